/* http_client: a small blocking HTTP/1.1 client (see http_client.h).
 *
 * The socket is non-blocking and every wait is a poll() against one
 * deadline, so a silent or slow server can never hang the CLI. The reader
 * keeps the unread bytes in one buffer: header lines are taken from it as
 * they complete, body bytes are moved out as they arrive, so it never
 * holds more than a header block or one read. */
#include "http_client.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RD_CHUNK 65536

static double now_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* strerror in lower case ("connection refused"). */
static const char *lc_strerror(int e, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", strerror(e));
  if (buf[0] && isupper((unsigned char)buf[0]) && !isupper((unsigned char)buf[1]))
    buf[0] = (char)tolower((unsigned char)buf[0]);
  return buf;
}

/* ---- URL ------------------------------------------------------------------ */

int pw_http_url_parse(const char *url, pw_http_url *out, pw_err *err) {
  memset(out, 0, sizeof *out);
  out->port = 80;
  if (!url || !*url) return pw_err_set(err, PW_EINVAL, "", "empty coordinator URL");
  for (const char *q = url; *q; q++)
    if ((unsigned char)*q <= ' ' || *q == 0x7f)
      return pw_err_set(err, PW_EINVAL, url, "the URL holds a space or a control character");
  const char *p = url;
  const char *sep = strstr(url, "://");
  if (sep) {
    if (sep - url == 4 && strncasecmp(url, "http", 4) == 0)
      p = sep + 3;
    else if (sep - url == 5 && strncasecmp(url, "https", 5) == 0)
      return pw_err_set(err, PW_EINVAL, url, "https is not supported: use http:// (through a TLS proxy if needed)");
    else
      return pw_err_set(err, PW_EINVAL, url, "unsupported URL scheme (want http://host:port)");
  }
  const char *host = p, *host_end;
  if (*p == '[') {
    host = p + 1;
    host_end = strchr(host, ']');
    if (!host_end) return pw_err_set(err, PW_EINVAL, url, "unterminated [ in the host");
    p = host_end + 1;
  } else {
    host_end = p + strcspn(p, ":/?#");
    p = host_end;
  }
  size_t hl = (size_t)(host_end - host);
  if (hl == 0) return pw_err_set(err, PW_EINVAL, url, "no host in the URL");
  if (hl >= sizeof out->host) return pw_err_set(err, PW_EINVAL, url, "host name too long");
  memcpy(out->host, host, hl);
  out->host[hl] = 0;
  if (*p == ':') {
    p++;
    long port = 0;
    int digits = 0;
    while (isdigit((unsigned char)*p) && digits < 6) port = port * 10 + (*p++ - '0'), digits++;
    if (!digits || port < 1 || port > 65535 || (*p && *p != '/'))
      return pw_err_set(err, PW_EINVAL, url, "bad port (want 1..65535)");
    out->port = (int)port;
  }
  if (*p && *p != '/') return pw_err_set(err, PW_EINVAL, url, "unexpected '%c' after the host", *p);
  if (strpbrk(p, "?#")) return pw_err_set(err, PW_EINVAL, url, "the base URL must not hold a query or fragment");
  size_t pl = strlen(p);
  while (pl && p[pl - 1] == '/') pl--;
  if (pl >= sizeof out->prefix) return pw_err_set(err, PW_EINVAL, url, "URL path too long");
  memcpy(out->prefix, p, pl);
  out->prefix[pl] = 0;
  return 0;
}

/* ---- connecting and sending ---------------------------------------------- */

/* Waits for events on fd until the deadline: 1 ready, 0 timed out, <0 errno. */
static int wait_fd(int fd, short events, double deadline) {
  for (;;) {
    double left = deadline - now_mono();
    if (left <= 0) return 0;
    struct pollfd pfd = {.fd = fd, .events = events};
    int ms = left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
    int n = poll(&pfd, 1, ms);
    if (n > 0) return 1;
    if (n < 0 && errno != EINTR) return -errno;
  }
}

