/* prog: runs a stage program's nodes forward and backward over flat arenas.
 *
 * Layout of a slot (all 4-byte elements): for each value the stage holds,
 * its data; then for each float activation value, its gradient; then each
 * node's auxiliaries. Offsets are computed once at create; the per-step
 * path is pointer arithmetic and kernel calls, nothing else.
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
 * same bits). */
#include "prog.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ops.h"
#include "rng.h"

struct pw_prog {
  const pw_model *m;
  pw_prog_config cfg;
  int node_lo, node_hi;          /* nodes [lo, hi) */
  /* parameters */
  pw_prog_param *params;
  int n_params;
  int *param_local;              /* model param id -> local index, or -1 */
  size_t numel;
  float *arena_p, *arena_g, *arena_m, *arena_v;
  /* A parameter read by several nodes of this program (tied embeddings)
   * accumulates each further use in a shadow gradient after the numel
   * main ones, added to the main gradient by pw_prog_grads_finalize: the
   * sum is then use 1 + use 2 + ..., each over all microbatches — the
   * same association as when the uses sit on different stages. */
  size_t grad_numel;             /* numel + shadows */
  size_t *node_dw, *node_db;     /* per local node: gradient offset of w and b */
  size_t (*shadow)[3];           /* {main offset, shadow offset, count} */
  int n_shadow;
  /* slots */
  size_t *val_off;               /* per model value: element offset in a slot, or SIZE_MAX */
  size_t *grad_off;              /* per model value: gradient offset, or SIZE_MAX */
  size_t *aux_off;               /* per local node */
  size_t slot_elems;
  unsigned char *bwd_acc;        /* per local node: bit k set = input k's gradient accumulates */
  size_t (*zero)[2];             /* gradients nobody in the stage writes, zeroed before a
                                    backward: {offset, count} (usually none) */
  int n_zero;
  float **slots;                 /* [max_slots], NULL until made */
  int max_slots;
  float *scratch;                /* attention: T*T */
  /* ports */
  pw_prog_port *inputs, *outputs;
  int n_inputs, n_outputs;
  int has_loss;
  float loss_scale;
};

#define NONE ((size_t)-1)

/* Write one float per 4 KiB page so the kernel maps it now. */
static void first_touch(float *a, size_t n) {
  volatile float *v = a;
  for (size_t i = 0; i < n; i += 1024) v[i] = 0.0f;
}

#define HUGE_PAGE ((size_t)2 << 20)

/* n zeroed floats, every page mapped now (the first use would pay the
 * page faults in the middle of a step). Arrays of 2 MiB or more are 2 MiB
 * aligned and asked to be transparent huge pages (THP is often in
 * "madvise" mode): a step streams through hundreds of MB of slot and
 * arenas, and OpenBLAS's packing walks many rows at once; with 4 KiB pages
 * each 4 KiB is a TLB miss. Measured on a d256 step: about even on a quiet
 * machine, 1-6 % faster while other processes load it. Freed with free(). */
static float *alloc_floats(size_t n) {
  size_t bytes = n * sizeof(float);
  float *a;
  if (bytes < HUGE_PAGE) {
    /* calloc maps its pages lazily (malloc + memset(0) becomes calloc too) */
    if ((a = calloc(n, sizeof(float)))) first_touch(a, n);
    return a;
  }
  void *v = NULL;
  size_t rounded = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
  if (posix_memalign(&v, HUGE_PAGE, rounded)) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(v, rounded, MADV_HUGEPAGE); /* a hint: if refused, 4 KiB pages */
#endif
  memset(v, 0, bytes);
  return v;
}

static int value_in_stage(const pw_prog *p, int v) {
  int prod = p->m->values[v].producer;
  return prod >= p->node_lo && prod < p->node_hi;
}

/* Bit k set: the op's backward_input writes the gradient of input k. */
static int grad_inputs(int op) {
  switch ((pw_op)op) {
    case PW_OP_EMBED: return 0; /* tokens */
    case PW_OP_ADD:
    case PW_OP_SWIGLU: return 3;
    default: return 1; /* the second input, if any, is a target or data */
  }
}

