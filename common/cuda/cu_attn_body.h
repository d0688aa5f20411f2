/* cu_attn_body: the arithmetic of the CUDA rope and attention kernels
 * (cu_attn.cu), one thread's work per call, in plain C so that gcc
 * compiles the very same bodies for tests/unit/test_cu_attn_emul.c, which
 * runs them over every index on the CPU against ops.h's kernels: the only
 * check their indexing gets on a machine without a GPU.
 *
 * Each body takes its thread's linear index (0 .. the count its *_n
 * function gives) and finds its row from it; a kernel is then one line per
 * thread. Parallel over output rows only: every output element is written
 * by exactly one thread, every sum runs serially in a fixed order inside
 * that thread (no atomics, no shared memory), so a run gives the same bits
 * every time. Layout and arithmetic are ops.h's (ops.c's rope, ops_attn.c's
 * attention, ops_flash.c's tiled attention): qkv (B,T,3C) packed, q of head
 * h at columns h*HD, k at C + h*HD, v at 2C + h*HD; out and dout (B,T,C);
 * att (B,NH,T,T); lse (B,NH,T). Gradients into dqkv are stored as
 * ops_math.h's pw__acc: (acc ? old : 0) + g.
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

#ifndef PW_HD
#ifdef __CUDACC__
#define PW_HD __host__ __device__
#else
#define PW_HD
#endif
#endif

#ifndef PW_CU_ATTN_CHUNK
#define PW_CU_ATTN_CHUNK 64
#endif

/* One attention call's shapes; C the model width (qkv rows are 3C). */
typedef struct {
  int B, T, C, NH, HD;
  float scale; /* 1 / sqrtf(HD), as the CPU computes it */
} pw_cu_attn_dims;

