/* http: the REST API server — libmicrohttpd on its own threads, the route
 * table of api.c, and everything every request goes through: URL and body
 * bounds, the bearer token, routing (404 / 405 with Allow), reading and
 * parsing the body once, counting and logging each answer, and the
 * dashboard's static files. Replies are built by api_req.c's helpers (one
 * error shape for all).
 *
 * It never decides what a route answers (api*.c does) and never touches
 * the control loop: handlers change jobs through the store and wake the
 * loop (coord.h).
 *
 * A request goes: URI callback (its state is allocated and the raw target
 * measured) -> first access call (checks that need no body: URL, auth,
 * route, Content-Length; an early error answers at once, without reading
 * the body) -> body pieces (kept up to the bound, dropped beyond it) ->
 * last access call (413 if the body overflowed, else parse and run the
 * handler) -> completed callback (state freed, one log line). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "log.h"

/* A request's whole state; handlers see only r. */
typedef struct {
  pw_req r;
  size_t url_len;          /* raw request target, query included */
  int nul_path, nul_query; /* "%00" in the raw path / query */
  int started;             /* the first access call has run */
  const pw_route *route;
  char *buf;               /* the body so far */
  size_t n, cap;
  int too_big;             /* the body passed the bound: dropped, answer 413 */
  double t0;
  char method[16];
  char path[256];          /* for the log line */
} http_req;

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t max_body(const pw_coord *c) { return c->max_body ? c->max_body : PW_HTTP_DEFAULT_MAX_BODY; }

/* ---- routing ---------------------------------------------------------------- */

/* Does path match pattern? Fills *id for "{id}". */
static int route_match(const char *pattern, const char *path, int64_t *id) {
  const char *p = pattern, *u = path;
  while (*p && *u) {
    if (!strncmp(p, "{id}", 4)) {
      int64_t x = 0;
      int nd = 0;
      while (*u >= '0' && *u <= '9') {
        if (++nd > 18) return 0;
        x = x * 10 + (*u++ - '0');
      }
      if (nd == 0 || x <= 0) return 0;
      *id = x;
      p += 4;
      continue;
    }
    if (*p++ != *u++) return 0;
  }
  return *p == 0 && *u == 0;
}

/* Paths the API owns: they never fall back to static files. */
static int api_path(const char *path) {
  return !strcmp(path, "/v1") || !strncmp(path, "/v1/", 4) || !strcmp(path, "/metrics") ||
         !strcmp(path, "/healthz");
}

/* 0 when the token is right or none is configured; else replies 401. */
static int check_token(http_req *h) {
  pw_coord *c = h->r.c;
  if (!c->api_token[0]) return 0;
  const char *a = MHD_lookup_connection_value(h->r.conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!a) {
    pw_reply_error(&h->r, PW_EAUTH, "Authorization",
                   "this API needs a bearer token: send \"Authorization: Bearer <token>\"");
    pw_reply_header(&h->r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"pipewright\"");
    return -1;
  }
  while (*a == ' ') a++;
  int bearer = !strncasecmp(a, "Bearer ", 7);
  if (bearer) a += 7;
  while (*a == ' ') a++;
  if (!bearer || !pw_control_token_equal(a, c->api_token)) {
    pw_reply_error(&h->r, PW_EAUTH, "Authorization",
                   "the bearer token is wrong");
    pw_reply_header(&h->r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"pipewright\", error=\"invalid_token\"");
    return -1;
  }
  return 0;
}

static void serve_static(pw_req *r);
static const pw_route static_route = {"GET", "/*", serve_static, PW_ROUTE_OPEN};

