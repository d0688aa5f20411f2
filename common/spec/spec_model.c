/* spec_model: the "model" section of a job spec — templates (gpt, llama,
 * mlp) and explicit layers lists — parsed into pw_model_spec and written
 * back as canonical JSON.
 *
 * Checks here are those a spec can be judged by on its own: fields, types,
 * ranges, divisibility of the template's own numbers, the order of layer
 * kinds in a list. Shapes of a layers list (an explicit "in" that disagrees
 * with the previous layer, heads that do not divide an inferred width) are
 * model.c's: it infers them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec_field.h"

#define MAX_DIM (1 << 20)
#define MAX_VOCAB (1 << 20)
#define MAX_SEQ 65536
#define MAX_BLOCKS 4096
#define MAX_LAYER_SPECS 10000
#define MAX_MESH_STAGES (4096 * 4096) /* pp x virtual_stages at most */

#define T_GPT (1u << PW_TEMPLATE_GPT)
#define T_LLAMA (1u << PW_TEMPLATE_LLAMA)
#define T_MLP (1u << PW_TEMPLATE_MLP)
#define T_BERT (1u << PW_TEMPLATE_BERT)
#define T_LAYERS (1u << PW_TEMPLATE_LAYERS)
#define T_REGIONS (1u << PW_TEMPLATE_REGIONS)
#define T_LISTS (T_LAYERS | T_REGIONS)
#define T_TF (T_GPT | T_LLAMA)
#define T_SEQ (T_TF | T_BERT) /* the sequence templates' common fields */

_Static_assert(sizeof(pw_template) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(pw_layer_type) == sizeof(int), "enums are stored as int");

static const char *const tmpl_names[] = {"gpt", "llama", "mlp", "bert"}; /* pw_template's first four */
static const char *const tmpl_ctx[] = {"template gpt", "template llama", "template mlp", "template bert",
                                       "a layers list", "regions"};
static const char *const act_names[] = {"relu", "gelu", "silu"};     /* pw_act_kind */
static const char *const loss_names[] = {"cross_entropy", "mse"};    /* pw_loss_kind */
static const char *const input_names[] = {"tokens", "features"};     /* pw_input_kind */
static const char *const mlp_act_names[] = {"silu", "gelu_tanh"};    /* pw_mlp_act_kind */
static const char *const bert_head_names[] = {"mlm", "classify"};    /* pw_bert_head_kind */
/* pw_layer_type order; stage_boundary is not a "type" but its own key. */
static const char *const layer_names[] = {"embedding", "pos_embedding", "linear",  "layernorm",
                                          "rmsnorm",   "gelu",          "relu",    "silu",
                                          "gpt_block", "llama_block",   "cross_entropy", "mse"};
#define N_LAYER_TYPES ((int)(sizeof layer_names / sizeof layer_names[0]))

