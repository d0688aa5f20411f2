/* ops_attn: rotary position embeddings, QK-norm and grouped-query
 * self-attention on packed qkv rows (ops.h), causal or with ops.h's
 * pw_attn_mask (a sliding window, bidirectional, a padding mask).
 * Contracts are in ops.h.
 *
 * Attention works per (batch, head) directly on the packed tensor through
 * sgemm leading dimensions (3C for q/k/v, C for out): q, k and v are never
 * copied. The mask's structure is exploited by walking the T rows in blocks
 * of ATTN_BLOCK: row block [r0,r1) only ever needs the key columns its rows
 * see, [0,r1) causal (half the work for long sequences), [r1 - window,
 * r1) under a sliding window. Pad keys get a score of -inf. Never allocates: the forward uses
 * `att` itself as the score buffer, the backward a T*T scratch. Softmax
 * rows use ops_math.h (vectorized exact exp, lane-wise max and sums). The
 * loops around the sgemms are PW_CPU_DISPATCH functions (cpu.h).
 * train.precision "bf16" runs the same blocks with the products on bf16
 * operands (pw_gemm_bf16, bf16.h; the rule in docs/contracts.md#bf16). */
#include "ops.h"

#include <math.h>
#include <string.h>

#include "bf16.h"
#include "cpu.h"
#include "gemm.h"
#include "log.h"
#include "ops_flash.h"
#include "ops_math.h"

/* Rows per causal block: big enough for efficient sgemm, small enough that
 * skipping the blocks above the diagonal pays off. */
#define ATTN_BLOCK 64

/* ---- rope ---------------------------------------------------------------- */

/* Frequencies once per call per chunk of pairs (ops_rope.h), cos/sin per
 * position, on the stack. */
#define ROPE_CHUNK 64

/* Rows t of each sequence sit at position t0 + t (a KV-cache decode's new
 * rows continue a sequence). backward: out = the transpose rotation of inp,
 * accumulated (acc) or not. */
static PW_CPU_DISPATCH(rope_apply, (float *out, const float *inp, int B, int T, int t0, int C,
                                    int NH, int NKV, const pw_rope *r, int backward, int acc),
                       (out, inp, B, T, t0, C, NH, NKV, r, backward, acc)) {
  PW_ASSERT(NH > 0 && C % NH == 0 && NKV > 0 && NH % NKV == 0);
  int HD = C / NH;
  PW_ASSERT(HD % 2 == 0);
  int half = HD / 2, KW = NKV * HD;
  size_t W = (size_t)C + 2 * (size_t)KW;
  float inv[ROPE_CHUNK], cs[ROPE_CHUNK], sn[ROPE_CHUNK];
  for (int i0 = 0; i0 < half; i0 += ROPE_CHUNK) {
    int i1 = i0 + ROPE_CHUNK < half ? i0 + ROPE_CHUNK : half;
    for (int i = i0; i < i1; i++) inv[i - i0] = pw_rope_inv_freq(r, i, HD);
    for (int t = 0; t < T; t++) {
      for (int i = i0; i < i1; i++) {
        float ang = (float)(t0 + t) * inv[i - i0];
        cs[i - i0] = cosf(ang);
        sn[i - i0] = sinf(ang);
      }
      for (int b = 0; b < B; b++) {
        const float *x = inp + ((size_t)b * T + t) * W;
        float *y = out + ((size_t)b * T + t) * W;
        /* q and k heads are NH + NKV consecutive HD-blocks. */
        for (int h = 0; h < NH + NKV; h++) {
          const float *xh = x + (size_t)h * HD;
          float *yh = y + (size_t)h * HD;
          for (int i = i0; i < i1; i++) {
            float c = cs[i - i0], s = sn[i - i0];
            float x1 = xh[i], x2 = xh[i + half];
            if (!backward) {
              yh[i] = x1 * c - x2 * s;
              yh[i + half] = x2 * c + x1 * s;
            } else { /* the transpose rotation */
              yh[i] = pw__acc(acc, yh[i], x1 * c + x2 * s);
              yh[i + half] = pw__acc(acc, yh[i + half], x2 * c - x1 * s);
            }
          }
        }
      }
    }
  }
  for (size_t row = 0; row < (size_t)B * T; row++) {
    const float *xv = inp + row * W + C + KW;
    float *yv = out + row * W + C + KW;
    if (!backward)
      memcpy(yv, xv, (size_t)KW * sizeof(float));
    else
      for (int c = 0; c < KW; c++) yv[c] = pw__acc(acc, yv[c], xv[c]);
  }
}

