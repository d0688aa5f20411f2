/* snaprun: a run's side of the in-memory snapshots (snap.h).
 *
 * Taking: after the update of every train.snapshot_every-th step, each
 * local stage's parameters and moments are copied into an OWN entry of the
 * worker's store and sent, as three SNAP frames (value 0 parameters, 1 m,
 * 2 v; microbatch 0), to the holder rank, whose compute thread reads them
 * into a HELD entry while it waits for its own inputs: the copy travels in
 * the idle time of the schedule, and the socket's buffers and the loop
 * thread carry what a busy receiver cannot read at once.
 *
 * Restoring: a run started after a loss names a step and, per stage, the
 * rank whose memory has that stage at that step (assign.restore_from).
 * That rank copies its entry into its own stage, or sends it (microbatch
 * 1) to every rank of the stage, which reads it into a RESTORE entry and
 * then into its program. No rank steps before every stage is restored.
 *
 * Every count and size in a SNAP header is checked before a byte of its
 * payload lands: the stage and sender must fit the plan, a restored stage
 * must be exactly the program's size, a held one at most the model's. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "worker.h"

enum { SNAP_HOLD = 0, SNAP_RESTORE = 1 };
#define SNAP_LATE 3 /* snapshots left to the step end, net of those taken in a wait, before a rank copies after its update */

int pw_snaprun_holder(const pw_run *r, int g) {
  if (r->n_ranks < 2) return -1;
  for (int i = 1; i < r->n_ranks; i++) {
    int k = (g + i) % r->n_ranks;
    if (!pw_exec_same_host(r, g, k)) return k;
  }
  return (g + 1) % r->n_ranks;
}

int pw_snaprun_alloc(pw_run *r) {
  r->cp.rx = calloc((size_t)r->n_ranks, sizeof *r->cp.rx);
  r->cp.rx_next = calloc((size_t)r->n_ranks, sizeof *r->cp.rx_next);
  r->cp.rx_step = calloc((size_t)r->n_ranks, sizeof *r->cp.rx_step);
  return r->cp.rx && r->cp.rx_next && r->cp.rx_step ? 0 : PW_ENOMEM;
}

void pw_snaprun_free(pw_run *r) {
  for (int k = 0; r->cp.rx && k < r->n_ranks; k++)
    if (r->cp.rx[k]) pw_snap_end_write(r->snaps, r->cp.rx[k], 0); /* half received: invalid */
  free(r->cp.rx);
  free(r->cp.rx_next);
  free(r->cp.rx_step);
  r->cp.rx = NULL;
  r->cp.rx_next = NULL;
  r->cp.rx_step = NULL;
}

int pw_snaprun_assign(pw_run *r, const pw_msg_assign *a, pw_err *err) {
  if (a->restore_step <= 0 && !a->restore_from) return 0;
  if (a->restore_step != r->start_step || !a->restore_from || json_array_size(a->restore_from) != (size_t)r->S)
    return pw_err_set(err, PW_EPROTO, "assign.restore_from", "must name a rank for each of the %d stages, with "
                      "restore_step = start_step", r->S);
  if (!(r->restore_from = malloc(sizeof(int) * (size_t)r->S))) return pw_err_set(err, PW_ENOMEM, "assign", "out of memory");
  for (int st = 0; st < r->S; st++) {
    json_int_t k = json_integer_value(json_array_get(a->restore_from, (size_t)st));
    if (k >= r->n_ranks) return pw_err_set(err, PW_EPROTO, "assign.restore_from", "rank %lld outside the mesh", (long long)k);
    r->restore_from[st] = (int)k;
  }
  r->restore_step = (int)a->restore_step;
  return 0;
}

/* ---- sending ----------------------------------------------------------------- */

static int send_entry(pw_run *r, pw_snap *e, int to, int purpose) {
  for (int part = 0; part < 3; part++) {
    pw_frame_hdr h;
    int rc = pw_frame_hdr_init_vec(&h, PW_FRAME_SNAP, r->job, (uint32_t)e->step, (uint32_t)purpose, (uint32_t)e->stage,
                                   (uint32_t)part, PW_DTYPE_F32, e->numel);
    if (rc)
      return pw_exec_fail(r, rc, NULL, "no frame header for a snapshot of stage %d (%zu floats): %s", e->stage, e->numel,
                          pw_strerror(rc));
    if ((rc = pw_exec_send_pending(r, to, &h, e->data + (size_t)part * e->numel, &e->sending))) return rc;
  }
  return 0;
}

/* A snapshot is params, m, v at numel floats each: the moments of frozen
 * parameters do not exist: train_numel of each, the rest is unused. */
static void copy_in(pw_prog *p, const float *src, size_t n) {
  size_t tn = pw_prog_train_numel(p);
  memcpy(pw_prog_params(p), src, n * sizeof(float));
  memcpy(pw_prog_moment(p, 0), src + n, tn * sizeof(float));
  memcpy(pw_prog_moment(p, 1), src + 2 * n, tn * sizeof(float));
}

