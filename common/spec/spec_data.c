/* spec_data: the "data" and "init" sections of a job spec — what a job
 * reads (a data kind, a file or a stored dataset, its sampler) and what it
 * starts from (stored weights, or another job's checkpoint); parsed, and
 * written back as canonical JSON (spec_field.h). The rules that tie the
 * data kind to the model stay with the other cross-section rules (spec.c). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "spec_field.h"
#include "suggest.h"

const char *const pw__data_names[] = {"text", "copy", "reverse", "regression", "classify", "tokens", "shift",
                                      "labeled"};
static const char *const sampler_names[] = {"sequential", "random"}; /* pw_sampler_kind */

#define D_STREAM ((1u << PW_DATA_TEXT) | (1u << PW_DATA_TOKENS)) /* one stream of ids, cut into windows */
#define D_TEXT (D_STREAM | (1u << PW_DATA_LABELED))                /* kinds read from a file */
static const pw__field data_fields[] = {
    PW__ENUM("kind", PW__REQ, PW__ALL, pw_data_spec, kind, 0, pw__data_names),
    PW__STR("path", 0, D_TEXT, pw_data_spec, path),
    PW__STR("dataset", 0, D_TEXT, pw_data_spec, dataset),
    PW__STR("tokenizer", 0, 1u << PW_DATA_TOKENS, pw_data_spec, tokenizer),
    PW__ENUM("sampler", 0, D_TEXT, pw_data_spec, sampler, PW_SAMPLER_RANDOM, sampler_names),
    PW__NUM("eval_fraction", PW__LO_OPEN | PW__HI_OPEN, D_TEXT, pw_data_spec, eval_fraction, 0.1, 0,
            1),
    PW__INT("keys", 0, 1u << PW_DATA_SHIFT, pw_data_spec, keys, 4, 1, 1 << 16),
    PW__INT("mask_token", PW__OMITDEF, D_STREAM, pw_data_spec, mask_token, -1, 0, (1 << 24) - 1),
};

int pw_data_id_valid(const char *s) {
  size_t n = 0;
  for (; s[n]; n++)
    if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) return 0;
  return n == 64;
}

/* data.path as given if it exists from here; else base_dir/path if that
 * exists; else as given (the dataset opener reports it missing). */
static void data_path_resolve(pw_data_spec *d, const char *base_dir) {
  if (d->path[0] == '/' || access(d->path, F_OK) == 0 || !base_dir || !base_dir[0]) return;
  char joined[sizeof d->path];
  int n = snprintf(joined, sizeof joined, "%s/%s", base_dir, d->path);
  if (n > 0 && (size_t)n < sizeof joined && access(joined, F_OK) == 0) memcpy(d->path, joined, (size_t)n + 1);
}

int pw__data_parse(const json_t *o, const char *base_dir, pw_data_spec *d, pw_err *err) {
  int kind = 0, rc;
  if ((rc = pw__enum_get(o, "data", "kind", pw__data_names, PW__N(pw__data_names), -1, &kind, err))) return rc;
  char ctx[32];
  snprintf(ctx, sizeof ctx, "kind %s", pw__data_names[kind]);
  d->mask_token = -1; /* the kinds without the field have none */
  if ((rc = pw__fields_parse(o, "data", data_fields, PW__N(data_fields), 1u << kind, ctx, d, err)))
    return rc;
  if (!((1u << kind) & D_TEXT)) return 0;
  if (!d->path[0] && !d->dataset[0])
    return pw_err_set(err, PW_ESPEC, "data", "kind %s needs data.path (a file) or data.dataset (a stored dataset's id)",
                      pw__data_names[kind]);
  if (d->dataset[0] && !pw_data_id_valid(d->dataset))
    return pw_err_set(err, PW_ESPEC, "data.dataset", "must be a dataset id: 64 lowercase hex digits (its sha256)");
  if (d->path[0] && !d->dataset[0]) data_path_resolve(d, base_dir);
  return 0;
}

/* "init": {"checkpoint": ID} or {"job": J, "step": N[, "optimizer": true]};
 * the coordinator's resolved form has both (and optimizer_checkpoint). */
