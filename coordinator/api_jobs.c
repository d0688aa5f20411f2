/* api_jobs: the job handlers of the REST API — submit, list, status (with
 * every attempt), cancel, retry, metrics (JSON, CSV, JSON lines), events,
 * and the TensorBoard event file. Timelines and checkpoints are in
 * api_timeline.c.
 *
 * A submitted spec is validated completely (parsed, read back as it will
 * be stored, held to the budget's cheap bounds, then planned as a dry run
 * and held to the plan's bounds: plan and slice sizes, each rank's memory
 * against --max-rank-memory and the smallest connected worker) before
 * anything is stored, so a job the planner or the cluster cannot run is
 * refused with the JSON path to change and never reaches the queue. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json_short.h"
#include "spec_json.h"
#include "api.h"
#include "contention.h"
#include "log.h"
#include "plan.h"
#include "sha256.h"
#include "weights.h"

/* rc of a call about job r->id: 0 passes; anything else is replied (an
 * unknown job: 404 at the id) and returned. */
static int job_replied(pw_req *r, int rc, const pw_err *err) {
  if (rc == PW_ENOENT)
    pw_reply_error(r, PW_ENOENT, "id", "no job %lld", (long long)r->id);
  else if (rc)
    pw_reply_err(r, err);
  return rc;
}

/* 0 when job r->id exists; else replies (404) and returns nonzero. */
static int job_exists(pw_req *r, pw_store *s) {
  pw_job_brief b;
  pw_err err = {0};
  int rc = pw_store_job_brief(s, r->id, &b, &err);
  if (!rc) free(b.spec);
  return job_replied(r, rc, &err);
}

/* "gpt d=64 L=4 H=4": the model in a few words, for lists. */
static void describe_model(const pw_model_spec *m, char *buf, size_t cap) {
  switch (m->tmpl) {
    case PW_TEMPLATE_GPT:
    case PW_TEMPLATE_LLAMA:
      snprintf(buf, cap, "%s d=%d L=%d H=%d", m->tmpl == PW_TEMPLATE_GPT ? "gpt" : "llama", m->d_model, m->n_layers,
               m->n_heads);
      break;
    case PW_TEMPLATE_BERT:
      snprintf(buf, cap, "bert %s d=%d L=%d H=%d", m->bert_head == PW_BERT_HEAD_CLASSIFY ? "classify" : "mlm",
               m->d_model, m->n_layers, m->n_heads);
      break;
    case PW_TEMPLATE_MLP:
      snprintf(buf, cap, "mlp in=%d h=%d out=%d L=%d", m->in_dim, m->hidden_dim, m->out_dim, m->n_layers);
      break;
    default: {
      int n = 0;
      for (int i = 0; i < m->n_layer_specs; i++) n += m->layers[i].type != PW_LAYER_STAGE_BOUNDARY;
      snprintf(buf, cap, "layers n=%d", n);
    }
  }
}

/* Idempotency-Key: a client that submits again with the key of an earlier
 * submit (a requeued batch script, a retry after a lost answer) gets that
 * job back, 200 instead of 201, whatever its state; the same key with
 * another body is a conflict. 1 when a reply was given. */
#define KEY_MAX 200
static int key_reply(pw_req *r, pw_store *s, const char *key, const char *sha) {
  int64_t id = 0;
  char had[65];
  pw_err err = {0};
  int rc = pw_store_job_by_key(s, key, &id, had, &err);
  if (rc == PW_ENOENT) return 0;
  if (rc) {
    pw_reply_err(r, &err);
    return 1;
  }
  if (strcmp(had, sha)) {
    pw_reply_error(r, PW_ECONFLICT, "Idempotency-Key",
                   "this key was used for job %lld with another body: a new job needs a new key", (long long)id);
    return 1;
  }
  pw_job_brief jb;
  if (pw_store_job_brief(s, id, &jb, &err)) {
    pw_reply_err(r, &err);
    return 1;
  }
  free(jb.spec);
  char loc[64];
  snprintf(loc, sizeof loc, "/v1/jobs/%lld", (long long)id);
  pw_reply_json(r, MHD_HTTP_OK, json_pack("{s:I, s:s, s:s, s:b}", "id", (json_int_t)id, "state",
                                          pw_job_state_name(jb.state), "location", loc, "existing", 1));
  pw_reply_header(r, MHD_HTTP_HEADER_LOCATION, loc);
  return 1;
}

