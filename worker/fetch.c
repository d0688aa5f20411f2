/* fetch: the worker's dataset cache (see fetch.h).
 *
 * Two locks. mu guards the index (entries, bytes) and is held only
 * briefly, never across a file or network operation, so the loop thread
 * can release an entry at any time. fetch_mu makes fetches, and the
 * evictions that make room for them, one at a time: a victim is taken out
 * of the index under mu, then its file removed without it; an acquire that
 * misses meanwhile waits on fetch_mu and fetches again. */
#include "fetch.h"

#include <ctype.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "curl_req.h"
#include "log.h"
#include "sha256.h"

#define TMP_PREFIX ".fetch-"
#define WHERE "data.dataset"
#define PATH_CAP 1024

typedef struct {
  char id[PW_SHA256_HEX_LEN + 1];
  uint64_t size;
  uint64_t used;           /* last use, ns since the epoch (the file's mtime) */
  int pins;                /* runs holding it */
  int present;             /* its file is in place (0 while a held entry is fetched again) */
} entry;

struct pw_dscache {
  char dir[640];
  uint64_t max;
  pthread_mutex_t mu;      /* e, n, cap, bytes, last_used */
  pthread_mutex_t fetch_mu;
  entry *e;
  int n, cap;
  uint64_t bytes;          /* of the present entries */
  uint64_t last_used;
};

/* ---- small helpers -------------------------------------------------------- */

int pw_dscache_id_ok(const char *id) {
  if (!id) return 0;
  for (int i = 0; i < PW_SHA256_HEX_LEN; i++)
    if (!isdigit((unsigned char)id[i]) && !(id[i] >= 'a' && id[i] <= 'f')) return 0;
  return id[PW_SHA256_HEX_LEN] == 0;
}

int pw_parse_bytes(const char *s, uint64_t *out) {
  if (!s || !isdigit((unsigned char)s[0])) return PW_EINVAL;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return PW_EINVAL;
  int shift = 0;
  switch (*end) {
    case 0: break;
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    case 't': case 'T': shift = 40; break;
    default: return PW_EINVAL;
  }
  if (*end && end[1] && strcmp(end + 1, "iB") && strcmp(end + 1, "B")) return PW_EINVAL;
  if (shift && v > (UINT64_MAX >> shift)) return PW_EINVAL;
  *out = (uint64_t)v << shift;
  return 0;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void entry_path(const pw_dscache *c, const char *id, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", c->dir, id);
}

/* mu held. */
static entry *find(pw_dscache *c, const char *id) {
  for (int i = 0; i < c->n; i++)
    if (!strcmp(c->e[i].id, id)) return &c->e[i];
  return NULL;
}

/* mu held. A new entry, not present, not held; NULL when out of memory. */
static entry *add(pw_dscache *c, const char *id) {
  if (c->n == c->cap) {
    int nc = c->cap ? c->cap * 2 : 16;
    entry *ne = realloc(c->e, sizeof *ne * (size_t)nc);
    if (!ne) return NULL;
    c->e = ne;
    c->cap = nc;
  }
  entry *e = &c->e[c->n++];
  memset(e, 0, sizeof *e);
  snprintf(e->id, sizeof e->id, "%.64s", id); /* ids are checked: 64 hex */
  return e;
}

/* mu held. */
static void drop(pw_dscache *c, entry *e) {
  if (e->present) c->bytes -= e->size;
  *e = c->e[--c->n];
}

/* mu held: the next use stamp (strictly increasing, so the order is total
 * even when the clock is coarse or steps back). */
static uint64_t stamp(pw_dscache *c) {
  uint64_t t = now_ns();
  c->last_used = t > c->last_used ? t : c->last_used + 1;
  return c->last_used;
}

/* The file's mtime records its last use, so the order survives a restart. */
static void touch(const char *path, uint64_t used) {
  struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT},
                           {.tv_sec = (time_t)(used / 1000000000u), .tv_nsec = (long)(used % 1000000000u)}};
  if (utimensat(AT_FDCWD, path, ts, 0)) pw_warn("dataset cache: cannot stamp %s: %s", path, strerror(errno));
}

