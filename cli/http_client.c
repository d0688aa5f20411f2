/* http_client: the CLI's HTTP(S) client on libcurl (see http_client.h).
 *
 * libcurl does the protocol, TLS, proxies and timeouts; this file sets it
 * up the same way for every request, bounds the body, and turns libcurl's
 * errors into pipewright's codes with a short lower-case reason. It must
 * never switch off certificate checks, nor stop libcurl reading the proxy
 * variables (it only bypasses them for loopback hosts). */
#include "http_client.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* strerror or a libcurl message with its first letter in lower case. */
static const char *lc(const char *s, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", s);
  if (buf[0] && isupper((unsigned char)buf[0]) && !isupper((unsigned char)buf[1]))
    buf[0] = (char)tolower((unsigned char)buf[0]);
  return buf;
}

/* ---- URL ------------------------------------------------------------------ */

static int bad_text(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < ' ' || *s == 0x7f) return 1;
  return 0;
}

int pw_http_url_parse(const char *url, pw_http_url *out, pw_err *err) {
  memset(out, 0, sizeof *out);
  if (!url || !*url) return pw_err_set(err, PW_EINVAL, "", "empty coordinator URL");
  if (bad_text(url) || strchr(url, ' '))
    return pw_err_set(err, PW_EINVAL, url, "the URL holds a space or a control character");
  const char *sep = strstr(url, "://");
  int tls = sep && sep - url == 5 && !strncasecmp(url, "https", 5);
  if (sep && !tls && !(sep - url == 4 && !strncasecmp(url, "http", 4)))
    return pw_err_set(err, PW_EINVAL, url, "unsupported URL scheme (want http:// or https://)");
  char full[1100];
  if (snprintf(full, sizeof full, "%s%s", sep ? "" : "http://", url) >= (int)sizeof full)
    return pw_err_set(err, PW_EINVAL, url, "URL too long");

  CURLU *u = curl_url();
  if (!u) return pw_err_set(err, PW_ENOMEM, url, "out of memory");
  char *host = NULL, *port = NULL, *path = NULL, *query = NULL, *frag = NULL, *user = NULL, eb[128];
  int rc = 0;
  CURLUcode uc = curl_url_set(u, CURLUPART_URL, full, 0);
  if (uc) {
    if (uc == CURLUE_BAD_PORT_NUMBER)
      rc = pw_err_set(err, PW_EINVAL, url, "bad port (want 1..65535)");
    else
      rc = pw_err_set(err, PW_EINVAL, url, "%s", lc(curl_url_strerror(uc), eb, sizeof eb));
    goto done;
  }
  curl_url_get(u, CURLUPART_USER, &user, 0);
  curl_url_get(u, CURLUPART_QUERY, &query, 0);
  curl_url_get(u, CURLUPART_FRAGMENT, &frag, 0);
  if (user) {
    rc = pw_err_set(err, PW_EINVAL, url, "credentials in the URL are not supported (use a token file)");
    goto done;
  }
  if (query || frag) {
    rc = pw_err_set(err, PW_EINVAL, url, "the base URL must not hold a query or fragment");
    goto done;
  }
  if (curl_url_get(u, CURLUPART_HOST, &host, 0) || curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) ||
      curl_url_get(u, CURLUPART_PATH, &path, 0)) {
    rc = pw_err_set(err, PW_EINVAL, url, "no host in the URL");
    goto done;
  }
  out->port = atoi(port);
  if (out->port < 1 || out->port > 65535) {
    rc = pw_err_set(err, PW_EINVAL, url, "bad port (want 1..65535)");
    goto done;
  }
  size_t hl = strlen(host);
  const char *h = host;
  if (hl >= 2 && host[0] == '[') h++, hl -= 2; /* IPv6 literal */
  if (hl == 0 || hl >= sizeof out->host) {
    rc = pw_err_set(err, PW_EINVAL, url, hl ? "host name too long" : "no host in the URL");
    goto done;
  }
  memcpy(out->host, h, hl);
  size_t pl = strlen(path);
  while (pl && path[pl - 1] == '/') pl--;
  char portpart[8] = "";
  if (out->port != (tls ? 443 : 80)) snprintf(portpart, sizeof portpart, ":%d", out->port);
  if (snprintf(out->base, sizeof out->base, "%s://%s%s%.*s", tls ? "https" : "http", host, portpart, (int)pl,
               path) >= (int)sizeof out->base)
    rc = pw_err_set(err, PW_EINVAL, url, "URL path too long");
