/* test_ops_math: the vectorizable math of ops_math.h and the kernel paths
 * built on it that the small shapes of test_ops.c do not reach.
 *
 *  - pw__exp and pw__tanh return the correctly rounded float (compared with
 *    long-double libm, rounded once) over a sweep of every sign and
 *    exponent, and handle 0, -0, infinities, NaN and the overflow edges;
 *  - pw__expf (the tiled attention's) is within 1 ulp of it over [-87, 88];
 *  - the lane reductions (sum, max, dot, squared deviation) agree with
 *    plain double loops for every length around the lane width;
 *  - GELU equals PyTorch's float formula bit for bit given a correctly
 *    rounded tanh, and its gradient the float derivative formula;
 *  - LayerNorm and RMSNorm rows wider than the backward's stack chunk and
 *    not a multiple of the lane width pass the finite-difference check.
 * Once per vector level (cpu.h): the kernels' variants; the helpers called
 * here directly are the baseline build of the same code. */
#include "cpu.h"
#include "opcheck.h"
#include "ops_math.h"

static float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void test_exp_tanh_correctly_rounded(void **state) {
  long n = 0, bad = 0;
  for (uint32_t u = 0; u < 0x7f800000u; u += 20011) {
    for (int s = 0; s < 2; s++) {
      float x = s ? -bits_to_float(u) : bits_to_float(u);
      float t = pw__tanh(x), want = (float)tanhl((long double)x);
      if (t != want) {
        if (bad++ < 5) printf("FAIL tanh(%.9g): expected %.9g got %.9g\n", x, want, t);
      }
      if (x > -110.0f && x < 88.0f) {
        float e = pw__exp(x), ew = (float)expl((long double)x);
        if (e != ew && bad++ < 5) printf("FAIL exp(%.9g): expected %.9g got %.9g\n", x, ew, e);
      }
      n++;
    }
  }
  assert_true(n > 200000);
  assert_int_equal(bad, 0);

  assert_true(pw__tanh(0.0f) == 0.0f && !signbit(pw__tanh(0.0f)));
  assert_true(pw__tanh(-0.0f) == 0.0f && signbit(pw__tanh(-0.0f)));
  assert_true(pw__tanh(INFINITY) == 1.0f && pw__tanh(-INFINITY) == -1.0f);
  assert_true(pw__tanh(30.0f) == 1.0f && pw__tanh(-1e30f) == -1.0f);
  assert_true(isnan(pw__tanh(NAN)));
  assert_true(pw__exp(0.0f) == 1.0f);
  assert_true(pw__exp(-INFINITY) == 0.0f && pw__exp(-200.0f) == 0.0f);
  assert_true(isinf(pw__exp(INFINITY)) && isinf(pw__exp(89.0f)));
  assert_true(pw__exp(88.7f) == (float)expl((long double)88.7f) && isfinite(pw__exp(88.7f)));
  assert_true(pw__exp(-103.0f) == (float)expl(-103.0L) && pw__exp(-103.0f) > 0.0f); /* subnormal */
  assert_true(isnan(pw__exp(NAN)));
}

/* The float exp of the tiled attention: within 1 ulp of the correctly
 * rounded e^x over [-87, 88] (every 1009th float of each sign: 2 million),
 * exact at 0, clamped outside (e^-87 below, e^88 above, finite). */
static void test_expf_one_ulp(void **state) {
  long n = 0, bad = 0, exact = 0;
  for (uint32_t u = 0; u < 0x42b00000u; u += 1009) /* |x| < 88 */
    for (int s = 0; s < 2; s++) {
      float x = s ? -bits_to_float(u) : bits_to_float(u);
      if (x < -87.0f) continue;
      float got = pw__expf(x), want = (float)expl((long double)x);
      float lo = nextafterf(want, -INFINITY), hi = nextafterf(want, INFINITY);
      exact += got == want;
      if (!(got >= lo && got <= hi) && bad++ < 5) printf("FAIL expf(%.9g): expected %.9g got %.9g\n", x, want, got);
      n++;
    }
  assert_true(n > 1000000);
  assert_int_equal(bad, 0);
  assert_true(exact > n * 95 / 100);
  assert_true(pw__expf(0.0f) == 1.0f && pw__expf(-0.0f) == 1.0f);
  assert_true(pw__expf(-1000.0f) == pw__expf(-87.0f) && pw__expf(-87.0f) > 0.0f);
  assert_true(pw__expf(1000.0f) == pw__expf(88.0f) && isfinite(pw__expf(88.0f)));
}

static void test_lane_reductions(void **state) {
  float x[80], y[80];
  for (int i = 0; i < 80; i++) {
    x[i] = (float)sin(1.7 * i) * (1.0f + (float)(i % 7));
    y[i] = (float)cos(0.3 * i);
  }
  for (int n = 1; n <= 80; n++) {
    double s = 0, d = 0, mean = 0, q = 0;
    float mx = x[0];
    for (int i = 0; i < n; i++) s += x[i], d += (double)x[i] * y[i], mx = x[i] > mx ? x[i] : mx;
    mean = s / n;
    for (int i = 0; i < n; i++) q += (x[i] - mean) * (x[i] - mean);
    assert_true(fabs(pw__sum_d(x, n) - s) <= 1e-12 * (1 + fabs(s)));
    assert_true(fabs(pw__sum(x, n) - s) <= 1e-5 * (1 + fabs(s)));
    assert_true(fabs(pw__dot_d(x, y, n) - d) <= 1e-12 * (1 + fabs(d)));
    assert_true(fabs(pw__dot(x, y, n) - d) <= 1e-5 * (1 + fabs(d)));
    assert_true(fabs(pw__sqdev_d(x, mean, n) - q) <= 1e-12 * (1 + q));
    assert_true(pw__max(x, n) == mx);
  }
  float neg[3] = {-5.0f, -2.0f, -9.0f};
  assert_true(pw__max(neg, 3) == -2.0f);
}

