/* bench_util: timing helpers shared by the bench/ programs (header-only).
 *
 * Measurements follow one rule: whatever is compared is measured
 * interleaved (A B A B ...) in the same process, so load from other
 * processes on the machine hits both sides alike, and the figure kept is the
 * median of the repetitions. Nothing here allocates per measurement. */
#ifndef PW_BENCH_UTIL_H
#define PW_BENCH_UTIL_H

#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median of n values (sorts a copy of at most 64). */
static inline double bench_median(const double *v, int n) {
  double s[64];
  if (n > 64) n = 64;
  if (n <= 0) return 0;
  memcpy(s, v, sizeof(double) * (size_t)n);
  qsort(s, (size_t)n, sizeof(double), bench_cmp_double);
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* A function under test: one call of `which` on `ctx`. */
typedef void (*bench_fn)(void *ctx, int which);

/* Calls per timed batch so that one batch takes about target seconds
 * (at least 1), from a first untimed call and a short calibration. */
static inline int bench_calibrate(bench_fn f, void *ctx, int which, double target) {
  f(ctx, which); /* warm: caches, OpenBLAS buffers, page faults */
  int k = 1;
  for (;;) {
    double t0 = bench_now();
    for (int i = 0; i < k; i++) f(ctx, which);
    double dt = bench_now() - t0;
    if (dt >= target / 4 || k >= 1 << 20) {
      double per = dt / k;
      int n = per > 0 ? (int)(target / per) : 1 << 20;
      return n < 1 ? 1 : n > (1 << 20) ? 1 << 20 : n;
    }
    k *= 4;
  }
}

/* Interleaved timing of up to 4 variants: reps rounds of (variant 0 for k0
 * calls, variant 1 for k1 calls, ...). sec[i] = median seconds per call. */
static inline void bench_interleave(bench_fn f, void *ctx, const int *which, int n_var, int reps,
                                    double target, double *sec) {
  int k[4];
  double t[4][64];
  if (reps > 64) reps = 64;
  for (int v = 0; v < n_var; v++) k[v] = bench_calibrate(f, ctx, which[v], target);
  for (int r = 0; r < reps; r++)
    for (int v = 0; v < n_var; v++) {
      double t0 = bench_now();
      for (int i = 0; i < k[v]; i++) f(ctx, which[v]);
      t[v][r] = (bench_now() - t0) / k[v];
    }
  for (int v = 0; v < n_var; v++) sec[v] = bench_median(t[v], reps);
}

/* Deterministic fill with small values in [-scale, scale). */
static inline void bench_fill(float *x, size_t n, unsigned long long seed, float scale) {
  unsigned long long s = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[i] = scale * ((float)(s >> 40) * (1.0f / 8388608.0f) - 1.0f);
  }
}

#endif
