/* model_bert: template bert — a BERT encoder as Hugging Face's
 * BertForMaskedLM and BertForSequenceClassification compute it, in
 * model.c's graph (docs/contracts.md#models names every tensor).
 *
 *   embed      x = LN(tok[t] + type[type(t)] + pos[t]), the types a function
 *              of the tokens (model.sep_token; ops_enc.h)
 *   blocks.i   post-LN: x = ln1(x + proj(attn(qkv(x)))), then
 *              x = ln2(x + mlp.proj(gelu_erf(mlp.fc(x)))); every query sees
 *              every key but those holding model.pad_token
 *   head       mlm: logits = ln(gelu_erf(transform(x))) tok^T + decoder.bias
 *              at every position, the loss over the masked ones (targets
 *              >= 0), divided by B K; classify: logits = classifier(tanh(
 *              pooler(x[0]))), one label a sequence
 *
 * Every weight is drawn N(0, init_std) as BERT's (no residual scaling),
 * biases 0, norms 1 and 0; the decoder always reads the token embedding. */
#include <stdio.h>

#include "model_build.h"

/* Bidirectional attention over the packed qkv h; with a padding token it
 * reads the model's tokens tok too (model.h's pad), so any stage holding
 * it draws them. */
static int attention(pw__mbuild *bd, int h, int tok) {
  const pw_model_spec *s = bd->spec;
  int T = s->seq_len, C = s->d_model, pad = s->pad_token >= 0;
  h = pw__mb_node(bd, (pw_op)pw_attention_op(PW_ATTN_AUTO, T, C / s->n_heads), h, pad ? tok : -1, -1, -1, T, C,
                  PW_DT_F32);
  if (bd->oom) return h;
  pw_node *n = &bd->m->nodes[bd->m->n_nodes - 1];
  n->NH = s->n_heads;
  n->bidir = 1;
  n->pad = pad ? s->pad_token : 0;
  return h;
}

/* Block p: post-LN, transformers' BertLayer (attention, then the MLP). */
static int block(pw__mbuild *bd, const char *p, int x, int tok) {
  const pw_model_spec *s = bd->spec;
  char nm[PW_PARAM_NAME_MAX];
  int C = s->d_model;
  float std = s->init_std > 0 ? s->init_std : 0.02f;
  snprintf(nm, sizeof nm, "%s.attn.qkv", p);
  int h = pw__mb_linear(bd, nm, x, 3 * C, 1, std);
  h = attention(bd, h, tok);
  snprintf(nm, sizeof nm, "%s.attn.proj", p);
  h = pw__mb_linear(bd, nm, h, C, 1, std);
  x = pw__mb_binary(bd, PW_OP_ADD, h, x); /* transformers' LayerNorm(hidden + input) */
  snprintf(nm, sizeof nm, "%s.ln1", p);
  x = pw__mb_norm(bd, nm, x, 0);
  snprintf(nm, sizeof nm, "%s.mlp.fc", p);
  h = pw__mb_linear(bd, nm, x, s->ffn_hidden > 0 ? s->ffn_hidden : 4 * C, 1, std);
  h = pw__mb_unary(bd, PW_OP_GELU_ERF, h);
  snprintf(nm, sizeof nm, "%s.mlp.proj", p);
  h = pw__mb_linear(bd, nm, h, C, 1, std);
  x = pw__mb_binary(bd, PW_OP_ADD, h, x);
  snprintf(nm, sizeof nm, "%s.ln2", p);
  return pw__mb_norm(bd, nm, x, 0);
}

/* The token, type and position embeddings, summed in transformers' order
 * ((tok + type) + pos), then their LayerNorm. */
