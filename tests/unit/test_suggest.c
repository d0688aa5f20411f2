/* test_suggest: the edit distance and the "did you mean" every message of
 * the CLI and the spec parser uses (common/spec/suggest.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "suggest.h"

static void test_distance(void **st) {
  static const struct {
    const char *a, *b;
    int d;
  } cases[] = {
      {"", "", 0},           {"", "abc", 3},          {"abc", "", 3},         {"steps", "steps", 0},
      {"step", "steps", 1},  {"stesp", "steps", 1},   {"n_head", "n_heads", 1}, {"GPipe", "gpipe", 0},
      {"kitten", "sitting", 3}, {"ca", "abc", 3},     {"zbh1", "zb-h1", 1},   {"abcd", "badc", 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int d = pw_edit_distance(cases[i].a, cases[i].b);
    if (d != cases[i].d) fail_msg("'%s' -> '%s': %d, want %d", cases[i].a, cases[i].b, d, cases[i].d);
    assert_int_equal(pw_edit_distance(cases[i].b, cases[i].a), d); /* symmetric */
  }
  char big[300];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  assert_int_equal(pw_edit_distance(big, "a"), 100); /* capped, no overflow */
}

static void test_suggest(void **st) {
  static const char *const flags[] = {"job", "steps", "out", "resume", "init", "log-json", "threads", "quiet"};
  static const char *const scheds[] = {"gpipe", "1f1b", "eager1f1b", "zb-h1", "interleaved-1f1b",
                                       "interleaved-gpipe", "interleaved-1f1b-plus-one", "kimi-k2", "dualpipev"};
  const int nf = (int)(sizeof flags / sizeof flags[0]), ns = (int)(sizeof scheds / sizeof scheds[0]);
  assert_string_equal(pw_suggest("step", flags, nf), "steps");
  assert_string_equal(pw_suggest("thread", flags, nf), "threads");
  assert_string_equal(pw_suggest("reusme", flags, nf), "resume");
  assert_string_equal(pw_suggest("log", flags, nf), "log-json"); /* the start of one name */
  assert_null(pw_suggest("verbose", flags, nf));
  assert_null(pw_suggest("x", flags, nf));
  assert_string_equal(pw_suggest("gpip", scheds, ns), "gpipe");
  assert_string_equal(pw_suggest("ZBH1", scheds, ns), "zb-h1");
  assert_string_equal(pw_suggest("dualpipe", scheds, ns), "dualpipev");
  assert_string_equal(pw_suggest("kimi", scheds, ns), "kimi-k2");
  assert_null(pw_suggest("interleaved", scheds, ns)); /* the start of three: no guess */
  assert_null(pw_suggest("pipedream", scheds, ns));
  assert_null(pw_suggest("a", NULL, 0));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_distance), cmocka_unit_test(test_suggest)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
