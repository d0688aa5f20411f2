/* ops_kv: causal attention of new rows against a sequence's KV cache — the
 * decode half of ops_attn.c's attention. Contract in ops.h.
 *
 * The cache holds each position's (rotated) key and value rows, (Tmax, C)
 * per layer and sequence, heads side by side as in the packed qkv; a head's
 * keys are read in place through a leading dimension of C. One new row (a
 * decode step) is two sgemv per head; a block of new rows (a prefill) two
 * sgemm per head and block of KV_BLOCK rows, each row's scores masked past
 * its own position. Never allocates. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "gemm.h"
#include "log.h"
#include "ops.h"
#include "ops_math.h"

/* New rows per block of a prefill: as ops_attn.c's ATTN_BLOCK. */
#define KV_BLOCK 64

size_t pw_attention_kv_scratch(int T, int t0) {
  return (size_t)(T < KV_BLOCK ? T : KV_BLOCK) * (size_t)(t0 + T);
}

/* Softmax of rows [0, rows) of S (row length ld); row i covers keys
 * [0, n0 + i], the rest of the row up to ncols is zeroed. */
static PW_CPU_DISPATCH(softmax_rows, (float *S, int rows, int ld, int n0, int ncols),
                       (S, rows, ld, n0, ncols)) {
  for (int i = 0; i < rows; i++) {
    float *p = S + (size_t)i * ld;
    int n = n0 + i;
    float mx = pw__max(p, n);
    for (int j = 0; j < n; j++) p[j] = pw__exp(p[j] - mx);
    float inv = 1.0f / pw__sum(p, n);
    for (int j = 0; j < n; j++) p[j] *= inv;
    if (ncols > n) memset(p + n, 0, (size_t)(ncols - n) * sizeof(float));
  }
}

void pw_attention_kv_forward(float *out, float *kc, float *vc, float *scratch, const float *qkv, int T,
                             int t0, int C, int NH) {
  PW_ASSERT(NH > 0 && C % NH == 0 && T > 0 && t0 >= 0);
  int HD = C / NH;
  size_t C3 = 3 * (size_t)C;
  float scale = 1.0f / sqrtf((float)HD);
  for (int t = 0; t < T; t++) {
    memcpy(kc + (size_t)(t0 + t) * C, qkv + t * C3 + C, (size_t)C * sizeof(float));
    memcpy(vc + (size_t)(t0 + t) * C, qkv + t * C3 + 2 * (size_t)C, (size_t)C * sizeof(float));
  }
  int ld = t0 + T; /* scratch row length: every key the last row sees */
  for (int h = 0; h < NH; h++) {
    const float *q = qkv + (size_t)h * HD, *k = kc + (size_t)h * HD, *v = vc + (size_t)h * HD;
    float *o = out + (size_t)h * HD;
    if (T == 1) {
      int n = t0 + 1;
      /* s (n) = scale * K[0:n] q;  o = V[0:n]^T softmax(s) */
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, HD, scale, k, C, q, 1, 0.0f, scratch, 1);
      softmax_rows(scratch, 1, ld, n, n);
      cblas_sgemv(CblasRowMajor, CblasTrans, n, HD, 1.0f, v, C, scratch, 1, 0.0f, o, 1);
      continue;
    }
    for (int r0 = 0; r0 < T; r0 += KV_BLOCK) {
      int r1 = r0 + KV_BLOCK < T ? r0 + KV_BLOCK : T;
      int rows = r1 - r0, n = t0 + r1; /* keys this block sees */
      /* S[0:rows, 0:n] = scale * Q[r0:r1] K[0:n]^T */
      pw_sgemm(0, 1, rows, n, HD, scale, q + (size_t)r0 * C3, (int)C3, k,
                  C, 0.0f, scratch, ld);
      softmax_rows(scratch, rows, ld, t0 + r0 + 1, n);
      /* O[r0:r1] = P[0:rows, 0:n] V[0:n] */
      pw_sgemm(0, 0, rows, HD, n, 1.0f, scratch, ld, v, C, 0.0f,
                  o + (size_t)r0 * C, C);
    }
  }
}