static int embed(pw__mbuild *bd, int tok) {
  const pw_model_spec *s = bd->spec;
  pw_model *m = bd->m;
  int T = s->seq_len, C = s->d_model, pad = s->pad_token;
  float std = s->init_std > 0 ? s->init_std : 0.02f;
  int w = pw__mb_param(bd, "embed.tok.weight", s->vocab_size, C, PW_INIT_NORMAL, std);
  int x = pw__mb_node(bd, pad >= 0 ? PW_OP_EMBED_PAD : PW_OP_EMBED, tok, -1, w, -1, T, C, PW_DT_F32);
  if (!bd->oom && pad >= 0) m->nodes[m->n_nodes - 1].pad = pad;
  w = pw__mb_param(bd, "embed.type.weight", s->type_vocab_size > 0 ? s->type_vocab_size : 2, C, PW_INIT_NORMAL,
                   std);
  x = pw__mb_node(bd, PW_OP_TOKTYPE, x, tok, w, -1, T, C, PW_DT_F32);
  if (!bd->oom) {
    m->nodes[m->n_nodes - 1].NH = s->sep_token;
    m->nodes[m->n_nodes - 1].pad = pad;
  }
  x = pw__mb_pos_embed(bd, "embed.pos.weight", x, std);
  return pw__mb_norm(bd, "embed.ln", x, 0);
}

/* BertOnlyMLMHead: transform, GELU, LayerNorm, then the decoder tied to
 * the token embedding with a bias of its own; the loss over K a sequence. */
static int head_mlm(pw__mbuild *bd, int x) {
  const pw_model_spec *s = bd->spec;
  pw_model *m = bd->m;
  int T = s->seq_len, C = s->d_model, V = s->vocab_size;
  float std = s->init_std > 0 ? s->init_std : 0.02f;
  int h = pw__mb_linear(bd, "head.transform", x, C, 1, std);
  h = pw__mb_unary(bd, PW_OP_GELU_ERF, h);
  h = pw__mb_norm(bd, "head.ln", h, 0);
  int b = pw__mb_param(bd, "head.decoder.bias", V, 0, PW_INIT_ZEROS, 0);
  h = pw__mb_node(bd, PW_OP_LINEAR, h, -1, pw__mb_param_find(m, "embed.tok.weight"), b, T, V, PW_DT_F32);
  int loss = pw__mb_node(bd, PW_OP_XENT_MLM, h, m->target_value, -1, -1, 0, 1, PW_DT_F32);
  if (!bd->oom) m->nodes[m->n_nodes - 1].NH = s->mlm_predictions;
  return loss;
}

/* BertForSequenceClassification: the pooler (the first position, a
 * linear, tanh), the classifier, cross-entropy against one label. */
static int head_classify(pw__mbuild *bd, int x) {
  const pw_model_spec *s = bd->spec;
  float std = s->init_std > 0 ? s->init_std : 0.02f;
  int h = pw__mb_node(bd, PW_OP_FIRST_ROW, x, -1, -1, -1, 1, s->d_model, PW_DT_F32);
  h = pw__mb_linear(bd, "head.pooler", h, s->d_model, 1, std);
  h = pw__mb_unary(bd, PW_OP_TANH, h);
  h = pw__mb_linear(bd, "head.classifier", h, s->n_labels, 1, std);
  return pw__mb_node(bd, PW_OP_XENT, h, bd->m->target_value, -1, -1, 0, 1, PW_DT_F32);
}

void pw__build_bert(pw__mbuild *bd) {
  const pw_model_spec *s = bd->spec;
  pw_model *m = bd->m;
  int T = s->seq_len, cls = s->bert_head == PW_BERT_HEAD_CLASSIFY;
  char nm[48];
  m->input_value = pw__mb_value(bd, T, 1, PW_DT_I32, PW_VAL_INPUT);
  m->target_value = pw__mb_value(bd, cls ? 1 : T, 1, PW_DT_I32, PW_VAL_TARGET);
  pw__mb_begin_layer(bd, "embed", -1, 0);
  int x = embed(bd, m->input_value);
  pw__mb_end_layer(bd);
  for (int i = 0; i < s->n_layers && !bd->oom; i++) {
    snprintf(nm, sizeof nm, "blocks.%d", i);
    pw__mb_begin_layer(bd, nm, -1, 1);
    x = block(bd, nm, x, m->input_value);
    pw__mb_end_layer(bd);
  }
  pw__mb_begin_layer(bd, "head", -1, 0);
  m->loss_value = cls ? head_classify(bd, x) : head_mlm(bd, x);
  pw__mb_end_layer(bd);
  m->data = (pw_data_shape){.vocab_size = s->vocab_size, .seq_len = T, .tokens = 1,
                            .out_dim = cls ? s->n_labels : 0, .mlm_predictions = cls ? 0 : s->mlm_predictions,
                            .pad_token = s->pad_token};
}
