/* api_data: a submitted job's data, before it is queued.
 *
 * data.path is a file on the coordinator's host, so it is read only under
 * --data-root (none by default: every path is refused). The path, joined to
 * the root when relative and folded ("." and ".."), must be inside the root
 * by its spelling; then it is opened once, beneath the root (openat2
 * RESOLVE_BENEATH: no symlink or ".." out of it; where the kernel has no
 * openat2, a walk that follows no symlink at all), non-blocking (a FIFO
 * cannot hold the request), and checked on the open descriptor: a regular
 * file. Everything after reads that descriptor, so nothing swapped in
 * between check and use is read. Anything else is a 422 at data.path naming
 * the path and the root. An accepted file is imported into the dataset store
 * (hashed and copied, on the pool thread the submission runs on) and the job
 * reads that dataset: workers on other hosts fetch it by its id, never by a
 * path. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "api.h"
#include "datasets.h"
#include "log.h"

/* Is real (a resolved path) root itself or inside it? */
static int under_root(const char *real, const char *root) {
  size_t n = strlen(root);
  if (n == 1 && root[0] == '/') return 1;
  return !strncmp(real, root, n) && (real[n] == 0 || real[n] == '/');
}

/* path with ".", ".." and repeated slashes folded, symlinks not followed
 * (in place; path is absolute). */
static void fold(char *path) {
  char *out = path, *p = path;
  while (*p) {
    while (*p == '/') p++;
    char *seg = p;
    while (*p && *p != '/') p++;
    size_t n = (size_t)(p - seg);
    if (n == 0 || (n == 1 && seg[0] == '.')) continue;
    if (n == 2 && seg[0] == '.' && seg[1] == '.') {
      while (out > path && *--out != '/') {
      }
      continue;
    }
    *out++ = '/';
    memmove(out, seg, n);
    out += n;
  }
  if (out == path) *out++ = '/';
  *out = 0;
}

/* rel (a folded path relative to the directory dfd, no "." or "..")
 * opened for reading by a walk that follows no symlink: the fallback for
 * kernels without openat2. Returns a descriptor or -1 with errno. */
static int open_walk(int dfd, const char *rel, int flags) {
  char part[PATH_MAX];
  int cur = dfd;
  for (;;) {
    const char *slash = strchr(rel, '/');
    if (!slash) break;
    size_t n = (size_t)(slash - rel);
    if (n >= sizeof part) {
      errno = ENAMETOOLONG;
      goto fail;
    }
    memcpy(part, rel, n);
    part[n] = 0;
    int next = openat(cur, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) goto fail;
    if (cur != dfd) close(cur);
    cur = next;
    rel = slash + 1;
  }
  int fd = openat(cur, rel, flags | O_NOFOLLOW);
  int e = errno;
  if (cur != dfd) close(cur);
  errno = e;
  return fd;
fail:
  e = errno;
  if (cur != dfd) close(cur);
  errno = e;
  return -1;
}

/* rel opened beneath root: never a file outside it, by symlink or "..". */
static int open_beneath(const char *root, const char *rel, int flags) {
  int dfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -1;
  struct open_how how = {.flags = (unsigned long long)flags, .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
  int fd = (int)syscall(SYS_openat2, dfd, rel, &how, sizeof how);
  if (fd < 0 && (errno == ENOSYS || errno == EPERM)) /* no openat2 here (old kernel, a seccomp filter) */
    fd = open_walk(dfd, rel, flags);
  int e = errno;
  close(dfd);
  errno = e;
  return fd;
}

int pw_api_data_check(pw_req *r, pw_store *s, const pw_job *job, int *fd) {
  const char *given = job->data.path, *root = r->c->data_root;
  *fd = -1;
  if (job->data.kind != PW_DATA_TEXT && job->data.kind != PW_DATA_TOKENS && job->data.kind != PW_DATA_LABELED) return 0;
  if (given[0] && job->data.dataset[0]) {
    pw_reply_error(r, PW_ESPEC, "data", "give data.path or data.dataset, not both");
    return PW_ESPEC;
  }
  if (job->data.dataset[0]) { /* known here, so an unknown id is refused before planning */
    json_t *row = NULL;
    pw_err err = {0};
    int rc = pw_store_dataset_json(s, job->data.dataset, &row, &err);
    json_decref(row);
    if (rc == PW_ENOENT)
      pw_reply_error(r, PW_ESPEC, "data.dataset", "no dataset %s is stored (upload it: POST /v1/datasets)",
                     job->data.dataset);
    else if (rc)
      pw_reply_err(r, &err);
    return rc;
  }
  if (!given[0]) return 0;
  if (!root[0]) {
    pw_reply_error(r, PW_ESPEC, "data.path",
                   "\"%.300s\": this coordinator reads no local files (no --data-root is set): upload the file "
                   "(POST /v1/datasets, pipewright dataset upload) and name it as data.dataset",
                   given);
    return PW_ESPEC;
  }
  char joined[PATH_MAX * 2];
  snprintf(joined, sizeof joined, given[0] == '/' ? "%s" : "%s/%s", given[0] == '/' ? given : root, given);
  /* outside by its very spelling: refused before the file is looked at, so
   * the answer says nothing about what exists outside the root */
  fold(joined);
  if (!under_root(joined, root)) {
    pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\" resolves outside the data root %s", given, root);
    return PW_ESPEC;
  }
  size_t n = strlen(root) == 1 ? 0 : strlen(root); /* joined minus the root and its slash */
  const char *rel = joined[n] == '/' ? joined + n + 1 : joined + n;
  if (!rel[0]) rel = ".";
  int f = open_beneath(root, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (f < 0) {
    int e = errno;
    if (e == EXDEV || e == ELOOP) /* a link (or "..") that leads out, or a link where none may be */
      pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\" resolves outside the data root %s", given, root);
    else if (e == ENOENT || e == ENOTDIR)
      pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\": no such file under the data root %s", given, root);
    else
      pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\" cannot be read: %s (data root %s)", given, strerror(e),
                     root);
    return PW_ESPEC;
  }
  /* the resolved path is never shown: it would map the host's files for the client */
  struct stat st;
  if (fstat(f, &st) || !S_ISREG(st.st_mode)) {
    close(f);
    pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\" is not a regular file (data root %s)", given, root);
    return PW_ESPEC;
  }
  *fd = f;
  return 0;
}

