/* test_decode: the KV-cache decode (decode.h) against full recompute, and
 * the sampler (sample.h).
 *
 * The reference is the training forward (pw_prog_forward) over a whole
 * sequence: attention is causal, so its logits at row t are those of the
 * prefix 0..t. The cached decode must give every row's logits within 1e-5
 * of the row's largest |logit| (the matmuls sum in another order: oneDNN's
 * packed kernels or sgemv against sgemm, a few keys against T), for gpt and
 * llama, tied and untied, llama's attention options and Gemma's,
 * and a layers list holding every op a token model can:
 * - a prefill of k tokens, then one token at a time to the end of seq_len;
 * - two sequences in one batch (slots 2 and 0 of 3) of different lengths,
 *   advancing by different numbers of rows, then one rewound and rewritten;
 * - a model split into three stage decoders chained port to port gives the
 *   single decoder's logits bit for bit (each stage runs the same kernels
 *   on the same rows: a pipeline will equal the oracle);
 * - greedy tokens equal a naive decode that recomputes the whole prefix
 *   for every token;
 * - a sequence's logits do not depend on its batch-mates: four sequences
 *   prefilled and stepped in shared calls give, bit for bit, the logits of
 *   each decoded alone (what serving's determinism rests on), on the
 *   linears' path this host takes (oneDNN on AVX-512, checked) and on the
 *   sgemv path forced.
 * Rotary rows at an offset are the whole sequence's bit for bit. Bad calls
 * are refused with nothing computed. The sampler: greedy takes
 * the first maximum, top-k 1 and a tiny top-p are greedy, a seed repeats
 * its tokens, and temperature 1 draws each token about as often as its
 * softmax probability (top-k and top-p renormalised). */
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
#include "decode.h"
#include "model.h"
#include "ops.h"
#include "prog.h"
#include "rng.h"
#include "rowmm.h"
#include "sample.h"

enum { V = 23, T = 12, SEED = 7 };
#define TOL 1e-5

static pw_model_spec spec_of(int tmpl, int tie) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = tmpl;
  s.vocab_size = V, s.seq_len = T, s.d_model = 16, s.n_layers = 3, s.n_heads = 2;
  s.ffn_hidden = 24;
  s.tie_embeddings = tie;
  s.init_std = 0.3f; /* logits of a few units: differences show */
  return s;
}

typedef struct {
  pw_model m;
  pw_prog *full;     /* the whole model, one sequence: the reference */
  int logits;        /* value id of the logits */
} fixture;

static void fixture_init_spec(fixture *f, const pw_model_spec *s) {
  pw_err err = {0};
  assert_int_equal(pw_model_build(s, &f->m, &err), 0);
  pw_prog_config pc = {.layer_lo = 0, .layer_hi = f->m.n_layers, .mb_size = 1, .batch_size = 1, .n_slots = 1};
  assert_int_equal(pw_prog_create(&f->m, &pc, &f->full, &err), 0);
  pw_prog_init_params(f->full, SEED);
  f->logits = f->m.nodes[f->m.values[f->m.loss_value].producer].in[0];
}

static void fixture_init(fixture *f, int tmpl, int tie) {
  pw_model_spec s = spec_of(tmpl, tie);
  fixture_init_spec(f, &s);
}

/* A layers list with every op a token model can hold: learned positions,
 * both blocks, both norms, GELU, ReLU and SiLU, biased and unbiased linears. */
static pw_model_spec layers_spec(pw_layer_spec *l) {
  static const pw_layer_spec list[] = {
      {.type = PW_LAYER_EMBEDDING, .vocab_size = V, .out = 16},
      {.type = PW_LAYER_POS_EMBEDDING},
      {.type = PW_LAYER_GPT_BLOCK, .n_heads = 2},
      {.type = PW_LAYER_LLAMA_BLOCK, .n_heads = 4},
      {.type = PW_LAYER_LAYERNORM},
      {.type = PW_LAYER_LINEAR, .out = 24, .bias = 1},
      {.type = PW_LAYER_GELU},
      {.type = PW_LAYER_LINEAR, .out = 20, .bias = 1},
      {.type = PW_LAYER_RELU},
      {.type = PW_LAYER_LINEAR, .out = 20, .bias = 0},
      {.type = PW_LAYER_SILU},
      {.type = PW_LAYER_RMSNORM},
      {.type = PW_LAYER_LINEAR, .out = V, .bias = 0},
      {.type = PW_LAYER_CROSS_ENTROPY},
  };
  memcpy(l, list, sizeof list);
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_LAYERS, s.input = PW_INPUT_TOKENS, s.seq_len = T, s.init_std = 0.3f;
  s.layers = l, s.n_layer_specs = (int)(sizeof list / sizeof list[0]);
  return s;
}

