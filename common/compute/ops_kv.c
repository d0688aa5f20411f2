/* ops_kv: causal attention of new rows against a sequence's KV cache — the
 * decode half of ops_attn.c's attention. Contract in ops.h. A sliding
 * window reads only the cache's last `window` rows up to each new row (the
 * cache itself keeps every position: no rolling buffer).
 *
 * The cache holds each position's (rotated) key and value rows, (Tmax,
 * NKV*HD) per layer and sequence, heads side by side as in the packed qkv; a head's
 * keys are read in place through a leading dimension of NKV*HD. One new row (a
 * decode step) is two sgemv per head; a block of new rows (a prefill) is
 * the tiled attention (ops_flash.h) with its rows at an offset into the
 * cache: no scores buffer as long as the cache. Never allocates. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "log.h"
#include "ops.h"
#include "ops_flash.h"
#include "ops_math.h"
#include "optable.h"

size_t pw_attention_kv_scratch(int T, int t0) {
  /* one row's scores (sgemv), or the tiled forward's score tile */
  return (size_t)(t0 + T) + (T > 1 ? (size_t)PW_ATTN_TILE_Q * PW_ATTN_TILE_K : 0);
}

/* Softmax of the n scores of one row. */
static PW_CPU_DISPATCH(softmax_row, (float *p, int n), (p, n)) {
  float mx = pw__max(p, n);
  for (int j = 0; j < n; j++) p[j] = pw__exp(p[j] - mx);
  float inv = 1.0f / pw__sum(p, n);
  for (int j = 0; j < n; j++) p[j] *= inv;
}

void pw_attention_kv_forward(float *out, float *kc, float *vc, float *scratch, const float *qkv, int T,
                             int t0, int C, int NH, int NKV, int window) {
  PW_ASSERT(NH > 0 && C % NH == 0 && NKV > 0 && NH % NKV == 0 && T > 0 && t0 >= 0 && window >= 0);
  int HD = C / NH, G = NH / NKV, KW = NKV * HD;
  size_t W = (size_t)C + 2 * (size_t)KW;
  for (int t = 0; t < T; t++) {
    memcpy(kc + (size_t)(t0 + t) * KW, qkv + t * W + C, (size_t)KW * sizeof(float));
    memcpy(vc + (size_t)(t0 + t) * KW, qkv + t * W + C + KW, (size_t)KW * sizeof(float));
  }
  if (T > 1) {
    pw__attn a = {.B = 1, .Tq = T, .Tk = t0 + T, .NH = NH, .NKV = NKV, .HD = HD, .off = t0, .causal = 1,
                  .window = window, .q = qkv, .k = kc, .v = vc, .ldq = W, .ldk = (size_t)KW, .ldo = (size_t)C};
    pw__attn_forward(&a, out, NULL, scratch, NULL);
    return;
  }
  float scale = 1.0f / sqrtf((float)HD);
  int lo = pw__attn_first_key(t0, window), n = t0 + 1 - lo; /* keys [lo, t0] */
  for (int h = 0; h < NH; h++) {
    const float *k = kc + (size_t)lo * KW + (size_t)(h / G) * HD, *v = vc + (size_t)lo * KW + (size_t)(h / G) * HD;
    /* s (n) = scale * K[lo:lo+n] q;  o = V[lo:lo+n]^T softmax(s) */
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, HD, scale, k, KW, qkv + (size_t)h * HD, 1, 0.0f, scratch, 1);
    softmax_row(scratch, n);
    cblas_sgemv(CblasRowMajor, CblasTrans, n, HD, 1.0f, v, KW, scratch, 1, 0.0f, out + (size_t)h * HD, 1);
  }
}
