/* exec: the run's compute thread. It walks the rank's action list step
 * after step — wait for an action's inputs, compute it, hand its outputs
 * on — then does the step end (stepend.c). The loop thread only receives
 * HELLOs, the control link and whatever a socket would not take at once;
 * so an action whose inputs are here starts the moment the previous one
 * ends, with no hand-off between threads, and a frame's CRC is computed
 * here, while the data is hot in this core's cache.
 * It also reads its inbound links itself while it waits (io.c). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "log.h"
#include "serve.h"
#include "run.h"

/* ---- one action ----------------------------------------------------------- */

static int act_ready(pw_run *r, const pw_action *a) {
  const pw_lstage *ls = &r->cx.ls[r->cx.lidx_of_stage[a->stage]];
  const pw_lstage_compute *lc = &r->cp.ls[r->cx.lidx_of_stage[a->stage]];
  switch (a->kind) {
    case PW_ACT_F:
      return ls->n_act_in == 0 || (lc->act_step[a->mb] == r->cp.tag && lc->act_got[a->mb] == ls->n_act_in);
    case PW_ACT_B:
    case PW_ACT_I:
      return ls->n_grad_in == 0 || (lc->grad_step[a->mb] == r->cp.tag && lc->grad_got[a->mb] == ls->n_grad_in);
    default: return 1;
  }
}

/* A unit is an action or a fused F&B pair: ready when all of it is. */
typedef struct {
  pw_run *r;
  const pw_action *a;
  int n;
} unit;

static int unit_ready(void *arg) {
  const unit *u = arg;
  pw_run *r = u->r;
  for (int k = 0; k < u->n; k++)
    if (!act_ready(r, &u->a[k])) return 0;
  return 1;
}

/* Draw this replica's share of microbatch mb straight into the slot: of
 * the step's batch, or in an eval pass of eval batch cp.eval_batch (the
 * batches `pipewright eval` draws, train.c). */
static void draw_data(pw_run *r, const pw_lstage *ls, int slot, int mb) {
  const pw_model *m = &r->cfg.sl.model;
  int per_replica = r->cfg.sl.train.batch_size / r->cx.dp;
  int first = r->cx.replica * per_replica + mb * r->cx.mb_size;
  /* a regions model's stage may read its tokens or its features (or neither) */
  void *inp = ls->first_input && m->input_value >= 0 ? pw_prog_value(ls->prog, slot, m->input_value) : NULL;
  float *feat = ls->first_input && m->feature_value >= 0 ? pw_prog_value(ls->prog, slot, m->feature_value) : NULL;
  void *tgt = ls->has_target ? pw_prog_value(ls->prog, slot, m->target_value) : NULL;
  pw_split split = r->eval.active ? PW_SPLIT_EVAL : PW_SPLIT_TRAIN;
  long step = r->eval.active ? r->eval.batch : r->sh.step;
  if (inp || tgt) pw_dataset_batch(r->data.ds, split, step, first, r->cx.mb_size, r->cfg.sl.train.batch_size, inp, tgt);
  if (feat) pw_dataset_features(r->data.ds, split, step, first, r->cx.mb_size, r->cfg.sl.train.batch_size, feat);
}

/* The header of a tensor of `bytes` of f32 (in bf16 with `bf16`) sent to
 * stage `stage`; fails the run when it cannot have one. */
static int frame_hdr_for(pw_run *r, pw_frame_hdr *h, int kind, int mb, int stage, int value, size_t bytes, int bf16) {
  int rc = pw_frame_hdr_init_vec(h, kind, r->cx.job, (uint32_t)r->cp.tag, (uint32_t)mb, (uint32_t)stage,
                                 (uint32_t)value, bf16 ? PW_DTYPE_BF16 : PW_DTYPE_F32, bytes / 4);
  if (rc)
    return pw_exec_fail(r, rc, NULL, "no %s frame header for value %d of %zu bytes to stage %d (job %llu): %s",
                        pw_frame_kind_name(kind), value, bytes, stage, (unsigned long long)r->cx.job, pw_strerror(rc));
  return 0;
}

/* Copy a tensor to local stage dli's microbatch mb and count it in. The
 * copy runs unlocked: the slot is claimed, and nothing reads it until the
 * count says it is complete. */
