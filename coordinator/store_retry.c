/* store_retry: the loop's checked writes and the queue of those the store
 * could not take yet (store_retry.h). It must never drop a write without
 * a log line and a count. */
#include "store_retry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

typedef struct {
  pw_write *v;     /* kept writes, oldest first from head; texts owned */
  int head, n, cap;
} writeq;

static const char *const kind_names[PW_W__N] = {
    [PW_W_METRIC] = "metrics",         [PW_W_PROGRESS] = "progress", [PW_W_TIMING] = "timing",
    [PW_W_CHECKPOINT] = "checkpoint",  [PW_W_RUN_FINISH] = "run end", [PW_W_JOB_STATE] = "state change",
    [PW_W_JOB_STATUS] = "status line", [PW_W_STAGE] = "partition",   [PW_W_ACTIONS] = "action list",
    [PW_W_ASSIGN] = "assignment",      [PW_W_WORKER_SEEN] = "worker last seen", [PW_W_EVENT] = "event",
    [PW_W_RUN_RESUME] = "start",       [PW_W_JOB_RESTARTS] = "restart count", [PW_W_RUN_STOP] = "drain step"};

/* Rewritten all the time: never kept. */
static int volatile_kind(pw_write_kind k) { return k == PW_W_JOB_STATUS || k == PW_W_WORKER_SEEN; }
/* What says why a job ended: kept even past the bound. */
static int critical_kind(pw_write_kind k) {
  return k == PW_W_RUN_FINISH || k == PW_W_JOB_STATE || k == PW_W_EVENT || k == PW_W_RUN_RESUME ||
         k == PW_W_JOB_RESTARTS || k == PW_W_RUN_STOP;
}
/* The store's failure, not the write's: worth retrying. */
static int transient(int rc) { return rc == PW_EIO || rc == PW_ENOMEM; }

const char *pw_write_describe(const pw_write *w, char *buf, size_t cap) {
  size_t l = 0;
  buf[0] = 0;
#define ADD(...) (l += (size_t)snprintf(buf + l, l < cap ? cap - l : 0, __VA_ARGS__), l = l < cap ? l : cap - 1)
  if (w->job) ADD("job %lld ", (long long)w->job);
  if (w->run) ADD("run %lld ", (long long)w->run);
  if (w->kind == PW_W_METRIC) ADD("step %d ", w->m.step);
  if (w->kind == PW_W_TIMING || w->kind == PW_W_CHECKPOINT) ADD("step %d ", w->step);
  if (w->kind == PW_W_TIMING || w->kind == PW_W_ACTIONS || w->kind == PW_W_ASSIGN) ADD("rank %d ", w->rank);
  if (w->kind == PW_W_CHECKPOINT || w->kind == PW_W_STAGE) ADD("stage %d ", w->stage);
  if (w->kind == PW_W_WORKER_SEEN) ADD("worker %lld ", (long long)w->worker);
  ADD("%s", w->kind >= 0 && w->kind < PW_W__N ? kind_names[w->kind] : "write");
  if (w->kind == PW_W_JOB_STATE) ADD(" to %s", pw_job_state_name(w->state));
  if (w->kind == PW_W_RUN_FINISH) ADD(" (%s)", w->text ? w->text : "");
  if (w->kind == PW_W_RUN_RESUME) ADD(" (step %d from %s)", w->step, w->text ? w->text : "?");
  if (w->kind == PW_W_JOB_RESTARTS) ADD(" (%d)", w->step);
#undef ADD
  return buf;
}