static int mkdir_p(const char *dir, pw_err *err) {
  char p[640];
  snprintf(p, sizeof p, "%s", dir);
  for (char *s = p + 1;; s++) {
    if (*s && *s != '/') continue;
    char was = *s;
    *s = 0;
    if (mkdir(p, 0700) && errno != EEXIST)
      return pw_err_set(err, PW_EIO, "--state-dir", "cannot make %s: %s", p, strerror(errno));
    if (!(*s = was)) break;
  }
  struct stat sb;
  if (stat(dir, &sb) || !S_ISDIR(sb.st_mode))
    return pw_err_set(err, PW_EIO, "--state-dir", "%s is not a directory", dir);
  return 0;
}

static int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

/* ---- eviction -------------------------------------------------------------- */

/* fetch_mu held: evicts least recently used entries nothing holds until
 * `need` more bytes fit under the bound. The files go after mu is let go. */
static int make_room(pw_dscache *c, const char *id, uint64_t need, pw_err *err) {
  if (need > c->max)
    return pw_err_set(err, PW_ETOOBIG, WHERE,
                      "dataset %s is %" PRIu64 " bytes, more than the worker's whole cache (--cache-max %" PRIu64 ")",
                      id, need, c->max);
  char (*victims)[PW_SHA256_HEX_LEN + 1] = NULL;
  int nv = 0, rc = 0;
  uint64_t held = 0;
  pthread_mutex_lock(&c->mu);
  if (c->bytes + need > c->max && !(victims = malloc(sizeof *victims * (size_t)(c->n ? c->n : 1))))
    rc = pw_err_set(err, PW_ENOMEM, WHERE, "out of memory");
  while (!rc && c->bytes + need > c->max) {
    entry *lru = NULL;
    for (int i = 0; i < c->n; i++)
      if (c->e[i].present && !c->e[i].pins && (!lru || c->e[i].used < lru->used)) lru = &c->e[i];
    if (!lru) {
      for (int i = 0; i < c->n; i++) held += c->e[i].present ? c->e[i].size : 0;
      rc = pw_err_set(err, PW_ETOOBIG, WHERE,
                      "no room for dataset %s (%" PRIu64 " bytes): running jobs hold %" PRIu64
                      " bytes of the cache's %" PRIu64 " (--cache-max)",
                      id, need, held, c->max);
      break;
    }
    pw_info("dataset cache: evicting %s (%" PRIu64 " bytes, least recently used) for %s", lru->id, lru->size, id);
    memcpy(victims[nv++], lru->id, sizeof victims[0]);
    drop(c, lru);
  }
  pthread_mutex_unlock(&c->mu);
  for (int i = 0; i < nv; i++) {
    char path[PATH_CAP];
    entry_path(c, victims[i], path, sizeof path);
    if (unlink(path) && errno != ENOENT) pw_warn("dataset cache: cannot remove %s: %s", path, strerror(errno));
  }
  free(victims);
  return rc;
}

/* ---- the fetch ------------------------------------------------------------- */

typedef struct {
  pw_dscache *c;
  CURL *h;
  const char *id, *url, *tmp;
  const char *where, *missing; /* the error path ("data.dataset" | "init"); a 404's text */
  int fd;
  pw_sha256_ctx sha;
  uint64_t got, bound, stated;
  int started, over, werr, room_rc;
  pw_err room_err;
  long status;
  curl_off_t announced;
  char ebody[512];         /* the start of an error answer */
  size_t ebody_len;
  atomic_int *abort;
} dl;

static size_t on_body(char *p, size_t sz, size_t n, void *arg) {
  dl *d = arg;
  size_t k = sz * n;
  if (!d->started) {
    d->started = 1;
    curl_easy_getinfo(d->h, CURLINFO_RESPONSE_CODE, &d->status);
    if (d->status == 200) {
      curl_easy_getinfo(d->h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &d->announced);
      if (d->announced >= 0 && (uint64_t)d->announced > d->bound) {
        d->over = 1;
        return 0;
      }
      /* Room before the bytes land, when the size is known by now (the
       * stated size made room before the request). */
      if (!d->stated && d->announced > 0 &&
          (d->room_rc = make_room(d->c, d->id, (uint64_t)d->announced, &d->room_err)))
        return 0;
    }
  }
  if (d->status != 200) { /* an error answer: keep its start for the message */
    pw_curl_keep_answer(d->ebody, sizeof d->ebody, &d->ebody_len, p, k);
    return k;
  }
  if (k > d->bound - d->got) {
    d->over = 1;
    return 0;
  }
  if ((d->werr = pw_curl_write_all(d->fd, p, k))) return 0;
  pw_sha256_update(&d->sha, p, k);
  d->got += k;
  return k;
}

