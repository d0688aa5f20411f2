/* test_bf16: bf16 numbers and the bf16 matrix multiply (bf16.h).
 *   - Rounding is to nearest, ties to even, on the bits: ties both ways,
 *     the largest float to inf, NaN stays NaN (quiet, sign kept), inf and
 *     subnormals keep their class; widening is exact; the in-place widening
 *     of a received frame equals the plain one over several blocks; every
 *     CPU level converts to the same bits.
 *   - pw_gemm_bf16 on each path this host has — oneDNN's AVX512_BF16
 *     kernels, the sgemm path forced, and the path of PW_CPU=avx2 (which must
 *     be the sgemm one) — in the three layouts a linear layer uses (NT
 *     forward, NN backward-input, TN backward-weight), overwrite and
 *     accumulate, odd shapes with leading dimensions wider than the rows:
 *       * against the exact product of the bf16 operands (long double):
 *         |err| <= K * 2^-23 * sum_k |a_k b_k| (float32 accumulation);
 *       * against float32 operands before rounding (the bf16 tolerance):
 *         |err| <= 2^-7 * sum_k |a_k b_k| (two roundings of 2^-9 each, plus
 *         the accumulation);
 *       * the elements outside the result (the ldc padding) are untouched.
 *   - The bf16 linear layer's forward, backward-input and backward-weight
 *     against the float32 kernels (ops.h) to the bf16 tolerance, bias and
 *     its gradient in float32; its whole backward equals weight then input
 *     bit for bit. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bf16.h"
#include "cpu.h"
#include "ops.h"
#include "rng.h"

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
static float of_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static void test_round(void **state) {
  (void)state;
  assert_int_equal(pw_bf16_of(1.0f), 0x3f80);
  assert_int_equal(pw_bf16_of(-2.0f), 0xc000);
  /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one, 1 */
  assert_int_equal(pw_bf16_of(1.0f + 0x1p-8f), 0x3f80);
  /* 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6 */
  assert_int_equal(pw_bf16_of(1.0f + 3 * 0x1p-8f), 0x3f82);
  /* just above a tie rounds up */
  assert_int_equal(pw_bf16_of(of_bits(0x3f808001)), 0x3f81);
  assert_int_equal(pw_bf16_of(of_bits(0x7f7fffff)), 0x7f80); /* FLT_MAX -> inf */
  assert_int_equal(pw_bf16_of(INFINITY), 0x7f80);
  assert_int_equal(pw_bf16_of(-INFINITY), 0xff80);
  pw_bf16 n = pw_bf16_of(of_bits(0xff800001)); /* a NaN whose payload is all in the low bits */
  assert_true(isnan(pw_bf16_value(n)) && (n & 0x8000) && (n & 0x0040));
  float sub = of_bits(0x00012345); /* subnormal: rounded, not flushed */
  assert_int_equal(pw_bf16_of(sub), 0x0001);
  assert_true(pw_bf16_value(pw_bf16_of(1e-40f)) != 0.0f);
  for (uint32_t u = 0; u < 0x10000; u += 7) { /* widening is exact: back to the same bf16 */
    if (isnan(pw_bf16_value((pw_bf16)u))) continue;
    assert_int_equal(pw_bf16_of(pw_bf16_value((pw_bf16)u)), u);
  }
}

static void fill(float *x, size_t n, unsigned long long seed, float scale) {
  pw_rng r;
  pw_rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++) x[i] = (float)(pw_rng_normal(&r) * scale);
}

static void test_levels_and_inplace(void **state) {
  (void)state;
  enum { N = 3001 }; /* three widening blocks and a tail, odd for the vector tails */
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *w = malloc(N * sizeof *w);
  pw_bf16 *b0 = malloc(N * sizeof *b0), *b = malloc(N * sizeof *b);
  assert_non_null(x && y && w && b0 && b);
  fill(x, N, 1, 3.0f);
  x[0] = NAN, x[1] = -INFINITY, x[2] = of_bits(0x00000001), x[3] = -0.0f, x[4] = of_bits(0x7f7fffff);
  pw_cpu_isa top = pw_cpu_detected();
  pw_cpu_force(PW_CPU_SSE);
  pw_bf16_from_f32(b0, x, N);
  for (int l = PW_CPU_SSE; l <= (int)top; l++) {
    pw_cpu_force((pw_cpu_isa)l);
    pw_bf16_from_f32(b, x, N);
    assert_memory_equal(b, b0, N * sizeof *b);
    memcpy(y, x, N * sizeof *y);
    pw_bf16_round_f32(y, N);
    pw_bf16_to_f32(w, b0, N);
    assert_memory_equal(y, w, N * sizeof *y);
    memcpy(w, b0, N * sizeof *b0); /* a frame's bf16 payload, in the float buffer it lands in */
    pw_bf16_widen_inplace(w, N);
    assert_memory_equal(y, w, N * sizeof *y);
  }
  pw_cpu_force(top);
  free(x), free(y), free(w), free(b0), free(b);
}

