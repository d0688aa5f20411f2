/* test_ops: the dense, norm, activation, embedding and loss kernels of
 * ops.c against double-precision references and finite differences (the
 * harness is opcheck.h), plus contract details: accumulation, tokens that
 * repeat, saved statistics, PyTorch's GELU values, loss stability, and a
 * meta-test proving the gradient check rejects a slightly wrong gradient.
 * Everything runs once per vector level the CPU has (cpu.h), as PW_CPU
 * allows. */
#include "cpu.h"
#include "opcheck.h"

/* ---- linear --------------------------------------------------------------- */
/* d = {N, C, OC, has_bias}; inputs inp, w, [b]. */

static void linear_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_linear_forward(out, in[0], in[1], c->d[3] ? in[2] : NULL, c->d[0], c->d[1], c->d[2]);
}
static void linear_bwd(const opcase *c, int which, float *const *in, float *saved,
                       const float *dout, float *const *g) {
  if (which == IN_DATA)
    pw_linear_backward_input(g[0], dout, in[1], c->d[0], c->d[1], c->d[2], 1);
  else
    pw_linear_backward_weight(g[1], c->d[3] ? g[2] : NULL, dout, in[0], c->d[0], c->d[1],
                              c->d[2]);
}
static void linear_ref(const opcase *c, double *const *in, double *out) {
  int N = c->d[0], C = c->d[1], OC = c->d[2];
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = c->d[3] ? in[2][o] : 0.0;
      for (int i = 0; i < C; i++) s += in[0][n * C + i] * in[1][o * C + i];
      out[n * OC + o] = s;
    }
}
static opcase linear_case(int N, int C, int OC, int bias) {
  opcase c = {.n_in = bias ? 3 : 2,
              .in_name = {"inp", "w", "bias"},
              .in_kind = {IN_DATA, IN_PARAM, IN_PARAM},
              .in_n = {(size_t)N * C, (size_t)OC * C, (size_t)OC},
              .out_n = (size_t)N * OC,
              .d = {N, C, OC, bias},
              .fwd = linear_fwd, .bwd = linear_bwd, .ref = linear_ref};
  snprintf(c.name, sizeof c.name, "linear N=%d C=%d OC=%d%s", N, C, OC, bias ? " +bias" : "");
  return c;
}

static void test_linear(void **state) {
  opcase c = linear_case(10, 8, 6, 1);
  check_op(&c);
  c = linear_case(7, 5, 3, 0);
  check_op(&c);
  c = linear_case(33, 17, 13, 1); /* odd sizes: sgemm edge tiles */
  check_op(&c);
}

/* The tolerance must bite: a gradient 1% off, or a forward 0.01% off, fails. */
static void test_gradcheck_meta(void **state) {
  opcase c = linear_case(10, 8, 6, 1);
  printf("  (meta: the next lines are expected failures)\n");
  opresult r = check_op_scaled(&c, 1.0, 1.01);
  assert_int_equal(r.fwd_fail, 0);
  assert_true(r.grad_fail > 0);
  r = check_op_scaled(&c, 1.0001, 1.0);
  assert_true(r.fwd_fail > 0);
  assert_int_equal(r.grad_fail, 0);
  /* A single element wrong by 0.5% of the largest gradient also fails. */
  double e[4] = {1.0, -0.5, 0.25, 0.0};
  float got[4] = {1.0f, -0.5f, 0.25f, 0.005f};
  assert_true(oc_compare("meta", "one element", got, e, 4, GRAD_RTOL, GRAD_ATOL, NULL, NULL) == 1);
  got[3] = 0.0f;
  assert_int_equal(oc_compare("meta", "exact", got, e, 4, GRAD_RTOL, GRAD_ATOL, NULL, NULL), 0);
}

/* ---- embeddings ----------------------------------------------------------- */
/* d = {N, C, V}; input wte; tokens in c->tok (with repeats). */