#define SETOPT(opt, val) (cc = cc ? cc : curl_easy_setopt(h, opt, val))

/* The request, its body into d->fd. 0 or an error naming the URL. */
static int http_get(dl *d, const char *token, pw_err *err) {
  CURL *h = curl_easy_init();
  if (!h) return pw_err_set(err, PW_ENOMEM, d->where, "GET %s: cannot initialise libcurl", d->url);
  d->h = h;
  char auth[PW_SHA256_HEX_LEN + 320] = "";
  struct curl_slist *hdrs = NULL;
  if (token && *token) {
    if (strlen(token) > 256 || strpbrk(token, "\r\n")) {
      curl_easy_cleanup(h);
      return pw_err_set(err, PW_EINVAL, d->where, "GET %s: the cluster token is not a usable header value", d->url);
    }
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    if (!(hdrs = curl_slist_append(NULL, auth))) {
      curl_easy_cleanup(h);
      return pw_err_set(err, PW_ENOMEM, d->where, "out of memory");
    }
  }
  char errbuf[CURL_ERROR_SIZE] = "";
  CURLcode cc = pw_curl_setup(h, d->url, hdrs, errbuf, on_body, d, d->abort);
  SETOPT(CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)d->bound);
  int rc = 0;
  if (cc != CURLE_OK) {
    rc = pw_err_set(err, PW_EINVAL, d->where, "GET %s: setting up the request: %s", d->url, curl_easy_strerror(cc));
  } else if ((cc = curl_easy_perform(h)) != CURLE_OK) {
    const char *why = errbuf[0] ? errbuf : curl_easy_strerror(cc);
    if (d->room_rc) {
      *err = d->room_err;
      rc = d->room_rc;
    } else if (d->werr) {
      rc = pw_err_set(err, PW_EIO, d->where, "GET %s: writing %s: %s", d->url, d->tmp, strerror(d->werr));
    } else if (d->over || cc == CURLE_FILESIZE_EXCEEDED) {
      rc = pw_err_set(err, PW_ETOOBIG, d->where, "GET %s: the body is over %" PRIu64 " bytes (%s)", d->url, d->bound,
                      d->stated ? "the size the job states" : "the cache's bound, --cache-max");
    } else if (cc == CURLE_ABORTED_BY_CALLBACK) {
      rc = pw_err_set(err, PW_ECANCELED, d->where, "GET %s: cancelled", d->url);
    } else {
      rc = pw_err_set(err, PW_EPEER, d->where, "GET %s: %s", d->url, why);
    }
  }
  if (!rc) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &d->status);
  curl_easy_cleanup(h);
  curl_slist_free_all(hdrs);
  d->h = NULL;
  if (rc || d->status == 200) return rc;
  char text[200];
  pw_curl_answer_text(d->ebody, d->ebody_len, text, sizeof text);
  const char *sep = text[0] ? ": " : "";
  if (d->status == 401 || d->status == 403)
    return pw_err_set(err, PW_EAUTH, d->where, "GET %s: HTTP %ld%s%s (%s)", d->url, d->status, sep, text,
                      token && *token ? "the coordinator refuses this worker's cluster token"
                                      : "this worker has no cluster token: give --token-file");
  if (d->status == 404)
    return pw_err_set(err, PW_ENOENT, d->where, "GET %s: HTTP 404: %s", d->url,
                      text[0] ? text : d->missing);
  return pw_err_set(err, PW_EIO, d->where, "GET %s: HTTP %ld%s%s", d->url, d->status, sep, text);
}

/* fetch_mu held: fetches id into a temporary file of the cache directory,
 * checks its size and hash, makes room for it, renames it into place, and
 * records it as present with `pins` more holders. */