done:
  curl_free(host);
  curl_free(port);
  curl_free(path);
  curl_free(query);
  curl_free(frag);
  curl_free(user);
  curl_url_cleanup(u);
  if (rc) memset(out, 0, sizeof *out);
  return rc;
}

/* localhost, *.localhost, 127.0.0.0/8, ::1 and ::ffff:127.x: a proxy
 * elsewhere could not reach these as meant, so the environment's proxy is
 * never used for them. */
static int is_loopback(const char *host) {
  size_t n = strlen(host);
  if (!strcasecmp(host, "localhost") || (n > 10 && !strcasecmp(host + n - 10, ".localhost"))) return 1;
  unsigned char a[16];
  if (inet_pton(AF_INET, host, a) == 1) return a[0] == 127;
  if (inet_pton(AF_INET6, host, a) != 1) return 0;
  static const unsigned char v6lo[16] = {[15] = 1}, mapped[12] = {[10] = 0xff, [11] = 0xff};
  return !memcmp(a, v6lo, 16) || (!memcmp(a, mapped, 12) && a[12] == 127);
}

/* ---- the process's libcurl handle ------------------------------------------ */

/* One easy handle for the process: libcurl keeps its connections (and TLS
 * sessions) in it, so successive requests reuse them. curl_global_init
 * runs once, on the first request; the cleanup is registered after it, so
 * it runs before the TLS library's own exit handler. */
static CURL *g_easy;

static void http_cleanup(void) {
  curl_easy_cleanup(g_easy);
  g_easy = NULL;
  curl_global_cleanup();
}

static CURL *easy_handle(void) {
  if (g_easy) return g_easy;
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return NULL;
  g_easy = curl_easy_init();
  if (!g_easy || atexit(http_cleanup) != 0) {
    curl_easy_cleanup(g_easy);
    g_easy = NULL;
    curl_global_cleanup();
    return NULL;
  }
  return g_easy;
}

/* ---- the request ----------------------------------------------------------- */

typedef struct {
  char *p;
  size_t len, cap, max;
  int over, nomem;
  long long announced; /* the last Content-Length seen, -1 for none */
  const pw_http_opts *o;
} sink;

/* Only to name the size of a body refused for its Content-Length: libcurl
 * stops before it reports the length itself. */
static size_t on_header(char *data, size_t size, size_t n, void *ud) {
  sink *s = ud;
  size_t k = size * n;
  if (k > 15 && !strncasecmp(data, "content-length:", 15)) {
    char num[32];
    size_t m = k - 15 < sizeof num - 1 ? k - 15 : sizeof num - 1;
    memcpy(num, data + 15, m);
    num[m] = 0;
    s->announced = strtoll(num, NULL, 10);
  }
  return k;
}

static size_t on_body(char *data, size_t size, size_t n, void *ud) {
  sink *s = ud;
  size_t k = size * n;
  if (k > s->max - s->len) {
    s->over = 1;
    return 0; /* short count: libcurl stops with CURLE_WRITE_ERROR */
  }
  if (s->len + k + 1 > s->cap) {
    size_t nc = s->cap ? s->cap : 4096;
    while (nc < s->len + k + 1) nc *= 2;
    char *np = realloc(s->p, nc);
    if (!np) {
      s->nomem = 1;
      return 0;
    }
    s->p = np;
    s->cap = nc;
  }
  memcpy(s->p + s->len, data, k);
  s->len += k;
  if (s->o && s->o->on_data) s->o->on_data(s->o->ud, data, k);
  return k;
}

/* An upload's body, fed to libcurl as it asks: never more than size. */
typedef struct {
  const pw_http_body_src *src;
  unsigned long long sent;
  int err_no;     /* src->read failed with this */
  int short_body; /* src->read ended before size bytes */
} source;