static const pw__field model_fields[] = {
    PW__ENUM("template", 0, T_SEQ | T_MLP, pw_model_spec, tmpl, 0, tmpl_names),
    PW__INT("vocab_size", 0, T_SEQ, pw_model_spec, vocab_size, 256, 2, MAX_VOCAB),
    PW__INT("seq_len", PW__REQ, T_SEQ, pw_model_spec, seq_len, 0, 1, MAX_SEQ),
    PW__INT("seq_len", PW__NODEF, T_LAYERS, pw_model_spec, seq_len, 0, 1, MAX_SEQ),
    PW__INT("seq_len", PW__REQ, T_REGIONS, pw_model_spec, seq_len, 0, 1, MAX_SEQ),
    PW__INT("d_model", PW__REQ, T_SEQ, pw_model_spec, d_model, 0, 1, MAX_DIM),
    PW__INT("n_layers", PW__REQ, T_SEQ, pw_model_spec, n_layers, 0, 1, MAX_BLOCKS),
    PW__INT("n_layers", 0, T_MLP, pw_model_spec, n_layers, 1, 0, MAX_BLOCKS),
    PW__INT("n_heads", PW__REQ, T_SEQ, pw_model_spec, n_heads, 0, 1, MAX_DIM),
    PW__INT("ffn_hidden", PW__NODEF, T_SEQ, pw_model_spec, ffn_hidden, 0, 1, MAX_DIM),
    PW__BOOL("tie_embeddings", 0, T_TF, pw_model_spec, tie_embeddings, 0),
    PW__FLOAT("rope_base", PW__LO_OPEN, T_LLAMA | T_LISTS, pw_model_spec, rope_base, 10000, 0,
              PW__FLT_MAX),
    PW__INT("n_kv_heads", PW__NODEF | PW__OMIT0, T_LLAMA, pw_model_spec, n_kv_heads, 0, 1, MAX_DIM),
    PW__SKIP("rope_scaling", 0, T_LLAMA), /* rope_scaling_parse */
    PW__BOOL("qkv_bias", PW__OMIT0, T_LLAMA, pw_model_spec, qkv_bias, 0),
    PW__BOOL("qk_norm", PW__OMIT0, T_LLAMA, pw_model_spec, qk_norm, 0),
    PW__ENUM("mlp_act", PW__OMIT0, T_LLAMA, pw_model_spec, mlp_act, PW_MLP_ACT_SILU, mlp_act_names),
    PW__BOOL("embed_scale", PW__OMIT0, T_LLAMA, pw_model_spec, embed_scale, 0),
    PW__INT("norm_offset", PW__OMIT0, T_LLAMA, pw_model_spec, norm_offset, 0, 0, 1),
    PW__INT("head_dim", PW__NODEF | PW__OMIT0, T_LLAMA, pw_model_spec, head_dim, 0, 1, MAX_DIM),
    PW__INT("sliding_window", PW__OMIT0, T_LLAMA, pw_model_spec, sliding_window, 0, 0, MAX_SEQ),
    PW__FLOAT("norm_eps", PW__LO_OPEN, T_TF | T_LISTS, pw_model_spec, norm_eps, 1e-5, 0, 1),
    PW__FLOAT("norm_eps", PW__LO_OPEN, T_BERT, pw_model_spec, norm_eps, 1e-12, 0, 1), /* BERT's layer_norm_eps */
    PW__FLOAT("init_std", PW__LO_OPEN, T_SEQ | T_LISTS, pw_model_spec, init_std, 0.02, 0,
              PW__FLT_MAX),
    /* bert: the fields of its own (bert_check: which go with which head) */
    PW__INT("type_vocab_size", 0, T_BERT, pw_model_spec, type_vocab_size, 2, 1, MAX_VOCAB),
    PW__ENUM("bert_head", 0, T_BERT, pw_model_spec, bert_head, PW_BERT_HEAD_MLM, bert_head_names),
    PW__INT("n_labels", PW__NODEF | PW__OMIT0, T_BERT, pw_model_spec, n_labels, 0, 2, MAX_VOCAB),
    PW__INT("mlm_predictions", PW__NODEF | PW__OMIT0, T_BERT, pw_model_spec, mlm_predictions, 0, 1, MAX_SEQ),
    PW__INT("pad_token", PW__OMITDEF, T_BERT, pw_model_spec, pad_token, -1, 0, MAX_VOCAB - 1),
    PW__INT("sep_token", PW__OMITDEF, T_BERT, pw_model_spec, sep_token, -1, 0, MAX_VOCAB - 1),
    PW__INT("in_dim", PW__REQ, T_MLP, pw_model_spec, in_dim, 0, 1, MAX_DIM),
    PW__INT("hidden_dim", PW__NODEF | PW__OMIT0, T_MLP, pw_model_spec, hidden_dim, 0, 1, MAX_DIM),
    PW__INT("out_dim", PW__REQ, T_MLP, pw_model_spec, out_dim, 0, 1, MAX_DIM),
    PW__ENUM("activation", 0, T_MLP, pw_model_spec, activation, PW_ACT_RELU, act_names),
    PW__ENUM("loss", 0, T_MLP, pw_model_spec, loss, PW_LOSS_MSE, loss_names),
    PW__SKIP("input", PW__REQ, T_LAYERS),
    PW__SKIP("layers", PW__REQ, T_LAYERS),
    PW__SKIP("regions", PW__REQ, T_REGIONS), /* spec_regions.c */
    PW__SKIP("graph", 0, T_REGIONS),
    PW__SKIP("lora", 0, PW__ALL), /* lora_parse */
    PW__SKIP("moe", 0, T_TF),     /* moe_parse */
};

