/* fuzz_hf_config: import-hf's reader of a Hugging Face config.json
 * (common/io/hf.h, pw_hf_config_model).
 *
 * Any bytes: parse as JSON, then as a config at seq_len 0 and 7. Nothing may
 * crash or leak; an accepted config's model, put in a job with a tokens
 * data section as import-hf writes it, must be a job spec pw_job_parse
 * accepts: the importer never writes a job that cannot run. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "hf.h"
#include "spec_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_t *cfg = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
  if (!cfg) return 0;
  for (int seq = 0; seq <= 7; seq += 7) {
    json_t *model;
    char arch[PW_HF_ARCH_MAX], notes[PW_HF_NOTES_MAX];
    pw_err err = {0};
    if (pw_hf_config_model(cfg, "config.json", seq, &model, arch, notes, sizeof notes, &err)) continue;
    json_t *job = json_pack("{s:s, s:o, s:{s:s, s:s}}", "name", "fuzz", "model", model, "data", "kind", "tokens",
                            "path", "x.tokens");
    pw_job j;
    if (!job) abort();
    if (pw_job_parse(job, NULL, &j, &err)) {
      char *s = json_dumps(job, JSON_COMPACT);
      fprintf(stderr, "accepted config gave a job that is refused: %s: %s\n%s\n", err.path, err.msg, s);
      abort();
    }
    pw_job_free(&j);
    json_decref(job);
  }
  json_decref(cfg);
  return 0;
}
