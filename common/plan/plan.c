/* plan: model -> schedule -> partition -> simulation, the memory each rank
 * will allocate, and the plan's JSON. */
#include "plan.h"

#include "collective.h"
#include "optable.h"
#include "placement.h"
#include "zero3.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- memory ---------------------------------------------------------------- */

size_t pw_tied_floats(const pw_model *m, const pw_shared_param *sp) {
  return (size_t)(1 + sp->n_holders) * m->params[sp->param].numel;
}

void pw_tied_wire(pw_tied_bufs *t, float *block, const pw_model *m, const pw_shared_param *sp) {
  size_t n = m->params[sp->param].numel;
  memset(t, 0, sizeof *t);
  t->block = block;
  for (int j = 0; j < sp->n_holders; j++) t->holder[j] = block + (size_t)j * n;
  t->sum = block + (size_t)sp->n_holders * n;
}

/* The walk of pw_plan_peak_slots for one rank r. done[kind][st*m+k]: the
 * action has completed; got[st*m+k]: microbatch k holds a slot of st. */
typedef struct {
  const pw_sched *s;
  uint8_t *done[4], *got;
  int *held, *pos, *stack, n_stack;
} slot_walk;

static int done_at(const slot_walk *w, int kind, int k, int st) { return w->done[kind][st * w->s->m + k]; }

static void take(slot_walk *w, int k, int st) {
  if (w->got[st * w->s->m + k]) return;
  w->got[st * w->s->m + k] = 1;
  w->held[st]++;
}

/* Inputs of a (as in sim.h) all done, or supplied by `first`, the F a fused
 * B runs with. */
static int deps_done(const slot_walk *w, const pw_action *a, const pw_action *first) {
  int k = a->mb, st = a->stage;
  int links[PW_SCHED_MAX_LINKS], n;
  switch (a->kind) {
    case PW_ACT_F:
      n = pw_sched_preds(w->s, st, links);
      for (int j = 0; j < n; j++)
        if (!done_at(w, PW_ACT_F, k, links[j])) return 0;
      return 1;
    case PW_ACT_W: return done_at(w, PW_ACT_I, k, st);
    default:
      if (!done_at(w, PW_ACT_F, k, st) && !(first && first->kind == PW_ACT_F && first->mb == k && first->stage == st))
        return 0;
      n = pw_sched_succs(w->s, st, links);
      for (int j = 0; j < n; j++)
        if (!done_at(w, PW_ACT_B, k, links[j]) && !done_at(w, PW_ACT_I, k, links[j])) return 0;
      return 1;
  }
}

static void push_rank_of(slot_walk *w, int st) {
  if (st >= 0 && st < w->s->S) w->stack[w->n_stack++] = w->s->stage_to_rank[st];
}

/* Action a has completed on some rank: what rank r's slots see of it, and
 * which ranks may now move. */
static void complete(slot_walk *w, int r, const pw_action *a) {
  const pw_sched *s = w->s;
  int k = a->mb, st = a->stage;
  int succ[PW_SCHED_MAX_LINKS], pred[PW_SCHED_MAX_LINKS];
  int ns = pw_sched_succs(s, st, succ), np = pw_sched_preds(s, st, pred);
  w->done[a->kind][st * s->m + k] = 1;
  for (int j = 0; j < ns && a->kind == PW_ACT_F; j++)
    if (s->stage_to_rank[succ[j]] == r) take(w, k, succ[j]); /* arrived */
  if (s->stage_to_rank[st] == r &&
      (a->kind == PW_ACT_B || a->kind == PW_ACT_W || (a->kind == PW_ACT_F && s->forward_only)))
    w->held[st]--;
  for (int j = 0; j < ns; j++) push_rank_of(w, succ[j]);
  for (int j = 0; j < np; j++) push_rank_of(w, pred[j]);
}

/* Every rank but r as far as its list and the completed actions allow. */
static void advance_others(slot_walk *w, int r) {
  const pw_sched *s = w->s;
  while (w->n_stack > 0) {
    int q = w->stack[--w->n_stack];
    if (q == r) continue;
    while (w->pos[q] < s->n_actions[q]) {
      const pw_action *a = &s->actions[q][w->pos[q]];
      int n = (a->flags & PW_ACTION_FUSED) && w->pos[q] + 1 < s->n_actions[q] ? 2 : 1;
      if (!deps_done(w, a, NULL) || (n == 2 && !deps_done(w, a + 1, a))) break;
      for (int u = 0; u < n; u++) complete(w, r, &a[u]);
      w->pos[q] += n;
    }
  }
}