/* Imports the open file fd; a token file whose header is wrong is the
 * spec's fault (422 at data.path), anything else the coordinator's. */
static int import(pw_req *r, pw_store *s, const char *given, int fd, pw_ds_info *info) {
  pw_err err = {0};
  int rc = pw_ds_import(r->c->state_dir, fd, "data.path", info, &err);
  if (!rc) {
    pw_dataset_new d = {.id = info->id,
                        .size = info->size,
                        .format = info->format,
                        .name = strrchr(given, '/') ? strrchr(given, '/') + 1 : given,
                        .vocab_size = info->vocab_size,
                        .width = info->width,
                        .n_tokens = info->n_tokens};
    int created = 0;
    rc = pw_store_dataset_insert(s, &d, &created, NULL, &err);
    if (!rc && created)
      pw_info("dataset %s imported from data.path \"%.300s\": %lld bytes, %s", info->id, given, (long long)info->size,
              info->format);
  }
  if (rc == PW_EFORMAT) {
    pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\": %s", given, err.msg);
  } else if (rc) {
    char b[600];
    pw_error("submit: importing data.path \"%.300s\": %s", given, pw_err_str(&err, b, sizeof b));
    pw_reply_err(r, &err);
  }
  return rc;
}

/* The stored dataset fits the job: kind tokens needs a token file, whose
 * vocabulary the model must cover. where: the field the user wrote. */
static int fits(pw_req *r, const pw_job *job, const json_t *row, int model_vocab, const char *where,
                const char *name) {
  const char *fmt = json_string_value(json_object_get(row, "format"));
  json_int_t vocab = json_integer_value(json_object_get(row, "vocab_size"));
  if (job->data.kind == PW_DATA_TOKENS && (!fmt || strcmp(fmt, "tokens"))) {
    pw_reply_error(r, PW_ESPEC, where, "data.kind is tokens but %s is %s, not a token file (PWTOKENS)", name,
                   fmt ? fmt : "?");
    return PW_ESPEC;
  }
  if (job->data.kind == PW_DATA_LABELED && fmt && !strcmp(fmt, "tokens")) {
    pw_reply_error(r, PW_ESPEC, where, "data.kind is labeled but %s is a token file; labeled sequences are JSON Lines",
                   name);
    return PW_ESPEC;
  }
  if (fmt && !strcmp(fmt, "tokens") && model_vocab > 0 && vocab > model_vocab) {
    pw_reply_error(r, PW_ESPEC, where, "the token file %s has vocab_size %lld, more than the model's %d", name,
                   (long long)vocab, model_vocab);
    return PW_ESPEC;
  }
  return 0;
}

int pw_api_data_resolve(pw_req *r, pw_store *s, pw_job *job, int fd, int model_vocab) {
  const char *where = fd >= 0 ? "data.path" : "data.dataset";
  char name[400]; /* what the user wrote */
  if (fd >= 0)
    snprintf(name, sizeof name, "\"%.300s\"", job->data.path);
  else
    snprintf(name, sizeof name, "dataset %.12s...", job->data.dataset);
  if (fd >= 0) {
    pw_ds_info info;
    if (import(r, s, job->data.path, fd, &info)) return -1;
    memcpy(job->data.dataset, info.id, sizeof job->data.dataset);
    job->data.path[0] = 0; /* workers fetch it by id, on any host */
  }
  if (!job->data.dataset[0]) return 0;
  json_t *row = NULL;
  pw_err err = {0};
  int rc = pw_store_dataset_json(s, job->data.dataset, &row, &err);
  if (rc == PW_ENOENT)
    pw_reply_error(r, PW_ESPEC, where, "no dataset %s is stored (deleted meanwhile?)", job->data.dataset);
  else if (rc)
    pw_reply_err(r, &err);
  if (!rc) rc = fits(r, job, row, model_vocab, where, name);
  json_decref(row);
  return rc;
}
