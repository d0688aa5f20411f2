/* net: the data plane — a listener for peers' inbound links, outbound
 * links to peers, and frame I/O over both.
 *
 * The loop reads an inbound link only up to its HELLO: once admitted, the
 * socket is the run's compute thread's, which reads frames straight into
 * program slots (recv.c), so an activation is never copied on receipt.
 * A bad HELLO closes its link with the reason logged, and the worker goes
 * on; a bad frame after it fails the run. No inbound link outlives its
 * purpose: one silent before HELLO, one held for a job that never starts
 * here, one whose peer hung up while held, one being drained whose peer
 * never ends it — each is closed after a bounded time (link timers below),
 * so junk connections cannot pile up descriptors. */
#include <poll.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "crc32c.h"
#include "log.h"
#include "worker.h"


static void link_unlist(pw_link *l) {
  for (pw_link **p = &l->w->links; *p; p = &(*p)->next)
    if (*p == l) {
      *p = l->next;
      return;
    }
}

static void on_link_closed(uv_handle_t *h) {
  pw_link *l = h->data;
  if (--l->handles > 0) return;
  pw_frame_reader_free(&l->reader);
  free(l);
}

void pw_link_close(pw_link *l) {
  if (l->closing) return;
  l->closing = 1;
  link_unlist(l);
  l->handles = 1 + l->timer_init;
  if (l->timer_init) uv_close((uv_handle_t *)&l->timer, on_link_closed);
  uv_close((uv_handle_t *)&l->tcp, on_link_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  pw_link *l = req->data;
  pw_link_close(l);
}

void pw_link_bye(pw_link *l, uint64_t job, const char *reason) {
  if (l->closing) return;
  if (!l->connected) {
    pw_link_close(l);
    return;
  }
  size_t n = reason ? strlen(reason) : 0;
  if (n > PW_FRAME_HELLO_MAX) n = PW_FRAME_HELLO_MAX;
  char *copy = n ? malloc(n) : NULL;
  if (copy) memcpy(copy, reason, n);
  else n = 0;
  pw_frame_hdr h;
  uint8_t hdr[PW_FRAME_HDR_SIZE];
  uint32_t dims[1] = {(uint32_t)n};
  /* Without its BYE the link still closes: the peer then reads an abrupt
   * end instead of our reason. */
  int rc = pw_frame_hdr_init(&h, PW_FRAME_BYE, job, 0, 0, 0, 0, PW_DTYPE_U8, 1, dims);
  if (rc) {
    pw_warn("link %s (rank %d): no BYE header for job %llu: %s", l->addr, l->peer_rank, (unsigned long long)job,
            pw_strerror(rc));
    free(copy);
    pw_link_close(l);
    return;
  }
  pw_frame_hdr_encode(&h, copy, hdr);
  if ((rc = pw_net_send_encoded(l, NULL, hdr, copy, n, 0, -1, -1, -1, NULL, copy))) {
    pw_warn("link %s (rank %d): cannot send BYE: %s", l->addr, l->peer_rank, uv_strerror(rc));
    pw_link_close(l);
    return;
  }
  l->shutdown_req.data = l;
  if (uv_shutdown(&l->shutdown_req, (uv_stream_t *)&l->tcp, on_shutdown)) pw_link_close(l);
}

/* A link failed or sent garbage: log, tell the run, close. */
static void link_fail(pw_link *l, const char *why) {
  if (l->closing) return;
  pw_warn("%s link %s (rank %d): %s", l->outbound ? "outbound" : "inbound", l->addr, l->peer_rank, why);
  pw_run *r = l->w->run;
  if (r && l->peer_rank >= 0) pw_run_on_link_down(r, l->peer_rank, l->outbound, l->addr, why);
  pw_link_close(l);
}

/* ---- inbound ------------------------------------------------------------ */

#define LINK_CHECK_MS 250 /* how often a pending link's deadline and peer are checked */

/* A held link is not read (its frames wait in the socket), so its peer's
 * hang-up is looked for: POLLRDHUP is reported even with bytes unread.
 * POLLIN: bytes wait to be read (the loop was held up; they are read in
 * this turn, after the timers). */
static int link_poll(pw_link *l, short events) {
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&l->tcp, &fd)) return POLLERR;
  struct pollfd p = {.fd = fd, .events = events};
  return poll(&p, 1, 0) > 0 ? p.revents : 0;
}

