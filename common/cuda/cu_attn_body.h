/* cu_attn_body: the arithmetic of the CUDA rope and plain attention
 * kernels (cu_attn.cu; the tiled attention is cu_fa_body.h's), one thread's work per call, in plain C so that gcc
 * compiles the very same bodies for tests/unit/test_cu_attn_emul.c, which
 * runs them over every index on the CPU against ops.h's kernels: the only
 * check their indexing gets on a machine without a GPU.
 *
 * Each body takes its thread's linear index (0 .. the count its *_n
 * function gives) and finds its row from it; a kernel is then one line per
 * thread. Parallel over output rows only: every output element is written
 * by exactly one thread, every sum runs serially in a fixed order inside
 * that thread (no atomics, no shared memory), so a run gives the same bits
 * every time. Layout and arithmetic are ops.h's (ops_attn.c's rope and
 * attention): qkv rows of W = C + 2 NKV HD
 * packed, q of head h at columns h*HD, k of key/value head g at C + g*HD,
 * v at C + NKV*HD + g*HD, query head h reading kv head h / (NH / NKV)
 * (grouped-query: Hugging Face's repeat_kv); out and dout (B,T,C); att
 * (B,NH,T,T). Gradients into dqkv are stored as ops_math.h's
 * pw__acc: (acc ? old : 0) + g. The backwards take D_i = dout_i . out_i
 * (the same number as sum_j p_ij dp_ij), so a key row's thread needs
 * nothing another thread made.
 *
 * Sums over a head's HD elements run in chunks of PW_CU_ATTN_CHUNK
 * accumulators a thread keeps (the test shrinks it to cover several chunks
 * and a partial one); a chunk after the first recomputes the scores. The
 * same sums either way: each element's sum runs over the same terms in
 * the same order.
 *
 * Must never: allocate, touch memory outside the arguments, or let a
 * thread's result depend on another thread's. */
#ifndef PW_CU_ATTN_BODY_H
#define PW_CU_ATTN_BODY_H

#include <math.h>
#include <stddef.h>

#include "hd.h"

#ifndef PW_CU_ATTN_CHUNK
#define PW_CU_ATTN_CHUNK 64
#endif

#include "ops_rope.h" /* pw_rope, pw_rope_inv_freq: the CPU's angles */

/* One attention call's shapes: C the query width (NH HD), NKV key/value
 * heads, W = C + 2 NKV HD a qkv row, G = NH / NKV query heads a kv head. */
typedef struct {
  int B, T, C, NH, NKV, HD, W, G;
  float scale; /* 1 / sqrtf(HD), as the CPU computes it */
} pw_cu_attn_dims;

/* The shapes of a call of NH query heads and NKV kv heads (<= 0: NH) over
 * a query width C (host side). */
static inline pw_cu_attn_dims pw_cu_attn_dims_make(int B, int T, int C, int NH, int NKV) {
  pw_cu_attn_dims d;
  d.B = B, d.T = T, d.C = C, d.NH = NH, d.NKV = NKV > 0 ? NKV : NH, d.HD = C / NH;
  d.W = C + 2 * d.NKV * d.HD, d.G = NH / d.NKV;
  d.scale = 1.0f / sqrtf((float)d.HD);
  return d;
}

static inline PW_HD float pw_cu__acc(int acc, float old, float g) { return (acc ? old : 0.0f) + g; }

static inline PW_HD float pw_cu__dot(const float *x, const float *y, int n) {
  float s = 0.0f;
  for (int e = 0; e < n; e++) s += x[e] * y[e];
  return s;
}

/* ---- rope ------------------------------------------------------------------ */

/* Threads of a rope call: one per pair (i, i + HD/2) of each of the
 * NH + 2 NKV head blocks of each row (W = (NH + 2 NKV) HD). */
static inline PW_HD size_t pw_cu_rope_n(int B, int T, int NH, int NKV, int HD) {
  return (size_t)B * T * (size_t)(NH + 2 * NKV) * (size_t)(HD / 2);
}

/* Pair i of head block hh (NH q heads, NKV k heads, NKV v heads) of row r:
 * q and k rotated by angle t * inv_freq (the transpose rotation backward),
 * v copied through; backward stores with acc. inv_freq is ops_rope.h's (so
 * the CPU's, Llama-3's rope_scaling too); cos and sin in double rounded to
 * float: the correctly rounded values glibc's cosf and sinf give (CUDA's
 * float ones may differ by ulps). */