static void embed_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_embed_forward(out, c->tok, in[0], c->d[0], c->d[1]);
}
static void embed_bwd(const opcase *c, int which, float *const *in, float *saved,
                      const float *dout, float *const *g) {
  if (which == IN_PARAM) pw_embed_backward_weight(g[0], dout, c->tok, c->d[0], c->d[1]);
}
static void embed_ref(const opcase *c, double *const *in, double *out) {
  int N = c->d[0], C = c->d[1];
  for (int n = 0; n < N; n++)
    for (int i = 0; i < C; i++) out[n * C + i] = in[0][c->tok[n] * C + i];
}

static void test_embed(void **state) {
  static const int32_t tok[] = {3, 0, 6, 3, 3, 1, 6, 2, 0}; /* V=7, 4 and 5 unused */
  opcase c = {.n_in = 1, .in_name = {"wte"}, .in_kind = {IN_PARAM}, .in_n = {7 * 5},
              .out_n = 9 * 5, .d = {9, 5, 7}, .tok = tok,
              .fwd = embed_fwd, .bwd = embed_bwd, .ref = embed_ref};
  snprintf(c.name, sizeof c.name, "embed N=9 C=5 V=7");
  check_op(&c);
}

/* d = {B, T, C, Tmax}; inputs inp, wpe (Tmax > T: rows past T get no gradient). */
static void posembed_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_posembed_forward(out, in[0], in[1], c->d[0], c->d[1], c->d[2]);
}
static void posembed_bwd(const opcase *c, int which, float *const *in, float *saved,
                         const float *dout, float *const *g) {
  if (which == IN_DATA)
    pw_posembed_backward_input(g[0], dout, c->d[0], c->d[1], c->d[2], 1);
  else
    pw_posembed_backward_weight(g[1], dout, c->d[0], c->d[1], c->d[2]);
}
static void posembed_ref(const opcase *c, double *const *in, double *out) {
  int B = c->d[0], T = c->d[1], C = c->d[2];
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int i = 0; i < C; i++)
        out[(b * T + t) * C + i] = in[0][(b * T + t) * C + i] + in[1][t * C + i];
}

static void test_posembed(void **state) {
  int B = 3, T = 5, C = 4, Tmax = 8;
  opcase c = {.n_in = 2, .in_name = {"inp", "wpe"}, .in_kind = {IN_DATA, IN_PARAM},
              .in_n = {(size_t)B * T * C, (size_t)Tmax * C}, .out_n = (size_t)B * T * C,
              .d = {B, T, C, Tmax}, .fwd = posembed_fwd, .bwd = posembed_bwd,
              .ref = posembed_ref};
  snprintf(c.name, sizeof c.name, "posembed B=3 T=5 C=4 Tmax=8");
  check_op(&c);
}

/* ---- norms ---------------------------------------------------------------- */
/* layernorm: d = {N, C}; inputs inp, w, b; saved mean (N), rstd (N). */

static void layernorm_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  int N = c->d[0];
  pw_layernorm_forward(out, saved, saved + N, in[0], in[1], in[2], N, c->d[1], c->fp);
}
static void layernorm_bwd(const opcase *c, int which, float *const *in, float *saved,
                          const float *dout, float *const *g) {
  int N = c->d[0], C = c->d[1];
  if (which == IN_DATA)
    pw_layernorm_backward_input(g[0], dout, in[0], in[1], saved, saved + N, N, C, 1);
  else
    pw_layernorm_backward_weight(g[1], g[2], dout, in[0], saved, saved + N, N, C);
}
static void layernorm_ref(const opcase *c, double *const *in, double *out) {
  int N = c->d[0], C = c->d[1];
  for (int n = 0; n < N; n++) {
    const double *x = in[0] + n * C;
    double m = 0, v = 0;
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    v /= C; /* biased, as PyTorch */
    double rs = 1.0 / sqrt(v + (double)c->fp);
    for (int i = 0; i < C; i++) out[n * C + i] = (x[i] - m) * rs * in[1][i] + in[2][i];
  }
}

static opcase layernorm_case(int N, int C) {
  opcase c = {.n_in = 3, .in_name = {"inp", "w", "b"},
              .in_kind = {IN_DATA, IN_PARAM, IN_PARAM},
              .in_n = {(size_t)N * C, (size_t)C, (size_t)C}, .out_n = (size_t)N * C,
              .saved_n = 2 * (size_t)N, .d = {N, C}, .fp = 1e-5f, .init_shift = 0.7,
              .fwd = layernorm_fwd, .bwd = layernorm_bwd, .ref = layernorm_ref};
  snprintf(c.name, sizeof c.name, "layernorm N=%d C=%d", N, C);
  return c;
}

