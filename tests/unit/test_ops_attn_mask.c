/* test_ops_attn_mask: attention's masks besides the causal one (ops.h's
 * pw_attn_mask: Mistral's sliding window, bidirectional attention, the
 * padding mask from the tokens) in the plain (ops_attn.c), tiled
 * (ops_flash.c) and KV-cache (ops_kv.c) kernels.
 *
 * - Gradient checks (opcheck.h: the forward against a double reference,
 *   the backward against central differences, accumulation) of the plain
 *   and the tiled kernel for each option and their combinations, with
 *   grouped-query heads: window (under, across and past the 64-row
 *   blocks), window + GQA, bidir + pad + GQA, causal + pad with leading
 *   pads, and a sequence of pads only (its rows attend uniformly: no
 *   gradient to q or k).
 * - The window's convention, transformers' (modeling_mistral 4.49: a key
 *   k is masked when k <= p - window): the query at p reads key p - window
 *   + 1, not p - window.
 * - plain == tiled to 1e-5 (forward and backward, overwriting) for T past
 *   the tiles, and the bf16 products against float32 to test_bf16's
 *   tolerance (2^-6 forward, 2^-5 gradients).
 * - A windowed prefill in chunks and one-token decode steps (ops_kv.c)
 *   give the rows of the whole sequence's windowed forward.
 * Everything once per vector level (cpu.h) but the finite differences. */
#include "bf16.h"
#include "cpu.h"
#include "opcheck.h"

/* d = {B, T, HD, NH, NKV, window, bidir, tiled}; tok (B,T) or NULL, pad
 * 0. Packed rows: NH query heads, NKV key heads, NKV value heads. saved:
 * att (B,NH,T,T) and the plain backward's T*T scratch, or lse (B,NH,T),
 * the tiled scratch and a copy of out. */
#define PAD 0

static pw_attn_mask mask_of(const opcase *c) {
  return (pw_attn_mask){.window = c->d[5], .bidir = c->d[6], .tok = c->tok, .pad = PAD};
}
static int qw(const opcase *c) { return c->d[2] * c->d[3]; } /* C = NH * HD */

static size_t tiled_out_at(const opcase *c) {
  int B = c->d[0], T = c->d[1], NH = c->d[3], NKV = c->d[4];
  return (size_t)B * NH * T + pw_attention_tiled_scratch(T, qw(c), NH, NKV);
}

static void mask_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  int B = c->d[0], T = c->d[1], NH = c->d[3], NKV = c->d[4];
  pw_attn_mask mk = mask_of(c);
  if (!c->d[7]) {
    pw_attention_forward_mask(out, saved, in[0], B, T, qw(c), NH, NKV, &mk);
    return;
  }
  pw_attention_tiled_forward_mask(out, saved, saved + (size_t)B * NH * T, in[0], B, T, qw(c), NH, NKV, &mk);
  memcpy(saved + tiled_out_at(c), out, c->out_n * sizeof(float));
}

static void mask_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                     float *const *g) {
  int B = c->d[0], T = c->d[1], NH = c->d[3], NKV = c->d[4];
  pw_attn_mask mk = mask_of(c);
  if (which != IN_DATA) return;
  if (!c->d[7])
    pw_attention_backward_input_mask(g[0], saved + (size_t)B * NH * T * T, dout, in[0], saved, B, T, qw(c), NH, NKV,
                                     1, &mk);
  else
    pw_attention_tiled_backward_input_mask(g[0], saved + (size_t)B * NH * T, dout, saved + tiled_out_at(c), in[0],
                                           saved, B, T, qw(c), NH, NKV, 1, &mk);
}

/* In double: row i sees keys [lo, hi) less its pad keys; a row whose keys
 * are all pad has constant scores 0 (uniform). */
