/* cost: the calibration profile — reading it, and the costs it gives. */
#include "cost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROFILE_MAX_BYTES ((long)16 << 20)

void pw_cost_free(pw_cost_profile *p) {
  free(p->names);
  free(p->f);
  free(p->i);
  free(p->w);
  memset(p, 0, sizeof *p);
}

/* A number >= 0 (integers too) at path, into *out. */
static int num(const json_t *v, double *out, const char *path, pw_err *err) {
  if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
    return pw_err_set(err, PW_EFORMAT, path, "must be a number >= 0");
  *out = json_number_value(v);
  return 0;
}

static int opt_num(const json_t *o, const char *key, double *out, const char *path, pw_err *err) {
  const json_t *v = json_object_get(o, key);
  char at[128];
  snprintf(at, sizeof at, "%s.%s", path, key);
  return v ? num(v, out, at, err) : 0;
}

static int int_in(const json_t *v, int lo, int hi, int *out, const char *path, pw_err *err) {
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return pw_err_set(err, PW_EFORMAT, path, "must be an integer in %d..%d", lo, hi);
  *out = (int)json_integer_value(v);
  return 0;
}

/* layers[li].key: n_mb numbers into dst. */
static int series(const json_t *layer, const char *key, int li, int n_mb, double *dst, pw_err *err) {
  const json_t *a = json_object_get(layer, key);
  char at[128];
  snprintf(at, sizeof at, "profile.layers[%d].%s", li, key);
  if (!json_is_array(a) || (int)json_array_size(a) != n_mb)
    return pw_err_set(err, PW_EFORMAT, at, "must be an array of %d numbers (one per mb_sizes entry)", n_mb);
  for (int k = 0; k < n_mb; k++) {
    snprintf(at, sizeof at, "profile.layers[%d].%s[%d]", li, key, k);
    int rc = num(json_array_get(a, (size_t)k), &dst[k], at, err);
    if (rc) return rc;
  }
  return 0;
}

/* sharing.speed: 1..PW_COST_MAX_SHARE rates in (0, 1]. */
static int parse_sharing(const json_t *sh, pw_cost_profile *p, pw_err *err) {
  if (!sh) return 0;
  if (!json_is_object(sh)) return pw_err_set(err, PW_EFORMAT, "profile.sharing", "must be an object");
  const json_t *a = json_object_get(sh, "speed");
  if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > PW_COST_MAX_SHARE)
    return pw_err_set(err, PW_EFORMAT, "profile.sharing.speed", "must be an array of 1..%d rates (n busy: [n-1])",
                      PW_COST_MAX_SHARE);
  p->n_speed = (int)json_array_size(a);
  for (int k = 0; k < p->n_speed; k++) {
    char at[64];
    snprintf(at, sizeof at, "profile.sharing.speed[%d]", k);
    int rc = num(json_array_get(a, (size_t)k), &p->speed[k], at, err);
    if (rc) return rc;
    if (p->speed[k] <= 0 || p->speed[k] > 1) return pw_err_set(err, PW_EFORMAT, at, "must be a rate in (0, 1]");
  }
  const json_t *w = json_object_get(sh, "wake_s");
  if (!w) return 0;
  if (!json_is_array(w) || (int)json_array_size(w) != p->n_speed)
    return pw_err_set(err, PW_EFORMAT, "profile.sharing.wake_s", "must be an array of %d numbers (one per speed)",
                      p->n_speed);
  for (int k = 0; k < p->n_speed; k++) {
    char at[64];
    snprintf(at, sizeof at, "profile.sharing.wake_s[%d]", k);
    int rc = num(json_array_get(w, (size_t)k), &p->wake_busy[k], at, err);
    if (rc) return rc;
  }
  return 0;
}