static void test_layernorm(void **state) {
  opcase c = layernorm_case(10, 8);
  check_op(&c);
  c = layernorm_case(5, 13);
  check_op(&c);

  /* Saved statistics are the biased mean and 1/sqrt(var + eps). */
  float x[6] = {1, 2, 3, 4, 5, 7}, w[3] = {1, 1, 1}, b[3] = {0, 0, 0}, y[6], mean[2], rstd[2];
  pw_layernorm_forward(y, mean, rstd, x, w, b, 2, 3, 1e-5f);
  assert_float_equal(mean[0], 2.0f, 1e-7);
  assert_float_equal(mean[1], 16.0f / 3.0f, 1e-6);
  assert_float_equal(rstd[0], 1.0 / sqrt(2.0 / 3.0 + 1e-5), 1e-6);
  assert_float_equal(rstd[1], 1.0 / sqrt(14.0 / 9.0 + 1e-5), 1e-6);
}

/* The fused backward (one pass) stores exactly what backward_weight then
 * backward_input store: narrow rows, rows of several LN_CHUNKs kept on the
 * stack, rows wider than LN_ROW (recomputed), overwriting and accumulating. */
static void test_layernorm_fused(void **state) {
  const int Cs[3] = {13, 300, 1100}, N = 3;
  for (int k = 0; k < 3; k++)
    for (int acc = 0; acc < 2; acc++) {
      int C = Cs[k];
      size_t n = (size_t)N * C;
      float *x = malloc(n * 4), *dy = malloc(n * 4), *y = malloc(n * 4), *dx1 = malloc(n * 4),
            *dx2 = malloc(n * 4), *w = malloc(C * 4u), *b = malloc(C * 4u), *dw1 = malloc(C * 4u),
            *dw2 = malloc(C * 4u), *db1 = malloc(C * 4u), *db2 = malloc(C * 4u), st[6];
      assert_true(x && dy && y && dx1 && dx2 && w && b && dw1 && dw2 && db1 && db2);
      for (size_t i = 0; i < n; i++) {
        x[i] = (float)sin(0.37 * (double)i) * 3.0f + 0.5f;
        dy[i] = (float)cos(0.91 * (double)i);
        dx1[i] = dx2[i] = acc ? (float)i * 1e-3f : NAN; /* overwritten unread */
      }
      for (int c = 0; c < C; c++) {
        w[c] = 1.0f + 0.01f * (float)(c % 17), b[c] = 0.1f;
        dw1[c] = dw2[c] = 0.25f, db1[c] = db2[c] = -0.5f;
      }
      pw_layernorm_forward(y, st, st + N, x, w, b, N, C, 1e-5f);
      pw_layernorm_backward_weight(dw1, db1, dy, x, st, st + N, N, C);
      pw_layernorm_backward_input(dx1, dy, x, w, st, st + N, N, C, acc);
      pw_layernorm_backward(dx2, dw2, db2, dy, x, w, st, st + N, N, C, acc);
      assert_memory_equal(dx1, dx2, n * 4);
      assert_memory_equal(dw1, dw2, C * 4u);
      assert_memory_equal(db1, db2, C * 4u);
      assert_true(dw1[0] != 0.25f && db1[0] != -0.5f); /* both really accumulated */
      free(x), free(dy), free(y), free(dx1), free(dx2), free(w), free(b);
      free(dw1), free(dw2), free(db1), free(db2);
    }
}

