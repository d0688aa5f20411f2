/* test_ops_enc: the encoder's kernels (ops_enc.h) through opcheck.h —
 * each forward against a double reference written independently, each
 * backward half alone against finite differences, accumulation — plus
 * what finite differences cannot see: the acc = 0 overwrite (into NaN),
 * the padding row that takes no gradient, the ignored targets, the erf
 * GELU told from the tanh one, PyTorch's values, and the same bits from
 * every vector level (cpu.h) a kernel is compiled for. */
#include "opcheck.h"

#include "cpu.h"
#include "ops_enc.h"

/* ---- erf GELU, tanh: d = {n}; saved gelu' ---------------------------------- */

static void gelu_erf_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_gelu_erf_forward(out, saved, in[0], c->d[0]);
}
static void gelu_erf_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                         float *const *g) {
  if (which == IN_DATA) pw_gelu_erf_backward_input(g[0], dout, saved, c->d[0], 1);
}
static void gelu_erf_ref(const opcase *c, double *const *in, double *out) {
  for (int i = 0; i < c->d[0]; i++) out[i] = 0.5 * in[0][i] * (1.0 + erf(in[0][i] / sqrt(2.0)));
}

static void tanh_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_tanh_forward(out, in[0], c->d[0]);
  memcpy(saved, out, (size_t)c->d[0] * sizeof(float)); /* the backward reads the output */
}
static void tanh_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                     float *const *g) {
  if (which == IN_DATA) pw_tanh_backward_input(g[0], dout, saved, c->d[0], 1);
}
static void tanh_ref(const opcase *c, double *const *in, double *out) {
  for (int i = 0; i < c->d[0]; i++) out[i] = tanh(in[0][i]);
}

static void test_elementwise(void **state) {
  (void)state;
  opcase g = {.n_in = 1, .in_name = {"inp"}, .in_kind = {IN_DATA}, .in_n = {300}, .out_n = 300, .saved_n = 300,
              .d = {300}, .init_scale = 4.0, .fwd = gelu_erf_fwd, .bwd = gelu_erf_bwd, .ref = gelu_erf_ref};
  snprintf(g.name, sizeof g.name, "gelu_erf n=300");
  check_op(&g);
  opcase t = g;
  t.fwd = tanh_fwd, t.bwd = tanh_bwd, t.ref = tanh_ref;
  snprintf(t.name, sizeof t.name, "tanh n=300");
  check_op(&t);
}

/* PyTorch 1.13's torch.nn.functional.gelu(x) (approximate='none') in
 * float32, printed with %.9g: the erf GELU. Its vectorized erf is off by
 * ~1e-7 absolute (a few ulps of 1 + erf, so 4e-5 relative at x = -3);
 * libm's erff here is within an ulp, so the double formula holds us to
 * 2 ulps plus 1 + erf's rounding (1e-8 |x|). The tanh GELU is 1e-4 to
 * 4e-4 away. */
static void test_gelu_erf_matches_pytorch(void **state) {
  (void)state;
  static const float x[] = {-3.0f, -1.5f, -0.5f, 0.0f, 0.25f, 1.0f, 2.0f, 2.5f};
  static const double want[] = {-0.00404986739, -0.10021086, -0.154268786, 0.0, 0.149676561, 0.841344714,
                                1.95449996, 2.48447585};
  float out[8], d[8], tanh_gelu[8], td[8];
  pw_gelu_erf_forward(out, d, x, 8);
  pw_gelu_forward(tanh_gelu, td, x, 8);
  for (int i = 0; i < 8; i++) {
    assert_float_equal(out[i], want[i], 3e-7);
    double e = 0.5 * (double)x[i] * (1 + erf((double)x[i] / sqrt(2.0)));
    double de = 0.5 * (1 + erf((double)x[i] / sqrt(2.0))) + (double)x[i] * exp(-0.5 * x[i] * x[i]) / sqrt(2 * M_PI);
    assert_float_equal(out[i], e, 2.4e-7 * fabs(e) + 1e-8 * fabs((double)x[i]));
    assert_float_equal(d[i], de, 2e-6);
  }
  assert_true(fabs(tanh_gelu[6] - out[6]) > 5e-5); /* x = 2: the tanh form is not this one */
}

/* ---- token types: d = {B, T, C, types, sep, pad}; inputs inp, wtt ----------- */

