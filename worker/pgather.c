/* pgather: ZeRO-3's per-layer gathers of parameters (pgather.h). Moves
 * bytes only: no arithmetic happens on a parameter here. */
#include "pgather.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "collective.h"
#include "dpx.h"

static int peer(const pw_pgather *g, int d) { return pw_rctx_rank_of(g->cx, d, g->cx->prank); }

/* ---- buffers ---------------------------------------------------------------- */

/* Stage li's arena: numel floats of address space, our shard's pages
 * read-write (touched when the parameters are drawn or loaded). */
static int arena_map(pw_pgather_stage *s) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = (s->numel ? s->numel : 1) * sizeof(float);
  s->arena_bytes = (bytes + page - 1) / page * page;
  void *a = mmap(NULL, s->arena_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (a == MAP_FAILED) return PW_ENOMEM;
  s->arena = a;
  if (s->hi > s->lo) {
    size_t lo = s->lo * sizeof(float) / page * page, hi = (s->hi * sizeof(float) + page - 1) / page * page;
    if (mprotect((char *)a + lo, hi - lo, PROT_READ | PROT_WRITE)) return PW_ENOMEM;
  }
  return 0;
}

static int stage_init(pw_pgather *g, int li) {
  const pw_rctx *c = g->cx;
  pw_pgather_stage *s = &g->st[li];
  pw_prog *p = c->ls[li].prog;
  const pw_prog_layout *L = pw_prog_layout_of(p);
  s->g = g, s->li = li, s->numel = L->sz.numel;
  if (L->sz.train_numel != L->sz.numel) return PW_ENOTSUP; /* frozen parameters: refused by the spec already */
  if (pw_z3_units_build(c->model, L, &s->z)) return PW_ENOMEM;
  if (s->z.max_floats >= (size_t)1 << 28) return PW_ENOTSUP; /* a piece's offset goes in the value's 28 bits */
  if (s->z.n_units >= 1 << 20) return PW_ENOTSUP;            /* the unit goes in the microbatch's 20 high bits */
  pw_shard_range(s->numel, c->dp, c->replica, &s->lo, &s->hi);
  if (arena_map(s)) return PW_ENOMEM;
  s->want = calloc((size_t)s->z.n_units + 1, sizeof(size_t));
  pw_z3_piece *pc = malloc(sizeof *pc * (size_t)pw_z3_max_runs(&s->z));
  s->pc = pc;
  if (!s->want || !pc) return PW_ENOMEM;
  for (int u = 0; u < s->z.n_units; u++)
    for (int d = 0; d < c->dp && s->z.floats[u]; d++) {
      size_t lo, hi;
      pw_shard_range(s->numel, c->dp, d, &lo, &hi);
      int n = pw_z3_pieces(&s->z, u, lo, hi, pc);
      if (d != c->replica) s->want[u] += (size_t)(n ? n : 1);
    }
  if (s->z.max_floats > g->buf_floats) g->buf_floats = s->z.max_floats;
  return pw_prog_set_pgather(p, s->arena, s->lo, s->hi, pw_pgather_unit, s);
}

int pw_pgather_init(pw_pgather *g, const pw_rctx *cx, struct pw_dpx *dp) {
  if (!g) return PW_ENOMEM;
  g->cx = cx, g->dp = dp;
  g->pre_li = g->bound_li = g->after_li = -1;
  atomic_init(&g->pending, 0);
  for (int k = 0; k < PW_Z3_RING; k++) g->slot[k].call = UINT32_MAX;
  if (!(g->st = calloc((size_t)cx->n_ls, sizeof *g->st))) return PW_ENOMEM;
  for (int li = 0; li < cx->n_ls; li++) {
    int rc = stage_init(g, li);
    if (rc) return rc;
  }
  for (int k = 0; k < PW_Z3_RING; k++) /* touched now, as every arena is (the planner counts them) */
    if (!(g->buf[k] = pw_alloc_floats(g->buf_floats ? g->buf_floats : 1))) return PW_ENOMEM;
  return 0;
}

