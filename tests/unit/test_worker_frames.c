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
 * and a bad frame or a hang-up fails the run naming the peer. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sys/socket.h>
#include <unistd.h>

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
} fx;

static int setup(void **state) {
  fx *x = calloc(1, sizeof *x);
  x->f = wf_job_make(SPEC);
  x->r = wf_run(x->f, 0, 3);
  pw_run *r = x->r;
  assert_int_equal(r->n_ls, 2);
  assert_int_equal(r->ls[0].stage, 0);
  assert_int_equal(r->ls[1].stage, 2);
  assert_int_equal(r->lidx_of_stage[2], 1);
  x->act_value = -1;
  for (int i = 0; i < pw_prog_n_inputs(r->ls[1].prog); i++)
    if (pw_prog_input(r->ls[1].prog, i)->role == PW_VAL_ACT) {
      x->act_value = pw_prog_input(r->ls[1].prog, i)->value;
      x->act_bytes = pw_prog_input(r->ls[1].prog, i)->bytes;
    }
  assert_true(x->act_value >= 0);
  assert_int_equal(r->ls[1].n_act_in, 1);
  x->out_value = pw_prog_output(r->ls[0].prog, 0)->value;
  x->out_bytes = pw_prog_output(r->ls[0].prog, 0)->bytes;
  *state = x;
  return 0;
}

static int teardown(void **state) {
  fx *x = *state;
  wf_run_free(x->f, x->r);
  wf_job_free(x->f);
  free(x);
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
  int rc = pw_run_frame_dest(r, from, h, &dst, &err);
  if (rc != PW_EPROTO || !strstr(pw_err_str(&err, b, sizeof b), why))
    fail_msg("expected PW_EPROTO with '%s', got %d: %s", why, rc, b);
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
  assert_int_equal(pw_run_frame_dest(r, 1, &h, &dst, &err), 0);
  int slot = r->cp.ls[1].mb_slot[1];
  assert_true(slot >= 0);
  assert_int_equal(r->cp.ls[0].mb_slot[1], -1); /* not stage 0's */
  assert_ptr_equal(dst, pw_prog_value(r->ls[1].prog, slot, x->act_value));
  float *payload = malloc(x->act_bytes);
  fill(payload, x->act_bytes / 4, 3.0f);
  memcpy(dst, payload, x->act_bytes);
  assert_int_equal(r->cp.ls[1].act_got[1], 0); /* counted only once complete */
  assert_int_equal(pw_run_frame_done(r, 1, &h, NULL, &err), 0);
  assert_int_equal(r->cp.ls[1].act_step[1], 0);
  assert_int_equal(r->cp.ls[1].act_got[1], 1);
  assert_memory_equal(pw_prog_value(r->ls[1].prog, slot, x->act_value), payload, x->act_bytes);
  refused(r, 1, &h, "sent twice");
  /* the next step's activation may come early, into another slot */
  pw_frame_hdr early = hdr(PW_FRAME_ACT, 1, 2, 2, x->act_value, x->act_bytes);
  assert_int_equal(pw_run_frame_dest(r, 1, &early, &dst, &err), 0);
  assert_true(r->cp.ls[1].mb_slot[2] >= 0 && r->cp.ls[1].mb_slot[2] != slot);
  assert_int_equal(pw_run_frame_done(r, 1, &early, NULL, &err), 0);
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
  assert_int_equal(pw_run_frame_dest(r, 1, &h, &dst, &err), 0);
  assert_ptr_equal(dst, pw_prog_grad(r->ls[0].prog, slot, x->out_value));
  assert_int_equal(pw_run_frame_done(r, 1, &h, NULL, &err), 0);
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
  h = hdr(PW_FRAME_ACT, 0, 0, 2, r->model.input_value, x->act_bytes);
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
  for (int li = 0; li < r->n_ls; li++)
    for (int mb = 0; mb < r->m; mb++) {
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
  int li, mb, step;
} arrival;

static int arrived(pw_run *r, const void *arg) {
  const arrival *a = arg;
  return r->cp.ls[a->li].act_step[a->mb] == a->step && r->cp.ls[a->li].act_got[a->mb] == 1;
}

static int never(pw_run *r, const void *arg) { return 0; }

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
  arrival a = {1, 3, 0};
  assert_int_equal(pw_exec_wait(r, arrived, &a), 0);
  int slot = r->cp.ls[1].mb_slot[3];
  assert_true(slot >= 0);
  assert_memory_equal(pw_prog_value(r->ls[1].prog, slot, x->act_value), payload, x->act_bytes);
  /* a frame for a stage we do not hold fails the run, naming the peer */
  h = hdr(PW_FRAME_ACT, 0, 0, 3, x->act_value, x->act_bytes);
  write_frame(sv[0], &h, payload);
  assert_int_equal(pw_exec_wait(r, never, NULL), PW_EPEER);
  assert_non_null(strstr(r->sh.error, "lost peer rank 1"));
  assert_non_null(strstr(r->sh.error, "stage 3 is not on this rank"));
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
  assert_non_null(strstr(r->sh.error, "peer closed the link"));
  close(sv[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_act_to_the_right_stage, setup, teardown),
      cmocka_unit_test_setup_teardown(test_grad_after_forward, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
      cmocka_unit_test_setup_teardown(test_link_reads_into_slot, setup, teardown),
      cmocka_unit_test_setup_teardown(test_link_hangup, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
