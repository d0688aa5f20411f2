/* bench_attn: the plain attention (ops_attn.c: the (B,NH,T,T) probabilities
 * saved) against the tiled one (ops_flash.c: lse saved), kernel against
 * kernel in one process, forward and backward-input, one thread. Driven by
 * bench/attention.py, which also times whole training steps.
 *
 *   bench_attn [--T 256,1024,4096] [--C 768] [--NH 12] [--B 1] [--rounds 5] [--target 0.3]
 *
 * Per T, in rounds alternating the order (plain then tiled, then tiled
 * then plain), each variant runs for about target seconds; per variant the
 * per-round seconds per call, wall and the thread's CPU time. Prints one
 * JSON object per T:
 *   {"T", "C", "NH", "B", "rounds", "plain_f": [...], "tiled_f": [...],
 *    "plain_b": [...], "tiled_b": [...], the same with "_cpu",
 *    "plain_bytes", "tiled_bytes", "max_diff_out", "max_diff_dqkv"}
 * with each side's saved-plus-scratch bytes and how far the tiled results
 * are from the plain ones (relative to the largest element). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ops.h"

/* The thread's CPU time: what a loaded machine's time slicing leaves out
 * (caches and memory bandwidth shared with the other processes still
 * count). Recorded beside the wall time. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  int B, T, C, NH;
  float *qkv, *dout, *out, *att, *tt, *lse, *ws, *dqkv, *out_t, *dqkv_t;
} ctx;

enum { PLAIN_F, TILED_F, PLAIN_B, TILED_B };

static void run(void *p, int which) {
  ctx *c = p;
  switch (which) {
    case PLAIN_F: pw_attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH, c->NH); break;
    case TILED_F: pw_attention_tiled_forward(c->out_t, c->lse, c->ws, c->qkv, c->B, c->T, c->C, c->NH, c->NH); break;
    case PLAIN_B:
      pw_attention_backward_input(c->dqkv, c->tt, c->dout, c->qkv, c->att, c->B, c->T, c->C, c->NH, c->NH, 0);
      break;
    default:
      pw_attention_tiled_backward_input(c->dqkv_t, c->ws, c->dout, c->out_t, c->qkv, c->lse, c->B, c->T, c->C, c->NH, c->NH,
                                        0);
  }
}

static float *alloc(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  if (!p) {
    fprintf(stderr, "bench_attn: out of memory (%zu floats)\n", n);
    exit(1);
  }
  memset(p, 0, n * sizeof(float)); /* touched: no first-touch faults in the timings */
  return p;
}

static double max_rel(const float *a, const float *b, size_t n) {
  double e = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    e = fmax(e, fabs((double)a[i] - b[i]));
    m = fmax(m, fabs((double)b[i]));
  }
  return m > 0 ? e / m : e;
}

static void print_list(const char *key, const double *v, int n) {
  printf(", \"%s\": [", key);
  for (int i = 0; i < n; i++) printf("%s%.6g", i ? ", " : "", v[i]);
  printf("]");
}

static void bench_T(int B, int T, int C, int NH, int rounds, double target) {
  ctx c = {.B = B, .T = T, .C = C, .NH = NH};
  size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
  size_t nws = pw_attention_tiled_scratch(T, C, NH, NH);
  c.qkv = alloc(nq), c.dout = alloc(no), c.out = alloc(no), c.out_t = alloc(no);
  c.att = alloc(natt), c.tt = alloc((size_t)T * T), c.lse = alloc((size_t)B * NH * T), c.ws = alloc(nws);
  c.dqkv = alloc(nq), c.dqkv_t = alloc(nq);
  bench_fill(c.qkv, nq, 1, 1.0f);
  bench_fill(c.dout, no, 2, 0.01f);
  int k[4];
  for (int v = 0; v < 4; v++) k[v] = bench_calibrate(run, &c, v, target);
  double t[4][64], u[4][64];
  if (rounds > 64) rounds = 64;
  for (int r = 0; r < rounds; r++)
    for (int j = 0; j < 4; j++) {
      /* F: plain tiled, B: plain tiled; odd rounds tiled first */
      int v = (j & 2) | ((j & 1) ^ (r & 1));
      double t0 = bench_now(), u0 = cpu_now();
      for (int i = 0; i < k[v]; i++) run(&c, v);
      t[v][r] = (bench_now() - t0) / k[v];
      u[v][r] = (cpu_now() - u0) / k[v];
    }
  run(&c, PLAIN_F), run(&c, TILED_F), run(&c, PLAIN_B), run(&c, TILED_B);
  printf("{\"T\": %d, \"C\": %d, \"NH\": %d, \"B\": %d, \"rounds\": %d", T, C, NH, B, rounds);
  print_list("plain_f", t[PLAIN_F], rounds);
  print_list("tiled_f", t[TILED_F], rounds);
  print_list("plain_b", t[PLAIN_B], rounds);
  print_list("tiled_b", t[TILED_B], rounds);
  print_list("plain_f_cpu", u[PLAIN_F], rounds);
  print_list("tiled_f_cpu", u[TILED_F], rounds);
  print_list("plain_b_cpu", u[PLAIN_B], rounds);
  print_list("tiled_b_cpu", u[TILED_B], rounds);
  printf(", \"plain_bytes\": %zu, \"tiled_bytes\": %zu", (natt + (size_t)T * T) * sizeof(float),
         ((size_t)B * NH * T + nws) * sizeof(float));
  printf(", \"max_diff_out\": %.3g, \"max_diff_dqkv\": %.3g}\n", max_rel(c.out_t, c.out, no),
         max_rel(c.dqkv_t, c.dqkv, nq));
  fflush(stdout);
  free(c.qkv), free(c.dout), free(c.out), free(c.out_t), free(c.att), free(c.tt), free(c.lse), free(c.ws);
  free(c.dqkv), free(c.dqkv_t);
}

int main(int argc, char **argv) {
  const char *Ts = "256,1024,4096";
  int C = 768, NH = 12, B = 1, rounds = 5;
  double target = 0.3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--T")) Ts = argv[i + 1];
    else if (!strcmp(argv[i], "--C")) C = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--NH")) NH = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--B")) B = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--target")) target = atof(argv[i + 1]);
    else {
      fprintf(stderr, "usage: bench_attn [--T 256,1024] [--C 768] [--NH 12] [--B 1] [--rounds 5] [--target 0.3]\n");
      return 2;
    }
  }
  if (C < 1 || NH < 1 || C % NH || B < 1 || rounds < 1) {
    fprintf(stderr, "bench_attn: bad shape\n");
    return 2;
  }
  for (const char *p = Ts; *p;) {
    int T = atoi(p);
    if (T < 1) {
      fprintf(stderr, "bench_attn: bad T list %s\n", Ts);
      return 2;
    }
    bench_T(B, T, C, NH, rounds, target);
    p = strchr(p, ',');
    if (!p) break;
    p++;
  }
  return 0;
}
