/* test_model_bert: template bert (common/model/model_bert.c), end to end.
 *
 * - the spec: defaults (norm_eps 1e-12, type_vocab_size 2, K = round(0.15
 *   T), ffn 4d), the canonical JSON (pad_token 0 kept, absent ones left
 *   out), and each refusal by its field;
 * - the graph: every tensor's name and shape against a table written from
 *   transformers' BertForMaskedLM / BertForSequenceClassification, the
 *   parameter count against the closed formula, the node kinds and their
 *   fields (bidirectional attention reading the tokens where there is a
 *   padding token, the type rule's separator, K on the loss), FLOPs and
 *   activation bytes of a block, the embeddings and each head against
 *   counts written out here;
 * - the arithmetic through the stage program: every tensor's gradient
 *   against a central finite difference (mlm with padding and a sentence
 *   pair, classify, a LoRA fine-tune of it; plain and tiled attention), the loss equal to the mean
 *   over B K predictions whatever the microbatching, the padding mask (the
 *   loss does not move when a padded position's embedding does, and does
 *   without pad_token), and a backend without the encoder's kernels
 *   refusing the model by op name. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "kernels.h"
#include "model.h"
#include "optable.h"
#include "prog.h"
#include "rng.h"
#include "spec_json.h"

enum { V = 29, T = 8, D = 8, L = 2, NH = 2, H = 12, K = 2, SEP = 3, PAD = 0, MASK = 4 };

static pw_model_spec bert_spec(int classify) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_BERT;
  s.vocab_size = V, s.seq_len = T, s.d_model = D, s.n_layers = L, s.n_heads = NH, s.ffn_hidden = H;
  s.norm_eps = 1e-12f, s.init_std = 0.3f; /* large enough that every path carries gradient */
  s.type_vocab_size = 2, s.pad_token = PAD, s.sep_token = SEP;
  s.bert_head = classify ? PW_BERT_HEAD_CLASSIFY : PW_BERT_HEAD_MLM;
  s.n_labels = classify ? 3 : 0;
  s.mlm_predictions = classify ? 0 : K;
  return s;
}

static void build(const pw_model_spec *s, pw_model *m, int impl) {
  pw_err err = {0};
  if (pw_model_build(s, m, &err)) fail_msg("%s: %s", err.path, err.msg);
  pw_model_set_attention(m, impl);
}

/* ---- the spec ------------------------------------------------------------------- */

static const char *const base_json =
    "{\"model\":{\"template\":\"bert\",\"vocab_size\":300,\"seq_len\":20,\"d_model\":16,\"n_layers\":1,"
    "\"n_heads\":2%s},\"data\":{\"kind\":\"text\",\"path\":\"x.txt\",\"mask_token\":103}}";

static int parse(const char *model_extra, pw_job *job, pw_err *err) {
  char buf[1024];
  snprintf(buf, sizeof buf, base_json, model_extra);
  json_error_t je;
  json_t *j = json_loads(buf, 0, &je);
  if (!j) fail_msg("bad test JSON: %s: %s", buf, je.text);
  int rc = pw_job_parse(j, NULL, job, err);
  json_decref(j);
  return rc;
}

