/* ckptxfer: checkpoint shards to and from the coordinator (ckptxfer.h). */
#include "ckptxfer.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"
#include "curl_req.h"

#define WHERE "checkpoint"

int pw_xfer_file_crc(const char *path, char hex[9], pw_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return pw_err_set(err, PW_EIO, WHERE, "cannot open %s: %s", path, strerror(errno));
  enum { PIECE = 1 << 20 };
  char *buf = malloc(PIECE);
  uint32_t crc = 0;
  int rc = buf ? 0 : pw_err_set(err, PW_ENOMEM, WHERE, "out of memory");
  while (!rc) {
    ssize_t k = read(fd, buf, PIECE);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) rc = pw_err_set(err, PW_EIO, WHERE, "cannot read %s: %s", path, strerror(errno));
    if (k <= 0) break;
    crc = pw_crc32c(crc, buf, (size_t)k);
  }
  free(buf);
  close(fd);
  if (!rc) snprintf(hex, 9, "%08x", crc);
  return rc;
}

/* One transfer's state: the body sink of a GET, the answer of either. */
typedef struct {
  CURL *h;
  const char *url;
  int fd;                  /* GET: the temporary file, else -1 */
  uint64_t got, max;
  long status;
  int started, over, werr;
  char ebody[512];
  size_t ebody_len;
  atomic_int *abort;
} xfer;

static size_t on_body(char *p, size_t sz, size_t n, void *arg) {
  xfer *d = arg;
  size_t k = sz * n;
  if (!d->started) {
    d->started = 1;
    curl_easy_getinfo(d->h, CURLINFO_RESPONSE_CODE, &d->status);
  }
  if (d->fd < 0 || d->status != 200) { /* an answer to read, not a body to keep */
    pw_curl_keep_answer(d->ebody, sizeof d->ebody, &d->ebody_len, p, k);
    return k;
  }
  if (k > d->max - d->got) {
    d->over = 1;
    return 0;
  }
  if ((d->werr = pw_curl_write_all(d->fd, p, k))) return 0;
  d->got += k;
  return k;
}

#define SETOPT(opt, val) (cc = cc ? cc : curl_easy_setopt(h, opt, val))

/* The request: a GET into d->fd, or (up != NULL) a PUT of up's bytes
 * (size bytes) with the checksum header crc. 0 when answered 2xx. */
static int perform(xfer *d, const pw_xfer *x, const char *method, FILE *up, uint64_t size, const char *crc,
                   pw_err *err) {
  if (x->token && *x->token && (strlen(x->token) > 256 || strpbrk(x->token, "\r\n")))
    return pw_err_set(err, PW_EINVAL, WHERE, "%s %s: the cluster token is not a usable header value", method, d->url);
  CURL *h = curl_easy_init();
  if (!h) return pw_err_set(err, PW_ENOMEM, WHERE, "%s %s: cannot initialise libcurl", method, d->url);
  d->h = h;
  struct curl_slist *hdrs = NULL, *t;
  char line[400];
  int oom = 0;
  if (x->token && *x->token) {
    snprintf(line, sizeof line, "Authorization: Bearer %s", x->token);
    oom |= !(t = curl_slist_append(hdrs, line)), hdrs = t ? t : hdrs;
  }
  if (up) {
    snprintf(line, sizeof line, "X-Pipewright-Crc32c: %s", crc);
    oom |= !(t = curl_slist_append(hdrs, line)), hdrs = t ? t : hdrs;
    if (x->upload_token && *x->upload_token && strlen(x->upload_token) < 200 && !strpbrk(x->upload_token, "\r\n")) {
      snprintf(line, sizeof line, "X-Pipewright-Upload-Token: %s", x->upload_token);
      oom |= !(t = curl_slist_append(hdrs, line)), hdrs = t ? t : hdrs;
    }
    oom |= !(t = curl_slist_append(hdrs, "Content-Type: application/octet-stream")), hdrs = t ? t : hdrs;
    oom |= !(t = curl_slist_append(hdrs, "Expect:")), hdrs = t ? t : hdrs; /* no wait for 100-continue */
  }
  char errbuf[CURL_ERROR_SIZE] = "";
  CURLcode cc = oom ? CURLE_OUT_OF_MEMORY : pw_curl_setup(h, d->url, hdrs, errbuf, on_body, d, d->abort);
  if (up) {
    SETOPT(CURLOPT_UPLOAD, 1L);
    SETOPT(CURLOPT_READDATA, up);
    SETOPT(CURLOPT_INFILESIZE_LARGE, (curl_off_t)size);
  } else {
    SETOPT(CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)d->max);
  }
  int rc = 0;
  if (cc != CURLE_OK) {
    rc = pw_err_set(err, PW_EINVAL, WHERE, "%s %s: setting up the request: %s", method, d->url, curl_easy_strerror(cc));
  } else if ((cc = curl_easy_perform(h)) != CURLE_OK) {
    if (d->werr)
      rc = pw_err_set(err, PW_EIO, WHERE, "%s %s: writing the body: %s", method, d->url, strerror(d->werr));
    else if (d->over || cc == CURLE_FILESIZE_EXCEEDED)
      rc = pw_err_set(err, PW_ETOOBIG, WHERE, "%s %s: the body is over %" PRIu64 " bytes", method, d->url, d->max);
    else if (cc == CURLE_ABORTED_BY_CALLBACK)
      rc = pw_err_set(err, PW_ECANCELED, WHERE, "%s %s: cancelled", method, d->url);
    else
      rc = pw_err_set(err, PW_EPEER, WHERE, "%s %s: %s", method, d->url, errbuf[0] ? errbuf : curl_easy_strerror(cc));
  }
  if (!rc) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &d->status);
  curl_easy_cleanup(h);
  curl_slist_free_all(hdrs);
  d->h = NULL;
  if (rc || (d->status >= 200 && d->status < 300)) return rc;
  char text[300];
  pw_curl_answer_text(d->ebody, d->ebody_len, text, sizeof text);
  const char *sep = text[0] ? ": " : "";
  if (d->status == 401 || d->status == 403)
    return pw_err_set(err, PW_EAUTH, WHERE, "%s %s: HTTP %ld%s%s (%s)", method, d->url, d->status, sep, text,
                      x->token && *x->token ? "the coordinator refuses this worker's cluster token"
                                            : "this worker has no cluster token: give --token-file");
  return pw_err_set(err, d->status == 404 ? PW_ENOENT : PW_EIO, WHERE, "%s %s: HTTP %ld%s%s", method, d->url,
                    d->status, sep, text);
}

