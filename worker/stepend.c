/* stepend: what a rank does between its last action of a step and the next
 * step — the same arithmetic as the single-process trainer, spread over
 * ranks:
 *   1. DP: data-parallel replicas of a stage reduce-scatter its gradient
 *      arena, each summing its shard in replica order (so every replica
 *      gets the same bits), and all-gather the sums (dpx.c); with
 *      train.zero > 0 the shards stay and step 4 all-gathers parameters;
 *   2. TIED: holders of a shared parameter (tied embeddings) exchange its
 *      gradient and each sums the copies in stage order;
 *   3. NORM: every pipeline rank sends its partial squared gradient norm to
 *      the other pipeline ranks of its replica, and each sums them in rank
 *      order (the same bits everywhere; one hop, and the step's barrier);
 *   4. UPDATE: clip coefficient and learning rate, each rank's own
 *      optimizer step, checkpoints, the step report.
 * The phases run on the compute thread, which reads what the peers send
 * into the buffers here while it waits (recv.c), tagging each with its
 * step (pw_stepend_dest/_frame).
 * A peer may be one step ahead of us, never more, and its early frames
 * never overwrite one still to be used (dpx.h says why for DP), and a tied
 * or norm frame of the next step can only be sent after this rank's part
 * in the current one. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckptxfer.h"
#include "log.h"
#include "optim.h"
#include "worker.h"

enum { RV_NORM_PART = 1 }; /* the REDUCE values from 2 on are dpx.h's */

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

static pw_prog_param *find_param(pw_prog *p, int model_index) {
  for (int i = 0; i < pw_prog_n_params(p); i++)
    if (pw_prog_param_at(p, i)->model_index == model_index) return pw_prog_param_at(p, i);
  return NULL;
}


/* ---- buffers -------------------------------------------------------------- */

/* What plan.h and collective.h describe (and the planner counts): the
 * data-parallel exchange's buffers (dpx.c); per shared parameter with a
 * local holder one block, wired into holder j's gradient and the sum. */
int pw_stepend_alloc(pw_run *r) {
  int train = r->spec.mode != PW_MODE_FORWARD;
  if (pw_dpx_alloc(r)) return PW_ENOMEM;
  if (r->part.n_shared == 0 || !train) return 0;
  r->cp.tied = calloc((size_t)r->part.n_shared, sizeof *r->cp.tied);
  if (!r->cp.tied) return PW_ENOMEM;
  for (int k = 0; k < r->part.n_shared; k++) {
    const pw_shared_param *sp = &r->part.shared[k];
    if (!local_holders(r, sp)) continue;
    float *block = calloc(pw_tied_floats(&r->model, sp), sizeof(float));
    if (!block) return PW_ENOMEM;
    pw_tied_wire(&r->cp.tied[k], block, &r->model, sp);
    for (int j = 0; j < sp->n_holders; j++) r->cp.tied_needed += r->lidx_of_stage[sp->holders[j]] < 0;
  }
  return 0;
}

void pw_stepend_free(pw_run *r) {
  pw_dpx_free(r);
  if (r->cp.tied)
    for (int k = 0; k < r->part.n_shared; k++) free(r->cp.tied[k].block);
  free(r->cp.tied);
  r->cp.tied = NULL;
}

/* ---- 2. tied parameters --------------------------------------------------- */

static void tied_reduce(pw_run *r) {
  for (int k = 0; k < r->part.n_shared; k++) {
    const pw_shared_param *sp = &r->part.shared[k];
    if (!local_holders(r, sp)) continue;
    size_t n = r->model.params[sp->param].numel;
    float *sum = r->cp.tied[k].sum;
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
      const float *g = li >= 0 ? find_param(r->ls[li].prog, sp->param)->grad : r->cp.tied[k].holder[j];
      for (size_t i = 0; i < n; i++) sum[i] += g[i];
    }
    for (int j = 0; j < no; j++) {
      int li = r->lidx_of_stage[sp->holders[j]];
      if (li >= 0) memcpy(find_param(r->ls[li].prog, sp->param)->grad, sum, n * sizeof(float));
    }
  }
}

