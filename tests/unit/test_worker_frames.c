/* test_worker_frames: where a peer's ACT or GRAD frame goes (worker/run.c,
 * pw_run_frame_dest / pw_run_frame_done; worker/recv.c reading a link).
 *
 * Pipeline rank 0 of an interleaved pp=2 job holds stages 0 and 2. An
 * activation for stage 2 lands in stage 2's slot of its microbatch (not
 * stage 0's), and is counted in; a gradient for stage 0's output lands in
 * the gradient of the slot its forward used. Refused, naming why: a stage
 * this rank does not hold, a value that is not a port, a step other than
 * the current one (or the next, for an activation), a size or dtype that
 * does not fit, the wrong sender, another job, a microbatch out of range,
 * a duplicate, a gradient before its forward. Over a socketpair, the
 * compute thread's reader (pw_exec_wait) puts a frame's bytes in the slot,
 * and a bad frame or a hang-up fails the run naming the peer.
 *
 * SNAP frames (worker/snaprun.c): a peer's snapshot is taken only from a
 * rank this one is the holder of (pw_snaprun_holder: the next rank on
 * another host, as the coordinator's host ids say, not the addresses: one
 * machine reached at two addresses is one host, two machines behind one
 * address are two; the spin before poll counts the same way), for a stage that rank runs, in part order 0, 1, 2, and
 * lands in a HELD entry of the run's store, reported once complete; a
 * restore only from the rank the assignment names for a local stage, at
 * its step, exactly the stage's size, into a RESTORE entry; header fields
 * of 2^31 and more are refused, not taken as negative indices. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sysres.h"
#include "test_worker_fixture.h"

static const char *SPEC =
    "{\"name\":\"frames\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":4,\"n_heads\":2},"
    "\"mesh\":{\"pp\":2,\"dp\":1,\"virtual_stages\":2},"
    "\"schedule\":{\"name\":\"interleaved-1f1b\",\"microbatches\":4},"
    "\"train\":{\"steps\":3,\"batch_size\":8,\"seed\":5},\"data\":{\"kind\":\"copy\"}}";

typedef struct {
  wf_job *f;
  pw_run *r;       /* pipeline rank 0: stages 0 and 2 */
  int act_value;   /* stage 2's activation input (from stage 1, on rank 1) */
  size_t act_bytes;
  int out_value;   /* stage 0's output (to stage 1, on rank 1) */
  size_t out_bytes;
  pw_snapstore *snaps; /* the run's snapshot store (r->snap.store), or NULL; outlives the run */
} fx;

static int setup(void **state) {
  fx *x = calloc(1, sizeof *x);
  x->f = wf_job_make(SPEC);
  x->r = wf_run(x->f, 0, 3);
  pw_run *r = x->r;
  assert_int_equal(r->cx.n_ls, 2);
  assert_int_equal(r->cx.ls[0].stage, 0);
  assert_int_equal(r->cx.ls[1].stage, 2);
  assert_int_equal(r->cx.lidx_of_stage[2], 1);
  x->act_value = -1;
  for (int i = 0; i < pw_prog_n_inputs(r->cx.ls[1].prog); i++)
    if (pw_prog_input(r->cx.ls[1].prog, i)->role == PW_VAL_ACT) {
      x->act_value = pw_prog_input(r->cx.ls[1].prog, i)->value;
      x->act_bytes = pw_prog_input(r->cx.ls[1].prog, i)->bytes;
    }
  assert_true(x->act_value >= 0);
  assert_int_equal(r->cx.ls[1].n_act_in, 1);
  x->out_value = pw_prog_output(r->cx.ls[0].prog, 0)->value;
  x->out_bytes = pw_prog_output(r->cx.ls[0].prog, 0)->bytes;
  *state = x;
  return 0;
}

static int teardown(void **state) {
  fx *x = *state;
  wf_run_free(x->f, x->r); /* ends a half-received snapshot's write: the store must still be there */
  wf_job_free(x->f);
  if (x->snaps) {
    pw_snapstore_free(x->snaps);
    free(x->snaps);
  }
  free(x);
  return 0;
}

