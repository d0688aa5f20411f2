/* hf_read: what import and export share (hf_int.h): config.json's field
 * readers, the list of name entries, a model directory's safetensors files
 * and the shortest decimal of a float. hf.c and hf_bert.c call these; they
 * call nothing of either. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hf_int.h"

const char *pw__hf_type_name(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
  }
}

/* An integer field in [lo, hi]; *v = def when absent or null and def >= 0, else required. */
int pw__hf_get_int(const pw__hf_cfg *c, const char *name, long long def, long long lo, long long hi, int *v) {
  const json_t *j = json_object_get(c->cfg, name);
  if (!j || json_is_null(j)) {
    if (def < 0) return pw_err_set(c->err, PW_ESPEC, c->what, "%s: required for %s (missing)", name, c->arch);
    *v = (int)def;
    return 0;
  }
  if (!json_is_integer(j))
    return pw_err_set(c->err, PW_ESPEC, c->what, "%s: must be an integer (got %s)", name, pw__hf_type_name(j));
  long long x = json_integer_value(j);
  if (x < lo || x > hi)
    return pw_err_set(c->err, PW_ESPEC, c->what, "%s: %lld is out of range (%lld ... %lld)", name, x, lo, hi);
  *v = (int)x;
  return 0;
}

/* A number field (integer or real), finite; def when absent or null. */
int pw__hf_get_num(const pw__hf_cfg *c, const char *name, double def, double *v) {
  const json_t *j = json_object_get(c->cfg, name);
  if (!j || json_is_null(j)) {
    *v = def;
    return 0;
  }
  if (!json_is_number(j))
    return pw_err_set(c->err, PW_ESPEC, c->what, "%s: must be a number (got %s)", name, pw__hf_type_name(j));
  *v = json_number_value(j);
  if (!isfinite(*v)) return pw_err_set(c->err, PW_ESPEC, c->what, "%s: must be finite", name);
  return 0;
}

int pw__hf_get_bool(const pw__hf_cfg *c, const char *name, int def, int *v) {
  const json_t *j = json_object_get(c->cfg, name);
  if (!j || json_is_null(j)) {
    *v = def;
    return 0;
  }
  if (!json_is_boolean(j))
    return pw_err_set(c->err, PW_ESPEC, c->what, "%s: must be true or false (got %s)", name, pw__hf_type_name(j));
  *v = json_is_true(j);
  return 0;
}

/* A boolean that must be `want` for us to compute what the model does. */
int pw__hf_want_bool(const pw__hf_cfg *c, const char *name, int def, int want, const char *why) {
  int v = def, rc = pw__hf_get_bool(c, name, def, &v);
  if (rc) return rc;
  if (v != want)
    return pw_err_set(c->err, PW_ENOTSUP, c->what, "%s: %s is not supported for %s (%s)", name, v ? "true" : "false",
                      c->arch, why);
  return 0;
}

/* A string field: absent or null takes transformers' default, which is
 * allowed[0]; else one of the allowed (a NULL-ended list), refused by name
 * otherwise. */
int pw__hf_want_str(const pw__hf_cfg *c, const char *name, const char *const *allowed) {
  const json_t *j = json_object_get(c->cfg, name);
  if (!j || json_is_null(j)) return 0;
  if (!json_is_string(j))
    return pw_err_set(c->err, PW_ESPEC, c->what, "%s: must be a string (got %s)", name, pw__hf_type_name(j));
  for (int i = 0; allowed[i]; i++)
    if (!strcmp(json_string_value(j), allowed[i])) return 0;
  return pw_err_set(c->err, PW_ENOTSUP, c->what, "%s: \"%.64s\" is not supported for %s (only \"%s\")", name,
                    json_string_value(j), c->arch, allowed[0]);
}

/* Dropout probabilities: read, not computed (pipewright has no dropout);
 * a non-zero one goes into the notes. */
int pw__hf_dropout(const pw__hf_cfg *c, const char *name, char *notes, size_t cap) {
  double p = 0;
  int rc = pw__hf_get_num(c, name, 0, &p);
  if (rc) return rc;
  if (p < 0 || p >= 1) return pw_err_set(c->err, PW_ESPEC, c->what, "%s: %g is not a probability in [0, 1)", name, p);
  if (p > 0 && notes) {
    size_t n = strlen(notes);
    if (n + 1 < cap)
      snprintf(notes + n, cap - n, "%s%s %g", n ? ", " : "dropout is not applied (pipewright has none): ", name, p);
  }
  return 0;
}

