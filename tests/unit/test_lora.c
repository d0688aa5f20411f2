/* test_lora: the LoRA kernels (lora.h) against plain double arithmetic and
 * against central differences of their own forward.
 *
 * y = x W^T + b + scale (x A^T) B^T on small odd shapes; the scalar
 * L = sum(R * y) for a fixed random R, so dL/dy = R. Checked:
 *   - forward: y (the base through ops.h plus the adapter) and h = x A^T
 *     against a double-precision loop;
 *   - dx (the base's backward_input, then the adapter's adding to it), dA
 *     and dB against (L(p + e) - L(p - e)) / 2e per element, L summed in
 *     double from the float forward;
 *   - B = 0 (PEFT's initial B): the adapter adds nothing and dA is 0,
 *     while dB is not (training starts through B);
 *   - a NULL gradient is left alone;
 *   - the adapter merged into W gives the adapted output. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lora.h"
#include "ops.h"
#include "rng.h"

enum { N = 6, C = 5, OC = 7, R = 3 };
static const float SCALE = 2.0f / 3.0f; /* alpha 2, rank 3 */

typedef struct {
  float x[N * C], w[OC * C], b[OC], A[R * C], B[OC * R], Rm[N * OC];
} case_t;

static void fill(float *a, int n, pw_rng *r) {
  for (int i = 0; i < n; i++) a[i] = (float)pw_rng_normal(r);
}

static void make(case_t *t, uint64_t seed) {
  pw_rng r;
  pw_rng_seed(&r, seed);
  fill(t->x, N * C, &r), fill(t->w, OC * C, &r), fill(t->b, OC, &r);
  fill(t->A, R * C, &r), fill(t->B, OC * R, &r), fill(t->Rm, N * OC, &r);
}

static void forward(const case_t *t, float *y, float *h) {
  pw_linear_forward(y, t->x, t->w, t->b, N, C, OC);
  pw_lora_forward(y, h, t->x, t->A, t->B, N, C, OC, R, SCALE);
}

static double loss(const case_t *t) {
  float y[N * OC], h[N * R];
  forward(t, y, h);
  double L = 0;
  for (int i = 0; i < N * OC; i++) L += (double)t->Rm[i] * y[i];
  return L;
}

static void test_forward(void **st) {
  (void)st;
  case_t t;
  make(&t, 1);
  float y[N * OC], h[N * R];
  forward(&t, y, h);
  for (int n = 0; n < N; n++) {
    double hh[R];
    for (int k = 0; k < R; k++) {
      hh[k] = 0;
      for (int c = 0; c < C; c++) hh[k] += (double)t.x[n * C + c] * t.A[k * C + c];
      assert_true(fabs(hh[k] - h[n * R + k]) <= 1e-5 * (1 + fabs(hh[k])));
    }
    for (int o = 0; o < OC; o++) {
      double want = t.b[o], ad = 0;
      for (int c = 0; c < C; c++) want += (double)t.x[n * C + c] * t.w[o * C + c];
      for (int k = 0; k < R; k++) ad += hh[k] * t.B[o * R + k];
      want += (double)SCALE * ad;
      if (fabs(want - y[n * OC + o]) > 1e-5 * (1 + fabs(want)))
        fail_msg("y[%d,%d] = %.9g, want %.9g", n, o, (double)y[n * OC + o], want);
    }
  }
}

/* Every element of p (n of them) against a central difference of L. */
static void check_fd(case_t *t, float *p, const float *g, int n, const char *what) {
  const float eps = 1e-2f;
  double gmax = 0;
  for (int i = 0; i < n; i++) gmax = fmax(gmax, fabs(g[i]));
  assert_true(gmax > 0.1); /* a gradient that is really there */
  for (int i = 0; i < n; i++) {
    float keep = p[i];
    p[i] = keep + eps;
    double lp = loss(t);
    p[i] = keep - eps;
    double lm = loss(t);
    p[i] = keep;
    double fd = (lp - lm) / (2.0 * eps);
    if (fabs(fd - g[i]) > 1e-3 * gmax + 1e-4) fail_msg("%s[%d]: kernel %.7g, finite difference %.7g", what, i, (double)g[i], fd);
  }
}