static int apply(pw_store *s, const pw_write *w, pw_err *err) {
  switch (w->kind) {
    case PW_W_METRIC: return pw_store_metric_insert(s, w->job, w->run, &w->m, err);
    case PW_W_PROGRESS: {
      int rc = pw_store_job_progress(s, w->job, w->step, w->m.loss, w->m.tokens_per_s, err);
      return rc || isnan(w->m.eval_loss) ? rc : pw_store_job_eval_loss(s, w->job, w->m.eval_loss, err);
    }
    case PW_W_TIMING: return pw_store_timing_insert(s, w->job, w->run, w->step, w->rank, w->text, err);
    case PW_W_CHECKPOINT:
      return pw_store_checkpoint_insert(s, w->job, w->run, w->step, w->stage, w->rank, w->text, w->bytes, err);
    case PW_W_RUN_FINISH: return pw_store_run_finish(s, w->run, w->text, w->text2, err);
    case PW_W_JOB_STATE: return pw_store_job_set_state(s, w->job, w->state, w->text, w->text2, err);
    case PW_W_JOB_STATUS: return pw_store_job_set_status(s, w->job, w->text, err);
    case PW_W_STAGE: return pw_store_stage_insert(s, w->run, w->stage, w->rank, w->text, w->bytes, w->flops, err);
    case PW_W_ACTIONS: return pw_store_actions_insert(s, w->run, w->rank, w->text, err);
    case PW_W_ASSIGN: return pw_store_assignment_insert(s, w->run, w->rank, w->worker, w->text, err);
    case PW_W_WORKER_SEEN: return pw_store_worker_seen(s, w->worker, w->text, err);
    case PW_W_EVENT: return pw_store_event(s, w->job, w->text, w->text2, err);
    case PW_W_RUN_RESUME: return pw_store_run_resume(s, w->run, w->step, w->text, err);
    case PW_W_JOB_RESTARTS: return pw_store_job_set_restarts(s, w->job, w->step, err);
    case PW_W_RUN_STOP: return pw_store_run_stop(s, w->run, w->step, err);
    case PW_W__N: break;
  }
  return pw_err_set(err, PW_EINVAL, "write", "unknown write kind %d", (int)w->kind);
}

static writeq *queue_of(pw_coord *c) {
  if (!c->writeq) c->writeq = calloc(1, sizeof(writeq));
  return c->writeq;
}

static void set_health(pw_coord *c, int pending, int failed, int dropped, const pw_err *e) {
  char b[sizeof c->store_error];
  pthread_mutex_lock(&c->mu);
  c->store_pending = pending;
  c->store_failures += (uint64_t)failed;
  c->store_dropped += (uint64_t)dropped;
  if (e) snprintf(c->store_error, sizeof c->store_error, "%s", pw_err_str(e, b, (int)sizeof b));
  else if (!pending) c->store_error[0] = 0;
  pthread_mutex_unlock(&c->mu);
}

static void free_write(pw_write *w) {
  free((char *)w->text);
  free((char *)w->text2);
}

/* Keeps a copy of w at the tail. */
static int keep(writeq *q, const pw_write *w) {
  if (q->head && q->head == q->n) q->head = q->n = 0;
  if (q->n == q->cap) {
    if (q->head) { /* reuse the flushed front before growing */
      memmove(q->v, q->v + q->head, sizeof *q->v * (size_t)(q->n - q->head));
      q->n -= q->head;
      q->head = 0;
    }
    if (q->n == q->cap) {
      int nc = q->cap ? q->cap * 2 : 64;
      pw_write *nv = realloc(q->v, sizeof *nv * (size_t)nc);
      if (!nv) return PW_ENOMEM;
      q->v = nv;
      q->cap = nc;
    }
  }
  pw_write *d = &q->v[q->n];
  *d = *w;
  d->text = w->text ? strdup(w->text) : NULL;
  d->text2 = w->text2 ? strdup(w->text2) : NULL;
  if ((w->text && !d->text) || (w->text2 && !d->text2)) {
    free_write(d);
    return PW_ENOMEM;
  }
  q->n++;
  return 0;
}

int pw_write_pending(pw_coord *c) {
  writeq *q = c->writeq;
  return q ? q->n - q->head : 0;
}

/* Status lines and last-seen stamps skip the queue (order does not
 * matter, the next one replaces them); a failure is counted, and logged
 * when they start and stop failing rather than every second. */
