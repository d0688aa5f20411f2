/* store: the coordinator's SQLite store — opening a connection (pragmas,
 * versioned migrations), the statement cache, and the writes of workers
 * and of jobs with their state machine. The JSON views live in
 * store_query.c.
 *
 * Each write that belongs together is one BEGIN IMMEDIATE transaction, so
 * a kill -9 leaves either all of it or none. Runs and what they record
 * are store_runs.c's. This file must never hold a
 * transaction open across a return: every error path rolls back. */
#include "store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

/* ---- schema -------------------------------------------------------------- */

/* migrations[k] takes the schema from version k to k + 1. Append only:
 * never edit a migration that has shipped. */
static const char *const migrations[] = {
    /* 0 -> 1: everything */
    "CREATE TABLE workers("
    "  id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, addr TEXT, cores INTEGER,"
    "  threads INTEGER, software TEXT, state TEXT, first_seen REAL, last_seen REAL);"
    "CREATE TABLE jobs("
    "  id INTEGER PRIMARY KEY, name TEXT, spec TEXT NOT NULL, state TEXT NOT NULL, status TEXT,"
    "  error TEXT, created REAL, started REAL, finished REAL, steps INTEGER,"
    "  steps_done INTEGER DEFAULT 0, loss REAL, tokens_per_s REAL, pp INTEGER, dp INTEGER,"
    "  vstages INTEGER, microbatches INTEGER, schedule TEXT, model TEXT, run INTEGER DEFAULT 0);"
    "CREATE INDEX jobs_state ON jobs(state);"
    "CREATE TABLE runs("
    "  id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL REFERENCES jobs(id), attempt INTEGER,"
    "  state TEXT, started REAL, finished REAL, error TEXT, plan TEXT);"
    "CREATE INDEX runs_job ON runs(job_id);"
    "CREATE TABLE stages("
    "  run_id INTEGER NOT NULL REFERENCES runs(id), stage INTEGER NOT NULL, rank INTEGER,"
    "  layers TEXT, params INTEGER, flops REAL, PRIMARY KEY(run_id, stage));"
    "CREATE TABLE assignments("
    "  run_id INTEGER NOT NULL REFERENCES runs(id), rank INTEGER NOT NULL, worker_id INTEGER,"
    "  worker_name TEXT, PRIMARY KEY(run_id, rank));"
    "CREATE TABLE actions("
    "  run_id INTEGER NOT NULL REFERENCES runs(id), rank INTEGER NOT NULL, actions TEXT,"
    "  PRIMARY KEY(run_id, rank));"
    "CREATE TABLE metrics("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), run_id INTEGER REFERENCES runs(id),"
    "  step INTEGER NOT NULL, loss REAL, step_time REAL, tokens REAL, tokens_per_s REAL,"
    "  grad_norm REAL, lr REAL, time REAL, PRIMARY KEY(job_id, step));"
    "CREATE TABLE timings("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), run_id INTEGER REFERENCES runs(id),"
    "  step INTEGER NOT NULL, rank INTEGER NOT NULL, actions TEXT,"
    "  PRIMARY KEY(job_id, step, rank));"
    "CREATE TABLE checkpoints("
    "  id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  run_id INTEGER REFERENCES runs(id), step INTEGER, stage INTEGER, rank INTEGER, path TEXT,"
    "  bytes INTEGER, time REAL);"
    "CREATE INDEX checkpoints_job ON checkpoints(job_id, run_id, step);"
    "CREATE TABLE events("
    "  id INTEGER PRIMARY KEY, job_id INTEGER REFERENCES jobs(id), time REAL, kind TEXT,"
    "  message TEXT);"
    "CREATE INDEX events_job ON events(job_id, id);",
    /* 1 -> 2: metrics keep one row per attempt (run) of a step: a resumed
     * run repeating steps no longer overwrites its predecessor's rows. */
    "CREATE TABLE metrics_v2("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), run_id INTEGER REFERENCES runs(id),"
    "  step INTEGER NOT NULL, loss REAL, step_time REAL, tokens REAL, tokens_per_s REAL,"
    "  grad_norm REAL, lr REAL, time REAL, PRIMARY KEY(job_id, run_id, step));"
    "INSERT INTO metrics_v2 SELECT job_id, run_id, step, loss, step_time, tokens, tokens_per_s,"
    "  grad_norm, lr, time FROM metrics;"
    "DROP TABLE metrics;"
    "ALTER TABLE metrics_v2 RENAME TO metrics;"
    "CREATE INDEX metrics_step ON metrics(job_id, step, run_id);",
    /* 2 -> 3: datasets (content-addressed files, datasets.h) and which
     * job uses which, so a dataset a live job needs is never deleted. The
     * link keeps no foreign key to datasets: a finished job's history
     * names a dataset deleted since. */
    "CREATE TABLE datasets("
    "  id TEXT PRIMARY KEY, size INTEGER NOT NULL, format TEXT NOT NULL, name TEXT,"
    "  created REAL NOT NULL, vocab_size INTEGER, width INTEGER, n_tokens INTEGER);"
    "CREATE TABLE job_datasets("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), dataset_id TEXT NOT NULL,"
    "  PRIMARY KEY(job_id, dataset_id));"
    "CREATE INDEX job_datasets_ds ON job_datasets(dataset_id, job_id);",
    /* ---- 3 -> 4, part h-ckpt: checkpoints in the coordinator's store
     * (checkpoints.h, store_ckpt.c). A shard is one stage's model or
     * optimizer file of one step (its file: the path checkpoints.h
     * derives); a step is complete once every stage's two shards are
     * in, and only then listed in ckpt_steps. One row per step, not per
     * run: a resumed run that repeats a step writes the same bytes. ---- */
    "CREATE TABLE ckpt_shards("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), step INTEGER NOT NULL, stage INTEGER NOT NULL,"
    "  kind TEXT NOT NULL, run_id INTEGER, bytes INTEGER NOT NULL, checksum TEXT, time REAL NOT NULL,"
    "  PRIMARY KEY(job_id, step, stage, kind));"
    "CREATE TABLE ckpt_steps("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), step INTEGER NOT NULL, n_stages INTEGER NOT NULL,"
    "  run_id INTEGER, bytes INTEGER NOT NULL, time REAL NOT NULL, PRIMARY KEY(job_id, step));"
    /* ---- end of part h-ckpt; the same migration goes on: ---- */
    /* 3 -> 4 (h-init): stored weights (content-addressed safetensors files
     * a job's parameters start from, weights.h) and which job uses which,
     * so weights a live job needs are never deleted. As for datasets, the
     * link has no foreign key to weights. */
    "CREATE TABLE weights("
    "  id TEXT PRIMARY KEY, size INTEGER NOT NULL, kind TEXT NOT NULL, name TEXT, source TEXT,"
    "  created REAL NOT NULL, n_tensors INTEGER NOT NULL, params INTEGER NOT NULL);"
    "CREATE TABLE job_weights("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), weights_id TEXT NOT NULL,"
    "  PRIMARY KEY(job_id, weights_id));"
    "CREATE INDEX job_weights_w ON job_weights(weights_id, job_id);",
    /* 4 -> 5 (issue 15, surviving lost workers): how many times the job
     * went back to the queue after losing a worker, and where each run
     * started (its step, and from what: "snapshot", "checkpoint" or
     * "start"), so every attempt can be shown. */
    "ALTER TABLE jobs ADD COLUMN restarts INTEGER DEFAULT 0;"
    "ALTER TABLE runs ADD COLUMN start_step INTEGER;"
    "ALTER TABLE runs ADD COLUMN resumed_from TEXT;",
    /* 5 -> 6 (train.eval_every): the held-out loss of the steps that
     * evaluated (NULL elsewhere), and the job's latest. */
    "ALTER TABLE metrics ADD COLUMN eval_loss REAL; ALTER TABLE jobs ADD COLUMN eval_loss REAL;",
    /* 6 -> 7 (issue 35): an idempotent submit — the client's Idempotency-Key
     * and the SHA-256 of the body it came with, one job per key; a drain —
     * the step a run was told to stop at (its checkpoint is taken there). */
    "ALTER TABLE jobs ADD COLUMN client_key TEXT; ALTER TABLE jobs ADD COLUMN client_sha TEXT;"
    "CREATE UNIQUE INDEX jobs_client_key ON jobs(client_key) WHERE client_key IS NOT NULL;"
    "ALTER TABLE runs ADD COLUMN stop_step INTEGER;",
};
#define N_MIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

