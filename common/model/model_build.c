/* model_build: the graph builder every template uses (model_build.h):
 * values, parameters, nodes and layers, and the layers they share (a
 * linear with its LoRA adapter, a norm, elementwise ops, learned
 * positions), with the attention op a node of T rows gets. model.c's
 * templates and model_bert.c's build on it; it calls neither. */
#include "model_build.h"

#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optable.h"

static void *grow(void *p, int *cap, int need, size_t elem, int *oom) {
  if (need <= *cap) return p;
  int nc = *cap ? *cap * 2 : 16;
  while (nc < need) nc *= 2;
  void *q = realloc(p, (size_t)nc * elem);
  if (!q) {
    *oom = 1;
    return p;
  }
  *cap = nc;
  return q;
}

int pw__mb_value(pw__mbuild *bd, int rows, int width, pw_dtype dt, pw_val_role role) {
  pw_model *m = bd->m;
  m->values = grow(m->values, &bd->cap_values, m->n_values + 1, sizeof *m->values, &bd->oom);
  if (bd->oom) return 0;
  pw_value *v = &m->values[m->n_values];
  memset(v, 0, sizeof *v);
  v->rows = rows;
  v->width = width;
  v->dtype = (uint8_t)dt;
  v->role = (uint8_t)role;
  v->producer = -1;
  return m->n_values++;
}

int pw__mb_param(pw__mbuild *bd, const char *name, int d0, int d1, pw_init_kind init, float std) {
  pw_model *m = bd->m;
  m->params = grow(m->params, &bd->cap_params, m->n_params + 1, sizeof *m->params, &bd->oom);
  if (bd->oom) return -1;
  pw_param *p = &m->params[m->n_params];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = d1 > 0 ? 2 : 1;
  p->shape[0] = d0;
  p->shape[1] = d1 > 0 ? d1 : 0;
  p->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
  p->decay = p->ndim >= 2;
  p->init = (uint8_t)init;
  p->init_std = std;
  m->layers[bd->layer].params += p->numel;
  return m->n_params++;
}

int pw__mb_param_find(const pw_model *m, const char *name) {
  for (int i = 0; i < m->n_params; i++)
    if (strcmp(m->params[i].name, name) == 0) return i;
  return -1;
}

/* Adds a node reading in0 (and in1) and returns its output value id. */
int pw__mb_node(pw__mbuild *bd, pw_op op, int in0, int in1, int w, int b, int out_rows, int out_width,
                pw_dtype out_dt) {
  pw_model *m = bd->m;
  int out = pw_op_info_of(op)->is_loss ? pw__mb_value(bd, 0, 1, PW_DT_F32, PW_VAL_LOSS)
                                       : pw__mb_value(bd, out_rows, out_width, out_dt, PW_VAL_ACT);
  m->nodes = grow(m->nodes, &bd->cap_nodes, m->n_nodes + 1, sizeof *m->nodes, &bd->oom);
  if (bd->oom) return 0;
  pw_node *n = &m->nodes[m->n_nodes];
  memset(n, 0, sizeof *n);
  n->op = (uint8_t)op;
  n->layer = bd->layer;
  n->in[0] = in0;
  n->in[1] = in1;
  n->out = out;
  n->w = w;
  n->b = b;
  n->C = m->values[in0].width;
  n->T = m->values[in0].rows;
  n->OC = out_width;
  n->eps = bd->spec->norm_eps > 0 ? bd->spec->norm_eps : 1e-5f;
  n->base = bd->spec->rope_base > 0 ? bd->spec->rope_base : 10000.0f;
  m->values[out].producer = m->n_nodes;
  m->n_nodes++;
  return out;
}

void pw__mb_begin_layer(pw__mbuild *bd, const char *name, int spec_index, int is_block) {
  pw_model *m = bd->m;
  m->layers = grow(m->layers, &bd->cap_layers, m->n_layers + 1, sizeof *m->layers, &bd->oom);
  if (bd->oom) return;
  pw_layer *l = &m->layers[m->n_layers];
  memset(l, 0, sizeof *l);
  snprintf(l->name, sizeof l->name, "%s", name);
  l->node_lo = l->node_hi = m->n_nodes;
  l->spec_index = spec_index;
  l->is_block = is_block;
  bd->layer = m->n_layers++;
}

void pw__mb_end_layer(pw__mbuild *bd) {
  if (bd->oom) return;
  bd->m->layers[bd->layer].node_hi = bd->m->n_nodes;
}

/* ---- layers, shared by templates and explicit lists ------------------ */

/* model.lora: an adapter after the linear layer `prefix` (input x, output
 * y0) when a target matches its name, as PEFT initialises it: A [r, C]
 * kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(C), 1/sqrt(C)); B
 * [OC, r] zeros, so the adapted model starts as the base. */