/* model.moe: a mixture of experts in place of some blocks' MLP. */
static const char *const moe_gate_names[] = {"softmax_topk", "softmax", "sigmoid"}; /* pw_moe_gate_kind */
static const pw__field moe_fields[] = {
    PW__INT("experts", PW__REQ, PW__ALL, pw_model_spec, moe_experts, 0, 2, 4096),
    PW__INT("top_k", 0, PW__ALL, pw_model_spec, moe_top_k, 2, 1, 4096),
    PW__INT("ffn_hidden", PW__NODEF, PW__ALL, pw_model_spec, moe_hidden, 0, 1, MAX_DIM),
    PW__ENUM("gate", 0, PW__ALL, pw_model_spec, moe_gate, PW_MOE_GATE_SOFTMAX_TOPK, moe_gate_names),
    PW__FLOAT("routed_scale", PW__LO_OPEN, PW__ALL, pw_model_spec, moe_routed_scale, 1, 0, PW__FLT_MAX),
    PW__INT("shared_experts", PW__OMIT0, PW__ALL, pw_model_spec, moe_shared, 0, 0, 64),
    PW__INT("shared_ffn_hidden", PW__OMIT0, PW__ALL, pw_model_spec, moe_shared_hidden, 0, 0, MAX_DIM),
    PW__BOOL("shared_gate", PW__OMIT0, PW__ALL, pw_model_spec, moe_shared_gate, 0),
    PW__INT("every", 0, PW__ALL, pw_model_spec, moe_every, 1, 1, MAX_BLOCKS),
    PW__INT("first_dense", PW__OMIT0, PW__ALL, pw_model_spec, moe_first_dense, 0, 0, MAX_BLOCKS),
};

static int moe_parse(const json_t *o, pw_model_spec *m, pw_err *err) {
  const json_t *e = json_object_get(o, "moe");
  if (!e) return 0;
  if (!json_is_object(e))
    return pw_err_set(err, PW_ESPEC, "model.moe", "must be an object {experts, top_k, ffn_hidden, gate, ...}");
  int rc = pw__fields_parse(e, "model.moe", moe_fields, PW__N(moe_fields), PW__ALL, "", m, err);
  if (rc) return rc;
  if (m->moe_top_k > m->moe_experts)
    return pw_err_set(err, PW_ESPEC, "model.moe.top_k", "%d is more than the %d experts", m->moe_top_k,
                      m->moe_experts);
  if ((m->moe_shared_hidden || m->moe_shared_gate) && !m->moe_shared)
    return pw_err_set(err, PW_ESPEC, m->moe_shared_gate ? "model.moe.shared_gate" : "model.moe.shared_ffn_hidden",
                      "only with shared_experts >= 1");
  if (m->moe_gate != PW_MOE_GATE_SIGMOID && m->moe_routed_scale != 1.0f)
    return pw_err_set(err, PW_ESPEC, "model.moe.routed_scale", "only with gate \"sigmoid\" (DeepSeek-V3's)");
  return 0;
}

static int moe_emit(json_t *o, const pw_model_spec *m) {
  if (!m->moe_experts) return 0; /* only when set: other specs keep their canonical text */
  json_t *e = json_object();
  return json_object_set_new(o, "moe", e) || pw__fields_emit(e, moe_fields, PW__N(moe_fields), PW__ALL, m);
}

static const pw__field lora_fields[] = {
    PW__INT("rank", 0, PW__ALL, pw_model_spec, lora_rank, 8, 1, 4096),
    PW__FLOAT("alpha", PW__LO_OPEN, PW__ALL, pw_model_spec, lora_alpha, 8, 0, PW__FLT_MAX),
    PW__SKIP("targets", PW__REQ, PW__ALL),
};

/* model.lora: the fields, then targets, a non-empty array of globs over
 * linear layer names (checked against the model when it is built). */
static int lora_parse(const json_t *o, pw_model_spec *m, pw_err *err) {
  const json_t *l = json_object_get(o, "lora");
  if (!l) return 0;
  if (!json_is_object(l)) return pw_err_set(err, PW_ESPEC, "model.lora", "must be an object {rank, alpha, targets}");
  int rc = pw__fields_parse(l, "model.lora", lora_fields, PW__N(lora_fields), PW__ALL, "", m, err);
  if (rc) return rc;
  return pw__globs_get(json_object_get(l, "targets"), "model.lora.targets", PW_LORA_TARGETS_MAX, PW_LORA_TARGET_LEN,
                       m->lora_targets[0], &m->n_lora_targets,
                       "linear layer names (e.g. [\"blocks.*.attn.qkv\"])", err);
}

