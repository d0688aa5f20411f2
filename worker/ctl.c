/* ctl: the worker's control link to the coordinator — connect, register,
 * heartbeat, take assignments, reconnect with backoff when the link drops.
 * Messages are dispatched from a table by type (control.h). A malformed
 * message closes the link (and we reconnect); it never stops the worker. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "serve.h"
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
  pw_err err = {0};
  char b[512];
  if (!msg) {
    pw_error("a control message could not be built");
    return;
  }
  /* What the coordinator would refuse (and drop the link for) is caught here. */
  if (pw_control_validate(msg, &err)) {
    pw_error("not sending an invalid %s message: %s", pw_control_type(msg) ? pw_control_type(msg) : "?",
             pw_err_str(&err, b, sizeof b));
    json_decref(msg);
    return;
  }
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

/* The process's open descriptors (entries of /proc/self/fd but the one
 * listing them), or -1 where there is no /proc: the heartbeat carries it so
 * a leak shows on the coordinator long before the limit is reached. Read
 * with getdents64 into a static buffer, not opendir's malloc'd one: a
 * heartbeat in the middle of a run then touches no page it has not
 * touched before (the first one after the run's arenas were made took
 * fresh heap pages). */
static int64_t open_fds(void) {
  static _Alignas(8) char buf[4096];
  int fd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int64_t n = 0;
  long got;
  while ((got = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
    for (long at = 0; at < got;) {
      const struct dirent64 *e = (const struct dirent64 *)(buf + at);
      if (e->d_name[0] != '.') n++;
      at += e->d_reclen;
    }
  close(fd);
  return got < 0 ? -1 : n - 1;
}

static void send_heartbeat(uv_timer_t *t) {
  pw_worker *w = t->data;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  pw_ctl_send(w, PW_CONTROL_BUILD(PW_MSG_HEARTBEAT, pw_msg_heartbeat, NULL,
                                  .time = (double)ts.tv_sec + ts.tv_nsec * 1e-9, .state = w->run ? "busy" : "idle",
                                  .job = w->run ? (int64_t)w->run->cx.job : -1, .fds = open_fds()));
}

static int on_welcome(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  pw_worker *w = ctx;
  w->ctl_state = 2;
  w->backoff_ms = BACKOFF_MIN_MS;
  w->worker_id = (int)m->WELCOME.worker_id;
  double hb = m->WELCOME.heartbeat_interval;
  w->heartbeat_interval = hb > 0.05 ? hb : 0.05;
  const char *url = m->WELCOME.http_url;
  if (url && strlen(url) >= sizeof w->http_url) {
    pw_warn("welcome.http_url is %zu bytes, over %zu: datasets cannot be fetched", strlen(url), sizeof w->http_url - 1);
    url = NULL;
  }
  snprintf(w->http_url, sizeof w->http_url, "%s", url ? url : "");
  /* A coordinator that registers us anew knows none of our snapshots. */
  pw_snapstore_drop_others(&w->snaps, 0);
  pw_info("registered as worker %d (heartbeat every %.2fs%s%s)", w->worker_id, w->heartbeat_interval,
          w->http_url[0] ? ", datasets from " : "", w->http_url);
  uint64_t ms = (uint64_t)(w->heartbeat_interval * 1000);
  uv_timer_start(&w->heartbeat, send_heartbeat, ms, ms);
  return 0;
}

static int on_refused(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  pw_worker *w = ctx;
  pw_error("coordinator refused registration: %s", m->REFUSED.reason);
  w->backoff_ms = BACKOFF_MAX_MS;
  ctl_close(w, NULL);
  return 0;
}

/* ---- runs -------------------------------------------------------------------- */

/* What the worker does for its run (run.h's pw_run_host). */
static void host_ctl_send(void *arg, json_t *msg) { pw_ctl_send(arg, msg); }

static void host_released(void *arg, pw_run *r) {
  pw_worker *w = arg;
  if (w->run == r) w->run = NULL;
  pw_pin_release(&w->pin); /* the next run may be given other CPUs, or none */
}

static void host_drain_in(void *arg, pw_run *r) {
  pw_worker *w = arg;
  for (pw_link *l = w->links; l; l = l->next)
    if (!l->outbound && l->hello_job == r->cx.job && l->hello_run == r->cx.run_id && l->peer_rank >= 0) pw_link_drain(l);
}

static int host_send(pw_link *l, pw_run *r, const uint8_t hdr[PW_FRAME_HDR_SIZE], const void *payload, uint64_t len,
                     uint64_t off, int to, int li, int slot, atomic_int *pending) {
  return pw_net_send_encoded(l, r, hdr, payload, len, off, to, li, slot, pending, NULL);
}

static void host_bye(pw_link *l, uint64_t job, const char *reason) {
  l->peer_rank = -1; /* its close is ours, not a failure to report */
  pw_link_bye(l, job, reason);
}

/* The run of assignment a, made, then the worker's: it connects to its
 * peers, and its compute thread starts once every link is up. */
static int start_run(pw_worker *w, const pw_msg_assign *a, const json_t *as, pw_err *err) {
  pw_run_host host = {.arg = w, .ctl_send = host_ctl_send, .send = host_send, .bye = host_bye,
                      .drain_in = host_drain_in, .released = host_released, .threads = w->threads,
                      .backend = w->backend, .cores = w->res.cores,
                      .cache = w->cache, .snaps = &w->snaps, .http_url = w->http_url, .token = w->token};
  pw_run *r;
  int rc = pw_run_create(w->loop, a, as, w->state_dir, &host, &r, err);
  if (rc) return rc;
  size_t kept = pw_snapstore_drop_others(&w->snaps, r->cx.job); /* only this job's can be used now */
  if (kept) pw_info("job %llu: %.1f MiB of its snapshots in memory", (unsigned long long)r->cx.job, (double)kept / (1 << 20));
  w->run = r;
  if (a->cpus) { /* before its compute thread exists: that thread inherits the loop's CPUs */
    char why[256];
    if (pw_pin_apply(&w->pin, a->cpus, why, sizeof why)) pw_warn("job %llu: not pinned: %s", (unsigned long long)r->cx.job, why);
    else pw_info("job %llu run %d: rank %d's threads on CPUs %s", (unsigned long long)r->cx.job, r->cx.run_id, r->cx.rank,
                 a->cpus);
  }
  pw_net_run_started(w, r);
  pw_info("job %llu run %d: rank %d (pipeline rank %d, replica %d) of %d, stages %d..%d, %d actions per step, "
          "budget %.1f MiB, plan %.12s",
          (unsigned long long)r->cx.job, r->cx.run_id, r->cx.rank, r->cx.prank, r->cx.replica, r->cx.n_ranks,
          r->cx.ls[0].stage, r->cx.ls[r->cx.n_ls - 1].stage, r->cx.n_acts, (double)r->cfg.sl.mem_budget / (1 << 20),
          r->cfg.sl.plan_sha256);
  for (int k = 0; k < r->cx.n_ranks; k++) {
    if (k == r->cx.rank) continue;
    r->lp.out.needed++;
    r->lp.out.link[k] = pw_net_connect(w, r->peers[k].addr, k);
    if (!r->lp.out.link[k]) {
      pw_run_fail(r, "bad address '%s' for rank %d", r->peers[k].addr, k);
      return 0;
    }
  }
  if (r->lp.out.needed == 0) pw_run_on_link_up(r, -1, -1);
  return 0;
}

static int on_assign(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  pw_worker *w = ctx;
  const pw_msg_assign *a = &m->ASSIGN;
  pw_err aerr = {0};
  char buf[512];
  /* The coordinator is the authority: a run it no longer knows about
   * (say, from before it restarted) gives way to the new assignment. */
  if (w->run) pw_run_cancel(w->run, "superseded by a new assignment");
  if (start_run(w, a, raw, &aerr)) {
    pw_error("assignment refused: %s", pw_err_str(&aerr, buf, sizeof buf));
    pw_ctl_send(w, PW_CONTROL_BUILD(PW_MSG_ERROR, pw_msg_error, NULL, .job = a->job, .run = a->run, .rank = a->rank,
                                    .message = buf));
  }
  return 0;
}

static int on_cancel(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  pw_worker *w = ctx;
  pw_run *r = w->run;
  const pw_msg_cancel *c = &m->CANCEL;
  if (r && (int64_t)r->cx.job == c->job && (c->run == 0 || r->cx.run_id == c->run)) pw_run_cancel(r, c->reason);
  return 0;
}

static int on_stop(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  pw_worker *w = ctx;
  pw_run *r = w->run;
  const pw_msg_stop *s = &m->STOP;
  char why[160];
  int rank = -1;
  if (!r || (int64_t)r->cx.job != s->job || r->cx.run_id != s->run) {
    /* not running it (its assign is still on the way, or it ended): this
     * rank cannot stop where its peers will, so the coordinator ends the
     * run now rather than at its drain's timeout */
    snprintf(why, sizeof why, "cannot stop after step %lld: this worker does not run that run", (long long)s->steps);
  } else if (s->steps > INT_MAX || pw_run_stop_at(r, (int)s->steps, why, sizeof why) == 0) {
    return 0;
  } else {
    rank = r->cx.rank;
  }
  pw_warn("job %lld run %lld: %s", (long long)s->job, (long long)s->run, why);
  pw_ctl_send(w, PW_CONTROL_BUILD(PW_MSG_ERROR, pw_msg_error, NULL, .job = s->job, .run = s->run, .rank = rank,
                                  .message = why));
  return 0;
}

static int on_generate(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  pw_worker *w = ctx;
  const pw_msg_generate *g = &m->GENERATE;
  pw_run *r = w->run;
  char why[256] = "this worker does not serve that run";
  int rank = 0;
  if (r && (int64_t)r->cx.job == g->job && r->cx.run_id == g->run) {
    rank = r->cx.rank;
    if (!r->serve) snprintf(why, sizeof why, "rank %d of job %llu does not take requests", r->cx.rank,
                            (unsigned long long)r->cx.job);
    else if (!pw_serve_submit(r->serve, g, why, sizeof why)) return 0;
  }
  pw_warn("job %lld: request %lld refused: %s", (long long)g->job, (long long)g->req, why);
  pw_ctl_send(w, PW_CONTROL_BUILD(PW_MSG_GEN_FAILED, pw_msg_gen_failed, NULL, .job = g->job, .run = g->run,
                                  .rank = rank, .req = g->req, .message = why));
  return 0;
}

static int on_shutdown(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  pw_info("coordinator asked us to shut down");
  raise(SIGTERM);
  return 0;
}

static const pw_control_handlers handlers = {.on = {[PW_MSG_WELCOME] = on_welcome,
                                                    [PW_MSG_REFUSED] = on_refused,
                                                    [PW_MSG_ASSIGN] = on_assign,
                                                    [PW_MSG_CANCEL] = on_cancel,
                                                    [PW_MSG_STOP] = on_stop,
                                                    [PW_MSG_GENERATE] = on_generate,
                                                    [PW_MSG_SHUTDOWN] = on_shutdown}};

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
    char b[512];
    if (pw_control_dispatch(&handlers, PW_CONTROL_TO_WORKER, w, NULL, msg, &err))
      ctl_close(w, pw_err_str(&err, b, sizeof b));
    json_decref(msg);
  }
}

