/* store_query: the store's read side — the JSON views the API answers with
 * (job, job list, run, metrics, timeline, checkpoint, events) and the
 * totals for /metrics. Every view is built from cached prepared
 * statements; views that read several statements do so in one read
 * transaction so they see one snapshot. Never writes. */
#include "store_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- columns as JSON ----------------------------------------------------- */

/* jansson refuses invalid UTF-8; the store keeps whatever it was given
 * (worker messages, say), so replace stray bytes rather than drop the
 * field. */
static json_t *text_json(const char *p, size_t n) {
  json_t *v = json_stringn(p, n);
  if (v) return v;
  char *c = malloc(n + 1);
  if (!c) return NULL;
  for (size_t i = 0; i < n; i++) c[i] = (unsigned char)p[i] < 0x80 && p[i] ? p[i] : '?';
  v = json_stringn(c, n);
  free(c);
  return v;
}

json_t *pw__store_col(sqlite3_stmt *st, int i) {
  switch (sqlite3_column_type(st, i)) {
  case SQLITE_INTEGER:
    return json_integer((json_int_t)sqlite3_column_int64(st, i));
  case SQLITE_FLOAT: {
    double d = sqlite3_column_double(st, i);
    return isfinite(d) ? json_real(d) : json_null();
  }
  case SQLITE_TEXT:
  case SQLITE_BLOB: {
    const char *p = (const char *)sqlite3_column_text(st, i);
    return p ? text_json(p, (size_t)sqlite3_column_bytes(st, i)) : json_null();
  }
  default:
    return json_null();
  }
}

json_t *pw__store_col_parsed(sqlite3_stmt *st, int i) {
  if (sqlite3_column_type(st, i) == SQLITE_NULL) return json_null();
  const char *p = (const char *)sqlite3_column_text(st, i);
  json_t *v = p ? json_loadb(p, (size_t)sqlite3_column_bytes(st, i), JSON_DECODE_ANY, NULL) : NULL;
  return v ? v : pw__store_col(st, i);
}

#define COL(o, key, st, i) json_object_set_new((o), (key), pw__store_col((st), (i)))

/* A read that spans statements: one snapshot. */
static int read_begin(pw_store *s, pw_err *err) { return pw__store_begin(s, 0, err); }
static void read_end(pw_store *s) { pw__store_rollback(s); }

/* ---- jobs ---------------------------------------------------------------- */

/* A row of PW__JOB_COLS + spec as the API's job object. */
static json_t *job_row(sqlite3_stmt *st, int with_spec) {
  json_t *o = json_object(), *mesh = json_object(), *prog = json_object();
  if (!o || !mesh || !prog) {
    json_decref(o);
    json_decref(mesh);
    json_decref(prog);
    return NULL;
  }
  COL(o, "id", st, 0);
  COL(o, "name", st, 1);
  COL(o, "state", st, 2);
  COL(o, "status", st, 3);
  COL(o, "error", st, 4);
  COL(o, "model", st, 5);
  COL(o, "schedule", st, 6);
  COL(mesh, "pp", st, 7);
  COL(mesh, "dp", st, 8);
  COL(mesh, "virtual_stages", st, 9);
  COL(mesh, "tp", st, 21);
  json_object_set_new(o, "mesh", mesh);
  COL(o, "microbatches", st, 10);
  COL(prog, "step", st, 11);
  COL(prog, "total", st, 12);
  json_object_set_new(o, "progress", prog);
  COL(o, "loss", st, 13);
  COL(o, "tokens_per_s", st, 14);
  COL(o, "created", st, 15);
  COL(o, "started", st, 16);
  COL(o, "finished", st, 17);
  COL(o, "run", st, 18);
  COL(o, "restarts", st, 19);
  COL(o, "eval_loss", st, 20);
  if (with_spec) json_object_set_new(o, "spec", pw__store_col_parsed(st, 22));
  return o;
}

int pw_store_job_json(pw_store *s, int64_t id, int with_spec, json_t **out, pw_err *err) {
  *out = NULL;
  STMT(st, PW_ST_JOB_GET);
  sqlite3_bind_int64(st, 1, id);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) {
    if (!(*out = job_row(st, with_spec))) ret = pw_err_set(err, PW_ENOMEM, "job", "out of memory");
  } else if (rc == SQLITE_DONE) {
    ret = pw_err_set(err, PW_ENOENT, "job", "job %lld not found", (long long)id);
  } else {
    ret = pw__store_fail(s, rc, err, "job");
  }
  sqlite3_reset(st);
  return ret;
}