static int route_local(pw_run *r, int dli, int mb, int value, const void *src, size_t bytes, int grad) {
  const pw_lstage *d = &r->cx.ls[dli];
  pw_lstage_compute *dc = &r->cp.ls[dli];
  pw_err err = {0};
  uv_mutex_lock(&r->sh.mu);
  int ds = grad ? dc->mb_slot[mb] : pw_run_slot_for(r, dli, mb, &err);
  uv_mutex_unlock(&r->sh.mu);
  if (ds < 0)
    return pw_exec_fail(r, grad ? PW_EINTERNAL : ds, grad ? NULL : &err, "stage %d, microbatch %d", d->stage, mb);
  memcpy(grad ? (void *)pw_prog_grad(d->prog, ds, value) : pw_prog_value(d->prog, ds, value), src, bytes);
  uv_mutex_lock(&r->sh.mu);
  int *step = grad ? dc->grad_step : dc->act_step, *got = grad ? dc->grad_got : dc->act_got;
  if (step[mb] != r->cp.tag) step[mb] = r->cp.tag, got[mb] = 0;
  got[mb]++;
  uv_mutex_unlock(&r->sh.mu);
  return 0;
}

/* Hand an F's outputs to the stages that read them. */
static int route_outputs(pw_run *r, const pw_action *a) {
  int li = r->cx.lidx_of_stage[a->stage];
  const pw_lstage *ls = &r->cx.ls[li];
  int slot = r->cp.ls[li].mb_slot[a->mb];
  for (int i = 0; i < pw_prog_n_outputs(ls->prog); i++) {
    const pw_prog_port *pt = pw_prog_output(ls->prog, i);
    int dst = pw_run_consumer(r, pt->value), rc;
    const void *src = pw_prog_value(ls->prog, slot, pt->value);
    if (r->cx.lidx_of_stage[dst] >= 0) {
      rc = route_local(r, r->cx.lidx_of_stage[dst], a->mb, pt->value, src, pt->bytes, 0);
    } else {
      /* bf16: the send buffer lives with the slot, held until the write is done */
      const void *wire = pw_prog_wire_fill(ls->prog, slot, pt->value);
      pw_frame_hdr h;
      rc = frame_hdr_for(r, &h, PW_FRAME_ACT, a->mb, dst, pt->value, pt->bytes, wire != NULL);
      if (!rc) rc = pw_exec_send(r, pw_rctx_global_rank(&r->cx, dst), &h, wire ? wire : src, li, slot, NULL);
      r->cp.io.act_sent++, r->cp.io.act_bytes += h.payload_len;
    }
    if (rc) return rc;
  }
  return 0;
}

/* Hand a B/I's input gradients back to the stages that produced them. */
static int route_grads(pw_run *r, const pw_action *a) {
  int li = r->cx.lidx_of_stage[a->stage];
  const pw_lstage *ls = &r->cx.ls[li];
  int slot = r->cp.ls[li].mb_slot[a->mb];
  for (int i = 0; i < pw_prog_n_inputs(ls->prog); i++) {
    const pw_prog_port *pt = pw_prog_input(ls->prog, i);
    if (pt->role != PW_VAL_ACT) continue;
    int src = pw_run_producer(r, pt->value), rc;
    const float *g = pw_prog_grad(ls->prog, slot, pt->value);
    if (r->cx.lidx_of_stage[src] >= 0) {
      rc = route_local(r, r->cx.lidx_of_stage[src], a->mb, pt->value, g, pt->bytes, 1);
    } else {
      pw_frame_hdr h;
      rc = frame_hdr_for(r, &h, PW_FRAME_GRAD, a->mb, src, pt->value, pt->bytes, 0);
      if (!rc) rc = pw_exec_send(r, pw_rctx_global_rank(&r->cx, src), &h, g, li, slot, NULL);
    }
    if (rc) return rc;
  }
  return 0;
}

static void release(pw_run *r, int li, int mb) {
  uv_mutex_lock(&r->sh.mu);
  pw_run_slot_release(r, li, mb);
  uv_mutex_unlock(&r->sh.mu);
}

/* Action acts[pc], its inputs there since `ready` (or 0: since it starts);
 * timed only in a training pass (the step report's). */