static int lora_emit(json_t *o, const pw_model_spec *m) {
  if (!m->lora_rank) return 0; /* only when set: other specs keep their canonical text */
  json_t *l = json_object();
  return json_object_set_new(o, "lora", l) || pw__fields_emit(l, lora_fields, PW__N(lora_fields), PW__ALL, m) ||
         pw__globs_emit(l, "targets", m->lora_targets[0], PW_LORA_TARGET_LEN, m->n_lora_targets);
}

/* model.rope_scaling: Hugging Face's config object, rope_type "llama3"
 * only (others refused by name); every field required, as transformers
 * reads them. */
static const char *const rope_types[] = {"llama3"};
static const pw__field rope_fields[] = {
    PW__SKIP("rope_type", PW__REQ, PW__ALL),
    PW__FLOAT("factor", PW__REQ | PW__LO_OPEN, PW__ALL, pw_model_spec, rope_factor, 0, 0, PW__FLT_MAX),
    PW__FLOAT("low_freq_factor", PW__REQ | PW__LO_OPEN, PW__ALL, pw_model_spec, rope_low_freq_factor, 0, 0,
              PW__FLT_MAX),
    PW__FLOAT("high_freq_factor", PW__REQ | PW__LO_OPEN, PW__ALL, pw_model_spec, rope_high_freq_factor, 0, 0,
              PW__FLT_MAX),
    PW__INT("original_max_position_embeddings", PW__REQ, PW__ALL, pw_model_spec, rope_orig_max_pos, 0, 1,
            1 << 30),
};

static int rope_scaling_parse(const json_t *o, pw_model_spec *m, pw_err *err) {
  const json_t *r = json_object_get(o, "rope_scaling");
  if (!r) return 0;
  if (!json_is_object(r))
    return pw_err_set(err, PW_ESPEC, "model.rope_scaling",
                      "must be an object {rope_type, factor, low_freq_factor, high_freq_factor, "
                      "original_max_position_embeddings}");
  int t, rc = pw__enum_get(r, "model.rope_scaling", "rope_type", rope_types, PW__N(rope_types), -1, &t, err);
  if (!rc) rc = pw__fields_parse(r, "model.rope_scaling", rope_fields, PW__N(rope_fields), PW__ALL, "", m, err);
  if (rc) return rc;
  if (!(m->rope_high_freq_factor > m->rope_low_freq_factor))
    return pw_err_set(err, PW_ESPEC, "model.rope_scaling.high_freq_factor", "must be > low_freq_factor (%g <= %g)",
                      (double)m->rope_high_freq_factor, (double)m->rope_low_freq_factor);
  m->rope_scaling = 1 + t;
  return 0;
}

static int rope_scaling_emit(json_t *o, const pw_model_spec *m) {
  if (!m->rope_scaling) return 0;
  json_t *r = json_object();
  return json_object_set_new(o, "rope_scaling", r) ||
         json_object_set_new(r, "rope_type", json_string(rope_types[m->rope_scaling - 1])) ||
         pw__fields_emit(r, rope_fields, PW__N(rope_fields), PW__ALL, m);
}

#define I_TOKENS (1u << PW_INPUT_TOKENS)
#define I_FEATURES (1u << PW_INPUT_FEATURES)
static const pw__field input_fields[] = {
    PW__ENUM("kind", PW__REQ, PW__ALL, pw_model_spec, input, 0, input_names),
    PW__INT("dim", PW__REQ, I_FEATURES, pw_model_spec, input_dim, 0, 1, MAX_DIM),
};

#define L(t) (1u << PW_LAYER_##t)
#define L_BLOCKS (L(GPT_BLOCK) | L(LLAMA_BLOCK))
#define L_ANY_BUT_EMBED (PW__ALL & ~(L(EMBEDDING) | L(POS_EMBEDDING) | L(STAGE_BOUNDARY)))
static const pw__field layer_fields[] = {
    PW__ENUM("type", PW__REQ, PW__ALL, pw_layer_spec, type, 0, layer_names),
    PW__INT("in", PW__NODEF | PW__OMIT0, L_ANY_BUT_EMBED, pw_layer_spec, in, 0, 1, MAX_DIM),
    PW__INT("vocab_size", 0, L(EMBEDDING), pw_layer_spec, vocab_size, 256, 2, MAX_VOCAB),
    PW__INT("out", PW__REQ, L(LINEAR) | L(EMBEDDING), pw_layer_spec, out, 0, 1, MAX_DIM),
    PW__BOOL("bias", 0, L(LINEAR), pw_layer_spec, bias, 1),
    PW__INT("n_heads", PW__REQ, L_BLOCKS, pw_layer_spec, n_heads, 0, 1, MAX_DIM),
    PW__INT("hidden", PW__NODEF | PW__OMIT0, L_BLOCKS, pw_layer_spec, hidden, 0, 1, MAX_DIM),
};