int pw_store_jobs_json(pw_store *s, int state, int limit, int offset, json_t **out, pw_err *err) {
  *out = NULL;
  if (state < -1 || state >= PW_JOB__N) return pw_err_set(err, PW_EINVAL, "state", "unknown job state %d", state);
  if (limit < 0) return pw_err_set(err, PW_EINVAL, "limit", "limit must be >= 0");
  if (offset < 0) return pw_err_set(err, PW_EINVAL, "offset", "offset must be >= 0");
  int rc = read_begin(s, err);
  if (rc) return rc;
  json_t *jobs = json_array(), *o = NULL;
  int64_t total = 0;
  sqlite3_stmt *st = pw__store_stmt(s, state < 0 ? PW_ST_JOBS_COUNT_ALL : PW_ST_JOBS_COUNT_STATE, err);
  if (!st) goto fail_stmt;
  if (state >= 0) sqlite3_bind_text(st, 3, pw_job_state_name(state), -1, SQLITE_STATIC);
  if ((rc = sqlite3_step(st)) == SQLITE_ROW) total = sqlite3_column_int64(st, 0);
  sqlite3_reset(st);
  if (rc != SQLITE_ROW) goto fail_sql;
  if (!(st = pw__store_stmt(s, state < 0 ? PW_ST_JOBS_PAGE_ALL : PW_ST_JOBS_PAGE_STATE, err))) goto fail_stmt;
  sqlite3_bind_int(st, 1, limit);
  sqlite3_bind_int(st, 2, offset);
  if (state >= 0) sqlite3_bind_text(st, 3, pw_job_state_name(state), -1, SQLITE_STATIC);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) json_array_append_new(jobs, job_row(st, 0));
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) goto fail_sql;
  read_end(s);
  o = json_pack("{s:o, s:I, s:i, s:i}", "jobs", jobs, "total", (json_int_t)total, "limit", limit, "offset", offset);
  if (!o) return pw_err_set(err, PW_ENOMEM, "jobs", "out of memory");
  *out = o;
  return 0;
fail_sql:
  rc = pw__store_fail(s, rc, err, "jobs");
  goto fail;
fail_stmt:
  rc = err ? err->code : PW_EIO;
fail:
  read_end(s);
  json_decref(jobs);
  return rc;
}

/* ---- runs ---------------------------------------------------------------- */

int pw_store_run_json(pw_store *s, int64_t job_id, json_t **out, pw_err *err) {
  *out = NULL;
  int rc = read_begin(s, err);
  if (rc) return rc;
  json_t *o = NULL, *stages = NULL, *ranks = NULL;
  int64_t run = 0;
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_RUN_OF_JOB, err);
  if (!st) goto fail_stmt;
  sqlite3_bind_int64(st, 1, job_id);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW && (run = sqlite3_column_int64(st, 0)) > 0 && sqlite3_column_type(st, 1) != SQLITE_NULL) {
    o = json_object();
    json_object_set_new(o, "run", json_integer((json_int_t)run));
    COL(o, "attempt", st, 1);
    COL(o, "state", st, 2);
  }
  sqlite3_reset(st);
  if (rc == SQLITE_DONE) {
    rc = pw_err_set(err, PW_ENOENT, "job", "job %lld not found", (long long)job_id);
    goto fail;
  }
  if (rc != SQLITE_ROW) goto fail_sql;
  if (!o) {
    rc = pw_err_set(err, PW_ENOENT, "run", "job %lld has no run yet", (long long)job_id);
    goto fail;
  }
  stages = json_array();
  if (!(st = pw__store_stmt(s, PW_ST_RUN_STAGES, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, run);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *g = json_object();
    COL(g, "stage", st, 0);
    COL(g, "rank", st, 1);
    json_object_set_new(g, "layers", pw__store_col_parsed(st, 2));
    COL(g, "params", st, 3);
    COL(g, "flops", st, 4);
    json_array_append_new(stages, g);
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) goto fail_sql;
  ranks = json_array();
  if (!(st = pw__store_stmt(s, PW_ST_RUN_RANKS, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, run);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *r = json_object();
    COL(r, "rank", st, 0);
    COL(r, "worker", st, 1);
    COL(r, "actions", st, 2);
    json_array_append_new(ranks, r);
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) goto fail_sql;
  read_end(s);
  json_object_set_new(o, "stages", stages);
  json_object_set_new(o, "ranks", ranks);
  *out = o;
  return 0;
fail_sql:
  rc = pw__store_fail(s, rc, err, "run");
  goto fail;
fail_stmt:
  rc = err ? err->code : PW_EIO;
fail:
  read_end(s);
  json_decref(o);
  json_decref(stages);
  json_decref(ranks);
  return rc;
}

/* ---- restarts and attempts (issue 15) ------------------------------------ */

int pw_store_job_restarts(pw_store *s, int64_t job, int *restarts, pw_err *err) {
  *restarts = 0;
  STMT(st, PW_ST_JOB_RESTARTS);
  sqlite3_bind_int64(st, 1, job);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW)
    *restarts = sqlite3_column_int(st, 0);
  else if (rc == SQLITE_DONE)
    ret = pw_err_set(err, PW_ENOENT, "job", "job %lld not found", (long long)job);
  else
    ret = pw__store_fail(s, rc, err, "job restarts");
  sqlite3_reset(st);
  return ret;
}