int pw_plan_peak_slots(const pw_sched *s, int *peak) {
  int S = s->S, m = s->m, pp = s->pp, total = 0;
  for (int q = 0; q < pp; q++) total += s->n_actions[q];
  size_t cells = (size_t)S * (size_t)m;
  slot_walk w = {.s = s};
  uint8_t *flags = malloc(5 * cells);
  w.held = malloc(sizeof(int) * (size_t)S);
  w.pos = malloc(sizeof(int) * (size_t)pp);
  /* each completion pushes up to 2 x PW_SCHED_MAX_LINKS ranks; plus every rank once per walk */
  w.stack = malloc(sizeof(int) * (2 * PW_SCHED_MAX_LINKS * (size_t)total + (size_t)pp + 1));
  int rc = flags && w.held && w.pos && w.stack ? 0 : PW_ENOMEM;
  for (int st = 0; st < S; st++) peak[st] = 0;
  for (int r = 0; r < pp && !rc; r++) {
    memset(flags, 0, 5 * cells);
    for (int k = 0; k < 4; k++) w.done[k] = flags + (size_t)k * cells;
    w.got = flags + 4 * cells;
    memset(w.held, 0, sizeof(int) * (size_t)S);
    memset(w.pos, 0, sizeof(int) * (size_t)pp);
    w.n_stack = 0;
    for (int q = 0; q < pp; q++) w.stack[w.n_stack++] = q;
    const pw_action *acts = s->actions[r];
    for (int i = 0;;) {
      advance_others(&w, r);
      for (int st = 0; st < S; st++)
        if (s->stage_to_rank[st] == r && w.held[st] > peak[st]) peak[st] = w.held[st];
      if (i == s->n_actions[r]) break;
      int n = (acts[i].flags & PW_ACTION_FUSED) && i + 1 < s->n_actions[r] ? 2 : 1;
      for (int u = 0; u < n; u++)
        if (acts[i + u].kind == PW_ACT_F) take(&w, acts[i + u].mb, acts[i + u].stage); /* F starts */
      for (int st = 0; st < S; st++)
        if (s->stage_to_rank[st] == r && w.held[st] > peak[st]) peak[st] = w.held[st];
      for (int u = 0; u < n; u++) complete(&w, r, &acts[i + u]);
      i += n;
    }
  }
  free(flags);
  free(w.held);
  free(w.pos);
  free(w.stack);
  return rc;
}

void pw_plan_work(const pw_sched *s, const int *remat, int *n_work) {
  for (int st = 0; st < s->S; st++) {
    int on = remat[st]; /* remat may be n_work itself */
    n_work[st] = 0;
    if (!on) continue;
    int r = s->stage_to_rank[st], pending = 0;
    n_work[st] = 1;
    for (int i = 0; i < s->n_actions[r]; i++) {
      const pw_action *a = &s->actions[r][i];
      if (a->stage != st) continue;
      if (a->kind != PW_ACT_W && pending + 1 > n_work[st]) n_work[st] = pending + 1;
      pending += a->kind == PW_ACT_I ? 1 : a->kind == PW_ACT_W ? -1 : 0;
    }
  }
}

/* What pw_dataset_open keeps in memory (common/io/data.c). */
static size_t data_bytes(const pw_job *job, const pw_model *m) {
  struct stat st;
  switch (job->data.kind) {
    case PW_DATA_TEXT:
    case PW_DATA_TOKENS: return job->data.path[0] && stat(job->data.path, &st) == 0 ? (size_t)st.st_size : 0;
    case PW_DATA_LABELED: /* the rows it parses, at most the file's bytes again (an id is at least 2 bytes of text) */
      return job->data.path[0] && stat(job->data.path, &st) == 0 ? 2 * (size_t)st.st_size : 0;
    case PW_DATA_REGRESSION:
    case PW_DATA_CLASSIFY: return (size_t)m->data.in_dim * (size_t)m->data.out_dim * sizeof(double);
    default: return 0;
  }
}

/* train.eval_every: the eval passes run the forward-only lists of the same
 * schedule in the same slots, where a stage may hold more microbatches at
 * once than in training (its upstream runs ahead with nothing to wait
 * for); each stage's peak is the larger of the two. */
static int eval_peak_slots(const pw_sched *s, int *peak) {
  pw_sched *f = NULL;
  int *fp = malloc(sizeof(int) * (size_t)s->S), rc = fp ? 0 : PW_ENOMEM;
  if (!rc) rc = pw_sched_new(s->pp, s->V, s->S, s->m, s->stage_to_rank, 1, &f, NULL);
  if (!rc) rc = pw_sched_copy_graph(f, s);
  for (int r = 0; r < s->pp && !rc; r++)
    for (int i = 0; i < s->n_actions[r] && !rc; i++)
      if (s->actions[r][i].kind == PW_ACT_F) {
        pw_action a = s->actions[r][i];
        a.flags = 0;
        rc = pw_sched_push(f, r, a);
      }
  if (!rc) rc = pw_plan_peak_slots(f, fp);
  for (int st = 0; st < s->S && !rc; st++)
    if (fp[st] > peak[st]) peak[st] = fp[st];
  pw_sched_free(f);
  free(fp);
  return rc;
}

