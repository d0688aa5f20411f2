/* model: expands a model spec into the SSA graph of model.h and infers
 * every shape, parameter count, FLOP count and activation size.
 *
 * Templates (gpt, llama, mlp; bert in model_bert.c) and explicit layers
 * lists go through the same small builder (model_build.c): add a value, a
 * node, a parameter. Each composite block is one function used by both the
 * template and the layers list, so a `gpt_block` in a list is exactly a
 * template block. This file never allocates activations or runs ops. */
#include "model.h"

#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_build.h"
#include "optable.h"
#include "suggest.h"

size_t pw_value_bytes(const pw_value *v, int b) {
  if (v->role == PW_VAL_LOSS) return sizeof(float);
  return (size_t)b * (size_t)v->rows * (size_t)v->width * 4u;
}

size_t pw_model_param_count(const pw_model *m) {
  size_t n = 0;
  for (int i = 0; i < m->n_params; i++) n += m->params[i].numel;
  return n;
}

/* ---- builder --------------------------------------------------------- */

typedef pw__mbuild builder; /* model_build.h */

/* model_build.c's builder, under the short names the templates here use */
static int add_value(builder *bd, int rows, int width, pw_dtype dt, pw_val_role role) {
  return pw__mb_value(bd, rows, width, dt, role);
}
static int add_param(builder *bd, const char *name, int d0, int d1, pw_init_kind init, float std) {
  return pw__mb_param(bd, name, d0, d1, init, std);
}
static int param_find(const pw_model *m, const char *name) { return pw__mb_param_find(m, name); }
static int add_node(builder *bd, pw_op op, int in0, int in1, int w, int b, int rows, int width, pw_dtype dt) {
  return pw__mb_node(bd, op, in0, in1, w, b, rows, width, dt);
}
static void begin_layer(builder *bd, const char *name, int spec_index, int is_block) {
  pw__mb_begin_layer(bd, name, spec_index, is_block);
}
static void end_layer(builder *bd) { pw__mb_end_layer(bd); }
static int linear(builder *bd, const char *prefix, int x, int oc, int bias, float std) {
  return pw__mb_linear(bd, prefix, x, oc, bias, std);
}
static int norm(builder *bd, const char *prefix, int x, int rms) { return pw__mb_norm(bd, prefix, x, rms); }
static int unary(builder *bd, pw_op op, int x) { return pw__mb_unary(bd, op, x); }
static int binary(builder *bd, pw_op op, int a, int b) { return pw__mb_binary(bd, op, a, b); }

/* ---- a mixture of experts (model.moe) -------------------------------- */

static int moe_here(const builder *bd) {
  const pw_model_spec *s = bd->spec;
  int i = bd->block_index;
  return s->moe_experts && i >= s->moe_first_dense && (i - s->moe_first_dense) % s->moe_every == 0;
}

/* A node of the mixture: NH its experts, HD the experts a token takes. */
static int moe_node(builder *bd, pw_op op, int in0, int in1, int w, int rows, int width) {
  int y = add_node(bd, op, in0, in1, w, -1, rows, width, PW_DT_F32);
  if (!bd->oom) {
    pw_node *n = &bd->m->nodes[bd->m->n_nodes - 1];
    n->NH = bd->spec->moe_experts;
    n->HD = bd->spec->moe_top_k;
  }
  return y;
}

/* Every expert's linear `prefix` (no bias) over the rows xs: one weight of
 * E x oc rows, expert e's oc rows after e's predecessors'. */
static int glinear(builder *bd, const char *prefix, int xs, int r, int oc, float std) {
  char nm[PW_PARAM_NAME_MAX];
  snprintf(nm, sizeof nm, "%.80s.weight", prefix);
  int w = add_param(bd, nm, bd->spec->moe_experts * oc, bd->m->values[xs].width, PW_INIT_NORMAL, std);
  return moe_node(bd, PW_OP_MOE_GLINEAR, xs, r, w, bd->m->values[xs].rows, oc);
}

/* model.moe's mixture in place of a block's MLP (ops_moe.h), on the
 * normed input h: the router (a linear without bias, "moe.router"), route,
 * dispatch, the experts' MLPs as grouped linears — llama's SwiGLU
 * "moe.experts.gate"/"up"/"down" (GeGLU with mlp_act gelu_tanh), gpt's
 * GELU "moe.experts.fc"/"proj", no biases — and combine; shared experts
 * ("moe.shared.*", the same MLP moe_shared times as wide, no biases) add
 * a dense MLP every token takes. */
