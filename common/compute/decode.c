/* decode: the incremental forward of decode.h over two flat arenas (the KV
 * cache slab and one call's activations), both sized and allocated at
 * create.
 *
 * Each node runs its kernel row's decode entry (kernels.h; the op table,
 * optable.h, says whether a node runs, is skipped or refused, and its
 * auxiliaries, cache and packed weights): the kernel its training forward
 * runs (ops.h) on the call's packed rows, except where a row's position
 * matters: learned positions and rotary embeddings run per sequence at its
 * offset, and attention reads and appends the sequence's cache
 * (pw_attention_kv_forward; a sliding window reads the last positions of
 * it; bidirectional or padding-masked attention is refused). A served
 * sequence's tokens must not depend on its batch-mates (they equal the
 * oracle's, which decodes one sequence), so every row of a linear must be
 * the same bits whatever rows it is multiplied with. Each linear's weights
 * are packed at create into a pw_rowmm (rowmm.h); when its probe passes
 * (oneDNN on AVX-512 hosts) all the call's rows, decode steps and prefills
 * of every sequence, go through it at once. Otherwise (sgemv path) each
 * sequence's rows run alone, as before: a single row is one sgemv, a
 * prefill one sgemm (whose rounding depends on how many rows it multiplies,
 * so it never sees another sequence's). LoRA adapters run per sequence.
 * Loss nodes are skipped: the last stage hands out their input, the logits.
 * Never allocates after create. */
#include "decode.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "optable.h"
#include "rowmm.h"

#define NONE ((size_t)-1)

struct pw_decode {
  pw_prog *p;
  const pw_model *m;
  pw_decode_config cfg;
  int node_lo, node_hi;
  float **wdata;         /* [model n_params] the program's parameter data, NULL if not held */
  size_t *val_off;       /* [model n_values] float offset in act, or NONE */
  size_t *kv_off;        /* [local nodes] a node with a cache: its offset in a slot, else NONE */
  pw_rowmm **mm;         /* [local nodes] a decode_pack node's packed weights, else NULL */
  char path[192];        /* the linears' kernel path (pw_decode_path) */
  size_t kv_slot;        /* floats per sequence slot */
  int *ports;            /* inputs, then outputs (value ids) */
  int n_in, n_out;
  int *filled;           /* [max_seqs] positions held per slot */
  unsigned char *seen;   /* [max_seqs] slot used in the current call (argument check) */
  float *kv;             /* [max_seqs][kv_slot] */
  float *act;            /* values, then aux, then attention scratch */
  float *aux, *scratch;
  const pw_decode_seq *seqs; /* the current call */
  int n_seqs, rows;
};

static int node_range(const pw_model *m, int lo, int hi, int *nlo, int *nhi) {
  if (lo < 0 || hi > m->n_layers || lo >= hi) return PW_EINVAL;
  *nlo = m->layers[lo].node_lo;
  *nhi = m->layers[hi - 1].node_hi;
  return 0;
}

size_t pw_decode_kv_floats(const pw_model *m, int layer_lo, int layer_hi, int max_pos) {
  int lo, hi;
  if (node_range(m, layer_lo, layer_hi, &lo, &hi)) return 0;
  size_t n = 0;
  for (int i = lo; i < hi; i++) n += (size_t)max_pos * pw_op_decode_kv(&m->nodes[i]);
  return n;
}

static int decode_of(const pw_node *n) { return pw_op_info_of(n->op)->decode; }

/* Input ports: values the stage reads but does not make (targets aside);
 * outputs: values it makes that a later node reads, and the loss's input.
 * Every value held gets max_rows rows in the activation arena. */
/* Rows a value holds per token: 1, or a mixture of experts' K (its
 * dispatched rows, T K a sequence). */
static size_t rows_per_token(const pw_model *m, int v) {
  int T = m->values[m->input_value].rows;
  return T > 0 && m->values[v].rows > T ? (size_t)(m->values[v].rows / T) : 1;
}