/* The request's Idempotency-Key, checked, and its body's SHA-256 (of the
 * parsed body, keys sorted: spacing does not count). -1 after a reply. */
static int key_of(pw_req *r, const char **key, char sha[65]) {
  *key = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Idempotency-Key");
  if (!*key) return 0;
  size_t n = strlen(*key);
  int ok = n >= 1 && n <= KEY_MAX;
  for (size_t i = 0; ok && i < n; i++) ok = (*key)[i] > 0x20 && (*key)[i] < 0x7f;
  if (!ok) {
    pw_reply_error(r, PW_EINVAL, "Idempotency-Key", "must be 1 to %d printable ASCII characters without spaces", KEY_MAX);
    return -1;
  }
  char *text = json_dumps(r->body, JSON_COMPACT | JSON_SORT_KEYS);
  if (!text) {
    pw_reply_oom(r);
    return -1;
  }
  pw_sha256_hex(text, strlen(text), sha);
  free(text);
  return 0;
}

void pw_api_job_submit(pw_req *r) {
  pw_store *s = pw_api_store(r);
  if (!s) return;
  const char *key;
  char key_sha[65] = "";
  if (key_of(r, &key, key_sha) || (key && key_reply(r, s, key, key_sha))) return;
  pw_job job;
  pw_budget budget;
  pw_err err = {0};
  pw_cost_profile prof;
  char why[1024] = "";
  int has_prof = 0, is_auto = pw_api_auto_take(r, &prof, &has_prof); /* "auto": chosen below */
  if (is_auto < 0) return;
  int bad = pw_api_job_read(r, NULL, 0, 1, &job, &budget); /* the cheap bounds, before planning */
  if (!bad && is_auto && (bad = pw_api_auto_choose(r, &job, &budget, has_prof ? &prof : NULL, why, sizeof why)))
    pw_job_free(&job);
  if (!bad && is_auto) pw_api_budget(r, &job, 1, &budget); /* the chosen mesh's bounds */
  if (has_prof) pw_cost_free(&prof);
  if (bad) return;
  int data_fd; /* data.path, opened once: what is imported below is what was checked */
  if (pw_api_data_check(r, s, &job, &data_fd)) { /* --data-root; fits data.path */
    pw_job_free(&job);
    return;
  }
  pw_plan p; /* dry run: a job that cannot be planned, or would not fit, is refused now */
  int rc = pw_plan_build(&job, NULL, &p, &err);
  int vocab = 0, n_params = 0;
  pw_w_param *params = NULL; /* names point into params_mem */
  char *params_mem = NULL;
  if (!rc) {
    rc = pw_plan_check_fit(&job, &p, &budget, &err);
    vocab = p.model.data.vocab_size;
    if (!rc && (job.init.checkpoint[0] || job.init.job)) {
      /* the model's parameters, for the init check; LoRA's adapters may be
       * absent (a base model's weights: they keep their initialisation, as
       * the worker loads them, common/compute/ckpt.c) */
      params = calloc((size_t)(p.model.n_params ? p.model.n_params : 1), sizeof *params);
      params_mem = calloc((size_t)(p.model.n_params ? p.model.n_params : 1), PW_PARAM_NAME_MAX);
      if (!params || !params_mem) rc = pw_err_set(&err, PW_ENOMEM, "init", "out of memory");
      for (int i = 0; !rc && i < p.model.n_params; i++) {
        const pw_param *pm = &p.model.params[i];
        if (pw_param_is_adapter(pm)) continue;
        char *nm = params_mem + (size_t)n_params * PW_PARAM_NAME_MAX;
        snprintf(nm, PW_PARAM_NAME_MAX, "%s", pm->name);
        params[n_params++] = (pw_w_param){nm, pm->ndim, {pm->shape[0], pm->shape[1]}};
      }
    }
    pw_plan_free(&p);
  }
  if (rc) {
    pw_reply_err(r, &err);
    pw_job_free(&job);
    free(params);
    free(params_mem);
    if (data_fd >= 0) close(data_fd);
    return;
  }
  if (!rc && pw_api_data_resolve(r, s, &job, data_fd, vocab)) /* a path becomes a dataset, read by id on any host */
    rc = -1;
  if (!rc && job.data.tokenizer[0] && pw_api_tokenizer_check(r, &job)) rc = -1;
  if (data_fd >= 0) close(data_fd);
  /* init: job + step gathered into stored weights; the file holds every parameter with its shape */
  if (!rc && (rc = pw_w_init_resolve(s, r->c->state_dir, &job.init, params, n_params, &err))) pw_reply_err(r, &err);
  free(params);
  free(params_mem);
  if (rc) {
    pw_job_free(&job);
    return;
  }
  json_t *canon = pw_job_to_json(&job);
  char *spec = canon ? pw_json_dumps(canon, JSON_COMPACT) : NULL;
  json_decref(canon);
  char model[96];
  describe_model(&job.model, model, sizeof model);
  pw_job_new jn = {.name = job.name,
                   .spec = spec,
                   .steps = job.train.steps,
                   .pp = job.mesh.pp,
                   .dp = job.mesh.dp,
                   .virtual_stages = job.mesh.virtual_stages,
                   .microbatches = job.schedule.microbatches,
                   .schedule = job.schedule.name,
                   .model = model,
                   .dataset = job.data.dataset[0] ? job.data.dataset : NULL,
                   .tokenizer = job.data.tokenizer[0] ? job.data.tokenizer : NULL,
                   .weights = {job.init.checkpoint, job.init.optimizer_checkpoint},
                   .client_key = key,
                   .client_sha = key_sha};
  int64_t id = 0;
  rc = spec ? pw_store_job_insert(s, &jn, &id, &err) : pw_err_set(&err, PW_ENOMEM, "", "out of memory");
  free(spec);
  if (rc == PW_ECONFLICT && key && key_reply(r, s, key, key_sha)) { /* the same key's other submit was first */
    pw_job_free(&job);
    return;
  }
  if (rc) {
    pw_reply_err(r, &err);
    pw_job_free(&job);
    return;
  }
  pw_info("job %lld queued: %s (%s, %s, pp %d x dp %d x tp %d)", (long long)id, job.name, model, job.schedule.name,
          job.mesh.pp, job.mesh.dp, job.mesh.tp);
  if (is_auto && pw_store_event(s, id, "auto", why, &err)) pw_warn("job %lld: the auto event: %s", (long long)id, err.msg);
  pw_job_free(&job);
  pw_coord_wake(r->c);
  char loc[64];
  snprintf(loc, sizeof loc, "/v1/jobs/%lld", (long long)id);
  pw_reply_json(r, MHD_HTTP_CREATED,
                json_pack("{s:I, s:s, s:s}", "id", (json_int_t)id, "state", "queued", "location", loc));
  pw_reply_header(r, MHD_HTTP_HEADER_LOCATION, loc);
}

