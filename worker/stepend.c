/* stepend: what a rank does between its last action of a step and the next
 * step — the same arithmetic as the single-process trainer, spread over
 * ranks:
 *   1. DP: data-parallel replicas of a stage exchange gradient arenas and
 *      each sums them in replica order (so every replica gets the same bits);
 *   2. TIED: holders of a shared parameter (tied embeddings) exchange its
 *      gradient and each sums the copies in stage order;
 *   3. NORM: every pipeline rank sends its partial squared gradient norm to
 *      its replica's pipeline rank 0, which sums them in rank order and
 *      sends the total back (this is also the step's barrier);
 *   4. UPDATE: clip coefficient and learning rate, each rank's own
 *      optimizer step, checkpoints, the step report.
 * Frames of a phase may arrive before this rank reaches it; each buffer is
 * tagged with its step, and DP arenas alternate by step parity, so an early
 * frame never overwrites one still to be used. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt.h"
#include "log.h"
#include "optim.h"
#include "worker.h"

enum { RV_DP = 0, RV_NORM_PART = 1, RV_NORM_TOTAL = 2 };

static void phase_tied(pw_run *r);
static void phase_norm(pw_run *r);
static void phase_update(pw_run *r);

static int global_rank(const pw_run *r, int stage) { return r->replica * r->pp + r->rank_of_stage[stage]; }

static int send_or_fail(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, void *owned) {
  pw_link *l = to >= 0 && to < r->n_ranks ? r->out[to] : NULL;
  int rc = l ? pw_net_send(l, r, h, payload, -1, -1, owned) : PW_EPEER;
  if (rc) {
    if (!l) free(owned);
    pw_run_fail(r, "cannot send %s to rank %d", pw_frame_kind_name(h->kind), to);
  }
  return rc;
}

/* ---- buffers -------------------------------------------------------------- */

static int ensure_dp_bufs(pw_run *r) {
  for (int li = 0; li < r->n_ls; li++) {
    pw_lstage *ls = &r->ls[li];
    if (ls->dp_buf) continue;
    size_t n = pw_prog_grad_numel(ls->prog);
    ls->dp_buf = calloc((size_t)(2 * r->dp), sizeof(float *));
    ls->dp_step = malloc(sizeof(int) * (size_t)(2 * r->dp));
    if (!ls->dp_buf || !ls->dp_step) return PW_ENOMEM;
    for (int k = 0; k < 2 * r->dp; k++) {
      ls->dp_step[k] = -1;
      if (!(ls->dp_buf[k] = calloc(n ? n : 1, sizeof(float)))) return PW_ENOMEM;
    }
  }
  return 0;
}

/* Tied buffers: [k*8 + j] receives holder j's gradient of shared param k;
 * [k*8 + 4 + j] is the copy local holder j sends. */
static int ensure_tied_bufs(pw_run *r) {
  if (r->tied_buf || r->part.n_shared == 0) return 0;
  r->tied_buf = calloc((size_t)r->part.n_shared * 8, sizeof(float *));
  if (!r->tied_buf) return PW_ENOMEM;
  for (int k = 0; k < r->part.n_shared; k++)
    for (int j = 0; j < 8; j++)
      if (!(r->tied_buf[k * 8 + j] = calloc(r->model.params[r->part.shared[k].param].numel, sizeof(float))))
        return PW_ENOMEM;
  return 0;
}

static pw_prog_param *find_param(pw_prog *p, int model_index) {
  for (int i = 0; i < pw_prog_n_params(p); i++)
    if (pw_prog_param_at(p, i)->model_index == model_index) return pw_prog_param_at(p, i);
  return NULL;
}

/* ---- 1. data-parallel all-reduce ----------------------------------------- */

static int dp_complete(pw_run *r) {
  int par = r->step & 1;
  for (int li = 0; li < r->n_ls; li++)
    for (int d = 0; d < r->dp; d++)
      if (d != r->replica && r->ls[li].dp_step[par * r->dp + d] != r->step) return 0;
  return 1;
}

static void dp_reduce(pw_run *r) {
  int par = r->step & 1;
  for (int li = 0; li < r->n_ls; li++) {
    pw_lstage *ls = &r->ls[li];
    float *g = pw_prog_grads(ls->prog);
    size_t n = pw_prog_grad_numel(ls->prog);
    for (size_t i = 0; i < n; i++) {
      float acc = 0;
      for (int d = 0; d < r->dp; d++) acc += d == r->replica ? g[i] : ls->dp_buf[par * r->dp + d][i];
      g[i] = acc;
    }
  }
}

