/* prog: runs a stage program's nodes forward and backward over flat arenas.
 *
 * Every offset comes from the layout (common/model/layout.h), computed once
 * at create; each node runs through its row of the kernel table
 * (kernels.h). The per-step path is pointer arithmetic and kernel calls,
 * nothing else.
 *
 * Value gradients are not zeroed before a backward: create decides, per
 * (node, input), whether that node's backward_input is the first writer of
 * the input's gradient in backward order (nodes last to first, input 0
 * before input 1), which overwrites, or a later one (a value used twice:
 * the residual stream), which accumulates. Same kernels, same order of
 * additions, 0 + g stored by the first: the bits of a zeroed buffer, without
 * a pass over ~all the slot's gradient memory per microbatch.
 *
 * A whole backward (B) runs a layernorm's two halves as one pass over its
 * rows (the same float operations as weight then input, so I+W gives the
 * same bits).
 *
 * Remat: an offset below the layout's keep_floats is in the slot, any
 * other in the work buffer the slot holds (work_of). */
#include "prog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "collective.h"
#include "kernels.h"
#include "optable.h"
#include "ops.h"
#include "rng.h"
#include "tp.h"

struct pw_prog {
  const pw_model *m;
  pw_prog_config cfg;
  const pw_backend *be;          /* where the arenas live and the kernels run (backend.h) */
  pw_err be_err;                 /* a failed upload of pw_prog_init_params (code 0: none), kept */
  /* PW_PROFILE_OPS set: seconds and calls per op kind and half (F, I, W,
   * B), each kernel waited for (backend sync) before and after; printed to
   * stderr by pw_prog_free */
  double (*prof_s)[4];
  long (*prof_n)[4];
  /* off the CPU only: the ports' host copies (prog.h), one block per slot */
  size_t *hval_off, *hgrad_off;  /* [n_values] float offset in a block, NONE if not a port's */
  size_t hport_floats;
  float **hport;                 /* [max_slots], made with their slots */
  /* Every offset and size (layout.h: the planner reads the same). A
   * parameter read by several nodes of this program (tied embeddings)
   * accumulates each further use in a shadow gradient after the numel main
   * ones, added to the main gradient by pw_prog_grads_finalize: the sum is
   * then use 1 + use 2 + ..., each over all microbatches — the same
   * association as when the uses sit on different stages. */
  pw_prog_layout L;
  pw_prog_param *params;         /* [L.n_params], wired into the arenas */
  float *arena_p, *arena_g, *arena_m, *arena_v;
  unsigned char *bwd_acc;        /* per local node: bit k set = input k's gradient accumulates */
  size_t (*zero)[2];             /* gradients nobody in the stage writes, zeroed before a
                                    backward: {offset, count} (usually none) */
  int n_zero;
  float **slots;                 /* [max_slots], NULL until made (remat: the keep parts) */
  int max_slots;
  /* remat only */
  float **work;                  /* [max_slots] work buffers, NULL until made */
  unsigned char *work_busy;      /* [max_slots] held by a slot */
  int *work_of;                  /* [max_slots] work buffer slot k holds, or -1 */
  float *scratch;                /* L.sz.scratch_floats */
  float loss_scale;
  /* bf16 only (prog.h) */
  pw_bf16 *wb;                   /* the linear nodes' weight copies */
  size_t *wb_off;                /* [local node] offset in wb, NONE for other nodes */
  pw_bf16 *bscratch;             /* a linear or attention node's converted operands */
  unsigned char *bf16_node;      /* [local node] it converts operands into bscratch */
  unsigned char *round_out;      /* [local node] its output is read by a later layer */
  size_t *wire_off;              /* [output port] offset in a slot's send buffer */
  size_t wire_n;                 /* bf16 elements of a send buffer */
  pw_bf16 **wire;                /* [max_slots] send buffers, made with their slots */
  /* tp > 1 only (pw_prog_set_tp) */
  int tp_rank;
  pw_err tp_err;                 /* the first failed all-reduce (code 0: none), kept */
  pw_prog_allreduce_fn tp_fn;
  void *tp_ctx;
  unsigned char *tp_node;        /* [local node] TP_* below */
  float *tp_buf;                 /* the cross-entropy's 3 floats per row */
  /* ZeRO-2 only (pw_prog_set_wgrad): arena_g is lent */
  size_t (*live)[2];             /* [n_live] the ranges of arena_g that exist */
  int n_live;
  unsigned char *wg_part;        /* [local node] bit k: part k (w, b) goes through the scratch */
  float *wg_scratch;
  pw_prog_wgrad_fn wg_fn;
  void *wg_ctx;
  pw_err wg_err;                 /* the first failed hand-off (code 0: none), kept */
  /* ZeRO-3 only (pw_prog_set_pgather): arena_p is lent */
  pw_prog_unit_fn pg_fn;
  void *pg_ctx;
  size_t pg_lo, pg_hi;           /* the part of arena_p that exists */
  int pg_layer;                  /* the layer fn last made whole in this entry point, or -1 */
  int pg_tail;                   /* what comes after the last layer of this pass: a recompute's
                                    backward goes on at the layer below it; else -1 */
  pw_err pg_err;                 /* the first failed gather (code 0: none), kept */
};

enum { TP_ROW = 1, TP_EMBED = 2, TP_XENT = 4, TP_DOUT = 8 }; /* tp_node bits */

#define NONE PW_LAYOUT_NONE

/* n floats (at least one) of the backend's zeroed memory, and back. */
static float *arena_alloc(const pw_prog *p, size_t n) { return p->be->alloc(p->be, (n ? n : 1) * sizeof(float)); }
static void arena_free(const pw_prog *p, void *a) {
  if (a) p->be->free(p->be, a);
}

/* One remat work buffer: the slot past its keep part (an embedding alone
 * may have none of it). */
static float *work_alloc(const pw_prog *p) { return arena_alloc(p, p->L.sz.slot_floats - p->L.sz.keep_floats); }

/* The first writer of each value gradient in backward order overwrites,
 * later ones accumulate. Output ports' gradients arrive filled by the
 * caller (what the next stage sent): every writer adds to them. A gradient
 * nobody writes is zeroed before each backward, merged into runs. */
