/* test_worker_slots: a run's activation slots (worker/run.c,
 * pw_run_slot_for / pw_run_slot_release / pw_run_send_done).
 *
 * A microbatch keeps the slot it first claimed until released; a released
 * slot is reused; a slot released while a send still reads it stays busy
 * until that send is done (then it is free again); when every slot is
 * held, claiming one is an error naming the stage, not a stomped slot. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "test_worker_fixture.h"

static const char *SPEC =
    "{\"name\":\"slots\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":2,\"n_heads\":2},"
    "\"mesh\":{\"pp\":2,\"dp\":1},\"schedule\":{\"name\":\"1f1b\",\"microbatches\":4},"
    "\"train\":{\"steps\":3,\"batch_size\":8,\"seed\":5},\"data\":{\"kind\":\"copy\"}}";

static int claim(pw_run *r, int li, int mb, pw_err *err) {
  uv_mutex_lock(&r->sh.mu);
  int s = pw_run_slot_for(r, li, mb, err);
  uv_mutex_unlock(&r->sh.mu);
  return s;
}

static void release(pw_run *r, int li, int mb) {
  uv_mutex_lock(&r->sh.mu);
  pw_run_slot_release(r, li, mb);
  uv_mutex_unlock(&r->sh.mu);
}

/* What the compute thread does when a frame reading slot s goes to the loop. */
static void send_pending(pw_run *r, int li, int s) {
  uv_mutex_lock(&r->sh.mu);
  r->sh.ls[li].slot_sends[s]++;
  uv_mutex_unlock(&r->sh.mu);
  r->lp.sends_inflight++;
}

static void test_claim_release_reuse(void **state) {
  wf_job *f = wf_job_make(SPEC);
  pw_run *r = wf_run(f, 0, 3);
  pw_err err = {0};
  assert_int_equal(r->cx.n_ls, 1);
  pw_prog *p = r->cx.ls[0].prog;
  int s0 = claim(r, 0, 0, &err), s1 = claim(r, 0, 1, &err);
  assert_true(s0 >= 0 && s1 >= 0 && s0 != s1);
  assert_int_equal(claim(r, 0, 0, &err), s0); /* the same microbatch, the same slot */
  assert_int_equal(r->cp.ls[0].mb_slot[0], s0);
  assert_int_equal(r->sh.ls[0].slot_busy[s0], 1);
  assert_non_null(pw_prog_value(p, s0, r->cfg.sl.model.input_value));
  release(r, 0, 0);
  assert_int_equal(r->cp.ls[0].mb_slot[0], -1);
  assert_int_equal(r->sh.ls[0].slot_busy[s0], 0);
  release(r, 0, 0); /* twice: nothing more happens */
  assert_int_equal(r->sh.ls[0].slot_busy[s1], 1);
  /* the freed slot is the first free one again */
  assert_int_equal(claim(r, 0, 2, &err), s0);
  release(r, 0, 1);
  release(r, 0, 2);
  wf_run_free(f, r);
  wf_job_free(f);
}

static void test_release_waits_for_sends(void **state) {
  wf_job *f = wf_job_make(SPEC);
  pw_run *r = wf_run(f, 0, 3);
  pw_err err = {0};
  int s = claim(r, 0, 0, &err);
  assert_true(s >= 0);
  send_pending(r, 0, s);
  send_pending(r, 0, s);
  release(r, 0, 0);
  assert_int_equal(r->cp.ls[0].mb_slot[0], -1);
  assert_int_equal(r->sh.ls[0].slot_busy[s], 1); /* a send still reads it */
  assert_int_equal(r->sh.ls[0].slot_free_pending[s], 1);
  int other = claim(r, 0, 1, &err);
  assert_true(other >= 0 && other != s);
  pw_run_send_done(r, -1, 0, s);
  assert_int_equal(r->sh.ls[0].slot_busy[s], 1); /* one send left */
  pw_run_send_done(r, -1, 0, s);
  assert_int_equal(r->sh.ls[0].slot_busy[s], 0);
  assert_int_equal(r->sh.ls[0].slot_free_pending[s], 0);
  assert_int_equal(r->lp.sends_inflight, 0);
  assert_int_equal(claim(r, 0, 2, &err), s);
  /* a send done on a slot never released leaves it held */
  send_pending(r, 0, other);
  pw_run_send_done(r, -1, 0, other);
  assert_int_equal(r->sh.ls[0].slot_busy[other], 1);
  wf_run_free(f, r);
  wf_job_free(f);
}

static void test_exhaustion(void **state) {
  wf_job *f = wf_job_make(SPEC);
  pw_run *r = wf_run(f, 1, 3);
  pw_err err = {0};
  char b[600];
  int cap = r->cx.m * 2 + 2, seen[64] = {0};
  assert_true(cap <= 64);
  /* every slot held by a send after its microbatch let go */
  for (int k = 0; k < cap; k++) {
    int s = claim(r, 0, k % r->cx.m, &err);
    if (s < 0) fail_msg("slot %d of %d: %s", k, cap, pw_err_str(&err, b, sizeof b));
    assert_false(seen[s]);
    seen[s] = 1;
    send_pending(r, 0, s);
    release(r, 0, k % r->cx.m);
  }
  int rc = claim(r, 0, 0, &err);
  assert_true(rc < 0);
  assert_int_equal(err.code, rc);
  assert_non_null(strstr(pw_err_str(&err, b, sizeof b), "slots in use"));
  assert_int_equal(r->cp.ls[0].mb_slot[0], -1);
  /* one send done: its slot comes back */
  pw_run_send_done(r, -1, 0, 3);
  assert_int_equal(claim(r, 0, 0, &err), 3);
  for (int s = 0; s < cap; s++)
    if (s != 3) pw_run_send_done(r, -1, 0, s);
  wf_run_free(f, r);
  wf_job_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_claim_release_reuse),
      cmocka_unit_test(test_release_waits_for_sends),
      cmocka_unit_test(test_exhaustion),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
