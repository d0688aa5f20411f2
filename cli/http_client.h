/* http_client: the CLI's blocking HTTP(S) client for the coordinator's REST
 * API, on libcurl.
 *
 * One call is one request with one overall timeout and a bounded body.
 * https:// is verified against the system CA store (or a CA file given);
 * proxies come from the environment as libcurl reads them (http_proxy,
 * https_proxy, all_proxy, no_proxy), except that a loopback coordinator is
 * never sent through one unless a proxy is given explicitly. It never
 * follows redirects and never retries: the caller decides. Not thread-safe:
 * the CLI is one thread, and one libcurl handle serves the whole process
 * (so `watch`'s polls reuse a connection); it is freed at exit. */
#ifndef PW_HTTP_CLIENT_H
#define PW_HTTP_CLIENT_H

#include <stddef.h>

#include "errors.h"

#define PW_HTTP_DEFAULT_MAX_BODY ((size_t)64 << 20) /* 64 MiB */
#define PW_HTTP_DEFAULT_TIMEOUT 30.0                /* seconds, whole request */

/* A parsed base URL: http[s]://host[:port][/prefix]. */
typedef struct {
  char base[1024]; /* "https://host:8443/prefix": no trailing '/', no default port */
  char host[256];  /* without brackets for an IPv6 literal */
  int port;        /* 80 or 443 when absent */
} pw_http_url;

/* Parses "http://host[:port][/prefix]" or "https://..." (also "[::1]:8080",
 * and a bare "host:port" taken as http). PW_EINVAL with a reason for
 * anything else: other schemes, credentials, a query or a fragment. */
PW_MUST_CHECK int pw_http_url_parse(const char *url, pw_http_url *out, pw_err *err);

typedef struct {
  const char *token;  /* bearer token, NULL or "" for none */
  double timeout;     /* seconds for the whole request; <= 0: the default */
  size_t max_body;    /* bound on the response body; 0: the default */
  const char *cacert; /* PEM file of the CAs to trust; NULL: the system store */
  const char *proxy;  /* NULL: the environment's (never for loopback); "": none;
                         else this proxy for every host, loopback included */
  void (*on_data)(void *ud, const char *data, size_t n); /* NULL, or each piece of the body as it
                                                           arrives (a stream of events) */
  void *ud;
  const char *header;  /* NULL, or one more request header, "Name: value" (checked: no CR/LF) */
} pw_http_opts;

typedef struct {
  int status; /* 200, 404, ... */
  char *body; /* malloc'd, NUL-terminated (also when empty) */
  size_t len; /* body bytes, without the NUL */
} pw_http_resp;

/* One request: method ("GET", "POST", "DELETE", ...) to url's base +
 * target ("/v1/jobs?state=running", already percent-encoded), with body
 * (body_len bytes, sent with Content-Type: application/json) when body is
 * not NULL. opts may be NULL. On success (any HTTP status) returns 0 with
 * *resp filled; free it with pw_http_resp_free. Errors, with err->msg the
 * reason in lower case ("connection refused") and err->path "host:port":
 *   PW_EPEER   the coordinator could not be reached: resolving, connecting
 *              (also to a proxy, or a proxy refusing the tunnel), or the
 *              connect timed out
 *   PW_EAUTH   its TLS certificate is not trusted
 *   PW_EIO     sending or receiving failed, or the timeout passed
 *   PW_EPROTO  the answer is not HTTP, or the TLS handshake failed
 *   PW_ETOOBIG the body exceeds its bound
 *   PW_EINVAL  a bad method, target, token or CA file
 *   PW_ENOMEM
 * *resp is zeroed on error (and pw_http_resp_free is still safe on it). */
PW_MUST_CHECK int pw_http_request(const pw_http_url *url, const char *method, const char *target,
                                  const char *body, size_t body_len, const pw_http_opts *opts, pw_http_resp *resp,
                                  pw_err *err);

/* A request body read as it is sent (an upload), never whole in memory. */
typedef struct {
  unsigned long long size;  /* exactly this many bytes are sent (Content-Length) */
  const char *content_type; /* e.g. "application/octet-stream" */
  /* Fills buf with up to cap bytes: returns how many, 0 at the end, or a
   * negative errno; the body is sent as read, so read may hash it. */
  long long (*read)(void *ud, char *buf, size_t cap);
  void *ud;
} pw_http_body_src;

/* As pw_http_request, with the body from src (sent with "Expect:
 * 100-continue", so a refusal such as 401 or 413 costs no body). Here
 * opts->timeout bounds the connect and any stall (no byte moved either way
 * for that long), not the whole transfer: a large upload takes as long as
 * it takes. Besides pw_http_request's errors: PW_EIO "reading the body:
 * ..." when src->read fails or ends before src->size bytes. */
PW_MUST_CHECK int pw_http_upload(const pw_http_url *url, const char *method, const char *target,
                                 const pw_http_body_src *src, const pw_http_opts *opts, pw_http_resp *resp,
                                 pw_err *err);

void pw_http_resp_free(pw_http_resp *resp);

#endif