static int moe_mlp(builder *bd, const char *p, int h, int llama, float std, float rstd) {
  const pw_model_spec *s = bd->spec;
  char nm[PW_PARAM_NAME_MAX];
  int T = bd->m->values[h].rows, C = bd->m->values[h].width, K = s->moe_top_k, H = s->moe_hidden;
  snprintf(nm, sizeof nm, "%s.moe.router", p);
  int logits = linear(bd, nm, h, s->moe_experts, 0, std);
  int r = moe_node(bd, PW_OP_MOE_ROUTE, logits, -1, -1, T, 2 * K);
  if (!bd->oom) {
    bd->m->nodes[bd->m->n_nodes - 1].pad = s->moe_gate;
    bd->m->nodes[bd->m->n_nodes - 1].base = s->moe_gate == PW_MOE_GATE_SIGMOID ? s->moe_routed_scale : 1.0f;
  }
  int xs = moe_node(bd, PW_OP_MOE_DISPATCH, h, r, -1, T * K, C), a;
  if (llama) {
    snprintf(nm, sizeof nm, "%s.moe.experts.gate", p);
    int g = glinear(bd, nm, xs, r, H, std);
    snprintf(nm, sizeof nm, "%s.moe.experts.up", p);
    a = binary(bd, s->mlp_act == PW_MLP_ACT_GELU_TANH ? PW_OP_GEGLU : PW_OP_SWIGLU, g, glinear(bd, nm, xs, r, H, std));
  } else {
    snprintf(nm, sizeof nm, "%s.moe.experts.fc", p);
    a = unary(bd, PW_OP_GELU, glinear(bd, nm, xs, r, H, std));
  }
  snprintf(nm, sizeof nm, "%s.moe.experts.%s", p, llama ? "down" : "proj");
  int y = moe_node(bd, PW_OP_MOE_COMBINE, glinear(bd, nm, a, r, C, rstd), r, -1, T, C);
  if (!s->moe_shared) return y;
  int HS = s->moe_shared_hidden ? s->moe_shared_hidden : s->moe_shared * H;
  if (llama) {
    snprintf(nm, sizeof nm, "%s.moe.shared.gate", p);
    int g = linear(bd, nm, h, HS, 0, std);
    snprintf(nm, sizeof nm, "%s.moe.shared.up", p);
    a = binary(bd, s->mlp_act == PW_MLP_ACT_GELU_TANH ? PW_OP_GEGLU : PW_OP_SWIGLU, g, linear(bd, nm, h, HS, 0, std));
  } else {
    snprintf(nm, sizeof nm, "%s.moe.shared.fc", p);
    a = unary(bd, PW_OP_GELU, linear(bd, nm, h, HS, 0, std));
  }
  snprintf(nm, sizeof nm, "%s.moe.shared.%s", p, llama ? "down" : "proj");
  int sh = linear(bd, nm, a, C, 0, rstd);
  if (s->moe_shared_gate) { /* Qwen2-MoE: times sigmoid of "moe.shared_gate" [1, d] over h */
    snprintf(nm, sizeof nm, "%s.moe.shared_gate", p);
    int g = linear(bd, nm, h, 1, 0, std);
    sh = add_node(bd, PW_OP_SIGMOID_GATE, sh, g, -1, -1, T, C, PW_DT_F32);
  }
  return binary(bd, PW_OP_ADD, y, sh);
}

/* A transformer block: x + attn(norm1(x)), then + mlp(norm2(x)).
 * nanoGPT's: layernorms "ln1"/"ln2", biases, a GELU MLP "fc"/"proj".
 * Llama's: RMSNorms "norm1"/"norm2", rotary qkv, no biases, a SwiGLU MLP
 * "gate"/"up"/"down"; the template's attention options (model.n_kv_heads:
 * a qkv of (nh + 2 n_kv_heads) HD columns, ops.h's packed rows;
 * model.head_dim: HD other than C / nh, attention's output nh HD wide and
 * attn.proj back to C; model.sliding_window; model.rope_scaling;
 * model.qkv_bias; model.qk_norm: "attn.q_norm" and "attn.k_norm", HD each)
 * on every block, and Gemma's: model.mlp_act "gelu_tanh" (a GeGLU in the
 * SwiGLU's place), model.norm_offset (norm()). */