static int add_port(pw_prog_port **arr, int *n, const pw_model *m, int v, int mb) {
  for (int i = 0; i < *n; i++)
    if ((*arr)[i].value == v) return 0;
  pw_prog_port *a = realloc(*arr, sizeof **arr * (size_t)(*n + 1));
  if (!a) return PW_ENOMEM;
  *arr = a;
  a[*n] = (pw_prog_port){.value = v, .role = m->values[v].role,
                         .bytes = pw_value_bytes(&m->values[v], mb)};
  (*n)++;
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
  pw_prog *p = calloc(1, sizeof *p);
  if (!p) return pw_err_set(err, PW_ENOMEM, "prog", "out of memory");
  p->m = m;
  p->cfg = *cfg;
  p->node_lo = m->layers[cfg->layer_lo].node_lo;
  p->node_hi = m->layers[cfg->layer_hi - 1].node_hi;
  int nn = p->node_hi - p->node_lo, mb = cfg->mb_size;
  p->param_local = malloc(sizeof(int) * (size_t)(m->n_params ? m->n_params : 1));
  p->val_off = malloc(sizeof(size_t) * (size_t)m->n_values);
  p->grad_off = malloc(sizeof(size_t) * (size_t)m->n_values);
  p->aux_off = malloc(sizeof(size_t) * (size_t)(nn ? nn : 1));
  if (!p->param_local || !p->val_off || !p->grad_off || !p->aux_off) goto oom;
  for (int i = 0; i < m->n_params; i++) p->param_local[i] = -1;
  for (int i = 0; i < m->n_values; i++) p->val_off[i] = p->grad_off[i] = NONE;

  /* Parameters used by the stage's nodes, in model order. */
  for (int i = p->node_lo; i < p->node_hi; i++) {
    int ids[2] = {m->nodes[i].w, m->nodes[i].b};
    for (int k = 0; k < 2; k++)
      if (ids[k] >= 0) p->param_local[ids[k]] = 0;
  }
  for (int i = 0; i < m->n_params; i++)
    if (p->param_local[i] == 0) p->n_params++;
  p->params = calloc((size_t)(p->n_params ? p->n_params : 1), sizeof *p->params);
  if (!p->params) goto oom;
  int np = 0;
  for (int i = 0; i < m->n_params; i++) {
    if (p->param_local[i] < 0) continue;
    p->param_local[i] = np;
    p->params[np].meta = &m->params[i];
    p->params[np].model_index = i;
    p->numel += m->params[i].numel;
    np++;
  }
  size_t pn = p->numel ? p->numel : 1;
  /* Gradient offsets per node use; second and later uses get shadows. */
  p->node_dw = malloc(sizeof(size_t) * (size_t)(nn ? nn : 1));
  p->node_db = malloc(sizeof(size_t) * (size_t)(nn ? nn : 1));
  p->shadow = malloc(sizeof *p->shadow * (size_t)(2 * nn + 1));
  int *uses = calloc((size_t)(p->n_params ? p->n_params : 1), sizeof(int));
  size_t *poff = malloc(sizeof(size_t) * (size_t)(p->n_params ? p->n_params : 1));
  if (!p->node_dw || !p->node_db || !p->shadow || !uses || !poff) {
    free(uses);
    free(poff);
    goto oom;
  }
  for (int i = 0, o = 0; i < p->n_params; i++) {
    poff[i] = (size_t)o;
    o += (int)p->params[i].meta->numel;
  }
  p->grad_numel = p->numel;
  for (int i = p->node_lo; i < p->node_hi; i++) {
    int ids[2] = {m->nodes[i].w, m->nodes[i].b};
    size_t *dst[2] = {&p->node_dw[i - p->node_lo], &p->node_db[i - p->node_lo]};
    for (int k = 0; k < 2; k++) {
      *dst[k] = NONE;
      if (ids[k] < 0) continue;
      int lp = p->param_local[ids[k]];
      if (uses[lp]++ == 0) {
        *dst[k] = poff[lp];
        continue;
      }
      size_t n = m->params[ids[k]].numel;
      p->shadow[p->n_shadow][0] = poff[lp];
      p->shadow[p->n_shadow][1] = p->grad_numel;
      p->shadow[p->n_shadow][2] = n;
      p->n_shadow++;
      *dst[k] = p->grad_numel;
      p->grad_numel += n;
    }
  }
  free(uses);
  free(poff);
  p->arena_p = alloc_floats(pn);
  p->arena_g = alloc_floats(p->grad_numel ? p->grad_numel : 1);
  p->arena_m = alloc_floats(pn);
  p->arena_v = alloc_floats(pn);
  if (!p->arena_p || !p->arena_g || !p->arena_m || !p->arena_v) goto oom;
  for (int i = 0, off = 0; i < p->n_params; i++) {
    p->params[i].data = p->arena_p + off;
    p->params[i].grad = p->arena_g + off;
    p->params[i].m = p->arena_m + off;
    p->params[i].v = p->arena_v + off;
    off += (int)p->params[i].meta->numel;
  }

  /* Ports and values. */
  for (int i = p->node_lo; i < p->node_hi; i++) {
    const pw_node *n = &m->nodes[i];
    for (int k = 0; k < 2; k++)
      if (n->in[k] >= 0 && !value_in_stage(p, n->in[k]) &&
          add_port(&p->inputs, &p->n_inputs, m, n->in[k], mb))
        goto oom;
    if (n->out == m->loss_value) p->has_loss = 1;
  }
  for (int i = 0; i < m->n_nodes; i++) {
    if (i >= p->node_lo && i < p->node_hi) continue;
    const pw_node *n = &m->nodes[i];
    for (int k = 0; k < 2; k++)
      if (n->in[k] >= 0 && value_in_stage(p, n->in[k]) &&
          add_port(&p->outputs, &p->n_outputs, m, n->in[k], mb))
        goto oom;
  }
  size_t off = 0;
  for (int i = 0; i < p->n_inputs; i++) {
    const pw_value *v = &m->values[p->inputs[i].value];
    p->val_off[p->inputs[i].value] = off;
    off += (size_t)mb * (size_t)v->rows * (size_t)v->width;
  }
  for (int i = p->node_lo; i < p->node_hi; i++) {
    const pw_value *v = &m->values[m->nodes[i].out];
    p->val_off[m->nodes[i].out] = off;
    off += v->role == PW_VAL_LOSS ? 1 : (size_t)mb * (size_t)v->rows * (size_t)v->width;
  }
  for (int i = 0; i < p->n_inputs; i++) {
    const pw_value *v = &m->values[p->inputs[i].value];
    if (v->role != PW_VAL_ACT) continue; /* data: no gradient */
    p->grad_off[p->inputs[i].value] = off;
    off += (size_t)mb * (size_t)v->rows * (size_t)v->width;
  }
  for (int i = p->node_lo; i < p->node_hi; i++) {
    const pw_value *v = &m->values[m->nodes[i].out];
    if (v->role != PW_VAL_ACT) continue;
    p->grad_off[m->nodes[i].out] = off;
    off += (size_t)mb * (size_t)v->rows * (size_t)v->width;
  }
  /* The first writer of each value gradient in backward order overwrites,
   * later ones accumulate. Output ports' gradients arrive filled by the
   * caller (what the next stage sent): every writer adds to them. A
   * gradient nobody writes is zeroed before each backward, merged into runs. */
  p->bwd_acc = calloc((size_t)(nn ? nn : 1), 1);
  p->zero = malloc(sizeof *p->zero * (size_t)(m->n_values ? m->n_values : 1));
  unsigned char *written = calloc((size_t)(m->n_values ? m->n_values : 1), 1);
  if (!p->bwd_acc || !p->zero || !written) {
    free(written);
    goto oom;
  }
  for (int k = 0; k < p->n_outputs; k++) written[p->outputs[k].value] = 1;
  for (int i = p->node_hi - 1; i >= p->node_lo; i--) {
    const pw_node *n = &m->nodes[i];
    for (int k = 0; k < 2; k++) {
      int v = n->in[k];
      if (!(grad_inputs(n->op) >> k & 1) || v < 0 || p->grad_off[v] == NONE) continue;
      if (written[v]) p->bwd_acc[i - p->node_lo] |= (unsigned char)(1u << k);
      written[v] = 1;
    }
  }
  for (int v = 0; v < m->n_values; v++) {
    if (p->grad_off[v] == NONE || written[v]) continue;
    size_t o = p->grad_off[v], n = pw_value_bytes(&m->values[v], mb) / sizeof(float);
    if (p->n_zero && p->zero[p->n_zero - 1][0] + p->zero[p->n_zero - 1][1] == o)
      p->zero[p->n_zero - 1][1] += n;
    else {
      p->zero[p->n_zero][0] = o;
      p->zero[p->n_zero][1] = n;
      p->n_zero++;
    }
  }
  free(written);
  size_t tt = 1;
  for (int i = p->node_lo; i < p->node_hi; i++) {
    const pw_node *n = &m->nodes[i];
    p->aux_off[i - p->node_lo] = off;
    off += (size_t)mb * n->aux;
    if (n->op == PW_OP_ATTENTION && (size_t)n->T * (size_t)n->T > tt) tt = (size_t)n->T * (size_t)n->T;
  }
  p->slot_elems = off ? off : 1;
  p->max_slots = cfg->max_slots ? cfg->max_slots : cfg->n_slots;
  p->slots = calloc((size_t)p->max_slots, sizeof *p->slots);
  p->scratch = malloc(tt * sizeof(float));
  if (!p->slots || !p->scratch) goto oom;
  memset(p->scratch, 0, tt * sizeof(float));
  for (int k = 0; k < cfg->n_slots; k++)
    if (pw_prog_slot_ensure(p, k)) goto oom;

  /* Loss scale: microbatch losses sum to the mean over the whole batch. */
  if (p->has_loss) {
    const pw_node *ln = &m->nodes[m->values[m->loss_value].producer];
    const pw_value *pred = &m->values[ln->in[0]];
    double per_seq = ln->op == PW_OP_MSE ? (double)pred->rows * pred->width : (double)pred->rows;
    p->loss_scale = (float)(1.0 / ((double)cfg->batch_size * per_seq));
  }
  *out = p;
  return 0;
oom:
  pw_prog_free(p);
  return pw_err_set(err, PW_ENOMEM, "prog", "out of memory");
}