static int plan_values(pw_decode *d, size_t *act_floats, size_t *aux_floats) {
  const pw_model *m = d->m;
  size_t R = (size_t)d->cfg.max_rows, off = 0, aux = 0;
  d->ports = malloc(sizeof(int) * (size_t)(2 * m->n_values + 1));
  int *outs = malloc(sizeof(int) * (size_t)(m->n_values + 1));
  if (!d->ports || !outs) {
    free(outs);
    return PW_ENOMEM;
  }
  for (int v = 0; v < m->n_values; v++) d->val_off[v] = NONE;
  for (int i = d->node_lo; i < d->node_hi; i++) {
    const pw_node *n = &m->nodes[i];
    if (decode_of(n) == PW_DECODE_SKIP) {
      outs[d->n_out++] = n->in[0];
      continue;
    }
    for (int k = 0; k < 2; k++) {
      int v = n->in[k];
      if (v < 0 || d->val_off[v] != NONE) continue;
      d->val_off[v] = off; /* read before made here: an input port */
      off += R * (size_t)m->values[v].width;
      d->ports[d->n_in++] = v;
    }
    d->val_off[n->out] = off;
    off += R * rows_per_token(m, n->out) * (size_t)n->OC;
    if (R * pw_op_decode_aux(n) > aux) aux = R * pw_op_decode_aux(n);
  }
  for (int i = d->node_hi; i < m->n_nodes; i++)
    for (int k = 0; k < 2; k++) {
      int v = m->nodes[i].in[k], dup = 0;
      if (v < 0 || d->val_off[v] == NONE || m->values[v].role == PW_VAL_INPUT) continue;
      for (int j = 0; j < d->n_out; j++) dup |= outs[j] == v;
      if (!dup) outs[d->n_out++] = v;
    }
  memcpy(d->ports + d->n_in, outs, sizeof(int) * (size_t)d->n_out);
  free(outs);
  *act_floats = off;
  *aux_floats = aux;
  return 0;
}

/* Every decode_pack node's (linear's) weights into a rowmm; the path of
 * the first, and how many others took another (the probe runs per weight
 * matrix). */
static int pack_linears(pw_decode *d, pw_err *err) {
  int n = 0, packed = 0, rc;
  for (int i = d->node_lo; i < d->node_hi; i++) {
    const pw_node *nd = &d->m->nodes[i];
    if (!pw_op_info_of(nd->op)->decode_pack || nd->C < 1 || nd->OC < 1) continue;
    pw_rowmm **r = &d->mm[i - d->node_lo];
    if ((rc = pw_rowmm_create(d->wdata[nd->w], nd->b >= 0 ? d->wdata[nd->b] : NULL, nd->C, nd->OC, r, err))) return rc;
    if (n++ == 0) snprintf(d->path, sizeof d->path, "%s", pw_rowmm_path(*r));
    packed += pw_rowmm_packed(*r);
  }
  if (!n) snprintf(d->path, sizeof d->path, "no linear");
  else if (packed && packed < n) snprintf(d->path, sizeof d->path, "oneDNN on %d of %d linears, sgemv on the rest", packed, n);
  return 0;
}