void pw_stepend_begin(pw_run *r) {
  if (r->spec.mode == PW_MODE_FORWARD) {
    phase_norm(r);
    return;
  }
  if (r->dp == 1) {
    phase_tied(r);
    return;
  }
  r->phase = PW_RUN_DP;
  if (ensure_dp_bufs(r)) {
    pw_run_fail(r, "out of memory for gradient all-reduce buffers");
    return;
  }
  int par = r->step & 1;
  for (int li = 0; li < r->n_ls; li++) {
    pw_lstage *ls = &r->ls[li];
    size_t n = pw_prog_grad_numel(ls->prog);
    float *copy = ls->dp_buf[par * r->dp + r->replica]; /* our own slot holds what we send */
    memcpy(copy, pw_prog_grads(ls->prog), n * sizeof(float));
    for (int d = 0; d < r->dp; d++) {
      if (d == r->replica) continue;
      pw_frame_hdr h;
      uint32_t dims[1] = {(uint32_t)n};
      pw_frame_hdr_init(&h, PW_FRAME_REDUCE, r->job, (uint32_t)r->step, (uint32_t)r->replica, (uint32_t)ls->stage,
                        RV_DP, PW_DTYPE_F32, 1, dims);
      if (send_or_fail(r, d * r->pp + r->prank, &h, copy, NULL)) return;
    }
  }
  if (dp_complete(r)) {
    dp_reduce(r);
    phase_tied(r);
  }
}

/* ---- 2. tied parameters --------------------------------------------------- */

static int holder_index(const pw_shared_param *sp, int stage) {
  for (int j = 0; j < sp->n_holders; j++)
    if (sp->holders[j] == stage) return j;
  return -1;
}

static int local_holders(const pw_run *r, const pw_shared_param *sp) {
  int n = 0;
  for (int j = 0; j < sp->n_holders; j++) n += r->lidx_of_stage[sp->holders[j]] >= 0;
  return n;
}

static void tied_reduce(pw_run *r) {
  for (int k = 0; k < r->part.n_shared; k++) {
    const pw_shared_param *sp = &r->part.shared[k];
    if (!local_holders(r, sp)) continue;
    size_t n = r->model.params[sp->param].numel;
    float *sum = r->tied_buf[k * 8 + 7]; /* scratch: the result */
    memset(sum, 0, n * sizeof(float));
    /* holders in ascending stage order */
    int order[4], no = sp->n_holders;
    for (int j = 0; j < no; j++) order[j] = j;
    for (int a = 0; a < no; a++)
      for (int b = a + 1; b < no; b++)
        if (sp->holders[order[b]] < sp->holders[order[a]]) {
          int t = order[a];
          order[a] = order[b];
          order[b] = t;
        }
    for (int o = 0; o < no; o++) {
      int j = order[o], li = r->lidx_of_stage[sp->holders[j]];
      const float *g = li >= 0 ? find_param(r->ls[li].prog, sp->param)->grad : r->tied_buf[k * 8 + j];
      for (size_t i = 0; i < n; i++) sum[i] += g[i];
    }
    for (int j = 0; j < no; j++) {
      int li = r->lidx_of_stage[sp->holders[j]];
      if (li >= 0) memcpy(find_param(r->ls[li].prog, sp->param)->grad, sum, n * sizeof(float));
    }
  }
}

static int tied_complete(pw_run *r) { return r->tied_got >= r->tied_needed; }

