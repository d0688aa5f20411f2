/* dpx: the data-parallel reduce-scatter and all-gather of dpx.h over real
 * frames. Never sums anything out of replica order: pw_reduce_ordered
 * does the adding. */
#include "dpx.h"

#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "log.h"
#include "worker.h"

int pw_dpx_zero(const pw_run *r) {
  return r->dp > 1 && r->spec.mode != PW_MODE_FORWARD ? r->spec.train.zero : 0;
}

static int slot_of(const pw_run *r, int d) { return d - (d > r->replica); }

static int peer(const pw_run *r, int d) { return pw_run_rank_of(r, d, r->prank); }

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
static int dpx_init(pw_run *r, pw_dpx *x, float *buf, size_t n, int rs) {
  int dp = r->dp;
  x->buf = buf, x->n = n;
  pw_shard_range(n, dp, r->replica, &x->lo, &x->hi);
  x->smax = pw_shard_max(n, dp);
  x->n_chunks = pw_chunk_count(x->hi - x->lo, r->cp.dp_chunk);
  x->ag_step = x->g_step = -1;
  for (int d = 0; d < dp; d++) {
    size_t lo, hi;
    pw_shard_range(n, dp, d, &lo, &hi);
    if (d != r->replica) x->ag_need += pw_chunk_count(hi - lo, r->cp.dp_chunk);
    if (d != 0) x->g_need += 2 * pw_chunk_count(hi - lo, r->cp.dp_chunk);
  }
  size_t sm = x->smax ? x->smax : 1;
  x->rx = pw_alloc_floats(rs ? (size_t)(dp - 1) * sm : 1);
  x->out = pw_alloc_floats(sm);
  x->rs_step = malloc(sizeof(int) * (size_t)(x->n_chunks + 1));
  x->rs_got = calloc((size_t)x->n_chunks + 1, sizeof(int));
  if (!x->rx || !x->out || !x->rs_step || !x->rs_got) return PW_ENOMEM;
  for (int c = 0; c < x->n_chunks; c++) x->rs_step[c] = -1;
  return 0;
}

/* zero > 0: the ranges stage li all-reduces whole, and their pack. */
static int full_init(pw_run *r, int li) {
  pw_prog *p = r->ls[li].prog;
  const pw_prog_layout *L = pw_prog_layout_of(p);
  int tied[64], nt = 0;
  for (int k = 0; k < r->part.n_shared && nt < 64; k++)
    for (int j = 0; j < r->part.shared[k].n_holders; j++)
      if (r->part.shared[k].holders[j] == r->ls[li].stage) tied[nt++] = r->part.shared[k].param;
  pw_dpx *x = &r->cp.dpx[li];
  x->full = malloc(sizeof *x->full * (size_t)(2 * L->n_shadow + nt + 1));
  if (!x->full) return PW_ENOMEM;
  x->n_full = pw_dp_full_ranges(&r->model, L, tied, nt, x->full);
  size_t n = pw_ranges_floats((const size_t(*)[2])x->full, x->n_full);
  float *pack = pw_alloc_floats(n ? n : 1);
  if (!pack) return PW_ENOMEM;
  return dpx_init(r, &r->cp.dpf[li], pack, n, 1);
}