static size_t on_read(char *buf, size_t size, size_t n, void *ud) {
  source *s = ud;
  size_t cap = size * n;
  unsigned long long left = s->src->size - s->sent;
  if (left == 0) return 0;
  if (cap > left) cap = (size_t)left;
  long long k = s->src->read(s->src->ud, buf, cap);
  if (k < 0) {
    s->err_no = (int)-k;
    return CURL_READFUNC_ABORT;
  }
  if (k == 0) { /* the file shrank: never send less than announced */
    s->short_body = 1;
    return CURL_READFUNC_ABORT;
  }
  s->sent += (unsigned long long)k;
  return (size_t)k;
}

/* libcurl's failure as a pipewright error (see the list in the header). */
static int map_error(CURL *h, CURLcode cc, const char *errbuf, const sink *s, const source *up,
                     const pw_http_url *url, double timeout, const char *where, pw_err *err) {
  char eb[CURL_ERROR_SIZE + 16];
  const char *why = lc(errbuf[0] ? errbuf : curl_easy_strerror(cc), eb, sizeof eb);
  if (s->nomem || cc == CURLE_OUT_OF_MEMORY) return pw_err_set(err, PW_ENOMEM, where, "out of memory");
  if (s->over) return pw_err_set(err, PW_ETOOBIG, where, "response body over the bound of %zu bytes", s->max);
  if (up && up->err_no) return pw_err_set(err, PW_EIO, where, "reading the body: %s", strerror(up->err_no));
  if (up && up->short_body)
    return pw_err_set(err, PW_EIO, where, "reading the body: it ended after %llu of %llu bytes (did it change?)",
                      up->sent, up->src->size);
  long os_errno = 0, tunnel = 0;
  curl_off_t connect_us = 0;
  curl_easy_getinfo(h, CURLINFO_OS_ERRNO, &os_errno);
  curl_easy_getinfo(h, CURLINFO_HTTP_CONNECTCODE, &tunnel);
  curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &connect_us);
  switch (cc) {
    case CURLE_FILESIZE_EXCEEDED:
      return pw_err_set(err, PW_ETOOBIG, where, "response body of %lld bytes over the bound of %zu", s->announced,
                        s->max);
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
      return pw_err_set(err, PW_EPEER, where, "%s", why);
    case CURLE_COULDNT_CONNECT: {
      /* the errno is the friendlier reason; libcurl's text names the
       * address it tried, which is a proxy's when it is not the URL's */
      char os[128], tried[256];
      int tried_port = 0;
      const char *reason = os_errno ? lc(strerror((int)os_errno), os, sizeof os) : "cannot connect";
      if (sscanf(errbuf, "Failed to connect to %255s port %d", tried, &tried_port) == 2 &&
          (strcmp(tried, url->host) || tried_port != url->port))
        return pw_err_set(err, PW_EPEER, where, "%s by the proxy at %s%s%s:%d", reason, strchr(tried, ':') ? "[" : "",
                          tried, strchr(tried, ':') ? "]" : "", tried_port);
      return pw_err_set(err, PW_EPEER, where, "%s", reason);
    }
    case CURLE_OPERATION_TIMEDOUT:
      if (connect_us == 0) return pw_err_set(err, PW_EPEER, where, "connection timed out after %g s", timeout);
      if (up) return pw_err_set(err, PW_EIO, where, "no progress for %g s (after %llu of %llu bytes sent)", timeout,
                                up->sent, up->src->size);
      return pw_err_set(err, PW_EIO, where, "timed out after %g s waiting for the response", timeout);
    case CURLE_PEER_FAILED_VERIFICATION:
      return pw_err_set(err, PW_EAUTH, where, "TLS certificate not trusted: %s", why);
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
      return pw_err_set(err, PW_EINVAL, where, "TLS: %s", why);
    case CURLE_SSL_CONNECT_ERROR:
      if (tunnel >= 300) break;
      return pw_err_set(err, PW_EPROTO, where, "TLS handshake failed (not an https server?): %s", why);
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_WEIRD_SERVER_REPLY:
      return pw_err_set(err, PW_EPROTO, where, "not an HTTP answer (an https server?): %s", why);
    case CURLE_GOT_NOTHING:
      return pw_err_set(err, PW_EPROTO, where, "the server closed the connection without answering");
    default: break;
  }
  if (tunnel >= 300) return pw_err_set(err, PW_EPEER, where, "the proxy refused the tunnel (HTTP %ld)", tunnel);
  return pw_err_set(err, PW_EIO, where, "%s", why);
}