static int connect_to(const pw_http_url *u, double deadline, int *fd_out, pw_err *err) {
  char port[8], where[300], eb[128];
  snprintf(port, sizeof port, "%d", u->port);
  snprintf(where, sizeof where, strchr(u->host, ':') ? "[%s]:%d" : "%s:%d", u->host, u->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  int g = getaddrinfo(u->host, port, &hints, &res);
  if (g != 0)
    return pw_err_set(err, PW_EPEER, where, "cannot resolve %s: %s", u->host,
                      g == EAI_SYSTEM ? lc_strerror(errno, eb, sizeof eb) : gai_strerror(g));
  int last = ECONNREFUSED, timed_out = 0;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = errno;
      continue;
    }
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      int w = wait_fd(fd, POLLOUT, deadline);
      if (w == 1) {
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) soerr = errno;
        rc = soerr ? -1 : 0;
        errno = soerr;
      } else {
        rc = -1;
        if (w == 0) timed_out = 1;
        errno = w == 0 ? ETIMEDOUT : -w;
      }
    }
    if (rc == 0) {
      freeaddrinfo(res);
      *fd_out = fd;
      return 0;
    }
    last = errno;
    close(fd);
    if (timed_out) break; /* the deadline is spent: no time for other addresses */
  }
  freeaddrinfo(res);
  return pw_err_set(err, PW_EPEER, where, "%s", lc_strerror(last, eb, sizeof eb));
}

/* 0, or the errno that stopped the send (ETIMEDOUT at the deadline). */
static int send_all(int fd, const char *p, size_t n, double deadline) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int w = wait_fd(fd, POLLOUT, deadline);
      if (w == 0) return ETIMEDOUT;
      if (w < 0) return -w;
      continue;
    }
    return k < 0 ? errno : EPIPE;
  }
  return 0;
}

/* ---- reading --------------------------------------------------------------- */

typedef struct {
  int fd;
  double deadline, timeout;
  char *buf;
  size_t pos, len, cap; /* unread bytes are buf[pos, len) */
  int eof;
  const char *where;
  pw_err *err;
} reader;

/* Reads more bytes into the buffer: 1 got some, 0 end of stream, <0 error. */
static int rd_fill(reader *r) {
  if (r->eof) return 0;
  if (r->pos == r->len) r->pos = r->len = 0;
  if (r->cap - r->len < RD_CHUNK / 2) {
    if (r->pos) {
      memmove(r->buf, r->buf + r->pos, r->len - r->pos);
      r->len -= r->pos;
      r->pos = 0;
    }
    if (r->cap - r->len < RD_CHUNK / 2) {
      size_t nc = r->cap ? r->cap * 2 : RD_CHUNK;
      char *nb = realloc(r->buf, nc);
      if (!nb) return pw_err_set(r->err, PW_ENOMEM, r->where, "out of memory reading the response");
      r->buf = nb;
      r->cap = nc;
    }
  }
  for (;;) {
    ssize_t k = recv(r->fd, r->buf + r->len, r->cap - r->len, 0);
    if (k > 0) {
      r->len += (size_t)k;
      return 1;
    }
    if (k == 0) {
      r->eof = 1;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int w = wait_fd(r->fd, POLLIN, r->deadline);
      if (w == 0)
        return pw_err_set(r->err, PW_EIO, r->where, "timed out after %g s waiting for the response", r->timeout);
      if (w < 0) errno = -w;
      else continue;
    }
    char eb[128];
    return pw_err_set(r->err, PW_EIO, r->where, "reading the response: %s", lc_strerror(errno, eb, sizeof eb));
  }
}