void pw_api_job_list(pw_req *r) {
  int64_t limit, offset;
  if (pw_req_int_arg(r, "limit", 50, 1, 500, &limit) || pw_req_int_arg(r, "offset", 0, 0, INT_MAX, &offset)) return;
  int state = -1;
  const char *st = pw_req_arg(r, "state");
  if (st && (state = pw_job_state_parse(st)) < 0) {
    char names[160] = "";
    for (int k = 0; k < PW_JOB__N; k++) {
      size_t n = strlen(names);
      snprintf(names + n, sizeof names - n, "%s%s", k ? ", " : "", pw_job_state_name(k));
    }
    pw_reply_error(r, PW_EINVAL, "state",
                   "unknown state \"%.32s\" (one of %s)", st, names);
    return;
  }
  pw_store *s = pw_api_store(r);
  if (!s) return;
  json_t *out = NULL;
  pw_err err = {0};
  if (pw_store_jobs_json(s, state, (int)limit, (int)offset, &out, &err))
    pw_reply_err(r, &err);
  else
    pw_reply_json(r, MHD_HTTP_OK, out);
}

/* [{"rank", "worker", "coordinate", "stages": [...]}] of the latest run;
 * [] before any. A rank runs the stages of its pipeline rank (spec's mesh). */
static json_t *ranks_json(pw_store *s, int64_t id, const json_t *spec) {
  const json_t *mesh = json_object_get(spec, "mesh");
  int pp = (int)json_integer_value(json_object_get(mesh, "pp")), tp = (int)json_integer_value(json_object_get(mesh, "tp"));
  pp = pp > 0 ? pp : 1, tp = tp > 0 ? tp : 1;
  json_t *run = NULL, *out = json_array();
  if (pw_store_run_json(s, id, &run, NULL)) return out;
  json_t *stages = json_object_get(run, "stages"), *rk;
  size_t i, k;
  json_array_foreach(json_object_get(run, "ranks"), i, rk) {
    json_int_t rank = json_integer_value(json_object_get(rk, "rank"));
    json_t *ss = json_array(), *st;
    json_array_foreach(stages, k, st) {
      if (json_integer_value(json_object_get(st, "rank")) == rank / tp % pp)
        json_array_append(ss, json_object_get(st, "stage"));
    }
    json_t *w = json_object_get(rk, "worker");
    json_array_append_new(out, json_pack("{s:I, s:O, s:o, s:o}", "rank", rank, "worker", w ? w : json_null(), "coordinate",
                                         pw_coord_coordinate_json((int)rank, pp, tp), "stages", ss));
  }
  json_decref(run);
  return out;
}

