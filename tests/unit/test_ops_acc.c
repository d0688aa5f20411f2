/* test_ops_acc: the `acc` flag of every backward_input kernel. With acc = 0
 * a kernel must overwrite its input gradient without reading it and store,
 * bit for bit, what acc = 1 stores into a zeroed buffer (0 + g: a -0 comes
 * out +0): here into buffers full of NaN, with output gradients that hold
 * zeros and negative zeros. Two-input kernels whose inputs are one value
 * (x + x) overwrite with the first and accumulate with the second. (That
 * acc = 1 adds, and the gradients themselves, are test_ops' business.)
 * Once per vector level (cpu.h). */
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
#include "ops.h"

enum { B = 2, T = 5, C = 12, NH = 2, N = B * T, OC = 7, V = 9, BIG = 4096 };

/* Inputs shared by every case, large enough for any of them. */
static float in0[BIG], in1[BIG], dout[BIG], w[BIG], aux[BIG], scratch[BIG];
static int32_t tok[N];

static void fill(float *x, size_t n, uint32_t seed, float scale) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = scale * ((float)(seed >> 8) / 8388608.0f - 1.0f);
  }
}

static void setup_inputs(void) {
  fill(in0, BIG, 1, 2.0f);
  fill(in1, BIG, 2, 2.0f);
  fill(w, BIG, 3, 1.0f);
  fill(dout, BIG, 4, 1.0f);
  /* zeros of both signs in the output gradient: g = +-0 somewhere */
  for (int i = 0; i < BIG; i += 7) dout[i] = i % 2 ? -0.0f : 0.0f;
  for (int i = 0; i < N; i++) tok[i] = (i * 5 + 1) % V;
  for (int i = 0; i < N; i++) aux[N + i] = 1.0f + 0.1f * (float)i; /* rstd for the norms */
}

typedef void (*bwd_fn)(float *g0, float *g1, int acc0, int acc1);

static void k_posembed(float *g, float *u, int a, int b) { pw_posembed_backward_input(g, dout, B, T, C, a); }
static void k_linear(float *g, float *u, int a, int b) { pw_linear_backward_input(g, dout, w, N, C, OC, a); }
static void k_layernorm(float *g, float *u, int a, int b) {
  pw_layernorm_backward_input(g, dout, in0, w, aux, aux + N, N, C, a);
}
static void k_rmsnorm(float *g, float *u, int a, int b) { pw_rmsnorm_backward_input(g, dout, in0, w, aux + N, N, C, a); }
static void k_gelu(float *g, float *u, int a, int b) { pw_gelu_backward_input(g, dout, in0, N * C, a); } /* in0 as gelu' */
static void k_relu(float *g, float *u, int a, int b) { pw_relu_backward_input(g, dout, in0, N * C, a); }
static void k_silu(float *g, float *u, int a, int b) { pw_silu_backward_input(g, dout, in0, N * C, a); }
static void k_swiglu(float *g, float *u, int a, int b) { pw_swiglu_backward_input(g, u, dout, in0, in1, N * C, a, b); }
static void k_swiglu_same(float *g, float *u, int a, int b) {
  pw_swiglu_backward_input(g, u, dout, in0, in0, N * C, a, b);
}
static void k_rmsnorm_offset(float *g, float *u, int a, int b) {
  pw_rmsnorm_offset_backward_input(g, dout, in0, w, 1.0f, aux + N, N, C, a);
}
static void k_geglu(float *g, float *u, int a, int b) { pw_geglu_backward_input(g, u, dout, in0, in1, N * C, a, b); }
static void k_geglu_same(float *g, float *u, int a, int b) {
  pw_geglu_backward_input(g, u, dout, in0, in0, N * C, a, b);
}
static void k_scale(float *g, float *u, int a, int b) { pw_scale_backward_input(g, dout, 45.254834f, N * C, a); }
static void k_add(float *g, float *u, int a, int b) { pw_add_backward_input(g, u, dout, N * C, a, b); }
static void k_rope(float *g, float *u, int a, int b) {
  pw_rope_backward_input(g, dout, B, T, C, NH, NH, &(pw_rope){.theta = 10000.0f}, a);
}
static void k_attention(float *g, float *u, int a, int b) {
  /* att: a causal softmax-like pattern is enough for the flag's contract */
  static float att[B * NH * T * T];
  for (int i = 0; i < B * NH * T; i++)
    for (int j = 0; j < T; j++) att[i * T + j] = j <= i % T ? 1.0f / (float)(i % T + 1) : 0.0f;
  pw_attention_backward_input(g, scratch, dout, in0, att, B, T, C, NH, NH, a);
}
static void k_xent(float *g, float *u, int a, int b) {
  pw_crossentropy_backward_input(g, in0, tok, N, V, 0.125f, a);
}
static void k_mse(float *g, float *u, int a, int b) { pw_mse_backward_input(g, in0, in1, N * C, 0.125f, a); }

