/* run: one assignment — a rank of a job — from the assign message to done.
 *
 * Everything the rank runs comes from the assignment's slice of the plan
 * (common/plan/slice.h: the compiled graph, its stages and their slots, its
 * action list, the tied table, the training config), checked against its
 * SHA-256 first; the worker builds its stage programs from it and never
 * re-partitions, re-plans or reads the model spec. pw_run_create makes a
 * run from it without a daemon (the tests do too); pw_run_start gives it
 * to the worker (both run_setup.c). Once the links to its peers are up,
 * the run's compute thread (exec.c) opens its files (run_files.c) and
 * walks the list step after step; this file is the loop thread's side of
 * the rest: the end of a run, the links, and the events the compute thread
 * queues (frames to write, step reports, done, failed); and the slots, the
 * frame checks and counters the compute thread calls as it reads its
 * inbound links (recv.c). run.h says who owns which field.
 *
 * Slots: microbatch mb of local stage li lives in slot mb_slot[mb] from the
 * moment its first input arrives (or its F starts) until its backward is
 * complete (B, or W after I) and every send reading the slot has finished.
 * Frames of the next step may arrive before this rank finishes the current
 * one (a neighbour that stepped its optimizer first); arrival counters are
 * tagged with their step for that reason. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "serve.h"
#include "worker.h"

static void finish(pw_run *r, int ok);

/* ---- helpers ------------------------------------------------------------ */

static int port_index(const pw_prog_port *(*get)(const pw_prog *, int), int n, const pw_prog *p, int value) {
  for (int i = 0; i < n; i++)
    if (get(p, i)->value == value) return i;
  return -1;
}

/* The stage that produces / consumes value v (chain models: one each). */
int pw_run_producer(const pw_run *r, int v) {
  for (int e = 0; e < r->part.n_edges; e++)
    if (r->part.edges[e].value == v) return r->part.edges[e].src;
  return -1;
}

int pw_run_consumer(const pw_run *r, int v) {
  for (int e = 0; e < r->part.n_edges; e++)
    if (r->part.edges[e].value == v) return r->part.edges[e].dst;
  return -1;
}

int pw_run_rank_of(const pw_run *r, int d, int prank) { return (d * r->pp + prank) * r->tp + r->tp_rank; }

int pw_run_global_rank(const pw_run *r, int stage) { return pw_run_rank_of(r, r->replica, r->rank_of_stage[stage]); }

int pw_run_slot_for(pw_run *r, int li, int mb, pw_err *err) {
  const pw_lstage *ls = &r->ls[li];
  pw_lstage_shared *ss = &r->sh.ls[li];
  pw_lstage_compute *lc = &r->cp.ls[li];
  if (lc->mb_slot[mb] >= 0) return lc->mb_slot[mb];
  int max = pw_prog_max_slots(ls->prog);
  for (int s = 0; s < max; s++) {
    if (ss->slot_busy[s]) continue;
    if (pw_prog_slot_ensure(ls->prog, s))
      return pw_err_set(err, PW_ENOMEM, "slots", "out of memory for an activation slot");
    ss->slot_busy[s] = 1;
    lc->mb_slot[mb] = s;
    return s;
  }
  return pw_err_set(err, PW_EINTERNAL, "slots", "stage %d: all %d slots in use", ls->stage, max);
}

void pw_run_slot_release(pw_run *r, int li, int mb) {
  pw_lstage_shared *ss = &r->sh.ls[li];
  pw_lstage_compute *lc = &r->cp.ls[li];
  int s = lc->mb_slot[mb];
  if (s < 0) return;
  lc->mb_slot[mb] = -1;
  if (ss->slot_sends[s])
    ss->slot_free_pending[s] = 1;
  else
    ss->slot_busy[s] = 0;
}

static void maybe_free(pw_run *r) {
  if (r->lp.closing && !r->lp.thread_running && r->lp.sends_inflight == 0) pw_run_free(r);
}