/* rmsnorm: d = {N, C}; inputs inp, w; saved rstd (N). */
/* d[2] 1: the offset kernels, scale 1 + w (Gemma); else pw_rmsnorm_*. */
static void rmsnorm_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  if (c->d[2])
    pw_rmsnorm_offset_forward(out, saved, in[0], in[1], 1.0f, c->d[0], c->d[1], c->fp);
  else
    pw_rmsnorm_forward(out, saved, in[0], in[1], c->d[0], c->d[1], c->fp);
}
static void rmsnorm_bwd(const opcase *c, int which, float *const *in, float *saved,
                        const float *dout, float *const *g) {
  if (which == IN_DATA && c->d[2])
    pw_rmsnorm_offset_backward_input(g[0], dout, in[0], in[1], 1.0f, saved, c->d[0], c->d[1], 1);
  else if (which == IN_DATA)
    pw_rmsnorm_backward_input(g[0], dout, in[0], in[1], saved, c->d[0], c->d[1], 1);
  else
    pw_rmsnorm_backward_weight(g[1], dout, in[0], saved, c->d[0], c->d[1]);
}
static void rmsnorm_ref(const opcase *c, double *const *in, double *out) {
  int N = c->d[0], C = c->d[1];
  for (int n = 0; n < N; n++) {
    const double *x = in[0] + n * C;
    double ss = 0;
    for (int i = 0; i < C; i++) ss += x[i] * x[i];
    double rs = 1.0 / sqrt(ss / C + (double)c->fp);
    for (int i = 0; i < C; i++) out[n * C + i] = x[i] * rs * ((c->d[2] ? 1.0 : 0.0) + in[1][i]);
  }
}

static void test_rmsnorm(void **state) {
  int dims[3][2] = {{10, 8}, {3, 11}, {2, 300}}; /* 300: past the backward's LN_CHUNK */
  for (int off = 0; off < 2; off++)
    for (int k = 0; k < 3; k++) {
      int N = dims[k][0], C = dims[k][1];
      opcase c = {.n_in = 2, .in_name = {"inp", "w"}, .in_kind = {IN_DATA, IN_PARAM},
                  .in_n = {(size_t)N * C, (size_t)C}, .out_n = (size_t)N * C,
                  .saved_n = (size_t)N, .d = {N, C, off}, .fp = 1e-6f,
                  .fwd = rmsnorm_fwd, .bwd = rmsnorm_bwd, .ref = rmsnorm_ref};
      snprintf(c.name, sizeof c.name, "%s N=%d C=%d", off ? "rmsnorm_offset" : "rmsnorm", N, C);
      check_op(&c);
    }
  /* offset 0 is pw_rmsnorm_* bit for bit, and offset 1 with w is offset 0 with 1 + w */
  enum { N = 3, C = 19 };
  float x[N * C], w[C], w1[C], dy[N * C], y0[N * C], y1[N * C], r0[N], r1[N], g0[N * C], g1[N * C];
  oc_seed(11);
  oc_fill(x, N * C, 2.0), oc_fill(w, C, 0.5), oc_fill(dy, N * C, 1.0);
  for (int i = 0; i < C; i++) w1[i] = 1.0f + w[i];
  pw_rmsnorm_forward(y0, r0, x, w1, N, C, 1e-6f);
  pw_rmsnorm_offset_forward(y1, r1, x, w, 1.0f, N, C, 1e-6f);
  assert_memory_equal(y0, y1, sizeof y0);
  assert_memory_equal(r0, r1, sizeof r0);
  pw_rmsnorm_backward_input(g0, dy, x, w1, r0, N, C, 0);
  pw_rmsnorm_offset_backward_input(g1, dy, x, w, 1.0f, r1, N, C, 0);
  assert_memory_equal(g0, g1, sizeof g0);
  pw_rmsnorm_offset_forward(y1, r1, x, w1, 0.0f, N, C, 1e-6f);
  assert_memory_equal(y0, y1, sizeof y0);
}

/* ---- elementwise ------------------------------------------------------------ */
/* d = {n, kind}; one data input (two for swiglu and add). */

enum { EW_GELU, EW_RELU, EW_SILU, EW_SWIGLU, EW_ADD, EW_GEGLU, EW_SCALE };