static int tied_ready(pw_run *r, const void *arg) { return r->cp.tied_step == r->cp.tag && r->cp.tied_got >= r->cp.tied_needed; }

static int tied_exchange(pw_run *r) {
  for (int k = 0; k < r->part.n_shared; k++) {
    const pw_shared_param *sp = &r->part.shared[k];
    if (!local_holders(r, sp)) continue;
    size_t n = r->model.params[sp->param].numel;
    /* each local holder's gradient, once to every rank holding a remote copy */
    for (int j = 0; j < sp->n_holders; j++) {
      int li = r->lidx_of_stage[sp->holders[j]];
      if (li < 0) continue;
      float *copy = r->cp.tied[k].holder[j];
      memcpy(copy, find_param(r->ls[li].prog, sp->param)->grad, n * sizeof(float));
      int sent_to[4], ns = 0;
      for (int j2 = 0; j2 < sp->n_holders; j2++) {
        int hs = sp->holders[j2], dst = pw_run_global_rank(r, hs), dup = 0;
        if (r->lidx_of_stage[hs] >= 0) continue;
        for (int q = 0; q < ns; q++) dup |= sent_to[q] == dst;
        if (dup) continue;
        sent_to[ns++] = dst;
        pw_frame_hdr h;
        int rc = pw_frame_hdr_init_vec(&h, PW_FRAME_TIED, r->job, (uint32_t)r->cp.tag, (uint32_t)sp->holders[j],
                                       (uint32_t)hs, (uint32_t)sp->param, PW_DTYPE_F32, n);
        if (rc)
          return pw_exec_fail(r, rc, NULL, "no frame header for tied parameter %d (%zu floats): %s", sp->param, n,
                              pw_strerror(rc));
        rc = pw_exec_send(r, dst, &h, copy, -1, -1);
        if (rc) return rc;
      }
    }
  }
  int rc = r->cp.tied_needed ? pw_exec_wait(r, tied_ready, NULL) : 0;
  if (!rc) tied_reduce(r);
  return rc;
}

/* ---- 3. global norm ------------------------------------------------------- */

static double local_sqnorm(pw_run *r, pw_lstage *ls, double *split) {
  int skip[16], ns = 0;
  for (int k = 0; k < r->part.n_shared && ns < 16; k++) {
    const pw_shared_param *sp = &r->part.shared[k];
    int lowest = sp->holders[0];
    for (int j = 1; j < sp->n_holders; j++)
      if (sp->holders[j] < lowest) lowest = sp->holders[j];
    if (holder_index(sp, ls->stage) >= 0 && ls->stage != lowest) skip[ns++] = sp->param;
  }
  if (r->tp > 1) { /* the split part in *split, summed over the group by the caller */
    *split += pw_tpx_sqnorm(r, ls->prog, skip, ns, 1);
    return pw_tpx_sqnorm(r, ls->prog, skip, ns, 0);
  }
  if (!pw_dpx_zero(r)) return pw_grad_sqnorm(ls->prog, skip, ns);
  const pw_dpx *x = &r->cp.dpx[ls - r->ls]; /* our shard only: the rest is summed elsewhere */
  return pw_grad_sqnorm_range(ls->prog, skip, ns, x->lo, x->hi);
}

/* Partials alternate by step parity: a rank that finished the barrier may
 * send the next step's partial before we have read this one (forward-only
 * runs, where rank 0 waits for nobody's activations). */
static int parts_ready(pw_run *r, const void *arg) {
  const int *st = r->cp.norm_parts_step + (r->cp.tag & 1) * r->pp;
  for (int k = 0; k < r->pp; k++)
    if (st[k] != r->cp.tag) return 0;
  return 1;
}