static void toktype_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_toktype_forward(out, in[0], c->tok, in[1], c->d[0], c->d[1], c->d[2], c->d[4], c->d[5]);
}
static void toktype_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                        float *const *g) {
  if (which == IN_DATA)
    pw_toktype_backward_input(g[0], dout, c->d[0], c->d[1], c->d[2], 1);
  else
    pw_toktype_backward_weight(g[1], dout, c->tok, c->d[0], c->d[1], c->d[2], c->d[4], c->d[5]);
}
/* The rule stated differently: find the first separator's index, then
 * type 1 strictly after it, but 0 on padding. */
static int ref_type(const int32_t *tok, int T, int t, int sep, int pad) {
  int first = T;
  for (int u = 0; u < T && sep >= 0; u++)
    if (tok[u] == sep) {
      first = u;
      break;
    }
  return t > first && !(pad >= 0 && tok[t] == pad);
}
static void toktype_ref(const opcase *c, double *const *in, double *out) {
  int B = c->d[0], T = c->d[1], C = c->d[2];
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      int ty = ref_type(c->tok + b * T, T, t, c->d[4], c->d[5]);
      for (int i = 0; i < C; i++) out[(b * T + t) * C + i] = in[0][(b * T + t) * C + i] + in[1][ty * C + i];
    }
}

static void test_toktype(void **state) {
  (void)state;
  /* sep 3, pad 0: a pair with padding, a sequence without any separator,
   * one opening with it, one with two (only the first counts) */
  static const int32_t tok[] = {5, 7, 3, 6, 8, 3, 0, 0, /**/ 5, 7, 6, 8, 9, 6, 7, 8,
                                3, 6, 6, 0, 7, 0, 8, 0, /**/ 5, 3, 7, 3, 7, 3, 0, 0};
  int B = 4, T = 8, C = 3;
  int sets[3][2] = {{3, 0}, {3, -1}, {-1, -1}}; /* (sep, pad) */
  for (int k = 0; k < 3; k++) {
    opcase c = {.n_in = 2, .in_name = {"inp", "wtt"}, .in_kind = {IN_DATA, IN_PARAM},
                .in_n = {(size_t)B * T * C, (size_t)2 * C}, .out_n = (size_t)B * T * C,
                .d = {B, T, C, 2, sets[k][0], sets[k][1]}, .tok = tok, .fwd = toktype_fwd, .bwd = toktype_bwd,
                .ref = toktype_ref};
    snprintf(c.name, sizeof c.name, "toktype B=4 T=8 C=3 sep=%d pad=%d", sets[k][0], sets[k][1]);
    check_op(&c);
  }
  /* the types themselves, read off a zero input and rows 0 / 1 of wtt */
  float x[4 * 8] = {0}, w[2] = {0.0f, 1.0f}, out[4 * 8];
  pw_toktype_forward(out, x, tok, w, B, T, 1, 3, 0);
  static const float want[] = {0, 0, 0, 1, 1, 1, 0, 0, /**/ 0, 0, 0, 0, 0, 0, 0, 0,
                               0, 1, 1, 0, 1, 0, 1, 0, /**/ 0, 0, 1, 1, 1, 1, 0, 0};
  for (int i = 0; i < B * T; i++) assert_true(out[i] == want[i]);
}

/* ---- first row: d = {B, T, C} ---------------------------------------------- */

static void first_row_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_first_row_forward(out, in[0], c->d[0], c->d[1], c->d[2]);
}
static void first_row_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                          float *const *g) {
  if (which == IN_DATA) pw_first_row_backward_input(g[0], dout, c->d[0], c->d[1], c->d[2], 1);
}
static void first_row_ref(const opcase *c, double *const *in, double *out) {
  int T = c->d[1], C = c->d[2];
  for (int b = 0; b < c->d[0]; b++)
    for (int i = 0; i < C; i++) out[b * C + i] = in[0][b * T * C + i];
}

static void test_first_row(void **state) {
  (void)state;
  opcase c = {.n_in = 1, .in_name = {"inp"}, .in_kind = {IN_DATA}, .in_n = {3 * 5 * 4}, .out_n = 3 * 4,
              .d = {3, 5, 4}, .fwd = first_row_fwd, .bwd = first_row_bwd, .ref = first_row_ref};
  snprintf(c.name, sizeof c.name, "first_row B=3 T=5 C=4");
  check_op(&c);
}

/* ---- masked-LM cross-entropy: d = {N, V}; -100 rows take no part ------------ */

