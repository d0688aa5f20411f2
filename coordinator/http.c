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
 * handler) -> completed callback (state freed, one log line).
 *
 * Uploads. A PW_ROUTE_STREAM route's body is never kept: each piece goes to
 * the route's sink (api.h) as it arrives, up to --max-upload bytes, and the
 * handler, on the pool, finishes what the sink wrote (fsync, rename, the
 * store). The sink's done callback runs when the request ends however it
 * ends, so an upload cut short leaves nothing behind.
 *
 * Admission. libmicrohttpd's own threads (a pool of 2) only ever run cheap
 * handlers, so /healthz, /metrics and job status never wait behind a plan.
 * A handler that plans, merges checkpoints or renders a timeline (pooled
 * below) runs on our own worker threads: the last access call suspends the
 * connection and queues the request; a worker runs the handler and resumes
 * the connection, whose next access call sends the reply. At most
 * workers + queue such requests are admitted at once; the next gets 429
 * with Retry-After. Connections are bounded in total and per client
 * address (refused at accept, logged, counted in /metrics), and an idle
 * connection is closed after the idle timeout. The total bound is kept
 * well above any client's share (and under the process's file limit), so
 * one address holding idle connections cannot lock the others out. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "log.h"

/* A request's whole state; handlers see only r. */
typedef struct http_req {
  pw_req r;
  struct http_req *next;   /* the pool's queue */
  int pooled;              /* handed to the pool: the reply is set when resumed */
  size_t url_len;          /* raw request target, query included */
  int nul_path, nul_query; /* "%00" in the raw path / query */
  int started;             /* the first access call has run */
  const pw_route *route;
  char *buf;               /* the body so far */
  size_t n, cap;
  int too_big;             /* the body passed the bound: dropped, answer 413 */
  int refused;             /* a stream route's sink refused: its reply is set, the rest is dropped */
  uint64_t streamed;       /* a stream route's body bytes so far */
  double t0;
  char method[16];
  char path[256];          /* for the log line */
} http_req;

/* One client address and its open connections. */
typedef struct {
  unsigned char addr[16];
  int n;
} ip_count;

/* The server: the daemon, the pool for expensive handlers, the counts. */
typedef struct {
  pw_coord *c;
  struct MHD_Daemon *d;
  pthread_cond_t cv;        /* with c->mu: the pool's queue */
  pthread_t *threads;
  int n_threads, queue_max, stopping;
  http_req *head, *tail;   /* admitted, waiting for a worker */
  int max_conns, max_per_ip;
  ip_count *ips;           /* addresses with open connections */
  int n_ips;
} http_srv; /* mutable fields guarded by c->mu (held briefly, never across a
               libmicrohttpd call); the counts /metrics shows are c->http_adm */

static _Atomic(pw_http_pool_hook) pool_hook; /* set by tests while the pool runs */
void pw_http_set_pool_hook(pw_http_pool_hook fn) { atomic_store(&pool_hook, fn); }

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t max_body(const pw_coord *c) { return c->max_body ? c->max_body : PW_HTTP_DEFAULT_MAX_BODY; }
static uint64_t max_upload(const pw_coord *c) { return c->max_upload ? c->max_upload : PW_HTTP_DEFAULT_MAX_UPLOAD; }
/* The body bound of h's route. */
static uint64_t body_limit(const http_req *h) {
  return h->route && (h->route->flags & PW_ROUTE_STREAM) ? max_upload(h->r.c) : (uint64_t)max_body(h->r.c);
}