/* Stage s's exchange under train.zero > 0 (worker/dpx.c, gradrs.c): the
 * floats it all-reduces whole (its shadows and the parameters it shares
 * with other stages) in *full and, zero 2, what its replica 0 keeps of
 * the gradient arena (*live), its weight-gradient buffers (*wbufs), the
 * bytes it sends per microbatch (*wsent) and its flushes per microbatch
 * (*flushes). */
typedef struct {
  size_t full, live, wbufs;
  uint64_t wsent;
  int flushes;
  /* zero 3 (worker/pgather.c): the shard of the parameter arena (pages
   * included), the largest unit (the rank's gather ring holds 3), the bytes
   * replica 0 sends to gather every layer once and the last layer's part
   * (a remat recompute's last layer is not gathered again), and the
   * gathers of a pass on the link (each behind the layer computed before
   * it: this action's, or the last one of the action before) */
  size_t z3_shard, z3_unit;
  uint64_t z3_pass, z3_last;
  double z3_sec;
} zero_sizes;

static int zero_sizes_of(const pw_plan *p, int s, int zero, zero_sizes *z) {
  const pw_stage *st = &p->part.stages[s];
  pw_prog_layout L;
  memset(z, 0, sizeof *z);
  if (pw_prog_layout_build(&p->model, st->layer_lo, st->layer_hi, p->mb_size, &L)) return PW_ENOMEM;
  int tied[64], nt = 0;
  for (int k = 0; k < p->part.n_shared && nt < 64; k++)
    for (int j = 0; j < p->part.shared[k].n_holders; j++)
      if (p->part.shared[k].holders[j] == s) tied[nt++] = p->part.shared[k].param;
  size_t(*r)[2] = malloc(sizeof *r * (size_t)(2 * L.n_shadow + nt + 2));
  size_t(*live)[2] = malloc(sizeof *live * (size_t)(2 * L.n_shadow + nt + 2));
  if (r && live) {
    int nf = pw_dp_full_ranges(&p->model, &L, tied, nt, r);
    const size_t(*f)[2] = (const size_t(*)[2])r;
    z->full = pw_ranges_floats(f, nf);
    if (zero == 3) { /* each layer's gather: its bytes, and one latency per frame-carrying gather */
      pw_z3_units u;
      if (pw_z3_units_build(&p->model, &L, &u)) {
        pw_z3_units_free(&u);
        free(r), free(live);
        pw_prog_layout_free(&L);
        return PW_ENOMEM;
      }
      size_t lo, hi;
      pw_shard_range(L.sz.numel, p->dp, 0, &lo, &hi);
      z->z3_shard = pw_z3_param_floats(L.sz.numel, p->dp, 0);
      z->z3_unit = u.max_floats;
      z->z3_pass = pw_z3_pass_bytes(&u, L.sz.numel, p->dp, 0);
      z->z3_last = (uint64_t)pw_z3_unit_part(&u, u.n_units - 1, lo, hi) * (uint64_t)(p->dp - 1) * sizeof(float);
      for (int k = 0; k < u.n_units; k++)
        if (u.floats[k])
          z->z3_sec += p->latency + pw_plan_wire_seconds(p, (double)u.floats[k] * (p->dp - 1) / p->dp * sizeof(float));
      pw_z3_units_free(&u);
    }
    if (zero >= 2) {
      z->live = pw_ranges_floats((const size_t(*)[2])live, pw_dp_live_ranges(L.sz.train_numel, p->dp, 0, f, nf, live));
      z->wbufs = pw_dp_wgrad_bufs_floats(pw_dp_wgrad_floats(&p->model, &L, f, nf), L.sz.train_numel, p->dp);
      z->wsent = pw_dp_wgrad_bytes(&p->model, &L, f, nf, p->dp, 0);
      for (int i = 0; i < L.node_hi - L.node_lo; i++) z->flushes += pw_dp_wgrad_parts(&p->model, &L, i, f, nf) != 0;
    }
  }
  free(r), free(live);
  pw_prog_layout_free(&L);
  return r && live ? 0 : PW_ENOMEM;
}

/* train.precision "bf16" (common/compute/prog.h): a stage keeps a bf16 copy
 * of its linear weights and scratch for one linear or attention node's
 * bf16 operands (*fixed), and per slot a bf16 send buffer of its float outputs
 * (*per_slot). */
static void bf16_bytes(const pw_model *m, const pw_stage *st, int mb, size_t *fixed, size_t *per_slot) {
  size_t wb = 0, sc = 0;
  *per_slot = st->out_bytes * (size_t)mb / 2;
  for (int i = m->layers[st->layer_lo].node_lo; i < m->layers[st->layer_hi - 1].node_hi; i++) {
    const pw_node *n = &m->nodes[i]; /* the op table's counts, as the program's (prog.c) */
    size_t ops = pw_op_bf16_scratch(n, &m->values[n->in[0]], mb);
    wb += pw_op_bf16_weight(n);
    if (ops > sc) sc = ops;
  }
  *fixed = (wb + sc) * 2;
}