void pw_prog_free(pw_prog *p) {
  if (!p) return;
  free(p->params);
  free(p->param_local);
  free(p->arena_p);
  free(p->arena_g);
  free(p->node_dw);
  free(p->node_db);
  free(p->shadow);
  free(p->arena_m);
  free(p->arena_v);
  free(p->val_off);
  free(p->grad_off);
  free(p->aux_off);
  free(p->bwd_acc);
  free(p->zero);
  if (p->slots)
    for (int k = 0; k < p->max_slots; k++) free(p->slots[k]);
  free(p->slots);
  free(p->scratch);
  free(p->inputs);
  free(p->outputs);
  free(p);
}

const pw_model *pw_prog_model(const pw_prog *p) { return p->m; }
const pw_prog_config *pw_prog_config_of(const pw_prog *p) { return &p->cfg; }
int pw_prog_n_params(const pw_prog *p) { return p->n_params; }
pw_prog_param *pw_prog_param_at(pw_prog *p, int i) { return &p->params[i]; }
size_t pw_prog_numel(const pw_prog *p) { return p->numel; }
size_t pw_prog_grad_numel(const pw_prog *p) { return p->grad_numel; }

void pw_prog_grads_finalize(pw_prog *p) {
  for (int i = 0; i < p->n_shadow; i++) {
    float *dst = p->arena_g + p->shadow[i][0];
    const float *src = p->arena_g + p->shadow[i][1];
    for (size_t k = 0; k < p->shadow[i][2]; k++) dst[k] += src[k];
  }
}
float *pw_prog_params(pw_prog *p) { return p->arena_p; }
float *pw_prog_grads(pw_prog *p) { return p->arena_g; }
size_t pw_prog_slot_bytes(const pw_prog *p) { return p->slot_elems * sizeof(float); }
int pw_prog_max_slots(const pw_prog *p) { return p->max_slots; }

