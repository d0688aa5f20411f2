/* test_cu_emul: the CUDA backend's kernel bodies (common/cuda/cu_ops_body.h)
 * compiled by gcc and run here, over every index their kernels cover,
 * against the CPU's kernels (ops.h) and optimizer (optim.h) on random
 * inputs: the only check of their indexing on a machine without a GPU.
 *
 * - Forward, backward_input (acc 0 into NaN-filled buffers, and acc 1) and
 *   backward_weight (accumulating into random gradients) of embed,
 *   posembed, layernorm, rmsnorm, gelu, relu, silu, swiglu, add, xent, mse
 *   and concat; swiglu and add also with both inputs one value. Rows of 13
 *   and of 600 channels: the norms' sums in one chunk and in three (256,
 *   256, 88), lanes and tails.
 * - The same bits as the CPU where the body has no exp, tanh or log and no
 *   GEMM: its sums keep ops.c's order — but the column sums of the bias
 *   and norm weight gradients (parts of 64 rows, then their totals: within
 *   1e-6 of the largest; test_many_rows over three parts). The norms' rows
 *   run as their GPU blocks (16 lanes a row), in both thread orders. Through exp/tanh/log, within 1e-6 of
 *   the largest element (double-precision libm rounded once against
 *   ops_math.h's correctly rounded floats).
 * - linear: its three GEMMs as the cuBLAS calls cu_ops.cu makes
 *   (pw_cu_linear_*_gemm: pw_sgemm's row-major arguments turned
 *   column-major) run through cuBLAS's sgemm as its documentation defines
 *   it, its leading dimensions checked as cuBLAS checks them, against
 *   pw_linear_* to 1e-5; the bias and its gradient exactly.
 * - AdamW and SGD (momentum and none, first step and later): the element
 *   bodies against pw_optim_step, the same bits; the squared norm's fixed
 *   grid against pw_grad_sqnorm to 1e-12.
 * - bf16 (cu_bf16_body.h): the round and the conversion bit for bit
 *   against bf16.c's over every high half with its edge low halves (ties,
 *   just past them, NaNs, infinities, subnormals) and random patterns;
 *   the bf16 linear's three products as cu_ops.cu's cublasGemmEx calls
 *   (bf16.c's pw_gemm_bf16 arguments through pw_cu_gemm_of, the operands
 *   converted by the element body and multiplied as documented) against
 *   pw_linear_*_bf16 to 1e-5, and the weight copy the forward leaves. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static int emu_reverse; /* the block programs' threads in the other order */
#define PW_PH_EMU_ORDER(i, n) (emu_reverse ? (n) - 1 - (i) : (i))

#include "bf16.h"
#include "cu_bf16_body.h"
#include "cu_ops_body.h"
#include "cu_rows_body.h"
#include "kernels.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "prog.h"

enum { B = 2, T = 5, N = B * T };

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double uniform(void) { /* [-1, 1) */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static float *rnd(size_t n, double scale) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = (float)(scale * uniform());
  return p;
}
static float *nans(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = NAN;
  return p;
}
static float *dup(const float *x, size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  assert_non_null(p);
  memcpy(p, x, n * sizeof(float));
  return p;
}
static int32_t *tokens(int n, int V) {
  int32_t *t = malloc((size_t)n * sizeof(int32_t));
  assert_non_null(t);
  for (int i = 0; i < n; i++) t[i] = (int32_t)((uniform() + 1.0) * 0.5 * V) % V;
  t[n - 1] = t[0]; /* a repeated token: two rows into one embedding row */
  return t;
}

/* the same bits, element by element (NaN never is) */
static void expect_same(const char *what, const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&got[i], &want[i], sizeof(float)) || isnan(got[i]))
      fail_msg("%s[%zu]: %.9g, the CPU's %.9g (not the same bits)", what, i, (double)got[i], (double)want[i]);
}

/* |got - want| <= tol * max |want| everywhere (NaN fails) */
static void expect_close(const char *what, const float *got, const float *want, size_t n, double tol) {
  double m = 0;
  size_t exact = 0;
  for (size_t i = 0; i < n; i++) m = fabs(want[i]) > m ? fabs(want[i]) : m;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= tol * m)) fail_msg("%s[%zu]: %.9g, the CPU's %.9g (tolerance %g of %g)", what, i, (double)got[i],
                                  (double)want[i], tol, m);
    exact += got[i] == want[i];
  }
  print_message("  %-28s %zu of %zu the CPU's bits\n", what, exact, n);
}

/* cu_ops.cu's norm row launches: each block of 16 rows in turn, its
 * shared memory poisoned (NaN doubles) first; twice, the threads of each
 * phase in the other order the second time (emu_rows runs fn both ways
 * into out and a copy; the two must agree, which a race would break). */
static unsigned char rows_sm[4 * PW_PH_NT * sizeof(double)];
typedef void (*rows_fn)(void *ctx, int blk);
static void emu_rows(rows_fn fn, void *ctx, int n, float *out, size_t nout) {
  float *start = malloc(nout * sizeof *start);
  assert_non_null(start);
  memcpy(start, out, nout * sizeof *start);
  float *first = malloc(nout * sizeof *first);
  assert_non_null(first);
  for (int r = 0; r < 2; r++) {
    emu_reverse = r;
    if (r) memcpy(first, out, nout * sizeof *out), memcpy(out, start, nout * sizeof *out);
    for (int blk = 0; blk < pw_cu_rows_blocks(n); blk++) {
      memset(rows_sm, 0xff, sizeof rows_sm);
      fn(ctx, blk);
    }
  }
  emu_reverse = 0;
  for (size_t i = 0; i < nout; i++)
    if (memcmp(&first[i], &out[i], sizeof *out))
      fail_msg("norm rows: element %zu differs with the threads in the other order: a race", i);
  free(start), free(first);
}