static void fixture_free(fixture *f) {
  pw_prog_free(f->full);
  pw_model_free(&f->m);
}

/* Logits (T,V) of a full forward over tok[0..n), padded with token 0. */
static void full_logits(fixture *f, const int32_t *tok, int n, float *out) {
  int32_t *in = pw_prog_value(f->full, 0, f->m.input_value);
  int32_t *tg = pw_prog_value(f->full, 0, f->m.target_value);
  for (int t = 0; t < T; t++) {
    in[t] = t < n ? tok[t] : 0;
    tg[t] = 0;
  }
  assert_int_equal(pw_prog_forward(f->full, 0, NULL, NULL), 0);
  memcpy(out, pw_prog_value(f->full, 0, f->logits), sizeof(float) * T * V);
}

static void random_tokens(int32_t *tok, int n, uint64_t key) {
  pw_rng r;
  pw_rng_seed(&r, key);
  for (int i = 0; i < n; i++) tok[i] = (int32_t)pw_rng_below(&r, V);
}

static void expect_row(const float *got, const float *want, const char *what, int pos) {
  double mx = 0, worst = 0;
  int at = 0;
  for (int v = 0; v < V; v++) mx = fmax(mx, fabs(want[v]));
  for (int v = 0; v < V; v++)
    if (fabs(got[v] - want[v]) > worst) worst = fabs(got[v] - want[v]), at = v;
  if (worst > TOL * mx)
    fail_msg("%s, position %d: logit %d is %.9g, full forward %.9g (|diff| %.3g > %.1g x %.3g)", what, pos, at,
             (double)got[at], (double)want[at], worst, TOL, mx);
}

static pw_decode *decoder(pw_prog *p, int max_seqs) {
  pw_decode *d = NULL;
  pw_err err = {0};
  pw_decode_config c = {.max_seqs = max_seqs};
  assert_int_equal(pw_decode_create(p, &c, &d, &err), 0);
  return d;
}

static void run(pw_decode *d, const pw_decode_seq *s, int n) {
  pw_err err = {0};
  int rc = pw_decode_forward(d, s, n, &err);
  if (rc) fail_msg("decode: %s: %s", err.path, err.msg);
}

/* Prefill k, then single tokens; every row against the full forward. */
static void check_prefill_then_steps_of(const pw_model_spec *s, int k) {
  fixture f;
  fixture_init_spec(&f, s);
  int32_t tok[T];
  float ref[T * V];
  random_tokens(tok, T, 100 + (uint64_t)k);
  full_logits(&f, tok, T, ref);
  pw_decode *d = decoder(f.full, 1);
  int32_t *in = pw_decode_value(d, f.m.input_value);
  float *lg = pw_decode_value(d, f.logits);
  assert_non_null(in);
  assert_non_null(lg);
  assert_int_equal(pw_decode_n_outputs(d), 1);
  assert_int_equal(pw_decode_output(d, 0), f.logits);
  memcpy(in, tok, sizeof(int32_t) * (size_t)k);
  run(d, &(pw_decode_seq){0, 0, k}, 1);
  for (int t = 0; t < k; t++) expect_row(lg + (size_t)t * V, ref + (size_t)t * V, "prefill", t);
  for (int t = k; t < T; t++) {
    in[0] = tok[t];
    run(d, &(pw_decode_seq){0, t, 1}, 1);
    expect_row(lg, ref + (size_t)t * V, "step", t);
  }
  assert_int_equal(pw_decode_filled(d, 0), T);
  pw_decode_free(d);
  fixture_free(&f);
}