/* Of a pass's gathers taking `sec` seconds behind its layers computing in
 * `compute` seconds (each layer's gather is sent while the layer before it
 * computes: the action's, or the last one of the action before it), what
 * is left over. */
static double z3_exposed(double sec, double compute) { return sec > compute ? sec - compute : 0; }

/* train.zero > 0 at dp > 1 in training: each stage's zero_sizes into
 * *out ([S], NULL otherwise); zero 2's reduce-scatter of one microbatch's
 * weight gradients runs inside the W (or B) that makes them, blocking, one
 * exchange per flush (worker/gradrs.c): it goes into those actions' costs. */
static int plan_zero(const pw_job *job, pw_plan *p, zero_sizes **out, pw_err *err) {
  int zero = p->sched->forward_only || p->dp < 2 ? 0 : job->train.zero;
  *out = NULL;
  if (!zero) return 0;
  zero_sizes *z = *out = calloc((size_t)p->S, sizeof *z);
  for (int s = 0; s < p->S; s++) {
    if (!z || zero_sizes_of(p, s, zero, &z[s])) return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
    double sec = z[s].flushes * p->latency + pw_plan_wire_seconds(p, (double)z[s].wsent);
    p->cost_w[s] += sec;
    p->cost_b[s] += sec;
    if (zero == 3) { /* the gathers, each behind the layer before it: what the compute does not hide */
      double f = z3_exposed(z[s].z3_sec, p->cost_f[s]);
      double b = z3_exposed(z[s].z3_sec, p->cost_i[s] - (p->n_work[s] ? p->cost_f[s] : 0));
      p->cost_f[s] += f;
      p->cost_i[s] += b + (p->n_work[s] ? f : 0); /* remat: the recompute gathers too */
      p->cost_b[s] += b + (p->n_work[s] ? f : 0);
    }
  }
  return 0;
}

/* Stage layouts, peak slots and each rank's sum (pw_plan_mem); zs: plan_zero's. */
static int plan_memory(const pw_job *job, pw_plan *p, const zero_sizes *zs, pw_err *err) {
  p->stage_mem = calloc((size_t)p->S, sizeof *p->stage_mem);
  p->peak_slots = calloc((size_t)p->S, sizeof(int));
  p->mem = calloc((size_t)p->pp, sizeof *p->mem);
  if (!p->stage_mem || !p->peak_slots || !p->mem || pw_plan_peak_slots(p->sched, p->peak_slots))
    return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  pw_plan_work(p->sched, p->n_work, p->n_work); /* in: 1 = remat (pw_plan_build) */
  int train = !p->sched->forward_only;
  if (train && job->train.eval_every > 0 && eval_peak_slots(p->sched, p->peak_slots))
    return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  size_t *ring = calloc((size_t)p->pp, sizeof *ring);
  if (!ring) return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  for (int s = 0; s < p->S; s++) {
    const pw_stage *st = &p->part.stages[s];
    const pw_prog_sizes *sm = &p->stage_mem[s];
    if (pw_prog_sizes_of(&p->model, st->layer_lo, st->layer_hi, p->mb_size, &p->stage_mem[s])) {
      free(ring);
      return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
    }
    pw_plan_mem *r = &p->mem[p->sched->stage_to_rank[s]];
    pw_plan_tp_rank(p, s, &p->stage_mem[s], r);
    int zero = zs ? job->train.zero : 0;
    zero_sizes z = zs ? zs[s] : (zero_sizes){0};
    r->params += (zero == 3 ? z.z3_shard : sm->numel) * sizeof(float);
    if (zero == 3 && z.z3_unit > ring[p->sched->stage_to_rank[s]]) ring[p->sched->stage_to_rank[s]] = z.z3_unit;
    r->grads += (zero >= 2 ? z.live : sm->grad_numel) * sizeof(float);
    r->adam += pw_dp_state_floats(sm->train_numel, p->dp, zero) * sizeof(float);
    size_t full = (size_t)p->peak_slots[s] * sm->slot_floats * sizeof(float);
    if (p->n_work[s]) {
      size_t keep = (size_t)p->peak_slots[s] * sm->keep_floats * sizeof(float);
      size_t work = (size_t)p->n_work[s] * (sm->slot_floats - sm->keep_floats) * sizeof(float);
      r->slots += keep;
      r->work += work;
      if (full > keep + work) r->remat_saved += full - keep - work;
    } else {
      r->slots += full;
    }
    r->n_slots += p->peak_slots[s];
    r->scratch += sm->scratch_floats * sizeof(float);
    if (job->train.precision == PW_PRECISION_BF16) {
      size_t fixed, per_slot;
      bf16_bytes(&p->model, st, p->mb_size, &fixed, &per_slot);
      r->scratch += fixed;
      r->slots += (size_t)p->peak_slots[s] * per_slot;
    }
    if (sm->draws_data) r->data = data_bytes(job, &p->model); /* once per rank */
    if (train) {
      r->dp += (pw_dp_floats(sm->grad_numel, sm->train_numel, z.full, p->dp, zero, PW_COLL_CHUNK) + z.wbufs) *
               sizeof(float);
      uint64_t sent = pw_dp_step_bytes(sm->grad_numel, sm->train_numel, z.full, p->dp, zero, 0);
      r->dp_seconds += pw_chunk_count((size_t)sent / sizeof(float), PW_COLL_CHUNK) * p->latency +
                       pw_plan_wire_seconds(p, (double)sent);
      r->dp_sent += sent + (uint64_t)p->m * z.wsent; /* zero 2: every microbatch's, priced in its W (plan_zero) */
      /* zero 3: each microbatch's F and I (or B) gather every layer, a remat recompute all but the last again */
      if (zero == 3) r->dp_sent += (uint64_t)p->m * (2 * z.z3_pass + (p->n_work[s] ? z.z3_pass - z.z3_last : 0));
      /* replica 0 holds the whole v at a checkpoint (m where the gradients are), zero 2 m too, zero 3 the
       * parameters too */
      if (zero) r->ckpt_gather += (zero >= 2 ? 2 : 1) * sm->train_numel * sizeof(float);
      if (zero == 3) r->ckpt_gather += sm->numel * sizeof(float);
    }
  }
  for (int k = 0; k < p->pp; k++) /* zero 3: a rank's gather ring, sized for its largest layer */
    p->mem[k].params += PW_Z3_RING * ring[k] * sizeof(float);
  free(ring);
  /* a rank holding a copy of a shared parameter keeps its block */
  for (int i = 0; i < p->part.n_shared && train; i++) {
    const pw_shared_param *sp = &p->part.shared[i];
    size_t bytes = pw_tied_floats(&p->model, sp) * sizeof(float);
    for (int r = 0; r < p->pp; r++) {
      int here = 0;
      for (int h = 0; h < sp->n_holders; h++) here |= p->sched->stage_to_rank[sp->holders[h]] == r;
      if (here) p->mem[r].tied += bytes;
    }
  }
  pw_plan_snap(job, p);
  for (int r = 0; r < p->pp; r++) {
    pw_plan_mem *m = &p->mem[r];
    m->total =
        m->params + m->grads + m->adam + m->slots + m->work + m->scratch + m->dp + m->tied + m->data + m->snapshots +
        m->ckpt_gather;
  }
  return 0;
}

