/* test_worker_snaprun_fake: a run's side of the in-memory snapshots
 * (worker/snaprun.c) driven through its narrow context alone — fake ranks
 * of one process (test_worker_fakectx.h) with stage programs made from
 * their real slices and snapshot stores of their own, no run. (The run-level
 * tests: test_worker_snaprun.c, when a rank takes them in a real step;
 * test_worker_frames.c, SNAP frames through the run's router.)
 *
 * - The holder: the next rank on another host, else the next rank (a fake
 *   same_host), -1 for a one-rank run.
 * - Taking: a due snapshot goes into the taker's store, is reported (a
 *   SNAP event, held 0) and sent as three frames to the holder, whose
 *   store gets the same bits as a HELD entry that is valid — and reported
 *   (report_step) — only after part 2; the sends are counted in the entry
 *   (sending) until read. What is due: every snapshot_every-th step but
 *   the last, not in forward mode nor without a store nor once cancelled;
 *   taken in an idle wait or at the step end, and right at the update once a
 *   rank has been late SNAP_LATE times; skipped while both generations are
 *   still being sent.
 * - Frames: parts out of order, a restore of the wrong size, are refused.
 * - Restoring: two ranks each holding the other's stage send them and
 *   wait, and each stage's program ends with exactly the held bits. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "snaprun.h"
#include "test_worker_fakectx.h"

static const char *SPEC =
    "{\"name\":\"snaprun\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":2,\"n_heads\":2},"
    "\"mesh\":{\"pp\":2,\"dp\":1},\"schedule\":{\"name\":\"1f1b\",\"microbatches\":2},"
    "\"train\":{\"steps\":30,\"batch_size\":4,\"seed\":3,\"snapshot_every\":2,\"checkpoint_every\":0,"
    "\"optimizer\":{\"name\":\"adamw\",\"lr\":0.01}},"
    "\"data\":{\"kind\":\"copy\"}}";

enum { HOLD = 0, RESTORE = 1 };

static int snap_dest(void *sub, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  return pw_snaprun_dest(sub, from, h, dst, err);
}
static int snap_done(void *sub, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  (void)payload;
  return pw_snaprun_frame(sub, from, h, err);
}

/* ---- the holder ------------------------------------------------------------------- */

static void holders(int n, const char *hosts, const int *want) {
  fk_net net;
  fk_net_init(&net, n);
  for (int k = 0; k < n; k++) snprintf(net.host[k], sizeof net.host[k], "%c", hosts[k]);
  fk_geom(&net.r[0], n, 1, 1, n, NULL);
  for (int g = 0; g < n; g++)
    if (pw_snaprun_holder(&net.r[0].cx, g) != want[g])
      fail_msg("hosts %s: rank %d's holder %d, want %d", hosts, g, pw_snaprun_holder(&net.r[0].cx, g), want[g]);
  fk_net_free(&net);
}

static void test_holder_by_host(void **state) {
  (void)state;
  holders(5, "aabba", (const int[]){2, 2, 4, 4, 2}); /* the next rank on another host, cyclically */
  holders(5, "mmmmm", (const int[]){1, 2, 3, 4, 0}); /* one host: the next rank */
  holders(4, "abcd", (const int[]){1, 2, 3, 0});
  holders(3, "aab", (const int[]){2, 2, 0});
  holders(1, "a", (const int[]){-1});
}

/* ---- two ranks of a pp = 2 job --------------------------------------------------- */

typedef struct {
  fk_job *f;
  fk_net net;
  pw_snapstore store[2];
  pw_snaprun x[2];
} pair;

static void pair_make(pair *p, const pw_msg_assign *a) {
  p->f = fk_job_make(SPEC);
  fk_net_init(&p->net, 2);
  p->net.solo = 1;
  snprintf(p->net.host[1], sizeof p->net.host[1], "other");
  for (int k = 0; k < 2; k++) {
    fk_rank *r = &p->net.r[k];
    fk_rank_slice(r, p->f, k, 30);
    fk_rank_progs(r, 0);
    assert_int_equal(pw_snapstore_init(&p->store[k]), 0);
    assert_int_equal(pw_snaprun_init(&p->x[k], &r->cx, &p->store[k]), 0);
    pw_err err = {0};
    if (a) assert_int_equal(pw_snaprun_assign(&p->x[k], a, &err), 0);
    p->x[k].holder = pw_snaprun_holder(&r->cx, k);
    r->route[PW_FRAME_SNAP] = (fk_route){snap_dest, snap_done, &p->x[k]};
  }
  assert_int_equal(p->x[0].holder, 1);
  assert_int_equal(p->x[1].holder, 0);
}