static int lora(pw__mbuild *bd, const char *prefix, int x, int y0) {
  const pw_model_spec *s = bd->spec;
  int hit = 0;
  for (int i = 0; i < s->n_lora_targets; i++)
    if (fnmatch(s->lora_targets[i], prefix, 0) == 0) bd->lora_hit |= 1u << i, hit = 1;
  if (!s->lora_rank || !hit || bd->oom) return y0;
  char nm[PW_PARAM_NAME_MAX];
  int C = bd->m->values[x].width, OC = bd->m->values[y0].width, r = s->lora_rank;
  snprintf(nm, sizeof nm, "%.80s.lora_A.weight", prefix);
  int a = pw__mb_param(bd, nm, r, C, PW_INIT_UNIFORM, 1.0f / sqrtf((float)C));
  snprintf(nm, sizeof nm, "%.80s.lora_B.weight", prefix);
  int b = pw__mb_param(bd, nm, OC, r, PW_INIT_ZEROS, 0);
  int y = pw__mb_node(bd, PW_OP_LORA, x, y0, a, b, bd->m->values[y0].rows, OC, PW_DT_F32);
  if (bd->oom) return y;
  pw_node *n = &bd->m->nodes[bd->m->n_nodes - 1];
  n->NH = r;
  n->base = s->lora_alpha / (float)r;
  return y;
}

int pw__mb_linear(pw__mbuild *bd, const char *prefix, int x, int oc, int bias, float std) {
  char nm[PW_PARAM_NAME_MAX];
  const pw_value *v = &bd->m->values[x];
  int C = v->width, rows = v->rows;
  snprintf(nm, sizeof nm, "%.80s.weight", prefix);
  int w = pw__mb_param(bd, nm, oc, C, PW_INIT_NORMAL, std);
  int b = -1;
  if (bias) {
    snprintf(nm, sizeof nm, "%.80s.bias", prefix);
    b = pw__mb_param(bd, nm, oc, 0, PW_INIT_ZEROS, 0);
  }
  int y = pw__mb_node(bd, PW_OP_LINEAR, x, -1, w, b, rows, oc, PW_DT_F32);
  return lora(bd, prefix, x, y);
}

int pw__mb_norm(pw__mbuild *bd, const char *prefix, int x, int rms) {
  char nm[PW_PARAM_NAME_MAX];
  const pw_value *v = &bd->m->values[x];
  int C = v->width, rows = v->rows;
  /* model.norm_offset (llama only): Gemma's RMSNorm scales by 1 + w, w
   * initialised 0 (so the scale starts at 1, as Llama's w does) */
  int off = rms && bd->spec->norm_offset;
  snprintf(nm, sizeof nm, "%.80s.weight", prefix);
  int w = pw__mb_param(bd, nm, C, 0, off ? PW_INIT_ZEROS : PW_INIT_ONES, 0);
  int b = -1;
  if (!rms) {
    snprintf(nm, sizeof nm, "%.80s.bias", prefix);
    b = pw__mb_param(bd, nm, C, 0, PW_INIT_ZEROS, 0);
  }
  int y = pw__mb_node(bd, off ? PW_OP_RMSNORM_OFFSET : rms ? PW_OP_RMSNORM : PW_OP_LAYERNORM, x, -1, w, b, rows, C,
                      PW_DT_F32);
  if (off && !bd->oom) bd->m->nodes[bd->m->n_nodes - 1].base = (float)bd->spec->norm_offset;
  return y;
}

int pw__mb_unary(pw__mbuild *bd, pw_op op, int x) {
  const pw_value *v = &bd->m->values[x];
  return pw__mb_node(bd, op, x, -1, -1, -1, v->rows, v->width, PW_DT_F32);
}

int pw__mb_binary(pw__mbuild *bd, pw_op op, int a, int b) {
  const pw_value *v = &bd->m->values[a];
  return pw__mb_node(bd, op, a, b, -1, -1, v->rows, v->width, PW_DT_F32);
}

int pw__mb_pos_embed(pw__mbuild *bd, const char *name, int x, float std) {
  const pw_value *v = &bd->m->values[x];
  int w = pw__mb_param(bd, name, v->rows, v->width, PW_INIT_NORMAL, std);
  return pw__mb_node(bd, PW_OP_POSEMBED, x, -1, w, -1, v->rows, v->width, PW_DT_F32);
}

/* model.h's: the op an attention node is built with (and changed to) */
int pw_attention_op(int impl, int T, int HD) {
  if (impl == PW_ATTN_AUTO) impl = T <= PW_ATTN_PLAIN_T_PER_HD * HD ? PW_ATTN_PLAIN : PW_ATTN_TILED;
  return impl == PW_ATTN_TILED ? PW_OP_ATTENTION_TILED : PW_OP_ATTENTION;
}
