/* cu_attn_bf16_body: the arithmetic of the CUDA plain attention kernels
 * of bf16 programs (cu_attn_bf16.cu; the tiled attention is
 * cu_fa_body.h's), one thread's work per call, in plain C so that gcc compiles the very same bodies for
 * tests/unit/test_cu_attn_bf16_emul.c, which runs them over every index on
 * the CPU against bf16.h's pw_attention_*_bf16 rows.
 *
 * What the CPU rounds to bf16 (ops_attn.c; docs/contracts.md
 * "bf16"), these round too, as they read it (cu_bf16_body.h's round, no
 * bf16 copies in memory): q, k, v and dout; P before P V and before dV =
 * P^T dO; scale * dS before dQ and dK. Every product is then of two bf16
 * values (exact in float32) and every sum float32, as the CPU's
 * pw_gemm_bf16: only the order of the sums differs. The softmax, its
 * gradient and the saved P (att) stay float32; the scores are q.k then
 * times scale, as the CPU scales after its product.
 *
 * Grouped-query heads (NKV of them, NH / NKV query heads each): qkv rows
 * are W = C + 2 NKV HD wide, q of head h at h HD, k of kv head g at
 * C + g HD, v at C + NKV HD + g HD; query head h reads kv head h / G. The
 * dk and dv of a kv head sum over its group's heads in one thread.
 *
 * One thread per output row (query row forward and for dq, key row of a
 * kv head for dk and dv), serial fixed-order sums, sums over HD in chunks
 * of PW_CU_ABF_CHUNK accumulators (a later chunk recomputes the scores):
 * the same bits run to run. Gradients stored as (acc ? old : 0) + g.
 *
 * Must never: allocate, touch memory outside the arguments, or let a
 * thread's result depend on another thread's. */
#ifndef PW_CU_ATTN_BF16_BODY_H
#define PW_CU_ATTN_BF16_BODY_H

#include <math.h>
#include <stddef.h>

#include "cu_bf16_body.h"

#ifndef PW_CU_ABF_CHUNK
#define PW_CU_ABF_CHUNK 64
#endif

/* One call's shapes; C the model width (the node's OC). */
typedef struct {
  int B, T, C, NH, NKV, HD, G;
  size_t W;    /* a packed qkv row: C + 2 NKV HD */
  float scale; /* 1 / sqrtf(HD), as the CPU computes it */
} pw_cu_abf_dims;

static inline pw_cu_abf_dims pw_cu_abf_dims_make(int B, int T, int C, int NH, int NKV) {
  pw_cu_abf_dims d;
  d.B = B, d.T = T, d.C = C, d.NH = NH, d.NKV = NKV > 0 ? NKV : NH;
  d.HD = NH > 0 ? C / NH : 0;
  d.G = d.NH / d.NKV;
  d.W = (size_t)C + 2 * (size_t)d.NKV * d.HD;
  d.scale = d.HD > 0 ? 1.0f / sqrtf((float)d.HD) : 0.0f;
  return d;
}

/* Threads: a query row of each (b, h); a key row of each (b, g). */
static inline PW_HD size_t pw_cu_abf_q_n(pw_cu_abf_dims d) { return (size_t)d.B * d.NH * d.T; }
static inline PW_HD size_t pw_cu_abf_kv_n(pw_cu_abf_dims d) { return (size_t)d.B * d.NKV * d.T; }

static inline PW_HD float pw_cu__abf_acc(int acc, float old, float g) { return (acc ? old : 0.0f) + g; }

