/* test_model: the model graph and stage programs, end to end.
 *
 * - every parameter tensor's gradient through the whole graph agrees with a
 *   central finite difference of the loss along a random direction (gpt,
 *   gpt tied, llama, mlp, a layers list);
 * - I then W equals a full B, bit for bit;
 * - the model cut into stage programs, with activations and gradients
 *   passed by hand between them, gives the single program's loss and
 *   gradients (the arithmetic a pipeline relies on);
 * - a recomputing (remat) stage program's losses, port gradients and
 *   parameter gradients equal the plain program's bit for bit, through B and
 *   through I then W with two W's pending (gpt, tied gpt, llama, mlp); it
 *   keeps only the ports per slot and holds no work buffer between actions;
 * - all of it again with the tiled attention (train.attention "tiled");
 * - shape inference and the errors of layers lists. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "model.h"
#include "optable.h"
#include "prog.h"
#include "rng.h"

static pw_model_spec gpt_spec(int tied) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_GPT;
  s.vocab_size = 23;
  s.seq_len = 6;
  s.d_model = 8;
  s.n_layers = 2;
  s.n_heads = 2;
  s.tie_embeddings = tied;
  s.init_std = 0.3f; /* large enough that every path carries gradient */
  return s;
}

static pw_model_spec llama_spec(void) {
  pw_model_spec s = gpt_spec(0);
  s.tmpl = PW_TEMPLATE_LLAMA;
  s.ffn_hidden = 12;
  return s;
}

/* llama's attention options: grouped-query (4 query heads over 2 kv
 * heads), Llama-3's rope scaling (every band within 6 positions), the qkv
 * bias, QK-norm. */
static pw_model_spec llama_opts_spec(void) {
  pw_model_spec s = llama_spec();
  s.n_heads = 4, s.n_kv_heads = 2, s.qkv_bias = 1, s.qk_norm = 1, s.rope_base = 100.0f;
  s.rope_scaling = 1, s.rope_factor = 4, s.rope_low_freq_factor = 1, s.rope_high_freq_factor = 2;
  s.rope_orig_max_pos = 4;
  return s;
}

/* Heads of a width of their own (6 over d_model 8 / 4 heads = 2) with
 * QK-norm and grouped-query heads, and a sliding window of 3 of the 6
 * positions (model.head_dim, model.sliding_window). */
static pw_model_spec head_dim_spec(void) {
  pw_model_spec s = llama_opts_spec();
  s.head_dim = 6, s.sliding_window = 3;
  return s;
}

/* Gemma's options: a GeGLU MLP (tanh GELU), embeddings times sqrt(d),
 * RMSNorms scaled by 1 + w, tied, multi-query (Gemma-2B's shape). */
static pw_model_spec gemma_spec(void) {
  pw_model_spec s = llama_spec();
  s.tie_embeddings = 1, s.n_kv_heads = 1, s.mlp_act = PW_MLP_ACT_GELU_TANH, s.embed_scale = 1, s.norm_offset = 1;
  return s;
}

/* Mixtures of experts (model.moe): llama's SwiGLU experts under softmax
 * top-2 gates; gpt's GELU experts under DeepSeek's sigmoid gates (a routed
 * scale), a shared expert of its own width behind Qwen2-MoE's sigmoid gate,
 * only the second block a mixture. */
static pw_model_spec moe_llama_spec(void) {
  pw_model_spec s = llama_spec();
  s.moe_experts = 3, s.moe_top_k = 2, s.moe_hidden = 6, s.moe_every = 1, s.moe_routed_scale = 1.0f;
  return s;
}

static pw_model_spec moe_gpt_spec(void) {
  pw_model_spec s = gpt_spec(0);
  s.moe_experts = 4, s.moe_top_k = 2, s.moe_hidden = 5, s.moe_gate = PW_MOE_GATE_SIGMOID, s.moe_routed_scale = 2.0f;
  s.moe_shared = 1, s.moe_every = 1, s.moe_first_dense = 1, s.moe_shared_hidden = 7, s.moe_shared_gate = 1;
  return s;
}

static pw_model_spec mlp_spec(void) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_MLP;
  s.in_dim = 5;
  s.hidden_dim = 7;
  s.out_dim = 3;
  s.n_layers = 2;
  s.activation = PW_ACT_GELU;
  s.loss = PW_LOSS_MSE;
  return s;
}

/* train.attention for the models the checks below build (the tiled
 * variants of the checks set it). */
static int attn_impl = PW_ATTN_AUTO;

static void build(pw_model_spec *spec, pw_model *m) {
  pw_err err = {0};
  if (pw_model_build(spec, m, &err)) fail_msg("%s: %s", err.path, err.msg);
  pw_model_set_attention(m, attn_impl);
}

/* Random inputs and targets for microbatch `mb` into slot `slot`. */
static void fill_data(pw_prog *p, const pw_model *m, int slot, int b, int mb) {
  pw_rng r, rt;
  pw_rng_seed(&r, 1000 + 2 * (uint64_t)mb);
  pw_rng_seed(&rt, 1001 + 2 * (uint64_t)mb);
  void *in = pw_prog_value(p, slot, m->input_value);
  void *tg = pw_prog_value(p, slot, m->target_value);
  const pw_value *iv = &m->values[m->input_value], *tv = &m->values[m->target_value];
  size_t ni = (size_t)b * iv->rows * iv->width, nt = (size_t)b * tv->rows * tv->width;
  int V = m->data.tokens ? m->data.vocab_size : m->data.out_dim;
  if (in) {
    for (size_t i = 0; i < ni; i++) {
      if (iv->dtype == PW_DT_I32)
        ((int32_t *)in)[i] = (int32_t)pw_rng_below(&r, (uint64_t)V);
      else
        ((float *)in)[i] = (float)pw_rng_normal(&r);
    }
  }
  if (tg) {
    for (size_t i = 0; i < nt; i++) {
      if (tv->dtype == PW_DT_I32)
        ((int32_t *)tg)[i] = (int32_t)pw_rng_below(&rt, (uint64_t)V);
      else
        ((float *)tg)[i] = (float)pw_rng_normal(&rt);
    }
  }
}