static int plan_grad_writes(pw_prog *p) {
  const pw_model *m = p->m;
  const pw_prog_layout *L = &p->L;
  p->bwd_acc = calloc((size_t)(L->node_hi - L->node_lo) + 1, 1);
  p->zero = malloc(sizeof *p->zero * ((size_t)m->n_values + 1));
  unsigned char *written = calloc((size_t)m->n_values + 1, 1);
  if (!p->bwd_acc || !p->zero || !written) {
    free(written);
    return PW_ENOMEM;
  }
  for (int k = 0; k < L->n_outputs; k++) written[L->outputs[k].value] = 1;
  for (int i = L->node_hi - 1; i >= L->node_lo; i--) {
    const pw_node *n = &m->nodes[i];
    for (int k = 0; k < 2; k++) {
      int v = n->in[k];
      if (!(pw_op_info_of(n->op)->grad_in >> k & 1) || v < 0 || L->grad_off[v] == NONE) continue;
      if (written[v]) p->bwd_acc[i - L->node_lo] |= (unsigned char)(1u << k);
      written[v] = 1;
    }
  }
  for (int v = 0; v < m->n_values; v++) {
    if (L->grad_off[v] == NONE || written[v]) continue;
    size_t o = L->grad_off[v], n = pw_value_bytes(&m->values[v], L->mb) / sizeof(float);
    if (p->n_zero && p->zero[p->n_zero - 1][0] + p->zero[p->n_zero - 1][1] == o && o != L->sz.keep_floats)
      p->zero[p->n_zero - 1][1] += n;
    else {
      p->zero[p->n_zero][0] = o;
      p->zero[p->n_zero][1] = n;
      p->n_zero++;
    }
  }
  free(written);
  return 0;
}

/* The bf16 tables: weight copies, scratch, which outputs are rounded and
 * where the output ports go in a send buffer. */
static int plan_bf16(pw_prog *p) {
  const pw_model *m = p->m;
  const pw_prog_layout *L = &p->L;
  int nl = L->node_hi - L->node_lo;
  p->wb_off = malloc(sizeof *p->wb_off * ((size_t)nl + 1));
  p->round_out = calloc((size_t)nl + 1, 1);
  p->bf16_node = calloc((size_t)nl + 1, 1);
  p->wire_off = malloc(sizeof *p->wire_off * ((size_t)L->n_outputs + 1));
  if (!p->wb_off || !p->round_out || !p->bf16_node || !p->wire_off) return PW_ENOMEM;
  size_t wn = 0, sn = 1;
  for (int i = L->node_lo; i < L->node_hi; i++) { /* the op table's counts, as the planner's */
    const pw_node *n = &m->nodes[i];
    size_t w = pw_op_bf16_weight(n), sc = pw_op_bf16_scratch(n, &m->values[n->in[0]], p->cfg.mb_size);
    p->wb_off[i - L->node_lo] = w ? wn : NONE;
    p->bf16_node[i - L->node_lo] = sc > 0;
    wn += w;
    if (sc > sn) sn = sc;
    if (m->values[n->out].dtype != PW_DT_F32) continue;
    for (int j = i + 1; j < m->n_nodes; j++) /* read by a later layer: rounded */
      if (m->nodes[j].layer != n->layer && (m->nodes[j].in[0] == n->out || m->nodes[j].in[1] == n->out))
        p->round_out[i - L->node_lo] = 1;
  }
  for (int k = 0; k < L->n_outputs; k++) {
    p->wire_off[k] = p->wire_n;
    if (m->values[L->outputs[k].value].dtype == PW_DT_F32) p->wire_n += L->outputs[k].bytes / sizeof(float);
  }
  /* the backend's: its kernels write and read them */
  p->wb = p->be->alloc(p->be, (wn ? wn : 1) * sizeof *p->wb);
  p->bscratch = p->be->alloc(p->be, sn * sizeof *p->bscratch);
  p->wire = calloc((size_t)p->max_slots, sizeof *p->wire);
  return p->wb && p->bscratch && p->wire ? 0 : PW_ENOMEM;
}

/* Off the CPU: where each port's value and gradient sit in a slot's host
 * block (inputs, then outputs; a value, then its gradient if it has one). */
static int plan_host_ports(pw_prog *p) {
  const pw_prog_layout *L = &p->L;
  int nv = p->m->n_values;
  p->hval_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
  p->hgrad_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
  p->hport = calloc((size_t)p->max_slots, sizeof *p->hport);
  if (!p->hval_off || !p->hgrad_off || !p->hport) return PW_ENOMEM;
  for (int v = 0; v < nv; v++) p->hval_off[v] = p->hgrad_off[v] = NONE;
  for (int k = 0; k < L->n_inputs + L->n_outputs; k++) {
    const pw_prog_port *pt = k < L->n_inputs ? &L->inputs[k] : &L->outputs[k - L->n_inputs];
    size_t n = (pt->bytes + sizeof(float) - 1) / sizeof(float);
    p->hval_off[pt->value] = p->hport_floats;
    p->hport_floats += n;
    if (L->grad_off[pt->value] != NONE) {
      p->hgrad_off[pt->value] = p->hport_floats;
      p->hport_floats += n;
    }
  }
  return 0;
}

/* What a backend other than the CPU does not run yet, refused by name:
 * an op without its kernel there, and the features whose code touches
 * the arenas from the host (bf16's conversions, ZeRO-2's lent gradients). */
static int check_backend(const pw_model *m, const pw_prog_config *cfg, const pw_backend *be, pw_err *err) {
  if (be->host) return 0;
  if (cfg->bf16 && !be->round_bf16)
    return pw_err_set(err, PW_ENOTSUP, "train.precision", "\"bf16\" does not run on %s yet (float32 does)", be->name);
  if (cfg->no_grads || cfg->no_moments || cfg->no_params)
    return pw_err_set(err, PW_ENOTSUP, "train.zero", "ZeRO does not run on %s yet", be->name);
  for (int i = 0; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    if (n->layer < cfg->layer_lo || n->layer >= cfg->layer_hi) continue;
    if (!be->kernel_of(n->op)->forward)
      return pw_err_set(err, PW_ENOTSUP, "model", "op '%s' (node %d, layer %d) has no kernel on %s",
                        pw_op_info_of(n->op)->name, i, n->layer, be->name);
    /* attention's options (ops.h's pw_attn_mask, the head width) are the CPU kernels' only */
    int attn = n->op == PW_OP_ATTENTION || n->op == PW_OP_ATTENTION_TILED;
    if ((attn || n->op == PW_OP_ROPE || n->op == PW_OP_QKNORM) &&
        (n->HD || n->window || n->bidir || (attn && n->in[1] >= 0)))
      return pw_err_set(err, PW_ENOTSUP, "model", "op '%s' (node %d, layer %d) with %s does not run on %s yet",
                        pw_op_info_of(n->op)->name, i, n->layer,
                        n->HD ? "heads of a width of their own (model.head_dim)"
                        : n->window ? "a sliding window (model.sliding_window)"
                        : n->bidir ? "bidirectional attention" : "a padding mask",
                        be->name);
  }
  return 0;
}