void pw_rope_forward(float *out, const float *inp, int B, int T, int C, int NH, int NKV, const pw_rope *r) {
  rope_apply(out, inp, B, T, 0, C, NH, NKV, r, 0, 0);
}

void pw_rope_forward_at(float *out, const float *inp, int T, int t0, int C, int NH, int NKV, const pw_rope *r) {
  rope_apply(out, inp, 1, T, t0, C, NH, NKV, r, 0, 0);
}

void pw_rope_backward_input(float *dinp, const float *dout, int B, int T, int C, int NH, int NKV,
                            const pw_rope *r, int acc) {
  rope_apply(dinp, dout, B, T, 0, C, NH, NKV, r, 1, acc);
}

/* ---- qk-norm ------------------------------------------------------------- */

/* Row n's NH query heads are NH rows of HD for pw_rmsnorm_*, its NKV key
 * heads NKV more: the same kernels, the same bits as a head's own norm. */
void pw_qknorm_forward(float *out, float *rstd, const float *inp, const float *wq, const float *wk, int N, int NH,
                       int NKV, int HD, float eps) {
  size_t W = (size_t)(NH + 2 * NKV) * HD, Q = (size_t)NH * HD, K = (size_t)NKV * HD;
  for (size_t n = 0; n < (size_t)N; n++) {
    float *r = rstd + n * (size_t)(NH + NKV);
    pw_rmsnorm_forward(out + n * W, r, inp + n * W, wq, NH, HD, eps);
    pw_rmsnorm_forward(out + n * W + Q, r + NH, inp + n * W + Q, wk, NKV, HD, eps);
    memcpy(out + n * W + Q + K, inp + n * W + Q + K, K * sizeof(float));
  }
}

void pw_qknorm_backward_input(float *dinp, const float *dout, const float *inp, const float *wq, const float *wk,
                              const float *rstd, int N, int NH, int NKV, int HD, int acc) {
  size_t W = (size_t)(NH + 2 * NKV) * HD, Q = (size_t)NH * HD, K = (size_t)NKV * HD;
  for (size_t n = 0; n < (size_t)N; n++) {
    const float *r = rstd + n * (size_t)(NH + NKV);
    float *dx = dinp + n * W;
    const float *dy = dout + n * W, *x = inp + n * W;
    pw_rmsnorm_backward_input(dx, dy, x, wq, r, NH, HD, acc);
    pw_rmsnorm_backward_input(dx + Q, dy + Q, x + Q, wk, r + NH, NKV, HD, acc);
    for (size_t c = Q + K; c < W; c++) dx[c] = pw__acc(acc, dx[c], dy[c]);
  }
}

void pw_qknorm_backward_weight(float *dwq, float *dwk, const float *dout, const float *inp, const float *rstd, int N,
                               int NH, int NKV, int HD) {
  size_t W = (size_t)(NH + 2 * NKV) * HD, Q = (size_t)NH * HD;
  for (size_t n = 0; n < (size_t)N; n++) {
    const float *r = rstd + n * (size_t)(NH + NKV);
    pw_rmsnorm_backward_weight(dwq, dout + n * W, inp + n * W, r, NH, HD);
    pw_rmsnorm_backward_weight(dwk, dout + n * W + Q, inp + n * W + Q, r + NH, NKV, HD);
  }
}

/* ---- attention ----------------------------------------------------------- */

/* One sequence's mask (ops.h's pw_attn_mask): row i sees keys [lo, hi),
 * less its pad keys. */