static void check_prefill_then_steps(int tmpl, int tie, int k) {
  pw_model_spec s = spec_of(tmpl, tie);
  check_prefill_then_steps_of(&s, k);
}

/* Four sequences in shared calls (prefills of different lengths in one,
 * then single rows of all four) against each one alone, bit for bit. */
static void check_batch_mates_of(const pw_model_spec *s) {
  enum { N = 4, STEPS = 4 };
  static const int len[N] = {3, 4, 1, 4}; /* 12 rows: max_rows is max_pos, T */
  fixture f;
  fixture_init_spec(&f, s);
  int32_t tok[N][T];
  for (int q = 0; q < N; q++) random_tokens(tok[q], T, 300 + (uint64_t)q);
  pw_decode *both = decoder(f.full, N), *one = decoder(f.full, 1);
  int32_t *in = pw_decode_value(both, f.m.input_value), *in1 = pw_decode_value(one, f.m.input_value);
  const float *lg = pw_decode_value(both, f.logits), *lg1 = pw_decode_value(one, f.logits);
  float got[N][STEPS + 1][V];
  pw_decode_seq call[N];
  int rows = 0;
  for (int q = 0; q < N; q++) {
    memcpy(in + rows, tok[q], sizeof(int32_t) * (size_t)len[q]);
    call[q] = (pw_decode_seq){N - 1 - q, 0, len[q]}; /* slots in another order than the rows */
    rows += len[q];
  }
  run(both, call, N);
  for (int q = 0, r = 0; q < N; r += len[q++]) memcpy(got[q][0], lg + (size_t)(r + len[q] - 1) * V, sizeof got[q][0]);
  for (int k = 1; k <= STEPS; k++) {
    for (int q = 0; q < N; q++) {
      in[q] = tok[q][len[q] + k - 1];
      call[q] = (pw_decode_seq){N - 1 - q, len[q] + k - 1, 1};
    }
    run(both, call, N);
    for (int q = 0; q < N; q++) memcpy(got[q][k], lg + (size_t)q * V, sizeof got[q][k]);
  }
  for (int q = 0; q < N; q++) {
    memcpy(in1, tok[q], sizeof(int32_t) * (size_t)len[q]);
    run(one, &(pw_decode_seq){0, 0, len[q]}, 1);
    for (int k = 0; k <= STEPS; k++) {
      if (k) {
        in1[0] = tok[q][len[q] + k - 1];
        run(one, &(pw_decode_seq){0, len[q] + k - 1, 1}, 1);
      }
      const float *want = k ? lg1 : lg1 + (size_t)(len[q] - 1) * V;
      if (memcmp(got[q][k], want, sizeof got[q][k]))
        fail_msg("sequence %d, step %d: its logits in a shared call differ from its own decode", q, k);
    }
  }
  pw_decode_free(both);
  pw_decode_free(one);
  fixture_free(&f);
}

/* On the kernel path this host takes (oneDNN on AVX-512: every row of a
 * call at once) and on the sgemv path forced (each sequence's rows alone). */
static void test_batch_mates(void **st) {
  (void)st;
  pw_model_spec g = spec_of(PW_TEMPLATE_GPT, 0), l = spec_of(PW_TEMPLATE_LLAMA, 1);
  pw_layer_spec list[14];
  pw_model_spec ls = layers_spec(list);
  for (int forced = 0; forced < 2; forced++) {
    pw_rowmm_force_sgemv(forced);
    fixture f;
    fixture_init(&f, PW_TEMPLATE_GPT, 1);
    pw_decode *d = decoder(f.full, 1);
    const char *want = forced ? "sgemv (forced)" : pw_cpu_level() == PW_CPU_AVX512 ? "onednn:" : "";
    if (strncmp(pw_decode_path(d), want, strlen(want)))
      fail_msg("the linears' path is %s, expected %s", pw_decode_path(d), want);
    pw_decode_free(d);
    fixture_free(&f);
    check_batch_mates_of(&g);
    check_batch_mates_of(&l);
    check_batch_mates_of(&ls);
  }
  pw_rowmm_force_sgemv(0);
}