static void pair_free(pair *p) {
  for (int k = 0; k < 2; k++) {
    fk_drop_inbox(&p->net.r[k]); /* what was not read: its entries' counts stay up, freed whole below */
    pw_snaprun_close(&p->x[k]);
    free(p->x[k].restore_from); /* test_close_frees_restore_from says whose it is */
    pw_snapstore_free(&p->store[k]);
  }
  fk_net_free(&p->net);
  fk_job_free(p->f);
}

/* A stage's state as a snapshot holds it: parameters, m, v. */
static float *state_of(pw_prog *p) {
  size_t n = pw_prog_numel(p), tn = pw_prog_train_numel(p);
  float *s = calloc(3 * n, sizeof(float));
  memcpy(s, pw_prog_params(p), n * sizeof(float));
  memcpy(s + n, pw_prog_moment(p, 0), tn * sizeof(float));
  memcpy(s + 2 * n, pw_prog_moment(p, 1), tn * sizeof(float));
  return s;
}

/* What an update would do: every parameter and moment changed. */
static void perturb(pw_prog *p, float by) {
  size_t n = pw_prog_numel(p), tn = pw_prog_train_numel(p);
  for (size_t i = 0; i < n; i++) pw_prog_params(p)[i] += by;
  for (size_t i = 0; i < tn; i++) pw_prog_moment(p, 0)[i] += by, pw_prog_moment(p, 1)[i] += 2 * by;
}

static void same_state(const pw_snap *e, const float *s, size_t n, size_t tn, const char *what) {
  assert_int_equal(e->numel, n);
  for (int part = 0; part < 3; part++)
    for (size_t i = 0; i < (part ? tn : n); i++)
      if (fk_bits(e->data[part * n + i]) != fk_bits(s[part * n + i]))
        fail_msg("%s: part %d element %zu: %.9g, want %.9g", what, part, i, e->data[part * n + i], s[part * n + i]);
}

static void test_take_and_hold(void **state) {
  (void)state;
  pair p;
  pair_make(&p, NULL);
  fk_rank *r0 = &p.net.r[0], *r1 = &p.net.r[1];
  pw_prog *prog = r0->ls[0].prog;
  size_t n = pw_prog_numel(prog), tn = pw_prog_train_numel(prog);
  perturb(prog, 0.5f); /* moments that are not zero */
  /* after the update of step 1 (2 steps done): due, not yet taken */
  r0->step = 1;
  pw_snaprun_due(&p.x[0]);
  assert_int_equal(p.x[0].due, 2);
  assert_int_equal(r1->n_in, 0);
  float *s2 = state_of(prog);
  /* the next step's first idle wait takes it */
  pw_snaprun_idle(&p.x[0]);
  assert_int_equal(p.x[0].due, 0);
  assert_int_equal(p.x[0].taken, 1);
  pw_snap *own = pw_snap_acquire(&p.store[0], FK_JOB, 0, 2);
  assert_non_null(own);
  assert_int_equal(own->kind, PW_SNAP_OWN);
  same_state(own, s2, n, tn, "own entry");
  assert_int_equal(atomic_load(&own->sending), 3); /* the three parts, not yet read */
  pw_snap_release(&p.store[0], own);
  assert_int_equal(r0->n_ev, 1);
  assert_int_equal(r0->ev[0].kind, PW_EV_SNAP);
  assert_int_equal(r0->ev[0].stage, 0);
  assert_int_equal(r0->ev[0].step, 2);
  assert_int_equal(r0->ev[0].held, 0);
  /* three frames to the holder: parameters, m, v */
  assert_int_equal(r1->n_in, 3);
  for (int part = 0; part < 3; part++) {
    const fk_frame *f = fk_peek(r1, part);
    assert_int_equal(f->h.kind, PW_FRAME_SNAP);
    assert_int_equal(f->h.step, 2);
    assert_int_equal(f->h.microbatch, HOLD);
    assert_int_equal(f->h.stage, 0);
    assert_int_equal(f->h.value, part);
    assert_int_equal(f->h.payload_len, n * sizeof(float));
  }
  /* the update of the next step: the holder must still get step 2's bits */
  perturb(prog, 1.0f);
  /* parts 0 and 1 in: nothing held yet, nothing to report */
  for (int part = 0; part < 2; part++) {
    fk_frame *f = fk_take(r1);
    assert_int_equal(fk_deliver(r1, f), 0);
    assert_int_equal(p.x[1].report_step, 0);
    assert_null(pw_snap_acquire(&p.store[1], FK_JOB, 0, 2));
  }
  assert_int_equal(fk_deliver(r1, fk_take(r1)), 0);
  assert_int_equal(p.x[1].report_step, 2);
  assert_int_equal(p.x[1].report_stage, 0);
  pw_snap *held = pw_snap_acquire(&p.store[1], FK_JOB, 0, 2);
  assert_non_null(held);
  assert_int_equal(held->kind, PW_SNAP_HELD);
  same_state(held, s2, n, tn, "held entry");
  pw_snap_release(&p.store[1], held);
  own = pw_snap_acquire(&p.store[0], FK_JOB, 0, 2);
  assert_int_equal(atomic_load(&own->sending), 0); /* all read */
  pw_snap_release(&p.store[0], own);
  assert_int_equal(r1->n_fail, 0);
  free(s2);
  pair_free(&p);
}