static int write_volatile(pw_coord *c, pw_store *s, const pw_write *w, pw_err *err) {
  static int failing;
  char d[160], b[600];
  pw_err e = {0};
  int rc = s ? apply(s, w, &e) : pw_err_set(&e, PW_EIO, "store", "the store cannot be opened");
  if (err) *err = e;
  if (!rc) {
    if (failing) pw_info("store: %s written again", pw_write_describe(w, d, sizeof d));
    failing = 0;
    return 0;
  }
  if (!transient(rc)) return rc;
  if (!failing) pw_warn("store: %s not written: %s", pw_write_describe(w, d, sizeof d), pw_err_str(&e, b, sizeof b));
  failing = 1;
  set_health(c, pw_write_pending(c), 1, 0, &e);
  return 1;
}

int pw_write_do(pw_coord *c, const pw_write *w, pw_err *err) {
  char d[160], b[600];
  pw_err e = {0};
  pw_store *s = pw_coord_store(c);
  if (volatile_kind(w->kind)) return write_volatile(c, s, w, err);
  writeq *q = queue_of(c);
  int pending = pw_write_pending(c), rc;
  if (pending) pending = pw_write_flush(c); /* keep the order: older writes first */
  if (!s) {
    rc = pw_err_set(&e, PW_EIO, "store", "the store cannot be opened");
  } else if (!pending) {
    rc = apply(s, w, &e);
    if (!rc) return 0;
  } else {
    rc = pw_err_set(&e, PW_EIO, "store", "%d earlier writes still pending", pending);
  }
  if (err) *err = e;
  pw_write_describe(w, d, sizeof d);
  if (!transient(rc)) {
    pw_warn("store: %s refused: %s", d, pw_err_str(&e, b, sizeof b));
    return rc;
  }
  if (!q || (pending >= PW_WRITEQ_MAX && !critical_kind(w->kind)) || keep(q, w)) {
    pw_error("store: %s LOST: %s (%d writes pending)", d, pw_err_str(&e, b, sizeof b), pending);
    set_health(c, pending, 1, 1, pending ? NULL : &e);
    return PW_ETOOBIG;
  }
  pw_error("store: %s failed: %s; kept in memory for a retry (%d pending)", d, pw_err_str(&e, b, sizeof b),
           pending + 1);
  /* queued behind earlier writes: the health keeps their error (the cause) */
  set_health(c, pending + 1, 1, 0, pending ? NULL : &e);
  return 1;
}

int pw_write_flush(pw_coord *c) {
  writeq *q = c->writeq;
  if (!q || q->head == q->n) return 0;
  pw_store *s = pw_coord_store(c);
  if (!s) return q->n - q->head;
  int done = 0;
  pw_err e = {0};
  char d[160], b[600];
  while (q->head < q->n) {
    pw_write *w = &q->v[q->head];
    int rc = apply(s, w, &e);
    if (rc && transient(rc)) break;
    if (rc) pw_warn("store: kept %s refused: %s", pw_write_describe(w, d, sizeof d), pw_err_str(&e, b, sizeof b));
    free_write(w);
    q->head++;
    done++;
  }
  int left = q->n - q->head;
  if (!left) q->head = q->n = 0;
  if (done && !left) pw_info("store: writes work again; %d kept write%s recorded", done, done == 1 ? "" : "s");
  set_health(c, left, 0, 0, left ? &e : NULL);
  return left;
}

void pw_write_shutdown(pw_coord *c) {
  writeq *q = c->writeq;
  if (!q) return;
  pw_write_flush(c);
  char d[160];
  for (int i = q->head; i < q->n; i++) {
    pw_error("store: %s never written (coordinator stopping)", pw_write_describe(&q->v[i], d, sizeof d));
    free_write(&q->v[i]);
  }
  free(q->v);
  free(q);
  c->writeq = NULL;
}
