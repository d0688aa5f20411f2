/* store_int: what store.c (connection, migrations, writes) and
 * store_query.c (the API's JSON views) share — the connection struct and
 * the table of prepared statements. Not for use outside the store. */
#ifndef PW_STORE_INT_H
#define PW_STORE_INT_H

#include <sqlite3.h>

#include "store.h"

/* The job row as both job views read it: same columns, same order
 * (the list selects NULL for spec). */
#define PW__JOB_COLS                                                                          \
  "id, name, state, status, error, model, schedule, pp, dp, vstages, microbatches, steps_done, " \
  "steps, loss, tokens_per_s, created, started, finished, run, COALESCE(restarts, 0), eval_loss, " \
  "COALESCE(json_extract(spec, '$.mesh.tp'), 1)" /* no column of its own: the spec holds it */

/* The weights row as its views read it (h-init). */
#define PW__W_COLS "id, size, kind, name, source, created, n_tensors, params"

/* The dataset row as its views read it. */
#define PW__DS_COLS "id, size, format, name, created, vocab_size, width, n_tokens"

/* Every statement the store runs, prepared once per connection on first
 * use and kept (SQLITE_PREPARE_PERSISTENT). Writes that belong together
 * run between BEGIN_W and COMMIT: BEGIN IMMEDIATE takes the write lock up
 * front, so a transaction never has to upgrade a read lock (which in WAL
 * mode fails at once with SQLITE_BUSY instead of waiting). */