int pw_prog_create(const pw_model *m, const pw_prog_config *cfg, pw_prog **out, pw_err *err) {
  *out = NULL;
  if (cfg->layer_lo < 0 || cfg->layer_hi > m->n_layers || cfg->layer_lo >= cfg->layer_hi)
    return pw_err_set(err, PW_EINVAL, "layers", "bad layer range [%d, %d) of %d", cfg->layer_lo,
                      cfg->layer_hi, m->n_layers);
  if (cfg->mb_size < 1 || cfg->n_slots < 0 || cfg->batch_size < cfg->mb_size ||
      (cfg->max_slots && cfg->max_slots < cfg->n_slots) || (!cfg->max_slots && !cfg->n_slots))
    return pw_err_set(err, PW_EINVAL, "prog", "bad microbatch size %d, batch %d or slots %d",
                      cfg->mb_size, cfg->batch_size, cfg->n_slots);
  const pw_backend *be = cfg->backend ? cfg->backend : pw_backend_cpu();
  int rc = check_backend(m, cfg, be, err);
  if (rc) return rc;
  pw_prog *p = calloc(1, sizeof *p);
  if (!p) return pw_err_set(err, PW_ENOMEM, "prog", "out of memory");
  p->m = m;
  p->cfg = *cfg;
  p->be = be;
  if (getenv("PW_PROFILE_OPS") && (!(p->prof_s = calloc(PW_OP__COUNT, sizeof *p->prof_s)) ||
                                   !(p->prof_n = calloc(PW_OP__COUNT, sizeof *p->prof_n))))
    goto oom;
  if (pw_prog_layout_build(m, cfg->layer_lo, cfg->layer_hi, cfg->mb_size, &p->L)) goto oom;
  const pw_prog_layout *L = &p->L;
  p->params = calloc((size_t)L->n_params + 1, sizeof *p->params);
  p->arena_p = cfg->no_params ? NULL : arena_alloc(p, L->sz.numel);
  p->arena_g = cfg->no_grads ? NULL : arena_alloc(p, L->sz.grad_numel);
  p->arena_m = cfg->no_moments ? NULL : arena_alloc(p, L->sz.train_numel);
  p->arena_v = cfg->no_moments ? NULL : arena_alloc(p, L->sz.train_numel);
  if (!p->params || (!cfg->no_params && !p->arena_p) || (!cfg->no_grads && !p->arena_g) || (!cfg->no_moments && (!p->arena_m || !p->arena_v))) goto oom;
  for (int i = 0; i < L->n_params; i++) {
    size_t go = L->param_goff[i];
    int frozen = go == NONE; /* no gradient, no optimizer state */
    p->params[i] = (pw_prog_param){.meta = &m->params[L->param_model[i]], .model_index = L->param_model[i],
                                   .data = p->arena_p ? p->arena_p + L->param_off[i] : NULL,
                                   .grad = frozen || !p->arena_g ? NULL : p->arena_g + go,
                                   .m = frozen || !p->arena_m ? NULL : p->arena_m + go,
                                   .v = frozen || !p->arena_v ? NULL : p->arena_v + go};
  }
  if (plan_grad_writes(p)) goto oom;
  p->max_slots = cfg->max_slots ? cfg->max_slots : cfg->n_slots;
  p->slots = calloc((size_t)p->max_slots, sizeof *p->slots);
  p->scratch = arena_alloc(p, L->sz.scratch_floats);
  if (!p->slots || !p->scratch || (cfg->bf16 && plan_bf16(p)) || (!be->host && plan_host_ports(p))) goto oom;
  for (int k = 0; k < cfg->n_slots; k++)
    if (pw_prog_slot_ensure(p, k)) goto oom;
  if (cfg->remat) {
    p->work = calloc((size_t)p->max_slots, sizeof *p->work);
    p->work_busy = calloc((size_t)p->max_slots, 1);
    p->work_of = malloc(sizeof(int) * (size_t)p->max_slots);
    if (!p->work || !p->work_busy || !p->work_of) goto oom;
    for (int k = 0; k < p->max_slots; k++) p->work_of[k] = -1;
    for (int k = 0; k < cfg->n_work && k < p->max_slots; k++)
      if (!(p->work[k] = work_alloc(p))) goto oom;
  }

  /* Loss scale: microbatch losses sum to the mean over the whole batch. */
  if (L->has_loss) {
    const pw_node *ln = &m->nodes[m->values[m->loss_value].producer];
    const pw_value *pred = &m->values[ln->in[0]];
    const pw_op_info *lo = pw_op_info_of(ln->op);
    double per_seq = lo->loss_per_elem ? (double)pred->rows * pred->width
                     : lo->loss_per_nh ? (double)ln->NH /* the masked LM's K */
                                       : (double)pred->rows;
    p->loss_scale = (float)(1.0 / ((double)cfg->batch_size * per_seq));
  }
  *out = p;
  return 0;
oom:
  pw_prog_free(p);
  return pw_err_set(err, PW_ENOMEM, "prog", "out of memory");
}

static void prof_print(const pw_prog *p) {
  static const char half[] = "FIWB";
  double all = 0;
  for (int o = 0; o < PW_OP__COUNT; o++)
    for (int h = 0; h < 4; h++) all += p->prof_s[o][h];
  fprintf(stderr, "PW_PROFILE_OPS: layers [%d, %d) on %s, %.1f ms in kernels\n", p->cfg.layer_lo, p->cfg.layer_hi,
          p->be->name, all * 1e3);
  for (int o = 0; o < PW_OP__COUNT; o++)
    for (int h = 0; h < 4; h++)
      if (p->prof_n[o][h])
        fprintf(stderr, "  %-16s %c %7ld calls %10.2f ms %5.1f %%\n", pw_op_info_of(o)->name, half[h], p->prof_n[o][h],
                p->prof_s[o][h] * 1e3, all > 0 ? 100 * p->prof_s[o][h] / all : 0.0);
}