/* The fixture run with a snapshot store, as the daemon gives its runs. */
static int setup_snaps(void **state) {
  setup(state);
  fx *x = *state;
  x->snaps = calloc(1, sizeof *x->snaps);
  assert_int_equal(pw_snapstore_init(x->snaps), 0);
  x->r->snap.store = x->snaps;
  return 0;
}

static pw_frame_hdr hdr(int kind, int step, int mb, int stage, int value, size_t bytes) {
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init_vec(&h, kind, WF_JOB, (uint32_t)step, (uint32_t)mb, (uint32_t)stage,
                                         (uint32_t)value, PW_DTYPE_F32, bytes / 4),
                   0);
  return h;
}

/* Expects frame h from `from` refused with a message containing `why`. */
static void refused(pw_run *r, int from, const pw_frame_hdr *h, const char *why) {
  void *dst = (void *)1;
  pw_err err = {0};
  char b[600];
  int rc = pw_route_dest(r, from, h, &dst, &err);
  pw_err_str(&err, b, sizeof b); /* also when rc is wrong: the message says which frame */
  if (rc != PW_EPROTO || !strstr(b, why))
    fail_msg("%s frame of stage %u from rank %d: expected PW_EPROTO with '%s', got %d: %s",
             pw_frame_kind_name(h->kind), h->stage, from, why, rc, b);
  assert_null(dst);
}

static void fill(float *p, size_t n, float base) {
  for (size_t i = 0; i < n; i++) p[i] = base + (float)i * 0.25f;
}

static void test_act_to_the_right_stage(void **state) {
  fx *x = *state;
  pw_run *r = x->r;
  pw_err err = {0};
  pw_frame_hdr h = hdr(PW_FRAME_ACT, 0, 1, 2, x->act_value, x->act_bytes);
  void *dst = NULL;
  assert_int_equal(pw_route_dest(r, 1, &h, &dst, &err), 0);
  int slot = r->cp.ls[1].mb_slot[1];
  assert_true(slot >= 0);
  assert_int_equal(r->cp.ls[0].mb_slot[1], -1); /* not stage 0's */
  assert_ptr_equal(dst, pw_prog_value(r->cx.ls[1].prog, slot, x->act_value));
  float *payload = malloc(x->act_bytes);
  fill(payload, x->act_bytes / 4, 3.0f);
  memcpy(dst, payload, x->act_bytes);
  assert_int_equal(r->cp.ls[1].act_got[1], 0); /* counted only once complete */
  assert_int_equal(pw_route_done(r, 1, &h, NULL, &err), 0);
  assert_int_equal(r->cp.ls[1].act_step[1], 0);
  assert_int_equal(r->cp.ls[1].act_got[1], 1);
  assert_memory_equal(pw_prog_value(r->cx.ls[1].prog, slot, x->act_value), payload, x->act_bytes);
  refused(r, 1, &h, "sent twice");
  /* the next step's activation may come early, into another slot */
  pw_frame_hdr early = hdr(PW_FRAME_ACT, 1, 2, 2, x->act_value, x->act_bytes);
  assert_int_equal(pw_route_dest(r, 1, &early, &dst, &err), 0);
  assert_true(r->cp.ls[1].mb_slot[2] >= 0 && r->cp.ls[1].mb_slot[2] != slot);
  assert_int_equal(pw_route_done(r, 1, &early, NULL, &err), 0);
  assert_int_equal(r->cp.ls[1].act_step[2], 1);
  free(payload);
}

