/* log: one line per event on stderr, with time, level and origin.
 * The level is set once at start (PW_LOG env or a daemon's option). */
#ifndef PW_LOG_H
#define PW_LOG_H

typedef enum { PW_LOG_DEBUG, PW_LOG_INFO, PW_LOG_WARN, PW_LOG_ERROR, PW_LOG_OFF } pw_log_level;

extern pw_log_level pw_log_min;
void pw_log_set_level(pw_log_level lvl);
/* Parses "debug" | "info" | "warn" | "error" | "off"; -1 if unknown. */
int pw_log_parse_level(const char *s);
void pw_log_set_tag(const char *tag); /* e.g. the worker's name */
void pw_log_write(pw_log_level lvl, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define PW_LOG(lvl, ...) \
  do { if ((lvl) >= pw_log_min) pw_log_write((lvl), __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define pw_debug(...) PW_LOG(PW_LOG_DEBUG, __VA_ARGS__)
#define pw_info(...) PW_LOG(PW_LOG_INFO, __VA_ARGS__)
#define pw_warn(...) PW_LOG(PW_LOG_WARN, __VA_ARGS__)
#define pw_error(...) PW_LOG(PW_LOG_ERROR, __VA_ARGS__)

/* An assert that survives NDEBUG and says where it failed. */
#define PW_ASSERT(cond) \
  do { if (!(cond)) pw__assert_fail(#cond, __FILE__, __LINE__); } while (0)
void pw__assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#endif