static void phase_tied(pw_run *r) {
  r->phase = PW_RUN_TIED;
  for (int li = 0; li < r->n_ls; li++) pw_prog_grads_finalize(r->ls[li].prog);
  if (r->part.n_shared == 0) {
    phase_norm(r);
    return;
  }
  if (ensure_tied_bufs(r)) {
    pw_run_fail(r, "out of memory for tied-parameter buffers");
    return;
  }
  int needed = 0;
  for (int k = 0; k < r->part.n_shared; k++) {
    const pw_shared_param *sp = &r->part.shared[k];
    if (!local_holders(r, sp)) continue;
    size_t n = r->model.params[sp->param].numel;
    for (int j = 0; j < sp->n_holders; j++) {
      int hs = sp->holders[j];
      if (r->lidx_of_stage[hs] >= 0) continue;
      needed++; /* we wait for remote holder j's gradient */
    }
    /* send each local holder's gradient once to every rank holding a remote copy */
    for (int j = 0; j < sp->n_holders; j++) {
      int li = r->lidx_of_stage[sp->holders[j]];
      if (li < 0) continue;
      float *copy = r->tied_buf[k * 8 + 4 + j];
      memcpy(copy, find_param(r->ls[li].prog, sp->param)->grad, n * sizeof(float));
      int sent_to[4], ns = 0;
      for (int j2 = 0; j2 < sp->n_holders; j2++) {
        int hs = sp->holders[j2], dst = global_rank(r, hs), dup = 0;
        if (r->lidx_of_stage[hs] >= 0) continue;
        for (int q = 0; q < ns; q++) dup |= sent_to[q] == dst;
        if (dup) continue;
        sent_to[ns++] = dst;
        pw_frame_hdr h;
        uint32_t dims[1] = {(uint32_t)n};
        pw_frame_hdr_init(&h, PW_FRAME_TIED, r->job, (uint32_t)r->step, (uint32_t)sp->holders[j], (uint32_t)hs,
                          (uint32_t)sp->param, PW_DTYPE_F32, 1, dims);
        if (send_or_fail(r, dst, &h, copy, NULL)) return;
      }
    }
  }
  r->tied_needed = needed;
  if (tied_complete(r)) {
    tied_reduce(r);
    r->tied_got = 0;
    phase_norm(r);
  }
}

/* ---- 3. global norm ------------------------------------------------------- */

static double local_sqnorm(pw_run *r, pw_lstage *ls) {
  int skip[16], ns = 0;
  for (int k = 0; k < r->part.n_shared && ns < 16; k++) {
    const pw_shared_param *sp = &r->part.shared[k];
    int lowest = sp->holders[0];
    for (int j = 1; j < sp->n_holders; j++)
      if (sp->holders[j] < lowest) lowest = sp->holders[j];
    if (holder_index(sp, ls->stage) >= 0 && ls->stage != lowest) skip[ns++] = sp->param;
  }
  return pw_grad_sqnorm(ls->prog, skip, ns);
}

static void norm_send_total(pw_run *r) {
  double total = 0;
  for (int k = 0; k < r->pp; k++) total += r->norm_parts[k];
  r->norm_total = total;
  r->norm_total_step = r->step;
  for (int k = 1; k < r->pp; k++) {
    pw_frame_hdr h;
    uint32_t dims[1] = {8};
    double *payload = malloc(sizeof(double));
    if (!payload) {
      pw_run_fail(r, "out of memory");
      return;
    }
    *payload = total;
    pw_frame_hdr_init(&h, PW_FRAME_REDUCE, r->job, (uint32_t)r->step, 0, 0, RV_NORM_TOTAL, PW_DTYPE_U8, 1, dims);
    if (send_or_fail(r, r->replica * r->pp + k, &h, payload, payload)) return;
  }
}

static int norm_parts_complete(pw_run *r) {
  for (int k = 0; k < r->pp; k++)
    if (r->norm_parts_step[k] != r->step) return 0;
  return 1;
}

static void phase_norm(pw_run *r) {
  r->phase = PW_RUN_NORM;
  double part = 0;
  if (r->spec.mode != PW_MODE_FORWARD)
    for (int li = 0; li < r->n_ls; li++) part += local_sqnorm(r, &r->ls[li]);
  if (r->prank == 0) {
    r->norm_parts[0] = part;
    r->norm_parts_step[0] = r->step;
    if (norm_parts_complete(r)) {
      norm_send_total(r);
      if (!r->closing) phase_update(r);
    }
    return;
  }
  pw_frame_hdr h;
  uint32_t dims[1] = {8};
  double *payload = malloc(sizeof(double));
  if (!payload) {
    pw_run_fail(r, "out of memory");
    return;
  }
  *payload = part;
  pw_frame_hdr_init(&h, PW_FRAME_REDUCE, r->job, (uint32_t)r->step, (uint32_t)r->prank, 0, RV_NORM_PART, PW_DTYPE_U8,
                    1, dims);
  if (send_or_fail(r, r->replica * r->pp, &h, payload, payload)) return;
  if (r->norm_total_step == r->step) phase_update(r);
}

/* ---- frames --------------------------------------------------------------- */

