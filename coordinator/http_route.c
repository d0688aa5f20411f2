/* http_route: what a request's target and headers decide before its body
 * is read (http_int.h: pw__http_first_checks) — the URL's bounds, the
 * route of api.c's table it matches and the numbers and ids in its path
 * (404 when none matches, 405 with Allow when only the method does not),
 * the bearer token, the declared Content-Length against the route's bound
 * — and the dashboard's static files, for paths the API does not own. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http_int.h"

/* "{run}", "{step}", "{stage}": a decimal number >= 0 of at most 9 digits
 * into *out. Returns the pattern length consumed, 0 when p is none of them
 * or u holds no such number (then *ok is 0). */
static size_t num_param(const char *p, const char **u, pw_req *r, int *ok) {
  static const char *const names[] = {"{run}", "{step}", "{stage}"};
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(names[i]);
    if (strncmp(p, names[i], n)) continue;
    int64_t x = 0;
    int nd = 0;
    while (**u >= '0' && **u <= '9') {
      if (++nd > 9) return *ok = 0, 0;
      x = x * 10 + (*(*u)++ - '0');
    }
    *ok = nd > 0;
    if (i == 0) r->run = x;
    else if (i == 1) r->step = (int)x;
    else r->stage = (int)x;
    return n;
  }
  return 0;
}

/* Does path match pattern? Fills *id for "{id}", ds for "{ds}", "{ck}" and "{name}", and r's
 * run, step and stage for theirs. */
static int route_match(const char *pattern, const char *path, int64_t *id, char ds[65], pw_req *r) {
  const char *p = pattern, *u = path;
  while (*p && *u) {
    int ok = 1;
    size_t used = num_param(p, &u, r, &ok);
    if (!ok) return 0;
    if (used) {
      p += used;
      continue;
    }
    if (!strncmp(p, "{ds}", 4) || !strncmp(p, "{ck}", 4)) {
      for (int k = 0; k < 64; k++)
        if (!((u[k] >= '0' && u[k] <= '9') || (u[k] >= 'a' && u[k] <= 'f'))) return 0;
      memcpy(ds, u, 64);
      ds[64] = 0;
      u += 64;
      p += 4;
      continue;
    }
    if (!strncmp(p, "{name}", 6)) {
      size_t n = strspn(u, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_");
      if (n == 0 || n > 64) return 0;
      memcpy(ds, u, n);
      ds[n] = 0;
      u += n;
      p += 6;
      continue;
    }
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

/* Whether the request comes from a loopback address. */
static int from_loopback(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  const struct sockaddr *sa = ci ? ci->client_addr : NULL;
  if (sa && sa->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa && sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return 0;
}

/* 0 when the token is right or none is configured; else replies 401.
 * Routes marked PW_ROUTE_CLUSTER take the cluster token too (workers fetch
 * datasets and move checkpoints with it). Without a cluster token the
 * control port is loopback only (main.c) and its workers are trusted
 * without one: a cluster route then takes a loopback client as they are,
 * else a worker could not store its checkpoints beside an API token. */
static int check_token(http_req *h) {
  pw_coord *c = h->r.c;
  if (!c->api_token[0]) return 0;
  if (h->route && (h->route->flags & PW_ROUTE_CLUSTER) && !c->cluster_token[0] && from_loopback(h->r.conn)) return 0;
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
  int cluster = h->route && (h->route->flags & PW_ROUTE_CLUSTER) && c->cluster_token[0] &&
                pw_control_token_equal(a, c->cluster_token);
  if (!bearer || (!cluster && !pw_control_token_equal(a, c->api_token))) {
    pw_reply_error(&h->r, PW_EAUTH, "Authorization",
                   "the bearer token is wrong");
    pw_reply_header(&h->r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"pipewright\", error=\"invalid_token\"");
    return -1;
  }
  return 0;
}

static void serve_static(pw_req *r);
static const pw_route static_route = {"GET", "/*", serve_static, PW_ROUTE_OPEN, NULL};

/* Everything decided before the body (http_int.h). */
int pw__http_first_checks(http_req *h) {
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
    char ds[65] = "";
    pw_req nums = {0};
    if (!route_match(rt->pattern, r->path, &id, ds, &nums)) continue;
    matched = 1;
    if (!(rt->flags & PW_ROUTE_OPEN)) all_open = 0;
    size_t k = strlen(allow);
    snprintf(allow + k, sizeof allow - k, "%s%s%s", k ? ", " : "", rt->method,
             !strcmp(rt->method, "GET") ? ", HEAD" : "");
    if (!strcmp(rt->method, m)) {
      h->route = rt;
      r->id = id;
      memcpy(r->ds, ds, sizeof r->ds);
      r->run = nums.run, r->step = nums.step, r->stage = nums.stage;
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
  int64_t declared = -1;
  if (cl) {
    char *end;
    errno = 0;
    unsigned long long n = strtoull(cl, &end, 10);
    if (errno == ERANGE || n > pw__http_body_limit(h)) {
      pw_reply_error(r, PW_ETOOBIG, "body", "the request body is %s bytes; the limit is %llu", cl,
                     (unsigned long long)pw__http_body_limit(h));
      return 1;
    }
    declared = (int64_t)n;
  }
  if ((h->route->flags & PW_ROUTE_STREAM) && h->route->sink->begin(r, declared)) {
    if (!r->resp) pw_reply_error(r, PW_EINTERNAL, "", "the upload could not start");
    return 1;
  }
  return 0;
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