static double loss_of(pw_prog *p, const pw_model *m, int b, int n_mb) {
  double s = 0;
  for (int j = 0; j < n_mb; j++) {
    float l;
    fill_data(p, m, 0, b, j);
    assert_int_equal(pw_prog_forward(p, 0, &l, NULL), 0);
    s += l;
  }
  return s;
}

static void gradcheck(pw_model_spec spec) {
  pw_model m;
  pw_err err = {0};
  build(&spec, &m);
  const int b = 2, n_mb = 2;
  pw_prog *p;
  pw_prog_config cfg = {0, m.n_layers, b, b * n_mb, 1, 0, 0, 0, 0, 0, 0, NULL, 0};
  assert_int_equal(pw_prog_create(&m, &cfg, &p, &err), 0);
  pw_prog_init_params(p, 42);
  for (int i = 0; i < pw_prog_n_params(p); i++) { /* LoRA's B starts at 0: A's gradient would be 0 too */
    pw_prog_param *pp = pw_prog_param_at(p, i);
    pw_rng rb;
    pw_rng_seed(&rb, (uint64_t)i);
    if (strstr(pp->meta->name, ".lora_B.") || /* and Gemma's norm weights: off 0, the offset shows */
        (strstr(pp->meta->name, "norm") && pp->meta->init == PW_INIT_ZEROS))
      for (size_t k = 0; k < pp->meta->numel; k++) pp->data[k] = (float)(0.3 * pw_rng_normal(&rb));
  }
  pw_prog_zero_grad(p);
  for (int j = 0; j < n_mb; j++) {
    float l;
    fill_data(p, &m, 0, b, j);
    assert_int_equal(pw_prog_forward(p, 0, &l, NULL), 0);
    assert_int_equal(pw_prog_backward(p, 0, NULL), 0);
  }
  pw_prog_grads_finalize(p); /* a tied parameter's two uses */
  pw_rng r;
  pw_rng_seed(&r, 7);
  for (int i = 0; i < pw_prog_n_params(p); i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    size_t n = pp->meta->numel;
    float *dir = malloc(n * sizeof(float)), *saved = malloc(n * sizeof(float));
    memcpy(saved, pp->data, n * sizeof(float));
    double gd = 0, dn = 0;
    for (size_t k = 0; k < n; k++) {
      dir[k] = (float)pw_rng_normal(&r);
      gd += (double)dir[k] * pp->grad[k];
      dn += (double)dir[k] * dir[k];
    }
    double eps = 1e-2 / sqrt(dn);
    for (size_t k = 0; k < n; k++) pp->data[k] = saved[k] + (float)(eps * dir[k]);
    double lp = loss_of(p, &m, b, n_mb);
    for (size_t k = 0; k < n; k++) pp->data[k] = saved[k] - (float)(eps * dir[k]);
    double lm = loss_of(p, &m, b, n_mb);
    memcpy(pp->data, saved, n * sizeof(float));
    double fd = (lp - lm) / (2 * eps);
    double tol = 2e-2 * fabs(fd) + 2e-3;
    if (fabs(fd - gd) > tol)
      fail_msg("%s: directional derivative %.6g (finite difference) vs %.6g (backward)", pp->meta->name, fd, gd);
    /* The tolerance is tight enough that a gradient off by 5% fails. */
    if (fabs(fd) > 0.1) assert_true(fabs(fd - 1.05 * gd) > tol);
    free(dir);
    free(saved);
  }
  pw_prog_free(p);
  pw_model_free(&m);
}

static void test_gradcheck_gpt(void **st) { gradcheck(gpt_spec(0)); }
static void test_gradcheck_gpt_tied(void **st) { gradcheck(gpt_spec(1)); }
static void test_gradcheck_llama(void **st) { gradcheck(llama_spec()); }
static void test_gradcheck_mlp(void **st) { gradcheck(mlp_spec()); }
static void test_gradcheck_llama_opts(void **st) {
  gradcheck(llama_opts_spec());
  pw_model_spec s = llama_opts_spec();
  s.n_kv_heads = 1; /* multi-query */
  gradcheck(s);
  gradcheck(head_dim_spec());
}

/* The norms' weights start at 0 (scale 1 + w = 1); gradcheck moves them
 * off it, so the offset and the weight are told apart. */
static void test_gradcheck_gemma(void **st) {
  gradcheck(gemma_spec());
  pw_model_spec s = gemma_spec();
  s.tie_embeddings = 0, s.n_kv_heads = 0, s.norm_offset = 0; /* each option alone too */
  gradcheck(s);
  s = llama_spec();
  s.norm_offset = 1;
  gradcheck(s);
  s = llama_spec();
  s.embed_scale = 1;
  gradcheck(s);
}

/* model.lora on gpt and llama (the adapter's node after each targeted
 * linear, its A and B checked like every parameter) and the errors. */