static int fetch_install(pw_dscache *c, const char *id, const pw_fetch_src *src, int pins, pw_err *err) {
  const char *base = src ? src->base_url : NULL;
  int wt = src && src->weights;
  const char *what = wt ? "weights" : "dataset"; /* in messages; where: the error path */
  const char *where = wt ? "init" : WHERE;
  if (!base || !*base)
    return pw_err_set(err, PW_EPROTO, where,
                      "%s %s: the coordinator gave this worker no http_url to fetch it from", what, id);
  if (strncmp(base, "http://", 7) && strncmp(base, "https://", 8))
    return pw_err_set(err, PW_EPROTO, where, "%s %s: http_url '%.200s' is not an http:// or https:// URL", what, id,
                      base);
  size_t bl = strlen(base);
  while (bl > 0 && base[bl - 1] == '/') bl--;
  char url[1024];
  if (snprintf(url, sizeof url, "%.*s/v1/%s/%s/content", (int)bl, base, wt ? "checkpoints" : "datasets", id) >=
      (int)sizeof url)
    return pw_err_set(err, PW_EINVAL, where, "%s %s: http_url is too long", what, id);
  uint64_t stated = src->size;
  int rc;
  if (stated && (rc = make_room(c, id, stated, err))) return rc;
  char tmp[PATH_CAP];
  snprintf(tmp, sizeof tmp, "%s/" TMP_PREFIX "%.16s-XXXXXX", c->dir, id);
  int fd = mkostemp(tmp, O_CLOEXEC);
  if (fd < 0) return pw_err_set(err, PW_EIO, where, "%s %s: cannot make %s: %s", what, id, tmp, strerror(errno));
  dl d = {.c = c, .id = id, .url = url, .tmp = tmp, .fd = fd, .stated = stated, .bound = stated ? stated : c->max,
          .announced = -1, .abort = src->abort, .where = where,
          .missing = wt ? "the coordinator has no such weights" : "the coordinator has no such dataset"};
  pw_sha256_init(&d.sha);
  pw_info("%s %s: fetching %s", what, id, url);
  rc = http_get(&d, src->token, err);
  if (!rc && stated && d.got != stated)
    rc = pw_err_set(err, PW_EIO, where, "GET %s: %" PRIu64 " bytes, but the job states %" PRIu64, url, d.got, stated);
  if (!rc) {
    uint8_t dig[PW_SHA256_LEN];
    char hex[PW_SHA256_HEX_LEN + 1];
    pw_sha256_final(&d.sha, dig);
    pw_sha256_to_hex(dig, hex);
    if (strcmp(hex, id))
      rc = pw_err_set(err, PW_EIO, where, "GET %s: the body's sha256 is %s, expected %s", url, hex, id);
  }
  if (!rc && fsync(fd)) rc = pw_err_set(err, PW_EIO, where, "%s %s: fsync %s: %s", what, id, tmp, strerror(errno));
  if (close(fd) && !rc) rc = pw_err_set(err, PW_EIO, where, "%s %s: close %s: %s", what, id, tmp, strerror(errno));
  if (!rc && !stated) rc = make_room(c, id, d.got, err);
  char path[PATH_CAP];
  entry_path(c, id, path, sizeof path);
  if (!rc && rename(tmp, path))
    rc = pw_err_set(err, PW_EIO, where, "%s %s: rename to %s: %s", what, id, path, strerror(errno));
  if (rc) {
    if (unlink(tmp) && errno != ENOENT) pw_warn("dataset cache: cannot remove %s: %s", tmp, strerror(errno));
    return rc;
  }
  if (fsync_dir(c->dir)) pw_warn("dataset cache: fsync %s: %s", c->dir, strerror(errno));
  pthread_mutex_lock(&c->mu);
  entry *e = find(c, id);
  if (!e) e = add(c, id);
  if (e) {
    e->present = 1;
    e->size = d.got;
    e->used = stamp(c);
    e->pins += pins;
    c->bytes += d.got;
  }
  uint64_t used = e ? e->used : 0;
  pthread_mutex_unlock(&c->mu);
  if (!e) {
    unlink(path);
    return pw_err_set(err, PW_ENOMEM, where, "out of memory");
  }
  touch(path, used);
  pw_info("%s %s: %" PRIu64 " bytes fetched and verified", what, id, d.got);
  return 0;
}

/* ---- the cache --------------------------------------------------------------- */

