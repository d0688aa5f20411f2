/* tpx: the tensor-parallel all-reduces of tpx.h over real frames, and the
 * canonical programs of checkpoints. Never sums out of member order:
 * pw_reduce_ordered does the adding. */
#include "tpx.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "dpx.h"
#include "log.h"
#include "optim.h"
#include "tp.h"

static int member(const pw_tpx *x, int t) { return x->cx->rank - x->cx->tp_rank + t; }

static int slot_of(const pw_tpx *x, int t) { return t - (t > x->cx->tp_rank); }

/* ---- buffers ---------------------------------------------------------------- */

/* The largest all-reduce: a float value of a microbatch (the activations,
 * their gradients; the cross-entropy's 2 per row are fewer). */
static size_t max_floats(const pw_tpx *x) {
  const pw_rctx *c = x->cx;
  size_t n = 1;
  for (int v = 0; v < c->model->n_values; v++) {
    size_t b = pw_value_bytes(&c->model->values[v], c->mb_size) / sizeof(float);
    if (b > n) n = b;
  }
  return n;
}

int pw_tpx_init(pw_tpx *x, const pw_rctx *cx) {
  const pw_rctx *c = cx;
  x->cx = cx;
  if (c->tp < 2) return 0;
  x->smax = pw_shard_max(max_floats(x), c->tp);
  for (int p = 0; p < 2; p++) {
    x->rx[p] = pw_alloc_floats((size_t)(c->tp - 1) * x->smax);
    x->rx_len[p] = calloc((size_t)c->tp, sizeof(uint32_t));
    x->rs_call[p] = UINT32_MAX;
    if (!x->rx[p] || !x->rx_len[p]) return PW_ENOMEM;
  }
  x->out = pw_alloc_floats(x->smax);
  return x->out ? 0 : PW_ENOMEM;
}

void pw_tpx_close(pw_tpx *x) {
  if (x->cx) pw_tpx_canon_free(x);
  for (int p = 0; p < 2; p++) free(x->rx[p]), free(x->rx_len[p]);
  free(x->out);
  free(x->iv);
  free(x->kinds);
  pw_model_free(&x->canon_model);
  memset(x, 0, sizeof *x);
}

/* ---- the all-reduce ------------------------------------------------------------ */

static int send_shard(pw_tpx *x, int t, int what, const float *src, size_t n, pw_err *err) {
  const pw_rctx *c = x->cx;
  pw_frame_hdr h;
  int rc = pw_frame_hdr_init_vec(&h, PW_FRAME_TP, c->job, x->call, (uint32_t)c->tp_rank, 0, (uint32_t)what,
                                 PW_DTYPE_F32, n);
  if (rc)
    return pw_err_set(err, rc, "tensor parallel", "no frame header for a %zu-float shard: %s", n, pw_strerror(rc));
  x->bytes += n * sizeof(float);
  return c->send(c->run, member(x, t), &h, src, NULL);
}

static int rs_ready(void *arg) {
  const pw_tpx *x = arg;
  const pw_rctx *c = x->cx;
  int p = x->call & 1;
  return x->rs_call[p] == x->call && x->rs_got[p] == c->tp - 1;
}

static int ag_ready(void *arg) {
  const pw_tpx *x = arg;
  return x->ag_got >= x->ag_want;
}

/* out[i] = the largest of in[0][i], ..., in[k-1][i] (out may be one of them). */
static void max_ordered(float *out, const float *const *in, int k, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float m = in[0][i];
    for (int j = 1; j < k; j++) m = fmaxf(m, in[j][i]);
    out[i] = m;
  }
}

static int allreduce(pw_tpx *x, float *buf, size_t n, int op, pw_err *err);

/* A traced step's all-reduce [t0, t1) for its timeline; one that starts
 * within 10 us of the last one's end extends it (a few per layer, else). */