static inline PW_HD void pw_cu_rope_body(float *out, const float *inp, int T, int NH, int NKV, int HD, pw_rope rp,
                                         int backward, int acc, size_t idx) {
  int half = HD / 2, blocks = NH + 2 * NKV;
  int i = (int)(idx % (size_t)half);
  size_t rh = idx / (size_t)half;
  int hh = (int)(rh % (size_t)blocks);
  size_t r = rh / (size_t)blocks;
  size_t o = r * (size_t)blocks * HD + (size_t)hh * HD;
  float x1 = inp[o + i], x2 = inp[o + i + half], y1 = x1, y2 = x2;
  if (hh < NH + NKV) {
    float ang = (float)(int)(r % (size_t)T) * pw_rope_inv_freq(&rp, i, HD);
    float c = (float)cos((double)ang), s = (float)sin((double)ang);
    if (!backward) {
      y1 = x1 * c - x2 * s;
      y2 = x2 * c + x1 * s;
    } else {
      y1 = x1 * c + x2 * s;
      y2 = x2 * c - x1 * s;
    }
  }
  if (!backward) {
    out[o + i] = y1;
    out[o + i + half] = y2;
  } else {
    out[o + i] = pw_cu__acc(acc, out[o + i], y1);
    out[o + i + half] = pw_cu__acc(acc, out[o + i + half], y2);
  }
}

/* ---- pointers of one (b, h) ----------------------------------------------- */

/* Threads of a forward or a dq pass: one per query row of each (b, h). */
static inline PW_HD size_t pw_cu_attn_n(pw_cu_attn_dims d) { return (size_t)d.B * d.NH * d.T; }
/* Threads of a dk/dv pass: one per key row of each (b, g). */
static inline PW_HD size_t pw_cu_attn_kv_n(pw_cu_attn_dims d) { return (size_t)d.B * d.NKV * d.T; }

/* Row i of head h of sequence b; p = b NH + h (or b NKV + g for a kv row). */
typedef struct {
  int b, h, i;
  size_t p;
} pw_cu__row;

/* From a thread index over the B NH T rows (heads NH) or B NKV T (NKV). */
static inline PW_HD pw_cu__row pw_cu__row_of(pw_cu_attn_dims d, int heads, size_t idx) {
  pw_cu__row r;
  r.i = (int)(idx % (size_t)d.T);
  r.p = idx / (size_t)d.T;
  r.h = (int)(r.p % (size_t)heads);
  r.b = (int)(r.p / (size_t)heads);
  return r;
}

/* Row 0 of sequence b's q of head h, k and v of kv head g, in qkv (row j at + j W) */
static inline PW_HD size_t pw_cu__q0(pw_cu_attn_dims d, int b, int h) {
  return (size_t)b * d.T * d.W + (size_t)h * d.HD;
}
static inline PW_HD size_t pw_cu__k0(pw_cu_attn_dims d, int b, int g) {
  return (size_t)b * d.T * d.W + (size_t)d.C + (size_t)g * d.HD;
}
static inline PW_HD size_t pw_cu__v0(pw_cu_attn_dims d, int b, int g) {
  return pw_cu__k0(d, b, g) + (size_t)d.NKV * d.HD;
}
/* out / dout of row i of (b, h) */
static inline PW_HD size_t pw_cu__out_at(pw_cu_attn_dims d, int b, int h, int i) {
  return ((size_t)b * d.T + (size_t)i) * d.C + (size_t)h * d.HD;
}

/* ---- attention (ops_attn.c): probabilities saved -------------------------- */

/* Query row i of (b, h): scores s_j = scale q_i.k_j for j <= i, the softmax
 * (max subtracted) into att's row (zeros above the diagonal), and
 * out_i = sum_j p_j v_j. */
static inline PW_HD void pw_cu_attn_fwd_body(float *out, float *att, const float *qkv, pw_cu_attn_dims d,
                                             size_t idx) {
  pw_cu__row r = pw_cu__row_of(d, d.NH, idx);
  int g = r.h / d.G;
  const float *q = qkv + pw_cu__q0(d, r.b, r.h) + (size_t)r.i * d.W;
  const float *k0 = qkv + pw_cu__k0(d, r.b, g), *v0 = qkv + pw_cu__v0(d, r.b, g);
  float *p = att + idx * (size_t)d.T; /* row i of (b, h): ((b NH + h) T + i) T */
  float mx = 0.0f, sum = 0.0f;
  for (int j = 0; j <= r.i; j++) {
    float s = d.scale * pw_cu__dot(q, k0 + (size_t)j * d.W, d.HD);
    p[j] = s;
    mx = j == 0 || s > mx ? s : mx;
  }
  for (int j = 0; j <= r.i; j++) {
    p[j] = expf(p[j] - mx);
    sum += p[j];
  }
  float inv = 1.0f / sum;
  for (int j = 0; j <= r.i; j++) p[j] *= inv;
  for (int j = r.i + 1; j < d.T; j++) p[j] = 0.0f;
  float *o = out + pw_cu__out_at(d, r.b, r.h, r.i);
  for (int e = 0; e < d.HD; e++) {
    float a = 0.0f;
    for (int j = 0; j <= r.i; j++) a += p[j] * v0[(size_t)j * d.W + e];
    o[e] = a;
  }
}

