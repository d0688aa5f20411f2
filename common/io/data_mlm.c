/* data_mlm: masked-LM corruption of a sequence (BERT's pretraining
 * objective) and the check that every window a sampler may read has
 * enough positions to corrupt. The draws are written out in data.c's top
 * comment; tests/unit/test_data.c and tests/ref/hf_bert_ref.py redo them. */
#include <stdlib.h>

#include "data.h"
#include "data_int.h"
#include "log.h"
#include "rng.h"
#include "tokfile.h"

void pw_mlm_corrupt(uint64_t key, int T, int K, int V, int mask, int pad, int32_t *x, int32_t *tg) {
  int stack[1024];
  int *pos = T <= 1024 ? stack : malloc(sizeof(int) * (size_t)T);
  PW_ASSERT(pos && K >= 0 && V > 0);
  int n = 0;
  for (int t = 0; t < T; t++)
    if (pad < 0 || x[t] != pad) pos[n++] = t;
  PW_ASSERT(n >= K); /* pw_dataset_open checked every window */
  pw_rng r;
  pw_rng_seed(&r, pw_hash64(key, pw_hash_str("mlm")));
  /* the first K of a Fisher-Yates shuffle: K distinct positions */
  for (int j = 0; j < K; j++) {
    int s = j + (int)pw_rng_below(&r, (uint64_t)(n - j));
    int p = pos[s];
    pos[s] = pos[j];
    pos[j] = p;
  }
  if (tg)
    for (int t = 0; t < T; t++) tg[t] = PW_DATA_IGNORE;
  for (int j = 0; j < K; j++) {
    int p = pos[j];
    if (tg) tg[p] = x[p];
    uint64_t u = pw_rng_below(&r, 10);
    if (u < 8) x[p] = mask;
    else if (u == 8) x[p] = (int32_t)pw_rng_below(&r, (uint64_t)V);
  }
  if (pos != stack) free(pos);
}

static uint32_t id_at(const unsigned char *ids, unsigned width, size_t i) {
  return width == 1 ? ids[i] : pw_tokfile_id(ids, width, i);
}

int pw__mlm_check_windows(const unsigned char *ids, unsigned width, size_t S, int T, int K, int pad, const char *path,
                          const char *split, pw_err *err) {
  if (K > T)
    return pw_err_set(err, PW_ESPEC, "model.mlm_predictions", "%d masked positions do not fit in seq_len %d", K, T);
  if (pad < 0) return 0;
  /* windows start at o = 0 .. M-1, M = S - T - 1 (data.c); count pads in each by sliding */
  size_t M = S - (size_t)T - 1, worst_o = 0;
  int pads = 0, worst = 0;
  for (size_t t = 0; t < (size_t)T; t++) pads += id_at(ids, width, t) == (uint32_t)pad;
  worst = pads;
  for (size_t o = 1; o < M; o++) {
    pads += (id_at(ids, width, o + (size_t)T - 1) == (uint32_t)pad) - (id_at(ids, width, o - 1) == (uint32_t)pad);
    if (pads > worst) worst = pads, worst_o = o;
  }
  if (T - worst < K)
    return pw_err_set(err, PW_ESPEC, "data.path",
                      "%s: the window of seq_len %d tokens at offset %zu of the %s split holds %d pad tokens (id %d), "
                      "leaving %d of the %d positions model.mlm_predictions masks",
                      path, T, worst_o, split, worst, pad, T - worst, K);
  return 0;
}
