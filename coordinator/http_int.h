/* http_int: what the HTTP server's files share — a request's state, the
 * server's, the body bounds — and the entry points of http_route.c (what
 * a request's path and headers decide) and http_conn.c (the connection
 * bounds) that http.c (the request's life, the pool, start and stop)
 * calls. Not for use outside them. */
#ifndef PW_HTTP_INT_H
#define PW_HTTP_INT_H

#include <stdint.h>
#include <sys/socket.h>

#include "api.h"

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

typedef struct http_srv http_srv;

/* One lane of the pool: its threads and its queue. Users' expensive
 * requests take one lane, the workers' checkpoint uploads the other, so a
 * flood of plans never turns a finished job's upload away. */
typedef struct {
  http_srv *srv;
  const char *what;         /* for the 429's message and the log */
  pthread_cond_t cv;        /* with c->mu: the lane's queue */
  pthread_t *threads;
  int n_threads, queue_max;
  http_req *head, *tail;    /* admitted, waiting for a thread */
  int *running, *queued;    /* its counts in c->http_adm (/metrics) */
  uint64_t *busy;
} http_lane;

/* The server: the daemon, the pool's two lanes, the counts. */
struct http_srv {
  pw_coord *c;
  struct MHD_Daemon *d;
  http_lane user, cluster;
  int stopping;
  int max_conns, max_per_ip;
  ip_count *ips;           /* addresses with open connections */
  int n_ips;
}; /* mutable fields guarded by c->mu (held briefly, never across a
      libmicrohttpd call); the counts /metrics shows are c->http_adm */

static inline size_t pw__http_max_body(const pw_coord *c) {
  return c->max_body ? c->max_body : PW_HTTP_DEFAULT_MAX_BODY;
}
/* The body bound of h's route. */
static inline uint64_t pw__http_body_limit(const http_req *h) {
  uint64_t upload = h->r.c->max_upload ? h->r.c->max_upload : PW_HTTP_DEFAULT_MAX_UPLOAD;
  return h->route && (h->route->flags & PW_ROUTE_STREAM) ? upload : (uint64_t)pw__http_max_body(h->r.c);
}

/* http_route.c. Everything decided before the body (the URL's bounds, the
 * route or a static file, 404 / 405 with Allow, the bearer token,
 * Content-Length, a stream route's start): returns 1 when a reply is set. */
int pw__http_first_checks(http_req *h);

/* http_conn.c. libmicrohttpd's accept policy (cls: the http_srv): a place
 * is taken under the total and per-address bounds, or the connection is
 * refused (logged, counted); the connection notification gives it back
 * when it closes. conn_limit: the total bound for c. */
enum MHD_Result pw__http_on_accept(void *cls, const struct sockaddr *sa, socklen_t len);
void pw__http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                            enum MHD_ConnectionNotificationCode toe);
int pw__http_conn_limit(const pw_coord *c);

#endif