static pw_model_spec with_lora(pw_model_spec s, const char *const *targets, int n) {
  s.lora_rank = 2, s.lora_alpha = 3;
  s.n_lora_targets = n;
  for (int i = 0; i < n; i++) snprintf(s.lora_targets[i], PW_LORA_TARGET_LEN, "%s", targets[i]);
  return s;
}
static void test_gradcheck_lora(void **st) {
  static const char *const gpt[] = {"blocks.*.attn.qkv", "blocks.1.mlp.fc", "lm_head"};
  static const char *const llama[] = {"blocks.*.attn.*", "blocks.0.mlp.up"};
  gradcheck(with_lora(gpt_spec(0), gpt, 3));
  gradcheck(with_lora(llama_spec(), llama, 2));
  gradcheck(with_lora(head_dim_spec(), llama, 2)); /* the adapters shaped by head_dim */
  pw_model m;
  pw_err err = {0};
  pw_model_spec s = with_lora(gpt_spec(0), gpt, 3);
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  int na = 0, nb = 0, nl = 0;
  for (int i = 0; i < m.n_params; i++) {
    const pw_param *p = &m.params[i];
    if (!pw_param_is_adapter(p)) continue;
    if (strstr(p->name, "lora_A")) na++, assert_int_equal(p->init, PW_INIT_UNIFORM);
    else nb++, assert_int_equal(p->init, PW_INIT_ZEROS);
  }
  for (int i = 0; i < m.n_nodes; i++)
    if (m.nodes[i].op == PW_OP_LORA) {
      nl++;
      assert_int_equal(m.nodes[i].NH, 2);
      assert_true(m.nodes[i].base == 1.5f);
      assert_int_equal(m.nodes[i - 1].op, PW_OP_LINEAR);
      assert_int_equal(m.nodes[i].in[1], m.nodes[i - 1].out);
    }
  assert_true(na == 4 && nb == 4 && nl == 4); /* qkv x 2, fc of block 1, lm_head */
  assert_int_equal(m.params[m.nodes[m.n_nodes - 2].w].shape[0], 2); /* lm_head's A: [r, d] */
  /* with no train.trainable only the adapters train */
  pw_train_spec tr = {0};
  assert_int_equal(pw_model_set_trainable(&m, &tr, &err), 0);
  for (int i = 0; i < m.n_params; i++) assert_int_equal(m.params[i].frozen, !pw_param_is_adapter(&m.params[i]));
  pw_model_free(&m);
  static const char *const typo[] = {"blocks.*.attn.qkv", "blocks.*.mlp.fcc"};
  s = with_lora(gpt_spec(0), typo, 2);
  assert_int_equal(pw_model_build(&s, &m, &err), PW_ESPEC);
  assert_string_equal(err.path, "model.lora.targets[1]");
  assert_non_null(strstr(err.msg, "'blocks.*.mlp.fcc' matches no linear layer"));
}
static void test_gradcheck_mlp_xent(void **st) {
  pw_model_spec s = mlp_spec();
  s.loss = PW_LOSS_CROSS_ENTROPY;
  s.activation = PW_ACT_SILU;
  gradcheck(s);
}

/* I then W must equal a full B exactly: the same kernels, the same sums. */
static void test_split_backward_equals_full(void **st) {
  pw_model_spec spec = llama_spec();
  pw_model m;
  pw_err err = {0};
  build(&spec, &m);
  pw_prog_config cfg = {0, m.n_layers, 2, 4, 1, 0, 0, 0, 0, 0, 0, NULL, 0};
  pw_prog *a, *b;
  assert_int_equal(pw_prog_create(&m, &cfg, &a, &err), 0);
  assert_int_equal(pw_prog_create(&m, &cfg, &b, &err), 0);
  pw_prog_init_params(a, 3);
  pw_prog_init_params(b, 3);
  pw_prog_zero_grad(a);
  pw_prog_zero_grad(b);
  for (int j = 0; j < 2; j++) {
    fill_data(a, &m, 0, 2, j);
    fill_data(b, &m, 0, 2, j);
    assert_int_equal(pw_prog_forward(a, 0, NULL, NULL), 0);
    assert_int_equal(pw_prog_forward(b, 0, NULL, NULL), 0);
    assert_int_equal(pw_prog_backward(a, 0, NULL), 0);
    assert_int_equal(pw_prog_backward_input(b, 0, NULL), 0);
    assert_int_equal(pw_prog_backward_weight(b, 0, NULL), 0);
  }
  assert_memory_equal(pw_prog_grads(a), pw_prog_grads(b), pw_prog_numel(a) * sizeof(float));
  pw_prog_free(a);
  pw_prog_free(b);
  pw_model_free(&m);
}

/* Cut the model into stages and move activations/gradients between them by
 * hand: the loss and every parameter gradient equal the single program's. */
