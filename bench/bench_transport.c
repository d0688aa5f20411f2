/* bench_transport: pipewright's data-plane transport against a raw socket
 * stream between two processes on loopback (issue 8, case 5), and the
 * blocking wake-up cost between processes (the floor under case 4).
 *
 *   bench_transport pw   SIZE ITERS [stream]   libuv + PWF1 frames (wire.h)
 *   bench_transport raw  SIZE ITERS [stream]   blocking send/recv, same bytes
 *   bench_transport wake ITERS                 pipe ping-pong between processes
 *   bench_transport wakeidle ITERS             wake-up of a process blocked for 1 ms
 *
 * pw and raw fork a receiver; the sender connects over 127.0.0.1 TCP
 * (TCP_NODELAY, as the worker sets) and sends ITERS messages of a 64-byte
 * header plus SIZE payload bytes. Ping-pong (default): the receiver answers
 * every message with one byte and the sender waits for it, so a message's
 * time is one hop plus a 1-byte return. stream: messages back to back, one
 * answer after the last. pw does what a worker does: the sender encodes a
 * PWF1 header with the payload's crc32c and writes header + payload with one
 * uv_try_write, queuing a uv_write only for what the socket did not take
 * (send_bufs, as worker/net.c's pw_net_send_encoded); the receiver reads
 * with libuv through pw_frame_reader straight into a destination buffer
 * (set_dest), CRC checked as bytes arrive, waiting for large payloads in
 * big pieces (rx_lowat: SO_RCVLOWAT), and answers the same way. raw copies
 * the same bytes with blocking write()/read() on default sockets and checks
 * nothing.
 *
 * Prints one JSON line: {"mode", "size", "iters", "seconds", "us_per_msg",
 * "gbytes_per_s"}. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "wire.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static size_t g_size;
static int g_iters, g_stream;

static int listen_any(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 4)) die("listen");
  getsockname(fd, (struct sockaddr *)&sa, &len);
  *port = ntohs(sa.sin_port);
  return fd;
}

static int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) die("connect");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static void write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die("write");
    c += k;
    n -= (size_t)k;
  }
}

static void read_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t k = read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die("read");
    c += k;
    n -= (size_t)k;
  }
}

/* ---- raw ---------------------------------------------------------------- */

static void raw_recv(int lfd) {
  int fd = accept(lfd, NULL, NULL), one = 1;
  if (fd < 0) die("accept");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char *buf = malloc(g_size + PW_FRAME_HDR_SIZE);
  for (int i = 0; i < g_iters; i++) {
    read_all(fd, buf, g_size + PW_FRAME_HDR_SIZE);
    if (!g_stream || i == g_iters - 1) write_all(fd, "k", 1);
  }
  free(buf);
  close(fd);
}

static double raw_send(int port) {
  int fd = connect_to(port);
  char *buf = malloc(g_size + PW_FRAME_HDR_SIZE), ack;
  memset(buf, 1, g_size + PW_FRAME_HDR_SIZE);
  double t0 = now();
  for (int i = 0; i < g_iters; i++) {
    write_all(fd, buf, g_size + PW_FRAME_HDR_SIZE);
    if (!g_stream || i == g_iters - 1) read_all(fd, &ack, 1);
  }
  double dt = now() - t0;
  free(buf);
  close(fd);
  return dt;
}

/* ---- pw: libuv + wire.h, as the worker ---------------------------------- */

typedef struct {
  uv_loop_t loop;
  uv_tcp_t server, conn;
  pw_frame_reader rd;
  float *dest;
  int got;
  uint8_t hdr[PW_FRAME_HDR_SIZE];
  int acks;
  float *payload;
  int sent;
  double t0, t1;
  char ackbuf[16];
  int lowat; /* the receiver's SO_RCVLOWAT now */
} pw_side;

static void on_close(uv_handle_t *h) { (void)h; }