void pw_run_send_done(pw_run *r, int to, int li, int slot) {
  r->lp.sends_inflight--;
  if (to >= 0) {
    uv_mutex_lock(&r->sh.wmu);
    r->sh.wl[to].queued--;
    uv_mutex_unlock(&r->sh.wmu);
  }
  if (li >= 0 && slot >= 0 && li < r->n_ls) {
    pw_lstage_shared *ss = &r->sh.ls[li];
    uv_mutex_lock(&r->sh.mu);
    if (--ss->slot_sends[slot] == 0 && ss->slot_free_pending[slot]) {
      ss->slot_free_pending[slot] = 0;
      ss->slot_busy[slot] = 0;
    }
    uv_mutex_unlock(&r->sh.mu);
  }
  maybe_free(r);
}

void pw_run_link_in(pw_run *r, pw_link *l) {
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&l->tcp, &fd) || l->peer_rank < 0 || l->peer_rank >= r->n_ranks) return;
  uv_mutex_lock(&r->sh.mu);
  r->sh.in_fd[l->peer_rank] = fd;
  uv_mutex_unlock(&r->sh.mu);
  pw_exec_wake(r);
}

int pw_run_step(pw_run *r) {
  uv_mutex_lock(&r->sh.mu);
  int step = r->sh.step;
  uv_mutex_unlock(&r->sh.mu);
  return step;
}

/* ---- the end of a run ---------------------------------------------------- */

static void run_destroy(pw_run *r) {
  pw_serve_free(r);
  pw_stepend_free(r);
  pw_snaprun_free(r);
  free(r->restore_from);
  for (int li = 0; li < r->n_ls; li++) {
    pw_prog_free(r->ls[li].prog);
    if (!r->sh.ls || !r->cp.ls) continue;
    pw_lstage_shared *ss = &r->sh.ls[li];
    pw_lstage_compute *lc = &r->cp.ls[li];
    free(lc->mb_slot);
    free(lc->act_step);
    free(lc->act_got);
    free(lc->grad_step);
    free(lc->grad_got);
    free(ss->slot_busy);
    free(ss->slot_sends);
    free(ss->slot_free_pending);
  }
  free(r->ls);
  free(r->sh.ls);
  free(r->cp.ls);
  free((int *)r->rank_of_stage);
  free((int *)r->lidx_of_stage);
  free(r->lp.out);
  free(r->peer_addr);
  free(r->peer_host);
  free(r->cp.timings);
  free(r->sh.trace_buf);
  free(r->cp.norm_parts);
  free(r->cp.norm_parts_step);
  free(r->cp.eval_acts);
  pw_dataset_close(r->ds);
  if (r->cp.ds_held) pw_dscache_release(r->cache, r->spec.data.dataset); /* (the compute thread is joined) */
  pw_sched_free(r->sched);
  pw_partition_free(&r->part);
  pw_tpx_free(r);
  pw_model_free(&r->model);
  pw_model_free(&r->canon);
  free(r->tp_kinds);
  free(r->peak_slots);
  free(r->n_work);
  json_decref(r->assign);
  free(r->sh.evq);
  free(r->sh.wl);
  for (int k = 0; r->cp.in && k < r->n_ranks; k++) pw_frame_reader_free(&r->cp.in[k].rd);
  free(r->cp.in);
  free(r->sh.in_fd);
  close(r->sh.wake_fd);
  uv_mutex_destroy(&r->sh.wmu);
  uv_mutex_destroy(&r->sh.mu);
  free(r);
}

static void on_async_closed(uv_handle_t *h) { run_destroy(h->data); }

/* Only once the compute thread has been joined (or never started). */
void pw_run_free(pw_run *r) {
  if (!r) return;
  if (r->w && r->w->run == r) r->w->run = NULL;
  if (r->lp.async_init) {
    r->lp.async_init = 0;
    uv_close((uv_handle_t *)&r->lp.async, on_async_closed);
  } else {
    run_destroy(r);
  }
}

