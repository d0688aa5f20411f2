/* dpx: the data-parallel reduce-scatter and all-gather of dpx.h over real
 * frames. Never sums anything out of replica order: pw_reduce_ordered
 * does the adding. */
#include "dpx.h"

#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "log.h"

int pw_dpx_zero(const pw_rctx *c) {
  return c->dp > 1 && c->cfg->sl.mode != PW_MODE_FORWARD ? c->cfg->sl.train.zero : 0;
}

static int slot_of(const pw_dpx *D, int d) { return d - (d > D->cx->replica); }

static int peer(const pw_dpx *D, int d) { return pw_rctx_rank_of(D->cx, d, D->cx->prank); }

static size_t chunk_len(size_t len, size_t chunk, int c) {
  size_t off = (size_t)c * chunk;
  return len - off < chunk ? len - off : chunk;
}

/* ---- buffers ---------------------------------------------------------------- */

/* PW_COLL_CHUNK floats, or fewer for a test (PW_COLL_CHUNK in the
 * environment: many chunks on a small model). */
static size_t coll_chunk(void) {
  const char *s = getenv("PW_COLL_CHUNK");
  char *end;
  unsigned long long v = s && *s ? strtoull(s, &end, 10) : 0;
  return v > 0 && v <= PW_COLL_CHUNK && !*end ? (size_t)v : PW_COLL_CHUNK;
}

/* Shards, chunks and receive buffers of x over n floats at buf (rs: the
 * received shards of a reduce-scatter; zero 2's main gradients have none).
 * Touched now (pw_alloc_floats), as the programs' arenas are: the planner
 * counts them (pw_dp_floats). */
static int dpx_init(pw_dpx *D, pw_dpx_stage *x, float *buf, size_t n, int rs, int out) {
  const pw_rctx *c = D->cx;
  int dp = c->dp;
  x->buf = buf, x->n = n;
  pw_shard_range(n, dp, c->replica, &x->lo, &x->hi);
  x->smax = pw_shard_max(n, dp);
  x->n_chunks = pw_chunk_count(x->hi - x->lo, D->chunk);
  x->ag_step = x->g_step = -1;
  for (int d = 0; d < dp; d++) {
    size_t lo, hi;
    pw_shard_range(n, dp, d, &lo, &hi);
    if (d != c->replica) x->ag_need += pw_chunk_count(hi - lo, D->chunk);
    if (d != 0) x->g_need += (pw_dpx_zero(c) == 3 ? 3 : 2) * pw_chunk_count(hi - lo, D->chunk); /* m, v (zero 3: w) */
  }
  size_t sm = x->smax ? x->smax : 1;
  x->rx = pw_alloc_floats(rs ? (size_t)(dp - 1) * sm : 1);
  x->out = pw_alloc_floats(out ? sm : 1);
  x->rs_step = malloc(sizeof(int) * (size_t)(x->n_chunks + 1));
  x->rs_got = calloc((size_t)x->n_chunks + 1, sizeof(int));
  if (!x->rx || !x->out || !x->rs_step || !x->rs_got) return PW_ENOMEM;
  for (int ci = 0; ci < x->n_chunks; ci++) x->rs_step[ci] = -1;
  return 0;
}

/* zero > 0: the ranges stage li all-reduces whole, and their pack. */
static int full_init(pw_dpx *D, int li) {
  const pw_rctx *c = D->cx;
  pw_prog *p = c->ls[li].prog;
  const pw_prog_layout *L = pw_prog_layout_of(p);
  int tied[64], nt = 0;
  for (int k = 0; k < c->part->n_shared && nt < 64; k++)
    for (int j = 0; j < c->part->shared[k].n_holders; j++)
      if (c->part->shared[k].holders[j] == c->ls[li].stage) tied[nt++] = c->part->shared[k].param;
  pw_dpx_stage *x = &D->st[li];
  x->full = malloc(sizeof *x->full * (size_t)(2 * L->n_shadow + nt + 1));
  if (!x->full) return PW_ENOMEM;
  x->n_full = pw_dp_full_ranges(c->model, L, tied, nt, x->full);
  size_t n = pw_ranges_floats((const size_t(*)[2])x->full, x->n_full);
  float *pack = pw_alloc_floats(n ? n : 1);
  if (!pack) return PW_ENOMEM;
  return dpx_init(D, &D->fr[li], pack, n, 1, 1);
}

