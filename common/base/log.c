/* log: the implementation of log.h. Thread-safe: one write(2) per line. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

pw_log_level pw_log_min = PW_LOG_INFO;
static char log_tag[64];

void pw_log_set_level(pw_log_level lvl) { pw_log_min = lvl; }

int pw_log_parse_level(const char *s) {
  static const char *const names[] = {"debug", "info", "warn", "error", "off"};
  for (int i = 0; i < 5; i++)
    if (s && strcasecmp(s, names[i]) == 0) return i;
  return -1;
}

void pw_log_set_tag(const char *tag) { snprintf(log_tag, sizeof log_tag, "%s", tag ? tag : ""); }

void pw_log_write(pw_log_level lvl, const char *file, int line, const char *fmt, ...) {
  static const char *const lv[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};
  char buf[2048];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s%s%s:%d ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                   tm.tm_sec, ts.tv_nsec / 1000000, lv[lvl], log_tag, log_tag[0] ? " " : "",
                   base, line);
  va_list ap;
  va_start(ap, fmt);
  if (n < (int)sizeof buf) n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  ssize_t w = write(2, buf, (size_t)n);
  (void)w;
}

void pw__assert_fail(const char *expr, const char *file, int line) {
  pw_log_write(PW_LOG_ERROR, file, line, "assertion failed: %s", expr);
  abort();
}