/* The exchange of each pipeline rank's partial `part`; the sum in *total. */
static int global_norm(pw_run *r, double part, double *total) {
  int par = r->cp.tag & 1, rc;
  r->cp.norm_parts[par * r->pp + r->prank] = part;
  r->cp.norm_parts_step[par * r->pp + r->prank] = r->cp.tag;
  r->cp.norm_out[par] = part;
  for (int k = 0; k < r->pp; k++) {
    if (k == r->prank) continue;
    pw_frame_hdr h;
    uint32_t dims[1] = {8};
    if ((rc = pw_frame_hdr_init(&h, PW_FRAME_REDUCE, r->job, (uint32_t)r->cp.tag, (uint32_t)r->prank, 0, RV_NORM_PART,
                                PW_DTYPE_U8, 1, dims)))
      return pw_exec_fail(r, rc, NULL, "no frame header for the norm partial: %s", pw_strerror(rc));
    if ((rc = pw_exec_send(r, pw_run_rank_of(r, r->replica, k), &h, &r->cp.norm_out[par], -1, -1))) return rc;
  }
  if ((rc = pw_exec_wait(r, parts_ready, NULL))) return rc;
  /* Summed in the order of each rank's first stage, not of rank numbers:
   * under a relabeled placement (mesh.placement) the same partials then add
   * in the same order, to the same bits. (A rank without a stage adds 0.) */
  double sum = 0;
  for (int st = 0; st < r->S; st++) {
    int k = r->rank_of_stage[st], first = 1;
    for (int e = 0; e < st && first; e++) first = r->rank_of_stage[e] != k;
    if (first) sum += r->cp.norm_parts[par * r->pp + k];
  }
  *total = sum;
  return 0;
}

/* ---- 4. update -------------------------------------------------------------- */

static int ckpt_step(const pw_run *r, int step) {
  int k = step + 1, every = r->spec.train.checkpoint_every;
  return r->spec.mode != PW_MODE_FORWARD && (k == r->steps || (every > 0 && k % every == 0));
}

static int ckpt_due(const pw_run *r, int step) { return r->replica == 0 && ckpt_step(r, step); }

