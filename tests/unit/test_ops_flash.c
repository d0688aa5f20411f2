/* test_ops_flash: the tiled attention (ops_flash.c) against the plain one
 * (ops_attn.c), a double-precision reference and finite differences
 * (opcheck.h).
 *
 * - Tiled equals plain within 1e-5 of the largest |element| in the
 *   forward (out) and the backward (dq, dk and dv against the largest of
 *   the three; overwriting: every element written), for (B, T, C, NH) from T 1 to T 300: T under, at and
 *   past the tiles (64 query rows, 128 keys), not a multiple of either, HD
 *   from 2 to 64; and twice the same call gives the same bits.
 * - Gradient checks (opcheck.h: forward against the double reference,
 *   backward against central differences, accumulation) of the packed
 *   causal attention, and of the general entry with grouped-query heads
 *   (NH 4 over NKV 2 and 1) and without the causal mask.
 * - bf16 products against the float32 tiled and plain attention to the
 *   bf16 tolerance test_bf16 uses (2^-6 forward, 2^-5 gradients), on the
 *   sgemm path and oneDNN's where the CPU has it, overwrite and accumulate.
 * - A prefill at an offset into a KV cache (ops_kv.c, the tiled forward)
 *   gives the rows of the whole sequence's forward; later tokens change no
 *   earlier output.
 * The comparisons once per vector level (cpu.h), the gradient checks once
 * (test_cpu holds the levels to the same bits). */
#include "bf16.h"
#include "cpu.h"
#include "opcheck.h"
#include "ops_flash.h"

static double maxabs(const float *x, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
  return m;
}

/* |got - want| <= tol * m for every element (NaN fails); m 0: max|want|. */
static void expect_close(const char *what, const float *got, const float *want, size_t n, double tol, double m) {
  double worst = 0;
  if (m == 0) m = maxabs(want, n);
  size_t bad = n;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= tol * m)) {
      bad = i;
      break;
    }
    worst = e > worst ? e : worst;
  }
  if (bad < n) fail_msg("%s: element %zu is %.9g, expected %.9g (tolerance %.3g of max %.3g)", what, bad, got[bad], want[bad], tol, m);
  (void)worst;
}

/* Columns [c0, c0 + C) of rows (row length ld) into dst (rows x C). */
static void columns(float *dst, const float *src, size_t rows, int ld, int c0, int C) {
  for (size_t r = 0; r < rows; r++) memcpy(dst + r * C, src + r * ld + c0, (size_t)C * sizeof(float));
}

/* ---- tiled against plain --------------------------------------------------- */