static void staged_equals_whole(pw_model_spec spec, const int *cuts, int n_stages) {
  pw_model m;
  pw_err err = {0};
  build(&spec, &m);
  const int b = 2, n_mb = 3;
  pw_prog_config whole_cfg = {0, m.n_layers, b, b * n_mb, 1, 0, 0, 0, 0, 0, 0, NULL, 0};
  pw_prog *whole, *stage[8];
  assert_int_equal(pw_prog_create(&m, &whole_cfg, &whole, &err), 0);
  pw_prog_init_params(whole, 11);
  pw_prog_zero_grad(whole);
  for (int s = 0; s < n_stages; s++) {
    pw_prog_config c = {cuts[s], cuts[s + 1], b, b * n_mb, n_mb, 0, 0, 0, 0, 0, 0, NULL, 0};
    assert_int_equal(pw_prog_create(&m, &c, &stage[s], &err), 0);
    pw_prog_init_params(stage[s], 11);
    pw_prog_zero_grad(stage[s]);
  }
  double lw = 0, ls = 0;
  for (int j = 0; j < n_mb; j++) {
    float l;
    fill_data(whole, &m, 0, b, j);
    assert_int_equal(pw_prog_forward(whole, 0, &l, NULL), 0);
    assert_int_equal(pw_prog_backward(whole, 0, NULL), 0);
    lw += l;
  }
  pw_prog_grads_finalize(whole);
  /* GPipe order by hand: all forwards, then all backwards. */
  for (int j = 0; j < n_mb; j++)
    for (int s = 0; s < n_stages; s++) {
      fill_data(stage[s], &m, j, b, j); /* only the ports this stage has are filled */
      for (int k = 0; k < pw_prog_n_inputs(stage[s]); k++) {
        const pw_prog_port *pt = pw_prog_input(stage[s], k);
        if (pt->role != PW_VAL_ACT) continue;
        void *src = NULL;
        for (int q = 0; q < s && !src; q++) src = pw_prog_value(stage[q], j, pt->value);
        assert_non_null(src);
        memcpy(pw_prog_value(stage[s], j, pt->value), src, pt->bytes);
      }
      float l;
      assert_int_equal(pw_prog_forward(stage[s], j, &l, NULL), 0);
      ls += l;
    }
  for (int j = n_mb - 1; j >= 0; j--)
    for (int s = n_stages - 1; s >= 0; s--) {
      for (int k = 0; k < pw_prog_n_outputs(stage[s]); k++) {
        const pw_prog_port *pt = pw_prog_output(stage[s], k);
        float *dst = pw_prog_grad(stage[s], j, pt->value);
        memset(dst, 0, pt->bytes);
        for (int q = s + 1; q < n_stages; q++) {
          float *g = pw_prog_grad(stage[q], j, pt->value);
          if (g)
            for (size_t e = 0; e < pt->bytes / 4; e++) dst[e] += g[e];
        }
      }
      if (j % 2) {
        assert_int_equal(pw_prog_backward(stage[s], j, NULL), 0);
      } else {
        assert_int_equal(pw_prog_backward_input(stage[s], j, NULL), 0);
        assert_int_equal(pw_prog_backward_weight(stage[s], j, NULL), 0);
      }
    }
  assert_true(fabs(lw - ls) <= 1e-6 * fabs(lw));
  /* every parameter of every stage equals the whole program's gradient
   * (a tied parameter: the sum over the stages holding it) */
  for (int i = 0; i < pw_prog_n_params(whole); i++) {
    pw_prog_param *wp = pw_prog_param_at(whole, i);
    size_t n = wp->meta->numel;
    double *sum = calloc(n, sizeof(double));
    int holders = 0;
    for (int s = 0; s < n_stages; s++)
      for (int k = 0; k < pw_prog_n_params(stage[s]); k++) {
        pw_prog_param *sp = pw_prog_param_at(stage[s], k);
        if (sp->model_index != wp->model_index) continue;
        holders++;
        assert_memory_equal(sp->data, wp->data, n * sizeof(float));
        for (size_t e = 0; e < n; e++) sum[e] += sp->grad[e];
      }
    assert_true(holders >= 1);
    for (size_t e = 0; e < n; e++)
      if (fabs(sum[e] - wp->grad[e]) > 1e-5 * (fabs(wp->grad[e]) + 1e-3))
        fail_msg("%s[%zu]: staged %.9g vs whole %.9g", wp->meta->name, e, sum[e], wp->grad[e]);
    free(sum);
  }
  for (int s = 0; s < n_stages; s++) pw_prog_free(stage[s]);
  pw_prog_free(whole);
  pw_model_free(&m);
}

static void test_staged_gpt(void **st) {
  int cuts[] = {0, 2, 3, 4}; /* embed+block0 | block1 | head */
  staged_equals_whole(gpt_spec(0), cuts, 3);
}
static void test_staged_gpt_tied(void **st) {
  int cuts[] = {0, 2, 4};
  staged_equals_whole(gpt_spec(1), cuts, 2);
}
static void test_staged_llama(void **st) {
  int cuts[] = {0, 1, 2, 3, 4};
  staged_equals_whole(llama_spec(), cuts, 4);
}
static void test_staged_llama_opts(void **st) {
  int cuts[] = {0, 2, 4};
  staged_equals_whole(llama_opts_spec(), cuts, 2);
}
static void test_staged_gemma(void **st) {
  int cuts[] = {0, 1, 3, 4}; /* embed (its scale) | blocks | head (a tied lm_head) */
  staged_equals_whole(gemma_spec(), cuts, 3);
}
static void test_gradcheck_moe(void **st) {
  (void)st;
  gradcheck(moe_llama_spec());
  gradcheck(moe_gpt_spec());
}
static void test_staged_moe(void **st) {
  (void)st;
  int c4[] = {0, 1, 2, 3, 4}, c2[] = {0, 2, 4};
  staged_equals_whole(moe_llama_spec(), c4, 4);
  staged_equals_whole(moe_gpt_spec(), c2, 2);
}
static void test_staged_mlp(void **st) {
  int cuts[] = {0, 1, 3};
  staged_equals_whole(mlp_spec(), cuts, 2);
}

/* ---- recomputation (partition.remat) ---------------------------------- */

#define NMB 4
#define MAXS 4

typedef struct {
  pw_prog *st[MAXS];
  float loss[NMB];
} pipe;

/* The model cut at cuts[], stage s recomputing when bit s of remat is set;
 * NMB microbatches forward, then backward in the order below: microbatch
 * 3 by B, 2 and 1 by I then I (two W's pending), their W's, 0 by B.
 * Activations and gradients are handed between stages by hand; `peek`
 * receives, per (stage, microbatch), the stage's input-port gradients. */