int pw_dpx_alloc(pw_run *r) {
  if (r->dp < 2 || r->spec.mode == PW_MODE_FORWARD) return 0;
  int zero = pw_dpx_zero(r), dp = r->dp;
  r->cp.dp_chunk = coll_chunk();
  r->cp.dpx = calloc((size_t)r->n_ls, sizeof *r->cp.dpx);
  r->cp.dpf = zero ? calloc((size_t)r->n_ls, sizeof *r->cp.dpf) : NULL;
  r->cp.dp_norm = calloc((size_t)(2 * dp), sizeof(double));
  r->cp.dp_norm_step = malloc(sizeof(int) * (size_t)(2 * dp));
  if (!r->cp.dpx || (zero && !r->cp.dpf) || !r->cp.dp_norm || !r->cp.dp_norm_step) return PW_ENOMEM;
  for (int k = 0; k < 2 * dp; k++) r->cp.dp_norm_step[k] = -1;
  for (int li = 0; li < r->n_ls && zero; li++)
    if (full_init(r, li)) return PW_ENOMEM;
  int rc = zero == 2 ? pw_gradrs_alloc(r) : 0; /* the programs' arenas: before they are exchanged */
  if (rc) return rc;
  for (int li = 0; li < r->n_ls; li++) {
    pw_dpx *x = &r->cp.dpx[li];
    pw_prog *p = r->ls[li].prog;
    if (dpx_init(r, x, pw_prog_grads(p), zero ? pw_prog_train_numel(p) : pw_prog_grad_numel(p), zero != 2))
      return PW_ENOMEM;
    if (!zero) continue;
    size_t sm = x->smax ? x->smax : 1;
    x->ag = pw_alloc_floats((size_t)(dp - 1) * r->cp.dp_chunk);
    x->m = pw_alloc_floats(sm);
    x->v = pw_alloc_floats(sm);
    if (!x->ag || !x->m || !x->v) return PW_ENOMEM;
  }
  return 0;
}

static void dpx_free(pw_dpx *x) {
  free(x->rx), free(x->out), free(x->ag), free(x->m), free(x->v), free(x->gv);
  free(x->rs_step), free(x->rs_got), free(x->full);
}

void pw_dpx_free(pw_run *r) {
  pw_gradrs_free(r);
  for (int li = 0; r->cp.dpx && li < r->n_ls; li++) {
    if (r->ls[li].prog && pw_dpx_zero(r)) pw_prog_wire_moments(r->ls[li].prog, NULL, NULL);
    dpx_free(&r->cp.dpx[li]);
    if (r->cp.dpf) {
      free(r->cp.dpf[li].buf); /* the pack (the main one's buf is the program's) */
      dpx_free(&r->cp.dpf[li]);
    }
  }
  free(r->cp.dpx), free(r->cp.dpf), free(r->cp.dp_norm), free(r->cp.dp_norm_step);
  r->cp.dpx = r->cp.dpf = NULL, r->cp.dp_norm = NULL, r->cp.dp_norm_step = NULL;
}

/* ---- sending ------------------------------------------------------------------- */

/* Chunk c of `what` for stage li (n floats at src) to replica d. */
static int send_chunk(pw_run *r, int li, int d, int what, int c, const float *src, size_t n) {
  pw_frame_hdr h;
  int rc = pw_frame_hdr_init_vec(&h, PW_FRAME_REDUCE, r->job, (uint32_t)r->sh.step, (uint32_t)r->replica,
                                 (uint32_t)r->ls[li].stage, (uint32_t)what | (uint32_t)c << 4, PW_DTYPE_F32, n);
  if (rc)
    return pw_exec_fail(r, rc, NULL, "no frame header for a %zu-float chunk of stage %d: %s", n, r->ls[li].stage,
                        pw_strerror(rc));
  r->cp.dp_bytes += n * sizeof(float);
  return pw_exec_send(r, peer(r, d), &h, src, -1, -1);
}

/* Every chunk of len floats at src to d. */
static int send_range(pw_run *r, int li, int d, int what, const float *src, size_t len) {
  for (int c = 0, rc; c < pw_chunk_count(len, r->cp.dp_chunk); c++)
    if ((rc = send_chunk(r, li, d, what, c, src + (size_t)c * r->cp.dp_chunk, chunk_len(len, r->cp.dp_chunk, c))))
      return rc;
  return 0;
}

/* Shard j of each stage's buffer to replica j. */
static int send_shards(pw_run *r, pw_dpx *xs, int what) {
  for (int li = 0; li < r->n_ls; li++)
    for (int j = 0; j < r->dp; j++) {
      size_t lo, hi;
      pw_shard_range(xs[li].n, r->dp, j, &lo, &hi);
      int rc = j == r->replica ? 0 : send_range(r, li, j, what, xs[li].buf + lo, hi - lo);
      if (rc) return rc;
    }
  return 0;
}

/* ---- reduce-scatter, all-gather --------------------------------------------------- */

typedef struct {
  const pw_dpx *xs;
  int li, c;
} chunk_ref;