static void test_gpt_untied(void **st) {
  (void)st;
  check_prefill_then_steps(PW_TEMPLATE_GPT, 0, 5);
  check_prefill_then_steps(PW_TEMPLATE_GPT, 0, 1);
}
static void test_gpt_tied(void **st) {
  (void)st;
  check_prefill_then_steps(PW_TEMPLATE_GPT, 1, 4);
}
static void test_llama_untied(void **st) {
  (void)st;
  check_prefill_then_steps(PW_TEMPLATE_LLAMA, 0, 5);
  check_prefill_then_steps(PW_TEMPLATE_LLAMA, 0, T);
}
static void test_llama_tied(void **st) {
  (void)st;
  check_prefill_then_steps(PW_TEMPLATE_LLAMA, 1, 3);
}

/* llama's attention options: grouped-query (4 query heads over 2 and 1
 * kv heads: the cache holds the narrower rows), Llama-3's rope scaling
 * (every band at these positions), the qkv bias, QK-norm. */
static void test_llama_options(void **st) {
  (void)st;
  for (int kv = 2; kv >= 1; kv--) {
    pw_model_spec s = spec_of(PW_TEMPLATE_LLAMA, 0);
    s.n_heads = 4, s.n_kv_heads = kv, s.rope_base = 100.0f, s.qkv_bias = kv == 1, s.qk_norm = kv == 2;
    s.rope_scaling = 1, s.rope_factor = 4, s.rope_low_freq_factor = 1, s.rope_high_freq_factor = 2;
    s.rope_orig_max_pos = 8;
    check_prefill_then_steps_of(&s, 5);
    check_prefill_then_steps_of(&s, 1);
  }
}

/* Gemma's options: the GeGLU MLP, embeddings times sqrt(d), RMSNorms
 * scaled by 1 + w (the scale and offset norm run on the call's rows),
 * tied, multi-query as Gemma-2B. */
static void test_gemma_options(void **st) {
  (void)st;
  pw_model_spec s = spec_of(PW_TEMPLATE_LLAMA, 1);
  s.n_heads = 2, s.n_kv_heads = 1, s.mlp_act = PW_MLP_ACT_GELU_TANH, s.embed_scale = 1, s.norm_offset = 1;
  check_prefill_then_steps_of(&s, 5);
  check_prefill_then_steps_of(&s, 1);
}

/* Mixtures of experts (model.moe): the routing is row by row, so a
 * prefill, single steps and shared calls give the full forward's logits;
 * llama's SwiGLU experts under softmax gates, gpt's under sigmoid gates
 * with a shared expert. */
static void test_moe(void **st) {
  (void)st;
  pw_model_spec l = spec_of(PW_TEMPLATE_LLAMA, 0), g = spec_of(PW_TEMPLATE_GPT, 1);
  l.moe_experts = 4, l.moe_top_k = 2, l.moe_hidden = 8, l.moe_every = 1, l.moe_routed_scale = 1.0f;
  g.moe_experts = 3, g.moe_top_k = 2, g.moe_hidden = 8, g.moe_every = 1, g.moe_gate = PW_MOE_GATE_SIGMOID;
  g.moe_routed_scale = 2.0f, g.moe_shared = 1;
  check_prefill_then_steps_of(&l, 5);
  check_prefill_then_steps_of(&g, 1);
  check_batch_mates_of(&l);
  check_batch_mates_of(&g);
}

static void test_layers_list(void **st) {
  (void)st;
  pw_layer_spec l[14];
  pw_model_spec s = layers_spec(l);
  check_prefill_then_steps_of(&s, 6);
}