/* ---- routing ---------------------------------------------------------------- */

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
    if (errno == ERANGE || n > body_limit(h)) {
      pw_reply_error(r, PW_ETOOBIG, "body", "the request body is %s bytes; the limit is %llu", cl,
                     (unsigned long long)body_limit(h));
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

/* A piece of a stream route's body: to the sink, until it refuses or the
 * bound is passed (then what it wrote so far is dropped at once). */
static void stream_body(http_req *h, const char *data, size_t n) {
  if (h->too_big || h->refused) return;
  if (n > body_limit(h) - h->streamed) {
    h->too_big = 1;
    h->route->sink->done(&h->r);
    return;
  }
  h->streamed += n;
  if (h->route->sink->chunk(&h->r, data, n)) {
    h->refused = 1;
    if (!h->r.resp) pw_reply_error(&h->r, PW_EINTERNAL, "body", "the upload failed");
  }
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
    pw_reply_error(r, PW_ETOOBIG, "body", "the request body is over the limit of %llu bytes",
                   (unsigned long long)body_limit(h));
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
  if (!r->resp && !r->parked) {
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

/* ---- the pool for expensive handlers --------------------------------------- */

/* Handlers that plan, merge or render (seconds of CPU for a big job), and
 * every upload's finish (fsync, checks, rename of up to --max-upload bytes). */
static int pooled_route(const pw_route *rt) {
  static const pw_handler heavy[] = {pw_api_plans, pw_api_schedule_analytics, pw_api_job_submit, pw_api_job_timeline,
                                     pw_api_job_checkpoint};
  if (rt->flags & PW_ROUTE_STREAM) return 1;
  for (size_t i = 0; i < sizeof heavy / sizeof heavy[0]; i++)
    if (rt->fn == heavy[i]) return 1;
  return 0;
}

static void *pool_main(void *arg) {
  http_srv *srv = arg;
  pthread_mutex_lock(&srv->c->mu);
  for (;;) {
    while (!srv->head && !srv->stopping) pthread_cond_wait(&srv->cv, &srv->c->mu);
    http_req *h = srv->head;
    if (!h) break; /* stopping, nothing left */
    srv->head = h->next;
    if (!srv->head) srv->tail = NULL;
    srv->c->http_adm.queued--;
    srv->c->http_adm.running++;
    pthread_mutex_unlock(&srv->c->mu);
    pw_http_pool_hook hook = atomic_load(&pool_hook);
    if (hook) hook(h->path);
    dispatch(h);
    pthread_mutex_lock(&srv->c->mu);
    srv->c->http_adm.running--;
    pthread_mutex_unlock(&srv->c->mu);
    MHD_resume_connection(h->r.conn); /* its next access call sends the reply */
    pthread_mutex_lock(&srv->c->mu);
  }
  pthread_mutex_unlock(&srv->c->mu);
  return NULL;
}

/* Admit h to the pool, or set its reply: 429 when workers and queue are
 * full, 503 when stopping. Either way the connection is suspended here and
 * resumed once the reply is set (by a worker, or at once), and its next
 * access call sends it. Suspended first, outside c->mu (no libmicrohttpd
 * call is made under our lock): a resume must follow its suspend. */
static void pool_admit(http_srv *srv, http_req *h) {
  h->pooled = 1;
  MHD_suspend_connection(h->r.conn);
  pthread_mutex_lock(&srv->c->mu);
  int n = srv->c->http_adm.queued + srv->c->http_adm.running;
  int full = n >= srv->n_threads + srv->queue_max, stopping = srv->stopping;
  uint64_t busy = full && !stopping ? ++srv->c->http_adm.busy : 0;
  if (!full && !stopping) {
    h->next = NULL;
    if (srv->tail) srv->tail->next = h;
    else srv->head = h;
    srv->tail = h;
    srv->c->http_adm.queued++;
    pthread_cond_signal(&srv->cv);
  }
  pthread_mutex_unlock(&srv->c->mu);
  if (!full && !stopping) return;
  if (stopping) {
    pw_reply_error(&h->r, PW_EUNAVAIL, "", "the server is stopping");
  } else {
    pw_reply_error(&h->r, PW_EBUSY, "",
                   "%d expensive requests (plans, submissions, timelines, checkpoints) are running or queued, "
                   "the most admitted: try again shortly", n);
    pw_reply_header(&h->r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (busy == 1 || busy % 100 == 0) /* the first, then every 100th: a flood does not flood the log */
      pw_warn("http: %s %s answered 429: %d expensive requests running or queued (%llu so far)", h->method, h->path,
              n, (unsigned long long)busy);
  }
  MHD_resume_connection(h->r.conn);
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
    if (h->route->flags & PW_ROUTE_STREAM) stream_body(h, upload_data, *upload_data_size);
    else take_body(h, upload_data, *upload_data_size);
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (h->pooled) return send_reply(h); /* resumed: the pool ran the handler */
  if (h->refused) return send_reply(h); /* the sink's error */
  if (!h->too_big && pooled_route(h->route)) {
    pool_admit(r->c->http, h);
    return MHD_YES;
  }
  dispatch(h);
  if (r->parked && !r->resp) { /* suspended by its handler: the reply comes with the resume */
    h->pooled = 1;
    return MHD_YES;
  }
  return send_reply(h);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  http_req *h = *con_cls;
  if (!h) return;
  *con_cls = NULL;
  /* a plan, timeline or merge over 10 s is said: it held a pool thread or waited for one (uploads take their time) */
  double ms = (mono() - h->t0) * 1e3;
  int slow = h->pooled && ms > 10e3 && !(h->route && (h->route->flags & PW_ROUTE_STREAM));
  PW_LOG(slow ? PW_LOG_WARN : PW_LOG_DEBUG, "http %s %s -> %d (%.1f ms)%s",
         h->method[0] ? h->method : "?", h->path, h->r.status, ms,
         toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (not completed)");
  if (h->route && (h->route->flags & PW_ROUTE_STREAM)) h->route->sink->done(&h->r);
  if (h->r.resp) MHD_destroy_response(h->r.resp);
  json_decref(h->r.body);
  free(h->buf);
  free(h);
}

/* ---- connection limits ---------------------------------------------------- */

/* The address bytes of sa (v4 as v4-mapped v6), for the per-address counts. */
static void addr_key(const struct sockaddr *sa, unsigned char key[16]) {
  memset(key, 0, 16);
  if (sa && sa->sa_family == AF_INET) {
    key[10] = key[11] = 0xff;
    memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
  } else if (sa && sa->sa_family == AF_INET6) {
    memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
  }
}

/* The count of key (added when missing and add is set); NULL if none. */
static ip_count *ip_find(http_srv *srv, const unsigned char key[16], int add) {
  for (int i = 0; i < srv->n_ips; i++)
    if (!memcmp(srv->ips[i].addr, key, 16)) return &srv->ips[i];
  if (!add) return NULL;
  ip_count *n = realloc(srv->ips, sizeof *n * (size_t)(srv->n_ips + 1));
  if (!n) return NULL;
  srv->ips = n;
  ip_count *e = &srv->ips[srv->n_ips++];
  memcpy(e->addr, key, 16);
  e->n = 0;
  return e;
}

/* Refusals are logged on the first and then every 100th, so a flood of
 * connections cannot flood the log. */
static void log_refusal(const char *what, uint64_t n, const char *who, int limit) {
  if (n == 1 || n % 100 == 0)
    pw_warn("http: refused a connection from %s: %d open, the %s limit (%llu refused so far)", who, limit, what,
            (unsigned long long)n);
}

static enum MHD_Result on_accept(void *cls, const struct sockaddr *sa, socklen_t len) {
  http_srv *srv = cls;
  (void)len;
  unsigned char key[16];
  addr_key(sa, key);
  /* The place is taken here, not when the connection starts: accepts run
   * on several threads, and a count taken later would let two through for
   * the last place. libmicrohttpd checks its own (higher) bound before
   * asking us, so a connection admitted here starts (short of running out
   * of memory setting it up) and is given back when it closes
   * (on_connection). */
  pthread_mutex_lock(&srv->c->mu);
  ip_count *e = ip_find(srv, key, 1);
  int over_total = !e || srv->c->http_adm.open >= srv->max_conns;
  int over_ip = !over_total && srv->max_per_ip && e->n >= srv->max_per_ip;
  uint64_t n = over_total ? ++srv->c->http_adm.refused_total : over_ip ? ++srv->c->http_adm.refused_per_ip : 0;
  int limit = over_total ? srv->max_conns : srv->max_per_ip;
  if (!n) {
    srv->c->http_adm.open++;
    e->n++;
  } else if (e && e->n == 0) {
    *e = srv->ips[--srv->n_ips]; /* keep the table to live addresses */
  }
  pthread_mutex_unlock(&srv->c->mu);
  if (!n) return MHD_YES;
  char who[INET6_ADDRSTRLEN] = "?";
  if (sa && sa->sa_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, who, sizeof who);
  if (sa && sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, who, sizeof who);
  log_refusal(over_total ? "total" : "per-address", n, who, limit);
  return MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
  http_srv *srv = cls;
  (void)socket_context;
  if (toe != MHD_CONNECTION_NOTIFY_CLOSED) return; /* its place was taken at accept */
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  unsigned char key[16];
  addr_key(ci ? ci->client_addr : NULL, key);
  pthread_mutex_lock(&srv->c->mu);
  ip_count *e = ip_find(srv, key, 0);
  srv->c->http_adm.open--;
  if (e && --e->n <= 0) *e = srv->ips[--srv->n_ips]; /* keep the table to live addresses */
  pthread_mutex_unlock(&srv->c->mu);
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

/* The connection bound: the option, else 2048, kept under the process's
 * file limit less room for the store, the worker links and the pool. */
static int conn_limit(const pw_coord *c) {
  int want = c->http_max_conns > 0 ? c->http_max_conns : 2048;
  struct rlimit rl;
  if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY) {
    long room = (long)rl.rlim_cur - 256;
    if (room < 16) room = 16;
    if (want > room) {
      pw_warn("http: %d connections asked, the file limit (%ld) allows %ld", want, (long)rl.rlim_cur, room);
      want = (int)room;
    }
  }
  return want;
}

static void srv_free(http_srv *srv) {
  pthread_cond_destroy(&srv->cv);
  free(srv->threads);
  free(srv->ips);
  free(srv);
}

/* Stops the pool: queued requests answer 503, running ones finish. */
static void pool_stop(http_srv *srv) {
  pthread_mutex_lock(&srv->c->mu);
  srv->stopping = 1;
  http_req *h = srv->head;
  srv->head = srv->tail = NULL;
  srv->c->http_adm.queued = 0;
  pthread_cond_broadcast(&srv->cv);
  pthread_mutex_unlock(&srv->c->mu);
  while (h) {
    http_req *next = h->next;
    pw_reply_error(&h->r, PW_EUNAVAIL, "", "the server is stopping");
    MHD_resume_connection(h->r.conn);
    h = next;
  }
  for (int i = 0; i < srv->n_threads; i++) pthread_join(srv->threads[i], NULL);
  srv->n_threads = 0;
}

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
  http_srv *srv = calloc(1, sizeof *srv);
  int nt = c->http_workers > 0 ? c->http_workers : 2;
  if (srv) srv->threads = calloc((size_t)nt, sizeof *srv->threads);
  if (!srv || !srv->threads) {
    if (srv) free(srv);
    freeaddrinfo(ai);
    return pw_err_set(err, PW_ENOMEM, "http", "out of memory");
  }
  srv->c = c;
  pthread_cond_init(&srv->cv, NULL);
  srv->queue_max = c->http_queue > 0 ? c->http_queue : 8;
  srv->max_conns = conn_limit(c);
  srv->max_per_ip = c->http_max_conns_per_ip > 0 ? c->http_max_conns_per_ip : 256;
  if (srv->max_per_ip > srv->max_conns) srv->max_per_ip = srv->max_conns;
  unsigned idle = c->http_idle_timeout > 0 ? (unsigned)c->http_idle_timeout : 30;
  for (; srv->n_threads < nt; srv->n_threads++)
    if (pthread_create(&srv->threads[srv->n_threads], NULL, pool_main, srv)) break;
  pthread_mutex_lock(&c->mu);
  c->http_adm.workers = srv->n_threads;
  c->http_adm.queue = srv->queue_max;
  c->http_adm.max_conns = srv->max_conns;
  c->http_adm.max_per_ip = srv->max_per_ip;
  pthread_mutex_unlock(&c->mu);
  c->http = srv; /* the handlers reach the pool through c */
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
  if (a->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  /* libmicrohttpd's own bound sits above ours (on_accept refuses first,
   * logged and counted); it splits it over its threads. */
  struct MHD_Daemon *d = srv->n_threads < nt ? NULL : MHD_start_daemon(
      flags, (uint16_t)c->http_port, on_accept, srv, on_request, c, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, c,
      MHD_OPTION_SOCK_ADDR, a->ai_addr, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)2, MHD_OPTION_URI_LOG_CALLBACK,
      on_uri, c, MHD_OPTION_NOTIFY_COMPLETED, on_completed, c, MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
      MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_CONNECTION_LIMIT, (unsigned)(srv->max_conns + 64),
      MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!d) {
    pool_stop(srv);
    srv_free(srv);
    c->http = NULL;
    return pw_err_set(err, PW_EIO, "http", "cannot listen on %s:%d (in use?)", host, c->http_port);
  }
  srv->d = d;
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  if (info && info->port) c->http_port = info->port;
  pw_info("http: listening on %s:%d%s; %d workers + %d queued for expensive requests; at most %d connections, %d "
          "per address, idle ones closed after %u s",
          host, c->http_port, c->api_token[0] ? " (bearer token required)" : "", srv->n_threads, srv->queue_max,
          srv->max_conns, srv->max_per_ip, idle);
  return 0;
}

void pw_http_stop(pw_coord *c) {
  http_srv *srv = c->http;
  if (!srv) return;
  pool_stop(srv);
  MHD_stop_daemon(srv->d);
  c->http = NULL;
  srv_free(srv);
}
