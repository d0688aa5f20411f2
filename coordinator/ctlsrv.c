/* ctlsrv: the coordinator's control plane — accepts worker links,
 * registers workers (protocol version and cluster token checked, a refusal
 * says why), follows their heartbeats, and hands everything about jobs to
 * the hooks it is given (sched.c's; it never calls sched.c by name).
 * Messages are dispatched from a table by type (control.h). A malformed
 * message closes that worker's link with the reason logged; the daemon
 * goes on. Loop thread only. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ctl_int.h"
#include "log.h"
#include "store_retry.h"

double pw_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static pw_ctl *ctl_of(pw_coord *c) { return c->ctl; }

/* ---- the registry the API shows ----------------------------------------- */

static pw_worker_info *registry_find(pw_coord *c, const char *name) {
  for (int i = 0; i < c->n_workers; i++)
    if (!strcmp(c->workers[i].name, name)) return &c->workers[i];
  return NULL;
}

void pw_registry_update(pw_coord *c, pw_wconn *w) {
  pthread_mutex_lock(&c->mu);
  pw_worker_info *wi = registry_find(c, w->name);
  if (wi) {
    wi->connected = w->registered && !w->closing;
    wi->job = w->job ? w->job->job : 0;
    wi->rank = w->rank;
    wi->pp = w->job ? w->job->pp : 1;
    wi->tp = w->job ? w->job->tp : 1;
    wi->last_heartbeat = pw_store_now() - (pw_mono() - w->last_seen);
  }
  pthread_mutex_unlock(&c->mu);
}

static void registry_add(pw_coord *c, pw_wconn *w, const pw_msg_register *reg) {
  pthread_mutex_lock(&c->mu);
  pw_worker_info *wi = registry_find(c, w->name);
  if (!wi) {
    if (c->n_workers == c->cap_workers) {
      int nc = c->cap_workers ? c->cap_workers * 2 : 16;
      pw_worker_info *nw = realloc(c->workers, sizeof *nw * (size_t)nc);
      if (!nw) {
        pthread_mutex_unlock(&c->mu);
        return;
      }
      c->workers = nw;
      c->cap_workers = nc;
    }
    wi = &c->workers[c->n_workers++];
    memset(wi, 0, sizeof *wi);
    snprintf(wi->name, sizeof wi->name, "%s", w->name);
  }
  wi->id = w->id;
  snprintf(wi->addr, sizeof wi->addr, "%s", w->addr);
  snprintf(wi->software, sizeof wi->software, "%s", reg->software);
  wi->cores = (int)reg->cores;
  wi->threads = (int)reg->threads;
  wi->memory = w->memory = reg->memory > 0 ? reg->memory : 0;
  snprintf(wi->blas_core, sizeof wi->blas_core, "%s", reg->blas_core ? reg->blas_core : "");
  wi->blas_forced = reg->blas_forced >= 0 ? reg->blas_forced != 0 : -1;
  snprintf(wi->cpu_level, sizeof wi->cpu_level, "%s", reg->cpu_level ? reg->cpu_level : "");
  wi->gemm_gflops = reg->gemm_gflops > 0 ? reg->gemm_gflops : 0; /* NAN (absent) too */
  snprintf(wi->gemm_path, sizeof wi->gemm_path, "%s", reg->gemm_path ? reg->gemm_path : "");
  snprintf(wi->host, sizeof wi->host, "%s", reg->host ? reg->host : "");
  snprintf(wi->hostname, sizeof wi->hostname, "%s", reg->hostname ? reg->hostname : "");
  snprintf(wi->cores_from, sizeof wi->cores_from, "%s", reg->cores_from ? reg->cores_from : "");
  snprintf(wi->memory_from, sizeof wi->memory_from, "%s", reg->memory_from ? reg->memory_from : "");
  wi->connected = 1;
  wi->job = 0;
  wi->last_heartbeat = pw_store_now();
  pthread_mutex_unlock(&c->mu);
}

/* ---- links -------------------------------------------------------------- */