static void test_spec_defaults(void **st) {
  (void)st;
  pw_job job;
  pw_err err = {0};
  if (parse("", &job, &err)) fail_msg("%s: %s", err.path, err.msg);
  const pw_model_spec *m = &job.model;
  assert_int_equal(m->tmpl, PW_TEMPLATE_BERT);
  assert_true(m->norm_eps == 1e-12f);
  assert_int_equal(m->type_vocab_size, 2);
  assert_int_equal(m->bert_head, PW_BERT_HEAD_MLM);
  assert_int_equal(m->mlm_predictions, 3); /* 0.15 * 20 */
  assert_int_equal(m->ffn_hidden, 64);
  assert_int_equal(m->pad_token, -1);
  assert_int_equal(m->sep_token, -1);
  json_t *c = pw_job_to_json(&job), *mo = json_object_get(c, "model");
  assert_null(json_object_get(mo, "pad_token"));
  assert_null(json_object_get(mo, "sep_token"));
  assert_null(json_object_get(mo, "n_labels"));
  assert_null(json_object_get(mo, "tie_embeddings"));
  assert_string_equal(json_string_value(json_object_get(mo, "bert_head")), "mlm");
  assert_int_equal(json_integer_value(json_object_get(mo, "mlm_predictions")), 3);
  json_decref(c);
  pw_job_free(&job);

  /* K rounds half up and is at least 1; a pad id of 0 is one (kept in the
   * canonical spec); the spec round-trips */
  static const struct { int T, K; } ks[] = {{1, 1}, {3, 1}, {10, 2}, {20, 3}, {128, 19}, {512, 77}};
  for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
    char ex[64];
    snprintf(ex, sizeof ex, ",\"seq_len\":%d", ks[i].T);
    char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"model\":{\"template\":\"bert\",\"vocab_size\":300,\"seq_len\":%d,\"d_model\":16,\"n_layers\":1,"
             "\"n_heads\":2},\"data\":{\"kind\":\"text\",\"path\":\"x.txt\",\"mask_token\":103}}",
             ks[i].T);
    json_t *j = json_loads(buf, 0, NULL);
    assert_int_equal(pw_job_parse(j, NULL, &job, &err), 0);
    assert_int_equal(job.model.mlm_predictions, ks[i].K);
    json_decref(j);
    pw_job_free(&job);
  }
  if (parse(",\"pad_token\":0,\"sep_token\":102,\"type_vocab_size\":3,\"norm_eps\":1e-6,\"mlm_predictions\":5",
            &job, &err))
    fail_msg("%s: %s", err.path, err.msg);
  c = pw_job_to_json(&job);
  mo = json_object_get(c, "model");
  assert_int_equal(json_integer_value(json_object_get(mo, "pad_token")), 0);
  assert_int_equal(json_integer_value(json_object_get(mo, "sep_token")), 102);
  assert_int_equal(json_integer_value(json_object_get(mo, "type_vocab_size")), 3);
  pw_job again;
  assert_int_equal(pw_job_parse(c, NULL, &again, &err), 0);
  json_t *c2 = pw_job_to_json(&again);
  assert_true(json_equal(c, c2));
  assert_int_equal(again.model.mlm_predictions, 5);
  json_decref(c2);
  json_decref(c);
  pw_job_free(&again);
  pw_job_free(&job);
}

