/* test_worker_stop: a drain's stop on a real run (worker/run.c:
 * pw_run_stop_at, pw_run_take_stop). The rule every rank of a run follows
 * alike: a stop at step S is taken only while step S has not begun (the
 * compute thread decides a step's checkpoint from cp.last, which it reads
 * when sh.step changes); one at or past the run's own end changes nothing;
 * the compute thread sees it only when it takes it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "test_worker_fixture.h"

static const char *SPEC =
    "{\"name\":\"stop\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":2,\"n_heads\":2},"
    "\"mesh\":{\"pp\":2,\"dp\":1},\"schedule\":{\"name\":\"1f1b\",\"microbatches\":2},"
    "\"train\":{\"steps\":100,\"batch_size\":4,\"seed\":5},\"data\":{\"kind\":\"copy\"}}";

static void stop_rule(void **state) {
  (void)state;
  wf_job *f = wf_job_make(SPEC);
  pw_run *r = wf_run(f, 0, 100);
  char why[160] = "";
  pw_run_take_stop(r);
  assert_int_equal(r->cp.last, 100); /* no stop: the run's own end */
  r->sh.step = 10;                   /* steps 1..10 done, step 11 may have begun */
  assert_int_equal(pw_run_stop_at(r, 11, why, sizeof why), PW_ECONFLICT);
  assert_non_null(strstr(why, "cannot stop after step 11: step 11 has begun"));
  assert_int_equal(r->sh.stop_at, 0); /* refused: nothing changed */
  assert_int_equal(pw_run_stop_at(r, 10, why, sizeof why), PW_ECONFLICT); /* already past */
  assert_int_equal(pw_run_stop_at(r, 100, why, sizeof why), 0);           /* its own end: nothing to do */
  assert_int_equal(pw_run_stop_at(r, 500, why, sizeof why), 0);
  assert_int_equal(r->sh.stop_at, 0);
  assert_int_equal(pw_run_stop_at(r, 12, why, sizeof why), 0); /* step 12 has not begun */
  assert_int_equal(r->sh.stop_at, 12);
  assert_int_equal(r->cp.last, 100); /* not seen before the compute thread takes it */
  pw_run_take_stop(r);
  assert_int_equal(r->cp.last, 12);
  wf_run_free(f, r);
  wf_job_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(stop_rule)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