/* sum_e bf16(x_e) bf16(y_e), in order */
static inline PW_HD float pw_cu__abf_dot(const float *x, const float *y, int n) {
  float s = 0.0f;
  for (int e = 0; e < n; e++) s += pw_cu_bf16_round(x[e]) * pw_cu_bf16_round(y[e]);
  return s;
}
/* q of head h, k and v of kv head g, row 0 of sequence b, in qkv */
static inline PW_HD size_t pw_cu__abf_q0(pw_cu_abf_dims d, int b, int h) {
  return (size_t)b * d.T * d.W + (size_t)h * d.HD;
}
static inline PW_HD size_t pw_cu__abf_k0(pw_cu_abf_dims d, int b, int g) {
  return (size_t)b * d.T * d.W + (size_t)d.C + (size_t)g * d.HD;
}
static inline PW_HD size_t pw_cu__abf_v0(pw_cu_abf_dims d, int b, int g) {
  return pw_cu__abf_k0(d, b, g) + (size_t)d.NKV * d.HD;
}
/* out / dout row i of head h of sequence b */
static inline PW_HD size_t pw_cu__abf_o(pw_cu_abf_dims d, int b, int h, int i) {
  return ((size_t)b * d.T + (size_t)i) * d.C + (size_t)h * d.HD;
}

/* ---- attention (ops_attn.c's bf16 rows): P saved ------------------------------ */

/* Query row i of (b, h), idx = (b NH + h) T + i: s_j = (q_i.k_j) scale
 * for j <= i, the softmax into att's row (zeros above the diagonal), out_i
 * = sum_j bf16(p_j) v_j. */
static inline PW_HD void pw_cu_abf_fwd_body(float *out, float *att, const float *qkv, pw_cu_abf_dims d,
                                            size_t idx) {
  int i = (int)(idx % (size_t)d.T);
  size_t p = idx / (size_t)d.T;
  int h = (int)(p % (size_t)d.NH), b = (int)(p / (size_t)d.NH);
  const float *q = qkv + pw_cu__abf_q0(d, b, h) + (size_t)i * d.W;
  const float *k0 = qkv + pw_cu__abf_k0(d, b, h / d.G), *v0 = qkv + pw_cu__abf_v0(d, b, h / d.G);
  float *P = att + idx * (size_t)d.T;
  float mx = 0.0f, sum = 0.0f;
  for (int j = 0; j <= i; j++) {
    float s = pw_cu__abf_dot(q, k0 + (size_t)j * d.W, d.HD) * d.scale;
    P[j] = s;
    mx = j == 0 || s > mx ? s : mx;
  }
  for (int j = 0; j <= i; j++) {
    P[j] = expf(P[j] - mx);
    sum += P[j];
  }
  float inv = 1.0f / sum;
  for (int j = 0; j <= i; j++) P[j] *= inv;
  for (int j = i + 1; j < d.T; j++) P[j] = 0.0f;
  float *o = out + pw_cu__abf_o(d, b, h, i);
  for (int e = 0; e < d.HD; e++) {
    float a = 0.0f;
    for (int j = 0; j <= i; j++) a += pw_cu_bf16_round(P[j]) * pw_cu_bf16_round(v0[(size_t)j * d.W + e]);
    o[e] = a;
  }
}

/* ---- the backward ------------------------------------------------------------------- */

/* What the forward saved and the q body passes to the kv body. */
typedef struct {
  const float *att; /* (B, NH, T, T) */
  float *D;         /* (B, NH, T): D_i = sum_j p_j dp_j, the q body's, the kv body's to read */
} pw_cu_abf_saved;

/* p_ij of query head h (pair ph = b NH + h) */
static inline PW_HD float pw_cu__abf_p(const pw_cu_abf_saved *sv, pw_cu_abf_dims d, size_t ph, int i, int j) {
  return sv->att[(ph * (size_t)d.T + (size_t)i) * d.T + (size_t)j];
}

/* Query row i of (b, h): dp_j = dout_i.v_j, D_i (into D), dS_j =
 * bf16(scale p_j (dp_j - D_i)), dq_i = sum_j dS_j k_j. */
