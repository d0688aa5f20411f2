/* http_client: a small blocking HTTP/1.1 client over one TCP socket, for
 * the CLI subcommands that speak the coordinator's REST API.
 *
 * One request per connection ("Connection: close"): connect (bounded by the
 * timeout), send the request line, Host, Content-Length and the optional
 * bearer token and JSON body, then read the status line, the headers and a
 * Content-Length, chunked or read-to-close body. Every wait is bounded by
 * one overall deadline and the body by max_body. Plain http:// only: there
 * is no TLS here (put a TLS-terminating proxy in front of the coordinator
 * and talk to it over loopback). It never follows redirects and never
 * retries: the caller decides. No library beyond libc. */
#ifndef PW_HTTP_CLIENT_H
#define PW_HTTP_CLIENT_H

#include <stddef.h>

#include "errors.h"

#define PW_HTTP_DEFAULT_MAX_BODY ((size_t)64 << 20) /* 64 MiB */
#define PW_HTTP_DEFAULT_TIMEOUT 30.0                /* seconds, whole request */
#define PW_HTTP_MAX_HEADER (64 << 10)               /* status line + headers */

/* A parsed base URL: http://host[:port][/prefix]. */
typedef struct {
  char host[256];   /* without brackets for an IPv6 literal */
  int port;         /* 80 when absent */
  char prefix[512]; /* path prefix without a trailing '/', "" for none */
} pw_http_url;

/* Parses "http://host[:port][/prefix]" (also "[::1]:8080", and a bare
 * "host:port" taken as http). PW_EINVAL with a reason for anything else,
 * https:// included. */
int pw_http_url_parse(const char *url, pw_http_url *out, pw_err *err);

typedef struct {
  const char *token;  /* bearer token, NULL or "" for none */
  double timeout;     /* seconds for the whole request; <= 0: the default */
  size_t max_body;    /* bound on the response body; 0: the default */
} pw_http_opts;

typedef struct {
  int status;              /* 200, 404, ... */
  char *body;              /* malloc'd, NUL-terminated (also when empty) */
  size_t len;              /* body bytes, without the NUL */
  char content_type[128];  /* "" when absent */
  char location[512];      /* Location header, "" when absent */
} pw_http_resp;

/* One request: method ("GET", "POST", "DELETE", ...) to url's prefix +
 * target ("/v1/jobs?state=running", already percent-encoded), with body
 * (body_len bytes, sent with Content-Type: application/json) when body is
 * not NULL. opts may be NULL. On success (any HTTP status) returns 0 with
 * *resp filled; free it with pw_http_resp_free. Errors, with err->msg the
 * reason in lower case ("connection refused") and err->path "host:port":
 *   PW_EPEER   the connection could not be made (resolve or connect failed,
 *              or the connect timed out)
 *   PW_EIO     sending or receiving failed, or the deadline passed
 *   PW_EPROTO  the answer is not valid HTTP/1.x
 *   PW_ETOOBIG the body or the headers exceed their bound
 *   PW_ENOMEM
 * *resp is zeroed on error (and pw_http_resp_free is still safe on it). */
int pw_http_request(const pw_http_url *url, const char *method, const char *target, const char *body,
                    size_t body_len, const pw_http_opts *opts, pw_http_resp *resp, pw_err *err);

void pw_http_resp_free(pw_http_resp *resp);

#endif
