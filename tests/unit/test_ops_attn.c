/* test_ops_attn: rotary embeddings and causal attention (ops_attn.c)
 * against double-precision references and finite differences (opcheck.h),
 * plus the causal mask, the saved probabilities, rope's identity at t=0 and
 * sequences longer than the kernel's causal row block (64). Once per vector
 * level (cpu.h). */
#include "cpu.h"
#include "opcheck.h"

/* ---- rope ------------------------------------------------------------------- */
/* d = {B, T, C, NH, NKV, scaled}; input qkv (B,T,W), W = C + 2 NKV HD; fp =
 * base; scaled: Llama-3's rope_scaling with LLAMA3 below. */

static const pw_rope LLAMA3 = {.factor = 8.0f, .low_freq_factor = 1.0f, .high_freq_factor = 4.0f,
                               .original_max_pos = 64};
static pw_rope rope_of(const opcase *c) {
  pw_rope r = c->d[5] ? LLAMA3 : (pw_rope){0};
  r.theta = c->fp;
  return r;
}
static size_t qkv_w(const opcase *c) { return (size_t)c->d[2] + 2 * (size_t)c->d[4] * (c->d[2] / c->d[3]); }

static void rope_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_rope r = rope_of(c);
  pw_rope_forward(out, in[0], c->d[0], c->d[1], c->d[2], c->d[3], c->d[4], &r);
}
static void rope_bwd(const opcase *c, int which, float *const *in, float *saved,
                     const float *dout, float *const *g) {
  pw_rope r = rope_of(c);
  if (which == IN_DATA) pw_rope_backward_input(g[0], dout, c->d[0], c->d[1], c->d[2], c->d[3], c->d[4], &r, 1);
}
/* transformers' _compute_llama3_parameters, in double */
static double llama3_ref(double f, const pw_rope *r) {
  double lo_wl = r->original_max_pos / (double)r->low_freq_factor;
  double hi_wl = r->original_max_pos / (double)r->high_freq_factor, wl = 2 * M_PI / f;
  if (wl > lo_wl) return f / r->factor;
  if (wl < hi_wl) return f;
  double s = (r->original_max_pos / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
  return (1 - s) * f / r->factor + s * f;
}
/* Hugging Face Llama: x*cos + rotate_half(x)*sin, rotate_half(x) = (-x2, x1). */
static void rope_ref(const opcase *c, double *const *in, double *out) {
  int B = c->d[0], T = c->d[1], C = c->d[2], NH = c->d[3], NKV = c->d[4], HD = C / NH, half = HD / 2;
  size_t W = qkv_w(c);
  pw_rope r = rope_of(c);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const double *x = in[0] + (size_t)(b * T + t) * W;
      double *y = out + (size_t)(b * T + t) * W;
      for (size_t j = 0; j < W; j++) y[j] = x[j];
      for (int h = 0; h < NH + NKV; h++) /* q heads, then k heads */
        for (int i = 0; i < half; i++) {
          double f = pow((double)c->fp, -2.0 * i / HD);
          double ang = t * (c->d[5] ? llama3_ref(f, &r) : f);
          double x1 = x[h * HD + i], x2 = x[h * HD + i + half];
          y[h * HD + i] = x1 * cos(ang) - x2 * sin(ang);
          y[h * HD + i + half] = x2 * cos(ang) + x1 * sin(ang);
        }
    }
}
static opcase rope_case_kv(int B, int T, int C, int NH, int NKV, float base, int scaled) {
  size_t W = (size_t)C + 2 * (size_t)NKV * (C / NH);
  opcase c = {.n_in = 1, .in_name = {"qkv"}, .in_kind = {IN_DATA},
              .in_n = {(size_t)B * T * W}, .out_n = (size_t)B * T * W,
              .d = {B, T, C, NH, NKV, scaled}, .fp = base,
              .fwd = rope_fwd, .bwd = rope_bwd, .ref = rope_ref};
  snprintf(c.name, sizeof c.name, "rope B=%d T=%d C=%d NH=%d NKV=%d base=%g%s", B, T, C, NH, NKV, base,
           scaled ? " llama3" : "");
  return c;
}
static opcase rope_case(int B, int T, int C, int NH, float base) { return rope_case_kv(B, T, C, NH, NH, base, 0); }