static void compare_plain(int B, int T, int C, int NH, int NKV) {
  size_t W = (size_t)C + 2 * (size_t)NKV * (C / NH), KW = (W - C) / 2;
  size_t nq = (size_t)B * T * W, no = (size_t)B * T * C, rows = (size_t)B * T;
  float *qkv = oc_alloc(nq, sizeof(float)), *dout = oc_alloc(no, sizeof(float));
  float *op = oc_alloc(no, sizeof(float)), *ot = oc_alloc(no, sizeof(float)), *ot2 = oc_alloc(no, sizeof(float));
  float *att = oc_alloc((size_t)B * NH * T * T, sizeof(float)), *tt = oc_alloc((size_t)T * T, sizeof(float));
  float *lse = oc_alloc((size_t)B * NH * T, sizeof(float));
  float *ws = oc_alloc(pw_attention_tiled_scratch(T, C, NH, NKV), sizeof(float));
  float *dp = oc_alloc(nq, sizeof(float)), *dt = oc_alloc(nq, sizeof(float)), *dt2 = oc_alloc(nq, sizeof(float));
  float *a = oc_alloc(no, sizeof(float)), *b = oc_alloc(no, sizeof(float));
  char what[96];
  oc_seed((uint64_t)(B * 1000 + T * 10 + NH + 100000 * (NH - NKV)));
  oc_fill(qkv, nq, 2.0); /* peaky softmax rows */
  oc_fill(dout, no, 1.0);
  for (size_t i = 0; i < no; i++) ot[i] = NAN;
  pw_attention_forward(op, att, qkv, B, T, C, NH, NKV);
  pw_attention_tiled_forward(ot, lse, ws, qkv, B, T, C, NH, NKV);
  snprintf(what, sizeof what, "B=%d T=%d C=%d NH=%d NKV=%d: out", B, T, C, NH, NKV);
  expect_close(what, ot, op, no, 1e-5, 0);
  for (size_t i = 0; i < nq; i++) dp[i] = dt[i] = NAN; /* acc 0 writes every element */
  pw_attention_backward_input(dp, tt, dout, qkv, att, B, T, C, NH, NKV, 0);
  pw_attention_tiled_backward_input(dt, ws, dout, ot, qkv, lse, B, T, C, NH, NKV, 0);
  /* each part against the largest gradient element (at T 1 dq is 0 up to
   * the rounding of dO.v in two orders) */
  static const char *const part[3] = {"dq", "dk", "dv"};
  double gm = maxabs(dp, nq);
  for (int k = 0; k < 3; k++) {
    size_t c0 = k ? C + (k - 1) * KW : 0, w = k ? KW : (size_t)C;
    columns(a, dt, rows, (int)W, (int)c0, (int)w);
    columns(b, dp, rows, (int)W, (int)c0, (int)w);
    snprintf(what, sizeof what, "B=%d T=%d C=%d NH=%d NKV=%d: %s", B, T, C, NH, NKV, part[k]);
    expect_close(what, a, b, rows * w, 1e-5, gm);
  }
  /* deterministic: the same call, the same bits */
  pw_attention_tiled_forward(ot2, lse, ws, qkv, B, T, C, NH, NKV);
  pw_attention_tiled_backward_input(dt2, ws, dout, ot2, qkv, lse, B, T, C, NH, NKV, 0);
  assert_memory_equal(ot2, ot, no * sizeof(float));
  assert_memory_equal(dt2, dt, nq * sizeof(float));
  free(qkv), free(dout), free(op), free(ot), free(ot2), free(att), free(tt), free(lse), free(ws);
  free(dp), free(dt), free(dt2), free(a), free(b);
}

static void test_tiled_equals_plain(void **state) {
  (void)state;
  static const int shapes[][4] = {{2, 5, 8, 2},   {3, 1, 8, 2},   {1, 1, 4, 1},    {1, 64, 8, 2},
                                  {1, 70, 6, 2},  {2, 128, 8, 1}, {2, 130, 16, 2}, {1, 200, 12, 3},
                                  {1, 257, 4, 2}, {1, 300, 128, 2}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    compare_plain(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][3]);
  /* grouped-query: the plain kernel's group sums against the tiled one's */
  compare_plain(2, 5, 16, 4, 2);
  compare_plain(1, 130, 16, 4, 1);
  compare_plain(1, 200, 24, 6, 2);
}

/* ---- gradient checks -------------------------------------------------------- */
/* Packed causal attention: d = {B, T, C, NH}; saved: lse (B,NH,T), the
 * scratch, then a copy of out (the backward reads it). */

static size_t saved_out(const opcase *c) {
  int B = c->d[0], T = c->d[1], C = c->d[2], NH = c->d[3];
  return (size_t)B * NH * T + pw_attention_tiled_scratch(T, C, NH, NH);
}

static void tiled_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  int B = c->d[0], T = c->d[1], C = c->d[2], NH = c->d[3];
  pw_attention_tiled_forward(out, saved, saved + (size_t)B * NH * T, in[0], B, T, C, NH, NH);
  memcpy(saved + saved_out(c), out, c->out_n * sizeof(float));
}
static void tiled_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                      float *const *g) {
  int B = c->d[0], T = c->d[1], C = c->d[2], NH = c->d[3];
  if (which == IN_DATA)
    pw_attention_tiled_backward_input(g[0], saved + (size_t)B * NH * T, dout, saved + saved_out(c), in[0], saved, B,
                                      T, C, NH, NH, 1);
}

/* The general problem in a packed layout of NH query heads, then NKV key
 * heads, then NKV value heads: d = {B, T, HD, NH, NKV, causal}. */