static void test_grad_after_forward(void **state) {
  fx *x = *state;
  pw_run *r = x->r;
  pw_err err = {0};
  pw_frame_hdr h = hdr(PW_FRAME_GRAD, 0, 0, 0, x->out_value, x->out_bytes);
  refused(r, 1, &h, "before its forward");
  uv_mutex_lock(&r->sh.mu);
  int slot = pw_run_slot_for(r, 0, 0, &err); /* what the F of microbatch 0 claims */
  uv_mutex_unlock(&r->sh.mu);
  assert_true(slot >= 0);
  void *dst = NULL;
  assert_int_equal(pw_route_dest(r, 1, &h, &dst, &err), 0);
  assert_ptr_equal(dst, pw_prog_grad(r->cx.ls[0].prog, slot, x->out_value));
  assert_int_equal(pw_route_done(r, 1, &h, NULL, &err), 0);
  assert_int_equal(r->cp.ls[0].grad_got[0], 1);
  assert_int_equal(r->cp.ls[0].grad_step[0], 0);
  refused(r, 1, &h, "sent twice");
  /* gradients never come a step early */
  pw_frame_hdr next = hdr(PW_FRAME_GRAD, 1, 0, 0, x->out_value, x->out_bytes);
  refused(r, 1, &next, "for step 1 while at step 0");
}

static void test_refusals(void **state) {
  fx *x = *state;
  pw_run *r = x->r;
  pw_frame_hdr h;
  h = hdr(PW_FRAME_ACT, 0, 0, 1, x->act_value, x->act_bytes);
  refused(r, 1, &h, "stage 1 is not on this rank");
  h = hdr(PW_FRAME_ACT, 0, 0, 9, x->act_value, x->act_bytes);
  refused(r, 1, &h, "stage 9 is not on this rank");
  h = hdr(PW_FRAME_ACT, 0, 0, 2, x->out_value, x->act_bytes); /* stage 0's output is no input of stage 2 */
  refused(r, 1, &h, "is not a input port of stage 2");
  h = hdr(PW_FRAME_ACT, 0, 0, 2, r->cfg.sl.model.input_value, x->act_bytes);
  refused(r, 1, &h, "not a input port");
  h = hdr(PW_FRAME_ACT, 2, 0, 2, x->act_value, x->act_bytes);
  refused(r, 1, &h, "for step 2 while at step 0");
  h = hdr(PW_FRAME_ACT, 0, 0, 2, x->act_value, x->act_bytes - 4);
  refused(r, 1, &h, "expected");
  h = hdr(PW_FRAME_ACT, 0, 0, 2, x->act_value, x->act_bytes);
  h.dtype = PW_DTYPE_U8;
  refused(r, 1, &h, "expected");
  h = hdr(PW_FRAME_ACT, 0, 0, 2, x->act_value, x->act_bytes);
  refused(r, 0, &h, "comes from rank 1, not 0");
  h = hdr(PW_FRAME_ACT, 0, 4, 2, x->act_value, x->act_bytes);
  refused(r, 1, &h, "microbatch 4 of 4");
  h = hdr(PW_FRAME_ACT, 0, 0, 2, x->act_value, x->act_bytes);
  h.job = WF_JOB + 1;
  refused(r, 1, &h, "is not ours");
  h = hdr(PW_FRAME_HELLO, 0, 0, 2, x->act_value, x->act_bytes);
  refused(r, 1, &h, "unexpected");
  /* nothing was claimed or counted by a refused frame */
  for (int li = 0; li < r->cx.n_ls; li++)
    for (int mb = 0; mb < r->cx.m; mb++) {
      assert_int_equal(r->cp.ls[li].mb_slot[mb], -1);
      assert_int_equal(r->cp.ls[li].act_step[mb], -1);
    }
  /* an aborted run takes no frame */
  atomic_store(&r->sh.abort, 1);
  h = hdr(PW_FRAME_ACT, 0, 0, 2, x->act_value, x->act_bytes);
  refused(r, 1, &h, "run is over");
  atomic_store(&r->sh.abort, 0);
}

/* ---- over a socketpair, as the compute thread reads a link ---------------- */

typedef struct {
  pw_run *r;
  int li, mb, step;
} arrival;

static int arrived(void *arg) {
  const arrival *a = arg;
  pw_run *r = a->r;
  return r->cp.ls[a->li].act_step[a->mb] == a->step && r->cp.ls[a->li].act_got[a->mb] == 1;
}