static void test_rope(void **state) {
  opcase c = rope_case(2, 5, 8, 2, 10000.0f);
  check_op(&c);
  c = rope_case(1, 9, 12, 3, 500.0f); /* HD=4 */
  check_op(&c);
  c = rope_case(1, 3, 260, 2, 10000.0f); /* half=65 > the kernel's 64-wide cos/sin chunk */
  check_op(&c);
  c = rope_case_kv(2, 5, 16, 4, 2, 10000.0f, 0); /* grouped-query: 2 kv heads */
  check_op(&c);
  c = rope_case_kv(1, 6, 12, 3, 1, 500.0f, 0); /* multi-query */
  check_op(&c);
}

/* Llama-3's rope_scaling: HD 16 at base 10000 and 64 original positions
 * puts pair 0 above the high-frequency cut (unchanged), pairs 1 and 2
 * between the cuts (smoothed), the rest below (divided by the factor). */
static void test_rope_llama3(void **state) {
  opcase c = rope_case_kv(2, 7, 32, 2, 1, 10000.0f, 1);
  check_op(&c);
  pw_rope r = LLAMA3;
  r.theta = 10000.0f;
  for (int i = 0; i < 8; i++) {
    double f = (double)(1.0f / powf(10000.0f, (float)(2 * i) / 16.0f));
    float got = pw_rope_inv_freq(&r, i, 16), want = (float)llama3_ref(f, &r);
    if (got != want) fail_msg("llama3 inv_freq[%d] = %.9g, want %.9g", i, (double)got, (double)want);
  }
  assert_true(pw_rope_inv_freq(&r, 0, 16) == 1.0f); /* the high band: unchanged */
  r.factor = 0;                                       /* none: HF's float32 inv_freq */
  for (int i = 0; i < 8; i++) assert_true(pw_rope_inv_freq(&r, i, 16) == 1.0f / powf(10000.0f, (float)(2 * i) / 16.0f));
}

/* ---- qk-norm ----------------------------------------------------------------- */
/* d = {N, NH, NKV, HD}; inputs qkv (N,W), wq (HD), wk (HD); fp = eps;
 * saved rstd (N, NH+NKV). */

static size_t qkn_w(const opcase *c) { return (size_t)(c->d[1] + 2 * c->d[2]) * c->d[3]; }
static void qkn_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_qknorm_forward(out, saved, in[0], in[1], in[2], c->d[0], c->d[1], c->d[2], c->d[3], c->fp);
}
static void qkn_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout, float *const *g) {
  if (which == IN_DATA)
    pw_qknorm_backward_input(g[0], dout, in[0], in[1], in[2], saved, c->d[0], c->d[1], c->d[2], c->d[3], 1);
  else
    pw_qknorm_backward_weight(g[1], g[2], dout, in[0], saved, c->d[0], c->d[1], c->d[2], c->d[3]);
}
/* Qwen3: q_norm(q.view(..., HD)), k_norm likewise; v as it is */
static void qkn_ref(const opcase *c, double *const *in, double *out) {
  int N = c->d[0], NH = c->d[1], NKV = c->d[2], HD = c->d[3];
  size_t W = qkn_w(c);
  for (int n = 0; n < N; n++)
    for (int h = 0; h < NH + 2 * NKV; h++) {
      const double *x = in[0] + n * W + (size_t)h * HD;
      double *y = out + n * W + (size_t)h * HD, ss = 0;
      const double *w = h < NH ? in[1] : in[2];
      for (int e = 0; e < HD; e++) ss += x[e] * x[e];
      double rs = 1 / sqrt(ss / HD + c->fp);
      for (int e = 0; e < HD; e++) y[e] = h < NH + NKV ? w[e] * x[e] * rs : x[e];
    }
}
static opcase qkn_case(int N, int NH, int NKV, int HD) {
  size_t W = (size_t)(NH + 2 * NKV) * HD;
  opcase c = {.n_in = 3, .in_name = {"qkv", "q_norm", "k_norm"}, .in_kind = {IN_DATA, IN_PARAM, IN_PARAM},
              .in_n = {(size_t)N * W, (size_t)HD, (size_t)HD}, .out_n = (size_t)N * W,
              .saved_n = (size_t)N * (NH + NKV), .d = {N, NH, NKV, HD}, .fp = 1e-6f,
              .fwd = qkn_fwd, .bwd = qkn_bwd, .ref = qkn_ref};
  snprintf(c.name, sizeof c.name, "qk_norm N=%d NH=%d NKV=%d HD=%d", N, NH, NKV, HD);
  return c;
}

static void test_qknorm(void **state) {
  opcase c = qkn_case(5, 4, 2, 6);
  check_op(&c);
  c = qkn_case(3, 2, 2, 8);
  check_op(&c);
  c = qkn_case(4, 3, 1, 5);
  check_op(&c);
}