int pw_prog_slot_ensure(pw_prog *p, int slot) {
  if (slot < 0 || slot >= p->max_slots) return PW_EINVAL;
  if (p->slots[slot]) return 0;
  float *s = alloc_floats(p->slot_elems);
  if (!s) return PW_ENOMEM;
  p->slots[slot] = s;
  return 0;
}
int pw_prog_n_inputs(const pw_prog *p) { return p->n_inputs; }
const pw_prog_port *pw_prog_input(const pw_prog *p, int i) { return &p->inputs[i]; }
int pw_prog_n_outputs(const pw_prog *p) { return p->n_outputs; }
const pw_prog_port *pw_prog_output(const pw_prog *p, int i) { return &p->outputs[i]; }
int pw_prog_has_loss(const pw_prog *p) { return p->has_loss; }

void *pw_prog_value(pw_prog *p, int slot, int value) {
  if (value < 0 || value >= p->m->n_values || p->val_off[value] == NONE || !p->slots[slot]) return NULL;
  return p->slots[slot] + p->val_off[value];
}

float *pw_prog_grad(pw_prog *p, int slot, int value) {
  if (value < 0 || value >= p->m->n_values || p->grad_off[value] == NONE || !p->slots[slot]) return NULL;
  return p->slots[slot] + p->grad_off[value];
}

