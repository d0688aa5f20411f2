/* test_worker_fakectx: a run context (worker/rctx.h) without a run, for
 * the worker's subsystems' unit tests (test_worker_pipex.c, _dpx.c,
 * _tpx.c, _gradrs.c, _snaprun_fake.c, _evalrun.c, _serve.c); the run-level
 * tests use test_worker_fixture.h.
 *
 * A "net" of N fake ranks in one process. Each rank has its own pw_rctx
 * whose functions are these:
 *   send      queues the frame in the destination rank's inbox (a list
 *             under a mutex and a condition variable). The header goes
 *             through the wire's encode and decode, so a header the wire
 *             would refuse fails the send. The payload is NOT copied at the
 *             send: the receiver reads it from the sender's memory when it
 *             takes the frame, and checks it against the CRC taken at the
 *             send — the latest moment a real link may read it (a frame the
 *             socket does not take at once is written by the loop thread
 *             later, with the CRC computed at the send), so a sender that
 *             rewrites what it sent before the receiver read it fails here.
 *             `pending` counts the frame until the receiver has read it.
 *   wait      while !ready(arg): take the next frame of its own inbox
 *             (blocking; in a solo net, where the other ranks are not
 *             running, an empty inbox fails the wait instead of hanging),
 *             ask the route of its kind where the payload goes (NULL: a
 *             buffer of the fake's own), copy it there, then call the
 *             route's done — under the rank's frame lock, as route.c and
 *             io.c do for a run. A refused frame fails the wait (PW_EPEER)
 *             and its message is recorded, as io.c's lost() does.
 *   fail_run  records the first message (and counts them).
 *   post      records the events.
 *   wake      counts.
 *   same_host compares the net's host names.
 * Ranks run as threads (fk_run), or one thread drives them in turn
 * (fk_pump delivers what an inbox holds). Contexts come from a real
 * slice (fk_rank_slice: a job spec, pw_plan_build, pw_slice_build,
 * pw_slice_decode, as the coordinator and run_setup.c make them, and
 * programs as run_setup.c makes them) or from bare geometry (fk_geom). */
#ifndef PW_TEST_WORKER_FAKECTX_H
#define PW_TEST_WORKER_FAKECTX_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "crc32c.h"
#include "plan.h"
#include "rctx.h"
#include "slice.h"
#include "spec_json.h"

#define FK_JOB 77
#define FK_KINDS 16
#define FK_EVENTS 256

/* ---- a job and its plan, as the coordinator makes them ---------------------- */

typedef struct {
  pw_job job;
  pw_plan plan;
  char plan_sha[PW_SHA256_HEX_LEN + 1];
} fk_job;

static inline fk_job *fk_job_make(const char *spec) {
  fk_job *f = calloc(1, sizeof *f);
  json_t *j = json_loads(spec, 0, NULL);
  pw_err err = {0};
  char b[600];
  if (!f || !j || pw_job_parse(j, NULL, &f->job, &err)) fail_msg("spec: %s", pw_err_str(&err, b, sizeof b));
  json_decref(j);
  if (pw_plan_build(&f->job, NULL, &f->plan, &err)) fail_msg("plan: %s", pw_err_str(&err, b, sizeof b));
  json_t *doc = pw_plan_json(&f->job, &f->plan);
  char *text;
  assert_int_equal(pw_slice_plan_text(doc, &text, f->plan_sha), 0);
  free(text);
  json_decref(doc);
  return f;
}

static inline void fk_job_free(fk_job *f) {
  pw_plan_free(&f->plan);
  pw_job_free(&f->job);
  free(f);
}

/* ---- the fake net ---------------------------------------------------------------- */

typedef struct fk_frame {
  struct fk_frame *next;
  int from;
  pw_frame_hdr h;          /* as the wire decoded it (payload_crc: the sender's) */
  const void *src;         /* the sender's payload, read at delivery */
  atomic_int *pending;
} fk_frame;