static void rx_alloc(uv_handle_t *h, size_t sug, uv_buf_t *b) {
  pw_side *s = h->data;
  void *base;
  size_t len;
  pw_frame_reader_next_buf(&s->rd, &base, &len);
  if (len > (1u << 30)) len = 1u << 30;
  *b = uv_buf_init(base, (unsigned)len);
}

static void ack_done(uv_write_t *w, int st) { free(w); }

/* Writes bufs as a worker sends a frame (worker/net.c): uv_try_write first,
 * and a uv_write (w, cb) only for what the socket did not take. A frame
 * that fits the send buffer then costs one writev: no request, no pass
 * through libuv's pending queue and no epoll_ctl for the POLLOUT interest
 * libuv arms and drops around every queued write. Returns 0 when all was
 * written (cb will not run), 1 when the rest is queued (cb will run). */
static int send_bufs(uv_stream_t *st, uv_buf_t *bufs, unsigned nbufs, uv_write_t *w, uv_write_cb cb) {
  int k = uv_try_write(st, bufs, nbufs);
  if (k < 0 && k != UV_EAGAIN) die("uv_try_write");
  size_t done = k > 0 ? (size_t)k : 0;
  while (nbufs && done >= bufs->len) {
    done -= bufs->len;
    bufs++;
    nbufs--;
  }
  if (!nbufs) return 0;
  bufs->base += done;
  bufs->len -= done;
  if (uv_write(w, st, bufs, nbufs, cb)) die("uv_write");
  return 1;
}

/* The receiver waits for a large payload in big pieces, as a worker's
 * inbound link does: SO_RCVLOWAT = LOWAT while at least LOWAT bytes of the
 * frame are missing, else the default 1. The loop then wakes and reads once
 * per LOWAT bytes instead of once per 64 KiB segment, and a sender on the
 * same CPU is not preempted by a wake-up for every segment: ~1.2-1.4x the
 * raw stream at 16 MiB on the CI machines, instead of ~0.8. Never more than
 * the frame still needs, or its last bytes would not wake us. Smaller
 * marks (256 KiB, 1 MiB, or a whole 1 MiB frame) and a fixed SO_RCVBUF were
 * measured too: up to 2x slower at 1 MiB when both processes share a CPU
 * (the whole frame in flight no longer fits the cache), and setting a mark
 * clamps the window to it on an autotuned buffer. */
#define LOWAT (4 << 20)

static void rx_lowat(pw_side *s, uv_stream_t *st) {
  int v = pw_frame_reader_missing(&s->rd) >= LOWAT ? LOWAT : 1;
  uv_os_fd_t fd;
  if (v == s->lowat || uv_fileno((uv_handle_t *)st, &fd)) return;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v)) die("SO_RCVLOWAT");
  s->lowat = v;
}

static void rx_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  pw_side *s = st->data;
  if (n == 0) return;
  if (n < 0) {
    uv_close((uv_handle_t *)st, on_close);
    uv_close((uv_handle_t *)&s->server, on_close);
    return;
  }
  pw_frame_event ev;
  pw_err err = {0};
  int rc = pw_frame_reader_advance(&s->rd, (size_t)n, &ev, &err);
  if (rc == PW_FRAME_HEADER) {
    pw_frame_reader_set_dest(&s->rd, s->dest);
  } else if (rc == PW_FRAME_DONE) {
    s->got++;
    if (!g_stream || s->got == g_iters) {
      uv_write_t *w = malloc(sizeof *w);
      uv_buf_t ab = uv_buf_init("k", 1);
      if (!send_bufs(st, &ab, 1, w, ack_done)) free(w);
    }
  } else if (rc < 0) {
    char m[256];
    fprintf(stderr, "bench_transport: %s\n", pw_err_str(&err, m, sizeof m));
    exit(1);
  }
  rx_lowat(s, st);
}