void pw_pgather_close(pw_pgather *g) {
  if (!g || !g->cx) return;
  for (int li = 0; g->st && li < g->cx->n_ls; li++) {
    pw_pgather_stage *s = &g->st[li];
    if (s->arena) munmap(s->arena, s->arena_bytes);
    pw_z3_units_free(&s->z);
    free(s->want), free(s->pc);
  }
  for (int k = 0; k < PW_Z3_RING; k++) free(g->buf[k]);
  free(g->st);
  g->st = NULL;
}

/* ---- where the parameters point ---------------------------------------------- */

/* Unit u of stage li's parameters into buffer b (NULL: back into the
 * arena). */
static void point(pw_pgather *g, int li, int u, const float *b) {
  pw_pgather_stage *s = &g->st[li];
  pw_prog *p = g->cx->ls[li].prog;
  const pw_prog_layout *L = pw_prog_layout_of(p);
  for (int j = s->z.par_lo[u]; j < s->z.par_lo[u + 1]; j++) {
    size_t off = L->param_off[s->z.par[j]];
    float *to = s->arena + off;
    for (int r = s->z.run_lo[u]; b && r < s->z.run_lo[u + 1]; r++)
      if (off >= s->z.runs[r].lo && off < s->z.runs[r].hi) to = (float *)b + s->z.runs[r].at + (off - s->z.runs[r].lo);
    pw_prog_param_at(p, s->z.par[j])->data = to;
  }
}

static void unbind(pw_pgather *g) {
  if (g->bound_li >= 0) point(g, g->bound_li, g->bound_unit, NULL);
  g->bound_li = -1;
}

void pw_pgather_lend(pw_pgather *g, int li, float *whole) {
  pw_prog *p = g->cx->ls[li].prog;
  const pw_prog_layout *L = pw_prog_layout_of(p);
  for (int i = 0; i < L->n_params; i++)
    pw_prog_param_at(p, i)->data = (whole ? whole : g->st[li].arena) + L->param_off[i];
}

/* ---- a gather ----------------------------------------------------------------- */

static int send_piece(pw_pgather *g, pw_pgather_stage *s, int d, uint32_t k, int u, size_t off, const float *src,
                      size_t n, pw_err *err) {
  const pw_rctx *c = g->cx;
  pw_frame_hdr h;
  int rc = pw_frame_hdr_init_vec(&h, PW_FRAME_DP, c->job, k, (uint32_t)c->replica | (uint32_t)u << 12,
                                 (uint32_t)c->ls[s->li].stage, (uint32_t)PW_PGATHER_PIECE | (uint32_t)off << 4,
                                 PW_DTYPE_F32, n);
  if (rc)
    return pw_err_set(err, rc, "ZeRO-3", "no frame header for a %zu-float parameter piece of stage %d: %s", n,
                      c->ls[s->li].stage, pw_strerror(rc));
  g->dp->bytes += n * sizeof(float);
  return c->send(c->run, peer(g, d), &h, src, &g->pending);
}

/* Gather k = issued of unit u: our pieces into its buffer and to every
 * other replica (an empty frame where we have none). */
static int issue(pw_pgather *g, pw_pgather_stage *s, int u, pw_z3_piece *pc, pw_err *err) {
  const pw_rctx *c = g->cx;
  uint32_t k = g->issued++;
  pw_pgather_slot *sl = &g->slot[k % PW_Z3_RING];
  if (sl->call != k) {
    sl->call = k, sl->got = 0, sl->li = s->li, sl->unit = u;
  } else if (sl->li != s->li || sl->unit != u) {
    return pw_err_set(err, PW_EPROTO, "ZeRO-3", "gather %u: a replica sent layer %d of stage %d, we gather layer %d of stage %d",
                      k, g->st[sl->li].z.layer_lo + sl->unit, c->ls[sl->li].stage, s->z.layer_lo + u, c->ls[s->li].stage);
  }
  float *b = g->buf[k % PW_Z3_RING];
  int n = pw_z3_pieces(&s->z, u, s->lo, s->hi, pc);
  for (int i = 0; i < n; i++) memcpy(b + pc[i][0], s->arena + pc[i][1], pc[i][2] * sizeof(float));
  for (int d = 0, rc; d < c->dp; d++) {
    if (d == c->replica) continue;
    for (int i = 0; i < n; i++)
      if ((rc = send_piece(g, s, d, k, u, pc[i][0], s->arena + pc[i][1], pc[i][2], err))) return rc;
    if (!n && (rc = send_piece(g, s, d, k, u, 0, b, 0, err))) return rc;
  }
  return 0;
}