/* {"stage_boundary": {"stage": k}}: the layers after it begin stage k (a
 * hint the partitioner checks; absent: none). */
static const pw__field boundary_fields[] = {
    PW__INT("stage", PW__NODEF | PW__OMIT0, PW__ALL, pw_layer_spec, stage, 0, 1, MAX_MESH_STAGES),
};

static int is_loss(pw_layer_type t) { return t == PW_LAYER_CROSS_ENTROPY || t == PW_LAYER_MSE; }

/* One entry of a layers list: {"type": ..., fields} or {"stage_boundary": {}}. */
int pw__layer_parse(const json_t *e, const char *pre, pw_layer_spec *ls, pw_err *err) {
  char path[128];
  if (!json_is_object(e)) return pw_err_set(err, PW_ESPEC, pre, "must be an object");
  const json_t *sb = json_object_get(e, "stage_boundary");
  if (sb) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)e, key, v) {
      if (strcmp(key, "stage_boundary") == 0) continue;
      pw__path(path, sizeof path, pre, key);
      return pw_err_set(err, PW_ESPEC, path, "a stage_boundary entry takes no other fields");
    }
    pw__path(path, sizeof path, pre, "stage_boundary");
    if (!json_is_object(sb)) return pw_err_set(err, PW_ESPEC, path, "must be {} or {\"stage\": k}");
    ls->type = PW_LAYER_STAGE_BOUNDARY;
    return pw__fields_parse(sb, path, boundary_fields, PW__N(boundary_fields), PW__ALL, "stage_boundary", ls, err);
  }
  int t;
  int rc = pw__enum_get(e, pre, "type", layer_names, N_LAYER_TYPES, -1, &t, err);
  if (rc) return rc;
  char ctx[48];
  snprintf(ctx, sizeof ctx, "type %s", layer_names[t]);
  return pw__fields_parse(e, pre, layer_fields, PW__N(layer_fields), 1u << t, ctx, ls, err);
}

/* The order rules of a layers list, checked after every entry parsed. */
static int layers_check(pw_model_spec *m, pw_err *err) {
  char path[128];
  int n = m->n_layer_specs;
  const pw_layer_spec *ls = m->layers;
  int tokens = m->input == PW_INPUT_TOKENS;
  for (int i = 0; i < n - 1; i++)
    if (is_loss(ls[i].type)) {
      snprintf(path, sizeof path, "model.layers[%d].type", i);
      return pw_err_set(err, PW_ESPEC, path, "a loss (%s) may only be the last layer",
                        layer_names[ls[i].type]);
    }
  if (!is_loss(ls[n - 1].type)) {
    snprintf(path, sizeof path, "model.layers[%d]", n - 1);
    return pw_err_set(err, PW_ESPEC, path, "the last layer must be a loss (cross_entropy or mse)");
  }
  for (int i = 0; i < n; i++) {
    if (ls[i].type != PW_LAYER_STAGE_BOUNDARY) continue;
    snprintf(path, sizeof path, "model.layers[%d]", i);
    if (i == 0 || ls[i - 1].type == PW_LAYER_STAGE_BOUNDARY)
      return pw_err_set(err, PW_ESPEC, path, "stage_boundary makes an empty stage");
    if (i == n - 2)
      return pw_err_set(err, PW_ESPEC, path,
                        "stage_boundary cuts right before the loss (a stage needs a layer besides its loss)");
  }
  for (int i = 0; i < n; i++) {
    pw_layer_type t = ls[i].type;
    snprintf(path, sizeof path, "model.layers[%d].type", i);
    if (i == 0 && tokens && t != PW_LAYER_EMBEDDING)
      return pw_err_set(err, PW_ESPEC, path, "tokens input needs an embedding first (got %s)",
                        layer_names[t]);
    if (t == PW_LAYER_EMBEDDING && !tokens)
      return pw_err_set(err, PW_ESPEC, path, "embedding needs tokens input (model.input.kind is features)");
    if (t == PW_LAYER_EMBEDDING && i > 0)
      return pw_err_set(err, PW_ESPEC, path, "embedding may only be the first layer");
    if (t == PW_LAYER_POS_EMBEDDING && !tokens)
      return pw_err_set(err, PW_ESPEC, path, "pos_embedding needs tokens input (model.input.kind is features)");
  }
  if (tokens && ls[n - 1].type != PW_LAYER_CROSS_ENTROPY) {
    snprintf(path, sizeof path, "model.layers[%d].type", n - 1);
    return pw_err_set(err, PW_ESPEC, path, "a tokens model must end with cross_entropy (got %s)",
                      layer_names[ls[n - 1].type]);
  }
  return 0;
}