/* ---- the plan -------------------------------------------------------------- */

/* The job's own schedule: one of the nine, or its custom lists, whose
 * stages must be the mesh's pp x virtual_stages. */
static int build_schedule(const pw_job *job, pw_sched **out, pw_err *err) {
  const pw_schedule_spec *sc = &job->schedule;
  int fwd = job->mode == PW_MODE_FORWARD, pp = job->mesh.pp, V = job->mesh.virtual_stages;
  if (!sc->custom_ranks) return pw_sched_build(sc->name, pp, V, sc->microbatches, fwd, out, err);
  if (sc->n_custom_ranks != pp)
    return pw_err_set(err, PW_ESPEC, "schedule.custom.ranks", "%d lists for mesh.pp = %d", sc->n_custom_ranks, pp);
  int rc = pw_sched_from_ranks((const char *const *)sc->custom_ranks, pp, sc->microbatches, fwd, out, err);
  if (rc) return rc;
  if ((*out)->V != V) {
    rc = pw_err_set(err, PW_ESPEC, "mesh.virtual_stages",
                    "the custom lists hold %d stages over %d ranks, so virtual_stages must be %d (got %d)", (*out)->S,
                    pp, (*out)->V, V);
    pw_sched_free(*out);
    *out = NULL;
  }
  return rc;
}

/* The simulated step ends with each rank's data-parallel exchange, at its
 * link-model cost (plan_memory's dp_seconds). */
static int plan_dp_action(pw_plan *p, pw_err *err) {
  double *sec = malloc(sizeof *sec * (size_t)p->pp);
  if (!sec) return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  for (int r = 0; r < p->pp; r++) sec[r] = p->mem[r].dp_seconds;
  int rc = pw_sim_add_dp(p->sim, sec, err);
  free(sec);
  return rc;
}

pw_sim_costs pw_plan_costs(const pw_plan *p) {
  return (pw_sim_costs){.f = p->cost_f, .b = p->cost_b, .i = p->cost_i, .w = p->cost_w,
                        .act_bytes = p->S > 1 ? p->act_bytes : NULL, .act_scale = p->act_scale,
                        .latency = p->latency, .bandwidth = p->bandwidth};
}

int pw_plan_build(const pw_job *job, const char *schedule, pw_plan *p, pw_err *err) {
  return pw_plan_build_costed(job, schedule, NULL, p, err);
}