/* Two sequences share calls: a in slot 2, b in slot 0, of 3 slots. */
static void check_two_sequences(int tmpl) {
  fixture f;
  fixture_init(&f, tmpl, 0);
  int32_t a[T], b[T];
  float ra[T * V], rb[T * V];
  random_tokens(a, T, 1);
  random_tokens(b, T, 2);
  full_logits(&f, a, T, ra);
  full_logits(&f, b, T, rb);
  pw_decode *d = decoder(f.full, 3);
  int32_t *in = pw_decode_value(d, f.m.input_value);
  float *lg = pw_decode_value(d, f.logits);
  /* (a rows, b rows) per call; a ends at 4+1+1+1+2 = 9, b at 7+1+1+3 = 12 */
  static const int steps[][2] = {{4, 7}, {1, 1}, {1, 1}, {1, 3}, {2, 0}};
  int pa = 0, pb = 0;
  for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
    int la = steps[s][0], lb = steps[s][1], n = 0;
    pw_decode_seq q[2];
    if (la) q[n++] = (pw_decode_seq){2, pa, la};
    if (lb) q[n++] = (pw_decode_seq){0, pb, lb};
    memcpy(in, a + pa, sizeof(int32_t) * (size_t)la);
    memcpy(in + la, b + pb, sizeof(int32_t) * (size_t)lb);
    run(d, q, n);
    for (int t = 0; t < la; t++) expect_row(lg + (size_t)t * V, ra + (size_t)(pa + t) * V, "sequence a", pa + t);
    for (int t = 0; t < lb; t++)
      expect_row(lg + (size_t)(la + t) * V, rb + (size_t)(pb + t) * V, "sequence b", pb + t);
    pa += la;
    pb += lb;
  }
  assert_int_equal(pw_decode_filled(d, 2), 9);
  assert_int_equal(pw_decode_filled(d, 0), T);
  assert_int_equal(pw_decode_filled(d, 1), 0);
  /* Rewind a to position 3 with other tokens: rows 3.. now follow those. */
  int32_t c[T];
  memcpy(c, a, sizeof c);
  random_tokens(c + 3, T - 3, 3);
  float rc[T * V];
  full_logits(&f, c, T, rc);
  memcpy(in, c + 3, sizeof(int32_t) * 4);
  run(d, &(pw_decode_seq){2, 3, 4}, 1);
  for (int t = 0; t < 4; t++) expect_row(lg + (size_t)t * V, rc + (size_t)(3 + t) * V, "rewound a", 3 + t);
  assert_int_equal(pw_decode_filled(d, 2), 7);
  pw_decode_free(d);
  fixture_free(&f);
}

static void test_two_sequences(void **st) {
  (void)st;
  check_two_sequences(PW_TEMPLATE_GPT);
  check_two_sequences(PW_TEMPLATE_LLAMA);
}

/* Stages [0,1) [1,3) [3,5) of embed, blocks.0-2, head, chained, against one
 * decoder over the whole model: the same logits bit for bit. */
static void check_stages(int tmpl) {
  fixture f;
  fixture_init(&f, tmpl, 1); /* tied: the first and last stage both hold embed.tok.weight */
  static const int cut[] = {0, 1, 3, 5};
  enum { S = 3 };
  assert_int_equal(f.m.n_layers, 5);
  pw_prog *p[S];
  pw_decode *d[S];
  pw_err err = {0};
  for (int s = 0; s < S; s++) {
    pw_prog_config pc = {.layer_lo = cut[s], .layer_hi = cut[s + 1], .mb_size = 1, .batch_size = 1, .max_slots = 1};
    assert_int_equal(pw_prog_create(&f.m, &pc, &p[s], &err), 0);
    pw_prog_init_params(p[s], SEED);
    d[s] = decoder(p[s], 2);
  }
  pw_decode *whole = decoder(f.full, 2);
  int32_t tok[T];
  random_tokens(tok, T, 9);
  static const int lens[] = {5, 1, 1, 3, 1, 1};
  int pos = 0;
  for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
    pw_decode_seq q = {1, pos, lens[k]};
    memcpy(pw_decode_value(whole, f.m.input_value), tok + pos, sizeof(int32_t) * (size_t)lens[k]);
    memcpy(pw_decode_value(d[0], f.m.input_value), tok + pos, sizeof(int32_t) * (size_t)lens[k]);
    run(whole, &q, 1);
    for (int s = 0; s < S; s++) {
      if (s > 0) {
        assert_int_equal(pw_decode_n_inputs(d[s]), 1);
        int v = pw_decode_input(d[s], 0);
        assert_int_equal(pw_decode_output(d[s - 1], 0), v);
        memcpy(pw_decode_value(d[s], v), pw_decode_value(d[s - 1], v),
               sizeof(float) * (size_t)lens[k] * (size_t)f.m.values[v].width);
      }
      run(d[s], &q, 1);
    }
    if (memcmp(pw_decode_value(d[S - 1], f.logits), pw_decode_value(whole, f.logits),
               sizeof(float) * (size_t)lens[k] * V) != 0)
      fail_msg("template %d: chained stages differ from the whole model at positions %d..%d", tmpl, pos,
               pos + lens[k] - 1);
    pos += lens[k];
  }
  pw_decode_free(whole);
  for (int s = 0; s < S; s++) {
    pw_decode_free(d[s]);
    pw_prog_free(p[s]);
  }
  fixture_free(&f);
}

