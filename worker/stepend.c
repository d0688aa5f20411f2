/* stepend: what a rank does between its last action of a step and the next
 * step — the same arithmetic as the single-process trainer, spread over
 * ranks:
 *   1. DP: data-parallel replicas of a stage reduce-scatter its gradient
 *      arena, each summing its shard in replica order (so every replica
 *      gets the same bits), and all-gather the sums (dpx.h); with
 *      train.zero 1 and 2 the shards stay and step 4 all-gathers
 *      parameters (zero 3 keeps its shard: each layer gathers them);
 *   2. TIED: holders of a shared parameter (tied embeddings) exchange its
 *      gradient and each sums the copies in stage order (pipex.h);
 *   3. NORM: every pipeline rank sends its partial squared gradient norm to
 *      the other pipeline ranks of its replica, and each sums them in rank
 *      order (the same bits everywhere; one hop, and the step's barrier);
 *   4. UPDATE: clip coefficient and learning rate, each rank's own
 *      optimizer step;
 * then (after any eval passes: exec.c) the step report, checkpoints
 * (ckptrun.c) and the next step. The phases run on the compute thread,
 * which reads what the peers send into the subsystems' buffers while it
 * waits (io.c, route.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "optim.h"
#include "run.h"

/* This rank's part of the squared gradient norm: each shared parameter
 * counted at its lowest holder only; under tp the split parameters' part
 * in *split (summed over the group by the caller); under zero > 0 our
 * shard only (the rest is summed elsewhere). */
static double local_sqnorm(pw_run *r, pw_lstage *ls, double *split) {
  int skip[16], ns = pw_pipex_norm_skips(&r->pipex, ls->stage, skip, 16);
  if (r->cx.tp > 1) {
    *split += pw_tpx_sqnorm(&r->tpx, ls->prog, skip, ns, 1);
    return pw_tpx_sqnorm(&r->tpx, ls->prog, skip, ns, 0);
  }
  if (!pw_dpx_zero(&r->cx)) return pw_grad_sqnorm(ls->prog, skip, ns);
  const pw_dpx_stage *x = &r->dpx.st[ls - r->cx.ls];
  return pw_grad_sqnorm_range(ls->prog, skip, ns, x->lo, x->hi);
}

/* Sums in the contract's order: replicas (the whole arena, shadow
 * gradients too), then each parameter's uses, then a tied parameter's
 * holders. zero > 0 all-reduces only what the uses and holders need
 * (dpx.h), and reduce-scatters the rest after: the same sums. */
int pw_stepend_reduce(pw_run *r, double *sqnorm) {
  int rc, zero = pw_dpx_zero(&r->cx), train = r->cfg.sl.mode != PW_MODE_FORWARD;
  r->dpx.t0 = -1; /* (bytes and seconds count from the step's start: zero 2 sends inside actions) */
  if (train) {
    if (r->cx.dp > 1 && (rc = zero ? pw_dpx_reduce_full(&r->dpx) : pw_dpx_allreduce(&r->dpx))) return rc;
    for (int li = 0; li < r->cx.n_ls; li++) pw_prog_grads_finalize(r->cx.ls[li].prog);
    if ((rc = pw_pipex_tied(&r->pipex))) return rc;
    if (zero == 1 && (rc = pw_dpx_reduce_scatter(&r->dpx))) return rc; /* zero 2's shards are summed already */
  }
  double part = 0, split = 0;
  if (train)
    for (int li = 0; li < r->cx.n_ls; li++) part += local_sqnorm(r, &r->cx.ls[li], &split);
  if (r->cx.tp > 1) { /* summed as floats: one value, in member order */
    float f = (float)split;
    uint64_t b = r->tpx.bytes; /* not the step's actions' */
    double sec = r->tpx.seconds;
    pw_err err = {0};
    if ((rc = pw_tpx_allreduce(&r->tpx, &f, 1, PW_PROG_SUM, &err)))
      return pw_exec_fail(r, rc, &err, "the gradient norm");
    r->tpx.bytes = b, r->tpx.seconds = sec;
    part += f;
  }
  if (zero && (rc = pw_dpx_norm(&r->dpx, part, &part))) return rc;
  return pw_pipex_norm(&r->pipex, part, sqnorm);
}

/* Under train.zero > 0 each replica updates its shards and the others'
 * come in the all-gather. The gradients are zeroed at the step's end
 * (pw_stepend_finish): then every reduce-scatter frame we sent from them
 * has been read, and a checkpoint under zero > 0 is done with their room. */