void pw_prog_free(pw_prog *p) {
  if (!p) return;
  if (p->prof_s) prof_print(p);
  free(p->prof_s);
  free(p->prof_n);
  free(p->params);
  if (!p->cfg.no_params) arena_free(p, p->arena_p); /* else lent */
  if (!p->cfg.no_grads) arena_free(p, p->arena_g); /* else lent */
  free(p->live);
  free(p->wg_part);
  if (!p->cfg.no_moments) { /* else lent, if anything */
    arena_free(p, p->arena_m);
    arena_free(p, p->arena_v);
  }
  free(p->bwd_acc);
  free(p->zero);
  if (p->slots)
    for (int k = 0; k < p->max_slots; k++) arena_free(p, p->slots[k]);
  free(p->slots);
  if (p->hport)
    for (int k = 0; k < p->max_slots; k++) free(p->hport[k]);
  free(p->hport);
  free(p->hval_off);
  free(p->hgrad_off);
  if (p->wire)
    for (int k = 0; k < p->max_slots; k++) free(p->wire[k]);
  free(p->wire);
  arena_free(p, p->wb);
  free(p->wb_off);
  arena_free(p, p->bscratch);
  free(p->round_out);
  free(p->bf16_node);
  free(p->wire_off);
  if (p->work)
    for (int k = 0; k < p->max_slots; k++) arena_free(p, p->work[k]);
  free(p->work);
  free(p->work_busy);
  free(p->work_of);
  arena_free(p, p->scratch);
  free(p->tp_node);
  free(p->tp_buf);
  pw_prog_layout_free(&p->L);
  free(p);
}

const pw_model *pw_prog_model(const pw_prog *p) { return p->m; }
const pw_backend *pw_prog_backend(const pw_prog *p) { return p->be; }
int pw_prog_upload(pw_prog *p, void *dst, const void *src, size_t bytes, pw_err *err) {
  return p->be->upload(p->be, dst, src, bytes, err);
}
int pw_prog_download(pw_prog *p, void *dst, const void *src, size_t bytes, pw_err *err) {
  return p->be->download(p->be, dst, src, bytes, err);
}
const pw_prog_layout *pw_prog_layout_of(const pw_prog *p) { return &p->L; }
const pw_prog_config *pw_prog_config_of(const pw_prog *p) { return &p->cfg; }
int pw_prog_n_params(const pw_prog *p) { return p->L.n_params; }
pw_prog_param *pw_prog_param_at(pw_prog *p, int i) { return &p->params[i]; }
size_t pw_prog_numel(const pw_prog *p) { return p->L.sz.numel; }
size_t pw_prog_grad_numel(const pw_prog *p) { return p->L.sz.grad_numel; }
size_t pw_prog_train_numel(const pw_prog *p) { return p->L.sz.train_numel; }

void pw_prog_grads_finalize(pw_prog *p) {
  for (int i = 0; i < p->L.n_shadow; i++)
    p->be->add_into(p->be, p->arena_g + p->L.shadow[i][0], p->arena_g + p->L.shadow[i][1], p->L.shadow[i][2]);
}
float *pw_prog_params(pw_prog *p) { return p->arena_p; }
float *pw_prog_moment(pw_prog *p, int which) { return which ? p->arena_v : p->arena_m; }

void pw_prog_wire_moments(pw_prog *p, float *m, float *v) {
  p->arena_m = m, p->arena_v = v;
  for (int i = 0; i < p->L.n_params; i++) {
    size_t go = p->L.param_goff[i];
    if (!p->params[i].grad) continue;
    p->params[i].m = m ? m + go : NULL;
    p->params[i].v = v ? v + go : NULL;
  }
}
float *pw_prog_grads(pw_prog *p) { return p->arena_g; }
size_t pw_prog_slot_bytes(const pw_prog *p) {
  return (p->cfg.remat ? p->L.sz.keep_floats : p->L.sz.slot_floats) * sizeof(float);
}
size_t pw_prog_work_bytes(const pw_prog *p) {
  return p->cfg.remat ? (p->L.sz.slot_floats - p->L.sz.keep_floats) * sizeof(float) : 0;
}
int pw_prog_n_work(const pw_prog *p) {
  int n = 0;
  for (int k = 0; p->work && k < p->max_slots; k++) n += p->work[k] != NULL;
  return n;
}
int pw_prog_max_slots(const pw_prog *p) { return p->max_slots; }

int pw_prog_slot_ensure(pw_prog *p, int slot) {
  if (slot < 0 || slot >= p->max_slots) return PW_EINVAL;
  if (p->slots[slot]) return 0;
  size_t n = p->cfg.remat ? p->L.sz.keep_floats : p->L.sz.slot_floats;
  if (p->wire && p->wire_n && !p->wire[slot] && !(p->wire[slot] = malloc(p->wire_n * sizeof(pw_bf16))))
    return PW_ENOMEM;
  if (p->hport && !(p->hport[slot] = calloc(p->hport_floats ? p->hport_floats : 1, sizeof(float))))
    return PW_ENOMEM;
  float *s = arena_alloc(p, n);
  if (!s) return PW_ENOMEM;
  p->slots[slot] = s;
  return 0;
}
int pw_prog_n_inputs(const pw_prog *p) { return p->L.n_inputs; }
const pw_prog_port *pw_prog_input(const pw_prog *p, int i) { return &p->L.inputs[i]; }
int pw_prog_n_outputs(const pw_prog *p) { return p->L.n_outputs; }
const pw_prog_port *pw_prog_output(const pw_prog *p, int i) { return &p->L.outputs[i]; }
int pw_prog_has_loss(const pw_prog *p) { return p->L.has_loss; }

/* Float offset `off` of slot `slot`: in the slot, or (remat, past the
 * keep part) in the work buffer it holds; NULL when it holds none. */
static float *slot_at(const pw_prog *p, int slot, size_t off) {
  if (!p->slots[slot]) return NULL;
  if (!p->cfg.remat || off < p->L.sz.keep_floats) return p->slots[slot] + off;
  int w = p->work_of[slot];
  return w < 0 ? NULL : p->work[w] + (off - p->L.sz.keep_floats);
}

/* The backend's buffers of a value and of its gradient (the kernels'). */
static void *dev_value(const pw_prog *p, int slot, int value) {
  if (value < 0 || value >= p->m->n_values || p->L.val_off[value] == NONE) return NULL;
  return slot_at(p, slot, p->L.val_off[value]);
}
static float *dev_grad(const pw_prog *p, int slot, int value) {
  if (value < 0 || value >= p->m->n_values || p->L.grad_off[value] == NONE) return NULL;
  return slot_at(p, slot, p->L.grad_off[value]);
}

/* Off the CPU, the caller's are the ports' host copies (prog.h). */
void *pw_prog_value(pw_prog *p, int slot, int value) {
  if (!p->hport) return dev_value(p, slot, value);
  if (value < 0 || value >= p->m->n_values || p->hval_off[value] == NONE || !p->hport[slot]) return NULL;
  return p->hport[slot] + p->hval_off[value];
}
float *pw_prog_grad(pw_prog *p, int slot, int value) {
  if (!p->hport) return dev_grad(p, slot, value);
  if (value < 0 || value >= p->m->n_values || p->hgrad_off[value] == NONE || !p->hport[slot]) return NULL;
  return p->hport[slot] + p->hgrad_off[value];
}