/* The next line (without CR LF), NUL-terminated in place; at most max bytes. */
static int rd_line(reader *r, size_t max, char **line) {
  size_t scanned = 0;
  for (;;) {
    char *start = r->buf + r->pos;
    char *nl = r->len > r->pos + scanned ? memchr(start + scanned, '\n', r->len - r->pos - scanned) : NULL;
    if (nl) {
      size_t n = (size_t)(nl - start);
      if (n && start[n - 1] == '\r') n--;
      start[n] = 0;
      r->pos = (size_t)(nl - r->buf) + 1;
      *line = start;
      return 0;
    }
    scanned = r->len - r->pos;
    if (scanned > max) return pw_err_set(r->err, PW_ETOOBIG, r->where, "response header line over %zu bytes", max);
    int k = rd_fill(r);
    if (k < 0) return k;
    if (k == 0) return pw_err_set(r->err, PW_EPROTO, r->where, "connection closed in the middle of the response");
  }
}

typedef struct {
  char *p;
  size_t len, cap, max;
} outbuf;

static int ob_add(outbuf *o, const char *src, size_t n, reader *r) {
  if (n > o->max - o->len)
    return pw_err_set(r->err, PW_ETOOBIG, r->where, "response body over %zu bytes", o->max);
  if (o->len + n + 1 > o->cap) {
    size_t nc = o->cap ? o->cap : 4096;
    while (nc < o->len + n + 1) nc *= 2;
    char *np = realloc(o->p, nc);
    if (!np) return pw_err_set(r->err, PW_ENOMEM, r->where, "out of memory reading the response");
    o->p = np;
    o->cap = nc;
  }
  memcpy(o->p + o->len, src, n);
  o->len += n;
  return 0;
}

/* Moves n body bytes (or, with n == SIZE_MAX, everything to the end of the
 * stream) from the connection into o. */
static int rd_body(reader *r, outbuf *o, size_t n) {
  while (n) {
    if (r->pos == r->len) {
      int k = rd_fill(r);
      if (k < 0) return k;
      if (k == 0) {
        if (n == SIZE_MAX) return 0;
        return pw_err_set(r->err, PW_EPROTO, r->where, "connection closed with %zu body bytes missing", n);
      }
    }
    size_t take = r->len - r->pos;
    if (take > n) take = n;
    int rc = ob_add(o, r->buf + r->pos, take, r);
    if (rc) return rc;
    r->pos += take;
    if (n != SIZE_MAX) n -= take;
  }
  return 0;
}

static int rd_chunked(reader *r, outbuf *o) {
  for (;;) {
    char *line;
    int rc = rd_line(r, 4096, &line);
    if (rc) return rc;
    char *end;
    errno = 0;
    if (!isxdigit((unsigned char)line[0]))
      return pw_err_set(r->err, PW_EPROTO, r->where, "bad chunk size line '%.40s'", line);
    unsigned long long n = strtoull(line, &end, 16);
    if (errno || (*end && *end != ';' && *end != ' ' && *end != '\t'))
      return pw_err_set(r->err, PW_EPROTO, r->where, "bad chunk size line '%.40s'", line);
    if (n == 0) break;
    if (n > o->max - o->len)
      return pw_err_set(r->err, PW_ETOOBIG, r->where, "response body over %zu bytes", o->max);
    if ((rc = rd_body(r, o, (size_t)n))) return rc;
    if ((rc = rd_line(r, 16, &line))) return rc;
    if (*line) return pw_err_set(r->err, PW_EPROTO, r->where, "chunk not followed by CRLF");
  }
  for (size_t total = 0;;) { /* trailers, up to the empty line */
    char *line;
    int rc = rd_line(r, PW_HTTP_MAX_HEADER, &line);
    if (rc) return rc;
    if (!*line) return 0;
    total += strlen(line);
    if (total > PW_HTTP_MAX_HEADER) return pw_err_set(r->err, PW_ETOOBIG, r->where, "trailers too large");
  }
}

