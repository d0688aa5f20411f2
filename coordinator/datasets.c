/* datasets: content-addressed dataset files (datasets.h). */
#include "datasets.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "log.h"
#include "sha256.h"
#include "tokfile.h"

#define TMP_PREFIX ".upload-"
#define HEAD_KEEP 32 /* the first bytes, for the format (a token file's header is 32 bytes) */

struct pw_ds_writer {
  int fd;
  int committed;
  char dir[PATH_MAX];
  char tmp[PATH_MAX];
  pw_sha256_ctx sha;
  uint64_t size;
  uint8_t head[HEAD_KEEP];
  /* a token file's ids, checked as they arrive */
  int hdr_tried, tok;
  pw_tokfile_hdr hdr;
  uint8_t carry[4];        /* the bytes of an id cut between two pieces */
  uint32_t carry_n;
  uint64_t ids_seen;
  int bad_id;
  char bad_id_msg[384];    /* the first id over the vocabulary */
};

int pw_ds_id_valid(const char *s) {
  if (!s) return 0;
  for (int i = 0; i < PW_DS_ID_LEN; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return s[PW_DS_ID_LEN] == 0;
}

static int sub_dir(const char *state_dir, const char *sub, char *out, size_t cap, pw_err *err) {
  int n = snprintf(out, cap, "%s/%s", state_dir, sub);
  if (n < 0 || (size_t)n >= cap) return pw_err_set(err, PW_EINVAL, "state_dir", "the state directory path is too long");
  return 0;
}

static int ds_dir(const char *state_dir, char *out, size_t cap, pw_err *err) {
  return sub_dir(state_dir, "datasets", out, cap, err);
}

int pw_ds_path(const char *state_dir, const char *id, char *out, size_t cap, pw_err *err) {
  if (!pw_ds_id_valid(id)) return pw_err_set(err, PW_EINVAL, "id", "a dataset id is 64 lowercase hex digits");
  int n = snprintf(out, cap, "%s/datasets/%s", state_dir, id);
  if (n < 0 || (size_t)n >= cap) return pw_err_set(err, PW_EINVAL, "state_dir", "the state directory path is too long");
  return 0;
}

/* A failed write or sync: a full disk or quota is PW_ENOSPC (507). */
static int io_fail(int e, const char *file, const char *what, pw_err *err) {
  int code = e == ENOSPC || e == EDQUOT ? PW_ENOSPC : PW_EIO;
  return pw_err_set(err, code, "body", "%s %s: %s", what, file, strerror(e));
}

int pw_ds_writer_open(const char *state_dir, pw_ds_writer **out, pw_err *err) {
  return pw_ds_writer_open_in(state_dir, "datasets", out, err);
}

int pw_ds_writer_open_in(const char *state_dir, const char *sub, pw_ds_writer **out, pw_err *err) {
  *out = NULL;
  pw_ds_writer *w = calloc(1, sizeof *w);
  if (!w) return pw_err_set(err, PW_ENOMEM, "body", "out of memory");
  w->fd = -1;
  int rc = sub_dir(state_dir, sub, w->dir, sizeof w->dir, err);
  if (rc) goto fail;
  if (mkdir(w->dir, 0700) && errno != EEXIST) {
    rc = io_fail(errno, w->dir, "cannot create", err);
    goto fail;
  }
  int n = snprintf(w->tmp, sizeof w->tmp, "%s/" TMP_PREFIX "XXXXXX", w->dir);
  if (n < 0 || (size_t)n >= sizeof w->tmp) {
    rc = pw_err_set(err, PW_EINVAL, "state_dir", "the state directory path is too long");
    goto fail;
  }
  if ((w->fd = mkostemp(w->tmp, O_CLOEXEC)) < 0) {
    rc = io_fail(errno, w->tmp, "cannot create", err);
    goto fail;
  }
  pw_sha256_init(&w->sha);
  *out = w;
  return 0;
fail:
  free(w);
  return rc;
}

/* n ids of a token file, the first being id number first. */
static void ids_check(pw_ds_writer *w, const uint8_t *ids, uint64_t n, uint64_t first) {
  pw_err e = {0};
  if (n && !w->bad_id && pw_tokfile_check_ids(ids, n, first, &w->hdr, "ids", &e)) {
    w->bad_id = 1;
    snprintf(w->bad_id_msg, sizeof w->bad_id_msg, "%s", e.msg);
  }
}

/* The ids in p[0..n), which start at byte off of the file. */
static void ids_take(pw_ds_writer *w, const uint8_t *p, size_t n, uint64_t off) {
  if (!w->tok || w->bad_id || off + n <= PW_TOKFILE_HEADER) return;
  if (off < PW_TOKFILE_HEADER) {
    size_t skip = (size_t)(PW_TOKFILE_HEADER - off);
    p += skip;
    n -= skip;
  }
  uint32_t wd = w->hdr.width;
  while (w->carry_n && n) {
    if (w->carry_n >= sizeof w->carry) return; /* width <= 4: never; tells GCC the bound */
    w->carry[w->carry_n++] = *p++;
    n--;
    if (w->carry_n == wd) {
      ids_check(w, w->carry, 1, w->ids_seen++);
      w->carry_n = 0;
    }
  }
  uint64_t k = n / wd;
  ids_check(w, p, k, w->ids_seen);
  w->ids_seen += k;
  w->carry_n = (uint32_t)(n - k * wd);
  memcpy(w->carry, p + k * wd, w->carry_n);
}

int pw_ds_writer_write(pw_ds_writer *w, const void *data, size_t n, pw_err *err) {
  const uint8_t *p = data;
  if (w->size < HEAD_KEEP) {
    size_t k = HEAD_KEEP - (size_t)w->size < n ? HEAD_KEEP - (size_t)w->size : n;
    memcpy(w->head + w->size, p, k);
  }
  if (!w->hdr_tried && w->size + n >= HEAD_KEEP) {
    w->hdr_tried = 1; /* a header that does not parse is reported at commit */
    w->tok = pw_tokfile_is_tokens(w->head, HEAD_KEEP) &&
             !pw_tokfile_header_parse(w->head, HEAD_KEEP, 0, &w->hdr, "", NULL);
  }
  ids_take(w, p, n, w->size);
  pw_sha256_update(&w->sha, p, n);
  int e = pw_ds_write_all(w->fd, p, n);
  if (e) return io_fail(e, w->tmp, "cannot write", err);
  w->size += n;
  return 0;
}

int pw_ds_write_all(int fd, const void *data, size_t n) {
  const uint8_t *p = data;
  for (size_t off = 0; off < n;) {
    ssize_t k = write(fd, p + off, n - off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return k < 0 ? errno : EIO;
    off += (size_t)k;
  }
  return 0;
}

uint64_t pw_ds_writer_size(const pw_ds_writer *w) { return w->size; }
const char *pw_ds_writer_tmp_path(const pw_ds_writer *w) { return w->tmp; }

/* The format from the first bytes: a file with the token magic must be a
 * whole token file (header right, size = header + its ids); its ids are
 * checked as they stream in (pw_ds_writer_write). */
static int detect_format(const pw_ds_writer *w, const char *what, pw_ds_info *info, pw_err *err) {
  info->vocab_size = info->width = info->n_tokens = -1;
  size_t n = w->size < HEAD_KEEP ? (size_t)w->size : HEAD_KEEP;
  if (!pw_tokfile_is_tokens(w->head, n)) {
    snprintf(info->format, sizeof info->format, "text");
    return 0;
  }
  pw_tokfile_hdr h;
  int rc = pw_tokfile_header_parse(w->head, n, w->size, &h, what, err);
  if (rc) return rc;
  if (w->bad_id) return pw_err_set(err, PW_EFORMAT, what, "%s", w->bad_id_msg);
  snprintf(info->format, sizeof info->format, "tokens");
  info->vocab_size = h.vocab_size;
  info->width = h.width;
  info->n_tokens = (int64_t)h.n_tokens;
  return 0;
}

int pw_ds_writer_commit(pw_ds_writer *w, const char *what, pw_ds_info *info, pw_err *err) {
  memset(info, 0, sizeof *info);
  uint8_t d[PW_SHA256_LEN];
  pw_sha256_final(&w->sha, d);
  pw_sha256_to_hex(d, info->id);
  info->size = (int64_t)w->size;
  int rc = detect_format(w, what, info, err);
  if (rc) return rc;
  if (fsync(w->fd)) return io_fail(errno, w->tmp, "cannot sync", err);
  char final[PATH_MAX];
  int n = snprintf(final, sizeof final, "%s/%s", w->dir, info->id);
  if (n < 0 || (size_t)n >= sizeof final) return pw_err_set(err, PW_EINVAL, "state_dir", "the path is too long");
  /* Same id, same bytes: replacing an existing file changes nothing a
   * reader sees (an open one keeps its file), and heals a damaged one. */
  return pw_ds_publish(w->tmp, final, w->dir, &w->committed, err);
}

int pw_ds_publish(const char *tmp, const char *final, const char *dir, int *committed, pw_err *err) {
  if (rename(tmp, final)) return io_fail(errno, final, "cannot rename into", err);
  *committed = 1;
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || fsync(dfd)) {
    int e = errno;
    if (dfd >= 0) close(dfd);
    return io_fail(e, dir, "cannot sync", err);
  }
  close(dfd);
  return 0;
}

void pw_ds_writer_free(pw_ds_writer *w) {
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  if (!w->committed && unlink(w->tmp) && errno != ENOENT)
    pw_warn("datasets: cannot remove %s: %s", w->tmp, strerror(errno));
  free(w);
}

int pw_ds_import(const char *state_dir, int fd, const char *what, pw_ds_info *info, pw_err *err) {
  pw_ds_writer *w = NULL;
  enum { PIECE = 1 << 20 };
  char *buf = malloc(PIECE);
  int rc = buf ? pw_ds_writer_open(state_dir, &w, err) : pw_err_set(err, PW_ENOMEM, what, "out of memory");
  while (!rc) {
    ssize_t k = read(fd, buf, PIECE);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) rc = pw_err_set(err, PW_EIO, what, "cannot read the file: %s", strerror(errno));
    if (k <= 0) break;
    rc = pw_ds_writer_write(w, buf, (size_t)k, err);
  }
  if (!rc) rc = pw_ds_writer_commit(w, what, info, err);
  pw_ds_writer_free(w);
  free(buf);
  return rc;
}