/* The attempt object of run `run` in arr (runs are few: a scan). */
static json_t *attempt_of(json_t *arr, json_int_t run) {
  size_t i;
  json_t *a;
  json_array_foreach(arr, i, a) {
    if (json_integer_value(json_object_get(a, "run")) == run) return a;
  }
  return NULL;
}

int pw_store_attempts_json(pw_store *s, int64_t job, json_t **out, pw_err *err) {
  static const char *const keys[] = {"attempt", "run", "state", "started", "finished", "reason", "start_step",
                                     "resumed_from"};
  *out = NULL;
  int rc = read_begin(s, err);
  if (rc) return rc;
  json_t *arr = json_array();
  sqlite3_stmt *st;
  if ((rc = pw__store_job_exists(s, job, err))) goto fail;
  if (!(st = pw__store_stmt(s, PW_ST_ATTEMPTS, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, job);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *a = json_object();
    for (int i = 0; i < 8; i++) COL(a, keys[i], st, i);
    json_object_set_new(a, "workers", json_array());
    json_array_append_new(arr, a);
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) goto fail_sql;
  if (!(st = pw__store_stmt(s, PW_ST_ATTEMPT_WORKERS, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, job);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) { /* by run, then rank */
    json_t *a = attempt_of(arr, (json_int_t)sqlite3_column_int64(st, 0));
    if (a) json_array_append_new(json_object_get(a, "workers"), pw__store_col(st, 1));
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) goto fail_sql;
  read_end(s);
  *out = arr;
  return 0;
fail_sql:
  rc = pw__store_fail(s, rc, err, "attempts");
  goto fail;
fail_stmt:
  rc = err ? err->code : PW_EIO;
fail:
  read_end(s);
  json_decref(arr);
  return rc;
}

/* ---- metrics, timings, checkpoints, events ------------------------------- */

int pw_store_run_plan_json(pw_store *s, int64_t job_id, json_t **out, pw_err *err) {
  *out = NULL;
  STMT(st, PW_ST_RUN_PLAN);
  sqlite3_bind_int64(st, 1, job_id);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *out = pw__store_col_parsed(st, 0);
  sqlite3_reset(st);
  if (rc == SQLITE_ROW && json_is_object(*out)) return 0;
  json_decref(*out);
  *out = NULL;
  if (rc == SQLITE_ROW || rc == SQLITE_DONE)
    return pw_err_set(err, PW_ENOENT, "run", "job %lld has no recorded plan", (long long)job_id);
  return pw_err_set(err, PW_EIO, "run", "reading the plan: %s", sqlite3_errstr(rc));
}

int pw_store_run_planned_step(pw_store *s, int64_t job_id, double *seconds, int *measured, pw_err *err) {
  *seconds = 0;
  *measured = 0;
  STMT(st, PW_ST_RUN_PLANNED_STEP);
  sqlite3_bind_int64(st, 1, job_id);
  int rc = sqlite3_step(st), have = 0;
  if (rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
    have = 1;
    *seconds = sqlite3_column_double(st, 0);
    *measured = sqlite3_column_int(st, 1);
  }
  sqlite3_reset(st);
  if (have) return 0;
  if (rc == SQLITE_ROW || rc == SQLITE_DONE)
    return pw_err_set(err, PW_ENOENT, "run", "job %lld has no planned step", (long long)job_id);
  return pw__store_fail(s, rc, err, "planned step");
}

/* In the order of PW_ST_METRICS_SINCE's columns. */
const char *const pw_store_metrics_keys[PW_STORE_METRICS_NKEYS] = {
    "step", "loss", "step_time", "tokens", "tokens_per_s", "grad_norm", "lr", "time", "run", "eval_loss"};

static int metrics_json(pw_store *s, int64_t job_id, int since, int all, json_t **out, pw_err *err) {
  const char *const *keys = pw_store_metrics_keys;
  *out = NULL;
  STMT(st, all ? PW_ST_METRICS_SINCE_ALL : PW_ST_METRICS_SINCE);
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int(st, 2, since);
  json_t *arr = json_array();
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *m = json_object();
    for (int i = 0; i < PW_STORE_METRICS_NKEYS; i++) COL(m, keys[i], st, i);
    json_array_append_new(arr, m);
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) rc = pw__store_fail(s, rc, err, "metrics");
  else if (json_array_size(arr) == 0) rc = pw__store_job_exists(s, job_id, err);
  else rc = 0;
  if (rc) {
    json_decref(arr);
    return rc;
  }
  *out = json_pack("{s:o}", "metrics", arr);
  return *out ? 0 : pw_err_set(err, PW_ENOMEM, "metrics", "out of memory");
}

int pw_store_metrics_json(pw_store *s, int64_t job_id, int since, json_t **out, pw_err *err) {
  return metrics_json(s, job_id, since, 0, out, err);
}

int pw_store_metrics_all_json(pw_store *s, int64_t job_id, int since, json_t **out, pw_err *err) {
  return metrics_json(s, job_id, since, 1, out, err);
}

/* [[kind, mb, stage, start, end], ...] as [{"kind","mb","stage","start","end"}]. */
static json_t *timing_actions(sqlite3_stmt *st, int i) {
  static const char *const keys[] = {"kind", "mb", "stage", "start", "end"};
  json_t *raw = pw__store_col_parsed(st, i), *out = json_array();
  size_t k;
  json_t *a;
  json_array_foreach(raw, k, a) {
    if (!json_is_array(a)) continue;
    json_t *o = json_object();
    for (size_t j = 0; j < 5 && j < json_array_size(a); j++) json_object_set(o, keys[j], json_array_get(a, j));
    json_array_append_new(out, o);
  }
  json_decref(raw);
  return out;
}

int pw_store_timeline_json(pw_store *s, int64_t job_id, int step, json_t **out, pw_err *err) {
  *out = NULL;
  int rc = read_begin(s, err);
  if (rc) return rc;
  json_t *steps = NULL, *ranks = NULL;
  sqlite3_stmt *st;
  if ((rc = pw__store_job_exists(s, job_id, err))) goto fail;
  if (step < 0) {
    if (!(st = pw__store_stmt(s, PW_ST_TIMING_LATEST, err))) goto fail_stmt;
    sqlite3_bind_int64(st, 1, job_id);
    int has = 0;
    if ((rc = sqlite3_step(st)) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
      step = sqlite3_column_int(st, 0);
      has = 1;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) goto fail_sql;
    if (!has) {
      rc = pw_err_set(err, PW_ENOENT, "step", "job %lld has no sampled timings yet", (long long)job_id);
      goto fail;
    }
  }
  ranks = json_array();
  if (!(st = pw__store_stmt(s, PW_ST_TIMING_AT, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int(st, 2, step);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *r = json_object();
    COL(r, "rank", st, 0);
    json_object_set_new(r, "actions", timing_actions(st, 1));
    json_array_append_new(ranks, r);
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) goto fail_sql;
  if (json_array_size(ranks) == 0) {
    rc = pw_err_set(err, PW_ENOENT, "step", "job %lld has no timings sampled at step %d", (long long)job_id, step);
    goto fail;
  }
  steps = json_array();
  if (!(st = pw__store_stmt(s, PW_ST_TIMING_STEPS, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, job_id);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) json_array_append_new(steps, pw__store_col(st, 0));
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) goto fail_sql;
  read_end(s);
  *out = json_pack("{s:i, s:o, s:o}", "step", step, "ranks", ranks, "steps", steps);
  return *out ? 0 : pw_err_set(err, PW_ENOMEM, "timeline", "out of memory");
fail_sql:
  rc = pw__store_fail(s, rc, err, "timeline");
  goto fail;
fail_stmt:
  rc = err ? err->code : PW_EIO;
fail:
  read_end(s);
  json_decref(steps);
  json_decref(ranks);
  return rc;
}

int pw_store_checkpoint_latest_json(pw_store *s, int64_t job_id, int n_stages, json_t **out, pw_err *err) {
  *out = NULL;
  if (n_stages <= 0) return pw_err_set(err, PW_EINVAL, "n_stages", "n_stages must be > 0");
  int rc = read_begin(s, err);
  if (rc) return rc;
  json_t *stages = NULL;
  int step = 0, has = 0;
  int64_t run = 0;
  sqlite3_stmt *st;
  if ((rc = pw__store_job_exists(s, job_id, err))) goto fail;
  if (!(st = pw__store_stmt(s, PW_ST_CKPT_LATEST_STEP, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int(st, 2, n_stages);
  if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    run = sqlite3_column_int64(st, 0);
    step = sqlite3_column_int(st, 1);
    has = 1;
  }
  sqlite3_reset(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) goto fail_sql;
  if (!has) {
    rc = pw_err_set(err, PW_ENOENT, "checkpoint", "job %lld has no complete checkpoint (stages 0..%d) yet",
                    (long long)job_id, n_stages - 1);
    goto fail;
  }
  stages = json_array();
  if (!(st = pw__store_stmt(s, PW_ST_CKPT_AT, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int64(st, 2, run);
  sqlite3_bind_int(st, 3, step);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *g = json_object();
    COL(g, "stage", st, 0);
    COL(g, "rank", st, 1);
    COL(g, "path", st, 2);
    COL(g, "bytes", st, 3);
    json_array_append_new(stages, g);
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) goto fail_sql;
  read_end(s);
  *out = json_pack("{s:i, s:o}", "step", step, "stages", stages);
  return *out ? 0 : pw_err_set(err, PW_ENOMEM, "checkpoint", "out of memory");
fail_sql:
  rc = pw__store_fail(s, rc, err, "checkpoint");
  goto fail;
fail_stmt:
  rc = err ? err->code : PW_EIO;
fail:
  read_end(s);
  json_decref(stages);
  return rc;
}

int pw_store_events_json(pw_store *s, int64_t job_id, int64_t since, json_t **out, pw_err *err) {
  *out = NULL;
  STMT(st, PW_ST_EVENTS_SINCE);
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int64(st, 2, since);
  json_t *arr = json_array();
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *e = json_object();
    COL(e, "id", st, 0);
    COL(e, "time", st, 1);
    COL(e, "kind", st, 2);
    COL(e, "message", st, 3);
    json_array_append_new(arr, e);
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) rc = pw__store_fail(s, rc, err, "events");
  else if (json_array_size(arr) == 0) rc = pw__store_job_exists(s, job_id, err);
  else rc = 0;
  if (rc) {
    json_decref(arr);
    return rc;
  }
  *out = json_pack("{s:o}", "events", arr);
  return *out ? 0 : pw_err_set(err, PW_ENOMEM, "events", "out of memory");
}

/* ---- totals -------------------------------------------------------------- */

int pw_store_totals(pw_store *s, int64_t counts[PW_JOB__N], int64_t *steps, double *tokens, pw_err *err) {
  for (int i = 0; i < PW_JOB__N; i++) counts[i] = 0;
  *steps = 0;
  *tokens = 0;
  int rc = read_begin(s, err);
  if (rc) return rc;
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_TOTALS_STATES, err);
  if (!st) goto fail_stmt;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    int k = pw_job_state_parse((const char *)sqlite3_column_text(st, 0));
    if (k >= 0) counts[k] += sqlite3_column_int64(st, 1);
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) goto fail_sql;
  if (!(st = pw__store_stmt(s, PW_ST_TOTALS_METRICS, err))) goto fail_stmt;
  if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    *steps = sqlite3_column_int64(st, 0);
    *tokens = sqlite3_column_double(st, 1);
  }
  sqlite3_reset(st);
  if (rc != SQLITE_ROW) goto fail_sql;
  read_end(s);
  return 0;
fail_sql:
  rc = pw__store_fail(s, rc, err, "totals");
  goto fail;
fail_stmt:
  rc = err ? err->code : PW_EIO;
fail:
  read_end(s);
  return rc;
}
