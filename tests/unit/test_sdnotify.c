/* test_sdnotify: the sd_notify datagram protocol against real sockets that
 * play the service manager. A path socket and an abstract ('@') socket each
 * receive exactly the bytes sent (the abstract name must not carry a
 * trailing NUL, or the datagram would go to a different name and fail);
 * formatted and multi-line states; the no-op when NOTIFY_SOCKET is unset or
 * empty; every malformed address and state refused with PW_EINVAL; a
 * socket nobody listens on is PW_EIO; no file descriptor leaks. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/time.h>
#include <unistd.h>

#include "errors.h"
#include "sdnotify.h"

/* The manager's side: a bound datagram socket. `name` starting with '@' is
 * abstract. Returns the fd; the test receives with a timeout so a broken
 * sender fails instead of hanging. */
static int manager_socket(const char *name) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t n = strlen(name);
  assert_true(n < sizeof sa.sun_path);
  socklen_t len;
  if (name[0] == '@') {
    memcpy(sa.sun_path + 1, name + 1, n - 1);
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  } else {
    memcpy(sa.sun_path, name, n);
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
  }
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, len), 0);
  struct timeval tv = {2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void expect_datagram(int fd, const char *want) {
  char buf[8192];
  ssize_t n = recv(fd, buf, sizeof buf, 0);
  if (n < 0) fail_msg("no datagram received (wanted '%s')", want);
  if ((size_t)n != strlen(want) || memcmp(buf, want, (size_t)n))
    fail_msg("received '%.*s' (%zd bytes), wanted '%s'", (int)n, buf, n, want);
}

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  assert_non_null(d);
  int n = 0;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

static void test_unset_is_noop(void **state) {
  unsetenv("NOTIFY_SOCKET");
  assert_int_equal(pw_sd_notify("READY=1"), 0);
  assert_int_equal(pw_sd_notifyf("STATUS=%d", 3), 0);
  setenv("NOTIFY_SOCKET", "", 1);
  assert_int_equal(pw_sd_notify("READY=1"), 0);
  /* No socket configured: even a bad state is not an error worth reporting. */
  assert_int_equal(pw_sd_notify(NULL), 0);
  unsetenv("NOTIFY_SOCKET");
}

static void test_path_socket(void **state) {
  char dir[] = "/tmp/pw-sdnotify-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof path, "%s/notify", dir);
  int fd = manager_socket(path);
  setenv("NOTIFY_SOCKET", path, 1);
  int before = count_fds();
  assert_int_equal(pw_sd_notify("READY=1"), 1);
  expect_datagram(fd, "READY=1");
  assert_int_equal(pw_sd_notify("READY=1\nSTATUS=serving on 127.0.0.1:8080"), 1);
  expect_datagram(fd, "READY=1\nSTATUS=serving on 127.0.0.1:8080");
  assert_int_equal(pw_sd_notifyf("STATUS=%d workers, %s", 3, "1 job running"), 1);
  expect_datagram(fd, "STATUS=3 workers, 1 job running");
  assert_int_equal(pw_sd_notify("STOPPING=1"), 1);
  expect_datagram(fd, "STOPPING=1");
  for (int i = 0; i < 50; i++) {
    assert_int_equal(pw_sd_notifyf("STATUS=step %d", i), 1);
    char want[32];
    snprintf(want, sizeof want, "STATUS=step %d", i);
    expect_datagram(fd, want);
  }
  assert_int_equal(count_fds(), before); /* one socket per call, always closed */
  close(fd);
  unlink(path);
  /* Nobody listening any more: an error, not a crash or a hang. */
  assert_int_equal(pw_sd_notify("READY=1"), PW_EIO);
  rmdir(dir);
  unsetenv("NOTIFY_SOCKET");
}

static void test_abstract_socket(void **state) {
  char name[64];
  snprintf(name, sizeof name, "@pw-sdnotify-test-%d-%ld", (int)getpid(), (long)random());
  int fd = manager_socket(name);
  setenv("NOTIFY_SOCKET", name, 1);
  assert_int_equal(pw_sd_notify("READY=1"), 1);
  expect_datagram(fd, "READY=1");
  assert_int_equal(pw_sd_notifyf("STATUS=%s", "registered as w1"), 1);
  expect_datagram(fd, "STATUS=registered as w1");
  close(fd);
  /* The name is gone with its socket. */
  assert_int_equal(pw_sd_notify("READY=1"), PW_EIO);
  unsetenv("NOTIFY_SOCKET");
}

static void test_bad_addresses_and_states(void **state) {
  setenv("NOTIFY_SOCKET", "relative/notify", 1);
  assert_int_equal(pw_sd_notify("READY=1"), PW_EINVAL);
  setenv("NOTIFY_SOCKET", "vsock:2:1234", 1);
  assert_int_equal(pw_sd_notify("READY=1"), PW_EINVAL);
  setenv("NOTIFY_SOCKET", "@", 1);
  assert_int_equal(pw_sd_notify("READY=1"), PW_EINVAL);
  char longp[200];
  memset(longp, 'a', sizeof longp - 1);
  longp[0] = '/';
  longp[sizeof longp - 1] = 0;
  setenv("NOTIFY_SOCKET", longp, 1);
  assert_int_equal(pw_sd_notify("READY=1"), PW_EINVAL);
  longp[0] = '@';
  setenv("NOTIFY_SOCKET", longp, 1);
  assert_int_equal(pw_sd_notify("READY=1"), PW_EINVAL);

  setenv("NOTIFY_SOCKET", "/nonexistent-dir/notify", 1);
  assert_int_equal(pw_sd_notify(NULL), PW_EINVAL);
  assert_int_equal(pw_sd_notify(""), PW_EINVAL);
  assert_int_equal(pw_sd_notify("READY=1"), PW_EIO);
  /* Too long to format: refused, not truncated into a different state. */
  char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = 0;
  assert_int_equal(pw_sd_notifyf("STATUS=%s", big), PW_EINVAL);
  assert_int_equal(pw_sd_notifyf(NULL), PW_EINVAL);
  unsetenv("NOTIFY_SOCKET");
}

int main(void) {
  srandom((unsigned)getpid());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unset_is_noop),
      cmocka_unit_test(test_path_socket),
      cmocka_unit_test(test_abstract_socket),
      cmocka_unit_test(test_bad_addresses_and_states),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
