/* test_cpuset: cpulists read and written as Linux writes them, and the
 * choice of a rank's CPUs (common/base/cpuset.h): disjoint from what other
 * ranks hold, within the worker's mask, on one NUMA node when one has
 * room (the tightest), across nodes otherwise, refused when too few. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "cpuset.h"

static pw_cpuset set(const char *text) {
  pw_cpuset s;
  pw_err err = {0};
  if (pw_cpuset_parse(text, &s, &err)) fail_msg("parse '%s': %s", text, err.msg);
  return s;
}

static const char *fmt(const pw_cpuset *s) {
  static char buf[PW_CPUSET_TEXT];
  assert_int_equal(pw_cpuset_format(s, buf, sizeof buf), 0);
  return buf;
}

static void parse_and_format(void **state) {
  (void)state;
  pw_cpuset s = set("0-3,8,10-11\n");
  assert_int_equal(pw_cpuset_count(&s), 7);
  assert_string_equal(fmt(&s), "0-3,8,10-11");
  s = set("5,4,6");
  assert_string_equal(fmt(&s), "4-6");
  s = set("");
  assert_int_equal(pw_cpuset_count(&s), 0);
  assert_string_equal(fmt(&s), "");
  s = set("1023");
  assert_true(pw_cpuset_has(&s, 1023));
  pw_err err = {0};
  assert_int_equal(pw_cpuset_parse("1024", &s, &err), PW_EFORMAT);
  assert_non_null(strstr(err.msg, "below 1024"));
  assert_int_equal(pw_cpuset_parse("3-1", &s, &err), PW_EFORMAT);
  assert_non_null(strstr(err.msg, "backwards"));
  assert_int_equal(pw_cpuset_parse("0-3;4", &s, &err), PW_EFORMAT);
  assert_int_equal(pw_cpuset_parse("a", &s, &err), PW_EFORMAT);
  assert_int_equal(pw_cpuset_parse("1,", &s, &err), PW_EFORMAT);
  assert_int_equal(pw_cpuset_parse("99999999999999999999", &s, &err), PW_EFORMAT);
  char small[4];
  s = set("0-3,8");
  assert_int_equal(pw_cpuset_format(&s, small, sizeof small), PW_ETOOBIG);
}

static void pick(void **state) {
  (void)state;
  pw_cpuset all = set("0-15"), used = set(""), out;
  pw_cpuset nodes[2] = {set("0-7"), set("8-15")};
  /* no nodes known: the lowest free */
  assert_int_equal(pw_cpuset_pick(&all, &used, NULL, 0, 2, &out), 0);
  assert_string_equal(fmt(&out), "0-1");
  /* four ranks of 4 threads on 2 nodes: each on one node, disjoint */
  const char *want[] = {"0-3", "4-7", "8-11", "12-15"};
  for (int k = 0; k < 4; k++) {
    assert_int_equal(pw_cpuset_pick(&all, &used, nodes, 2, 4, &out), 0);
    assert_string_equal(fmt(&out), want[k]);
    pw_cpuset_or(&used, &out);
  }
  assert_int_equal(pw_cpuset_pick(&all, &used, nodes, 2, 1, &out), PW_EBUDGET); /* all held */
  assert_int_equal(pw_cpuset_count(&out), 0);
  /* the tightest node that fits: node 0 has 3 free, node 1 has 8: a rank of 3 goes to node 0 */
  used = set("0-4");
  assert_int_equal(pw_cpuset_pick(&all, &used, nodes, 2, 3, &out), 0);
  assert_string_equal(fmt(&out), "5-7");
  /* no node has 6 free: across nodes, lowest first */
  assert_int_equal(pw_cpuset_pick(&all, &used, nodes, 2, 12, &out), PW_EBUDGET);
  used = set("0-4,8-12");
  assert_int_equal(pw_cpuset_pick(&all, &used, nodes, 2, 6, &out), 0);
  assert_string_equal(fmt(&out), "5-7,13-15");
  /* only within the worker's own mask (a Slurm task's, say) */
  pw_cpuset mine = set("2,3,9");
  used = set("2");
  assert_int_equal(pw_cpuset_pick(&mine, &used, nodes, 2, 2, &out), 0);
  assert_string_equal(fmt(&out), "3,9");
  assert_int_equal(pw_cpuset_pick(&mine, &used, nodes, 2, 3, &out), PW_EBUDGET);
  assert_int_equal(pw_cpuset_pick(&mine, &used, nodes, 2, 0, &out), PW_EBUDGET);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(parse_and_format), cmocka_unit_test(pick)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