/* C (M,N) of op(A) op(B), the layouts of bf16.h, checked element by
 * element against the exact product of the bf16 operands and against the
 * float32 operands. */
static void check_gemm(int ta, int tb, int acc, const char *path) {
  enum { M = 37, N = 29, K = 67, PAD = 3 };
  int lda = (ta ? M : K) + PAD, ldb = (tb ? K : N) + PAD, ldc = N + PAD;
  int arows = ta ? K : M, brows = tb ? N : K;
  float *af = malloc(sizeof(float) * (size_t)arows * lda), *bf = malloc(sizeof(float) * (size_t)brows * ldb);
  float *c = malloc(sizeof(float) * (size_t)M * ldc), *c0 = malloc(sizeof(float) * (size_t)M * ldc);
  pw_bf16 *a = malloc(sizeof(pw_bf16) * (size_t)arows * lda), *b = malloc(sizeof(pw_bf16) * (size_t)brows * ldb);
  assert_non_null(af && bf && c && c0 && a && b);
  fill(af, (size_t)arows * lda, 11, 1.0f);
  fill(bf, (size_t)brows * ldb, 12, 0.05f);
  fill(c0, (size_t)M * ldc, 13, 0.5f);
  pw_bf16_from_f32(a, af, (size_t)arows * lda);
  pw_bf16_from_f32(b, bf, (size_t)brows * ldb);
  memcpy(c, c0, sizeof(float) * (size_t)M * ldc);
  pw_gemm_bf16(ta, tb, M, N, K, a, lda, b, ldb, acc, c, ldc);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < ldc; j++) {
      float got = c[(size_t)i * ldc + j];
      if (j >= N) { /* padding */
        assert_int_equal(bits(got), bits(c0[(size_t)i * ldc + j]));
        continue;
      }
      long double exact = acc ? c0[(size_t)i * ldc + j] : 0.0L, vs32 = exact, mag = fabsl(exact);
      for (int k = 0; k < K; k++) {
        size_t ai = ta ? (size_t)k * lda + i : (size_t)i * lda + k, bi = tb ? (size_t)j * ldb + k : (size_t)k * ldb + j;
        long double p = (long double)pw_bf16_value(a[ai]) * pw_bf16_value(b[bi]);
        exact += p;
        vs32 += (long double)af[ai] * bf[bi];
        mag += fabsl(p);
      }
      long double tol_acc = (K + 1) * 0x1p-23L * mag + 1e-30L, tol_bf16 = 0x1p-7L * mag + 1e-30L;
      if (fabsl(got - exact) > tol_acc || fabsl(got - vs32) > tol_bf16)
        fail_msg("%s ta %d tb %d acc %d: C[%d,%d] = %.9g, exact on bf16 %.9Lg (tol %.3Lg), float32 %.9Lg (tol %.3Lg)",
                 path, ta, tb, acc, i, j, got, exact, tol_acc, vs32, tol_bf16);
    }
  free(af), free(bf), free(c), free(c0), free(a), free(b);
}

static void check_layouts(const char *path) {
  for (int acc = 0; acc < 2; acc++) {
    check_gemm(0, 1, acc, path); /* forward */
    check_gemm(0, 0, acc, path); /* backward-input */
    check_gemm(1, 0, acc, path); /* backward-weight */
  }
}

static void test_gemm_paths(void **state) {
  (void)state;
  pw_cpu_isa top = pw_cpu_detected();
  if (pw_gemm_bf16_force(1)) {
    check_layouts("onednn");
    assert_true(strncmp(pw_gemm_bf16_name(), "onednn:", 7) == 0);
  } else {
    print_message("no AVX512_BF16 here: the oneDNN path is not tested\n");
  }
  assert_int_equal(pw_gemm_bf16_force(0), 0);
  check_layouts("sgemm");
  /* PW_CPU=avx2 (a host without AVX-512): no AVX512_BF16, the sgemm path */
  pw_cpu_force(PW_CPU_AVX2);
  assert_int_equal(pw_cpu_bf16(), 0);
  assert_int_equal(pw_gemm_bf16_force(1), 0);
  assert_string_equal(pw_gemm_bf16_name(), "sgemm");
  check_layouts("avx2");
  pw_cpu_force(top);
  pw_gemm_bf16_force(1);
}

