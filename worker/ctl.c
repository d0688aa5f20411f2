/* ctl: the worker's control link to the coordinator — connect, register,
 * heartbeat, take assignments, reconnect with backoff when the link drops.
 * A malformed message closes the link (and we reconnect); it never stops
 * the worker. */
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "worker.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

static void ctl_connect(pw_worker *w);
static void on_reconnect_timer(uv_timer_t *t) { ctl_connect(t->data); }

typedef struct {
  uv_write_t req;
  uint8_t *data;
} ctl_write;

static void on_ctl_write(uv_write_t *req, int status) {
  ctl_write *cw = (ctl_write *)req;
  if (status < 0 && status != UV_ECANCELED) pw_warn("control write: %s", uv_strerror(status));
  free(cw->data);
  free(cw);
}

void pw_ctl_send(pw_worker *w, json_t *msg) {
  if (!msg) return;
  if (w->ctl_state == 0 || w->ctl_closing) {
    pw_debug("control link down: dropping %s", pw_control_type(msg) ? pw_control_type(msg) : "?");
    json_decref(msg);
    return;
  }
  ctl_write *cw = calloc(1, sizeof *cw);
  size_t len = 0;
  if (!cw || pw_control_encode(msg, &cw->data, &len)) {
    pw_error("cannot encode a %s message", pw_control_type(msg) ? pw_control_type(msg) : "?");
    free(cw);
    json_decref(msg);
    return;
  }
  json_decref(msg);
  uv_buf_t buf = uv_buf_init((char *)cw->data, (unsigned)len);
  int rc = uv_write(&cw->req, (uv_stream_t *)&w->ctl, &buf, 1, on_ctl_write);
  if (rc) {
    pw_warn("control write: %s", uv_strerror(rc));
    free(cw->data);
    free(cw);
  }
}

static void on_ctl_closed(uv_handle_t *h) {
  pw_worker *w = h->data;
  w->ctl_state = 0;
  w->ctl_closing = 0;
  pw_control_reader_free(&w->ctl_reader);
  if (w->stopping) return;
  pw_info("control link down; reconnecting in %d ms", w->backoff_ms);
  uv_timer_start(&w->reconnect, on_reconnect_timer, (uint64_t)w->backoff_ms, 0);
  w->backoff_ms = w->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : w->backoff_ms * 2;
}

static void ctl_close(pw_worker *w, const char *why) {
  if (w->ctl_closing || w->ctl_state == 0) return;
  if (why) pw_warn("closing control link: %s", why);
  w->ctl_closing = 1;
  uv_timer_stop(&w->heartbeat);
  uv_close((uv_handle_t *)&w->ctl, on_ctl_closed);
}

static void send_heartbeat(uv_timer_t *t) {
  pw_worker *w = t->data;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  json_t *hb = json_pack("{s:s, s:f, s:s}", "type", "heartbeat", "time", (double)ts.tv_sec + ts.tv_nsec * 1e-9,
                         "state", w->run ? "busy" : "idle");
  if (w->run) json_object_set_new(hb, "job", json_integer((json_int_t)w->run->job));
  pw_ctl_send(w, hb);
}

static void handle(pw_worker *w, json_t *msg) {
  const char *type = pw_control_type(msg);
  pw_err err = {0};
  char buf[512];
  if (pw_control_msg_dir(type) != PW_CONTROL_TO_WORKER) {
    ctl_close(w, "coordinator sent a worker-to-coordinator message");
    return;
  }
  if (!strcmp(type, "welcome")) {
    w->ctl_state = 2;
    w->backoff_ms = BACKOFF_MIN_MS;
    w->worker_id = (int)json_integer_value(json_object_get(msg, "worker_id"));
    double hb = json_number_value(json_object_get(msg, "heartbeat_interval"));
    w->heartbeat_interval = hb > 0.05 ? hb : 0.05;
    pw_info("registered as worker %d (heartbeat every %.2fs)", w->worker_id, w->heartbeat_interval);
    uint64_t ms = (uint64_t)(w->heartbeat_interval * 1000);
    uv_timer_start(&w->heartbeat, send_heartbeat, ms, ms);
  } else if (!strcmp(type, "refused")) {
    pw_error("coordinator refused registration: %s", json_string_value(json_object_get(msg, "reason")));
    w->backoff_ms = BACKOFF_MAX_MS;
    ctl_close(w, NULL);
  } else if (!strcmp(type, "assign")) {
    /* The coordinator is the authority: a run it no longer knows about
     * (say, from before it restarted) gives way to the new assignment. */
    if (w->run) pw_run_cancel(w->run, "superseded by a new assignment");
    if (pw_run_start(w, msg, &err)) {
      pw_error("assignment refused: %s", pw_err_str(&err, buf, sizeof buf));
      pw_ctl_send(w, json_pack("{s:s, s:O, s:O, s:O, s:s}", "type", "error", "job", json_object_get(msg, "job"),
                               "run", json_object_get(msg, "run"), "rank", json_object_get(msg, "rank"),
                               "message", pw_err_str(&err, buf, sizeof buf)));
    }
  } else if (!strcmp(type, "cancel")) {
    pw_run *r = w->run;
    int run = (int)json_integer_value(json_object_get(msg, "run")); /* 0: any run of the job */
    if (r && (json_int_t)r->job == json_integer_value(json_object_get(msg, "job")) && (run == 0 || r->run_id == run))
      pw_run_cancel(r, json_string_value(json_object_get(msg, "reason")));
  } else if (!strcmp(type, "shutdown")) {
    pw_info("coordinator asked us to shut down");
    raise(SIGTERM);
  }
}