int pw_plan_build_costed(const pw_job *job, const char *schedule, const pw_cost_model *cm, pw_plan *p, pw_err *err) {
  memset(p, 0, sizeof *p);
  zero_sizes *zs = NULL;
  const pw_cost_profile *prof = cm ? cm->profile : NULL;
  p->calibrated = prof != NULL;
  p->latency = prof ? pw_cost_transfer_latency(prof, cm->cores ? job->mesh.pp * job->mesh.dp : 1)
                    : PW_PLAN_LINK_LATENCY;
  p->bandwidth = prof ? prof->bandwidth : PW_PLAN_LINK_BW;
  const char *name = schedule ? schedule : job->schedule.name;
  p->pp = job->mesh.pp;
  p->dp = job->mesh.dp;
  p->V = job->mesh.virtual_stages;
  p->m = job->schedule.microbatches;
  p->act_scale = job->train.precision == PW_PRECISION_BF16 ? 0.5 : 1.0;
  int rc = p->mb_size = pw_job_mb_size(job, err);
  if (rc < 0) return rc;
  rc = pw_model_build(&job->model, &p->model, err);
  if (rc) return rc;
  pw_model_set_attention(&p->model, job->train.attention);
  rc = pw_model_set_trainable(&p->model, &job->train, err);
  if (rc) goto fail;
  if (job->model.tmpl == PW_TEMPLATE_REGIONS) {
    if (schedule) {
      rc = pw_err_set(err, PW_ESPEC, "schedule.name", "a regions model runs each region's own schedule "
                      "(model.regions[i].schedule): not %s", schedule);
      goto fail;
    }
    if (!(p->regions = calloc((size_t)job->model.n_regions, sizeof *p->regions))) {
      rc = pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
      goto fail;
    }
    rc = pw_regions_plan(job, &p->model, &p->part, &p->joint, p->regions, err);
    if (!rc && job->schedule.regions_serial) rc = pw_regions_serial(job, p->joint, p->regions, &p->sched, err);
    if (rc) goto fail;
    if (!p->sched) p->sched = p->joint;
    p->S = p->sched->S;
  } else {
    rc = schedule ? pw_sched_build(name, p->pp, p->V, p->m, job->mode == PW_MODE_FORWARD, &p->sched, err)
                  : build_schedule(job, &p->sched, err);
    if (rc) goto fail;
    rc = pw_sched_place_mesh(p->sched, &job->mesh, err); /* mesh.placement, a name resolved there */
    if (rc) goto fail;
    p->S = p->sched->S;
    rc = pw_partition_build(&p->model, &job->partition, p->S, &p->part, err);
    if (rc) goto fail;
  }
  int S = p->S;
  p->cost_f = calloc((size_t)S, sizeof(double));
  p->cost_i = calloc((size_t)S, sizeof(double));
  p->cost_w = calloc((size_t)S, sizeof(double));
  p->cost_b = calloc((size_t)S, sizeof(double));
  p->act_bytes = calloc((size_t)(S > 1 ? S - 1 : 1), sizeof(double));
  p->n_work = calloc((size_t)S, sizeof(int));
  if (!p->cost_f || !p->cost_i || !p->cost_w || !p->cost_b || !p->act_bytes || !p->n_work) {
    rc = pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
    goto fail;
  }
  /* a list longer or shorter than the stages (a schedule override changed V) */
  if (job->partition.n_remat && job->partition.n_remat != S) {
    rc = pw_err_set(err, PW_ESPEC, "partition.remat", "lists %d stages, but %s runs %d", job->partition.n_remat,
                    p->sched->name, S);
    goto fail;
  }
  for (int s = 0; s < S; s++) p->n_work[s] = pw_partition_remat(&job->partition, s);
  /* Measured layer times replace FLOPs: split them F:I:W in the FLOP ratio. */
  for (int s = 0; s < S; s++) {
    const pw_stage *st = &p->part.stages[s];
    double fl = st->flops_f + st->flops_i + st->flops_w;
    double scale = job->partition.layer_times && fl > 0 ? st->cost / fl : 1.0 / PW_PLAN_FLOPS_PER_S;
    if (job->partition.layer_times && fl > 0) scale /= p->mb_size; /* layer_times are per microbatch */
    p->cost_f[s] = st->flops_f * p->mb_size * scale;
    p->cost_i[s] = st->flops_i * p->mb_size * scale;
    p->cost_w[s] = st->flops_w * p->mb_size * scale;
  }
  if (prof && (rc = pw_cost_stages(prof, &p->model, &p->part, p->mb_size, p->cost_f, p->cost_i, p->cost_w, err)))
    goto fail;
  for (int s = 0; s < S; s++) {
    if (p->n_work[s]) p->cost_i[s] += p->cost_f[s]; /* remat: the forward again, before B or I */
    p->cost_b[s] = p->cost_i[s] + p->cost_w[s];
  }
  if ((rc = pw_plan_tp(job, p, err)) || (rc = plan_zero(job, p, &zs, err))) goto fail;
  for (int e = 0; e < p->part.n_edges; e++) {
    const pw_stage_edge *ed = &p->part.edges[e];
    /* a stage graph's edges all count: each from the upstream stage */
    if (ed->dst == ed->src + 1 || p->sched->pred) p->act_bytes[ed->src] += (double)ed->bytes * p->mb_size;
  }
  pw_sim_costs c = pw_plan_costs(p);
  rc = pw_sim_run(p->sched, &c, &p->sim, err);
  if (rc == PW_EDEADLOCK && p->regions) { /* say which choice to change */
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    rc = pw_err_set(err, PW_ESPEC, "model.regions", "the regions' schedules do not fit together where they meet "
                    "(a one-stage last region under 1f1b fits any): %s", msg);
  }
  if (rc) goto fail;
  rc = plan_memory(job, p, zs, err);
  if (rc) goto fail;
  if (p->dp > 1 && !p->sched->forward_only && (rc = plan_dp_action(p, err))) goto fail;
  rc = pw_plan_predict(p, &c, cm, err);
  if (rc) goto fail;
  free(zs);
  return 0;
fail:
  free(zs);
  pw_plan_free(p);
  return rc;
}