static void gqa_ref(const opcase *c, double *const *in, double *out) {
  int B = c->d[0], T = c->d[1], HD = c->d[2], NH = c->d[3], NKV = c->d[4], causal = c->d[5];
  int W = (NH + 2 * NKV) * HD, G = NH / NKV;
  double p[256];
  assert_true(T <= 256);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const double *q = in[0] + (size_t)(b * T + i) * W + h * HD;
        int n = causal ? i + 1 : T, kc = NH * HD + h / G * HD, vc = (NH + NKV) * HD + h / G * HD;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < n; j++) {
          double s = 0;
          for (int e = 0; e < HD; e++) s += q[e] * in[0][(size_t)(b * T + j) * W + kc + e];
          p[j] = s / sqrt((double)HD);
          mx = p[j] > mx ? p[j] : mx;
        }
        for (int j = 0; j < n; j++) sum += (p[j] = exp(p[j] - mx));
        for (int e = 0; e < HD; e++) {
          double s = 0;
          for (int j = 0; j < n; j++) s += p[j] / sum * in[0][(size_t)(b * T + j) * W + vc + e];
          out[(size_t)(b * T + i) * NH * HD + h * HD + e] = s;
        }
      }
}

static pw__attn gqa_problem(const opcase *c, const float *x) {
  int B = c->d[0], T = c->d[1], HD = c->d[2], NH = c->d[3], NKV = c->d[4];
  size_t W = (size_t)(NH + 2 * NKV) * HD;
  return (pw__attn){.B = B, .Tq = T, .Tk = T, .NH = NH, .NKV = NKV, .HD = HD, .causal = c->d[5], .q = x,
                    .k = x + (size_t)NH * HD, .v = x + (size_t)(NH + NKV) * HD, .ldq = W, .ldk = W,
                    .ldo = (size_t)NH * HD, .sq = (size_t)T * W, .sk = (size_t)T * W, .so = (size_t)T * NH * HD};
}

static size_t gqa_lse(const opcase *c) { return (size_t)c->d[0] * c->d[3] * c->d[1]; }

static void gqa_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw__attn a = gqa_problem(c, in[0]);
  size_t w = pw__attn_work(c->d[1], c->d[2], c->d[3], c->d[4]);
  pw__attn_forward(&a, out, saved, saved + gqa_lse(c), NULL);
  memcpy(saved + gqa_lse(c) + w, out, c->out_n * sizeof(float));
}
static void gqa_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                    float *const *g) {
  if (which != IN_DATA) return;
  pw__attn a = gqa_problem(c, in[0]);
  size_t w = pw__attn_work(c->d[1], c->d[2], c->d[3], c->d[4]);
  int NH = c->d[3], HD = c->d[2];
  pw__attn_backward(&a, g[0], g[0] + (size_t)NH * HD, g[0] + (size_t)(NH + c->d[4]) * HD, dout,
                    saved + gqa_lse(c) + w, saved, 1, saved + gqa_lse(c), NULL);
}

/* The packed problem is the general one with NKV = NH, causal. */
static void tiled_ref(const opcase *c, double *const *in, double *out) {
  opcase r = *c;
  r.d[2] = c->d[2] / c->d[3], r.d[4] = c->d[3], r.d[5] = 1;
  gqa_ref(&r, in, out);
}

static opcase tiled_case(int B, int T, int C, int NH) {
  opcase c = {.n_in = 1, .in_name = {"qkv"}, .in_kind = {IN_DATA}, .in_n = {(size_t)B * T * 3 * C},
              .out_n = (size_t)B * T * C, .d = {B, T, C, NH}, .init_scale = 2.0, /* peaky softmax rows */
              .fwd = tiled_fwd, .bwd = tiled_bwd, .ref = tiled_ref};
  c.saved_n = saved_out(&c) + c.out_n;
  snprintf(c.name, sizeof c.name, "attention_tiled B=%d T=%d C=%d NH=%d", B, T, C, NH);
  return c;
}

static opcase gqa_case(int B, int T, int HD, int NH, int NKV, int causal) {
  opcase c = {.n_in = 1, .in_name = {"qkv"}, .in_kind = {IN_DATA},
              .in_n = {(size_t)B * T * (NH + 2 * NKV) * HD}, .out_n = (size_t)B * T * NH * HD,
              .d = {B, T, HD, NH, NKV, causal}, .init_scale = 2.0, .fwd = gqa_fwd, .bwd = gqa_bwd, .ref = gqa_ref};
  c.saved_n = (size_t)B * NH * T + pw__attn_work(T, HD, NH, NKV) + c.out_n;
  snprintf(c.name, sizeof c.name, "attention B=%d T=%d HD=%d NH=%d NKV=%d %s", B, T, HD, NH, NKV,
           causal ? "causal" : "bidirectional");
  return c;
}