void pw_prog_init_params(pw_prog *p, unsigned long long seed) {
  for (int i = 0; i < p->n_params; i++) {
    const pw_param *pm = p->params[i].meta;
    float *d = p->params[i].data;
    switch ((pw_init_kind)pm->init) {
      case PW_INIT_ZEROS: memset(d, 0, pm->numel * sizeof(float)); break;
      case PW_INIT_ONES:
        for (size_t k = 0; k < pm->numel; k++) d[k] = 1.0f;
        break;
      case PW_INIT_NORMAL: {
        pw_rng r;
        pw_rng_seed(&r, pw_hash64(seed, pw_hash_str(pm->name)));
        for (size_t k = 0; k < pm->numel; k++) d[k] = (float)(pw_rng_normal(&r) * pm->init_std);
        break;
      }
    }
  }
}

void pw_prog_zero_grad(pw_prog *p) { memset(p->arena_g, 0, p->grad_numel * sizeof(float)); }

/* ---- per node -------------------------------------------------------- */

typedef struct {
  float *in0, *in1, *out;       /* data */
  float *din0, *din1, *dout;    /* gradients (NULL where none) */
  float *aux;
  float *w, *b, *dw, *db;
  int rows;                     /* mb * rows per sequence of the input */
} node_io;

static void node_bind(pw_prog *p, int slot, int i, node_io *io) {
  const pw_node *n = &p->m->nodes[i];
  memset(io, 0, sizeof *io);
  io->in0 = pw_prog_value(p, slot, n->in[0]);
  io->din0 = pw_prog_grad(p, slot, n->in[0]);
  if (n->in[1] >= 0) {
    io->in1 = pw_prog_value(p, slot, n->in[1]);
    io->din1 = pw_prog_grad(p, slot, n->in[1]);
  }
  io->out = pw_prog_value(p, slot, n->out);
  io->dout = pw_prog_grad(p, slot, n->out);
  io->aux = p->slots[slot] + p->aux_off[i - p->node_lo];
  if (n->w >= 0) {
    io->w = p->params[p->param_local[n->w]].data;
    io->dw = p->arena_g + p->node_dw[i - p->node_lo];
  }
  if (n->b >= 0) {
    io->b = p->params[p->param_local[n->b]].data;
    io->db = p->arena_g + p->node_db[i - p->node_lo];
  }
  io->rows = p->cfg.mb_size * p->m->values[n->in[0]].rows;
}

