/* weights: stored weights files, checked and content-addressed (weights.h). */
#include "weights.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "checkpoints.h"
#include "log.h"
#include "safetensors.h"

int pw_w_path(const char *state_dir, const char *id, char *out, size_t cap, pw_err *err) {
  if (!pw_ds_id_valid(id)) return pw_err_set(err, PW_EINVAL, "ck", "a weights id is 64 lowercase hex digits");
  int n = snprintf(out, cap, "%s/" PW_WEIGHTS_DIR "/%s", state_dir, id);
  if (n < 0 || (size_t)n >= cap) return pw_err_set(err, PW_EINVAL, "state_dir", "the state directory path is too long");
  return 0;
}

int pw_w_check(const char *path, const char *what, int64_t *n_tensors, int64_t *params, pw_err *err) {
  pw_st_file *f = NULL;
  pw_err e2 = {0};
  int rc = pw_st_open(path, &f, &e2);
  if (rc) /* the reader names the temporary file; the client knows it as what */
    return pw_err_set(err, rc == PW_ENOMEM ? PW_ENOMEM : PW_EFORMAT, what, "not a valid safetensors file: %s", e2.msg);
  int64_t total = 0;
  int n = pw_st_count(f);
  for (int i = 0; i < n && !rc; i++) {
    const pw_st_tensor *t = pw_st_get(f, i);
    if (t->dtype != PW_ST_F32) {
      rc = pw_err_set(err, PW_EFORMAT, what, "tensor '%s' is not F32: every tensor of stored weights is float32",
                      t->name);
      break;
    }
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
    const unsigned char *p = t->data;
    for (int64_t k = 0; k < numel; k++) {
      float v;
      memcpy(&v, p + k * 4, 4); /* the data is not aligned */
      if (!isfinite(v)) {
        rc = pw_err_set(err, PW_EFORMAT, what, "tensor '%s' holds a non-finite value (%g at element %lld)", t->name,
                        (double)v, (long long)k);
        break;
      }
    }
    total += numel;
  }
  pw_st_close(f);
  if (!rc) {
    *n_tensors = n;
    *params = total;
  }
  return rc;
}

int pw_w_commit(pw_ds_writer *w, const char *what, pw_w_info *info, pw_err *err) {
  memset(info, 0, sizeof *info);
  int rc = pw_w_check(pw_ds_writer_tmp_path(w), what, &info->n_tensors, &info->params, err);
  pw_ds_info di;
  if (!rc) rc = pw_ds_writer_commit(w, what, &di, err);
  if (rc) return rc;
  memcpy(info->id, di.id, sizeof info->id);
  info->size = di.size;
  return 0;
}

int pw_w_import(pw_store *s, const char *state_dir, const char *src, const char *kind, const char *source,
                pw_w_info *info, pw_err *err) {
  int fd = open(src, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return pw_err_set(err, PW_EIO, "init", "cannot open %s: %s", src, strerror(errno));
  pw_ds_writer *w = NULL;
  enum { PIECE = 1 << 20 };
  char *buf = malloc(PIECE);
  int rc = buf ? pw_ds_writer_open_in(state_dir, PW_WEIGHTS_DIR, &w, err) : pw_err_set(err, PW_ENOMEM, "init", "out of memory");
  while (!rc) {
    ssize_t k = read(fd, buf, PIECE);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) rc = pw_err_set(err, PW_EIO, "init", "cannot read %s: %s", src, strerror(errno));
    if (k <= 0) break;
    rc = pw_ds_writer_write(w, buf, (size_t)k, err);
  }
  if (!rc) rc = pw_w_commit(w, "init", info, err);
  pw_ds_writer_free(w);
  free(buf);
  close(fd);
  if (rc) return rc;
  pw_weights_new row = {.id = info->id, .size = info->size, .kind = kind, .source = source,
                        .n_tensors = info->n_tensors, .params = info->params};
  int created = 0;
  if ((rc = pw_store_weights_insert(s, &row, &created, NULL, err))) return rc;
  if (created) pw_info("weights %s stored from %s: %lld bytes, %s", info->id, source, (long long)info->size, kind);
  return 0;
}

int pw_w_unlink(const char *state_dir, const char *id, pw_err *err) {
  char path[PATH_MAX];
  int rc = pw_w_path(state_dir, id, path, sizeof path, err);
  if (rc) return rc;
  if (unlink(path) && errno != ENOENT) return pw_err_set(err, PW_EIO, "ck", "cannot remove %s: %s", path, strerror(errno));
  return 0;
}

/* ---- submit --------------------------------------------------------------- */