static double ref_silu(double x) { return x / (1.0 + exp(-x)); }
static double ref_gelu(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

static void ew_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  int n = c->d[0];
  switch (c->d[1]) {
  case EW_GELU: pw_gelu_forward(out, saved, in[0], n); break;
  case EW_RELU: pw_relu_forward(out, in[0], n); break;
  case EW_SILU: pw_silu_forward(out, in[0], n); break;
  case EW_SWIGLU: pw_swiglu_forward(out, in[0], in[1], n); break;
  case EW_ADD: pw_add_forward(out, in[0], in[1], n); break;
  case EW_GEGLU: pw_geglu_forward(out, in[0], in[1], n); break;
  case EW_SCALE: pw_scale_forward(out, in[0], c->fp, n); break;
  }
}
static void ew_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                   float *const *g) {
  int n = c->d[0];
  if (which != IN_DATA) return;
  switch (c->d[1]) {
  case EW_GELU: pw_gelu_backward_input(g[0], dout, saved, n, 1); break;
  case EW_RELU: pw_relu_backward_input(g[0], dout, in[0], n, 1); break;
  case EW_SILU: pw_silu_backward_input(g[0], dout, in[0], n, 1); break;
  case EW_SWIGLU: pw_swiglu_backward_input(g[0], g[1], dout, in[0], in[1], n, 1, 1); break;
  case EW_ADD: pw_add_backward_input(g[0], g[1], dout, n, 1, 1); break;
  case EW_GEGLU: pw_geglu_backward_input(g[0], g[1], dout, in[0], in[1], n, 1, 1); break;
  case EW_SCALE: pw_scale_backward_input(g[0], dout, c->fp, n, 1); break;
  }
}
static void ew_ref(const opcase *c, double *const *in, double *out) {
  for (int i = 0; i < c->d[0]; i++) {
    double x = in[0][i];
    switch (c->d[1]) {
    case EW_GELU:
      out[i] = ref_gelu(x);
      break;
    case EW_RELU: out[i] = x > 0 ? x : 0; break;
    case EW_SILU: out[i] = ref_silu(x); break;
    case EW_SWIGLU: out[i] = ref_silu(x) * in[1][i]; break;
    case EW_ADD: out[i] = x + in[1][i]; break;
    case EW_GEGLU: out[i] = ref_gelu(x) * in[1][i]; break;
    case EW_SCALE: out[i] = x * (double)c->fp; break;
    }
  }
}

static void test_elementwise(void **state) {
  static const char *names[] = {"gelu", "relu", "silu", "swiglu", "add", "geglu", "scale"};
  for (int kind = EW_GELU; kind <= EW_SCALE; kind++) {
    int n = kind == EW_GEGLU ? 601 : 37; /* geglu: past a GELU_CHUNK of 256 */
    int two = kind == EW_SWIGLU || kind == EW_ADD || kind == EW_GEGLU, gated = kind == EW_SWIGLU || kind == EW_GEGLU;
    opcase c = {.n_in = two ? 2 : 1,
                .in_name = {gated ? "gate" : "a", gated ? "up" : "b"}, .fp = 45.254833995939045f, /* sqrt(2048) */
                .in_kind = {IN_DATA, IN_DATA}, .in_n = {(size_t)n, (size_t)n},
                .out_n = (size_t)n, .saved_n = kind == EW_GELU ? (size_t)n : 0, .d = {n, kind},
                .init_scale = kind == EW_RELU ? 1.0 : 4.0, /* reach GELU/SiLU tails */
                .init_gap = kind == EW_RELU ? 0.05 : 0.0,  /* FD never straddles the kink */
                .fwd = ew_fwd, .bwd = ew_bwd, .ref = ew_ref};
    snprintf(c.name, sizeof c.name, "%s n=%d", names[kind], n);
    check_op(&c);
  }
  /* add(x, x): both gradients may be the same buffer. */
  float d[3] = {1, 2, 3}, g[3] = {1, 1, 1};
  pw_add_backward_input(g, g, d, 3, 1, 1);
  assert_float_equal(g[0], 3.0f, 0);
  assert_float_equal(g[2], 7.0f, 0);
  /* ... and the first store may overwrite: garbage in g does not matter. */
  g[0] = NAN, g[1] = 1e30f, g[2] = -5.0f;
  pw_add_backward_input(g, g, d, 3, 0, 1);
  assert_float_equal(g[0], 2.0f, 0);
  assert_float_equal(g[1], 4.0f, 0);
  assert_float_equal(g[2], 6.0f, 0);
}