/* When a snapshot is due and where it is taken. */
static void test_take_policy(void **state) {
  (void)state;
  pair p;
  pair_make(&p, NULL);
  fk_rank *r0 = &p.net.r[0], *r1 = &p.net.r[1];
  pw_snaprun *x = &p.x[0];
  /* odd counts of steps done are not due (snapshot_every 2) */
  r0->step = 2;
  pw_snaprun_due(x);
  assert_int_equal(x->due, 0);
  /* late at the step end: counted; an idle wait takes it back */
  r0->step = 3; /* 4 done */
  pw_snaprun_due(x);
  assert_int_equal(x->due, 4);
  pw_snaprun_overdue(x);
  assert_int_equal(x->late, 1);
  assert_int_equal(fk_pump(r1), 0);
  r0->step = 5;
  pw_snaprun_due(x);
  assert_int_equal(r1->n_in, 0);
  pw_snaprun_idle(x);
  assert_int_equal(x->due, 0);
  assert_int_equal(x->late, 0);
  assert_int_equal(r1->n_in, 3);
  assert_int_equal(fk_pump(r1), 0);
  /* late three times in a row (frames delivered each time) ... */
  for (int k = 0; k < 3; k++) {
    r0->step = 7 + 2 * k; /* 8, 10, 12 done */
    pw_snaprun_due(x);
    assert_int_equal(x->due, 8 + 2 * k);
    assert_int_equal(r1->n_in, 0);
    pw_snaprun_overdue(x);
    assert_int_equal(x->due, 0);
    assert_int_equal(x->late, k + 1);
    assert_int_equal(r1->n_in, 3);
    assert_int_equal(fk_pump(r1), 0);
  }
  /* ... then taken right at the update, from then on */
  for (int k = 0; k < 2; k++) {
    r0->step = 13 + 2 * k;
    pw_snaprun_due(x);
    assert_int_equal(x->due, 0);
    assert_int_equal(r1->n_in, 3);
    assert_int_equal(fk_pump(r1), 0);
    pw_snap *e = pw_snap_acquire(&p.store[1], FK_JOB, 0, 14 + 2 * k);
    assert_non_null(e);
    pw_snap_release(&p.store[1], e);
  }
  assert_int_equal(x->late, 3);
  /* nothing due: idle and overdue take nothing */
  int taken = x->taken;
  pw_snaprun_idle(x), pw_snaprun_overdue(x);
  assert_int_equal(x->taken, taken);
  assert_int_equal(x->late, 3);
  /* the last step's state is not snapshotted (a checkpoint ends the run) */
  r0->step = 29;
  pw_snaprun_due(x);
  assert_int_equal(x->taken, taken);
  assert_int_equal(r1->n_in, 0);
  r0->cfg.steps = 31; /* one more step: now it is */
  pw_snaprun_due(x);
  assert_int_equal(x->taken, taken + 1);
  assert_int_equal(fk_pump(r1), 0);
  r0->cfg.steps = 30;
  /* both generations still being sent (the holder reads nothing): the next is skipped */
  r0->step = 17;
  pw_snaprun_due(x);
  r0->step = 19;
  pw_snaprun_due(x);
  assert_int_equal(r1->n_in, 6);
  assert_int_equal(x->skipped, 0);
  r0->step = 21;
  pw_snaprun_due(x);
  assert_int_equal(x->skipped, 1);
  assert_int_equal(r1->n_in, 6);
  assert_null(pw_snap_acquire(&p.store[0], FK_JOB, 0, 22));
  assert_int_equal(fk_pump(r1), 0);
  r0->step = 23; /* read: the next one is taken */
  pw_snaprun_due(x);
  assert_int_equal(x->skipped, 1);
  assert_int_equal(r1->n_in, 3);
  assert_int_equal(fk_pump(r1), 0);
  /* cancelled: not taken (its restart may read the older ones) */
  atomic_store(&r0->abort, 1);
  taken = x->taken;
  r0->step = 25;
  pw_snaprun_due(x);
  assert_int_equal(x->due, 0);
  assert_int_equal(x->taken, taken);
  assert_null(pw_snap_acquire(&p.store[0], FK_JOB, 0, 26));
  assert_int_equal(r1->n_in, 0);
  atomic_store(&r0->abort, 0);
  /* forward mode, no store: never due */
  r0->cfg.sl.mode = PW_MODE_FORWARD;
  r0->step = 27;
  pw_snaprun_due(x);
  assert_int_equal(x->due, 0);
  r0->cfg.sl.mode = PW_MODE_TRAIN;
  pw_snapstore *st = x->store;
  x->store = NULL;
  pw_snaprun_due(x);
  assert_int_equal(x->due, 0);
  x->store = st;
  assert_int_equal(r0->n_fail + r1->n_fail, 0);
  pair_free(&p);
}

