/* test_share: the plan replayed under processor sharing (share.h) against
 * hand-computed timelines, and the no-sharing case against pw_sim_run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "schedule.h"
#include "share.h"
#include "sim.h"

#define EPS 1e-9

static pw_sched *build(const char *name, int pp, int m) {
  pw_sched *s = NULL;
  pw_err e = {0};
  assert_int_equal(pw_sched_build(name, pp, 1, m, 0, &s, &e), 0);
  return s;
}

/* 1f1b, pp = 2, m = 2, F = 1, B = 2, free links. Own cores: makespan 9,
 * bubble 6/18 = 1/3. Both ranks on one core (1 thread each):
 *   0-1 r0 F0 alone; 1-3 r0 F1 and r1 F0 at half speed; 3-5 r1 B0 alone;
 *   5-7 r0 B0 and r1 F1 at half (r1 F1 ends, r0 B0 has 1 left);
 *   7-9 r0 B0 and r1 B1 at half (r0 B0 ends, r1 B1 has 1 left);
 *   9-10 r1 B1 alone; 10-12 r0 B1 alone.
 * Makespan 12; r0 busy 1+2+4+2 = 9, r1 2+2+2+3 = 9; bubble 6/24 = 1/4. */
static const double F[2] = {1, 1}, B[2] = {2, 2};

static pw_sim_result *shared(const pw_sched *s, int cores, int other) {
  int host[2] = {0, 0}, threads[2] = {1, 1}, c[1] = {cores}, o[1] = {other};
  pw_share sh = {.n_ranks = 2, .host = host, .threads = threads, .n_hosts = 1, .cores = c, .other = o};
  pw_sim_costs cs = {.f = F, .b = B};
  pw_sim_result *r = NULL;
  pw_err e = {0};
  assert_int_equal(pw_sim_run_shared(s, &cs, &sh, &r, &e), 0);
  return r;
}

static void one_core(void **state) {
  (void)state;
  pw_sched *s = build("1f1b", 2, 2);
  pw_sim_result *r = shared(s, 1, 0);
  assert_true(fabs(r->makespan - 12) < EPS);
  assert_true(fabs(r->bubble_ratio - 0.25) < EPS);
  assert_true(fabs(r->busy[0] - 9) < EPS && fabs(r->busy[1] - 9) < EPS);
  /* r0's B0 ran 5..9: 2 units of work at half speed all the way */
  const pw_sim_event *b0 = &r->events[r->rank_first[0] + 2];
  assert_int_equal(b0->act.kind, PW_ACT_B);
  assert_true(fabs(b0->start - 5) < EPS && fabs(b0->end - 9) < EPS);
  pw_sim_result_free(r);
  pw_sched_free(s);
}

/* Enough cores: the plain replay, figure for figure. */
static void no_sharing(void **state) {
  (void)state;
  pw_sched *s = build("1f1b", 2, 2);
  pw_sim_costs cs = {.f = F, .b = B};
  pw_sim_result *plain = NULL, *r = shared(s, 2, 0);
  pw_err e = {0};
  assert_int_equal(pw_sim_run(s, &cs, &plain, &e), 0);
  assert_true(fabs(plain->bubble_ratio - 1.0 / 3) < EPS);
  assert_true(fabs(r->bubble_ratio - plain->bubble_ratio) < EPS);
  assert_true(fabs(r->makespan - plain->makespan) < EPS);
  for (int i = 0; i < r->n_events; i++) {
    assert_true(fabs(r->events[i].start - plain->events[i].start) < EPS);
    assert_true(fabs(r->events[i].end - plain->events[i].end) < EPS);
  }
  pw_sim_result_free(plain);
  pw_sim_result_free(r);
  pw_sched_free(s);
}

/* Other busy work always there: 2 cores, 2 other threads, so a lone rank
 * gets 2/3 and two ranks 1/2 each. 0-1.5 r0 F0 alone (1 at 2/3); then the
 * one-core timeline with lone stretches at 2/3 instead of 1: every lone
 * stretch takes 1.5 times as long: 1.5 + 2 + 3 + 2 + 2 + 1.5 + 3 = 15. */
static void other_work(void **state) {
  (void)state;
  pw_sched *s = build("1f1b", 2, 2);
  pw_sim_result *r = shared(s, 2, 2);
  assert_true(fabs(r->makespan - 15) < EPS);
  pw_sim_result_free(r);
  pw_sched_free(s);
}

static void bad_share(void **state) {
  (void)state;
  pw_sched *s = build("1f1b", 2, 2);
  int host[2] = {0, 1}, threads[2] = {1, 1}, c[1] = {1};
  pw_share sh = {.n_ranks = 2, .host = host, .threads = threads, .n_hosts = 1, .cores = c};
  pw_sim_result *r = NULL;
  pw_err e = {0};
  assert_int_equal(pw_sim_run_shared(s, NULL, &sh, &r, &e), PW_EINVAL);
  assert_null(r);
  assert_string_equal(e.path, "share");
  pw_sched_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(one_core), cmocka_unit_test(no_sharing),
                                     cmocka_unit_test(other_work), cmocka_unit_test(bad_share)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