void pw_stepend_ckpt_path(const pw_run *r, int step, int stage, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/job-%llu/step-%d/stage-%d.safetensors", r->ckpt_dir, (unsigned long long)r->job, step + 1,
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

/* A saved stage checkpoint (model file + optimizer file) to the
 * coordinator, then deleted here: the worker keeps nothing it cannot
 * lose. On the compute thread (never the loop): the next step starts once
 * the coordinator confirmed, so a run's last checkpoint is stored before
 * its rank says done. Without an http_url (no coordinator HTTP API: a run
 * made by a test harness) the files stay where they were written.
 *
 * A coordinator that cannot take it now (busy: 429, 503; its disk full:
 * 507; unreachable) is tried again, waiting 0.2 s, 0.4 s, ... up to 10 s
 * between tries: the run's last checkpoint for as long as the run lives
 * (its rank says done only once it is stored, so a job never ends
 * succeeded without its model), an earlier one for UPLOAD_PATIENCE
 * seconds, then the run goes on and the files stay here (the next
 * checkpoint supersedes it). A refusal (4xx) is final at once. */
#define UPLOAD_PATIENCE 60.0

/* Sleeps s seconds unless the run is aborted meanwhile (1 then). */
static int nap(pw_run *r, double s) {
  for (double t = 0; t < s; t += 0.05) {
    if (atomic_load(&r->sh.abort)) return 1;
    usleep(50000);
  }
  return atomic_load(&r->sh.abort) != 0;
}

static int upload_stage(pw_run *r, int step, int stage, const char *path) {
  if (!r->http_url[0]) return 0;
  char opath[1024], url[256];
  pw_ckpt_optim_path(path, opath, sizeof opath);
  pw_xfer x = {.base_url = r->http_url, .token = r->token, .abort = &r->sh.abort, .upload_token = r->upload_token};
  double t0 = pw_now();
  int last = step == r->steps;
  struct stat sm, so;
  for (int opt = 1; opt >= 0; opt--) { /* the optimizer first, as ckpt.c writes them */
    pw_err err = {0};
    snprintf(url, sizeof url, "/v1/jobs/%llu/runs/%d/checkpoints/%d/stages/%d%s", (unsigned long long)r->job,
             r->run_id, step, stage, opt ? "/optimizer" : "");
    int rc = 0, tries = 0;
    long status = 0;
    double wait = 0.2, began = pw_now();
    for (;;) {
      tries++;
      if (!(rc = pw_xfer_put(&x, url, opt ? opath : path, &status, &err)) || !pw_xfer_retryable(rc, status)) break;
      if (!last && pw_now() - began + wait > UPLOAD_PATIENCE) break;
      if (tries == 1 || (tries & (tries - 1)) == 0) { /* the first, then the 2nd, 4th, 8th... try: said, not flooded */
        char b[700];
        pw_warn("job %llu: checkpoint of step %d, stage %d: try %d not stored, again in %.1f s%s: %s",
                (unsigned long long)r->job, step, stage, tries, wait, last ? " (the run's last: until stored)" : "",
                pw_err_str(&err, b, sizeof b));
      }
      if (nap(r, wait)) {
        rc = pw_err_set(&err, PW_ECANCELED, "checkpoint", "cancelled while the upload waited to be tried again");
        break;
      }
      wait = wait * 2 > 10 ? 10 : wait * 2;
    }
    if (rc == PW_ECANCELED) return pw_exec_fail(r, rc, &err, "checkpoint of step %d, stage %d", step, stage);
    /* refused (a 4xx): the job must not end as if its model were stored.
     * A server that takes no uploads at all (501, 405: a test harness's
     * stub, never a coordinator) keeps them here, as without an http_url. */
    if (rc && last && status != 501 && status != 405)
      return pw_exec_fail(r, rc, &err, "the run's last checkpoint (step %d, stage %d, kept at %s) was refused", step,
                          stage, path);
    if (rc) {
      /* The coordinator did not store it: the run goes on and the files
       * stay here, named in the log and in the checkpoint report; the step
       * is not complete on the coordinator, so a resume takes an earlier
       * one. */
      char b[700];
      pw_warn("job %llu: checkpoint of step %d, stage %d kept at %s: the coordinator did not store it after %d tries "
              "in %.0f s: %s",
              (unsigned long long)r->job, step, stage, path, tries, pw_now() - began, pw_err_str(&err, b, sizeof b));
      return 0;
    }
    if (tries > 1)
      pw_info("job %llu: checkpoint of step %d, stage %d stored at try %d, after %.1f s", (unsigned long long)r->job,
              step, stage, tries, pw_now() - began);
  }
  int sized = stat(path, &sm) == 0 && stat(opath, &so) == 0;
  pw_info("job %llu: checkpoint of step %d, stage %d uploaded (%lld bytes, %.1f ms)", (unsigned long long)r->job, step,
          stage, sized ? (long long)(sm.st_size + so.st_size) : -1LL, (pw_now() - t0) * 1e3);
  for (int opt = 0; opt < 2; opt++) {
    const char *f = opt ? opath : path;
    if (unlink(f) && errno != ENOENT)
      pw_warn("job %llu: cannot remove the uploaded checkpoint %s: %s", (unsigned long long)r->job, f, strerror(errno));
  }
  /* the step's folder, then the job's, once empty (another stage of this
   * rank may still be in the first) */
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", path);
  for (int up = 0; up < 2; up++) {
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) break;
    *slash = 0;
    if (rmdir(dir) && errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT)
      pw_warn("job %llu: cannot remove %s: %s", (unsigned long long)r->job, dir, strerror(errno));
  }
  return 0;
}

/* Under train.zero > 0 each replica updates its shards and the others'
 * come in the all-gather. The gradients are zeroed at the step's end
 * (pw_stepend_run): then every reduce-scatter frame we sent from them has
 * been read, and a checkpoint under zero > 0 is done with their room. */
static int update(pw_run *r, double sqnorm) {
  pw_step_sched sc = pw_step_sched_of(&r->spec.train, r->sh.step, sqnorm);
  r->cp.lr = sc.lr;
  if (r->spec.mode == PW_MODE_FORWARD) return 0;
  int zero = pw_dpx_zero(r);
  for (int li = 0; li < r->n_ls; li++) {
    const pw_dpx *x = zero ? &r->cp.dpx[li] : NULL;
    if (x)
      pw_optim_update_range(r->ls[li].prog, &r->spec.train, &sc, x->lo, x->hi, x->m, x->v);
    else
      pw_optim_update(r->ls[li].prog, &r->spec.train, &sc);
  }
  return zero ? pw_dpx_allgather_params(r) : 0;
}

