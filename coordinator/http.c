/* http: the REST API server — libmicrohttpd on its own threads, the route
 * table of api.c, and everything every request goes through: URL and body
 * bounds, the bearer token, routing (404 / 405 with Allow), reading and
 * parsing the body once, counting and logging each answer, and the
 * dashboard's static files. Replies are built by api_req.c's helpers (one
 * error shape for all). This file has a request's life, the pool and the
 * server's start and stop; what the target and headers decide before the
 * body (routing, the token, the static files) is http_route.c's, the
 * connection bounds are http_conn.c's (http_int.h between them).
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
 * the connection, whose next access call sends the reply. The pool has two
 * lanes, each with its threads and queue: users' requests, and the
 * workers' checkpoint uploads (never turned away by a flood of plans). At
 * most threads + queue requests are admitted to a lane at once; the next
 * gets 429 with Retry-After. Connections are bounded in total and per client
 * address (refused at accept, logged, counted in /metrics), and an idle
 * connection is closed after the idle timeout. The total bound is kept
 * well above any client's share (and under the process's file limit), so
 * one address holding idle connections cannot lock the others out. */
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "http_int.h"
#include "log.h"

static _Atomic(pw_http_pool_hook) pool_hook; /* set by tests while the pool runs */
void pw_http_set_pool_hook(pw_http_pool_hook fn) { atomic_store(&pool_hook, fn); }

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the body and the handler ------------------------------------------------ */

/* A piece of a stream route's body: to the sink, until it refuses or the
 * bound is passed (then what it wrote so far is dropped at once). */