/* Off the CPU: the ports' host copies to the device (to_dev) or back, the
 * values or the gradients of the inputs or the outputs. */
static int move_ports(pw_prog *p, int slot, int outputs, int grads, int to_dev, pw_err *err) {
  if (!p->hport) return 0;
  int n = outputs ? p->L.n_outputs : p->L.n_inputs, rc = 0;
  for (int k = 0; k < n && !rc; k++) {
    const pw_prog_port *pt = outputs ? &p->L.outputs[k] : &p->L.inputs[k];
    void *d = grads ? (void *)dev_grad(p, slot, pt->value) : dev_value(p, slot, pt->value);
    void *h = grads ? (void *)pw_prog_grad(p, slot, pt->value) : pw_prog_value(p, slot, pt->value);
    if (!d || !h) continue; /* an input with no gradient (tokens, targets) */
    rc = to_dev ? p->be->upload(p->be, d, h, pt->bytes, err) : p->be->download(p->be, h, d, pt->bytes, err);
  }
  return rc;
}

pw_bf16 *pw_prog_wire(pw_prog *p, int slot, int value) {
  if (!p->wire || slot < 0 || slot >= p->max_slots || !p->wire[slot]) return NULL;
  for (int k = 0; k < p->L.n_outputs; k++)
    if (p->L.outputs[k].value == value && p->m->values[value].dtype == PW_DT_F32) return p->wire[slot] + p->wire_off[k];
  return NULL;
}

const pw_bf16 *pw_prog_wire_fill(pw_prog *p, int slot, int value) {
  pw_bf16 *w = pw_prog_wire(p, slot, value);
  const float *v = pw_prog_value(p, slot, value);
  if (w && v) pw_bf16_from_f32(w, v, pw_value_bytes(&p->m->values[value], p->cfg.mb_size) / sizeof(float));
  return w && v ? w : NULL;
}

void pw_prog_init_params(pw_prog *p, unsigned long long seed) {
  /* drawn on the host: into the arena itself, or into a copy uploaded whole
   * (a failure there is kept for the next entry point, like a callback's) */
  float *host = p->be->host ? p->arena_p : pw_alloc_floats(p->L.sz.numel ? p->L.sz.numel : 1);
  if (!host) {
    pw_err_set(&p->be_err, PW_ENOMEM, "stage program", "out of memory for the initial parameters");
    return;
  }
  for (int i = 0; i < p->L.n_params; i++) {
    const pw_param *pm = p->params[i].meta;
    float *d = p->be->host ? p->params[i].data : host + p->L.param_off[i]; /* (ZeRO-3 may lend whole ones) */
    /* ZeRO-3 keeps elements [a, b) of the parameter (its part of the
     * shard), drawn as the whole one's: the stream is run up to b */
    size_t a = 0, b = pm->numel;
    if (p->pg_fn) {
      size_t off = p->L.param_off[i];
      a = p->pg_lo > off ? p->pg_lo - off : 0;
      b = p->pg_hi > off ? p->pg_hi - off : 0;
      if (b > pm->numel) b = pm->numel;
      if (a >= b) continue;
    }
    switch ((pw_init_kind)pm->init) {
      case PW_INIT_ZEROS: memset(d + a, 0, (b - a) * sizeof(float)); break;
      case PW_INIT_ONES:
        for (size_t k = a; k < b; k++) d[k] = 1.0f;
        break;
      case PW_INIT_NORMAL: {
        pw_rng r;
        pw_rng_seed(&r, pw_hash64(seed, pw_hash_str(pm->name)));
        for (size_t k = 0; k < b; k++) {
          float x = (float)(pw_rng_normal(&r) * pm->init_std);
          if (k >= a) d[k] = x;
        }
        break;
      }
      case PW_INIT_UNIFORM: {
        pw_rng r;
        pw_rng_seed(&r, pw_hash64(seed, pw_hash_str(pm->name)));
        for (size_t k = 0; k < b; k++) {
          float x = (float)((2.0 * pw_rng_uniform(&r) - 1.0) * pm->init_std);
          if (k >= a) d[k] = x;
        }
        break;
      }
    }
  }
  if (p->be->host) return;
  if (!p->be_err.code) (void)p->be->upload(p->be, p->arena_p, host, p->L.sz.numel * sizeof(float), &p->be_err);
  free(host);
}

void pw_prog_zero_grad(pw_prog *p) {
  if (!p->cfg.no_grads) {
    p->be->zero(p->be, p->arena_g, p->L.sz.grad_numel * sizeof(float), NULL);
    return;
  }
  for (int k = 0; p->arena_g && k < p->n_live; k++)
    memset(p->arena_g + p->live[k][0], 0, (p->live[k][1] - p->live[k][0]) * sizeof(float));
}

/* ---- ZeRO-2's lent arena and weight-gradient scratch --------------------- */

int pw_prog_set_wgrad(pw_prog *p, float *g, const size_t (*live)[2], int n_live, const size_t (*direct)[2],
                      int n_direct, float *scratch, pw_prog_wgrad_fn fn, void *ctx) {
  if (!p->be->host) return PW_ENOTSUP;
  const pw_prog_layout *L = &p->L;
  int nl = L->node_hi - L->node_lo;
  p->arena_g = g;
  for (int i = 0; i < L->n_params; i++)
    if (L->param_goff[i] != NONE) p->params[i].grad = g + L->param_goff[i];
  free(p->live), free(p->wg_part);
  p->live = malloc(sizeof *p->live * (size_t)(n_live + 1));
  p->wg_part = calloc((size_t)nl + 1, 1);
  if (!p->live || !p->wg_part) return PW_ENOMEM;
  memcpy(p->live, live, sizeof *p->live * (size_t)n_live);
  p->n_live = n_live;
  for (int i = 0; i < nl; i++) p->wg_part[i] = (unsigned char)pw_dp_wgrad_parts(p->m, L, i, direct, n_direct);
  p->wg_scratch = scratch, p->wg_fn = fn, p->wg_ctx = ctx;
  return 0;
}

/* Points node i's redirected weight gradients into the zeroed scratch;
 * their arena spans in spans. Returns how many (0: all direct). */