/* Bytes the peer sent that we have not read. */
static int link_unread(pw_link *l) {
  uv_os_fd_t fd;
  int n = 0;
  return uv_fileno((uv_handle_t *)&l->tcp, &fd) || ioctl(fd, FIONREAD, &n) ? 0 : n;
}

/* Deadlines in monotonic ms, not uv_now(): that is the time the loop's turn
 * began, which a slow turn leaves behind. */
static uint64_t now_ms(void) { return uv_hrtime() / 1000000; }

static void on_link_timer(uv_timer_t *t) {
  pw_link *l = t->data;
  if (l->closing) return;
  if (l->peer_rank >= 0) { /* admitted: the run's now */
    uv_timer_stop(t);
    return;
  }
  char why[160];
  /* A held link whose peer hung up having sent nothing more is closed now;
   * one with frames left (say, a BYE with the peer's reason) waits for its
   * run as long as any, so that run can still read why. */
  if (l->paused && (link_poll(l, POLLRDHUP) & (POLLRDHUP | POLLHUP | POLLERR)) && link_unread(l) == 0) {
    snprintf(why, sizeof why, "peer hung up while its link waited for job %llu", (unsigned long long)l->hello_job);
    link_fail(l, why);
    return;
  }
  if (now_ms() < l->deadline) return;
  if (!l->paused && !l->draining && (link_poll(l, POLLIN) & POLLIN)) return; /* its HELLO may be there */
  if (l->draining)
    snprintf(why, sizeof why, "peer did not end the link within %.1f s of the run's end", l->w->held_timeout);
  else if (l->paused)
    snprintf(why, sizeof why, "no run of job %llu started here within %.1f s of its HELLO",
             (unsigned long long)l->hello_job, l->w->held_timeout);
  else
    snprintf(why, sizeof why, "no HELLO within %.1f s", l->w->hello_timeout);
  if (l->draining) {
    pw_debug("inbound link %s: %s", l->addr, why);
    pw_link_close(l);
  } else {
    link_fail(l, why);
  }
}

/* (Re)arms inbound link l's deadline, `seconds` from now. */
static void link_deadline(pw_link *l, double seconds) {
  if (!l->timer_init) return;
  l->deadline = now_ms() + (uint64_t)(seconds * 1000);
  uv_timer_start(&l->timer, on_link_timer, LINK_CHECK_MS, LINK_CHECK_MS);
}

static int on_hello(pw_link *l, const void *payload, size_t len, pw_err *err) {
  uint64_t job;
  uint32_t rank, run;
  char token[PW_CONTROL_TOKEN_MAX + 1];
  int rc = pw_frame_hello_parse(payload, len, &job, &run, &rank, token, sizeof token, err);
  if (rc) return rc;
  if (!pw_control_token_equal(token, l->w->token))
    return pw_err_set(err, PW_EAUTH, "hello", "wrong cluster token from peer claiming rank %u", rank);
  l->hello_job = job;
  l->hello_run = (int)run;
  l->hello_rank = (int)rank;
  pw_run *r = l->w->run;
  if (r && r->cx.job == job && (int)run < r->cx.run_id)
    return pw_err_set(err, PW_EPROTO, "hello", "rank %u of job %llu's run %u, which is over (this is run %d)", rank,
                      (unsigned long long)job, run, r->cx.run_id);
  if (!r || r->cx.job != job || (int)run != r->cx.run_id) {
    /* Our assignment for that job has not arrived yet (the coordinator's
     * messages reach workers at different times): stop reading — its
     * frames wait in the socket — until the run starts. */
    l->paused = 1;
    uv_read_stop((uv_stream_t *)&l->tcp);
    link_deadline(l, l->w->held_timeout);
    pw_debug("inbound link from rank %u of job %llu run %u held until that run starts", rank, (unsigned long long)job,
             run);
    return 0;
  }
  return pw_net_admit(l, r, err);
}

