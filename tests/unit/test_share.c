/* test_share: the plan replayed on shared cores (share.h) against
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
 * bubble 6/18 = 1/3. Both ranks on one core (1 thread each), cores as
 * slots:
 *   0-1 r0 F0;  1-2 r0 F1 (r0 keeps the core; r1's F0 waits from 1);
 *   2-3 r1 F0 (r0 waits for B0@s1);  3-5 r1 B0;
 *   5-6 r1 F1 (r1 keeps the core; r0's B0 waits from 5);  6-8 r1 B1;
 *   8-10 r0 B0;  10-12 r0 B1.
 * Makespan 12; each rank busy 6 (the core is never idle); bubble
 * 12/24 = 1/2. */
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

/* Each rank's four actions start and end at the times given. */
static void same_times(const pw_sim_result *r, const double r0[4][2], const double r1[4][2]) {
  for (int i = 0; i < 4; i++) {
    const pw_sim_event *a = &r->events[r->rank_first[0] + i], *b = &r->events[r->rank_first[1] + i];
    assert_true(fabs(a->start - r0[i][0]) < EPS && fabs(a->end - r0[i][1]) < EPS);
    assert_true(fabs(b->start - r1[i][0]) < EPS && fabs(b->end - r1[i][1]) < EPS);
  }
}

static void one_core(void **state) {
  (void)state;
  pw_sched *s = build("1f1b", 2, 2);
  pw_sim_result *r = shared(s, 1, 0);
  assert_true(fabs(r->makespan - 12) < EPS);
  assert_true(fabs(r->bubble_ratio - 0.5) < EPS);
  assert_true(fabs(r->busy[0] - 6) < EPS && fabs(r->busy[1] - 6) < EPS);
  static const double r0[4][2] = {{0, 1}, {1, 2}, {8, 10}, {10, 12}}, r1[4][2] = {{2, 3}, {3, 5}, {5, 6}, {6, 8}};
  same_times(r, r0, r1);
  pw_sim_result_free(r);
  pw_sched_free(s);
}

/* r is the plain replay of s, event for event; returns the plain bubble. */
static double same_as_plain(const pw_sched *s, pw_sim_result *r) {
  pw_sim_costs cs = {.f = F, .b = B};
  pw_sim_result *plain = NULL;
  pw_err e = {0};
  assert_int_equal(pw_sim_run(s, &cs, &plain, &e), 0);
  assert_true(fabs(r->bubble_ratio - plain->bubble_ratio) < EPS);
  assert_true(fabs(r->makespan - plain->makespan) < EPS);
  for (int i = 0; i < r->n_events; i++) {
    assert_true(fabs(r->events[i].start - plain->events[i].start) < EPS);
    assert_true(fabs(r->events[i].end - plain->events[i].end) < EPS);
  }
  double bubble = plain->bubble_ratio;
  pw_sim_result_free(plain);
  pw_sim_result_free(r);
  return bubble;
}

/* Enough cores: the plain replay, figure for figure. */
static void no_sharing(void **state) {
  (void)state;
  pw_sched *s = build("1f1b", 2, 2);
  assert_true(fabs(same_as_plain(s, shared(s, 2, 0)) - 1.0 / 3) < EPS);
  pw_sched_free(s);
}

/* Other busy work always there: 1 core and 1 other thread, so whichever
 * rank computes runs at 1/2: the one-core timeline at half speed,
 * makespan 24, the same bubble. */
static void other_work(void **state) {
  (void)state;
  pw_sched *s = build("1f1b", 2, 2);
  pw_sim_result *r = shared(s, 1, 1);
  assert_true(fabs(r->makespan - 24) < EPS);
  assert_true(fabs(r->bubble_ratio - 0.5) < EPS);
  pw_sim_result_free(r);
  pw_sched_free(s);
}

/* Each rank on a host of its own with one core: nothing shared. */
static void own_hosts(void **state) {
  (void)state;
  pw_sched *s = build("gpipe", 2, 3);
  int host[2] = {0, 1}, threads[2] = {1, 1}, c[2] = {1, 1};
  pw_share sh = {.n_ranks = 2, .host = host, .threads = threads, .n_hosts = 2, .cores = c};
  pw_sim_costs cs = {.f = F, .b = B};
  pw_sim_result *r = NULL;
  pw_err e = {0};
  assert_int_equal(pw_sim_run_shared(s, &cs, &sh, &r, &e), 0);
  same_as_plain(s, r);
  pw_sched_free(s);
}