static const char *const stmt_sql[PW_ST__N] = {
#define PW__ST_SQL(name, sql) sql,
    PW_STORE_STMTS(PW__ST_SQL)
#undef PW__ST_SQL
};

/* ---- job states ---------------------------------------------------------- */

static const char *const state_names[PW_JOB__N] = {"queued",    "planning", "dispatching", "running",
                                                   "succeeded", "failed",   "cancelled"};

const char *pw_job_state_name(int state) {
  return state >= 0 && state < PW_JOB__N ? state_names[state] : "unknown";
}

int pw_job_state_parse(const char *s) {
  for (int i = 0; s && i < PW_JOB__N; i++)
    if (!strcmp(s, state_names[i])) return i;
  return -1;
}

int pw_job_state_terminal(int state) {
  return state == PW_JOB_SUCCEEDED || state == PW_JOB_FAILED || state == PW_JOB_CANCELLED;
}

/* The lifecycle, one step forward at a time; any live state may fail or
 * be cancelled; planning/dispatching/running may go back to queued (a
 * retry, or recovery after a crash). Terminal states are final. */
static int transition_allowed(int from, int to) {
  if (pw_job_state_terminal(from)) return 0;
  if (to == PW_JOB_CANCELLED || to == PW_JOB_FAILED) return 1;
  if (to == from + 1) return 1; /* queued -> planning -> dispatching -> running -> succeeded */
  return to == PW_JOB_QUEUED && from >= PW_JOB_PLANNING && from <= PW_JOB_RUNNING;
}