static int wg_begin(pw_prog *p, int i, pw_kernel_io *io, size_t (*spans)[2]) {
  int li = i - p->L.node_lo, ns = 0;
  if (!p->wg_part || !p->wg_part[li]) return 0;
  const pw_node *n = &p->m->nodes[i];
  size_t at = 0;
  for (int k = 0; k < 2; k++) {
    if (!(p->wg_part[li] >> k & 1)) continue;
    size_t off = k ? p->L.node_db[li] : p->L.node_dw[li], len = p->m->params[k ? n->b : n->w].numel;
    *(k ? &io->db : &io->dw) = p->wg_scratch + at;
    spans[ns][0] = off, spans[ns][1] = len, ns++;
    at += len;
  }
  memset(p->wg_scratch, 0, at * sizeof(float));
  return ns;
}

/* A callback's failure, kept in *kept with the callback's err (or, if it
 * left that empty, one that says what failed). */
static void keep_failure(pw_err *kept, int rc, const pw_err *e, const char *what, size_t n) {
  if (e->code == rc && (e->msg[0] || e->path[0]))
    *kept = *e;
  else
    pw_err_set(kept, rc, "stage program", "%s of %zu floats failed: %s", what, n, pw_strerror(rc));
}

static void wg_end(pw_prog *p, const size_t (*spans)[2], int ns) {
  if (!ns || p->wg_err.code) return;
  pw_err e = {0};
  int rc = p->wg_fn(p->wg_ctx, p->wg_scratch, spans, ns, &e);
  if (rc) keep_failure(&p->wg_err, rc, &e, "a weight-gradient hand-off", spans[0][1] + (ns > 1 ? spans[1][1] : 0));
}

/* ---- ZeRO-3's lent parameters and per-layer gathers ----------------------- */

int pw_prog_set_pgather(pw_prog *p, float *a, size_t lo, size_t hi, pw_prog_unit_fn fn, void *ctx) {
  if (!p->be->host || !p->cfg.no_params) return PW_ENOTSUP;
  if (p->L.sz.train_numel != p->L.sz.numel) return PW_ENOTSUP; /* a frozen parameter has no shard */
  p->arena_p = a;
  for (int i = 0; i < p->L.n_params; i++) p->params[i].data = a + p->L.param_off[i];
  p->pg_lo = lo, p->pg_hi = hi, p->pg_fn = fn, p->pg_ctx = ctx, p->pg_layer = p->pg_tail = -1;
  return 0;
}

/* Before node i runs in direction dir (+1 forward, -1 backward): its
 * layer's parameters made whole when it is another layer than the last
 * one. 0, or nonzero once a gather failed: the caller stops. */
static int unit_enter(pw_prog *p, int i, int dir) {
  if (!p->pg_fn) return 0;
  if (p->pg_err.code) return 1;
  int layer = p->m->nodes[i].layer;
  if (layer == p->pg_layer) return 0;
  int first = p->m->nodes[p->L.node_lo].layer, last = p->m->nodes[p->L.node_hi - 1].layer;
  int next = layer + dir >= first && layer + dir <= last ? layer + dir : p->pg_tail;
  pw_err e = {0};
  int rc = p->pg_fn(p->pg_ctx, layer, next, &e);
  if (rc) {
    keep_failure(&p->pg_err, rc, &e, "a parameter gather", 0);
    return 1;
  }
  p->pg_layer = layer;
  return 0;
}

/* An entry point's end: the parameters back in the lent arena. */
static void unit_leave(pw_prog *p) {
  if (!p->pg_fn || p->pg_layer < 0) return;
  p->pg_layer = -1;
  pw_err e = {0};
  int rc = p->pg_fn(p->pg_ctx, -1, -1, &e);
  if (rc && !p->pg_err.code) keep_failure(&p->pg_err, rc, &e, "a parameter release", 0);
}

/* ---- per node -------------------------------------------------------- */

/* Node i's buffers in `slot`, for its row of the kernel table. */
static void node_bind(pw_prog *p, int slot, int i, pw_kernel_io *io) {
  const pw_node *n = &p->m->nodes[i];
  int li = i - p->L.node_lo;
  memset(io, 0, sizeof *io);
  io->n = n;
  io->in0 = dev_value(p, slot, n->in[0]);
  io->din0 = dev_grad(p, slot, n->in[0]);
  if (n->in[1] >= 0) {
    io->in1 = dev_value(p, slot, n->in[1]);
    io->din1 = dev_grad(p, slot, n->in[1]);
  }
  io->out = dev_value(p, slot, n->out);
  io->dout = dev_grad(p, slot, n->out);
  io->aux = slot_at(p, slot, p->L.aux_off[li]);
  /* a frozen parameter's gradient stays NULL */
  if (n->w >= 0) {
    io->w = p->params[p->L.param_local[n->w]].data;
    if (p->L.node_dw[li] != NONE) io->dw = p->arena_g + p->L.node_dw[li];
  }
  if (n->b >= 0) {
    io->b = p->params[p->L.param_local[n->b]].data;
    if (p->L.node_db[li] != NONE) io->db = p->arena_g + p->L.node_db[li];
  }
  io->scratch = p->scratch;
  io->B = p->cfg.mb_size;
  io->rows = p->cfg.mb_size * p->m->values[n->in[0]].rows;
  io->acc0 = p->bwd_acc[li] & 1;
  io->acc1 = p->bwd_acc[li] >> 1 & 1;
  io->loss_scale = p->loss_scale;
  if (p->wb && p->wb_off[li] != NONE) io->wb = p->wb + p->wb_off[li];
  if (p->wb && p->bf16_node[li]) io->bscratch = p->bscratch;
}

/* ---- tensor parallel -------------------------------------------------- */

int pw_prog_set_tp(pw_prog *p, int rank, pw_prog_allreduce_fn fn, void *ctx) {
  if (!p->be->host) return PW_ENOTSUP; /* its all-reduces and row sums run on the host */
  const pw_model *m = p->m;
  int nl = p->L.node_hi - p->L.node_lo;
  uint8_t *kinds = malloc((size_t)m->n_params + 1);
  p->tp_node = calloc((size_t)nl + 1, 1);
  p->tp_buf = malloc(sizeof(float) * (3 * (size_t)p->cfg.mb_size * (size_t)m->seq_len + 1));
  if (!kinds || !p->tp_node || !p->tp_buf) {
    free(kinds);
    return PW_ENOMEM;
  }
  p->tp_rank = rank;
  p->tp_fn = fn;
  p->tp_ctx = ctx;
  pw_tp_kinds(m, kinds);
  for (int i = p->L.node_lo; i < p->L.node_hi; i++) {
    const pw_node *n = &m->nodes[i];
    unsigned char *f = &p->tp_node[i - p->L.node_lo];
    int role = pw_op_info_of(n->op)->tp_role;
    if (role == PW_TP_ROLE_LINEAR && kinds[n->w] == PW_TP_ROW) *f |= TP_ROW;
    if (role == PW_TP_ROLE_EMBED) *f |= TP_EMBED;
    if (role == PW_TP_ROLE_VOCAB_LOSS) *f |= TP_XENT;
    int split = 0, whole = 0; /* readers of the output adding partial input gradients, or not */
    for (int j = 0; j < m->n_nodes; j++) {
      const pw_node *c = &m->nodes[j];
      if (c->in[0] != n->out && c->in[1] != n->out) continue;
      if (pw_op_info_of(c->op)->tp_role == PW_TP_ROLE_LINEAR && kinds[c->w] != PW_TP_REPLICATED &&
          kinds[c->w] != PW_TP_ROW)
        split = 1;
      else
        whole = 1;
    }
    if (split && !whole) *f |= TP_DOUT;
  }
  free(kinds);
  return 0;
}

