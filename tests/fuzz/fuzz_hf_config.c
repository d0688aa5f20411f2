/* fuzz_hf_config: import-hf's reader of a Hugging Face config.json
 * (common/io/hf.h, pw_hf_config_model).
 *
 * Any bytes: parse as JSON, then as a config at seq_len 0 and 7. Nothing may
 * crash or leak. An accepted config's model goes into a job with a tokens
 * data section (BERT's: masked-LM tokens with a mask id, or labeled lines)
 * and through pw_job_parse, as import-hf does (which reports
 * the spec's refusal: a rule the reader leaves to the spec, such as
 * llama's even head width); the same bytes give the same model twice. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    json_t *again;
    if (pw_hf_config_model(cfg, "config.json", seq, &again, arch, notes, sizeof notes, &err) ||
        !json_equal(model, again)) {
      fprintf(stderr, "the same config read twice gave another model\n");
      abort();
    }
    json_decref(again);
    /* BERT's data as import-hf writes it: masked LM over tokens with a mask id, a classifier's labeled lines */
    const char *head = json_string_value(json_object_get(model, "bert_head"));
    json_t *job = head && !strcmp(head, "classify")
                      ? json_pack("{s:s, s:o, s:{s:s, s:s}}", "name", "fuzz", "model", model, "data", "kind", "labeled",
                                  "path", "x.jsonl")
                  : head ? json_pack("{s:s, s:o, s:{s:s, s:s, s:i}}", "name", "fuzz", "model", model, "data", "kind",
                                     "tokens", "path", "x.tokens", "mask_token", 1)
                         : json_pack("{s:s, s:o, s:{s:s, s:s}}", "name", "fuzz", "model", model, "data", "kind",
                                     "tokens", "path", "x.tokens");
    pw_job j;
    if (!job) abort();
    if (pw_job_parse(job, NULL, &j, &err) == 0) pw_job_free(&j);
    json_decref(job);
  }
  json_decref(cfg);
  return 0;
}