/* Transfers priced as the plain replay prices them: an activation sent as
 * bf16 (act_scale 0.5) takes half its float bytes' time, its gradient all
 * of it. Own hosts, so any difference is the links'. */
static void scaled_links(void **state) {
  (void)state;
  pw_sched *s = build("1f1b", 2, 2);
  int host[2] = {0, 1}, threads[2] = {1, 1}, c[2] = {1, 1};
  pw_share sh = {.n_ranks = 2, .host = host, .threads = threads, .n_hosts = 2, .cores = c};
  double bytes[1] = {4};
  pw_sim_costs cs = {.f = F, .b = B, .act_bytes = bytes, .bandwidth = 1, .act_scale = 0.5};
  pw_sim_result *r = NULL, *plain = NULL;
  pw_err e = {0};
  assert_int_equal(pw_sim_run_shared(s, &cs, &sh, &r, &e), 0);
  assert_int_equal(pw_sim_run(s, &cs, &plain, &e), 0);
  /* F0@s1 starts when F0@s0's 2 seconds of bf16 bytes arrive at 1 + 2 */
  assert_true(fabs(r->events[r->rank_first[1]].start - 3) < EPS);
  assert_true(fabs(r->makespan - plain->makespan) < EPS);
  for (int i = 0; i < r->n_events; i++) assert_true(fabs(r->events[i].end - plain->events[i].end) < EPS);
  pw_sim_result_free(plain);
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

/* Measured sharing (speed {1, 0.5}: two busy threads each at half speed),
 * same plan and costs, both ranks on one host: processor sharing, no rank
 * waits for a core.
 *   0-1 r0 F0 alone;  1-3 r0 F1 and r1 F0 together at 0.5;
 *   3-5 r1 B0 alone (r0 waits for it);  5-7 r1 F1 at 0.5 beside r0's B0;
 *   7-9 r0 B0's second half at 0.5 beside r1's B1 (half of it done);
 *   9-10 r1 B1's rest alone;  10-12 r0 B1 alone.
 * Makespan 12; busy 9 each; bubble 6/24 = 1/4. */
static void measured_speed(void **state) {
  (void)state;
  pw_sched *s = build("1f1b", 2, 2);
  int host[2] = {0, 0}, threads[2] = {1, 1}, c[1] = {1};
  double speed[2] = {1, 0.5};
  pw_share sh = {.n_ranks = 2, .host = host, .threads = threads, .n_hosts = 1, .cores = c, .speed = speed, .n_speed = 2};
  pw_sim_costs cs = {.f = F, .b = B};
  pw_sim_result *r = NULL;
  pw_err e = {0};
  assert_int_equal(pw_sim_run_shared(s, &cs, &sh, &r, &e), 0);
  assert_true(fabs(r->makespan - 12) < EPS);
  assert_true(fabs(r->bubble_ratio - 0.25) < EPS);
  static const double r0[4][2] = {{0, 1}, {1, 3}, {5, 9}, {10, 12}}, r1[4][2] = {{1, 3}, {3, 5}, {5, 7}, {7, 10}};
  same_times(r, r0, r1);
  pw_sim_result_free(r);
  speed[1] = 1;
  assert_int_equal(pw_sim_run_shared(s, &cs, &sh, &r, &e), 0);
  pw_sim_result *plain = NULL;
  assert_int_equal(pw_sim_run(s, &cs, &plain, &e), 0);
  assert_true(fabs(r->makespan - plain->makespan) < EPS); /* speed 1 for both: as on cores of their own */
  pw_sim_result_free(plain);
  pw_sim_result_free(r);
  pw_sched_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(measured_speed), cmocka_unit_test(one_core), cmocka_unit_test(no_sharing),
                                     cmocka_unit_test(other_work), cmocka_unit_test(own_hosts), cmocka_unit_test(scaled_links),
                                     cmocka_unit_test(bad_share)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