static void copy_value(char *dst, size_t cap, const char *v) {
  while (*v == ' ' || *v == '\t') v++;
  size_t n = strlen(v);
  while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
  if (n >= cap) n = cap - 1;
  memcpy(dst, v, n);
  dst[n] = 0;
}

/* Status line and headers; skips interim 1xx answers. */
static int rd_head(reader *r, pw_http_resp *resp, long long *content_length, int *chunked) {
  for (;;) {
    size_t used = 0;
    char *line;
    int rc = rd_line(r, PW_HTTP_MAX_HEADER, &line);
    if (rc) return rc;
    int major, minor, status, nread = 0;
    if (sscanf(line, "HTTP/%d.%d %3d%n", &major, &minor, &status, &nread) != 3 || major != 1 || status < 100 ||
        status > 999 || (line[nread] && line[nread] != ' '))
      return pw_err_set(r->err, PW_EPROTO, r->where, "not an HTTP/1.x status line: '%.60s'", line);
    *content_length = -1;
    *chunked = 0;
    resp->content_type[0] = resp->location[0] = 0;
    for (;;) {
      if ((rc = rd_line(r, PW_HTTP_MAX_HEADER, &line))) return rc;
      if (!*line) break;
      used += strlen(line) + 2;
      if (used > PW_HTTP_MAX_HEADER)
        return pw_err_set(r->err, PW_ETOOBIG, r->where, "response headers over %d bytes", PW_HTTP_MAX_HEADER);
      char *colon = strchr(line, ':');
      if (!colon) return pw_err_set(r->err, PW_EPROTO, r->where, "malformed header line '%.60s'", line);
      *colon = 0;
      const char *v = colon + 1;
      while (*v == ' ' || *v == '\t') v++;
      if (!strcasecmp(line, "Content-Length")) {
        char *end;
        errno = 0;
        long long n = isdigit((unsigned char)*v) ? strtoll(v, &end, 10) : -1;
        if (n < 0 || errno || (*end && *end != ' ' && *end != '\t') ||
            (*content_length >= 0 && *content_length != n))
          return pw_err_set(r->err, PW_EPROTO, r->where, "bad Content-Length '%.40s'", v);
        *content_length = n;
      } else if (!strcasecmp(line, "Transfer-Encoding")) {
        size_t n = strlen(v);
        while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
        if (n >= 7 && !strncasecmp(v + n - 7, "chunked", 7))
          *chunked = 1;
        else if (n && strncasecmp(v, "identity", n))
          return pw_err_set(r->err, PW_EPROTO, r->where, "unsupported Transfer-Encoding '%.40s'", v);
      } else if (!strcasecmp(line, "Content-Type")) {
        copy_value(resp->content_type, sizeof resp->content_type, v);
      } else if (!strcasecmp(line, "Location")) {
        copy_value(resp->location, sizeof resp->location, v);
      }
    }
    resp->status = status;
    if (status >= 200 || status == 101) return 0;
  }
}

/* ---- the request ------------------------------------------------------------ */

static int bad_text(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < ' ' || *s == 0x7f) return 1;
  return 0;
}