double pw_store_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- helpers shared with store_query.c ----------------------------------- */

int pw__store_fail(pw_store *s, int rc, pw_err *err, const char *what) {
  const char *msg = s && s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc);
  const char *path = s ? s->path : "";
  switch (rc) {
  case SQLITE_CONSTRAINT_FOREIGNKEY:
    return pw_err_set(err, PW_ENOENT, path, "%s: a referenced job or run does not exist", what);
  case SQLITE_CONSTRAINT_PRIMARYKEY:
  case SQLITE_CONSTRAINT_UNIQUE:
    return pw_err_set(err, PW_ECONFLICT, path, "%s: already recorded (%s)", what, msg);
  case SQLITE_NOTADB:
    return pw_err_set(err, PW_EFORMAT, path, "%s: not a SQLite database (%s)", what, msg);
  case SQLITE_NOMEM:
    return pw_err_set(err, PW_ENOMEM, path, "%s: %s", what, msg);
  default:
    return pw_err_set(err, PW_EIO, path, "%s: %s (sqlite %d)", what, msg, rc);
  }
}

sqlite3_stmt *pw__store_stmt(pw_store *s, int id, pw_err *err) {
  sqlite3_stmt *st = s->st[id];
  if (!st) {
    int rc = sqlite3_prepare_v3(s->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT, &s->st[id], NULL);
    if (rc != SQLITE_OK) {
      pw__store_fail(s, rc, err, "prepare");
      return NULL;
    }
    return s->st[id];
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return st;
}

int pw__store_exec(pw_store *s, sqlite3_stmt *st, pw_err *err, const char *what) {
  int rc = sqlite3_step(st);
  int ret = rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : pw__store_fail(s, rc, err, what);
  sqlite3_reset(st);
  return ret;
}

int pw__store_begin(pw_store *s, int write, pw_err *err) {
  if (!sqlite3_get_autocommit(s->db)) pw__store_rollback(s); /* never nest into a stray one */
  sqlite3_stmt *st = pw__store_stmt(s, write ? PW_ST_BEGIN_W : PW_ST_BEGIN_R, err);
  return st ? pw__store_exec(s, st, err, "begin") : (err ? err->code : PW_EIO);
}

int pw__store_commit(pw_store *s, pw_err *err) {
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_COMMIT, err);
  int rc = st ? pw__store_exec(s, st, err, "commit") : (err ? err->code : PW_EIO);
  if (rc) pw__store_rollback(s);
  return rc;
}

void pw__store_rollback(pw_store *s) {
  if (sqlite3_get_autocommit(s->db)) return;
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_ROLLBACK, NULL);
  if (st) pw__store_exec(s, st, NULL, "rollback");
}

int pw__store_job_exists(pw_store *s, int64_t id, pw_err *err) {
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_JOB_EXISTS, err);
  if (!st) return err ? err->code : PW_EIO;
  sqlite3_bind_int64(st, 1, id);
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  if (rc == SQLITE_ROW) return 0;
  if (rc == SQLITE_DONE) return pw_err_set(err, PW_ENOENT, "job", "job %lld not found", (long long)id);
  return pw__store_fail(s, rc, err, "job lookup");
}

/* ---- open / close -------------------------------------------------------- */

/* A one-row, one-column pragma or query as an integer or text. */
static int query_int(pw_store *s, const char *sql, int64_t *out, pw_err *err) {
  sqlite3_stmt *st;
  int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
  if (rc != SQLITE_OK) return pw__store_fail(s, rc, err, sql);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *out = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return rc == SQLITE_ROW ? 0 : pw__store_fail(s, rc, err, sql);
}

