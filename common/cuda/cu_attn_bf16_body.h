/* cu_attn_bf16_body: the arithmetic of the CUDA attention and
 * attention_tiled kernels of bf16 programs (cu_attn_bf16.cu), one thread's
 * work per call, in plain C so that gcc compiles the very same bodies for
 * tests/unit/test_cu_attn_bf16_emul.c, which runs them over every index on
 * the CPU against bf16.h's pw_attention_*_bf16 rows.
 *
 * What the CPU rounds to bf16 (ops_attn.c, ops_flash.c; docs/contracts.md
 * "bf16"), these round too, as they read it (cu_bf16_body.h's round, no
 * bf16 copies in memory): q, k, v and dout; P before P V and before dV =
 * P^T dO; scale * dS before dQ and dK. Every product is then of two bf16
 * values (exact in float32) and every sum float32, as the CPU's
 * pw_gemm_bf16: only the order of the sums differs. The softmax, its
 * gradient and the saved P (att) or lse stay float32; the scores are
 * q.k then times scale, as the CPU scales after its product. The tiled
 * forward keeps the CPU's tiles of PW_ATTN_TILE_K keys: its P is
 * exp(s - m) with m the running max after the row's tile, rounded before
 * P V, then the output rescaled — rounding exp(s - m) and not the final
 * probability is the CPU's, and gives other bits than the plain
 * attention's. The tiled backward's D is dout.out in float32 (the CPU's).
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
#include "optable.h"

#ifndef PW_CU_ABF_CHUNK
#define PW_CU_ABF_CHUNK 64
#endif
#define PW_CU_ABF_TK PW_ATTN_TILE_K /* the CPU's key tile (ops_flash.c) */

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
/* sum_e x_e y_e in float32 (the tiled backward's D, unrounded) */
static inline PW_HD float pw_cu__abf_dot_f(const float *x, const float *y, int n) {
  float s = 0.0f;
  for (int e = 0; e < n; e++) s += x[e] * y[e];
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

/* ---- attention_tiled (ops_flash.c's bf16 rows): lse saved ----------------------- */

/* Query row i of (b, h): the CPU's online softmax tile by tile (tiles of
 * PW_CU_ABF_TK keys from key 0; the row's last tile ends at key i): m the
 * max so far, p_j = exp(s_j - m) after the tile's max is taken in, the
 * output so far times exp(m_old - m) then plus sum_j bf16(p_j) v_j; at the
 * end out = a / l, lse = m + log l. */
static inline PW_HD void pw_cu_abf_tiled_fwd_body(float *out, float *lse, const float *qkv, pw_cu_abf_dims d,
                                                  size_t idx) {
  int i = (int)(idx % (size_t)d.T);
  size_t p = idx / (size_t)d.T;
  int h = (int)(p % (size_t)d.NH), b = (int)(p / (size_t)d.NH);
  const float *q = qkv + pw_cu__abf_q0(d, b, h) + (size_t)i * d.W;
  const float *k0 = qkv + pw_cu__abf_k0(d, b, h / d.G), *v0 = qkv + pw_cu__abf_v0(d, b, h / d.G);
  float *o = out + pw_cu__abf_o(d, b, h, i);
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ABF_CHUNK) {
    int w = d.HD - e0 < PW_CU_ABF_CHUNK ? d.HD - e0 : PW_CU_ABF_CHUNK;
    float a[PW_CU_ABF_CHUNK], S[PW_CU_ABF_TK];
    float m = 0.0f, l = 0.0f;
    for (int e = 0; e < w; e++) a[e] = 0.0f;
    for (int c0 = 0; c0 <= i; c0 += PW_CU_ABF_TK) {
      int n = i + 1 - c0 < PW_CU_ABF_TK ? i + 1 - c0 : PW_CU_ABF_TK; /* keys of the tile the row sees */
      float t = 0.0f;
      for (int j = 0; j < n; j++) {
        S[j] = pw_cu__abf_dot(q, k0 + (size_t)(c0 + j) * d.W, d.HD) * d.scale;
        t = j == 0 || S[j] > t ? S[j] : t;
      }
      float mx = c0 == 0 || t > m ? t : m, s = 0.0f;
      for (int j = 0; j < n; j++) {
        S[j] = expf(S[j] - mx);
        s += S[j];
      }
      if (c0 == 0) {
        l = s;
      } else {
        float al = expf(m - mx);
        l = l * al + s;
        for (int e = 0; e < w; e++) a[e] *= al;
      }
      m = mx;
      for (int e = 0; e < w; e++) {
        float x = 0.0f;
        for (int j = 0; j < n; j++)
          x += pw_cu_bf16_round(S[j]) * pw_cu_bf16_round(v0[(size_t)(c0 + j) * d.W + e0 + e]);
        a[e] += x;
      }
    }
    float inv = 1.0f / l;
    for (int e = 0; e < w; e++) o[e0 + e] = a[e] * inv;
    if (e0 == 0) lse[idx] = m + logf(l);
  }
}