static int block(builder *bd, const char *p, int x, int nh, int hidden, float std, int n_layers, int llama) {
  char nm[PW_PARAM_NAME_MAX];
  const pw_model_spec *s = bd->spec;
  int C = bd->m->values[x].width, T = bd->m->values[x].rows;
  int hd = llama && s->head_dim > 0 ? s->head_dim : C / nh, Q = nh * hd; /* the queries' width */
  int nkv = llama && s->n_kv_heads > 0 ? s->n_kv_heads : nh, W = Q + 2 * nkv * hd;
  int HD = hd * nh == C ? 0 : hd; /* the nodes' HD: 0 where it is C / nh (plan slices carry it only when not) */
  float rstd = std / sqrtf(2.0f * (float)(n_layers > 0 ? n_layers : 1)); /* residual projections, as GPT-2 */
  snprintf(nm, sizeof nm, "%s.%s", p, llama ? "norm1" : "ln1");
  int h = norm(bd, nm, x, llama);
  snprintf(nm, sizeof nm, "%s.attn.qkv", p);
  h = linear(bd, nm, h, W, !llama || s->qkv_bias, std);
  if (llama && s->qk_norm) { /* Qwen3: q_norm, k_norm over each head, before rope */
    snprintf(nm, sizeof nm, "%s.attn.q_norm.weight", p);
    int wq = add_param(bd, nm, hd, 0, PW_INIT_ONES, 0);
    snprintf(nm, sizeof nm, "%s.attn.k_norm.weight", p);
    int wk = add_param(bd, nm, hd, 0, PW_INIT_ONES, 0);
    h = add_node(bd, PW_OP_QKNORM, h, -1, wq, wk, T, W, PW_DT_F32);
    if (bd->oom) return h;
    bd->m->nodes[bd->m->n_nodes - 1].NH = nh;
    bd->m->nodes[bd->m->n_nodes - 1].NKV = nkv == nh ? 0 : nkv;
    bd->m->nodes[bd->m->n_nodes - 1].HD = HD;
  }
  if (llama) {
    h = add_node(bd, PW_OP_ROPE, h, -1, -1, -1, T, W, PW_DT_F32);
    if (bd->oom) return h;
    pw_node *n = &bd->m->nodes[bd->m->n_nodes - 1];
    n->NH = nh;
    n->NKV = nkv == nh ? 0 : nkv; /* 0: NH (plan slices carry it only when not) */
    n->HD = HD;
    if (s->rope_scaling) {
      n->rope_factor = s->rope_factor;
      n->rope_low_freq = s->rope_low_freq_factor;
      n->rope_high_freq = s->rope_high_freq_factor;
      n->rope_orig_max_pos = s->rope_orig_max_pos;
    }
  }
  h = add_node(bd, (pw_op)pw_attention_op(PW_ATTN_AUTO, T, hd), h, -1, -1, -1, T, Q, PW_DT_F32);
  if (bd->oom) return h;
  pw_node *an = &bd->m->nodes[bd->m->n_nodes - 1];
  an->NH = nh;
  an->NKV = nkv == nh ? 0 : nkv;
  an->HD = HD;
  an->window = llama ? s->sliding_window : 0;
  snprintf(nm, sizeof nm, "%s.attn.proj", p);
  h = linear(bd, nm, h, C, !llama, rstd);
  x = binary(bd, PW_OP_ADD, x, h);
  snprintf(nm, sizeof nm, "%s.%s", p, llama ? "norm2" : "ln2");
  h = norm(bd, nm, x, llama);
  if (moe_here(bd)) return binary(bd, PW_OP_ADD, x, moe_mlp(bd, p, h, llama, std, rstd));
  if (llama) {
    snprintf(nm, sizeof nm, "%s.mlp.gate", p);
    int g = linear(bd, nm, h, hidden, 0, std);
    snprintf(nm, sizeof nm, "%s.mlp.up", p);
    int u = linear(bd, nm, h, hidden, 0, std);
    h = binary(bd, s->mlp_act == PW_MLP_ACT_GELU_TANH ? PW_OP_GEGLU : PW_OP_SWIGLU, g, u);
  } else {
    snprintf(nm, sizeof nm, "%s.mlp.fc", p);
    h = linear(bd, nm, h, hidden, 1, std);
    h = unary(bd, PW_OP_GELU, h);
  }
  snprintf(nm, sizeof nm, "%s.mlp.%s", p, llama ? "down" : "proj");
  h = linear(bd, nm, h, C, !llama, rstd);
  return binary(bd, PW_OP_ADD, x, h);
}

static int token_embed(builder *bd, const char *name, int tok, int V, int C, float std) {
  int w = add_param(bd, name, V, C, PW_INIT_NORMAL, std);
  return add_node(bd, PW_OP_EMBED, tok, -1, w, -1, bd->m->values[tok].rows, C, PW_DT_F32);
}

static int pos_embed(builder *bd, const char *name, int x, float std) { return pw__mb_pos_embed(bd, name, x, std); }

static int loss_node(builder *bd, pw_op op, int pred) {
  return add_node(bd, op, pred, bd->m->target_value, -1, -1, 0, 1, PW_DT_F32);
}