static void run_pipe(const pw_model *m, const int *cuts, int n, unsigned remat, pipe *P, float **peek) {
  const int b = 2;
  for (int s = 0; s < n; s++) {
    pw_prog_config c = {.layer_lo = cuts[s], .layer_hi = cuts[s + 1], .mb_size = b, .batch_size = b * NMB,
                        .n_slots = NMB, .remat = (int)(remat >> s & 1)};
    assert_int_equal(pw_prog_create(m, &c, &P->st[s], NULL), 0);
    pw_prog_init_params(P->st[s], 7);
    pw_prog_zero_grad(P->st[s]);
  }
  for (int j = 0; j < NMB; j++) {
    P->loss[j] = 0;
    for (int s = 0; s < n; s++) {
      fill_data(P->st[s], m, j, b, j);
      for (int k = 0; k < pw_prog_n_inputs(P->st[s]); k++) {
        const pw_prog_port *pt = pw_prog_input(P->st[s], k);
        if (pt->role != PW_VAL_ACT) continue;
        void *src = NULL;
        for (int q = 0; q < s && !src; q++) src = pw_prog_value(P->st[q], j, pt->value);
        assert_non_null(src);
        memcpy(pw_prog_value(P->st[s], j, pt->value), src, pt->bytes);
      }
      float l = 0;
      assert_int_equal(pw_prog_forward(P->st[s], j, &l, NULL), 0);
      P->loss[j] += l;
      if (remat >> s & 1) assert_int_equal(pw_prog_n_work(P->st[s]), 1); /* F gave its buffer back */
    }
  }
  static const int order[][2] = {{3, 'B'}, {2, 'I'}, {1, 'I'}, {2, 'W'}, {1, 'W'}, {0, 'B'}};
  for (int s = n - 1; s >= 0; s--)
    for (size_t o = 0; o < sizeof order / sizeof order[0]; o++) {
      int j = order[o][0], kind = order[o][1];
      pw_prog *p = P->st[s];
      if (kind != 'W')
        for (int k = 0; k < pw_prog_n_outputs(p); k++) { /* the later stages' input gradients, summed */
          const pw_prog_port *pt = pw_prog_output(p, k);
          float *dst = pw_prog_grad(p, j, pt->value);
          memset(dst, 0, pt->bytes);
          for (int q = s + 1; q < n; q++) {
            float *g = pw_prog_grad(P->st[q], j, pt->value);
            for (size_t e = 0; g && e < pt->bytes / 4; e++) dst[e] += g[e];
          }
        }
      int rc = kind == 'B' ? pw_prog_backward(p, j, NULL) : kind == 'I' ? pw_prog_backward_input(p, j, NULL)
                                                                  : pw_prog_backward_weight(p, j, NULL);
      assert_int_equal(rc, 0);
      if (kind == 'W') continue;
      size_t off = 0;
      for (int k = 0; k < pw_prog_n_inputs(p); k++) {
        const pw_prog_port *pt = pw_prog_input(p, k);
        if (pt->role != PW_VAL_ACT) continue;
        memcpy((char *)peek[s * NMB + j] + off, pw_prog_grad(p, j, pt->value), pt->bytes);
        off += pt->bytes;
      }
    }
}

static void free_pipe(pipe *P, int n) {
  for (int s = 0; s < n; s++) pw_prog_free(P->st[s]);
}

static void remat_equals_plain(pw_model_spec spec, const int *cuts, int n) {
  pw_model m;
  build(&spec, &m);
  float *peek[2][MAXS * NMB];
  for (int v = 0; v < 2; v++)
    for (int i = 0; i < MAXS * NMB; i++) peek[v][i] = calloc(1 << 16, 1);
  unsigned masks[] = {(1u << n) - 1, 1u, 2u};
  for (size_t mi = 0; mi < sizeof masks / sizeof masks[0]; mi++) {
    pipe A, R;
    run_pipe(&m, cuts, n, 0, &A, peek[0]);
    run_pipe(&m, cuts, n, masks[mi], &R, peek[1]);
    assert_memory_equal(A.loss, R.loss, sizeof A.loss);
    for (int s = 0; s < n; s++) {
      pw_prog *a = A.st[s], *r = R.st[s];
      assert_int_equal(pw_prog_grad_numel(a), pw_prog_grad_numel(r));
      assert_memory_equal(pw_prog_grads(a), pw_prog_grads(r), pw_prog_grad_numel(a) * sizeof(float));
      for (int j = 0; j < NMB; j++) assert_memory_equal(peek[0][s * NMB + j], peek[1][s * NMB + j], 1 << 16);
      if (!(masks[mi] >> s & 1)) continue;
      /* the slot is the ports; the rest lives in work buffers, two at most
       * (2 and 1 between their I and W) and none held now */
      pw_prog_layout L;
      assert_int_equal(pw_prog_layout_build(&m, cuts[s], cuts[s + 1], 2, &L), 0);
      assert_int_equal(pw_prog_slot_bytes(r), L.sz.keep_floats * sizeof(float));
      assert_int_equal(pw_prog_work_bytes(r), (L.sz.slot_floats - L.sz.keep_floats) * sizeof(float));
      assert_true(pw_prog_slot_bytes(r) <= pw_prog_slot_bytes(a)); /* an embedding alone: its slot is its ports */
      assert_int_equal(pw_prog_n_work(r), 2);
      int inner = -1; /* a node output that is no port */
      for (int i = L.node_lo; i < L.node_hi && inner < 0; i++)
        if (L.val_off[m.nodes[i].out] >= L.sz.keep_floats) inner = m.nodes[i].out;
      if (inner >= 0) { /* (an embedding alone has none) */
        assert_null(pw_prog_value(r, 0, inner));
        assert_non_null(pw_prog_value(a, 0, inner));
      }
      pw_err we = {0};
      assert_int_equal(pw_prog_backward_weight(r, 0, &we), PW_EINVAL); /* no I before it */
      assert_non_null(strstr(we.msg, "backward_weight of slot 0 before its backward_input"));
      pw_prog_layout_free(&L);
    }
    free_pipe(&A, n);
    free_pipe(&R, n);
  }
  for (int v = 0; v < 2; v++)
    for (int i = 0; i < MAXS * NMB; i++) free(peek[v][i]);
  pw_model_free(&m);
}

