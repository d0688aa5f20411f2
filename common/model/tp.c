/* tp: which parameters split how, their shards, and the all-reduces a
 * tensor-parallel stage makes (tp.h). */
#include "tp.h"

#include <stdlib.h>
#include <string.h>

#include "optable.h"

const char *pw_tp_kind_name(pw_tp_kind k) {
  static const char *const names[] = {"replicated", "column", "qkv", "row", "vocab"};
  return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* A node's part in the split (optable.h). */
static int role(const pw_node *n) { return pw_op_info_of(n->op)->tp_role; }

/* The role of the first node reading value v, or UNDECLARED when none does. */
static int consumer_role(const pw_model *m, int v) {
  for (int j = 0; j < m->n_nodes; j++)
    if (m->nodes[j].in[0] == v || m->nodes[j].in[1] == v) return role(&m->nodes[j]);
  return PW_TP_ROLE_UNDECLARED;
}

static int producer_role(const pw_model *m, int v) {
  int p = m->values[v].producer;
  return p >= 0 ? role(&m->nodes[p]) : PW_TP_ROLE_UNDECLARED;
}

static pw_tp_kind linear_kind(const pw_model *m, const pw_node *n) {
  int c = consumer_role(m, n->out), p = producer_role(m, n->in[0]);
  if (c == PW_TP_ROLE_HEADS) return PW_TP_QKV;
  if (c == PW_TP_ROLE_VOCAB_LOSS) return PW_TP_VOCAB;
  if (c == PW_TP_ROLE_ACTIVATION) return PW_TP_COLUMN;
  if (p == PW_TP_ROLE_HEADS || p == PW_TP_ROLE_ACTIVATION) return PW_TP_ROW;
  return PW_TP_REPLICATED;
}

void pw_tp_kinds(const pw_model *m, uint8_t *kinds) {
  memset(kinds, PW_TP_REPLICATED, (size_t)m->n_params);
  for (int i = 0; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    if (role(n) == PW_TP_ROLE_EMBED) kinds[n->w] = PW_TP_VOCAB;
    if (role(n) != PW_TP_ROLE_LINEAR) continue;
    pw_tp_kind k = linear_kind(m, n);
    kinds[n->w] = (uint8_t)k;
    if (n->b >= 0) kinds[n->b] = (uint8_t)(k == PW_TP_ROW ? PW_TP_REPLICATED : k);
  }
}

int pw_tp_check(const pw_job *job, const pw_model *m, pw_err *err) {
  int tp = job->mesh.tp;
  if (tp <= 1) return 0;
  const pw_model_spec *s = &job->model;
  if (s->tmpl != PW_TEMPLATE_GPT && s->tmpl != PW_TEMPLATE_LLAMA)
    return pw_err_set(err, PW_ESPEC, "mesh.tp", "tensor parallel (tp %d) splits the gpt and llama templates only", tp);
  if (s->lora_rank)
    return pw_err_set(err, PW_ESPEC, "mesh.tp", "tensor parallel (tp %d) does not split LoRA adapters", tp);
  if (s->moe_experts)
    return pw_err_set(err, PW_ESPEC, "mesh.tp", "tensor parallel (tp %d) does not split experts (model.moe)", tp);
  if (job->train.precision != PW_PRECISION_FP32)
    return pw_err_set(err, PW_ESPEC, "mesh.tp", "tensor parallel (tp %d) runs train.precision \"fp32\" only", tp);
  if (job->train.zero)
    return pw_err_set(err, PW_ESPEC, "mesh.tp", "tensor parallel (tp %d) runs with train.zero 0 only", tp);
  if (job->mode != PW_MODE_TRAIN)
    return pw_err_set(err, PW_ESPEC, "mesh.tp", "tensor parallel (tp %d) trains only (mode \"train\")", tp);
  if (s->n_kv_heads || s->qk_norm)
    return pw_err_set(err, PW_ESPEC, "mesh.tp", "tensor parallel (tp %d) does not split %s yet", tp,
                      s->n_kv_heads ? "grouped-query attention (model.n_kv_heads)" : "model.qk_norm");
  if (s->n_heads % tp)
    return pw_err_set(err, PW_ESPEC, "mesh.tp", "must divide model.n_heads (%d %% %d != 0)", s->n_heads, tp);
  if (s->vocab_size % tp)
    return pw_err_set(err, PW_ESPEC, "mesh.tp", "must divide model.vocab_size (%d %% %d != 0)", s->vocab_size, tp);
  uint8_t *kinds = malloc((size_t)m->n_params + 1);
  if (!kinds) return pw_err_set(err, PW_ENOMEM, "mesh.tp", "out of memory");
  pw_tp_kinds(m, kinds);
  int rc = 0;
  for (int i = 0; i < m->n_params && !rc; i++)
    if (kinds[i] == PW_TP_COLUMN && m->params[i].shape[0] % tp)
      rc = pw_err_set(err, PW_ESPEC, "mesh.tp", "must divide the MLP width (model.ffn_hidden: %d %% %d != 0)",
                      m->params[i].shape[0], tp);
  free(kinds);
  return rc;
}

size_t pw_tp_numel(const pw_param *p, pw_tp_kind k, int tp) {
  return k == PW_TP_REPLICATED ? p->numel : p->numel / (size_t)tp;
}

/* Walks rank r's shard as runs of contiguous floats of the canonical
 * tensor: (canonical offset, length) in shard order. */
typedef void (*run_fn)(float *dst, const float *src, size_t canon, size_t shard, size_t n);

static void walk(float *dst, const float *src, const pw_param *p, pw_tp_kind k, int tp, int r, run_fn f) {
  size_t rows = (size_t)p->shape[0], cols = p->ndim > 1 ? (size_t)p->shape[1] : 1, at = 0;
  if (k == PW_TP_REPLICATED) {
    f(dst, src, 0, 0, p->numel);
  } else if (k == PW_TP_ROW) {
    size_t w = cols / (size_t)tp;
    for (size_t i = 0; i < rows; i++, at += w) f(dst, src, i * cols + (size_t)r * w, at, w);
  } else {
    int blocks = k == PW_TP_QKV ? 3 : 1;
    size_t per = rows / (size_t)blocks, mine = per / (size_t)tp;
    for (int b = 0; b < blocks; b++, at += mine * cols)
      f(dst, src, ((size_t)b * per + (size_t)r * mine) * cols, at, mine * cols);
  }
}

static void to_shard(float *dst, const float *src, size_t canon, size_t shard, size_t n) {
  memcpy(dst + shard, src + canon, n * sizeof(float));
}

static void to_canon(float *dst, const float *src, size_t canon, size_t shard, size_t n) {
  memcpy(dst + canon, src + shard, n * sizeof(float));
}

void pw_tp_shard(float *dst, const float *src, const pw_param *p, pw_tp_kind k, int tp, int r) {
  walk(dst, src, p, k, tp, r, to_shard);
}

void pw_tp_unshard(float *dst, const float *src, const pw_param *p, pw_tp_kind k, int tp, int r) {
  walk(dst, src, p, k, tp, r, to_canon);
}

static void *dup(const void *src, size_t n, size_t size) {
  void *d = malloc(n * size + 1);
  if (d && n) memcpy(d, src, n * size);
  return d;
}

int pw_tp_model(const pw_model *m, int tp, pw_model *out, uint8_t *kinds) {
  *out = *m;
  out->values = dup(m->values, (size_t)m->n_values, sizeof *m->values);
  out->nodes = dup(m->nodes, (size_t)m->n_nodes, sizeof *m->nodes);
  out->params = dup(m->params, (size_t)m->n_params, sizeof *m->params);
  out->layers = dup(m->layers, (size_t)m->n_layers, sizeof *m->layers);
  out->markers = dup(m->markers, (size_t)m->n_markers, sizeof *m->markers);
  if (!out->values || !out->nodes || !out->params || !out->layers || !out->markers) {
    pw_model_free(out);
    return PW_ENOMEM;
  }
  pw_tp_kinds(m, kinds);
  if (tp <= 1) return 0;
  for (int i = 0; i < m->n_params; i++) {
    pw_param *p = &out->params[i];
    if (kinds[i] == PW_TP_REPLICATED) continue;
    p->shape[kinds[i] == PW_TP_ROW ? 1 : 0] /= tp;
    p->numel /= (size_t)tp;
  }
  /* a value is split when a split linear makes it, or an op reads a split
   * one (attention, the activations) — up to a row linear or the loss */
  for (int i = 0; i < out->n_nodes; i++) {
    pw_node *n = &out->nodes[i];
    pw_value *o = &out->values[n->out];
    int in_split = out->values[n->in[0]].producer >= 0 && out->values[n->in[0]].width != m->values[n->in[0]].width;
    int linear = role(n) == PW_TP_ROLE_LINEAR;
    if (linear && kinds[n->w] != PW_TP_REPLICATED && kinds[n->w] != PW_TP_ROW) {
      n->OC /= tp;
      o->width /= tp;
    } else if (linear && kinds[n->w] == PW_TP_ROW) {
      n->C /= tp;
    } else if (in_split) {
      n->C /= tp;
      n->NH /= tp;
      n->NKV /= tp;
      if (!pw_op_info_of(n->op)->is_loss) { /* the loss: one float */
        n->OC /= tp;
        o->width /= tp;
      }
    }
    n->aux = pw_op_aux(n, &out->values[n->in[0]]);
  }
  return 0;
}

void pw_tp_comm_layers(const pw_model *m, const uint8_t *kinds, int lo, int hi, pw_tp_comm *out) {
  memset(out, 0, sizeof *out);
  for (int l = lo; l < hi; l++)
    for (int i = m->layers[l].node_lo; i < m->layers[l].node_hi; i++) {
      const pw_node *n = &m->nodes[i];
      const pw_value *o = &m->values[n->out];
      int r = role(n);
      if (r == PW_TP_ROLE_EMBED || (r == PW_TP_ROLE_LINEAR && kinds[n->w] == PW_TP_ROW)) {
        out->fwd += (size_t)o->rows * (size_t)o->width;
        out->n_fwd++;
      } else if (r == PW_TP_ROLE_VOCAB_LOSS) {
        out->fwd += 3 * (size_t)m->values[n->in[0]].rows;
        out->n_fwd += 2;
      }
      int again = 0; /* llama's gate and up read one input: its gradient is summed once, for both */
      for (int j = m->layers[l].node_lo; j < i; j++)
        again |= role(&m->nodes[j]) == PW_TP_ROLE_LINEAR && m->nodes[j].in[0] == n->in[0];
      if (r == PW_TP_ROLE_LINEAR && kinds[n->w] != PW_TP_ROW && kinds[n->w] != PW_TP_REPLICATED && !again) {
        const pw_value *x = &m->values[n->in[0]];
        out->bwd += (size_t)x->rows * (size_t)x->width;
        out->n_bwd++;
      }
    }
}

void pw_tp_shrink_sizes(const pw_model *m, const uint8_t *kinds, int node_lo, int node_hi, int tp,
                        pw_prog_sizes *sz) {
  for (int i = node_lo; i < node_hi; i++)
    for (int t = 0; t < 2; t++) {
      int id = t ? m->nodes[i].b : m->nodes[i].w;
      if (id < 0 || kinds[id] == PW_TP_REPLICATED) continue;
      const pw_param *p = &m->params[id];
      size_t cut = p->numel - pw_tp_numel(p, (pw_tp_kind)kinds[id], tp);
      int first = 1; /* a use before this one in the range: this is a shadow */
      for (int j = node_lo; j < i && first; j++) first = m->nodes[j].w != id && m->nodes[j].b != id;
      if (first) sz->numel -= cut;
      if (p->frozen) continue;
      if (first) sz->train_numel -= cut;
      sz->grad_numel -= cut;
    }
}