int pw__input_parse(const json_t *in, const char *path, int *kind, int *dim, pw_err *err) {
  pw_model_spec tmp = {0};
  int rc = pw__enum_get(in, path, "kind", input_names, 2, -1, kind, err);
  if (!rc)
    rc = pw__fields_parse(in, path, input_fields, PW__N(input_fields), 1u << *kind,
                          *kind == PW_INPUT_TOKENS ? "kind tokens" : "kind features", &tmp, err);
  *dim = tmp.input_dim;
  return rc;
}

json_t *pw__input_emit(int kind, int dim) {
  pw_model_spec tmp = {.input = kind, .input_dim = dim};
  json_t *in = json_object();
  if (in && pw__fields_emit(in, input_fields, PW__N(input_fields), 1u << kind, &tmp)) {
    json_decref(in);
    return NULL;
  }
  return in;
}

json_t *pw__layer_emit(const pw_layer_spec *ls) {
  json_t *e = json_object(), *b = NULL;
  if (!e) return NULL;
  int bad = ls->type == PW_LAYER_STAGE_BOUNDARY
                ? json_object_set_new(e, "stage_boundary", b = json_object()) ||
                      pw__fields_emit(b, boundary_fields, PW__N(boundary_fields), PW__ALL, ls)
                : pw__fields_emit(e, layer_fields, PW__N(layer_fields), 1u << ls->type, ls);
  if (bad) {
    json_decref(e);
    return NULL;
  }
  return e;
}

const char *pw__layer_type_name(int t) { return t >= 0 && t < N_LAYER_TYPES ? layer_names[t] : "stage_boundary"; }

static int layers_parse(const json_t *o, pw_model_spec *m, pw_err *err) {
  const json_t *in;
  int rc = pw__obj_get(o, "model", "input", &in, err);
  if (rc) return rc;
  int kind;
  if ((rc = pw__input_parse(in, "model.input", &kind, &m->input_dim, err))) return rc;
  m->input = (pw_input_kind)kind;

  const json_t *arr = json_object_get(o, "layers");
  if (!json_is_array(arr)) return pw_err_set(err, PW_ESPEC, "model.layers", "must be an array");
  size_t n = json_array_size(arr);
  if (n == 0) return pw_err_set(err, PW_ESPEC, "model.layers", "must not be empty");
  if (n > MAX_LAYER_SPECS)
    return pw_err_set(err, PW_ESPEC, "model.layers", "too many entries (%zu > %d)", n, MAX_LAYER_SPECS);
  m->layers = calloc(n, sizeof *m->layers);
  if (!m->layers) return pw_err_set(err, PW_ENOMEM, "model.layers", "out of memory");
  m->n_layer_specs = (int)n;
  for (size_t i = 0; i < n; i++) {
    char pre[64];
    snprintf(pre, sizeof pre, "model.layers[%zu]", i);
    if ((rc = pw__layer_parse(json_array_get(arr, i), pre, &m->layers[i], err))) return rc;
  }
  if ((rc = layers_check(m, err))) return rc;

  m->loss = m->layers[n - 1].type == PW_LAYER_MSE ? PW_LOSS_MSE : PW_LOSS_CROSS_ENTROPY;
  if (m->input == PW_INPUT_TOKENS) {
    if (!json_object_get(o, "seq_len"))
      return pw_err_set(err, PW_ESPEC, "model.seq_len", "required (tokens input)");
    m->vocab_size = m->layers[0].vocab_size;
  } else {
    if (json_object_get(o, "seq_len"))
      return pw_err_set(err, PW_ESPEC, "model.seq_len", "not used with features input");
    m->seq_len = 1;
  }
  return 0;
}