/* The data address peers dial: --listen's, or for a wildcard (0.0.0.0,
 * ::) the address this host reaches the coordinator from, which is the
 * interface the cluster's network uses. */
static void advertised(pw_worker *w, char *addr, size_t cap) {
  struct sockaddr_storage sa;
  int len = sizeof sa;
  char host[64];
  int wild = !strcmp(w->listen_host, "0.0.0.0") || !strcmp(w->listen_host, "::");
  if (wild && uv_tcp_getsockname(&w->ctl, (struct sockaddr *)&sa, &len) == 0 &&
      uv_ip_name((struct sockaddr *)&sa, host, sizeof host) == 0) {
    snprintf(addr, cap, sa.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host, w->listen_port);
    return;
  }
  snprintf(addr, cap, "%s:%d", w->listen_host, w->listen_port);
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
  advertised(w, addr, sizeof addr);
  /* cores and memory as the cgroup and affinity mask grant them (main.c
   * read them): the coordinator's memory budget and contention note */
  pw_ctl_send(w, PW_CONTROL_BUILD(PW_MSG_REGISTER, pw_msg_register, NULL, .version = PW_PROTO_VERSION,
                                  .name = w->name, .token = w->token, .data_addr = addr,
                                  .cores = w->res.cores, .threads = w->threads,
                                  .software = "pipewright-worker " PW_VERSION,
                                  .job = w->run ? (int64_t)w->run->cx.job : -1, /* still busy with it */
                                  .memory = w->res.memory, .cores_from = w->res.cores_from,
                                  .memory_from = w->res.memory_from,
                                  .blas_core = w->blas.core[0] ? w->blas.core : NULL, .blas_forced = w->blas.forced,
                                  .cpu_level = pw_cpu_name(w->blas.cpu), .gemm_gflops = w->blas.gflops,
                                  .gemm_path = w->blas.gemm ? pw_gemm_path_name(w->blas.gemm->path) : NULL,
                                  .host = w->host_id, .hostname = w->hostname,
                                  .cpus = w->pin.mask_text[0] ? w->pin.mask_text : NULL,
                                  .numa = w->pin.numa_text[0] ? w->pin.numa_text : NULL));
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