static void mlm_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  out[0] = pw_xent_mlm_forward(saved, in[0], c->tok, c->d[0], c->d[1], c->fp);
}
static void mlm_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout, float *const *g) {
  if (which == IN_DATA) pw_xent_mlm_backward_input(g[0], saved, c->tok, c->d[0], c->d[1], c->fp * dout[0], 1);
}
static void mlm_ref(const opcase *c, double *const *in, double *out) {
  int N = c->d[0], V = c->d[1];
  double s = 0;
  for (int n = 0; n < N; n++) {
    if (c->tok[n] == -100) continue;
    double z = 0;
    for (int v = 0; v < V; v++) z += exp(in[0][n * V + v]);
    s += log(z) - in[0][n * V + c->tok[n]];
  }
  out[0] = s * (double)c->fp;
}

static void test_xent_mlm(void **state) {
  (void)state;
  enum { N = 10, V = 7 };
  static const int32_t tgt[N] = {-100, 6, -100, -100, 2, -100, 1, -100, -100, 0};
  opcase c = {.n_in = 1, .in_name = {"logits"}, .in_kind = {IN_DATA}, .in_n = {N * V}, .out_n = 1,
              .saved_n = N * V, .d = {N, V}, .tok = tgt, .fp = 1.0f / 8, .init_scale = 3.0, .fwd = mlm_fwd,
              .bwd = mlm_bwd, .ref = mlm_ref};
  snprintf(c.name, sizeof c.name, "mlm_cross_entropy N=10 V=7 4 rows scale=1/8");
  check_op(&c);

  /* the counted rows alone through ops.c's cross-entropy: the same bits */
  float logits[N * V], probs[N * V], kept[4 * V], kprobs[4 * V], d[N * V], kd[4 * V];
  int32_t kt[4];
  oc_seed(3);
  oc_fill(logits, N * V, 3.0);
  for (int n = 0, k = 0; n < N; n++)
    if (tgt[n] >= 0) {
      memcpy(kept + k * V, logits + n * V, V * sizeof(float));
      kt[k++] = tgt[n];
    }
  float l = pw_xent_mlm_forward(probs, logits, tgt, N, V, 0.125f);
  assert_true(l == pw_crossentropy_forward(kprobs, kept, kt, 4, V, 0.125f));
  for (int i = 0; i < N * V; i++) d[i] = NAN; /* acc 0 never reads */
  pw_xent_mlm_backward_input(d, probs, tgt, N, V, 0.125f, 0);
  pw_crossentropy_backward_input(kd, kprobs, kt, 4, V, 0.125f, 0);
  for (int n = 0, k = 0; n < N; n++)
    for (int v = 0; v < V; v++) {
      if (tgt[n] < 0)
        assert_true(d[n * V + v] == 0.0f && !signbit(d[n * V + v])); /* ignored: +0 */
      else
        assert_true(d[n * V + v] == kd[k * V + v]);
      k += tgt[n] >= 0 && v == V - 1;
    }
}

/* ---- embedding with a padding row ------------------------------------------ */

static void test_embed_pad(void **state) {
  (void)state;
  enum { N = 9, C = 5, V = 7 };
  static const int32_t tok[N] = {3, 0, 6, 3, 3, 1, 6, 2, 0};
  float dout[N * C], want[V * C], got[V * C];
  oc_seed(5);
  oc_fill(dout, N * C, 1.0);
  for (int pad = 0; pad < 3; pad += 2) { /* 0: a padding row used twice; 2: once */
    oc_fill(want, V * C, 1.0);
    memcpy(got, want, sizeof got);
    pw_embed_backward_weight(want, dout, tok, N, C); /* what embed adds ... */
    for (int n = 0; n < N; n++)                     /* ... less the padding rows' part */
      if (tok[n] == pad)
        for (int i = 0; i < C; i++) want[pad * C + i] -= dout[n * C + i];
    float before[C];
    memcpy(before, got + pad * C, sizeof before);
    pw_embed_pad_backward_weight(got, dout, tok, N, C, pad);
    for (int i = 0; i < V * C; i++)
      assert_true(got[i] == (i / C == pad ? before[i % C] : want[i])); /* the padding row untouched */
  }
}

/* ---- acc = 0 overwrites without reading, as into a zeroed buffer ------------- */