/* Inbound links are the compute thread's until it has returned; then the
 * loop reads them to their end (the peer's BYE and close), not closing
 * them first: a peer still finishing its last step, or reading our BYE's
 * reason, must not see its link drop before. */
static void close_links_in(pw_run *r) {
  for (pw_link *l = r->w->links; l; l = l->next)
    if (!l->outbound && l->hello_job == r->job && l->hello_run == r->run_id && l->peer_rank >= 0) pw_link_drain(l);
}

/* Ends the run: links to peers closed (with BYE when it succeeded, so they
 * do not take it for a failure), the worker free for the next assignment,
 * the memory released once the last write callback has run. */
static void finish(pw_run *r, int ok) {
  if (r->lp.closing) return;
  r->lp.closing = 1;
  if (r->w->run == r) r->w->run = NULL;
  /* The links are the loop's alone from here (waits for a direct write
   * in progress), so BYE cannot interleave with a frame. */
  uv_mutex_lock(&r->sh.wmu);
  for (int k = 0; k < r->n_ranks && r->sh.wl; k++) r->sh.wl[k].fd = -1;
  uv_mutex_unlock(&r->sh.wmu);
  for (int k = 0; k < r->n_ranks; k++) {
    pw_link *l = r->lp.out ? r->lp.out[k] : NULL;
    if (!l) continue;
    l->peer_rank = -1; /* its close is ours, not a failure to report */
    pw_link_bye(l, r->job, ok ? NULL : r->sh.error[0] ? r->sh.error : "cancelled");
    r->lp.out[k] = NULL;
  }
  atomic_store(&r->sh.abort, 1);
  pw_exec_wake(r);
  if (!r->lp.thread_running) close_links_in(r);
  maybe_free(r);
}

void pw_run_fail(pw_run *r, const char *fmt, ...) {
  if (r->lp.closing) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->sh.error, sizeof r->sh.error, fmt, ap);
  va_end(ap);
  pw_error("job %llu run %d rank %d failed at step %d: %s", (unsigned long long)r->job, r->run_id, r->rank, r->sh.step,
           r->sh.error);
  uv_mutex_lock(&r->sh.mu);
  int lost = r->sh.lost_rank, restore = r->sh.restore_failed, aborted = r->sh.aborted_rank;
  uv_mutex_unlock(&r->sh.mu);
  pw_ctl_send(r->w, PW_CONTROL_BUILD(PW_MSG_ERROR, pw_msg_error, NULL, .job = (int64_t)r->job, .run = r->run_id,
                                     .rank = r->rank, .message = r->sh.error, .lost_rank = lost,
                                     .restore_failed = restore ? 1 : -1, .peer_aborted = aborted));
  finish(r, 0);
}

void pw_run_cancel(pw_run *r, const char *reason) {
  if (r->lp.closing) return;
  pw_info("job %llu run %d cancelled: %s", (unsigned long long)r->job, r->run_id, reason ? reason : "");
  snprintf(r->sh.error, sizeof r->sh.error, "cancelled: %s", reason ? reason : "");
  finish(r, 0);
}

/* ---- links ---------------------------------------------------------------- */

void pw_run_on_link_up(pw_run *r, pw_link *l) {
  /* A HELLO whose write completes after the run ended (finish() gave its
   * links back: peer_rank -1) is no link of the run's any more. */
  if (r->lp.closing || (l && (l->peer_rank < 0 || l->peer_rank >= r->n_ranks))) return;
  if (l) {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&l->tcp, &fd)) {
      pw_run_fail(r, "link to rank %d has no socket", l->peer_rank);
      return;
    }
    uv_mutex_lock(&r->sh.wmu);
    r->sh.wl[l->peer_rank].fd = fd;
    uv_mutex_unlock(&r->sh.wmu);
    r->lp.n_out_connected++;
  }
  if (r->lp.started || r->lp.closing || r->lp.n_out_connected < r->lp.n_out_needed) return;
  r->lp.started = 1;
  int rc = uv_thread_create(&r->lp.thread, pw_exec_main, r);
  if (rc) {
    pw_run_fail(r, "cannot start the compute thread: %s", uv_strerror(rc));
    return;
  }
  r->lp.thread_running = 1;
}