static int never(void *arg) {
  (void)arg;
  return 0;
}

static void write_frame(int fd, const pw_frame_hdr *h, const void *payload) {
  uint8_t b[PW_FRAME_HDR_SIZE];
  pw_frame_hdr_encode(h, payload, b);
  assert_int_equal(write(fd, b, sizeof b), (ssize_t)sizeof b);
  if (h->payload_len) assert_int_equal(write(fd, payload, h->payload_len), (ssize_t)h->payload_len);
}

static void test_link_reads_into_slot(void **state) {
  fx *x = *state;
  pw_run *r = x->r;
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  r->sh.in_fd[1] = sv[1]; /* what pw_run_link_in does once HELLO is admitted */
  float *payload = malloc(x->act_bytes);
  fill(payload, x->act_bytes / 4, -7.0f);
  pw_frame_hdr h = hdr(PW_FRAME_ACT, 0, 3, 2, x->act_value, x->act_bytes);
  write_frame(sv[0], &h, payload);
  arrival a = {r, 1, 3, 0};
  assert_int_equal(pw_exec_wait(r, arrived, &a), 0);
  int slot = r->cp.ls[1].mb_slot[3];
  assert_true(slot >= 0);
  assert_memory_equal(pw_prog_value(r->cx.ls[1].prog, slot, x->act_value), payload, x->act_bytes);
  /* a frame for a stage we do not hold fails the run, naming the peer */
  h = hdr(PW_FRAME_ACT, 0, 0, 3, x->act_value, x->act_bytes);
  write_frame(sv[0], &h, payload);
  assert_int_equal(pw_exec_wait(r, never, NULL), PW_EPEER);
  assert_non_null(strstr(r->sh.why.error, "lost peer rank 1"));
  assert_non_null(strstr(r->sh.why.error, "stage 3 is not on this rank"));
  close(sv[0]);
  close(sv[1]);
  free(payload);
}

static void test_link_hangup(void **state) {
  fx *x = *state;
  pw_run *r = x->r;
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  r->sh.in_fd[1] = sv[1];
  close(sv[0]);
  assert_int_equal(pw_exec_wait(r, never, NULL), PW_EPEER);
  assert_non_null(strstr(r->sh.why.error, "peer closed the link"));
  close(sv[1]);
}

/* ---- SNAP frames ------------------------------------------------------------ */

enum { HOLD = 0, RESTORE = 1 };

static pw_frame_hdr snap_hdr(int step, int purpose, uint32_t stage, int part, size_t numel) {
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_SNAP, WF_JOB, (uint32_t)step, (uint32_t)purpose, stage,
                                         (uint32_t)part, PW_DTYPE_F32, numel),
                   0);
  return h;
}

/* Delivers part `part` of a snapshot from `from` as the reader does: the
 * destination, the payload copied in, the frame done. */
static void snap_part(pw_run *r, int from, int step, int purpose, int stage, int part, const float *data, size_t numel) {
  pw_frame_hdr h = snap_hdr(step, purpose, (uint32_t)stage, part, numel);
  void *dst = NULL;
  pw_err err = {0};
  char b[600];
  if (pw_route_dest(r, from, &h, &dst, &err))
    fail_msg("part %d of stage %d from rank %d refused: %s", part, stage, from, pw_err_str(&err, b, sizeof b));
  assert_non_null(dst); /* kept: the store had room */
  memcpy(dst, data + (size_t)part * numel, numel * sizeof(float));
  assert_int_equal(pw_route_done(r, from, &h, dst, &err), 0);
}

/* The SNAP events the run posted (the loop would report them): "stage/step/held ...". */
static void expect_snap_events(pw_run *r, const char *want) {
  char got[256] = "";
  pw_event ev;
  while (pw_run_event_next(r, &ev))
    if (ev.kind == PW_EV_SNAP) {
      size_t l = strlen(got);
      snprintf(got + l, sizeof got - l, "%s%d/%d/%d", l ? " " : "", ev.stage, ev.step, ev.held);
    }
  if (strcmp(got, want)) fail_msg("snapshot events '%s', expected '%s'", got, want);
}