static int query_text(pw_store *s, const char *sql, char *out, size_t cap, pw_err *err) {
  sqlite3_stmt *st;
  int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
  if (rc != SQLITE_OK) return pw__store_fail(s, rc, err, sql);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) snprintf(out, cap, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  return rc == SQLITE_ROW ? 0 : pw__store_fail(s, rc, err, sql);
}

static int exec_sql(pw_store *s, const char *sql, pw_err *err) {
  int rc = sqlite3_exec(s->db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? 0 : pw__store_fail(s, rc, err, "schema");
}

static int refuse_newer(pw_store *s, int64_t v, pw_err *err) {
  return pw_err_set(err, PW_ENOTSUP, s->path,
                    "database schema version %lld is newer than this coordinator supports (%d): "
                    "upgrade pipewright",
                    (long long)v, N_MIGRATIONS);
}

/* Applies the missing migrations in one transaction. The version is read
 * again under the write lock, as another connection may have migrated the
 * file meanwhile. */
static int migrate(pw_store *s, pw_err *err) {
  int64_t v = 0;
  int rc = query_int(s, "PRAGMA user_version", &v, err);
  if (rc) return rc;
  if (v > N_MIGRATIONS) return refuse_newer(s, v, err);
  if (v == N_MIGRATIONS) return 0;
  if ((rc = exec_sql(s, "BEGIN IMMEDIATE", err))) return rc;
  if ((rc = query_int(s, "PRAGMA user_version", &v, err))) goto fail;
  if (v > N_MIGRATIONS) {
    rc = refuse_newer(s, v, err);
    goto fail;
  }
  for (int64_t k = v; k < N_MIGRATIONS; k++) {
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %lld", (long long)(k + 1));
    if ((rc = exec_sql(s, migrations[k], err)) || (rc = exec_sql(s, sql, err))) goto fail;
    pw_info("store %s: migrated schema to version %lld", s->path, (long long)(k + 1));
  }
  if ((rc = exec_sql(s, "COMMIT", err))) goto fail;
  return 0;
fail:
  sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

/* WAL is a property of the file: set it once. Switching needs an
 * exclusive lock, which a second connection opening a fresh file at the
 * same moment may not get at once, so retry for a while. */
static int set_wal(pw_store *s, pw_err *err) {
  char mode[32] = "";
  int rc = 0;
  for (int tries = 0; tries < 500; tries++) {
    pw_err e = {0};
    if (!(rc = query_text(s, "PRAGMA journal_mode", mode, sizeof mode, &e)) && !strcmp(mode, "wal")) return 0;
    if (!rc && !strcmp(mode, "memory")) return 0; /* ":memory:" has no journal file */
    if (!rc && !(rc = query_text(s, "PRAGMA journal_mode = WAL", mode, sizeof mode, &e)) && !strcmp(mode, "wal"))
      return 0;
    if (rc && rc != PW_EIO) return err ? (*err = e, rc) : rc;
    usleep(10000);
  }
  if (rc) return pw_err_set(err, rc, s->path, "cannot switch to WAL mode");
  return pw_err_set(err, PW_EIO, s->path, "cannot switch to WAL mode (journal mode stays %s)", mode);
}

int pw_store_open(const char *path, pw_store **out, pw_err *err) {
  *out = NULL;
  pw__store_fault_from_env();
  if (!path || !*path) return pw_err_set(err, PW_EINVAL, "db", "no database path");
  pw_store *s = calloc(1, sizeof *s);
  if (!s) return pw_err_set(err, PW_ENOMEM, path, "store");
  snprintf(s->path, sizeof s->path, "%s", path);
  int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    rc = pw_err_set(err, rc == SQLITE_NOMEM ? PW_ENOMEM : PW_EIO, s->path, "cannot open the database: %s",
                    s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
    goto fail;
  }
  sqlite3_extended_result_codes(s->db, 1);
  sqlite3_busy_timeout(s->db, 5000);
  int64_t v = 0;
  /* the first read of the file: a file that is not a database fails here */
  if ((rc = query_int(s, "PRAGMA user_version", &v, err))) goto fail;
  if (v > N_MIGRATIONS) {
    rc = refuse_newer(s, v, err);
    goto fail;
  }
  if ((rc = set_wal(s, err)) || (rc = exec_sql(s, "PRAGMA synchronous = NORMAL", err)) ||
      (rc = exec_sql(s, "PRAGMA foreign_keys = ON", err)) || (rc = migrate(s, err)))
    goto fail;
  *out = s;
  return 0;
fail:
  pw_store_close(s);
  return rc;
}

void pw_store_close(pw_store *s) {
  if (!s) return;
  for (int i = 0; i < PW_ST__N; i++) sqlite3_finalize(s->st[i]);
  if (s->db) sqlite3_close_v2(s->db);
  free(s);
}

int pw_store_schema_version(pw_store *s) {
  int64_t v = 0;
  int rc = query_int(s, "PRAGMA user_version", &v, NULL);
  return rc ? rc : (int)v;
}

/* ---- workers ------------------------------------------------------------- */

int pw_store_worker_register(pw_store *s, const char *name, const char *addr, int cores, int threads,
                             const char *software, int64_t *id, pw_err *err) {
  FAULT("register worker");
  if (!name || !*name) return pw_err_set(err, PW_EINVAL, "name", "a worker needs a name");
  STMT(st, PW_ST_WORKER_UPSERT);
  sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, addr, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 3, cores);
  sqlite3_bind_int(st, 4, threads);
  sqlite3_bind_text(st, 5, software, -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 6, pw_store_now());
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    if (id) *id = sqlite3_column_int64(st, 0);
    rc = sqlite3_step(st); /* finish the statement: RETURNING rows come before DONE */
  }
  int ret = rc == SQLITE_DONE ? 0 : pw__store_fail(s, rc, err, "register worker");
  sqlite3_reset(st);
  return ret;
}

