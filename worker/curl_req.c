/* curl_req: the worker's shared libcurl setup (curl_req.h). */
#include "curl_req.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "addr.h"

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
  atomic_int *abort = arg;
  (void)dt, (void)dn, (void)ut, (void)un;
  return abort && atomic_load(abort) ? 1 : 0;
}

#define SETOPT(opt, val) (cc = cc ? cc : curl_easy_setopt(h, opt, val))

CURLcode pw_curl_setup(CURL *h, const char *url, struct curl_slist *hdrs, char *errbuf, curl_write_callback on_body,
                       void *body_arg, atomic_int *abort) {
  CURLcode cc = CURLE_OK;
  SETOPT(CURLOPT_URL, url);
  SETOPT(CURLOPT_PROTOCOLS_STR, "http,https");
  SETOPT(CURLOPT_NOSIGNAL, 1L);
  SETOPT(CURLOPT_ERRORBUFFER, errbuf);
  SETOPT(CURLOPT_USERAGENT, "pipewright-worker/" PW_VERSION);
  if (hdrs) SETOPT(CURLOPT_HTTPHEADER, hdrs);
  /* No overall timeout (a large file takes what it takes); a connection
   * that does not come up, or a transfer that stalls, fails. */
  SETOPT(CURLOPT_CONNECTTIMEOUT, 30L);
  SETOPT(CURLOPT_LOW_SPEED_LIMIT, 1L);
  SETOPT(CURLOPT_LOW_SPEED_TIME, 60L);
  SETOPT(CURLOPT_WRITEFUNCTION, on_body);
  SETOPT(CURLOPT_WRITEDATA, body_arg);
  SETOPT(CURLOPT_NOPROGRESS, 0L);
  SETOPT(CURLOPT_XFERINFOFUNCTION, on_progress);
  SETOPT(CURLOPT_XFERINFODATA, abort);
  /* The proxy variables are honoured, except for a coordinator on loopback. */
  if (pw_curl_url_is_loopback(url)) SETOPT(CURLOPT_PROXY, "");
  return cc;
}

void pw_curl_answer_text(const char *body, size_t len, char *out, size_t cap) {
  out[0] = 0;
  json_t *j = json_loadb(body, len, 0, NULL);
  const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
  if (m) {
    snprintf(out, cap, "%s", m);
  } else {
    size_t k = 0;
    for (size_t i = 0; i < len && k + 1 < cap && k < 120; i++) out[k++] = body[i] >= ' ' && body[i] < 0x7f ? body[i] : ' ';
    out[k] = 0;
  }
  json_decref(j);
}

void pw_curl_keep_answer(char *buf, size_t cap, size_t *len, const char *p, size_t k) {
  size_t take = k < cap - 1 - *len ? k : cap - 1 - *len;
  memcpy(buf + *len, p, take);
  *len += take;
  buf[*len] = 0;
}

int pw_curl_write_all(int fd, const char *p, size_t n) {
  for (size_t off = 0; off < n;) {
    ssize_t w = write(fd, p + off, n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    off += (size_t)w;
  }
  return 0;
}

/* libcurl's host part keeps an IPv6 address's brackets. */
int pw_curl_url_is_loopback(const char *url) {
  CURLU *u = curl_url();
  char *host = NULL;
  int lo = 0;
  if (u && !curl_url_set(u, CURLUPART_URL, url, 0) && !curl_url_get(u, CURLUPART_HOST, &host, 0) && host) {
    size_t n = strlen(host);
    if (n > 2 && host[0] == '[' && host[n - 1] == ']') {
      host[n - 1] = 0;
      lo = pw_addr_is_loopback(host + 1);
    } else {
      lo = pw_addr_is_loopback(host);
    }
  }
  curl_free(host);
  curl_url_cleanup(u);
  return lo;
}