static void tp_reduce(pw_prog *p, float *buf, size_t n, int op) {
  if (p->tp_err.code) return;
  pw_err e = {0};
  int rc = p->tp_fn(p->tp_ctx, buf, n, op, &e);
  if (rc) keep_failure(&p->tp_err, rc, &e, "a tensor-parallel all-reduce", n);
}

static int tp_flags(const pw_prog *p, int i) { return p->tp_node ? p->tp_node[i - p->L.node_lo] : 0; }

/* The vocabulary rows [v0, v0 + V) this rank holds. */
static int tp_v0(const pw_prog *p, int V) { return p->tp_rank * V; }

/* The forward of a node the group computes together; 0 for the others. */
static int tp_forward(pw_prog *p, const pw_kernel_io *io) {
  const pw_node *n = io->n;
  int f = tp_flags(p, (int)(n - p->m->nodes)), N = io->rows;
  if (f & TP_EMBED) {
    int V = p->m->params[n->w].shape[0];
    pw_embed_vp_forward(io->out, (const int32_t *)io->in0, io->w, N, n->OC, V, tp_v0(p, V));
    tp_reduce(p, io->out, (size_t)N * (size_t)n->OC, PW_PROG_SUM);
  } else if (f & TP_ROW) { /* the partial products summed, then the bias once */
    pw_kernel_io nb = *io;
    nb.b = NULL;
    pw_kernel_of(n->op)->forward(&nb);
    tp_reduce(p, io->out, (size_t)N * (size_t)n->OC, PW_PROG_SUM);
    for (int r = 0; io->b && r < N; r++)
      for (int c = 0; c < n->OC; c++) io->out[(size_t)r * (size_t)n->OC + (size_t)c] += io->b[c];
  } else if (f & TP_XENT) {
    float *mx = p->tp_buf, *part = p->tp_buf + N;
    pw_xent_vp_max(mx, io->in0, N, n->C);
    tp_reduce(p, mx, (size_t)N, PW_PROG_MAX);
    pw_xent_vp_partial(part, io->aux, io->in0, mx, (const int32_t *)io->in1, N, n->C, tp_v0(p, n->C));
    tp_reduce(p, part, 2 * (size_t)N, PW_PROG_SUM);
    io->out[0] = pw_xent_vp_finish(io->aux, part, N, n->C, io->loss_scale);
  } else {
    return 0;
  }
  return 1;
}

/* Before node i's backward: its output's gradient summed over the group
 * when the readers each added a partial one. */
static void tp_dout(pw_prog *p, int slot, int i) {
  if (!(tp_flags(p, i) & TP_DOUT)) return;
  const pw_node *n = &p->m->nodes[i];
  float *g = dev_grad(p, slot, n->out);
  if (g) tp_reduce(p, g, pw_value_bytes(&p->m->values[n->out], p->cfg.mb_size) / sizeof(float), PW_PROG_SUM);
}

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One kernel of half h (0 F, 1 I, 2 W, 3 B); timed when profiling. */
static void call(pw_prog *p, pw_kernel_fn f, const pw_kernel_io *io, int h) {
  if (!p->prof_s) {
    f(io);
    return;
  }
  (void)p->be->sync(p->be, NULL);
  double t0 = mono_s();
  f(io);
  (void)p->be->sync(p->be, NULL);
  p->prof_s[io->n->op][h] += mono_s() - t0;
  p->prof_n[io->n->op][h]++;
}

static void node_forward(pw_prog *p, int slot, int i) {
  pw_kernel_io io;
  node_bind(p, slot, i, &io);
  if (!tp_forward(p, &io)) call(p, p->be->kernel_of(io.n->op)->forward, &io, 0);
  if (p->round_out && p->round_out[i - p->L.node_lo])
    p->be->round_bf16(p->be, io.out, pw_value_bytes(&p->m->values[io.n->out], p->cfg.mb_size) / sizeof(float));
}

static void node_backward_input(pw_prog *p, int slot, int i) {
  pw_kernel_fn f = p->be->kernel_of(p->m->nodes[i].op)->backward_input;
  if (!f) return;
  pw_kernel_io io;
  node_bind(p, slot, i, &io);
  if (!io.din0 && !io.din1) return; /* nothing upstream wants a gradient */
  if (tp_flags(p, i) & TP_XENT)
    pw_xent_vp_backward_input(io.din0, io.aux, (const int32_t *)io.in1, io.rows, io.n->C,
                              tp_v0(p, io.n->C), io.loss_scale, io.acc0);
  else
    call(p, f, &io, 1);
}

static void node_backward_weight(pw_prog *p, int slot, int i) {
  const pw_node *n = &p->m->nodes[i];
  pw_kernel_fn f = p->be->kernel_of(n->op)->backward_weight;
  if (n->w < 0 || !f) return;
  pw_kernel_io io;
  node_bind(p, slot, i, &io);
  if (!io.dw && !io.db) return; /* frozen: no W */
  size_t spans[2][2];
  int ns = wg_begin(p, i, &io, spans);
  if (tp_flags(p, i) & TP_EMBED) {
    int V = p->m->params[n->w].shape[0];
    pw_embed_vp_backward_weight(io.dw, io.dout, (const int32_t *)io.in0, io.rows, n->OC, V, tp_v0(p, V));
  } else {
    call(p, f, &io, 2);
  }
  wg_end(p, (const size_t(*)[2])spans, ns);
}

/* ---- remat's work buffers ------------------------------------------------ */

