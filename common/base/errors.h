/* errors: pipewright's error codes, one table for all of them.
 *
 * Functions return 0 on success and a negative PW_E* code on failure, as
 * libuv does. The same X-macro table gives each code its name, a message,
 * the HTTP status the API answers with, and the API's error code string.
 * Where a caller needs to know *what* was wrong (which JSON path, which
 * frame field), it passes a pw_err that the callee fills. */
#ifndef PW_ERRORS_H
#define PW_ERRORS_H

#include <stdarg.h>

/* On a function whose int result reports failure: ignoring it is a
 * compile error (-Werror), so an error cannot be dropped by accident. A
 * (void) cast does not silence it: handle the result. */
#define PW_MUST_CHECK __attribute__((warn_unused_result))

/*  name        message                         http  api code */
#define PW_ERRNO_MAP(X)                                                    \
  X(EINVAL,    "invalid argument",              400, "invalid_argument")   \
  X(ESPEC,     "invalid spec",                  422, "invalid_spec")       \
  X(EJSON,     "malformed JSON",                400, "malformed_json")     \
  X(ENOMEM,    "out of memory",                 500, "out_of_memory")      \
  X(EIO,       "i/o error",                     500, "io_error")           \
  X(ENOENT,    "not found",                     404, "not_found")          \
  X(EFORMAT,   "malformed data",                400, "malformed_data")     \
  X(EPROTO,    "protocol error",                400, "protocol_error")     \
  X(ETOOBIG,   "too large",                     413, "too_large")          \
  X(ETOOLONG,  "request target too long",       414, "too_large")          \
  X(EAUTH,     "unauthorized",                  401, "unauthorized")       \
  X(ECONFLICT, "conflict",                      409, "conflict")           \
  X(EMETHOD,   "method not allowed",            405, "method_not_allowed") \
  X(ENOTSUP,   "not supported",                 422, "not_supported")      \
  X(EDEADLOCK, "schedule deadlocks",            422, "deadlock")           \
  X(ESCHEDULE, "schedule invalid",              422, "invalid_schedule")   \
  X(ECANCELED, "cancelled",                     409, "cancelled")          \
  X(EPEER,     "peer lost",                     500, "peer_lost")          \
  X(EINTERNAL, "internal error",                500, "internal")           \
  X(EBUDGET,   "over the resource budget",      422, "over_budget")        \
  X(EBUSY,     "too many requests",             429, "busy")               \
  X(EUNAVAIL,  "service unavailable",           503, "unavailable")        \
  X(ENOSPC,    "no space left",                 507, "insufficient_storage") \
  X(EREQUEST,  "invalid request",               422, "invalid_request")    \
  X(EFORBIDDEN, "forbidden",                    403, "forbidden")

typedef enum {
  PW_OK = 0,
#define PW__ERR_ENUM(name, msg, http, api) PW_##name,
  PW__ERR_FIRST = -1000,
  PW_ERRNO_MAP(PW__ERR_ENUM)
#undef PW__ERR_ENUM
  PW__ERR_LAST
} pw_errno;

const char *pw_strerror(int code);  /* "invalid spec" */
const char *pw_err_name(int code);  /* "ESPEC" */
int pw_err_http_status(int code);   /* 422 */
const char *pw_err_api_code(int code); /* "invalid_spec" */

/* A detailed error: the code, where (a JSON path such as
 * "model.n_heads", a file name, a frame field) and why. */
typedef struct {
  int code;
  char path[128];
  char msg[384];
} pw_err;

/* Fill err (if not NULL) and return code, so callers can write
 * `return pw_err_set(err, PW_ESPEC, "model.d_model", "must be > 0");` */
int pw_err_set(pw_err *err, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "model.n_heads: must divide d_model (768 % 5 != 0)" or the bare message. */
const char *pw_err_str(const pw_err *err, char *buf, int cap);

#endif