static void gradients(const case_t *t, float *dx, float *dA, float *dB) {
  float y[N * OC], h[N * R], dh[N * R];
  forward(t, y, h);
  pw_linear_backward_input(dx, t->Rm, t->w, N, C, OC, 0);
  pw_lora_backward_input(dx, dh, t->Rm, t->A, t->B, N, C, OC, R, SCALE);
  memset(dA, 0, sizeof(float) * R * C);
  memset(dB, 0, sizeof(float) * OC * R);
  pw_lora_backward_weight(dA, dB, dh, t->Rm, t->x, h, t->B, N, C, OC, R, SCALE);
}

static void test_gradients(void **st) {
  (void)st;
  case_t t;
  make(&t, 2);
  float dx[N * C], dA[R * C], dB[OC * R];
  gradients(&t, dx, dA, dB);
  check_fd(&t, t.x, dx, N * C, "dx");
  check_fd(&t, t.A, dA, R * C, "dA");
  check_fd(&t, t.B, dB, OC * R, "dB");
  /* the weight gradients accumulate: a second call doubles them */
  float y[N * OC], h[N * R], dh[N * R], dA2[R * C], dB2[OC * R];
  memcpy(dA2, dA, sizeof dA), memcpy(dB2, dB, sizeof dB);
  forward(&t, y, h);
  pw_lora_backward_weight(dA2, dB2, dh, t.Rm, t.x, h, t.B, N, C, OC, R, SCALE);
  for (int i = 0; i < R * C; i++) assert_true(dA2[i] == 2.0f * dA[i]);
  for (int i = 0; i < OC * R; i++) assert_true(dB2[i] == 2.0f * dB[i]);
  /* a NULL gradient is not wanted: the other one is the same */
  memset(dA2, 0, sizeof dA2);
  pw_lora_backward_weight(dA2, NULL, dh, t.Rm, t.x, h, t.B, N, C, OC, R, SCALE);
  assert_memory_equal(dA2, dA, sizeof dA);
  memset(dB2, 0, sizeof dB2);
  pw_lora_backward_weight(NULL, dB2, dh, t.Rm, t.x, h, t.B, N, C, OC, R, SCALE);
  assert_memory_equal(dB2, dB, sizeof dB);
}

static void test_zero_b(void **st) {
  (void)st;
  case_t t;
  make(&t, 3);
  memset(t.B, 0, sizeof t.B);
  float y[N * OC], base[N * OC], h[N * R];
  forward(&t, y, h);
  pw_linear_forward(base, t.x, t.w, t.b, N, C, OC);
  assert_memory_equal(y, base, sizeof y);
  float dx[N * C], dA[R * C], dB[OC * R];
  gradients(&t, dx, dA, dB);
  for (int i = 0; i < R * C; i++) assert_true(dA[i] == 0.0f);
  check_fd(&t, t.B, dB, OC * R, "dB at B = 0");
}

/* Merged (W += scale B A), the plain linear computes the adapted output. */
static void test_merge(void **st) {
  (void)st;
  case_t t;
  make(&t, 4);
  float y[N * OC], h[N * R], ym[N * OC], w[OC * C];
  forward(&t, y, h);
  memcpy(w, t.w, sizeof w);
  pw_lora_merge_weight(w, t.A, t.B, C, OC, R, SCALE);
  pw_linear_forward(ym, t.x, w, t.b, N, C, OC);
  for (int i = 0; i < N * OC; i++)
    if (fabsf(ym[i] - y[i]) > 1e-5f * (1 + fabsf(y[i]))) fail_msg("y[%d]: merged %.9g, adapted %.9g", i, (double)ym[i], (double)y[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward),
      cmocka_unit_test(test_gradients),
      cmocka_unit_test(test_zero_b),
      cmocka_unit_test(test_merge),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