static void test_spec_refusals(void **st) {
  (void)st;
  static const struct {
    const char *extra, *path, *msg;
  } bad[] = {
      {",\"bert_head\":\"classify\"", "model.n_labels", "required with bert_head \"classify\""},
      {",\"bert_head\":\"classify\",\"n_labels\":1", "model.n_labels", "must be >= 2 (got 1)"},
      {",\"n_labels\":3", "model.n_labels", "not used with bert_head \"mlm\""},
      {",\"bert_head\":\"classify\",\"n_labels\":2,\"mlm_predictions\":2", "model.mlm_predictions",
       "not used with bert_head \"classify\""},
      {",\"mlm_predictions\":21", "model.mlm_predictions", "must be <= seq_len (21 > 20)"},
      {",\"mlm_predictions\":0", "model.mlm_predictions", "must be >= 1"},
      {",\"pad_token\":300", "model.pad_token", "must be a token id below vocab_size (300 >= 300)"},
      {",\"sep_token\":301", "model.sep_token", "must be a token id below vocab_size (301 >= 300)"},
      {",\"pad_token\":-2", "model.pad_token", "must be >= 0"},
      {",\"pad_token\":5,\"sep_token\":5", "model.sep_token", "must differ from pad_token (both 5)"},
      {",\"sep_token\":5,\"type_vocab_size\":1", "model.type_vocab_size", "must be >= 2 with sep_token"},
      {",\"type_vocab_size\":0", "model.type_vocab_size", "must be >= 1"},
      {",\"n_heads\":3", "model.n_heads", "must divide d_model (16 % 3 != 0)"},
      {",\"bert_head\":\"pooler\"", "model.bert_head", "must be one of mlm, classify"},
      {",\"tie_embeddings\":false", "model.tie_embeddings", "not used with template bert"},
      {",\"rope_base\":100", "model.rope_base", "not used with template bert"},
      {",\"n_kv_heads\":1", "model.n_kv_heads", "not used with template bert"},
      {",\"ln_eps\":1", "model.ln_eps", "unknown field"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    pw_job job;
    pw_err err = {0};
    int rc = parse(bad[i].extra, &job, &err);
    if (rc != PW_ESPEC || strcmp(err.path, bad[i].path) || !strstr(err.msg, bad[i].msg))
      fail_msg("case %zu (%s): want %s: ...%s..., got %d %s: %s", i, bad[i].extra, bad[i].path, bad[i].msg, rc,
               err.path, err.msg);
  }  /* an encoder is not served (nothing generates from it) */
  json_t *j = json_loads("{\"mode\":\"serve\",\"init\":{\"job\":3,\"step\":4},\"model\":{\"template\":"
                         "\"bert\",\"vocab_size\":300,\"seq_len\":20,\"d_model\":16,\"n_layers\":1,\"n_heads\":2},"
                         "\"data\":{\"kind\":\"text\",\"path\":\"x.txt\",\"mask_token\":103}}",
                         0, NULL);
  pw_job job;
  pw_err err = {0};
  assert_non_null(j);
  assert_int_equal(pw_job_parse(j, NULL, &job, &err), PW_ESPEC);
  assert_string_equal(err.path, "mode");
  assert_non_null(strstr(err.msg, "template bert is an encoder"));
  json_decref(j);
}

/* ---- the graph ------------------------------------------------------------------ */

typedef struct {
  const char *name;
  int d0, d1;
} shape;

static void expect_params(const pw_model *m, const shape *want, int n) {
  assert_int_equal(m->n_params, n);
  for (int i = 0; i < n; i++) {
    const pw_param *p = &m->params[i];
    if (strcmp(p->name, want[i].name) || p->shape[0] != want[i].d0 || p->shape[1] != want[i].d1)
      fail_msg("param %d: want %s [%d, %d], got %s [%d, %d]", i, want[i].name, want[i].d0, want[i].d1, p->name,
               p->shape[0], p->shape[1]);
  }
}

static void test_graph_mlm(void **st) {
  (void)st;
  pw_model_spec s = bert_spec(0);
  pw_model m;
  build(&s, &m, PW_ATTN_PLAIN);
  const shape want[] = {
      {"embed.tok.weight", V, D},         {"embed.type.weight", 2, D},
      {"embed.pos.weight", T, D},         {"embed.ln.weight", D, 0},
      {"embed.ln.bias", D, 0},            {"blocks.0.attn.qkv.weight", 3 * D, D},
      {"blocks.0.attn.qkv.bias", 3 * D, 0}, {"blocks.0.attn.proj.weight", D, D},
      {"blocks.0.attn.proj.bias", D, 0},  {"blocks.0.ln1.weight", D, 0},
      {"blocks.0.ln1.bias", D, 0},        {"blocks.0.mlp.fc.weight", H, D},
      {"blocks.0.mlp.fc.bias", H, 0},     {"blocks.0.mlp.proj.weight", D, H},
      {"blocks.0.mlp.proj.bias", D, 0},   {"blocks.0.ln2.weight", D, 0},
      {"blocks.0.ln2.bias", D, 0},        {"blocks.1.attn.qkv.weight", 3 * D, D},
      {"blocks.1.attn.qkv.bias", 3 * D, 0}, {"blocks.1.attn.proj.weight", D, D},
      {"blocks.1.attn.proj.bias", D, 0},  {"blocks.1.ln1.weight", D, 0},
      {"blocks.1.ln1.bias", D, 0},        {"blocks.1.mlp.fc.weight", H, D},
      {"blocks.1.mlp.fc.bias", H, 0},     {"blocks.1.mlp.proj.weight", D, H},
      {"blocks.1.mlp.proj.bias", D, 0},   {"blocks.1.ln2.weight", D, 0},
      {"blocks.1.ln2.bias", D, 0},        {"head.transform.weight", D, D},
      {"head.transform.bias", D, 0},      {"head.ln.weight", D, 0},
      {"head.ln.bias", D, 0},             {"head.decoder.bias", V, 0},
  };
  expect_params(&m, want, (int)(sizeof want / sizeof want[0]));
  size_t n = (size_t)V * D + (size_t)T * D + 2 * D + 2 * D + (size_t)L * (4 * D * D + 2 * D * H + 9 * D + H) +
             (D * D + 3 * D + V);
  assert_int_equal(pw_model_param_count(&m), n);
  for (int i = 0; i < m.n_params; i++) { /* BERT's init: no scaled residuals, LayerNorms 1 and 0 */
    const pw_param *p = &m.params[i];
    int ln = strstr(p->name, "ln") != NULL, bias = strstr(p->name, ".bias") != NULL;
    assert_int_equal(p->init, bias ? PW_INIT_ZEROS : ln ? PW_INIT_ONES : PW_INIT_NORMAL);
    if (p->init == PW_INIT_NORMAL) assert_true(p->init_std == 0.3f);
  }
  /* the nodes: embed_pad, toktype, posembed, layernorm; per block linear,
   * attention, linear, add, layernorm, linear, gelu_erf, linear, add,
   * layernorm; the head's linear, gelu_erf, layernorm, the tied decoder,
   * the loss */
  static const int ops[] = {PW_OP_EMBED_PAD, PW_OP_TOKTYPE,  PW_OP_POSEMBED,  PW_OP_LAYERNORM,
                            PW_OP_LINEAR,    PW_OP_ATTENTION, PW_OP_LINEAR,   PW_OP_ADD,
                            PW_OP_LAYERNORM, PW_OP_LINEAR,   PW_OP_GELU_ERF,  PW_OP_LINEAR,
                            PW_OP_ADD,       PW_OP_LAYERNORM};
  for (int i = 0; i < 14; i++) assert_int_equal(m.nodes[i].op, ops[i]);
  for (int i = 4; i < 14; i++) assert_int_equal(m.nodes[i + 10].op, ops[i]);
  static const int head[] = {PW_OP_LINEAR, PW_OP_GELU_ERF, PW_OP_LAYERNORM, PW_OP_LINEAR, PW_OP_XENT_MLM};
  assert_int_equal(m.n_nodes, 24 + 5);
  for (int i = 0; i < 5; i++) assert_int_equal(m.nodes[24 + i].op, head[i]);
  const pw_node *e = &m.nodes[0], *tt = &m.nodes[1], *at = &m.nodes[5], *dec = &m.nodes[27], *ls = &m.nodes[28];
  assert_int_equal(e->pad, PAD);
  assert_true(tt->in[1] == m.input_value && tt->NH == SEP && tt->pad == PAD);
  assert_true(at->bidir == 1 && at->in[1] == m.input_value && at->pad == PAD && at->NH == NH && at->window == 0);
  assert_true(dec->w == 0 && dec->b == m.n_params - 1); /* the decoder reads embed.tok.weight */
  assert_true(ls->NH == K && ls->in[1] == m.target_value);
  assert_true(m.nodes[3].eps == 1e-12f);
  assert_int_equal(m.values[m.target_value].rows, T);
  assert_true(m.data.tokens && m.data.vocab_size == V && m.data.seq_len == T && m.data.mlm_predictions == K &&
              m.data.pad_token == PAD && m.data.out_dim == 0);
  assert_int_equal(m.n_layers, L + 2);
  assert_string_equal(m.layers[1].name, "blocks.0");
  assert_true(m.layers[1].is_block && !m.layers[0].is_block && !m.layers[L + 1].is_block);

  /* FLOPs and saved bytes a sequence, written out from optable.c's rules */
  double t = T, d = D, h = H, v = V;
  double blk_f = 2 * t * d * 3 * d + 4 * t * t * d + 2 * t * d * d + 5 * t * d + 5 * t * d + 2 * t * d * h +
                 5 * t * h + 2 * t * h * d + 5 * t * d + 5 * t * d;
  double blk_i = 2 * t * d * 3 * d + 8 * t * t * d + 2 * t * d * d + 8 * t * d * 4 + 2 * t * d * h + 8 * t * h +
                 2 * t * h * d;
  double blk_w = 2 * t * d * 3 * d + 2 * t * d * d + 3 * t * d * 2 + 2 * t * d * h + 2 * t * h * d;
  assert_true(fabs(m.layers[1].flops_f - blk_f) < 1e-6 * blk_f);
  assert_true(fabs(m.layers[1].flops_i - blk_i) < 1e-6 * blk_i);
  assert_true(fabs(m.layers[1].flops_w - blk_w) < 1e-6 * blk_w);
  /* saved: outputs (qkv 3d, att d, proj d, add d, ln d, fc h, gelu h, proj
   * d, add d, ln d a row), the probabilities NH T^2, the norms' mean and
   * rstd, gelu_erf's derivative */
  size_t blk_b = 4 * ((size_t)T * (3 * D + D + D + D + D + H + H + D + D + D) + (size_t)NH * T * T + 2 * 2 * T +
                      (size_t)T * H);
  assert_int_equal(m.layers[1].act_bytes, blk_b);
  double emb_f = 5 * t * d * 3 + 0; /* toktype, posembed, layernorm; the embedding 0 */
  assert_true(fabs(m.layers[0].flops_f - emb_f) < 1e-9);
  assert_true(fabs(m.layers[0].flops_w - (t * d + 3 * t * d * 3)) < 1e-9); /* embed_pad, toktype, pos, ln */
  double head_f = 2 * t * d * d + 5 * t * d + 5 * t * d + 2 * t * d * v + 5 * t * v;
  assert_true(fabs(m.layers[L + 1].flops_f - head_f) < 1e-6 * head_f);
  size_t head_b = 4 * ((size_t)T * (D + D + D + V) + (size_t)T * D + 2 * T + (size_t)T * V); /* + probs */
  assert_int_equal(m.layers[L + 1].act_bytes, head_b);
  pw_model_free(&m);

  /* no padding token: a plain embedding and an attention without the tokens */
  s.pad_token = -1, s.sep_token = -1;
  build(&s, &m, PW_ATTN_AUTO);
  assert_int_equal(m.nodes[0].op, PW_OP_EMBED);
  assert_true(m.nodes[1].NH == -1 && m.nodes[1].pad == -1);
  assert_true(m.nodes[5].in[1] == -1 && m.nodes[5].bidir == 1);
  assert_int_equal(m.data.pad_token, -1);
  pw_model_free(&m);
}

static void test_graph_classify(void **st) {
  (void)st;
  pw_model_spec s = bert_spec(1);
  pw_model m;
  build(&s, &m, PW_ATTN_AUTO);
  assert_int_equal(m.n_params, 5 + 12 * L + 4);
  static const shape tail[] = {
      {"head.pooler.weight", D, D}, {"head.pooler.bias", D, 0}, {"head.classifier.weight", 3, D},
      {"head.classifier.bias", 3, 0}};
  for (int i = 0; i < 4; i++) {
    const pw_param *p = &m.params[m.n_params - 4 + i];
    assert_string_equal(p->name, tail[i].name);
    assert_true(p->shape[0] == tail[i].d0 && p->shape[1] == tail[i].d1);
  }
  size_t n = (size_t)V * D + (size_t)T * D + 2 * D + 2 * D + (size_t)L * (4 * D * D + 2 * D * H + 9 * D + H) +
             (D * D + D + 3 * (D + 1));
  assert_int_equal(pw_model_param_count(&m), n);
  static const int head[] = {PW_OP_FIRST_ROW, PW_OP_LINEAR, PW_OP_TANH, PW_OP_LINEAR, PW_OP_XENT};
  for (int i = 0; i < 5; i++) assert_int_equal(m.nodes[m.n_nodes - 5 + i].op, head[i]);
  const pw_node *fr = &m.nodes[m.n_nodes - 5];
  assert_int_equal(m.values[fr->out].rows, 1);
  assert_int_equal(m.values[m.target_value].rows, 1);
  assert_true(m.data.out_dim == 3 && m.data.mlm_predictions == 0);
  double d = D, t = T;
  double head_f = d + 2 * d * d + 5 * d + 2 * d * 3 + 5 * 3;
  double head_i = t * d + 2 * d * d + 8 * d + 2 * d * 3 + 8 * 3;
  assert_true(fabs(m.layers[L + 1].flops_f - head_f) < 1e-9 && fabs(m.layers[L + 1].flops_i - head_i) < 1e-9);
  pw_model_free(&m);
}

/* ---- the arithmetic --------------------------------------------------------------- */

/* Sequence i of microbatch mb: a pair [2 a.. SEP b.. SEP] then padding,
 * its length varying; mlm targets at K non-pad positions (the original
 * token), -100 elsewhere; classify one label. */
static void make_batch(int mb, int b, int cls, int32_t *tok, int32_t *tgt) {
  pw_rng r;
  pw_rng_seed(&r, 77 + (uint64_t)mb);
  for (int s = 0; s < b; s++) {
    int32_t *x = tok + s * T;
    int len = T - 2 + (s + mb) % 3; /* 6, 7, 8 */
    if (len > T) len = T;
    int mid = 1 + (int)pw_rng_below(&r, (uint64_t)(len - 3));
    for (int t = 0; t < T; t++) x[t] = t < len ? 5 + (int32_t)pw_rng_below(&r, V - 5) : PAD;
    x[0] = 2, x[mid] = SEP, x[len - 1] = SEP;
    if (cls) {
      tgt[s] = (int32_t)pw_rng_below(&r, 3);
      continue;
    }
    for (int t = 0; t < T; t++) tgt[s * T + t] = -100;
    for (int k = 0; k < K;) {
      int t = 1 + (int)pw_rng_below(&r, (uint64_t)(len - 1));
      if (tgt[s * T + t] >= 0 || x[t] == SEP) continue;
      tgt[s * T + t] = x[t];
      x[t] = MASK;
      k++;
    }
  }
}

static void fill(pw_prog *p, const pw_model *m, int b, int mb) {
  int32_t tok[4 * T], tgt[4 * T];
  make_batch(mb, b, m->values[m->target_value].rows == 1, tok, tgt);
  memcpy(pw_prog_value(p, 0, m->input_value), tok, sizeof(int32_t) * (size_t)(b * T));
  memcpy(pw_prog_value(p, 0, m->target_value), tgt,
         sizeof(int32_t) * (size_t)(b * m->values[m->target_value].rows));
}

static double loss_of(pw_prog *p, const pw_model *m, int b, int n_mb) {
  double s = 0;
  for (int j = 0; j < n_mb; j++) {
    float l;
    fill(p, m, b, j);
    assert_int_equal(pw_prog_forward(p, 0, &l, NULL), 0);
    s += l;
  }
  return s;
}

static pw_prog *prog_of(const pw_model *m, int b, int n_mb) {
  pw_prog *p;
  pw_err err = {0};
  pw_prog_config cfg = {.layer_lo = 0, .layer_hi = m->n_layers, .mb_size = b, .batch_size = b * n_mb, .n_slots = 1};
  if (pw_prog_create(m, &cfg, &p, &err)) fail_msg("%s: %s", err.path, err.msg);
  pw_prog_init_params(p, 42);
  return p;
}

static void gradcheck(const pw_model_spec *s, int impl) {
  pw_model m;
  build(s, &m, impl);
  const int b = 2, n_mb = 2;
  pw_prog *p = prog_of(&m, b, n_mb);
  for (int i = 0; i < pw_prog_n_params(p); i++) { /* biases and norms off 0 and 1: their paths show */
    pw_prog_param *pp = pw_prog_param_at(p, i);
    pw_rng rb;
    pw_rng_seed(&rb, (uint64_t)i);
    if (pp->meta->init != PW_INIT_NORMAL)
      for (size_t k = 0; k < pp->meta->numel; k++) pp->data[k] += (float)(0.2 * pw_rng_normal(&rb));
  }
  pw_prog_zero_grad(p);
  for (int j = 0; j < n_mb; j++) {
    float l;
    fill(p, &m, b, j);
    assert_int_equal(pw_prog_forward(p, 0, &l, NULL), 0);
    assert_int_equal(pw_prog_backward(p, 0, NULL), 0);
  }
  pw_prog_grads_finalize(p); /* the tied embedding's two uses */
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
    double fd = (lp - lm) / (2 * eps), tol = 2e-2 * fabs(fd) + 2e-3;
    if (fabs(fd - gd) > tol)
      fail_msg("%s: directional derivative %.6g (finite difference) vs %.6g (backward)", pp->meta->name, fd, gd);
    if (fabs(fd) > 0.1) assert_true(fabs(fd - 1.05 * gd) > tol); /* a gradient 5% off fails */
    free(dir);
    free(saved);
  }
  pw_prog_free(p);
  pw_model_free(&m);
}