typedef struct {
  int T, window, causal;
  const int32_t *tok; /* the sequence's tokens, or NULL */
  int32_t pad;
} amask;

static amask mask_of(const pw_attn_mask *mk, int b, int T) {
  amask m = {.T = T, .causal = 1};
  if (mk) {
    m.window = mk->window, m.causal = !mk->bidir, m.pad = mk->pad;
    m.tok = mk->tok ? mk->tok + (size_t)b * T : NULL;
  }
  return m;
}

static inline int row_lo(const amask *m, int i) { return pw__attn_first_key(i, m->window); }
static inline int row_hi(const amask *m, int i) { return m->causal ? i + 1 : m->T; }
/* The columns of rows [r0, r1) that the backward's key blocks read: the
 * blocks of ATTN_BLOCK keys their keys fall in. */
static inline int span_lo(const amask *m, int r0) { return row_lo(m, r0) / ATTN_BLOCK * ATTN_BLOCK; }
static inline int span_hi(const amask *m, int r1) {
  int h = (row_hi(m, r1 - 1) + ATTN_BLOCK - 1) / ATTN_BLOCK * ATTN_BLOCK;
  return h < m->T ? h : m->T;
}

static void check_mask(const pw_attn_mask *mk) {
  PW_ASSERT(!mk || (mk->window >= 0 && (!mk->window || !mk->bidir) && (mk->bidir == 0 || mk->bidir == 1)));
}

/* The pad mask on row p's scores [a, b): a pad key's score is -inf (its
 * exp 0), or every score 0 where all its keys are pad (a uniform row). */
static inline void mask_row(float *p, int a, int b, const amask *m) {
  if (pw__attn_all_pad(m->tok, m->pad, a, b)) {
    memset(p + a, 0, (size_t)(b - a) * sizeof(float));
    return;
  }
  for (int j = a; j < b; j++)
    if (m->tok[j] == m->pad) p[j] = -INFINITY;
}

/* Softmax of each row i of P[r0:r1] (row length T) over its keys [lo, hi),
 * one phase at a time over the block's rows (max, exp, sum, scale): the
 * serial chains that combine a row's lanes then overlap across rows. exp
 * and scale run on to a whole number of PW_LANES (within c1, the block's
 * last key: scores there too, zeroed at the end) rather than end in a
 * scalar tail of up to 15 exps, which cost more than the whole vectors.
 * The rest of each row is zeroed. */
static PW_CPU_DISPATCH(softmax_block, (float *P, int T, int r0, int r1, int c1, const amask *m),
                       (P, T, r0, r1, c1, m)) {
  float rv[ATTN_BLOCK]; /* per row: its max, then 1 / its sum */
  if (m->tok)
    for (int i = r0; i < r1; i++) mask_row(P + (size_t)i * T, row_lo(m, i), row_hi(m, i), m);
  for (int i = r0; i < r1; i++) {
    int a = row_lo(m, i);
    rv[i - r0] = pw__max(P + (size_t)i * T + a, row_hi(m, i) - a);
  }
  for (int i = r0; i < r1; i++) {
    float *p = P + (size_t)i * T, mx = rv[i - r0];
    int a = row_lo(m, i), n = a + (row_hi(m, i) - a + PW_LANES - 1) / PW_LANES * PW_LANES;
    n = n < c1 ? n : c1;
    for (int j = a; j < n; j++) p[j] = pw__exp(p[j] - mx);
  }
  for (int i = r0; i < r1; i++) {
    int a = row_lo(m, i);
    rv[i - r0] = 1.0f / pw__sum(P + (size_t)i * T + a, row_hi(m, i) - a);
  }
  for (int i = r0; i < r1; i++) {
    float *p = P + (size_t)i * T, inv = rv[i - r0];
    int a = row_lo(m, i), b = row_hi(m, i), n = a + (b - a + PW_LANES - 1) / PW_LANES * PW_LANES;
    n = n < c1 ? n : c1;
    for (int j = a; j < n; j++) p[j] *= inv;
    memset(p, 0, (size_t)a * sizeof(float));
    memset(p + b, 0, (size_t)(T - b) * sizeof(float));
  }
}