/* ---- frames ---------------------------------------------------------------------- */

static pw_frame_hdr snap_hdr(int step, int purpose, int stage, int part, size_t n) {
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_SNAP, FK_JOB, (uint32_t)step, (uint32_t)purpose,
                                         (uint32_t)stage, (uint32_t)part, PW_DTYPE_F32, n),
                   0);
  return h;
}

static void refused(pw_snaprun *x, int from, const pw_frame_hdr *h, const char *want) {
  pw_err err = {0};
  void *dst = (void *)1;
  int rc = pw_snaprun_dest(x, from, h, &dst, &err);
  if (rc != PW_EPROTO) fail_msg("%s: accepted (%d)", want, rc);
  fk_err_has(&err, want);
}

static void accepted(pw_snaprun *x, int from, const pw_frame_hdr *h) {
  pw_err err = {0};
  void *dst = NULL;
  assert_int_equal(pw_snaprun_dest(x, from, h, &dst, &err), 0);
  assert_non_null(dst);
  assert_int_equal(pw_snaprun_frame(x, from, h, &err), 0);
}

static void test_frame_refusals(void **state) {
  (void)state;
  /* the run starts from the snapshots of step 4: stage 0 from rank 1, stage 1 from rank 0 */
  json_t *from = json_pack("[i, i]", 1, 0);
  pw_msg_assign a = {.restore_step = 4, .restore_from = from};
  pair p;
  pair_make(&p, NULL);
  fk_rank *r0 = &p.net.r[0];
  pw_snaprun *x = &p.x[0]; /* holds rank 1's stage 1 */
  size_t n0 = pw_prog_numel(r0->ls[0].prog), n1 = pw_prog_numel(p.net.r[1].ls[0].prog);
  assert_true(n0 != n1);
  /* held parts in order only: 0, 1, 2, then 0 again */
  pw_frame_hdr h = snap_hdr(2, HOLD, 1, 1, n1);
  refused(x, 1, &h, "snapshot part 1 of stage 1 from rank 1 out of order");
  h = snap_hdr(2, HOLD, 1, 2, n1);
  refused(x, 1, &h, "out of order");
  h = snap_hdr(2, HOLD, 1, 0, n1);
  accepted(x, 1, &h);
  refused(x, 1, &h, "out of order"); /* part 0 twice */
  h = snap_hdr(2, HOLD, 1, 2, n1);
  refused(x, 1, &h, "out of order"); /* part 1 skipped */
  h = snap_hdr(3, HOLD, 1, 1, n1);
  refused(x, 1, &h, "out of order"); /* another step's part 1 */
  h = snap_hdr(2, HOLD, 1, 1, n1 - 1);
  refused(x, 1, &h, "out of order"); /* another size */
  h = snap_hdr(2, HOLD, 1, 1, n1);
  accepted(x, 1, &h);
  assert_int_equal(x->report_step, 0);
  h = snap_hdr(2, HOLD, 1, 2, n1);
  accepted(x, 1, &h);
  assert_int_equal(x->report_step, 2);
  assert_int_equal(x->report_stage, 1);
  /* restores: exactly the stage's size, from the rank the assignment names, of its step */
  p.net.r[0].cfg.start_step = 4;
  pw_err err = {0};
  assert_int_equal(pw_snaprun_assign(x, &a, &err), 0);
  h = snap_hdr(4, RESTORE, 0, 0, n0 + 1);
  refused(x, 1, &h, "a restore of stage 0, step 4");
  h = snap_hdr(4, RESTORE, 0, 0, n0 - 1);
  refused(x, 1, &h, "does not fit");
  h = snap_hdr(4, RESTORE, 0, 0, n1);
  refused(x, 1, &h, "does not fit");
  h = snap_hdr(4, RESTORE, 0, 0, n0);
  refused(x, 0, &h, "does not fit"); /* not the rank named */
  h = snap_hdr(3, RESTORE, 0, 0, n0);
  refused(x, 1, &h, "does not fit"); /* not the step */
  h = snap_hdr(4, RESTORE, 1, 0, n1);
  refused(x, 0, &h, "does not fit"); /* stage 1 is not ours */
  h = snap_hdr(4, RESTORE, 0, 0, n0);
  accepted(x, 1, &h);
  /* the assignment, checked against the mesh (each a fresh one: assign is called once a run) */
  free(x->restore_from), x->restore_from = NULL;
  p.net.r[0].cfg.start_step = 5;
  assert_int_equal(pw_snaprun_assign(x, &a, &err), PW_EPROTO);
  fk_err_has(&err, "restore_step = start_step");
  p.net.r[0].cfg.start_step = 4;
  json_t *short_list = json_pack("[i]", 1), *outside = json_pack("[i, i]", 1, 2);
  a.restore_from = short_list;
  assert_int_equal(pw_snaprun_assign(x, &a, &err), PW_EPROTO);
  fk_err_has(&err, "must name a rank for each of the 2 stages");
  a.restore_from = outside;
  assert_int_equal(pw_snaprun_assign(x, &a, &err), PW_EPROTO);
  fk_err_has(&err, "rank 2 outside the mesh");
  free(x->restore_from), x->restore_from = NULL;
  json_decref(short_list), json_decref(outside), json_decref(from);
  pair_free(&p);
}