static void test_gradcheck_mlm(void **st) {
  (void)st;
  pw_model_spec s = bert_spec(0);
  gradcheck(&s, PW_ATTN_PLAIN);
  gradcheck(&s, PW_ATTN_TILED);
  s.pad_token = -1, s.sep_token = -1; /* every key seen, every type 0 */
  gradcheck(&s, PW_ATTN_PLAIN);
}

static void test_gradcheck_classify(void **st) {
  (void)st;
  pw_model_spec s = bert_spec(1);
  gradcheck(&s, PW_ATTN_PLAIN);
  gradcheck(&s, PW_ATTN_TILED);
  /* a LoRA fine-tune of the classifier: adapters on the attention and the
   * pooler (their B off 0 in gradcheck, so A's gradient shows) */
  s.lora_rank = 2, s.lora_alpha = 4, s.n_lora_targets = 2;
  snprintf(s.lora_targets[0], PW_LORA_TARGET_LEN, "blocks.*.attn.qkv");
  snprintf(s.lora_targets[1], PW_LORA_TARGET_LEN, "head.pooler");
  pw_model m;
  build(&s, &m, PW_ATTN_AUTO);
  int adapters = 0;
  for (int i = 0; i < m.n_params; i++) adapters += pw_param_is_adapter(&m.params[i]);
  assert_int_equal(adapters, 2 * (L + 1));
  pw_model_free(&m);
  gradcheck(&s, PW_ATTN_PLAIN);
}