/* Where the latest run's ranks share a host's cores (contention.h); null
 * when none do, or before any run. */
static json_t *contention_json(pw_coord *c, pw_store *s, int64_t id) {
  pw_contention ct;
  if (pw_contention_of_job(c, s, id, &ct)) return json_null();
  json_t *j = pw_contention_json(&ct);
  pw_contention_free(&ct);
  return j ? j : json_null();
}

/* Seconds left from the mean step time of the last few steps; null when
 * that cannot be known (not running, no steps yet). */
static json_t *eta_json(pw_store *s, int64_t id, json_t *job) {
  const char *state = json_string_value(json_object_get(job, "state"));
  json_t *prog = json_object_get(job, "progress");
  json_int_t step = json_integer_value(json_object_get(prog, "step"));
  json_int_t total = json_integer_value(json_object_get(prog, "total"));
  if (state && !strcmp(state, "succeeded")) return json_real(0);
  if (!state || strcmp(state, "running")) return json_null();
  enum { WINDOW = 20 };
  json_t *m = NULL;
  if (pw_store_metrics_json(s, id, step > WINDOW ? (int)(step - WINDOW) : 0, &m, NULL)) return json_null();
  double sum = 0;
  int n = 0;
  size_t i;
  json_t *row;
  json_array_foreach(json_object_get(m, "metrics"), i, row) {
    double t = json_number_value(json_object_get(row, "step_time"));
    if (t > 0) {
      sum += t;
      n++;
    }
  }
  json_decref(m);
  if (!n) return json_null();
  json_int_t left = total > step ? total - step : 0;
  return json_real(sum / n * (double)left);
}

/* train.max_restarts of the stored spec; a spec stored before the field
 * existed runs with its default, 3 (common/spec/spec.c). */
static json_t *max_restarts_json(json_t *spec) {
  json_t *v = json_object_get(json_object_get(spec, "train"), "max_restarts");
  return json_integer(json_is_integer(v) ? json_integer_value(v) : 3);
}

/* {"every", "note"}: the in-memory snapshots the run takes (every K steps,
 * 0 = none) and, when the spec's setting is not what runs, why. A spec
 * stored before the field existed runs with its default, 1. */