/* max |a - b| / max |b| over n elements */
static double rel_err(const float *a, const float *b, size_t n) {
  double e = 0, m = 1e-30;
  for (size_t i = 0; i < n; i++) {
    e = fmax(e, fabs((double)a[i] - b[i]));
    m = fmax(m, fabs((double)b[i]));
  }
  return e / m;
}

static void test_linear(void **state) {
  (void)state;
  enum { N = 48, C = 40, OC = 24 };
  float x[N * C], w[OC * C], bias[OC], dy[N * OC], y[N * OC], y32[N * OC], dx[N * C], dx32[N * C];
  float dw[OC * C], dw32[OC * C], db[OC], db32[OC];
  pw_bf16 wb[OC * C], xb[N * C], dyb[N * OC];
  fill(x, N * C, 21, 1.0f);
  fill(w, OC * C, 22, 0.1f);
  fill(bias, OC, 23, 0.1f);
  fill(dy, N * OC, 24, 0.01f);
  for (int paths = 0; paths < 2; paths++) {
    pw_gemm_bf16_force(!paths);
    pw_linear_forward_bf16(y, x, w, wb, xb, bias, N, C, OC);
    pw_linear_forward(y32, x, w, bias, N, C, OC);
    assert_true(rel_err(y, y32, N * OC) < 0x1p-7);
    for (int i = 0; i < OC * C; i++) assert_int_equal(wb[i], pw_bf16_of(w[i])); /* the copy refreshed */
    for (int acc = 0; acc < 2; acc++) {
      fill(dx, N * C, 25, 0.01f);
      memcpy(dx32, dx, sizeof dx);
      pw_linear_backward_input_bf16(dx, dy, wb, dyb, N, C, OC, acc);
      pw_linear_backward_input(dx32, dy, w, N, C, OC, acc);
      assert_true(rel_err(dx, dx32, N * C) < 0x1p-7);
    }
    fill(dw, OC * C, 26, 0.01f);
    memcpy(dw32, dw, sizeof dw);
    fill(db, OC, 27, 0.01f);
    memcpy(db32, db, sizeof db);
    pw_linear_backward_weight_bf16(dw, db, dy, x, dyb, xb, N, C, OC);
    pw_linear_backward_weight(dw32, db32, dy, x, N, C, OC);
    assert_true(rel_err(dw, dw32, OC * C) < 0x1p-7);
    assert_memory_equal(db, db32, sizeof db); /* the bias gradient stays float32: same bits */
    /* the whole backward (W then I, dout converted once) = the two calls, bit for bit */
    float dx2[N * C], dw2[OC * C], db2[OC];
    memcpy(dx2, dx, sizeof dx), memcpy(dw2, dw, sizeof dw), memcpy(db2, db, sizeof db);
    pw_linear_backward_weight_bf16(dw, db, dy, x, dyb, xb, N, C, OC);
    pw_linear_backward_input_bf16(dx, dy, wb, dyb, N, C, OC, 1);
    pw_linear_backward_bf16(dx2, dw2, db2, dy, x, wb, dyb, xb, N, C, OC, 1);
    assert_memory_equal(dx2, dx, sizeof dx);
    assert_memory_equal(dw2, dw, sizeof dw);
    assert_memory_equal(db2, db, sizeof db);
  }
  pw_gemm_bf16_force(1);
}

/* Attention with bf16 products: B 2, T 80 (a full and a partial causal
 * block), C 32, NH 2. */
enum { AB = 2, AT = 80, AC = 32, ANH = 2, AHD = AC / ANH };

static float rb(float x) { return pw_bf16_value(pw_bf16_of(x)); }