void pw_attention_forward_mask(float *out, float *att, const float *qkv, int B, int T, int C, int NH, int NKV,
                               const pw_attn_mask *mk) {
  PW_ASSERT(NH > 0 && C % NH == 0 && NKV > 0 && NH % NKV == 0);
  check_mask(mk);
  int HD = C / NH, G = NH / NKV;
  int C3 = C + 2 * NKV * HD; /* a packed row: q, k, v */
  float scale = 1.0f / sqrtf((float)HD);
  for (int b = 0; b < B; b++) {
    amask m = mask_of(mk, b, T);
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * C3 + (size_t)h * HD;
      const float *k = qkv + (size_t)b * T * C3 + C + (size_t)(h / G) * HD; /* its key/value head */
      const float *v = k + (size_t)NKV * HD;
      float *o = out + (size_t)b * T * C + (size_t)h * HD;
      float *P = att + ((size_t)b * NH + h) * T * T;
      for (int r0 = 0; r0 < T; r0 += ATTN_BLOCK) {
        int r1 = r0 + ATTN_BLOCK < T ? r0 + ATTN_BLOCK : T;
        int rows = r1 - r0, c0 = row_lo(&m, r0), c1 = row_hi(&m, r1 - 1); /* the keys the block sees */
        /* S[r0:r1, c0:c1] = scale * Q[r0:r1] K[c0:c1]^T */
        pw_sgemm(0, 1, rows, c1 - c0, HD, scale, q + (size_t)r0 * C3, C3, k + (size_t)c0 * C3, C3, 0.0f,
                 P + (size_t)r0 * T + c0, T);
        softmax_block(P, T, r0, r1, c1, &m);
        /* O[r0:r1] = P[r0:r1, c0:c1] V[c0:c1] */
        pw_sgemm(0, 0, rows, HD, c1 - c0, 1.0f, P + (size_t)r0 * T + c0, T, v + (size_t)c0 * C3, C3, 0.0f,
                 o + (size_t)r0 * C, C);
      }
    }
  }
}

void pw_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH, int NKV) {
  pw_attention_forward_mask(out, att, qkv, B, T, C, NH, NKV, NULL);
}

/* dS = P * (dP - rowsum(dP * P)) in place on rows [r0, r1) of dS (row
 * length T) over each row's keys; zero elsewhere within the block's span
 * (span_lo, span_hi), and in a uniform row (its scores were constants). */
static PW_CPU_DISPATCH(softmax_grad_block, (float *dS, const float *P, int T, int r0, int r1, const amask *m),
                       (dS, P, T, r0, r1, m)) {
  int za = span_lo(m, r0), zb = span_hi(m, r1);
  for (int i = r0; i < r1; i++) {
    float *d = dS + (size_t)i * T;
    const float *p = P + (size_t)i * T;
    int a = row_lo(m, i), b = row_hi(m, i);
    if (pw__attn_all_pad(m->tok, m->pad, a, b)) {
      memset(d + za, 0, (size_t)(zb - za) * sizeof(float));
      continue;
    }
    float dot = pw__dot(d + a, p + a, b - a);
    for (int j = a; j < b; j++) d[j] = p[j] * (d[j] - dot);
    for (int j = za; j < a; j++) d[j] = 0.0f;
    for (int j = b; j < zb; j++) d[j] = 0.0f;
  }
}

/* Rows [*lo, *hi) see some key of block [c0, c1). */
static void rows_of_block(const amask *m, int c0, int c1, int *lo, int *hi) {
  *lo = m->causal ? c0 : 0;
  *hi = m->window && c1 + m->window - 1 < m->T ? c1 + m->window - 1 : m->T;
}