static void test_remat_gpt(void **st) {
  (void)st;
  int cuts[] = {0, 2, 3, 4}; /* embed+block0 | block1 | head */
  remat_equals_plain(gpt_spec(0), cuts, 3);
}
static void test_remat_gpt_tied(void **st) {
  (void)st;
  int cuts[] = {0, 2, 4};
  remat_equals_plain(gpt_spec(1), cuts, 2);
}
static void test_remat_llama(void **st) {
  (void)st;
  int cuts[] = {0, 1, 2, 3, 4};
  remat_equals_plain(llama_spec(), cuts, 4);
}
static void test_remat_moe(void **st) {
  (void)st;
  int cuts[] = {0, 2, 4};
  remat_equals_plain(moe_gpt_spec(), cuts, 2);
}
static void test_remat_mlp(void **st) {
  (void)st;
  int cuts[] = {0, 1, 3};
  remat_equals_plain(mlp_spec(), cuts, 2);
}

/* The same checks with the tiled attention (ops_flash.c): gradients,
 * I then W = B bit for bit, stages = the whole program, remat = plain. */
static void test_tiled(void **st) {
  (void)st;
  int c3[] = {0, 2, 3, 4}, c4[] = {0, 1, 2, 3, 4}, c2[] = {0, 2, 4};
  attn_impl = PW_ATTN_TILED;
  gradcheck(gpt_spec(0));
  gradcheck(llama_spec());
  gradcheck(head_dim_spec());
  test_split_backward_equals_full(st);
  staged_equals_whole(gpt_spec(0), c3, 3);
  staged_equals_whole(llama_spec(), c4, 4);
  remat_equals_plain(gpt_spec(1), c2, 2);
  remat_equals_plain(llama_spec(), c4, 4);
  attn_impl = PW_ATTN_AUTO;
}

static void test_shapes_and_counts(void **st) {
  pw_model_spec s = gpt_spec(0);
  s.vocab_size = 256;
  s.seq_len = 64;
  s.d_model = 64;
  s.n_layers = 4;
  s.n_heads = 4;
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  assert_int_equal(m.n_layers, 6); /* embed, 4 blocks, head */
  size_t d = 64, V = 256, T = 64;
  size_t block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d);
  size_t want = V * d + T * d + 4 * block + 2 * d + V * d;
  assert_int_equal(pw_model_param_count(&m), want);
  assert_int_equal(m.layers[1].params, block);
  assert_true(m.layers[1].is_block && !m.layers[0].is_block && !m.layers[5].is_loss);
  /* forward FLOPs of a block: 2*T*(3d^2 + d^2 + 8d^2) matmuls + attention 4*T^2*d */
  double mm = 2.0 * T * (12.0 * d * d);
  assert_true(m.layers[1].flops_f >= mm + 4.0 * T * T * d);
  assert_true(m.layers[1].flops_w >= mm && m.layers[1].flops_w < 1.01 * mm); /* + norm weights */
  assert_int_equal(m.layers[0].out_bytes, T * d * 4);
  /* the head's lm_head is [V, d] and the qkv rows are [3d, d] */
  int found = 0;
  for (int i = 0; i < m.n_params; i++) {
    if (!strcmp(m.params[i].name, "lm_head.weight"))
      found += m.params[i].shape[0] == 256 && m.params[i].shape[1] == 64;
    if (!strcmp(m.params[i].name, "blocks.3.attn.qkv.weight"))
      found += m.params[i].shape[0] == 192 && m.params[i].shape[1] == 64;
  }
  assert_int_equal(found, 2);
  pw_model_free(&m);
  s.tie_embeddings = 1;
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  assert_int_equal(pw_model_param_count(&m), want - V * d);
  pw_model_free(&m);
}

/* Grouped-query: the qkv projection is C + 2 n_kv_heads HD wide (its
 * bias too), the FLOPs and the KV cache count the narrower k and v. */
static void test_shapes_gqa(void **st) {
  pw_model_spec s = llama_spec();
  s.seq_len = 64, s.d_model = 64, s.n_heads = 8, s.n_kv_heads = 2, s.qkv_bias = 1;
  pw_model m, mha;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  s.n_kv_heads = 0;
  assert_int_equal(pw_model_build(&s, &mha, &err), 0);
  size_t d = 64, W = 64 + 2 * 2 * 8, T = 64;
  int found = 0;
  for (int i = 0; i < m.n_params; i++) {
    if (!strcmp(m.params[i].name, "blocks.0.attn.qkv.weight"))
      found += m.params[i].shape[0] == (int)W && m.params[i].shape[1] == (int)d;
    if (!strcmp(m.params[i].name, "blocks.0.attn.qkv.bias")) found += m.params[i].shape[0] == (int)W;
  }
  assert_int_equal(found, 2);
  assert_int_equal(pw_model_param_count(&mha) - pw_model_param_count(&m), 2 * ((3 * d - W) * d + 3 * d - W));
  /* the qkv linear's 2 T d (3d - W) FLOPs each way fewer; attention's the same */
  double dw = 2.0 * T * d * (double)(3 * d - W);
  assert_true(fabs(mha.layers[1].flops_f - m.layers[1].flops_f - dw) < 1e-6 * dw + 10 * T * (double)(3 * d - W));
  assert_true(fabs(mha.layers[1].flops_w - m.layers[1].flops_w - dw) < 1e-6 * dw + 10 * T * (double)(3 * d - W));
  for (int i = 0; i < m.n_nodes; i++) {
    const pw_node *n = &m.nodes[i];
    if (n->op == PW_OP_ROPE) assert_true(n->C == (int)W && n->NH == 8 && n->NKV == 2);
    if (n->op == PW_OP_ATTENTION || n->op == PW_OP_ATTENTION_TILED) {
      assert_true(n->C == (int)W && n->OC == (int)d && n->NKV == 2);
      assert_int_equal(pw_op_decode_kv(n), 2 * 2 * 8); /* K and V of 2 heads of 8 a position */
    }
  }
  pw_model_free(&m);
  pw_model_free(&mha);
}