/* PyTorch 1.13 gelu(x, approximate='tanh') in float32 for these inputs. */
static void test_gelu_matches_pytorch(void **state) {
  const float x[7] = {-3.0f, -1.0f, -0.5f, 0.0f, 0.3f, 1.0f, 2.5f};
  const double torch[7] = {-0.0036374330520629883, -0.15880799293518066, -0.1542859971523285,
                           0.0, 0.18537093698978424, 0.8411920070648193, 2.4849157333374023};
  float y[7], dy[7];
  pw_gelu_forward(y, dy, x, 7);
  for (int i = 0; i < 7; i++) {
    if (fabs(y[i] - torch[i]) > 2.5e-7 * fabs(torch[i]) + 1e-9)
      printf("FAIL gelu vs PyTorch: x=%g expected %.9g got %.9g\n", x[i], torch[i], y[i]);
    assert_true(fabs(y[i] - torch[i]) <= 2.5e-7 * fabs(torch[i]) + 1e-9);
  }
}

/* PyTorch 1.13's gelu(gate, approximate='tanh') * up in float32, and its
 * autograd's gradients for the output gradient d. */
static void test_geglu_matches_pytorch(void **state) {
  const float g[7] = {-3.0f, -1.0f, -0.5f, 0.0f, 0.3f, 1.0f, 2.5f};
  const float u[7] = {0.7f, -1.5f, 2.0f, 1.0f, -0.25f, 0.5f, 1.25f};
  const float d[7] = {1.0f, 0.5f, -2.0f, 1.0f, 3.0f, -1.0f, 0.75f};
  const double want[3][7] = {
      {-0.002546203089877963, 0.238211989402771, -0.308571994304657, 0.0, -0.04634273424744606,
       0.42059600353240967, 3.106144666671753},
      {-0.008109007962048054, 0.06222306936979294, -0.5305204391479492, 0.5, -0.5492216348648071,
       -0.5414820313453674, 0.9730797410011292},
      {-0.0036374330520629883, -0.07940399646759033, 0.308571994304657, 0.0, 0.5561128258705139,
       -0.8411920070648193, 1.8636868000030518}};
  float got[3][7];
  pw_geglu_forward(got[0], g, u, 7);
  pw_geglu_backward_input(got[1], got[2], d, g, u, 7, 0, 0);
  static const char *what[3] = {"out", "dgate", "dup"};
  /* the forward to 2.5e-7 as the GELU's; the gradients to 1e-5: near
   * saturation gelu' is 1 - tanh^2 cancelling, so a tanh an ulp apart
   * (PyTorch's vectorised one, 1 ulp) moves it by ~5e-6 (dgate at -3) */
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 7; i++)
      if (!(fabs(got[k][i] - want[k][i]) <= (k ? 1e-5 : 2.5e-7) * fabs(want[k][i]) + 1e-9))
        fail_msg("geglu vs PyTorch: %s[%d] (gate %g, up %g): expected %.9g got %.9g", what[k], i, (double)g[i],
                 (double)u[i], want[k][i], (double)got[k][i]);
}

/* ---- losses ----------------------------------------------------------------- */
/* cross-entropy: d = {N, V}; input logits; targets in tok; saved probs;
 * out[0] = loss. Backward of L = R[0]*loss is backward with scale*R[0]. */

static void ce_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  out[0] = pw_crossentropy_forward(saved, in[0], c->tok, c->d[0], c->d[1], c->fp);
}
static void ce_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                   float *const *g) {
  if (which == IN_DATA)
    pw_crossentropy_backward_input(g[0], saved, c->tok, c->d[0], c->d[1], c->fp * dout[0], 1);
}
static void ce_ref(const opcase *c, double *const *in, double *out) {
  int N = c->d[0], V = c->d[1];
  double s = 0;
  for (int n = 0; n < N; n++) {
    const double *x = in[0] + n * V;
    double z = 0;
    for (int v = 0; v < V; v++) z += exp(x[v]);
    s += log(z) - x[c->tok[n]];
  }
  out[0] = s * (double)c->fp;
}

