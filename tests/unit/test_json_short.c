/* test_json_short: reals in JSON text as people wrote them (json_short.h):
 * the shortest decimal that reads back as the same double, still a real;
 * strings, keys, integers and literals untouched; and for many random
 * doubles, the text parses back to the same bits. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "json_short.h"

static void expect_dump(json_t *j, const char *want) {
  char *s = pw_json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
  assert_non_null(s);
  assert_string_equal(s, want);
  free(s);
  json_decref(j);
}

static void test_as_written(void **state) {
  expect_dump(json_pack("{s:f}", "lr", 3e-3), "{\"lr\":0.003}");
  expect_dump(json_pack("[f, f, f, f]", 0.1, 2.382, 1e-8, 0.95), "[0.1,2.382,1e-8,0.95]");
  /* a real stays a real */
  expect_dump(json_pack("[f, f, f]", 1.0, -2.0, 1e22), "[1.0,-2.0,1e22]");
  /* what needs 17 digits keeps them */
  expect_dump(json_pack("[f]", 0.1 + 0.2), "[0.30000000000000004]");
  /* integers, literals, strings and keys are not numbers to rewrite */
  expect_dump(json_pack("{s:i, s:b, s:n, s:s, s:f}", "1.50000000000000000", 7, "t", 1, "z", "0.30000000000000004e1",
                        "x", "x", 0.5),
              "{\"1.50000000000000000\":7,\"t\":true,\"z\":null,\"0.30000000000000004e1\":\"x\",\"x\":0.5}");
  /* escapes inside strings do not end them */
  expect_dump(json_pack("[s, f]", "a\"0.10000000000000001\\", 0.25), "[\"a\\\"0.10000000000000001\\\\\",0.25]");
}

static void test_shorten_text(void **state) {
  char t[] = "{\"lr\": 0.0030000000000000001, \"n\": [12, -3.5000000000000000, 1.0000000000000001e-05]}";
  pw_json_shorten(t);
  assert_string_equal(t, "{\"lr\": 0.003, \"n\": [12, -3.5, 1e-5]}");
}

/* Random doubles of every magnitude: the shortened text parses back to the
 * same bits, and is never longer than jansson's. */
static void test_round_trip(void **state) {
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 20000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    double d;
    uint64_t bits = x;
    memcpy(&d, &bits, sizeof d);
    if (!isfinite(d)) continue;
    json_t *a = json_pack("[f]", d);
    char *full = json_dumps(a, JSON_COMPACT), *s = pw_json_dumps(a, JSON_COMPACT);
    assert_non_null(s);
    assert_true(strlen(s) <= strlen(full));
    json_t *back = json_loads(s, 0, NULL);
    assert_non_null(back);
    assert_true(json_is_real(json_array_get(back, 0)));
    double e = json_real_value(json_array_get(back, 0));
    if (memcmp(&e, &d, sizeof d)) fail_msg("%s read back as %.17g, not %.17g", s, e, d);
    json_decref(back);
    json_decref(a);
    free(full);
    free(s);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_as_written),
      cmocka_unit_test(test_shorten_text),
      cmocka_unit_test(test_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
