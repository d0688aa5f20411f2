/* checkpoints: the coordinator's checkpoint shard files (checkpoints.h). */
#include "checkpoints.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "datasets.h"
#include "log.h"
#include "safetensors.h"
#include "sha256.h"

#define TMP_PREFIX ".upload-"

struct pw_ck_writer {
  int fd;
  int committed;
  char dir[PATH_MAX];
  char tmp[PATH_MAX];
  char final[PATH_MAX];
  pw_ck_sum want;
  uint32_t crc;
  pw_sha256_ctx sha;
  uint64_t size;
};

static int too_long(pw_err *err) {
  return pw_err_set(err, PW_EINVAL, "state_dir", "the state directory path is too long");
}

int pw_ck_dir(const char *state_dir, int64_t job, int step, char *out, size_t cap, pw_err *err) {
  int n = step < 0 ? snprintf(out, cap, "%s/checkpoints/job-%lld", state_dir, (long long)job)
                   : snprintf(out, cap, "%s/checkpoints/job-%lld/step-%d", state_dir, (long long)job, step);
  return n < 0 || (size_t)n >= cap ? too_long(err) : 0;
}

int pw_ck_shard_path(const char *state_dir, int64_t job, int step, int stage, int optimizer, char *out, size_t cap,
                     pw_err *err) {
  int n = snprintf(out, cap, "%s/checkpoints/job-%lld/step-%d/stage-%d%s.safetensors", state_dir, (long long)job,
                   step, stage, optimizer ? ".optim" : "");
  return n < 0 || (size_t)n >= cap ? too_long(err) : 0;
}

int pw_ck_sum_parse(char kind, const char *value, pw_ck_sum *out, pw_err *err) {
  const char *hdr = kind == 'c' ? "X-Pipewright-Crc32c" : "X-Pipewright-Sha256";
  size_t want = kind == 'c' ? 8 : 64, n = value ? strlen(value) : 0;
  if (n != want)
    return pw_err_set(err, PW_EINVAL, hdr, "%s must be %zu hex digits (got %zu characters)", hdr, want, n);
  out->kind = kind;
  for (size_t i = 0; i < n; i++) {
    char ch = value[i];
    if (ch >= 'A' && ch <= 'F') ch = (char)(ch - 'A' + 'a');
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
      return pw_err_set(err, PW_EINVAL, hdr, "%s must be hex digits (character %zu is not)", hdr, i + 1);
    out->hex[i] = ch;
  }
  out->hex[n] = 0;
  return 0;
}

static int io_fail(int e, const char *file, const char *what, pw_err *err) {
  int code = e == ENOSPC || e == EDQUOT ? PW_ENOSPC : PW_EIO;
  return pw_err_set(err, code, "body", "%s %s: %s", what, file, strerror(e));
}

/* mkdir -p of dir (its parents from <state_dir> down). */
static int mkdirs(char *dir, pw_err *err) {
  for (char *p = dir + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      int bad = mkdir(dir, 0700) && errno != EEXIST;
      *p = '/';
      if (bad) return io_fail(errno, dir, "cannot create", err);
    }
  if (mkdir(dir, 0700) && errno != EEXIST) return io_fail(errno, dir, "cannot create", err);
  return 0;
}

int pw_ck_writer_open(const char *state_dir, int64_t job, int step, int stage, int optimizer, const pw_ck_sum *sum,
                      pw_ck_writer **out, pw_err *err) {
  *out = NULL;
  pw_ck_writer *w = calloc(1, sizeof *w);
  if (!w) return pw_err_set(err, PW_ENOMEM, "body", "out of memory");
  w->fd = -1;
  w->want = *sum;
  pw_sha256_init(&w->sha);
  int rc = pw_ck_dir(state_dir, job, step, w->dir, sizeof w->dir, err);
  if (!rc) rc = pw_ck_shard_path(state_dir, job, step, stage, optimizer, w->final, sizeof w->final, err);
  if (!rc) rc = mkdirs(w->dir, err);
  if (rc) goto fail;
  int n = snprintf(w->tmp, sizeof w->tmp, "%s/" TMP_PREFIX "XXXXXX", w->dir);
  if (n < 0 || (size_t)n >= sizeof w->tmp) {
    rc = too_long(err);
    goto fail;
  }
  if ((w->fd = mkostemp(w->tmp, O_CLOEXEC)) < 0) {
    rc = io_fail(errno, w->tmp, "cannot create", err);
    goto fail;
  }
  *out = w;
  return 0;
fail:
  free(w);
  return rc;
}

int pw_ck_writer_write(pw_ck_writer *w, const void *data, size_t n, pw_err *err) {
  const uint8_t *p = data;
  if (w->want.kind == 'c') w->crc = pw_crc32c(w->crc, p, n);
  else pw_sha256_update(&w->sha, p, n);
  int e = pw_ds_write_all(w->fd, p, n);
  if (e) return io_fail(e, w->tmp, "cannot write", err);
  w->size += n;
  return 0;
}

uint64_t pw_ck_writer_size(const pw_ck_writer *w) { return w->size; }