int pw__store_update_one(pw_store *s, sqlite3_stmt *st, const char *what, int64_t id, pw_err *err) {
  int rc = pw__store_exec(s, st, err, what);
  if (rc) return rc;
  if (sqlite3_changes(s->db) == 0) return pw_err_set(err, PW_ENOENT, what, "%s %lld not found", what, (long long)id);
  return 0;
}

int pw_store_worker_seen(pw_store *s, int64_t id, const char *state, pw_err *err) {
  FAULT("worker");
  STMT(st, PW_ST_WORKER_SEEN);
  sqlite3_bind_int64(st, 1, id);
  sqlite3_bind_double(st, 2, pw_store_now());
  sqlite3_bind_text(st, 3, state, -1, SQLITE_STATIC);
  return pw__store_update_one(s, st, "worker", id, err);
}

/* ---- jobs ---------------------------------------------------------------- */

int pw__store_add_event(pw_store *s, int64_t job_id, double t, const char *kind, const char *message, pw_err *err) {
  STMT(st, PW_ST_EVENT_INSERT);
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_double(st, 2, t);
  sqlite3_bind_text(st, 3, kind, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 4, message, -1, SQLITE_STATIC);
  return pw__store_exec(s, st, err, "event");
}

/* Inside the job's insert: the link to its dataset, which must be stored. */
static int job_dataset(pw_store *s, int64_t job, const char *id, const char *field, pw_err *err) {
  STMT(st, PW_ST_DS_EXISTS);
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  if (rc == SQLITE_DONE)
    return pw_err_set(err, PW_ESPEC, field, "no dataset %.64s is stored (upload it: POST /v1/datasets)", id);
  if (rc != SQLITE_ROW) return pw__store_fail(s, rc, err, "dataset");
  STMT(ins, PW_ST_JOB_DS_INSERT);
  sqlite3_bind_int64(ins, 1, job);
  sqlite3_bind_text(ins, 2, id, -1, SQLITE_STATIC);
  return pw__store_exec(s, ins, err, "job dataset");
}

/* Inside the job's insert: the link to init weights, which must be stored
 * (h-init, schema 4). */
static int job_weights(pw_store *s, int64_t job, const char *id, pw_err *err) {
  STMT(st, PW_ST_W_EXISTS);
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  if (rc == SQLITE_DONE)
    return pw_err_set(err, PW_ESPEC, "init", "no weights %.64s are stored (upload them: POST /v1/checkpoints)", id);
  if (rc != SQLITE_ROW) return pw__store_fail(s, rc, err, "weights");
  STMT(ins, PW_ST_JOB_W_INSERT);
  sqlite3_bind_int64(ins, 1, job);
  sqlite3_bind_text(ins, 2, id, -1, SQLITE_STATIC);
  rc = sqlite3_step(ins);
  sqlite3_reset(ins);
  return rc == SQLITE_DONE ? 0 : pw__store_fail(s, rc, err, "job weights");
}