static void mask_ref(const opcase *c, double *const *in, double *out) {
  int B = c->d[0], T = c->d[1], HD = c->d[2], NH = c->d[3], NKV = c->d[4], win = c->d[5], bidir = c->d[6];
  int W = (NH + 2 * NKV) * HD, G = NH / NKV;
  double p[512];
  assert_true(T <= 512);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const double *q = in[0] + (size_t)(b * T + i) * W + h * HD;
        const int32_t *tok = c->tok ? c->tok + (size_t)b * T : NULL;
        int lo = win && i + 1 > win ? i + 1 - win : 0, hi = bidir ? T : i + 1, kc = NH * HD + h / G * HD;
        int vc = (NH + NKV) * HD + h / G * HD, all_pad = tok != NULL;
        for (int j = lo; j < hi && tok; j++) all_pad &= tok[j] == PAD;
        double mx = -INFINITY, sum = 0;
        for (int j = lo; j < hi; j++) {
          double s = 0;
          for (int e = 0; e < HD; e++) s += q[e] * in[0][(size_t)(b * T + j) * W + kc + e];
          p[j] = all_pad ? 0.0 : tok && tok[j] == PAD ? -INFINITY : s / sqrt((double)HD);
          mx = p[j] > mx ? p[j] : mx;
        }
        for (int j = lo; j < hi; j++) sum += (p[j] = exp(p[j] - mx));
        for (int e = 0; e < HD; e++) {
          double s = 0;
          for (int j = lo; j < hi; j++) s += p[j] / sum * in[0][(size_t)(b * T + j) * W + vc + e];
          out[(size_t)(b * T + i) * NH * HD + h * HD + e] = s;
        }
      }
}

static opcase mask_case(int B, int T, int HD, int NH, int NKV, int window, int bidir, const int32_t *tok, int tiled) {
  opcase c = {.n_in = 1, .in_name = {"qkv"}, .in_kind = {IN_DATA},
              .in_n = {(size_t)B * T * (NH + 2 * NKV) * HD}, .out_n = (size_t)B * T * NH * HD,
              .d = {B, T, HD, NH, NKV, window, bidir, tiled}, .tok = tok, .init_scale = 2.0, /* peaky rows */
              .fwd = mask_fwd, .bwd = mask_bwd, .ref = mask_ref};
  c.saved_n = tiled ? tiled_out_at(&c) + c.out_n : (size_t)B * NH * T * T + (size_t)T * T;
  snprintf(c.name, sizeof c.name, "%s attention B=%d T=%d HD=%d NH=%d NKV=%d window=%d %s%s",
           tiled ? "tiled" : "plain", B, T, HD, NH, NKV, window, bidir ? "bidirectional" : "causal",
           tok ? " pad" : "");
  return c;
}

/* Tokens with pads: sequence 0 some pads inside and at the end, sequence
 * 1 pads only (B 2), or leading pads (B 3: a causal row before the first
 * token sees pads only). */
static int32_t *pad_tokens(int B, int T) {
  int32_t *t = oc_alloc((size_t)B * T, sizeof(int32_t));
  for (int i = 0; i < T; i++) {
    t[i] = i % 5 == 2 || i >= T - T / 4 ? PAD : 1 + i % 7;
    if (B > 1) t[T + i] = PAD;
    if (B > 2) t[2 * T + i] = i < 3 ? PAD : 2 + i % 3;
  }
  return t;
}

static void check_both(int B, int T, int HD, int NH, int NKV, int window, int bidir, const int32_t *tok) {
  for (int tiled = 0; tiled < 2; tiled++) {
    opcase c = mask_case(B, T, HD, NH, NKV, window, bidir, tok, tiled);
    check_op(&c);
  }
}

static void test_window_gradients(void **state) {
  (void)state;
  check_both(2, 9, 3, 2, 2, 3, 0, NULL);   /* window under T */
  check_both(1, 7, 2, 4, 2, 1, 0, NULL);   /* window 1: each row sees itself; GQA */
  check_both(1, 9, 2, 2, 2, 20, 0, NULL);  /* window past T: plain causal */
  check_both(1, 150, 1, 4, 2, 70, 0, NULL); /* across the plain kernel's 64-row blocks and a key tile, GQA */
  check_both(1, 140, 1, 2, 1, 5, 0, NULL); /* a narrow window far from the first blocks, multi-query */
}

