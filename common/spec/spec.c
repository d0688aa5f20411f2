/* spec: parse and validate a job spec (spec.h), and write it back as
 * canonical JSON with every default filled in.
 *
 * Each object's fields are a table (spec_field.h) walked by one parser and
 * one emitter; the rules that tie sections together (batch divisible by
 * microbatches * dp, data kind vs model, partition markers vs mesh) are
 * checked once every section has parsed. This file never builds the model
 * graph or judges a schedule against a plan: model.c and schedule.c do.
 * The sections of their own files: the model (spec_model.c, its regions
 * spec_regions.c), where stages go (spec_layout.c), data and init
 * (spec_data.c); the schedule names and their spellings: spec_schedules.c. */
#include "spec_json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec_field.h"
#include "suggest.h"

#define MAX_SPEC_FILE (16u << 20)
#define MAX_MESH 4096
#define MAX_MICROBATCHES (1 << 20)
#define MAX_BATCH (1 << 24)
#define MAX_LAYER_TIMES 100000
#define INT_MAXD 2147483647.0

/* ---- the sections ---------------------------------------------------- */

static const char *const mode_names[] = {"train", "forward", "serve"}; /* pw_mode */
static const char *const part_names[] = {"even", "markers", "balanced", "explicit"}; /* pw_partition_mode */
static const char *const opt_names[] = {"adamw", "sgd"};            /* pw_opt_kind */
static const char *const nonfinite_names[] = {"fail", "skip"};       /* pw_nonfinite */
static const char *const precision_names[] = {"fp32", "bf16"};       /* pw_precision */
static const char *const attention_names[] = {"auto", "tiled", "plain"}; /* pw_attn_impl */

_Static_assert(sizeof(pw_mode) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(pw_data_kind) == sizeof(int), "enums are stored as int");

static const pw__field job_fields[] = {
    PW__SKIP("name", 0, PW__ALL),
    PW__ENUM("mode", 0, PW__ALL, pw_job, mode, PW_MODE_TRAIN, mode_names),
    PW__SKIP("model", PW__REQ, PW__ALL),
    PW__SKIP("mesh", 0, PW__ALL),
    PW__SKIP("schedule", 0, PW__ALL),
    PW__SKIP("partition", 0, PW__ALL),
    PW__SKIP("train", 0, PW__ALL),
    PW__SKIP("data", PW__REQ, PW__ALL),
    PW__SKIP("init", 0, PW__ALL),
    PW__SKIP("serve", 0, PW__ALL),
};

static const pw__field serve_fields[] = {
    PW__INT("max_sequences", 0, PW__ALL, pw_serve_spec, max_sequences, 8, 1, 1024),
    PW__INT("max_len", 0, PW__ALL, pw_serve_spec, max_len, 0, 0, 1 << 20),
    PW__INT("max_queue", 0, PW__ALL, pw_serve_spec, max_queue, 64, 0, 4096),
};

/* "serve" only with mode serve; a serve job needs init (the weights it
 * serves) and a token model; max_len 0 is the model's seq_len, the most
 * learned positions allow. */
static int serve_parse(const json_t *o, pw_job *job, pw_err *err) {
  if (json_object_get(o, "serve") && job->mode != PW_MODE_SERVE)
    return pw_err_set(err, PW_ESPEC, "serve", "only with \"mode\": \"serve\"");
  if (job->mode != PW_MODE_SERVE) return 0;
  const json_t *sv;
  int rc = pw__obj_get(o, "", "serve", &sv, err);
  if (!rc) rc = pw__fields_parse(sv, "serve", serve_fields, PW__N(serve_fields), PW__ALL, "", &job->serve, err);
  if (rc) return rc;
  if (job->model.input != PW_INPUT_TOKENS)
    return pw_err_set(err, PW_ESPEC, "mode", "serve needs a token model (gpt, llama, or a layers list on tokens)");
  if (job->model.tmpl == PW_TEMPLATE_BERT)
    return pw_err_set(err, PW_ESPEC, "mode",
                      "serve generates text, and template bert is an encoder: nothing decodes it (pipewright logits "
                      "gives its outputs)");
  if (!job->init.checkpoint[0] && !job->init.job)
    return pw_err_set(err, PW_ESPEC, "init",
                      "mode serve needs init: the weights to serve (init.checkpoint, or init.job and init.step)");
  if (job->serve.max_len == 0) job->serve.max_len = job->model.seq_len;
  if (job->serve.max_len > job->model.seq_len)
    return pw_err_set(err, PW_ESPEC, "serve.max_len", "must be at most model.seq_len (%d > %d)", job->serve.max_len,
                      job->model.seq_len);
  return 0;
}

static const pw__field mesh_fields[] = {
    PW__INT("pp", 0, PW__ALL, pw_mesh_spec, pp, 1, 1, MAX_MESH),
    PW__INT("dp", 0, PW__ALL, pw_mesh_spec, dp, 1, 1, MAX_MESH),
    PW__INT("virtual_stages", 0, PW__ALL, pw_mesh_spec, virtual_stages, 1, 1, MAX_MESH),
    PW__INT("tp", PW__OMITDEF, PW__ALL, pw_mesh_spec, tp, 1, 1, MAX_MESH),
    PW__SKIP("placement", 0, PW__ALL), /* spec_layout.c */
};