static int rs_ready(pw_run *r, const void *arg) {
  const chunk_ref *k = arg;
  const pw_dpx *x = &k->xs[k->li];
  return x->rs_step[k->c] == r->sh.step && x->rs_got[k->c] == r->dp - 1;
}

static int ag_ready(pw_run *r, const void *arg) {
  const pw_dpx *xs = arg;
  for (int li = 0; li < r->n_ls; li++)
    if (xs[li].ag_need && (xs[li].ag_step != r->sh.step || xs[li].ag_got != xs[li].ag_need)) return 0;
  return 1;
}

/* Elements [a, b) of x's shard (offsets in it) summed in replica order
 * into dst (our own copy is x->buf's; dst may be it). */
static void reduce_span(pw_run *r, const pw_dpx *x, size_t a, size_t b, float *dst) {
  const float *in[PW_DPX_MAX];
  for (int d = 0; d < r->dp; d++)
    in[d] = d == r->replica ? x->buf + x->lo + a : x->rx + (size_t)slot_of(r, d) * x->smax + a;
  pw_reduce_ordered(dst + a, in, r->dp, b - a);
}

/* Reduce-scatter of each stage's x->buf; then either every summed chunk
 * to the others as it is done (gather: zero 0, and the full ranges),
 * through x->out (the buffer itself may be the next step's before the
 * sends are written), or the sum left in place outside the full ranges
 * (zero > 0's main gradients: those ranges hold their sums already). */
static int reduce_scatter(pw_run *r, pw_dpx *xs, int rs, int ag) {
  int rc = send_shards(r, xs, rs);
  for (int li = 0; li < r->n_ls && !rc; li++) {
    pw_dpx *x = &xs[li];
    for (int c = 0; c < x->n_chunks && !rc; c++) {
      chunk_ref k = {xs, li, c};
      if ((rc = pw_exec_wait(r, rs_ready, &k))) break;
      size_t off = (size_t)c * r->cp.dp_chunk, n = chunk_len(x->hi - x->lo, r->cp.dp_chunk, c);
      if (!ag) { /* in place, around the full ranges */
        size_t a = off, end = off + n;
        for (int f = 0; f < x->n_full && a < end; f++) {
          size_t fa = x->full[f][0] > x->lo ? x->full[f][0] - x->lo : 0, fb = x->full[f][1] > x->lo ? x->full[f][1] - x->lo : 0;
          if (fb <= a || fa >= end) continue;
          if (fa > a) reduce_span(r, x, a, fa, x->buf + x->lo);
          a = fb;
        }
        if (a < end) reduce_span(r, x, a, end, x->buf + x->lo);
        continue;
      }
      reduce_span(r, x, off, off + n, x->out);
      memcpy(x->buf + x->lo + off, x->out + off, n * sizeof(float));
      for (int d = 0; d < r->dp && !rc; d++)
        if (d != r->replica) rc = send_chunk(r, li, d, ag, c, x->out + off, n);
    }
  }
  return rc || !ag ? rc : pw_exec_wait(r, ag_ready, xs);
}

/* Every part of the step's exchange is timed: the step report carries the
 * sum, a traced step's timeline the span from the first to the last. */
static int timed(pw_run *r, double t0, int rc) {
  double t1 = pw_now();
  r->cp.dp_seconds += t1 - t0;
  if (r->cp.dp_t0 < 0) r->cp.dp_t0 = t0 - r->cp.t_step0;
  r->cp.dp_t1 = t1 - r->cp.t_step0;
  return rc;
}

int pw_dpx_allreduce(pw_run *r) {
  double t0 = pw_now();
  return timed(r, t0, reduce_scatter(r, r->cp.dpx, PW_DPX_RS, PW_DPX_AG));
}

/* Copies between the gradient arena and the packed full ranges. */
static void full_pack(pw_run *r, int li, int to_pack) {
  const pw_dpx *x = &r->cp.dpx[li];
  float *g = pw_prog_grads(r->ls[li].prog), *pack = r->cp.dpf[li].buf;
  for (int f = 0; f < x->n_full; f++) {
    size_t n = x->full[f][1] - x->full[f][0];
    if (to_pack)
      memcpy(pack, g + x->full[f][0], n * sizeof(float));
    else
      memcpy(g + x->full[f][0], pack, n * sizeof(float));
    pack += n;
  }
}