int pw_dscache_open(const char *state_dir, uint64_t max_bytes, pw_dscache **out, pw_err *err) {
  *out = NULL;
  if (max_bytes == 0) return pw_err_set(err, PW_EINVAL, "--cache-max", "must be > 0");
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return pw_err_set(err, PW_EINTERNAL, "libcurl", "curl_global_init failed");
  pw_dscache *c = calloc(1, sizeof *c);
  if (!c) {
    curl_global_cleanup();
    return pw_err_set(err, PW_ENOMEM, "cache", "out of memory");
  }
  c->max = max_bytes;
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->fetch_mu, NULL);
  *out = c;
  if (snprintf(c->dir, sizeof c->dir, "%s/cache/datasets", state_dir) >= (int)sizeof c->dir) {
    pw_dscache_close(c);
    *out = NULL;
    return pw_err_set(err, PW_EINVAL, "--state-dir", "path too long");
  }
  int rc = mkdir_p(c->dir, err);
  DIR *dir = rc ? NULL : opendir(c->dir);
  if (!rc && !dir) rc = pw_err_set(err, PW_EIO, "--state-dir", "cannot read %s: %s", c->dir, strerror(errno));
  for (struct dirent *de; !rc && (de = readdir(dir));) {
    char path[PATH_CAP];
    entry_path(c, de->d_name, path, sizeof path);
    if (!strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX))) { /* an interrupted fetch */
      if (unlink(path)) pw_warn("dataset cache: cannot remove %s: %s", path, strerror(errno));
      continue;
    }
    struct stat sb;
    if (!pw_dscache_id_ok(de->d_name) || stat(path, &sb) || !S_ISREG(sb.st_mode)) continue;
    entry *e = add(c, de->d_name);
    if (!e) {
      rc = pw_err_set(err, PW_ENOMEM, "cache", "out of memory");
      break;
    }
    e->present = 1;
    e->size = (uint64_t)sb.st_size;
    e->used = (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec;
    c->bytes += e->size;
    if (e->used > c->last_used) c->last_used = e->used;
  }
  if (dir) closedir(dir);
  if (!rc && c->bytes > c->max) rc = make_room(c, "(start-up)", 0, err);
  if (rc) {
    pw_dscache_close(c);
    *out = NULL;
    return rc;
  }
  pw_info("dataset cache %s: %d entries, %" PRIu64 " of %" PRIu64 " bytes", c->dir, c->n, c->bytes, c->max);
  return 0;
}

void pw_dscache_close(pw_dscache *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->fetch_mu);
  free(c->e);
  free(c);
  curl_global_cleanup();
}

static int bad_id(const char *id, pw_err *err) {
  return pw_err_set(err, PW_EINVAL, WHERE, "'%.80s' is not a dataset id (64 lowercase hex characters)", id ? id : "");
}

/* mu held: takes a present entry (a hit). */
static int hit(pw_dscache *c, const char *id, uint64_t *used) {
  entry *e = find(c, id);
  if (!e || !e->present) return 0;
  e->pins++;
  *used = e->used = stamp(c);
  return 1;
}

int pw_dscache_acquire(pw_dscache *c, const char *id, const pw_fetch_src *src, char *path, size_t cap, pw_err *err) {
  if (!pw_dscache_id_ok(id)) return bad_id(id, err);
  if (cap < strlen(c->dir) + PW_SHA256_HEX_LEN + 2) return pw_err_set(err, PW_EINVAL, WHERE, "path buffer too small");
  entry_path(c, id, path, cap);
  uint64_t used;
  pthread_mutex_lock(&c->mu);
  int found = hit(c, id, &used);
  pthread_mutex_unlock(&c->mu);
  if (!found) {
    pthread_mutex_lock(&c->fetch_mu);
    pthread_mutex_lock(&c->mu); /* another fetch may have brought it meanwhile */
    found = hit(c, id, &used);
    pthread_mutex_unlock(&c->mu);
    int rc = found ? 0 : fetch_install(c, id, src, 1, err);
    pthread_mutex_unlock(&c->fetch_mu);
    if (rc) return rc;
    if (!found) return 0; /* fetch_install stamped it */
  }
  touch(path, used);
  pw_debug("dataset %s: in the cache", id);
  return 0;
}