/* The schedule's name is a string in pw_schedule_spec; it parses as an
 * index into pw_schedule_names. */
typedef struct {
  int name;
  int microbatches;
  int regions; /* pw_schedule_spec.regions_serial */
} sched_tmp;
static const char *const regions_exec_names[] = {"concurrent", "serial"};
static const pw__field sched_fields[] = {
    {"name", PW__F_ENUM, 0, PW__ALL, offsetof(sched_tmp, name), 0, 1, 0, 0, pw_schedule_names,
     sizeof pw_schedule_names / sizeof pw_schedule_names[0]},
    PW__INT("microbatches", 0, PW__ALL, sched_tmp, microbatches, 1, 1, MAX_MICROBATCHES),
    /* a regions model's execution; left out when concurrent (the default) */
    PW__ENUM("regions", PW__OMIT0, PW__ALL, sched_tmp, regions, 0, regions_exec_names),
};

#define P_BAL (1u << PW_PARTITION_BALANCED)
static const pw__field part_fields[] = {
    PW__ENUM("mode", PW__NODEF, PW__ALL, pw_partition_spec, mode, 0, part_names),
    PW__SKIP("stages", 0, 1u << PW_PARTITION_EXPLICIT), /* spec_layout.c */
    PW__SKIP("layer_times", 0, P_BAL),
    PW__NUM("byte_cost", 0, P_BAL, pw_partition_spec, byte_cost, 0, 0, PW__NOLIM),
    PW__SKIP("remat", 0, PW__ALL), /* remat_parse */
};

static const pw__field train_fields[] = {
    PW__INT("steps", 0, PW__ALL, pw_train_spec, steps, 100, 0, INT_MAXD),
    PW__INT("batch_size", 0, PW__ALL, pw_train_spec, batch_size, 8, 1, MAX_BATCH),
    PW__U64("seed", 0, PW__ALL, pw_train_spec, seed, 1),
    PW__NUM("grad_clip", 0, PW__ALL, pw_train_spec, grad_clip, 1.0, 0, PW__NOLIM),
    PW__INT("checkpoint_every", 0, PW__ALL, pw_train_spec, checkpoint_every, 0, 0, INT_MAXD),
    PW__INT("eval_batches", 0, PW__ALL, pw_train_spec, eval_batches, 8, 1, MAX_BATCH),
    /* held-out loss during cluster runs; omitted when 0 (off), so older
     * specs keep their hash */
    PW__INT("eval_every", PW__OMIT0, PW__ALL, pw_train_spec, eval_every, 0, 0, INT_MAXD),
    /* the coordinator's retention; the workers never need it, so it stays
     * out of the slice */
    PW__INT("keep_checkpoints", 0, PW__ALL, pw_train_spec, keep_checkpoints, 3, 1, INT_MAXD),
    /* left out of the canonical spec when "fail" (the default): specs and
     * plan hashes from before the field stay the same */
    PW__ENUM("on_nonfinite", PW__OMIT0, PW__ALL, pw_train_spec, on_nonfinite, PW_NONFINITE_FAIL, nonfinite_names),
    /* recovery (the coordinator's; snapshot_every travels in the slice) */
    PW__INT("max_restarts", 0, PW__ALL, pw_train_spec, max_restarts, 3, 0, 1000),
    PW__INT("snapshot_every", 0, PW__ALL, pw_train_spec, snapshot_every, 1, 0, INT_MAXD),
    /* sharded optimizer state; omitted when 0, so older specs keep their hash */
    PW__INT("zero", PW__OMIT0, PW__ALL, pw_train_spec, zero, 0, 0, 3),
    /* omitted when "fp32" (the default): older specs keep their hash */
    PW__ENUM("precision", PW__OMIT0, PW__ALL, pw_train_spec, precision, PW_PRECISION_FP32, precision_names),
    /* omitted when "auto" (the default): older specs keep their hash */
    PW__ENUM("attention", PW__OMIT0, PW__ALL, pw_train_spec, attention, PW_ATTN_AUTO, attention_names),
    PW__SKIP("optimizer", 0, PW__ALL),
    PW__SKIP("trainable", 0, PW__ALL), /* trainable_parse */
};

#define O_ADAMW (1u << PW_OPT_ADAMW)
#define O_SGD (1u << PW_OPT_SGD)
static const pw__field opt_fields[] = {
    PW__ENUM("name", 0, PW__ALL, pw_optim_spec, kind, PW_OPT_ADAMW, opt_names),
    PW__NUM("lr", PW__LO_OPEN, PW__ALL, pw_optim_spec, lr, 3e-4, 0, PW__NOLIM),
    PW__NUM("min_lr", PW__NODEF, PW__ALL, pw_optim_spec, min_lr, 0, 0, PW__NOLIM),
    PW__INT("warmup_steps", 0, PW__ALL, pw_optim_spec, warmup_steps, 0, 0, INT_MAXD),
    PW__SKIP("betas", 0, O_ADAMW),
    PW__NUM("eps", PW__LO_OPEN, O_ADAMW, pw_optim_spec, eps, 1e-8, 0, PW__NOLIM),
    PW__NUM("weight_decay", PW__NODEF, PW__ALL, pw_optim_spec, weight_decay, 0, 0, PW__NOLIM),
    PW__NUM("momentum", PW__HI_OPEN, O_SGD, pw_optim_spec, momentum, 0, 0, 1),
};