void pw_plan_free(pw_plan *p) {
  pw_sim_result_free(p->sim);
  if (p->joint != p->sched) pw_sched_free(p->joint);
  pw_sched_free(p->sched);
  pw_partition_free(&p->part);
  pw_model_free(&p->model);
  free(p->cost_f);
  free(p->cost_i);
  free(p->cost_w);
  free(p->cost_b);
  free(p->act_bytes);
  free(p->stage_mem);
  free(p->peak_slots);
  free(p->n_work);
  free(p->mem);
  free(p->tp_kinds);
  free(p->regions);
  memset(p, 0, sizeof *p);
}

int pw_plan_rank_stages(const pw_plan *p, int r, int *stages, int cap) {
  int n = 0;
  for (int s = 0; s < p->S; s++)
    if (p->sched->stage_to_rank[s] == r) {
      if (n < cap) stages[n] = s;
      n++;
    }
  return n;
}

json_t *pw_plan_json(const pw_job *job, const pw_plan *p) {
  json_t *s2r = json_array();
  for (int s = 0; s < p->S; s++) json_array_append_new(s2r, json_integer(p->sched->stage_to_rank[s]));
  json_t *part = pw_partition_json(&p->model, &p->part, p->mb_size);
  /* annotate each stage with its rank */
  json_t *stages = json_object_get(part, "stages");
  for (size_t i = 0; i < json_array_size(stages); i++) {
    json_t *st = json_array_get(stages, i);
    json_object_set_new(st, "rank", json_integer(p->sched->stage_to_rank[i]));
    const pw_prog_sizes *sm = &p->stage_mem[i];
    size_t slot = p->n_work[i] ? sm->keep_floats : sm->slot_floats;
    json_object_set_new(st, "slot_bytes", json_integer((json_int_t)(slot * sizeof(float))));
    json_object_set_new(st, "peak_slots", json_integer(p->peak_slots[i]));
    json_object_set_new(st, "remat", json_boolean(p->n_work[i] > 0));
    if (p->n_work[i]) {
      json_object_set_new(st, "work_bytes",
                          json_integer((json_int_t)((sm->slot_floats - sm->keep_floats) * sizeof(float))));
      json_object_set_new(st, "n_work", json_integer(p->n_work[i]));
    }
  }
  json_t *analytics = pw_sim_result_json(p->sim);
  json_t *ranks = json_object_get(analytics, "ranks");
  for (int r = 0; r < p->pp && r < (int)json_array_size(ranks); r++) {
    const pw_plan_mem *m = &p->mem[r];
    json_t *o = json_array_get(ranks, (size_t)r);
    json_object_set_new(o, "memory_bytes", json_integer((json_int_t)m->total));
    json_object_set_new(o, "memory",
                        json_pack("{s:I, s:I, s:I, s:I, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "params",
                                  (json_int_t)m->params, "grads", (json_int_t)m->grads, "adam", (json_int_t)m->adam,
                                  "slots", (json_int_t)m->slots, "n_slots", m->n_slots, "work", (json_int_t)m->work,
                                  "remat_saved", (json_int_t)m->remat_saved, "scratch",
                                  (json_int_t)m->scratch, "dp", (json_int_t)m->dp, "tied", (json_int_t)m->tied, "data",
                                  (json_int_t)m->data, "snapshots", (json_int_t)m->snapshots));
    json_object_set_new(o, "dp_bytes_per_step", json_integer((json_int_t)m->dp_sent));
    json_object_set_new(o, "dp_seconds_per_step", json_real(m->dp_seconds));
    json_object_set_new(o, "snapshot_bytes_per_step",
                        json_real(p->snapshot_every ? (double)m->snap_sent / p->snapshot_every : 0));
    json_object_set_new(o, "snapshot_seconds_per_step", json_real(m->snap_seconds));
    json_object_set_new(o, "snapshot_share", json_real(pw_plan_snap_share(p, r)));
    if (p->tp > 1) {
      json_object_set_new(o, "tp_bytes_per_step", json_integer((json_int_t)m->tp_sent));
      json_object_set_new(o, "tp_seconds_per_step", json_real(m->tp_seconds));
    }
    if (m->ckpt_gather)
      json_object_set_new(json_object_get(o, "memory"), "ckpt_gather", json_integer((json_int_t)m->ckpt_gather));
  }
  json_t *costs = json_array();
  for (int s = 0; s < p->S; s++)
    json_array_append_new(costs, json_pack("{s:i, s:f, s:f, s:f, s:f}", "stage", s, "f", p->cost_f[s], "b",
                                           p->cost_b[s], "i", p->cost_i[s], "w", p->cost_w[s]));
  int len = pw_sched_grid(p->sched, p->sim, NULL, 0);
  char *grid = len >= 0 ? malloc((size_t)len + 1) : NULL;
  if (grid) pw_sched_grid(p->sched, p->sim, grid, (size_t)len + 1);
  json_t *out = json_pack(
      "{s:s, s:s, s:{s:i, s:i, s:i}, s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:s}", "job", job->name, "schedule",
      p->sched->name, "mesh", "pp", p->pp, "dp", p->dp, "virtual_stages", p->V, "stages", p->S, "microbatches", p->m,
      "microbatch_size", p->mb_size, "partition", part, "stage_to_rank", s2r, "costs", costs, "plan",
      pw_sched_to_json(p->sched), "analytics", analytics, "grid", grid ? grid : "");
  free(grid);
  if (out && p->tp > 1) json_object_set_new(json_object_get(out, "mesh"), "tp", json_integer(p->tp));
  if (out && !p->sched->forward_only) json_object_set_new(out, "snapshots", pw_plan_snap_json(p));
  if (out && p->regions) {
    pw_sim_costs c = pw_plan_costs(p);
    pw_err err = {0};
    json_t *cmp = pw_regions_compare_json(job, p->joint, p->regions, &c, 0, NULL, NULL, &err);
    json_object_set_new(out, "regions", cmp ? cmp : json_pack("{s:s}", "error", err.msg));
  }
  return out;
}