static void test_snap_hold(void **state) {
  fx *x = *state;
  pw_run *r = x->r; /* rank 0 of 2: the holder of rank 1 (stages 1 and 3) */
  assert_int_equal(pw_snaprun_holder(&r->cx, 1), 0);
  assert_int_equal(pw_snaprun_holder(&r->cx, 0), 1);
  enum { N = 40 };
  float data[3 * N];
  fill(data, 3 * N, 11.0f);
  pw_frame_hdr h;
  /* a run without a store takes none */
  r->snap.store = NULL;
  h = snap_hdr(2, HOLD, 1, 0, N);
  refused(r, 1, &h, "unexpected SNAP frame");
  r->snap.store = x->snaps;
  /* not from a rank it holds for, nor a stage the sender does not run, nor
   * larger than the whole model */
  h = snap_hdr(2, HOLD, 0, 0, N);
  refused(r, 0, &h, "does not fit");
  refused(r, 1, &h, "does not fit");
  h = snap_hdr(2, HOLD, 2, 0, N);
  refused(r, 1, &h, "does not fit");
  size_t model_numel = 0;
  for (int i = 0; i < r->cfg.sl.model.n_params; i++) model_numel += r->cfg.sl.model.params[i].numel;
  h = snap_hdr(2, HOLD, 1, 0, model_numel + 1);
  refused(r, 1, &h, "does not fit");
  h = snap_hdr(0, HOLD, 1, 0, N); /* step 0 is no snapshot's */
  refused(r, 1, &h, "unexpected SNAP frame");
  h = snap_hdr(2, HOLD, 1, 3, N);
  refused(r, 1, &h, "unexpected SNAP frame");
  h = snap_hdr(2, 2, 1, 0, N); /* neither hold nor restore */
  refused(r, 1, &h, "unexpected SNAP frame");
  h = snap_hdr(2, HOLD, 1, 0, N);
  h.dtype = PW_DTYPE_I32;
  refused(r, 1, &h, "unexpected SNAP frame");
  /* parts in order only */
  h = snap_hdr(2, HOLD, 1, 1, N);
  refused(r, 1, &h, "out of order");
  h = snap_hdr(2, HOLD, 1, 2, N);
  refused(r, 1, &h, "out of order");
  assert_null(x->snaps->list); /* nothing claimed by a refused frame */
  snap_part(r, 1, 2, HOLD, 1, 0, data, N);
  pw_snap *e = x->snaps->list;
  assert_non_null(e);
  assert_int_equal(e->kind, PW_SNAP_HELD);
  assert_int_equal(e->stage, 1);
  assert_null(pw_snap_acquire(x->snaps, WF_JOB, 1, 2)); /* not before its last part */
  h = snap_hdr(2, HOLD, 1, 0, N);
  refused(r, 1, &h, "out of order");
  h = snap_hdr(2, HOLD, 1, 2, N);
  refused(r, 1, &h, "out of order");
  h = snap_hdr(2, HOLD, 3, 1, N); /* another stage's part 1 */
  refused(r, 1, &h, "out of order");
  h = snap_hdr(2, HOLD, 1, 1, N + 1); /* another size */
  refused(r, 1, &h, "out of order");
  snap_part(r, 1, 2, HOLD, 1, 1, data, N);
  expect_snap_events(r, "");
  snap_part(r, 1, 2, HOLD, 1, 2, data, N);
  expect_snap_events(r, "1/2/1"); /* the coordinator hears of it once complete */
  pw_snap *got = pw_snap_acquire(x->snaps, WF_JOB, 1, 2);
  assert_ptr_equal(got, e);
  assert_int_equal(got->numel, N);
  assert_memory_equal(got->data, data, sizeof data);
  pw_snap_release(x->snaps, got);
  /* the next snapshot starts at part 0 again: stage 3, of the same step */
  snap_part(r, 1, 2, HOLD, 3, 0, data, N);
  snap_part(r, 1, 2, HOLD, 3, 1, data, N);
  snap_part(r, 1, 2, HOLD, 3, 2, data, N);
  expect_snap_events(r, "3/2/1");
  assert_int_equal(x->snaps->bytes, 2 * 3 * N * sizeof(float));
  assert_int_equal(r->snap.restore_got, 0); /* held copies restore nothing */
  /* a half-received one is abandoned when the run ends (teardown): its
   * entry must not stay claimed, nor valid */
  snap_part(r, 1, 3, HOLD, 1, 0, data, N);
  assert_null(pw_snap_acquire(x->snaps, WF_JOB, 1, 3));
}