static void node_forward(pw_prog *p, int slot, int i) {
  const pw_node *n = &p->m->nodes[i];
  node_io io;
  node_bind(p, slot, i, &io);
  int N = io.rows, C = n->C, B = p->cfg.mb_size;
  switch ((pw_op)n->op) {
    case PW_OP_EMBED: pw_embed_forward(io.out, (const int32_t *)io.in0, io.w, N, n->OC); break;
    case PW_OP_POSEMBED: pw_posembed_forward(io.out, io.in0, io.w, B, n->T, C); break;
    case PW_OP_LINEAR: pw_linear_forward(io.out, io.in0, io.w, io.b, N, C, n->OC); break;
    case PW_OP_LAYERNORM:
      pw_layernorm_forward(io.out, io.aux, io.aux + N, io.in0, io.w, io.b, N, C, n->eps);
      break;
    case PW_OP_RMSNORM: pw_rmsnorm_forward(io.out, io.aux, io.in0, io.w, N, C, n->eps); break;
    case PW_OP_GELU: pw_gelu_forward(io.out, io.aux, io.in0, N * C); break;
    case PW_OP_RELU: pw_relu_forward(io.out, io.in0, N * C); break;
    case PW_OP_SILU: pw_silu_forward(io.out, io.in0, N * C); break;
    case PW_OP_SWIGLU: pw_swiglu_forward(io.out, io.in0, io.in1, N * C); break;
    case PW_OP_ADD: pw_add_forward(io.out, io.in0, io.in1, N * C); break;
    case PW_OP_ROPE: pw_rope_forward(io.out, io.in0, B, n->T, C / 3, n->NH, n->base); break;
    case PW_OP_ATTENTION: pw_attention_forward(io.out, io.aux, io.in0, B, n->T, C / 3, n->NH); break;
    case PW_OP_XENT:
      io.out[0] = pw_crossentropy_forward(io.aux, io.in0, (const int32_t *)io.in1, N, C, p->loss_scale);
      break;
    case PW_OP_MSE: io.out[0] = pw_mse_forward(io.in0, io.in1, N * C, p->loss_scale); break;
    case PW_OP__COUNT: break;
  }
}

static void node_backward_input(pw_prog *p, int slot, int i) {
  const pw_node *n = &p->m->nodes[i];
  node_io io;
  node_bind(p, slot, i, &io);
  int N = io.rows, C = n->C, B = p->cfg.mb_size;
  if (!io.din0 && !io.din1) return; /* nothing upstream wants a gradient */
  int a0 = p->bwd_acc[i - p->node_lo] & 1, a1 = p->bwd_acc[i - p->node_lo] >> 1 & 1;
  switch ((pw_op)n->op) {
    case PW_OP_EMBED: break;
    case PW_OP_POSEMBED: pw_posembed_backward_input(io.din0, io.dout, B, n->T, C, a0); break;
    case PW_OP_LINEAR: pw_linear_backward_input(io.din0, io.dout, io.w, N, C, n->OC, a0); break;
    case PW_OP_LAYERNORM:
      pw_layernorm_backward_input(io.din0, io.dout, io.in0, io.w, io.aux, io.aux + N, N, C, a0);
      break;
    case PW_OP_RMSNORM: pw_rmsnorm_backward_input(io.din0, io.dout, io.in0, io.w, io.aux, N, C, a0); break;
    case PW_OP_GELU: pw_gelu_backward_input(io.din0, io.dout, io.aux, N * C, a0); break;
    case PW_OP_RELU: pw_relu_backward_input(io.din0, io.dout, io.in0, N * C, a0); break;
    case PW_OP_SILU: pw_silu_backward_input(io.din0, io.dout, io.in0, N * C, a0); break;
    case PW_OP_SWIGLU: pw_swiglu_backward_input(io.din0, io.din1, io.dout, io.in0, io.in1, N * C, a0, a1); break;
    case PW_OP_ADD: pw_add_backward_input(io.din0, io.din1, io.dout, N * C, a0, a1); break;
    case PW_OP_ROPE: pw_rope_backward_input(io.din0, io.dout, B, n->T, C / 3, n->NH, n->base, a0); break;
    case PW_OP_ATTENTION:
      pw_attention_backward_input(io.din0, p->scratch, io.dout, io.in0, io.aux, B, n->T, C / 3, n->NH, a0);
      break;
    case PW_OP_XENT:
      pw_crossentropy_backward_input(io.din0, io.aux, (const int32_t *)io.in1, N, C, p->loss_scale, a0);
      break;
    case PW_OP_MSE: pw_mse_backward_input(io.din0, io.in0, io.in1, N * C, p->loss_scale, a0); break;
    case PW_OP__COUNT: break;
  }
}