static int compute(pw_run *r, const pw_action *acts, int pc, double ready) {
  const pw_action *a = &acts[pc];
  int li = r->cx.lidx_of_stage[a->stage];
  const pw_lstage *ls = &r->cx.ls[li];
  int slot = r->cp.ls[li].mb_slot[a->mb];
  double t0 = pw_now();
  pw_err err = {0};
  int rc = 0;
  switch (a->kind) {
    case PW_ACT_F: {
      float loss = 0;
      draw_data(r, ls, slot, a->mb);
      rc = pw_prog_forward(ls->prog, slot, &loss, &err);
      r->cp.loss_sum += loss;
      break;
    }
    case PW_ACT_B: rc = pw_prog_backward(ls->prog, slot, &err); break;
    case PW_ACT_I: rc = pw_prog_backward_input(ls->prog, slot, &err); break;
    case PW_ACT_W: rc = pw_prog_backward_weight(ls->prog, slot, &err); break;
  }
  /* err says what failed (a recompute buffer, W before I, a tensor-parallel
   * all-reduce, a ZeRO-2 hand-off); the first failure recorded wins (a lost
   * peer's, said where it was found) */
  if (rc) return pw_exec_fail(r, rc, &err, "stage %d, microbatch %d", a->stage, a->mb);
  pw_timing *tm = r->eval.active ? NULL : &r->cp.timings[pc];
  if (tm) {
    tm->a = *a;
    tm->ready = (ready > 0 ? ready : t0) - r->cp.t_step0;
    tm->start = t0 - r->cp.t_step0;
    tm->end = pw_now() - r->cp.t_step0;
  }
  switch (a->kind) {
    case PW_ACT_F:
      if (++r->cp.act_held > r->cp.peak_act) r->cp.peak_act = r->cp.act_held;
      rc = route_outputs(r, a);
      if (r->cfg.sl.sched->forward_only || r->eval.active) { /* nothing will come back for it */
        r->cp.act_held--;
        release(r, li, a->mb);
      }
      break;
    case PW_ACT_B:
      r->cp.act_held--;
      rc = route_grads(r, a);
      release(r, li, a->mb);
      break;
    case PW_ACT_I:
      r->cp.act_held--;
      rc = route_grads(r, a);
      break;
    case PW_ACT_W: release(r, li, a->mb); break;
  }
  if (tm) tm->routed = pw_now() - r->cp.t_step0;
  return rc;
}

/* ---- the step loop -------------------------------------------------------- */

int pw_exec_actions(pw_run *r, const pw_action *acts, int n_acts) {
  if (!r->eval.active) r->cp.t_step0 = pw_now(), r->tpx.bytes = 0, r->tpx.seconds = 0;
  r->cp.loss_sum = 0;
  for (int pc = 0; pc < n_acts;) {
    unit u = {r, acts + pc, (acts[pc].flags & PW_ACTION_FUSED) && pc + 1 < n_acts ? 2 : 1};
    pw_err err = {0};
    double ready = r->eval.active ? 0 : pw_now();
    int rc = pw_exec_wait(r, unit_ready, &u);
    if (rc) return rc;
    uv_mutex_lock(&r->sh.mu);
    for (int k = 0; k < u.n && !rc; k++) {
      const pw_action *a = &acts[pc + k];
      int slot = a->kind == PW_ACT_F ? pw_run_slot_for(r, r->cx.lidx_of_stage[a->stage], a->mb, &err) : 0;
      if (slot < 0) rc = slot;
    }
    uv_mutex_unlock(&r->sh.mu);
    if (rc == PW_ECANCELED) return rc;
    if (rc) return pw_exec_fail(r, rc, &err, "%s", "");
    for (int k = 0; k < u.n && !rc; k++) {
      if (r->dpx.pgather) pw_pgather_next_action(r->dpx.pgather, acts, pc + k, n_acts); /* ZeRO-3's prefetch */
      rc = compute(r, acts, pc + k, k ? 0 : ready);
    }
    if (rc) return rc;
    pc += u.n;
  }
  return 0;
}

/* The eval passes after the update of sh.step, when due: *loss gets this
 * replica's share of the eval loss, *done 1. Each pass ends with the
 * pipeline ranks of the replica waiting for each other (the norm exchange
 * with nothing to sum): a pass's microbatch never meets the next pass's in
 * a slot. Touches no gradient and no optimizer state. */