/* Give slot a work buffer (no-op without remat or when it holds one). */
static int work_take(pw_prog *p, int slot, pw_err *err) {
  if (!p->cfg.remat || p->work_of[slot] >= 0) return 0;
  int w = 0;
  while (w < p->max_slots && (p->work_busy[w] || !p->work[w])) w++; /* a made one first */
  if (w == p->max_slots) {
    for (w = 0; w < p->max_slots && p->work[w]; w++) {}
    if (w == p->max_slots) /* cannot happen: one per slot at most */
      return pw_err_set(err, PW_EINTERNAL, "stage program", "no work buffer free for slot %d: all %d are held", slot,
                        p->max_slots);
    if (!(p->work[w] = work_alloc(p)))
      return pw_err_set(err, PW_ENOMEM, "stage program", "out of memory for a recompute buffer (%zu bytes)",
                        pw_prog_work_bytes(p));
  }
  p->work_busy[w] = 1;
  p->work_of[slot] = w;
  return 0;
}

static void work_give(pw_prog *p, int slot) {
  if (!p->cfg.remat || p->work_of[slot] < 0) return;
  p->work_busy[p->work_of[slot]] = 0;
  p->work_of[slot] = -1;
}

/* ---- entry points ---------------------------------------------------------- */

static void run_forward(pw_prog *p, int slot) {
  for (int i = p->L.node_lo; i < p->L.node_hi; i++) {
    if (unit_enter(p, i, 1)) return;
    node_forward(p, slot, i);
  }
}

/* A slot an entry point may run on: one that exists. */
static int check_slot(const pw_prog *p, int slot, const char *entry, pw_err *err) {
  if (slot >= 0 && slot < p->max_slots && p->slots[slot]) return 0;
  return pw_err_set(err, PW_EINVAL, "stage program", "%s of slot %d: no such slot (%d may exist; made by create or "
                    "pw_prog_slot_ensure)", entry, slot, p->max_slots);
}

/* An entry point's end: 0, or the first callback failure kept (the
 * all-reduce's first: a hand-off after it ran on garbage). */
static int kept_failure(const pw_prog *p, pw_err *err) {
  const pw_err *e = p->be_err.code   ? &p->be_err
                     : p->pg_err.code ? &p->pg_err
                     : p->tp_err.code ? &p->tp_err
                                      : &p->wg_err;
  if (!e->code) return 0;
  if (err) *err = *e;
  return e->code;
}

int pw_prog_forward(pw_prog *p, int slot, float *loss, pw_err *err) {
  int rc = check_slot(p, slot, "forward", err);
  if (!rc) rc = work_take(p, slot, err);
  if (!rc) rc = move_ports(p, slot, 0, 0, 1, err);
  if (rc) return rc;
  run_forward(p, slot);
  unit_leave(p);
  rc = move_ports(p, slot, 1, 0, 0, err);
  if (loss) *loss = 0.0f;
  if (!rc && loss && p->L.has_loss) /* on a device: waits for the forward, and says if a kernel failed */
    rc = p->be->download(p->be, loss, dev_value(p, slot, p->m->loss_value), sizeof(float), err);
  work_give(p, slot);
  return rc ? rc : kept_failure(p, err);
}

/* Remat: a work buffer for the backward, filled by the forward again
 * (whose last layer's gather is followed by the backward's second). */
static int recompute(pw_prog *p, int slot, pw_err *err) {
  if (!p->cfg.remat) return 0;
  int rc = work_take(p, slot, err);
  int first = p->m->nodes[p->L.node_lo].layer, last = p->m->nodes[p->L.node_hi - 1].layer;
  p->pg_tail = last > first ? last - 1 : -1;
  if (!rc) run_forward(p, slot);
  p->pg_tail = -1;
  return rc;
}

static void zero_value_grads(pw_prog *p, int slot) {
  for (int i = 0; i < p->n_zero; i++) p->be->zero(p->be, slot_at(p, slot, p->zero[i][0]), p->zero[i][1] * sizeof(float), NULL);
}

int pw_prog_backward_input(pw_prog *p, int slot, pw_err *err) {
  int rc = check_slot(p, slot, "backward_input", err);
  if (!rc) rc = recompute(p, slot, err);
  if (!rc) rc = move_ports(p, slot, 1, 1, 1, err);
  if (rc) return rc;
  zero_value_grads(p, slot);
  for (int i = p->L.node_hi - 1; i >= p->L.node_lo; i--) {
    if (unit_enter(p, i, -1)) break;
    tp_dout(p, slot, i);
    node_backward_input(p, slot, i);
  }
  unit_leave(p);
  if ((rc = move_ports(p, slot, 0, 1, 0, err))) return rc;
  return kept_failure(p, err); /* remat: the work buffer stays with the slot until its W */
}

int pw_prog_backward_weight(pw_prog *p, int slot, pw_err *err) {
  int rc = check_slot(p, slot, "backward_weight", err);
  if (rc) return rc;
  if (p->cfg.remat && p->work_of[slot] < 0)
    return pw_err_set(err, PW_EINVAL, "stage program", "backward_weight of slot %d before its backward_input", slot);
  for (int i = p->L.node_hi - 1; i >= p->L.node_lo; i--) node_backward_weight(p, slot, i);
  work_give(p, slot);
  return kept_failure(p, err);
}

/* Both halves in one pass where the op has one (the layernorm: the bits
 * of weight-then-input). Returns 0 where it does not. */
static int node_backward_fused(pw_prog *p, int slot, int i) {
  pw_kernel_fn f = p->be->kernel_of(p->m->nodes[i].op)->backward;
  if (!f) return 0;
  pw_kernel_io io;
  node_bind(p, slot, i, &io);
  if (!io.din0 || !io.dw || (io.n->b >= 0 && !io.db)) return 0; /* frozen: I alone */
  size_t spans[2][2];
  int ns = wg_begin(p, i, &io, spans);
  call(p, f, &io, 3);
  wg_end(p, (const size_t(*)[2])spans, ns);
  return 1;
}

int pw_prog_backward(pw_prog *p, int slot, pw_err *err) {
  int rc = check_slot(p, slot, "backward", err);
  if (!rc) rc = recompute(p, slot, err);
  if (!rc) rc = move_ports(p, slot, 1, 1, 1, err);
  if (rc) return rc;
  zero_value_grads(p, slot);
  for (int i = p->L.node_hi - 1; i >= p->L.node_lo; i--) {
    if (unit_enter(p, i, -1)) break;
    tp_dout(p, slot, i);
    if (node_backward_fused(p, slot, i)) continue;
    node_backward_weight(p, slot, i);
    node_backward_input(p, slot, i);
  }
  unit_leave(p);
  work_give(p, slot);
  if ((rc = move_ports(p, slot, 0, 1, 0, err))) return rc;
  return kept_failure(p, err);
}