int pw_ds_unlink(const char *state_dir, const char *id, pw_err *err) {
  char path[PATH_MAX];
  int rc = pw_ds_path(state_dir, id, path, sizeof path, err);
  if (rc) return rc;
  if (unlink(path) && errno != ENOENT) return pw_err_set(err, PW_EIO, "id", "cannot remove %s: %s", path, strerror(errno));
  return 0;
}

int pw_ds_sweep(const char *state_dir) { return pw_ds_sweep_in(state_dir, "datasets"); }

int pw_ds_sweep_in(const char *state_dir, const char *sub) {
  char dir[PATH_MAX];
  if (sub_dir(state_dir, sub, dir, sizeof dir, NULL)) return 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, TMP_PREFIX, strlen(TMP_PREFIX))) continue;
    if (unlinkat(dirfd(d), e->d_name, 0) == 0) n++;
    else pw_warn("datasets: cannot remove %s/%s: %s", dir, e->d_name, strerror(errno));
  }
  closedir(d);
  return n;
}

int64_t pw_ds_free_bytes(const char *state_dir) {
  char dir[PATH_MAX];
  struct statvfs v;
  if (ds_dir(state_dir, dir, sizeof dir, NULL)) return -1;
  if (statvfs(dir, &v) && statvfs(state_dir, &v)) return -1;
  return (int64_t)v.f_bavail * (int64_t)v.f_frsize;
}
