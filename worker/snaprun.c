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
#include "snaprun.h"

enum { SNAP_HOLD = 0, SNAP_RESTORE = 1 };
#define SNAP_LATE 3 /* snapshots left to the step end, net of those taken in a wait, before a rank copies after its update */

int pw_snaprun_holder(const pw_rctx *c, int g) {
  if (c->n_ranks < 2) return -1;
  for (int i = 1; i < c->n_ranks; i++) {
    int k = (g + i) % c->n_ranks;
    if (!c->same_host(c->run, g, k)) return k;
  }
  return (g + 1) % c->n_ranks;
}

int pw_snaprun_init(pw_snaprun *x, const pw_rctx *cx, pw_snapstore *store) {
  memset(x, 0, sizeof *x);
  x->cx = cx, x->store = store, x->holder = -1;
  const pw_rctx *c = cx;
  x->rx = calloc((size_t)c->n_ranks, sizeof *x->rx);
  x->rx_next = calloc((size_t)c->n_ranks, sizeof *x->rx_next);
  x->rx_step = calloc((size_t)c->n_ranks, sizeof *x->rx_step);
  return x->rx && x->rx_next && x->rx_step ? 0 : PW_ENOMEM;
}

void pw_snaprun_close(pw_snaprun *x) {
  const pw_rctx *c = x->cx;
  for (int k = 0; x->rx && k < c->n_ranks; k++)
    if (x->rx[k]) pw_snap_end_write(x->store, x->rx[k], 0); /* half received: invalid */
  free(x->rx);
  free(x->rx_next);
  free(x->rx_step);
  free(x->restore_from);
  x->rx = NULL;
  x->rx_next = NULL;
  x->rx_step = NULL;
  x->restore_from = NULL;
}

int pw_snaprun_assign(pw_snaprun *x, const pw_msg_assign *a, pw_err *err) {
  const pw_rctx *c = x->cx;
  if (a->restore_step <= 0 && !a->restore_from) return 0;
  if (a->restore_step != c->cfg->start_step || !a->restore_from || json_array_size(a->restore_from) != (size_t)c->S)
    return pw_err_set(err, PW_EPROTO, "assign.restore_from", "must name a rank for each of the %d stages, with "
                      "restore_step = start_step", c->S);
  if (!(x->restore_from = malloc(sizeof(int) * (size_t)c->S))) return pw_err_set(err, PW_ENOMEM, "assign", "out of memory");
  for (int st = 0; st < c->S; st++) {
    json_int_t k = json_integer_value(json_array_get(a->restore_from, (size_t)st));
    if (k >= c->n_ranks) return pw_err_set(err, PW_EPROTO, "assign.restore_from", "rank %lld outside the mesh", (long long)k);
    x->restore_from[st] = (int)k;
  }
  x->restore_step = (int)a->restore_step;
  return 0;
}

/* ---- sending ----------------------------------------------------------------- */

static int send_entry(pw_snaprun *x, pw_snap *e, int to, int purpose) {
  const pw_rctx *c = x->cx;
  for (int part = 0; part < 3; part++) {
    pw_frame_hdr h;
    int rc = pw_frame_hdr_init_vec(&h, PW_FRAME_SNAP, c->job, (uint32_t)e->step, (uint32_t)purpose, (uint32_t)e->stage,
                                   (uint32_t)part, PW_DTYPE_F32, e->numel);
    if (rc)
      return pw_rctx_fail(c, rc, NULL, "no frame header for a snapshot of stage %d (%zu floats): %s", e->stage, e->numel,
                          pw_strerror(rc));
    if ((rc = c->send(c->run, to, &h, e->data + (size_t)part * e->numel, &e->sending))) return rc;
  }
  return 0;
}

/* A snapshot is params, m, v at numel floats each: the moments of frozen
 * parameters do not exist: train_numel of each, the rest is unused. */
static int copy_in(pw_prog *p, const float *src, size_t n, pw_err *err) {
  size_t tn = pw_prog_train_numel(p);
  int rc = pw_prog_upload(p, pw_prog_params(p), src, n * sizeof(float), err);
  if (!rc) rc = pw_prog_upload(p, pw_prog_moment(p, 0), src + n, tn * sizeof(float), err);
  if (!rc) rc = pw_prog_upload(p, pw_prog_moment(p, 1), src + 2 * n, tn * sizeof(float), err);
  return rc;
}

static void post_snap(pw_snaprun *x, int stage, int step, int held) {
  const pw_rctx *c = x->cx;
  pw_event ev = {.kind = PW_EV_SNAP, .stage = stage, .step = step, .held = held};
  if (c->post(c->run, &ev)) pw_warn("job %llu: out of memory reporting a snapshot", (unsigned long long)c->job);
}

