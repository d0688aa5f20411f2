/* cu_ops_body: the arithmetic of the CUDA kernels of cu_ops.cu and
 * cu_optim.cu, one thread's work per call, in plain C so that gcc compiles
 * the very same bodies for tests/unit/test_cu_emul.c, which runs them over
 * every index on the CPU against ops.h's kernels: the only check their
 * indexing gets on a machine without a GPU.
 *
 * A body computes one output element (`_el`, index i over the output), one
 * row (`_row`, row n: its reductions run serially in the thread) or one
 * column (`_col`: a parameter gradient summed over the rows in row order,
 * as ops.c's loops add them). No atomics, no shared memory, so every run
 * gives the same bits. Where ops.c sums a row in PW_LANES double lanes
 * (ops_math.h's pw__sum_d, pw__dot_d, pw__sqdev_d) the body keeps the same
 * lanes in the same order, and exp, tanh and log are taken in double and
 * rounded once, as ops_math.h's correctly rounded float ones are: with
 * nvcc's --fmad=false (no contraction, as gcc's ISO C mode) the GPU gives
 * the CPU's bits but for GEMMs and the rare double-rounding case.
 *
 * Layouts and contracts are ops.h's; gradients stored with acc are
 * (acc ? old : 0) + g. Must never: allocate, touch memory outside the
 * arguments, or let a thread's result depend on another thread's. */
#ifndef PW_CU_OPS_BODY_H
#define PW_CU_OPS_BODY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "hd.h"

#define PW_CU_LANES 16  /* ops_math.h's PW_LANES */
#define PW_CU_CHUNK 256 /* ops.c's LN_CHUNK: the norms' backward sums chunk by chunk */

/* ops_math.h's pw__acc */
static inline PW_HD float pw_cu__accum(int acc, float old, float g) { return (acc ? old : 0.0f) + g; }

/* e^x and tanh x correctly rounded to float (but for double rounding,
 * ~2^-29 of inputs): what ops_math.h's pw__exp and pw__tanh give. Clamps
 * are not needed: double neither overflows nor underflows where float
 * does. */
static inline PW_HD float pw_cu__exp(float x) { return (float)exp((double)x); }
static inline PW_HD float pw_cu__tanh(float x) { return (float)tanh((double)x); }

/* ---- ops_math.h's lane reductions, the same order --------------------------- */

static inline PW_HD double pw_cu__sum_d(const float *x, int n) {
  double s[PW_CU_LANES] = {0};
  int j = 0;
  for (; j + PW_CU_LANES <= n; j += PW_CU_LANES)
    for (int l = 0; l < PW_CU_LANES; l++) s[l] += (double)x[j + l];
  double r = 0;
  for (int l = 0; l < PW_CU_LANES; l++) r += s[l];
  for (; j < n; j++) r += (double)x[j];
  return r;
}

static inline PW_HD double pw_cu__dot_d(const float *x, const float *y, int n) {
  double s[PW_CU_LANES] = {0};
  int j = 0;
  for (; j + PW_CU_LANES <= n; j += PW_CU_LANES)
    for (int l = 0; l < PW_CU_LANES; l++) s[l] += (double)x[j + l] * y[j + l];
  double r = 0;
  for (int l = 0; l < PW_CU_LANES; l++) r += s[l];
  for (; j < n; j++) r += (double)x[j] * y[j];
  return r;
}

