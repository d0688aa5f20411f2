/* sdnotify: the sd_notify datagram protocol (see sdnotify.h). One socket per
 * call: notifications are rare (start, a status change, stop), and keeping
 * no state means no fd leaks into children and nothing to close. Must never
 * block or signal: MSG_DONTWAIT | MSG_NOSIGNAL on a SOCK_CLOEXEC socket. */
#include "sdnotify.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "errors.h"

int pw_sd_notify(const char *state) {
  const char *addr = getenv("NOTIFY_SOCKET");
  if (!addr || !addr[0]) return 0;
  if (!state || !state[0]) return PW_EINVAL;

  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t n = strlen(addr);
  if (n >= sizeof sa.sun_path) return PW_EINVAL;
  socklen_t len;
  if (addr[0] == '@') {
    /* Abstract: a leading NUL, then the name; the length counts exactly the
     * name's bytes (no trailing NUL: it would be part of the name). */
    if (n < 2) return PW_EINVAL;
    memcpy(sa.sun_path + 1, addr + 1, n - 1);
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  } else if (addr[0] == '/') {
    memcpy(sa.sun_path, addr, n);
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
  } else {
    return PW_EINVAL; /* e.g. systemd 254's "vsock:..." — not ours to reach */
  }

  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PW_EIO;
  size_t sl = strlen(state);
  ssize_t w;
  do {
    w = sendto(fd, state, sl, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&sa, len);
  } while (w < 0 && errno == EINTR);
  close(fd);
  return w == (ssize_t)sl ? 1 : PW_EIO;
}

int pw_sd_notifyf(const char *fmt, ...) {
  if (!fmt) return PW_EINVAL;
  const char *addr = getenv("NOTIFY_SOCKET");
  if (!addr || !addr[0]) return 0;
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof buf) return PW_EINVAL;
  return pw_sd_notify(buf);
}
