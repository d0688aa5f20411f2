/* bench_coll: the raw-socket bound under a worker's data-parallel exchange
 * (issue 17's "dp all-reduce time vs the raw-socket bound"; bench/dp.py).
 *
 *   bench_coll K N ROUNDS
 *
 * Forks K processes, connected pairwise over 127.0.0.1 TCP (TCP_NODELAY, as
 * the worker sets), each holding N floats, and times ROUNDS all-reduces in
 * worker/dpx.c's pattern with nothing else: member j owns shard j
 * (collective.h's ranges); every member streams shard j of its buffer to
 * j; j adds the K copies in member order (pw_reduce_ordered) a chunk of
 * PW_COLL_CHUNK floats at a time, as soon as every copy of that chunk is
 * in, and streams each summed chunk to the others, who write it into
 * place. Every member sends pw_coll_bytes_rs_ag(N, K, me) bytes, as a
 * worker's dp_bytes says. Unlike a worker: no frame headers, no CRC, no
 * loop thread; every socket is non-blocking and busy-polled by the one
 * thread (no sleep, no wake-up; a poll that moved nothing yields the core,
 * so members sharing a core take turns), so it is the fastest this pattern
 * moves on this host. Each round starts after a
 * 1-byte barrier among all members; a round's time is the slowest member's;
 * one untimed round first.
 *
 * Prints one JSON line: {"k", "n", "rounds", "bytes_sent" (per member),
 * "seconds": [per round], "median", "min", "max"}. */
#include <errno.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "collective.h"

#define K_MAX 16

static void die(const char *what) {
  perror(what);
  exit(1);
}

static int g_k, g_me;
static size_t g_n;
static int g_fd[K_MAX]; /* to each other member */

/* One direction of a link: a byte stream of two parts, the reduce-scatter
 * (the shard the receiver owns) then the all-gather (the sender's summed
 * shard). Sends of the second part may only go as far as `ready` bytes. */
typedef struct {
  char *p1, *p2;
  size_t n1, n2, done, ready;
} stream;

static size_t pump(int fd, stream *s, int tx) {
  size_t total = s->n1 + s->n2, lim = tx ? s->n1 + s->ready : total;
  if (s->done >= lim) return 0;
  char *p = s->done < s->n1 ? s->p1 + s->done : s->p2 + (s->done - s->n1);
  size_t len = s->done < s->n1 ? s->n1 - s->done : lim - s->done;
  ssize_t k = tx ? send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL) : recv(fd, p, len, MSG_DONTWAIT);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  if (k <= 0) die(tx ? "send" : "recv");
  s->done += (size_t)k;
  return (size_t)k;
}

static void barrier(void) {
  char c = 'b';
  for (int j = 0; j < g_k; j++)
    if (j != g_me && send(g_fd[j], &c, 1, MSG_NOSIGNAL) != 1) die("barrier send");
  for (int j = 0; j < g_k; j++)
    if (j != g_me)
      for (;;) {
        ssize_t k = recv(g_fd[j], &c, 1, MSG_DONTWAIT);
        if (k == 1) break;
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) die("barrier recv");
      }
}

/* One all-reduce of buf[n]: rx[j] receives shard me from j; out our sum. */
static void allreduce(float *buf, float **rx, float *out) {
  size_t lo[K_MAX], hi[K_MAX];
  for (int j = 0; j < g_k; j++) pw_shard_range(g_n, g_k, j, &lo[j], &hi[j]);
  size_t mine = hi[g_me] - lo[g_me];
  stream tx[K_MAX] = {{0}}, rxs[K_MAX] = {{0}};
  for (int j = 0; j < g_k; j++) {
    if (j == g_me) continue;
    tx[j] = (stream){(char *)(buf + lo[j]), (char *)out, (hi[j] - lo[j]) * 4, mine * 4, 0, 0};
    rxs[j] = (stream){(char *)rx[j], (char *)(buf + lo[j]), mine * 4, (hi[j] - lo[j]) * 4, 0, 0};
  }
  int chunks = pw_chunk_count(mine, PW_COLL_CHUNK), summed = 0;
  for (;;) {
    int busy = 0;
    size_t moved = 0;
    for (int j = 0; j < g_k; j++) {
      if (j == g_me) continue;
      moved += pump(g_fd[j], &tx[j], 1) + pump(g_fd[j], &rxs[j], 0);
      busy |= tx[j].done < tx[j].n1 + tx[j].n2 || rxs[j].done < rxs[j].n1 + rxs[j].n2;
    }
    if (!moved) sched_yield(); /* a peer sharing our core runs now; no sleep, no wake-up */
    /* the next chunk of our shard, once every copy of it is in */
    while (summed < chunks) {
      size_t a = (size_t)summed * PW_COLL_CHUNK, b = a + PW_COLL_CHUNK < mine ? a + PW_COLL_CHUNK : mine;
      int in = 1;
      for (int j = 0; j < g_k; j++) in &= j == g_me || rxs[j].done >= b * 4;
      if (!in) break;
      const float *src[K_MAX];
      for (int j = 0; j < g_k; j++) src[j] = j == g_me ? buf + lo[g_me] + a : rx[j] + a;
      pw_reduce_ordered(out + a, src, g_k, b - a);
      memcpy(buf + lo[g_me] + a, out + a, (b - a) * 4);
      for (int j = 0; j < g_k; j++) tx[j].ready = b * 4;
      summed++;
      busy = 1;
    }
    if (!busy && summed == chunks) return;
  }
}

