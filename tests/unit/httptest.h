/* httptest: the blocking HTTP/1.1 client the coordinator's unit tests talk
 * to a real server with (test_coord_http.c, test_coord_admission.c). Every
 * request is one connection (Connection: close), read to EOF. Include after
 * <cmocka.h> and <jansson.h>. */
#ifndef PW_HTTPTEST_H
#define PW_HTTPTEST_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
  int status; /* 0: the server closed without an HTTP answer (e.g. a refused connection) */
  char *head; /* status line and headers */
  char *body;
  size_t len;
} resp;

static inline void resp_free(resp *r) {
  free(r->head);
  free(r->body);
  memset(r, 0, sizeof *r);
}

/* A connection to 127.0.0.1:port, from 127.0.0.<src> when src > 0. */
static inline int ht_dial(int port, int src) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  if (src > 0) {
    struct sockaddr_in me = {.sin_family = AF_INET};
    me.sin_addr.s_addr = htonl(0x7f000000u | (unsigned)src);
    assert_int_equal(bind(fd, (struct sockaddr *)&me, sizeof me), 0);
  }
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

/* Sends what the server takes of req (it may stop reading, or have closed
 * a refused connection). */
static inline void ht_send_raw(int fd, const char *req, size_t n) {
  for (size_t off = 0; off < n;) {
    ssize_t k = send(fd, req + off, n - off, MSG_NOSIGNAL);
    if (k <= 0) break;
    off += (size_t)k;
  }
}

/* Sends one request; headers is extra header lines ("Name: v\r\n") or
 * NULL, body may be NULL. */
static inline void ht_send(int fd, const char *method, const char *target, const char *headers, const char *body) {
  size_t bl = body ? strlen(body) : 0, cap = strlen(target) + (headers ? strlen(headers) : 0) + bl + 256;
  char *r = malloc(cap);
  assert_non_null(r);
  int n = snprintf(r, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, target,
                   headers ? headers : "");
  if (body) n += snprintf(r + n, cap - (size_t)n, "Content-Length: %zu\r\n", bl);
  n += snprintf(r + n, cap - (size_t)n, "\r\n");
  if (body) memcpy(r + n, body, bl);
  ht_send_raw(fd, r, (size_t)n + bl);
  free(r);
}

/* Reads the answer to EOF and closes fd. */
static inline void ht_read(int fd, resp *out) {
  size_t cap = 65536, len = 0;
  char *buf = malloc(cap);
  assert_non_null(buf);
  for (;;) {
    if (len + 4096 > cap) assert_non_null(buf = realloc(buf, cap *= 2));
    ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
    if (k <= 0) break;
    len += (size_t)k;
  }
  close(fd);
  buf[len] = 0;
  memset(out, 0, sizeof *out);
  char *eoh = strstr(buf, "\r\n\r\n");
  if (!eoh || sscanf(buf, "HTTP/1.%*d %d", &out->status) != 1) {
    out->status = 0;
    free(buf);
    return;
  }
  size_t hl = (size_t)(eoh - buf) + 2;
  out->head = strndup(buf, hl);
  out->len = len - hl - 2;
  out->body = malloc(out->len + 1);
  memcpy(out->body, eoh + 4, out->len);
  out->body[out->len] = 0;
  free(buf);
}

static inline void ht_exchange(int fd, const char *req, size_t n, resp *out) {
  ht_send_raw(fd, req, n);
  ht_read(fd, out);
}

/* One request on a new connection from 127.0.0.<src> (0: any). */
static inline void ht_req(int port, int src, const char *method, const char *target, const char *headers,
                          const char *body, resp *out) {
  int fd = ht_dial(port, src);
  ht_send(fd, method, target, headers, body);
  ht_read(fd, out);
}

/* A response header's value (static buffer), NULL if absent. */
static inline const char *header(const resp *r, const char *name) {
  static char v[512];
  size_t nl = strlen(name);
  for (const char *p = r->head ? strstr(r->head, "\r\n") : NULL; p && p[2]; p = strstr(p + 2, "\r\n")) {
    if (!strncasecmp(p + 2, name, nl) && p[2 + nl] == ':') {
      const char *s = p + 3 + nl, *e = strstr(s, "\r\n");
      while (*s == ' ') s++;
      snprintf(v, sizeof v, "%.*s", (int)(e - s), s);
      return v;
    }
  }
  return NULL;
}

static inline json_t *body_json(const resp *r) {
  json_error_t e;
  json_t *j = json_loadb(r->body ? r->body : "", r->len, 0, &e);
  if (!j) fprintf(stderr, "not JSON (%s): %.300s\n", e.text, r->body ? r->body : "");
  assert_non_null(j);
  return j;
}

/* The error shape: status, code, path (NULL: any), message substring. */
static inline void check_error(const resp *r, int status, const char *code, const char *path, const char *msg) {
  if (r->status != status) fprintf(stderr, "expected %d, got %d: %s\n", status, r->status, r->body);
  assert_int_equal(r->status, status);
  assert_non_null(header(r, "Content-Type"));
  assert_non_null(strstr(header(r, "Content-Type"), "application/json"));
  json_t *j = body_json(r), *e = json_object_get(j, "error");
  assert_true(json_is_object(e));
  assert_int_equal(json_object_size(e), 3);
  const char *c = json_string_value(json_object_get(e, "code")), *p = json_string_value(json_object_get(e, "path"));
  const char *m = json_string_value(json_object_get(e, "message"));
  assert_non_null(c);
  assert_non_null(p);
  assert_non_null(m);
  assert_string_equal(c, code);
  if (path) assert_string_equal(p, path);
  if (!strstr(m, msg)) fprintf(stderr, "message \"%s\" lacks \"%s\"\n", m, msg);
  assert_non_null(strstr(m, msg));
  json_decref(j);
}

#endif