int pw_ck_writer_commit(pw_ck_writer *w, pw_err *err) {
  char got[65];
  if (w->want.kind == 'c') {
    snprintf(got, sizeof got, "%08x", w->crc);
  } else {
    uint8_t d[PW_SHA256_LEN];
    pw_sha256_final(&w->sha, d);
    pw_sha256_to_hex(d, got);
  }
  if (strcmp(got, w->want.hex))
    return pw_err_set(err, PW_EFORMAT, "body", "the body's %s is %s, the upload states %s: corrupted in transit",
                      w->want.kind == 'c' ? "CRC32C" : "SHA-256", got, w->want.hex);
  if (fsync(w->fd)) return io_fail(errno, w->tmp, "cannot sync", err);
  /* The whole file parsed as the reader will: header, ranges, and each
   * tensor's stored CRC32C (ckpt.c writes them). */
  pw_st_file *f = NULL;
  pw_err e2 = {0};
  if (pw_st_open(w->tmp, &f, &e2)) {
    char b[600];
    return pw_err_set(err, PW_EFORMAT, "body", "not a valid safetensors file: %s", pw_err_str(&e2, b, sizeof b));
  }
  pw_st_close(f);
  return pw_ds_publish(w->tmp, w->final, w->dir, &w->committed, err);
}

void pw_ck_writer_free(pw_ck_writer *w) {
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  if (!w->committed && unlink(w->tmp) && errno != ENOENT)
    pw_warn("checkpoints: cannot remove %s: %s", w->tmp, strerror(errno));
  free(w);
}

/* ---- gather ----------------------------------------------------------------- */

int pw_ckpt_gather(const char *state_dir, int64_t job, int step, int n_stages, int optimizer, const char *job_json,
                   const char *out, pw_err *err) {
  if (n_stages < 1) return pw_err_set(err, PW_EINVAL, "stages", "a checkpoint has at least one stage");
  pw_st_file **files = calloc((size_t)n_stages, sizeof *files);
  pw_st_tensor *ts = NULL;
  int nt = 0, cap = 0, rc = files ? 0 : pw_err_set(err, PW_ENOMEM, "", "out of memory");
  for (int k = 0; k < n_stages && !rc; k++) {
    char path[PATH_MAX];
    if ((rc = pw_ck_shard_path(state_dir, job, step, k, optimizer, path, sizeof path, err))) break;
    pw_err e2 = {0};
    if ((rc = pw_st_open(path, &files[k], &e2))) {
      char b[600];
      rc = pw_err_set(err, access(path, F_OK) ? PW_ENOENT : rc, "step", "step %d, stage %d's %s: %s", step, k,
                      optimizer ? "optimizer state" : "model", pw_err_str(&e2, b, sizeof b));
      break;
    }
    for (int i = 0; i < pw_st_count(files[k]); i++) {
      const pw_st_tensor *t = pw_st_get(files[k], i);
      int dup = 0;
      for (int j = 0; j < nt && !dup; j++) dup = !strcmp(ts[j].name, t->name);
      if (dup) continue;
      if (nt == cap) {
        cap = cap ? cap * 2 : 64;
        pw_st_tensor *nts = realloc(ts, sizeof *ts * (size_t)cap);
        if (!nts) {
          rc = pw_err_set(err, PW_ENOMEM, "", "out of memory");
          break;
        }
        ts = nts;
      }
      ts[nt++] = *t;
    }
  }
  if (!rc) {
    char sb[24];
    snprintf(sb, sizeof sb, "%d", step);
    pw_st_meta meta[3] = {{"format", "pt"}, {"step", sb}, {"job", job_json ? job_json : "{}"}};
    rc = pw_st_write(out, ts, nt, meta, 3, err);
  }
  for (int k = 0; files && k < n_stages; k++)
    if (files[k]) pw_st_close(files[k]);
  free(files);
  free(ts);
  return rc;
}

/* ---- removal ---------------------------------------------------------------- */

/* Every entry of dir (files, and folders one level down), then dir. */
static int remove_tree(const char *dir, int depth, pw_err *err) {
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return 0;
    return pw_err_set(err, PW_EIO, "checkpoint", "cannot open %s: %s", dir, strerror(errno));
  }
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[PATH_MAX];
    int n = snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (n < 0 || (size_t)n >= sizeof p) {
      rc = too_long(err);
      break;
    }
    struct stat sb;
    if (lstat(p, &sb)) continue; /* gone meanwhile */
    if (S_ISDIR(sb.st_mode) && depth > 0) rc = remove_tree(p, depth - 1, err);
    else if (unlink(p) && errno != ENOENT) rc = pw_err_set(err, PW_EIO, "checkpoint", "cannot remove %s: %s", p,
                                                           strerror(errno));
  }
  closedir(d);
  if (!rc && rmdir(dir) && errno != ENOENT)
    rc = pw_err_set(err, PW_EIO, "checkpoint", "cannot remove %s: %s", dir, strerror(errno));
  return rc;
}

int pw_ck_remove(const char *state_dir, int64_t job, int step, pw_err *err) {
  char dir[PATH_MAX];
  int rc = pw_ck_dir(state_dir, job, step, dir, sizeof dir, err);
  return rc ? rc : remove_tree(dir, step < 0 ? 1 : 0, err);
}

int pw_ck_step_check(const char *state_dir, int64_t job, int step, int n_stages, pw_err *err) {
  for (int st = 0; st < n_stages; st++)
    for (int opt = 0; opt < 2; opt++) {
      char path[PATH_MAX];
      pw_st_file *f = NULL;
      int rc = pw_ck_shard_path(state_dir, job, step, st, opt, path, sizeof path, err);
      if (!rc && access(path, R_OK))
        rc = pw_err_set(err, PW_ENOENT, "checkpoint", "%s is missing: %s", path, strerror(errno));
      if (!rc) rc = pw_st_open(path, &f, err);
      pw_st_close(f);
      if (rc) return rc;
    }
  return 0;
}