/* The loss is the mean over B K predictions: one microbatch of 4 or two of
 * 2 give the same (to the float sum of two parts), and it is the mean of
 * -log p(target) over the masked positions computed from the logits. */
static void test_loss_mean(void **st) {
  (void)st;
  pw_model_spec s = bert_spec(0);
  pw_model m;
  build(&s, &m, PW_ATTN_AUTO);
  pw_prog *one = prog_of(&m, 4, 1), *two = prog_of(&m, 2, 2);
  int32_t tok[4 * T], tgt[4 * T];
  make_batch(0, 4, 0, tok, tgt);
  memcpy(pw_prog_value(one, 0, m.input_value), tok, sizeof tok);
  memcpy(pw_prog_value(one, 0, m.target_value), tgt, sizeof tgt);
  float l1, a, b;
  assert_int_equal(pw_prog_forward(one, 0, &l1, NULL), 0);
  /* by hand from the logits (the decoder's output), in double */
  const float *lg = pw_prog_value(one, 0, m.nodes[m.n_nodes - 1].in[0]);
  double sum = 0;
  int counted = 0;
  for (int n = 0; n < 4 * T; n++) {
    if (tgt[n] < 0) continue;
    double mx = -INFINITY, z = 0;
    for (int v = 0; v < V; v++) mx = fmax(mx, lg[n * V + v]);
    for (int v = 0; v < V; v++) z += exp(lg[n * V + v] - mx);
    sum += log(z) + mx - lg[n * V + tgt[n]];
    counted++;
  }
  assert_int_equal(counted, 4 * K);
  assert_float_equal(l1, sum / (4 * K), 1e-6 * fabs(l1));
  for (int j = 0; j < 2; j++) {
    memcpy(pw_prog_value(two, 0, m.input_value), tok + j * 2 * T, sizeof tok / 2);
    memcpy(pw_prog_value(two, 0, m.target_value), tgt + j * 2 * T, sizeof tgt / 2);
    assert_int_equal(pw_prog_forward(two, 0, j ? &b : &a, NULL), 0);
  }
  assert_float_equal(l1, a + b, 2e-7 * fabs(l1));
  pw_prog_free(one);
  pw_prog_free(two);
  pw_model_free(&m);
}