static void test_bidir_pad_gradients(void **state) {
  (void)state;
  int32_t *tok = pad_tokens(3, 70), *t9 = pad_tokens(2, 9);
  check_both(2, 9, 3, 4, 2, 0, 1, t9);     /* bidir + pad + GQA, an all-pad sequence */
  check_both(2, 70, 1, 2, 1, 0, 1, tok);   /* past a row block */
  check_both(2, 8, 2, 2, 2, 0, 1, NULL);   /* bidir alone */
  check_both(3, 70, 1, 4, 2, 0, 0, tok);   /* causal + pad: leading pads are uniform rows */
  check_both(3, 70, 1, 2, 2, 6, 0, tok);   /* window + pad: windows of pads only */
  free(tok), free(t9);
}

/* ---- the window's convention ------------------------------------------------ */

/* The query at p reads keys p - window + 1 .. p: changing key (and value)
 * p - window changes nothing at p, changing p - window + 1 does. */
static void test_window_convention(void **state) {
  (void)state;
  enum { T = 12, HD = 4, W = 3 * HD, WIN = 4, P = 9 };
  float qkv[T * W], o1[T * HD], o2[T * HD], att[T * T], lse[T];
  float *ws = oc_alloc(pw_attention_tiled_scratch(T, HD, 1, 1), sizeof(float));
  pw_attn_mask mk = {.window = WIN};
  for (int tiled = 0; tiled < 2; tiled++)
    for (int k = P - WIN; k <= P - WIN + 1; k++) {
      oc_seed(3);
      oc_fill(qkv, T * W, 1.0);
      if (tiled) pw_attention_tiled_forward_mask(o1, lse, ws, qkv, 1, T, HD, 1, 1, &mk);
      else pw_attention_forward_mask(o1, att, qkv, 1, T, HD, 1, 1, &mk);
      for (int e = HD; e < W; e++) qkv[k * W + e] += 3.0f;
      if (tiled) pw_attention_tiled_forward_mask(o2, lse, ws, qkv, 1, T, HD, 1, 1, &mk);
      else pw_attention_forward_mask(o2, att, qkv, 1, T, HD, 1, 1, &mk);
      int same = !memcmp(o1 + P * HD, o2 + P * HD, HD * sizeof(float));
      if (same != (k == P - WIN))
        fail_msg("%s window %d: changing key %d %s the output at %d", tiled ? "tiled" : "plain", WIN, k,
                 same ? "does not change" : "changes", P);
    }
  free(ws);
}

/* A sequence of pads attends uniformly: every row the mean of the values
 * it may see (bidirectional: all of them), as HF BERT's finfo.min mask. */
static void test_all_pad_uniform(void **state) {
  (void)state;
  enum { T = 10, HD = 2, NH = 2, W = 3 * NH * HD };
  float qkv[T * W], o[T * NH * HD], att[NH * T * T], lse[NH * T];
  int32_t tok[T] = {0};
  float *ws = oc_alloc(pw_attention_tiled_scratch(T, NH * HD, NH, NH), sizeof(float));
  pw_attn_mask mk = {.bidir = 1, .tok = tok, .pad = 0};
  oc_seed(8);
  oc_fill(qkv, T * W, 2.0);
  for (int tiled = 0; tiled < 2; tiled++) {
    if (tiled) pw_attention_tiled_forward_mask(o, lse, ws, qkv, 1, T, NH * HD, NH, NH, &mk);
    else pw_attention_forward_mask(o, att, qkv, 1, T, NH * HD, NH, NH, &mk);
    for (int i = 0; i < T; i++)
      for (int c = 0; c < NH * HD; c++) {
        double mean = 0;
        for (int j = 0; j < T; j++) mean += qkv[j * W + 2 * NH * HD + c] / T;
        if (fabs(o[i * NH * HD + c] - mean) > 1e-6)
          fail_msg("%s: row %d column %d is %.9g, the mean of the values %.9g", tiled ? "tiled" : "plain", i, c,
                   o[i * NH * HD + c], mean);
      }
  }
  free(ws);
}