typedef struct {
  const pw_pgather *g;
  uint32_t k;
  size_t want;
} gather_ref;

static int gathered(void *arg) {
  const gather_ref *r = arg;
  const pw_pgather_slot *sl = &r->g->slot[r->k % PW_Z3_RING];
  return sl->call == r->k && sl->got == r->want;
}

static int sent(void *arg) {
  pw_pgather *g = arg;
  return atomic_load(&g->pending) == 0;
}

static int unit(pw_pgather_stage *s, int layer, int next, pw_err *err) {
  pw_pgather *g = s->g;
  const pw_rctx *c = g->cx;
  if (layer < 0) {
    unbind(g);
    return 0;
  }
  int u = layer - s->z.layer_lo, nu = next < 0 ? -1 : next - s->z.layer_lo, rc, has;
  if (u < 0 || u >= s->z.n_units || nu >= s->z.n_units)
    return pw_err_set(err, PW_EINTERNAL, "ZeRO-3", "layer %d (next %d) is not stage %d's", layer, next,
                      c->ls[s->li].stage);
  pw_pgather_stage *ns = s; /* the stage of the prefetch: the next action's, after this one's last layer */
  if (nu < 0 && g->after_li >= 0) ns = &g->st[g->after_li], nu = g->after_unit;
  if (g->bound_li == s->li && g->bound_unit == u) return 0;
  uint32_t k = g->done; /* the next to complete: ours, issued now or as the last layer's prefetch */
  if ((has = s->z.floats[u] > 0)) { /* (a layer without parameters gathers nothing, on every replica) */
    if (g->pre_li == s->li && g->pre_unit == u)
      g->pre_li = -1;
    else if (g->pre_li >= 0)
      return pw_err_set(err, PW_EINTERNAL, "ZeRO-3", "layer %d of stage %d asked for while layer %d was prefetched",
                        layer, c->ls[s->li].stage, g->st[g->pre_li].z.layer_lo + g->pre_unit);
    else if ((rc = issue(g, s, u, s->pc, err)))
      return rc;
  }
  unbind(g);
  if (has) {
    gather_ref want = {g, k, s->want[u]};
    if ((rc = c->wait(c->run, gathered, &want))) return rc;
    g->done = k + 1, g->gathers++;
  }
  /* the prefetch, issued once ours is complete (so no replica is more
   * than one gather ahead of what we issued: pgather.h): its frames
   * travel while this layer computes */
  if (nu >= 0 && ns->z.floats[nu] && g->pre_li < 0) {
    if ((rc = issue(g, ns, nu, ns->pc, err))) return rc;
    g->pre_li = ns->li, g->pre_unit = nu;
  }
  if (!has) return 0;
  point(g, s->li, u, g->buf[k % PW_Z3_RING]);
  g->bound_li = s->li, g->bound_unit = u;
  return 0;
}

int pw_pgather_unit(void *ctx, int layer, int next, pw_err *err) {
  pw_pgather_stage *s = ctx;
  double t0 = pw_now();
  pw_err e = {0};
  int rc = unit(s, layer, next, &e);
  if (rc && !e.code) /* a send or the wait: what failed there is recorded already (pw_exec_fail) */
    pw_err_set(&e, rc, "ZeRO-3", "gathering layer %d of stage %d: %s", layer, s->g->cx->ls[s->li].stage,
               pw_strerror(rc));
  if (rc && err) *err = e;
  s->g->dp->seconds += pw_now() - t0;
  return rc;
}

/* The first unit with parameters a program asks for in a forward (dir 1)
 * or a backward (-1), or -1. */