/* Padded positions are masked as keys: moving the position embedding of a
 * row that holds a pad (no target there) leaves every other row, so the
 * loss, exactly as it was; without pad_token it moves. */
static float loss_with_pos_moved(pw_model_spec s, int move, int impl) {
  pw_model m;
  build(&s, &m, impl);
  pw_prog *p = prog_of(&m, 2, 1);
  int32_t tok[2 * T], tgt[2 * T];
  make_batch(0, 2, 0, tok, tgt);
  assert_true(tok[T - 1] == PAD && tok[2 * T - 1] == PAD); /* both sequences end padded */
  for (int i = 0; i < pw_prog_n_params(p); i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    if (move && !strcmp(pp->meta->name, "embed.pos.weight"))
      for (int c = 0; c < D; c++) pp->data[(T - 1) * D + c] += c % 3 ? 2.0f : -3.0f; /* not a constant: LN */
  }
  memcpy(pw_prog_value(p, 0, m.input_value), tok, sizeof tok);
  memcpy(pw_prog_value(p, 0, m.target_value), tgt, sizeof tgt);
  float l;
  assert_int_equal(pw_prog_forward(p, 0, &l, NULL), 0);
  pw_prog_free(p);
  pw_model_free(&m);
  return l;
}

static void test_padding_mask(void **st) {
  (void)st;
  for (int impl = PW_ATTN_TILED; impl <= PW_ATTN_PLAIN; impl++) {
    pw_model_spec s = bert_spec(0);
    assert_true(loss_with_pos_moved(s, 0, impl) == loss_with_pos_moved(s, 1, impl));
    s.pad_token = -1;
    float a = loss_with_pos_moved(s, 0, impl), b = loss_with_pos_moved(s, 1, impl);
    if (!(fabs(a - b) > 1e-4)) fail_msg("without pad_token: %.9g and %.9g", a, b);
  }
}