static void test_rope_properties(void **state) {
  int B = 2, T = 6, C = 12, NH = 2, n = B * T * 3 * C;
  float *x = oc_alloc(n, sizeof(float)), *y = oc_alloc(n, sizeof(float));
  float *back = oc_alloc(n, sizeof(float));
  oc_seed(42);
  oc_fill(x, n, 1.0);
  pw_rope_forward(y, x, B, T, C, NH, NH, &(pw_rope){.theta = 10000.0f});
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int j = 0; j < 3 * C; j++) {
        int i = (b * T + t) * 3 * C + j;
        if (t == 0 || j >= 2 * C) { /* t=0 is the identity; v passes through untouched */
          if (y[i] != x[i])
            printf("FAIL rope identity: b=%d t=%d col=%d: %g != %g\n", b, t, j, y[i], x[i]);
          assert_true(y[i] == x[i]);
        }
      }
  /* A rotation: each (i, i+half) pair keeps its length; t>0 really rotates. */
  int HD = C / NH, half = HD / 2, moved = 0;
  for (int r = 0; r < B * T; r++)
    for (int h = 0; h < 2 * NH; h++)
      for (int i = 0; i < half; i++) {
        int p = r * 3 * C + h * HD + i;
        double n0 = hypot(x[p], x[p + half]), n1 = hypot(y[p], y[p + half]);
        assert_true(fabs(n0 - n1) <= 1e-6 * (1 + n0));
        moved += fabs(y[p] - x[p]) > 1e-3;
      }
  assert_true(moved > 0);
  /* backward is the transpose = the inverse rotation. */
  pw_rope_backward_input(back, y, B, T, C, NH, NH, &(pw_rope){.theta = 10000.0f}, 1);
  for (int i = 0; i < n; i++) assert_true(fabs(back[i] - x[i]) <= 2e-6);
  free(x); free(y); free(back);
}

/* ---- attention -------------------------------------------------------------- */
/* d = {B, T, C, NH, NKV}; input qkv (B,T,W); saved att (B,NH,T,T) then scratch (T,T). */

static void attn_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  pw_attention_forward(out, saved, in[0], c->d[0], c->d[1], c->d[2], c->d[3], c->d[4]);
}
static void attn_bwd(const opcase *c, int which, float *const *in, float *saved,
                     const float *dout, float *const *g) {
  int B = c->d[0], T = c->d[1], C = c->d[2], NH = c->d[3];
  if (which == IN_DATA)
    pw_attention_backward_input(g[0], saved + (size_t)B * NH * T * T, dout, in[0], saved, B, T,
                                C, NH, c->d[4], 1);
}
/* query head h reads key/value head h / (NH / NKV): Hugging Face's repeat_kv */
static void attn_ref(const opcase *c, double *const *in, double *out) {
  int B = c->d[0], T = c->d[1], C = c->d[2], NH = c->d[3], NKV = c->d[4], HD = C / NH;
  size_t W = qkv_w(c);
  double p[256];
  assert_true(T <= 256);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        int g = h / (NH / NKV);
        const double *q = in[0] + (size_t)(b * T + i) * W + h * HD;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= i; j++) {
          const double *k = in[0] + (size_t)(b * T + j) * W + C + g * HD;
          double s = 0;
          for (int e = 0; e < HD; e++) s += q[e] * k[e];
          p[j] = s / sqrt((double)HD);
          mx = p[j] > mx ? p[j] : mx;
        }
        for (int j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
        double *o = out + (size_t)(b * T + i) * C + h * HD;
        for (int e = 0; e < HD; e++) {
          double s = 0;
          for (int j = 0; j <= i; j++)
            s += p[j] / sum * in[0][(size_t)(b * T + j) * W + C + (size_t)(NKV + g) * HD + e];
          o[e] = s;
        }
      }
}
static opcase attn_case_kv(int B, int T, int C, int NH, int NKV) {
  size_t W = (size_t)C + 2 * (size_t)NKV * (C / NH);
  opcase c = {.n_in = 1, .in_name = {"qkv"}, .in_kind = {IN_DATA},
              .in_n = {(size_t)B * T * W}, .out_n = (size_t)B * T * C,
              .saved_n = (size_t)B * NH * T * T + (size_t)T * T, .d = {B, T, C, NH, NKV},
              .init_scale = 2.0, /* peaky enough softmax to matter */
              .fwd = attn_fwd, .bwd = attn_bwd, .ref = attn_ref};
  snprintf(c.name, sizeof c.name, "attention B=%d T=%d C=%d NH=%d NKV=%d", B, T, C, NH, NKV);
  return c;
}
static opcase attn_case(int B, int T, int C, int NH) { return attn_case_kv(B, T, C, NH, NH); }