int pw_store_job_insert(pw_store *s, const pw_job_new *j, int64_t *id, pw_err *err) {
  FAULT("insert job");
  if (!j || !j->spec) return pw_err_set(err, PW_EINVAL, "spec", "a job needs a spec");
  json_t *spec = json_loads(j->spec, 0, NULL);
  int is_obj = json_is_object(spec);
  json_decref(spec);
  if (!is_obj) return pw_err_set(err, PW_EINVAL, "spec", "the job spec is not a JSON object");
  double now = pw_store_now();
  int rc = pw__store_begin(s, 1, err);
  if (rc) return rc;
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_JOB_INSERT, err);
  if (!st) {
    rc = err ? err->code : PW_EIO;
    goto fail;
  }
  sqlite3_bind_text(st, 1, j->name, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, j->spec, -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 3, now);
  sqlite3_bind_int(st, 4, j->steps);
  sqlite3_bind_int(st, 5, j->pp);
  sqlite3_bind_int(st, 6, j->dp);
  sqlite3_bind_int(st, 7, j->virtual_stages);
  sqlite3_bind_int(st, 8, j->microbatches);
  sqlite3_bind_text(st, 9, j->schedule, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 10, j->model, -1, SQLITE_STATIC);
  if (j->client_key) {
    sqlite3_bind_text(st, 11, j->client_key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 12, j->client_sha, -1, SQLITE_STATIC);
  } else {
    sqlite3_bind_null(st, 11);
    sqlite3_bind_null(st, 12);
  }
  int step_rc = sqlite3_step(st);
  if ((step_rc & 0xff) == SQLITE_CONSTRAINT && j->client_key) /* a submit with the same key won the race */
    rc = pw_err_set(err, PW_ECONFLICT, "Idempotency-Key", "a job with this key was just submitted");
  else if (step_rc != SQLITE_DONE)
    rc = pw__store_fail(s, step_rc, err, "insert job");
  sqlite3_reset(st);
  if (rc) goto fail;
  int64_t job = sqlite3_last_insert_rowid(s->db);
  /* in the same transaction as the check, so a concurrent delete of the
   * dataset either sees this job or makes this insert fail */
  if (j->dataset && (rc = job_dataset(s, job, j->dataset, "data.dataset", err))) goto fail;
  if (j->tokenizer && (!j->dataset || strcmp(j->tokenizer, j->dataset)) &&
      (rc = job_dataset(s, job, j->tokenizer, "data.tokenizer", err)))
    goto fail;
  for (int k = 0; k < 2 && !rc; k++)
    if (j->weights[k] && j->weights[k][0]) rc = job_weights(s, job, j->weights[k], err);
  if (rc) goto fail;
  if ((rc = pw__store_add_event(s, job, now, "state", "queued", err)) || (rc = pw__store_commit(s, err))) goto fail;
  if (id) *id = job;
  return 0;
fail:
  pw__store_rollback(s);
  return rc;
}

int pw_store_job_by_key(pw_store *s, const char *key, int64_t *id, char sha[65], pw_err *err) {
  STMT(st, PW_ST_JOB_BY_KEY);
  sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) {
    *id = sqlite3_column_int64(st, 0);
    const char *h = (const char *)sqlite3_column_text(st, 1);
    snprintf(sha, 65, "%s", h ? h : "");
  } else if (rc == SQLITE_DONE) {
    ret = pw_err_set(err, PW_ENOENT, "Idempotency-Key", "no job has this key");
  } else {
    ret = pw__store_fail(s, rc, err, "job by key");
  }
  sqlite3_reset(st);
  return ret;
}

/* The job's state (PW_ENOENT if missing). */
static int job_state(pw_store *s, int64_t id, int *state, pw_err *err) {
  STMT(st, PW_ST_JOB_STATE);
  sqlite3_bind_int64(st, 1, id);
  int rc = sqlite3_step(st);
  int ret = 0;
  if (rc == SQLITE_ROW) {
    const char *name = (const char *)sqlite3_column_text(st, 0);
    *state = pw_job_state_parse(name);
    if (*state < 0) ret = pw_err_set(err, PW_EFORMAT, "job", "job %lld has an unknown state '%s'", (long long)id, name);
  } else if (rc == SQLITE_DONE) {
    ret = pw_err_set(err, PW_ENOENT, "job", "job %lld not found", (long long)id);
  } else {
    ret = pw__store_fail(s, rc, err, "job state");
  }
  sqlite3_reset(st);
  return ret;
}