typedef struct {
  uv_write_t req;
  uint8_t *data;
} wmsg;

static void on_written(uv_write_t *req, int status) {
  wmsg *m = (wmsg *)req;
  free(m->data);
  free(m);
}

void pw_ctl_send_msg(pw_wconn *w, json_t *msg) {
  if (!msg) {
    pw_error("a message for %s could not be built", w->name);
    return;
  }
  if (w->closing) {
    json_decref(msg);
    return;
  }
  wmsg *m = calloc(1, sizeof *m);
  size_t len = 0;
  if (!m || pw_control_encode(msg, &m->data, &len)) {
    pw_error("cannot encode a %s message for %s", pw_control_type(msg), w->name);
    free(m);
    json_decref(msg);
    return;
  }
  json_decref(msg);
  uv_buf_t b = uv_buf_init((char *)m->data, (unsigned)len);
  if (uv_write(&m->req, (uv_stream_t *)&w->tcp, &b, 1, on_written)) {
    free(m->data);
    free(m);
  }
}

static void on_closed(uv_handle_t *h) {
  pw_wconn *w = h->data;
  pw_control_reader_free(&w->reader);
  pw_rec_conn_free(w);
  free(w);
}

void pw_ctl_drop(pw_wconn *w, const char *why) {
  if (w->closing) return;
  pw_coord *c = w->c;
  pw_ctl *ctl = ctl_of(c);
  if (why) pw_warn("worker %s: dropping its link: %s", w->name[0] ? w->name : "(unregistered)", why);
  w->closing = 1;
  for (pw_wconn **p = &ctl->conns; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  if (w->registered) {
    if (w->job) ctl->hooks->lost(c, w, why ? why : "link closed");
    pw_registry_update(c, w);
    pw_write seen = {.kind = PW_W_WORKER_SEEN, .worker = w->id, .text = "lost"};
    pw_write_do(c, &seen, NULL); /* checked and logged there */
  }
  uv_close((uv_handle_t *)&w->tcp, on_closed);
}

static void cancel_foreign(pw_wconn *w, int64_t job) {
  w->draining = 1;
  pw_ctl_send_msg(w, PW_CONTROL_BUILD(PW_MSG_CANCEL, pw_msg_cancel, NULL, .job = job, .run = 0,
                                      .reason = "not a run of this coordinator"));
}

static void refuse(pw_wconn *w, const char *reason) {
  pw_ctl_send_msg(w, PW_CONTROL_BUILD(PW_MSG_REFUSED, pw_msg_refused, NULL, .reason = reason));
}

/* The REST API's base URL as worker w reaches it (welcome.http_url):
 * --advertise-url; else the HTTP bind address when it is a specific one;
 * else (0.0.0.0, ::) the local address the worker's control link came in
 * on, which a host bound to every address also serves HTTP on. "" when
 * none can be known (the worker then cannot fetch datasets, and says so). */
void pw_ctl_http_url(pw_coord *c, const struct sockaddr *local, char *out, size_t cap) {
  out[0] = 0;
  if (c->advertise_url[0]) {
    snprintf(out, cap, "%s", c->advertise_url);
    return;
  }
  char host[INET6_ADDRSTRLEN + 2] = "";
  const char *h = c->http_host;
  size_t hl = strlen(h);
  int wildcard = !hl || !strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !strcmp(h, "[::]");
  if (!wildcard) {
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') snprintf(host, sizeof host, "%.*s", (int)(hl - 2), h + 1);
    else snprintf(host, sizeof host, "%s", h);
  } else if (local && local->sa_family == AF_INET) {
    inet_ntop(AF_INET, &((const struct sockaddr_in *)local)->sin_addr, host, sizeof host);
  } else if (local && local->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)local)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a)) inet_ntop(AF_INET, &a->s6_addr[12], host, sizeof host);
    else inet_ntop(AF_INET6, a, host, sizeof host);
  }
  if (!host[0]) return;
  snprintf(out, cap, strchr(host, ':') ? "http://[%s]:%d" : "http://%s:%d", host, c->http_port);
}