static void test_stages_chain(void **st) {
  (void)st;
  check_stages(PW_TEMPLATE_GPT);
  check_stages(PW_TEMPLATE_LLAMA);
}

/* Greedy with the cache = greedy recomputing the whole prefix each token. */
static void check_greedy(int tmpl, int tie) {
  fixture f;
  fixture_init(&f, tmpl, tie);
  enum { P = 3 };
  int32_t naive[T], cached[T];
  float ref[T * V];
  random_tokens(naive, P, 11);
  memcpy(cached, naive, sizeof(int32_t) * P);
  for (int n = P; n < T; n++) {
    full_logits(&f, naive, n, ref);
    naive[n] = pw_argmax(ref + (size_t)(n - 1) * V, V);
  }
  pw_decode *d = decoder(f.full, 1);
  int32_t *in = pw_decode_value(d, f.m.input_value);
  float *lg = pw_decode_value(d, f.logits);
  memcpy(in, cached, sizeof(int32_t) * P);
  run(d, &(pw_decode_seq){0, 0, P}, 1);
  cached[P] = pw_argmax(lg + (size_t)(P - 1) * V, V);
  for (int n = P + 1; n < T; n++) {
    in[0] = cached[n - 1];
    run(d, &(pw_decode_seq){0, n - 1, 1}, 1);
    cached[n] = pw_argmax(lg, V);
  }
  for (int n = P; n < T; n++)
    if (naive[n] != cached[n]) fail_msg("template %d tie %d: token %d is %d cached, %d naive", tmpl, tie, n, cached[n], naive[n]);
  pw_decode_free(d);
  fixture_free(&f);
}

static void test_greedy_equals_naive(void **st) {
  (void)st;
  check_greedy(PW_TEMPLATE_GPT, 0);
  check_greedy(PW_TEMPLATE_GPT, 1);
  check_greedy(PW_TEMPLATE_LLAMA, 0);
  check_greedy(PW_TEMPLATE_LLAMA, 1);
}

/* Rows t0.. of a rotary forward at an offset are, bit for bit, those rows
 * of the forward over the whole sequence (the same angles). */
static void test_rope_at_offset(void **st) {
  (void)st;
  enum { C = 8, NH = 2, C3 = 3 * C };
  float in[T * C3], whole[T * C3], part[T * C3];
  pw_rng r;
  pw_rng_seed(&r, 5);
  for (int i = 0; i < T * C3; i++) in[i] = (float)pw_rng_normal(&r);
  pw_rope_forward(whole, in, 1, T, C, NH, NH, &(pw_rope){.theta = 10000.0f});
  for (int t0 = 0; t0 < T; t0 += 5) {
    int n = T - t0 < 5 ? T - t0 : 5;
    pw_rope_forward_at(part, in + t0 * C3, n, t0, C, NH, NH, &(pw_rope){.theta = 10000.0f});
    if (memcmp(part, whole + t0 * C3, sizeof(float) * (size_t)(n * C3)) != 0)
      fail_msg("rows %d..%d rotated at their offset differ from the whole sequence's", t0, t0 + n - 1);
  }
}

static void expect_refused(pw_decode *d, const pw_decode_seq *q, int n, const char *needle) {
  pw_err err = {0};
  assert_int_equal(pw_decode_forward(d, q, n, &err), PW_EINVAL);
  if (!strstr(err.msg, needle)) fail_msg("expected '%s' in: %s", needle, err.msg);
}