/* ---- the backward of both ------------------------------------------------------------ */

/* What the two backwards differ in: P saved (att, D_i = sum_j p_j dp_j
 * kept in D by the q body) or recomputed from lse (D_i = dout_i.out_i). */
typedef struct {
  const float *att;       /* plain: (B, NH, T, T) */
  float *D;               /* plain: (B, NH, T), the q body's, the kv body's to read */
  const float *lse, *out; /* tiled: (B, NH, T) and (B, T, C) */
} pw_cu_abf_saved;

/* p_ij of query head h (pair ph = b NH + h) */
static inline PW_HD float pw_cu__abf_p(const pw_cu_abf_saved *sv, pw_cu_abf_dims d, size_t ph, int i, int j,
                                       const float *qi, const float *kj) {
  if (sv->att) return sv->att[(ph * (size_t)d.T + (size_t)i) * d.T + (size_t)j];
  return expf(pw_cu__abf_dot(qi, kj, d.HD) * d.scale - sv->lse[ph * (size_t)d.T + (size_t)i]);
}

/* Query row i of (b, h): dp_j = dout_i.v_j, D_i (plain: into D), dS_j =
 * bf16(scale p_j (dp_j - D_i)), dq_i = sum_j dS_j k_j. */
static inline PW_HD void pw_cu_abf_bwd_q_body(float *dqkv, const float *dout, const float *qkv,
                                              pw_cu_abf_saved sv, pw_cu_abf_dims d, int acc, size_t idx) {
  int i = (int)(idx % (size_t)d.T);
  size_t ph = idx / (size_t)d.T;
  int h = (int)(ph % (size_t)d.NH), b = (int)(ph / (size_t)d.NH);
  size_t q0 = pw_cu__abf_q0(d, b, h);
  const float *q = qkv + q0 + (size_t)i * d.W;
  const float *k0 = qkv + pw_cu__abf_k0(d, b, h / d.G), *v0 = qkv + pw_cu__abf_v0(d, b, h / d.G);
  const float *dO = dout + pw_cu__abf_o(d, b, h, i);
  float Di;
  if (sv.att) {
    Di = 0.0f;
    for (int j = 0; j <= i; j++)
      Di += pw_cu__abf_dot(dO, v0 + (size_t)j * d.W, d.HD) * pw_cu__abf_p(&sv, d, ph, i, j, q, NULL);
    sv.D[idx] = Di;
  } else {
    Di = pw_cu__abf_dot_f(dO, sv.out + pw_cu__abf_o(d, b, h, i), d.HD);
  }
  float *dq = dqkv + q0 + (size_t)i * d.W;
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ABF_CHUNK) {
    int w = d.HD - e0 < PW_CU_ABF_CHUNK ? d.HD - e0 : PW_CU_ABF_CHUNK;
    float g[PW_CU_ABF_CHUNK];
    for (int e = 0; e < w; e++) g[e] = 0.0f;
    for (int j = 0; j <= i; j++) {
      const float *kj = k0 + (size_t)j * d.W;
      float pj = pw_cu__abf_p(&sv, d, ph, i, j, q, kj);
      float ds = pw_cu_bf16_round(pj * (pw_cu__abf_dot(dO, v0 + (size_t)j * d.W, d.HD) - Di) * d.scale);
      for (int e = 0; e < w; e++) g[e] += ds * pw_cu_bf16_round(kj[e0 + e]);
    }
    for (int e = 0; e < w; e++) dq[e0 + e] = pw_cu__abf_acc(acc, dq[e0 + e], g[e]);
  }
}

/* Key row j of kv head g of sequence b, idx = (b NKV + g) T + j, over the
 * group's query heads in order and their rows i >= j: dk_j = sum dS_ij
 * q_i, dv_j = sum bf16(p_ij) dout_i. The plain backward reads the q
 * body's D. */
static inline PW_HD void pw_cu_abf_bwd_kv_body(float *dqkv, const float *dout, const float *qkv,
                                               pw_cu_abf_saved sv, pw_cu_abf_dims d, int acc, size_t idx) {
  int j = (int)(idx % (size_t)d.T);
  size_t pg = idx / (size_t)d.T;
  int g = (int)(pg % (size_t)d.NKV), b = (int)(pg / (size_t)d.NKV);
  size_t k0 = pw_cu__abf_k0(d, b, g) + (size_t)j * d.W, v0 = pw_cu__abf_v0(d, b, g) + (size_t)j * d.W;
  const float *kj = qkv + k0, *vj = qkv + v0;
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
        float pij = pw_cu__abf_p(&sv, d, ph, i, j, qi, kj);
        float Di = sv.att ? sv.D[ph * (size_t)d.T + (size_t)i] : pw_cu__abf_dot_f(dO, sv.out + oi, d.HD);
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