static int name_parse(const json_t *root, pw_job *job, pw_err *err) {
  const json_t *v = json_object_get(root, "name");
  if (!v) {
    snprintf(job->name, sizeof job->name, "job");
    return 0;
  }
  if (!json_is_string(v)) return pw_err_set(err, PW_ESPEC, "name", "must be a string");
  const char *s = json_string_value(v);
  size_t len = json_string_length(v);
  if (len == 0) return pw_err_set(err, PW_ESPEC, "name", "must not be empty");
  if (len >= sizeof job->name)
    return pw_err_set(err, PW_ESPEC, "name", "too long (%zu bytes, at most %zu)", len,
                      sizeof job->name - 1);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7f)
      return pw_err_set(err, PW_ESPEC, "name", "must not contain control characters (0x%02x at byte %zu)",
                        c, i);
  }
  memcpy(job->name, s, len + 1);
  return 0;
}

/* One number of an array ("betas", "layer_times") goes through the same
 * checks as a field. */
typedef struct {
  double v;
} num_box;
static const pw__field beta_field = PW__NUM("", PW__HI_OPEN, PW__ALL, num_box, v, 0, 0, 1);
static const pw__field time_field = PW__NUM("", PW__LO_OPEN, PW__ALL, num_box, v, 0, 0, PW__NOLIM);

static int optim_parse(const json_t *o, pw_optim_spec *op, pw_err *err) {
  const char *pre = "train.optimizer";
  int kind = 0, rc;
  if ((rc = pw__enum_get(o, pre, "name", opt_names, 2, PW_OPT_ADAMW, &kind, err))) return rc;
  if ((rc = pw__fields_parse(o, pre, opt_fields, PW__N(opt_fields), 1u << kind,
                             kind == PW_OPT_ADAMW ? "optimizer adamw" : "optimizer sgd", op, err)))
    return rc;
  op->beta1 = 0.9;
  op->beta2 = 0.999;
  const json_t *b = o ? json_object_get(o, "betas") : NULL;
  if (b) {
    if (!json_is_array(b) || json_array_size(b) != 2)
      return pw_err_set(err, PW_ESPEC, "train.optimizer.betas", "must be an array of 2 numbers [b1, b2]");
    num_box box[2];
    for (int i = 0; i < 2; i++) {
      char path[64];
      snprintf(path, sizeof path, "train.optimizer.betas[%d]", i);
      if ((rc = pw__field_parse(&beta_field, json_array_get(b, (size_t)i), path, &box[i], err))) return rc;
    }
    op->beta1 = box[0].v;
    op->beta2 = box[1].v;
  }
  if (!o || !json_object_get(o, "min_lr")) op->min_lr = op->lr / 10;
  if (op->min_lr > op->lr)
    return pw_err_set(err, PW_ESPEC, "train.optimizer.min_lr", "must be <= lr (%g > %g)", op->min_lr,
                      op->lr);
  if (!o || !json_object_get(o, "weight_decay")) op->weight_decay = kind == PW_OPT_ADAMW ? 0.01 : 0;
  return 0;
}

/* train.trainable: a non-empty array of glob patterns; whether each
 * matches a parameter is checked when the model is built (model.c). */
static int trainable_parse(const json_t *o, pw_train_spec *t, pw_err *err) {
  const json_t *a = o ? json_object_get(o, "trainable") : NULL;
  t->n_trainable = 0;
  return a ? pw__globs_get(a, "train.trainable", PW_TRAINABLE_MAX, PW_TRAINABLE_LEN, t->trainable[0], &t->n_trainable,
                           "parameter names (e.g. [\"blocks.*\", \"lm_head.weight\"])", err)
           : 0;
}

static int train_parse(const json_t *o, pw_train_spec *t, pw_err *err) {
  const json_t *opt;
  int rc = pw__fields_parse(o, "train", train_fields, PW__N(train_fields), PW__ALL, "", t, err);
  if (!rc) rc = trainable_parse(o, t, err);
  if (!rc) rc = pw__obj_get(o, "train", "optimizer", &opt, err);
  if (!rc) rc = optim_parse(opt, &t->optim, err);
  return rc;
}

/* schedule.custom: {"ranks": [one string per pipeline rank]}, kept as
 * given (the planner parses and proves the lists). */