static int copy_out(pw_prog *p, float *dst, size_t n, pw_err *err) {
  size_t tn = pw_prog_train_numel(p);
  int rc = pw_prog_download(p, dst, pw_prog_params(p), n * sizeof(float), err);
  if (!rc) rc = pw_prog_download(p, dst + n, pw_prog_moment(p, 0), tn * sizeof(float), err);
  if (!rc) rc = pw_prog_download(p, dst + 2 * n, pw_prog_moment(p, 1), tn * sizeof(float), err);
  return rc;
}

/* In the next step's first wait that finds nothing to read (recv.c), when
 * the rank would idle; else at that step's end, before any of its
 * exchanges (stepend.c). So a peer finishes a step only after this rank
 * took the snapshot of the step before, and the ranks' newest snapshots
 * stay at most a step apart, as snap.h's two generations need. In one go:
 * copying a piece per wait measured slower (the pieces delayed the inputs
 * they waited for, and the sends landed mid-step). */
static void take(pw_snaprun *x) {
  const pw_rctx *c = x->cx;
  int done = x->due;
  x->due = 0;
  if (!done) return;
  if (atomic_load(c->abort)) return; /* cancelled: its restart may be about to read the older ones */
  double t0 = pw_now();
  for (int li = 0; li < c->n_ls; li++) {
    pw_prog *p = c->ls[li].prog;
    size_t n = pw_prog_numel(p);
    pw_snap *e = pw_snap_begin_write(x->store, c->job, c->ls[li].stage, PW_SNAP_OWN, done, n);
    if (!e) { /* both generations still being sent: the link is slower than the steps */
      if (x->skipped++ == 0)
        pw_warn("job %llu rank %d: snapshot of step %d skipped: the previous ones are still being sent",
                (unsigned long long)c->job, c->rank, done);
      continue;
    }
    pw_err err = {0};
    if (copy_out(p, e->data, n, &err)) /* off the CPU: a failed download; the device is lost for the run anyway */
      pw_warn("job %llu rank %d: snapshot of step %d: %s", (unsigned long long)c->job, c->rank, done, err.msg);
    pw_snap_end_write(x->store, e, done);
    post_snap(x, c->ls[li].stage, done, 0);
    /* A failed send fails the run at its next wait, as any frame's does. */
    if (x->holder >= 0 && send_entry(x, e, x->holder, SNAP_HOLD)) break;
  }
  x->taken++;
  x->seconds += pw_now() - t0;
}

/* Not at the step's end: the parameters and moments stay as they are
 * until the next step's update, and a copy there delayed the next step's
 * first action, and with it every rank that waits on it (~90 us of the
 * pp = 2 case's step). */
void pw_snaprun_due(pw_snaprun *x) {
  const pw_rctx *c = x->cx;
  int k = c->cfg->sl.train.snapshot_every, done = (*c->step) + 1;
  if (!x->store || k <= 0 || done % k || done >= c->cfg->steps || c->cfg->sl.mode == PW_MODE_FORWARD) return;
  x->due = done;
  if (c->n_ranks == 1 || x->late >= SNAP_LATE) take(x); /* no later point is cheaper */
}

void pw_snaprun_idle(pw_snaprun *x) {
  if (!x->due) return;
  if (x->late > 0) x->late--;
  take(x);
}

/* At the step end the copy delays the exchange every rank waits on: a
 * rank whose waits keep finding their inputs there (the last stage, whose
 * one wait of a step, for its first activation, is short) copies right
 * after its update instead, where it would wait for that activation
 * anyway. */
void pw_snaprun_overdue(pw_snaprun *x) {
  if (!x->due) return;
  if (x->late < SNAP_LATE) x->late++;
  take(x);
}

/* ---- restoring ---------------------------------------------------------------- */

static int restore_fail(pw_snaprun *x, pw_err *err, int stage, const char *where) {
  x->restore_failed = 1; /* read by the loop thread after the run's FAIL event */
  return pw_err_set(err, PW_ENOENT, "restore", "the snapshot of stage %d after step %d is not in %s", stage,
                    x->restore_step, where);
}

static int restored_all(void *arg) {
  const pw_snaprun *x = arg;
  return x->restore_got >= x->restore_want;
}

