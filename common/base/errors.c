/* errors: the tables behind errors.h. */
#include "errors.h"

#include <stdio.h>
#include <string.h>

#define PW__IDX(c) ((c) - PW__ERR_FIRST - 1)
#define PW__VALID(c) ((c) > PW__ERR_FIRST && (c) < PW__ERR_LAST)

static const char *const msgs[] = {
#define X(name, msg, http, api) msg,
    PW_ERRNO_MAP(X)
#undef X
};
static const char *const names[] = {
#define X(name, msg, http, api) "PW_" #name,
    PW_ERRNO_MAP(X)
#undef X
};
static const int https[] = {
#define X(name, msg, http, api) http,
    PW_ERRNO_MAP(X)
#undef X
};
static const char *const apis[] = {
#define X(name, msg, http, api) api,
    PW_ERRNO_MAP(X)
#undef X
};

const char *pw_strerror(int code) {
  if (code == 0) return "ok";
  return PW__VALID(code) ? msgs[PW__IDX(code)] : "unknown error";
}
const char *pw_err_name(int code) {
  if (code == 0) return "PW_OK";
  return PW__VALID(code) ? names[PW__IDX(code)] : "PW_EUNKNOWN";
}
int pw_err_http_status(int code) {
  if (code == 0) return 200;
  return PW__VALID(code) ? https[PW__IDX(code)] : 500;
}
const char *pw_err_api_code(int code) {
  if (code == 0) return "ok";
  return PW__VALID(code) ? apis[PW__IDX(code)] : "internal";
}

int pw_err_set(pw_err *err, int code, const char *path, const char *fmt, ...) {
  if (!err) return code;
  err->code = code;
  snprintf(err->path, sizeof err->path, "%s", path ? path : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  return code;
}

const char *pw_err_str(const pw_err *err, char *buf, int cap) {
  if (err->path[0])
    snprintf(buf, (size_t)cap, "%s: %s", err->path, err->msg);
  else if (err->msg[0])
    snprintf(buf, (size_t)cap, "%s", err->msg);
  else
    snprintf(buf, (size_t)cap, "%s", pw_strerror(err->code));
  return buf;
}