static int custom_parse(const json_t *c, int pp, pw_schedule_spec *s, pw_err *err) {
  if (!json_is_object(c)) return pw_err_set(err, PW_ESPEC, "schedule.custom", "must be an object {\"ranks\": [...]}");
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)c, key, v)
    if (strcmp(key, "ranks") != 0)
      return pw_err_set(err, PW_ESPEC, "schedule.custom", "unknown field \"%.64s\" (the only field is ranks)", key);
  const json_t *ranks = json_object_get(c, "ranks");
  if (!json_is_array(ranks))
    return pw_err_set(err, PW_ESPEC, "schedule.custom.ranks",
                      "must be an array of action lists, one per pipeline rank");
  if ((int)json_array_size(ranks) != pp)
    return pw_err_set(err, PW_ESPEC, "schedule.custom.ranks",
                      "needs one action list per pipeline rank: mesh.pp = %d (got %d)", pp, (int)json_array_size(ranks));
  for (int r = 0; r < pp; r++)
    if (!json_is_string(json_array_get(ranks, (size_t)r)))
      return pw_err_set(err, PW_ESPEC, "schedule.custom.ranks",
                        "entry %d must be a string of actions (\"F0@s0 F1@s0 B0@s0 ...\")", r);
  s->custom_ranks = calloc((size_t)pp, sizeof(char *));
  if (!s->custom_ranks) return pw_err_set(err, PW_ENOMEM, "schedule.custom", "out of memory");
  s->n_custom_ranks = pp;
  for (int r = 0; r < pp; r++)
    if (!(s->custom_ranks[r] = strdup(json_string_value(json_array_get(ranks, (size_t)r)))))
      return pw_err_set(err, PW_ENOMEM, "schedule.custom", "out of memory");
  return 0;
}

static int schedule_parse(const json_t *o, int pp, pw_schedule_spec *s, pw_err *err) {
  sched_tmp tmp;
  /* another spelling of a schedule's name is read as its canonical name
   * (and stored so: the canonical spec never holds an alias); a custom
   * schedule's name is "custom" or absent */
  const json_t *jname = json_object_get(o, "name"), *custom = json_object_get(o, "custom");
  const char *name = json_string_value(jname), *canon = pw_schedule_resolve(name);
  int is_custom = custom || (name && strcmp(name, "custom") == 0);
  if (is_custom && !custom)
    return pw_err_set(err, PW_ESPEC, "schedule.custom", "required when schedule.name is \"custom\"");
  if (is_custom && jname && !(name && strcmp(name, "custom") == 0))
    return pw_err_set(err, PW_ESPEC, "schedule.name",
                      "must be \"custom\" or absent with schedule.custom (got %s%.64s%s)",
                      name ? "\"" : "", name ? name : "a non-string", name ? "\"" : "");
  json_t *copy = NULL;
  if (is_custom || (canon && strcmp(name, canon) != 0)) {
    if (!(copy = json_copy((json_t *)o)) ||
        (is_custom ? json_object_del(copy, "custom") || (jname && json_object_del(copy, "name"))
                   : json_object_set_new(copy, "name", json_string(canon)))) {
      json_decref(copy);
      return pw_err_set(err, PW_ENOMEM, "schedule", "out of memory");
    }
    o = copy;
  }
  int rc = pw__fields_parse(o, "schedule", sched_fields, PW__N(sched_fields), PW__ALL, "", &tmp, err);
  json_decref(copy);
  if (rc) return rc;
  snprintf(s->name, sizeof s->name, "%s", is_custom ? "custom" : pw_schedule_names[tmp.name]);
  s->microbatches = tmp.microbatches;
  s->regions_serial = tmp.regions;
  return is_custom ? custom_parse(custom, pp, s, err) : 0;
}

int pw_partition_remat(const pw_partition_spec *p, int s) {
  return p->remat_all || (s >= 0 && s < p->n_remat && p->remat[s]);
}

#define REMAT_RULE "must be \"none\", \"full\" or a list with one entry per stage (true/false or \"full\"/\"none\")"

/* One entry: true/false or "full"/"none"; 1, 0, or -1 when it is neither. */
static int remat_entry(const json_t *v) {
  if (json_is_boolean(v)) return json_is_true(v);
  const char *s = json_string_value(v);
  return !s ? -1 : !strcmp(s, "full") ? 1 : !strcmp(s, "none") ? 0 : -1;
}

/* partition.remat; its length is checked against the mesh in cross_check. */
static int remat_parse(const json_t *o, pw_partition_spec *p, pw_err *err) {
  const json_t *a = o ? json_object_get(o, "remat") : NULL;
  const char *path0 = "partition.remat";
  if (!a) return 0;
  if (json_is_string(a)) {
    int v = remat_entry(a);
    if (v < 0) return pw_err_set(err, PW_ESPEC, path0, REMAT_RULE "; got \"%.40s\"", json_string_value(a));
    p->remat_all = v;
    return 0;
  }
  if (!json_is_array(a)) return pw_err_set(err, PW_ESPEC, path0, REMAT_RULE);
  size_t n = json_array_size(a);
  if (n == 0) return pw_err_set(err, PW_ESPEC, path0, "must not be empty (\"none\" turns it off)");
  if (n > (size_t)MAX_MESH * MAX_MESH) return pw_err_set(err, PW_ESPEC, path0, "too many entries (%zu)", n);
  if (!(p->remat = calloc(n, 1))) return pw_err_set(err, PW_ENOMEM, path0, "out of memory");
  p->n_remat = (int)n;
  for (size_t i = 0; i < n; i++) {
    int v = remat_entry(json_array_get(a, i));
    if (v < 0) {
      char path[48];
      snprintf(path, sizeof path, "%s[%zu]", path0, i);
      return pw_err_set(err, PW_ESPEC, path, "must be true/false or \"full\"/\"none\"");
    }
    p->remat[i] = (unsigned char)v;
  }
  return 0;
}