int pw_net_admit(pw_link *l, pw_run *r, pw_err *err) {
  if (l->hello_rank >= r->cx.n_ranks || l->hello_rank == r->cx.rank)
    return pw_err_set(err, PW_EPROTO, "hello", "peer claims job %llu rank %d, which is not a peer of ours",
                      (unsigned long long)l->hello_job, l->hello_rank);
  l->peer_rank = l->hello_rank;
  if (l->timer_init) uv_timer_stop(&l->timer);
  /* From here the run's compute thread reads the socket (io.c); HELLO
   * was read to its last byte, so nothing is left in our reader. */
  uv_read_stop((uv_stream_t *)&l->tcp);
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&l->tcp, &fd))
    return pw_err_set(err, PW_EINTERNAL, "hello", "inbound link from rank %d has no socket", l->peer_rank);
  pw_run_link_in(r, l->peer_rank, fd);
  pw_debug("inbound link from rank %d (%s)", l->peer_rank, l->addr);
  return 0;
}

static void on_in_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  pw_link *l = h->data;
  void *base;
  size_t len;
  pw_frame_reader_next_buf(&l->reader, &base, &len);
  if (len > (1u << 30)) len = 1u << 30;
  *buf = uv_buf_init(base, (unsigned)len);
}

static void on_in_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  pw_link *l = s->data;
  if (n == 0) return;
  if (n < 0) {
    link_fail(l, n == UV_EOF ? "peer closed the link" : uv_strerror((int)n));
    return;
  }
  pw_frame_event ev;
  pw_err err = {0};
  char b[512];
  int rc = pw_frame_reader_advance(&l->reader, (size_t)n, &ev, &err);
  if (rc == PW_FRAME_HEADER) {
    if (ev.hdr.kind != PW_FRAME_HELLO) link_fail(l, "first frame is not HELLO");
  } else if (rc == PW_FRAME_DONE) {
    if (ev.hdr.kind != PW_FRAME_HELLO || l->hello_rank >= 0) {
      link_fail(l, "first frame is not HELLO");
      return;
    }
    if (on_hello(l, ev.payload, ev.len, &err)) link_fail(l, pw_err_str(&err, b, sizeof b));
  } else if (rc < 0) {
    link_fail(l, pw_err_str(&err, b, sizeof b));
  }
}

static void on_connection(uv_stream_t *server, int status) {
  pw_worker *w = server->data;
  if (status < 0) {
    pw_warn("accept: %s", uv_strerror(status));
    return;
  }
  pw_link *l = calloc(1, sizeof *l);
  if (!l) return;
  l->w = w;
  l->peer_rank = l->hello_rank = -1;
  uv_tcp_init(w->loop, &l->tcp);
  l->tcp.data = l;
  pw_frame_reader_init(&l->reader, PW_FRAME_HELLO_MAX);
  if (uv_accept(server, (uv_stream_t *)&l->tcp)) {
    l->handles = 1;
    uv_close((uv_handle_t *)&l->tcp, on_link_closed);
    return;
  }
  uv_timer_init(w->loop, &l->timer);
  l->timer.data = l;
  l->timer_init = 1;
  struct sockaddr_storage sa;
  int len = sizeof sa;
  if (uv_tcp_getpeername(&l->tcp, (struct sockaddr *)&sa, &len) == 0) {
    char ip[48] = "?";
    if (sa.ss_family == AF_INET) {
      uv_ip4_name((struct sockaddr_in *)&sa, ip, sizeof ip);
      snprintf(l->addr, sizeof l->addr, "%s:%d", ip, ntohs(((struct sockaddr_in *)&sa)->sin_port));
    } else {
      uv_ip6_name((struct sockaddr_in6 *)&sa, ip, sizeof ip);
      snprintf(l->addr, sizeof l->addr, "[%s]:%d", ip, ntohs(((struct sockaddr_in6 *)&sa)->sin6_port));
    }
  }
  uv_tcp_nodelay(&l->tcp, 1);
  l->connected = 1;
  l->next = w->links;
  w->links = l;
  link_deadline(l, w->hello_timeout);
  if (uv_read_start((uv_stream_t *)&l->tcp, on_in_alloc, on_in_read)) pw_link_close(l);
}