static int listen_any(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, K_MAX)) die("listen");
  getsockname(fd, (struct sockaddr *)&sa, &len);
  *port = ntohs(sa.sin_port);
  return fd;
}

static void nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Member me: connect to the members after it, accept the ones before it
 * (each connector says who it is), run the rounds, write each round's
 * seconds to wfd. */
static void member(int me, const int *lfd, const int *port, int rounds, int wfd) {
  g_me = me;
  for (int j = me + 1; j < g_k; j++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port[j]),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) die("connect");
    if (write(fd, &me, sizeof me) != sizeof me) die("hello");
    nodelay(fd);
    g_fd[j] = fd;
  }
  for (int i = 0; i < me; i++) {
    int fd = accept(lfd[me], NULL, NULL), who = -1;
    if (fd < 0 || read(fd, &who, sizeof who) != sizeof who || who < 0 || who >= me) die("accept");
    nodelay(fd);
    g_fd[who] = fd;
  }
  size_t smax = pw_shard_max(g_n, g_k);
  float *buf = malloc(g_n * 4), *out = malloc(smax * 4), *rx[K_MAX] = {0};
  if (!buf || !out) die("malloc");
  for (int j = 0; j < g_k; j++)
    if (j != me && !(rx[j] = malloc(smax * 4))) die("malloc");
  for (int r = -1; r < rounds; r++) { /* round -1 warms the links up (TCP's slow start), untimed */
    for (size_t i = 0; i < g_n; i++) buf[i] = (float)((i * 7 + (size_t)me) % 13) * 0.25f; /* sums stay finite */
    barrier();
    double t0 = bench_now();
    allreduce(buf, rx, out);
    double dt = bench_now() - t0;
    if (r >= 0 && write(wfd, &dt, sizeof dt) != sizeof dt) die("report");
  }
  barrier(); /* nobody closes a link another is still reading */
  _exit(0);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: bench_coll K N ROUNDS  (K processes, N floats each)\n");
    return 2;
  }
  g_k = atoi(argv[1]);
  g_n = (size_t)strtoull(argv[2], NULL, 10);
  int rounds = atoi(argv[3]);
  if (g_k < 2 || g_k > K_MAX || g_n < (size_t)g_k || rounds < 1) {
    fprintf(stderr, "bench_coll: K in 2..%d, N >= K, ROUNDS >= 1\n", K_MAX);
    return 2;
  }
  int lfd[K_MAX], port[K_MAX], pfd[K_MAX][2];
  pid_t pid[K_MAX];
  for (int j = 0; j < g_k; j++) lfd[j] = listen_any(&port[j]);
  for (int j = 0; j < g_k; j++) {
    if (pipe(pfd[j])) die("pipe");
    if ((pid[j] = fork()) < 0) die("fork");
    if (pid[j] == 0) {
      close(pfd[j][0]);
      member(j, lfd, port, rounds, pfd[j][1]);
    }
    close(pfd[j][1]);
  }
  double *sec = calloc((size_t)rounds, sizeof *sec);
  for (int j = 0; j < g_k; j++)
    for (int r = 0; r < rounds; r++) {
      double dt;
      if (read(pfd[j][0], &dt, sizeof dt) != sizeof dt) die("a member's report");
      if (dt > sec[r]) sec[r] = dt;
    }
  int bad = 0;
  for (int j = 0; j < g_k; j++) {
    int st = 0;
    waitpid(pid[j], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st);
  }
  if (bad) {
    fprintf(stderr, "bench_coll: a member failed\n");
    return 1;
  }
  printf("{\"k\": %d, \"n\": %zu, \"rounds\": %d, \"bytes_sent\": [", g_k, g_n, rounds);
  for (int j = 0; j < g_k; j++) printf("%s%llu", j ? ", " : "", (unsigned long long)pw_coll_bytes_rs_ag(g_n, g_k, j));
  printf("], \"seconds\": [");
  for (int r = 0; r < rounds; r++) printf("%s%.6f", r ? ", " : "", sec[r]);
  qsort(sec, (size_t)rounds, sizeof *sec, bench_cmp_double);
  printf("], \"median\": %.6f, \"min\": %.6f, \"max\": %.6f}\n", sec[rounds / 2], sec[0], sec[rounds - 1]);
  free(sec);
  return 0;
}