void pw_attention_backward_input_mask(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                      const float *att, int B, int T, int C, int NH, int NKV, int acc,
                                      const pw_attn_mask *mk) {
  PW_ASSERT(NH > 0 && C % NH == 0 && NKV > 0 && NH % NKV == 0);
  check_mask(mk);
  int HD = C / NH, G = NH / NKV;
  int C3 = C + 2 * NKV * HD;
  float scale = 1.0f / sqrtf((float)HD);
  /* Each element of dqkv is written by exactly one sgemm below, so beta
   * = 0 overwrites it (OpenBLAS: a zeroing pass, then the beta = 1 kernel). */
  float beta = acc ? 1.0f : 0.0f;
  float *dS = scratch; /* (T,T): dP, then turned into dS in place */
  for (int b = 0; b < B; b++) {
    amask m = mask_of(mk, b, T);
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * C3 + (size_t)h * HD;
      const float *k = qkv + (size_t)b * T * C3 + C + (size_t)(h / G) * HD; /* its key/value head */
      const float *v = k + (size_t)NKV * HD;
      float *dq = dqkv + (size_t)b * T * C3 + (size_t)h * HD;
      float *dk = dqkv + (size_t)b * T * C3 + C + (size_t)(h / G) * HD;
      float *dv = dk + (size_t)NKV * HD;
      /* a group's later heads add into its first one's dK and dV */
      float beta_kv = h % G ? 1.0f : beta;
      const float *dO = dout + (size_t)b * T * C + (size_t)h * HD;
      const float *P = att + ((size_t)b * NH + h) * T * T;
      for (int r0 = 0; r0 < T; r0 += ATTN_BLOCK) {
        int r1 = r0 + ATTN_BLOCK < T ? r0 + ATTN_BLOCK : T;
        int rows = r1 - r0, c0 = row_lo(&m, r0), c1 = row_hi(&m, r1 - 1);
        /* dP[r0:r1, c0:c1] = dO[r0:r1] V[c0:c1]^T */
        pw_sgemm(0, 1, rows, c1 - c0, HD, 1.0f, dO + (size_t)r0 * C, C, v + (size_t)c0 * C3, C3, 0.0f,
                 dS + (size_t)r0 * T + c0, T);
        /* dS = P * (dP - rowsum(dP * P)); zero off each row's keys */
        softmax_grad_block(dS, P, T, r0, r1, &m);
        /* dQ[r0:r1] (+)= scale * dS[r0:r1, c0:c1] K[c0:c1] */
        pw_sgemm(0, 0, rows, HD, c1 - c0, scale, dS + (size_t)r0 * T + c0, T, k + (size_t)c0 * C3, C3, beta,
                 dq + (size_t)r0 * C3, C3);
      }
      for (int c0 = 0; c0 < T; c0 += ATTN_BLOCK) {
        int c1 = c0 + ATTN_BLOCK < T ? c0 + ATTN_BLOCK : T;
        int cols = c1 - c0, i0, i1;
        rows_of_block(&m, c0, c1, &i0, &i1); /* causal: queries i >= c0 */
        /* dK[c0:c1] (+)= scale * dS[i0:i1, c0:c1]^T Q[i0:i1] */
        pw_sgemm(1, 0, cols, HD, i1 - i0, scale, dS + (size_t)i0 * T + c0, T, q + (size_t)i0 * C3, C3, beta_kv,
                 dk + (size_t)c0 * C3, C3);
        /* dV[c0:c1] (+)= P[i0:i1, c0:c1]^T dO[i0:i1] */
        pw_sgemm(1, 0, cols, HD, i1 - i0, 1.0f, P + (size_t)i0 * T + c0, T, dO + (size_t)i0 * C, C, beta_kv,
                 dv + (size_t)c0 * C3, C3);
      }
    }
  }
}

void pw_attention_backward_input(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                 const float *att, int B, int T, int C, int NH, int NKV, int acc) {
  pw_attention_backward_input_mask(dqkv, scratch, dout, qkv, att, B, T, C, NH, NKV, acc, NULL);
}

/* ---- attention with bf16 products (train.precision "bf16") --------------- */