int pw_llama_ffn_default(int d) { return ((8 * d / 3) + 31) / 32 * 32; }


/* ---- templates ------------------------------------------------------- */

static void build_transformer(builder *bd, int llama) {
  const pw_model_spec *s = bd->spec;
  pw_model *m = bd->m;
  int T = s->seq_len, C = s->d_model, V = s->vocab_size;
  float std = s->init_std > 0 ? s->init_std : 0.02f;
  int hidden = s->ffn_hidden > 0 ? s->ffn_hidden : (llama ? pw_llama_ffn_default(C) : 4 * C);
  char nm[48];

  m->input_value = add_value(bd, T, 1, PW_DT_I32, PW_VAL_INPUT);
  m->target_value = add_value(bd, T, 1, PW_DT_I32, PW_VAL_TARGET);
  begin_layer(bd, "embed", -1, 0);
  int x = token_embed(bd, "embed.tok.weight", m->input_value, V, C, std);
  if (!llama) x = pos_embed(bd, "embed.pos.weight", x, std);
  if (llama && s->embed_scale) { /* Gemma: times sqrt(d), rounded to float as transformers does */
    x = unary(bd, PW_OP_SCALE, x);
    if (!bd->oom) m->nodes[m->n_nodes - 1].base = (float)sqrt((double)C);
  }
  end_layer(bd);
  for (int i = 0; i < s->n_layers && !bd->oom; i++) {
    snprintf(nm, sizeof nm, "blocks.%d", i);
    begin_layer(bd, nm, -1, 1);
    bd->block_index = i;
    x = block(bd, nm, x, s->n_heads, hidden, std, s->n_layers, llama);
    bd->block_index = -1;
    end_layer(bd);
  }
  begin_layer(bd, "head", -1, 0);
  x = norm(bd, llama ? "norm_f" : "ln_f", x, llama);
  if (s->tie_embeddings) {
    int w = param_find(m, "embed.tok.weight");
    x = add_node(bd, PW_OP_LINEAR, x, -1, w, -1, T, V, PW_DT_F32);
  } else {
    x = linear(bd, "lm_head", x, V, 0, std);
  }
  m->loss_value = loss_node(bd, PW_OP_XENT, x);
  end_layer(bd);
  m->data = (pw_data_shape){.vocab_size = V, .seq_len = T, .tokens = 1};
}

static pw_op act_op(pw_act_kind a) {
  return a == PW_ACT_GELU ? PW_OP_GELU : a == PW_ACT_SILU ? PW_OP_SILU : PW_OP_RELU;
}

static void build_mlp(builder *bd) {
  const pw_model_spec *s = bd->spec;
  pw_model *m = bd->m;
  int ce = s->loss == PW_LOSS_CROSS_ENTROPY;
  char nm[48], pn[64];
  m->input_value = add_value(bd, 1, s->in_dim, PW_DT_F32, PW_VAL_INPUT);
  m->target_value = ce ? add_value(bd, 1, 1, PW_DT_I32, PW_VAL_TARGET)
                       : add_value(bd, 1, s->out_dim, PW_DT_F32, PW_VAL_TARGET);
  int x = m->input_value;
  for (int i = 0; i < s->n_layers && !bd->oom; i++) {
    snprintf(nm, sizeof nm, "blocks.%d", i);
    begin_layer(bd, nm, -1, 1);
    snprintf(pn, sizeof pn, "%s.fc", nm);
    x = linear(bd, pn, x, s->hidden_dim, 1, 1.0f / sqrtf((float)m->values[x].width));
    x = unary(bd, act_op(s->activation), x);
    end_layer(bd);
  }
  begin_layer(bd, "head", -1, 0);
  x = linear(bd, "head", x, s->out_dim, 1, 1.0f / sqrtf((float)m->values[x].width));
  m->loss_value = loss_node(bd, ce ? PW_OP_XENT : PW_OP_MSE, x);
  end_layer(bd);
  m->data = (pw_data_shape){.seq_len = 1, .in_dim = s->in_dim, .out_dim = s->out_dim, .tokens = 0};
}

/* A chain of layer specs (a layers list, or one region's), each reading
 * the previous layer's output, from value x; the output value (or the loss)
 * in *x. Layers are named pre + "layers.i" (i the entry's index), errors
 * say path + "[i]". Widths left out are inferred; widths given must agree.
 * feat_std: linear layers draw from 1/sqrt(in) (a features input) rather
 * than init_std. *vocab: the embedding's vocabulary (left alone without
 * one); *n_out: the loss's width. */
typedef struct {
  const pw_layer_spec *ls;
  int n;
  const char *pre, *path;
  int n_blocks, feat_std, region;
} chain_spec;

