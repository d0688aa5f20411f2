/* test_coord_contention: the contention note (coordinator/contention.h)
 * from hand-made host tables: which hosts are named, the share, and the
 * message's wording for uniform and mixed threads and other jobs' work. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "contention.h"

/* n ranks over the hosts in host[], threads[] each; cores[] and other[]
 * per host (named h0, h1, ...). */
static pw_contention table(int n, int *host, int *threads, int nh, int *cores, int *other, pw_cont_host *hs) {
  for (int h = 0; h < nh; h++) {
    memset(&hs[h], 0, sizeof hs[h]);
    snprintf(hs[h].host, sizeof hs[h].host, "id%d", h);
    snprintf(hs[h].hostname, sizeof hs[h].hostname, "h%d", h);
    hs[h].cores = cores[h];
    hs[h].other = other[h];
  }
  for (int r = 0; r < n; r++) hs[host[r]].threads += threads[r], hs[host[r]].n_ranks++;
  return (pw_contention){.n_ranks = n, .host = host, .threads = threads, .n_hosts = nh, .hosts = hs, .cores = cores,
                         .other = other};
}

static void four_on_two(void **state) {
  (void)state;
  int host[4] = {0, 0, 0, 0}, threads[4] = {1, 1, 1, 1}, cores[1] = {2}, other[1] = {0};
  pw_cont_host hs[1];
  pw_contention ct = table(4, host, threads, 1, cores, other, hs);
  json_t *j = pw_contention_json(&ct);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(j, "message")),
                      "4 ranks with 1 thread each share 2 cores on host h0: each rank gets about half a core");
  json_t *h = json_array_get(json_object_get(j, "hosts"), 0);
  assert_int_equal(json_array_size(json_object_get(j, "hosts")), 1);
  assert_true(fabs(json_real_value(json_object_get(h, "share")) - 2.0) < 1e-12);
  assert_int_equal(json_integer_value(json_object_get(h, "threads")), 4);
  assert_int_equal(json_array_size(json_object_get(h, "ranks")), 4);
  json_decref(j);
}

/* Enough cores everywhere: no note. */
static void fits(void **state) {
  (void)state;
  int host[2] = {0, 0}, threads[2] = {1, 1}, cores[1] = {2}, other[1] = {0};
  pw_cont_host hs[1];
  pw_contention ct = table(2, host, threads, 1, cores, other, hs);
  assert_null(pw_contention_json(&ct));
}

/* Two hosts, one fine; mixed threads and other jobs' threads on the other. */
static void mixed(void **state) {
  (void)state;
  int host[3] = {0, 1, 1}, threads[3] = {1, 2, 1}, cores[2] = {4, 2}, other[2] = {0, 1};
  pw_cont_host hs[2];
  pw_contention ct = table(3, host, threads, 2, cores, other, hs);
  json_t *j = pw_contention_json(&ct);
  assert_non_null(j);
  assert_int_equal(json_array_size(json_object_get(j, "hosts")), 1);
  json_t *h = json_array_get(json_object_get(j, "hosts"), 0);
  assert_string_equal(json_string_value(json_object_get(h, "hostname")), "h1");
  assert_int_equal(json_integer_value(json_object_get(h, "other_threads")), 1);
  assert_true(fabs(json_real_value(json_object_get(h, "share")) - 2.0) < 1e-12);
  assert_string_equal(json_string_value(json_object_get(j, "message")),
                      "2 ranks with 3 threads in all share 2 cores with 1 thread of other jobs on host h1: "
                      "each thread gets about half a core");
  json_decref(j);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(four_on_two), cmocka_unit_test(fits), cmocka_unit_test(mixed)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
