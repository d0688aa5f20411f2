/* store_runs: a job's runs and what they record — the plan, partition,
 * schedule and assignments of a run, then its metrics, timings,
 * checkpoints and events. Every write is one statement or one BEGIN
 * IMMEDIATE transaction (store.c's rules). */
#include "store_int.h"

#include <string.h>

/* ---- runs, partition, schedule ------------------------------------------- */

int pw_store_run_insert(pw_store *s, int64_t job_id, const char *plan_json, int64_t *run_id, pw_err *err) {
  FAULT("insert run");
  int rc = pw__store_begin(s, 1, err);
  if (rc) return rc;
  sqlite3_stmt *st;
  int64_t attempt = 1, run = 0;
  if ((rc = pw__store_job_exists(s, job_id, err))) goto fail;
  if (!(st = pw__store_stmt(s, PW_ST_RUN_NEXT_ATTEMPT, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, job_id);
  if ((rc = sqlite3_step(st)) == SQLITE_ROW) attempt = sqlite3_column_int64(st, 0);
  sqlite3_reset(st);
  if (rc != SQLITE_ROW) {
    rc = pw__store_fail(s, rc, err, "run attempt");
    goto fail;
  }
  if (!(st = pw__store_stmt(s, PW_ST_RUN_INSERT, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int64(st, 2, attempt);
  sqlite3_bind_double(st, 3, pw_store_now());
  sqlite3_bind_text(st, 4, plan_json, -1, SQLITE_STATIC);
  if ((rc = pw__store_exec(s, st, err, "insert run"))) goto fail;
  run = sqlite3_last_insert_rowid(s->db);
  if (!(st = pw__store_stmt(s, PW_ST_JOB_SET_RUN, err))) goto fail_stmt;
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int64(st, 2, run);
  if ((rc = pw__store_exec(s, st, err, "job run")) || (rc = pw__store_commit(s, err))) goto fail;
  if (run_id) *run_id = run;
  return 0;
fail_stmt:
  rc = err ? err->code : PW_EIO;
fail:
  pw__store_rollback(s);
  return rc;
}

int pw_store_run_finish(pw_store *s, int64_t run_id, const char *state, const char *error, pw_err *err) {
  FAULT("run");
  if (!state || !*state) return pw_err_set(err, PW_EINVAL, "state", "a finished run needs a state");
  STMT(st, PW_ST_RUN_FINISH);
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_text(st, 2, state, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 3, error, -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 4, pw_store_now());
  return pw__store_update_one(s, st, "run", run_id, err);
}

int pw_store_run_resume(pw_store *s, int64_t run_id, int start_step, const char *from, pw_err *err) {
  FAULT("run start");
  if (!from || (strcmp(from, "snapshot") && strcmp(from, "checkpoint") && strcmp(from, "start")))
    return pw_err_set(err, PW_EINVAL, "resumed_from", "a run resumes from \"snapshot\", \"checkpoint\" or \"start\"");
  if (start_step < 0) return pw_err_set(err, PW_EINVAL, "start_step", "a run starts at step >= 0 (got %d)", start_step);
  STMT(st, PW_ST_RUN_RESUME);
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_int(st, 2, start_step);
  sqlite3_bind_text(st, 3, from, -1, SQLITE_STATIC);
  return pw__store_update_one(s, st, "run", run_id, err);
}

/* A text argument that must hold JSON of the given type (array, object). */
static int check_json(const char *text, json_type type, const char *what, pw_err *err) {
  json_t *v = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
  int ok = v && json_typeof(v) == type;
  json_decref(v);
  return ok ? 0 : pw_err_set(err, PW_EINVAL, what, "%s must be a JSON %s", what, type == JSON_ARRAY ? "array" : "object");
}

int pw_store_stage_insert(pw_store *s, int64_t run_id, int stage, int rank, const char *layers_json, int64_t params,
                          double flops, pw_err *err) {
  FAULT("stage");
  int rc = check_json(layers_json, JSON_ARRAY, "layers", err);
  if (rc) return rc;
  STMT(st, PW_ST_STAGE_INSERT);
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_int(st, 2, stage);
  sqlite3_bind_int(st, 3, rank);
  sqlite3_bind_text(st, 4, layers_json, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 5, params);
  sqlite3_bind_double(st, 6, flops);
  return pw__store_exec(s, st, err, "stage");
}

int pw_store_assignment_insert(pw_store *s, int64_t run_id, int rank, int64_t worker_id, const char *worker_name,
                               pw_err *err) {
  FAULT("assignment");
  STMT(st, PW_ST_ASSIGN_INSERT);
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_int(st, 2, rank);
  sqlite3_bind_int64(st, 3, worker_id);
  sqlite3_bind_text(st, 4, worker_name, -1, SQLITE_STATIC);
  return pw__store_exec(s, st, err, "assignment");
}

int pw_store_actions_insert(pw_store *s, int64_t run_id, int rank, const char *actions, pw_err *err) {
  FAULT("actions");
  if (!actions) return pw_err_set(err, PW_EINVAL, "actions", "no action list");
  STMT(st, PW_ST_ACTIONS_INSERT);
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_int(st, 2, rank);
  sqlite3_bind_text(st, 3, actions, -1, SQLITE_STATIC);
  return pw__store_exec(s, st, err, "actions");
}

/* ---- metrics, timings, checkpoints, events ------------------------------- */

int pw_store_metric_insert(pw_store *s, int64_t job_id, int64_t run_id, const pw_metric *m, pw_err *err) {
  FAULT("metric");
  STMT(st, PW_ST_METRIC_UPSERT);
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int64(st, 2, run_id);
  sqlite3_bind_int(st, 3, m->step);
  sqlite3_bind_double(st, 4, m->loss);
  sqlite3_bind_double(st, 5, m->step_time);
  sqlite3_bind_double(st, 6, m->tokens);
  sqlite3_bind_double(st, 7, m->tokens_per_s);
  sqlite3_bind_double(st, 8, m->grad_norm);
  sqlite3_bind_double(st, 9, m->lr);
  sqlite3_bind_double(st, 10, pw_store_now());
  sqlite3_bind_double(st, 11, m->eval_loss);
  return pw__store_exec(s, st, err, "metric");
}

int pw_store_timing_insert(pw_store *s, int64_t job_id, int64_t run_id, int step, int rank, const char *actions_json,
                           pw_err *err) {
  FAULT("timing");
  int rc = check_json(actions_json, JSON_ARRAY, "actions", err);
  if (rc) return rc;
  STMT(st, PW_ST_TIMING_UPSERT);
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int64(st, 2, run_id);
  sqlite3_bind_int(st, 3, step);
  sqlite3_bind_int(st, 4, rank);
  sqlite3_bind_text(st, 5, actions_json, -1, SQLITE_STATIC);
  return pw__store_exec(s, st, err, "timing");
}

int pw_store_checkpoint_insert(pw_store *s, int64_t job_id, int64_t run_id, int step, int stage, int rank,
                               const char *path, int64_t bytes, pw_err *err) {
  FAULT("checkpoint");
  if (!path || !*path) return pw_err_set(err, PW_EINVAL, "path", "a checkpoint needs a path");
  STMT(st, PW_ST_CKPT_INSERT);
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int64(st, 2, run_id);
  sqlite3_bind_int(st, 3, step);
  sqlite3_bind_int(st, 4, stage);
  sqlite3_bind_int(st, 5, rank);
  sqlite3_bind_text(st, 6, path, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 7, bytes);
  sqlite3_bind_double(st, 8, pw_store_now());
  return pw__store_exec(s, st, err, "checkpoint");
}

int pw_store_event(pw_store *s, int64_t job_id, const char *kind, const char *message, pw_err *err) {
  FAULT("event");
  if (!kind || !*kind) return pw_err_set(err, PW_EINVAL, "kind", "an event needs a kind");
  return pw__store_add_event(s, job_id, pw_store_now(), kind, message, err);
}