/* The norms' row programs' arguments, and a block of each. */
typedef struct {
  float *out, *mean, *rstd, *din;
  const float *inp, *w, *b, *dout, *cmean, *crstd;
  double *rowloss;
  const int32_t *tgt;
  int n, C, acc;
  float eps, off;
} rows_args;
static void ln_f_blk(void *p, int blk) {
  rows_args *a = p;
  pw_cu_layernorm_f_block(a->out, a->mean, a->rstd, a->inp, a->w, a->b, a->n, a->C, a->eps, blk, rows_sm);
}
static void ln_i_blk(void *p, int blk) {
  rows_args *a = p;
  pw_cu_layernorm_i_block(a->din, a->dout, a->inp, a->w, a->cmean, a->crstd, a->n, a->C, a->acc, blk, rows_sm);
}
static void rms_f_blk(void *p, int blk) {
  rows_args *a = p;
  pw_cu_rmsnorm_f_block(a->out, a->rstd, a->inp, a->w, a->off, a->n, a->C, a->eps, blk, rows_sm);
}
static void rms_i_blk(void *p, int blk) {
  rows_args *a = p;
  pw_cu_rmsnorm_i_block(a->din, a->dout, a->inp, a->w, a->off, a->crstd, a->n, a->C, a->acc, blk, rows_sm);
}
static void xent_f_blk(void *p, int blk) {
  rows_args *a = p;
  pw_cu_xent_f_block(a->out, a->rowloss, a->inp, a->tgt, a->n, a->C, blk, rows_sm);
}
static void emu_xent_f(float *probs, double *rowloss, const float *logits, const int32_t *tgt, int n, int V) {
  rows_args a = {.out = probs, .rowloss = rowloss, .inp = logits, .tgt = tgt, .n = n, .C = V};
  emu_rows(xent_f_blk, &a, n, probs, (size_t)n * V);
}
/* layernorm forward: out (n C) then mean and rstd (2 n) in aux; the order
 * check covers out, the aux against the CPU's */
static void emu_layernorm_f(float *out, float *aux, const float *x, const float *w, const float *b, int n, int C,
                            float eps) {
  rows_args a = {.out = out, .mean = aux, .rstd = aux + n, .inp = x, .w = w, .b = b, .n = n, .C = C, .eps = eps};
  emu_rows(ln_f_blk, &a, n, out, (size_t)n * C);
}
static void emu_layernorm_i(float *d, const float *dout, const float *x, const float *w, const float *aux, int n,
                            int C, int acc) {
  rows_args a = {.din = d, .dout = dout, .inp = x, .w = w, .cmean = aux, .crstd = aux + n, .n = n, .C = C, .acc = acc};
  emu_rows(ln_i_blk, &a, n, d, (size_t)n * C);
}
static void emu_rmsnorm_f(float *out, float *rstd, const float *x, const float *w, float off, int n, int C, float eps) {
  rows_args a = {.out = out, .rstd = rstd, .inp = x, .w = w, .off = off, .n = n, .C = C, .eps = eps};
  emu_rows(rms_f_blk, &a, n, out, (size_t)n * C);
}
static void emu_rmsnorm_i(float *d, const float *dout, const float *x, const float *w, float off, const float *rstd,
                          int n, int C, int acc) {
  rows_args a = {.din = d, .dout = dout, .inp = x, .w = w, .off = off, .crstd = rstd, .n = n, .C = C, .acc = acc};
  emu_rows(rms_i_blk, &a, n, d, (size_t)n * C);
}

/* The two-stage column sums (a bias's, a norm's weight gradient: parts of
 * PW_CU_COL_ROWS rows, then their totals) are not the CPU's one serial
 * sum a column: within float32 rounding of it. */
#define COL_TOL 1e-6

/* cu_ops.cu's two launches of a column sum: every (column, part), then
 * each column's total (NULL: that half frozen, its total not launched) */
static void emu_bias_w(float *db, const float *dout, int n, int OC) {
  int np = pw_cu_col_parts(n);
  float *part = malloc((size_t)np * OC * sizeof *part);
  assert_non_null(part);
  for (int k = 0; k < np; k++)
    for (int o = 0; o < OC; o++) pw_cu_bias_w_part(part, dout, n, OC, o, k);
  for (int o = 0; o < OC; o++) pw_cu_col_total(db, part, np, OC, o);
  free(part);
}
static void emu_layernorm_w(float *dw, float *db, const float *dout, const float *x, const float *mean,
                            const float *rstd, int n, int C) {
  int np = pw_cu_col_parts(n);
  float *pw = malloc(2 * (size_t)np * C * sizeof *pw), *pb = pw + (size_t)np * C;
  assert_non_null(pw);
  for (int k = 0; k < np; k++)
    for (int c = 0; c < C; c++) pw_cu_layernorm_w_part(pw, pb, dout, x, mean, rstd, n, C, c, k);
  for (int c = 0; c < C; c++) {
    if (dw) pw_cu_col_total(dw, pw, np, C, c);
    if (db) pw_cu_col_total(db, pb, np, C, c);
  }
  free(pw);
}
static void emu_rmsnorm_w(float *dw, const float *dout, const float *x, const float *rstd, int n, int C) {
  int np = pw_cu_col_parts(n);
  float *part = malloc((size_t)np * C * sizeof *part);
  assert_non_null(part);
  for (int k = 0; k < np; k++)
    for (int c = 0; c < C; c++) pw_cu_rmsnorm_w_part(part, dout, x, rstd, n, C, c, k);
  for (int c = 0; c < C; c++) pw_cu_col_total(dw, part, np, C, c);
  free(part);
}

/* ---- embeddings ------------------------------------------------------------------ */

static void test_embed(void **state) {
  (void)state;
  int V = 11, C = 600;
  int32_t *tok = tokens(N, V);
  float *wte = rnd((size_t)V * C, 1), *out = nans((size_t)N * C), *want = nans((size_t)N * C);
  pw_embed_forward(want, tok, wte, N, C);
  for (size_t i = 0; i < (size_t)N * C; i++) pw_cu_embed_f_el(out, tok, wte, C, i);
  expect_same("embed forward", out, want, (size_t)N * C);

  float *dout = rnd((size_t)N * C, 1), *dw = rnd((size_t)V * C, 1), *dw_want = dup(dw, (size_t)V * C);
  pw_embed_backward_weight(dw_want, dout, tok, N, C);
  for (int c = 0; c < C; c++) pw_cu_embed_w_col(dw, dout, tok, N, C, c);
  expect_same("embed backward_weight", dw, dw_want, (size_t)V * C);
  free(tok), free(wte), free(out), free(want), free(dout), free(dw), free(dw_want);
}