/* ---- plain against tiled, bf16 ----------------------------------------------- */

static double maxabs(const float *x, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
  return m;
}

static void expect_close(const char *what, const float *got, const float *want, size_t n, double tol) {
  double m = maxabs(want, n);
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= tol * m))
      fail_msg("%s: element %zu is %.9g, expected %.9g (tolerance %.3g of max %.3g)", what, i, got[i], want[i], tol,
               m);
}

static void compare(int B, int T, int HD, int NH, int NKV, const pw_attn_mask *mk) {
  int C = NH * HD;
  size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * C;
  float *qkv = oc_alloc(nq, 4), *dout = oc_alloc(no, 4), *op = oc_alloc(no, 4), *ot = oc_alloc(no, 4);
  float *att = oc_alloc((size_t)B * NH * T * T, 4), *tt = oc_alloc((size_t)T * T, 4);
  float *lse = oc_alloc((size_t)B * NH * T, 4), *ws = oc_alloc(pw_attention_tiled_scratch(T, C, NH, NKV), 4);
  float *dp = oc_alloc(nq, 4), *dt = oc_alloc(nq, 4), *ob = oc_alloc(no, 4), *db = oc_alloc(nq, 4);
  pw_bf16 *bs = oc_alloc(pw_attention_bf16_scratch(B, T, C) + pw_attention_tiled_bf16_scratch(B, T, C), 2);
  char what[128];
  snprintf(what, sizeof what, "B=%d T=%d HD=%d NH=%d NKV=%d window=%d bidir=%d pad=%d", B, T, HD, NH, NKV,
           mk->window, mk->bidir, mk->tok != NULL);
  oc_seed((uint64_t)T * 7 + (uint64_t)mk->window);
  oc_fill(qkv, nq, 2.0);
  oc_fill(dout, no, 1.0);
  for (size_t i = 0; i < nq; i++) dp[i] = dt[i] = NAN; /* acc 0 writes every element */
  pw_attention_forward_mask(op, att, qkv, B, T, C, NH, NKV, mk);
  pw_attention_tiled_forward_mask(ot, lse, ws, qkv, B, T, C, NH, NKV, mk);
  expect_close(what, ot, op, no, 1e-5);
  pw_attention_backward_input_mask(dp, tt, dout, qkv, att, B, T, C, NH, NKV, 0, mk);
  pw_attention_tiled_backward_input_mask(dt, ws, dout, ot, qkv, lse, B, T, C, NH, NKV, 0, mk);
  expect_close(what, dt, dp, nq, 1e-5);
  /* bf16 products: plain and tiled against float32 */
  for (int tiled = 0; tiled < 2; tiled++) {
    for (size_t i = 0; i < nq; i++) db[i] = NAN;
    if (tiled) {
      pw_attention_tiled_forward_bf16_mask(ob, lse, ws, bs, qkv, B, T, C, NH, NKV, mk);
      pw_attention_tiled_backward_input_bf16_mask(db, ws, bs, dout, ob, qkv, lse, B, T, C, NH, NKV, 0, mk);
    } else {
      pw_attention_forward_bf16_mask(ob, att, bs, qkv, B, T, C, NH, NKV, mk);
      pw_attention_backward_input_bf16_mask(db, tt, bs, dout, qkv, att, B, T, C, NH, NKV, 0, mk);
    }
    expect_close(what, ob, op, no, 0x1p-6);
    expect_close(what, db, dp, nq, 0x1p-5);
  }
  free(qkv), free(dout), free(op), free(ot), free(att), free(tt), free(lse), free(ws), free(dp), free(dt);
  free(ob), free(db), free(bs);
}

