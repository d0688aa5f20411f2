/* ckpt: save and load a program's state through safetensors.c. */
#include "ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "safetensors.h"

/* A program on a device: its tensors go through host copies (the CPU's
 * are read and written in place). */
static int on_host(pw_prog *p) { return pw_prog_backend(p)->host; }

/* n floats of the program's memory readable on the host: src itself, or a
 * malloc'd copy (freed by the caller when !on_host). */
static const float *host_view(pw_prog *p, const float *src, size_t n, pw_err *err) {
  if (on_host(p)) return src;
  float *h = malloc((n ? n : 1) * sizeof(float));
  if (!h) {
    pw_err_set(err, PW_ENOMEM, "checkpoint", "out of memory for a host copy of %zu floats", n);
    return NULL;
  }
  if (pw_prog_download(p, h, src, n * sizeof(float), err)) {
    free(h);
    return NULL;
  }
  return h;
}

void pw_ckpt_optim_path(const char *path, char *buf, size_t cap) {
  size_t n = strlen(path), sl = strlen(".safetensors");
  if (n > sl && strcmp(path + n - sl, ".safetensors") == 0) n -= sl;
  snprintf(buf, cap, "%.*s.optim.safetensors", (int)n, path);
}

static void fill_shape(pw_st_tensor *t, const pw_param *pm) {
  t->ndim = pm->ndim;
  for (int d = 0; d < pm->ndim; d++) t->shape[d] = pm->shape[d];
}

static void drop_views(pw_prog *p, pw_st_tensor *ts, int n) {
  for (int i = 0; !on_host(p) && i < n; i++) free((void *)ts[i].data);
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
    ts[no] = (pw_st_tensor){.name = names[no], .dtype = PW_ST_F32, .data = host_view(p, pp->m, pp->meta->numel, err)};
    ts[no + 1] = (pw_st_tensor){.name = names[no + 1], .dtype = PW_ST_F32,
                                .data = ts[no].data ? host_view(p, pp->v, pp->meta->numel, err) : NULL};
    if (!ts[no].data || !ts[no + 1].data) {
      no += ts[no].data != NULL;
      goto fail;
    }
    fill_shape(&ts[no], pp->meta);
    fill_shape(&ts[no + 1], pp->meta);
    no += 2;
  }
  pw_ckpt_optim_path(path, opath, sizeof opath);
  int rc = pw_st_write(opath, ts, no, meta, 2, err);
  drop_views(p, ts, no);
  if (!rc) {
    for (no = 0; no < n; no++) {
      pw_prog_param *pp = pw_prog_param_at(p, no);
      ts[no] = (pw_st_tensor){.name = pp->meta->name, .dtype = PW_ST_F32,
                              .data = host_view(p, pp->data, pp->meta->numel, err)};
      if (!ts[no].data) break;
      fill_shape(&ts[no], pp->meta);
    }
    rc = no < n ? (err && err->code ? err->code : PW_ENOMEM) : pw_st_write(path, ts, n, meta, 3, err);
    drop_views(p, ts, no);
  }
  free(ts);
  free(names);
  return rc;
fail:
  drop_views(p, ts, no);
  free(ts);
  free(names);
  return err && err->code ? err->code : PW_ENOMEM;
}

/* A tensor copied in must be finite: a diverged run's NaN weights would
 * otherwise load silently and train or evaluate to NaN. */
static int load_into(pw_prog *p, const pw_st_file *f, const char *path, const char *name, const pw_param *pm,
                     float *dst, pw_err *err) {
  int64_t shape[2] = {pm->shape[0], pm->shape[1]};
  float *h = on_host(p) ? dst : malloc((pm->numel ? pm->numel : 1) * sizeof(float));
  if (!h) return pw_err_set(err, PW_ENOMEM, path, "out of memory for tensor '%s'", name);
  int rc = pw_st_copy(f, name, PW_ST_F32, pm->ndim, shape, h, err);
  for (size_t i = 0; !rc && i < pm->numel; i++)
    if (!isfinite(h[i]))
      rc = pw_err_set(err, PW_EFORMAT, path, "tensor '%s' holds a non-finite value (%g at element %zu): "
                      "the run that wrote it diverged", name, (double)h[i], i);
  if (!on_host(p)) {
    if (!rc) rc = pw_prog_upload(p, dst, h, pm->numel * sizeof(float), err);
    free(h);
  }
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
    rc = load_into(p, f, path, pp->meta->name, pp->meta, pp->data, err);
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
    rc = load_into(p, f, opath, name, pp->meta, pp->m, err);
    snprintf(name, sizeof name, "exp_avg_sq.%s", pp->meta->name);
    if (!rc) rc = load_into(p, f, opath, name, pp->meta, pp->v, err);
  }
  pw_st_close(f);
  return rc;
}