static void node_backward_weight(pw_prog *p, int slot, int i) {
  const pw_node *n = &p->m->nodes[i];
  if (n->w < 0) return;
  node_io io;
  node_bind(p, slot, i, &io);
  int N = io.rows, C = n->C, B = p->cfg.mb_size;
  switch ((pw_op)n->op) {
    case PW_OP_EMBED: pw_embed_backward_weight(io.dw, io.dout, (const int32_t *)io.in0, N, n->OC); break;
    case PW_OP_POSEMBED: pw_posembed_backward_weight(io.dw, io.dout, B, n->T, C); break;
    case PW_OP_LINEAR: pw_linear_backward_weight(io.dw, io.db, io.dout, io.in0, N, C, n->OC); break;
    case PW_OP_LAYERNORM:
      pw_layernorm_backward_weight(io.dw, io.db, io.dout, io.in0, io.aux, io.aux + N, N, C);
      break;
    case PW_OP_RMSNORM: pw_rmsnorm_backward_weight(io.dw, io.dout, io.in0, io.aux, N, C); break;
    default: break;
  }
}

void pw_prog_forward(pw_prog *p, int slot, float *loss) {
  for (int i = p->node_lo; i < p->node_hi; i++) node_forward(p, slot, i);
  if (loss) *loss = p->has_loss ? *(float *)pw_prog_value(p, slot, p->m->loss_value) : 0.0f;
}

static void zero_value_grads(pw_prog *p, int slot) {
  float *base = p->slots[slot];
  for (int i = 0; i < p->n_zero; i++) memset(base + p->zero[i][0], 0, p->zero[i][1] * sizeof(float));
}

void pw_prog_backward_input(pw_prog *p, int slot) {
  zero_value_grads(p, slot);
  for (int i = p->node_hi - 1; i >= p->node_lo; i--) node_backward_input(p, slot, i);
}

void pw_prog_backward_weight(pw_prog *p, int slot) {
  for (int i = p->node_hi - 1; i >= p->node_lo; i--) node_backward_weight(p, slot, i);
}

/* Both halves of a layernorm in one pass (pw_layernorm_backward: the
 * bits of weight-then-input). Returns 0 where the node is not one. */
static int node_backward_fused(pw_prog *p, int slot, int i) {
  const pw_node *n = &p->m->nodes[i];
  if (n->op != PW_OP_LAYERNORM) return 0;
  node_io io;
  node_bind(p, slot, i, &io);
  if (!io.din0) return 0;
  int N = io.rows;
  pw_layernorm_backward(io.din0, io.dw, io.db, io.dout, io.in0, io.w, io.aux, io.aux + N, N, n->C,
                        p->bwd_acc[i - p->node_lo] & 1);
  return 1;
}

void pw_prog_backward(pw_prog *p, int slot) {
  zero_value_grads(p, slot);
  for (int i = p->node_hi - 1; i >= p->node_lo; i--) {
    if (node_backward_fused(p, slot, i)) continue;
    node_backward_weight(p, slot, i);
    node_backward_input(p, slot, i);
  }
}