static void post_snap(pw_run *r, int stage, int step, int held) {
  pw_event ev = {.kind = PW_EV_SNAP, .stage = stage, .step = step, .held = held};
  if (pw_exec_post(r, &ev)) pw_warn("job %llu: out of memory reporting a snapshot", (unsigned long long)r->job);
}

static void copy_out(pw_prog *p, float *dst, size_t n) {
  memcpy(dst, pw_prog_params(p), n * sizeof(float));
  size_t tn = pw_prog_train_numel(p);
  memcpy(dst + n, pw_prog_moment(p, 0), tn * sizeof(float));
  memcpy(dst + 2 * n, pw_prog_moment(p, 1), tn * sizeof(float));
}

/* In the next step's first wait that finds nothing to read (recv.c), when
 * the rank would idle; else at that step's end, before any of its
 * exchanges (stepend.c). So a peer finishes a step only after this rank
 * took the snapshot of the step before, and the ranks' newest snapshots
 * stay at most a step apart, as snap.h's two generations need. In one go:
 * copying a piece per wait measured slower (the pieces delayed the inputs
 * they waited for, and the sends landed mid-step). */
static void take(pw_run *r) {
  int done = r->cp.snap_due;
  r->cp.snap_due = 0;
  if (!done) return;
  if (atomic_load(&r->sh.abort)) return; /* cancelled: its restart may be about to read the older ones */
  double t0 = pw_now();
  for (int li = 0; li < r->n_ls; li++) {
    pw_prog *p = r->ls[li].prog;
    size_t n = pw_prog_numel(p);
    pw_snap *e = pw_snap_begin_write(r->snaps, r->job, r->ls[li].stage, PW_SNAP_OWN, done, n);
    if (!e) { /* both generations still being sent: the link is slower than the steps */
      if (r->cp.snaps_skipped++ == 0)
        pw_warn("job %llu rank %d: snapshot of step %d skipped: the previous ones are still being sent",
                (unsigned long long)r->job, r->rank, done);
      continue;
    }
    copy_out(p, e->data, n);
    pw_snap_end_write(r->snaps, e, done);
    post_snap(r, r->ls[li].stage, done, 0);
    /* A failed send fails the run at its next wait, as any frame's does. */
    if (r->snap_holder >= 0 && send_entry(r, e, r->snap_holder, SNAP_HOLD)) break;
  }
  r->cp.snaps_taken++;
  r->cp.snap_seconds += pw_now() - t0;
}

/* Not at the step's end: the parameters and moments stay as they are
 * until the next step's update, and a copy there delayed the next step's
 * first action, and with it every rank that waits on it (~90 us of the
 * pp = 2 case's step). */
void pw_snaprun_due(pw_run *r) {
  int k = r->spec.train.snapshot_every, done = r->sh.step + 1;
  if (!r->snaps || k <= 0 || done % k || done >= r->steps || r->spec.mode == PW_MODE_FORWARD) return;
  r->cp.snap_due = done;
  if (r->n_ranks == 1 || r->cp.snap_late >= SNAP_LATE) take(r); /* no later point is cheaper */
}

void pw_snaprun_idle(pw_run *r) {
  if (!r->cp.snap_due) return;
  if (r->cp.snap_late > 0) r->cp.snap_late--;
  take(r);
}

/* At the step end the copy delays the exchange every rank waits on: a
 * rank whose waits keep finding their inputs there (the last stage, whose
 * one wait of a step, for its first activation, is short) copies right
 * after its update instead, where it would wait for that activation
 * anyway. */
void pw_snaprun_overdue(pw_run *r) {
  if (!r->cp.snap_due) return;
  if (r->cp.snap_late < SNAP_LATE) r->cp.snap_late++;
  take(r);
}

/* ---- restoring ---------------------------------------------------------------- */

static int restore_fail(pw_run *r, pw_err *err, int stage, const char *where) {
  uv_mutex_lock(&r->sh.mu);
  r->sh.restore_failed = 1;
  uv_mutex_unlock(&r->sh.mu);
  return pw_err_set(err, PW_ENOENT, "restore", "the snapshot of stage %d after step %d is not in %s", stage,
                    r->restore_step, where);
}

static int restored_all(pw_run *r, const void *arg) { return r->cp.restore_got >= *(const int *)arg; }