static void test_posembed(void **state) {
  (void)state;
  int C = 13, Tmax = 7;
  size_t n = (size_t)N * C;
  float *inp = rnd(n, 1), *wpe = rnd((size_t)Tmax * C, 1), *out = nans(n), *want = nans(n);
  pw_posembed_forward(want, inp, wpe, B, T, C);
  for (size_t i = 0; i < n; i++) pw_cu_posembed_f_el(out, inp, wpe, T, C, i);
  expect_same("posembed forward", out, want, n);

  float *dout = rnd(n, 1);
  for (int acc = 0; acc <= 1; acc++) {
    float *d = acc ? rnd(n, 1) : nans(n), *dw = acc ? dup(d, n) : nans(n);
    pw_posembed_backward_input(dw, dout, B, T, C, acc);
    for (size_t i = 0; i < n; i++) pw_cu_pass_el(d, dout, acc, i);
    expect_same(acc ? "posembed backward_input acc" : "posembed backward_input", d, dw, n);
    free(d), free(dw);
  }
  float *dwpe = rnd((size_t)Tmax * C, 1), *dwpe_want = dup(dwpe, (size_t)Tmax * C);
  pw_posembed_backward_weight(dwpe_want, dout, B, T, C);
  for (size_t j = 0; j < (size_t)T * C; j++) pw_cu_posembed_w_el(dwpe, dout, B, T, C, j);
  expect_same("posembed backward_weight", dwpe, dwpe_want, (size_t)Tmax * C);
  free(inp), free(wpe), free(out), free(want), free(dout), free(dwpe), free(dwpe_want);
}

/* ---- linear: the cuBLAS calls ---------------------------------------------------- */

/* cuBLAS's sgemm as its documentation defines it, column-major: C (m,n) =
 * alpha op(A) op(B) + beta C, op(A) (m,k), op(B) (k,n); element (i,j) of
 * a matrix with leading dimension ld at [i + j ld]; beta 0 reads no C.
 * The leading dimensions are checked as cuBLAS does (else
 * CUBLAS_STATUS_INVALID_VALUE). */
static void cublas_sgemm(pw_cu_gemm g, float alpha, float beta) {
  assert_true(g.m >= 0 && g.n >= 0 && g.k >= 0);
  assert_true(g.lda >= (g.ta ? g.k : g.m) && g.lda >= 1);
  assert_true(g.ldb >= (g.tb ? g.n : g.k) && g.ldb >= 1);
  assert_true(g.ldc >= g.m && g.ldc >= 1);
  for (int j = 0; j < g.n; j++)
    for (int i = 0; i < g.m; i++) {
      double s = 0;
      for (int l = 0; l < g.k; l++) {
        float a = g.ta ? g.a[l + (size_t)i * g.lda] : g.a[i + (size_t)l * g.lda];
        float b = g.tb ? g.b[j + (size_t)l * g.ldb] : g.b[l + (size_t)j * g.ldb];
        s += (double)a * b;
      }
      float *c = &g.c[i + (size_t)j * g.ldc];
      *c = beta == 0.0f ? (float)(alpha * s) : (float)(alpha * s + (double)beta * *c);
    }
}

static void test_linear(void **state) {
  (void)state;
  int C = 37, OC = 23; /* N, C and OC all different: a swapped dimension shows */
  float *inp = rnd((size_t)N * C, 1), *w = rnd((size_t)OC * C, 1), *bias = rnd(OC, 1);
  for (int with_bias = 0; with_bias <= 1; with_bias++) { /* cu_ops.cu's linear_f */
    float *out = nans((size_t)N * OC), *want = nans((size_t)N * OC);
    const float *b = with_bias ? bias : NULL;
    pw_linear_forward(want, inp, w, b, N, C, OC);
    if (b)
      for (size_t i = 0; i < (size_t)N * OC; i++) pw_cu_bias_fill_el(out, b, OC, i);
    cublas_sgemm(pw_cu_linear_f_gemm(out, inp, w, N, C, OC), 1.0f, b ? 1.0f : 0.0f);
    expect_close(b ? "linear forward, bias" : "linear forward", out, want, (size_t)N * OC, 1e-5);
    free(out), free(want);
  }
  float *dout = rnd((size_t)N * OC, 1);
  for (int acc = 0; acc <= 1; acc++) { /* linear_i */
    float *d = acc ? rnd((size_t)N * C, 1) : nans((size_t)N * C), *dw = acc ? dup(d, (size_t)N * C) : nans((size_t)N * C);
    pw_linear_backward_input(dw, dout, w, N, C, OC, acc);
    cublas_sgemm(pw_cu_linear_i_gemm(d, dout, w, N, C, OC), 1.0f, acc ? 1.0f : 0.0f);
    expect_close(acc ? "linear backward_input acc" : "linear backward_input", d, dw, (size_t)N * C, 1e-5);
    free(d), free(dw);
  }
  /* linear_w: dw += dout^T inp, dbias += column sums */
  float *gw = rnd((size_t)OC * C, 1), *gb = rnd(OC, 1), *gw_want = dup(gw, (size_t)OC * C), *gb_want = dup(gb, OC);
  pw_linear_backward_weight(gw_want, gb_want, dout, inp, N, C, OC);
  cublas_sgemm(pw_cu_linear_w_gemm(gw, dout, inp, N, C, OC), 1.0f, 1.0f);
  emu_bias_w(gb, dout, N, OC);
  expect_close("linear backward_weight", gw, gw_want, (size_t)OC * C, 1e-5);
  expect_close("linear backward_weight bias", gb, gb_want, OC, COL_TOL);
  free(inp), free(w), free(bias), free(dout), free(gw), free(gb), free(gw_want), free(gb_want);
}

/* ---- bf16 ------------------------------------------------------------------------ */

static float of_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* one pattern: the body's bits against bf16.c's, rounded and converted */
static void round_one(uint32_t u) {
  float x = of_bits(u), want = x, got = x;
  pw_bf16 b = 0;
  pw_bf16_round_f32(&want, 1);
  pw_cu_bf16_round_el(&got, 0);
  pw_cu_bf16_from_el(&b, &x, 0);
  if (memcmp(&got, &want, sizeof got) || b != pw_bf16_of(x) || pw_cu_bf16_bits(x) != b)
    fail_msg("bf16 of 0x%08x: body 0x%04x (%a), bf16.c 0x%04x (%a)", (unsigned)u, (unsigned)b, (double)got,
             (unsigned)pw_bf16_of(x), (double)want);
}

static void test_bf16_round(void **state) {
  (void)state;
  static const uint32_t low[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000, 0xc000};
  for (uint32_t hi = 0; hi < 0x10000u; hi++) /* every exponent and mantissa top: NaN, inf, subnormal, zero */
    for (size_t k = 0; k < sizeof low / sizeof low[0]; k++) round_one(hi << 16 | low[k]);
  for (int i = 0; i < 1000000; i++) round_one((uint32_t)(uniform() * 2147483648.0) * 2u + (i & 1));
  /* arrays, as the kernels run them */
  size_t n = 1000;
  float *x = rnd(n, 100), *want = dup(x, n), *got = dup(x, n);
  pw_bf16 *bw = malloc(n * sizeof *bw), *bg = malloc(n * sizeof *bg);
  assert_non_null(bw), assert_non_null(bg);
  pw_bf16_round_f32(want, n);
  pw_bf16_from_f32(bw, x, n);
  for (size_t i = 0; i < n; i++) pw_cu_bf16_round_el(got, i), pw_cu_bf16_from_el(bg, x, i);
  expect_same("bf16 round", got, want, n);
  assert_memory_equal(bg, bw, n * sizeof *bw);
  free(x), free(want), free(got), free(bw), free(bg);
}