int pw_dpx_init(pw_dpx *D, const pw_rctx *cx) {
  const pw_rctx *c = cx;
  memset(D, 0, sizeof *D);
  D->cx = cx;
  D->t0 = -1;
  if (c->dp < 2 || c->cfg->sl.mode == PW_MODE_FORWARD) return 0;
  int zero = pw_dpx_zero(D->cx), dp = c->dp;
  D->chunk = coll_chunk();
  D->st = calloc((size_t)c->n_ls, sizeof *D->st);
  D->fr = zero ? calloc((size_t)c->n_ls, sizeof *D->fr) : NULL;
  D->norm = calloc((size_t)(2 * dp), sizeof(double));
  D->norm_step = malloc(sizeof(int) * (size_t)(2 * dp));
  if (!D->st || (zero && !D->fr) || !D->norm || !D->norm_step) return PW_ENOMEM;
  for (int k = 0; k < 2 * dp; k++) D->norm_step[k] = -1;
  for (int li = 0; li < c->n_ls && zero; li++)
    if (full_init(D, li)) return PW_ENOMEM;
  int rc = zero >= 2 ? pw_gradrs_init(D->gradrs = calloc(1, sizeof *D->gradrs), c, D) : 0; /* the programs' arenas: before they are exchanged */
  if (!rc && zero == 3) rc = pw_pgather_init(D->pgather = calloc(1, sizeof *D->pgather), c, D);
  if (rc) return rc;
  for (int li = 0; li < c->n_ls; li++) {
    pw_dpx_stage *x = &D->st[li];
    pw_prog *p = c->ls[li].prog;
    /* zero 2 and 3 have no step-end reduce-scatter of the main gradients, zero 3 no all-gather of parameters */
    if (dpx_init(D, x, pw_prog_grads(p), zero ? pw_prog_train_numel(p) : pw_prog_grad_numel(p), zero < 2, zero < 3))
      return PW_ENOMEM;
    if (!zero) continue;
    size_t sm = x->smax ? x->smax : 1;
    x->ag = pw_alloc_floats(zero < 3 ? (size_t)(dp - 1) * D->chunk : 1);
    x->m = pw_alloc_floats(sm);
    x->v = pw_alloc_floats(sm);
    if (!x->ag || !x->m || !x->v) return PW_ENOMEM;
  }
  return 0;
}

static void dpx_free(pw_dpx_stage *x) {
  free(x->rx), free(x->out), free(x->ag), free(x->m), free(x->v), free(x->gv), free(x->gp);
  free(x->rs_step), free(x->rs_got), free(x->full);
}

void pw_dpx_close(pw_dpx *D) {
  const pw_rctx *c = D->cx;
  if (!c) return;
  if (D->gradrs) pw_gradrs_close(D->gradrs);
  free(D->gradrs);
  D->gradrs = NULL;
  if (D->pgather) pw_pgather_close(D->pgather);
  free(D->pgather);
  D->pgather = NULL;
  for (int li = 0; D->st && li < c->n_ls; li++) {
    if (c->ls[li].prog && pw_dpx_zero(D->cx)) pw_prog_wire_moments(c->ls[li].prog, NULL, NULL);
    dpx_free(&D->st[li]);
    if (D->fr) {
      free(D->fr[li].buf); /* the pack (the main one's buf is the program's) */
      dpx_free(&D->fr[li]);
    }
  }
  free(D->st), free(D->fr), free(D->norm), free(D->norm_step);
  D->st = D->fr = NULL, D->norm = NULL, D->norm_step = NULL;
}

/* ---- sending ------------------------------------------------------------------- */

/* Chunk ci of `what` for stage li (n floats at src) to replica d. */
static int send_chunk(pw_dpx *D, int li, int d, int what, int ci, const float *src, size_t n) {
  const pw_rctx *c = D->cx;
  pw_frame_hdr h;
  int rc = pw_frame_hdr_init_vec(&h, PW_FRAME_DP, c->job, (uint32_t)(*c->step), (uint32_t)c->replica,
                                 (uint32_t)c->ls[li].stage, (uint32_t)what | (uint32_t)ci << 4, PW_DTYPE_F32, n);
  if (rc)
    return pw_rctx_fail(c, rc, NULL, "no frame header for a %zu-float chunk of stage %d: %s", n, c->ls[li].stage,
                        pw_strerror(rc));
  D->bytes += n * sizeof(float);
  return c->send(c->run, peer(D, d), &h, src, NULL);
}