/* pw__max (n >= 1; isgreater is > for the NaN-free inputs it assumes) */
static inline PW_HD float pw_cu__max(const float *x, int n) {
  float m[PW_CU_LANES];
  int j = 0;
  for (int l = 0; l < PW_CU_LANES; l++) m[l] = x[0];
  for (; j + PW_CU_LANES <= n; j += PW_CU_LANES)
    for (int l = 0; l < PW_CU_LANES; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  float r = m[0];
  for (int l = 1; l < PW_CU_LANES; l++) r = m[l] > r ? m[l] : r;
  for (; j < n; j++) r = x[j] > r ? x[j] : r;
  return r;
}

/* ---- embeddings -------------------------------------------------------------- */

/* out (N,C) element i = wte[tok[i / C], i % C] */
static inline PW_HD void pw_cu_embed_f_el(float *out, const int32_t *tok, const float *wte, int C, size_t i) {
  size_t n = i / (size_t)C, c = i % (size_t)C;
  out[i] = wte[(size_t)tok[n] * (size_t)C + c];
}

/* Column c of dwte over the N rows in order: the CPU's += sequence for
 * every element (two rows of one token add in row order). */
static inline PW_HD void pw_cu_embed_w_col(float *dwte, const float *dout, const int32_t *tok, int N, int C, int c) {
  for (int n = 0; n < N; n++) dwte[(size_t)tok[n] * (size_t)C + c] += dout[(size_t)n * (size_t)C + c];
}

/* out (B,T,C) element i = inp[i] + wpe[t, c] */
static inline PW_HD void pw_cu_posembed_f_el(float *out, const float *inp, const float *wpe, int T, int C, size_t i) {
  size_t c = i % (size_t)C, t = i / (size_t)C % (size_t)T;
  out[i] = inp[i] + wpe[t * (size_t)C + c];
}

/* the gradient copied (or added) through: posembed's and concat's dinp */
static inline PW_HD void pw_cu_pass_el(float *din, const float *dout, int acc, size_t i) {
  din[i] = pw_cu__accum(acc, din[i], dout[i]);
}

/* dwpe (T,C) element j += dout[b, j] for b in order */
static inline PW_HD void pw_cu_posembed_w_el(float *dwpe, const float *dout, int B, int T, int C, size_t j) {
  size_t TC = (size_t)T * (size_t)C;
  float a = dwpe[j];
  for (int b = 0; b < B; b++) a += dout[(size_t)b * TC + j];
  dwpe[j] = a;
}

/* ---- linear: the GEMMs as cuBLAS calls, the bias ------------------------------ */

/* One cuBLAS sgemm call, column-major: C (m,n) = alpha op(A) (m,k) op(B)
 * (k,n) + beta C; op T when ta / tb. */
typedef struct {
  int ta, tb, m, n, k;
  const float *a;
  int lda;
  const float *b;
  int ldb;
  float *c;
  int ldc;
} pw_cu_gemm;

/* pw_sgemm's row-major call (gemm.h: C (M,N) = op(A) (M,K) op(B) (K,N))
 * as cuBLAS's column-major one. A row-major (r,c) matrix with leading
 * dimension ld is, read column-major, its transpose (c,r) with the same
 * ld. So C^T (N,M) = op(B)^T op(A)^T: swap A and B (with their lds),
 * swap M and N, keep each operand's own transpose flag. */
static inline PW_HD pw_cu_gemm pw_cu_gemm_of(int ta, int tb, int M, int N, int K, const float *A, int lda,
                                             const float *B, int ldb, float *C, int ldc) {
  pw_cu_gemm g = {tb, ta, N, M, K, B, ldb, A, lda, C, ldc};
  return g;
}

/* ops.c's three linear GEMMs, argument for argument:
 * out (N,OC) (+)= inp (N,C) @ w^T, w (OC,C) */
static inline PW_HD pw_cu_gemm pw_cu_linear_f_gemm(float *out, const float *inp, const float *w, int N, int C,
                                                   int OC) {
  return pw_cu_gemm_of(0, 1, N, OC, C, inp, C, w, C, out, OC);
}
/* dinp (N,C) (+)= dout (N,OC) @ w (OC,C) */
static inline PW_HD pw_cu_gemm pw_cu_linear_i_gemm(float *dinp, const float *dout, const float *w, int N, int C,
                                                   int OC) {
  return pw_cu_gemm_of(0, 0, N, C, OC, dout, OC, w, C, dinp, C);
}
/* dw (OC,C) += dout^T (OC,N) @ inp (N,C) */
static inline PW_HD pw_cu_gemm pw_cu_linear_w_gemm(float *dw, const float *dout, const float *inp, int N, int C,
                                                   int OC) {
  return pw_cu_gemm_of(1, 0, OC, C, N, dout, OC, inp, C, dw, C);
}

/* out (N,OC) element i = bias[i % OC]: the GEMM then adds with beta 1 (torch.addmm) */
static inline PW_HD void pw_cu_bias_fill_el(float *out, const float *bias, int OC, size_t i) {
  out[i] = bias[i % (size_t)OC];
}

/* ---- column sums in two stages --------------------------------------------------- */

/* A weight gradient that sums a column over the N rows (a bias, a norm's
 * weight) runs as two launches: part k of column c sums rows [k R, (k + 1)
 * R) in order (a thread per (column, part): N / R times the threads of one
 * per column, so that the rows' loads are in flight together — one thread
 * per column kept a GPT-2's 768 columns on 3 SMs), then a thread per
 * column adds its parts in order to the gradient. The same bits every run,
 * but not the CPU's (one serial sum a column): within float32 rounding of
 * them. R rows a part; parts (N + R - 1) / R, each of them C floats. */
#define PW_CU_COL_ROWS 64
static inline PW_HD int pw_cu_col_parts(int N) { return (N + PW_CU_COL_ROWS - 1) / PW_CU_COL_ROWS; }

/* d[c] += the parts of column c in order (part k at part[k C + c]) */
static inline PW_HD void pw_cu_col_total(float *d, const float *part, int np, int C, int c) {
  float s = 0.0f;
  for (int k = 0; k < np; k++) s += part[(size_t)k * (size_t)C + c];
  d[c] += s;
}

/* Part k of dbias[o]: dout[n, o] over the part's rows in order */
static inline PW_HD void pw_cu_bias_w_part(float *part, const float *dout, int N, int OC, int o, int k) {
  int n1 = (k + 1) * PW_CU_COL_ROWS < N ? (k + 1) * PW_CU_COL_ROWS : N;
  float a = 0.0f;
  for (int n = k * PW_CU_COL_ROWS; n < n1; n++) a += dout[(size_t)n * (size_t)OC + o];
  part[(size_t)k * (size_t)OC + o] = a;
}

/* ---- layernorm (aux: mean (N), rstd (N)) --------------------------------------- */

/* The rows (forward, backward_input) are cu_rows_body.h's block programs. */

/* Part k of column c of dw (dy xhat) and db (dy) over the part's rows in
 * order, into pw and pb (the two-stage column sums above) */
static inline PW_HD void pw_cu_layernorm_w_part(float *pw, float *pb, const float *dout, const float *inp,
                                                const float *mean, const float *rstd, int N, int C, int c, int k) {
  int n1 = (k + 1) * PW_CU_COL_ROWS < N ? (k + 1) * PW_CU_COL_ROWS : N;
  float aw = 0.0f, ab = 0.0f;
  for (int n = k * PW_CU_COL_ROWS; n < n1; n++) {
    size_t i = (size_t)n * (size_t)C + c;
    aw += dout[i] * ((inp[i] - mean[n]) * rstd[n]);
    ab += dout[i];
  }
  pw[(size_t)k * (size_t)C + c] = aw;
  pb[(size_t)k * (size_t)C + c] = ab;
}

/* ---- rmsnorm (aux: rstd (N)) ----------------------------------------------------- */

/* One thread's row, qk_norm's heads' (the rmsnorm op's rows are
 * cu_rows_body.h's block programs, the same sums). off: 0 for rmsnorm, 1
 * for Gemma's rmsnorm_offset (the scale 1 + w), as ops.c's */
static inline PW_HD void pw_cu_rmsnorm_f_row(float *out, float *rstd, const float *inp, const float *w, float off,
                                             int C, float eps, int n) {
  const float *x = inp + (size_t)n * (size_t)C;
  float *y = out + (size_t)n * (size_t)C;
  double ss = pw_cu__dot_d(x, x, C);
  float rs = 1.0f / sqrtf((float)(ss / C) + eps);
  for (int c = 0; c < C; c++) y[c] = (off + w[c]) * (x[c] * rs);
  rstd[n] = rs;
}

/* dx (+)= rstd (g - xhat mean(g xhat)), g = dy w, xhat = x rstd; the sum
 * chunk by chunk in lanes as ops.c's */
static inline PW_HD void pw_cu_rmsnorm_i_row(float *dinp, const float *dout, const float *inp, const float *w,
                                             float off, const float *rstd, int C, int acc, int n) {
  size_t o = (size_t)n * (size_t)C;
  const float *x = inp + o, *dy = dout + o;
  float *dx = dinp + o;
  float rs = rstd[n];
  double sgx = 0.0;
  for (int c0 = 0; c0 < C; c0 += PW_CU_CHUNK) {
    int len = C - c0 < PW_CU_CHUNK ? C - c0 : PW_CU_CHUNK;
    double s[PW_CU_LANES] = {0};
    int j = 0;
    for (; j + PW_CU_LANES <= len; j += PW_CU_LANES)
      for (int l = 0; l < PW_CU_LANES; l++) {
        int c = c0 + j + l;
        float g = dy[c] * (off + w[c]), xh = x[c] * rs;
        s[l] += (double)g * xh;
      }
    double r = 0;
    for (int l = 0; l < PW_CU_LANES; l++) r += s[l];
    for (; j < len; j++) {
      int c = c0 + j;
      float g = dy[c] * (off + w[c]), xh = x[c] * rs;
      r += (double)g * xh;
    }
    sgx += r;
  }
  float mgx = (float)(sgx / C);
  for (int c = 0; c < C; c++) dx[c] = pw_cu__accum(acc, dx[c], rs * (dy[c] * (off + w[c]) - (x[c] * rs) * mgx));
}

/* Part k of column c of dw (dy x rstd) over the part's rows in order */
static inline PW_HD void pw_cu_rmsnorm_w_part(float *part, const float *dout, const float *inp, const float *rstd,
                                              int N, int C, int c, int k) {
  int n1 = (k + 1) * PW_CU_COL_ROWS < N ? (k + 1) * PW_CU_COL_ROWS : N;
  float a = 0.0f;
  for (int n = k * PW_CU_COL_ROWS; n < n1; n++) {
    size_t i = (size_t)n * (size_t)C + c;
    a += dout[i] * (inp[i] * rstd[n]);
  }
  part[(size_t)k * (size_t)C + c] = a;
}

/* ---- qk_norm (Qwen3): an RMSNorm over each q and k head of a qkv row ----------------- */

/* Segment s of the N (NH + 2 NKV) HD-blocks: a q head (wq) or a k head (wk)
 * normalised, its rstd at row n's NH + NKV; a v head copied (ops_attn.c's
 * pw_qknorm_forward, the rmsnorm rows above) */
static inline PW_HD void pw_cu_qknorm_f_seg(float *out, float *rstd, const float *inp, const float *wq, const float *wk,
                                            int NH, int NKV, int HD, float eps, size_t s) {
  int heads = NH + 2 * NKV, hh = (int)(s % (size_t)heads);
  size_t n = s / (size_t)heads, o = s * (size_t)HD;
  if (hh >= NH + NKV) {
    for (int e = 0; e < HD; e++) out[o + e] = inp[o + e];
    return;
  }
  pw_cu_rmsnorm_f_row(out + o, rstd + n * (size_t)(NH + NKV) + hh, inp + o, hh < NH ? wq : wk, 0.0f, HD, eps, 0);
}

static inline PW_HD void pw_cu_qknorm_i_seg(float *dinp, const float *dout, const float *inp, const float *wq,
                                            const float *wk, const float *rstd, int NH, int NKV, int HD, int acc,
                                            size_t s) {
  int heads = NH + 2 * NKV, hh = (int)(s % (size_t)heads);
  size_t n = s / (size_t)heads, o = s * (size_t)HD;
  if (hh >= NH + NKV) {
    for (int e = 0; e < HD; e++) dinp[o + e] = pw_cu__accum(acc, dinp[o + e], dout[o + e]);
    return;
  }
  pw_cu_rmsnorm_i_row(dinp + o, dout + o, inp + o, hh < NH ? wq : wk, 0.0f, rstd + n * (size_t)(NH + NKV) + hh, HD,
                      acc, 0);
}

/* Column c2 of [wq | wk] (2 HD): its rows n, then its heads, in the CPU's
 * order of additions into dw */
static inline PW_HD void pw_cu_qknorm_w_col(float *dwq, float *dwk, const float *dout, const float *inp,
                                            const float *rstd, int N, int NH, int NKV, int HD, int c2) {
  int k = c2 >= HD, c = c2 - k * HD, h0 = k ? NH : 0, nh = k ? NKV : NH, heads = NH + 2 * NKV;
  float *dw = k ? dwk : dwq;
  if (!dw) return; /* that half frozen */
  float a = dw[c];
  for (int n = 0; n < N; n++)
    for (int h = h0; h < h0 + nh; h++) {
      size_t kk = ((size_t)n * heads + (size_t)h) * HD + (size_t)c;
      a += dout[kk] * (inp[kk] * rstd[(size_t)n * (NH + NKV) + (size_t)h]);
    }
  dw[c] = a;
}

/* ---- activations (element i of n) ------------------------------------------------ */

/* ops.c's GELU_BETA (sqrt(2/pi) as M_SQRT2 * M_2_SQRTPI * 0.5) and GELU_KAPPA */
#define PW_CU_GELU_BETA ((float)(1.41421356237309504880 * 1.12837916709551257390 * 0.5))
#define PW_CU_GELU_KAPPA 0.044715f

/* out = gelu(x); dgelu = gelu'(x), term for term as ops.c's forward */
static inline PW_HD void pw_cu_gelu_f_el(float *out, float *dgelu, const float *inp, size_t i) {
  float x = inp[i];
  float th = pw_cu__tanh(PW_CU_GELU_BETA * (x + PW_CU_GELU_KAPPA * (x * x * x)));
  float left = 0.5f * x;
  float right = 1.0f + th;
  out[i] = left * right;
  float dleft = 0.5f * right;
  float dtanh = 1.0f - th * th;
  float dinner = PW_CU_GELU_BETA * (1.0f + 3.0f * PW_CU_GELU_KAPPA * (x * x));
  dgelu[i] = dleft + left * dtanh * dinner;
}

static inline PW_HD void pw_cu_gelu_i_el(float *dinp, const float *dout, const float *dgelu, int acc, size_t i) {
  dinp[i] = pw_cu__accum(acc, dinp[i], dout[i] * dgelu[i]);
}

static inline PW_HD void pw_cu_relu_f_el(float *out, const float *inp, size_t i) {
  out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

static inline PW_HD void pw_cu_relu_i_el(float *dinp, const float *dout, const float *inp, int acc, size_t i) {
  float base = acc ? dinp[i] : 0.0f;
  dinp[i] = inp[i] > 0.0f ? base + dout[i] : base;
}

static inline PW_HD void pw_cu_silu_f_el(float *out, const float *inp, size_t i) {
  out[i] = inp[i] / (1.0f + pw_cu__exp(-inp[i]));
}

static inline PW_HD void pw_cu_silu_i_el(float *dinp, const float *dout, const float *inp, int acc, size_t i) {
  float x = inp[i], s = 1.0f / (1.0f + pw_cu__exp(-x));
  dinp[i] = pw_cu__accum(acc, dinp[i], dout[i] * (s * (1.0f + x * (1.0f - s))));
}

static inline PW_HD void pw_cu_swiglu_f_el(float *out, const float *gate, const float *up, size_t i) {
  out[i] = gate[i] / (1.0f + pw_cu__exp(-gate[i])) * up[i];
}

/* dgate and dup may be one buffer (gate == up, acc_up 1): dgate's store first, as on the CPU */
static inline PW_HD void pw_cu_swiglu_i_el(float *dgate, float *dup, const float *dout, const float *gate,
                                           const float *up, int acc_gate, int acc_up, size_t i) {
  float g = gate[i], e = pw_cu__exp(-g), s = 1.0f / (1.0f + e);
  float silu = g / (1.0f + e);
  dgate[i] = pw_cu__accum(acc_gate, dgate[i], dout[i] * up[i] * (s * (1.0f + g * (1.0f - s))));
  dup[i] = pw_cu__accum(acc_up, dup[i], dout[i] * silu);
}

/* Gemma's GeGLU: out = gelu_tanh(gate) * up in PyTorch's order, the
 * backward term for term as ops.c's pw_geglu_backward_input (the tanh
 * recomputed); dgate and dup may be one buffer, dgate's store first */
static inline PW_HD void pw_cu_geglu_f_el(float *out, const float *gate, const float *up, size_t i) {
  float x = gate[i];
  float th = pw_cu__tanh(PW_CU_GELU_BETA * (x + PW_CU_GELU_KAPPA * (x * x * x)));
  out[i] = 0.5f * x * (1.0f + th) * up[i];
}

static inline PW_HD void pw_cu_geglu_i_el(float *dgate, float *dup, const float *dout, const float *gate,
                                          const float *up, int acc_gate, int acc_up, size_t i) {
  float x = gate[i];
  float th = pw_cu__tanh(PW_CU_GELU_BETA * (x + PW_CU_GELU_KAPPA * (x * x * x)));
  float left = 0.5f * x, right = 1.0f + th;
  float dleft = 0.5f * right, dtanh = 1.0f - th * th;
  float dinner = PW_CU_GELU_BETA * (1.0f + 3.0f * PW_CU_GELU_KAPPA * (x * x));
  float dg = dout[i] * up[i] * (dleft + left * dtanh * dinner);
  float du = dout[i] * (left * right);
  dgate[i] = pw_cu__accum(acc_gate, dgate[i], dg);
  dup[i] = pw_cu__accum(acc_up, dup[i], du);
}

/* Gemma's embedding scale: out = inp * s (s = sqrt(d) as float32, the node's base) */
static inline PW_HD void pw_cu_scale_f_el(float *out, const float *inp, float sc, size_t i) { out[i] = inp[i] * sc; }
static inline PW_HD void pw_cu_scale_i_el(float *dinp, const float *dout, float sc, int acc, size_t i) {
  dinp[i] = pw_cu__accum(acc, dinp[i], dout[i] * sc);
}

static inline PW_HD void pw_cu_add_f_el(float *out, const float *a, const float *b, size_t i) { out[i] = a[i] + b[i]; }

/* da and db may be one buffer (a + a, acc_b 1): da's store first */
static inline PW_HD void pw_cu_add_i_el(float *da, float *db, const float *dout, int acc_a, int acc_b, size_t i) {
  da[i] = pw_cu__accum(acc_a, da[i], dout[i]);
  db[i] = pw_cu__accum(acc_b, db[i], dout[i]);
}

/* ---- losses ------------------------------------------------------------------------ */

/* cross-entropy's rows: cu_rows_body.h's pw_cu_xent_f_block, 16 lanes a
 * row (ops.c's lanes), rowloss[n] = -log softmax[n, t_n] in double, which
 * xent_total adds in row order */
/* the loss: scale * the rows' sum, the rows in order */
static inline PW_HD float pw_cu_xent_total(const double *rowloss, int N, float scale) {
  double tot = 0.0;
  for (int n = 0; n < N; n++) tot += rowloss[n];
  return (float)(tot * scale);
}

/* dlogits (N,V) element i (+)= scale p, less scale at the target */
static inline PW_HD void pw_cu_xent_i_el(float *dlogits, const float *probs, const int32_t *targets, int V,
                                         float scale, int acc, size_t i) {
  size_t n = i / (size_t)V;
  float d = pw_cu__accum(acc, dlogits[i], scale * probs[i]);
  if ((size_t)targets[n] == i % (size_t)V) d -= scale;
  dlogits[i] = d;
}

/* scale * sum (pred - target)^2 in double, serially in element order:
 * ops.c's sum (the losses of regression models are small) */
static inline PW_HD float pw_cu_mse_f(const float *pred, const float *target, size_t n, float scale) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)pred[i] - target[i];
    s += d * d;
  }
  return (float)(s * scale);
}

