/* backend: the CPU backend — the process's memory, ops.h's kernels and
 * optim.c's loops; the reference every other backend is checked against. */
#include "backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bf16.h"
#include "cpu.h"

/* Write one float per 4 KiB page so the kernel maps it now. */
static void first_touch(float *a, size_t n) {
  volatile float *v = a;
  for (size_t i = 0; i < n; i += 1024) v[i] = 0.0f;
}

#define HUGE_PAGE ((size_t)2 << 20)

/* n zeroed floats, every page mapped now (the first use would pay the
 * page faults in the middle of a step). Arrays of 2 MiB or more are 2 MiB
 * aligned and asked to be transparent huge pages (THP is often in
 * "madvise" mode): a step streams through hundreds of MB of slot and
 * arenas, and OpenBLAS's packing walks many rows at once; with 4 KiB pages
 * each 4 KiB is a TLB miss. Measured on a d256 step: about even on a quiet
 * machine, 1-6 % faster while other processes load it. Only the whole huge
 * pages inside the n floats are asked for: one over the tail would map up to
 * 2 MiB nobody uses, which the planner does not count (measured: a ZeRO-2
 * worker's three 2.4 MB buffers held 5 MiB more than planned). Freed with
 * free(). */
float *pw_alloc_floats(size_t n) {
  size_t bytes = n * sizeof(float);
  float *a;
  if (bytes < HUGE_PAGE) {
    /* calloc maps its pages lazily (malloc + memset(0) becomes calloc too) */
    if ((a = calloc(n, sizeof(float)))) first_touch(a, n);
    return a;
  }
  void *v = NULL;
  size_t rounded = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
  if (posix_memalign(&v, HUGE_PAGE, rounded)) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(v, bytes / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* a hint: if refused, 4 KiB pages */
#endif
  memset(v, 0, bytes);
  return v;
}

static void *cpu_alloc(const pw_backend *be, size_t bytes) {
  (void)be;
  return pw_alloc_floats((bytes + sizeof(float) - 1) / sizeof(float));
}
static void cpu_free(const pw_backend *be, void *p) {
  (void)be;
  free(p);
}
static int cpu_copy(const pw_backend *be, void *dst, const void *src, size_t bytes, pw_err *err) {
  (void)be, (void)err;
  if (bytes) memmove(dst, src, bytes);
  return 0;
}
static int cpu_zero(const pw_backend *be, void *p, size_t bytes, pw_err *err) {
  (void)be, (void)err;
  memset(p, 0, bytes);
  return 0;
}
static int cpu_sync(const pw_backend *be, pw_err *err) {
  (void)be, (void)err;
  return 0;
}

/* The two loops over whole arenas, compiled per vector level (cpu.h): the
 * same operations in the same order at every level, so the same bits. */
static PW_CPU_DISPATCH(sqnorm16, (const float *g, size_t n, double *out), (g, n, out)) {
  /* 16 partial sums: the loop vectorises, and the order is fixed. */
  size_t j = 0;
  double l[16] = {0}, t = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; k++) l[k] += (double)g[j + k] * g[j + k];
  for (; j < n; j++) t += (double)g[j] * g[j];
  for (int k = 0; k < 16; k++) t += l[k];
  *out = t;
}

static PW_CPU_DISPATCH(adamw_loop,
                       (float *w, const float *g, float *m, float *v, size_t n, float gs, float decay, float b1,
                        float b2, float eps, float step, float bc2s),
                       (w, g, m, v, n, gs, decay, b1, b2, eps, step, bc2s)) {
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * gs;
    w[i] *= decay;
    m[i] = m[i] * b1 + gi * (1.0f - b1);
    v[i] = v[i] * b2 + (1.0f - b2) * gi * gi;
    float denom = sqrtf(v[i]) / bc2s + eps;
    w[i] -= step * (m[i] / denom);
  }
}

static double cpu_sqnorm(const pw_backend *be, const float *g, size_t n) {
  (void)be;
  double t;
  sqnorm16(g, n, &t);
  return t;
}
static void cpu_adamw(const pw_backend *be, float *w, const float *g, float *m, float *v, size_t n, float gs,
                      float decay, float b1, float b2, float eps, float step, float bc2s) {
  (void)be;
  adamw_loop(w, g, m, v, n, gs, decay, b1, b2, eps, step, bc2s);
}
static void cpu_sgd(const pw_backend *be, float *w, const float *g, float *buf, size_t n, float gs, float wd,
                    float mom, float lr, int first) {
  (void)be;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * gs + wd * w[i];
    if (mom != 0.0f) {
      buf[i] = first ? gi : buf[i] * mom + gi;
      gi = buf[i];
    }
    w[i] -= lr * gi;
  }
}
static void cpu_add_into(const pw_backend *be, float *out, const float *in, size_t n) {
  (void)be;
  for (size_t k = 0; k < n; k++) out[k] += in[k];
}

static void cpu_round_bf16(const pw_backend *be, float *x, size_t n) {
  (void)be;
  pw_bf16_round_f32(x, n);
}

static const pw_backend cpu = {
    .name = "cpu",
    .host = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .kernel_of = pw_kernel_of,
    .sqnorm = cpu_sqnorm,
    .adamw = cpu_adamw,
    .sgd = cpu_sgd,
    .add_into = cpu_add_into,
    .round_bf16 = cpu_round_bf16,
};

const pw_backend *pw_backend_cpu(void) { return &cpu; }