/* Every chunk of len floats at src to d. */
static int send_range(pw_dpx *D, int li, int d, int what, const float *src, size_t len) {
  for (int ci = 0, rc; ci < pw_chunk_count(len, D->chunk); ci++)
    if ((rc = send_chunk(D, li, d, what, ci, src + (size_t)ci * D->chunk, chunk_len(len, D->chunk, ci))))
      return rc;
  return 0;
}

/* Shard j of each stage's buffer to replica j. */
static int send_shards(pw_dpx *D, pw_dpx_stage *xs, int what) {
  const pw_rctx *c = D->cx;
  for (int li = 0; li < c->n_ls; li++)
    for (int j = 0; j < c->dp; j++) {
      size_t lo, hi;
      pw_shard_range(xs[li].n, c->dp, j, &lo, &hi);
      int rc = j == c->replica ? 0 : send_range(D, li, j, what, xs[li].buf + lo, hi - lo);
      if (rc) return rc;
    }
  return 0;
}

/* ---- reduce-scatter, all-gather --------------------------------------------------- */

typedef struct {
  const pw_dpx *D;
  const pw_dpx_stage *xs;
  int li, ci;
} chunk_ref;

static int rs_ready(void *arg) {
  const chunk_ref *k = arg;
  const pw_rctx *c = k->D->cx;
  const pw_dpx_stage *x = &k->xs[k->li];
  return x->rs_step[k->ci] == (*c->step) && x->rs_got[k->ci] == c->dp - 1;
}

static int ag_ready(void *arg) {
  const chunk_ref *k = arg;
  const pw_rctx *c = k->D->cx;
  const pw_dpx_stage *xs = k->xs;
  for (int li = 0; li < c->n_ls; li++)
    if (xs[li].ag_need && (xs[li].ag_step != (*c->step) || xs[li].ag_got != xs[li].ag_need)) return 0;
  return 1;
}

/* Elements [a, b) of x's shard (offsets in it) summed in replica order
 * into dst (our own copy is x->buf's; dst may be it). */
static void reduce_span(pw_dpx *D, const pw_dpx_stage *x, size_t a, size_t b, float *dst) {
  const pw_rctx *c = D->cx;
  const float *in[PW_DPX_MAX];
  for (int d = 0; d < c->dp; d++)
    in[d] = d == c->replica ? x->buf + x->lo + a : x->rx + (size_t)slot_of(D, d) * x->smax + a;
  pw_reduce_ordered(dst + a, in, c->dp, b - a);
}

/* Reduce-scatter of each stage's x->buf; then either every summed chunk
 * to the others as it is done (gather: zero 0, and the full ranges),
 * through x->out (the buffer itself may be the next step's before the
 * sends are written), or the sum left in place outside the full ranges
 * (zero > 0's main gradients: those ranges hold their sums already). */
static int reduce_scatter(pw_dpx *D, pw_dpx_stage *xs, int rs, int ag) {
  const pw_rctx *c = D->cx;
  int rc = send_shards(D, xs, rs);
  for (int li = 0; li < c->n_ls && !rc; li++) {
    pw_dpx_stage *x = &xs[li];
    for (int ci = 0; ci < x->n_chunks && !rc; ci++) {
      chunk_ref k = {D, xs, li, ci};
      if ((rc = c->wait(c->run, rs_ready, &k))) break;
      size_t off = (size_t)ci * D->chunk, n = chunk_len(x->hi - x->lo, D->chunk, ci);
      if (!ag) { /* in place, around the full ranges */
        size_t a = off, end = off + n;
        for (int f = 0; f < x->n_full && a < end; f++) {
          size_t fa = x->full[f][0] > x->lo ? x->full[f][0] - x->lo : 0, fb = x->full[f][1] > x->lo ? x->full[f][1] - x->lo : 0;
          if (fb <= a || fa >= end) continue;
          if (fa > a) reduce_span(D, x, a, fa, x->buf + x->lo);
          a = fb;
        }
        if (a < end) reduce_span(D, x, a, end, x->buf + x->lo);
        continue;
      }
      reduce_span(D, x, off, off + n, x->out);
      memcpy(x->buf + x->lo + off, x->out + off, n * sizeof(float));
      for (int d = 0; d < c->dp && !rc; d++)
        if (d != c->replica) rc = send_chunk(D, li, d, ag, ci, x->out + off, n);
    }
  }
  chunk_ref all = {D, xs, 0, 0};
  return rc || !ag ? rc : c->wait(c->run, ag_ready, &all);
}