static int build_chain(builder *bd, const chain_spec *c, int *x_io, int *vocab, int *n_out, pw_err *err) {
  const pw_model_spec *s = bd->spec;
  pw_model *m = bd->m;
  float std = s->init_std > 0 ? s->init_std : 0.02f;
  char path[96], nm[48];
  int x = *x_io;
  for (int i = 0; i < c->n && !bd->oom; i++) {
    const pw_layer_spec *ls = &c->ls[i];
    snprintf(path, sizeof path, "%s[%d]", c->path, i);
    if (ls->type == PW_LAYER_STAGE_BOUNDARY) {
      m->markers = realloc(m->markers, sizeof(int) * (size_t)(m->n_markers + 1));
      if (!m->markers) return pw_err_set(err, PW_ENOMEM, path, "out of memory");
      m->markers[m->n_markers++] = m->n_layers;
      continue;
    }
    const pw_value xval = m->values[x]; /* a copy: adding values may move the array */
    const pw_value *xv = &xval;
    int is_tok = xv->dtype == PW_DT_I32;
    if (ls->type == PW_LAYER_EMBEDDING) {
      if (!is_tok)
        return pw_err_set(err, PW_ESPEC, path, "embedding needs token input, but its input is a float value of width %d", xv->width);
    } else if (is_tok) {
      return pw_err_set(err, PW_ESPEC, path, "the input is tokens: the first layer must be an embedding");
    }
    if (ls->in > 0 && !is_tok && ls->in != xv->width)
      return pw_err_set(err, PW_ESPEC, path, "in: expected %d (the previous layer's output), got %d", xv->width, ls->in);
    if ((ls->type == PW_LAYER_POS_EMBEDDING || ls->type == PW_LAYER_GPT_BLOCK ||
         ls->type == PW_LAYER_LLAMA_BLOCK) && xv->rows != s->seq_len)
      return pw_err_set(err, PW_ESPEC, path, "needs a sequence input (token model)");
    if ((ls->type == PW_LAYER_GPT_BLOCK || ls->type == PW_LAYER_LLAMA_BLOCK) && (ls->n_heads <= 0 || xv->width % ls->n_heads))
      return pw_err_set(err, PW_ESPEC, path, "n_heads: must divide the input width (%d %% %d != 0)", xv->width, ls->n_heads);
    if (ls->type == PW_LAYER_LLAMA_BLOCK && (xv->width / ls->n_heads) % 2)
      return pw_err_set(err, PW_ESPEC, path, "n_heads: head_dim must be even for rotary embeddings (%d/%d = %d)", xv->width, ls->n_heads, xv->width / ls->n_heads);
    int is_block = ls->type == PW_LAYER_GPT_BLOCK || ls->type == PW_LAYER_LLAMA_BLOCK;
    snprintf(nm, sizeof nm, "%slayers.%d", c->pre, i);
    begin_layer(bd, nm, i, is_block);
    if (bd->oom) break;
    m->layers[bd->layer].region = c->region;
    char pn[64];
    switch (ls->type) {
      case PW_LAYER_EMBEDDING:
        *vocab = ls->vocab_size;
        snprintf(pn, sizeof pn, "%s.weight", nm);
        x = token_embed(bd, pn, x, ls->vocab_size, ls->out, std);
        break;
      case PW_LAYER_POS_EMBEDDING:
        snprintf(pn, sizeof pn, "%s.weight", nm);
        x = pos_embed(bd, pn, x, std);
        break;
      case PW_LAYER_LINEAR:
        x = linear(bd, nm, x, ls->out, ls->bias, c->feat_std ? 1.0f / sqrtf((float)xv->width) : std);
        break;
      case PW_LAYER_LAYERNORM: x = norm(bd, nm, x, 0); break;
      case PW_LAYER_RMSNORM: x = norm(bd, nm, x, 1); break;
      case PW_LAYER_GELU: x = unary(bd, PW_OP_GELU, x); break;
      case PW_LAYER_RELU: x = unary(bd, PW_OP_RELU, x); break;
      case PW_LAYER_SILU: x = unary(bd, PW_OP_SILU, x); break;
      case PW_LAYER_GPT_BLOCK:
        x = block(bd, nm, x, ls->n_heads, ls->hidden > 0 ? ls->hidden : 4 * xv->width, std, c->n_blocks, 0);
        break;
      case PW_LAYER_LLAMA_BLOCK:
        x = block(bd, nm, x, ls->n_heads, ls->hidden > 0 ? ls->hidden : pw_llama_ffn_default(xv->width), std,
                  c->n_blocks, 1);
        break;
      case PW_LAYER_CROSS_ENTROPY:
        if (i != c->n - 1)
          return pw_err_set(err, PW_ESPEC, path, "a loss must be the last layer");
        m->target_value = add_value(bd, xv->rows, 1, PW_DT_I32, PW_VAL_TARGET);
        if (*vocab && xv->width != *vocab)
          return pw_err_set(err, PW_ESPEC, path, "cross_entropy over %d classes, but the vocabulary has %d tokens", xv->width, *vocab);
        m->loss_value = x = loss_node(bd, PW_OP_XENT, x);
        m->layers[bd->layer].is_loss = 1;
        *n_out = xv->width;
        break;
      case PW_LAYER_MSE:
        if (i != c->n - 1)
          return pw_err_set(err, PW_ESPEC, path, "a loss must be the last layer");
        if (*vocab) return pw_err_set(err, PW_ESPEC, path, "mse needs a feature model (input kind features)");
        m->target_value = add_value(bd, 1, xv->width, PW_DT_F32, PW_VAL_TARGET);
        m->loss_value = x = loss_node(bd, PW_OP_MSE, x);
        m->layers[bd->layer].is_loss = 1;
        *n_out = xv->width;
        break;
      case PW_LAYER_STAGE_BOUNDARY: break;
    }
    end_layer(bd);
  }
  *x_io = x;
  return 0;
}

