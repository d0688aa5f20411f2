/* fuzz_http: the coordinator's HTTP request path on any bytes.
 *
 * A real HTTP server (coordinator/http.c on libmicrohttpd, the route table,
 * every handler, a real store in a temporary directory) runs in this
 * process; each input is sent as the raw bytes of one connection, and the
 * first answer read to its end. What must hold:
 * nothing crashes or leaks; an answer, when there is one, is HTTP with a
 * status; and the server keeps answering another client address: every
 * 64 inputs, and after any
 * input that got no answer (an incomplete request, or a handler slower
 * than the harness waits), GET /healthz must give 200. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <strings.h>
#include <sys/time.h>
#include <unistd.h>

#include "coord.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static pw_coord C;
static char dir[64];

/* Complete: the headers and as many body bytes as Content-Length says. */
static int complete(const char *buf, size_t len) {
  const char *eoh = strstr(buf, "\r\n\r\n");
  if (!eoh) return 0;
  const char *cl = strcasestr(buf, "\r\nContent-Length:");
  if (!cl || cl > eoh) return 1;
  return len >= (size_t)(eoh + 4 - buf) + strtoull(cl + 17, NULL, 10);
}

/* Sends n bytes on a new connection from 127.0.0.<src> and reads the first
 * answer (at most cap - 1 bytes kept) until it is complete, the
 * server closes, or wait_ms pass without a byte (an incomplete request:
 * the server would wait for the rest until its idle timeout, so the
 * harness hangs up instead). Returns the bytes read. */
static size_t exchange(const void *req, size_t n, char *out, size_t cap, int wait_ms, int src) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) abort();
  struct sockaddr_in me = {.sin_family = AF_INET};
  me.sin_addr.s_addr = htonl(0x7f000000u | (unsigned)src);
  if (bind(fd, (struct sockaddr *)&me, sizeof me)) abort();
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)C.http_port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) abort();
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  for (size_t off = 0; off < n;) {
    ssize_t k = send(fd, (const char *)req + off, n - off, MSG_NOSIGNAL);
    if (k <= 0) break; /* the server may stop reading: its answer still counts */
    off += (size_t)k;
  }
  /* No shutdown(SHUT_WR): libmicrohttpd 0.9.75 keeps a connection whose
   * client half-closed until its idle timeout, even after the close. */
  size_t len = 0;
  out[0] = 0;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, wait_ms) <= 0) break;
    char tmp[4096];
    ssize_t k = recv(fd, tmp, sizeof tmp, 0);
    if (k <= 0) break;
    size_t take = (size_t)k < cap - 1 - len ? (size_t)k : cap - 1 - len;
    memcpy(out + len, tmp, take);
    len += take;
    out[len] = 0;
    if (complete(out, len)) break;
  }
  close(fd);
  return len;
}

static void check_alive(void) {
  static const char hz[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  char buf[4096];
  /* From another address: the fuzzed connections may fill 127.0.0.1's
   * share (--http-max-conns-per-ip), which must not lock others out. */
  if (exchange(hz, sizeof hz - 1, buf, sizeof buf, 10000, 2) < 12 || strncmp(buf, "HTTP/1.1 200", 12)) {
    fprintf(stderr, "the server stopped answering /healthz: %.200s\n", buf);
    abort();
  }
}

static void stop(void) {
  pw_http_stop(&C);
  for (int i = 0; i < C.n_stores; i++) pw_store_close(C.stores[i]);
  free(C.stores);
  free(C.workers);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) fprintf(stderr, "fuzz_http: could not remove %s\n", dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  snprintf(dir, sizeof dir, "/tmp/pw-fuzz-http-XXXXXX");
  if (!mkdtemp(dir)) abort();
  char web[96];
  snprintf(web, sizeof web, "%s/web", dir);
  mkdir(web, 0700);
  pthread_mutex_init(&C.mu, NULL);
  snprintf(C.http_host, sizeof C.http_host, "127.0.0.1");
  snprintf(C.db_path, sizeof C.db_path, "%s/coord.db", dir);
  snprintf(C.web_dir, sizeof C.web_dir, "%s", web);
  snprintf(C.state_dir, sizeof C.state_dir, "%s", dir);
  C.max_body = 64 * 1024;
  pw_err err = {0};
  if (pw_http_start(&C, &err)) {
    fprintf(stderr, "pw_http_start: %s\n", err.msg);
    abort();
  }
  atexit(stop);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static unsigned n;
  char buf[1 << 16];
  size_t len = exchange(data, size, buf, sizeof buf, 200, 1);
  if (len >= 7 && strncmp(buf, "HTTP/1.", 7)) {
    fprintf(stderr, "an answer that is not HTTP: %.200s\n", buf);
    abort();
  }
  if (len == 0 || ++n % 64 == 0) check_alive();
  return 0;
}