/* Every part of the step's exchange is timed: the step report carries the
 * sum, a traced step's timeline the span from the first to the last. */
static int timed(pw_dpx *D, double t0, int rc) {
  const pw_rctx *c = D->cx;
  double t1 = pw_now();
  D->seconds += t1 - t0;
  if (D->t0 < 0) D->t0 = t0 - (*c->t_step0);
  D->t1 = t1 - (*c->t_step0);
  return rc;
}

int pw_dpx_allreduce(pw_dpx *D) {
  double t0 = pw_now();
  return timed(D, t0, reduce_scatter(D, D->st, PW_DPX_RS, PW_DPX_AG));
}

/* Copies between the gradient arena and the packed full ranges. */
static void full_pack(pw_dpx *D, int li, int to_pack) {
  const pw_rctx *c = D->cx;
  const pw_dpx_stage *x = &D->st[li];
  float *g = pw_prog_grads(c->ls[li].prog), *pack = D->fr[li].buf;
  for (int f = 0; f < x->n_full; f++) {
    size_t n = x->full[f][1] - x->full[f][0];
    if (to_pack)
      memcpy(pack, g + x->full[f][0], n * sizeof(float));
    else
      memcpy(g + x->full[f][0], pack, n * sizeof(float));
    pack += n;
  }
}

int pw_dpx_reduce_full(pw_dpx *D) {
  const pw_rctx *c = D->cx;
  double t0 = pw_now();
  for (int li = 0; li < c->n_ls; li++) full_pack(D, li, 1);
  int rc = reduce_scatter(D, D->fr, PW_DPX_FRS, PW_DPX_FAG);
  for (int li = 0; li < c->n_ls && !rc; li++) full_pack(D, li, 0);
  return timed(D, t0, rc);
}

int pw_dpx_reduce_scatter(pw_dpx *D) {
  double t0 = pw_now();
  return timed(D, t0, reduce_scatter(D, D->st, PW_DPX_RS, 0));
}

/* ---- norm --------------------------------------------------------------------- */

static int norm_ready(void *arg) {
  const pw_dpx *D = arg;
  const pw_rctx *c = D->cx;
  const int *st = D->norm_step + ((*c->step) & 1) * c->dp;
  for (int d = 0; d < c->dp; d++)
    if (st[d] != (*c->step)) return 0;
  return 1;
}

static int norm(pw_dpx *D, double part, double *total);

int pw_dpx_norm(pw_dpx *D, double part, double *total) {
  double t0 = pw_now();
  return timed(D, t0, norm(D, part, total));
}

static int norm(pw_dpx *D, double part, double *total) {
  const pw_rctx *c = D->cx;
  int par = (*c->step) & 1, rc;
  D->norm[par * c->dp + c->replica] = part;
  D->norm_step[par * c->dp + c->replica] = (*c->step);
  for (int d = 0; d < c->dp; d++) {
    if (d == c->replica) continue;
    pw_frame_hdr h;
    uint32_t dims[1] = {8};
    if ((rc = pw_frame_hdr_init(&h, PW_FRAME_DP, c->job, (uint32_t)(*c->step), (uint32_t)c->replica, 0,
                                PW_DPX_NORM, PW_DTYPE_U8, 1, dims)))
      return pw_rctx_fail(c, rc, NULL, "no frame header for the shard norm: %s", pw_strerror(rc));
    if ((rc = c->send(c->run, peer(D, d), &h, &D->norm[par * c->dp + c->replica], NULL))) return rc;
  }
  if ((rc = c->wait(c->run, norm_ready, D))) return rc;
  double sum = 0;
  for (int d = 0; d < c->dp; d++) sum += D->norm[par * c->dp + d];
  *total = sum;
  return 0;
}

/* ---- parameters --------------------------------------------------------------- */

/* Copies between the parameters and a packed range [lo, lo + n) of the
 * gradient arena's main part (frozen parameters have no place in it). */