static void on_conn(uv_stream_t *srv, int status) {
  pw_side *s = srv->data;
  uv_tcp_init(&s->loop, &s->conn);
  s->conn.data = s;
  if (uv_accept(srv, (uv_stream_t *)&s->conn)) die("uv_accept");
  uv_tcp_nodelay(&s->conn, 1);
  s->lowat = 1;
  uv_read_start((uv_stream_t *)&s->conn, rx_alloc, rx_read);
}

static void pw_recv(int lfd) {
  pw_side s = {0};
  uv_loop_init(&s.loop);
  pw_frame_reader_init(&s.rd, g_size + 1);
  s.dest = malloc(g_size ? g_size : 1);
  uv_tcp_init(&s.loop, &s.server);
  s.server.data = &s;
  if (uv_tcp_open(&s.server, lfd) || uv_listen((uv_stream_t *)&s.server, 4, on_conn)) die("uv_listen");
  uv_run(&s.loop, UV_RUN_DEFAULT);
  if (s.got != g_iters) {
    fprintf(stderr, "bench_transport: receiver got %d of %d frames\n", s.got, g_iters);
    exit(1);
  }
  pw_frame_reader_free(&s.rd);
  free(s.dest);
  uv_loop_close(&s.loop);
}

static void tx_next(pw_side *s);

static void tx_written(uv_write_t *w, int st) {
  pw_side *s = w->data;
  free(w);
  if (st < 0) die("uv_write");
  if (g_stream && s->sent < g_iters) tx_next(s);
}

static void tx_alloc(uv_handle_t *h, size_t sug, uv_buf_t *b) {
  pw_side *s = h->data;
  *b = uv_buf_init(s->ackbuf, sizeof s->ackbuf);
}

static void tx_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  pw_side *s = st->data;
  if (n <= 0) return;
  s->acks += (int)n;
  if (g_stream || s->acks >= g_iters) {
    s->t1 = now();
    uv_close((uv_handle_t *)st, on_close);
    return;
  }
  tx_next(s);
}

/* Sends the next frame; in stream mode goes on while the socket takes
 * frames whole, else tx_written continues. */
static void tx_next(pw_side *s) {
  do {
    pw_frame_hdr h;
    uint32_t dims[1] = {(uint32_t)(g_size / 4)};
    pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, (uint32_t)s->sent, 1, 0, PW_DTYPE_F32, 1, dims);
    pw_frame_hdr_encode(&h, s->payload, s->hdr);
    s->sent++;
    uv_write_t *w = malloc(sizeof *w);
    uv_buf_t bufs[2] = {uv_buf_init((char *)s->hdr, PW_FRAME_HDR_SIZE),
                        uv_buf_init((char *)s->payload, (unsigned)g_size)};
    w->data = s;
    if (send_bufs((uv_stream_t *)&s->conn, bufs, g_size ? 2 : 1, w, tx_written)) return;
    free(w);
  } while (g_stream && s->sent < g_iters);
}

static void on_connected(uv_connect_t *c, int status) {
  pw_side *s = c->data;
  if (status < 0) die("uv_connect");
  uv_tcp_nodelay(&s->conn, 1);
  uv_read_start((uv_stream_t *)&s->conn, tx_alloc, tx_read);
  s->t0 = now();
  tx_next(s);
}

static double pw_send(int port) {
  pw_side s = {0};
  uv_connect_t creq;
  struct sockaddr_in sa;
  uv_loop_init(&s.loop);
  s.payload = malloc(g_size ? g_size : 1);
  for (size_t i = 0; i < g_size / 4; i++) s.payload[i] = (float)i;
  uv_tcp_init(&s.loop, &s.conn);
  s.conn.data = &s;
  creq.data = &s;
  uv_ip4_addr("127.0.0.1", port, &sa);
  uv_tcp_connect(&creq, &s.conn, (struct sockaddr *)&sa, on_connected);
  uv_run(&s.loop, UV_RUN_DEFAULT);
  free(s.payload);
  uv_loop_close(&s.loop);
  return s.t1 - s.t0;
}