/* The partition's default mode depends on the model: markers when the
 * layers list carries stage_boundary entries; explicit when stages are
 * listed. */
static int partition_parse(const json_t *o, const pw_model_spec *m, pw_partition_spec *p, pw_err *err) {
  int n_bound = 0, mode = 0, rc;
  for (int i = 0; i < m->n_layer_specs; i++) n_bound += m->layers[i].type == PW_LAYER_STAGE_BOUNDARY;
  const json_t *stages = o ? json_object_get(o, "stages") : NULL;
  int def = stages ? PW_PARTITION_EXPLICIT : n_bound ? PW_PARTITION_MARKERS : PW_PARTITION_EVEN;
  if ((rc = pw__enum_get(o, "partition", "mode", part_names, PW__N(part_names), def, &mode, err))) return rc;
  char ctx[32];
  snprintf(ctx, sizeof ctx, "mode %s", part_names[mode]);
  if ((rc = pw__fields_parse(o, "partition", part_fields, PW__N(part_fields), 1u << mode, ctx, p, err)))
    return rc;
  p->mode = (pw_partition_mode)mode;
  if (mode == PW_PARTITION_MARKERS && n_bound == 0)
    return pw_err_set(err, PW_ESPEC, "partition.mode",
                      "markers needs stage_boundary entries in model.layers (there are none)");
  if ((rc = pw__hints_collect(m, p, err)) || (mode == PW_PARTITION_EXPLICIT && (rc = pw__stages_parse(stages, p, err))) ||
      (rc = remat_parse(o, p, err)))
    return rc;
  const json_t *a = o ? json_object_get(o, "layer_times") : NULL;
  if (!a) return 0;
  const char *path0 = "partition.layer_times";
  if (!json_is_array(a)) return pw_err_set(err, PW_ESPEC, path0, "must be an array of numbers");
  size_t n = json_array_size(a);
  if (n == 0) return pw_err_set(err, PW_ESPEC, path0, "must not be empty");
  if (n > MAX_LAYER_TIMES)
    return pw_err_set(err, PW_ESPEC, path0, "too many entries (%zu > %d)", n, MAX_LAYER_TIMES);
  p->layer_times = malloc(n * sizeof *p->layer_times);
  if (!p->layer_times) return pw_err_set(err, PW_ENOMEM, path0, "out of memory");
  p->n_layer_times = (int)n;
  for (size_t i = 0; i < n; i++) {
    char path[64];
    num_box box;
    snprintf(path, sizeof path, "%s[%zu]", path0, i);
    if ((rc = pw__field_parse(&time_field, json_array_get(a, i), path, &box, err))) return rc;
    p->layer_times[i] = box.v;
  }
  return 0;
}

/* ---- rules across sections ------------------------------------------- */

int pw_job_mb_size(const pw_job *job, pw_err *err) {
  long long per = (long long)job->schedule.microbatches * job->mesh.dp;
  if (per < 1 || job->train.batch_size % per)
    return pw_err_set(err, PW_ESPEC, "train.batch_size",
                      "must be divisible by schedule.microbatches * mesh.dp (%d %% %lld != 0)",
                      job->train.batch_size, per);
  return (int)(job->train.batch_size / per);
}

/* BERT's data: a masked-LM model masks windows of text or tokens with
 * data.mask_token, a classifier reads labeled sequences; neither goes with
 * another model. */
static int bert_data_check(const pw_job *job, pw_err *err) {
  const pw_model_spec *m = &job->model;
  const pw_data_spec *d = &job->data;
  int bert = m->tmpl == PW_TEMPLATE_BERT, mlm = bert && m->bert_head == PW_BERT_HEAD_MLM;
  if (mlm && d->kind != PW_DATA_TEXT && d->kind != PW_DATA_TOKENS)
    return pw_err_set(err, PW_ESPEC, "data.kind", "bert_head \"mlm\" masks windows of kind text or tokens (got %s)",
                      pw__data_names[d->kind]);
  if (mlm && d->mask_token < 0)
    return pw_err_set(err, PW_ESPEC, "data.mask_token",
                      "required with bert_head \"mlm\": the id that replaces a masked position (BERT's [MASK])");
  if (mlm && d->mask_token >= m->vocab_size)
    return pw_err_set(err, PW_ESPEC, "data.mask_token", "must be below vocab_size (%d >= %d)", d->mask_token,
                      m->vocab_size);
  if (!mlm && d->mask_token >= 0)
    return pw_err_set(err, PW_ESPEC, "data.mask_token", "only with template bert, bert_head \"mlm\"");
  if (bert && !mlm && d->kind != PW_DATA_LABELED)
    return pw_err_set(err, PW_ESPEC, "data.kind",
                      "bert_head \"classify\" reads kind labeled (token sequences with a label each; got %s)",
                      pw__data_names[d->kind]);
  if (d->kind == PW_DATA_LABELED && !(bert && !mlm))
    return pw_err_set(err, PW_ESPEC, "data.kind", "labeled sequences are read by template bert, bert_head \"classify\"");
  return 0;
}