int pw_http_request(const pw_http_url *url, const char *method, const char *target, const char *body,
                    size_t body_len, const pw_http_opts *opts, pw_http_resp *resp, pw_err *err) {
  memset(resp, 0, sizeof *resp);
  double timeout = opts && opts->timeout > 0 ? opts->timeout : PW_HTTP_DEFAULT_TIMEOUT;
  size_t max_body = opts && opts->max_body ? opts->max_body : PW_HTTP_DEFAULT_MAX_BODY;
  const char *token = opts && opts->token && *opts->token ? opts->token : NULL;
  char where[300];
  snprintf(where, sizeof where, strchr(url->host, ':') ? "[%s]:%d" : "%s:%d", url->host, url->port);
  if (!method || !*method || strpbrk(method, " \t") || bad_text(method) || !target || target[0] != '/' ||
      strpbrk(target, " \t") || bad_text(target))
    return pw_err_set(err, PW_EINVAL, where, "bad request method or target");
  if (token && bad_text(token)) return pw_err_set(err, PW_EINVAL, where, "the token holds a control character");

  /* the whole request in one buffer: head, then the body */
  char host[300];
  if (url->port == 80)
    snprintf(host, sizeof host, strchr(url->host, ':') ? "[%s]" : "%s", url->host);
  else
    snprintf(host, sizeof host, "%s", where);
  int send_len = body || !strcmp(method, "POST") || !strcmp(method, "PUT") || !strcmp(method, "PATCH");
  size_t cap = strlen(method) + strlen(url->prefix) + strlen(target) + strlen(host) + (token ? strlen(token) : 0) +
               256 + (body ? body_len : 0);
  char *req = malloc(cap);
  if (!req) return pw_err_set(err, PW_ENOMEM, where, "out of memory");
  int hl = snprintf(req, cap,
                    "%s %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: pipewright/" PW_VERSION
                    "\r\nAccept: application/json\r\nConnection: close\r\n",
                    method, url->prefix, target, host);
  if (token) hl += snprintf(req + hl, cap - (size_t)hl, "Authorization: Bearer %s\r\n", token);
  if (body) hl += snprintf(req + hl, cap - (size_t)hl, "Content-Type: application/json\r\n");
  if (send_len) hl += snprintf(req + hl, cap - (size_t)hl, "Content-Length: %zu\r\n", body ? body_len : 0);
  hl += snprintf(req + hl, cap - (size_t)hl, "\r\n");
  if (body && body_len) memcpy(req + hl, body, body_len);
  size_t req_len = (size_t)hl + (body ? body_len : 0);

  double deadline = now_mono() + timeout;
  int fd = -1;
  int rc = connect_to(url, deadline, &fd, err);
  if (rc) {
    free(req);
    return rc;
  }
  /* A server may answer early (413 for a body too large) and close while
   * the body is still going out: then its answer, if one arrives, wins. */
  int send_errno = send_all(fd, req, req_len, deadline);
  free(req);
  if (send_errno == ETIMEDOUT) {
    close(fd);
    return pw_err_set(err, PW_EIO, where, "timed out after %g s sending the request", timeout);
  }
  if (send_errno) shutdown(fd, SHUT_WR);

  reader r = {.fd = fd, .deadline = deadline, .timeout = timeout, .where = where, .err = err};
  outbuf o = {.max = max_body};
  long long clen = -1;
  int chunked = 0;
  rc = rd_head(&r, resp, &clen, &chunked);
  if (rc && send_errno) {
    char eb[128];
    rc = pw_err_set(err, PW_EIO, where, "sending the request: %s", lc_strerror(send_errno, eb, sizeof eb));
  }
  if (!rc) {
    int no_body = !strcmp(method, "HEAD") || resp->status == 204 || resp->status == 304 || resp->status == 101;
    if (no_body)
      rc = 0;
    else if (chunked)
      rc = rd_chunked(&r, &o);
    else if (clen >= 0) {
      if ((unsigned long long)clen > max_body)
        rc = pw_err_set(err, PW_ETOOBIG, where, "response body of %lld bytes over the bound of %zu", clen, max_body);
      else
        rc = rd_body(&r, &o, (size_t)clen);
    } else
      rc = rd_body(&r, &o, SIZE_MAX);
  }
  if (!rc) rc = ob_add(&o, "", 0, &r); /* make room for the NUL */
  close(fd);
  free(r.buf);
  if (rc) {
    free(o.p);
    memset(resp, 0, sizeof *resp);
    return rc;
  }
  o.p[o.len] = 0;
  resp->body = o.p;
  resp->len = o.len;
  return 0;
}

void pw_http_resp_free(pw_http_resp *resp) {
  if (!resp) return;
  free(resp->body);
  resp->body = NULL;
  resp->len = 0;
}