/* cu_ops.cu's gemm_bf16: the row-major call turned column-major by
 * pw_cu_gemm_of, cublasGemmEx's product of the bf16 operands (widened
 * exactly here) */
static void gemm_bf16_emul(int ta, int tb, int M, int N_, int K, const pw_bf16 *A, int lda, const pw_bf16 *B_,
                           int ldb, int acc, float *C, int ldc) {
  size_t na = (size_t)(ta ? K : M) * (size_t)lda, nb = (size_t)(tb ? N_ : K) * (size_t)ldb;
  float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b);
  assert_non_null(a), assert_non_null(b);
  pw_bf16_to_f32(a, A, na);
  pw_bf16_to_f32(b, B_, nb);
  cublas_sgemm(pw_cu_gemm_of(ta, tb, M, N_, K, a, lda, b, ldb, C, ldc), 1.0f, acc ? 1.0f : 0.0f);
  free(a), free(b);
}

static pw_bf16 *to_bf16_emul(const float *x, size_t n) {
  pw_bf16 *b = malloc((n ? n : 1) * sizeof *b);
  assert_non_null(b);
  for (size_t i = 0; i < n; i++) pw_cu_bf16_from_el(b, x, i);
  return b;
}

static void test_linear_bf16(void **state) {
  (void)state;
  int C = 37, OC = 23;
  size_t nx = (size_t)N * C, ny = (size_t)N * OC, nw = (size_t)OC * C;
  float *inp = rnd(nx, 1), *w = rnd(nw, 1), *bias = rnd(OC, 1), *dout = rnd(ny, 1);
  pw_bf16 *wb = malloc(nw * sizeof *wb), *sc = malloc((nx + ny) * sizeof *sc);
  assert_non_null(wb), assert_non_null(sc);
  pw_bf16 *wbe = to_bf16_emul(w, nw), *xbe = to_bf16_emul(inp, nx), *dybe = to_bf16_emul(dout, ny);
  for (int with_bias = 0; with_bias <= 1; with_bias++) { /* linear_f */
    const float *b = with_bias ? bias : NULL;
    float *out = nans(ny), *want = nans(ny);
    pw_linear_forward_bf16(want, inp, w, wb, sc, b, N, C, OC);
    assert_memory_equal(wb, wbe, nw * sizeof *wb); /* the copy the backward reads */
    if (b)
      for (size_t i = 0; i < ny; i++) pw_cu_bias_fill_el(out, b, OC, i);
    gemm_bf16_emul(0, 1, N, OC, C, xbe, C, wbe, C, b != NULL, out, OC);
    expect_close(b ? "linear bf16 forward, bias" : "linear bf16 forward", out, want, ny, 1e-5);
    free(out), free(want);
  }
  for (int acc = 0; acc <= 1; acc++) { /* linear_i */
    float *d = acc ? rnd(nx, 1) : nans(nx), *dw = acc ? dup(d, nx) : nans(nx);
    pw_linear_backward_input_bf16(dw, dout, wb, sc + nx, N, C, OC, acc);
    gemm_bf16_emul(0, 0, N, C, OC, dybe, OC, wbe, C, acc, d, C);
    expect_close(acc ? "linear bf16 backward_input acc" : "linear bf16 backward_input", d, dw, nx, 1e-5);
    free(d), free(dw);
  }
  /* linear_w: dw += dout^T x in bf16, the bias in float32 */
  float *gw = rnd(nw, 1), *gb = rnd(OC, 1), *gw_want = dup(gw, nw), *gb_want = dup(gb, OC);
  pw_linear_backward_weight_bf16(gw_want, gb_want, dout, inp, sc + nx, sc, N, C, OC);
  gemm_bf16_emul(1, 0, OC, C, N, dybe, OC, xbe, C, 1, gw, C);
  emu_bias_w(gb, dout, N, OC);
  expect_close("linear bf16 backward_weight", gw, gw_want, nw, 1e-5);
  expect_close("linear bf16 backward_weight bias", gb, gb_want, OC, COL_TOL);
  free(inp), free(w), free(bias), free(dout), free(wb), free(sc), free(wbe), free(xbe), free(dybe);
  free(gw), free(gb), free(gw_want), free(gb_want);
}

/* ---- norms ----------------------------------------------------------------------- */

static void layernorm_at(int C) {
  size_t n = (size_t)N * C;
  float *x = rnd(n, 2), *w = rnd(C, 1), *b = rnd(C, 1);
  for (size_t i = 0; i < n; i++) x[i] += 0.5f; /* a mean away from 0 */
  float *out = nans(n), *aux = nans(2 * N), *want = nans(n), *aux_want = nans(2 * N);
  pw_layernorm_forward(want, aux_want, aux_want + N, x, w, b, N, C, 1e-5f);
  emu_layernorm_f(out, aux, x, w, b, N, C, 1e-5f);
  expect_same("layernorm forward", out, want, n);
  expect_same("layernorm mean, rstd", aux, aux_want, 2 * N);

  float *dout = rnd(n, 1);
  for (int acc = 0; acc <= 1; acc++) {
    float *d = acc ? rnd(n, 1) : nans(n), *dw = acc ? dup(d, n) : nans(n);
    pw_layernorm_backward_input(dw, dout, x, w, aux, aux + N, N, C, acc);
    emu_layernorm_i(d, dout, x, w, aux, N, C, acc);
    expect_same(acc ? "layernorm backward_input acc" : "layernorm backward_input", d, dw, n);
    free(d), free(dw);
  }
  /* W, with either half frozen too; then W then I = the CPU's one-pass backward */
  for (int frozen = 0; frozen < 3; frozen++) {
    float *gw = rnd(C, 1), *gb = rnd(C, 1), *gw_want = dup(gw, C), *gb_want = dup(gb, C);
    float *pw = frozen == 1 ? NULL : gw, *pb = frozen == 2 ? NULL : gb;
    pw_layernorm_backward_weight(frozen == 1 ? NULL : gw_want, frozen == 2 ? NULL : gb_want, dout, x, aux, aux + N, N, C);
    emu_layernorm_w(pw, pb, dout, x, aux, aux + N, N, C);
    expect_close("layernorm backward_weight w", gw, gw_want, C, COL_TOL);
    expect_close("layernorm backward_weight b", gb, gb_want, C, COL_TOL);
    free(gw), free(gb), free(gw_want), free(gb_want);
  }
  float *gw = rnd(C, 1), *gb = rnd(C, 1), *gw_want = dup(gw, C), *gb_want = dup(gb, C);
  float *d = rnd(n, 1), *dw = dup(d, n);
  pw_layernorm_backward(dw, gw_want, gb_want, dout, x, w, aux, aux + N, N, C, 1);
  emu_layernorm_w(gw, gb, dout, x, aux, aux + N, N, C);
  emu_layernorm_i(d, dout, x, w, aux, N, C, 1);
  expect_same("layernorm backward (W, I)", d, dw, n);
  expect_close("layernorm backward (W, I) w", gw, gw_want, C, COL_TOL);
  expect_close("layernorm backward (W, I) b", gb, gb_want, C, COL_TOL);
  free(gw), free(gb), free(gw_want), free(gb_want), free(d), free(dw);
  free(x), free(w), free(b), free(out), free(aux), free(want), free(aux_want), free(dout);
}