static void params_range(pw_prog *p, size_t lo, size_t n, float *packed, int to_params) {
  const float *g0 = pw_prog_grads(p);
  for (int i = 0; i < pw_prog_n_params(p); i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    if (!pp->grad) continue;
    size_t off = (size_t)(pp->grad - g0), end = off + pp->meta->numel;
    size_t a = off > lo ? off : lo, b = end < lo + n ? end : lo + n;
    if (a >= b) continue;
    if (to_params)
      memcpy(pp->data + (a - off), packed + (a - lo), (b - a) * sizeof(float));
    else
      memcpy(packed + (a - lo), pp->data + (a - off), (b - a) * sizeof(float));
  }
}

static int allgather_params(pw_dpx *D);

int pw_dpx_allgather_params(pw_dpx *D) {
  double t0 = pw_now();
  return timed(D, t0, allgather_params(D));
}

static int allgather_params(pw_dpx *D) {
  const pw_rctx *c = D->cx;
  int rc = 0;
  for (int li = 0; li < c->n_ls && !rc; li++) {
    pw_dpx_stage *x = &D->st[li];
    params_range(c->ls[li].prog, x->lo, x->hi - x->lo, x->out, 0);
    for (int d = 0; d < c->dp && !rc; d++)
      if (d != c->replica) rc = send_range(D, li, d, PW_DPX_AG, x->out, x->hi - x->lo);
  }
  chunk_ref all = {D, D->st, 0, 0};
  return rc ? rc : c->wait(c->run, ag_ready, &all);
}

/* ---- optimizer state at checkpoints and loads ------------------------------------ */

static int g_ready(void *arg) {
  const pw_dpx *D = arg;
  const pw_rctx *c = D->cx;
  for (int li = 0; li < c->n_ls; li++)
    if (D->st[li].g_need && (D->st[li].g_step != (*c->step) || D->st[li].g_got != D->st[li].g_need))
      return 0;
  return 1;
}

/* The whole m goes where the gradients are (idle from the update to the
 * step's end, when they are zeroed: pw_stepend_run), only v is made;
 * zero 2 keeps no whole gradient arena: m is made too; zero 3 the whole
 * parameters when `params`. */
static int whole_state(const pw_dpx *D, pw_dpx_stage *x, int params) {
  int zero = pw_dpx_zero(D->cx);
  if (!x->gm) x->gm = zero >= 2 ? calloc(x->n ? x->n : 1, sizeof(float)) : x->buf;
  if (!x->gv) x->gv = calloc(x->n ? x->n : 1, sizeof(float));
  if (zero == 3 && params && !x->gp) x->gp = calloc(x->n ? x->n : 1, sizeof(float)); /* n: the parameter arena */
  return x->gm && x->gv && (!params || zero < 3 || x->gp) ? 0 : PW_ENOMEM;
}

int pw_dpx_state_gather(pw_dpx *D) {
  const pw_rctx *c = D->cx;
  int rc = 0;
  if (c->replica != 0) {
    for (int li = 0; li < c->n_ls && !rc; li++) {
      pw_dpx_stage *x = &D->st[li];
      if (!(rc = send_range(D, li, 0, PW_DPX_GM, x->m, x->hi - x->lo)))
        rc = send_range(D, li, 0, PW_DPX_GV, x->v, x->hi - x->lo);
      if (!rc && D->pgather) /* the shard is read until the next update: after replica 0 has it all */
        rc = send_range(D, li, 0, PW_DPX_GP, D->pgather->st[li].arena + x->lo, x->hi - x->lo);
    }
    return rc;
  }
  if ((rc = c->wait(c->run, g_ready, D))) return rc;
  for (int li = 0; li < c->n_ls; li++) {
    pw_dpx_stage *x = &D->st[li];
    if (whole_state(D, x, 1)) return pw_rctx_fail(c, PW_ENOMEM, NULL, "out of memory gathering optimizer state");
    memcpy(x->gm + x->lo, x->m, (x->hi - x->lo) * sizeof(float));
    memcpy(x->gv + x->lo, x->v, (x->hi - x->lo) * sizeof(float));
    pw_prog_wire_moments(c->ls[li].prog, x->gm, x->gv);
    if (D->pgather) { /* zero 3: the whole parameters too, lent for the save */
      memcpy(x->gp + x->lo, D->pgather->st[li].arena + x->lo, (x->hi - x->lo) * sizeof(float));
      pw_pgather_lend(D->pgather, li, x->gp);
    }
  }
  return 0;
}