/* The same blocks and softmax as above; the four products take bf16
 * operands through pw_gemm_bf16 (float32 accumulation): q, k, v and dout
 * converted once per call, P and scale * dS per row block. bs layout:
 * qkv (B*T*3C), then forward P's block (ATTN_BLOCK*T <= 2T*T) or backward
 * dout (B*T*C), P (T*T) and scale * dS (T*T). */
/* rows x n of src into dst, both with row length ld */
static void rows_to_bf16(pw_bf16 *dst, const float *src, int ld, int rows, int n) {
  for (int i = 0; i < rows; i++) pw_bf16_from_f32(dst + (size_t)i * ld, src + (size_t)i * ld, (size_t)n);
}

/* rows x n of x (row length ld) times s */
static void scale_rows(float *x, int ld, int rows, int n, float s) {
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < n; j++) x[(size_t)i * ld + j] *= s;
}

void pw_attention_forward_bf16_mask(float *out, float *att, pw_bf16 *bs, const float *qkv, int B, int T, int C,
                                    int NH, int NKV, const pw_attn_mask *mk) {
  PW_ASSERT(NH > 0 && C % NH == 0 && NKV > 0 && NH % NKV == 0);
  check_mask(mk);
  int HD = C / NH, G = NH / NKV;
  int C3 = C + 2 * NKV * HD;
  float scale = 1.0f / sqrtf((float)HD);
  pw_bf16 *qkvb = bs, *pb = bs + (size_t)B * T * C3;
  pw_bf16_from_f32(qkvb, qkv, (size_t)B * T * C3);
  for (int b = 0; b < B; b++) {
    amask m = mask_of(mk, b, T);
    for (int h = 0; h < NH; h++) {
      const pw_bf16 *q = qkvb + (size_t)b * T * C3 + (size_t)h * HD;
      const pw_bf16 *k = qkvb + (size_t)b * T * C3 + C + (size_t)(h / G) * HD;
      const pw_bf16 *v = k + (size_t)NKV * HD;
      float *o = out + (size_t)b * T * C + (size_t)h * HD;
      float *P = att + ((size_t)b * NH + h) * T * T;
      for (int r0 = 0; r0 < T; r0 += ATTN_BLOCK) {
        int r1 = r0 + ATTN_BLOCK < T ? r0 + ATTN_BLOCK : T;
        int rows = r1 - r0, c0 = row_lo(&m, r0), c1 = row_hi(&m, r1 - 1);
        float *Pb = P + (size_t)r0 * T + c0;
        /* S[r0:r1, c0:c1] = Q[r0:r1] K[c0:c1]^T, then times scale in float32 */
        pw_gemm_bf16(0, 1, rows, c1 - c0, HD, q + (size_t)r0 * C3, C3, k + (size_t)c0 * C3, C3, 0, Pb, T);
        scale_rows(Pb, T, rows, c1 - c0, scale);
        softmax_block(P, T, r0, r1, c1, &m);
        /* O[r0:r1] = bf16(P[r0:r1, c0:c1]) V[c0:c1]; P itself stays float32 */
        rows_to_bf16(pb + c0, Pb, T, rows, c1 - c0);
        pw_gemm_bf16(0, 0, rows, HD, c1 - c0, pb + c0, T, v + (size_t)c0 * C3, C3, 0, o + (size_t)r0 * C, C);
      }
    }
  }
}

void pw_attention_forward_bf16(float *out, float *att, pw_bf16 *bs, const float *qkv, int B, int T, int C,
                               int NH, int NKV) {
  pw_attention_forward_bf16_mask(out, att, bs, qkv, B, T, C, NH, NKV, NULL);
}