static void stream_body(http_req *h, const char *data, size_t n) {
  if (h->too_big || h->refused) return;
  if (n > pw__http_body_limit(h) - h->streamed) {
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
  size_t lim = pw__http_max_body(h->r.c);
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
                   (unsigned long long)pw__http_body_limit(h));
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

/* The lane a pooled request queues in: a worker's checkpoint upload (a
 * cluster route's streamed body) in the cluster lane, the rest in the
 * users'. */
static http_lane *lane_of(http_srv *srv, const http_req *h) {
  int cluster = h->route && (h->route->flags & PW_ROUTE_CLUSTER) && (h->route->flags & PW_ROUTE_STREAM);
  return cluster ? &srv->cluster : &srv->user;
}

static void *pool_main(void *arg) {
  http_lane *l = arg;
  http_srv *srv = l->srv;
  pthread_mutex_lock(&srv->c->mu);
  for (;;) {
    while (!l->head && !srv->stopping) pthread_cond_wait(&l->cv, &srv->c->mu);
    http_req *h = l->head;
    if (!h) break; /* stopping, nothing left */
    l->head = h->next;
    if (!l->head) l->tail = NULL;
    (*l->queued)--;
    (*l->running)++;
    pthread_mutex_unlock(&srv->c->mu);
    pw_http_pool_hook hook = atomic_load(&pool_hook);
    if (hook) hook(h->path);
    dispatch(h);
    pthread_mutex_lock(&srv->c->mu);
    (*l->running)--;
    pthread_mutex_unlock(&srv->c->mu);
    MHD_resume_connection(h->r.conn); /* its next access call sends the reply */
    pthread_mutex_lock(&srv->c->mu);
  }
  pthread_mutex_unlock(&srv->c->mu);
  return NULL;
}

/* Admit h to its lane, or set its reply: 429 when the lane's threads and
 * queue are full, 503 when stopping. Either way the connection is
 * suspended here and resumed once the reply is set (by a thread, or at
 * once), and its next access call sends it. Suspended first, outside c->mu
 * (no libmicrohttpd call is made under our lock): a resume must follow its
 * suspend. */
static void pool_admit(http_srv *srv, http_req *h) {
  http_lane *l = lane_of(srv, h);
  h->pooled = 1;
  MHD_suspend_connection(h->r.conn);
  pthread_mutex_lock(&srv->c->mu);
  int n = *l->queued + *l->running;
  int full = n >= l->n_threads + l->queue_max, stopping = srv->stopping;
  uint64_t busy = full && !stopping ? ++*l->busy : 0;
  if (!full && !stopping) {
    h->next = NULL;
    if (l->tail) l->tail->next = h;
    else l->head = h;
    l->tail = h;
    (*l->queued)++;
    pthread_cond_signal(&l->cv);
  }
  pthread_mutex_unlock(&srv->c->mu);
  if (!full && !stopping) return;
  if (stopping) {
    pw_reply_error(&h->r, PW_EUNAVAIL, "", "the server is stopping");
  } else {
    pw_reply_error(&h->r, PW_EBUSY, "", "%d %s are running or queued, the most admitted: try again shortly", n,
                   l->what);
    pw_reply_header(&h->r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (busy == 1 || busy % 100 == 0) /* the first, then every 100th: a flood does not flood the log */
      pw_warn("http: %s %s answered 429: %d %s running or queued (%llu so far)", h->method, h->path, n, l->what,
              (unsigned long long)busy);
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
    if (pw__http_first_checks(h)) return send_reply(h);
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

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  char b[512];
  vsnprintf(b, sizeof b, fmt, ap);
  size_t n = strlen(b);
  while (n && (b[n - 1] == '\n' || b[n - 1] == '\r')) b[--n] = 0;
  pw_warn("http: %s", b);
}

/* ---- start and stop ---------------------------------------------------------- */

static void srv_free(http_srv *srv) {
  pthread_cond_destroy(&srv->user.cv);
  pthread_cond_destroy(&srv->cluster.cv);
  free(srv->user.threads);
  free(srv->cluster.threads);
  free(srv->ips);
  free(srv);
}

/* Starts a lane of nt threads; 0, or -1 when not every thread started. */
static int lane_start(http_srv *srv, http_lane *l, const char *what, int nt, int queue_max, int *running, int *queued,
                      uint64_t *busy) {
  l->srv = srv;
  l->what = what;
  l->queue_max = queue_max;
  l->running = running, l->queued = queued, l->busy = busy;
  pthread_cond_init(&l->cv, NULL);
  if (!(l->threads = calloc((size_t)nt, sizeof *l->threads))) return -1;
  for (; l->n_threads < nt; l->n_threads++)
    if (pthread_create(&l->threads[l->n_threads], NULL, pool_main, l)) break;
  return l->n_threads < nt ? -1 : 0;
}

/* A lane's queued requests answer 503 (after srv->stopping is set). */
static void lane_drain(http_srv *srv, http_lane *l) {
  pthread_mutex_lock(&srv->c->mu);
  http_req *h = l->head;
  l->head = l->tail = NULL;
  *l->queued = 0;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&srv->c->mu);
  while (h) {
    http_req *next = h->next;
    pw_reply_error(&h->r, PW_EUNAVAIL, "", "the server is stopping");
    MHD_resume_connection(h->r.conn);
    h = next;
  }
}

/* Stops the pool: queued requests answer 503, running ones finish. */
static void pool_stop(http_srv *srv) {
  pthread_mutex_lock(&srv->c->mu);
  srv->stopping = 1;
  pthread_mutex_unlock(&srv->c->mu);
  http_lane *lanes[] = {&srv->user, &srv->cluster};
  for (int k = 0; k < 2; k++) lane_drain(srv, lanes[k]);
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < lanes[k]->n_threads; i++) pthread_join(lanes[k]->threads[i], NULL);
    lanes[k]->n_threads = 0;
  }
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
  if (!srv) {
    freeaddrinfo(ai);
    return pw_err_set(err, PW_ENOMEM, "http", "out of memory");
  }
  srv->c = c;
  int nt = c->http_workers > 0 ? c->http_workers : 2;
  /* The cluster lane: 2 threads (an upload's finish is an fsync and a
   * checksum, not CPU) and room for every rank of a large job at once; the
   * workers retry a 429 with backoff. */
  int bad = lane_start(srv, &srv->user, "expensive requests (plans, submissions, timelines, checkpoints)", nt,
                       c->http_queue > 0 ? c->http_queue : 8, &c->http_adm.running, &c->http_adm.queued,
                       &c->http_adm.busy);
  bad |= lane_start(srv, &srv->cluster, "checkpoint uploads from workers", 2, 256, &c->http_adm.c_running,
                    &c->http_adm.c_queued, &c->http_adm.c_busy);
  srv->max_conns = pw__http_conn_limit(c);
  srv->max_per_ip = c->http_max_conns_per_ip > 0 ? c->http_max_conns_per_ip : 256;
  if (srv->max_per_ip > srv->max_conns) srv->max_per_ip = srv->max_conns;
  unsigned idle = c->http_idle_timeout > 0 ? (unsigned)c->http_idle_timeout : 30;
  pthread_mutex_lock(&c->mu);
  c->http_adm.workers = srv->user.n_threads;
  c->http_adm.queue = srv->user.queue_max;
  c->http_adm.c_workers = srv->cluster.n_threads;
  c->http_adm.c_queue = srv->cluster.queue_max;
  c->http_adm.max_conns = srv->max_conns;
  c->http_adm.max_per_ip = srv->max_per_ip;
  pthread_mutex_unlock(&c->mu);
  c->http = srv; /* the handlers reach the pool through c */
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
  if (a->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  /* libmicrohttpd's own bound sits above ours (on_accept refuses first,
   * logged and counted); it splits it over its threads. */
  struct MHD_Daemon *d = bad ? NULL : MHD_start_daemon(
      flags, (uint16_t)c->http_port, pw__http_on_accept, srv, on_request, c, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log,
      c, MHD_OPTION_SOCK_ADDR, a->ai_addr, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)2, MHD_OPTION_URI_LOG_CALLBACK,
      on_uri, c, MHD_OPTION_NOTIFY_COMPLETED, on_completed, c, MHD_OPTION_NOTIFY_CONNECTION, pw__http_on_connection,
      srv, MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_CONNECTION_LIMIT, (unsigned)(srv->max_conns + 64),
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
  pw_info("http: listening on %s:%d%s; %d workers + %d queued for expensive requests, %d + %d for workers' "
          "checkpoint uploads; at most %d connections, %d per address, idle ones closed after %u s",
          host, c->http_port, c->api_token[0] ? " (bearer token required)" : "", srv->user.n_threads,
          srv->user.queue_max, srv->cluster.n_threads, srv->cluster.queue_max, srv->max_conns, srv->max_per_ip, idle);
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