static void test_layernorm(void **state) {
  (void)state;
  layernorm_at(13);
  layernorm_at(600);
}

/* off 0: rmsnorm; 1: Gemma's rmsnorm_offset (the scale 1 + w) */
static void rmsnorm_at(int C, float off) {
  size_t n = (size_t)N * C;
  float *x = rnd(n, 2), *w = rnd(C, 1);
  float *out = nans(n), *rstd = nans(N), *want = nans(n), *rstd_want = nans(N);
  pw_rmsnorm_offset_forward(want, rstd_want, x, w, off, N, C, 1e-6f);
  emu_rmsnorm_f(out, rstd, x, w, off, N, C, 1e-6f);
  expect_same(off ? "rmsnorm_offset forward" : "rmsnorm forward", out, want, n);
  expect_same("rmsnorm rstd", rstd, rstd_want, N);

  float *dout = rnd(n, 1);
  for (int acc = 0; acc <= 1; acc++) {
    float *d = acc ? rnd(n, 1) : nans(n), *dw = acc ? dup(d, n) : nans(n);
    pw_rmsnorm_offset_backward_input(dw, dout, x, w, off, rstd, N, C, acc);
    emu_rmsnorm_i(d, dout, x, w, off, rstd, N, C, acc);
    expect_same(acc ? "rmsnorm backward_input acc" : "rmsnorm backward_input", d, dw, n);
    free(d), free(dw);
  }
  float *gw = rnd(C, 1), *gw_want = dup(gw, C);
  pw_rmsnorm_backward_weight(gw_want, dout, x, rstd, N, C);
  emu_rmsnorm_w(gw, dout, x, rstd, N, C);
  expect_close("rmsnorm backward_weight", gw, gw_want, C, COL_TOL);
  free(x), free(w), free(out), free(rstd), free(want), free(rstd_want), free(dout), free(gw), free(gw_want);
}

static void test_rmsnorm(void **state) {
  (void)state;
  rmsnorm_at(13, 0.0f);
  rmsnorm_at(600, 0.0f);
  rmsnorm_at(13, 1.0f);
  rmsnorm_at(600, 1.0f);
}

/* More rows than a block and a part: 150 rows of 37 columns — the norms'
 * and cross-entropy's rows in 10 blocks of 16 (the last of 6), the CPU's
 * bits; the column sums
 * in parts of 64, 64 and 22, into random gradients, against the CPU's
 * bias, layernorm and rmsnorm weight gradients. */
static void test_many_rows(void **state) {
  (void)state;
  enum { R = 150, CC = 37 };
  size_t n = (size_t)R * CC;
  float *x = rnd(n, 2), *dout = rnd(n, 1), *mean = rnd(R, 0.5), *rstd = rnd(R, 1);
  for (int r = 0; r < R; r++) rstd[r] = 1.0f + fabsf(rstd[r]);
  assert_int_equal(pw_cu_col_parts(R), 3);
  assert_int_equal(pw_cu_rows_blocks(R), 10);
  {
    float *w = rnd(CC, 1), *bb = rnd(CC, 1), *o = nans(n), *ow = nans(n), *aux = nans(2 * R), *auxw = nans(2 * R);
    pw_layernorm_forward(ow, auxw, auxw + R, x, w, bb, R, CC, 1e-5f);
    emu_layernorm_f(o, aux, x, w, bb, R, CC, 1e-5f);
    expect_same("layernorm forward, 10 blocks", o, ow, n);
    expect_same("layernorm mean, rstd, 10 blocks", aux, auxw, 2 * R);
    float *d = rnd(n, 1), *dw = dup(d, n);
    pw_layernorm_backward_input(dw, dout, x, w, auxw, auxw + R, R, CC, 1);
    emu_layernorm_i(d, dout, x, w, auxw, R, CC, 1);
    expect_same("layernorm backward_input acc, 10 blocks", d, dw, n);
    pw_rmsnorm_offset_forward(ow, auxw, x, w, 0.0f, R, CC, 1e-6f);
    emu_rmsnorm_f(o, aux, x, w, 0.0f, R, CC, 1e-6f);
    expect_same("rmsnorm forward, 10 blocks", o, ow, n);
    expect_same("rmsnorm rstd, 10 blocks", aux, auxw, R);
    pw_rmsnorm_offset_backward_input(dw, dout, x, w, 0.0f, auxw, R, CC, 0);
    emu_rmsnorm_i(d, dout, x, w, 0.0f, auxw, R, CC, 0);
    expect_same("rmsnorm backward_input, 10 blocks", d, dw, n);
    int32_t *tgt = tokens(R, CC);
    double rl[R];
    float lw = pw_crossentropy_forward(ow, x, tgt, R, CC, 0.5f);
    emu_xent_f(o, rl, x, tgt, R, CC);
    float l = pw_cu_xent_total(rl, R, 0.5f);
    expect_same("xent probs, 10 blocks", o, ow, n);
    expect_same("xent loss, 10 blocks", &l, &lw, 1);
    free(w), free(bb), free(o), free(ow), free(aux), free(auxw), free(d), free(dw), free(tgt);
  }
  float *g = rnd(CC, 1), *h = rnd(CC, 1), *gw = dup(g, CC), *hw = dup(h, CC);
  pw_linear_backward_weight(NULL, gw, dout, x, R, 0, CC); /* the bias alone: no inputs' columns */
  emu_bias_w(g, dout, R, CC);
  expect_close("bias gradient, 3 parts", g, gw, CC, COL_TOL);
  pw_layernorm_backward_weight(gw, hw, dout, x, mean, rstd, R, CC);
  emu_layernorm_w(g, h, dout, x, mean, rstd, R, CC);
  expect_close("layernorm backward_weight w, 3 parts", g, gw, CC, COL_TOL);
  expect_close("layernorm backward_weight b, 3 parts", h, hw, CC, COL_TOL);
  pw_rmsnorm_backward_weight(gw, dout, x, rstd, R, CC);
  emu_rmsnorm_w(g, dout, x, rstd, R, CC);
  expect_close("rmsnorm backward_weight, 3 parts", g, gw, CC, COL_TOL);
  free(x), free(dout), free(mean), free(rstd), free(g), free(h), free(gw), free(hw);
}