/* Everything decided before the body: returns 1 when a reply is set. */
static int first_checks(http_req *h) {
  pw_req *r = &h->r;
  pw_coord *c = r->c;
  if (h->url_len > PW_HTTP_MAX_URL) {
    pw_reply_error(r, PW_ETOOLONG, "url",
                   "the request target is %zu bytes; the limit is %d", h->url_len, PW_HTTP_MAX_URL);
    return 1;
  }
  if (h->nul_path) {
    pw_reply_error(r, PW_ENOENT, "url", "no such path (it holds a NUL byte)");
    return 1;
  }
  if (h->nul_query) {
    pw_reply_error(r, PW_EINVAL, "url", "the query holds a NUL byte");
    return 1;
  }
  const char *m = !strcmp(r->method, "HEAD") ? "GET" : r->method;
  char allow[128] = "";
  int matched = 0, all_open = 1;
  for (int i = 0; i < pw_api_n_routes; i++) {
    const pw_route *rt = &pw_api_routes[i];
    int64_t id = 0;
    if (!route_match(rt->pattern, r->path, &id)) continue;
    matched = 1;
    if (!(rt->flags & PW_ROUTE_OPEN)) all_open = 0;
    size_t k = strlen(allow);
    snprintf(allow + k, sizeof allow - k, "%s%s%s", k ? ", " : "", rt->method,
             !strcmp(rt->method, "GET") ? ", HEAD" : "");
    if (!strcmp(rt->method, m)) {
      h->route = rt;
      r->id = id;
    }
  }
  if (!matched && !api_path(r->path) && c->web_dir[0]) {
    if (strcmp(m, "GET")) {
      pw_reply_error(r, PW_EMETHOD, "",
                     "%s is not allowed on static files", r->method);
      pw_reply_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
      return 1;
    }
    h->route = &static_route;
    return 0;
  }
  int open_route = h->route ? (h->route->flags & PW_ROUTE_OPEN) : (matched && all_open);
  if (!open_route && check_token(h)) return 1;
  if (!matched) {
    pw_reply_error(r, PW_ENOENT, "", "no route for %s %s", r->method, r->path);
    return 1;
  }
  if (!h->route) {
    pw_reply_error(r, PW_EMETHOD, "", "%s is not allowed on %s (allowed: %s)",
                   r->method, r->path, allow);
    pw_reply_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    return 1;
  }
  const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (cl) {
    char *end;
    errno = 0;
    unsigned long long n = strtoull(cl, &end, 10);
    if (errno == ERANGE || n > max_body(c)) {
      pw_reply_error(r, PW_ETOOBIG, "body",
                     "the request body is %s bytes; the limit is %zu", cl, max_body(c));
      return 1;
    }
  }
  return 0;
}

/* Keep a piece of the body, or drop it once past the bound. */
static void take_body(http_req *h, const char *data, size_t n) {
  size_t lim = max_body(h->r.c);
  if (h->too_big || n > lim - h->n) {
    h->too_big = 1;
    free(h->buf);
    h->buf = NULL;
    h->n = h->cap = 0;
    return;
  }
  if (h->n + n > h->cap) {
    size_t nc = h->cap ? h->cap : 4096;
    while (nc < h->n + n) nc *= 2;
    if (nc > lim) nc = lim;
    char *nb = realloc(h->buf, nc);
    if (!nb) {
      h->too_big = 1; /* cannot hold it: same answer as too big */
      return;
    }
    h->buf = nb;
    h->cap = nc;
  }
  memcpy(h->buf + h->n, data, n);
  h->n += n;
}

/* The last access call: the body is complete. */
static void dispatch(http_req *h) {
  pw_req *r = &h->r;
  if (h->too_big) {
    pw_reply_error(r, PW_ETOOBIG, "body",
                   "the request body is over the limit of %zu bytes", max_body(r->c));
    return;
  }
  if (h->route->flags & PW_ROUTE_BODY) {
    if (h->n == 0) {
      pw_reply_error(r, PW_EJSON, "",
                     "the request body is empty: send a JSON object");
      return;
    }
    json_error_t jerr;
    r->body = json_loadb(h->buf, h->n, JSON_REJECT_DUPLICATES, &jerr);
    if (!r->body) {
      pw_reply_error(r, PW_EJSON, "", "line %d column %d: %s", jerr.line,
                     jerr.column, jerr.text);
      return;
    }
  }
  h->route->fn(r);
  if (!r->resp) {
    pw_error("http: %s %s: the handler left no reply", h->method, h->path);
    pw_reply_error(r, PW_EINTERNAL, "", "no reply");
  }
}

static enum MHD_Result send_reply(http_req *h) {
  pw_req *r = &h->r;
  if (!r->resp) pw_reply_oom(r);
  if (!r->resp) return MHD_NO; /* cannot even say so: drop the connection */
  MHD_add_response_header(r->resp, "Cache-Control", "no-store");
  MHD_add_response_header(r->resp, "X-Content-Type-Options", "nosniff");
  enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)r->status, r->resp);
  MHD_destroy_response(r->resp);
  r->resp = NULL;
  pw_coord_count_http(r->c, r->status);
  return ret;
}