/* Inside a transaction: the state change, its stamps and its event. */
static int transition(pw_store *s, int64_t id, int from, int to, const char *reason, const char *error, double now,
                      pw_err *err) {
  STMT(st, PW_ST_JOB_SET_STATE);
  sqlite3_bind_int64(st, 1, id);
  sqlite3_bind_text(st, 2, state_names[to], -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 3, error, -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 4, now);
  sqlite3_bind_int(st, 5, pw_job_state_terminal(to));
  int rc = pw__store_exec(s, st, err, "job state");
  if (rc) return rc;
  char *msg = reason && *reason ? sqlite3_mprintf("%s -> %s: %s", state_names[from], state_names[to], reason)
                                 : sqlite3_mprintf("%s -> %s", state_names[from], state_names[to]);
  if (!msg) return pw_err_set(err, PW_ENOMEM, "event", "out of memory");
  rc = pw__store_add_event(s, id, now, "state", msg, err);
  sqlite3_free(msg);
  return rc;
}

int pw_store_job_set_state(pw_store *s, int64_t id, int state, const char *reason, const char *error, pw_err *err) {
  FAULT("job state");
  if (state < 0 || state >= PW_JOB__N) return pw_err_set(err, PW_EINVAL, "state", "unknown job state %d", state);
  int rc = pw__store_begin(s, 1, err);
  if (rc) return rc;
  int from = 0;
  if ((rc = job_state(s, id, &from, err))) goto fail;
  if (!transition_allowed(from, state)) {
    rc = pw_err_set(err, PW_ECONFLICT, "state", "job %lld cannot go from %s to %s", (long long)id, state_names[from],
                    state_names[state]);
    goto fail;
  }
  if ((rc = transition(s, id, from, state, reason, error, pw_store_now(), err)) || (rc = pw__store_commit(s, err)))
    goto fail;
  return 0;
fail:
  pw__store_rollback(s);
  return rc;
}

int pw_store_job_set_status(pw_store *s, int64_t id, const char *status, pw_err *err) {
  FAULT("job status");
  STMT(st, PW_ST_JOB_SET_STATUS);
  sqlite3_bind_int64(st, 1, id);
  sqlite3_bind_text(st, 2, status, -1, SQLITE_STATIC);
  return pw__store_update_one(s, st, "job", id, err);
}

int pw_store_job_progress(pw_store *s, int64_t id, int steps_done, double loss, double tokens_per_s, pw_err *err) {
  FAULT("job progress");
  STMT(st, PW_ST_JOB_PROGRESS);
  sqlite3_bind_int64(st, 1, id);
  sqlite3_bind_int(st, 2, steps_done);
  sqlite3_bind_double(st, 3, loss); /* NaN binds as NULL */
  sqlite3_bind_double(st, 4, tokens_per_s);
  return pw__store_update_one(s, st, "job", id, err);
}

int pw_store_job_eval_loss(pw_store *s, int64_t id, double eval_loss, pw_err *err) {
  FAULT("job eval loss");
  STMT(st, PW_ST_JOB_EVAL_LOSS);
  sqlite3_bind_int64(st, 1, id);
  sqlite3_bind_double(st, 2, eval_loss);
  return pw__store_update_one(s, st, "job", id, err);
}

int pw_store_run_stop(pw_store *s, int64_t run, int step, pw_err *err) {
  FAULT("run stop");
  if (step < 1) return pw_err_set(err, PW_EINVAL, "step", "a run stops after step 1 at the earliest (got %d)", step);
  STMT(st, PW_ST_RUN_STOP);
  sqlite3_bind_int64(st, 1, run);
  sqlite3_bind_int(st, 2, step);
  return pw__store_update_one(s, st, "run", run, err);
}

int pw_store_job_set_restarts(pw_store *s, int64_t id, int restarts, pw_err *err) {
  FAULT("job restarts");
  if (restarts < 0) return pw_err_set(err, PW_EINVAL, "restarts", "a restart count must be >= 0 (got %d)", restarts);
  STMT(st, PW_ST_JOB_SET_RESTARTS);
  sqlite3_bind_int64(st, 1, id);
  sqlite3_bind_int(st, 2, restarts);
  return pw__store_update_one(s, st, "job", id, err);
}

/* Outside the lifecycle (terminal states are final to transition_allowed):
 * only a person asks for it, and it starts a new round of restarts. */
int pw_store_job_retry(pw_store *s, int64_t id, pw_err *err) {
  FAULT("job retry");
  int rc = pw__store_begin(s, 1, err), from = 0;
  if (rc) return rc;
  if ((rc = job_state(s, id, &from, err))) goto fail;
  if (from != PW_JOB_FAILED && from != PW_JOB_CANCELLED) {
    rc = pw_err_set(err, PW_ECONFLICT, "job", "job %lld is %s: only a failed or cancelled job can be retried",
                    (long long)id, state_names[from]);
    goto fail;
  }
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_JOB_RETRY, err);
  if (!st) {
    rc = err ? err->code : PW_EIO;
    goto fail;
  }
  sqlite3_bind_int64(st, 1, id);
  if ((rc = pw__store_exec(s, st, err, "job retry")) ||
      (rc = pw__store_add_event(s, id, pw_store_now(), "retry", "retried by request: resumes from its newest state", err)) ||
      (rc = pw__store_commit(s, err)))
    goto fail;
  return 0;