static void test_acc_overwrite(void **state) {
  (void)state;
  enum { B = 2, T = 4, C = 6, N = B * T * C };
  float dout[N], aux[N], over[N], zeroed[N];
  oc_seed(9);
  oc_fill(dout, N, 1.0);
  oc_fill(aux, N, 1.0);
  for (int i = 0; i < N; i += 5) dout[i] = -0.0f;
  for (int k = 0; k < 4; k++) {
    for (int i = 0; i < N; i++) over[i] = NAN, zeroed[i] = 0.0f;
    float *g[2] = {over, zeroed};
    for (int a = 0; a < 2; a++) {
      int acc = a; /* over: acc 0 into NaN; zeroed: acc 1 into zeros */
      switch (k) {
        case 0: pw_gelu_erf_backward_input(g[a], dout, aux, N, acc); break;
        case 1: pw_tanh_backward_input(g[a], dout, aux, N, acc); break;
        case 2: pw_toktype_backward_input(g[a], dout, B, T, C, acc); break;
        case 3: pw_first_row_backward_input(g[a], dout, B, T, C, acc); break;
      }
    }
    assert_memory_equal(over, zeroed, sizeof over);
  }
}

/* ---- every vector level the same bits ------------------------------------------ */

enum { LB = 3, LT = 37, LC = 21, LN = LB * LT, LV = 45, LNE = LN * LC, LX = LNE / LV, NO = 12 };
static float lin[4][LNE], lout[NO][LNE], lref[NO][LNE];
static int32_t ltok[LN], ltgt[LN];

static void run_all(int acc) {
  oc_seed(11);
  for (int k = 0; k < NO; k++) oc_fill(lout[k], LNE, 0.5); /* prefilled: acc adds to the same values */
  pw_gelu_erf_forward(lout[0], lout[1], lin[0], LNE);
  pw_gelu_erf_backward_input(lout[2], lin[1], lout[1], LNE, acc);
  pw_tanh_forward(lout[3], lin[0], LNE);
  pw_tanh_backward_input(lout[4], lin[1], lout[3], LNE, acc);
  pw_toktype_forward(lout[5], lin[0], ltok, lin[2], LB, LT, LC, 3, 0);
  pw_toktype_backward_input(lout[6], lin[1], LB, LT, LC, acc);
  pw_toktype_backward_weight(lout[7], lin[1], ltok, LB, LT, LC, 3, 0);
  pw_first_row_backward_input(lout[8], lin[1], LB, LT, LC, acc);
  pw_embed_pad_backward_weight(lout[9], lin[1], ltok, LN, LC, 0);
  lout[10][0] = pw_xent_mlm_forward(lout[11], lin[3], ltgt, LX, LV, 0.01f);
  pw_xent_mlm_backward_input(lout[10] + 1, lout[11], ltgt, LX - 1, LV, 0.01f, acc);
}

static void test_levels_same_bits(void **state) {
  (void)state;
  oc_seed(10);
  for (int k = 0; k < 4; k++) oc_fill(lin[k], LNE, k == 0 ? 4.0 : 1.0);
  for (int i = 0; i < LN; i++) ltok[i] = (i * 7 + 1) % 9, ltgt[i] = i % 3 ? -100 : (i * 5) % LV;
  pw_cpu_isa before = pw_cpu_level();
  for (int acc = 0; acc <= 1; acc++) {
    pw_cpu_force(PW_CPU_SSE);
    run_all(acc);
    memcpy(lref, lout, sizeof lout);
    for (int l = before; l > PW_CPU_SSE; l--) {
      pw_cpu_force((pw_cpu_isa)l);
      run_all(acc);
      for (int k = 0; k < NO; k++)
        for (int i = 0; i < LNE; i++)
          if (memcmp(&lout[k][i], &lref[k][i], sizeof(float)))
            fail_msg("acc %d: out[%d][%d] %.9g at %s, %.9g at sse", acc, k, i, (double)lout[k][i],
                     pw_cpu_name((pw_cpu_isa)l), (double)lref[k][i]);
    }
  }
  pw_cpu_force(before);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_elementwise),  cmocka_unit_test(test_gelu_erf_matches_pytorch),
      cmocka_unit_test(test_toktype),      cmocka_unit_test(test_first_row),
      cmocka_unit_test(test_xent_mlm),     cmocka_unit_test(test_embed_pad),
      cmocka_unit_test(test_acc_overwrite), cmocka_unit_test(test_levels_same_bits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