static void test_attention(void **state) {
  opcase c = attn_case(2, 5, 8, 2);
  check_op(&c);
  c = attn_case(1, 7, 6, 2); /* odd: HD=3 */
  check_op(&c);
  c = attn_case(3, 1, 4, 1); /* T=1: attends to itself only */
  check_op(&c);
  c = attn_case_kv(2, 5, 12, 4, 2); /* grouped-query: two query heads a kv head */
  check_op(&c);
  c = attn_case_kv(1, 7, 9, 3, 1); /* multi-query, HD=3 */
  check_op(&c);
  c = attn_case_kv(1, 70, 8, 4, 2); /* past one causal row block */
  check_op(&c);
}

/* Longer than one causal row block: 70 = 64 + 6, 130 = 2*64 + 2. */
static void test_attention_blocked(void **state) {
  opcase c = attn_case(1, 70, 6, 2);
  check_op(&c);
  c = attn_case(1, 130, 2, 1);
  check_op(&c);
}

/* Changing tokens at t >= t0 leaves every output before t0 unchanged; the
 * probabilities are a causal distribution per row. */
static void check_causal(int B, int T, int C, int NH, int t0) {
  size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
  float *qkv = oc_alloc(nq, sizeof(float)), *o1 = oc_alloc(no, sizeof(float));
  float *o2 = oc_alloc(no, sizeof(float)), *att = oc_alloc(na, sizeof(float));
  oc_seed((uint64_t)T);
  oc_fill(qkv, nq, 2.0);
  for (size_t i = 0; i < na; i++) att[i] = NAN;
  pw_attention_forward(o1, att, qkv, B, T, C, NH, NH);
  for (int bh = 0; bh < B * NH; bh++)
    for (int i = 0; i < T; i++) {
      const float *p = att + ((size_t)bh * T + i) * T;
      double s = 0;
      for (int j = 0; j < T; j++) {
        if (j > i && p[j] != 0.0f)
          printf("FAIL attention att: bh=%d row %d col %d above the diagonal is %g\n", bh, i, j,
                 p[j]);
        assert_true(j <= i ? p[j] >= 0.0f : p[j] == 0.0f);
        s += p[j];
      }
      if (fabs(s - 1.0) > 1e-5) printf("FAIL attention att: bh=%d row %d sums to %.9g\n", bh, i, s);
      assert_true(fabs(s - 1.0) <= 1e-5);
    }
  /* Perturb the future of batch 0 (q, k and v). */
  for (int t = t0; t < T; t++)
    for (int j = 0; j < 3 * C; j++) qkv[(size_t)t * 3 * C + j] += 5.0f;
  pw_attention_forward(o2, att, qkv, B, T, C, NH, NH);
  int changed_future = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int e = 0; e < C; e++) {
        size_t i = ((size_t)b * T + t) * C + e;
        if (b > 0 || t < t0) {
          if (fabs(o1[i] - o2[i]) > 1e-6 * (1 + fabs(o1[i])))
            printf("FAIL attention causal: b=%d t=%d e=%d changed %.9g -> %.9g\n", b, t, e,
                   o1[i], o2[i]);
          assert_true(fabs(o1[i] - o2[i]) <= 1e-6 * (1 + fabs(o1[i])));
        } else {
          changed_future += o1[i] != o2[i];
        }
      }
  assert_true(changed_future > 0);
  free(qkv); free(o1); free(o2); free(att);
}

static void test_attention_causal(void **state) {
  check_causal(2, 9, 8, 2, 4);
  check_causal(2, 150, 4, 2, 100); /* spans causal row blocks */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_rope_llama3),
      cmocka_unit_test(test_qknorm),
      cmocka_unit_test(test_rope_properties),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_attention_blocked),
      cmocka_unit_test(test_attention_causal),
  };
  /* Once per vector level (cpu.h), from the one PW_CPU allows down. */
  int rc = 0;
  for (int l = pw_cpu_level(); l >= PW_CPU_SSE; l--) {
    pw_cpu_force((pw_cpu_isa)l);
    rc |= cmocka_run_group_tests_name(pw_cpu_name((pw_cpu_isa)l), tests, NULL, NULL);
  }
  return rc;
}