static void test_snap_restore(void **state) {
  fx *x = *state;
  pw_run *r = x->r; /* rank 0: stages 0 and 2 */
  size_t n0 = pw_prog_numel(r->cx.ls[0].prog), n2 = pw_prog_numel(r->cx.ls[1].prog);
  assert_true(n0 > 0 && n2 > 0 && n0 != n2);
  float *data = malloc(3 * n0 * sizeof(float));
  fill(data, 3 * n0, -2.0f);
  pw_frame_hdr h;
  /* no restore in the assignment: none taken */
  h = snap_hdr(4, RESTORE, 0, 0, n0);
  refused(r, 1, &h, "does not fit");
  /* assign.restore_step 4, restore_from: stage 0 from rank 1, stage 2 this rank's own */
  r->snap.restore_step = 4;
  r->snap.restore_from = malloc(4 * sizeof(int)); /* freed with the run */
  int from[4] = {1, 1, 0, 1};
  memcpy(r->snap.restore_from, from, sizeof from);
  h = snap_hdr(3, RESTORE, 0, 0, n0); /* another step */
  refused(r, 1, &h, "does not fit");
  h = snap_hdr(5, RESTORE, 0, 0, n0);
  refused(r, 1, &h, "does not fit");
  h = snap_hdr(4, RESTORE, 0, 0, n0); /* from a rank the assignment does not name */
  refused(r, 0, &h, "does not fit");
  h = snap_hdr(4, RESTORE, 2, 0, n2); /* stage 2 is this rank's own to restore */
  refused(r, 1, &h, "does not fit");
  h = snap_hdr(4, RESTORE, 1, 0, n0); /* stage 1 is not on this rank */
  refused(r, 1, &h, "does not fit");
  h = snap_hdr(4, RESTORE, 0, 0, n0 - 1); /* exactly the stage's size */
  refused(r, 1, &h, "does not fit");
  h = snap_hdr(4, RESTORE, 0, 0, n0 + 1);
  refused(r, 1, &h, "does not fit");
  h = snap_hdr(4, RESTORE, 0, 0, n2);
  refused(r, 1, &h, "does not fit");
  h = snap_hdr(4, RESTORE, 0, 1, n0);
  refused(r, 1, &h, "out of order");
  assert_null(x->snaps->list);
  snap_part(r, 1, 4, RESTORE, 0, 0, data, n0);
  snap_part(r, 1, 4, RESTORE, 0, 1, data, n0);
  assert_int_equal(r->snap.restore_got, 0);
  snap_part(r, 1, 4, RESTORE, 0, 2, data, n0);
  assert_int_equal(r->snap.restore_got, 1);
  expect_snap_events(r, ""); /* a restore's copy is not reported as held */
  pw_snap *e = pw_snap_acquire(x->snaps, WF_JOB, 0, 4);
  assert_non_null(e);
  assert_int_equal(e->kind, PW_SNAP_RESTORE);
  assert_int_equal(e->numel, n0);
  assert_memory_equal(e->data, data, 3 * n0 * sizeof(float));
  pw_snap_release(x->snaps, e);
  free(data);
}

