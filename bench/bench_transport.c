/* bench_transport: pipewright's data-plane transport against a raw socket
 * stream between two processes on loopback (issue 8, case 5), and the
 * blocking wake-up cost between processes (the floor under case 4).
 *
 *   bench_transport pw   SIZE ITERS [stream]   PWF1 frames, as a worker sends them
 *   bench_transport raw  SIZE ITERS [stream]   blocking send/recv, same bytes
 *   bench_transport spin SIZE ITERS [stream]   raw, but both ends busy-poll
 *                                              non-blocking sockets (no sleep)
 *   bench_transport wake ITERS                 pipe ping-pong between processes
 *   bench_transport wakeidle ITERS             wake-up of a process blocked for 1 ms
 *
 * pw and raw fork a receiver; the sender connects over 127.0.0.1 TCP
 * (TCP_NODELAY, as the worker sets) and sends ITERS messages of a 64-byte
 * header plus SIZE payload bytes. Ping-pong (default): the receiver answers
 * every message with one byte and the sender waits for it, so a message's
 * time is one hop plus a 1-byte return. stream: messages back to back, one
 * answer after the last. pw does what a worker's compute thread does: the
 * sender encodes a PWF1 header with the payload's crc32c and writes header
 * + payload with one non-blocking sendmsg (a message over the worker's
 * chunk limit, PW_FRAME_CHUNK_DEFAULT = 256 KiB or PW_WIRE_CHUNK, as chunk
 * frames, each CRC'd just before it goes), waiting for the socket only for
 * what it did not take (worker/exec.c pw_exec_send; the worker's loop
 * thread writes that rest); the receiver reads at most 256 KiB at a time
 * without blocking through pw_frame_reader straight into a destination
 * buffer, CRC checked as bytes arrive, polling the socket while nothing
 * comes for up to 1 ms (yielding the core between polls),
 * then sleeping in poll() (worker/recv.c). raw copies the same bytes with
 * blocking write()/read() on default sockets and checks nothing; spin does
 * the same with non-blocking calls retried in a busy loop, so neither end
 * ever sleeps: the fastest raw path when a core is free to burn, and the
 * bound pw is compared with besides raw.
 *
 * Prints one JSON line: {"mode", "size", "iters", "seconds", "us_per_msg",
 * "gbytes_per_s"}. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>


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

static size_t g_size, g_chunk = PW_FRAME_CHUNK_DEFAULT; /* the worker's chunk limit (or PW_WIRE_CHUNK) */
static int g_iters, g_stream;
/* recv.c: poll the socket for up to this long before sleeping; read at
 * most this much at once */
#define SPIN_SECONDS_MAX 1e-3
#define RECV_PIECE ((size_t)256 << 10)
static double g_spin_s = SPIN_SECONDS_MAX;

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

/* spin: retry non-blocking calls without ever sleeping */
static int g_spin;

static void write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t k = g_spin ? send(fd, c, n, MSG_DONTWAIT | MSG_NOSIGNAL) : write(fd, c, n);
    if (k < 0 && (errno == EINTR || (g_spin && (errno == EAGAIN || errno == EWOULDBLOCK)))) continue;
    if (k <= 0) die("write");
    c += k;
    n -= (size_t)k;
  }
}

static void read_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t k = g_spin ? recv(fd, c, n, MSG_DONTWAIT) : read(fd, c, n);
    if (k < 0 && (errno == EINTR || (g_spin && (errno == EAGAIN || errno == EWOULDBLOCK)))) continue;
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

/* ---- pw: what a worker's compute thread does (worker/exec.c, recv.c) ---- */

/* recv.c's wait: a non-blocking read; while nothing comes, poll the socket
 * again for up to g_spin_s (yielding the core between polls), then sleep in
 * poll(). Returns bytes read (> 0). */
static size_t recv_wait(int fd, void *buf, size_t len) {
  double spin_until = 0;
  for (;;) {
    ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
    if (n > 0) return (size_t)n;
    if (n == 0) die("peer closed");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die("recv");
    double t = now();
    if (spin_until == 0) spin_until = t + g_spin_s;
    if (t < spin_until) {
      sched_yield();
      continue;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, -1);
    spin_until = 0;
  }
}

/* exec.c's send: header (payload CRC computed here) + payload in one
 * non-blocking sendmsg; what the socket does not take, the worker's loop
 * writes when the socket is writable again: here, poll + sendmsg. */
