/* test_rowmm: the frozen linear of rowmm.h, on the path the probe picks on
 * this host and on the sgemv path forced:
 *   - N = 1..40 rows (past two chunks of PW_ROWMM_MAX_M), with a bias and
 *     without, at d256 shapes, a tall lm_head-like one and odd small ones:
 *       * against the product in double: |err| <= C * 2^-22 * sum |x w|
 *         (+ |b|), element by element;
 *       * every row the same bits as that row multiplied alone (N = 1), at
 *         every position of every N: what batched decoding relies on;
 *   - an AVX-512 host (PW_CPU native or avx512) takes the oneDNN path at
 *     the d256 shapes (oneDNN 2.6's brgemm passes the probe there), and
 *     PW_CPU=avx2 does not (its gemm:jit rounds one row otherwise; CI's
 *     sanitized suite runs PW_CPU=avx2);
 *   - the probe does not trust the layer's weights: all-zero ones (which
 *     any summation order multiplies alike) take the path random ones do;
 *   - bad shapes are refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu.h"
#include "rng.h"
#include "rowmm.h"

enum { NMAX = 40 };

static float *randoms(size_t n, uint64_t key) {
  float *x = malloc(sizeof(float) * n);
  assert_non_null(x);
  pw_rng g;
  pw_rng_seed(&g, key);
  for (size_t i = 0; i < n; i++) x[i] = (float)(2 * pw_rng_uniform(&g) - 1);
  return x;
}

/* The product, every row alone and against the double product. */
static void check_shape(int C, int OC, int with_bias, int want_packed) {
  float *w = randoms((size_t)OC * C, 1), *b = with_bias ? randoms((size_t)OC, 2) : NULL;
  float *x = randoms((size_t)NMAX * C, 3);
  float *one = malloc(sizeof(float) * (size_t)NMAX * OC), *all = malloc(sizeof(float) * (size_t)NMAX * OC);
  assert_true(one && all);
  pw_rowmm *r = NULL;
  pw_err err = {0};
  assert_int_equal(pw_rowmm_create(w, b, C, OC, &r, &err), 0);
  if (want_packed >= 0 && pw_rowmm_packed(r) != want_packed)
    fail_msg("%d -> %d: path %s, expected the %s one", C, OC, pw_rowmm_path(r), want_packed ? "oneDNN" : "sgemv");
  for (int i = 0; i < NMAX; i++) pw_rowmm_run(r, one + (size_t)i * OC, x + (size_t)i * C, 1);
  for (int i = 0; i < NMAX; i++)
    for (int o = 0; o < OC; o++) {
      double s = b ? b[o] : 0, mag = b ? fabs(b[o]) : 0;
      for (int c = 0; c < C; c++) {
        double p = (double)x[(size_t)i * C + c] * w[(size_t)o * C + c];
        s += p, mag += fabs(p);
      }
      double got = one[(size_t)i * OC + o];
      if (fabs(got - s) > C * 0x1p-22 * mag)
        fail_msg("%d -> %d (%s): row %d, out %d is %.9g, the product %.9g", C, OC, pw_rowmm_path(r), i, o, got, s);
    }
  /* N rows from an offset, so each row is seen at many positions */
  for (int n = 2; n <= NMAX; n++) {
    int at = (n * 7) % (NMAX - n + 1);
    pw_rowmm_run(r, all, x + (size_t)at * C, n);
    for (int i = 0; i < n; i++)
      if (memcmp(all + (size_t)i * OC, one + (size_t)(at + i) * OC, sizeof(float) * (size_t)OC))
        fail_msg("%d -> %d (%s): row %d at position %d of %d differs from the row alone", C, OC, pw_rowmm_path(r),
                 at + i, i, n);
  }
  pw_rowmm_free(r);
  free(w), free(b), free(x), free(one), free(all);
}

static void check_shapes(int want_packed) {
  check_shape(256, 768, 1, want_packed); /* d256: qkv */
  check_shape(1024, 256, 1, want_packed); /* mlp down: kernels switch at 4 rows in sgemm */
  check_shape(256, 1000, 0, want_packed); /* a tied lm_head: no bias */
  check_shape(7, 5, 1, -1);               /* odd and small: whatever the probe says */
  check_shape(33, 17, 0, -1);
}

static void test_probed_path(void **st) {
  (void)st;
  /* oneDNN 2.6's brgemm on AVX-512 passes the probe; AVX2's gemm:jit fails it */
  pw_cpu_isa l = pw_cpu_level();
  check_shapes(l == PW_CPU_AVX512 ? 1 : l == PW_CPU_AVX2 ? 0 : -1);
}

static void test_sgemv_forced(void **st) {
  (void)st;
  pw_rowmm_force_sgemv(1);
  check_shapes(0);
  pw_rowmm *r = NULL;
  pw_err err = {0};
  float w[6] = {1, 2, 3, 4, 5, 6};
  assert_int_equal(pw_rowmm_create(w, NULL, 3, 2, &r, &err), 0);
  assert_string_equal(pw_rowmm_path(r), "sgemv (forced)");
  pw_rowmm_free(r);
  pw_rowmm_force_sgemv(0);
}

static void test_probe_ignores_weights(void **st) {
  (void)st;
  float *w = randoms(256 * 768, 4), *z = calloc(256 * 768 + 768, sizeof(float));
  assert_non_null(z);
  pw_rowmm *a = NULL, *b = NULL;
  pw_err err = {0};
  assert_int_equal(pw_rowmm_create(w, w, 256, 768, &a, &err), 0);
  assert_int_equal(pw_rowmm_create(z, z + 256 * 768, 256, 768, &b, &err), 0);
  assert_string_equal(pw_rowmm_path(a), pw_rowmm_path(b));
  float x[256], y[768];
  for (int i = 0; i < 256; i++) x[i] = (float)i;
  pw_rowmm_run(b, y, x, 1);
  for (int o = 0; o < 768; o++) assert_true(y[o] == 0.0f);
  pw_rowmm_free(a), pw_rowmm_free(b);
  free(w), free(z);
}

static void test_bad_shape(void **st) {
  (void)st;
  pw_rowmm *r = NULL;
  pw_err err = {0};
  float w[4] = {0};
  assert_int_equal(pw_rowmm_create(w, NULL, 0, 4, &r, &err), PW_EINVAL);
  assert_null(r);
  assert_int_equal(pw_rowmm_create(NULL, NULL, 2, 2, &r, &err), PW_EINVAL);
  assert_non_null(strstr(err.msg, "shape"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_probed_path),
      cmocka_unit_test(test_sgemv_forced),
      cmocka_unit_test(test_probe_ignores_weights),
      cmocka_unit_test(test_bad_shape),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