/* PyTorch's gelu(approximate='tanh') in float with a correctly rounded tanh. */
static void test_gelu_float_formula(void **state) {
  enum { n = 1000 };
  float x[n], y[n], g[n], d[n], dg[n];
  const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
  for (int i = 0; i < n; i++) {
    x[i] = -9.0f + 18.0f * (float)i / (n - 1) + 1e-3f * (float)(i % 3);
    d[i] = 1.0f + 0.01f * (float)(i % 5);
    g[i] = 0.25f;
  }
  pw_gelu_forward(y, dg, x, n);
  pw_gelu_backward_input(g, d, dg, n, 1);
  for (int i = 0; i < n; i++) {
    float xi = x[i], x2 = xi * xi;
    float inner = beta * (xi + kappa * (xi * xi * xi));
    float th = (float)tanhl((long double)inner);
    float want = 0.5f * xi * (1.0f + th);
    float left = 0.5f * xi, right = 1.0f + th, dleft = 0.5f * right, dtanh = 1.0f - th * th;
    float dinner = beta * (1.0f + 3.0f * kappa * x2);
    float gw = 0.25f + d[i] * (dleft + left * dtanh * dinner);
    if (y[i] != want || g[i] != gw)
      printf("FAIL gelu x=%.9g: y %.9g want %.9g, grad %.9g want %.9g\n", xi, y[i], want, g[i], gw);
    assert_true(y[i] == want);
    assert_true(g[i] == gw);
  }
}

/* ---- norms over rows wider than LN_CHUNK (256), C % 16 != 0 ------------ */

static void ln_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_layernorm_forward(out, saved, saved + c->d[0], in[0], in[1], in[2], c->d[0], c->d[1], c->fp);
}
static void ln_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                   float *const *g) {
  int N = c->d[0], C = c->d[1];
  if (which == IN_DATA)
    pw_layernorm_backward_input(g[0], dout, in[0], in[1], saved, saved + N, N, C, 1);
  else
    pw_layernorm_backward_weight(g[1], g[2], dout, in[0], saved, saved + N, N, C);
}
static void ln_ref(const opcase *c, double *const *in, double *out) {
  int N = c->d[0], C = c->d[1];
  for (int n = 0; n < N; n++) {
    const double *x = in[0] + (size_t)n * C;
    double m = 0, v = 0;
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    double rs = 1.0 / sqrt(v / C + (double)c->fp);
    for (int i = 0; i < C; i++) out[(size_t)n * C + i] = (x[i] - m) * rs * in[1][i] + in[2][i];
  }
}
static void rms_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_rmsnorm_forward(out, saved, in[0], in[1], c->d[0], c->d[1], c->fp);
}
static void rms_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                    float *const *g) {
  if (which == IN_DATA)
    pw_rmsnorm_backward_input(g[0], dout, in[0], in[1], saved, c->d[0], c->d[1], 1);
  else
    pw_rmsnorm_backward_weight(g[1], dout, in[0], saved, c->d[0], c->d[1]);
}
static void rms_ref(const opcase *c, double *const *in, double *out) {
  int N = c->d[0], C = c->d[1];
  for (int n = 0; n < N; n++) {
    const double *x = in[0] + (size_t)n * C;
    double ss = 0;
    for (int i = 0; i < C; i++) ss += x[i] * x[i];
    double rs = 1.0 / sqrt(ss / C + (double)c->fp);
    for (int i = 0; i < C; i++) out[(size_t)n * C + i] = x[i] * rs * in[1][i];
  }
}

static void test_wide_norms(void **state) {
  int N = 2, C = 300;
  opcase ln = {.n_in = 3, .in_name = {"inp", "w", "b"}, .in_kind = {IN_DATA, IN_PARAM, IN_PARAM},
               .in_n = {(size_t)N * C, (size_t)C, (size_t)C}, .out_n = (size_t)N * C,
               .saved_n = 2 * (size_t)N, .d = {N, C}, .fp = 1e-5f, .init_shift = 0.7,
               .fwd = ln_fwd, .bwd = ln_bwd, .ref = ln_ref};
  snprintf(ln.name, sizeof ln.name, "layernorm N=%d C=%d", N, C);
  check_op(&ln);
  opcase rms = {.n_in = 2, .in_name = {"inp", "w"}, .in_kind = {IN_DATA, IN_PARAM},
                .in_n = {(size_t)N * C, (size_t)C}, .out_n = (size_t)N * C,
                .saved_n = (size_t)N, .d = {N, C}, .fp = 1e-6f,
                .fwd = rms_fwd, .bwd = rms_bwd, .ref = rms_ref};
  snprintf(rms.name, sizeof rms.name, "rmsnorm N=%d C=%d", N, C);
  check_op(&rms);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exp_tanh_correctly_rounded),
      cmocka_unit_test(test_expf_one_ulp),
      cmocka_unit_test(test_lane_reductions),
      cmocka_unit_test(test_gelu_float_formula),
      cmocka_unit_test(test_wide_norms),
  };
  /* Once per vector level (cpu.h), from the one PW_CPU allows down. */
  int rc = 0;
  for (int l = pw_cpu_level(); l >= PW_CPU_SSE; l--) {
    pw_cpu_force((pw_cpu_isa)l);
    rc |= cmocka_run_group_tests_name(pw_cpu_name((pw_cpu_isa)l), tests, NULL, NULL);
  }
  return rc;
}
