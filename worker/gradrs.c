/* gradrs: ZeRO-2's reduce-scatter of weight gradients inside the W and B
 * actions (gradrs.h). Never sums out of replica order:
 * pw_reduce_ordered_add does the adding. */
#include "gradrs.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "collective.h"
#include "dpx.h"

static int slot_of(const pw_gradrs *g, int d) { return d - (d > g->cx->replica); }

static int peer(const pw_gradrs *g, int d) { return pw_rctx_rank_of(g->cx, d, g->cx->prank); }

/* ---- buffers ---------------------------------------------------------------- */

/* Stage li's arena: grad_numel floats of address space, the live ranges'
 * pages read-write. */
static int arena_map(pw_gradrs_stage *s, size_t grad_numel) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = (grad_numel ? grad_numel : 1) * sizeof(float);
  s->arena_bytes = (bytes + page - 1) / page * page;
  void *a = mmap(NULL, s->arena_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (a == MAP_FAILED) return PW_ENOMEM;
  s->arena = a;
  for (int k = 0; k < s->n_live; k++) {
    size_t lo = s->live[k][0] * sizeof(float) / page * page, hi = s->live[k][1] * sizeof(float);
    hi = (hi + page - 1) / page * page;
    if (mprotect((char *)a + lo, hi - lo, PROT_READ | PROT_WRITE)) return PW_ENOMEM;
  }
  return 0;
}

static int stage_alloc(pw_gradrs *g, int li) {
  const pw_rctx *c = g->cx;
  pw_gradrs_stage *s = &g->st[li];
  const pw_dpx_stage *x = &g->dp->st[li];
  pw_prog *p = c->ls[li].prog;
  const pw_prog_layout *L = pw_prog_layout_of(p);
  const size_t(*full)[2] = (const size_t(*)[2])x->full;
  size_t tn = pw_prog_train_numel(p), sc = pw_dp_wgrad_floats(c->model, L, full, x->n_full);
  s->g = g, s->li = li;
  if (!(s->live = malloc(sizeof *s->live * (size_t)(x->n_full + 1)))) return PW_ENOMEM;
  s->n_live = pw_dp_live_ranges(tn, c->dp, c->replica, full, x->n_full, s->live);
  if (arena_map(s, pw_prog_grad_numel(p))) return PW_ENOMEM;
  s->cap = pw_shard_max(tn, c->dp) < sc ? pw_shard_max(tn, c->dp) : sc;
  if (s->cap >= (size_t)1 << 28) return PW_ENOTSUP; /* a piece's offset goes in the value's 28 bits */
  s->scratch = pw_alloc_floats(sc ? sc : 1);
  for (int k = 0; k < 2; k++) s->rx[k] = pw_alloc_floats(s->cap ? (size_t)(c->dp - 1) * s->cap : 1);
  if (!s->scratch || !s->rx[0] || !s->rx[1]) return PW_ENOMEM;
  int rc = pw_prog_set_wgrad(p, s->arena, (const size_t(*)[2])s->live, s->n_live, full, x->n_full, s->scratch,
                             pw_gradrs_flush, s);
  if (!rc) pw_prog_zero_grad(p); /* maps the live pages now, as every arena is */
  return rc;
}

int pw_gradrs_init(pw_gradrs *g, const pw_rctx *cx, struct pw_dpx *dp) {
  const pw_rctx *c = cx;
  if (!g) return PW_ENOMEM;
  g->cx = cx, g->dp = dp;
  if (!(g->st = calloc((size_t)c->n_ls, sizeof *g->st))) return PW_ENOMEM;
  atomic_init(&g->pending, 0);
  g->rx_call[0] = g->rx_call[1] = UINT32_MAX;
  for (int li = 0; li < c->n_ls; li++) {
    int rc = stage_alloc(g, li);
    if (rc) return rc;
  }
  return 0;
}

void pw_gradrs_close(pw_gradrs *g) {
  if (!g || !g->cx) return;
  const pw_rctx *c = g->cx;
  for (int li = 0; g->st && li < c->n_ls; li++) {
    pw_gradrs_stage *s = &g->st[li];
    if (s->arena) munmap(s->arena, s->arena_bytes);
    free(s->live), free(s->scratch), free(s->rx[0]), free(s->rx[1]);
  }
  free(g->st);
  g->st = NULL;
}

/* ---- the flush ------------------------------------------------------------------ */

static int send_piece(pw_gradrs *g, int li, int d, size_t off, const float *src, size_t n, pw_err *err) {
  const pw_rctx *c = g->cx;
  pw_frame_hdr h;
  int rc = pw_frame_hdr_init_vec(&h, PW_FRAME_DP, c->job, g->call, (uint32_t)c->replica,
                                 (uint32_t)c->ls[li].stage, (uint32_t)PW_GRADRS_PIECE | (uint32_t)off << 4, PW_DTYPE_F32,
                                 n);
  if (rc)
    return pw_err_set(err, rc, "ZeRO-2", "no frame header for a %zu-float gradient piece of stage %d: %s", n,
                      c->ls[li].stage, pw_strerror(rc));
  g->dp->bytes += n * sizeof(float);
  return c->send(c->run, peer(g, d), &h, src, &g->pending);
}

typedef struct {
  const pw_gradrs *g;
  uint32_t call;
  size_t want; /* frames */
} rx_ref;

static int rx_ready(void *arg) {
  const rx_ref *k = arg;
  const pw_gradrs *g = k->g;
  return g->rx_call[k->call & 1] == k->call && g->rx_got[k->call & 1] == k->want;
}

static int sent(void *arg) {
  pw_gradrs *g = arg;
  return atomic_load(&g->pending) == 0;
}