static void http_url_for(pw_coord *c, pw_wconn *w, char *out, size_t cap) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  int ok = uv_tcp_getsockname(&w->tcp, (struct sockaddr *)&ss, &len) == 0;
  pw_ctl_http_url(c, ok ? (struct sockaddr *)&ss : NULL, out, cap);
  if (!out[0]) pw_warn("worker %s: no URL of the API to give it (set --advertise-url)", w->name);
}

/* Whether s holds a control character (a newline would forge lines of the
 * log, an escape sequence would drive the terminal that shows it). */
static int has_control(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f) return 1;
  return 0;
}

/* s for the log: control characters as \xNN, at most cap - 1 bytes. */
static const char *loggable(const char *s, char *buf, size_t cap) {
  size_t n = 0;
  for (; *s && n + 5 < cap; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch < 0x20 || ch == 0x7f)
      n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", ch);
    else
      buf[n++] = (char)ch;
  }
  buf[n] = 0;
  return buf;
}

static int on_register(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  pw_coord *c = ctx;
  pw_wconn *w = conn;
  const pw_msg_register *reg = &m->REGISTER;
  if (w->registered) return pw_err_set(err, PW_EPROTO, "register", "registered twice");
  char reason[400] = "";
  if (reg->version != PW_PROTO_VERSION)
    snprintf(reason, sizeof reason, "protocol version %lld is not supported (this coordinator speaks %d)",
             (long long)reg->version, PW_PROTO_VERSION);
  else if (c->cluster_token[0] && !pw_control_token_equal(reg->token, c->cluster_token))
    snprintf(reason, sizeof reason, "wrong cluster token");
  else if (!reg->name[0] || strlen(reg->name) >= sizeof w->name)
    snprintf(reason, sizeof reason, "worker name must be 1..%zu bytes", sizeof w->name - 1);
  else if (has_control(reg->name))
    snprintf(reason, sizeof reason, "worker name must not hold control characters (newlines, tabs, escapes)");
  else if (reg->host && has_control(reg->host))
    snprintf(reason, sizeof reason, "worker host id must not hold control characters");
  else if (reg->host && strlen(reg->host) >= sizeof w->host) /* cut, it could merge two hosts */
    snprintf(reason, sizeof reason, "worker host id must be at most %zu bytes", sizeof w->host - 1);
  if (reason[0]) {
    char shown[300];
    pw_warn("refusing worker '%s': %s", loggable(reg->name, shown, sizeof shown), reason);
    refuse(w, reason);
    pw_ctl_drop(w, NULL);
    return 0;
  }
  /* A name is one worker's. While its holder is alive (heard from within
   * the heartbeat timeout) a second worker of that name is refused, or the
   * two would evict each other forever; a holder gone silent is replaced
   * (the same worker back after a crash we had not noticed yet). */
  pw_wconn *next;
  for (pw_wconn *o = ctl_of(c)->conns; o; o = next) {
    next = o->next;
    if (o == w || !o->registered || strcmp(o->name, reg->name)) continue;
    double quiet = pw_mono() - o->last_seen;
    if (quiet < c->heartbeat_timeout) {
      snprintf(reason, sizeof reason,
               "worker name '%.64s' is taken by the worker at %.96s (heard from %.1f s ago): give each worker its own "
               "--name",
               reg->name, o->addr, quiet);
      pw_warn("refusing a second worker '%s' (data plane %s): %s", reg->name, reg->data_addr, reason);
      refuse(w, reason);
      pw_ctl_drop(w, NULL);
      return 0;
    }
    pw_ctl_drop(o, "replaced by a new connection of the same worker");
  }
  snprintf(w->name, sizeof w->name, "%s", reg->name);
  snprintf(w->addr, sizeof w->addr, "%s", reg->data_addr);
  pw_host_key(w->host, sizeof w->host, reg->host, w->name);
  w->threads = (int)reg->threads;
  /* a list too long to keep is none: that worker is never pinned */
  snprintf(w->cpus, sizeof w->cpus, "%s", reg->cpus && strlen(reg->cpus) < sizeof w->cpus ? reg->cpus : "");
  snprintf(w->numa, sizeof w->numa, "%s", reg->numa && strlen(reg->numa) < sizeof w->numa ? reg->numa : "");
  w->pinned[0] = 0;
  pw_store *s = pw_coord_store(c);
  pw_err serr = {0};
  if (!s || pw_store_worker_register(s, w->name, w->addr, (int)reg->cores, (int)reg->threads, reg->software, &w->id,
                                     &serr)) {
    char b[600];
    pw_error("worker %s: cannot record its registration: %s", reg->name,
             s ? pw_err_str(&serr, b, sizeof b) : "the store cannot be opened");
    refuse(w, "coordinator store unavailable");
    pw_ctl_drop(w, "store unavailable");
    return 0;
  }
  w->registered = 1;
  w->last_seen = pw_mono();
  registry_add(c, w, reg);
  if (reg->job >= 0) cancel_foreign(w, reg->job); /* busy with a run from before: stop it first */
  pw_info("worker %s registered (id %lld, data plane %s)", w->name, (long long)w->id, w->addr);
  char url[300];
  http_url_for(c, w, url, sizeof url);
  pw_ctl_send_msg(w, PW_CONTROL_BUILD(PW_MSG_WELCOME, pw_msg_welcome, NULL, .version = PW_PROTO_VERSION,
                                      .worker_id = w->id, .heartbeat_interval = c->heartbeat_interval,
                                      .http_url = url[0] ? url : NULL));
  ctl_of(c)->hooks->tick(c);
  return 0;
}