static void pw_send_frame(int fd, const uint8_t *hdr, const void *payload, size_t len) {
  size_t total = PW_FRAME_HDR_SIZE + len, off = 0;
  while (off < total) {
    struct iovec iov[2];
    int n_iov = 0;
    if (off < PW_FRAME_HDR_SIZE) iov[n_iov++] = (struct iovec){(void *)(hdr + off), PW_FRAME_HDR_SIZE - off};
    size_t poff = off > PW_FRAME_HDR_SIZE ? off - PW_FRAME_HDR_SIZE : 0;
    if (len > poff) iov[n_iov++] = (struct iovec){(char *)payload + poff, len - poff};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
    ssize_t n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      off += (size_t)n;
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die("sendmsg");
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    poll(&p, 1, -1);
  }
}

static void pw_recv(int lfd) {
  int fd = accept(lfd, NULL, NULL), one = 1;
  if (fd < 0) die("accept");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  pw_frame_reader rd;
  pw_frame_reader_init(&rd, g_size + 1);
  float *dest = malloc(g_size ? g_size : 1);
  for (int got = 0; got < g_iters;) {
    void *buf;
    size_t len;
    pw_frame_reader_next_buf(&rd, &buf, &len);
    if (!len) die("frame reader");
    if (len > RECV_PIECE) len = RECV_PIECE;
    size_t n = recv_wait(fd, buf, len);
    pw_frame_event ev;
    pw_err err = {0};
    int rc = pw_frame_reader_advance(&rd, n, &ev, &err);
    if (rc < 0) die(err.msg);
    if (rc == PW_FRAME_HEADER && pw_frame_reader_set_dest(&rd, dest)) die("set_dest");
    if (rc == PW_FRAME_DONE && (++got, !g_stream || got == g_iters)) write_all(fd, "k", 1);
  }
  pw_frame_reader_free(&rd);
  free(dest);
  close(fd);
}

static double pw_send(int port) {
  int fd = connect_to(port);
  float *payload = malloc(g_size ? g_size : 1);
  for (size_t i = 0; i < g_size / 4; i++) payload[i] = (float)i;
  uint8_t hdr[PW_FRAME_HDR_SIZE];
  char ack;
  double t0 = now();
  for (int i = 0; i < g_iters; i++) {
    pw_frame_hdr h;
    uint32_t dims[1] = {(uint32_t)(g_size / 4)};
    int rc = pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, (uint32_t)i, 1, 0, PW_DTYPE_F32, 1, dims);
    if (rc) {
      fprintf(stderr, "bench_transport: frame header for %zu bytes: %s\n", g_size, pw_strerror(rc));
      exit(1);
    }
    /* over the worker's chunk limit, chunk frames, each CRC'd just before it goes (exec.c send_chunked) */
    pw_frame_hdr c = h;
    uint64_t off = 0;
    do {
      if (h.payload_len > g_chunk && pw_frame_chunk(&h, g_chunk, off, &c)) die("pw_frame_chunk");
      pw_frame_hdr_encode(&c, (const uint8_t *)payload + off, hdr);
      pw_send_frame(fd, hdr, (const uint8_t *)payload + off, c.payload_len);
      off += c.payload_len;
    } while (off < h.payload_len);
    if (!g_stream || i == g_iters - 1) recv_wait(fd, &ack, 1);
  }
  double dt = now() - t0;
  free(payload);
  close(fd);
  return dt;
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
  if (argc < 4 || (strcmp(argv[1], "pw") && strcmp(argv[1], "raw") && strcmp(argv[1], "spin"))) {
    fprintf(stderr, "usage: bench_transport pw|raw|spin SIZE ITERS [stream] | wake ITERS | wakeidle ITERS\n");
    return 2;
  }
  int pw = !strcmp(argv[1], "pw");
  g_spin = !strcmp(argv[1], "spin");
  g_size = (size_t)atol(argv[2]) & ~(size_t)3;
  if (g_size > PW_FRAME_MAX_PAYLOAD) { /* a u32 dim of floats */
    fprintf(stderr, "bench_transport: SIZE must be at most %u\n", PW_FRAME_MAX_PAYLOAD);
    return 2;
  }
  g_iters = atoi(argv[3]);
  const char *ch = getenv("PW_WIRE_CHUNK");
  if (ch && *ch) g_chunk = (size_t)strtoull(ch, NULL, 10);
  if (!g_chunk) g_chunk = PW_FRAME_CHUNK_DEFAULT;
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