/* A backend whose table lacks the encoder's kernels (the CUDA backend's
 * case) refuses the model by op name when the program is made. */
static const pw_kernel none = {0};
static const pw_kernel *no_encoder(int op) { return op >= PW_OP_GELU_ERF ? &none : pw_kernel_of(op); }

static void test_backend_refuses(void **st) {
  (void)st;
  pw_model_spec s = bert_spec(0);
  pw_model m;
  build(&s, &m, PW_ATTN_AUTO);
  pw_backend be = *pw_backend_cpu();
  be.host = 0, be.name = "a test device", be.kernel_of = no_encoder;
  pw_prog_config cfg = {.layer_lo = 0, .layer_hi = m.n_layers, .mb_size = 1, .batch_size = 1, .n_slots = 1,
                        .backend = &be};
  pw_prog *p = NULL;
  pw_err err = {0};
  assert_int_equal(pw_prog_create(&m, &cfg, &p, &err), PW_ENOTSUP);
  assert_non_null(strstr(err.msg, "op 'embed_pad' (node 0, layer 0) has no kernel on a test device"));
  cfg.layer_lo = L + 1, cfg.layer_hi = L + 2; /* the head: its gelu_erf */
  assert_int_equal(pw_prog_create(&m, &cfg, &p, &err), PW_ENOTSUP);
  if (!strstr(err.msg, "op 'gelu_erf'")) fail_msg("%s", err.msg);
  pw_model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spec_defaults),    cmocka_unit_test(test_spec_refusals),
      cmocka_unit_test(test_graph_mlm),        cmocka_unit_test(test_graph_classify),
      cmocka_unit_test(test_gradcheck_mlm),    cmocka_unit_test(test_gradcheck_classify),
      cmocka_unit_test(test_loss_mean),        cmocka_unit_test(test_padding_mask),
      cmocka_unit_test(test_backend_refuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
