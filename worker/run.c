/* run: the loop thread's side of a run — its end (done, failed or
 * cancelled), its outbound links, and the events its compute thread
 * queues (frames a socket did not take, step reports, snapshots, done,
 * failed). The run is made in run_setup.c; its compute thread is exec.c;
 * run.h says who owns which field. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "run.h"
#include "serve.h"

static void finish(pw_run *r, int ok);

static void maybe_free(pw_run *r) {
  if (r->lp.closing && !r->lp.thread_running && r->lp.sends_inflight == 0) pw_run_free(r);
}

void pw_run_send_done(pw_run *r, int to, int li, int slot) {
  r->lp.sends_inflight--;
  if (to >= 0) {
    uv_mutex_lock(&r->sh.out.mu);
    r->sh.out.link[to].queued--;
    uv_mutex_unlock(&r->sh.out.mu);
  }
  pw_run_slot_sent(r, li, slot);
  maybe_free(r);
}

void pw_run_link_in(pw_run *r, int k, int fd) {
  if (k < 0 || k >= r->cx.n_ranks) return;
  uv_mutex_lock(&r->sh.mu);
  r->sh.in_fd[k] = fd;
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
  if (r->serve) pw_serve_free(r->serve);
  pw_dpx_close(&r->dpx);
  pw_pipex_close(&r->pipex);
  pw_snaprun_close(&r->snap);
  pw_evalrun_close(&r->eval);
  for (int li = 0; li < r->cx.n_ls; li++) {
    pw_prog_free(r->cx.ls[li].prog);
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
  free(r->cx.ls);
  free(r->sh.ls);
  free(r->cp.ls);
  free((int *)r->cx.rank_of_stage);
  free((int *)r->cx.lidx_of_stage);
  free(r->lp.out.link);
  free(r->peers);
  free(r->cp.timings);
  free(r->sh.trace.buf);
  pw_dataset_close(r->data.ds);
  if (r->data.held) pw_dscache_release(r->data.cache, r->cfg.sl.data.dataset); /* (the compute thread is joined) */
  pw_tpx_close(&r->tpx);
  pw_slice_free(&r->cfg.sl);
  json_decref(r->assign);
  free(r->sh.ev.q);
  free(r->sh.out.link);
  for (int k = 0; r->cp.io.in && k < r->cx.n_ranks; k++) pw_frame_reader_free(&r->cp.io.in[k].rd);
  free(r->cp.io.in);
  free(r->sh.in_fd);
  close(r->sh.wake_fd);
  uv_mutex_destroy(&r->sh.out.mu);
  uv_mutex_destroy(&r->sh.mu);
  free(r);
}

static void on_async_closed(uv_handle_t *h) { run_destroy(h->data); }

/* Only once the compute thread has been joined (or never started). */
void pw_run_free(pw_run *r) {
  if (!r) return;
  if (r->host.released) r->host.released(r->host.arg, r);
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
  if (r->host.drain_in) r->host.drain_in(r->host.arg, r);
}

/* Ends the run: links to peers closed (with BYE when it succeeded, so they
 * do not take it for a failure), the worker free for the next assignment,
 * the memory released once the last write callback has run. */