static void test_tiled_equals_plain(void **state) {
  (void)state;
  int32_t *tok = pad_tokens(3, 300);
  compare(1, 300, 16, 4, 2, &(pw_attn_mask){.window = 100});  /* a window across the tiles */
  compare(2, 200, 8, 2, 2, &(pw_attn_mask){.window = 7});     /* far narrower than a tile */
  compare(1, 257, 8, 4, 1, &(pw_attn_mask){.window = 128});   /* one key tile wide */
  compare(3, 300, 8, 4, 2, &(pw_attn_mask){.bidir = 1, .tok = tok, .pad = PAD});
  compare(3, 300, 8, 2, 1, &(pw_attn_mask){.tok = tok, .pad = PAD});
  compare(3, 300, 8, 2, 2, &(pw_attn_mask){.window = 40, .tok = tok, .pad = PAD});
  compare(2, 130, 16, 2, 2, &(pw_attn_mask){.bidir = 1});
  free(tok);
}

/* ---- the KV cache ------------------------------------------------------------- */

/* Prefill in chunks, then one-row decode steps, against the whole
 * sequence's windowed forward. */
static void test_kv_window(void **state) {
  (void)state;
  enum { T = 230, HD = 8, NH = 4, NKV = 2, WIN = 50, C = NH * HD, W = (NH + 2 * NKV) * HD };
  float *qkv = oc_alloc((size_t)T * W, 4), *whole = oc_alloc((size_t)T * C, 4), *o = oc_alloc((size_t)T * C, 4);
  float *lse = oc_alloc((size_t)NH * T, 4), *ws = oc_alloc(pw_attention_tiled_scratch(T, C, NH, NKV), 4);
  float *kc = oc_alloc((size_t)T * NKV * HD, 4), *vc = oc_alloc((size_t)T * NKV * HD, 4);
  float *ks = oc_alloc(pw_attention_kv_scratch(T, T), 4);
  oc_seed(11);
  oc_fill(qkv, (size_t)T * W, 2.0);
  pw_attention_tiled_forward_mask(whole, lse, ws, qkv, 1, T, C, NH, NKV, &(pw_attn_mask){.window = WIN});
  int t0 = 0;
  for (; t0 < 150; t0 += 75) pw_attention_kv_forward(o + (size_t)t0 * C, kc, vc, ks, qkv + (size_t)t0 * W, 75, t0, C,
                                                      NH, NKV, WIN);
  for (; t0 < T; t0++) pw_attention_kv_forward(o + (size_t)t0 * C, kc, vc, ks, qkv + (size_t)t0 * W, 1, t0, C, NH,
                                                NKV, WIN);
  expect_close("windowed prefill and decode", o, whole, (size_t)T * C, 1e-6);
  free(qkv), free(whole), free(o), free(lse), free(ws), free(kc), free(vc), free(ks);
}

int main(void) {
  const struct CMUnitTest per_level[] = {
      cmocka_unit_test(test_window_convention),
      cmocka_unit_test(test_all_pad_uniform),
      cmocka_unit_test(test_tiled_equals_plain),
      cmocka_unit_test(test_kv_window),
  };
  /* the finite differences once, at the best level: test_cpu holds every
   * level to the same bits */
  const struct CMUnitTest once[] = {
      cmocka_unit_test(test_window_gradients),
      cmocka_unit_test(test_bidir_pad_gradients),
  };
  int rc = cmocka_run_group_tests_name("gradients", once, NULL, NULL);
  for (int l = pw_cpu_level(); l >= PW_CPU_SSE; l--) {
    pw_cpu_force((pw_cpu_isa)l);
    rc |= cmocka_run_group_tests_name(pw_cpu_name((pw_cpu_isa)l), per_level, NULL, NULL);
  }
  return rc;
}
