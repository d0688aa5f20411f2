/* fuzz_tokfile: token files (common/io/tokfile.h) on any file contents, and
 * the dataset opener that trains on them.
 *
 * Properties: the file check and the in-memory header + id checks agree;
 * an accepted file whose ids the dataset opener also takes gives batches
 * whose every id is below the header's vocab_size. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "tokfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!path[0]) snprintf(path, sizeof path, "/tmp/pw-fuzz-tok.%d", (int)getpid());
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  if (fclose(f)) abort();
  pw_tokfile_hdr h, hm;
  pw_err err = {0};
  int file_rc = pw_tokfile_check(path, &h, &err);
  int mem_rc = pw_tokfile_header_parse(data, size, size ? size : 1, &hm, "mem", &err);
  if (!mem_rc) mem_rc = pw_tokfile_check_ids(data + PW_TOKFILE_HEADER, hm.n_tokens, 0, &hm, "mem", &err);
  if ((file_rc == 0) != (mem_rc == 0)) abort(); /* two readers of one format disagree */
  if (file_rc) return 0;
  if (h.version != hm.version || h.width != hm.width || h.vocab_size != hm.vocab_size || h.n_tokens != hm.n_tokens)
    abort();

  pw_data_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.kind = PW_DATA_TOKENS;
  snprintf(spec.path, sizeof spec.path, "%s", path);
  spec.sampler = data[size - 1] & 1 ? PW_SAMPLER_RANDOM : PW_SAMPLER_SEQUENTIAL;
  spec.eval_fraction = 0.25;
  pw_data_shape shape = {.vocab_size = (int)(h.vocab_size > 1u << 30 ? 1u << 30 : h.vocab_size), .seq_len = 3,
                         .tokens = 1};
  pw_dataset *ds = NULL;
  if (pw_dataset_open(&spec, &shape, 1, &ds, &err)) return 0; /* too short for the splits, or vocab over 2^30 */
  int32_t in[4 * 3], tg[4 * 3];
  for (int split = 0; split < 2; split++)
    for (long step = 0; step < 3; step++) {
      pw_dataset_batch(ds, (pw_split)split, step, 0, 4, 4, in, tg);
      for (int k = 0; k < 12; k++)
        if (in[k] < 0 || (uint32_t)in[k] >= h.vocab_size || tg[k] < 0 || (uint32_t)tg[k] >= h.vocab_size) abort();
    }
  pw_dataset_close(ds);
  return 0;
}