static int on_heartbeat(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  pw_coord *c = ctx;
  pw_wconn *w = conn;
  pw_registry_update(c, w);
  /* A worker still busy with a job we are not running here (say, from
   * before a coordinator restart) is told to stop it. */
  int64_t job = m->HEARTBEAT.job;
  if (job >= 0 && (!w->job || w->job->job != job)) {
    cancel_foreign(w, job);
  } else if (job < 0 && w->draining) {
    w->draining = 0; /* idle now */
    ctl_of(c)->hooks->tick(c);
  }
  return 0;
}

static void on_message(pw_wconn *w, json_t *msg) {
  pw_coord *c = w->c;
  pw_err err = {0};
  char b[512];
  if (!w->registered && pw_control_msg_of(pw_control_type(msg)) != PW_MSG_REGISTER) {
    pw_ctl_drop(w, "first message is not register");
    return;
  }
  if (w->registered) w->last_seen = pw_mono();
  if (pw_control_dispatch(&ctl_of(c)->handlers, PW_CONTROL_TO_COORD, c, w, msg, &err))
    pw_ctl_drop(w, pw_err_str(&err, b, sizeof b));
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  pw_wconn *w = h->data;
  void *base;
  size_t len;
  pw_control_reader_next_buf(&w->reader, &base, &len);
  *buf = uv_buf_init(base, (unsigned)len);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  pw_wconn *w = st->data;
  if (n == 0 || w->closing) return;
  if (n < 0) {
    pw_ctl_drop(w, n == UV_EOF ? "worker closed the link" : uv_strerror((int)n));
    return;
  }
  json_t *msg = NULL;
  pw_err err = {0};
  int rc = pw_control_reader_advance(&w->reader, (size_t)n, &msg, &err);
  if (rc < 0) {
    char b[512];
    pw_ctl_drop(w, pw_err_str(&err, b, sizeof b));
  } else if (rc == 1) {
    on_message(w, msg);
    json_decref(msg);
  }
}