/* The shapes of a call on qkv (B,T,3C) of NH heads (host side). */
static inline pw_cu_attn_dims pw_cu_attn_dims_make(int B, int T, int C, int NH) {
  pw_cu_attn_dims d;
  d.B = B, d.T = T, d.C = C, d.NH = NH, d.HD = C / NH;
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

/* Threads of a rope call: one per pair (i, i + HD/2) of each of the 3 NH
 * head blocks of each row. */
static inline PW_HD size_t pw_cu_rope_n(int B, int T, int C) { return (size_t)B * T * 3 * (size_t)(C / 2); }

/* Pair i of head block hh (q heads, then k heads, then v heads) of row r:
 * q and k rotated by angle t * inv_freq (the transpose rotation backward),
 * v copied through; backward stores with acc. inv_freq, cos and sin in
 * double rounded to float: the correctly rounded values glibc's powf, cosf
 * and sinf give (CUDA's float ones may differ by ulps), as inv_freq's last
 * bit is multiplied by t in the angle. */
static inline PW_HD void pw_cu_rope_body(float *out, const float *inp, int T, int C, int NH, float base,
                                         int backward, int acc, size_t idx) {
  int HD = C / NH, half = HD / 2;
  int i = (int)(idx % (size_t)half);
  size_t rh = idx / (size_t)half;
  int hh = (int)(rh % (size_t)(3 * NH));
  size_t r = rh / (size_t)(3 * NH);
  size_t o = r * 3 * (size_t)C + (size_t)hh * HD;
  float x1 = inp[o + i], x2 = inp[o + i + half], y1 = x1, y2 = x2;
  if (hh < 2 * NH) {
    float inv_freq = 1.0f / (float)pow((double)base, (double)((float)(2 * i) / (float)HD));
    float ang = (float)(int)(r % (size_t)T) * inv_freq;
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

/* Threads of a forward: one per query row of each (b, h). */
static inline PW_HD size_t pw_cu_attn_n(pw_cu_attn_dims d) { return (size_t)d.B * d.NH * d.T; }

/* Row i of (b, h) from a thread index over the B NH T rows, pair p = b NH + h. */
typedef struct {
  int b, h, i;
  size_t p; /* b * NH + h */
} pw_cu__row;

static inline PW_HD pw_cu__row pw_cu__row_of(pw_cu_attn_dims d, size_t idx) {
  pw_cu__row r;
  r.i = (int)(idx % (size_t)d.T);
  r.p = idx / (size_t)d.T;
  r.h = (int)(r.p % (size_t)d.NH);
  r.b = (int)(r.p / (size_t)d.NH);
  return r;
}

/* q of row 0 of (b, h) in qkv (k at + C, v at + 2C; row j at + j 3C) */
static inline PW_HD size_t pw_cu__qkv0(pw_cu_attn_dims d, pw_cu__row r) {
  return (size_t)r.b * d.T * 3 * (size_t)d.C + (size_t)r.h * d.HD;
}
/* out / dout of row i of (b, h) */
static inline PW_HD size_t pw_cu__out_at(pw_cu_attn_dims d, pw_cu__row r, int i) {
  return ((size_t)r.b * d.T + (size_t)i) * d.C + (size_t)r.h * d.HD;
}

/* ---- attention (ops_attn.c): probabilities saved -------------------------- */

/* Query row i of (b, h): scores s_j = scale q_i.k_j for j <= i, the softmax
 * (max subtracted) into att's row (zeros above the diagonal), and
 * out_i = sum_j p_j v_j. */
static inline PW_HD void pw_cu_attn_fwd_body(float *out, float *att, const float *qkv, pw_cu_attn_dims d,
                                             size_t idx) {
  pw_cu__row r = pw_cu__row_of(d, idx);
  size_t C3 = 3 * (size_t)d.C;
  const float *q0 = qkv + pw_cu__qkv0(d, r), *q = q0 + (size_t)r.i * C3;
  float *p = att + idx * (size_t)d.T; /* row i of (b, h): ((b NH + h) T + i) T */
  float mx = 0.0f, sum = 0.0f;
  for (int j = 0; j <= r.i; j++) {
    float s = d.scale * pw_cu__dot(q, q0 + (size_t)j * C3 + d.C, d.HD);
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
  float *o = out + pw_cu__out_at(d, r, r.i);
  const float *v0 = q0 + 2 * (size_t)d.C;
  for (int e = 0; e < d.HD; e++) {
    float a = 0.0f;
    for (int j = 0; j <= r.i; j++) a += p[j] * v0[(size_t)j * C3 + e];
    o[e] = a;
  }
}

/* The backward runs in groups of pairs (b, h): D_i = sum_j p_ij dp_ij of
 * each row of a group is kept in the scratch (ops.h: at least T T floats)
 * between its two kernels, T floats a pair, so a group is T pairs. */
static inline PW_HD int pw_cu_attn_bwd_group(int T) { return T; }

/* Query row i of pair p0 + idx / T: dp_j = dout_i.v_j, D_i = sum_j p_j dp_j
 * into D[idx] (D: the group's first pair), dS_j = p_j (dp_j - D_i) and
 * dq_i = scale sum_j dS_j k_j. */
static inline PW_HD void pw_cu_attn_bwd_q_body(float *dqkv, float *D, const float *dout, const float *qkv,
                                               const float *att, pw_cu_attn_dims d, int acc, size_t p0, size_t idx) {
  pw_cu__row r = pw_cu__row_of(d, p0 * (size_t)d.T + idx);
  size_t C3 = 3 * (size_t)d.C;
  size_t q0 = pw_cu__qkv0(d, r);
  const float *k0 = qkv + q0 + d.C, *v0 = qkv + q0 + 2 * (size_t)d.C;
  const float *dO = dout + pw_cu__out_at(d, r, r.i);
  const float *p = att + (r.p * (size_t)d.T + (size_t)r.i) * d.T;
  float Di = 0.0f;
  for (int j = 0; j <= r.i; j++) Di += p[j] * pw_cu__dot(dO, v0 + (size_t)j * C3, d.HD);
  D[idx] = Di;
  float *dq = dqkv + q0 + (size_t)r.i * C3;
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ATTN_CHUNK) {
    int w = d.HD - e0 < PW_CU_ATTN_CHUNK ? d.HD - e0 : PW_CU_ATTN_CHUNK;
    float g[PW_CU_ATTN_CHUNK];
    for (int e = 0; e < w; e++) g[e] = 0.0f;
    for (int j = 0; j <= r.i; j++) {
      float ds = p[j] * (pw_cu__dot(dO, v0 + (size_t)j * C3, d.HD) - Di);
      const float *kj = k0 + (size_t)j * C3 + e0;
      for (int e = 0; e < w; e++) g[e] += ds * kj[e];
    }
    for (int e = 0; e < w; e++) dq[e0 + e] = pw_cu__acc(acc, dq[e0 + e], d.scale * g[e]);
  }
}

/* Key row j of pair p0 + idx / T, over the query rows i >= j that see it:
 * dk_j = scale sum_i dS_ij q_i, dv_j = sum_i p_ij dout_i, with the D the
 * q kernel left in D (the group's). */
static inline PW_HD void pw_cu_attn_bwd_kv_body(float *dqkv, const float *D, const float *dout, const float *qkv,
                                                const float *att, pw_cu_attn_dims d, int acc, size_t p0,
                                                size_t idx) {
  pw_cu__row r = pw_cu__row_of(d, p0 * (size_t)d.T + idx);
  int j = r.i;
  size_t C3 = 3 * (size_t)d.C;
  size_t q0 = pw_cu__qkv0(d, r);
  const float *vj = qkv + q0 + 2 * (size_t)d.C + (size_t)j * C3;
  const float *Dp = D + (idx - (size_t)j); /* row 0 of this pair */
  const float *pc = att + r.p * (size_t)d.T * d.T + (size_t)j; /* column j: row i at + i T */
  float *dk = dqkv + q0 + d.C + (size_t)j * C3, *dv = dk + d.C;
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ATTN_CHUNK) {
    int w = d.HD - e0 < PW_CU_ATTN_CHUNK ? d.HD - e0 : PW_CU_ATTN_CHUNK;
    float gk[PW_CU_ATTN_CHUNK], gv[PW_CU_ATTN_CHUNK];
    for (int e = 0; e < w; e++) gk[e] = gv[e] = 0.0f;
    for (int i = j; i < d.T; i++) {
      const float *dO = dout + pw_cu__out_at(d, r, i);
      const float *qi = qkv + q0 + (size_t)i * C3 + e0;
      float pij = pc[(size_t)i * d.T];
      float ds = pij * (pw_cu__dot(dO, vj, d.HD) - Dp[i]);
      for (int e = 0; e < w; e++) {
        gk[e] += ds * qi[e];
        gv[e] += pij * dO[e0 + e];
      }
    }
    for (int e = 0; e < w; e++) {
      dk[e0 + e] = pw_cu__acc(acc, dk[e0 + e], d.scale * gk[e]);
      dv[e0 + e] = pw_cu__acc(acc, dv[e0 + e], gv[e]);
    }
  }
}

/* ---- attention_tiled (ops_flash.c): lse saved, nothing T x T -------------- */

/* Query row i of (b, h) with an online softmax over keys j <= i (running
 * max m, sum l, the output rescaled by exp(m_old - m_new) when m grows):
 * out_i = sum_j exp(s_j - m) v_j / l and lse_i = m + log l. */
static inline PW_HD void pw_cu_attn_tiled_fwd_body(float *out, float *lse, const float *qkv, pw_cu_attn_dims d,
                                                   size_t idx) {
  pw_cu__row r = pw_cu__row_of(d, idx);
  size_t C3 = 3 * (size_t)d.C;
  const float *q0 = qkv + pw_cu__qkv0(d, r), *q = q0 + (size_t)r.i * C3;
  const float *k0 = q0 + d.C, *v0 = q0 + 2 * (size_t)d.C;
  float *o = out + pw_cu__out_at(d, r, r.i);
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ATTN_CHUNK) {
    int w = d.HD - e0 < PW_CU_ATTN_CHUNK ? d.HD - e0 : PW_CU_ATTN_CHUNK;
    float a[PW_CU_ATTN_CHUNK];
    float m = d.scale * pw_cu__dot(q, k0, d.HD), l = 1.0f; /* key 0: every row sees it */
    for (int e = 0; e < w; e++) a[e] = v0[e0 + e];
    for (int j = 1; j <= r.i; j++) {
      float s = d.scale * pw_cu__dot(q, k0 + (size_t)j * C3, d.HD);
      if (s > m) {
        float al = expf(m - s);
        l *= al;
        for (int e = 0; e < w; e++) a[e] *= al;
        m = s;
      }
      float pj = expf(s - m);
      const float *vj = v0 + (size_t)j * C3 + e0;
      l += pj;
      for (int e = 0; e < w; e++) a[e] += pj * vj[e];
    }
    float inv = 1.0f / l;
    for (int e = 0; e < w; e++) o[e0 + e] = a[e] * inv;
    if (e0 == 0) lse[idx] = m + logf(l); /* (b NH + h) T + i */
  }
}

/* Query row i of (b, h): p_j = exp(s_j - lse_i) recomputed, D_i =
 * dout_i.out_i, dS_j = p_j (dout_i.v_j - D_i), dq_i = scale sum_j dS_j k_j. */
static inline PW_HD void pw_cu_attn_tiled_bwd_q_body(float *dqkv, const float *dout, const float *out,
                                                     const float *qkv, const float *lse, pw_cu_attn_dims d, int acc,
                                                     size_t idx) {
  pw_cu__row r = pw_cu__row_of(d, idx);
  size_t C3 = 3 * (size_t)d.C;
  size_t q0 = pw_cu__qkv0(d, r);
  const float *q = qkv + q0 + (size_t)r.i * C3, *k0 = qkv + q0 + d.C, *v0 = qkv + q0 + 2 * (size_t)d.C;
  size_t oi = pw_cu__out_at(d, r, r.i);
  const float *dO = dout + oi;
  float Di = pw_cu__dot(dO, out + oi, d.HD), L = lse[idx];
  float *dq = dqkv + q0 + (size_t)r.i * C3;
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ATTN_CHUNK) {
    int w = d.HD - e0 < PW_CU_ATTN_CHUNK ? d.HD - e0 : PW_CU_ATTN_CHUNK;
    float g[PW_CU_ATTN_CHUNK];
    for (int e = 0; e < w; e++) g[e] = 0.0f;
    for (int j = 0; j <= r.i; j++) {
      float pj = expf(d.scale * pw_cu__dot(q, k0 + (size_t)j * C3, d.HD) - L);
      float ds = pj * (pw_cu__dot(dO, v0 + (size_t)j * C3, d.HD) - Di);
      const float *kj = k0 + (size_t)j * C3 + e0;
      for (int e = 0; e < w; e++) g[e] += ds * kj[e];
    }
    for (int e = 0; e < w; e++) dq[e0 + e] = pw_cu__acc(acc, dq[e0 + e], d.scale * g[e]);
  }
}