static inline PW_HD void pw_cu_abf_bwd_q_body(float *dqkv, const float *dout, const float *qkv,
                                              pw_cu_abf_saved sv, pw_cu_abf_dims d, int acc, size_t idx) {
  int i = (int)(idx % (size_t)d.T);
  size_t ph = idx / (size_t)d.T;
  int h = (int)(ph % (size_t)d.NH), b = (int)(ph / (size_t)d.NH);
  size_t q0 = pw_cu__abf_q0(d, b, h);
  const float *k0 = qkv + pw_cu__abf_k0(d, b, h / d.G), *v0 = qkv + pw_cu__abf_v0(d, b, h / d.G);
  const float *dO = dout + pw_cu__abf_o(d, b, h, i);
  float Di = 0.0f;
  for (int j = 0; j <= i; j++) Di += pw_cu__abf_dot(dO, v0 + (size_t)j * d.W, d.HD) * pw_cu__abf_p(&sv, d, ph, i, j);
  sv.D[idx] = Di;
  float *dq = dqkv + q0 + (size_t)i * d.W;
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ABF_CHUNK) {
    int w = d.HD - e0 < PW_CU_ABF_CHUNK ? d.HD - e0 : PW_CU_ABF_CHUNK;
    float g[PW_CU_ABF_CHUNK];
    for (int e = 0; e < w; e++) g[e] = 0.0f;
    for (int j = 0; j <= i; j++) {
      const float *kj = k0 + (size_t)j * d.W;
      float pj = pw_cu__abf_p(&sv, d, ph, i, j);
      float ds = pw_cu_bf16_round(pj * (pw_cu__abf_dot(dO, v0 + (size_t)j * d.W, d.HD) - Di) * d.scale);
      for (int e = 0; e < w; e++) g[e] += ds * pw_cu_bf16_round(kj[e0 + e]);
    }
    for (int e = 0; e < w; e++) dq[e0 + e] = pw_cu__abf_acc(acc, dq[e0 + e], g[e]);
  }
}

/* Key row j of kv head g of sequence b, idx = (b NKV + g) T + j, over the
 * group's query heads in order and their rows i >= j: dk_j = sum dS_ij
 * q_i, dv_j = sum bf16(p_ij) dout_i; D the q body's. */
static inline PW_HD void pw_cu_abf_bwd_kv_body(float *dqkv, const float *dout, const float *qkv,
                                               pw_cu_abf_saved sv, pw_cu_abf_dims d, int acc, size_t idx) {
  int j = (int)(idx % (size_t)d.T);
  size_t pg = idx / (size_t)d.T;
  int g = (int)(pg % (size_t)d.NKV), b = (int)(pg / (size_t)d.NKV);
  size_t k0 = pw_cu__abf_k0(d, b, g) + (size_t)j * d.W, v0 = pw_cu__abf_v0(d, b, g) + (size_t)j * d.W;
  const float *vj = qkv + v0;
  float *dk = dqkv + k0, *dv = dqkv + v0;
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ABF_CHUNK) {
    int w = d.HD - e0 < PW_CU_ABF_CHUNK ? d.HD - e0 : PW_CU_ABF_CHUNK;
    float gk[PW_CU_ABF_CHUNK], gv[PW_CU_ABF_CHUNK];
    for (int e = 0; e < w; e++) gk[e] = gv[e] = 0.0f;
    for (int t = 0; t < d.G; t++) {
      int h = g * d.G + t;
      size_t ph = (size_t)b * d.NH + (size_t)h;
      const float *q0 = qkv + pw_cu__abf_q0(d, b, h);
      for (int i = j; i < d.T; i++) {
        const float *qi = q0 + (size_t)i * d.W;
        size_t oi = pw_cu__abf_o(d, b, h, i);
        const float *dO = dout + oi;
        float pij = pw_cu__abf_p(&sv, d, ph, i, j);
        float Di = sv.D[ph * (size_t)d.T + (size_t)i];
        float ds = pw_cu_bf16_round(pij * (pw_cu__abf_dot(dO, vj, d.HD) - Di) * d.scale);
        float pb = pw_cu_bf16_round(pij);
        for (int e = 0; e < w; e++) {
          gk[e] += ds * pw_cu_bf16_round(qi[e0 + e]);
          gv[e] += pb * pw_cu_bf16_round(dO[e0 + e]);
        }
      }
    }
    for (int e = 0; e < w; e++) {
      dk[e0 + e] = pw_cu__abf_acc(acc, dk[e0 + e], gk[e]);
      dv[e0 + e] = pw_cu__abf_acc(acc, dv[e0 + e], gv[e]);
    }
  }
}

#endif