static void test_bad_calls(void **st) {
  (void)st;
  fixture f;
  fixture_init(&f, PW_TEMPLATE_GPT, 0);
  pw_err err = {0};
  pw_decode *d = NULL;
  pw_decode_config c = {.max_seqs = 2, .max_pos = T + 1};
  assert_int_equal(pw_decode_create(f.full, &c, &d, &err), PW_EINVAL); /* past the learned positions */
  assert_non_null(strstr(err.msg, "learned positions"));
  c = (pw_decode_config){.max_seqs = 2, .max_rows = 4};
  assert_int_equal(pw_decode_create(f.full, &c, &d, &err), 0);
  int32_t *in = pw_decode_value(d, f.m.input_value);
  memset(in, 0, sizeof(int32_t) * 4);
  expect_refused(d, &(pw_decode_seq){2, 0, 1}, 1, "slot 2 is not in 0..1");
  expect_refused(d, &(pw_decode_seq){0, 1, 1}, 1, "slot 0 holds 0");
  expect_refused(d, &(pw_decode_seq){0, 0, 0}, 1, "0 rows");
  expect_refused(d, (pw_decode_seq[]){{0, 0, 1}, {0, 0, 1}}, 2, "appears twice");
  expect_refused(d, (pw_decode_seq[]){{0, 0, 3}, {1, 0, 2}}, 2, "more than 4 new rows");
  in[1] = V;
  expect_refused(d, &(pw_decode_seq){0, 0, 2}, 1, "token 23 is not in 0..22");
  in[1] = 0;
  assert_int_equal(pw_decode_filled(d, 0), 0); /* nothing ran */
  for (int pos = 0; pos < T; pos += 4) run(d, &(pw_decode_seq){1, pos, 4}, 1);
  expect_refused(d, &(pw_decode_seq){1, T, 1}, 1, "past the 12 the cache holds");
  run(d, (pw_decode_seq[]){{0, 0, 2}, {1, 0, 2}}, 2); /* the refusals left no slot marked */
  pw_decode_free(d);
  fixture_free(&f);

  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_MLP, s.in_dim = 3, s.hidden_dim = 4, s.out_dim = 2, s.n_layers = 1;
  pw_model m;
  pw_prog *p;
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  pw_prog_config pc = {.layer_lo = 0, .layer_hi = m.n_layers, .mb_size = 1, .batch_size = 1, .n_slots = 1};
  assert_int_equal(pw_prog_create(&m, &pc, &p, &err), 0);
  c = (pw_decode_config){.max_seqs = 1};
  assert_int_equal(pw_decode_create(p, &c, &d, &err), PW_EINVAL);
  assert_null(d);
  pw_prog_free(p);
  pw_model_free(&m);
}

/* ---- sampler ---------------------------------------------------------- */

static pw_sampler sampler(double temp, int k, double p, uint64_t seed, int n) {
  pw_sampler s;
  pw_err err = {0};
  pw_sample_config c = {.temperature = temp, .top_k = k, .top_p = p, .seed = seed};
  assert_int_equal(pw_sampler_init(&s, n, &c, &err), 0);
  return s;
}

