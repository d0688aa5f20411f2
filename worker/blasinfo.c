/* blasinfo: the implementation of blasinfo.h. The rate is a median of a
 * few calls after a warm-up (which pays for OpenBLAS's buffers and the
 * first page faults), bounded in time so a slow or loaded host still
 * starts quickly: every worker start, tests included, runs it. */
#include "blasinfo.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAX_CALLS 9

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double gemm_rate(int *calls) {
  const int n = PW_GEMM_PROBE_N;
  float *m = malloc(sizeof(float) * 3 * (size_t)n * (size_t)n);
  *calls = 0;
  if (!m) return 0;
  float *a = m, *b = m + n * n, *c = m + 2 * n * n;
  for (int i = 0; i < 2 * n * n; i++) m[i] = (float)(i % 17) * 0.0625f - 0.5f; /* finite, no denormals */
  pw_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
  double t[MAX_CALLS], start = now_s();
  int k = 0;
  while (k < MAX_CALLS && (k == 0 || now_s() - start < PW_GEMM_PROBE_BUDGET)) {
    double t0 = now_s();
    pw_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    t[k++] = now_s() - t0;
  }
  free(m);
  qsort(t, (size_t)k, sizeof t[0], cmp_double);
  *calls = k;
  double med = t[k / 2];
  return med > 0 ? 2.0 * n * n * n / med * 1e-9 : 0;
}

void pw_blasinfo_probe(pw_blasinfo *b) {
  double t0 = now_s();
  const char *core = openblas_get_corename(), *env = getenv("OPENBLAS_CORETYPE");
  snprintf(b->core, sizeof b->core, "%s", core ? core : "");
  b->forced = env && env[0];
  b->cpu = pw_cpu_detected();
  b->gemm = pw_gemm_choice_get();
  openblas_set_num_threads(1); /* the rate of one core, whatever --threads says */
  b->gflops = gemm_rate(&b->calls);
  b->probe_s = now_s() - t0;
}
