/* test_addr: HOST:PORT parsing as the daemons' options use it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "addr.h"

static void test_split(void **st) {
  static const struct {
    const char *in, *host;
    int port, rc;
  } cases[] = {
      {"127.0.0.1:8080", "127.0.0.1", 8080, 0}, {"0.0.0.0:0", "0.0.0.0", 0, 0},
      {"[::1]:7070", "::1", 7070, 0},         {"localhost:1", "localhost", 1, 0},
      {"host", "", 0, -1},                     {":80", "", 0, -1},
      {"h:", "", 0, -1},                       {"h:65536", "", 0, -1},
      {"h:-1", "", 0, -1},                     {"h:80x", "", 0, -1},
      {"[]:80", "", 0, -1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char host[64] = "";
    int port = -7;
    int rc = pw_addr_split(cases[i].in, host, sizeof host, &port);
    if (rc != cases[i].rc) fail_msg("%s: rc %d, want %d", cases[i].in, rc, cases[i].rc);
    if (!rc) {
      assert_string_equal(host, cases[i].host);
      assert_int_equal(port, cases[i].port);
    }
  }
  char tiny[4];
  int port;
  assert_int_equal(pw_addr_split("longhost:1", tiny, sizeof tiny, &port), -1);
  assert_true(pw_addr_is_loopback("127.0.0.2") && pw_addr_is_loopback("::1") && pw_addr_is_loopback("localhost"));
  assert_false(pw_addr_is_loopback("10.0.0.1") || pw_addr_is_loopback("0.0.0.0"));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_split)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