/* ---- activations ------------------------------------------------------------------ */

enum { NE = N * 600 };

static void test_gelu_relu_silu(void **state) {
  (void)state;
  float *x = rnd(NE, 4), *dout = rnd(NE, 1);
  x[0] = 0.0f, x[1] = -0.0f, x[2] = 30.0f, x[3] = -30.0f, x[4] = 1e-30f; /* the edges */
  float *out = nans(NE), *aux = nans(NE), *want = nans(NE), *aux_want = nans(NE);
  pw_gelu_forward(want, aux_want, x, NE);
  for (size_t i = 0; i < NE; i++) pw_cu_gelu_f_el(out, aux, x, i);
  expect_close("gelu forward", out, want, NE, 1e-6);
  expect_close("gelu gelu'", aux, aux_want, NE, 1e-6);
  for (int acc = 0; acc <= 1; acc++) { /* from the CPU's gelu': the same bits */
    float *d = acc ? rnd(NE, 1) : nans(NE), *dw = acc ? dup(d, NE) : nans(NE);
    pw_gelu_backward_input(dw, dout, aux_want, NE, acc);
    for (size_t i = 0; i < NE; i++) pw_cu_gelu_i_el(d, dout, aux_want, acc, i);
    expect_same("gelu backward_input", d, dw, NE);
    free(d), free(dw);
  }

  pw_relu_forward(want, x, NE);
  for (size_t i = 0; i < NE; i++) pw_cu_relu_f_el(out, x, i);
  expect_same("relu forward", out, want, NE);
  pw_silu_forward(want, x, NE);
  for (size_t i = 0; i < NE; i++) pw_cu_silu_f_el(out, x, i);
  expect_close("silu forward", out, want, NE, 1e-6);
  for (int acc = 0; acc <= 1; acc++) {
    float *d = acc ? rnd(NE, 1) : nans(NE), *dw = acc ? dup(d, NE) : nans(NE);
    pw_relu_backward_input(dw, dout, x, NE, acc);
    for (size_t i = 0; i < NE; i++) pw_cu_relu_i_el(d, dout, x, acc, i);
    expect_same("relu backward_input", d, dw, NE);
    float *e = acc ? dup(d, NE) : nans(NE), *ew = acc ? dup(d, NE) : nans(NE);
    pw_silu_backward_input(ew, dout, x, NE, acc);
    for (size_t i = 0; i < NE; i++) pw_cu_silu_i_el(e, dout, x, acc, i);
    expect_close("silu backward_input", e, ew, NE, 1e-6);
    free(d), free(dw), free(e), free(ew);
  }
  free(x), free(dout), free(out), free(aux), free(want), free(aux_want);
}

/* swiglu and add, with two values and with one (x op x: the gradients one
 * buffer, the first overwriting or adding as acc says, the second adding) */
static void test_swiglu_add(void **state) {
  (void)state;
  float *a = rnd(NE, 4), *b = rnd(NE, 2), *dout = rnd(NE, 1), *out = nans(NE), *want = nans(NE);
  pw_swiglu_forward(want, a, b, NE);
  for (size_t i = 0; i < NE; i++) pw_cu_swiglu_f_el(out, a, b, i);
  expect_close("swiglu forward", out, want, NE, 1e-6);
  pw_add_forward(want, a, b, NE);
  for (size_t i = 0; i < NE; i++) pw_cu_add_f_el(out, a, b, i);
  expect_same("add forward", out, want, NE);
  for (int acc = 0; acc <= 1; acc++)
    for (int one = 0; one <= 1; one++) {
      float *g0 = acc ? rnd(NE, 1) : nans(NE), *g1 = acc ? rnd(NE, 1) : nans(NE);
      float *w0 = dup(g0, NE), *w1 = dup(g1, NE);
      const float *up = one ? a : b;
      pw_swiglu_backward_input(w0, one ? w0 : w1, dout, a, up, NE, acc, one ? 1 : acc);
      for (size_t i = 0; i < NE; i++) pw_cu_swiglu_i_el(g0, one ? g0 : g1, dout, a, up, acc, one ? 1 : acc, i);
      expect_close(one ? "swiglu backward_input x*x" : "swiglu backward_input", g0, w0, NE, 1e-6);
      if (!one) expect_close("swiglu backward_input up", g1, w1, NE, 1e-6);
      free(g0), free(g1), free(w0), free(w1);
      g0 = acc ? rnd(NE, 1) : nans(NE), g1 = acc ? rnd(NE, 1) : nans(NE);
      w0 = dup(g0, NE), w1 = dup(g1, NE);
      pw_add_backward_input(w0, one ? w0 : w1, dout, NE, acc, one ? 1 : acc);
      for (size_t i = 0; i < NE; i++) pw_cu_add_i_el(g0, one ? g0 : g1, dout, acc, one ? 1 : acc, i);
      expect_same(one ? "add backward_input x+x" : "add backward_input", g0, w0, NE);
      if (!one) expect_same("add backward_input b", g1, w1, NE);
      free(g0), free(g1), free(w0), free(w1);
    }
  free(a), free(b), free(dout), free(out), free(want);
}

/* Qwen3's qk_norm: q and k heads normalised per head (wq, wk), v copied;
 * the CPU's bits (the rmsnorm rows) */