void pw_run_on_link_down(pw_run *r, pw_link *l, const char *why) {
  if (r->lp.closing || l->peer_rank < 0) return;
  int k = l->peer_rank;
  if (l->outbound && r->lp.out[k] == l) r->lp.out[k] = NULL;
  uv_mutex_lock(&r->sh.mu);
  if (r->sh.lost_rank < 0) r->sh.lost_rank = k;
  uv_mutex_unlock(&r->sh.mu);
  pw_run_fail(r, "lost peer rank %d (%s): %s", k, r->peer_addr[k][0] ? r->peer_addr[k] : l->addr, why);
}

/* ---- events from the compute thread ------------------------------------- */

static void on_event(pw_run *r, pw_event *ev) {
  switch (ev->kind) {
    case PW_EV_SEND: {
      pw_link *l = r->lp.closing ? NULL : r->lp.out[ev->to];
      int rc = l ? pw_net_send_encoded(l, r, ev->hdr, ev->payload, ev->len, ev->off, ev->to, ev->li, ev->slot,
                                       ev->pending, NULL)
                 : PW_EPEER;
      if (rc && ev->pending) atomic_fetch_sub(ev->pending, 1); /* never written: the entry is free again */
      if (rc && !r->lp.closing) pw_run_fail(r, "cannot send to rank %d: %s", ev->to, l ? uv_strerror(rc) : "no link");
      return;
    }
    case PW_EV_SNAP: /* said even once the run is over: it is what the worker's memory holds */
      pw_ctl_send(r->w, PW_CONTROL_BUILD(PW_MSG_SNAPSHOT, pw_msg_snapshot, NULL, .job = (int64_t)r->job,
                                         .run = r->run_id, .rank = r->rank, .stage = ev->stage, .step = ev->step,
                                         .held = ev->held));
      return;
    case PW_EV_CKPT:
      if (!r->lp.closing) pw_report_ckpt(r, ev);
      return;
    case PW_EV_STEP:
      if (!r->lp.closing) pw_report_step(r, ev);
      json_decref(ev->colls);
      if (ev->timings) {
        uv_mutex_lock(&r->sh.mu);
        r->sh.trace_busy[(ev->timings - r->sh.trace_buf) / r->n_acts] = 0;
        uv_mutex_unlock(&r->sh.mu);
      }
      return;
    case PW_EV_DONE:
      if (r->lp.closing) return;
      pw_info("job %llu run %d: rank %d done (%d steps, peak %d saved activations)", (unsigned long long)r->job,
              r->run_id, r->rank, r->steps, ev->peak_act);
      if (r->snaps) pw_snapstore_drop_others(r->snaps, 0); /* the job is over: no restore will ask */
      pw_ctl_send(r->w, PW_CONTROL_BUILD(PW_MSG_DONE, pw_msg_done, NULL, .job = (int64_t)r->job, .run = r->run_id,
                                         .rank = r->rank));
      finish(r, 1);
      return;
    case PW_EV_FAIL: {
      char why[sizeof r->sh.error];
      uv_mutex_lock(&r->sh.mu);
      snprintf(why, sizeof why, "%s", r->sh.error[0] ? r->sh.error : "compute failed");
      uv_mutex_unlock(&r->sh.mu);
      pw_run_fail(r, "%s", why);
      return;
    }
    case PW_EV_CTL:
      if (r->w && !r->lp.closing) pw_ctl_send(r->w, ev->msg);
      else json_decref(ev->msg);
      return;
    case PW_EV_EXIT:
      uv_thread_join(&r->lp.thread);
      r->lp.thread_running = 0;
      if (r->lp.closing) close_links_in(r);
      if (!r->lp.closing) pw_run_fail(r, "the compute thread stopped");
      maybe_free(r);
      return;
  }
}