static int cross_check(const pw_job *job, pw_err *err) {
  const pw_model_spec *m = &job->model;
  const pw_data_spec *d = &job->data;
  int tokens = m->input == PW_INPUT_TOKENS;
  int token_data = d->kind == PW_DATA_TEXT || d->kind == PW_DATA_TOKENS || d->kind == PW_DATA_COPY ||
                   d->kind == PW_DATA_REVERSE || d->kind == PW_DATA_SHIFT || d->kind == PW_DATA_LABELED;
  int rc = bert_data_check(job, err);
  if (rc) return rc;
  /* A snapshot copies a stage's whole optimizer state, which a ZeRO
   * replica does not hold: asked for explicitly, refused rather than
   * half-taken (left out, it defaults to 0: pw_job_parse). */
  if (job->train.zero > 0 && job->mesh.dp > 1 && job->train.snapshot_every > 0)
    return pw_err_set(err, PW_ESPEC, "train.zero",
                      "sharded optimizer state (zero %d over mesh.dp %d) cannot be snapshotted for recovery: set "
                      "train.snapshot_every to 0 or leave it out (recovery then resumes from the last checkpoint)",
                      job->train.zero, job->mesh.dp);
  /* ZeRO-3 shards the parameter arena as the gradients' main part: a
   * frozen parameter has no place there; bf16 keeps whole weight copies */
  if (job->train.zero == 3 && (job->train.n_trainable > 0 || m->n_lora_targets > 0))
    return pw_err_set(err, PW_ESPEC, "train.zero",
                      "zero 3 shards trainable parameters only (train.trainable or model.lora freeze some): use zero 2");
  if (job->train.zero == 3 && job->train.precision == PW_PRECISION_BF16)
    return pw_err_set(err, PW_ESPEC, "train.zero",
                      "zero 3 runs train.precision \"fp32\" only (bf16 keeps whole copies of the weights): use zero 2");
  if (tokens && !token_data)
    return pw_err_set(err, PW_ESPEC, "data.kind",
                      "a token model needs kind text, tokens, copy, reverse or shift (got %s)",
                      pw__data_names[d->kind]);
  for (int r = 0; r < m->n_regions; r++)
    if (m->regions[r].has_input && m->regions[r].input == PW_INPUT_FEATURES && d->kind != PW_DATA_SHIFT) {
      char path[48];
      snprintf(path, sizeof path, "model.regions[%d].input", r);
      return pw_err_set(err, PW_ESPEC, path, "features per position come with data kind shift (got %s)",
                        pw__data_names[d->kind]);
    }
  if (!tokens && token_data)
    return pw_err_set(err, PW_ESPEC, "data.kind",
                      "a features model (%s) needs kind regression or classify (got %s)",
                      m->tmpl == PW_TEMPLATE_MLP ? "mlp" : "features input", pw__data_names[d->kind]);
  if (!tokens) {
    int want = m->loss == PW_LOSS_MSE ? PW_DATA_REGRESSION : PW_DATA_CLASSIFY;
    if ((int)d->kind != want)
      return pw_err_set(err, PW_ESPEC, "data.kind", "%s with loss %s needs kind %s (got %s)",
                        m->tmpl == PW_TEMPLATE_MLP ? "mlp" : "a layers list",
                        m->loss == PW_LOSS_MSE ? "mse" : "cross_entropy", pw__data_names[want],
                        pw__data_names[d->kind]);
  }
  if (d->kind == PW_DATA_TEXT && m->vocab_size < 256)
    return pw_err_set(err, PW_ESPEC,
                      m->tmpl == PW_TEMPLATE_LAYERS ? "model.layers[0].vocab_size" : "model.vocab_size",
                      "byte-level text needs vocab_size >= 256 (got %d)", m->vocab_size);

  rc = pw_job_mb_size(job, err);
  if (rc < 0) return rc;

  if (job->partition.mode == PW_PARTITION_MARKERS) {
    int stages = 1;
    for (int i = 0; i < m->n_layer_specs; i++) stages += m->layers[i].type == PW_LAYER_STAGE_BOUNDARY;
    long long want = (long long)job->mesh.pp * job->mesh.virtual_stages;
    if (stages != want)
      return pw_err_set(err, PW_ESPEC, "partition.mode",
                        "the stage_boundary markers make %d stages, but mesh.pp * mesh.virtual_stages = %lld",
                        stages, want);
  }
  long long S = (long long)job->mesh.pp * job->mesh.virtual_stages;
  if (job->partition.mode == PW_PARTITION_EXPLICIT && job->partition.n_stages != S)
    return pw_err_set(err, PW_ESPEC, "partition.stages",
                      "lists %d stages, but the mesh runs mesh.pp * mesh.virtual_stages = %d * %d = %lld",
                      job->partition.n_stages, job->mesh.pp, job->mesh.virtual_stages, S);
  if (job->partition.n_remat && job->partition.n_remat != S)
    return pw_err_set(err, PW_ESPEC, "partition.remat",
                      "lists %d stages, but the mesh runs mesh.pp * mesh.virtual_stages = %d * %d = %lld",
                      job->partition.n_remat, job->mesh.pp, job->mesh.virtual_stages, S);
  return 0;
}