int pw_dscache_refetch(pw_dscache *c, const char *id, const pw_fetch_src *src, pw_err *err) {
  if (!pw_dscache_id_ok(id)) return bad_id(id, err);
  char path[PATH_CAP];
  entry_path(c, id, path, sizeof path);
  pthread_mutex_lock(&c->fetch_mu);
  pthread_mutex_lock(&c->mu);
  entry *e = find(c, id);
  int held = e && e->pins > 0;
  if (held && e->present) {
    c->bytes -= e->size;
    e->present = 0;
  }
  pthread_mutex_unlock(&c->mu);
  int rc;
  if (!held) {
    rc = pw_err_set(err, PW_EINVAL, WHERE, "dataset %s is not held: acquire it first", id);
  } else {
    pw_warn("dataset %s: the cached copy is corrupted: deleting it and fetching it again", id);
    if (unlink(path) && errno != ENOENT) pw_warn("dataset cache: cannot remove %s: %s", path, strerror(errno));
    rc = fetch_install(c, id, src, 0, err);
  }
  pthread_mutex_unlock(&c->fetch_mu);
  return rc;
}

void pw_dscache_release(pw_dscache *c, const char *id) {
  pthread_mutex_lock(&c->mu);
  entry *e = find(c, id);
  if (e && e->pins > 0) e->pins--;
  if (e && !e->pins && !e->present) drop(c, e); /* fetched again in vain: nothing on disk */
  pthread_mutex_unlock(&c->mu);
}

int pw_dscache_verify(const char *path, const char *id, pw_err *err) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return pw_err_set(err, PW_EIO, WHERE, "cannot open %s: %s", path, strerror(errno));
  size_t cap = (size_t)1 << 20;
  uint8_t *buf = malloc(cap);
  if (!buf) {
    close(fd);
    return pw_err_set(err, PW_ENOMEM, WHERE, "out of memory");
  }
  pw_sha256_ctx sha;
  pw_sha256_init(&sha);
  int rc = 0;
  for (;;) {
    ssize_t n = read(fd, buf, cap);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      rc = pw_err_set(err, PW_EIO, WHERE, "reading %s: %s", path, strerror(errno));
      break;
    }
    if (n == 0) break;
    pw_sha256_update(&sha, buf, (size_t)n);
  }
  free(buf);
  close(fd);
  if (rc) return rc;
  uint8_t dig[PW_SHA256_LEN];
  char hex[PW_SHA256_HEX_LEN + 1];
  pw_sha256_final(&sha, dig);
  pw_sha256_to_hex(dig, hex);
  if (strcmp(hex, id)) return pw_err_set(err, PW_EIO, WHERE, "%s: sha256 is %s, expected %s", path, hex, id);
  return 0;
}

int pw_dscache_open_entry(pw_dscache *c, const char *id, const pw_fetch_src *src, pw_dscache_open_fn open_fn,
                          void *arg, pw_err *err) {
  char path[PATH_CAP];
  int rc = pw_dscache_acquire(c, id, src, path, sizeof path, err);
  if (rc) return rc;
  if (!(rc = open_fn(arg, path, err))) return 0;
  /* The open failed: for the file's sake (corrupted on disk since it was
   * fetched), or for its content's (the job's error, which stands)? */
  pw_err verr = {0};
  if (pw_dscache_verify(path, id, &verr) == 0) {
    pw_dscache_release(c, id);
    return rc;
  }
  char b[512];
  pw_warn("dataset %s: %s", id, pw_err_str(&verr, b, sizeof b));
  if (!(rc = pw_dscache_refetch(c, id, src, err))) rc = open_fn(arg, path, err);
  if (rc) pw_dscache_release(c, id);
  return rc;
}

uint64_t pw_dscache_bytes(pw_dscache *c) {
  pthread_mutex_lock(&c->mu);
  uint64_t b = c->bytes;
  pthread_mutex_unlock(&c->mu);
  return b;
}

int pw_dscache_count(pw_dscache *c) {
  pthread_mutex_lock(&c->mu);
  int n = 0;
  for (int i = 0; i < c->n; i++) n += c->e[i].present;
  pthread_mutex_unlock(&c->mu);
  return n;
}

int pw_dscache_has(pw_dscache *c, const char *id) {
  pthread_mutex_lock(&c->mu);
  entry *e = find(c, id);
  int has = e && e->present;
  pthread_mutex_unlock(&c->mu);
  return has;
}