static int init_id(const json_t *o, const char *key, char out[65], pw_err *err) {
  const json_t *v = json_object_get(o, key);
  if (!v) return 0;
  char path[48];
  snprintf(path, sizeof path, "init.%s", key);
  if (!json_is_string(v) || !pw_data_id_valid(json_string_value(v)))
    return pw_err_set(err, PW_ESPEC, path, "must be a stored weights id: 64 lowercase hex digits (its sha256)");
  memcpy(out, json_string_value(v), 65);
  return 0;
}

int pw__init_parse(const json_t *o, pw_init_spec *in, pw_err *err) {
  memset(in, 0, sizeof *in);
  if (!o) return 0;
  const char *key;
  const json_t *v;
  static const char *const keys[] = {"checkpoint", "job", "step", "optimizer", "optimizer_checkpoint"};
  const int n_keys = (int)(sizeof keys / sizeof keys[0]);
  json_object_foreach((json_t *)o, key, v) {
    int known = 0;
    for (int i = 0; i < n_keys; i++) known |= !strcmp(key, keys[i]);
    char near[96];
    if (!known)
      return pw_err_set(err, PW_ESPEC, "init", "unknown field \"%.64s\" (checkpoint, or job and step, optimizer)%s",
                        key, pw_suggest_text(key, keys, n_keys, "", near, sizeof near));
  }
  int rc;
  if ((rc = init_id(o, "checkpoint", in->checkpoint, err)) ||
      (rc = init_id(o, "optimizer_checkpoint", in->optimizer_checkpoint, err)))
    return rc;
  const json_t *job = json_object_get(o, "job"), *step = json_object_get(o, "step"), *opt = json_object_get(o, "optimizer");
  if (job && (!json_is_integer(job) || json_integer_value(job) < 1))
    return pw_err_set(err, PW_ESPEC, "init.job", "must be a job id (an integer >= 1)");
  if (step && (!json_is_integer(step) || json_integer_value(step) < 0 || json_integer_value(step) > 2147483647))
    return pw_err_set(err, PW_ESPEC, "init.step", "must be a step (an integer >= 0)");
  if (!!job != !!step)
    return pw_err_set(err, PW_ESPEC, job ? "init.step" : "init.job", "init.job and init.step go together");
  if (opt && !json_is_boolean(opt)) return pw_err_set(err, PW_ESPEC, "init.optimizer", "must be true or false");
  in->job = job ? (long long)json_integer_value(job) : 0;
  in->step = step ? (int)json_integer_value(step) : 0;
  in->optimizer = opt && json_is_true(opt);
  if (!in->job && !in->checkpoint[0])
    return pw_err_set(err, PW_ESPEC, "init", "give init.checkpoint (a stored weights id) or init.job and init.step");
  if (in->optimizer && !in->job)
    return pw_err_set(err, PW_ESPEC, "init.optimizer", "carrying the optimizer state needs init.job and init.step");
  if (in->optimizer_checkpoint[0] && !in->optimizer)
    return pw_err_set(err, PW_ESPEC, "init.optimizer_checkpoint", "is only used with \"optimizer\": true");
  return 0;
}

json_t *pw__init_emit(const pw_init_spec *in) {
  json_t *o = json_object();
  if (!o) return NULL;
  int bad = 0;
  if (in->checkpoint[0]) bad |= json_object_set_new(o, "checkpoint", json_string(in->checkpoint));
  if (in->job) {
    bad |= json_object_set_new(o, "job", json_integer(in->job));
    bad |= json_object_set_new(o, "step", json_integer(in->step));
  }
  if (in->optimizer) bad |= json_object_set_new(o, "optimizer", json_true());
  if (in->optimizer_checkpoint[0])
    bad |= json_object_set_new(o, "optimizer_checkpoint", json_string(in->optimizer_checkpoint));
  if (bad) {
    json_decref(o);
    return NULL;
  }
  return o;
}

int pw__data_emit(json_t *data, const pw_data_spec *d) {
  return pw__fields_emit(data, data_fields, PW__N(data_fields), 1u << d->kind, d);
}