int pw_decode_create(pw_prog *p, const pw_decode_config *cfg, pw_decode **out, pw_err *err) {
  *out = NULL;
  const pw_model *m = pw_prog_model(p);
  const pw_prog_config *pc = pw_prog_config_of(p);
  pw_decode_config c = *cfg;
  if (!m->data.tokens) return pw_err_set(err, PW_EINVAL, "decode", "a features model has no sequence to decode");
  if (m->input_value < 0 || m->feature_value >= 0 || (m->n_layers && m->layers[m->n_layers - 1].region))
    return pw_err_set(err, PW_EINVAL, "decode", "a regions model (towers meeting at a fusion) is not decoded");
  if (!c.max_pos) c.max_pos = m->seq_len;
  if (!c.max_rows) c.max_rows = c.max_pos;
  if (c.max_seqs < 1 || c.max_pos < 1 || c.max_rows < 1)
    return pw_err_set(err, PW_EINVAL, "decode", "bad sizes: %d sequences, %d positions, %d rows", c.max_seqs,
                      c.max_pos, c.max_rows);
  pw_decode *d = calloc(1, sizeof *d);
  if (!d) return pw_err_set(err, PW_ENOMEM, "decode", "out of memory");
  d->p = p;
  d->m = m;
  d->cfg = c;
  if (node_range(m, pc->layer_lo, pc->layer_hi, &d->node_lo, &d->node_hi)) {
    free(d);
    return pw_err_set(err, PW_EINVAL, "decode", "bad layer range");
  }
  int nn = d->node_hi - d->node_lo;
  d->wdata = calloc((size_t)m->n_params + 1, sizeof *d->wdata);
  d->val_off = calloc((size_t)m->n_values + 1, sizeof *d->val_off);
  d->kv_off = calloc((size_t)nn + 1, sizeof *d->kv_off);
  d->mm = calloc((size_t)nn + 1, sizeof *d->mm);
  d->filled = calloc((size_t)c.max_seqs, sizeof *d->filled);
  d->seen = calloc((size_t)c.max_seqs, 1);
  size_t act = 0, aux = 0;
  int rc;
  if (!d->wdata || !d->val_off || !d->kv_off || !d->mm || !d->filled || !d->seen || plan_values(d, &act, &aux)) goto oom;
  for (int i = 0; i < pw_prog_n_params(p); i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    d->wdata[pp->model_index] = pp->data;
  }
  for (int i = d->node_lo; i < d->node_hi; i++) {
    const pw_node *n = &m->nodes[i];
    size_t kv = pw_op_decode_kv(n);
    d->kv_off[i - d->node_lo] = NONE;
    if (decode_of(n) != PW_DECODE_RUN && decode_of(n) != PW_DECODE_SKIP) {
      pw_decode_free(d);
      return pw_err_set(err, PW_EINVAL, "decode", "a %s node is not decoded", pw_op_name((pw_op)n->op));
    }
    if ((n->op == PW_OP_ATTENTION || n->op == PW_OP_ATTENTION_TILED) && (n->bidir || n->in[1] >= 0)) {
      pw_decode_free(d);
      return pw_err_set(err, PW_EINVAL, "decode", "node %d: %s attention is not decoded (an encoder's: each row "
                        "sees keys after it)", i, n->bidir ? "bidirectional" : "padding-masked");
    }
    if (pw_op_info_of(n->op)->positions && c.max_pos > m->params[n->w].shape[0]) {
      pw_decode_free(d);
      return pw_err_set(err, PW_EINVAL, "decode", "max_pos %d is past the %d learned positions", c.max_pos,
                        m->params[n->w].shape[0]);
    }
    if (kv) {
      d->kv_off[i - d->node_lo] = d->kv_slot;
      d->kv_slot += (size_t)c.max_pos * kv;
    }
  }
  if ((rc = pack_linears(d, err))) {
    pw_decode_free(d);
    return rc;
  }
  size_t scratch = pw_attention_kv_scratch(c.max_rows < c.max_pos ? c.max_rows : c.max_pos, c.max_pos);
  for (int i = d->node_lo; i < d->node_hi; i++) /* the other ops' (a mixture's order) */
    if (pw_op_scratch(&m->nodes[i]) > scratch) scratch = pw_op_scratch(&m->nodes[i]);
  d->kv = pw_alloc_floats(d->kv_slot * (size_t)c.max_seqs + 1);
  d->act = pw_alloc_floats(act + aux + scratch + 1);
  if (!d->kv || !d->act) goto oom;
  d->aux = d->act + act;
  d->scratch = d->aux + aux;
  *out = d;
  return 0;
oom:
  pw_decode_free(d);
  return pw_err_set(err, PW_ENOMEM, "decode", "out of memory");
}

void pw_decode_free(pw_decode *d) {
  if (!d) return;
  free(d->wdata);
  free(d->val_off);
  free(d->kv_off);
  for (int i = 0; d->mm && i < d->node_hi - d->node_lo; i++) pw_rowmm_free(d->mm[i]);
  free(d->mm);
  free(d->ports);
  free(d->filled);
  free(d->seen);
  free(d->kv);
  free(d->act);
  free(d);
}

const pw_decode_config *pw_decode_config_of(const pw_decode *d) { return &d->cfg; }
const char *pw_decode_path(const pw_decode *d) { return d->path; }
int pw_decode_n_inputs(const pw_decode *d) { return d->n_in; }
int pw_decode_input(const pw_decode *d, int i) { return d->ports[i]; }
int pw_decode_n_outputs(const pw_decode *d) { return d->n_out; }
int pw_decode_output(const pw_decode *d, int i) { return d->ports[d->n_in + i]; }
int pw_decode_filled(const pw_decode *d, int slot) {
  return slot >= 0 && slot < d->cfg.max_seqs ? d->filled[slot] : 0;
}

void *pw_decode_value(pw_decode *d, int value) {
  if (value < 0 || value >= d->m->n_values || d->val_off[value] == NONE) return NULL;
  return d->act + d->val_off[value];
}