/* ---- restoring --------------------------------------------------------------------- */

static int restore_body(fk_rank *r, void *arg) {
  (void)r;
  pw_err err = {0};
  int rc = pw_snaprun_restore(arg, &err);
  if (rc) {
    char b[300];
    fk_fail_rank(r, rc, "restore: %s", pw_err_str(&err, b, sizeof b));
  }
  return rc;
}

static void test_restore_from_peers(void **state) {
  (void)state;
  json_t *from = json_pack("[i, i]", 1, 0); /* each stage from the other rank */
  pw_msg_assign a = {.restore_step = 4, .restore_from = from};
  pair p;
  p.f = fk_job_make(SPEC);
  fk_net_init(&p.net, 2);
  snprintf(p.net.host[1], sizeof p.net.host[1], "other");
  float *held[2];
  size_t n[2], tn[2];
  for (int k = 0; k < 2; k++) {
    fk_rank *r = &p.net.r[k];
    fk_rank_slice(r, p.f, k, 30);
    r->cfg.start_step = 4;
    fk_rank_progs(r, 0);
    n[k] = pw_prog_numel(r->ls[0].prog), tn[k] = pw_prog_train_numel(r->ls[0].prog);
    assert_int_equal(pw_snapstore_init(&p.store[k]), 0);
    assert_int_equal(pw_snaprun_init(&p.x[k], &r->cx, &p.store[k]), 0);
    pw_err err = {0};
    assert_int_equal(pw_snaprun_assign(&p.x[k], &a, &err), 0);
    r->route[PW_FRAME_SNAP] = (fk_route){snap_dest, snap_done, &p.x[k]};
  }
  /* rank k holds the other's stage at step 4 (and a newer one, which must not be used) */
  for (int k = 0; k < 2; k++) {
    int st = 1 - k;
    size_t m = n[st];
    held[st] = calloc(3 * m, sizeof(float));
    for (size_t i = 0; i < 3 * m; i++) held[st][i] = (float)st * 1000 + (float)i * 0.5f;
    for (size_t i = m + tn[st]; i < 2 * m; i++) held[st][i] = 0; /* past train_numel: unused */
    for (size_t i = 2 * m + tn[st]; i < 3 * m; i++) held[st][i] = 0;
    pw_snap *e = pw_snap_begin_write(&p.store[k], FK_JOB, st, PW_SNAP_HELD, 4, m);
    memcpy(e->data, held[st], 3 * m * sizeof(float));
    pw_snap_end_write(&p.store[k], e, 4);
    e = pw_snap_begin_write(&p.store[k], FK_JOB, st, PW_SNAP_HELD, 6, m);
    memset(e->data, 0x7f, 3 * m * sizeof(float));
    pw_snap_end_write(&p.store[k], e, 6);
  }
  fk_run(&p.net, NULL, 2, restore_body, (void *[]){&p.x[0], &p.x[1]});
  for (int k = 0; k < 2; k++) {
    assert_int_equal(p.x[k].restore_got, 1);
    assert_int_equal(p.x[k].restore_failed, 0);
    float *s = state_of(p.net.r[k].ls[0].prog);
    for (size_t i = 0; i < 3 * n[k]; i++)
      if (fk_bits(s[i]) != fk_bits(held[k][i]))
        fail_msg("rank %d stage %d: state element %zu %.9g, want the held %.9g", k, k, i, s[i], held[k][i]);
    free(s);
    free(held[k]);
    assert_int_equal(p.net.r[k].n_in, 0);
  }
  json_decref(from);
  pair_free(&p);
}