int pw_run_event_next(pw_run *r, pw_event *ev) {
  uv_mutex_lock(&r->sh.mu);
  int got = r->sh.evq_len > 0;
  if (got) {
    *ev = r->sh.evq[r->sh.evq_head];
    r->sh.evq_head = (r->sh.evq_head + 1) % r->sh.evq_cap;
    r->sh.evq_len--;
  }
  uv_mutex_unlock(&r->sh.mu);
  return got;
}

void pw_run_on_events(uv_async_t *h) {
  pw_run *r = h->data;
  pw_event ev;
  for (int exited = 0; !exited && pw_run_event_next(r, &ev);) {
    exited = ev.kind == PW_EV_EXIT;
    on_event(r, &ev);
  }
}

/* ---- frames from peers -------------------------------------------------- */

static int tp_frame(const pw_frame_hdr *h) {
  return h->kind == PW_FRAME_REDUCE && (h->value == PW_TPX_RS || h->value == PW_TPX_AG);
}

static int frame_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  if (h->job != r->job) return pw_err_set(err, PW_EPROTO, "frame", "job %llu is not ours", (unsigned long long)h->job);
  if (tp_frame(h)) return pw_tpx_dest(r, from, h, dst, err);
  if (h->kind == PW_FRAME_REDUCE || h->kind == PW_FRAME_TIED) return pw_stepend_dest(r, from, h, dst, err);
  if (h->kind == PW_FRAME_SNAP) return pw_snaprun_dest(r, from, h, dst, err);
  if (r->serve) return pw_serve_dest(r, from, h, dst, err);
  if (h->kind != PW_FRAME_ACT && h->kind != PW_FRAME_GRAD)
    return pw_err_set(err, PW_EPROTO, "frame", "unexpected %s frame", pw_frame_kind_name(h->kind));
  int act = h->kind == PW_FRAME_ACT;
  if ((int)h->step != r->cp.tag && !(act && (int)h->step == pw_evalrun_next(r->cp.tag)))
    return pw_evalrun_refuse(r, h, err);
  if (h->stage >= (uint32_t)r->S || r->lidx_of_stage[h->stage] < 0)
    return pw_err_set(err, PW_EPROTO, "frame", "stage %u is not on this rank", h->stage);
  if (h->microbatch >= (uint32_t)r->m)
    return pw_err_set(err, PW_EPROTO, "frame", "microbatch %u of %d", h->microbatch, r->m);
  int li = r->lidx_of_stage[h->stage], mb = (int)h->microbatch;
  const pw_lstage *ls = &r->ls[li];
  const pw_lstage_compute *lc = &r->cp.ls[li];
  pw_prog *p = ls->prog;
  int v = (int)h->value;
  int idx = act ? port_index(pw_prog_input, pw_prog_n_inputs(p), p, v)
                : port_index(pw_prog_output, pw_prog_n_outputs(p), p, v);
  if (idx < 0 || (act && pw_prog_input(p, idx)->role != PW_VAL_ACT))
    return pw_err_set(err, PW_EPROTO, "frame", "value %d is not a %s port of stage %u", v, act ? "input" : "output",
                      h->stage);
  const pw_prog_port *pt = act ? pw_prog_input(p, idx) : pw_prog_output(p, idx);
  int peer_stage = act ? pw_run_producer(r, v) : pw_run_consumer(r, v);
  if (from != pw_run_global_rank(r, peer_stage))
    return pw_err_set(err, PW_EPROTO, "frame", "value %d comes from rank %d, not %d", v, pw_run_global_rank(r, peer_stage),
                      from);
  /* a bf16 run's activations come as bf16 (exec.c), widened by pw_run_frame_done */
  int dt = act && r->spec.train.precision == PW_PRECISION_BF16 ? PW_DTYPE_BF16 : PW_DTYPE_F32;
  if (h->dtype != dt || h->payload_len != pt->bytes / 4 * pw_frame_dtype_size(dt))
    return pw_err_set(err, PW_EPROTO, "frame", "value %d: %llu bytes of %s, expected %zu bytes of %s", v,
                      (unsigned long long)h->payload_len, pw_frame_dtype_name(h->dtype),
                      pt->bytes / 4 * pw_frame_dtype_size(dt), pw_frame_dtype_name(dt));
  if (act) {
    if ((lc->act_step[mb] == (int)h->step && lc->act_got[mb] >= ls->n_act_in))
      return pw_err_set(err, PW_EPROTO, "frame", "activation for microbatch %d of stage %u sent twice", mb, h->stage);
    int slot = pw_run_slot_for(r, li, mb, err);
    if (slot < 0) return slot;
    *dst = pw_prog_value(p, slot, v);
  } else {
    int slot = lc->mb_slot[mb];
    if (slot < 0) return pw_err_set(err, PW_EPROTO, "frame", "gradient for microbatch %d before its forward", mb);
    if (lc->grad_step[mb] == r->cp.tag && lc->grad_got[mb] >= ls->n_grad_in)
      return pw_err_set(err, PW_EPROTO, "frame", "gradient for microbatch %d of stage %u sent twice", mb, h->stage);
    *dst = pw_prog_grad(p, slot, v);
  }
  return 0;
}