static int count_blocks(const pw_layer_spec *ls, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) k += ls[i].type == PW_LAYER_GPT_BLOCK || ls[i].type == PW_LAYER_LLAMA_BLOCK;
  return k;
}

/* An explicit layers list: one chain from the model's input. */
static int build_layers(builder *bd, pw_err *err) {
  const pw_model_spec *s = bd->spec;
  pw_model *m = bd->m;
  int tokens = s->input == PW_INPUT_TOKENS;
  int T = tokens ? s->seq_len : 1;
  m->input_value = tokens ? add_value(bd, T, 1, PW_DT_I32, PW_VAL_INPUT)
                          : add_value(bd, 1, s->input_dim, PW_DT_F32, PW_VAL_INPUT);
  m->target_value = -1;
  int x = m->input_value, vocab = 0, n_out = 0;
  chain_spec c = {s->layers, s->n_layer_specs, "", "model.layers", count_blocks(s->layers, s->n_layer_specs),
                  !tokens, 0};
  int rc = build_chain(bd, &c, &x, &vocab, &n_out, err);
  if (rc) return rc;
  if (bd->oom) return pw_err_set(err, PW_ENOMEM, "model", "out of memory");
  if (m->target_value < 0)
    return pw_err_set(err, PW_ESPEC, "model.layers", "the last layer must be a loss (cross_entropy or mse)");
  for (int k = 0; k < m->n_markers; k++)
    if (m->markers[k] == 0 || m->markers[k] >= m->n_layers || m->layers[m->markers[k]].is_loss ||
        (k > 0 && m->markers[k] == m->markers[k - 1]))
      return pw_err_set(err, PW_ESPEC, "model.layers",
                        "stage_boundary %d makes an empty stage or cuts before the loss", k);
  m->data = (pw_data_shape){.vocab_size = vocab, .seq_len = T, .in_dim = tokens ? 0 : s->input_dim,
                            .out_dim = n_out, .tokens = tokens};
  return 0;
}

/* A regions model (model.regions): each region a chain, in the spec's
 * order (every region after those feeding it). A source region reads the
 * model's tokens or its per-position features; any other begins with its
 * fusion layer "<name>.fuse" joining its upstream regions' outputs in the
 * graph's order (left to right: ((a, b), c)), unless one region feeds it. */