/* template bert: the rules across its fields. The head decides which of
 * n_labels (classify) and mlm_predictions (mlm) it takes; the special
 * tokens must be ids of the vocabulary, and two of them. */
static int bert_check(const json_t *o, pw_model_spec *m, pw_err *err) {
  int cls = m->bert_head == PW_BERT_HEAD_CLASSIFY;
  if (m->d_model % m->n_heads)
    return pw_err_set(err, PW_ESPEC, "model.n_heads", "must divide d_model (%d %% %d != 0)", m->d_model, m->n_heads);
  if (cls && !m->n_labels)
    return pw_err_set(err, PW_ESPEC, "model.n_labels", "required with bert_head \"classify\" (2 or more classes)");
  if (!cls && json_object_get(o, "n_labels"))
    return pw_err_set(err, PW_ESPEC, "model.n_labels", "not used with bert_head \"mlm\" (classify takes it)");
  if (cls && json_object_get(o, "mlm_predictions"))
    return pw_err_set(err, PW_ESPEC, "model.mlm_predictions", "not used with bert_head \"classify\" (mlm takes it)");
  if (!cls && !m->mlm_predictions) {
    m->mlm_predictions = (15 * m->seq_len + 50) / 100; /* round(0.15 T), BERT's share, half up */
    if (m->mlm_predictions < 1) m->mlm_predictions = 1;
  }
  if (m->mlm_predictions > m->seq_len)
    return pw_err_set(err, PW_ESPEC, "model.mlm_predictions", "must be <= seq_len (%d > %d)", m->mlm_predictions,
                      m->seq_len);
  const char *tok[2] = {"pad_token", "sep_token"};
  int id[2] = {m->pad_token, m->sep_token};
  for (int k = 0; k < 2; k++)
    if (id[k] >= m->vocab_size) {
      char path[32];
      snprintf(path, sizeof path, "model.%s", tok[k]);
      return pw_err_set(err, PW_ESPEC, path, "must be a token id below vocab_size (%d >= %d)", id[k], m->vocab_size);
    }
  if (m->pad_token >= 0 && m->pad_token == m->sep_token)
    return pw_err_set(err, PW_ESPEC, "model.sep_token", "must differ from pad_token (both %d)", m->pad_token);
  if (m->sep_token >= 0 && m->type_vocab_size < 2)
    return pw_err_set(err, PW_ESPEC, "model.type_vocab_size",
                      "must be >= 2 with sep_token (the tokens after the first separator are type 1), got %d",
                      m->type_vocab_size);
  if (m->ffn_hidden == 0) m->ffn_hidden = 4 * m->d_model;
  m->input = PW_INPUT_TOKENS;
  m->loss = PW_LOSS_CROSS_ENTROPY;
  return 0;
}