static void test_attention(void **state) {
  (void)state;
  size_t nq = (size_t)AB * AT * 3 * AC, no = (size_t)AB * AT * AC, na = (size_t)AB * ANH * AT * AT;
  float *qkv = malloc(nq * sizeof(float)), *dout = malloc(no * sizeof(float));
  float *o = malloc(no * sizeof(float)), *o32 = malloc(no * sizeof(float));
  float *att = malloc(na * sizeof(float)), *att32 = malloc(na * sizeof(float));
  float *dq = malloc(nq * sizeof(float)), *dq32 = malloc(nq * sizeof(float)), *dq0 = malloc(nq * sizeof(float));
  float *scratch = malloc((size_t)AT * AT * sizeof(float));
  pw_bf16 *bs = malloc(pw_attention_bf16_scratch(AB, AT, AC) * sizeof(pw_bf16));
  assert_non_null(qkv), assert_non_null(dout), assert_non_null(o), assert_non_null(o32), assert_non_null(att);
  assert_non_null(att32), assert_non_null(dq), assert_non_null(dq32), assert_non_null(dq0);
  assert_non_null(scratch), assert_non_null(bs);
  fill(qkv, nq, 31, 1.0f);
  fill(dout, no, 32, 0.01f);
  for (int paths = 0; paths < 2; paths++) {
    pw_gemm_bf16_force(!paths);
    pw_attention_forward(o32, att32, qkv, AB, AT, AC, ANH, ANH); /* o32 is reused below */
    pw_attention_forward_bf16(o, att, bs, qkv, AB, AT, AC, ANH, ANH);
    assert_true(rel_err(o, o32, no) < 0x1p-6);
    assert_true(rel_err(att, att32, na) < 0x1p-6);
    /* the rule: O = bf16(P) bf16(v) with float32 accumulation, P the saved
     * float32 probabilities; upper triangle zero */
    for (int b = 0; b < AB; b++)
      for (int h = 0; h < ANH; h++)
        for (int i = 0; i < AT; i++) {
          const float *P = att + (((size_t)b * ANH + h) * AT + i) * AT;
          for (int j = i + 1; j < AT; j++) assert_true(P[j] == 0.0f);
          for (int d = 0; d < AHD; d++) {
            double ref = 0, mag = 0;
            for (int j = 0; j <= i; j++) {
              double t = (double)rb(P[j]) * rb(qkv[((size_t)b * AT + j) * 3 * AC + 2 * AC + h * AHD + d]);
              ref += t, mag += fabs(t);
            }
            double got = o[((size_t)b * AT + i) * AC + h * AHD + d];
            assert_true(fabs(got - ref) <= (i + 2) * 0x1p-23 * mag + 1e-30);
          }
        }
    /* backward: against float32 to the bf16 tolerance, overwrite and
     * accumulate (acc adds to what was there: equal to overwrite + prior) */
    pw_attention_backward_input(dq32, scratch, dout, qkv, att32, AB, AT, AC, ANH, ANH, 0);
    pw_attention_backward_input_bf16(dq, scratch, bs, dout, qkv, att, AB, AT, AC, ANH, ANH, 0);
    for (int part = 0; part < 3; part++) { /* dq, dk and dv each, as columns of dqkv */
      float *g = o, *g32 = o32; /* (AB*AT, AC) each: the forward's checks are done */
      for (size_t r = 0; r < (size_t)AB * AT; r++) {
        memcpy(g + r * AC, dq + r * 3 * AC + part * AC, AC * sizeof(float));
        memcpy(g32 + r * AC, dq32 + r * 3 * AC + part * AC, AC * sizeof(float));
      }
      assert_true(rel_err(g, g32, no) < 0x1p-5);
    }
    fill(dq0, nq, 33, 0.001f);
    memcpy(dq32, dq0, nq * sizeof(float));
    pw_attention_backward_input_bf16(dq32, scratch, bs, dout, qkv, att, AB, AT, AC, ANH, ANH, 1);
    for (size_t i = 0; i < nq; i++) assert_true(fabsf(dq32[i] - (dq0[i] + dq[i])) <= 0x1p-20 * (fabsf(dq0[i]) + fabsf(dq[i])) + 1e-30f);
    /* dV = bf16(P)^T bf16(dout): the rule, exactly as stated */
    for (int b = 0; b < AB; b++)
      for (int h = 0; h < ANH; h++)
        for (int j = 0; j < AT; j++)
          for (int d = 0; d < AHD; d++) {
            double ref = 0, mag = 0;
            for (int i = j; i < AT; i++) {
              double t = (double)rb(att[(((size_t)b * ANH + h) * AT + i) * AT + j]) *
                         rb(dout[((size_t)b * AT + i) * AC + h * AHD + d]);
              ref += t, mag += fabs(t);
            }
            double got = dq[((size_t)b * AT + j) * 3 * AC + 2 * AC + h * AHD + d];
            assert_true(fabs(got - ref) <= (AT + 2) * 0x1p-23 * mag + 1e-30);
          }
  }
  pw_gemm_bf16_force(1);
  free(qkv), free(dout), free(o), free(o32), free(att), free(att32), free(dq), free(dq32), free(dq0);
  free(scratch), free(bs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round),
      cmocka_unit_test(test_levels_and_inplace),
      cmocka_unit_test(test_gemm_paths),
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_attention),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