#define PW_STORE_STMTS(X)                                                                          \
  X(BEGIN_W, "BEGIN IMMEDIATE")                                                                    \
  X(BEGIN_R, "BEGIN")                                                                              \
  X(COMMIT, "COMMIT")                                                                              \
  X(ROLLBACK, "ROLLBACK")                                                                          \
  X(WORKER_UPSERT,                                                                                 \
    "INSERT INTO workers(name, addr, cores, threads, software, state, first_seen, last_seen) "     \
    "VALUES(?1, ?2, ?3, ?4, ?5, 'idle', ?6, ?6) ON CONFLICT(name) DO UPDATE SET "                  \
    "addr = excluded.addr, cores = excluded.cores, threads = excluded.threads, "                   \
    "software = excluded.software, state = 'idle', last_seen = excluded.last_seen RETURNING id")   \
  X(WORKER_SEEN, "UPDATE workers SET last_seen = ?2, state = COALESCE(?3, state) WHERE id = ?1")   \
  X(JOB_INSERT,                                                                                    \
    "INSERT INTO jobs(name, spec, state, created, steps, pp, dp, vstages, microbatches, "          \
    "schedule, model, client_key, client_sha) "                                                    \
    "VALUES(?1, ?2, 'queued', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)")                         \
  X(JOB_BY_KEY, "SELECT id, client_sha FROM jobs WHERE client_key = ?1")                           \
  X(EVENT_INSERT, "INSERT INTO events(job_id, time, kind, message) VALUES(?1, ?2, ?3, ?4)")        \
  X(JOB_STATE, "SELECT state FROM jobs WHERE id = ?1")                                             \
  X(JOB_SET_STATE,                                                                                 \
    "UPDATE jobs SET state = ?2, error = COALESCE(?3, error), "                                    \
    "started = CASE WHEN ?2 = 'running' THEN COALESCE(started, ?4) ELSE started END, "             \
    "finished = CASE WHEN ?5 THEN ?4 ELSE finished END WHERE id = ?1")                             \
  X(JOB_SET_STATUS, "UPDATE jobs SET status = ?2 WHERE id = ?1")                                   \
  X(JOB_PROGRESS, "UPDATE jobs SET steps_done = ?2, loss = ?3, tokens_per_s = ?4 WHERE id = ?1")   \
  X(JOB_EVAL_LOSS, "UPDATE jobs SET eval_loss = ?2 WHERE id = ?1")                                \
  X(JOB_BRIEF, "SELECT id, state, steps, steps_done, spec, run, "                                 \
    "(SELECT stop_step FROM runs WHERE runs.id = jobs.run) FROM jobs WHERE id = ?1")               \
  X(JOB_EXISTS, "SELECT 1 FROM jobs WHERE id = ?1")                                                \
  X(JOBS_IN_STATE, "SELECT id FROM jobs WHERE state = ?1 ORDER BY id")                             \
  X(JOBS_MIDFLIGHT,                                                                                \
    "SELECT id, state FROM jobs WHERE state IN ('planning', 'dispatching', 'running') ORDER BY id") \
  X(RUNS_INTERRUPT_OPEN,                                                                                \
    "UPDATE runs SET state = 'interrupted', error = ?2, finished = ?3 "                            \
    "WHERE job_id = ?1 AND finished IS NULL")                                                      \
  X(JOB_GET, "SELECT " PW__JOB_COLS ", spec FROM jobs WHERE id = ?1")                              \
  X(JOBS_COUNT_ALL, "SELECT count(*) FROM jobs")                                                   \
  X(JOBS_COUNT_STATE, "SELECT count(*) FROM jobs WHERE state = ?3")                                \
  X(JOBS_PAGE_ALL, "SELECT " PW__JOB_COLS ", NULL FROM jobs ORDER BY id DESC LIMIT ?1 OFFSET ?2")  \
  X(JOBS_PAGE_STATE,                                                                               \
    "SELECT " PW__JOB_COLS ", NULL FROM jobs WHERE state = ?3 ORDER BY id DESC LIMIT ?1 OFFSET ?2") \
  X(RUN_NEXT_ATTEMPT, "SELECT COALESCE(MAX(attempt), 0) + 1 FROM runs WHERE job_id = ?1")          \
  X(RUN_INSERT,                                                                                    \
    "INSERT INTO runs(job_id, attempt, state, started, plan) VALUES(?1, ?2, 'running', ?3, ?4)")   \
  X(JOB_SET_RUN, "UPDATE jobs SET run = ?2 WHERE id = ?1")                                         \
  X(RUN_FINISH, "UPDATE runs SET state = ?2, error = ?3, finished = ?4 WHERE id = ?1")             \
  X(STAGE_INSERT,                                                                                  \
    "INSERT INTO stages(run_id, stage, rank, layers, params, flops) VALUES(?1, ?2, ?3, ?4, ?5, ?6)") \
  X(ASSIGN_INSERT,                                                                                 \
    "INSERT INTO assignments(run_id, rank, worker_id, worker_name) VALUES(?1, ?2, ?3, ?4)")        \
  X(ACTIONS_INSERT, "INSERT INTO actions(run_id, rank, actions) VALUES(?1, ?2, ?3)")               \
  X(RUN_OF_JOB,                                                                                    \
    "SELECT j.run, r.attempt, r.state FROM jobs j LEFT JOIN runs r ON r.id = j.run "               \
    "WHERE j.id = ?1")                                                                             \
  X(RUN_PLAN, "SELECT r.plan FROM jobs j JOIN runs r ON r.id = j.run WHERE j.id = ?1")              \
  /* /metrics: the latest run's planned step, without parsing the plan into a tree */              \
  X(RUN_PLANNED_STEP,                                                                              \
    "SELECT COALESCE(json_extract(r.plan, '$.analytics.step_makespan'), "                          \
    "json_extract(r.plan, '$.analytics.makespan')), "                                              \
    "json_extract(j.spec, '$.partition.layer_times') IS NOT NULL "                                 \
    "FROM jobs j JOIN runs r ON r.id = j.run WHERE j.id = ?1")                                     \
  X(RUN_STAGES,                                                                                    \
    "SELECT stage, rank, layers, params, flops FROM stages WHERE run_id = ?1 ORDER BY stage")      \
  X(RUN_RANKS,                                                                                     \
    "SELECT k.rank, a.worker_name, x.actions FROM "                                                \
    "(SELECT rank FROM assignments WHERE run_id = ?1 UNION SELECT rank FROM actions "              \
    "WHERE run_id = ?1) k "                                                                        \
    "LEFT JOIN assignments a ON a.run_id = ?1 AND a.rank = k.rank "                                \
    "LEFT JOIN actions x ON x.run_id = ?1 AND x.rank = k.rank ORDER BY k.rank")                    \
  X(METRIC_UPSERT,                                                                                 \
    "INSERT OR REPLACE INTO metrics(job_id, run_id, step, loss, step_time, tokens, tokens_per_s, " \
    "grad_norm, lr, time, eval_loss) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)")        \
  X(METRICS_SINCE,                                                                                 \
    "SELECT step, loss, step_time, tokens, tokens_per_s, grad_norm, lr, time, run_id, eval_loss "   \
    "FROM metrics m "                                                                              \
    "WHERE job_id = ?1 AND step >= ?2 AND run_id IS (SELECT max(run_id) FROM metrics WHERE "      \
    "job_id = ?1 AND step = m.step) ORDER BY step")                                                \
  X(METRICS_SINCE_ALL,                                                                             \
    "SELECT step, loss, step_time, tokens, tokens_per_s, grad_norm, lr, time, run_id, eval_loss "   \
    "FROM metrics "                                                                                \
    "WHERE job_id = ?1 AND step >= ?2 ORDER BY step, run_id")                                      \
  X(TIMING_UPSERT,                                                                                 \
    "INSERT OR REPLACE INTO timings(job_id, run_id, step, rank, actions) "                         \
    "VALUES(?1, ?2, ?3, ?4, ?5)")                                                                  \
  /* the newest step every rank has reported (a running job's newest may lack some yet) */              \
  X(TIMING_LATEST, "SELECT step FROM timings WHERE job_id = ?1 GROUP BY step HAVING COUNT(DISTINCT rank) = " \
                   "(SELECT MAX(n) FROM (SELECT COUNT(DISTINCT rank) AS n FROM timings WHERE job_id = ?1 "  \
                   "GROUP BY step)) ORDER BY step DESC LIMIT 1")                                             \
  X(TIMING_STEPS, "SELECT DISTINCT step FROM timings WHERE job_id = ?1 ORDER BY step")             \
  X(TIMING_AT,                                                                                     \
    "SELECT rank, actions FROM timings WHERE job_id = ?1 AND step = ?2 ORDER BY rank")             \
  X(CKPT_INSERT,                                                                                   \
    "INSERT INTO checkpoints(job_id, run_id, step, stage, rank, path, bytes, time) "               \
    "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")                                                      \
  X(CKPT_LATEST_STEP,                                                                              \
    "SELECT run_id, step FROM checkpoints WHERE job_id = ?1 GROUP BY run_id, step "                \
    "HAVING count(DISTINCT stage) = ?2 AND min(stage) = 0 AND max(stage) = ?2 - 1 "                \
    "ORDER BY step DESC, run_id DESC LIMIT 1")                                                     \
  X(CKPT_AT,                                                                                       \
    "SELECT stage, rank, path, bytes FROM checkpoints WHERE id IN (SELECT max(id) FROM checkpoints " \
    "WHERE job_id = ?1 AND run_id = ?2 AND step = ?3 GROUP BY stage) ORDER BY stage")              \
  X(EVENTS_SINCE,                                                                                  \
    "SELECT id, time, kind, message FROM events WHERE job_id = ?1 AND id > ?2 ORDER BY id")        \
  X(TOTALS_STATES, "SELECT state, count(*) FROM jobs GROUP BY state")                              \
  X(TOTALS_METRICS, "SELECT count(*), total(tokens) FROM metrics")                                \
  X(DS_INSERT,                                                                                     \
    "INSERT INTO datasets(id, size, format, name, created, vocab_size, width, n_tokens) "           \
    "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT(id) DO NOTHING")                          \
  X(DS_GET, "SELECT " PW__DS_COLS " FROM datasets WHERE id = ?1")                                  \
  X(DS_LIST, "SELECT " PW__DS_COLS " FROM datasets ORDER BY created DESC, id")                     \
  X(DS_DELETE, "DELETE FROM datasets WHERE id = ?1")                                               \
  X(DS_EXISTS, "SELECT 1 FROM datasets WHERE id = ?1")                                               \
  X(DS_USER,                                                                                       \
    "SELECT j.id, j.state FROM job_datasets d JOIN jobs j ON j.id = d.job_id WHERE d.dataset_id = ?1 " \
    "AND j.state NOT IN ('succeeded', 'failed', 'cancelled') ORDER BY j.id LIMIT 1")               \
  X(JOB_DS_INSERT, "INSERT OR IGNORE INTO job_datasets(job_id, dataset_id) VALUES(?1, ?2)")        \
  X(JOB_DS_GET, "SELECT dataset_id FROM job_datasets WHERE job_id = ?1 ORDER BY dataset_id LIMIT 1")   \
  /* ---- weights (h-init, schema 4) ---- */                                                         \
  X(W_INSERT,                                                                                      \
    "INSERT INTO weights(id, size, kind, name, source, created, n_tensors, params) "                \
    "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT(id) DO NOTHING")                          \
  X(W_GET, "SELECT " PW__W_COLS " FROM weights WHERE id = ?1")                                     \
  X(W_LIST, "SELECT " PW__W_COLS " FROM weights ORDER BY created DESC, id")                        \
  X(W_DELETE, "DELETE FROM weights WHERE id = ?1")                                                 \
  X(W_EXISTS, "SELECT 1 FROM weights WHERE id = ?1")                                               \
  X(W_USER,                                                                                        \
    "SELECT j.id, j.state FROM job_weights w JOIN jobs j ON j.id = w.job_id WHERE w.weights_id = ?1 " \
    "AND j.state NOT IN ('succeeded', 'failed', 'cancelled') ORDER BY j.id LIMIT 1")               \
  X(JOB_W_INSERT, "INSERT OR IGNORE INTO job_weights(job_id, weights_id) VALUES(?1, ?2)")             \
  /* ---- restarts and attempts (issue 15, schema 5) ---- */                                         \
  X(RUN_RESUME, "UPDATE runs SET start_step = ?2, resumed_from = ?3 WHERE id = ?1")                 \
  X(JOB_SET_RESTARTS, "UPDATE jobs SET restarts = ?2 WHERE id = ?1")                               \
  X(RUN_STOP, "UPDATE runs SET stop_step = ?2 WHERE id = ?1")                                      \
  X(JOB_RESTARTS, "SELECT COALESCE(restarts, 0) FROM jobs WHERE id = ?1")                           \
  X(JOB_RETRY,                                                                                     \
    "UPDATE jobs SET state = 'queued', error = NULL, finished = NULL, status = '', restarts = 0 "   \
    "WHERE id = ?1")                                                                               \
  X(ATTEMPTS,                                                                                      \
    "SELECT attempt, id, state, started, finished, error, start_step, resumed_from FROM runs "      \
    "WHERE job_id = ?1 ORDER BY attempt, id")                                                      \
  X(ATTEMPT_WORKERS,                                                                               \
    "SELECT a.run_id, a.worker_name FROM assignments a JOIN runs r ON r.id = a.run_id "            \
    "WHERE r.job_id = ?1 ORDER BY a.run_id, a.rank")                                               \
  /* ---- TensorBoard event files (store_tfevents.c): every run's rows, or run ?2's ---- */          \
  X(JOB_CREATED, "SELECT created FROM jobs WHERE id = ?1")                                         \
  X(TF_METRICS,                                                                                    \
    "SELECT run_id, step, time, loss, eval_loss, lr, grad_norm, tokens_per_s, step_time FROM metrics " \
    "WHERE job_id = ?1 AND (?2 = 0 OR run_id = ?2) ORDER BY run_id, step")                          \
  X(TF_TIMINGS,                                                                                    \
    "SELECT run_id, step, rank, actions FROM timings "                                             \
    "WHERE job_id = ?1 AND (?2 = 0 OR run_id = ?2) ORDER BY run_id, step, rank")