static void qknorm_at(int NH, int NKV, int HD) {
  int heads = NH + 2 * NKV;
  size_t n = (size_t)N * heads * HD, nr = (size_t)N * (NH + NKV);
  float *x = rnd(n, 2), *wq = rnd(HD, 1), *wk = rnd(HD, 1);
  float *out = nans(n), *rstd = nans(nr), *want = nans(n), *rstd_want = nans(nr);
  pw_qknorm_forward(want, rstd_want, x, wq, wk, N, NH, NKV, HD, 1e-6f);
  for (size_t s = 0; s < (size_t)N * heads; s++) pw_cu_qknorm_f_seg(out, rstd, x, wq, wk, NH, NKV, HD, 1e-6f, s);
  expect_same("qk_norm forward", out, want, n);
  expect_same("qk_norm rstd", rstd, rstd_want, nr);
  float *dout = rnd(n, 1);
  for (int acc = 0; acc <= 1; acc++) {
    float *d = acc ? rnd(n, 1) : nans(n), *dw = acc ? dup(d, n) : nans(n);
    pw_qknorm_backward_input(dw, dout, x, wq, wk, rstd, N, NH, NKV, HD, acc);
    for (size_t s = 0; s < (size_t)N * heads; s++) pw_cu_qknorm_i_seg(d, dout, x, wq, wk, rstd, NH, NKV, HD, acc, s);
    expect_same(acc ? "qk_norm backward_input acc" : "qk_norm backward_input", d, dw, n);
    free(d), free(dw);
  }
  float *gq = rnd(HD, 1), *gk = rnd(HD, 1), *gq_want = dup(gq, HD), *gk_want = dup(gk, HD);
  pw_qknorm_backward_weight(gq_want, gk_want, dout, x, rstd, N, NH, NKV, HD);
  for (int c = 0; c < 2 * HD; c++) pw_cu_qknorm_w_col(gq, gk, dout, x, rstd, N, NH, NKV, HD, c);
  expect_same("qk_norm backward_weight q", gq, gq_want, HD);
  expect_same("qk_norm backward_weight k", gk, gk_want, HD);
  free(x), free(wq), free(wk), free(out), free(rstd), free(want), free(rstd_want), free(dout);
  free(gq), free(gk), free(gq_want), free(gk_want);
}

static void test_qknorm(void **state) {
  (void)state;
  qknorm_at(4, 2, 8);
  qknorm_at(3, 3, 20);
  qknorm_at(4, 1, 40);
}

/* Gemma's geglu (one value too: geglu(g, g)) and scale */
static void test_geglu_scale(void **state) {
  (void)state;
  float *a = rnd(NE, 4), *b = rnd(NE, 2), *dout = rnd(NE, 1), *out = nans(NE), *want = nans(NE);
  pw_geglu_forward(want, a, b, NE);
  for (size_t i = 0; i < NE; i++) pw_cu_geglu_f_el(out, a, b, i);
  expect_close("geglu forward", out, want, NE, 1e-6);
  pw_scale_forward(want, a, 45.254834f, NE);
  for (size_t i = 0; i < NE; i++) pw_cu_scale_f_el(out, a, 45.254834f, i);
  expect_same("scale forward", out, want, NE);
  for (int acc = 0; acc <= 1; acc++)
    for (int one = 0; one <= 1; one++) {
      float *g0 = acc ? rnd(NE, 1) : nans(NE), *g1 = acc ? rnd(NE, 1) : nans(NE);
      float *w0 = dup(g0, NE), *w1 = dup(g1, NE);
      const float *up = one ? a : b;
      pw_geglu_backward_input(w0, one ? w0 : w1, dout, a, up, NE, acc, one ? 1 : acc);
      for (size_t i = 0; i < NE; i++) pw_cu_geglu_i_el(g0, one ? g0 : g1, dout, a, up, acc, one ? 1 : acc, i);
      expect_close(one ? "geglu backward_input x*x" : "geglu backward_input", g0, w0, NE, 1e-5);
      if (!one) expect_close("geglu backward_input up", g1, w1, NE, 1e-5);
      free(g0), free(g1), free(w0), free(w1);
    }
  for (int acc = 0; acc <= 1; acc++) {
    float *g = acc ? rnd(NE, 1) : nans(NE), *w = dup(g, NE);
    pw_scale_backward_input(w, dout, 45.254834f, NE, acc);
    for (size_t i = 0; i < NE; i++) pw_cu_scale_i_el(g, dout, 45.254834f, acc, i);
    expect_same(acc ? "scale backward_input acc" : "scale backward_input", g, w, NE);
    free(g), free(w);
  }
  free(a), free(b), free(dout), free(out), free(want);
}

/* ---- losses and concat -------------------------------------------------------------- */

static void test_xent_mse(void **state) {
  (void)state;
  int V = 300; /* lanes and a tail of 12 */
  size_t n = (size_t)N * V;
  float *x = rnd(n, 6), *probs = nans(n), *probs_want = nans(n);
  int32_t *tgt = tokens(N, V);
  float scale = 1.0f / 37.0f;
  float loss_want = pw_crossentropy_forward(probs_want, x, tgt, N, V, scale);
  double rowloss[N];
  emu_xent_f(probs, rowloss, x, tgt, N, V);
  float loss = pw_cu_xent_total(rowloss, N, scale);
  expect_close("xent probs", probs, probs_want, n, 1e-6);
  expect_close("xent loss", &loss, &loss_want, 1, 1e-6);
  for (int acc = 0; acc <= 1; acc++) { /* from the CPU's probs: the same bits */
    float *d = acc ? rnd(n, 1) : nans(n), *dw = acc ? dup(d, n) : nans(n);
    pw_crossentropy_backward_input(dw, probs_want, tgt, N, V, scale, acc);
    for (size_t i = 0; i < n; i++) pw_cu_xent_i_el(d, probs_want, tgt, V, scale, acc, i);
    expect_same("xent backward_input", d, dw, n);
    free(d), free(dw);
  }
  free(x), free(probs), free(probs_want), free(tgt);

  size_t m = (size_t)N * 13;
  float *pred = rnd(m, 2), *target = rnd(m, 2);
  float mse = pw_cu_mse_f(pred, target, m, scale), mse_want = pw_mse_forward(pred, target, (int)m, scale);
  expect_same("mse loss", &mse, &mse_want, 1);
  for (int acc = 0; acc <= 1; acc++) {
    float *d = acc ? rnd(m, 1) : nans(m), *dw = acc ? dup(d, m) : nans(m);
    pw_mse_backward_input(dw, pred, target, (int)m, scale, acc);
    for (size_t i = 0; i < m; i++) pw_cu_mse_i_el(d, pred, target, scale, acc, i);
    expect_same("mse backward_input", d, dw, m);
    free(d), free(dw);
  }
  free(pred), free(target);
}