static json_t *snapshots_json(json_t *spec) {
  json_t *t = json_object_get(spec, "train"), *m = json_object_get(spec, "mesh"), *v = json_object_get(t, "snapshot_every");
  json_int_t every = json_is_integer(v) ? json_integer_value(v) : 1, zero = json_integer_value(json_object_get(t, "zero"));
  const char *note = NULL;
  if (json_integer_value(json_object_get(m, "tp")) > 1 && every > 0)
    every = 0, note = "off: a tensor-parallel run (mesh.tp > 1) takes no in-memory snapshots; a lost worker "
                      "resumes from the last checkpoint";
  else if (zero > 0 && json_integer_value(json_object_get(m, "dp")) > 1 && every == 0)
    note = "off: train.zero shards the optimizer state over the mesh.dp replicas, which a snapshot cannot copy; a "
           "lost worker resumes from the last checkpoint";
  return json_pack("{s:I, s:s?}", "every", every, "note", note);
}

void pw_api_job_get(pw_req *r) {
  pw_store *s = pw_api_store(r);
  if (!s) return;
  json_t *j = NULL;
  pw_err err = {0};
  if (job_replied(r, pw_store_job_json(s, r->id, 1, &j, &err), &err)) return;
  json_t *attempts = NULL;
  if (job_replied(r, pw_store_attempts_json(s, r->id, &attempts, &err), &err)) {
    json_decref(j);
    return;
  }
  json_object_set_new(j, "ranks", ranks_json(s, r->id, json_object_get(j, "spec")));
  json_object_set_new(j, "contention", contention_json(r->c, s, r->id));
  json_object_set_new(j, "eta_seconds", eta_json(s, r->id, j));
  json_object_set_new(j, "max_restarts", max_restarts_json(json_object_get(j, "spec")));
  json_object_set_new(j, "snapshots", snapshots_json(json_object_get(j, "spec")));
  json_object_set_new(j, "attempts", attempts);
  pw_reply_json(r, MHD_HTTP_OK, j);
}

/* POST /v1/jobs/{id}/retry: a failed or cancelled job back to the queue;
 * its next run resumes from the newest state the store holds. */
void pw_api_job_retry(pw_req *r) {
  pw_store *s = pw_api_store(r);
  if (!s) return;
  pw_err err = {0};
  if (job_replied(r, pw_store_job_retry(s, r->id, &err), &err)) return;
  pw_info("job %lld retried by request", (long long)r->id);
  pw_coord_wake(r->c);
  char loc[64];
  snprintf(loc, sizeof loc, "/v1/jobs/%lld", (long long)r->id);
  pw_reply_json(r, MHD_HTTP_OK,
                json_pack("{s:I, s:s, s:s}", "id", (json_int_t)r->id, "state", "queued", "location", loc));
}

void pw_api_job_cancel(pw_req *r) {
  int purge;
  if (pw_req_bool_arg(r, "purge", 0, &purge)) return;
  if (purge) { /* a finished job's checkpoint files (api_ckpt.c) */
    pw_api_job_purge(r);
    return;
  }
  pw_err err = {0};
  if (job_replied(r, pw_coord_cancel(r->c, r->id, &err), &err)) return;
  pw_info("job %lld cancelled by request", (long long)r->id);
  pw_reply_json(r, MHD_HTTP_OK, json_pack("{s:I, s:s}", "id", (json_int_t)r->id, "state", "cancelled"));
}

/* The metrics view's rows as CSV (a header of its keys, in order, then a
 * line per row; a null is an empty field) or JSON lines (a row object a
 * line). Every value is written as the JSON reply writes it, so each
 * format reads back to the same numbers. NULL when out of memory. */