/* model.head_dim and model.sliding_window in the graph: qkv (NH + 2 NKV)
 * HD rows, attention NH HD wide with the nodes' HD and window, attn.proj
 * back to d_model, the norms' weights HD; attention's FLOPs and the KV
 * cache follow HD. A backend other than the host's refuses them by name. */
static void test_shapes_head_dim(void **st) {
  pw_model_spec s = llama_spec();
  s.seq_len = 16, s.d_model = 32, s.n_heads = 4, s.n_kv_heads = 2, s.qk_norm = 1;
  s.head_dim = 12, s.sliding_window = 5;
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  int d = 32, HD = 12, Q = 4 * HD, W = Q + 2 * 2 * HD, T = 16, found = 0;
  for (int i = 0; i < m.n_params; i++) {
    const pw_param *p = &m.params[i];
    if (!strcmp(p->name, "blocks.0.attn.qkv.weight")) found += p->shape[0] == W && p->shape[1] == d;
    if (!strcmp(p->name, "blocks.0.attn.proj.weight")) found += p->shape[0] == d && p->shape[1] == Q;
    if (!strcmp(p->name, "blocks.0.attn.q_norm.weight")) found += p->shape[0] == HD;
  }
  assert_int_equal(found, 3);
  for (int i = 0; i < m.n_nodes; i++) {
    const pw_node *n = &m.nodes[i];
    if (n->op == PW_OP_ROPE || n->op == PW_OP_QKNORM) assert_true(n->C == W && n->OC == W && n->HD == HD);
    if (n->op == PW_OP_ATTENTION || n->op == PW_OP_ATTENTION_TILED) {
      assert_true(n->C == W && n->OC == Q && n->HD == HD && n->window == 5 && n->NKV == 2);
      assert_int_equal(pw_op_decode_kv(n), 2 * 2 * HD);
      double fl[3];
      pw_op_flops(n, &m.values[n->in[0]], fl);
      assert_true(fl[0] == 4.0 * T * T * Q);
    }
  }
  /* a backend whose memory is not the host's: the CPU's, marked so */
  pw_backend dev = *pw_backend_cpu();
  dev.host = 0, dev.name = "dev";
  pw_prog_config cfg = {0};
  cfg.layer_lo = 0, cfg.layer_hi = m.n_layers, cfg.mb_size = 1, cfg.batch_size = 1, cfg.n_slots = 1;
  cfg.backend = &dev;
  pw_prog *p = NULL;
  assert_int_equal(pw_prog_create(&m, &cfg, &p, &err), PW_ENOTSUP);
  assert_non_null(strstr(err.msg, "model.head_dim"));
  assert_non_null(strstr(err.msg, "does not run on dev"));
  pw_model_free(&m);
  s.head_dim = 0;
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  assert_int_equal(pw_prog_create(&m, &cfg, &p, &err), PW_ENOTSUP);
  assert_non_null(strstr(err.msg, "model.sliding_window"));
  pw_model_free(&m);
}

/* Gemma's options in the graph: the scale node after the embedding
 * (factor sqrt(d) as a float), every RMSNorm an rmsnorm_offset of 1 with
 * weights initialised 0, a geglu for the swiglu; the parameters, FLOPs and
 * activation bytes those of llama's (the scale adds its output, T d floats,
 * and d T FLOPs each way). */
static void test_shapes_gemma(void **st) {
  pw_model_spec s = llama_spec();
  s.seq_len = 16, s.d_model = 32, s.n_heads = 4, s.ffn_hidden = 64, s.tie_embeddings = 1;
  pw_model m, g;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  s.mlp_act = PW_MLP_ACT_GELU_TANH, s.embed_scale = 1, s.norm_offset = 1;
  assert_int_equal(pw_model_build(&s, &g, &err), 0);
  assert_int_equal(pw_model_param_count(&g), pw_model_param_count(&m));
  assert_int_equal(g.n_nodes, m.n_nodes + 1);
  int counts[PW_OP__COUNT] = {0};
  for (int i = 0; i < g.n_nodes; i++) {
    const pw_node *n = &g.nodes[i];
    counts[n->op]++;
    if (n->op == PW_OP_SCALE) {
      assert_int_equal(n->layer, 0);
      assert_true(n->base == (float)sqrt(32.0) && n->in[0] == g.nodes[0].out);
    }
    if (n->op == PW_OP_RMSNORM_OFFSET) {
      assert_true(n->base == 1.0f);
      assert_int_equal(g.params[n->w].init, PW_INIT_ZEROS);
    }
  }
  assert_int_equal(counts[PW_OP_SCALE], 1);
  assert_int_equal(counts[PW_OP_RMSNORM_OFFSET], 2 * 2 + 1);
  assert_int_equal(counts[PW_OP_RMSNORM] + counts[PW_OP_SWIGLU], 0);
  assert_int_equal(counts[PW_OP_GEGLU], 2);
  double T = 16, d = 32;
  assert_true(g.layers[0].flops_f == m.layers[0].flops_f + T * d && g.layers[0].flops_i == T * d);
  assert_true(g.layers[0].act_bytes == m.layers[0].act_bytes + (size_t)(T * d * 4));
  for (int l = 1; l < g.n_layers; l++) {
    assert_true(g.layers[l].flops_f == m.layers[l].flops_f && g.layers[l].flops_i == m.layers[l].flops_i &&
                g.layers[l].flops_w == m.layers[l].flops_w);
    assert_int_equal(g.layers[l].act_bytes, m.layers[l].act_bytes);
  }
  pw_model_free(&m);
  pw_model_free(&g);
}