typedef struct {
  const char *name;
  bwd_fn fn;
  size_t n;  /* floats of each input gradient */
  int two;   /* writes a second input gradient */
} kcase;

static const kcase cases[] = {
    {"posembed", k_posembed, N * C, 0},   {"linear", k_linear, N * C, 0},
    {"layernorm", k_layernorm, N * C, 0}, {"rmsnorm", k_rmsnorm, N * C, 0},
    {"gelu", k_gelu, N * C, 0},           {"relu", k_relu, N * C, 0},
    {"silu", k_silu, N * C, 0},           {"swiglu", k_swiglu, N * C, 1},
    {"add", k_add, N * C, 1},             {"rope", k_rope, N * 3 * C, 0},
    {"attention", k_attention, N * 3 * C, 0}, {"cross_entropy", k_xent, N * V, 0},
    {"mse", k_mse, N * C, 0},
    {"rmsnorm_offset", k_rmsnorm_offset, N * C, 0}, {"geglu", k_geglu, N * C, 1},
    {"scale", k_scale, N * C, 0},
};

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static void expect_same(const char *name, const char *what, const float *want, const float *got, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (bits(want[i]) != bits(got[i]))
      fail_msg("%s: %s[%zu]: %.9g (bits %08x) into zeros with acc = 1, %.9g (bits %08x) overwritten", name, what,
               i, (double)want[i], bits(want[i]), (double)got[i], bits(got[i]));
}

static void test_overwrite_equals_zeroed_accumulate(void **st) {
  setup_inputs();
  static float z0[BIG], z1[BIG], g0[BIG], g1[BIG];
  /* (acc0, acc1): the overwritten gradients start as NaN, the others at 0 */
  static const int accs[3][2] = {{0, 0}, {0, 1}, {1, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    const kcase *k = &cases[c];
    assert_true(k->n <= BIG);
    memset(z0, 0, sizeof z0);
    memset(z1, 0, sizeof z1);
    k->fn(z0, z1, 1, 1);
    size_t nonzero = 0;
    for (size_t i = 0; i < k->n; i++) nonzero += z0[i] != 0.0f;
    assert_true(nonzero > k->n / 4); /* the case computes something */
    for (int v = 0; v < (k->two ? 3 : 1); v++) {
      for (size_t i = 0; i < BIG; i++) {
        g0[i] = accs[v][0] ? 0.0f : NAN;
        g1[i] = accs[v][1] ? 0.0f : NAN;
      }
      k->fn(g0, g1, accs[v][0], accs[v][1]);
      expect_same(k->name, "d0", z0, g0, k->n);
      if (k->two) expect_same(k->name, "d1", z1, g1, k->n);
    }
  }
}

/* A gradient of -0 is stored as +0 when overwriting, as adding to +0 does. */
static void test_negative_zero(void **st) {
  float d[2] = {-0.0f, 1.0f}, dgelu[2] = {1.0f, 1.0f}, g[2] = {NAN, NAN};
  pw_gelu_backward_input(g, d, dgelu, 2, 0);
  assert_false(signbit(g[0]));
  float d0[2] = {-0.0f, -0.0f}, a[2] = {NAN, NAN};
  pw_add_backward_input(a, a + 1, d0, 1, 0, 0);
  assert_false(signbit(a[0]));
  assert_false(signbit(a[1]));
}

/* One value read twice (x + x, swiglu(g, g), geglu(g, g)): the first store overwrites,
 * the second adds; the sum equals two accumulations into zeros. */
static void test_same_buffer(void **st) {
  setup_inputs();
  static float z[BIG], g[BIG];
  bwd_fn fns[3] = {k_add, k_swiglu_same, k_geglu_same};
  static const char *const names[3] = {"add(x, x)", "swiglu(g, g)", "geglu(g, g)"};
  for (int f = 0; f < 3; f++) {
    memset(z, 0, sizeof z);
    fns[f](z, z, 1, 1);
    for (size_t i = 0; i < BIG; i++) g[i] = NAN;
    fns[f](g, g, 0, 1);
    expect_same(names[f], "d", z, g, N * C);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_overwrite_equals_zeroed_accumulate),
      cmocka_unit_test(test_negative_zero),
      cmocka_unit_test(test_same_buffer),
  };
  /* Once per vector level (cpu.h), from the one PW_CPU allows down. */
  int rc = 0;
  for (int l = pw_cpu_level(); l >= PW_CPU_SSE; l--) {
    pw_cpu_force((pw_cpu_isa)l);
    rc |= cmocka_run_group_tests_name(pw_cpu_name((pw_cpu_isa)l), tests, NULL, NULL);
  }
  return rc;
}