enum {
#define PW__ST_ENUM(name, sql) PW_ST_##name,
  PW_STORE_STMTS(PW__ST_ENUM)
#undef PW__ST_ENUM
  PW_ST__N
};

struct pw_store {
  sqlite3 *db;
  sqlite3_stmt *st[PW_ST__N]; /* prepared on first use */
  char path[256];             /* for error messages */
};

/* The statement, prepared if needed, reset, bindings cleared; NULL on
 * failure (err filled). */
sqlite3_stmt *pw__store_stmt(pw_store *s, int id, pw_err *err);
/* Maps a SQLite result code to a PW_E* code and fills err with what
 * failed and SQLite's message. Constraint failures: a foreign key names a
 * missing row (PW_ENOENT), a duplicate key is PW_ECONFLICT. */
int pw__store_fail(pw_store *s, int rc, pw_err *err, const char *what);
/* Transactions: write (BEGIN IMMEDIATE) or read (deferred). */
PW_MUST_CHECK int pw__store_begin(pw_store *s, int write, pw_err *err);
PW_MUST_CHECK int pw__store_commit(pw_store *s, pw_err *err);
void pw__store_rollback(pw_store *s);
/* Runs a statement that returns no rows; resets it. */
int pw__store_exec(pw_store *s, sqlite3_stmt *st, pw_err *err, const char *what);
/* An UPDATE by id: PW_ENOENT when it touched nothing. */
PW_MUST_CHECK int pw__store_update_one(pw_store *s, sqlite3_stmt *st, const char *what, int64_t id, pw_err *err);
/* A job's event row, inside the caller's transaction. */
PW_MUST_CHECK int pw__store_add_event(pw_store *s, int64_t job_id, double t, const char *kind, const char *message,
                                      pw_err *err);
