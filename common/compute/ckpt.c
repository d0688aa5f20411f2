/* ckpt: save and load a program's state through safetensors.c. */
#include "ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

void pw_ckpt_optim_path(const char *path, char *buf, size_t cap) {
  size_t n = strlen(path), sl = strlen(".safetensors");
  if (n > sl && strcmp(path + n - sl, ".safetensors") == 0) n -= sl;
  snprintf(buf, cap, "%.*s.optim.safetensors", (int)n, path);
}

static void fill_shape(pw_st_tensor *t, const pw_param *pm) {
  t->ndim = pm->ndim;
  for (int d = 0; d < pm->ndim; d++) t->shape[d] = pm->shape[d];
}

int pw_ckpt_save(pw_prog *p, const char *path, int step, const char *job_json, pw_err *err) {
  int n = pw_prog_n_params(p);
  pw_st_tensor *ts = calloc((size_t)(2 * n + 1), sizeof *ts);
  char (*names)[PW_PARAM_NAME_MAX + 16] = calloc((size_t)(2 * n + 1), sizeof *names);
  if (!ts || !names) {
    free(ts);
    free(names);
    return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  }
  char stepbuf[32], opath[1024];
  snprintf(stepbuf, sizeof stepbuf, "%d", step);
  pw_st_meta meta[3] = {{"format", "pt"}, {"step", stepbuf}, {"job", job_json ? job_json : "{}"}};
  int no = 0; /* frozen parameters have no optimizer state */
  for (int i = 0; i < n; i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    if (!pp->m) continue;
    snprintf(names[no], sizeof names[0], "exp_avg.%s", pp->meta->name);
    snprintf(names[no + 1], sizeof names[0], "exp_avg_sq.%s", pp->meta->name);
    ts[no] = (pw_st_tensor){.name = names[no], .dtype = PW_ST_F32, .data = pp->m};
    ts[no + 1] = (pw_st_tensor){.name = names[no + 1], .dtype = PW_ST_F32, .data = pp->v};
    fill_shape(&ts[no], pp->meta);
    fill_shape(&ts[no + 1], pp->meta);
    no += 2;
  }
  pw_ckpt_optim_path(path, opath, sizeof opath);
  int rc = pw_st_write(opath, ts, no, meta, 2, err);
  if (!rc) {
    for (int i = 0; i < n; i++) {
      pw_prog_param *pp = pw_prog_param_at(p, i);
      ts[i] = (pw_st_tensor){.name = pp->meta->name, .dtype = PW_ST_F32, .data = pp->data};
      fill_shape(&ts[i], pp->meta);
    }
    rc = pw_st_write(path, ts, n, meta, 3, err);
  }
  free(ts);
  free(names);
  return rc;
}

/* A tensor copied in must be finite: a diverged run's NaN weights would
 * otherwise load silently and train or evaluate to NaN. */
static int load_into(const pw_st_file *f, const char *path, const char *name, const pw_param *pm, float *dst,
                     pw_err *err) {
  int64_t shape[2] = {pm->shape[0], pm->shape[1]};
  int rc = pw_st_copy(f, name, PW_ST_F32, pm->ndim, shape, dst, err);
  for (size_t i = 0; !rc && i < pm->numel; i++)
    if (!isfinite(dst[i]))
      rc = pw_err_set(err, PW_EFORMAT, path, "tensor '%s' holds a non-finite value (%g at element %zu): "
                      "the run that wrote it diverged", name, (double)dst[i], i);
  return rc;
}

int pw_ckpt_load(pw_prog *p, const char *path, int with_optim, int *step, pw_err *err) {
  pw_st_file *f = NULL;
  int rc = pw_st_open(path, &f, err);
  if (rc) return rc;
  for (int i = 0; i < pw_prog_n_params(p) && !rc; i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    /* a base model's file into a LoRA model: the adapters keep their init */
    if (!pw_st_find(f, pp->meta->name) && pw_param_is_adapter(pp->meta)) continue;
    rc = load_into(f, path, pp->meta->name, pp->meta, pp->data, err);
  }
  const char *s = pw_st_meta_get(f, "step");
  int st = s ? atoi(s) : 0;
  pw_st_close(f);
  if (rc || !with_optim) {
    if (step) *step = st;
    return rc;
  }
  char opath[1024];
  pw_ckpt_optim_path(path, opath, sizeof opath);
  rc = pw_ckpt_load_optim(p, opath, err);
  if (step) *step = st;
  return rc;
}

int pw_ckpt_load_optim(pw_prog *p, const char *opath, pw_err *err) {
  char name[PW_PARAM_NAME_MAX + 16];
  pw_st_file *f = NULL;
  int rc = pw_st_open(opath, &f, err);
  if (rc) return rc;
  for (int i = 0; i < pw_prog_n_params(p) && !rc; i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    if (!pp->m) continue; /* frozen */
    snprintf(name, sizeof name, "exp_avg.%s", pp->meta->name);
    rc = load_into(f, opath, name, pp->meta, pp->m, err);
    snprintf(name, sizeof name, "exp_avg_sq.%s", pp->meta->name);
    if (!rc) rc = load_into(f, opath, name, pp->meta, pp->v, err);
  }
  pw_st_close(f);
  return rc;
}