int pw_snaprun_restore(pw_run *r, pw_err *err) {
  int S = r->restore_step, expect = 0, rc;
  /* What this rank holds goes out first: a rank waiting for its own
   * stage must never hold back what another waits for. */
  for (int st = 0; st < r->S; st++) {
    if (r->restore_from[st] != r->rank) continue;
    pw_snap *e = r->snaps ? pw_snap_acquire(r->snaps, r->job, st, S) : NULL;
    if (!e) return restore_fail(r, err, st, "this worker's memory any more");
    rc = 0;
    for (int d = 0; d < r->dp && !rc; d++) {
      int to = pw_run_rank_of(r, d, r->rank_of_stage[st]);
      if (to != r->rank) rc = send_entry(r, e, to, SNAP_RESTORE);
    }
    pw_snap_release(r->snaps, e);
    if (rc) return pw_err_set(err, rc, "restore", "cannot send the snapshot of stage %d", st);
  }
  for (int li = 0; li < r->n_ls; li++) expect += r->restore_from[r->ls[li].stage] != r->rank;
  if (expect && (rc = pw_exec_wait(r, restored_all, &expect)))
    return pw_err_set(err, rc, "restore", "waiting for the snapshots of %d stage%s: %s", expect, expect == 1 ? "" : "s",
                      r->sh.error[0] ? r->sh.error : pw_strerror(rc));
  /* Every stage from memory now, its own copy or the one a peer sent:
   * any entry of the stage at that step holds the same bits. */
  for (int li = 0; li < r->n_ls; li++) {
    int st = r->ls[li].stage;
    pw_snap *e = pw_snap_acquire(r->snaps, r->job, st, S);
    if (!e)
      return restore_fail(r, err, st,
                          r->restore_from[st] == r->rank ? "this worker's memory any more" : "what rank's peers sent");
    size_t n = e->numel;
    if (n == pw_prog_numel(r->ls[li].prog)) copy_in(r->ls[li].prog, e->data, n);
    pw_snap_release(r->snaps, e);
    if (n != pw_prog_numel(r->ls[li].prog))
      return pw_err_set(err, PW_EFORMAT, "restore", "the snapshot of stage %d has %zu floats, the stage %zu", st, n,
                        pw_prog_numel(r->ls[li].prog));
  }
  pw_info("job %llu run %d rank %d: stages restored from the in-memory snapshots of step %d (%d sent by peers)",
          (unsigned long long)r->job, r->run_id, r->rank, S, expect);
  return 0;
}

/* ---- receiving (sh.mu held) --------------------------------------------------- */

/* Floats in all of the model's parameters: no stage holds more. */
static size_t model_numel(const pw_run *r) {
  size_t n = 0;
  for (int i = 0; i < r->model.n_params; i++) n += r->model.params[i].numel;
  return n;
}

int pw_snaprun_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  /* Bounds checked on the header's unsigned fields before any becomes an
   * index (a stage of 2^32 - 1 must not turn into -1). */
  if (!r->snaps || h->dtype != PW_DTYPE_F32 || h->payload_len % 4 || h->value > 2 || h->stage >= (uint32_t)r->S ||
      h->step < 1 || h->step > INT_MAX || h->microbatch > SNAP_RESTORE)
    return pw_err_set(err, PW_EPROTO, "frame", "unexpected SNAP frame (stage %u, part %u, step %u, microbatch %u)",
                      h->stage, h->value, h->step, h->microbatch);
  int st = (int)h->stage, part = (int)h->value, step = (int)h->step, purpose = (int)h->microbatch;
  size_t n = (size_t)(h->payload_len / 4);
  int kind;
  if (purpose == SNAP_RESTORE) {
    int li = r->lidx_of_stage[st];
    if (!r->restore_from || step != r->restore_step || li < 0 || r->restore_from[st] != from ||
        n != pw_prog_numel(r->ls[li].prog))
      return pw_err_set(err, PW_EPROTO, "frame", "a restore of stage %d, step %d, %zu floats from rank %d does not fit",
                        st, step, n, from);
    kind = PW_SNAP_RESTORE;
  } else {
    if (pw_snaprun_holder(r, from) != r->rank || r->rank_of_stage[st] != from % r->pp || n > model_numel(r))
      return pw_err_set(err, PW_EPROTO, "frame", "a snapshot of stage %d from rank %d does not fit (%zu floats)", st,
                        from, n);
    kind = PW_SNAP_HELD;
  }
  pw_snap *e = r->cp.rx[from];
  /* parts 1 and 2 continue part 0: the same stage, size, step and purpose */
  if (part != r->cp.rx_next[from] ||
      (part > 0 && (r->cp.rx_step[from] != step || (e && (e->stage != st || e->numel != n || e->kind != kind)))))
    return pw_err_set(err, PW_EPROTO, "frame", "snapshot part %d of stage %d from rank %d out of order", part, st, from);
  r->cp.rx_step[from] = step;
  if (part == 0) {
    e = r->cp.rx[from] = pw_snap_begin_write(r->snaps, r->job, st, kind, step, n);
    if (!e) pw_warn("job %llu: no room for rank %d's snapshot of stage %d after step %d: not kept", (unsigned long long)r->job,
                    from, st, step);
  }
  r->cp.rx_next[from] = (part + 1) % 3;
  *dst = e ? e->data + (size_t)part * n : NULL; /* NULL: into the reader's buffer (bounded above), dropped */
  return 0;
}

int pw_snaprun_frame(pw_run *r, int from, const pw_frame_hdr *h, pw_err *err) {
  pw_snap *e = r->cp.rx[from];
  if (h->value != 2 || !e) return 0;
  r->cp.rx[from] = NULL;
  pw_snap_end_write(r->snaps, e, (int)h->step);
  if (e->kind == PW_SNAP_RESTORE) {
    r->cp.restore_got++;
  } else {
    r->cp.report_stage = e->stage;
    r->cp.report_step = (int)h->step;
  }
  return 0;
}