/* Each region's schedule name (spec_regions.c keeps it as written), read
 * as schedule.name is: one of the nine, any spelling; never custom. */
static int regions_schedules(pw_model_spec *m, pw_err *err) {
  for (int r = 0; r < m->n_regions; r++) {
    char path[64], sug[96];
    const char *canon = pw_schedule_resolve(m->regions[r].schedule);
    snprintf(path, sizeof path, "model.regions[%d].schedule.name", r);
    if (!canon)
      return pw_err_set(err, PW_ESPEC, path, "must be one of the nine schedules (got %s)%s", m->regions[r].schedule,
                        pw_suggest_text(m->regions[r].schedule, pw_schedule_names, pw_n_schedule_names, "", sug,
                                        sizeof sug));
    snprintf(m->regions[r].schedule, sizeof m->regions[r].schedule, "%s", canon);
  }
  return 0;
}

/* ---- public ---------------------------------------------------------- */

static int job_parse(const json_t *root, const char *base_dir, pw_job *job, pw_err *err) {
  const json_t *model, *mesh, *sched, *part, *train, *data, *init;
  int rc;
  if (!json_is_object(root)) return pw_err_set(err, PW_ESPEC, "", "a job spec must be a JSON object");
  if ((rc = pw__fields_parse(root, "", job_fields, PW__N(job_fields), PW__ALL, "", job, err))) return rc;
  if ((rc = name_parse(root, job, err))) return rc;
  if ((rc = pw__obj_get(root, "", "model", &model, err)) || (rc = pw__obj_get(root, "", "mesh", &mesh, err)) ||
      (rc = pw__obj_get(root, "", "schedule", &sched, err)) ||
      (rc = pw__obj_get(root, "", "partition", &part, err)) ||
      (rc = pw__obj_get(root, "", "train", &train, err)) || (rc = pw__obj_get(root, "", "data", &data, err)) ||
      (rc = pw__obj_get(root, "", "init", &init, err)))
    return rc;
  if ((rc = pw__model_parse(model, &job->model, err)) ||
      (job->model.tmpl == PW_TEMPLATE_REGIONS && (rc = pw__regions_parse(model, &job->model, err))))
    return rc;
  if ((rc = pw__fields_parse(mesh, "mesh", mesh_fields, PW__N(mesh_fields), PW__ALL, "", &job->mesh, err)) ||
      (rc = pw__placement_parse(mesh, &job->mesh, err)))
    return rc;
  if ((rc = schedule_parse(sched, job->mesh.pp, &job->schedule, err))) return rc;
  if ((rc = partition_parse(part, &job->model, &job->partition, err))) return rc;
  if ((rc = pw__regions_settle(job, mesh, err)) || (rc = regions_schedules(&job->model, err))) return rc;
  if ((rc = train_parse(train, &job->train, err))) return rc;
  /* A ZeRO replica holds a shard of the optimizer state, which a snapshot
   * cannot copy: unless the spec asks for snapshots, they default to off. */
  if (job->train.zero > 0 && job->mesh.dp > 1 && !json_object_get(train, "snapshot_every"))
    job->train.snapshot_every = 0;
  if ((rc = pw__data_parse(data, base_dir, &job->data, err))) return rc;
  if ((rc = pw__init_parse(init, &job->init, err))) return rc;
  if ((rc = serve_parse(root, job, err))) return rc;
  return cross_check(job, err);
}

int pw_job_parse(const json_t *root, const char *base_dir, pw_job *job, pw_err *err) {
  if (!job) return pw_err_set(err, PW_EINVAL, "", "no job");
  memset(job, 0, sizeof *job);
  int rc = job_parse(root, base_dir, job, err);
  if (rc) {
    pw_job_free(job);
    memset(job, 0, sizeof *job);
  }
  return rc;
}

int pw_job_load_file(const char *path, pw_job *job, pw_err *err) {
  if (job) memset(job, 0, sizeof *job);
  if (!path || !job) return pw_err_set(err, PW_EINVAL, "", "no file or job");
  FILE *f = fopen(path, "rb");
  if (!f) return pw_err_set(err, errno == ENOENT ? PW_ENOENT : PW_EIO, path, "%s", strerror(errno));
  char *buf = malloc(MAX_SPEC_FILE + 1);
  if (!buf) {
    fclose(f);
    return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  }
  size_t len = fread(buf, 1, MAX_SPEC_FILE + 1, f);
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return pw_err_set(err, PW_EIO, path, "read failed");
  }
  if (len > MAX_SPEC_FILE) {
    free(buf);
    return pw_err_set(err, PW_ETOOBIG, path, "larger than %u MiB", MAX_SPEC_FILE >> 20);
  }
  json_error_t jerr;
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
  free(buf);
  if (!root)
    return pw_err_set(err, PW_EJSON, path, "line %d column %d: %s", jerr.line, jerr.column, jerr.text);

  char dir[512];
  const char *slash = strrchr(path, '/');
  const char *base = NULL;
  if (slash && (size_t)(slash - path) < sizeof dir) {
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    memcpy(dir, path, n);
    dir[n] = 0;
    base = dir;
  }
  int rc = pw_job_parse(root, base, job, err);
  json_decref(root);
  return rc;
}