static int first_unit(const pw_pgather_stage *s, int dir) {
  for (int k = 0; k < s->z.n_units; k++) {
    int u = dir > 0 ? k : s->z.n_units - 1 - k;
    if (s->z.floats[u]) return u;
  }
  return -1;
}

void pw_pgather_next_action(pw_pgather *g, const pw_action *acts, int at, int n) {
  const pw_rctx *c = g->cx;
  g->after_li = -1;
  for (int k = at + 1; k < n; k++) {
    int li = acts[k].stage < c->S ? c->lidx_of_stage[acts[k].stage] : -1;
    if (li < 0 || acts[k].kind == PW_ACT_W) continue; /* W reads no parameter */
    /* a remat I or B recomputes the forward first */
    int fwd = acts[k].kind == PW_ACT_F || pw_prog_config_of(c->ls[li].prog)->remat;
    int u = first_unit(&g->st[li], fwd ? 1 : -1);
    if (u >= 0) g->after_li = li, g->after_unit = u;
    return;
  }
}

int pw_pgather_quiesce(pw_pgather *g) { return g->cx->wait(g->cx->run, sent, g); }

/* ---- frames (compute thread, sh.mu held) ------------------------------------------ */

/* A piece of gather h->step of unit *u of stage *li from replica d: the
 * gather is one we may receive now and the piece is exactly one of d's. */
static int fits(pw_pgather *g, int from, const pw_frame_hdr *h, int *li, int *u, pw_err *err) {
  int d = (int)(h->microbatch & 0xfff);
  size_t off = h->value >> 4, n = (size_t)(h->payload_len / sizeof(float));
  uint32_t k = h->step;
  *li = -1, *u = (int)(h->microbatch >> 12);
  if (!g)
    return pw_err_set(err, PW_EPROTO, "frame", "parameter piece (gather %u) for stage %u from rank %d: not a ZeRO-3 run",
                      k, h->stage, from);
  const pw_rctx *c = g->cx;
  *li = h->stage < (uint32_t)c->S ? c->lidx_of_stage[h->stage] : -1;
  int ok = *li >= 0 && d < c->dp && d != c->replica && from == peer(g, d) && h->dtype == PW_DTYPE_F32 &&
           k - g->done < PW_Z3_RING && k <= g->issued && *u < g->st[*li].z.n_units;
  if (ok) { /* one of d's pieces of the unit, or the empty frame when it has none */
    pw_pgather_stage *s = &g->st[*li];
    size_t lo, hi;
    pw_shard_range(s->numel, c->dp, d, &lo, &hi);
    int np = s->z.floats[*u] ? pw_z3_pieces(&s->z, *u, lo, hi, s->pc) : -1, hit = np == 0 && n == 0 && off == 0;
    for (int i = 0; i < np && !hit; i++) hit = s->pc[i][0] == off && s->pc[i][2] == n;
    const pw_pgather_slot *sl = &g->slot[k % PW_Z3_RING];
    ok = hit && !(sl->call == k && (sl->li != *li || sl->unit != *u || sl->got >= s->want[*u]));
  }
  if (!ok)
    return pw_err_set(err, PW_EPROTO, "frame",
                      "parameter piece (gather %u, layer %d, offset %zu, %zu floats) for stage %u from rank %d does "
                      "not fit (at gather %u of %u issued)",
                      k, *u, off, n, h->stage, from, g->done, g->issued);
  return 0;
}

int pw_pgather_dest(pw_pgather *g, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  int li, u, rc = fits(g, from, h, &li, &u, err);
  *dst = rc ? NULL : g->buf[h->step % PW_Z3_RING] + (h->value >> 4);
  return rc;
}

int pw_pgather_frame(pw_pgather *g, int from, const pw_frame_hdr *h, pw_err *err) {
  int li, u, rc = fits(g, from, h, &li, &u, err);
  if (rc) return rc;
  pw_pgather_slot *sl = &g->slot[h->step % PW_Z3_RING];
  if (sl->call != h->step) sl->call = h->step, sl->got = 0, sl->li = li, sl->unit = u;
  sl->got++;
  return 0;
}