/* A run started: admit the links that were held for it. */
void pw_net_run_started(pw_worker *w, pw_run *r) {
  pw_link *next;
  for (pw_link *l = w->links; l; l = next) {
    next = l->next;
    if (l->outbound || !l->paused || l->hello_job != r->cx.job || l->hello_run > r->cx.run_id) continue;
    if (l->hello_run < r->cx.run_id) { /* a late link of an earlier run (the epoch fence) */
      char b[160];
      snprintf(b, sizeof b, "its HELLO names run %d of job %llu, which is over (run %d started)", l->hello_run,
               (unsigned long long)l->hello_job, r->cx.run_id);
      link_fail(l, b);
      continue;
    }
    l->paused = 0;
    pw_err err = {0};
    char b[512];
    if (pw_net_admit(l, r, &err)) link_fail(l, pw_err_str(&err, b, sizeof b));
  }
}

int pw_net_listen(pw_worker *w) {
  struct sockaddr_storage sa;
  if (uv_ip4_addr(w->listen_host, w->listen_port, (struct sockaddr_in *)&sa) &&
      uv_ip6_addr(w->listen_host, w->listen_port, (struct sockaddr_in6 *)&sa)) {
    pw_error("--listen: '%s' is not an IP address", w->listen_host);
    return -1;
  }
  uv_tcp_init(w->loop, &w->listener);
  w->listener.data = w;
  int rc = uv_tcp_bind(&w->listener, (struct sockaddr *)&sa, 0);
  if (!rc) rc = uv_listen((uv_stream_t *)&w->listener, 128, on_connection);
  if (rc) {
    pw_error("cannot listen on %s:%d: %s", w->listen_host, w->listen_port, uv_strerror(rc));
    return -1;
  }
  int len = sizeof sa;
  uv_tcp_getsockname(&w->listener, (struct sockaddr *)&sa, &len);
  w->listen_port = sa.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&sa)->sin_port)
                                           : ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
  return 0;
}

void pw_net_stop(pw_worker *w) {
  uv_close((uv_handle_t *)&w->listener, NULL);
  while (w->links) pw_link_close(w->links);
}

/* ---- outbound ----------------------------------------------------------- */

static void on_send_done(uv_write_t *req, int status) {
  pw_send *s = (pw_send *)req;
  pw_link *l = req->handle->data;
  if (status < 0 && status != UV_ECANCELED && !l->closing) link_fail(l, uv_strerror(status));
  if (s->run && s->hello && status == 0 && !l->closing && l->peer_rank >= 0) {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&l->tcp, &fd))
      pw_run_fail(s->run, "link to rank %d has no socket", l->peer_rank);
    else
      pw_run_on_link_up(s->run, l->peer_rank, fd);
  }
  if (s->pending) { /* before the run may be freed: serving waits on it */
    atomic_fetch_sub(s->pending, 1);
    if (s->run) pw_exec_wake(s->run);
  }
  if (s->run) pw_run_send_done(s->run, s->to, s->li, s->slot);
  free(s->owned);
  free(s);
}

/* Queues hdr + payload from byte `off` on l; hello: the run's link is up
 * once it is written. */