static void test_crossentropy(void **state) {
  static const int32_t tgt[] = {0, 6, 3, 3, 2, 5, 1, 6, 4, 0};
  opcase c = {.n_in = 1, .in_name = {"logits"}, .in_kind = {IN_DATA}, .in_n = {10 * 7},
              .out_n = 1, .saved_n = 10 * 7, .d = {10, 7}, .tok = tgt, .fp = 1.0f / 20,
              .init_scale = 3.0, .fwd = ce_fwd, .bwd = ce_bwd, .ref = ce_ref};
  snprintf(c.name, sizeof c.name, "crossentropy N=10 V=7 scale=1/20");
  check_op(&c);

  /* Uniform logits: loss log(V) per token; probs saved and normalised. */
  float logits[2 * 5] = {0}, probs[2 * 5];
  int32_t t2[2] = {1, 4};
  float loss = pw_crossentropy_forward(probs, logits, t2, 2, 5, 0.5f);
  assert_float_equal(loss, log(5.0), 1e-6);
  for (int i = 0; i < 10; i++) assert_float_equal(probs[i], 0.2f, 1e-7);

  /* Huge logits stay finite (stable softmax): loss = log(1 + e^-1) here. */
  float big[3] = {1000.0f, 999.0f, -1000.0f}, pb[3];
  int32_t t0 = 0;
  loss = pw_crossentropy_forward(pb, big, &t0, 1, 3, 1.0f);
  assert_true(isfinite(loss));
  assert_float_equal(loss, log1p(exp(-1.0)), 1e-6);
  assert_float_equal(pb[0] + pb[1] + pb[2], 1.0f, 1e-6);
  /* A wrong target's loss is large but finite, not inf. */
  int32_t t2b = 2;
  loss = pw_crossentropy_forward(pb, big, &t2b, 1, 3, 1.0f);
  assert_true(isfinite(loss) && loss > 1999.0f);
}

/* mse: d = {n}; inputs pred (data), target (const); out[0] = loss. */
static void mse_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  out[0] = pw_mse_forward(in[0], in[1], c->d[0], c->fp);
}
static void mse_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                    float *const *g) {
  if (which == IN_DATA) pw_mse_backward_input(g[0], in[0], in[1], c->d[0], c->fp * dout[0], 1);
}
static void mse_ref(const opcase *c, double *const *in, double *out) {
  double s = 0;
  for (int i = 0; i < c->d[0]; i++) s += (in[0][i] - in[1][i]) * (in[0][i] - in[1][i]);
  out[0] = s * (double)c->fp;
}

static void test_mse(void **state) {
  opcase c = {.n_in = 2, .in_name = {"pred", "target"}, .in_kind = {IN_DATA, IN_CONST},
              .in_n = {23, 23}, .out_n = 1, .d = {23}, .fp = 1.0f / 46,
              .fwd = mse_fwd, .bwd = mse_bwd, .ref = mse_ref};
  snprintf(c.name, sizeof c.name, "mse n=23 scale=1/46");
  check_op(&c);
  float p[2] = {1, 2}, t[2] = {0, 0};
  assert_float_equal(pw_mse_forward(p, t, 2, 0.5f), 2.5f, 1e-7);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gradcheck_meta), cmocka_unit_test(test_linear),
      cmocka_unit_test(test_embed),          cmocka_unit_test(test_posembed),
      cmocka_unit_test(test_layernorm),      cmocka_unit_test(test_layernorm_fused),
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_elementwise),    cmocka_unit_test(test_gelu_matches_pytorch),
      cmocka_unit_test(test_geglu_matches_pytorch),
      cmocka_unit_test(test_crossentropy),   cmocka_unit_test(test_mse),
  };
  /* Once per vector level (cpu.h), from the one PW_CPU allows down. */
  int rc = 0;
  for (int l = pw_cpu_level(); l >= PW_CPU_SSE; l--) {
    pw_cpu_force((pw_cpu_isa)l);
    rc |= cmocka_run_group_tests_name(pw_cpu_name((pw_cpu_isa)l), tests, NULL, NULL);
  }
  return rc;
}