int pw__model_parse(const json_t *o, pw_model_spec *m, pw_err *err) {
  int rc, t;
  if (json_object_get(o, "regions") && !json_object_get(o, "template")) {
    t = PW_TEMPLATE_REGIONS;
  } else if (json_object_get(o, "template") || !json_object_get(o, "layers")) {
    if (!json_object_get(o, "template"))
      return pw_err_set(err, PW_ESPEC, "model.template",
                        "required: gpt, llama, mlp or bert (or give a \"layers\" list or \"regions\" instead)");
    if ((rc = pw__enum_get(o, "model", "template", tmpl_names, PW__N(tmpl_names), -1, &t, err))) return rc;
  } else {
    t = PW_TEMPLATE_LAYERS;
  }
  /* Defaults the builder reads whatever the template. */
  m->rope_base = 10000.0f;
  m->norm_eps = 1e-5f;
  m->init_std = 0.02f;
  if ((rc = pw__fields_parse(o, "model", model_fields, PW__N(model_fields), 1u << t, tmpl_ctx[t], m,
                             err)) ||
      (rc = lora_parse(o, m, err)) || (rc = rope_scaling_parse(o, m, err)) || (rc = moe_parse(o, m, err)))
    return rc;
  m->tmpl = (pw_template)t;

  switch (m->tmpl) {
    case PW_TEMPLATE_GPT:
    case PW_TEMPLATE_LLAMA:
      /* model.head_dim (llama): heads of a width of their own (Gemma-7B's
       * 16 x 256 over d_model 3072); d_model / n_heads is the default, one
       * canonical text */
      if (m->head_dim && m->d_model % m->n_heads == 0 && m->head_dim == m->d_model / m->n_heads) m->head_dim = 0;
      if (!m->head_dim && m->d_model % m->n_heads)
        return pw_err_set(err, PW_ESPEC, "model.n_heads", "must divide d_model (%d %% %d != 0)%s",
                          m->d_model, m->n_heads, m->tmpl == PW_TEMPLATE_LLAMA ? ", or give model.head_dim" : "");
      if (m->tmpl == PW_TEMPLATE_LLAMA && (m->head_dim ? m->head_dim : m->d_model / m->n_heads) % 2)
        return m->head_dim ? pw_err_set(err, PW_ESPEC, "model.head_dim", "%d: must be even for rotary embeddings",
                                        m->head_dim)
                           : pw_err_set(err, PW_ESPEC, "model.n_heads",
                                        "head_dim must be even for rotary embeddings (d_model/n_heads = %d)",
                                        m->d_model / m->n_heads);
      if (m->n_kv_heads && m->n_heads % m->n_kv_heads)
        return pw_err_set(err, PW_ESPEC, "model.n_kv_heads", "must divide n_heads (%d %% %d != 0)", m->n_heads,
                          m->n_kv_heads);
      if (m->n_kv_heads == m->n_heads) m->n_kv_heads = 0; /* the default: one canonical text */
      if (m->qk_norm && m->norm_offset)
        return pw_err_set(err, PW_ESPEC, "model.norm_offset",
                          "not with qk_norm: the q/k norms scaled by 1 + w (Gemma 3's) are not built");
      if (m->ffn_hidden == 0)
        m->ffn_hidden = m->tmpl == PW_TEMPLATE_GPT ? 4 * m->d_model
                                                   : (8 * m->d_model / 3 + 31) / 32 * 32;
      if (m->moe_experts && !m->moe_hidden) m->moe_hidden = m->ffn_hidden;
      if (m->moe_experts && m->moe_first_dense >= m->n_layers)
        return pw_err_set(err, PW_ESPEC, "model.moe.first_dense", "%d leaves none of the %d blocks a mixture",
                          m->moe_first_dense, m->n_layers);
      m->input = PW_INPUT_TOKENS;
      m->loss = PW_LOSS_CROSS_ENTROPY;
      return 0;
    case PW_TEMPLATE_BERT:
      return bert_check(o, m, err);
    case PW_TEMPLATE_MLP:
      if (m->n_layers > 0 && m->hidden_dim == 0)
        return pw_err_set(err, PW_ESPEC, "model.hidden_dim", "required when n_layers > 0 (n_layers = %d)",
                          m->n_layers);
      m->seq_len = 1;
      m->input = PW_INPUT_FEATURES;
      m->input_dim = m->in_dim;
      return 0;
    case PW_TEMPLATE_LAYERS:
      return layers_parse(o, m, err);
    case PW_TEMPLATE_REGIONS:
      return 0; /* spec.c goes on with pw__regions_parse */
  }
  return pw_err_set(err, PW_EINTERNAL, "model", "bad template");
}

json_t *pw__model_emit(const pw_model_spec *m) {
  json_t *o = json_object();
  if (!o) return NULL;
  unsigned mask = 1u << m->tmpl;
  if (pw__fields_emit(o, model_fields, PW__N(model_fields), mask, m) || lora_emit(o, m) || rope_scaling_emit(o, m) ||
      moe_emit(o, m))
    goto fail;
  if (m->tmpl != PW_TEMPLATE_LAYERS) return o; /* regions: spec.c adds them */

  if (json_object_set_new(o, "input", pw__input_emit(m->input, m->input_dim))) goto fail;
  if (m->input == PW_INPUT_FEATURES) json_object_del(o, "seq_len");
  json_t *arr = json_array();
  if (json_object_set_new(o, "layers", arr)) goto fail;
  for (int i = 0; i < m->n_layer_specs; i++)
    if (json_array_append_new(arr, pw__layer_emit(&m->layers[i]))) goto fail;
  return o;
fail:
  json_decref(o);
  return NULL;
}

void pw__model_free(pw_model_spec *m) {
  for (int r = 0; r < m->n_regions; r++) free(m->regions[r].layers);
  free(m->regions);
  m->regions = NULL;
  m->n_regions = 0;
  free(m->layers);
  m->layers = NULL;
  m->n_layer_specs = 0;
}