static void on_connection(uv_stream_t *server, int status) {
  pw_coord *c = server->data;
  if (status < 0) return;
  pw_wconn *w = calloc(1, sizeof *w);
  if (!w) return;
  w->c = c;
  w->rank = -1;
  uv_tcp_init(c->loop, &w->tcp);
  w->tcp.data = w;
  pw_control_reader_init(&w->reader, 1 << 20); /* workers send small messages */
  if (uv_accept(server, (uv_stream_t *)&w->tcp)) {
    uv_close((uv_handle_t *)&w->tcp, on_closed);
    return;
  }
  w->last_seen = pw_mono();
  uv_tcp_nodelay(&w->tcp, 1); /* small messages: no Nagle delay */
  w->next = ctl_of(c)->conns;
  ctl_of(c)->conns = w;
  uv_read_start((uv_stream_t *)&w->tcp, on_alloc, on_read);
}

/* Every second: heartbeat timeouts (unregistered links get the same time
 * to register), lost workers leave the registry after --worker-expiry,
 * then a scheduling pass. */
static void on_tick(uv_timer_t *t) {
  pw_coord *c = t->data;
  double now = pw_mono();
  pw_wconn *next;
  for (pw_wconn *w = ctl_of(c)->conns; w; w = next) {
    next = w->next;
    if (now - w->last_seen > c->heartbeat_timeout) {
      char why[96];
      snprintf(why, sizeof why, "no heartbeat for %.1f s", now - w->last_seen);
      pw_ctl_drop(w, why);
    }
  }
  pw_coord_workers_expire(c, pw_store_now());
  ctl_of(c)->hooks->tick(c);
}

static void on_wake(uv_async_t *a) {
  pw_coord *c = a->data;
  ctl_of(c)->hooks->tick(c);
}

int pw_ctl_server_start(pw_coord *c, const pw_ctl_hooks *hooks, pw_err *err) {
  pw_ctl *ctl = calloc(1, sizeof *ctl);
  if (!ctl) return pw_err_set(err, PW_ENOMEM, "control", "out of memory");
  c->ctl = ctl;
  ctl->hooks = hooks;
  ctl->handlers = hooks->msgs;
  ctl->handlers.on[PW_MSG_REGISTER] = on_register;
  ctl->handlers.on[PW_MSG_HEARTBEAT] = on_heartbeat;
  struct sockaddr_storage sa;
  if (uv_ip4_addr(c->ctl_host, c->ctl_port, (struct sockaddr_in *)&sa) &&
      uv_ip6_addr(c->ctl_host, c->ctl_port, (struct sockaddr_in6 *)&sa))
    return pw_err_set(err, PW_EINVAL, "--control", "'%s' is not an IP address", c->ctl_host);
  uv_tcp_init(c->loop, &ctl->listener);
  ctl->listener.data = c;
  int rc = uv_tcp_bind(&ctl->listener, (struct sockaddr *)&sa, 0);
  if (!rc) rc = uv_listen((uv_stream_t *)&ctl->listener, 128, on_connection);
  if (rc) return pw_err_set(err, PW_EIO, "--control", "cannot listen on %s:%d: %s", c->ctl_host, c->ctl_port, uv_strerror(rc));
  int len = sizeof sa;
  uv_tcp_getsockname(&ctl->listener, (struct sockaddr *)&sa, &len);
  c->ctl_port = sa.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&sa)->sin_port)
                                        : ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
  uv_async_init(c->loop, &c->wake, on_wake);
  c->wake.data = c;
  uv_timer_init(c->loop, &ctl->tick);
  ctl->tick.data = c;
  uv_timer_start(&ctl->tick, on_tick, 1000, 1000);
  return 0;
}

void pw_ctl_server_stop(pw_coord *c) {
  pw_ctl *ctl = ctl_of(c);
  if (!ctl) return;
  ctl->hooks->shutdown(c);
  uv_timer_stop(&ctl->tick);
  uv_close((uv_handle_t *)&ctl->tick, NULL);
  uv_close((uv_handle_t *)&ctl->listener, NULL);
  uv_close((uv_handle_t *)&c->wake, NULL);
  while (ctl->conns) {
    pw_ctl_drop(ctl->conns, NULL);
  }
  pw_rec_free_all(c);
}