/* PW_ENOENT naming the job when it does not exist. */
PW_MUST_CHECK int pw__store_job_exists(pw_store *s, int64_t id, pw_err *err);
/* The prepare-or-fail preamble of a function returning a PW_E* code. */
#define STMT(var, id)                               \
  sqlite3_stmt *var = pw__store_stmt(s, (id), err); \
  if (!var) return err ? err->code : PW_EIO
/* A write's fault-injection point (store_fault.c). */
#define FAULT(what)                                \
  do {                                             \
    int frc_ = pw__store_fault(s, err, (what));    \
    if (frc_) return frc_;                         \
  } while (0)

/* store_fault.c: PW_EIO as SQLITE_FULL would give when this write is to
 * fail (fault injection), else 0; and reading PW_STORE_FAIL_* once. */
int pw__store_fault(pw_store *s, pw_err *err, const char *what);
void pw__store_fault_from_env(void);
/* A column as JSON: NULL -> null, integers, finite reals (else null),
 * text (invalid UTF-8 bytes become '?'). */
json_t *pw__store_col(sqlite3_stmt *st, int i);
/* A text column holding JSON, parsed (any value); the raw string if it
 * does not parse; null if NULL. */
json_t *pw__store_col_parsed(sqlite3_stmt *st, int i);