int pw_stepend_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  *dst = NULL;
  /* A replica or a tied holder may be one step ahead of us, never more. */
  if ((int)h->step != r->step && (int)h->step != r->step + 1)
    return pw_err_set(err, PW_EPROTO, "frame", "%s for step %u while at step %d", pw_frame_kind_name(h->kind), h->step,
                      r->step);
  if (h->kind == PW_FRAME_TIED) {
    int k = -1;
    for (int i = 0; i < r->part.n_shared; i++)
      if (r->part.shared[i].param == (int)h->value) k = i;
    if (k < 0 || (int)h->step != r->step) return pw_err_set(err, PW_EPROTO, "frame", "unexpected TIED for value %u", h->value);
    const pw_shared_param *sp = &r->part.shared[k];
    int j = holder_index(sp, (int)h->microbatch);
    size_t n = r->model.params[sp->param].numel;
    if (j < 0 || from != global_rank(r, sp->holders[j]) || h->payload_len != n * 4 || h->dtype != PW_DTYPE_F32)
      return pw_err_set(err, PW_EPROTO, "frame", "TIED for parameter %u from rank %d does not fit", h->value, from);
    if (ensure_tied_bufs(r)) return pw_err_set(err, PW_ENOMEM, "frame", "out of memory");
    *dst = r->tied_buf[k * 8 + j];
    return 0;
  }
  switch (h->value) {
    case RV_DP: {
      int li = h->stage < (uint32_t)r->S ? r->lidx_of_stage[h->stage] : -1;
      int d = (int)h->microbatch;
      if (li < 0 || d >= r->dp || d == r->replica || from != d * r->pp + r->prank)
        return pw_err_set(err, PW_EPROTO, "frame", "gradient all-reduce frame for stage %u from rank %d does not fit",
                          h->stage, from);
      if (h->dtype != PW_DTYPE_F32 || h->payload_len != pw_prog_grad_numel(r->ls[li].prog) * 4)
        return pw_err_set(err, PW_EPROTO, "frame", "gradient arena of %llu bytes, expected %zu",
                          (unsigned long long)h->payload_len, pw_prog_grad_numel(r->ls[li].prog) * 4);
      if (ensure_dp_bufs(r)) return pw_err_set(err, PW_ENOMEM, "frame", "out of memory");
      *dst = r->ls[li].dp_buf[(h->step & 1) * r->dp + d];
      return 0;
    }
    case RV_NORM_PART:
    case RV_NORM_TOTAL:
      if (h->payload_len != 8 || h->dtype != PW_DTYPE_U8 || (int)h->step != r->step)
        return pw_err_set(err, PW_EPROTO, "frame", "bad norm reduction frame");
      if (h->value == RV_NORM_PART && (r->prank != 0 || h->microbatch >= (uint32_t)r->pp ||
                                       from != r->replica * r->pp + (int)h->microbatch))
        return pw_err_set(err, PW_EPROTO, "frame", "norm partial from rank %d does not fit", from);
      if (h->value == RV_NORM_TOTAL && from != r->replica * r->pp)
        return pw_err_set(err, PW_EPROTO, "frame", "norm total from rank %d, not our replica's rank 0", from);
      return 0; /* the reader's buffer */
    default: return pw_err_set(err, PW_EPROTO, "frame", "unknown reduction %u", h->value);
  }
}

int pw_stepend_frame(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  if (h->kind == PW_FRAME_TIED) {
    r->tied_got++;
    if (r->phase == PW_RUN_TIED && tied_complete(r)) {
      tied_reduce(r);
      r->tied_got = 0;
      phase_norm(r);
    }
    return 0;
  }
  double v;
  switch (h->value) {
    case RV_DP:
      r->ls[r->lidx_of_stage[h->stage]].dp_step[(h->step & 1) * r->dp + (int)h->microbatch] = (int)h->step;
      if (r->phase == PW_RUN_DP && (int)h->step == r->step && dp_complete(r)) {
        dp_reduce(r);
        phase_tied(r);
      }
      return 0;
    case RV_NORM_PART:
      memcpy(&v, payload, 8);
      r->norm_parts[h->microbatch] = v;
      r->norm_parts_step[h->microbatch] = (int)h->step;
      if (r->phase == PW_RUN_NORM && norm_parts_complete(r)) {
        norm_send_total(r);
        if (!r->closing) phase_update(r);
      }
      return 0;
    case RV_NORM_TOTAL:
      memcpy(&v, payload, 8);
      r->norm_total = v;
      r->norm_total_step = (int)h->step;
      if (r->phase == PW_RUN_NORM) phase_update(r);
      return 0;
  }
  return pw_err_set(err, PW_EPROTO, "frame", "unknown reduction %u", h->value);
}

/* ---- 4. update ------------------------------------------------------------ */

static int ckpt_due(const pw_run *r) {
  int k = r->step + 1, every = r->spec.train.checkpoint_every;
  return r->replica == 0 && r->spec.mode != PW_MODE_FORWARD && (k == r->steps || (every > 0 && k % every == 0));
}