int pw_dpx_reduce_full(pw_run *r) {
  double t0 = pw_now();
  for (int li = 0; li < r->n_ls; li++) full_pack(r, li, 1);
  int rc = reduce_scatter(r, r->cp.dpf, PW_DPX_FRS, PW_DPX_FAG);
  for (int li = 0; li < r->n_ls && !rc; li++) full_pack(r, li, 0);
  return timed(r, t0, rc);
}

int pw_dpx_reduce_scatter(pw_run *r) {
  double t0 = pw_now();
  return timed(r, t0, reduce_scatter(r, r->cp.dpx, PW_DPX_RS, 0));
}

/* ---- norm --------------------------------------------------------------------- */

static int norm_ready(pw_run *r, const void *arg) {
  const int *st = r->cp.dp_norm_step + (r->sh.step & 1) * r->dp;
  for (int d = 0; d < r->dp; d++)
    if (st[d] != r->sh.step) return 0;
  return 1;
}

static int norm(pw_run *r, double part, double *total);

int pw_dpx_norm(pw_run *r, double part, double *total) {
  double t0 = pw_now();
  return timed(r, t0, norm(r, part, total));
}

static int norm(pw_run *r, double part, double *total) {
  int par = r->sh.step & 1, rc;
  r->cp.dp_norm[par * r->dp + r->replica] = part;
  r->cp.dp_norm_step[par * r->dp + r->replica] = r->sh.step;
  for (int d = 0; d < r->dp; d++) {
    if (d == r->replica) continue;
    pw_frame_hdr h;
    uint32_t dims[1] = {8};
    if ((rc = pw_frame_hdr_init(&h, PW_FRAME_REDUCE, r->job, (uint32_t)r->sh.step, (uint32_t)r->replica, 0,
                                PW_DPX_NORM, PW_DTYPE_U8, 1, dims)))
      return pw_exec_fail(r, rc, NULL, "no frame header for the shard norm: %s", pw_strerror(rc));
    if ((rc = pw_exec_send(r, peer(r, d), &h, &r->cp.dp_norm[par * r->dp + r->replica], -1, -1))) return rc;
  }
  if ((rc = pw_exec_wait(r, norm_ready, NULL))) return rc;
  double sum = 0;
  for (int d = 0; d < r->dp; d++) sum += r->cp.dp_norm[par * r->dp + d];
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

static int allgather_params(pw_run *r);

int pw_dpx_allgather_params(pw_run *r) {
  double t0 = pw_now();
  return timed(r, t0, allgather_params(r));
}

static int allgather_params(pw_run *r) {
  int rc = 0;
  for (int li = 0; li < r->n_ls && !rc; li++) {
    pw_dpx *x = &r->cp.dpx[li];
    params_range(r->ls[li].prog, x->lo, x->hi - x->lo, x->out, 0);
    for (int d = 0; d < r->dp && !rc; d++)
      if (d != r->replica) rc = send_range(r, li, d, PW_DPX_AG, x->out, x->hi - x->lo);
  }
  return rc ? rc : pw_exec_wait(r, ag_ready, r->cp.dpx);
}

/* ---- optimizer state at checkpoints and loads ------------------------------------ */

static int g_ready(pw_run *r, const void *arg) {
  for (int li = 0; li < r->n_ls; li++)
    if (r->cp.dpx[li].g_need && (r->cp.dpx[li].g_step != r->sh.step || r->cp.dpx[li].g_got != r->cp.dpx[li].g_need))
      return 0;
  return 1;
}

/* The whole m goes where the gradients are (idle from the update to the
 * step's end, when they are zeroed: pw_stepend_run), only v is made;
 * zero 2 keeps no whole gradient arena: m is made too. */
static int whole_state(const pw_run *r, pw_dpx *x) {
  if (!x->gm) x->gm = pw_dpx_zero(r) == 2 ? calloc(x->n ? x->n : 1, sizeof(float)) : x->buf;
  if (!x->gv) x->gv = calloc(x->n ? x->n : 1, sizeof(float));
  return x->gm && x->gv ? 0 : PW_ENOMEM;
}

int pw_dpx_state_gather(pw_run *r) {
  int rc = 0;
  if (r->replica != 0) {
    for (int li = 0; li < r->n_ls && !rc; li++) {
      pw_dpx *x = &r->cp.dpx[li];
      if (!(rc = send_range(r, li, 0, PW_DPX_GM, x->m, x->hi - x->lo)))
        rc = send_range(r, li, 0, PW_DPX_GV, x->v, x->hi - x->lo);
    }
    return rc;
  }
  if ((rc = pw_exec_wait(r, g_ready, NULL))) return rc;
  for (int li = 0; li < r->n_ls; li++) {
    pw_dpx *x = &r->cp.dpx[li];
    if (whole_state(r, x)) return pw_exec_fail(r, PW_ENOMEM, NULL, "out of memory gathering optimizer state");
    memcpy(x->gm + x->lo, x->m, (x->hi - x->lo) * sizeof(float));
    memcpy(x->gv + x->lo, x->v, (x->hi - x->lo) * sizeof(float));
    pw_prog_wire_moments(r->ls[li].prog, x->gm, x->gv);
  }
  return 0;
}

void pw_dpx_state_release(pw_run *r) {
  for (int li = 0; li < r->n_ls; li++) {
    pw_dpx *x = &r->cp.dpx[li];
    pw_prog_wire_moments(r->ls[li].prog, NULL, NULL);
    if (x->gm != x->buf) free(x->gm);
    free(x->gv);
    x->gm = x->gv = NULL;
  }
}

int pw_dpx_load_begin(pw_run *r) {
  for (int li = 0; li < r->n_ls; li++) {
    pw_dpx *x = &r->cp.dpx[li];
    if (whole_state(r, x)) return PW_ENOMEM;
    pw_prog_wire_moments(r->ls[li].prog, x->gm, x->gv);
  }
  return 0;
}

void pw_dpx_load_end(pw_run *r) {
  for (int li = 0; li < r->n_ls; li++) {
    pw_dpx *x = &r->cp.dpx[li];
    if (x->gm) memcpy(x->m, x->gm + x->lo, (x->hi - x->lo) * sizeof(float));
    if (x->gv) memcpy(x->v, x->gv + x->lo, (x->hi - x->lo) * sizeof(float));
    pw_prog_zero_grad(r->ls[li].prog); /* m was lent the gradients' room */
  }
  pw_dpx_state_release(r);
}

/* ---- frames (compute thread, sh.mu held) ------------------------------------------ */

/* Checks a chunk frame: from replica *d for stage *li's exchange *x,
 * chunk c of shard [*lo, ...) — ours for a reduce-scatter, the sender's
 * otherwise; *off gets the chunk's offset in the shard. */
static int chunk_fits(pw_run *r, int from, const pw_frame_hdr *h, pw_dpx **x, int *li, int *d, size_t *lo, size_t *off,
                      pw_err *err) {
  int what = (int)(h->value & 15), c = (int)(h->value >> 4), full = what == PW_DPX_FRS || what == PW_DPX_FAG;
  *x = NULL, *lo = *off = 0; /* set on every path: -O3 cannot see that callers only read them on success */
  *li = h->stage < (uint32_t)r->S ? r->lidx_of_stage[h->stage] : -1;
  *d = (int)h->microbatch;
  if (*li < 0 || !r->cp.dpx || (full && !r->cp.dpf) || *d >= r->dp || *d == r->replica || from != peer(r, *d) ||
      h->dtype != PW_DTYPE_F32 || what < PW_DPX_RS || what > PW_DPX_FAG || what == PW_DPX_NORM)
    return pw_err_set(err, PW_EPROTO, "frame", "data-parallel frame (value %u) for stage %u from rank %d does not fit",
                      h->value, h->stage, from);
  *x = full ? &r->cp.dpf[*li] : &r->cp.dpx[*li];
  size_t hi;
  pw_shard_range((*x)->n, r->dp, what == PW_DPX_RS || what == PW_DPX_FRS ? r->replica : *d, lo, &hi);
  int n_chunks = pw_chunk_count(hi - *lo, r->cp.dp_chunk);
  if (c >= n_chunks || h->payload_len != chunk_len(hi - *lo, r->cp.dp_chunk, c) * sizeof(float) ||
      ((what == PW_DPX_GM || what == PW_DPX_GV) && (r->replica != 0 || !pw_dpx_zero(r))) ||
      (what == PW_DPX_RS && pw_dpx_zero(r) == 2)) /* no step-end reduce-scatter of the main gradients: no buffer */
    return pw_err_set(err, PW_EPROTO, "frame", "data-parallel chunk %d (value %u, %llu bytes) of stage %u does not fit",
                      c, h->value, (unsigned long long)h->payload_len, h->stage);
  *off = (size_t)c * r->cp.dp_chunk;
  return 0;
}

int pw_dpx_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  int what = (int)(h->value & 15), li, d;
  size_t lo, off;
  pw_dpx *x;
  *dst = NULL;
  if (what == PW_GRADRS_PIECE) return pw_gradrs_dest(r, from, h, dst, err);
  if ((int)h->step != r->sh.step && (int)h->step != r->sh.step + 1)
    return pw_err_set(err, PW_EPROTO, "frame", "data-parallel frame for step %u while at step %d", h->step, r->sh.step);
  if (what == PW_DPX_NORM) {
    if (h->payload_len != 8 || h->dtype != PW_DTYPE_U8 || !r->cp.dpx || h->microbatch >= (uint32_t)r->dp ||
        (int)h->microbatch == r->replica || from != peer(r, (int)h->microbatch))
      return pw_err_set(err, PW_EPROTO, "frame", "shard norm from rank %d does not fit", from);
    return 0; /* the reader's buffer */
  }
  int rc = chunk_fits(r, from, h, &x, &li, &d, &lo, &off, err);
  if (rc) return rc;
  switch (what) {
    case PW_DPX_RS:
    case PW_DPX_FRS: *dst = x->rx + (size_t)slot_of(r, d) * x->smax + off; return 0;
    case PW_DPX_AG:
    case PW_DPX_FAG:
      /* zero > 0's parameters go through a chunk buffer (pw_dpx_frame) */
      *dst = what == PW_DPX_AG && pw_dpx_zero(r) ? x->ag + (size_t)slot_of(r, d) * r->cp.dp_chunk : x->buf + lo + off;
      return 0;
    default: /* GM, GV */
      if (whole_state(r, x)) return pw_err_set(err, PW_ENOMEM, "frame", "out of memory gathering optimizer state");
      *dst = (what == PW_DPX_GM ? x->gm : x->gv) + lo + off;
      return 0;
  }
}