void pw_job_free(pw_job *job) {
  if (!job) return;
  pw__model_free(&job->model);
  free(job->partition.layer_times);
  job->partition.layer_times = NULL;
  job->partition.n_layer_times = 0;
  free(job->partition.remat);
  job->partition.remat = NULL;
  job->partition.n_remat = 0;
  pw__layout_free(job);
  for (int r = 0; r < job->schedule.n_custom_ranks; r++) free(job->schedule.custom_ranks[r]);
  free(job->schedule.custom_ranks);
  job->schedule.custom_ranks = NULL;
  job->schedule.n_custom_ranks = 0;
}

json_t *pw_job_to_json(const pw_job *job) {
  json_t *o = json_object(), *v;
  if (!o) return NULL;
  int bad = json_object_set_new(o, "name", json_string(job->name));
  bad |= pw__fields_emit(o, job_fields, PW__N(job_fields), PW__ALL, job);
  bad |= json_object_set_new(o, "model", v = pw__model_emit(&job->model));
  if (job->model.tmpl == PW_TEMPLATE_REGIONS) bad |= !v || pw__regions_emit(v, &job->model);

  bad |= json_object_set_new(o, "mesh", v = json_object());
  bad |= pw__fields_emit(v, mesh_fields, PW__N(mesh_fields), PW__ALL, &job->mesh);
  bad |= pw__placement_emit(v, &job->mesh);

  sched_tmp st = {.name = -1, .microbatches = job->schedule.microbatches, .regions = job->schedule.regions_serial};
  for (int i = 0; i < pw_n_schedule_names; i++)
    if (strcmp(job->schedule.name, pw_schedule_names[i]) == 0) st.name = i;
  bad |= json_object_set_new(o, "schedule", v = json_object());
  if (job->schedule.custom_ranks) {
    json_t *ranks = json_array();
    bad |= json_object_set_new(v, "name", json_string("custom"));
    bad |= json_object_set_new(v, "microbatches", json_integer(job->schedule.microbatches));
    bad |= json_object_set_new(v, "custom", json_pack("{s:o}", "ranks", ranks));
    for (int r = 0; r < job->schedule.n_custom_ranks; r++)
      bad |= json_array_append_new(ranks, json_string(job->schedule.custom_ranks[r]));
  } else {
    bad |= pw__fields_emit(v, sched_fields, PW__N(sched_fields), PW__ALL, &st);
  }

  const pw_partition_spec *p = &job->partition;
  bad |= json_object_set_new(o, "partition", v = json_object());
  bad |= pw__fields_emit(v, part_fields, PW__N(part_fields), 1u << p->mode, p);
  bad |= pw__stages_emit(v, p);
  if (p->layer_times) {
    json_t *a = json_array();
    bad |= json_object_set_new(v, "layer_times", a);
    for (int i = 0; i < p->n_layer_times; i++) bad |= json_array_append_new(a, json_real(p->layer_times[i]));
  }
  /* only when set: specs without remat keep their canonical text (and plan hash) */
  if (p->remat_all) bad |= json_object_set_new(v, "remat", json_string("full"));
  if (p->n_remat && !p->remat_all) {
    json_t *a = json_array();
    bad |= json_object_set_new(v, "remat", a);
    for (int i = 0; i < p->n_remat; i++) bad |= json_array_append_new(a, json_boolean(p->remat[i]));
  }

  const pw_optim_spec *op = &job->train.optim;
  bad |= json_object_set_new(o, "train", v = json_object());
  bad |= pw__fields_emit(v, train_fields, PW__N(train_fields), PW__ALL, &job->train);
  if (job->train.n_trainable) /* only when set: other specs keep their canonical text */
    bad |= pw__globs_emit(v, "trainable", job->train.trainable[0], PW_TRAINABLE_LEN, job->train.n_trainable);
  json_t *ov = json_object();
  bad |= json_object_set_new(v, "optimizer", ov);
  bad |= pw__fields_emit(ov, opt_fields, PW__N(opt_fields), 1u << op->kind, op);
  if (op->kind == PW_OPT_ADAMW)
    bad |= json_object_set_new(ov, "betas", json_pack("[ff]", op->beta1, op->beta2));

  bad |= json_object_set_new(o, "data", v = json_object());
  bad |= pw__data_emit(v, &job->data);
  /* only when set: specs without init keep their canonical text (and plan hash) */
  if (job->init.checkpoint[0] || job->init.job) bad |= json_object_set_new(o, "init", pw__init_emit(&job->init));
  if (job->mode == PW_MODE_SERVE) {
    bad |= json_object_set_new(o, "serve", v = json_object());
    bad |= pw__fields_emit(v, serve_fields, PW__N(serve_fields), PW__ALL, &job->serve);
  }
  if (bad) {
    json_decref(o);
    return NULL;
  }
  return o;
}