/* After the step's report is posted: a checkpoint is never on the
 * coordinator before the report of the step it follows, so a resume from
 * it finds every earlier step recorded. */
static int checkpoint_stage(pw_run *r, int li) {
  char path[1024];
  pw_err err = {0};
  pw_stepend_ckpt_path(r, r->sh.step, r->ls[li].stage, path, sizeof path);
  if (mkdirs(path)) {
    int e = errno;
    return pw_exec_fail(r, PW_EIO, NULL, "checkpoint: cannot make the directories of %s: %s (errno %d)", path,
                        strerror(e), e);
  }
  int rc = pw_ckpt_save(r->ls[li].prog, path, r->sh.step + 1, NULL, &err);
  if (rc) return pw_exec_fail(r, rc, &err, "checkpoint");
  if ((rc = upload_stage(r, r->sh.step + 1, r->ls[li].stage, path))) return rc;
  pw_event ev = {.kind = PW_EV_CKPT, .step = r->sh.step, .stage = r->ls[li].stage};
  if ((rc = pw_exec_post(r, &ev))) return pw_exec_fail(r, rc, NULL, "out of memory for a checkpoint report");
  return 0;
}

/* tp > 1: the group gathers canonical programs, its first member writes
 * them (docs/contracts.md: checkpoints have the tp = 1 names and shapes). */
static int checkpoint_tp(pw_run *r) {
  pw_err err = {0};
  int rc = pw_tpx_canon(r, &err);
  if (rc) return pw_exec_fail(r, rc, &err, "checkpoint");
  if (!(rc = pw_tpx_gather(r)) && r->tp_rank == 0) {
    pw_prog **own = malloc(sizeof *own * (size_t)r->n_ls);
    if (!own) rc = pw_exec_fail(r, PW_ENOMEM, NULL, "out of memory for a checkpoint");
    for (int li = 0; own && li < r->n_ls; li++) own[li] = r->ls[li].prog, r->ls[li].prog = r->cp.tpx->canon[li];
    for (int li = 0; own && li < r->n_ls && !rc; li++) rc = checkpoint_stage(r, li);
    for (int li = 0; own && li < r->n_ls; li++) r->ls[li].prog = own[li];
    free(own);
  }
  pw_tpx_canon_free(r);
  return rc;
}

static int checkpoint(pw_run *r) {
  int rc = 0, zero = pw_dpx_zero(r);
  if (zero && ckpt_step(r, r->sh.step) && (rc = pw_dpx_state_gather(r))) return rc;
  if (!ckpt_due(r, r->sh.step)) return 0;
  if (r->tp > 1) return checkpoint_tp(r);
  for (int li = 0; li < r->n_ls && !rc; li++) rc = checkpoint_stage(r, li);
  if (zero) pw_dpx_state_release(r);
  return rc;
}

/* Sums in the contract's order: replicas (the whole arena, shadow
 * gradients too), then each parameter's uses, then a tied parameter's
 * holders. zero > 0 all-reduces only what the uses and holders need
 * (dpx.h), and reduce-scatters the rest after: the same sums. */