fail:
  pw__store_rollback(s);
  return rc;
}

int pw_store_job_brief(pw_store *s, int64_t id, pw_job_brief *out, pw_err *err) {
  memset(out, 0, sizeof *out);
  STMT(st, PW_ST_JOB_BRIEF);
  sqlite3_bind_int64(st, 1, id);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) {
    out->id = sqlite3_column_int64(st, 0);
    out->state = pw_job_state_parse((const char *)sqlite3_column_text(st, 1));
    out->steps = sqlite3_column_int(st, 2);
    out->steps_done = sqlite3_column_int(st, 3);
    const char *spec = (const char *)sqlite3_column_text(st, 4);
    out->run = sqlite3_column_int(st, 5);
    out->stop_step = sqlite3_column_int(st, 6);
    if (spec && !(out->spec = strdup(spec))) ret = pw_err_set(err, PW_ENOMEM, "job", "out of memory");
  } else if (rc == SQLITE_DONE) {
    ret = pw_err_set(err, PW_ENOENT, "job", "job %lld not found", (long long)id);
  } else {
    ret = pw__store_fail(s, rc, err, "job");
  }
  sqlite3_reset(st);
  return ret;
}

int pw_store_jobs_in_state(pw_store *s, int state, int64_t **ids, int *n, pw_err *err) {
  *ids = NULL;
  *n = 0;
  if (state < 0 || state >= PW_JOB__N) return pw_err_set(err, PW_EINVAL, "state", "unknown job state %d", state);
  STMT(st, PW_ST_JOBS_IN_STATE);
  sqlite3_bind_text(st, 1, state_names[state], -1, SQLITE_STATIC);
  int64_t *v = NULL;
  int len = 0, cap = 0, rc, ret = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (len == cap) {
      int64_t *nv = realloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 16));
      if (!nv) {
        ret = pw_err_set(err, PW_ENOMEM, "jobs", "out of memory");
        break;
      }
      v = nv;
    }
    v[len++] = sqlite3_column_int64(st, 0);
  }
  if (!ret && rc != SQLITE_DONE) ret = pw__store_fail(s, rc, err, "jobs in state");
  sqlite3_reset(st);
  if (ret) {
    free(v);
    return ret;
  }
  *ids = v;
  *n = len;
  return 0;
}

int pw_store_recover(pw_store *s, const char *reason, pw_err *err) {
  FAULT("recover");
  int rc = pw__store_begin(s, 1, err);
  if (rc) return rc;
  int64_t *ids = NULL;
  int *from = NULL, n = 0, cap = 0;
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_JOBS_MIDFLIGHT, err);
  if (!st) {
    rc = err ? err->code : PW_EIO;
    goto fail;
  }
  /* collect first: the updates below change the rows being scanned */
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      cap = cap ? 2 * cap : 8;
      int64_t *ni = realloc(ids, sizeof *ids * (size_t)cap);
      if (ni) ids = ni;
      int *nf = realloc(from, sizeof *from * (size_t)cap);
      if (nf) from = nf;
      if (!ni || !nf) {
        sqlite3_reset(st);
        rc = pw_err_set(err, PW_ENOMEM, "recover", "out of memory");
        goto fail;
      }
    }
    ids[n] = sqlite3_column_int64(st, 0);
    from[n++] = pw_job_state_parse((const char *)sqlite3_column_text(st, 1));
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) {
    rc = pw__store_fail(s, rc, err, "recover");
    goto fail;
  }
  double now = pw_store_now();
  for (int i = 0; i < n; i++) {
    if (!(st = pw__store_stmt(s, PW_ST_RUNS_INTERRUPT_OPEN, err))) {
      rc = err ? err->code : PW_EIO;
      goto fail;
    }
    sqlite3_bind_int64(st, 1, ids[i]);
    sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 3, now);
    if ((rc = pw__store_exec(s, st, err, "recover runs")) ||
        (rc = transition(s, ids[i], from[i], PW_JOB_QUEUED, reason, NULL, now, err)))
      goto fail;
  }
  if ((rc = pw__store_commit(s, err))) goto fail;
  free(ids);
  free(from);
  return n;
fail:
  pw__store_rollback(s);
  free(ids);
  free(from);
  return rc;
}