typedef int (*fk_dest_fn)(void *sub, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
typedef int (*fk_done_fn)(void *sub, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);

typedef struct {
  fk_dest_fn dest;
  fk_done_fn done;
  void *sub;
} fk_route;

struct fk_net;

typedef struct {
  struct fk_net *net;
  pw_rctx cx;
  pw_runcfg cfg;           /* cx.cfg; cfg.sl decoded from a slice by fk_rank_slice, else zero */
  int has_slice;
  int *rank_of_stage, *lidx_of_stage; /* [S] */
  pw_lstage *ls;           /* [S] */
  int step, tag, eval;
  atomic_int abort;
  double t_step0;
  uv_mutex_t mu;           /* the frame lock (a run's sh.mu) */
  uv_mutex_t in_mu;        /* the inbox */
  uv_cond_t in_cv;
  fk_frame *head, *tail;
  int n_in;
  fk_route route[FK_KINDS];
  /* what the rank asked of its "run" */
  char failed[512];        /* the first fail_run message ("" none) */
  int n_fail;
  int fail_rc;
  pw_event ev[FK_EVENTS];
  int n_ev;
  atomic_int wakes;
  int frames_sent, frames_read;
  uint64_t bytes_sent;
} fk_rank;

typedef struct fk_net {
  int n;
  fk_rank *r;              /* [n] */
  int solo;                /* one thread drives the ranks: an empty inbox fails a wait */
  char host[64][16];       /* same_host: ranks with equal names share a machine */
  double timeout;          /* seconds a threaded wait blocks before failing */
} fk_net;

static inline int fk_fail_rank(fk_rank *r, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int fk_fail_rank(fk_rank *r, int rc, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  uv_mutex_lock(&r->mu);
  if (!r->failed[0]) snprintf(r->failed, sizeof r->failed, "%s", msg), r->fail_rc = rc;
  r->n_fail++;
  uv_mutex_unlock(&r->mu);
  return rc ? rc : PW_EINTERNAL;
}

static inline int fk_cx_fail(void *run, int rc, const pw_err *err, const char *msg) {
  char eb[512] = "";
  if (err) pw_err_str(err, eb, sizeof eb);
  return fk_fail_rank(run, rc, "%s%s%s", msg, msg[0] && eb[0] ? ": " : "", eb);
}

static inline int fk_cx_post(void *run, const pw_event *ev) {
  fk_rank *r = run;
  uv_mutex_lock(&r->mu);
  int ok = r->n_ev < FK_EVENTS;
  if (ok) r->ev[r->n_ev++] = *ev;
  uv_mutex_unlock(&r->mu);
  return ok ? 0 : PW_ENOMEM;
}

static inline void fk_cx_wake(void *run) { atomic_fetch_add(&((fk_rank *)run)->wakes, 1); }

static inline int fk_cx_same_host(void *run, int a, int b) {
  const fk_net *net = ((fk_rank *)run)->net;
  return !strcmp(net->host[a], net->host[b]);
}

static inline void fk_push(fk_rank *to, fk_frame *f) {
  uv_mutex_lock(&to->in_mu);
  if (to->tail)
    to->tail->next = f;
  else
    to->head = f;
  to->tail = f;
  to->n_in++;
  uv_cond_broadcast(&to->in_cv);
  uv_mutex_unlock(&to->in_mu);
}

static inline int fk_cx_send(void *run, int to, const pw_frame_hdr *h, const void *payload, atomic_int *pending) {
  fk_rank *r = run;
  fk_net *net = r->net;
  char hs[200], b[300];
  if (to < 0 || to >= net->n || to == r->cx.rank)
    return fk_fail_rank(r, PW_EINTERNAL, "send of %s to rank %d (we are %d of %d)", pw_frame_hdr_str(h, hs, sizeof hs),
                        to, r->cx.rank, net->n);
  /* what the wire makes of the header: a header it refuses fails here */
  uint8_t bytes[PW_FRAME_HDR_SIZE];
  pw_frame_hdr_encode(h, payload, bytes);
  fk_frame *f = calloc(1, sizeof *f);
  assert_non_null(f);
  pw_err err = {0};
  if (pw_frame_hdr_decode(bytes, SIZE_MAX, &f->h, &err)) {
    free(f);
    return fk_fail_rank(r, PW_EPROTO, "the wire refuses %s: %s", pw_frame_hdr_str(h, hs, sizeof hs),
                        pw_err_str(&err, b, sizeof b));
  }
  f->from = r->cx.rank, f->src = payload, f->pending = pending;
  if (pending) atomic_fetch_add(pending, 1);
  r->frames_sent++;
  r->bytes_sent += h->payload_len;
  fk_push(&net->r[to], f);
  return 0;
}

/* Frame f's payload into where its route says, and its end; the frame is
 * freed. A refusal is recorded (io.c's lost()) and returns PW_EPEER. */
static inline int fk_deliver(fk_rank *r, fk_frame *f) {
  const fk_route *rt = f->h.kind < FK_KINDS ? &r->route[f->h.kind] : NULL;
  pw_err err = {0};
  void *dst = NULL, *own = NULL;
  size_t len = (size_t)f->h.payload_len;
  int rc;
  char hs[200], b[600];
  if (!rt || !rt->dest) {
    rc = pw_err_set(&err, PW_EPROTO, "frame", "unexpected %s frame", pw_frame_kind_name(f->h.kind));
  } else {
    uv_mutex_lock(&r->mu);
    rc = rt->dest(rt->sub, f->from, &f->h, &dst, &err);
    uv_mutex_unlock(&r->mu);
  }
  /* the sender's bytes, as its link writes them now: what they were at
   * the send, or the run fails (the CRC taken then) */
  if (!rc && len) {
    if (!dst) dst = own = malloc(len);
    assert_non_null(dst);
    memcpy(dst, f->src, len);
    if (pw_crc32c(0, dst, len) != f->h.payload_crc)
      rc = pw_err_set(&err, PW_EPROTO, "fake link", "the payload of %s changed between its send and its write",
                      pw_frame_hdr_str(&f->h, hs, sizeof hs));
  }
  if (f->pending) atomic_fetch_sub(f->pending, 1); /* written (or dropped with the link) */
  if (f->pending) { /* the sender may wait for it */
    fk_rank *s = &r->net->r[f->from];
    uv_mutex_lock(&s->in_mu);
    uv_cond_broadcast(&s->in_cv);
    uv_mutex_unlock(&s->in_mu);
  }
  if (!rc && rt->done) {
    uv_mutex_lock(&r->mu);
    rc = rt->done(rt->sub, f->from, &f->h, len ? dst : NULL, &err);
    uv_mutex_unlock(&r->mu);
  }
  r->frames_read++;
  free(own);
  int from = f->from;
  free(f);
  if (rc) return fk_fail_rank(r, PW_EPEER, "lost peer rank %d: %s", from, pw_err_str(&err, b, sizeof b));
  return 0;
}

/* The next frame of r's inbox, or NULL: in a threaded net after waiting
 * a moment for one (or for a frame of ours to be read: `pending`). */
static inline fk_frame *fk_take(fk_rank *r) {
  uv_mutex_lock(&r->in_mu);
  if (!r->head && !r->net->solo) (void)uv_cond_timedwait(&r->in_cv, &r->in_mu, 2000000);
  fk_frame *f = r->head;
  if (f) {
    r->head = f->next;
    if (!r->head) r->tail = NULL;
    r->n_in--;
  }
  uv_mutex_unlock(&r->in_mu);
  return f;
}

static inline int fk_cx_wait(void *run, pw_rctx_ready_fn ready, void *arg) {
  fk_rank *r = run;
  uint64_t deadline = uv_hrtime() + (uint64_t)(r->net->timeout * 1e9);
  for (;;) {
    if (atomic_load(&r->abort)) return PW_ECANCELED;
    if (ready(arg)) return 0;
    fk_frame *f = fk_take(r);
    if (!f) {
      if (!r->net->solo && uv_hrtime() < deadline) continue; /* a pending count may be what it waits for */
      return fk_fail_rank(r, PW_EPEER, "rank %d: %s", r->cx.rank,
                          r->net->solo ? "the wait would block (solo net, empty inbox)" : "the wait timed out");
    }
    int rc = fk_deliver(r, f);
    if (rc) return rc;
  }
}

/* Solo net: delivers every frame in r's inbox; the first refusal's code. */
static inline int fk_pump(fk_rank *r) {
  fk_frame *f;
  int rc = 0;
  while ((f = fk_take(r)))
    if (!rc)
      rc = fk_deliver(r, f);
    else
      free(f);
  return rc;
}

/* A frame from rank `from` straight into r's inbox, its payload copied
 * (kept until fk_net_free). */
typedef struct fk_blob {
  struct fk_blob *next;
  uint8_t data[];
} fk_blob;
static fk_blob *fk_blobs __attribute__((unused));

static inline void fk_inject(fk_rank *r, int from, const pw_frame_hdr *h, const void *payload) {
  fk_blob *bl = malloc(sizeof *bl + (size_t)h->payload_len + 1);
  assert_non_null(bl);
  if (h->payload_len) memcpy(bl->data, payload, (size_t)h->payload_len);
  bl->next = fk_blobs, fk_blobs = bl;
  uint8_t bytes[PW_FRAME_HDR_SIZE];
  pw_frame_hdr_encode(h, bl->data, bytes);
  fk_frame *f = calloc(1, sizeof *f);
  assert_non_null(f);
  pw_err err = {0};
  assert_int_equal(pw_frame_hdr_decode(bytes, SIZE_MAX, &f->h, &err), 0);
  f->from = from, f->src = bl->data;
  fk_push(r, f);
}

/* Frame i of r's inbox (not taken), or NULL. */
static inline const fk_frame *fk_peek(fk_rank *r, int i) {
  const fk_frame *f = r->head;
  while (f && i-- > 0) f = f->next;
  return f;
}

static inline void fk_drop_inbox(fk_rank *r) {
  fk_frame *f;
  while ((f = r->head)) {
    r->head = f->next;
    free(f);
  }
  r->tail = NULL, r->n_in = 0;
}

static inline void fk_net_init(fk_net *net, int n) {
  memset(net, 0, sizeof *net);
  net->n = n;
  net->timeout = 10;
  net->r = calloc((size_t)n, sizeof *net->r);
  assert_non_null(net->r);
  assert_true(n <= 64);
  for (int k = 0; k < n; k++) {
    fk_rank *r = &net->r[k];
    snprintf(net->host[k], sizeof net->host[k], "m");
    r->net = net;
    assert_int_equal(uv_mutex_init(&r->mu), 0);
    assert_int_equal(uv_mutex_init(&r->in_mu), 0);
    assert_int_equal(uv_cond_init(&r->in_cv), 0);
    atomic_init(&r->abort, 0);
    atomic_init(&r->wakes, 0);
    pw_rctx *c = &r->cx;
    c->job = FK_JOB, c->run_id = 1, c->rank = k;
    c->cfg = &r->cfg, c->model = &r->cfg.sl.model, c->part = &r->cfg.sl.part;
    c->step = &r->step, c->tag = &r->tag, c->eval = &r->eval, c->abort = &r->abort, c->t_step0 = &r->t_step0;
    c->run = r;
    c->send = fk_cx_send, c->wait = fk_cx_wait, c->fail_run = fk_cx_fail, c->post = fk_cx_post;
    c->wake = fk_cx_wake, c->same_host = fk_cx_same_host;
  }
}

/* Bare geometry: rank k of a pp x dp x tp mesh, S stages placed by
 * rank_of_stage (pipeline ranks; NULL: stage s on rank s, S = pp), no
 * programs. */
static inline void fk_geom(fk_rank *r, int pp, int dp, int tp, int S, const int *rank_of_stage) {
  pw_rctx *c = &r->cx;
  c->pp = pp, c->dp = dp, c->tp = tp, c->n_ranks = pp * dp * tp, c->S = S;
  c->tp_rank = c->rank % tp, c->prank = c->rank / tp % pp, c->replica = c->rank / tp / pp;
  c->m = 1, c->mb_size = 1;
  free(r->rank_of_stage), free(r->lidx_of_stage), free(r->ls);
  r->rank_of_stage = malloc(sizeof(int) * (size_t)S);
  r->lidx_of_stage = malloc(sizeof(int) * (size_t)S);
  r->ls = calloc((size_t)S, sizeof *r->ls);
  assert_true(r->rank_of_stage && r->lidx_of_stage && r->ls);
  c->n_ls = 0;
  for (int s = 0; s < S; s++) {
    r->rank_of_stage[s] = rank_of_stage ? rank_of_stage[s] : s;
    r->lidx_of_stage[s] = -1;
    if (r->rank_of_stage[s] == c->prank) r->lidx_of_stage[s] = c->n_ls, r->ls[c->n_ls++].stage = s;
  }
  c->rank_of_stage = r->rank_of_stage, c->lidx_of_stage = r->lidx_of_stage, c->ls = r->ls;
}

/* Rank r's configuration from slice `rank` of the job's plan (its rank in
 * the mesh too), as pw_run_create decodes it, and its tables. A test may
 * then place it elsewhere (fk_geom) before making its programs. */
static inline void fk_rank_slice(fk_rank *r, const fk_job *f, int rank, int steps) {
  char *text, hex[PW_SHA256_HEX_LEN + 1], b[600];
  pw_err err = {0};
  if (pw_slice_build(&f->job, &f->plan, rank, f->plan_sha, &text, hex, &err))
    fail_msg("slice of rank %d: %s", rank, pw_err_str(&err, b, sizeof b));
  if (pw_slice_decode(text, strlen(text), hex, &r->cfg.sl, &err))
    fail_msg("decode of rank %d's slice: %s", rank, pw_err_str(&err, b, sizeof b));
  free(text);
  r->has_slice = 1;
  r->cfg.steps = steps;
  const pw_slice *sl = &r->cfg.sl;
  pw_rctx *c = &r->cx;
  c->rank = rank;
  fk_geom(r, sl->pp, sl->dp, sl->tp, sl->S, sl->sched->stage_to_rank);
  c->m = sl->m, c->mb_size = sl->mb_size;
  c->acts = sl->sched->actions[c->prank];
  c->n_acts = sl->sched->n_actions[c->prank];
}

/* Stage programs as run_setup.c makes them, of the layers cx.part gives
 * each local stage (zero: the train.zero in effect), parameters drawn
 * from the slice's seed (zero 3: the caller draws them once pw_dpx_init
 * lent the arena). */
static inline void fk_rank_progs(fk_rank *r, int zero) {
  pw_rctx *c = &r->cx;
  char b[600];
  for (int li = 0; li < c->n_ls; li++) {
    const pw_stage *st = &c->part->stages[c->ls[li].stage];
    pw_prog_config pc = {.layer_lo = st->layer_lo, .layer_hi = st->layer_hi, .mb_size = c->mb_size,
                         .batch_size = r->cfg.sl.train.batch_size, .n_slots = 1, .max_slots = 1,
                         .no_moments = zero > 0, .no_grads = zero >= 2, .no_params = zero == 3};
    pw_err err = {0};
    if (pw_prog_create(&r->cfg.sl.model, &pc, &r->ls[li].prog, &err))
      fail_msg("program of stage %d: %s", c->ls[li].stage, pw_err_str(&err, b, sizeof b));
    if (zero < 3) pw_prog_init_params(r->ls[li].prog, (unsigned long long)r->cfg.sl.train.seed); /* zero 3: once lent */
    if (!zero) pw_prog_zero_grad(r->ls[li].prog);
  }
}

static inline void fk_net_free(fk_net *net) {
  for (int k = 0; k < net->n; k++) {
    fk_rank *r = &net->r[k];
    fk_drop_inbox(r);
    for (int li = 0; r->ls && li < r->cx.n_ls; li++) pw_prog_free(r->ls[li].prog);
    free(r->rank_of_stage), free(r->lidx_of_stage), free(r->ls);
    if (r->has_slice) pw_slice_free(&r->cfg.sl);
    uv_mutex_destroy(&r->mu);
    uv_mutex_destroy(&r->in_mu);
    uv_cond_destroy(&r->in_cv);
  }
  free(net->r);
  while (fk_blobs) {
    fk_blob *bl = fk_blobs;
    fk_blobs = bl->next;
    free(bl);
  }
  memset(net, 0, sizeof *net);
}

/* ---- ranks as threads ------------------------------------------------------------ */

typedef int (*fk_body_fn)(fk_rank *r, void *arg);

typedef struct {
  fk_rank *r;
  fk_body_fn fn;
  void *arg;
  int rc;
} fk_thread;

static inline void fk_thread_main(void *p) {
  fk_thread *t = p;
  t->rc = t->fn(t->r, t->arg);
  if (t->rc) /* the others would wait for it: stop them */
    for (int k = 0; k < t->r->net->n; k++) atomic_store(&t->r->net->r[k].abort, 1);
}

/* fn on each of the n ranks ranks[] (NULL: 0 .. n-1), one thread each, args[k]
 * its argument (args NULL: none); every rank's code must be 0. fn runs on
 * its own thread: it returns a code, never calls cmocka's asserts. */
static inline void fk_run(fk_net *net, const int *ranks, int n, fk_body_fn fn, void **args) {
  uv_thread_t th[64];
  fk_thread t[64];
  assert_true(n <= 64);
  for (int k = 0; k < n; k++) {
    t[k] = (fk_thread){.r = &net->r[ranks ? ranks[k] : k], .fn = fn, .arg = args ? args[k] : NULL};
    assert_int_equal(uv_thread_create(&th[k], fk_thread_main, &t[k]), 0);
  }
  for (int k = 0; k < n; k++) uv_thread_join(&th[k]);
  for (int k = 0; k < n; k++) /* the rank that failed first, not those it stopped */
    if (t[k].rc && t[k].rc != PW_ECANCELED)
      fail_msg("rank %d: code %d (%s): %s", t[k].r->cx.rank, t[k].rc, pw_strerror(t[k].rc), t[k].r->failed);
  for (int k = 0; k < n; k++)
    if (t[k].rc) fail_msg("rank %d: code %d (%s): %s", t[k].r->cx.rank, t[k].rc, pw_strerror(t[k].rc), t[k].r->failed);
}

/* err's message holds `want` (its path and message, as pw_err_str says it). */
static inline void fk_err_has(const pw_err *err, const char *want) {
  char b[600];
  pw_err_str(err, b, sizeof b);
  if (!strstr(b, want)) fail_msg("error \"%s\" does not say \"%s\"", b, want);
}

/* Bits of a float / double, for exact comparisons that say which differs. */
static inline uint32_t fk_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

#endif