static int build_regions(builder *bd, pw_err *err) {
  const pw_model_spec *s = bd->spec;
  pw_model *m = bd->m;
  int T = s->seq_len, out[PW_REGIONS_MAX], vocab = s->vocab_size, n_out = 0, g = 0;
  char pre[40], path[64], nm[48];
  m->input_value = m->target_value = -1;
  for (int r = 0; r < s->n_regions && !bd->oom; r++) {
    const pw_region_spec *rg = &s->regions[r];
    int x, feat = rg->has_input && rg->input == PW_INPUT_FEATURES;
    if (rg->has_input && !feat) {
      if (m->input_value < 0) m->input_value = add_value(bd, T, 1, PW_DT_I32, PW_VAL_INPUT);
      x = m->input_value;
    } else if (feat) {
      if (m->feature_value < 0) m->feature_value = add_value(bd, T, rg->input_dim, PW_DT_F32, PW_VAL_INPUT);
      x = m->feature_value;
      if (!bd->oom && m->values[x].width != rg->input_dim) {
        snprintf(path, sizeof path, "model.regions[%d].input.dim", r);
        return pw_err_set(err, PW_ESPEC, path, "%d, but the data has one features input and an earlier region reads "
                          "it with dim %d", rg->input_dim, m->values[x].width);
      }
    } else {
      snprintf(path, sizeof path, "model.graph[%d]", g++);
      x = out[rg->from[0]];
      if (rg->n_from > 1) {
        snprintf(nm, sizeof nm, "%s.fuse", rg->name);
        begin_layer(bd, nm, -1, 0);
        if (bd->oom) break;
        m->layers[bd->layer].region = r;
      }
      for (int k = 1; k < rg->n_from && !bd->oom; k++) {
        const pw_value a = m->values[x], b = m->values[out[rg->from[k]]];
        if (rg->fusion == PW_FUSION_ADD && a.width != b.width)
          return pw_err_set(err, PW_ESPEC, path, "add into region '%s' needs equal widths: %s gives %d, '%s' gives %d",
                            rg->name, k == 1 ? "the first" : "the sum so far", a.width, s->regions[rg->from[k]].name,
                            b.width);
        if (a.rows != b.rows)
          return pw_err_set(err, PW_ESPEC, path, "%s into region '%s' needs the same rows per sequence (%d and %d)",
                            rg->fusion == PW_FUSION_ADD ? "add" : "concat", rg->name, a.rows, b.rows);
        x = rg->fusion == PW_FUSION_ADD ? binary(bd, PW_OP_ADD, x, out[rg->from[k]])
                                        : add_node(bd, PW_OP_CONCAT, x, out[rg->from[k]], -1, -1, a.rows,
                                                   a.width + b.width, PW_DT_F32);
      }
      if (rg->n_from > 1) end_layer(bd);
    }
    snprintf(pre, sizeof pre, "%s.", rg->name);
    snprintf(path, sizeof path, "model.regions[%d].layers", r);
    int v = vocab;
    chain_spec c = {rg->layers, rg->n_layer_specs, pre, path, count_blocks(rg->layers, rg->n_layer_specs), feat, r};
    int rc = build_chain(bd, &c, &x, &v, &n_out, err);
    if (rc) return rc;
    if (v != vocab) {
      snprintf(path, sizeof path, "model.regions[%d].layers[0].vocab_size", r);
      return pw_err_set(err, PW_ESPEC, path, "%d, but another region embeds the same tokens with %d", v, vocab);
    }
    out[r] = x;
  }
  if (bd->oom) return pw_err_set(err, PW_ENOMEM, "model", "out of memory");
  m->data = (pw_data_shape){.vocab_size = n_out, .seq_len = T, .tokens = 1,
                            .feature_dim = m->feature_value >= 0 ? m->values[m->feature_value].width : 0};
  return 0;
}

/* ---- accounting ------------------------------------------------------ */

/* FLOPs and auxiliaries from the op table (optable.c), added into n's
 * layer (sign 1) or taken out of it (-1). */
static void count_node(pw_model *m, pw_node *n, int sign) {
  pw_layer *l = &m->layers[n->layer];
  const pw_value *in = &m->values[n->in[0]], *out = &m->values[n->out];
  double fl[3];
  pw_op_flops(n, in, fl);
  l->flops_f += sign * fl[0];
  l->flops_i += sign * fl[1];
  l->flops_w += sign * fl[2];
  n->aux = pw_op_aux(n, in);
  size_t bytes = n->aux * 4 + (out->role == PW_VAL_LOSS ? 0 : pw_value_bytes(out, 1));
  l->act_bytes = sign > 0 ? l->act_bytes + bytes : l->act_bytes - bytes;
}

void pw_model_set_attention(pw_model *m, int impl) {
  for (int i = 0; i < m->n_nodes; i++) {
    pw_node *n = &m->nodes[i];
    int op = pw_attention_op(impl, n->T, n->NH ? n->OC / n->NH : 1);
    if ((n->op != PW_OP_ATTENTION && n->op != PW_OP_ATTENTION_TILED) || n->op == op) continue;
    count_node(m, n, -1);
    n->op = (uint8_t)op;
    count_node(m, n, 1);
  }
}