void pw_dpx_state_release(pw_dpx *D) {
  const pw_rctx *c = D->cx;
  for (int li = 0; li < c->n_ls; li++) {
    pw_dpx_stage *x = &D->st[li];
    pw_prog_wire_moments(c->ls[li].prog, NULL, NULL);
    if (D->pgather) pw_pgather_lend(D->pgather, li, NULL);
    if (x->gm != x->buf) free(x->gm);
    free(x->gv), free(x->gp);
    x->gm = x->gv = x->gp = NULL;
  }
}

int pw_dpx_load_begin(pw_dpx *D) {
  const pw_rctx *c = D->cx;
  /* zero 3: whole parameters only when a file is read; drawn ones are
   * drawn into the shard alone (pw_prog_init_params) */
  int file = c->cfg->resume || c->cfg->sl.init_sha256[0];
  for (int li = 0; li < c->n_ls; li++) {
    pw_dpx_stage *x = &D->st[li];
    if (whole_state(D, x, file)) return PW_ENOMEM;
    pw_prog_wire_moments(c->ls[li].prog, x->gm, x->gv);
    if (x->gp) pw_pgather_lend(D->pgather, li, x->gp);
  }
  return 0;
}

void pw_dpx_load_end(pw_dpx *D) {
  const pw_rctx *c = D->cx;
  for (int li = 0; li < c->n_ls; li++) {
    pw_dpx_stage *x = &D->st[li];
    if (x->gm) memcpy(x->m, x->gm + x->lo, (x->hi - x->lo) * sizeof(float));
    if (x->gv) memcpy(x->v, x->gv + x->lo, (x->hi - x->lo) * sizeof(float));
    if (x->gp) memcpy(D->pgather->st[li].arena + x->lo, x->gp + x->lo, (x->hi - x->lo) * sizeof(float));
    pw_prog_zero_grad(c->ls[li].prog); /* m was lent the gradients' room */
  }
  pw_dpx_state_release(D);
}

/* ---- frames (compute thread, sh.mu held) ------------------------------------------ */

/* Checks a chunk frame: from replica *d for stage *li's exchange *x,
 * chunk c of shard [*lo, ...) — ours for a reduce-scatter, the sender's
 * otherwise; *off gets the chunk's offset in the shard. */
static int chunk_fits(pw_dpx *D, int from, const pw_frame_hdr *h, pw_dpx_stage **x, int *li, int *d, size_t *lo, size_t *off,
                      pw_err *err) {
  const pw_rctx *c = D->cx;
  int what = (int)(h->value & 15), ci = (int)(h->value >> 4), full = what == PW_DPX_FRS || what == PW_DPX_FAG;
  *x = NULL, *lo = *off = 0; /* set on every path: -O3 cannot see that callers only read them on success */
  *li = h->stage < (uint32_t)c->S ? c->lidx_of_stage[h->stage] : -1;
  *d = (int)h->microbatch;
  if (*li < 0 || !D->st || (full && !D->fr) || *d >= c->dp || *d == c->replica || from != peer(D, *d) ||
      h->dtype != PW_DTYPE_F32 || what < PW_DPX_RS || what > PW_DPX_GP || what == PW_DPX_NORM)
    return pw_err_set(err, PW_EPROTO, "frame", "data-parallel frame (value %u) for stage %u from rank %d does not fit",
                      h->value, h->stage, from);
  *x = full ? &D->fr[*li] : &D->st[*li];
  size_t hi;
  pw_shard_range((*x)->n, c->dp, what == PW_DPX_RS || what == PW_DPX_FRS ? c->replica : *d, lo, &hi);
  int n_chunks = pw_chunk_count(hi - *lo, D->chunk);
  if (ci >= n_chunks || h->payload_len != chunk_len(hi - *lo, D->chunk, ci) * sizeof(float) ||
      ((what == PW_DPX_GM || what == PW_DPX_GV) && (c->replica != 0 || !pw_dpx_zero(D->cx))) ||
      (what == PW_DPX_GP && (c->replica != 0 || pw_dpx_zero(D->cx) != 3)) ||
      (what == PW_DPX_RS && pw_dpx_zero(D->cx) >= 2) || /* no step-end reduce-scatter of the main gradients: no buffer */
      (what == PW_DPX_AG && pw_dpx_zero(D->cx) == 3)) /* nor an all-gather of parameters */
    return pw_err_set(err, PW_EPROTO, "frame", "data-parallel chunk %d (value %u, %llu bytes) of stage %u does not fit",
                      ci, h->value, (unsigned long long)h->payload_len, h->stage);
  *off = (size_t)ci * D->chunk;
  return 0;
}