int pw_stepend_update(pw_run *r, double *sqnorm, double *lr) {
  int rc = pw_stepend_reduce(r, sqnorm);
  if (rc) return rc;
  pw_step_sched sc = pw_step_sched_of(&r->cfg.sl.train, r->sh.step, *sqnorm);
  *lr = sc.lr;
  if (r->cfg.sl.mode == PW_MODE_FORWARD) return 0;
  int zero = pw_dpx_zero(&r->cx);
  if (zero == 3 && (rc = pw_pgather_quiesce(r->dpx.pgather))) return rc; /* our pieces read the shard */
  for (int li = 0; li < r->cx.n_ls; li++) {
    const pw_dpx_stage *x = zero ? &r->dpx.st[li] : NULL;
    if (x)
      pw_optim_update_range(r->cx.ls[li].prog, &r->cfg.sl.train, &sc, x->lo, x->hi, x->m, x->v);
    else
      pw_optim_update(r->cx.ls[li].prog, &r->cfg.sl.train, &sc);
  }
  return zero && zero < 3 ? pw_dpx_allgather_params(&r->dpx) : 0; /* zero 3 gathers per layer (pgather.h) */
}

/* A traced step's collectives as timeline entries [kind, 0, stage, start,
 * end] (stage: the rank's first): "T" each tensor-parallel all-reduce (back
 * to back ones merged; inside the F and B blocks), "D" the data-parallel
 * exchange from its first part's start to its last part's end (after the
 * rank's last action). NULL when there are none. */
static json_t *colls_json(pw_run *r) {
  if (r->cx.tp < 2 && !(r->cx.dp > 1 && r->dpx.t0 >= 0)) return NULL;
  json_t *a = json_array();
  int stage = r->cx.n_ls ? r->cx.ls[0].stage : 0;
  if (r->cx.tp > 1) pw_tpx_spans(&r->tpx, a, stage);
  if (a && r->cx.dp > 1 && r->dpx.t0 >= 0)
    json_array_append_new(a, json_pack("[s, i, i, f, f]", "D", 0, stage, r->dpx.t0, r->dpx.t1));
  return a;
}

/* A traced step's timings go to the loop in one of the buffers made at
 * start; a step finding none free goes untraced. */
static void trace(pw_run *r, pw_event *ev) {
  uv_mutex_lock(&r->sh.mu);
  for (int b = 0; b < PW_TRACE_BUFS && !ev->timings; b++)
    if (!r->sh.trace.busy[b]) {
      r->sh.trace.busy[b] = 1;
      ev->timings = r->sh.trace.buf + (size_t)b * (size_t)r->cx.n_acts;
    }
  uv_mutex_unlock(&r->sh.mu);
  if (!ev->timings) return;
  memcpy(ev->timings, r->cp.timings, sizeof *ev->timings * (size_t)r->cx.n_acts);
  ev->colls = colls_json(r);
}

int pw_stepend_finish(pw_run *r, pw_event *ev) {
  int rc;
  pw_snaprun_due(&r->snap);
  ev->step = r->sh.step, ev->peak_act = r->cp.peak_act, ev->t0 = r->cp.t_step0;
  ev->dp_bytes = r->dpx.bytes, ev->dp_seconds = r->dpx.seconds;
  ev->tp_bytes = r->tpx.bytes, ev->tp_seconds = r->tpx.seconds;
  ev->sleeps = r->cp.io.sleeps - r->cp.io.sleeps_told;
  r->cp.io.sleeps_told = r->cp.io.sleeps;
  for (int li = 0; li < r->cx.n_ls && r->cx.tp_rank == 0; li++) ev->has_loss |= pw_prog_has_loss(r->cx.ls[li].prog);
  ev->has_eval = ev->has_loss && ev->has_eval;
  if (r->cfg.trace_every > 0 && r->sh.step % r->cfg.trace_every == 0) trace(r, ev);
  if (r->cx.tp > 1) pw_tpx_spans(&r->tpx, NULL, 0); /* an untraced step's (none) or one left out */
  ev->after = pw_now() - ev->after;
  if ((rc = pw_exec_post(r, ev))) {
    json_decref(ev->colls);
    return pw_exec_fail(r, rc, NULL, "out of memory for a step report");
  }
  if ((rc = pw_ckptrun(r))) return rc;
  r->dpx.bytes = 0, r->dpx.seconds = 0; /* the next step's, from its first action (not a checkpoint's) */
  if (r->cfg.sl.mode != PW_MODE_FORWARD)
    for (int li = 0; li < r->cx.n_ls; li++) pw_prog_zero_grad(r->cx.ls[li].prog);
  uv_mutex_lock(&r->sh.mu);
  r->sh.step++;
  pw_run_take_stop(r);
  uv_mutex_unlock(&r->sh.mu);
  return 0;
}
