/* layout: the arithmetic of layout.h. Offsets are in floats (every element
 * is 4 bytes: float, or int32 tokens and class targets). */
#include "layout.h"

#include <stdlib.h>
#include <string.h>

#include "optable.h"

#define NONE PW_LAYOUT_NONE

static int value_in_stage(const pw_model *m, const pw_prog_layout *l, int v) {
  int prod = m->values[v].producer;
  return prod >= l->node_lo && prod < l->node_hi;
}

static size_t value_floats(const pw_value *v, int mb) { return pw_value_bytes(v, mb) / sizeof(float); }

static int add_port(pw_prog_port **arr, int *n, const pw_model *m, int v, int mb) {
  for (int i = 0; i < *n; i++)
    if ((*arr)[i].value == v) return 0;
  pw_prog_port *a = realloc(*arr, sizeof **arr * (size_t)(*n + 1));
  if (!a) return PW_ENOMEM;
  *arr = a;
  a[*n] = (pw_prog_port){.value = v, .role = m->values[v].role, .bytes = pw_value_bytes(&m->values[v], mb)};
  (*n)++;
  return 0;
}

/* Parameters used by the stage's nodes in model order, their arena
 * offsets, and each node's gradient offsets: a trainable parameter's first
 * use writes its main gradient, later uses get shadows after the main
 * ones; a frozen one has no gradient at all. */
static void lay_params(const pw_model *m, pw_prog_layout *l, int *uses) {
  for (int i = 0; i < m->n_params; i++) l->param_local[i] = -1;
  for (int i = l->node_lo; i < l->node_hi; i++) {
    int ids[2] = {m->nodes[i].w, m->nodes[i].b};
    for (int k = 0; k < 2; k++)
      if (ids[k] >= 0) l->param_local[ids[k]] = 0;
  }
  for (int i = 0; i < m->n_params; i++) {
    if (l->param_local[i] < 0) continue;
    l->param_local[i] = l->n_params;
    l->param_model[l->n_params] = i;
    l->param_goff[l->n_params] = m->params[i].frozen ? NONE : l->sz.train_numel;
    if (!m->params[i].frozen) l->sz.train_numel += m->params[i].numel;
    l->param_off[l->n_params++] = l->sz.numel;
    l->sz.numel += m->params[i].numel;
  }
  l->sz.grad_numel = l->sz.train_numel;
  for (int i = l->node_lo; i < l->node_hi; i++) {
    int ids[2] = {m->nodes[i].w, m->nodes[i].b};
    size_t *dst[2] = {&l->node_dw[i - l->node_lo], &l->node_db[i - l->node_lo]};
    for (int k = 0; k < 2; k++) {
      *dst[k] = NONE;
      if (ids[k] < 0 || m->params[ids[k]].frozen) continue;
      int lp = l->param_local[ids[k]];
      if (uses[lp]++ == 0) {
        *dst[k] = l->param_goff[lp];
        continue;
      }
      size_t n = m->params[ids[k]].numel;
      l->shadow[l->n_shadow][0] = l->param_goff[lp];
      l->shadow[l->n_shadow][1] = l->sz.grad_numel;
      l->shadow[l->n_shadow][2] = n;
      l->n_shadow++;
      *dst[k] = l->sz.grad_numel;
      l->sz.grad_numel += n;
    }
  }
}

/* Every value a node reads: its op's inputs, and an attention's optional
 * second, the tokens its padding mask reads (model.h), which any stage
 * holding one draws as the first stage does. */
static int find_ports(const pw_model *m, pw_prog_layout *l) {
  for (int i = l->node_lo; i < l->node_hi; i++) {
    const pw_node *n = &m->nodes[i];
    for (int k = 0; k < 2; k++)
      if (n->in[k] >= 0 && !value_in_stage(m, l, n->in[k]) && add_port(&l->inputs, &l->n_inputs, m, n->in[k], l->mb))
        return PW_ENOMEM;
    if (n->out == m->loss_value) l->has_loss = 1;
  }
  for (int i = 0; i < m->n_nodes; i++) {
    if (i >= l->node_lo && i < l->node_hi) continue;
    const pw_node *n = &m->nodes[i];
    for (int k = 0; k < 2; k++)
      if (n->in[k] >= 0 && value_in_stage(m, l, n->in[k]) && add_port(&l->outputs, &l->n_outputs, m, n->in[k], l->mb))
        return PW_ENOMEM;
  }
  return 0;
}