int pw_run_frame_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  *dst = NULL;
  if (atomic_load(&r->sh.abort)) return pw_err_set(err, PW_EPROTO, "frame", "run is over");
  uv_mutex_lock(&r->sh.mu);
  int rc = frame_dest(r, from, h, dst, err);
  uv_mutex_unlock(&r->sh.mu);
  return rc;
}

static void frame_done(pw_run *r, const pw_frame_hdr *h) {
  pw_lstage_compute *lc = &r->cp.ls[r->lidx_of_stage[h->stage]];
  int mb = (int)h->microbatch, step = (int)h->step;
  if (h->kind == PW_FRAME_ACT) {
    if (lc->act_step[mb] != step) lc->act_step[mb] = step, lc->act_got[mb] = 0;
    lc->act_got[mb]++;
  } else {
    if (lc->grad_step[mb] != step) lc->grad_step[mb] = step, lc->grad_got[mb] = 0;
    lc->grad_got[mb]++;
  }
}

int pw_run_frame_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  int rc = 0;
  if (h->kind == PW_FRAME_ACT && h->dtype == PW_DTYPE_BF16) /* in place, before anyone may read it */
    pw_bf16_widen_inplace((void *)payload, h->payload_len / 2);
  uv_mutex_lock(&r->sh.mu);
  if (tp_frame(h))
    rc = pw_tpx_frame(r, from, h, err);
  else if (h->kind == PW_FRAME_REDUCE || h->kind == PW_FRAME_TIED)
    rc = pw_stepend_frame(r, from, h, payload, err);
  else if (h->kind == PW_FRAME_SNAP)
    rc = pw_snaprun_frame(r, from, h, err);
  else if (r->serve)
    pw_serve_frame(r, h);
  else
    frame_done(r, h);
  uv_mutex_unlock(&r->sh.mu);
  if (r->cp.report_step > 0) { /* a peer's snapshot is complete here: the coordinator counts on it */
    pw_event ev = {.kind = PW_EV_SNAP, .stage = r->cp.report_stage, .step = r->cp.report_step, .held = 1};
    r->cp.report_step = 0;
    if (pw_exec_post(r, &ev)) pw_warn("job %llu: out of memory reporting a held snapshot", (unsigned long long)r->job);
  }
  return rc;
}