void pw_attention_backward_input_bf16_mask(float *dqkv, float *scratch, pw_bf16 *bs, const float *dout,
                                           const float *qkv, const float *att, int B, int T, int C, int NH,
                                           int NKV, int acc, const pw_attn_mask *mk) {
  PW_ASSERT(NH > 0 && C % NH == 0 && NKV > 0 && NH % NKV == 0);
  check_mask(mk);
  int HD = C / NH, G = NH / NKV;
  int C3 = C + 2 * NKV * HD;
  float scale = 1.0f / sqrtf((float)HD);
  pw_bf16 *qkvb = bs, *dob = bs + (size_t)B * T * C3;
  pw_bf16 *pb = dob + (size_t)B * T * C, *dsb = pb + (size_t)T * T;
  pw_bf16_from_f32(qkvb, qkv, (size_t)B * T * C3);
  pw_bf16_from_f32(dob, dout, (size_t)B * T * C);
  float *dS = scratch; /* (T,T): dP, then dS in place, then scale * dS */
  for (int b = 0; b < B; b++) {
    amask m = mask_of(mk, b, T);
    for (int h = 0; h < NH; h++) {
      const pw_bf16 *q = qkvb + (size_t)b * T * C3 + (size_t)h * HD;
      const pw_bf16 *k = qkvb + (size_t)b * T * C3 + C + (size_t)(h / G) * HD;
      const pw_bf16 *v = k + (size_t)NKV * HD;
      float *dq = dqkv + (size_t)b * T * C3 + (size_t)h * HD;
      float *dk = dqkv + (size_t)b * T * C3 + C + (size_t)(h / G) * HD;
      float *dv = dk + (size_t)NKV * HD;
      /* a group's later heads add into its first one's dK and dV */
      int acc_kv = acc || h % G;
      const pw_bf16 *dO = dob + (size_t)b * T * C + (size_t)h * HD;
      const float *P = att + ((size_t)b * NH + h) * T * T;
      for (int r0 = 0; r0 < T; r0 += ATTN_BLOCK) {
        int r1 = r0 + ATTN_BLOCK < T ? r0 + ATTN_BLOCK : T;
        int rows = r1 - r0, c0 = row_lo(&m, r0), c1 = row_hi(&m, r1 - 1);
        int za = span_lo(&m, r0), zb = span_hi(&m, r1);
        size_t at = (size_t)r0 * T;
        pw_gemm_bf16(0, 1, rows, c1 - c0, HD, dO + (size_t)r0 * C, C, v + (size_t)c0 * C3, C3, 0, dS + at + c0, T);
        softmax_grad_block(dS, P, T, r0, r1, &m);
        /* the later products read rows [r0, r1) over the block's span only */
        scale_rows(dS + at + za, T, rows, zb - za, scale);
        rows_to_bf16(dsb + at + za, dS + at + za, T, rows, zb - za);
        rows_to_bf16(pb + at + za, P + at + za, T, rows, zb - za);
        pw_gemm_bf16(0, 0, rows, HD, c1 - c0, dsb + at + c0, T, k + (size_t)c0 * C3, C3, acc, dq + (size_t)r0 * C3,
                     C3);
      }
      for (int c0 = 0; c0 < T; c0 += ATTN_BLOCK) {
        int c1 = c0 + ATTN_BLOCK < T ? c0 + ATTN_BLOCK : T;
        int cols = c1 - c0, i0, i1;
        rows_of_block(&m, c0, c1, &i0, &i1);
        pw_gemm_bf16(1, 0, cols, HD, i1 - i0, dsb + (size_t)i0 * T + c0, T, q + (size_t)i0 * C3, C3, acc_kv,
                     dk + (size_t)c0 * C3, C3);
        pw_gemm_bf16(1, 0, cols, HD, i1 - i0, pb + (size_t)i0 * T + c0, T, dO + (size_t)i0 * C, C, acc_kv,
                     dv + (size_t)c0 * C3, C3);
      }
    }
  }
}

void pw_attention_backward_input_bf16(float *dqkv, float *scratch, pw_bf16 *bs, const float *dout,
                                      const float *qkv, const float *att, int B, int T, int C, int NH,
                                      int NKV, int acc) {
  pw_attention_backward_input_bf16_mask(dqkv, scratch, bs, dout, qkv, att, B, T, C, NH, NKV, acc, NULL);
}