pw__hf_entry *pw__hf_map_add(pw__hf_map *mp, const char *ours, int ndim, int64_t r, int64_t cols) {
  if (mp->n == mp->cap) {
    int cap = mp->cap ? 2 * mp->cap : 64;
    pw__hf_entry *e = realloc(mp->e, sizeof *e * (size_t)cap);
    if (!e) return NULL;
    mp->e = e;
    mp->cap = cap;
  }
  pw__hf_entry *e = &mp->e[mp->n++];
  memset(e, 0, sizeof *e);
  snprintf(e->ours, sizeof e->ours, "%s", ours);
  e->ndim = ndim;
  e->shape[0] = r;
  e->shape[1] = cols;
  e->n_parts = 1;
  e->rows[0] = r;
  return e;
}

const char *pw__hf_part_name(const pw__hf_entry *e, int p, char *buf) {
  if (!e->experts) return e->hf[p];
  snprintf(buf, PW__HF_PART_NAME, "%s%d%s", e->hf[0], p, e->hf[1]);
  return buf;
}

int64_t pw__hf_part_rows(const pw__hf_entry *e, int p) { return e->experts ? e->rows[0] : e->rows[p]; }

/* model.safetensors, or the shards a model.safetensors.index.json names. */

void pw__hf_src_close(pw__hf_src *s) {
  for (int i = 0; i < s->n_files; i++) {
    pw_st_close(s->files[i]);
    free(s->names[i]);
  }
  free(s->files);
  free(s->names);
  json_decref(s->weight_map);
  json_decref(s->used);
  memset(s, 0, sizeof *s);
}

static int src_add(pw__hf_src *s, const char *name, pw_err *err) {
  for (int i = 0; i < s->n_files; i++)
    if (!strcmp(s->names[i], name)) return 0;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", s->dir, name);
  pw_st_file **f = realloc(s->files, sizeof *f * (size_t)(s->n_files + 1));
  char **n = f ? realloc(s->names, sizeof *n * (size_t)(s->n_files + 1)) : NULL;
  if (f) s->files = f;
  if (n) s->names = n;
  if (!f || !n) return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  s->names[s->n_files] = strdup(name);
  if (!s->names[s->n_files]) return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  int rc = pw_st_open(path, &s->files[s->n_files], err);
  if (rc) {
    free(s->names[s->n_files]);
    return rc;
  }
  s->n_files++;
  return 0;
}

int pw__hf_src_open(pw__hf_src *s, const char *dir, pw_err *err) {
  memset(s, 0, sizeof *s);
  s->dir = dir;
  s->used = json_object();
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if (access(path, F_OK) == 0) return src_add(s, "model.safetensors", err);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  json_error_t je;
  json_t *idx = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!idx) {
    if (access(path, F_OK))
      return pw_err_set(err, PW_ENOENT, dir, "neither model.safetensors nor model.safetensors.index.json is here");
    return pw_err_set(err, PW_EJSON, path, "line %d column %d: %s", je.line, je.column, je.text);
  }
  json_t *wm = json_object_get(idx, "weight_map");
  if (!json_is_object(wm)) {
    json_decref(idx);
    return pw_err_set(err, PW_EFORMAT, path, "weight_map: missing or not an object");
  }
  s->weight_map = json_incref(wm);
  json_decref(idx);
  const char *k;
  json_t *v;
  json_object_foreach(s->weight_map, k, v) {
    const char *f = json_string_value(v);
    if (!f || !*f || strchr(f, '/') || !strcmp(f, ".") || !strcmp(f, ".."))
      return pw_err_set(err, PW_EFORMAT, path, "weight_map.%.64s: must name a file in this directory", k);
    int rc = src_add(s, f, err);
    if (rc) return rc;
  }
  return 0;
}

const pw_st_tensor *pw__hf_src_find(pw__hf_src *s, const char *name, const pw_st_file **file) {
  const pw_st_file *f = s->n_files ? s->files[0] : NULL;
  if (s->weight_map) {
    const char *fn = json_string_value(json_object_get(s->weight_map, name));
    f = NULL;
    for (int i = 0; fn && i < s->n_files; i++)
      if (!strcmp(s->names[i], fn)) f = s->files[i];
  }
  const pw_st_tensor *t = f ? pw_st_find(f, name) : NULL;
  if (t) json_object_set_new(s->used, name, json_true());
  if (file) *file = f;
  return t;
}

double pw__hf_short_float(float f) {
  char b[32];
  for (int p = 1; p <= 9; p++) {
    snprintf(b, sizeof b, "%.*g", p, (double)f);
    if (strtof(b, NULL) == f) break;
  }
  return strtod(b, NULL);
}

