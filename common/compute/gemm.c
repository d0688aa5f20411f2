/* gemm: the choice of gemm.h, its probe, and pw_sgemm. */
#include "gemm.h"

#include <cblas.h>
#include <dnnl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "log.h"

const char *pw_gemm_path_name(pw_gemm_path p) { return p == PW_GEMM_ONEDNN ? "onednn" : "openblas"; }

pw_gemm_path pw_gemm_prefer(const char *core, int cpu_level, const char *want, char *why, size_t cap) {
  if (want && !strcmp(want, "openblas")) {
    snprintf(why, cap, "PW_GEMM=openblas");
    return PW_GEMM_OPENBLAS;
  }
  if (want && !strcmp(want, "onednn")) {
    snprintf(why, cap, "PW_GEMM=onednn");
    return PW_GEMM_ONEDNN;
  }
  int k = pw_cpu_blas_core_level(core);
  if (k >= 0 && k >= cpu_level) {
    snprintf(why, cap, "OpenBLAS's %s kernel uses this CPU's %s", core, pw_cpu_name((pw_cpu_isa)cpu_level));
    return PW_GEMM_OPENBLAS;
  }
  if (k < 0)
    snprintf(why, cap, "OpenBLAS's kernel %s is not one we know; oneDNN generates code for this CPU (%s)",
             core && core[0] ? core : "(unnamed)", pw_cpu_name((pw_cpu_isa)cpu_level));
  else
    snprintf(why, cap, "OpenBLAS's %s kernel is below this CPU's %s; oneDNN generates code for it", core,
             pw_cpu_name((pw_cpu_isa)cpu_level));
  return PW_GEMM_ONEDNN;
}

/* Debian's oneDNN runs on OpenMP (libgomp), as in bf16.c. */
void omp_set_num_threads(int n);

static void run(pw_gemm_path path, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc) {
  if (path == PW_GEMM_ONEDNN) {
    /* as many threads as OpenBLAS is given (the worker's --threads); row-
     * major, as cblas's CblasRowMajor. It fails only on bad arguments,
     * which the kernels never pass (the probe covers every layout). */
    omp_set_num_threads(openblas_get_num_threads());
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) != dnnl_success)
      abort();
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

/* Sizes past any kernel's register block in each dimension, and odd, so a
 * kernel's edge code runs too. */
#define PM 37
#define PN 45
#define PK 131

int pw_gemm_verify(pw_gemm_path path, int corrupt, pw_err *err) {
  float *a = malloc(sizeof(float) * PM * PK), *b = malloc(sizeof(float) * PK * PN), *c = malloc(sizeof(float) * PM * PN);
  int rc = 0;
  if (!a || !b || !c) {
    rc = pw_err_set(err, PW_ENOMEM, "gemm", "out of memory for the probe");
    goto done;
  }
  uint32_t s = 12345;
  for (int i = 0; i < PM * PK; i++) a[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
  for (int i = 0; i < PK * PN; i++) b[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
  for (int t = 0; t < 4 && !rc; t++) {
    int ta = t & 1, tb = t >> 1;
    /* the same numbers in each layout: op(A) is PM x PK, op(B) PK x PN */
    float *at = malloc(sizeof(float) * PM * PK), *bt = malloc(sizeof(float) * PK * PN);
    if (!at || !bt) {
      free(at), free(bt);
      rc = pw_err_set(err, PW_ENOMEM, "gemm", "out of memory for the probe");
      break;
    }
    for (int i = 0; i < PM; i++)
      for (int k = 0; k < PK; k++) at[ta ? k * PM + i : i * PK + k] = a[i * PK + k];
    for (int k = 0; k < PK; k++)
      for (int j = 0; j < PN; j++) bt[tb ? j * PK + k : k * PN + j] = b[k * PN + j];
    for (int i = 0; i < PM * PN; i++) c[i] = 0.25f; /* beta 0.5 reads it */
    run(path, ta, tb, PM, PN, PK, 1.5f, at, ta ? PM : PK, bt, tb ? PK : PN, 0.5f, c, PN);
    if (corrupt) c[(PM / 2) * PN + PN / 2] += 0.01f;
    free(at), free(bt);
    for (int i = 0; i < PM && !rc; i++)
      for (int j = 0; j < PN && !rc; j++) {
        double want = 0.125, mag = 0;
        for (int k = 0; k < PK; k++) {
          want += 1.5 * (double)a[i * PK + k] * b[k * PN + j];
          mag += fabs(1.5 * (double)a[i * PK + k] * b[k * PN + j]);
        }
        /* float products summed in any order: a few ulps of the terms' size */
        if (!(fabs(c[i * PN + j] - want) <= 1e-5 * (mag + 1)))
          rc = pw_err_set(err, PW_EFORMAT, "gemm",
                          "%s sgemm (%s, %s) of %dx%dx%d: element (%d, %d) is %.9g, the reference %.9g",
                          pw_gemm_path_name(path), ta ? "T" : "N", tb ? "T" : "N", PM, PN, PK, i, j, c[i * PN + j],
                          want);
      }
  }
done:
  free(a), free(b), free(c);
  return rc;
}

static pw_gemm_choice choice;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void decide(void) {
  const char *core = openblas_get_corename(), *want = getenv("PW_GEMM"), *bad = getenv("PW_GEMM_CORRUPT");
  snprintf(choice.core, sizeof choice.core, "%s", core ? core : "");
  if (want && want[0] && strcmp(want, "auto") && strcmp(want, "openblas") && strcmp(want, "onednn")) {
    pw_warn("PW_GEMM=%s is none of auto, openblas, onednn: auto", want);
    want = NULL;
  }
  pw_gemm_path first = pw_gemm_prefer(choice.core, pw_cpu_detected(), want, choice.why, sizeof choice.why);
  pw_gemm_path order[2] = {first, first == PW_GEMM_ONEDNN ? PW_GEMM_OPENBLAS : PW_GEMM_ONEDNN};
  choice.path = first;
  for (int i = 0; i < 2 && !choice.ok; i++) {
    pw_err err = {0};
    char b[300];
    if (!pw_gemm_verify(order[i], bad && strstr(bad, pw_gemm_path_name(order[i])) != NULL, &err)) {
      choice.path = order[i], choice.ok = 1;
      if (i) snprintf(choice.why, sizeof choice.why, "%s failed the probe", pw_gemm_path_name(first));
      break;
    }
    pw_err_str(&err, b, sizeof b);
    pw_error("gemm: %s computes wrong products, not used: %s", pw_gemm_path_name(order[i]), b);
    size_t l = strlen(choice.refused);
    snprintf(choice.refused + l, sizeof choice.refused - l, "%s%s", l ? "; " : "", b);
  }
  if (choice.ok && (choice.path == PW_GEMM_ONEDNN || choice.refused[0]))
    pw_info("gemm: products on %s (%s)", pw_gemm_path_name(choice.path), choice.why);
}

const pw_gemm_choice *pw_gemm_choice_get(void) {
  pthread_once(&once, decide);
  return &choice;
}

int pw_gemm_check(pw_err *err) {
  const pw_gemm_choice *c = pw_gemm_choice_get();
  if (c->ok) return 0;
  return pw_err_set(err, PW_EFORMAT, "gemm", "no matrix-product path computes right on this host: %s", c->refused);
}

void pw_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc) {
  run(pw_gemm_choice_get()->path, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