int pw_stepend_reduce(pw_run *r, double *sqnorm) {
  int rc, zero = pw_dpx_zero(r);
  r->cp.dp_t0 = -1; /* (bytes and seconds count from the step's start: zero 2 sends inside actions) */
  if (r->spec.mode != PW_MODE_FORWARD) {
    if (r->dp > 1 && (rc = zero ? pw_dpx_reduce_full(r) : pw_dpx_allreduce(r))) return rc;
    for (int li = 0; li < r->n_ls; li++) pw_prog_grads_finalize(r->ls[li].prog);
    if (r->part.n_shared && (rc = tied_exchange(r))) return rc;
    if (zero == 1 && (rc = pw_dpx_reduce_scatter(r))) return rc; /* zero 2's shards are summed already */
  }
  double part = 0, split = 0;
  if (r->spec.mode != PW_MODE_FORWARD)
    for (int li = 0; li < r->n_ls; li++) part += local_sqnorm(r, &r->ls[li], &split);
  if (r->tp > 1) { /* summed as floats: one value, in member order */
    float f = (float)split;
    uint64_t b = r->cp.tp_bytes; /* not the step's actions' */
    double sec = r->cp.tp_seconds;
    pw_err err = {0};
    if ((rc = pw_tpx_allreduce(r, &f, 1, PW_PROG_SUM, &err))) return pw_exec_fail(r, rc, &err, "the gradient norm");
    r->cp.tp_bytes = b, r->cp.tp_seconds = sec;
    part += f;
  }
  if (zero && (rc = pw_dpx_norm(r, part, &part))) return rc;
  return global_norm(r, part, sqnorm);
}

int pw_stepend_barrier(pw_run *r) {
  double unused;
  return global_norm(r, 0, &unused);
}

/* A traced step's collectives as timeline entries [kind, 0, stage, start,
 * end] (stage: the rank's first): "T" each tensor-parallel all-reduce (back
 * to back ones merged; inside the F and B blocks), "D" the data-parallel
 * exchange from its first part's start to its last part's end (after the
 * rank's last action). NULL when there are none. */
static json_t *colls_json(pw_run *r) {
  if (r->tp < 2 && !(r->dp > 1 && r->cp.dp_t0 >= 0)) return NULL;
  json_t *a = json_array();
  int stage = r->n_ls ? r->ls[0].stage : 0;
  if (r->tp > 1) pw_tpx_spans(r, a, stage);
  if (a && r->dp > 1 && r->cp.dp_t0 >= 0)
    json_array_append_new(a, json_pack("[s, i, i, f, f]", "D", 0, stage, r->cp.dp_t0, r->cp.dp_t1));
  return a;
}

int pw_stepend_run(pw_run *r) {
  int rc;
  double sqnorm = 0, t0 = pw_now(), waited = r->cp.waited;
  pw_snaprun_overdue(r); /* not taken in a wait of this step's actions (snaprun.c) */
  if ((rc = pw_stepend_reduce(r, &sqnorm)) || (rc = update(r, sqnorm))) return rc;
  double loss = r->cp.loss_sum, t1 = pw_now(), step_time = t1 - r->cp.t_step0, eval_loss = 0;
  double end_wait = r->cp.waited - waited; /* before the eval passes wait for theirs */
  int evaluated = 0;
  if ((rc = pw_evalrun(r, &eval_loss, &evaluated))) return rc;
  pw_snaprun_due(r);
  pw_event ev = {.kind = PW_EV_STEP, .step = r->sh.step, .step_time = step_time, .loss = loss,
                 .grad_norm = sqrt(sqnorm), .lr = r->cp.lr, .peak_act = r->cp.peak_act, .eval_loss = eval_loss,
                 .dp_bytes = r->cp.dp_bytes, .tp_bytes = r->cp.tp_bytes, .tp_seconds = r->cp.tp_seconds,
                 .dp_seconds = r->cp.dp_seconds, .end_wait = end_wait, .end_work = t1 - t0 - end_wait,
                 .after = pw_now() - t1, .t0 = r->cp.t_step0, .sleeps = r->cp.sleeps - r->cp.sleeps_told};
  r->cp.sleeps_told = r->cp.sleeps;
  for (int li = 0; li < r->n_ls && r->tp_rank == 0; li++) ev.has_loss |= pw_prog_has_loss(r->ls[li].prog);
  ev.has_eval = ev.has_loss && evaluated;
  if (r->trace_every > 0 && r->sh.step % r->trace_every == 0) {
    uv_mutex_lock(&r->sh.mu);
    for (int b = 0; b < PW_TRACE_BUFS && !ev.timings; b++)
      if (!r->sh.trace_busy[b]) {
        r->sh.trace_busy[b] = 1;
        ev.timings = r->sh.trace_buf + (size_t)b * (size_t)r->n_acts;
      }
    uv_mutex_unlock(&r->sh.mu);
    if (ev.timings) memcpy(ev.timings, r->cp.timings, sizeof *ev.timings * (size_t)r->n_acts);
    if (ev.timings) ev.colls = colls_json(r);
  }
  if (r->tp > 1) pw_tpx_spans(r, NULL, 0); /* an untraced step's (none) or one left out */
  if ((rc = pw_exec_post(r, &ev))) {
    json_decref(ev.colls);
    return pw_exec_fail(r, rc, NULL, "out of memory for a step report");
  }
  if ((rc = checkpoint(r))) return rc;
  r->cp.dp_bytes = 0, r->cp.dp_seconds = 0; /* the next step's, from its first action (not a checkpoint's) */
  if (r->spec.mode != PW_MODE_FORWARD)
    for (int li = 0; li < r->n_ls; li++) pw_prog_zero_grad(r->ls[li].prog);
  uv_mutex_lock(&r->sh.mu);
  r->sh.step++;
  uv_mutex_unlock(&r->sh.mu);
  return 0;
}