int pw_snaprun_restore(pw_snaprun *x, pw_err *err) {
  const pw_rctx *c = x->cx;
  int S = x->restore_step, expect = 0, rc;
  /* What this rank holds goes out first: a rank waiting for its own
   * stage must never hold back what another waits for. */
  for (int st = 0; st < c->S; st++) {
    if (x->restore_from[st] != c->rank) continue;
    pw_snap *e = x->store ? pw_snap_acquire(x->store, c->job, st, S) : NULL;
    if (!e) return restore_fail(x, err, st, "this worker's memory any more");
    rc = 0;
    for (int d = 0; d < c->dp && !rc; d++) {
      int to = pw_rctx_rank_of(c, d, c->rank_of_stage[st]);
      if (to != c->rank) rc = send_entry(x, e, to, SNAP_RESTORE);
    }
    pw_snap_release(x->store, e);
    if (rc) return pw_err_set(err, rc, "restore", "cannot send the snapshot of stage %d", st);
  }
  for (int li = 0; li < c->n_ls; li++) expect += x->restore_from[c->ls[li].stage] != c->rank;
  x->restore_want = expect;
  if (expect && (rc = c->wait(c->run, restored_all, x)))
    return pw_err_set(err, rc, "restore", "waiting for the snapshots of %d stage%s", expect, expect == 1 ? "" : "s");
  /* Every stage from memory now, its own copy or the one a peer sent:
   * any entry of the stage at that step holds the same bits. */
  for (int li = 0; li < c->n_ls; li++) {
    int st = c->ls[li].stage;
    pw_snap *e = pw_snap_acquire(x->store, c->job, st, S);
    if (!e)
      return restore_fail(x, err, st,
                          x->restore_from[st] == c->rank ? "this worker's memory any more" : "what rank's peers sent");
    size_t n = e->numel;
    rc = n == pw_prog_numel(c->ls[li].prog) ? copy_in(c->ls[li].prog, e->data, n, err) : 0;
    pw_snap_release(x->store, e);
    if (rc) return rc;
    if (n != pw_prog_numel(c->ls[li].prog))
      return pw_err_set(err, PW_EFORMAT, "restore", "the snapshot of stage %d has %zu floats, the stage %zu", st, n,
                        pw_prog_numel(c->ls[li].prog));
  }
  pw_info("job %llu run %d rank %d: stages restored from the in-memory snapshots of step %d (%d sent by peers)",
          (unsigned long long)c->job, c->run_id, c->rank, S, expect);
  return 0;
}

/* ---- receiving (sh.mu held) --------------------------------------------------- */

/* Floats in all of the model's parameters: no stage holds more. */
static size_t model_numel(const pw_snaprun *x) {
  const pw_rctx *c = x->cx;
  size_t n = 0;
  for (int i = 0; i < c->model->n_params; i++) n += c->model->params[i].numel;
  return n;
}

int pw_snaprun_dest(pw_snaprun *x, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  const pw_rctx *c = x->cx;
  /* Bounds checked on the header's unsigned fields before any becomes an
   * index (a stage of 2^32 - 1 must not turn into -1). */
  if (!x->store || h->dtype != PW_DTYPE_F32 || h->payload_len % 4 || h->value > 2 || h->stage >= (uint32_t)c->S ||
      h->step < 1 || h->step > INT_MAX || h->microbatch > SNAP_RESTORE)
    return pw_err_set(err, PW_EPROTO, "frame", "unexpected SNAP frame (stage %u, part %u, step %u, microbatch %u)",
                      h->stage, h->value, h->step, h->microbatch);
  int st = (int)h->stage, part = (int)h->value, step = (int)h->step, purpose = (int)h->microbatch;
  size_t n = (size_t)(h->payload_len / 4);
  int kind;
  if (purpose == SNAP_RESTORE) {
    int li = c->lidx_of_stage[st];
    if (!x->restore_from || step != x->restore_step || li < 0 || x->restore_from[st] != from ||
        n != pw_prog_numel(c->ls[li].prog))
      return pw_err_set(err, PW_EPROTO, "frame", "a restore of stage %d, step %d, %zu floats from rank %d does not fit",
                        st, step, n, from);
    kind = PW_SNAP_RESTORE;
  } else {
    if (pw_snaprun_holder(c, from) != c->rank || c->rank_of_stage[st] != from % c->pp || n > model_numel(x))
      return pw_err_set(err, PW_EPROTO, "frame", "a snapshot of stage %d from rank %d does not fit (%zu floats)", st,
                        from, n);
    kind = PW_SNAP_HELD;
  }
  pw_snap *e = x->rx[from];
  /* parts 1 and 2 continue part 0: the same stage, size, step and purpose */
  if (part != x->rx_next[from] ||
      (part > 0 && (x->rx_step[from] != step || (e && (e->stage != st || e->numel != n || e->kind != kind)))))
    return pw_err_set(err, PW_EPROTO, "frame", "snapshot part %d of stage %d from rank %d out of order", part, st, from);
  x->rx_step[from] = step;
  if (part == 0) {
    e = x->rx[from] = pw_snap_begin_write(x->store, c->job, st, kind, step, n);
    if (!e) pw_warn("job %llu: no room for rank %d's snapshot of stage %d after step %d: not kept", (unsigned long long)c->job,
                    from, st, step);
  }
  x->rx_next[from] = (part + 1) % 3;
  *dst = e ? e->data + (size_t)part * n : NULL; /* NULL: into the reader's buffer (bounded above), dropped */
  return 0;
}

int pw_snaprun_frame(pw_snaprun *x, int from, const pw_frame_hdr *h, pw_err *err) {
  pw_snap *e = x->rx[from];
  if (h->value != 2 || !e) return 0;
  x->rx[from] = NULL;
  pw_snap_end_write(x->store, e, (int)h->step);
  if (e->kind == PW_SNAP_RESTORE) {
    x->restore_got++;
  } else {
    x->report_stage = e->stage;
    x->report_step = (int)h->step;
  }
  return 0;
}