/* Key row j of (b, h) over the query rows i >= j: p_ij recomputed from
 * lse_i, D_i = dout_i.out_i, dk_j = scale sum_i dS_ij q_i, dv_j = sum_i
 * p_ij dout_i. */
static inline PW_HD void pw_cu_attn_tiled_bwd_kv_body(float *dqkv, const float *dout, const float *out,
                                                      const float *qkv, const float *lse, pw_cu_attn_dims d, int acc,
                                                      size_t idx) {
  pw_cu__row r = pw_cu__row_of(d, idx);
  int j = r.i;
  size_t C3 = 3 * (size_t)d.C;
  size_t q0 = pw_cu__qkv0(d, r);
  const float *kj = qkv + q0 + d.C + (size_t)j * C3, *vj = kj + d.C;
  const float *L = lse + (idx - (size_t)j); /* row 0 of this pair */
  float *dk = dqkv + q0 + d.C + (size_t)j * C3, *dv = dk + d.C;
  for (int e0 = 0; e0 < d.HD; e0 += PW_CU_ATTN_CHUNK) {
    int w = d.HD - e0 < PW_CU_ATTN_CHUNK ? d.HD - e0 : PW_CU_ATTN_CHUNK;
    float gk[PW_CU_ATTN_CHUNK], gv[PW_CU_ATTN_CHUNK];
    for (int e = 0; e < w; e++) gk[e] = gv[e] = 0.0f;
    for (int i = j; i < d.T; i++) {
      const float *qi = qkv + q0 + (size_t)i * C3;
      size_t oi = pw_cu__out_at(d, r, i);
      const float *dO = dout + oi;
      float pij = expf(d.scale * pw_cu__dot(qi, kj, d.HD) - L[i]);
      float ds = pij * (pw_cu__dot(dO, vj, d.HD) - pw_cu__dot(dO, out + oi, d.HD));
      for (int e = 0; e < w; e++) {
        gk[e] += ds * qi[e0 + e];
        gv[e] += pij * dO[e0 + e];
      }
    }
    for (int e = 0; e < w; e++) {
      dk[e0 + e] = pw_cu__acc(acc, dk[e0 + e], d.scale * gk[e]);
      dv[e0 + e] = pw_cu__acc(acc, dv[e0 + e], gv[e]);
    }
  }
}

#endif