/* pp=2, dp=2: ranks 0 and 1 on one host, 2 and 3 on another. */
static const char *SPEC_DP =
    "{\"name\":\"frames-dp\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":2,\"n_heads\":2},"
    "\"mesh\":{\"pp\":2,\"dp\":2},"
    "\"schedule\":{\"name\":\"1f1b\",\"microbatches\":2},"
    "\"train\":{\"steps\":3,\"batch_size\":8,\"seed\":5},\"data\":{\"kind\":\"copy\"}}";

static int setup_dp(void **state) {
  fx *x = calloc(1, sizeof *x);
  x->f = wf_job_make(SPEC_DP);
  x->r = wf_run(x->f, 0, 3);
  x->snaps = calloc(1, sizeof *x->snaps);
  assert_int_equal(pw_snapstore_init(x->snaps), 0);
  x->r->snap.store = x->snaps;
  assert_int_equal(x->r->cx.n_ranks, 4);
  assert_int_equal(x->r->cx.rank_of_stage[0], 0);
  assert_int_equal(x->r->cx.rank_of_stage[1], 1);
  *state = x;
  return 0;
}

/* Ranks 0 and 1 are reached at address a on machine ma, ranks 2 and 3
 * at b on mb: the coordinator's host ids decide, never the addresses. */
static void hosts(pw_run *r, const char *a, const char *b, const char *ma, const char *mb) {
  for (int k = 0; k < r->cx.n_ranks; k++) {
    snprintf(r->peers[k].addr, sizeof r->peers[k].addr, "%s:%d", k < 2 ? a : b, 7001 + k);
    snprintf(r->peers[k].host, sizeof r->peers[k].host, "%s", k < 2 ? ma : mb);
  }
}

/* cp.spin as pw_exec_spin_init sets it for `local` compute threads on
 * this machine (one each: the run has no worker). */
static double spin_for(int local) {
  long cpus = pw_sysres_cores(); /* what the cgroup and affinity mask grant */
  return cpus > 0 && local > cpus ? 0 : 1e-3;
}

static void test_snap_holder_by_host(void **state) {
  fx *x = *state;
  pw_run *r = x->r;
  enum { N = 8 };
  float data[3 * N];
  fill(data, 3 * N, 5.0f);
  pw_frame_hdr h;
  /* one host reached at two addresses (loopback, its LAN address): each
   * rank's holder is the next rank; this one holds rank 3's */
  hosts(r, "127.0.0.1", "192.168.1.7", "m1", "m1");
  assert_int_equal(pw_exec_same_host(r, 0, 3), 1);
  assert_int_equal(pw_snaprun_holder(&r->cx, 1), 2);
  assert_int_equal(pw_snaprun_holder(&r->cx, 2), 3);
  pw_exec_spin_init(r); /* four compute threads here */
  assert_true(r->cp.io.spin == spin_for(4));
  h = snap_hdr(1, HOLD, 0, 0, N);
  refused(r, 2, &h, "does not fit");
  snap_part(r, 3, 1, HOLD, 1, 0, data, N);
  snap_part(r, 3, 1, HOLD, 1, 1, data, N);
  snap_part(r, 3, 1, HOLD, 1, 2, data, N);
  /* two hosts behind one address (a NAT): a snapshot goes to the next rank
   * on the other host, so this rank holds rank 2's and 3's, and no longer
   * rank 1's; two compute threads here */
  hosts(r, "203.0.113.9", "203.0.113.9", "m1", "m2");
  assert_int_equal(pw_exec_same_host(r, 0, 1), 1);
  assert_int_equal(pw_exec_same_host(r, 0, 2), 0);
  pw_exec_spin_init(r);
  assert_true(r->cp.io.spin == spin_for(2));
  assert_int_equal(pw_snaprun_holder(&r->cx, 1), 2);
  assert_int_equal(pw_snaprun_holder(&r->cx, 2), 0);
  assert_int_equal(pw_snaprun_holder(&r->cx, 3), 0);
  h = snap_hdr(1, HOLD, 1, 0, N);
  refused(r, 1, &h, "does not fit");
  snap_part(r, 2, 1, HOLD, 0, 0, data, N);
  snap_part(r, 3, 2, HOLD, 1, 0, data, N); /* senders' parts interleave, each in its own order */
  snap_part(r, 2, 1, HOLD, 0, 1, data, N);
  snap_part(r, 3, 2, HOLD, 1, 1, data, N);
  snap_part(r, 2, 1, HOLD, 0, 2, data, N);
  snap_part(r, 3, 2, HOLD, 1, 2, data, N);
  expect_snap_events(r, "1/1/1 0/1/1 1/2/1");
  pw_snap *e = pw_snap_acquire(x->snaps, WF_JOB, 0, 1);
  assert_non_null(e);
  assert_int_equal(e->kind, PW_SNAP_HELD);
  assert_memory_equal(e->data, data, sizeof data);
  pw_snap_release(x->snaps, e);
  /* rank 2 runs stage 0, not stage 1 */
  h = snap_hdr(3, HOLD, 1, 0, N);
  refused(r, 2, &h, "does not fit");
}