#define SETOPT(opt, val) (cc = cc ? cc : curl_easy_setopt(h, opt, val))

/* One request, its body from memory (body), from src, or none. */
static int perform(const pw_http_url *url, const char *method, const char *target, const char *body,
                   size_t body_len, const pw_http_body_src *src, const pw_http_opts *opts, pw_http_resp *resp,
                   pw_err *err) {
  memset(resp, 0, sizeof *resp);
  double timeout = opts && opts->timeout > 0 ? opts->timeout : PW_HTTP_DEFAULT_TIMEOUT;
  size_t max_body = opts && opts->max_body ? opts->max_body : PW_HTTP_DEFAULT_MAX_BODY;
  const char *token = opts && opts->token && *opts->token ? opts->token : NULL;
  const char *proxy = opts ? opts->proxy : NULL;
  char where[300];
  snprintf(where, sizeof where, strchr(url->host, ':') ? "[%s]:%d" : "%s:%d", url->host, url->port);
  if (!method || !*method || strpbrk(method, " \t") || bad_text(method) || !target || target[0] != '/' ||
      strpbrk(target, " \t") || bad_text(target))
    return pw_err_set(err, PW_EINVAL, where, "bad request method or target");
  if (token && bad_text(token)) return pw_err_set(err, PW_EINVAL, where, "the token holds a control character");
  char *full = malloc(strlen(url->base) + strlen(target) + 1);
  char *auth = token ? malloc(strlen(token) + 32) : NULL;
  if (!full || (token && !auth)) {
    free(full);
    free(auth);
    return pw_err_set(err, PW_ENOMEM, where, "out of memory");
  }
  strcpy(full, url->base);
  strcat(full, target);
  if (auth) sprintf(auth, "Authorization: Bearer %s", token);

  CURL *h = easy_handle();
  if (!h) {
    free(full);
    free(auth);
    return pw_err_set(err, PW_ENOMEM, where, "cannot initialise libcurl");
  }
  /* "Expect:" and "Content-Type:" remove what libcurl would add for a POST */
  struct curl_slist *hdrs = NULL, *t;
  char ctype[160] = "Content-Type:";
  if (src && src->content_type && !bad_text(src->content_type))
    snprintf(ctype, sizeof ctype, "Content-Type: %s", src->content_type);
  else if (body)
    snprintf(ctype, sizeof ctype, "Content-Type: application/json");
  const char *extra = opts && opts->header && !bad_text(opts->header) ? opts->header : NULL;
  const char *add[] = {"Accept: application/json", src ? "Expect: 100-continue" : "Expect:", auth, ctype, extra};
  int hdrs_oom = 0;
  for (size_t i = 0; i < sizeof add / sizeof add[0] && !hdrs_oom; i++) {
    if (!add[i]) continue;
    if ((t = curl_slist_append(hdrs, add[i])))
      hdrs = t;
    else
      hdrs_oom = 1;
  }
  sink s = {.max = max_body, .announced = -1, .o = opts};
  char errbuf[CURL_ERROR_SIZE] = "";
  CURLcode cc = CURLE_OK;
  SETOPT(CURLOPT_URL, full);
  SETOPT(CURLOPT_PROTOCOLS_STR, "http,https");
  SETOPT(CURLOPT_NOSIGNAL, 1L);
  SETOPT(CURLOPT_ERRORBUFFER, errbuf);
  SETOPT(CURLOPT_USERAGENT, "pipewright/" PW_VERSION);
  SETOPT(CURLOPT_HTTPHEADER, hdrs);
  long timeout_ms = timeout < 2e6 ? (long)(timeout * 1000 + 0.5) : 2000000000L;
  if (src) { /* a stall, not the whole transfer: an upload takes as long as it takes */
    SETOPT(CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    SETOPT(CURLOPT_LOW_SPEED_LIMIT, 1L);
    SETOPT(CURLOPT_LOW_SPEED_TIME, timeout_ms / 1000 > 0 ? timeout_ms / 1000 : 1L);
  } else {
    SETOPT(CURLOPT_TIMEOUT_MS, timeout_ms);
  }
  SETOPT(CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max_body);
  SETOPT(CURLOPT_WRITEFUNCTION, on_body);
  SETOPT(CURLOPT_WRITEDATA, &s);
  SETOPT(CURLOPT_HEADERFUNCTION, on_header);
  SETOPT(CURLOPT_HEADERDATA, &s);
  if (opts && opts->cacert) {
    SETOPT(CURLOPT_CAINFO, opts->cacert);
    SETOPT(CURLOPT_PROXY_CAINFO, opts->cacert);
  }
  /* unset, libcurl reads http_proxy, https_proxy, all_proxy and no_proxy */
  if (proxy)
    SETOPT(CURLOPT_PROXY, proxy);
  else if (is_loopback(url->host))
    SETOPT(CURLOPT_PROXY, "");
  source up = {.src = src};
  int send_body = body || src || !strcmp(method, "POST") || !strcmp(method, "PUT") || !strcmp(method, "PATCH");
  if (src) {
    SETOPT(CURLOPT_POST, 1L);
    SETOPT(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)src->size);
    SETOPT(CURLOPT_READFUNCTION, on_read);
    SETOPT(CURLOPT_READDATA, &up);
  } else if (send_body) {
    SETOPT(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? body_len : 0));
    SETOPT(CURLOPT_POSTFIELDS, body ? body : "");
  }
  if (!strcmp(method, "HEAD"))
    SETOPT(CURLOPT_NOBODY, 1L);
  else if (strcmp(method, send_body ? "POST" : "GET"))
    SETOPT(CURLOPT_CUSTOMREQUEST, method);

  int rc = 0;
  if (cc != CURLE_OK || hdrs_oom)
    rc = pw_err_set(err, cc == CURLE_OK || cc == CURLE_OUT_OF_MEMORY ? PW_ENOMEM : PW_EINVAL, where,
                    "setting up the request: %s", curl_easy_strerror(cc));
  else if ((cc = curl_easy_perform(h)) != CURLE_OK)
    rc = map_error(h, cc, errbuf, &s, src ? &up : NULL, url, timeout, where, err);
  long status = 0;
  if (!rc) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (!rc && !s.p && !(s.p = malloc(1))) rc = pw_err_set(err, PW_ENOMEM, where, "out of memory");
  /* the options point into this frame: drop them, keep the connections */
  curl_easy_reset(h);
  curl_slist_free_all(hdrs);
  free(full);
  free(auth);
  if (rc) {
    free(s.p);
    return rc;
  }
  s.p[s.len] = 0;
  resp->status = (int)status;
  resp->body = s.p;
  resp->len = s.len;
  return 0;
}

int pw_http_request(const pw_http_url *url, const char *method, const char *target, const char *body,
                    size_t body_len, const pw_http_opts *opts, pw_http_resp *resp, pw_err *err) {
  return perform(url, method, target, body, body_len, NULL, opts, resp, err);
}

int pw_http_upload(const pw_http_url *url, const char *method, const char *target, const pw_http_body_src *src,
                   const pw_http_opts *opts, pw_http_resp *resp, pw_err *err) {
  if (!src || !src->read) {
    memset(resp, 0, sizeof *resp);
    return pw_err_set(err, PW_EINVAL, url->host, "no body to upload");
  }
  return perform(url, method, target, NULL, 0, src, opts, resp, err);
}

void pw_http_resp_free(pw_http_resp *resp) {
  if (!resp) return;
  free(resp->body);
  resp->body = NULL;
  resp->len = 0;
}