/* store_objects.c: the content-addressed kinds (datasets, weights) share
 * one table shape: a row per id (64 hex) inserted or kept, a list newest
 * first, and a job link that refuses delete while a queued or running job
 * uses the id. A kind names its statements, its row as JSON and its
 * words for errors. */
typedef struct {
  int st_insert, st_get, st_list, st_user, st_delete;
  json_t *(*row)(sqlite3_stmt *st);
  const char *what;    /* "dataset": "insert dataset", "dataset users" */
  const char *param;   /* the id's error field: "ds" | "ck" */
  const char *missing; /* PW_ENOENT: "no <missing> <id>" */
  const char *are;     /* PW_ECONFLICT: "<what> <id>... <are> in use by job N" */
  const char *list;    /* the list's key and error field */
} pw__store_kind;

/* One row by id: 0 with *out, PW_ENOENT, or a store error. */
PW_MUST_CHECK int pw__store_obj_get(pw_store *s, const pw__store_kind *k, const char *id, json_t **out, pw_err *err);
/* The kind's insert statement, bound by bind(st, arg), run in a write
 * transaction; the row (new or kept) into *out when out is not NULL,
 * *created 1 when the id was new. */
PW_MUST_CHECK int pw__store_obj_insert(pw_store *s, const pw__store_kind *k, const char *id,
                                       void (*bind)(sqlite3_stmt *st, const void *arg), const void *arg, int *created,
                                       json_t **out, pw_err *err);
/* {"<list>": [row...]}. */
PW_MUST_CHECK int pw__store_obj_list(pw_store *s, const pw__store_kind *k, json_t **out, pw_err *err);
/* Deletes the row unless a live job uses it (PW_ECONFLICT naming the
 * job); the deleted row into *out when out is not NULL. */
PW_MUST_CHECK int pw__store_obj_delete(pw_store *s, const pw__store_kind *k, const char *id, json_t **out,
                                       pw_err *err);

#endif
