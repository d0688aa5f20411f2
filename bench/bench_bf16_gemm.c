/* bench_bf16_gemm: one round of bench/bf16_gemm.py — the linear layers'
 * matrix multiplies of the d512 bench GPT (N = 8 x 256 = 2048 rows) in the
 * three layouts a linear layer runs, timed one way per process:
 *
 *   bench_bf16_gemm sgemm     OpenBLAS cblas_sgemm on float32 (its kernels
 *                             are what OPENBLAS_CORETYPE says)
 *   bench_bf16_gemm onednn    pw_gemm_bf16's oneDNN path, bf16 x bf16 ->
 *                             float32, plus the float32 -> bf16 conversion of
 *                             the operands a linear layer converts per call
 *                             (the activation or output gradient; the weight
 *                             once per microbatch)
 *   bench_bf16_gemm widened   pw_gemm_bf16's sgemm path (a host without
 *                             AVX512_BF16), conversions included likewise
 *
 * fwd: out (N,OC) = x (N,C) w^T; bwd-in: dx (N,C) = dy (N,OC) w (OC,C);
 * bwd-w: dw (OC,C) += dy^T x. Prints one JSON object: per shape and layout
 * the median ms of `reps` calls and the GFLOP/s it makes. One thread
 * (the driver sets OPENBLAS_NUM_THREADS=1). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf16.h"
#include "bench_util.h"

static const struct {
  const char *name;
  int C, OC;
} shapes[] = {{"qkv", 512, 1536}, {"proj", 512, 512}, {"fc", 512, 2048}, {"fcproj", 2048, 512}, {"lm_head", 512, 256}};
#define N_ROWS 2048

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct {
  int mode, N, C, OC;
  float *x, *w, *dy, *out, *dx, *dw;
  pw_bf16 *xb, *wb, *dyb;
} ctx;

static void run(ctx *c, int layout) {
  int N = c->N, C = c->C, OC = c->OC;
  if (c->mode == 0) {
    if (layout == 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, c->x, C, c->w, C, 0.0f, c->out, OC);
    else if (layout == 1)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, c->dy, OC, c->w, C, 0.0f, c->dx, C);
    else
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, c->dy, OC, c->x, C, 1.0f, c->dw, C);
    return;
  }
  /* what the bf16 linear converts per call */
  if (layout == 0) {
    pw_bf16_from_f32(c->wb, c->w, (size_t)OC * C);
    pw_bf16_from_f32(c->xb, c->x, (size_t)N * C);
    pw_gemm_bf16(0, 1, N, OC, C, c->xb, C, c->wb, C, 0, c->out, OC);
  } else if (layout == 1) {
    pw_bf16_from_f32(c->dyb, c->dy, (size_t)N * OC);
    pw_gemm_bf16(0, 0, N, C, OC, c->dyb, OC, c->wb, C, 0, c->dx, C);
  } else {
    pw_bf16_from_f32(c->dyb, c->dy, (size_t)N * OC);
    pw_bf16_from_f32(c->xb, c->x, (size_t)N * C);
    pw_gemm_bf16(1, 0, OC, C, N, c->dyb, OC, c->xb, C, 1, c->dw, C);
  }
}

int main(int argc, char **argv) {
  int mode = argc > 1 && !strcmp(argv[1], "onednn") ? 1 : argc > 1 && !strcmp(argv[1], "widened") ? 2 : 0;
  int reps = argc > 2 ? atoi(argv[2]) : 7;
  if (mode) pw_gemm_bf16_force(mode == 1);
  if (mode == 1 && !pw_gemm_bf16_native()) {
    fprintf(stderr, "bench_bf16_gemm: no AVX512_BF16 here\n");
    return 77;
  }
  static const char *lay[] = {"fwd", "bwd_in", "bwd_w"};
  printf("{\"mode\": \"%s\", \"core\": \"%s\", \"shapes\": [", mode == 0 ? "sgemm" : argv[1],
         openblas_get_corename());
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    ctx c = {.mode = mode, .N = N_ROWS, .C = shapes[s].C, .OC = shapes[s].OC};
    size_t nx = (size_t)c.N * c.C, nw = (size_t)c.OC * c.C, ny = (size_t)c.N * c.OC;
    c.x = malloc(nx * 4), c.w = malloc(nw * 4), c.dy = malloc(ny * 4), c.out = malloc(ny * 4), c.dx = malloc(nx * 4);
    c.dw = calloc(nw, 4), c.xb = malloc(nx * 2), c.wb = malloc(nw * 2), c.dyb = malloc(ny * 2);
    bench_fill(c.x, nx, 1, 1.0f);
    bench_fill(c.w, nw, 2, 0.02f);
    bench_fill(c.dy, ny, 3, 1e-3f);
    printf("%s{\"name\": \"%s\", \"N\": %d, \"C\": %d, \"OC\": %d", s ? ", " : "", shapes[s].name, c.N, c.C, c.OC);
    for (int l = 0; l < 3; l++) {
      double t[64];
      if (reps > 64) reps = 64;
      run(&c, l); /* warm-up: primitives made, pages touched */
      for (int r = 0; r < reps; r++) {
        double t0 = now();
        run(&c, l);
        t[r] = now() - t0;
      }
      qsort(t, (size_t)reps, sizeof t[0], cmp);
      double ms = t[reps / 2] * 1e3, gf = 2.0 * c.N * c.C * c.OC / (t[reps / 2] * 1e9);
      printf(", \"%s_ms\": %.4f, \"%s_gflops\": %.1f", lay[l], ms, lay[l], gf);
    }
    printf("}");
    free(c.x), free(c.w), free(c.dy), free(c.out), free(c.dx), free(c.dw), free(c.xb), free(c.wb), free(c.dyb);
  }
  printf("], \"impl\": \"%s\"}\n", mode ? pw_gemm_bf16_name() : "sgemm");
  return 0;
}
