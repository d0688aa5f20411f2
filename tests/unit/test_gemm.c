/* test_gemm: the matrix products' path (common/compute/gemm.h) — the rule
 * that puts them on oneDNN where OpenBLAS's kernel is below the CPU, the
 * probe that refuses a path computing wrong, and pw_sgemm against a plain
 * double reference in every layout. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "gemm.h"

static void expect_path(const char *core, int level, const char *want, pw_gemm_path path, const char *why_has) {
  char why[200];
  pw_gemm_path got = pw_gemm_prefer(core, level, want, why, sizeof why);
  if (got != path || !strstr(why, why_has))
    fail_msg("%s on %s (PW_GEMM=%s): %s (%s), expected %s with '%s'", core ? core : "NULL", pw_cpu_name(level),
             want ? want : "auto", pw_gemm_path_name(got), why, pw_gemm_path_name(path), why_has);
}

static void test_rule(void **state) {
  (void)state;
  /* a kernel that uses the CPU's ISA: OpenBLAS */
  expect_path("Haswell", PW_CPU_AVX2, NULL, PW_GEMM_OPENBLAS, "uses this CPU's avx2");
  expect_path("Zen", PW_CPU_AVX2, NULL, PW_GEMM_OPENBLAS, "Zen");
  expect_path("SkylakeX", PW_CPU_AVX512, NULL, PW_GEMM_OPENBLAS, "avx512");
  expect_path("SapphireRapids", PW_CPU_AVX512, "auto", PW_GEMM_OPENBLAS, "avx512");
  expect_path("Prescott", PW_CPU_SSE, NULL, PW_GEMM_OPENBLAS, "sse");
  /* below it: oneDNN (Debian's 0.3.21 on a Sapphire Rapids says Prescott) */
  expect_path("Prescott", PW_CPU_AVX512, NULL, PW_GEMM_ONEDNN, "Prescott kernel is below this CPU's avx512");
  expect_path("Prescott", PW_CPU_AVX2, NULL, PW_GEMM_ONEDNN, "below");
  expect_path("Haswell", PW_CPU_AVX512, NULL, PW_GEMM_ONEDNN, "Haswell kernel is below");
  expect_path("Sandybridge", PW_CPU_AVX2, NULL, PW_GEMM_ONEDNN, "below");
  /* a kernel we do not know: oneDNN, which knows the CPU */
  expect_path("Neoverse", PW_CPU_AVX2, NULL, PW_GEMM_ONEDNN, "not one we know");
  expect_path("", PW_CPU_SSE, NULL, PW_GEMM_ONEDNN, "(unnamed)");
  expect_path(NULL, PW_CPU_AVX2, NULL, PW_GEMM_ONEDNN, "(unnamed)");
  /* PW_GEMM decides when set */
  expect_path("Prescott", PW_CPU_AVX512, "openblas", PW_GEMM_OPENBLAS, "PW_GEMM=openblas");
  expect_path("SkylakeX", PW_CPU_AVX512, "onednn", PW_GEMM_ONEDNN, "PW_GEMM=onednn");
}

/* Both paths compute the probe right; a corrupted one is refused with the
 * element that is off. */
static void test_probe(void **state) {
  (void)state;
  for (int p = 0; p < 2; p++) {
    pw_err err = {0};
    if (pw_gemm_verify((pw_gemm_path)p, 0, &err)) fail_msg("%s: %s", pw_gemm_path_name(p), err.msg);
    assert_int_equal(pw_gemm_verify((pw_gemm_path)p, 1, &err), PW_EFORMAT);
    assert_string_equal(err.path, "gemm");
    assert_non_null(strstr(err.msg, pw_gemm_path_name(p)));
    assert_non_null(strstr(err.msg, "element (18, 22)"));
    assert_non_null(strstr(err.msg, "the reference"));
  }
}

/* pw_sgemm, on the process's path, against a double reference: every
 * transpose, a leading dimension wider than the matrix, alpha and beta. */
static void test_sgemm(void **state) {
  (void)state;
  const pw_gemm_choice *c = pw_gemm_choice_get();
  assert_true(c->ok);
  assert_true(c->why[0] != 0);
  enum { M = 19, N = 23, K = 70, PAD = 3 };
  for (int t = 0; t < 4; t++) {
    int ta = t & 1, tb = t >> 1;
    int lda = (ta ? M : K) + PAD, ldb = (tb ? K : N) + PAD, ldc = N + PAD;
    float *A = calloc((size_t)lda * (ta ? K : M), sizeof(float)), *B = calloc((size_t)ldb * (tb ? N : K), sizeof(float));
    float *C = calloc((size_t)ldc * M, sizeof(float));
    for (int i = 0; i < M; i++)
      for (int k = 0; k < K; k++) A[ta ? k * lda + i : i * lda + k] = (float)((i * 7 + k * 3) % 11) - 5.0f;
    for (int k = 0; k < K; k++)
      for (int j = 0; j < N; j++) B[tb ? j * ldb + k : k * ldb + j] = (float)((k * 5 + j) % 13) * 0.25f - 1.5f;
    for (int i = 0; i < M * ldc; i++) C[i] = 2.0f;
    pw_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, -1.0f, C, ldc);
    for (int i = 0; i < M; i++) {
      for (int j = 0; j < N; j++) {
        double want = -2.0;
        for (int k = 0; k < K; k++)
          want += 0.5 * (double)A[ta ? k * lda + i : i * lda + k] * (double)B[tb ? j * ldb + k : k * ldb + j];
        /* small integers and quarters: every partial sum is exact in float */
        if (C[i * ldc + j] != (float)want) fail_msg("t=%d (%d, %d): %g != %g", t, i, j, C[i * ldc + j], want);
      }
      for (int j = N; j < ldc; j++) assert_true(C[i * ldc + j] == 2.0f); /* past N: untouched */
    }
    free(A), free(B), free(C);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rule),
      cmocka_unit_test(test_probe),
      cmocka_unit_test(test_sgemm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