int pw_model_build(const pw_model_spec *spec, pw_model *m, pw_err *err) {
  memset(m, 0, sizeof *m);
  m->feature_value = -1;
  builder bd = {.m = m, .spec = spec, .block_index = -1};
  int rc = 0;
  switch (spec->tmpl) {
    case PW_TEMPLATE_GPT: build_transformer(&bd, 0); break;
    case PW_TEMPLATE_LLAMA: build_transformer(&bd, 1); break;
    case PW_TEMPLATE_MLP: build_mlp(&bd); break;
    case PW_TEMPLATE_BERT: pw__build_bert(&bd); break;
    case PW_TEMPLATE_LAYERS: rc = build_layers(&bd, err); break;
    case PW_TEMPLATE_REGIONS: rc = build_regions(&bd, err); break;
  }
  if (!rc && bd.oom) rc = pw_err_set(err, PW_ENOMEM, "model", "out of memory");
  for (int i = 0; !rc && spec->lora_rank && i < spec->n_lora_targets; i++)
    if (!(bd.lora_hit >> i & 1)) {
      char path[48];
      snprintf(path, sizeof path, "model.lora.targets[%d]", i);
      rc = pw_err_set(err, PW_ESPEC, path, "'%s' matches no linear layer (names like 'blocks.0.attn.qkv', "
                      "'blocks.0.mlp.fc', 'lm_head')", spec->lora_targets[i]);
    }
  if (rc) {
    pw_model_free(m);
    return rc;
  }
  m->seq_len = m->data.seq_len;
  for (int i = 0; i < m->n_nodes; i++) count_node(m, &m->nodes[i], 1);
  /* out_bytes: what a layer hands on = the values it produces that a later
   * layer reads. */
  for (int i = 0; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    for (int k = 0; k < 2; k++) {
      int v = n->in[k];
      if (v < 0 || m->values[v].producer < 0) continue;
      int pl = m->nodes[m->values[v].producer].layer;
      if (pl != n->layer) {
        /* count each value once per consumer layer boundary */
        int first = 1;
        for (int j = m->layers[n->layer].node_lo; j < i; j++)
          if (m->nodes[j].in[0] == v || m->nodes[j].in[1] == v) first = 0;
        if (first) m->layers[pl].out_bytes += pw_value_bytes(&m->values[v], 1);
      }
    }
  }
  return 0;
}

/* W of node n is skipped when none of its parameters trains (prog.c). */
static int node_frozen(const pw_model *m, const pw_node *n) {
  return (n->w < 0 || m->params[n->w].frozen) && (n->b < 0 || m->params[n->b].frozen);
}

int pw_param_is_adapter(const pw_param *p) {
  size_t n = strlen(p->name), k = strlen(".lora_A.weight");
  return n > k && (!strcmp(p->name + n - k, ".lora_A.weight") || !strcmp(p->name + n - k, ".lora_B.weight"));
}

int pw_model_set_trainable(pw_model *m, const pw_train_spec *tr, pw_err *err) {
  int adapters = 0;
  for (int i = 0; i < m->n_params; i++) adapters |= pw_param_is_adapter(&m->params[i]);
  if (!tr->n_trainable && !adapters) return 0;
  /* with LoRA and no train.trainable, only the adapters train */
  for (int i = 0; i < m->n_params; i++) m->params[i].frozen = !tr->n_trainable ? !pw_param_is_adapter(&m->params[i]) : 1;
  for (int k = 0; k < tr->n_trainable; k++) {
    int hit = 0;
    for (int i = 0; i < m->n_params; i++)
      if (fnmatch(tr->trainable[k], m->params[i].name, 0) == 0) m->params[i].frozen = 0, hit = 1;
    if (hit) continue;
    const char **names = malloc(sizeof *names * (size_t)(m->n_params + 1));
    char sug[160] = "", path[48];
    if (names) {
      for (int i = 0; i < m->n_params; i++) names[i] = m->params[i].name;
      pw_suggest_text(tr->trainable[k], names, m->n_params, "", sug, sizeof sug);
    }
    free(names);
    snprintf(path, sizeof path, "train.trainable[%d]", k);
    return pw_err_set(err, PW_ESPEC, path, "'%s' matches no parameter of the model (names like '%s')%s",
                      tr->trainable[k], m->params[m->n_params - 1].name, sug);
  }
  /* recounted rather than subtracted: a frozen layer's W is exactly 0 */
  for (int l = 0; l < m->n_layers; l++) m->layers[l].flops_w = 0;
  for (int i = 0; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    double fl[3];
    pw_op_flops(n, &m->values[n->in[0]], fl);
    if (!node_frozen(m, n)) m->layers[n->layer].flops_w += fl[2];
  }
  return 0;
}

size_t pw_model_trainable_count(const pw_model *m) {
  size_t n = 0;
  for (int i = 0; i < m->n_params; i++) n += m->params[i].frozen ? 0 : m->params[i].numel;
  return n;
}

void pw_model_free(pw_model *m) {
  free(m->values);
  free(m->nodes);
  free(m->params);
  free(m->layers);
  free(m->markers);
  memset(m, 0, sizeof *m);
}