static inline PW_HD void pw_cu_mse_i_el(float *dpred, const float *pred, const float *target, float scale, int acc,
                                        size_t i) {
  float s2 = 2.0f * scale;
  dpred[i] = pw_cu__accum(acc, dpred[i], s2 * (pred[i] - target[i]));
}

/* ---- concat: row r of out is a's C floats, then b's D ------------------------------- */

static inline PW_HD void pw_cu_concat_f_el(float *out, const float *a, const float *b, int C, int D, size_t i) {
  size_t W = (size_t)C + (size_t)D, r = i / W, k = i % W;
  out[i] = k < (size_t)C ? a[r * (size_t)C + k] : b[r * (size_t)D + (k - (size_t)C)];
}

/* din (rows, w) element i (+)= dout[r, off + k], dout's rows `stride` wide */
static inline PW_HD void pw_cu_concat_i_el(float *din, const float *dout, int w, int off, int stride, int acc,
                                           size_t i) {
  size_t r = i / (size_t)w, k = i % (size_t)w;
  din[i] = pw_cu__accum(acc, din[i], dout[r * (size_t)stride + (size_t)off + k]);
}

/* ---- optimizer (optim.c's loops, element i) -------------------------------------- */

static inline PW_HD void pw_cu_adamw_el(float *w, const float *g, float *m, float *v, float gs, float decay, float b1,
                                        float b2, float eps, float step, float bc2s, size_t i) {
  float gi = g[i] * gs;
  w[i] *= decay;
  m[i] = m[i] * b1 + gi * (1.0f - b1);
  v[i] = v[i] * b2 + (1.0f - b2) * gi * gi;
  float denom = sqrtf(v[i]) / bc2s + eps;
  w[i] -= step * (m[i] / denom);
}

/* first: the first step (t == 1 in optim.c), whose momentum buffer starts as the gradient */
static inline PW_HD void pw_cu_sgd_el(float *w, const float *g, float *buf, float gs, float wd, float mom, float lr,
                                      int first, size_t i) {
  float gi = g[i] * gs + wd * w[i];
  if (mom != 0.0f) {
    buf[i] = first ? gi : buf[i] * mom + gi;
    gi = buf[i];
  }
  w[i] -= lr * gi;
}

/* sqnorm's fixed shape (cu_optim.cu): SQ_BLOCKS blocks of SQ_THREADS */
#define PW_CU_SQ_BLOCKS 264 /* two waves of an H100/H200's 132 SMs; fixed, so the order is too */
#define PW_CU_SQ_THREADS 256

/* sqnorm's first stage: thread t of nt sums g[t], g[t + nt], ... squared
 * in double; the partials are then added in thread order (cu_optim.cu) */
static inline PW_HD double pw_cu_sqnorm_part(const float *g, size_t n, size_t t, size_t nt) {
  double s = 0.0;
  for (size_t i = t; i < n; i += nt) s += (double)g[i] * g[i];
  return s;
}

#endif