/* ---- wake-up: pipe ping-pong between two processes ---------------------- */

static double wake(int iters) {
  int a[2], b[2];
  char c = 'x';
  if (pipe(a) || pipe(b)) die("pipe");
  pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0; i < iters; i++) {
      read_all(a[0], &c, 1);
      write_all(b[1], &c, 1);
    }
    _exit(0);
  }
  double t0 = now();
  for (int i = 0; i < iters; i++) {
    write_all(a[1], &c, 1);
    read_all(b[0], &c, 1);
  }
  double dt = now() - t0;
  waitpid(pid, NULL, 0);
  return dt;
}

/* One-way wake-up latency of a process that has been blocked for about
 * 1 ms (its CPU idle meanwhile, as a worker's loop thread is while its
 * compute runs): the parent spins 1 ms, stamps CLOCK_MONOTONIC, writes the
 * stamp; the child, blocked in read(), takes the difference. Median. */
static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double wake_idle(int iters) {
  int a[2], b[2];
  if (pipe(a) || pipe(b)) die("pipe");
  pid_t pid = fork();
  if (pid == 0) {
    double *d = malloc(sizeof *d * (size_t)iters), t;
    for (int i = 0; i < iters; i++) {
      read_all(a[0], &t, sizeof t);
      d[i] = now() - t;
    }
    qsort(d, (size_t)iters, sizeof *d, cmp_d);
    write_all(b[1], &d[iters / 2], sizeof *d);
    _exit(0);
  }
  double med = 0;
  for (int i = 0; i < iters; i++) {
    double t0 = now();
    while (now() - t0 < 1e-3) {
    }
    double t = now();
    write_all(a[1], &t, sizeof t);
  }
  read_all(b[0], &med, sizeof med);
  waitpid(pid, NULL, 0);
  return med;
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "wakeidle")) {
    int iters = atoi(argv[2]);
    printf("{\"mode\": \"wakeidle\", \"iters\": %d, \"us_per_wakeup\": %.3f}\n", iters, wake_idle(iters) * 1e6);
    return 0;
  }
  if (argc >= 3 && !strcmp(argv[1], "wake")) {
    int iters = atoi(argv[2]);
    double dt = wake(iters);
    printf("{\"mode\": \"wake\", \"iters\": %d, \"seconds\": %.6f, \"us_per_wakeup\": %.3f}\n", iters, dt,
           dt / (2.0 * iters) * 1e6);
    return 0;
  }
  if (argc < 4 || (strcmp(argv[1], "pw") && strcmp(argv[1], "raw"))) {
    fprintf(stderr, "usage: bench_transport pw|raw SIZE ITERS [stream] | wake ITERS\n");
    return 2;
  }
  int pw = !strcmp(argv[1], "pw");
  g_size = (size_t)atol(argv[2]) & ~(size_t)3;
  g_iters = atoi(argv[3]);
  g_stream = argc > 4 && !strcmp(argv[4], "stream");
  int port, lfd = listen_any(&port);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    if (pw)
      pw_recv(lfd);
    else
      raw_recv(lfd);
    _exit(0);
  }
  close(lfd);
  double dt = pw ? pw_send(port) : raw_send(port);
  int st = 0;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st)) {
    fprintf(stderr, "bench_transport: receiver failed\n");
    return 1;
  }
  printf("{\"mode\": \"%s\", \"stream\": %s, \"size\": %zu, \"iters\": %d, \"seconds\": %.6f, "
         "\"us_per_msg\": %.3f, \"gbytes_per_s\": %.4f}\n",
         argv[1], g_stream ? "true" : "false", g_size, g_iters, dt, dt / g_iters * 1e6,
         (double)g_size * g_iters / dt * 1e-9);
  return 0;
}