static int eval_passes(pw_run *r, double *loss, int *done) {
  *loss = 0, *done = 0;
  if (!pw_evalrun_due(&r->eval, r->sh.step)) return 0;
  int n = r->cfg.sl.train.eval_batches, rc = 0;
  double sum = 0, unused;
  r->eval.active = 1;
  for (int b = 0; b < n && !rc; b++) {
    r->cp.tag = pw_evalrun_next(r->cp.tag);
    r->eval.batch = b;
    rc = pw_exec_actions(r, r->eval.acts, r->eval.n_acts);
    if (!rc) sum += r->cp.loss_sum, rc = pw_pipex_norm(&r->pipex, 0, &unused);
  }
  r->eval.active = 0;
  *loss = sum / n;
  *done = !rc;
  return rc;
}

/* One training step: the actions, the step end's exchange and update, the
 * eval passes when due, then the report and checkpoints. */
int pw_exec_step(pw_run *r) {
  double sqnorm, lr, t0;
  pw_event ev = {.kind = PW_EV_STEP};
  r->cp.tag = pw_evalrun_tag(&r->eval, r->sh.step);
  int rc = pw_exec_actions(r, r->cx.acts, r->cx.n_acts);
  if (rc) return rc;
  t0 = pw_now();
  double waited = r->cp.io.waited;
  pw_snaprun_overdue(&r->snap); /* not taken in a wait of this step's actions */
  if ((rc = pw_stepend_update(r, &sqnorm, &lr))) return rc;
  double t1 = pw_now();
  ev.step_time = t1 - r->cp.t_step0, ev.loss = r->cp.loss_sum, ev.grad_norm = sqrt(sqnorm), ev.lr = lr;
  ev.end_wait = r->cp.io.waited - waited; /* before the eval passes wait for theirs */
  ev.end_work = t1 - t0 - ev.end_wait;
  int evaluated = 0;
  if ((rc = eval_passes(r, &ev.eval_loss, &evaluated))) return rc;
  ev.has_eval = evaluated;
  ev.after = t1; /* pw_stepend_finish makes it the seconds since */
  return pw_stepend_finish(r, &ev);
}

void pw_exec_main(void *arg) {
  pw_run *r = arg;
  pw_err err = {0};
  /* Files are opened here, never on the loop thread: a slow disk or a
   * path naming something other than a file must not stall the worker. */
  int rc = pw_exec_chunk_limit(r);
  pw_exec_spin_init(r);
  if (!rc && (rc = pw_run_open_files(r, &err))) rc = pw_exec_fail(r, rc, &err, "%s", "");
  if (!rc && r->serve) rc = pw_serve_run(r->serve);
  uv_mutex_lock(&r->sh.mu);
  pw_run_take_stop(r);
  uv_mutex_unlock(&r->sh.mu);
  while (!rc && !r->serve && r->sh.step < r->cp.last) rc = pw_exec_step(r);
  if (r->cp.io.chunked)
    pw_info("job %llu run %d: rank %d sent %llu tensors over %zu bytes as %llu chunks", (unsigned long long)r->cx.job,
            r->cx.run_id, r->cx.rank, (unsigned long long)r->cp.io.chunked, r->cp.io.chunk_limit,
            (unsigned long long)r->cp.io.chunks);
  if (r->cp.io.act_sent) /* test_bf16_pipeline reads it: bf16 halves the bytes */
    pw_info("job %llu run %d: rank %d sent %llu activation frames, %llu payload bytes", (unsigned long long)r->cx.job,
            r->cx.run_id, r->cx.rank, (unsigned long long)r->cp.io.act_sent, (unsigned long long)r->cp.io.act_bytes);
  if (r->snap.taken)
    pw_info("job %llu run %d: rank %d took %d snapshots, %.2f ms each (copy and queued sends)%s",
            (unsigned long long)r->cx.job, r->cx.run_id, r->cx.rank, r->snap.taken, 1e3 * r->snap.seconds / r->snap.taken,
            r->snap.skipped ? ", some skipped" : "");
  /* The ring always has room for these two (pw_exec_post), so they cannot fail. */
  pw_event ev = {.kind = rc == 0 ? PW_EV_DONE : PW_EV_FAIL, .peak_act = r->cp.peak_act};
  if ((rc != PW_ECANCELED || !atomic_load(&r->sh.abort)) && pw_exec_post(r, &ev)) pw_error("cannot report the run's end");
  ev.kind = PW_EV_EXIT;
  if (pw_exec_post(r, &ev)) pw_error("cannot report the compute thread's exit");
}