/* The part of span [a, b) in shard [lo, hi): [*ia, *ib), empty when ia >= ib. */
static int meet(size_t a, size_t b, size_t lo, size_t hi, size_t *ia, size_t *ib) {
  *ia = a > lo ? a : lo, *ib = b < hi ? b : hi;
  return *ia < *ib;
}

static int flush(pw_gradrs_stage *s, const float *scratch, const size_t (*spans)[2], int ns, pw_err *err) {
  pw_gradrs *g = s->g;
  const pw_rctx *c = g->cx;
  size_t tn = pw_prog_train_numel(c->ls[s->li].prog), mine = 0, ia, ib;
  int rc = 0, met = 0;
  /* shard j of each span to replica j, at `off` in its part; an empty
   * frame when none meets it: every flush waits for every replica, so
   * none runs more than one flush ahead */
  for (int j = 0; j < c->dp && !rc; j++) {
    size_t lo, hi, off = 0, at = 0;
    int n = 0;
    pw_shard_range(tn, c->dp, j, &lo, &hi);
    for (int k = 0; k < ns && !rc; at += spans[k][1], k++) {
      if (!meet(spans[k][0], spans[k][0] + spans[k][1], lo, hi, &ia, &ib)) continue;
      if (j != c->replica) rc = send_piece(g, s->li, j, off, scratch + at + (ia - spans[k][0]), ib - ia, err);
      off += ib - ia, n++;
    }
    if (j != c->replica && !n && !rc) rc = send_piece(g, s->li, j, 0, scratch, 0, err);
    if (j == c->replica) mine = off, met = n;
  }
  rx_ref want = {g, g->call, (size_t)(c->dp - 1) * (size_t)(met ? met : 1)};
  if (!rc) rc = c->wait(c->run, rx_ready, &want);
  if (rc) return rc;
  /* our part: the dp copies in replica order, added into our shard */
  const float *in[PW_DPX_MAX];
  size_t lo, hi, off = 0, at = 0;
  pw_shard_range(tn, c->dp, c->replica, &lo, &hi);
  for (int k = 0; k < ns && mine; at += spans[k][1], k++) {
    if (!meet(spans[k][0], spans[k][0] + spans[k][1], lo, hi, &ia, &ib)) continue;
    for (int d = 0; d < c->dp; d++)
      in[d] = d == c->replica ? scratch + at + (ia - spans[k][0])
                              : s->rx[g->call & 1] + (size_t)slot_of(g, d) * s->cap + off;
    pw_reduce_ordered_add(s->arena + ia, in, c->dp, ib - ia);
    off += ib - ia;
  }
  /* the scratch is the next node's once the loop wrote our pieces */
  if ((rc = c->wait(c->run, sent, g))) return rc;
  g->call++;
  return 0;
}

int pw_gradrs_flush(void *ctx, const float *scratch, const size_t (*spans)[2], int n_spans, pw_err *err) {
  pw_gradrs_stage *s = ctx;
  double t0 = pw_now();
  uint32_t call = s->g->call;
  pw_err e = {0};
  int rc = flush(s, scratch, spans, n_spans, &e);
  if (rc && !e.code) /* a send or the wait: what failed there is recorded already (pw_exec_fail) */
    pw_err_set(&e, rc, "ZeRO-2", "gradient flush %u of stage %d: %s", call, s->g->cx->ls[s->li].stage, pw_strerror(rc));
  if (rc && err) *err = e;
  s->g->dp->seconds += pw_now() - t0;
  return rc;
}

/* ---- frames (compute thread, sh.mu held) ------------------------------------------ */

/* A piece of flush h->step for stage li from replica d, at offset off: it
 * fits our receive buffers (an empty one reaches only pw_gradrs_frame). */
static int fits(pw_gradrs *g, int from, const pw_frame_hdr *h, int *li, pw_err *err) {
  int d = (int)h->microbatch;
  size_t off = h->value >> 4, n = (size_t)(h->payload_len / sizeof(float));
  *li = -1;
  if (!g) /* not a ZeRO-2 run: no piece is ever due */
    return pw_err_set(err, PW_EPROTO, "frame", "gradient piece (flush %u) for stage %u from rank %d: not a ZeRO-2 run",
                      h->step, h->stage, from);
  const pw_rctx *c = g->cx;
  *li = h->stage < (uint32_t)c->S ? c->lidx_of_stage[h->stage] : -1;
  if (*li < 0 || d >= c->dp || d == c->replica || from != peer(g, d) || h->dtype != PW_DTYPE_F32 ||
      (h->step != g->call && h->step != g->call + 1) || off + n > g->st[*li].cap)
    return pw_err_set(err, PW_EPROTO, "frame",
                      "gradient piece (flush %u, offset %zu, %zu floats) for stage %u from rank %d does not fit (at "
                      "flush %u)",
                      h->step, off, n, h->stage, from, g->call);
  return 0;
}

int pw_gradrs_dest(pw_gradrs *g, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  int li, rc = fits(g, from, h, &li, err);
  *dst = rc ? NULL
            : g->st[li].rx[h->step & 1] + (size_t)slot_of(g, (int)h->microbatch) * g->st[li].cap +
                  (h->value >> 4);
  return rc;
}

int pw_gradrs_frame(pw_gradrs *g, int from, const pw_frame_hdr *h, pw_err *err) {
  int li, rc = fits(g, from, h, &li, err);
  if (rc) return rc;
  int p = h->step & 1;
  if (g->rx_call[p] != h->step) g->rx_call[p] = h->step, g->rx_got[p] = 0;
  g->rx_got[p]++;
  return 0;
}