int pw_dpx_frame(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  int what = (int)(h->value & 15), step = (int)h->step, li, d;
  if (what == PW_GRADRS_PIECE) return pw_gradrs_frame(r, from, h, err);
  if (what == PW_DPX_NORM) {
    double v;
    memcpy(&v, payload, 8);
    r->cp.dp_norm[(step & 1) * r->dp + (int)h->microbatch] = v;
    r->cp.dp_norm_step[(step & 1) * r->dp + (int)h->microbatch] = step;
    return 0;
  }
  size_t lo, off;
  pw_dpx *x;
  int rc = chunk_fits(r, from, h, &x, &li, &d, &lo, &off, err);
  if (rc) return rc;
  int c = (int)(h->value >> 4);
  switch (what) {
    case PW_DPX_RS:
    case PW_DPX_FRS:
      if (x->rs_step[c] != step) x->rs_step[c] = step, x->rs_got[c] = 0;
      x->rs_got[c]++;
      return 0;
    case PW_DPX_AG:
    case PW_DPX_FAG:
      if (what == PW_DPX_AG && pw_dpx_zero(r)) /* into the parameters now: d's next frame reuses the buffer */
        params_range(r->ls[li].prog, lo + off, h->payload_len / sizeof(float),
                     x->ag + (size_t)slot_of(r, d) * r->cp.dp_chunk, 1);
      if (x->ag_step != step) x->ag_step = step, x->ag_got = 0;
      x->ag_got++;
      return 0;
    default:
      if (x->g_step != step) x->g_step = step, x->g_got = 0;
      x->g_got++;
      return 0;
  }
}