static int make_url(const pw_xfer *x, const char *url_path, char *url, size_t cap, pw_err *err) {
  if (!x->base_url || !*x->base_url)
    return pw_err_set(err, PW_EPROTO, WHERE, "the coordinator gave this worker no http_url for checkpoints");
  if (strncmp(x->base_url, "http://", 7) && strncmp(x->base_url, "https://", 8))
    return pw_err_set(err, PW_EPROTO, WHERE, "http_url '%.200s' is not an http:// or https:// URL", x->base_url);
  size_t n = strlen(x->base_url);
  while (n && x->base_url[n - 1] == '/') n--;
  int k = snprintf(url, cap, "%.*s%s", (int)n, x->base_url, url_path);
  return k < 0 || (size_t)k >= cap ? pw_err_set(err, PW_EINVAL, WHERE, "http_url is too long") : 0;
}

int pw_xfer_retryable(int rc, long status) {
  if (rc == PW_ECANCELED || rc == PW_EAUTH) return 0;
  if (status == 501 || status == 505) return 0; /* a server that takes no uploads at all */
  return rc == PW_EPEER || status == 0 || status == 429 || status >= 500;
}

int pw_xfer_put(const pw_xfer *x, const char *url_path, const char *path, long *status, pw_err *err) {
  char url[1200], crc[9];
  *status = 0;
  int rc = make_url(x, url_path, url, sizeof url, err);
  if (rc || (rc = pw_xfer_file_crc(path, crc, err))) return rc;
  FILE *f = fopen(path, "rbe");
  if (!f) return pw_err_set(err, PW_EIO, WHERE, "cannot open %s: %s", path, strerror(errno));
  long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (size < 0 || fseek(f, 0, SEEK_SET)) {
    fclose(f);
    return pw_err_set(err, PW_EIO, WHERE, "cannot size %s: %s", path, strerror(errno));
  }
  xfer d = {.url = url, .fd = -1, .abort = x->abort};
  rc = perform(&d, x, "PUT", f, (uint64_t)size, crc, err);
  fclose(f);
  *status = d.status;
  return rc;
}

int pw_xfer_get(const pw_xfer *x, const char *url_path, const char *path, uint64_t max, pw_err *err) {
  char url[1200], tmp[1100];
  int rc = make_url(x, url_path, url, sizeof url, err);
  if (rc) return rc;
  int k = snprintf(tmp, sizeof tmp, "%s.fetch-XXXXXX", path);
  if (k < 0 || (size_t)k >= sizeof tmp) return pw_err_set(err, PW_EINVAL, WHERE, "the path %s is too long", path);
  xfer d = {.url = url, .max = max, .abort = x->abort};
  if ((d.fd = mkostemp(tmp, O_CLOEXEC)) < 0)
    return pw_err_set(err, PW_EIO, WHERE, "cannot create %s: %s", tmp, strerror(errno));
  rc = perform(&d, x, "GET", NULL, 0, NULL, err);
  if (!rc && fsync(d.fd)) rc = pw_err_set(err, PW_EIO, WHERE, "cannot sync %s: %s", tmp, strerror(errno));
  close(d.fd);
  if (!rc && rename(tmp, path)) rc = pw_err_set(err, PW_EIO, WHERE, "cannot rename %s: %s", tmp, strerror(errno));
  if (rc) unlink(tmp);
  return rc;
}