static void finish(pw_run *r, int ok) {
  if (r->lp.closing) return;
  r->lp.closing = 1;
  if (r->host.released) r->host.released(r->host.arg, r);
  /* The links are the loop's alone from here (waits for a direct write
   * in progress), so BYE cannot interleave with a frame. */
  uv_mutex_lock(&r->sh.out.mu);
  for (int k = 0; k < r->cx.n_ranks && r->sh.out.link; k++) r->sh.out.link[k].fd = -1;
  uv_mutex_unlock(&r->sh.out.mu);
  for (int k = 0; k < r->cx.n_ranks; k++) {
    pw_link *l = r->lp.out.link ? r->lp.out.link[k] : NULL;
    if (!l) continue;
    r->lp.out.link[k] = NULL;
    if (r->host.bye) r->host.bye(l, r->cx.job, ok ? NULL : r->sh.why.error[0] ? r->sh.why.error : "cancelled");
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
  vsnprintf(r->sh.why.error, sizeof r->sh.why.error, fmt, ap);
  va_end(ap);
  pw_error("job %llu run %d rank %d failed at step %d: %s", (unsigned long long)r->cx.job, r->cx.run_id, r->cx.rank,
           r->sh.step, r->sh.why.error);
  uv_mutex_lock(&r->sh.mu);
  int lost = r->sh.why.lost_rank, aborted = r->sh.why.aborted_rank;
  uv_mutex_unlock(&r->sh.mu);
  pw_run_tell(r, PW_CONTROL_BUILD(PW_MSG_ERROR, pw_msg_error, NULL, .job = (int64_t)r->cx.job, .run = r->cx.run_id,
                                  .rank = r->cx.rank, .message = r->sh.why.error, .lost_rank = lost,
                                  .restore_failed = r->snap.restore_failed ? 1 : -1, .peer_aborted = aborted));
  finish(r, 0);
}

int pw_run_stop_at(pw_run *r, int steps, char *why, size_t cap) {
  int rc = 0;
  uv_mutex_lock(&r->sh.mu);
  if (steps >= r->cfg.steps) {
    /* its own end comes first */
  } else if (r->sh.step < steps - 1) {
    r->sh.stop_at = steps;
  } else {
    snprintf(why, cap, "cannot stop after step %d: step %d has begun", steps, r->sh.step + 1);
    rc = PW_ECONFLICT;
  }
  uv_mutex_unlock(&r->sh.mu);
  if (!rc) pw_info("job %llu run %d: stopping after step %d (a drain)", (unsigned long long)r->cx.job, r->cx.run_id,
                   steps < r->cfg.steps ? steps : r->cfg.steps);
  return rc;
}

void pw_run_cancel(pw_run *r, const char *reason) {
  if (r->lp.closing) return;
  pw_info("job %llu run %d cancelled: %s", (unsigned long long)r->cx.job, r->cx.run_id, reason ? reason : "");
  snprintf(r->sh.why.error, sizeof r->sh.why.error, "cancelled: %s", reason ? reason : "");
  finish(r, 0);
}

/* ---- links ---------------------------------------------------------------- */

void pw_run_on_link_up(pw_run *r, int k, int fd) {
  /* A HELLO whose write completes after the run ended (finish() gave its
   * links back) is no link of the run's any more. */
  if (r->lp.closing || k >= r->cx.n_ranks) return;
  if (k >= 0) {
    uv_mutex_lock(&r->sh.out.mu);
    r->sh.out.link[k].fd = fd;
    uv_mutex_unlock(&r->sh.out.mu);
    r->lp.out.connected++;
  }
  if (r->lp.started || r->lp.closing || r->lp.out.connected < r->lp.out.needed) return;
  r->lp.started = 1;
  int rc = uv_thread_create(&r->lp.thread, pw_exec_main, r);
  if (rc) {
    pw_run_fail(r, "cannot start the compute thread: %s", uv_strerror(rc));
    return;
  }
  r->lp.thread_running = 1;
}

void pw_run_on_link_down(pw_run *r, int k, int outbound, const char *addr, const char *why) {
  if (r->lp.closing || k < 0 || k >= r->cx.n_ranks) return;
  if (outbound) r->lp.out.link[k] = NULL;
  uv_mutex_lock(&r->sh.mu);
  if (r->sh.why.lost_rank < 0) r->sh.why.lost_rank = k;
  uv_mutex_unlock(&r->sh.mu);
  pw_run_fail(r, "lost peer rank %d (%s): %s", k, r->peers[k].addr[0] ? r->peers[k].addr : addr, why);
}

/* ---- events from the compute thread ------------------------------------- */

static void on_event(pw_run *r, pw_event *ev) {
  switch (ev->kind) {
    case PW_EV_SEND: {
      pw_link *l = r->lp.closing ? NULL : r->lp.out.link[ev->to];
      int rc = l && r->host.send ? r->host.send(l, r, ev->hdr, ev->payload, ev->len, ev->off, ev->to, ev->li, ev->slot,
                                                ev->pending)
                                 : PW_EPEER;
      if (rc && ev->pending) atomic_fetch_sub(ev->pending, 1); /* never written: the entry is free again */
      if (rc && !r->lp.closing) pw_run_fail(r, "cannot send to rank %d: %s", ev->to, l ? uv_strerror(rc) : "no link");
      return;
    }
    case PW_EV_SNAP: /* said even once the run is over: it is what the worker's memory holds */
      pw_run_tell(r, PW_CONTROL_BUILD(PW_MSG_SNAPSHOT, pw_msg_snapshot, NULL, .job = (int64_t)r->cx.job,
                                      .run = r->cx.run_id, .rank = r->cx.rank, .stage = ev->stage, .step = ev->step,
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
        r->sh.trace.busy[(ev->timings - r->sh.trace.buf) / r->cx.n_acts] = 0;
        uv_mutex_unlock(&r->sh.mu);
      }
      return;
    case PW_EV_DONE:
      if (r->lp.closing) return;
      pw_info("job %llu run %d: rank %d done (%d steps, peak %d saved activations)", (unsigned long long)r->cx.job,
              r->cx.run_id, r->cx.rank, r->cfg.steps, ev->peak_act);
      if (r->snap.store) pw_snapstore_drop_others(r->snap.store, 0); /* the job is over: no restore will ask */
      pw_run_tell(r, PW_CONTROL_BUILD(PW_MSG_DONE, pw_msg_done, NULL, .job = (int64_t)r->cx.job, .run = r->cx.run_id,
                                      .rank = r->cx.rank));
      finish(r, 1);
      return;
    case PW_EV_FAIL: {
      char why[sizeof r->sh.why.error];
      uv_mutex_lock(&r->sh.mu);
      snprintf(why, sizeof why, "%s", r->sh.why.error[0] ? r->sh.why.error : "compute failed");
      uv_mutex_unlock(&r->sh.mu);
      pw_run_fail(r, "%s", why);
      return;
    }
    case PW_EV_CTL:
      if (!r->lp.closing) pw_run_tell(r, ev->msg);
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
  int got = r->sh.ev.len > 0;
  if (got) {
    *ev = r->sh.ev.q[r->sh.ev.head];
    r->sh.ev.head = (r->sh.ev.head + 1) % r->sh.ev.cap;
    r->sh.ev.len--;
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