static void trace_span(pw_tpx *x, double t0, double t1) {
  const pw_rctx *c = x->cx;
  if (c->cfg->trace_every <= 0 || (*c->step) % c->cfg->trace_every || (*c->eval)) return;
  t0 -= (*c->t_step0), t1 -= (*c->t_step0);
  if (x->n_iv && t0 - x->iv[2 * x->n_iv - 1] < 1e-5) {
    x->iv[2 * x->n_iv - 1] = t1;
    return;
  }
  if (x->n_iv == x->cap_iv) {
    int cap = x->cap_iv ? 2 * x->cap_iv : 64;
    double *iv = cap <= 1 << 16 ? realloc(x->iv, sizeof *iv * 2 * (size_t)cap) : NULL;
    if (!iv) return; /* a sample: left out */
    x->iv = iv, x->cap_iv = cap;
  }
  x->iv[2 * x->n_iv] = t0, x->iv[2 * x->n_iv + 1] = t1;
  x->n_iv++;
}

void pw_tpx_spans(pw_tpx *x, json_t *acts, int stage) {
  for (int i = 0; x && acts && i < x->n_iv; i++)
    json_array_append_new(acts, json_pack("[s, i, i, f, f]", "T", 0, stage, x->iv[2 * i], x->iv[2 * i + 1]));
  if (x) x->n_iv = 0;
}

int pw_tpx_allreduce(void *ctx, float *buf, size_t n, int op, pw_err *err) {
  pw_tpx *x = ctx;
  double t0 = pw_now();
  uint32_t call = x->call;
  pw_err e = {0};
  int rc = allreduce(x, buf, n, op, &e);
  if (rc && !e.code) /* a send or the wait: what failed there is recorded already (pw_exec_fail) */
    pw_err_set(&e, rc, "tensor parallel", "all-reduce call %u of %zu floats: %s", call, n, pw_strerror(rc));
  if (rc && err) *err = e;
  double t1 = pw_now();
  x->seconds += t1 - t0;
  trace_span(x, t0, t1);
  return rc;
}

static int allreduce(pw_tpx *x, float *buf, size_t n, int op, pw_err *err) {
  const pw_rctx *c = x->cx;
  int tp = c->tp, p = x->call & 1, rc = 0;
  if (pw_shard_max(n, tp) > x->smax)
    return pw_err_set(err, PW_EINTERNAL, "tensor parallel", "an all-reduce of %zu floats: more than planned", n);
  x->buf = buf, x->n = n, x->ag_got = 0;
  pw_shard_range(n, tp, c->tp_rank, &x->lo, &x->hi);
  for (int t = 0; t < tp && !rc; t++) {
    size_t lo, hi;
    pw_shard_range(n, tp, t, &lo, &hi);
    if (t != c->tp_rank && hi > lo) rc = send_shard(x, t, PW_TPX_RS, buf + lo, hi - lo, err);
  }
  size_t mine = x->hi - x->lo;
  if (!rc && mine) rc = c->wait(c->run, rs_ready, x);
  if (rc) return rc;
  const float *in[PW_DPX_MAX];
  for (int t = 0; t < tp; t++) {
    if (t != c->tp_rank && mine && x->rx_len[p][t] != mine * sizeof(float))
      return pw_err_set(err, PW_EPROTO, "tensor parallel", "call %u: %u bytes of our shard from rank %d, expected %zu",
                        x->call, x->rx_len[p][t], member(x, t), mine * sizeof(float));
    in[t] = t == c->tp_rank ? buf + x->lo : x->rx[p] + (size_t)slot_of(x, t) * x->smax;
  }
  if (op == PW_PROG_MAX)
    max_ordered(x->out, in, tp, mine);
  else
    pw_reduce_ordered(x->out, in, tp, mine);
  memcpy(buf + x->lo, x->out, mine * sizeof(float));
  x->rs_got[p] = 0;
  for (int t = 0; t < tp && !rc; t++)
    if (t != c->tp_rank && mine) rc = send_shard(x, t, PW_TPX_AG, x->out, mine, err);
  /* every other member's non-empty shard comes back summed */
  x->ag_want = 0;
  for (int t = 0; t < tp; t++) {
    size_t lo, hi;
    pw_shard_range(n, tp, t, &lo, &hi);
    x->ag_want += t != c->tp_rank && hi > lo;
  }
  if (!rc) rc = c->wait(c->run, ag_ready, x);
  x->buf = NULL;
  x->call++;
  return rc;
}