int pw_plan_virtual_stages(const pw_job *job, const char *schedule) {
  const pw_sched_info *info = pw_sched_info_find(schedule);
  int V = job->mesh.virtual_stages;
  if (!info) return V;
  if (info->min_v == info->max_v) return info->min_v;
  return info->max_v == 1 ? 1 : (V > 2 ? V : 2);
}

/* One row of the comparison: schedule `name` (NULL: the job's custom lists). */
static json_t *compare_row(const pw_job *job, const char *name) {
  pw_job j = *job; /* shallow: only mesh.virtual_stages changes */
  if (name) j.mesh.virtual_stages = pw_plan_virtual_stages(job, name);
  const char *label = name ? name : job->model.tmpl == PW_TEMPLATE_REGIONS ? "regions" : "custom";
  pw_plan p;
  pw_err err = {0};
  if (pw_plan_build(&j, name, &p, &err)) {
    char buf[600];
    return json_pack("{s:s, s:b, s:i, s:s}", "schedule", label, "ok", 0, "virtual_stages", j.mesh.virtual_stages,
                     "error", pw_err_str(&err, buf, sizeof buf));
  }
  int peak = 0, pend = 0, acts = 0;
  size_t mem = 0;
  for (int r = 0; r < p.pp; r++) {
    if (p.mem[r].total > mem) mem = p.mem[r].total;
    if (p.sim->peak_act[r] > peak) peak = p.sim->peak_act[r];
    if (p.sim->peak_pending_w[r] > pend) pend = p.sim->peak_pending_w[r];
    acts += p.sched->n_actions[r];
  }
  json_t *row = json_pack("{s:s, s:b, s:i, s:i, s:f, s:f, s:i, s:i, s:I, s:i}", "schedule", label, "ok", 1,
                          "virtual_stages", p.V, "stages", p.S, "makespan", p.sim->makespan, "bubble_ratio",
                          p.sim->bubble_ratio, "peak_activations", peak, "peak_pending_w", pend, "peak_memory_bytes",
                          (json_int_t)mem, "actions", acts);
  pw_plan_free(&p);
  return row;
}

json_t *pw_plan_compare_json(const pw_job *job) {
  json_t *rows = json_array();
  int n = 0;
  const pw_sched_info *infos = pw_sched_infos(&n);
  if (job->model.tmpl == PW_TEMPLATE_REGIONS) { /* its regions' own schedules, one row */
    json_array_append_new(rows, compare_row(job, NULL));
    return json_pack("{s:s, s:o}", "job", job->name, "rows", rows);
  }
  for (int i = 0; i < n; i++) json_array_append_new(rows, compare_row(job, infos[i].name));
  if (job->schedule.custom_ranks) json_array_append_new(rows, compare_row(job, NULL));
  return json_pack("{s:s, s:o}", "job", job->name, "rows", rows);
}