/* ---- per node -------------------------------------------------------- */

static float *val(pw_decode *d, int v) { return d->act + d->val_off[v]; }

/* Node i through its kernel row's decode entry (a loss: skipped). */
static void node_forward(pw_decode *d, int i) {
  const pw_node *n = &d->m->nodes[i];
  int li = i - d->node_lo;
  if (decode_of(n) != PW_DECODE_RUN) return;
  pw_kernel_io io = {.n = n,
                     .in0 = val(d, n->in[0]),
                     .in1 = n->in[1] >= 0 ? val(d, n->in[1]) : NULL,
                     .out = val(d, n->out),
                     .aux = d->aux,
                     .w = n->w >= 0 ? d->wdata[n->w] : NULL,
                     .b = n->b >= 0 ? d->wdata[n->b] : NULL,
                     .scratch = d->scratch,
                     .rows = d->rows * (int)rows_per_token(d->m, n->in[0]), /* rows of input 0, as training's */
                     .seqs = d->seqs,
                     .n_seqs = d->n_seqs,
                     .kv = d->kv_off[li] != NONE ? d->kv + d->kv_off[li] : NULL,
                     .kv_slot = d->kv_slot,
                     .max_pos = d->cfg.max_pos,
                     .mm = d->mm[li]};
  pw_kernel_of(n->op)->decode(&io);
}

static int check_call(pw_decode *d, const pw_decode_seq *seqs, int n, pw_err *err) {
  const pw_decode_config *c = &d->cfg;
  int rows = 0, rc = 0;
  if (n < 1) return pw_err_set(err, PW_EINVAL, "decode", "no sequences");
  for (int s = 0; s < n && !rc; s++) {
    const pw_decode_seq *q = &seqs[s];
    if (q->slot < 0 || q->slot >= c->max_seqs)
      rc = pw_err_set(err, PW_EINVAL, "decode", "sequence %d: slot %d is not in 0..%d", s, q->slot, c->max_seqs - 1);
    else if (d->seen[q->slot])
      rc = pw_err_set(err, PW_EINVAL, "decode", "sequence %d: slot %d appears twice in one call", s, q->slot);
    else if (q->len < 1 || q->pos < 0 || q->pos > d->filled[q->slot])
      rc = pw_err_set(err, PW_EINVAL, "decode", "sequence %d: %d rows at position %d, but slot %d holds %d", s,
                      q->len, q->pos, q->slot, d->filled[q->slot]);
    else if (q->len > c->max_pos - q->pos)
      rc = pw_err_set(err, PW_EINVAL, "decode", "sequence %d: positions %d..%d are past the %d the cache holds", s,
                      q->pos, q->pos + q->len - 1, c->max_pos);
    else if (q->len > c->max_rows - rows)
      rc = pw_err_set(err, PW_EINVAL, "decode", "more than %d new rows in one call", c->max_rows);
    else {
      d->seen[q->slot] = 1;
      rows += q->len;
    }
  }
  for (int s = 0; s < n; s++)
    if (seqs[s].slot >= 0 && seqs[s].slot < c->max_seqs) d->seen[seqs[s].slot] = 0;
  for (int i = 0; i < d->n_in && !rc; i++) {
    const pw_value *v = &d->m->values[d->ports[i]];
    if (v->role != PW_VAL_INPUT || v->dtype != PW_DT_I32) continue;
    const int32_t *tok = (const int32_t *)val(d, d->ports[i]);
    for (int r = 0; r < rows && !rc; r++)
      if (tok[r] < 0 || tok[r] >= d->m->data.vocab_size)
        rc = pw_err_set(err, PW_EINVAL, "decode", "row %d: token %d is not in 0..%d", r, (int)tok[r],
                        d->m->data.vocab_size - 1);
  }
  d->rows = rows;
  return rc;
}

int pw_decode_forward(pw_decode *d, const pw_decode_seq *seqs, int n, pw_err *err) {
  int rc = check_call(d, seqs, n, err);
  if (rc) return rc;
  d->seqs = seqs;
  d->n_seqs = n;
  for (int i = d->node_lo; i < d->node_hi; i++) node_forward(d, i);
  for (int s = 0; s < n; s++) d->filled[seqs[s].slot] = seqs[s].pos + seqs[s].len;
  d->seqs = NULL;
  return 0;
}