static void test_tiled_gradients(void **state) {
  (void)state;
  static const int shapes[][4] = {{2, 5, 8, 2}, {1, 7, 6, 2}, {3, 1, 4, 1}, {1, 70, 4, 2}, {1, 130, 2, 1}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    opcase c = tiled_case(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
    check_op(&c);
  }
}

static void test_gqa_bidirectional(void **state) {
  (void)state;
  static const int cases[][6] = {{2, 9, 3, 4, 2, 1}, {1, 70, 1, 4, 2, 1}, {1, 70, 1, 4, 1, 0},
                                 {2, 6, 4, 2, 2, 0}, {1, 140, 1, 2, 1, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int *k = cases[i];
    opcase c = gqa_case(k[0], k[1], k[2], k[3], k[4], k[5]);
    check_op(&c);
  }
}

/* ---- bf16 ------------------------------------------------------------------- */

/* max|a - b| / max|b| */
static double rel_err(const float *a, const float *b, size_t n) {
  double e = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    e = fmax(e, fabs((double)a[i] - b[i]));
    m = fmax(m, fabs((double)b[i]));
  }
  return m > 0 ? e / m : e;
}

enum { AB = 2, AT = 150, AC = 32, ANH = 2 }; /* past a query and a key tile */

static void test_tiled_bf16(void **state) {
  (void)state;
  size_t nq = (size_t)AB * AT * 3 * AC, no = (size_t)AB * AT * AC, rows = (size_t)AB * AT;
  float *qkv = oc_alloc(nq, sizeof(float)), *dout = oc_alloc(no, sizeof(float));
  float *o = oc_alloc(no, sizeof(float)), *o32 = oc_alloc(no, sizeof(float)), *op = oc_alloc(no, sizeof(float));
  float *lse = oc_alloc((size_t)AB * ANH * AT, sizeof(float)), *lse32 = oc_alloc((size_t)AB * ANH * AT, sizeof(float));
  float *att = oc_alloc((size_t)AB * ANH * AT * AT, sizeof(float)), *tt = oc_alloc((size_t)AT * AT, sizeof(float));
  float *ws = oc_alloc(pw_attention_tiled_scratch(AT, AC, ANH, ANH), sizeof(float));
  pw_bf16 *bs = oc_alloc(pw_attention_tiled_bf16_scratch(AB, AT, AC), sizeof(pw_bf16));
  float *dq = oc_alloc(nq, sizeof(float)), *dq32 = oc_alloc(nq, sizeof(float)), *dqp = oc_alloc(nq, sizeof(float));
  float *dq0 = oc_alloc(nq, sizeof(float)), *a = oc_alloc(no, sizeof(float)), *b = oc_alloc(no, sizeof(float));
  oc_seed(31);
  oc_fill(qkv, nq, 1.0);
  oc_fill(dout, no, 0.01);
  pw_attention_forward(op, att, qkv, AB, AT, AC, ANH, ANH);
  pw_attention_backward_input(dqp, tt, dout, qkv, att, AB, AT, AC, ANH, ANH, 0);
  pw_attention_tiled_forward(o32, lse32, ws, qkv, AB, AT, AC, ANH, ANH);
  pw_attention_tiled_backward_input(dq32, ws, dout, o32, qkv, lse32, AB, AT, AC, ANH, ANH, 0);
  for (int paths = 0; paths < 2; paths++) {
    if (pw_gemm_bf16_force(!paths) != !paths) continue; /* no AVX512_BF16 here */
    pw_attention_tiled_forward_bf16(o, lse, ws, bs, qkv, AB, AT, AC, ANH, ANH);
    assert_true(rel_err(o, o32, no) < 0x1p-6);
    assert_true(rel_err(o, op, no) < 0x1p-6);
    for (size_t i = 0; i < nq; i++) dq[i] = NAN;
    pw_attention_tiled_backward_input_bf16(dq, ws, bs, dout, o, qkv, lse, AB, AT, AC, ANH, ANH, 0);
    for (int k = 0; k < 3; k++) { /* dq, dk, dv */
      columns(a, dq, rows, 3 * AC, k * AC, AC);
      columns(b, dq32, rows, 3 * AC, k * AC, AC);
      assert_true(rel_err(a, b, no) < 0x1p-5);
      columns(b, dqp, rows, 3 * AC, k * AC, AC);
      assert_true(rel_err(a, b, no) < 0x1p-5);
    }
    /* accumulate: what was there plus the overwriting call's result */
    oc_fill(dq0, nq, 0.001);
    float *acc = dqp; /* the plain gradients are checked: reuse */
    memcpy(acc, dq0, nq * sizeof(float));
    pw_attention_tiled_backward_input_bf16(acc, ws, bs, dout, o, qkv, lse, AB, AT, AC, ANH, ANH, 1);
    for (size_t i = 0; i < nq; i++)
      assert_true(fabsf(acc[i] - (dq0[i] + dq[i])) <= 0x1p-20 * (fabsf(dq0[i]) + fabsf(dq[i])) + 1e-30f);
    pw_attention_backward_input(dqp, tt, dout, qkv, att, AB, AT, AC, ANH, ANH, 0);
  }
  pw_gemm_bf16_force(1);
  free(qkv), free(dout), free(o), free(o32), free(op), free(lse), free(lse32), free(att), free(tt), free(ws);
  free(bs), free(dq), free(dq32), free(dqp), free(dq0), free(a), free(b);
}

/* ---- the KV-cache prefill and the causal mask -------------------------------- */

/* Rows t0 .. T-1 prefilled at offset t0 after rows 0 .. t0-1 (ops_kv.c)
 * are those rows of the whole sequence's tiled forward (to the rounding
 * of sums over other tiles); changing rows >= t0 changes no row before. */
static void test_prefill_offset(void **state) {
  (void)state;
  enum { T = 200, C = 16, NH = 2 };
  size_t nq = (size_t)T * 3 * C, no = (size_t)T * C;
  float *qkv = oc_alloc(nq, sizeof(float)), *whole = oc_alloc(no, sizeof(float)), *o = oc_alloc(no, sizeof(float));
  float *lse = oc_alloc((size_t)NH * T, sizeof(float)), *ws = oc_alloc(pw_attention_tiled_scratch(T, C, NH, NH), 4);
  float *kc = oc_alloc(no, sizeof(float)), *vc = oc_alloc(no, sizeof(float));
  float *ks = oc_alloc(pw_attention_kv_scratch(T, T), sizeof(float));
  oc_seed(5);
  oc_fill(qkv, nq, 2.0);
  pw_attention_tiled_forward(whole, lse, ws, qkv, 1, T, C, NH, NH);
  for (int t0 = 0; t0 < T; t0 += 70) { /* 0, 70, 140: chunks of 70 rows (the last 60) */
    int n = T - t0 < 70 ? T - t0 : 70;
    pw_attention_kv_forward(o + (size_t)t0 * C, kc, vc, ks, qkv + (size_t)t0 * 3 * C, n, t0, C, NH, NH, 0);
  }
  expect_close("prefill in chunks of 70", o, whole, no, 1e-6, 0);
  for (size_t i = 100 * 3 * C; i < nq; i++) qkv[i] += 5.0f;
  pw_attention_tiled_forward(o, lse, ws, qkv, 1, T, C, NH, NH);
  assert_memory_equal(o, whole, 100 * C * sizeof(float)); /* rows before 100: the same bits */
  int changed = 0;
  for (size_t i = 100 * C; i < no; i++) changed += o[i] != whole[i];
  assert_true(changed > 0);
  free(qkv), free(whole), free(o), free(lse), free(ws), free(kc), free(vc), free(ks);
}

int main(void) {
  const struct CMUnitTest per_level[] = {
      cmocka_unit_test(test_tiled_equals_plain),
      cmocka_unit_test(test_tiled_bf16),
      cmocka_unit_test(test_prefill_offset),
  };
  /* the finite differences once, at the best level: test_cpu holds every
   * level to the same bits */
  const struct CMUnitTest once[] = {
      cmocka_unit_test(test_tiled_gradients),
      cmocka_unit_test(test_gqa_bidirectional),
  };
  int rc = cmocka_run_group_tests_name("gradients", once, NULL, NULL);
  for (int l = pw_cpu_level(); l >= PW_CPU_SSE; l--) {
    pw_cpu_force((pw_cpu_isa)l);
    rc |= cmocka_run_group_tests_name(pw_cpu_name((pw_cpu_isa)l), per_level, NULL, NULL);
  }
  return rc;
}