static void test_sampler_greedy(void **st) {
  (void)st;
  const float l[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  assert_int_equal(pw_argmax(l, 5), 1); /* the first of the tied maxima */
  pw_sampler g = sampler(0, 0, 1, 1, 5), k1 = sampler(1.5, 1, 1, 2, 5), p0 = sampler(1, 0, 1e-9, 3, 5);
  for (int i = 0; i < 50; i++) {
    assert_int_equal(pw_sampler_next(&g, l), 1);
    assert_int_equal(pw_sampler_next(&k1, l), 1); /* ties: the lower index sorts first */
    assert_int_equal(pw_sampler_next(&p0, l), 1);
  }
  pw_sampler_free(&g);
  pw_sampler_free(&k1);
  pw_sampler_free(&p0);
  pw_sampler bad;
  pw_err err = {0};
  pw_sample_config c = {.temperature = 1, .top_p = 0};
  assert_int_equal(pw_sampler_init(&bad, 5, &c, &err), PW_EINVAL);
  c = (pw_sample_config){.temperature = -1, .top_p = 1};
  assert_int_equal(pw_sampler_init(&bad, 5, &c, &err), PW_EINVAL);
}

static void test_sampler_seeded(void **st) {
  (void)st;
  float l[V];
  for (int i = 0; i < V; i++) l[i] = (float)sin(i);
  pw_sampler a = sampler(1, 0, 1, 42, V), b = sampler(1, 0, 1, 42, V), c = sampler(1, 0, 1, 43, V);
  int differ = 0;
  for (int i = 0; i < 200; i++) {
    int x = pw_sampler_next(&a, l);
    assert_int_equal(x, pw_sampler_next(&b, l));
    differ += x != pw_sampler_next(&c, l);
  }
  assert_true(differ > 50);
  /* reset (a served slot's sampler taken by the next request) draws as a fresh one */
  pw_err err = {0};
  assert_int_equal(pw_sampler_reset(&c, &(pw_sample_config){.temperature = 1, .top_p = 1, .seed = 42}, &err), 0);
  pw_sampler d = sampler(1, 0, 1, 42, V);
  for (int i = 0; i < 50; i++) assert_int_equal(pw_sampler_next(&c, l), pw_sampler_next(&d, l));
  assert_int_equal(pw_sampler_reset(&c, &(pw_sample_config){.temperature = 1, .top_p = 0}, &err), PW_EINVAL);
  pw_sampler_free(&a);
  pw_sampler_free(&b);
  pw_sampler_free(&c);
  pw_sampler_free(&d);
}

/* Frequencies of N draws against the renormalised probabilities. */
static void expect_freq(double temp, int k, double p, const double *want) {
  enum { N = 20000 };
  const float l[4] = {(float)log(0.4), (float)log(0.3), (float)log(0.2), (float)log(0.1)};
  pw_sampler s = sampler(temp, k, p, 5, 4);
  int count[4] = {0};
  for (int i = 0; i < N; i++) count[pw_sampler_next(&s, l)]++;
  for (int i = 0; i < 4; i++)
    if (fabs((double)count[i] / N - want[i]) > 0.015)
      fail_msg("temperature %g top_k %d top_p %g: token %d drawn %.4f of the time, expected %.4f", temp, k, p, i,
               (double)count[i] / N, want[i]);
  pw_sampler_free(&s);
}

static void test_sampler_distribution(void **st) {
  (void)st;
  expect_freq(1, 0, 1, (const double[]){0.4, 0.3, 0.2, 0.1});
  expect_freq(1, 2, 1, (const double[]){0.4 / 0.7, 0.3 / 0.7, 0, 0});
  expect_freq(1, 0, 0.75, (const double[]){0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0}); /* 0.7 < 0.75 <= 0.9 */
  expect_freq(1, 3, 0.5, (const double[]){0.4 / 0.7, 0.3 / 0.7, 0, 0});          /* of 0.9 kept: 0.4 < 0.45 */
  double z = 0.16 + 0.09 + 0.04 + 0.01; /* temperature 0.5 squares the probabilities */
  expect_freq(0.5, 0, 1, (const double[]){0.16 / z, 0.09 / z, 0.04 / z, 0.01 / z});
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpt_untied),         cmocka_unit_test(test_gpt_tied),
      cmocka_unit_test(test_llama_untied),       cmocka_unit_test(test_llama_tied),
      cmocka_unit_test(test_llama_options),
      cmocka_unit_test(test_gemma_options),
      cmocka_unit_test(test_moe),
      cmocka_unit_test(test_layers_list),        cmocka_unit_test(test_rope_at_offset),
      cmocka_unit_test(test_two_sequences),      cmocka_unit_test(test_stages_chain),
      cmocka_unit_test(test_greedy_equals_naive), cmocka_unit_test(test_bad_calls),
      cmocka_unit_test(test_sampler_greedy),     cmocka_unit_test(test_sampler_seeded),
      cmocka_unit_test(test_sampler_distribution), cmocka_unit_test(test_batch_mates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