/* ---- frames (compute thread, sh.mu held) ----------------------------------------- */

int pw_tpx_dest(pw_tpx *x, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  const pw_rctx *c = x->cx;
  int t = (int)h->microbatch;
  *dst = NULL;
  if (!x || t >= c->tp || t == c->tp_rank || from != member(x, t) || h->dtype != PW_DTYPE_F32)
    return pw_err_set(err, PW_EPROTO, "frame", "tensor-parallel frame (value %u) from rank %d does not fit", h->value, from);
  if (h->value == PW_TPX_RS) {
    if (h->step != x->call && h->step != x->call + 1)
      return pw_err_set(err, PW_EPROTO, "frame", "tensor-parallel call %u from rank %d while at call %u", h->step, from,
                        x->call);
    if (h->payload_len > x->smax * sizeof(float))
      return pw_err_set(err, PW_EPROTO, "frame", "tensor-parallel shard of %llu bytes: more than %zu",
                        (unsigned long long)h->payload_len, x->smax * sizeof(float));
    *dst = x->rx[h->step & 1] + (size_t)slot_of(x, t) * x->smax;
    return 0;
  }
  size_t lo, hi;
  if (!x->buf || h->step != x->call)
    return pw_err_set(err, PW_EPROTO, "frame", "tensor-parallel sum of call %u from rank %d while at call %u", h->step,
                      from, x->call);
  pw_shard_range(x->n, c->tp, t, &lo, &hi);
  if (h->payload_len != (hi - lo) * sizeof(float))
    return pw_err_set(err, PW_EPROTO, "frame", "tensor-parallel sum of %llu bytes from rank %d, expected %zu",
                      (unsigned long long)h->payload_len, from, (hi - lo) * sizeof(float));
  *dst = x->buf + lo;
  return 0;
}

int pw_tpx_frame(pw_tpx *x, int from, const pw_frame_hdr *h, pw_err *err) {
  if (h->value == PW_TPX_AG) {
    x->ag_got++;
    return 0;
  }
  int p = h->step & 1;
  if (x->rs_call[p] != h->step) x->rs_call[p] = h->step, x->rs_got[p] = 0;
  x->rs_got[p]++;
  x->rx_len[p][h->microbatch] = (uint32_t)h->payload_len;
  return 0;
}

/* ---- norms ------------------------------------------------------------------------ */

double pw_tpx_sqnorm(const pw_tpx *x, pw_prog *p, const int *skip, int ns, int split) {
  int n = pw_prog_n_params(p), k = 0;
  int *sk = malloc(sizeof(int) * (size_t)(ns + n + 1));
  if (!sk) return NAN;
  for (int i = 0; i < ns; i++) sk[k++] = skip[i];
  for (int i = 0; i < n; i++) {
    int id = pw_prog_param_at(p, i)->model_index;
    if ((x->kinds[id] != PW_TP_REPLICATED) != split) sk[k++] = id;
  }
  double s = pw_grad_sqnorm(p, sk, k);
  free(sk);
  return s;
}

/* ---- canonical programs --------------------------------------------------------- */

int pw_tpx_canon(pw_tpx *x, pw_err *err) {
  const pw_rctx *c = x->cx;
  if (!(x->canon = calloc((size_t)c->n_ls, sizeof *x->canon))) return pw_err_set(err, PW_ENOMEM, "tp", "out of memory");
  for (int li = 0; li < c->n_ls; li++) {
    const pw_prog_config *pc = pw_prog_config_of(c->ls[li].prog);
    pw_prog_config cfg = {.layer_lo = pc->layer_lo, .layer_hi = pc->layer_hi, .mb_size = pc->mb_size,
                          .batch_size = pc->batch_size, .max_slots = 1};
    int rc = pw_prog_create(&x->canon_model, &cfg, &x->canon[li], err);
    if (rc) return rc;
  }
  return 0;
}

void pw_tpx_canon_free(pw_tpx *x) {
  const pw_rctx *c = x->cx;
  for (int li = 0; x->canon && li < c->n_ls; li++) pw_prog_free(x->canon[li]);
  free(x->canon);
  x->canon = NULL;
}