/* Places `v` (once) at *off in dst. */
static void place(const pw_model *m, size_t *dst, int v, int mb, size_t *off) {
  if (dst[v] != NONE) return;
  dst[v] = *off;
  *off += value_floats(&m->values[v], mb);
}

/* The ports first (input then output values, then the float ones'
 * gradients): the keep part. Then the work part: the other node outputs,
 * their gradients in the same order (float activations only: data and the
 * loss have none), then the nodes' auxiliaries. */
static void lay_slot(const pw_model *m, pw_prog_layout *l) {
  size_t off = 0;
  int mb = l->mb;
  for (int pass = 0; pass < 2; pass++) {
    size_t *dst = pass ? l->grad_off : l->val_off;
    for (int i = 0; i < l->n_inputs + l->n_outputs; i++) {
      const pw_prog_port *pt = i < l->n_inputs ? &l->inputs[i] : &l->outputs[i - l->n_inputs];
      if (!pass || pt->role == PW_VAL_ACT) place(m, dst, pt->value, mb, &off);
    }
  }
  l->sz.keep_floats = off;
  for (int pass = 0; pass < 2; pass++) {
    size_t *dst = pass ? l->grad_off : l->val_off;
    for (int i = l->node_lo; i < l->node_hi; i++)
      if (!pass || m->values[m->nodes[i].out].role == PW_VAL_ACT) place(m, dst, m->nodes[i].out, mb, &off);
  }
  size_t tt = 1;
  for (int i = l->node_lo; i < l->node_hi; i++) {
    const pw_node *n = &m->nodes[i];
    l->aux_off[i - l->node_lo] = off;
    off += (size_t)mb * n->aux;
    if (pw_op_scratch(n) > tt) tt = pw_op_scratch(n);
  }
  for (int i = 0; i < l->n_inputs; i++) l->sz.draws_data |= l->inputs[i].role != PW_VAL_ACT;
  l->sz.slot_floats = off ? off : 1;
  l->sz.scratch_floats = tt;
}

int pw_prog_layout_build(const pw_model *m, int layer_lo, int layer_hi, int mb, pw_prog_layout *l) {
  memset(l, 0, sizeof *l);
  if (layer_lo < 0 || layer_hi > m->n_layers || layer_lo >= layer_hi || mb < 1) return PW_EINVAL;
  l->node_lo = m->layers[layer_lo].node_lo;
  l->node_hi = m->layers[layer_hi - 1].node_hi;
  l->mb = mb;
  /* The tables in one block: size_t ones first, then int ones (uses: scratch). */
  size_t nn = (size_t)(l->node_hi - l->node_lo) + 1, np = (size_t)m->n_params + 1, nv = (size_t)m->n_values + 1;
  size_t words = 2 * np + 3 * nn + 2 * nn * 3 + 2 * nv;
  size_t *w = l->tables = malloc(words * sizeof(size_t) + 3 * np * sizeof(int));
  if (!w) return PW_ENOMEM;
  l->param_off = w, w += np;
  l->param_goff = w, w += np;
  l->node_dw = w, w += nn;
  l->node_db = w, w += nn;
  l->aux_off = w, w += nn;
  l->shadow = (size_t(*)[3])w, w += 2 * nn * 3;
  l->val_off = w, w += nv;
  l->grad_off = w, w += nv;
  int *iw = (int *)w, *uses = iw + 2 * np;
  l->param_model = iw;
  l->param_local = iw + np;
  memset(uses, 0, np * sizeof(int));
  for (int i = 0; i < m->n_values; i++) l->val_off[i] = l->grad_off[i] = NONE;
  lay_params(m, l, uses);
  int rc = find_ports(m, l);
  if (rc) {
    pw_prog_layout_free(l);
    return rc;
  }
  lay_slot(m, l);
  return 0;
}

void pw_prog_layout_free(pw_prog_layout *l) {
  free(l->tables);
  free(l->inputs);
  free(l->outputs);
  memset(l, 0, sizeof *l);
}

int pw_prog_sizes_of(const pw_model *m, int layer_lo, int layer_hi, int mb, pw_prog_sizes *out) {
  pw_prog_layout l;
  int rc = pw_prog_layout_build(m, layer_lo, layer_hi, mb, &l);
  *out = l.sz;
  pw_prog_layout_free(&l);
  return rc;
}