/* The table assign makes is the subsystem's (the run stopped freeing it
 * when snapshots became a handle of their own): close gives it back. */
static void test_close_frees_restore_from(void **state) {
  (void)state;
  json_t *from = json_pack("[i, i]", 1, 0);
  pw_msg_assign a = {.restore_step = 4, .restore_from = from};
  fk_job *f = fk_job_make(SPEC);
  fk_net net;
  fk_net_init(&net, 2);
  fk_rank *r = &net.r[0];
  fk_rank_slice(r, f, 0, 30);
  r->cfg.start_step = 4;
  pw_snaprun x;
  assert_int_equal(pw_snaprun_init(&x, &r->cx, NULL), 0);
  pw_err err = {0};
  assert_int_equal(pw_snaprun_assign(&x, &a, &err), 0);
  assert_non_null(x.restore_from);
  assert_int_equal(x.restore_from[0], 1);
  pw_snaprun_close(&x);
  int left = x.restore_from != NULL;
  free(x.restore_from); /* (so this test leaks nothing either way) */
  json_decref(from);
  fk_net_free(&net);
  fk_job_free(f);
  if (left) fail_msg("pw_snaprun_close leaves restore_from allocated: nothing else frees it (a leak per restored run)");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_holder_by_host),
      cmocka_unit_test(test_take_and_hold),
      cmocka_unit_test(test_take_policy),
      cmocka_unit_test(test_frame_refusals),
      cmocka_unit_test(test_restore_from_peers),
      cmocka_unit_test(test_close_frees_restore_from),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