static void ckpt_path(const pw_run *r, int stage, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/job-%llu/step-%d/stage-%d.safetensors", r->ckpt_dir, (unsigned long long)r->job, r->step + 1,
           stage);
}

static int mkdirs(const char *path) {
  char tmp[1024];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
      *p = '/';
    }
  return 0;
}

static void update_work(uv_work_t *req) {
  pw_run *r = req->data;
  r->work_rc = 0;
  if (r->spec.mode != PW_MODE_FORWARD)
    for (int li = 0; li < r->n_ls; li++) {
      pw_optim_step(r->ls[li].prog, &r->spec.train.optim, r->step + 1, r->lr, r->clip_coef);
      pw_prog_zero_grad(r->ls[li].prog);
    }
  if (ckpt_due(r))
    for (int li = 0; li < r->n_ls && !r->work_rc; li++) {
      char path[1024];
      pw_err err = {0};
      ckpt_path(r, r->ls[li].stage, path, sizeof path);
      mkdirs(path);
      r->work_rc = pw_ckpt_save(r->ls[li].prog, path, r->step + 1, NULL, &err);
      if (r->work_rc) pw_err_str(&err, r->error, sizeof r->error);
    }
}

static void report_step(pw_run *r) {
  double dt = pw_now() - r->t_step0;
  json_t *msg = json_pack("{s:s, s:I, s:i, s:i, s:i, s:f, s:i}", "type", "step", "job", (json_int_t)r->job, "run",
                          r->run_id, "rank", r->rank, "step", r->step, "step_time", dt, "peak_act", r->peak_act);
  int holds_loss = 0;
  for (int li = 0; li < r->n_ls; li++) holds_loss |= pw_prog_has_loss(r->ls[li].prog);
  if (holds_loss && isfinite(r->loss_sum)) {
    json_object_set_new(msg, "loss", json_real(r->loss_sum));
    json_object_set_new(msg, "tokens",
                        json_real((double)r->spec.train.batch_size / r->dp * r->model.seq_len));
  }
  if (r->replica == 0 && r->prank == 0) {
    json_object_set_new(msg, "grad_norm", json_real(sqrt(r->norm_total)));
    json_object_set_new(msg, "lr", json_real(r->lr));
  }
  if (r->trace_every > 0 && r->step % r->trace_every == 0) {
    static const char *const kinds[] = {"F", "B", "I", "W"};
    json_t *acts = json_array();
    for (int i = 0; i < r->n_acts; i++) {
      const pw_timing *t = &r->timings[i];
      json_array_append_new(acts, json_pack("[s, i, i, f, f]", kinds[t->a.kind & 3], t->a.mb, t->a.stage, t->start,
                                            t->end));
    }
    json_object_set_new(msg, "actions", acts);
  }
  pw_ctl_send(r->w, msg);
  if (ckpt_due(r))
    for (int li = 0; li < r->n_ls; li++) {
      char path[1024];
      struct stat sb;
      ckpt_path(r, r->ls[li].stage, path, sizeof path);
      pw_ctl_send(r->w, json_pack("{s:s, s:I, s:i, s:i, s:i, s:i, s:s, s:I}", "type", "checkpoint", "job",
                                  (json_int_t)r->job, "run", r->run_id, "rank", r->rank, "stage", r->ls[li].stage,
                                  "step", r->step + 1, "path", path, "bytes",
                                  (json_int_t)(stat(path, &sb) == 0 ? sb.st_size : 0)));
    }
}

static void after_update(uv_work_t *req, int status) {
  pw_run *r = req->data;
  r->busy = 0;
  if (r->closing) {
    if (r->sends_inflight == 0) pw_run_free(r);
    return;
  }
  if (r->work_rc) {
    pw_run_fail(r, "checkpoint: %s", r->error);
    return;
  }
  report_step(r);
  pw_run_step_complete(r);
}

static void phase_update(pw_run *r) {
  r->phase = PW_RUN_UPDATE;
  double norm = sqrt(r->norm_total);
  r->clip_coef = pw_clip_coef(norm, r->spec.train.grad_clip);
  r->lr = pw_lr_at(&r->spec.train.optim, r->spec.train.steps, r->step);
  r->busy = 1;
  int rc = uv_queue_work(r->w->loop, &r->work, update_work, after_update);
  if (rc) {
    r->busy = 0;
    pw_run_fail(r, "cannot queue the optimizer step: %s", uv_strerror(rc));
  }
}