/* Query row i of (b, h): dp_j = dout_i.v_j, D_i = dout_i.out_i, dS_j =
 * p_j (dp_j - D_i) and dq_i = scale sum_j dS_j k_j. */
static inline PW_HD void pw_cu_attn_bwd_q_body(float *dqkv, const float *dout, const float *out, const float *qkv,
                                               const float *att, pw_cu_attn_dims d, int acc, size_t idx) {
  pw_cu__row r = pw_cu__row_of(d, d.NH, idx);
  int g = r.h / d.G;
  const float *k0 = qkv + pw_cu__k0(d, r.b, g), *v0 = qkv + pw_cu__v0(d, r.b, g);
  size_t oi = pw_cu__out_at(d, r.b, r.h, r.i);
  const float *dO = dout + oi;
  const float *p = att + idx * (size_t)d.T;
  float Di = pw_cu__dot(dO, out + oi, d.HD);
  float *dq = dqkv + pw_cu__q0(d, r.b, r.h) + (size_t)r.i * d.W;
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ATTN_CHUNK) {
    int w = d.HD - e0 < PW_CU_ATTN_CHUNK ? d.HD - e0 : PW_CU_ATTN_CHUNK;
    float gq[PW_CU_ATTN_CHUNK];
    for (int e = 0; e < w; e++) gq[e] = 0.0f;
    for (int j = 0; j <= r.i; j++) {
      float ds = p[j] * (pw_cu__dot(dO, v0 + (size_t)j * d.W, d.HD) - Di);
      const float *kj = k0 + (size_t)j * d.W + e0;
      for (int e = 0; e < w; e++) gq[e] += ds * kj[e];
    }
    for (int e = 0; e < w; e++) dq[e0 + e] = pw_cu__acc(acc, dq[e0 + e], d.scale * gq[e]);
  }
}

/* Key row j of kv head g of b, over the query heads h of its group and
 * the query rows i >= j that see it: dk_j = scale sum_h sum_i dS_hij q_hi,
 * dv_j = sum_h sum_i p_hij dout_hi. */
static inline PW_HD void pw_cu_attn_bwd_kv_body(float *dqkv, const float *dout, const float *out, const float *qkv,
                                                const float *att, pw_cu_attn_dims d, int acc, size_t idx) {
  pw_cu__row r = pw_cu__row_of(d, d.NKV, idx); /* r.h: the kv head */
  int j = r.i;
  const float *vj = qkv + pw_cu__v0(d, r.b, r.h) + (size_t)j * d.W;
  float *dk = dqkv + pw_cu__k0(d, r.b, r.h) + (size_t)j * d.W;
  float *dv = dqkv + pw_cu__v0(d, r.b, r.h) + (size_t)j * d.W;
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ATTN_CHUNK) {
    int w = d.HD - e0 < PW_CU_ATTN_CHUNK ? d.HD - e0 : PW_CU_ATTN_CHUNK;
    float gk[PW_CU_ATTN_CHUNK], gv[PW_CU_ATTN_CHUNK];
    for (int e = 0; e < w; e++) gk[e] = gv[e] = 0.0f;
    for (int h = r.h * d.G; h < (r.h + 1) * d.G; h++) {
      const float *q0 = qkv + pw_cu__q0(d, r.b, h);
      const float *pc = att + ((size_t)r.b * d.NH + (size_t)h) * d.T * d.T + (size_t)j; /* column j: row i at + i T */
      for (int i = j; i < d.T; i++) {
        size_t oi = pw_cu__out_at(d, r.b, h, i);
        const float *dO = dout + oi, *qi = q0 + (size_t)i * d.W + e0;
        float pij = pc[(size_t)i * d.T];
        float ds = pij * (pw_cu__dot(dO, vj, d.HD) - pw_cu__dot(dO, out + oi, d.HD));
        for (int e = 0; e < w; e++) {
          gk[e] += ds * qi[e];
          gv[e] += pij * dO[e0 + e];
        }
      }
    }
    for (int e = 0; e < w; e++) {
      dk[e0 + e] = pw_cu__acc(acc, dk[e0 + e], d.scale * gk[e]);
      dv[e0 + e] = pw_cu__acc(acc, dv[e0 + e], gv[e]);
    }
  }
}

#endif