static void test_layers_list(void **st) {
  pw_layer_spec L[] = {
      {.type = PW_LAYER_LINEAR, .out = 16, .bias = 1},
      {.type = PW_LAYER_RELU},
      {.type = PW_LAYER_STAGE_BOUNDARY},
      {.type = PW_LAYER_LINEAR, .out = 4, .bias = 1}, /* in inferred: 16 */
      {.type = PW_LAYER_MSE},
  };
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_LAYERS;
  s.input = PW_INPUT_FEATURES;
  s.input_dim = 10;
  s.layers = L;
  s.n_layer_specs = 5;
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  assert_int_equal(m.n_layers, 4);
  assert_int_equal(m.n_markers, 1);
  assert_int_equal(m.markers[0], 2);
  assert_string_equal(m.params[2].name, "layers.3.weight");
  assert_int_equal(m.params[2].shape[1], 16);
  assert_int_equal(m.data.out_dim, 4);
  pw_model_free(&m);

  L[3].in = 12; /* disagrees with the 16 coming in */
  assert_int_equal(pw_model_build(&s, &m, &err), PW_ESPEC);
  assert_string_equal(err.path, "model.layers[3]");
  assert_non_null(strstr(err.msg, "expected 16"));
  L[3].in = 0;
  L[0].type = PW_LAYER_EMBEDDING; /* on features */
  assert_int_equal(pw_model_build(&s, &m, &err), PW_ESPEC);
  assert_non_null(strstr(err.msg, "embedding needs token input"));
  L[0].type = PW_LAYER_LINEAR;
  s.n_layer_specs = 4; /* no loss at the end */
  assert_int_equal(pw_model_build(&s, &m, &err), PW_ESPEC);
  assert_non_null(strstr(err.msg, "must be a loss"));
}

/* Same seed, same parameters, whatever the stage: init is keyed by name. */
static void test_init_by_name(void **st) {
  pw_model_spec s = gpt_spec(0);
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  pw_prog *a, *b;
  pw_prog_config ca = {0, m.n_layers, 1, 1, 1, 0, 0, 0, 0, 0, 0, NULL, 0}, cb = {2, m.n_layers, 1, 1, 1, 0, 0, 0, 0, 0, 0, NULL, 0};
  assert_int_equal(pw_prog_create(&m, &ca, &a, &err), 0);
  assert_int_equal(pw_prog_create(&m, &cb, &b, &err), 0);
  pw_prog_init_params(a, 5);
  pw_prog_init_params(b, 5);
  int matched = 0;
  for (int i = 0; i < pw_prog_n_params(b); i++)
    for (int k = 0; k < pw_prog_n_params(a); k++)
      if (pw_prog_param_at(a, k)->model_index == pw_prog_param_at(b, i)->model_index) {
        assert_memory_equal(pw_prog_param_at(a, k)->data, pw_prog_param_at(b, i)->data,
                            pw_prog_param_at(b, i)->meta->numel * 4);
        matched++;
      }
  assert_int_equal(matched, pw_prog_n_params(b));
  /* a weight is normal(0, std); a layernorm weight ones, a bias zeros */
  pw_prog_param *w = pw_prog_param_at(a, 0);
  double s2 = 0;
  for (size_t k = 0; k < w->meta->numel; k++) s2 += (double)w->data[k] * w->data[k];
  double sd = sqrt(s2 / (double)w->meta->numel);
  assert_true(sd > 0.2 && sd < 0.4);
  pw_prog_free(a);
  pw_prog_free(b);
  pw_model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shapes_and_counts),
      cmocka_unit_test(test_shapes_gqa),
      cmocka_unit_test(test_shapes_gemma),
      cmocka_unit_test(test_shapes_head_dim),
      cmocka_unit_test(test_layers_list),
      cmocka_unit_test(test_init_by_name),
      cmocka_unit_test(test_gradcheck_gpt),
      cmocka_unit_test(test_gradcheck_gpt_tied),
      cmocka_unit_test(test_gradcheck_llama),
      cmocka_unit_test(test_gradcheck_mlp),
      cmocka_unit_test(test_gradcheck_llama_opts),
      cmocka_unit_test(test_gradcheck_gemma),
      cmocka_unit_test(test_gradcheck_mlp_xent),
      cmocka_unit_test(test_gradcheck_lora),
      cmocka_unit_test(test_split_backward_equals_full),
      cmocka_unit_test(test_staged_gpt),
      cmocka_unit_test(test_staged_gpt_tied),
      cmocka_unit_test(test_staged_llama),
      cmocka_unit_test(test_staged_mlp),
      cmocka_unit_test(test_staged_llama_opts),
      cmocka_unit_test(test_staged_gemma),
      cmocka_unit_test(test_remat_gpt),
      cmocka_unit_test(test_remat_gpt_tied),
      cmocka_unit_test(test_remat_llama),
      cmocka_unit_test(test_remat_mlp),
      cmocka_unit_test(test_gradcheck_moe),
      cmocka_unit_test(test_staged_moe),
      cmocka_unit_test(test_remat_moe),
      cmocka_unit_test(test_tiled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