/* ---- frames (compute thread, r->sh.mu held) ------------------------------------ */

int pw_stepend_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  *dst = NULL;
  /* A replica's frames are tagged with the step (dpx.c checks them); a
   * pipeline peer's with the pass, and it may be one pass ahead of us,
   * never more. */
  if (h->kind == PW_FRAME_REDUCE && h->value != RV_NORM_PART) return pw_dpx_dest(r, from, h, dst, err);
  int tag = (int)h->step;
  if (tag != r->cp.tag && tag != pw_evalrun_next(r->cp.tag)) return pw_evalrun_refuse(r, h, err);
  if (h->kind == PW_FRAME_TIED) {
    int k = -1;
    for (int i = 0; i < r->part.n_shared; i++)
      if (r->part.shared[i].param == (int)h->value) k = i;
    if (k < 0 || !r->cp.tied || !local_holders(r, &r->part.shared[k]))
      return pw_err_set(err, PW_EPROTO, "frame", "unexpected TIED for value %u", h->value);
    const pw_shared_param *sp = &r->part.shared[k];
    int j = holder_index(sp, (int)h->microbatch);
    size_t n = r->model.params[sp->param].numel;
    if (j < 0 || from != pw_run_global_rank(r, sp->holders[j]) || h->payload_len != n * 4 ||
        h->dtype != PW_DTYPE_F32)
      return pw_err_set(err, PW_EPROTO, "frame", "TIED for parameter %u from rank %d does not fit", h->value, from);
    *dst = r->cp.tied[k].holder[j];
    return 0;
  }
  switch (h->value) {
    case RV_NORM_PART:
      if (h->payload_len != 8 || h->dtype != PW_DTYPE_U8)
        return pw_err_set(err, PW_EPROTO, "frame", "bad norm reduction frame");
      if (h->microbatch >= (uint32_t)r->pp || (int)h->microbatch == r->prank ||
          from != pw_run_rank_of(r, r->replica, (int)h->microbatch))
        return pw_err_set(err, PW_EPROTO, "frame", "norm partial from rank %d does not fit", from);
      return 0; /* the reader's buffer */
    default: return pw_err_set(err, PW_EPROTO, "frame", "unknown reduction %u", h->value);
  }
}

int pw_stepend_frame(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  if (h->kind == PW_FRAME_TIED) {
    if (r->cp.tied_step != (int)h->step) r->cp.tied_step = (int)h->step, r->cp.tied_got = 0;
    r->cp.tied_got++;
    return 0;
  }
  if (h->value != RV_NORM_PART) return pw_dpx_frame(r, from, h, payload, err);
  double v;
  switch (h->value) {
    case RV_NORM_PART:
      memcpy(&v, payload, 8);
      r->cp.norm_parts[(h->step & 1) * r->pp + h->microbatch] = v;
      r->cp.norm_parts_step[(h->step & 1) * r->pp + h->microbatch] = (int)h->step;
      return 0;
  }
  return pw_err_set(err, PW_EPROTO, "frame", "unknown reduction %u", h->value);
}