/* Job `job`'s step gathered (optim: its optimizer state) into stored
 * weights; id[65] gets their sha256. */
static int gather(pw_store *s, const char *state_dir, const pw_init_spec *in, int optim, char id[65], pw_err *err) {
  static atomic_uint seq;
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s/.init-%lld-%d-%d-%u.safetensors", state_dir, in->job, in->step, (int)getpid(),
           atomic_fetch_add(&seq, 1));
  pw_err e2 = {0};
  json_t *jj = NULL;
  int n_stages = 0, rc = pw_store_job_json(s, in->job, 0, &jj, &e2);
  json_decref(jj);
  if (rc == PW_ENOENT) return pw_err_set(err, PW_ESPEC, "init.job", "no job %lld", in->job);
  if (!rc) rc = pw_store_ckpt_step(s, in->job, in->step, &n_stages, &e2);
  if (!rc) rc = pw_ckpt_gather(state_dir, in->job, in->step, n_stages, optim, NULL, tmp, &e2);
  if (rc == PW_ENOENT) {
    unlink(tmp);
    return pw_err_set(err, PW_ESPEC, "init.step", "job %lld has no retained checkpoint at step %d: %s", in->job,
                      in->step, e2.msg);
  }
  if (rc) {
    unlink(tmp);
    char b[600];
    pw_error("init: gathering job %lld step %d: %s", in->job, in->step, pw_err_str(&e2, b, sizeof b));
    return pw_err_set(err, rc, "init", "gathering job %lld's step %d: %s", in->job, in->step, e2.msg);
  }
  char source[96];
  snprintf(source, sizeof source, "job %lld step %d%s", in->job, in->step, optim ? " optimizer" : "");
  pw_w_info info;
  rc = pw_w_import(s, state_dir, tmp, optim ? "optimizer" : "model", source, &info, err);
  if (unlink(tmp) && errno != ENOENT) pw_warn("init: cannot remove %s: %s", tmp, strerror(errno));
  if (!rc) memcpy(id, info.id, 65);
  return rc;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && n < cap; d++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Every parameter in the stored file, with its shape. */
static int fits(const char *state_dir, const char *id, const pw_w_param *params, int n_params, pw_err *err) {
  char path[PATH_MAX];
  int rc = pw_w_path(state_dir, id, path, sizeof path, err);
  if (rc) return rc;
  pw_st_file *f = NULL;
  pw_err e2 = {0};
  if ((rc = pw_st_open(path, &f, &e2))) {
    char b[600];
    pw_error("init: stored weights %s: %s", id, pw_err_str(&e2, b, sizeof b));
    return pw_err_set(err, PW_EIO, "init", "the stored weights %.12s... cannot be read: %s", id, e2.msg);
  }
  for (int i = 0; i < n_params && !rc; i++) {
    const pw_w_param *p = &params[i];
    const pw_st_tensor *t = pw_st_find(f, p->name);
    int64_t want[2] = {p->shape[0], p->shape[1]};
    char ws[64], gs[160];
    shape_str(ws, sizeof ws, p->ndim, want);
    if (!t) {
      rc = pw_err_set(err, PW_ESPEC, "init", "tensor '%s' %s: missing from the weights %.12s...", p->name, ws, id);
      break;
    }
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == want[d];
    if (!same) {
      shape_str(gs, sizeof gs, t->ndim, t->shape);
      rc = pw_err_set(err, PW_ESPEC, "init", "tensor '%s': the model's shape is %s, the weights' %s", p->name, ws, gs);
    }
  }
  pw_st_close(f);
  return rc;
}

int pw_w_init_resolve(pw_store *s, const char *state_dir, pw_init_spec *in, const pw_w_param *params, int n_params,
                      pw_err *err) {
  if (!in->checkpoint[0] && !in->job) return 0;
  int rc;
  if (in->job) { /* a given checkpoint id is replaced by what job + step hold now */
    if ((rc = gather(s, state_dir, in, 0, in->checkpoint, err))) return rc;
    in->optimizer_checkpoint[0] = 0;
    if (in->optimizer && (rc = gather(s, state_dir, in, 1, in->optimizer_checkpoint, err))) return rc;
  } else {
    json_t *row = NULL;
    rc = pw_store_weights_json(s, in->checkpoint, &row, err);
    json_decref(row);
    if (rc == PW_ENOENT)
      return pw_err_set(err, PW_ESPEC, "init.checkpoint", "no weights %s are stored (upload them: POST /v1/checkpoints)",
                        in->checkpoint);
    if (rc) return rc;
  }
  return fits(state_dir, in->checkpoint, params, n_params, err);
}