/* concat's CPU rows (kernels.c's concat_f, concat_i) through the op table */
static void test_concat(void **state) {
  (void)state;
  int C = 13, D = 7, OC = C + D;
  pw_node node;
  memset(&node, 0, sizeof node);
  node.op = PW_OP_CONCAT, node.C = C, node.OC = OC;
  float *a = rnd((size_t)N * C, 1), *b = rnd((size_t)N * D, 1), *out = nans((size_t)N * OC), *want = nans((size_t)N * OC);
  pw_kernel_io io;
  memset(&io, 0, sizeof io);
  io.n = &node, io.rows = N, io.B = B, io.in0 = a, io.in1 = b, io.out = want;
  pw_kernel_of(PW_OP_CONCAT)->forward(&io);
  for (size_t i = 0; i < (size_t)N * OC; i++) pw_cu_concat_f_el(out, a, b, C, D, i);
  expect_same("concat forward", out, want, (size_t)N * OC);
  float *dout = rnd((size_t)N * OC, 1);
  for (int acc = 0; acc <= 1; acc++) {
    float *da = acc ? rnd((size_t)N * C, 1) : nans((size_t)N * C), *db = acc ? rnd((size_t)N * D, 1) : nans((size_t)N * D);
    float *wa = dup(da, (size_t)N * C), *wb = dup(db, (size_t)N * D);
    io.dout = dout, io.din0 = wa, io.din1 = wb, io.acc0 = acc, io.acc1 = acc;
    pw_kernel_of(PW_OP_CONCAT)->backward_input(&io);
    for (size_t i = 0; i < (size_t)N * C; i++) pw_cu_concat_i_el(da, dout, C, 0, OC, acc, i);
    for (size_t i = 0; i < (size_t)N * D; i++) pw_cu_concat_i_el(db, dout, D, C, OC, acc, i);
    expect_same("concat backward_input a", da, wa, (size_t)N * C);
    expect_same("concat backward_input b", db, wb, (size_t)N * D);
    free(da), free(db), free(wa), free(wb);
  }
  free(a), free(b), free(out), free(want), free(dout);
}

/* ---- optimizer ------------------------------------------------------------------------ */

/* An MLP program: its parameters, some decayed (the matrices), some not. */
static pw_prog *mlp_prog(pw_model *m) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_MLP;
  s.in_dim = 37, s.hidden_dim = 53, s.out_dim = 5, s.n_layers = 2;
  s.activation = PW_ACT_RELU, s.loss = PW_LOSS_MSE;
  assert_int_equal(pw_model_build(&s, m, NULL), 0);
  pw_prog_config cfg = {.layer_lo = 0, .layer_hi = m->n_layers, .mb_size = 1, .batch_size = 1, .n_slots = 1};
  pw_prog *p = NULL;
  assert_int_equal(pw_prog_create(m, &cfg, &p, NULL), 0);
  return p;
}

/* Two steps of pw_optim_step against the element bodies over every
 * parameter, with optim.c's per-parameter scalars. */
static void optim_case(int kind, double momentum) {
  pw_model m;
  pw_prog *p = mlp_prog(&m);
  size_t n = pw_prog_numel(p);
  float *w = pw_prog_params(p), *g = pw_prog_grads(p);
  for (size_t i = 0; i < n; i++) w[i] = (float)uniform(), g[i] = (float)uniform();
  float *ew = dup(w, n), *eg = dup(g, n), *em = calloc(n, sizeof(float)), *ev = calloc(n, sizeof(float));
  assert_true(em && ev);
  pw_optim_spec o;
  memset(&o, 0, sizeof o);
  o.kind = kind, o.lr = 3e-3, o.beta1 = 0.9, o.beta2 = 0.95, o.eps = 1e-8, o.weight_decay = 0.1, o.momentum = momentum;
  float gs = 0.75f;
  for (int t = 1; t <= 2; t++) {
    double lr = o.lr * t;
    pw_optim_step(p, &o, t, lr, gs);
    for (int k = 0; k < pw_prog_n_params(p); k++) {
      pw_prog_param *pp = pw_prog_param_at(p, k);
      size_t at = (size_t)(pp->data - w), len = pp->meta->numel;
      if (kind == PW_OPT_SGD) {
        float wd = pp->meta->decay ? (float)o.weight_decay : 0.0f;
        for (size_t i = 0; i < len; i++)
          pw_cu_sgd_el(ew + at, eg + at, em + at, gs, wd, (float)momentum, (float)lr, t == 1, i);
      } else {
        float decay = pp->meta->decay ? (float)(1.0 - lr * o.weight_decay) : 1.0f;
        double bc1 = 1.0 - pow(o.beta1, t), bc2 = 1.0 - pow(o.beta2, t);
        for (size_t i = 0; i < len; i++)
          pw_cu_adamw_el(ew + at, eg + at, em + at, ev + at, gs, decay, (float)o.beta1, (float)o.beta2, (float)o.eps,
                         (float)(lr / bc1), (float)sqrt(bc2), i);
      }
    }
    expect_same(kind == PW_OPT_SGD ? "sgd weights" : "adamw weights", ew, w, n);
    if (kind == PW_OPT_ADAMW || momentum != 0) expect_same("optimizer moment 1", em, pw_prog_moment(p, 0), n);
    if (kind == PW_OPT_ADAMW) expect_same("adamw moment 2", ev, pw_prog_moment(p, 1), n);
  }
  /* the squared norm: cu_optim.cu's fixed grid, each block's threads in
   * order, the blocks in order; the CPU's own order differs: 1e-12 */
  double want = pw_grad_sqnorm(p, NULL, 0), got = 0;
  size_t nt = (size_t)PW_CU_SQ_BLOCKS * PW_CU_SQ_THREADS;
  for (size_t bk = 0; bk < PW_CU_SQ_BLOCKS; bk++) {
    double s = 0;
    for (size_t th = 0; th < PW_CU_SQ_THREADS; th++) s += pw_cu_sqnorm_part(g, n, bk * PW_CU_SQ_THREADS + th, nt);
    got += s;
  }
  if (!(fabs(got - want) <= 1e-12 * want)) fail_msg("sqnorm %.17g, the CPU's %.17g", got, want);
  free(ew), free(eg), free(em), free(ev);
  pw_prog_free(p);
  pw_model_free(&m);
}

static void test_optim(void **state) {
  (void)state;
  optim_case(PW_OPT_ADAMW, 0);
  optim_case(PW_OPT_SGD, 0.9);
  optim_case(PW_OPT_SGD, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embed),       cmocka_unit_test(test_posembed), cmocka_unit_test(test_linear),
      cmocka_unit_test(test_layernorm),   cmocka_unit_test(test_rmsnorm),  cmocka_unit_test(test_many_rows),  cmocka_unit_test(test_gelu_relu_silu),
      cmocka_unit_test(test_swiglu_add),
      cmocka_unit_test(test_geglu_scale),
      cmocka_unit_test(test_qknorm),  cmocka_unit_test(test_xent_mse), cmocka_unit_test(test_concat),
      cmocka_unit_test(test_optim),       cmocka_unit_test(test_bf16_round), cmocka_unit_test(test_linear_bf16),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