static int parse(const json_t *j, pw_cost_profile *p, pw_err *err) {
  if (!json_is_object(j)) return pw_err_set(err, PW_EFORMAT, "profile", "must be an object");
  const json_t *v = json_object_get(j, "version");
  if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > PW_COST_VERSION)
    return pw_err_set(err, PW_EFORMAT, "profile.version", "must be 1 or %d", PW_COST_VERSION);
  v = json_object_get(j, "host");
  if (v && (!json_is_string(v) || strlen(json_string_value(v)) >= sizeof p->host))
    return pw_err_set(err, PW_EFORMAT, "profile.host", "must be a string of at most %zu bytes", sizeof p->host - 1);
  snprintf(p->host, sizeof p->host, "%s", v ? json_string_value(v) : "");
  p->cores = p->threads = 1;
  int rc;
  if ((v = json_object_get(j, "cores")) && (rc = int_in(v, 1, 1 << 16, &p->cores, "profile.cores", err))) return rc;
  if ((v = json_object_get(j, "threads")) && (rc = int_in(v, 1, 1 << 16, &p->threads, "profile.threads", err)))
    return rc;
  const json_t *mbs = json_object_get(j, "mb_sizes");
  if (!json_is_array(mbs) || json_array_size(mbs) < 1 || json_array_size(mbs) > PW_COST_MAX_MB)
    return pw_err_set(err, PW_EFORMAT, "profile.mb_sizes", "must be an array of 1..%d sizes", PW_COST_MAX_MB);
  p->n_mb = (int)json_array_size(mbs);
  for (int k = 0; k < p->n_mb; k++) {
    char at[64];
    snprintf(at, sizeof at, "profile.mb_sizes[%d]", k);
    if ((rc = int_in(json_array_get(mbs, (size_t)k), 1, 1 << 20, &p->mb[k], at, err))) return rc;
    if (k && p->mb[k] <= p->mb[k - 1]) return pw_err_set(err, PW_EFORMAT, at, "sizes must ascend, each once");
  }
  const json_t *layers = json_object_get(j, "layers");
  if (!json_is_array(layers) || json_array_size(layers) < 1 || json_array_size(layers) > PW_COST_MAX_LAYERS)
    return pw_err_set(err, PW_EFORMAT, "profile.layers", "must be an array of 1..%d layers", PW_COST_MAX_LAYERS);
  p->n_layers = (int)json_array_size(layers);
  size_t cells = (size_t)p->n_layers * (size_t)p->n_mb;
  p->names = calloc((size_t)p->n_layers, sizeof *p->names);
  p->f = calloc(cells, sizeof(double));
  p->i = calloc(cells, sizeof(double));
  p->w = calloc(cells, sizeof(double));
  if (!p->names || !p->f || !p->i || !p->w) return pw_err_set(err, PW_ENOMEM, "profile", "out of memory");
  for (int li = 0; li < p->n_layers; li++) {
    const json_t *l = json_array_get(layers, (size_t)li);
    const json_t *name = json_object_get(l, "name");
    char at[64];
    snprintf(at, sizeof at, "profile.layers[%d].name", li);
    if (!json_is_string(name) || !json_string_length(name) || json_string_length(name) >= sizeof p->names[0])
      return pw_err_set(err, PW_EFORMAT, at, "must be a layer name of 1..%zu bytes", sizeof p->names[0] - 1);
    snprintf(p->names[li], sizeof p->names[0], "%s", json_string_value(name));
    for (int k = 0; k < li; k++)
      if (!strcmp(p->names[k], p->names[li])) return pw_err_set(err, PW_EFORMAT, at, "'%s' listed twice", p->names[li]);
    size_t o = (size_t)li * (size_t)p->n_mb;
    if ((rc = series(l, "f", li, p->n_mb, p->f + o, err)) || (rc = series(l, "i", li, p->n_mb, p->i + o, err)) ||
        (rc = series(l, "w", li, p->n_mb, p->w + o, err)))
      return rc;
  }
  const json_t *step = json_object_get(j, "step"), *link = json_object_get(j, "link");
  if (step && !json_is_object(step)) return pw_err_set(err, PW_EFORMAT, "profile.step", "must be an object");
  if (link && !json_is_object(link)) return pw_err_set(err, PW_EFORMAT, "profile.link", "must be an object");
  p->latency = 50e-6;
  p->bandwidth = 3e9;
  if ((rc = opt_num(step, "per_param_s", &p->per_param, "profile.step", err)) ||
      (rc = opt_num(step, "fixed_s", &p->fixed, "profile.step", err)) ||
      (rc = opt_num(link, "latency_s", &p->latency, "profile.link", err)) ||
      (rc = opt_num(link, "bandwidth_Bps", &p->bandwidth, "profile.link", err)) ||
      (rc = opt_num(link, "wake_s", &p->wake, "profile.link", err)))
    return rc;
  return parse_sharing(json_object_get(j, "sharing"), p, err);
}

int pw_cost_parse(const json_t *j, pw_cost_profile *out, pw_err *err) {
  memset(out, 0, sizeof *out);
  int rc = parse(j, out, err);
  if (rc) pw_cost_free(out);
  return rc;
}