int pw_dpx_dest(pw_dpx *D, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  const pw_rctx *c = D->cx;
  int what = (int)(h->value & 15), li, d;
  size_t lo, off;
  pw_dpx_stage *x;
  *dst = NULL;
  if (what == PW_GRADRS_PIECE) return pw_gradrs_dest(D->gradrs, from, h, dst, err);
  if (what == PW_PGATHER_PIECE) return pw_pgather_dest(D->pgather, from, h, dst, err);
  if ((int)h->step != (*c->step) && (int)h->step != (*c->step) + 1)
    return pw_err_set(err, PW_EPROTO, "frame", "data-parallel frame for step %u while at step %d", h->step, (*c->step));
  if (what == PW_DPX_NORM) {
    if (h->payload_len != 8 || h->dtype != PW_DTYPE_U8 || !D->st || h->microbatch >= (uint32_t)c->dp ||
        (int)h->microbatch == c->replica || from != peer(D, (int)h->microbatch))
      return pw_err_set(err, PW_EPROTO, "frame", "shard norm from rank %d does not fit", from);
    return 0; /* the reader's buffer */
  }
  int rc = chunk_fits(D, from, h, &x, &li, &d, &lo, &off, err);
  if (rc) return rc;
  switch (what) {
    case PW_DPX_RS:
    case PW_DPX_FRS: *dst = x->rx + (size_t)slot_of(D, d) * x->smax + off; return 0;
    case PW_DPX_AG:
    case PW_DPX_FAG:
      /* zero > 0's parameters go through a chunk buffer (pw_dpx_frame) */
      *dst = what == PW_DPX_AG && pw_dpx_zero(D->cx) ? x->ag + (size_t)slot_of(D, d) * D->chunk : x->buf + lo + off;
      return 0;
    default: /* GM, GV, GP */
      if (whole_state(D, x, what == PW_DPX_GP))
        return pw_err_set(err, PW_ENOMEM, "frame", "out of memory gathering optimizer state");
      *dst = (what == PW_DPX_GM ? x->gm : what == PW_DPX_GV ? x->gv : x->gp) + lo + off;
      return 0;
  }
}

int pw_dpx_frame(pw_dpx *D, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  const pw_rctx *c = D->cx;
  int what = (int)(h->value & 15), step = (int)h->step, li, d;
  if (what == PW_GRADRS_PIECE) return pw_gradrs_frame(D->gradrs, from, h, err);
  if (what == PW_PGATHER_PIECE) return pw_pgather_frame(D->pgather, from, h, err);
  if (what == PW_DPX_NORM) {
    double v;
    memcpy(&v, payload, 8);
    D->norm[(step & 1) * c->dp + (int)h->microbatch] = v;
    D->norm_step[(step & 1) * c->dp + (int)h->microbatch] = step;
    return 0;
  }
  size_t lo, off;
  pw_dpx_stage *x;
  int rc = chunk_fits(D, from, h, &x, &li, &d, &lo, &off, err);
  if (rc) return rc;
  int ci = (int)(h->value >> 4);
  switch (what) {
    case PW_DPX_RS:
    case PW_DPX_FRS:
      if (x->rs_step[ci] != step) x->rs_step[ci] = step, x->rs_got[ci] = 0;
      x->rs_got[ci]++;
      return 0;
    case PW_DPX_AG:
    case PW_DPX_FAG:
      if (what == PW_DPX_AG && pw_dpx_zero(D->cx)) /* into the parameters now: d's next frame reuses the buffer */
        params_range(c->ls[li].prog, lo + off, h->payload_len / sizeof(float),
                     x->ag + (size_t)slot_of(D, d) * D->chunk, 1);
      if (x->ag_step != step) x->ag_step = step, x->ag_got = 0;
      x->ag_got++;
      return 0;
    default:
      if (x->g_step != step) x->g_step = step, x->g_got = 0;
      x->g_got++;
      return 0;
  }
}