static int send_queue(pw_link *l, pw_run *run, const uint8_t hdr[PW_FRAME_HDR_SIZE], const void *payload,
                      uint64_t len, uint64_t off, int to, int li, int slot, int hello, atomic_int *pending,
                      void *owned) {
  pw_send *s = calloc(1, sizeof *s);
  if (!s) {
    free(owned);
    return PW_ENOMEM;
  }
  s->run = run;
  s->to = to;
  s->li = li;
  s->slot = slot;
  s->hello = hello;
  s->owned = owned;
  s->pending = pending;
  memcpy(s->hdr, hdr, PW_FRAME_HDR_SIZE);
  uv_buf_t bufs[2];
  int n = 0;
  if (off < PW_FRAME_HDR_SIZE) bufs[n++] = uv_buf_init((char *)s->hdr + off, (unsigned)(PW_FRAME_HDR_SIZE - off));
  uint64_t poff = off > PW_FRAME_HDR_SIZE ? off - PW_FRAME_HDR_SIZE : 0;
  if (len > poff) bufs[n++] = uv_buf_init((char *)payload + poff, (unsigned)(len - poff));
  int rc = uv_write(&s->req, (uv_stream_t *)&l->tcp, bufs, (unsigned)n, on_send_done);
  if (rc) {
    free(s->owned);
    free(s);
    return rc;
  }
  if (run) run->lp.sends_inflight++;
  return 0;
}

int pw_net_send_encoded(pw_link *l, pw_run *run, const uint8_t hdr[PW_FRAME_HDR_SIZE], const void *payload,
                        uint64_t len, uint64_t off, int to, int li, int slot, atomic_int *pending, void *owned) {
  return send_queue(l, run, hdr, payload, len, off, to, li, slot, 0, pending, owned);
}


/* Peers never send on our outbound links; reading them tells us at once
 * when the peer goes away. */
static void on_out_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  static char sink[64];
  *buf = uv_buf_init(sink, sizeof sink);
}

static void on_out_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  pw_link *l = s->data;
  if (n == 0) return;
  link_fail(l, n == UV_EOF ? "peer closed the link" : n < 0 ? uv_strerror((int)n) : "peer sent data on our outbound link");
}

static void on_drain_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  if (n < 0) pw_link_close(s->data);
}

void pw_link_drain(pw_link *l) {
  l->peer_rank = -1; /* its end is not a failure */
  l->draining = 1;
  if (l->closing) return;
  if (uv_read_start((uv_stream_t *)&l->tcp, on_out_alloc, on_drain_read)) pw_link_close(l);
  else link_deadline(l, l->w->held_timeout);
}

static void on_out_connect(uv_connect_t *req, int status) {
  pw_link *l = req->data;
  if (l->closing) return;
  if (status < 0) {
    link_fail(l, uv_strerror(status));
    return;
  }
  l->connected = 1;
  uv_tcp_nodelay(&l->tcp, 1);
  uv_read_start((uv_stream_t *)&l->tcp, on_out_alloc, on_out_read);
  pw_run *r = l->w->run;
  if (!r) {
    pw_link_close(l);
    return;
  }
  pw_frame_hdr h;
  uint8_t *hello = NULL, hdr[PW_FRAME_HDR_SIZE];
  if (pw_frame_hello_make(r->cx.job, (uint32_t)r->cx.run_id, (uint32_t)r->cx.rank, l->w->token, &h, &hello)) {
    link_fail(l, "cannot send HELLO");
    return;
  }
  /* The link counts as up once HELLO is written: from then on the run's
   * compute thread may write to the socket itself. */
  pw_frame_hdr_encode(&h, hello, hdr);
  if (send_queue(l, r, hdr, hello, h.payload_len, 0, -1, -1, -1, 1, NULL, hello)) link_fail(l, "cannot send HELLO");
}

pw_link *pw_net_connect(pw_worker *w, const char *addr, int peer_rank) {
  char host[64];
  int port = 0;
  struct sockaddr_storage sa;
  if (pw_addr_split(addr, host, sizeof host, &port) || port == 0 ||
      (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) && uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa)))
    return NULL;
  pw_link *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->w = w;
  l->outbound = 1;
  l->peer_rank = peer_rank;
  snprintf(l->addr, sizeof l->addr, "%s", addr);
  pw_frame_reader_init(&l->reader, 0);
  uv_tcp_init(w->loop, &l->tcp);
  l->tcp.data = l;
  l->connect_req.data = l;
  l->next = w->links;
  w->links = l;
  if (uv_tcp_connect(&l->connect_req, &l->tcp, (struct sockaddr *)&sa, on_out_connect)) {
    pw_link_close(l);
    return NULL;
  }
  return l;
}
