/* test_worker_evalrun: a cluster run's eval passes (worker/evalrun.c)
 * through its narrow context alone (test_worker_fakectx.h: a context with
 * a configuration and nothing else, no run).
 *
 * Tags: step k's pass is k + eval_batches * floor(k / eval_every), so the
 * tags of two consecutive steps leave exactly eval_batches tags between
 * them when the eval passes follow the first one, none otherwise; the last
 * step is always followed by them; a run without eval_every, or in forward
 * mode, never evaluates and its tags are its steps; tags stay in
 * [0, 2^31) (the frame's u32, never the -1 of "none"). The forward-only
 * action list keeps exactly the F actions, in order. A frame of another
 * pass is refused naming a step while passes are steps, a pass otherwise. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>

#include "evalrun.h"
#include "test_worker_fakectx.h"

static void ctx(fk_net *net, int mode, int every, int batches, int steps) {
  fk_net_init(net, 1);
  fk_rank *r = &net->r[0];
  fk_geom(r, 1, 1, 1, 1, NULL);
  r->cfg.sl.mode = mode;
  r->cfg.sl.train.eval_every = every;
  r->cfg.sl.train.eval_batches = batches;
  r->cfg.steps = steps;
}

static void tags_case(int every, int batches, int steps) {
  fk_net net;
  ctx(&net, PW_MODE_TRAIN, every, batches, steps);
  pw_evalrun e;
  assert_int_equal(pw_evalrun_init(&e, &net.r[0].cx), 0);
  int evals = 0;
  for (int k = 0; k < steps; k++) {
    int due = pw_evalrun_due(&e, k);
    int want_due = (k + 1) % every == 0 || k + 1 == steps;
    if (due != want_due) fail_msg("every %d, %d steps: step %d due %d, want %d", every, steps, k, due, want_due);
    evals += due;
    assert_int_equal(pw_evalrun_tag(&e, k), k + batches * (k / every));
    if (k + 1 < steps) {
      int gap = pw_evalrun_tag(&e, k + 1) - pw_evalrun_tag(&e, k) - 1;
      if (gap != (due ? batches : 0))
        fail_msg("every %d batches %d: steps %d and %d leave %d tags between them, want %d", every, batches, k, k + 1,
                 gap, due ? batches : 0);
      assert_int_equal(pw_evalrun_next(pw_evalrun_tag(&e, k)), pw_evalrun_tag(&e, k) + 1);
    }
  }
  assert_int_equal(evals, steps / every + (steps % every != 0));
  assert_true(pw_evalrun_due(&e, steps - 1)); /* the last step */
  pw_evalrun_close(&e);
  fk_net_free(&net);
}

static void test_tags_and_due(void **state) {
  (void)state;
  tags_case(3, 2, 10);
  tags_case(3, 2, 9); /* the last step is an eval_every-th one: once */
  tags_case(1, 4, 6);
  tags_case(5, 1, 3); /* only the last */
  tags_case(2, 8, 7);
}

static void test_no_eval(void **state) {
  (void)state;
  struct {
    int mode, every;
  } cases[] = {{PW_MODE_TRAIN, 0}, {PW_MODE_FORWARD, 2}, {PW_MODE_FORWARD, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fk_net net;
    ctx(&net, cases[i].mode, cases[i].every, 3, 8);
    pw_evalrun e;
    assert_int_equal(pw_evalrun_init(&e, &net.r[0].cx), 0);
    assert_null(e.acts);
    for (int k = 0; k < 8; k++) {
      assert_false(pw_evalrun_due(&e, k));
      assert_int_equal(pw_evalrun_tag(&e, k), k);
    }
    pw_evalrun_close(&e);
    fk_net_free(&net);
  }
}

static void test_tags_wrap(void **state) {
  (void)state;
  assert_int_equal(pw_evalrun_next(0x7ffffffe), 0x7fffffff);
  assert_int_equal(pw_evalrun_next(0x7fffffff), 0); /* never negative */
  fk_net net;
  ctx(&net, PW_MODE_TRAIN, 1, 8, INT_MAX);
  pw_evalrun e;
  assert_int_equal(pw_evalrun_init(&e, &net.r[0].cx), 0);
  for (int k = INT_MAX - 3; k > 0 && k <= INT_MAX - 1; k++) {
    int t = pw_evalrun_tag(&e, k);
    assert_true(t >= 0);
    assert_int_equal((uint32_t)t, (uint32_t)(((uint64_t)k * 9) & 0x7fffffffu));
    /* consecutive tags stay consecutive mod 2^31 */
    assert_int_equal(pw_evalrun_tag(&e, k + 1), (int)(((uint32_t)t + 9) & 0x7fffffffu));
  }
  pw_evalrun_close(&e);
  fk_net_free(&net);
}

static void test_forward_list(void **state) {
  (void)state;
  fk_net net;
  ctx(&net, PW_MODE_TRAIN, 2, 1, 4);
  fk_rank *r = &net.r[0];
  static const pw_action acts[] = {
      {.kind = PW_ACT_F, .mb = 0, .stage = 0}, {.kind = PW_ACT_F, .mb = 1, .stage = 0},
      {.kind = PW_ACT_B, .mb = 0, .stage = 0}, {.kind = PW_ACT_F, .mb = 2, .stage = 0},
      {.kind = PW_ACT_I, .mb = 1, .stage = 0}, {.kind = PW_ACT_W, .mb = 1, .stage = 0},
      {.kind = PW_ACT_F, .mb = 3, .stage = 0}, {.kind = PW_ACT_B, .mb = 2, .stage = 0},
  };
  r->cx.acts = acts, r->cx.n_acts = 8;
  pw_evalrun e;
  assert_int_equal(pw_evalrun_init(&e, &r->cx), 0);
  assert_int_equal(e.n_acts, 4);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(e.acts[i].kind, PW_ACT_F);
    assert_int_equal(e.acts[i].mb, i);
  }
  assert_int_equal(acts[2].kind, PW_ACT_B); /* the run's own list untouched */
  pw_evalrun_close(&e);
  assert_null(e.acts);
  fk_net_free(&net);
}

static void test_refuse(void **state) {
  (void)state;
  fk_net net;
  ctx(&net, PW_MODE_TRAIN, 2, 3, 10);
  fk_rank *r = &net.r[0];
  pw_evalrun e;
  assert_int_equal(pw_evalrun_init(&e, &r->cx), 0);
  pw_frame_hdr h = {.kind = PW_FRAME_ACT, .job = FK_JOB, .step = 7};
  pw_err err = {0};
  /* before the first eval: passes are steps */
  r->step = 1, r->tag = pw_evalrun_tag(&e, 1);
  assert_int_equal(r->tag, 1);
  assert_int_equal(pw_evalrun_refuse(&e, &h, &err), PW_EPROTO);
  fk_err_has(&err, "ACT for step 7 while at step 1");
  /* after one: tags run ahead of steps */
  r->step = 4, r->tag = pw_evalrun_tag(&e, 4);
  assert_int_equal(r->tag, 10);
  h.kind = PW_FRAME_NORM, h.step = 12;
  memset(&err, 0, sizeof err);
  assert_int_equal(pw_evalrun_refuse(&e, &h, &err), PW_EPROTO);
  fk_err_has(&err, "NORM for pass 12 while at pass 10 (step 4)");
  pw_evalrun_close(&e);
  fk_net_free(&net);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tags_and_due),
      cmocka_unit_test(test_no_eval),
      cmocka_unit_test(test_tags_wrap),
      cmocka_unit_test(test_forward_list),
      cmocka_unit_test(test_refuse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