int pw_cost_load(const char *path, pw_cost_profile *out, pw_err *err) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  long size = -1;
  if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (f) fclose(f);
  if (size < 0) return pw_err_set(err, PW_EIO, path, "cannot read the profile");
  if (size > PROFILE_MAX_BYTES) return pw_err_set(err, PW_EFORMAT, path, "a profile is at most 16 MiB");
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) return pw_err_set(err, PW_EFORMAT, path, "line %d: %s", je.line, je.text);
  int rc = pw_cost_parse(j, out, err);
  json_decref(j);
  return rc;
}

static json_t *arr(const double *v, int n) {
  json_t *a = json_array();
  for (int k = 0; k < n; k++) json_array_append_new(a, json_real(v[k]));
  return a;
}

json_t *pw_cost_json(const pw_cost_profile *p) {
  json_t *mbs = json_array(), *layers = json_array();
  for (int k = 0; k < p->n_mb; k++) json_array_append_new(mbs, json_integer(p->mb[k]));
  for (int li = 0; li < p->n_layers; li++) {
    size_t o = (size_t)li * (size_t)p->n_mb;
    json_array_append_new(layers, json_pack("{s:s, s:o, s:o, s:o}", "name", p->names[li], "f", arr(p->f + o, p->n_mb),
                                            "i", arr(p->i + o, p->n_mb), "w", arr(p->w + o, p->n_mb)));
  }
  json_t *j = json_pack("{s:i, s:s, s:i, s:i, s:o, s:o, s:{s:f, s:f}, s:{s:f, s:f, s:f}}", "version",
                        PW_COST_VERSION, "host", p->host, "cores", p->cores, "threads", p->threads, "mb_sizes", mbs,
                        "layers", layers, "step", "per_param_s", p->per_param, "fixed_s", p->fixed, "link",
                        "latency_s", p->latency, "bandwidth_Bps", p->bandwidth, "wake_s", p->wake);
  if (j && p->n_speed)
    json_object_set_new(j, "sharing", json_pack("{s:o, s:o}", "speed", arr(p->speed, p->n_speed), "wake_s",
                                                arr(p->wake_busy, p->n_speed)));
  return j;
}

/* One series at mb sequences: interpolated between the measured sizes
 * around it, else scaled per sequence from the nearest. */
static double at_mb(const pw_cost_profile *p, const double *v, int mb) {
  int n = p->n_mb;
  if (mb <= p->mb[0]) return v[0] * mb / p->mb[0];
  if (mb >= p->mb[n - 1]) return v[n - 1] * mb / p->mb[n - 1];
  int k = 1;
  while (p->mb[k] < mb) k++;
  double t = (double)(mb - p->mb[k - 1]) / (p->mb[k] - p->mb[k - 1]);
  return v[k - 1] + t * (v[k] - v[k - 1]);
}

void pw_cost_layer(const pw_cost_profile *p, int layer, int mb, double *f, double *i, double *w) {
  size_t o = (size_t)layer * (size_t)p->n_mb;
  *f = at_mb(p, p->f + o, mb);
  *i = at_mb(p, p->i + o, mb);
  *w = at_mb(p, p->w + o, mb);
}

static int find(const pw_cost_profile *p, const char *name) {
  for (int li = 0; li < p->n_layers; li++)
    if (!strcmp(p->names[li], name)) return li;
  return -1;
}

int pw_cost_stages(const pw_cost_profile *p, const pw_model *m, const pw_partition *part, int mb, double *f,
                   double *i, double *w, pw_err *err) {
  for (int s = 0; s < part->n_stages; s++) {
    f[s] = i[s] = w[s] = 0;
    for (int l = part->stages[s].layer_lo; l < part->stages[s].layer_hi; l++) {
      int li = find(p, m->layers[l].name);
      if (li < 0)
        return pw_err_set(err, PW_EFORMAT, "profile.layers", "no entry for layer '%s' (calibrate with this job's model)",
                          m->layers[l].name);
      double lf, lb, lw;
      pw_cost_layer(p, li, mb, &lf, &lb, &lw);
      f[s] += lf;
      i[s] += lb;
      w[s] += lw;
    }
  }
  return 0;
}

double pw_cost_step_end(const pw_cost_profile *p, size_t params) { return p->fixed + p->per_param * (double)params; }

double pw_cost_transfer_latency(const pw_cost_profile *p, int n) {
  int k = n < p->n_speed ? n : p->n_speed;
  double wake = k > 1 && p->wake_busy[k - 1] > 0 ? p->wake_busy[k - 1] : p->wake;
  return p->latency + 2 * wake;
}