static char *metrics_text(const json_t *rows, int csv) {
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  if (!f) return NULL;
  int bad = 0;
  for (int k = 0; csv && k < PW_STORE_METRICS_NKEYS; k++)
    fprintf(f, "%s%s", k ? "," : "", pw_store_metrics_keys[k]);
  if (csv) fputc('\n', f);
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) {
    if (!csv) {
      char *line = pw_json_dumps(row, JSON_COMPACT);
      bad |= !line;
      fprintf(f, "%s\n", line ? line : "");
      free(line);
      continue;
    }
    for (int k = 0; k < PW_STORE_METRICS_NKEYS; k++) {
      json_t *v = json_object_get(row, pw_store_metrics_keys[k]);
      char *cell = v && !json_is_null(v) ? pw_json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
      bad |= v && !json_is_null(v) && !cell;
      fprintf(f, "%s%s", k ? "," : "", cell ? cell : "");
      free(cell);
    }
    fputc('\n', f);
  }
  if (fclose(f) || bad) {
    free(text);
    return NULL;
  }
  return text;
}

/* GET /v1/jobs/{id}/metrics[?since=N][&all=1][&format=json|csv|jsonl]:
 * one row per step, the latest run's; with all=1 every run's row (a
 * resumed run repeats steps); as one JSON object, CSV or JSON lines. */
void pw_api_job_metrics(pw_req *r) {
  int64_t since;
  int all;
  if (pw_req_int_arg(r, "since", 0, 0, INT_MAX, &since) || pw_req_bool_arg(r, "all", 0, &all)) return;
  const char *format = pw_req_arg(r, "format");
  int csv = format && !strcmp(format, "csv"), jsonl = format && !strcmp(format, "jsonl");
  if (format && !csv && !jsonl && strcmp(format, "json")) {
    pw_reply_error(r, PW_EINVAL, "format", "unknown format \"%.32s\" (one of json, csv, jsonl)", format);
    return;
  }
  pw_store *s = pw_api_store(r);
  if (!s || job_exists(r, s)) return;
  json_t *out = NULL;
  pw_err err = {0};
  if ((all ? pw_store_metrics_all_json : pw_store_metrics_json)(s, r->id, (int)since, &out, &err)) {
    pw_reply_err(r, &err);
    return;
  }
  if (!csv && !jsonl) {
    pw_reply_json(r, MHD_HTTP_OK, out);
    return;
  }
  char *text = metrics_text(json_object_get(out, "metrics"), csv), cd[96];
  json_decref(out);
  pw_reply_text(r, MHD_HTTP_OK, csv ? "text/csv; charset=utf-8" : "application/x-ndjson", text);
  snprintf(cd, sizeof cd, "attachment; filename=\"job-%lld-metrics.%s\"", (long long)r->id, csv ? "csv" : "jsonl");
  if (text) pw_reply_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, cd);
}

/* GET /v1/jobs/{id}/events.tfevents: the job's scalars as a TensorBoard
 * event file, built from the store on each request (store.h,
 * pw_store_tfevents): every run's rows, whole records only, whatever
 * happened to the coordinator while the job ran. */
void pw_api_job_tfevents(pw_req *r) {
  pw_store *s = pw_api_store(r);
  if (!s) return;
  pw_tf_buf b = {0};
  double created = 0;
  pw_err err = {0};
  if (job_replied(r, pw_store_tfevents(s, r->id, 0, &b, &created, &err), &err)) {
    pw_tf_buf_free(&b);
    return;
  }
  pw_reply_bytes(r, MHD_HTTP_OK, "application/octet-stream", b.data, b.len); /* takes b.data */
  char cd[128];
  snprintf(cd, sizeof cd, "attachment; filename=\"events.out.tfevents.%lld.pipewright-job%lld\"", (long long)created,
           (long long)r->id);
  pw_reply_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, cd);
}

void pw_api_job_events(pw_req *r) {
  int64_t since;
  if (pw_req_int_arg(r, "since", 0, 0, 999999999999999999LL, &since)) return;
  pw_store *s = pw_api_store(r);
  if (!s || job_exists(r, s)) return;
  json_t *out = NULL;
  pw_err err = {0};
  if (pw_store_events_json(s, r->id, since, &out, &err))
    pw_reply_err(r, &err);
  else
    pw_reply_json(r, MHD_HTTP_OK, out);
}