/* The three tensors of a parameter: data, m, v (NULL when it has none). */
static float *part_of(pw_prog_param *pp, int k) { return k == 0 ? pp->data : k == 1 ? pp->m : pp->v; }

int pw_tpx_gather(pw_tpx *x) {
  const pw_rctx *c = x->cx;
  for (int li = 0; li < c->n_ls; li++) {
    pw_prog *p = c->ls[li].prog, *cn = x->canon[li];
    for (int i = 0; i < pw_prog_n_params(p); i++) {
      pw_prog_param *pp = pw_prog_param_at(p, i), *cp = pw_prog_param_at(cn, i);
      const pw_param *meta = cp->meta;
      pw_tp_kind k = (pw_tp_kind)x->kinds[pp->model_index];
      for (int part = 0; part < 3; part++) {
        float *src = part_of(pp, part), *dst = part_of(cp, part);
        if (!src || !dst) continue;
        if (k == PW_TP_REPLICATED) { /* the same bits on every member */
          memcpy(dst, src, meta->numel * sizeof(float));
          continue;
        }
        memset(dst, 0, meta->numel * sizeof(float));
        pw_tp_unshard(dst, src, meta, k, c->tp, c->tp_rank);
        size_t step = x->smax * (size_t)c->tp; /* no call over what the buffers hold */
        for (size_t o = 0; o < meta->numel; o += step) {
          pw_err err = {0};
          int rc = pw_tpx_allreduce(x, dst + o, meta->numel - o < step ? meta->numel - o : step, PW_PROG_SUM, &err);
          if (rc) return pw_rctx_fail(c, rc, &err, "gathering %s", meta->name);
        }
      }
    }
  }
  return 0;
}

void pw_tpx_scatter(pw_tpx *x) {
  const pw_rctx *c = x->cx;
  for (int li = 0; li < c->n_ls; li++) {
    pw_prog *p = c->ls[li].prog, *cn = x->canon[li];
    for (int i = 0; i < pw_prog_n_params(p); i++) {
      pw_prog_param *pp = pw_prog_param_at(p, i), *cp = pw_prog_param_at(cn, i);
      for (int part = 0; part < 3; part++)
        if (part_of(pp, part) && part_of(cp, part))
          pw_tp_shard(part_of(pp, part), part_of(cp, part), cp->meta, (pw_tp_kind)x->kinds[pp->model_index], c->tp,
                      c->tp_rank);
    }
  }
}

/* ---- setup and loads ------------------------------------------------------------ */

int pw_tpx_setup(pw_tpx *x, pw_runcfg *cfg, pw_err *err) {
  pw_slice *sl = &cfg->sl;
  x->canon_model = sl->model;
  memset(&sl->model, 0, sizeof sl->model);
  if (sl->train.snapshot_every > 0 && sl->tp_rank == 0)
    pw_info("tensor parallel (tp %d): no in-memory snapshots (train.snapshot_every %d ignored); a lost worker resumes "
            "from the last checkpoint", sl->tp, sl->train.snapshot_every);
  sl->train.snapshot_every = 0;
  if (!(x->kinds = malloc((size_t)x->canon_model.n_params + 1)) || pw_tp_model(&x->canon_model, sl->tp, &sl->model, x->kinds))
    return pw_err_set(err, PW_ENOMEM, "assign", "out of memory for the tensor-parallel graph");
  return 0;
}

int pw_tpx_load(pw_tpx *x, int (*load)(void *arg, pw_err *err), void *arg, pw_err *err) {
  const pw_rctx *c = x->cx;
  int rc = pw_tpx_canon(x, err);
  pw_prog **own = malloc(sizeof *own * (size_t)(c->n_ls + 1));
  if (!rc && !own) rc = pw_err_set(err, PW_ENOMEM, "tp", "out of memory");
  if (!rc) {
    for (int li = 0; li < c->n_ls; li++) own[li] = c->ls[li].prog, c->ls[li].prog = x->canon[li];
    rc = load(arg, err);
    for (int li = 0; li < c->n_ls; li++) c->ls[li].prog = own[li];
  }
  if (!rc) pw_tpx_scatter(x);
  free(own);
  pw_tpx_canon_free(x);
  return rc;
}