static void on_ctl_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  pw_worker *w = h->data;
  void *base;
  size_t len;
  pw_control_reader_next_buf(&w->ctl_reader, &base, &len);
  *buf = uv_buf_init(base, (unsigned)len);
}

static void on_ctl_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  pw_worker *w = s->data;
  if (n == 0) return;
  if (n < 0) {
    ctl_close(w, n == UV_EOF ? "coordinator closed the link" : uv_strerror((int)n));
    return;
  }
  json_t *msg = NULL;
  pw_err err = {0};
  int rc = pw_control_reader_advance(&w->ctl_reader, (size_t)n, &msg, &err);
  if (rc < 0) {
    char b[512];
    ctl_close(w, pw_err_str(&err, b, sizeof b));
    return;
  }
  if (rc == 1) {
    handle(w, msg);
    json_decref(msg);
  }
}

static void on_ctl_connect(uv_connect_t *req, int status) {
  pw_worker *w = req->data;
  if (status < 0) {
    pw_warn("cannot reach coordinator %s:%d: %s", w->coord_host, w->coord_port, uv_strerror(status));
    w->ctl_state = 1;
    ctl_close(w, NULL);
    return;
  }
  w->ctl_state = 1;
  uv_tcp_nodelay(&w->ctl, 1); /* small messages: no Nagle delay */
  pw_control_reader_init(&w->ctl_reader, 0);
  uv_read_start((uv_stream_t *)&w->ctl, on_ctl_alloc, on_ctl_read);
  char addr[96];
  snprintf(addr, sizeof addr, "%s:%d", w->listen_host, w->listen_port);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  json_t *reg = json_pack("{s:s, s:i, s:s, s:s, s:s, s:i, s:i, s:s}", "type", "register", "version",
                           PW_PROTO_VERSION, "name", w->name, "token", w->token, "data_addr", addr, "cores",
                           (int)(cores > 0 ? cores : 1), "threads", w->threads, "software",
                           "pipewright-worker " PW_VERSION);
  if (w->run) json_object_set_new(reg, "job", json_integer((json_int_t)w->run->job)); /* still busy */
  pw_ctl_send(w, reg);
}

static int resolve(const char *host, int port, struct sockaddr_storage *out) {
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)out) == 0) return 0;
  if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)out) == 0) return 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, NULL, &hints, &res) || !res) return -1;
  memcpy(out, res->ai_addr, res->ai_addrlen);
  if (out->ss_family == AF_INET)
    ((struct sockaddr_in *)out)->sin_port = htons((uint16_t)port);
  else
    ((struct sockaddr_in6 *)out)->sin6_port = htons((uint16_t)port);
  freeaddrinfo(res);
  return 0;
}

static void ctl_connect(pw_worker *w) {
  if (w->stopping) return;
  struct sockaddr_storage sa;
  if (resolve(w->coord_host, w->coord_port, &sa)) {
    pw_warn("cannot resolve coordinator host '%s'", w->coord_host);
    uv_timer_start(&w->reconnect, on_reconnect_timer, (uint64_t)BACKOFF_MAX_MS, 0);
    return;
  }
  uv_tcp_init(w->loop, &w->ctl);
  w->ctl.data = w;
  w->ctl_connect.data = w;
  w->ctl_state = 1;
  int rc = uv_tcp_connect(&w->ctl_connect, &w->ctl, (struct sockaddr *)&sa, on_ctl_connect);
  if (rc) {
    pw_warn("connect to coordinator: %s", uv_strerror(rc));
    ctl_close(w, NULL);
  }
}

int pw_ctl_start(pw_worker *w) {
  uv_timer_init(w->loop, &w->heartbeat);
  uv_timer_init(w->loop, &w->reconnect);
  w->heartbeat.data = w->reconnect.data = w;
  w->backoff_ms = BACKOFF_MIN_MS;
  ctl_connect(w);
  return 0;
}

void pw_ctl_stop(pw_worker *w) {
  uv_timer_stop(&w->reconnect);
  uv_timer_stop(&w->heartbeat);
  uv_close((uv_handle_t *)&w->heartbeat, NULL);
  uv_close((uv_handle_t *)&w->reconnect, NULL);
  if (w->ctl_state && !w->ctl_closing) {
    w->ctl_closing = 1;
    uv_close((uv_handle_t *)&w->ctl, on_ctl_closed);
  }
}