/* ---- libmicrohttpd callbacks --------------------------------------------- */

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
  http_req *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  h->r.c = cls;
  h->r.conn = conn;
  h->t0 = mono();
  h->url_len = strlen(uri);
  const char *q = strchr(uri, '?');
  size_t plen = q ? (size_t)(q - uri) : h->url_len;
  for (const char *p = uri; (p = strstr(p, "%00")) != NULL; p += 3) {
    if ((size_t)(p - uri) < plen) h->nul_path = 1;
    else h->nul_query = 1;
  }
  return h;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
  http_req *h = *con_cls;
  if (!h) { /* the URI callback could not allocate */
    h = on_uri(cls, url, conn);
    if (!h) return MHD_NO;
    *con_cls = h;
  }
  pw_req *r = &h->r;
  if (!h->started) {
    h->started = 1;
    r->method = method;
    r->path = url;
    snprintf(h->method, sizeof h->method, "%s", method);
    snprintf(h->path, sizeof h->path, "%s", url);
    if (first_checks(h)) return send_reply(h);
    return MHD_YES;
  }
  if (*upload_data_size) {
    take_body(h, upload_data, *upload_data_size);
    *upload_data_size = 0;
    return MHD_YES;
  }
  dispatch(h);
  return send_reply(h);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  http_req *h = *con_cls;
  if (!h) return;
  *con_cls = NULL;
  pw_debug("http %s %s -> %d (%.1f ms)%s", h->method[0] ? h->method : "?", h->path, h->r.status,
           (mono() - h->t0) * 1e3, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (not completed)");
  if (h->r.resp) MHD_destroy_response(h->r.resp);
  json_decref(h->r.body);
  free(h->buf);
  free(h);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  char b[512];
  vsnprintf(b, sizeof b, fmt, ap);
  size_t n = strlen(b);
  while (n && (b[n - 1] == '\n' || b[n - 1] == '\r')) b[--n] = 0;
  pw_warn("http: %s", b);
}

/* ---- static files ------------------------------------------------------------ */

static const char *content_type(const char *path) {
  static const struct {
    const char *ext, *type;
  } types[] = {
      {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
      {".mjs", "text/javascript; charset=utf-8"}, {".css", "text/css; charset=utf-8"},
      {".json", "application/json"}, {".map", "application/json"},
      {".svg", "image/svg+xml"}, {".png", "image/png"},
      {".jpg", "image/jpeg"}, {".jpeg", "image/jpeg"},
      {".ico", "image/x-icon"}, {".txt", "text/plain; charset=utf-8"},
      {".woff2", "font/woff2"}, {".wasm", "application/wasm"},
  };
  const char *dot = strrchr(path, '.');
  if (dot && !strchr(dot, '/'))
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
      if (!strcasecmp(dot, types[i].ext)) return types[i].type;
  return "application/octet-stream";
}

static void serve_static(pw_req *r) {
  const char *p = r->path;
  char file[PATH_MAX];
  int n = -1;
  if (p[0] == '/' && !strstr(p, ".."))
    n = snprintf(file, sizeof file, "%s%s%s", r->c->web_dir, p, p[strlen(p) - 1] == '/' ? "index.html" : "");
  int fd = n > 0 && (size_t)n < sizeof file ? open(file, O_RDONLY | O_CLOEXEC) : -1;
  struct stat st;
  if (fd >= 0 && (fstat(fd, &st) || !S_ISREG(st.st_mode))) {
    close(fd);
    fd = -1;
  }
  if (fd < 0) {
    pw_reply_error(r, PW_ENOENT, "", "no such file: %.200s", p);
    return;
  }
  pw_reply_fd(r, MHD_HTTP_OK, content_type(file), fd, (uint64_t)st.st_size);
}

/* ---- start and stop ---------------------------------------------------------- */

int pw_http_start(pw_coord *c, pw_err *err) {
  char host[sizeof c->http_host];
  snprintf(host, sizeof host, "%s", c->http_host[0] ? c->http_host : "127.0.0.1");
  size_t hl = strlen(host);
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') { /* "[::1]" */
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = 0;
  }
  if (c->http_port < 0 || c->http_port > 65535)
    return pw_err_set(err, PW_EINVAL, "http", "port %d is out of range", c->http_port);
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  char port[8];
  snprintf(port, sizeof port, "%d", c->http_port);
  int gai = getaddrinfo(host, port, &hints, &ai);
  if (gai) return pw_err_set(err, PW_EINVAL, "http", "cannot resolve %s: %s", host, gai_strerror(gai));
  /* "localhost" may give ::1 first: prefer IPv4, which clients try first too */
  const struct addrinfo *a = ai;
  for (const struct addrinfo *x = ai; x; x = x->ai_next)
    if (x->ai_family == AF_INET) {
      a = x;
      break;
    }
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
  if (a->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, (uint16_t)c->http_port, NULL, NULL, on_request, c, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, c,
      MHD_OPTION_SOCK_ADDR, a->ai_addr, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)2, MHD_OPTION_URI_LOG_CALLBACK,
      on_uri, c, MHD_OPTION_NOTIFY_COMPLETED, on_completed, c, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
      MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!d) return pw_err_set(err, PW_EIO, "http", "cannot listen on %s:%d (in use?)", host, c->http_port);
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  if (info && info->port) c->http_port = info->port;
  c->http = d;
  pw_info("http: listening on %s:%d%s", host, c->http_port, c->api_token[0] ? " (bearer token required)" : "");
  return 0;
}

void pw_http_stop(pw_coord *c) {
  if (!c->http) return;
  MHD_stop_daemon(c->http);
  c->http = NULL;
}