/* The header's stage is bounded as the unsigned it is before it indexes
 * anything: 2^31 or more must never become a negative index (a heap read
 * before rank_of_stage / restore_from, found by this test). */
static void test_snap_stage_out_of_range(void **state) {
  fx *x = *state;
  pw_run *r = x->r;
  hosts(r, "10.0.0.1", "10.0.0.2", "m1", "m2"); /* rank 2 (pipeline rank 0) sends its snapshots here */
  /* a restore, as the assignment allows one from rank 2 of every stage */
  r->snap.restore_step = 1;
  r->snap.restore_from = malloc(2 * sizeof(int)); /* freed with the run */
  r->snap.restore_from[0] = r->snap.restore_from[1] = 2;
  size_t n0 = pw_prog_numel(r->cx.ls[0].prog);
  pw_frame_hdr h = snap_hdr(1, RESTORE, 0xffffffffu, 0, n0);
  refused(r, 2, &h, "unexpected SNAP frame");
  h = snap_hdr(1, HOLD, (uint32_t)r->cx.S, 0, 8);
  refused(r, 2, &h, "unexpected SNAP frame");
  h = snap_hdr(1, HOLD, 0xffffffffu, 0, 8);
  refused(r, 2, &h, "unexpected SNAP frame");
  h = snap_hdr(1, HOLD, 0x80000000u, 0, 8);
  refused(r, 2, &h, "unexpected SNAP frame");
  assert_null(x->snaps->list);
}

/* Likewise the microbatch (the purpose): only 0 (hold) and 1 (restore)
 * are SNAP frames, 2^31 included. */
static void test_snap_purpose_out_of_range(void **state) {
  fx *x = *state;
  pw_run *r = x->r;
  hosts(r, "10.0.0.1", "10.0.0.2", "m1", "m2");
  pw_frame_hdr h = snap_hdr(1, 2, 0, 0, 8);
  refused(r, 2, &h, "unexpected SNAP frame");
  h = snap_hdr(1, 0, 0, 0, 8);
  h.microbatch = 0x80000000u;
  refused(r, 2, &h, "unexpected SNAP frame");
  assert_null(x->snaps->list);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_act_to_the_right_stage, setup, teardown),
      cmocka_unit_test_setup_teardown(test_grad_after_forward, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
      cmocka_unit_test_setup_teardown(test_link_reads_into_slot, setup, teardown),
      cmocka_unit_test_setup_teardown(test_link_hangup, setup, teardown),
      cmocka_unit_test_setup_teardown(test_snap_hold, setup_snaps, teardown),
      cmocka_unit_test_setup_teardown(test_snap_restore, setup_snaps, teardown),
      cmocka_unit_test_setup_teardown(test_snap_holder_by_host, setup_dp, teardown),
      cmocka_unit_test_setup_teardown(test_snap_stage_out_of_range, setup_dp, teardown),
      cmocka_unit_test_setup_teardown(test_snap_purpose_out_of_range, setup_dp, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
