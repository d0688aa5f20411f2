/* test_coord_store_faults: the store when writes fail, and what the
 * control loop does about it.
 *
 *  - fault injection: writes after+1 .. after+count fail as a full disk
 *    would (PW_EIO naming SQLITE_FULL), leave nothing half-written, and
 *    work again afterwards; a fault file fails writes while it exists;
 *  - store_retry: writes the store cannot take are kept in order, shown
 *    as pending with the error (/healthz, /metrics), and all land once the
 *    store works — metrics, the run's end and the job's final state, so a
 *    job whose ranks finished meanwhile ends succeeded, with every step;
 *    refused writes are dropped, the queue is bounded;
 *  - migration 1 -> 2: a database of schema 1 (metrics keyed by job and
 *    step) opens as schema 2 with its rows, and then keeps one row per run. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "store_retry.h"
#include "storetest.h"

static char g_dir[256];
static const char *SPEC = "{\"model\": {\"d_model\": 64, \"n_layers\": 4}, \"steps\": 10}";

static pw_store *open_at(const char *name, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", g_dir, name);
  pw_store *s = NULL;
  pw_err err = {0};
  if (pw_store_open(path, &s, &err)) fail_msg("open %s: %s", path, err.msg);
  return s;
}

static int64_t new_job(pw_store *s) {
  pw_job_new j = {.name = "j", .spec = SPEC, .steps = 10, .pp = 2, .dp = 1, .virtual_stages = 1,
                  .microbatches = 4, .schedule = "1f1b", .model = "gpt"};
  int64_t id = 0;
  pw_err err = {0};
  assert_int_equal(pw_store_job_insert(s, &j, &id, &err), 0);
  return id;
}

static void test_fault_injection(void **state) {
  char path[512];
  pw_store *s = open_at("fault.db", path, sizeof path);
  int64_t job = new_job(s), run;
  pw_err err = {0};
  assert_int_equal(pw_store_run_insert(s, job, NULL, &run, &err), 0);
  pw_store_fault_inject(1, 2); /* the 2nd and 3rd writes from now fail */
  pw_metric m = {.step = 0, .loss = 1, .step_time = 0.1};
  assert_int_equal(pw_store_metric_insert(s, job, run, &m, &err), 0);
  m.step = 1;
  assert_int_equal(pw_store_metric_insert(s, job, run, &m, &err), PW_EIO);
  assert_non_null(strstr(err.msg, "database or disk is full"));
  assert_non_null(strstr(err.msg, "metric"));
  /* a failing transaction leaves nothing: no state change, no event */
  assert_int_equal(pw_store_job_set_state(s, job, PW_JOB_PLANNING, "x", NULL, &err), PW_EIO);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM events"), 1);
  assert_int_equal(pw_store_job_set_state(s, job, PW_JOB_PLANNING, "x", NULL, &err), 0);
  assert_int_equal(pw_store_metric_insert(s, job, run, &m, &err), 0);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM metrics"), 2);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM events"), 2);
  /* reads are not writes: they never fail */
  pw_store_fault_inject(0, -1);
  json_t *j = NULL;
  assert_int_equal(pw_store_metrics_json(s, job, 0, &j, &err), 0);
  json_decref(j);
  assert_int_equal(pw_store_event(s, job, "k", "m", &err), PW_EIO);
  pw_store_fault_inject(-1, 0);
  assert_int_equal(pw_store_event(s, job, "k", "m", &err), 0);
  /* the fault file: writes fail while it exists */
  char ff[512];
  snprintf(ff, sizeof ff, "%s/full", g_dir);
  pw_store_fault_file(ff);
  assert_int_equal(pw_store_event(s, job, "k", "m", &err), 0);
  FILE *f = fopen(ff, "w");
  fclose(f);
  assert_int_equal(pw_store_event(s, job, "k", "m", &err), PW_EIO);
  unlink(ff);
  assert_int_equal(pw_store_event(s, job, "k", "m", &err), 0);
  pw_store_fault_file(NULL);
  pw_store_close(s);
}

/* ---- the loop's writes -------------------------------------------------- */

/* One pw_coord per test: pw_coord_store keeps a thread's connection by
 * the coordinator's address, so a test never reuses another's. */
static pw_coord coords[2];
#define C (*cur)
static pw_coord *cur = &coords[0];

static void coord_on(const char *name) {
  static int next;
  cur = &coords[next++];
  memset(&C, 0, sizeof C);
  snprintf(C.db_path, sizeof C.db_path, "%s/%s", g_dir, name);
  pthread_mutex_init(&C.mu, NULL);
}

static void coord_off(void) {
  pw_write_shutdown(&C);
  for (int i = 0; i < C.n_stores; i++) pw_store_close(C.stores[i]);
  free(C.stores);
  C.stores = NULL;
  C.n_stores = 0;
  pthread_mutex_destroy(&C.mu);
}

static int healthy(char *err, size_t cap, int *pending) { return !pw_coord_store_health(&C, err, cap, pending); }

static void test_retry_keeps_order_and_reconciles(void **state) {
  coord_on("retry.db");
  pw_store *s = pw_coord_store(&C);
  assert_non_null(s);
  pw_err err = {0};
  int64_t job = new_job(s), run;
  assert_int_equal(pw_store_job_set_state(s, job, PW_JOB_PLANNING, NULL, NULL, &err), 0);
  assert_int_equal(pw_store_job_set_state(s, job, PW_JOB_DISPATCHING, NULL, NULL, &err), 0);
  assert_int_equal(pw_store_job_set_state(s, job, PW_JOB_RUNNING, NULL, NULL, &err), 0);
  assert_int_equal(pw_store_run_insert(s, job, NULL, &run, &err), 0);
  char e[256];
  int pending = -1;
  assert_true(healthy(e, sizeof e, &pending));

  /* step 0 is written; then the disk fills up */
  pw_write w = {.kind = PW_W_METRIC, .job = job, .run = run, .m = {.step = 0, .loss = 2.0, .step_time = 0.1}};
  assert_int_equal(pw_write_do(&C, &w, NULL), 0);
  pw_store_fault_inject(0, -1);
  for (int st = 1; st < 10; st++) {
    w.m.step = st;
    w.m.loss = 2.0 - 0.1 * st;
    assert_int_equal(pw_write_do(&C, &w, NULL), 1);
    pw_write t = {.kind = PW_W_TIMING, .job = job, .run = run, .step = st, .rank = 1, .text = "[[\"F\", 0, 0, 0.0, 1.0]]"};
    assert_int_equal(pw_write_do(&C, &t, NULL), 1);
  }
  /* the ranks all finish: the run's end and the job's state are kept too */
  pw_write fin = {.kind = PW_W_RUN_FINISH, .job = job, .run = run, .text = "succeeded"};
  pw_write ok = {.kind = PW_W_JOB_STATE, .job = job, .state = PW_JOB_SUCCEEDED, .text = "all ranks done"};
  assert_int_equal(pw_write_do(&C, &fin, NULL), 1);
  assert_int_equal(pw_write_do(&C, &ok, NULL), 1);
  /* status lines are not kept (the next one replaces them) */
  pw_write status = {.kind = PW_W_JOB_STATUS, .job = job, .text = "x"};
  assert_int_equal(pw_write_do(&C, &status, NULL), 1);
  assert_int_equal(pw_write_pending(&C), 20);
  assert_false(healthy(e, sizeof e, &pending));
  assert_int_equal(pending, 20);
  assert_non_null(strstr(e, "database or disk is full"));
  assert_true(C.store_failures >= 21);
  assert_int_equal(C.store_dropped, 0);
  char *text = pw_coord_metrics_text(&C);
  assert_non_null(strstr(text, "pipewright_store_writes_pending 20\n"));
  assert_null(strstr(text, "pipewright_store_write_failures_total 0\n"));
  free(text);
  /* nothing of it is in the store yet: the job still runs there */
  json_t *j = NULL;
  assert_int_equal(pw_store_job_json(s, job, 0, &j, &err), 0);
  assert_string_equal(json_string_value(json_object_get(j, "state")), "running");
  json_decref(j);
  /* retries while the store still fails keep everything, in order */
  assert_int_equal(pw_write_flush(&C), 20);

  /* space comes back: one flush writes it all, the job ends succeeded */
  pw_store_fault_inject(-1, 0);
  assert_int_equal(pw_write_flush(&C), 0);
  assert_true(healthy(e, sizeof e, &pending));
  assert_int_equal(pending, 0);
  assert_int_equal(pw_store_metrics_json(s, job, 0, &j, &err), 0);
  json_t *rows = json_object_get(j, "metrics");
  assert_int_equal(json_array_size(rows), 10);
  for (int st = 0; st < 10; st++)
    assert_int_equal(json_integer_value(json_object_get(json_array_get(rows, (size_t)st), "step")), st);
  json_decref(j);
  assert_int_equal(pw_store_timeline_json(s, job, 9, &j, &err), 0);
  assert_int_equal(json_array_size(json_object_get(j, "ranks")), 1);
  json_decref(j);
  assert_int_equal(pw_store_job_json(s, job, 0, &j, &err), 0);
  assert_string_equal(json_string_value(json_object_get(j, "state")), "succeeded");
  json_decref(j);
  text = pw_coord_metrics_text(&C);
  assert_non_null(strstr(text, "pipewright_store_writes_pending 0\n"));
  free(text);
  coord_off();
}

static void test_retry_refused_and_bounded(void **state) {
  coord_on("bounded.db");
  pw_store *s = pw_coord_store(&C);
  pw_err err = {0};
  int64_t job = new_job(s), run;
  assert_int_equal(pw_store_run_insert(s, job, NULL, &run, &err), 0);
  /* refused for its content (queued -> succeeded is not a transition):
   * dropped at once, nothing pending, the store is healthy */
  pw_write bad = {.kind = PW_W_JOB_STATE, .job = job, .state = PW_JOB_SUCCEEDED, .text = "x"};
  assert_int_equal(pw_write_do(&C, &bad, &err), PW_ECONFLICT);
  assert_int_equal(pw_write_pending(&C), 0);
  char e[256];
  int pending;
  assert_int_equal(pw_coord_store_health(&C, e, sizeof e, &pending), 0);

  /* kept while failing; refused when retried: dropped, the rest lands */
  pw_store_fault_inject(0, -1);
  assert_int_equal(pw_write_do(&C, &bad, NULL), 1);
  pw_write cancel = {.kind = PW_W_JOB_STATE, .job = job, .state = PW_JOB_CANCELLED, .text = "by request"};
  assert_int_equal(pw_write_do(&C, &cancel, NULL), 1);
  /* the bound: past PW_WRITEQ_MAX a metric is lost, and said to be */
  pw_write w = {.kind = PW_W_METRIC, .job = job, .run = run};
  int kept = 0, lost = 0;
  for (int st = 0; st < PW_WRITEQ_MAX + 5; st++) {
    w.m.step = st;
    int rc = pw_write_do(&C, &w, NULL);
    kept += rc == 1;
    lost += rc == PW_ETOOBIG;
  }
  assert_int_equal(kept, PW_WRITEQ_MAX - 2);
  assert_int_equal(lost, 7);
  assert_int_equal(C.store_dropped, 7);
  /* state changes are kept even past the bound */
  pw_write ev = {.kind = PW_W_EVENT, .job = job, .text = "store", .text2 = "writes lost"};
  assert_int_equal(pw_write_do(&C, &ev, NULL), 1);
  pw_store_fault_inject(-1, 0);
  assert_int_equal(pw_write_flush(&C), 0);
  json_t *j = NULL;
  assert_int_equal(pw_store_job_json(s, job, 0, &j, &err), 0);
  assert_string_equal(json_string_value(json_object_get(j, "state")), "cancelled");
  json_decref(j);
  char sql[128];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM metrics WHERE job_id = %lld", (long long)job);
  assert_int_equal(raw_int(C.db_path, sql), PW_WRITEQ_MAX - 2);
  assert_int_equal(raw_int(C.db_path, "SELECT count(*) FROM events WHERE message = 'writes lost'"), 1);
  coord_off();
}

/* ---- migration ----------------------------------------------------------- */

/* Schema 1 as it shipped, with what a resumed run left: one row per step. */
static const char *V1 =
    "CREATE TABLE workers(id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, addr TEXT, cores INTEGER,"
    "  threads INTEGER, software TEXT, state TEXT, first_seen REAL, last_seen REAL);"
    "CREATE TABLE jobs(id INTEGER PRIMARY KEY, name TEXT, spec TEXT NOT NULL, state TEXT NOT NULL, status TEXT,"
    "  error TEXT, created REAL, started REAL, finished REAL, steps INTEGER, steps_done INTEGER DEFAULT 0,"
    "  loss REAL, tokens_per_s REAL, pp INTEGER, dp INTEGER, vstages INTEGER, microbatches INTEGER,"
    "  schedule TEXT, model TEXT, run INTEGER DEFAULT 0);"
    "CREATE INDEX jobs_state ON jobs(state);"
    "CREATE TABLE runs(id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL REFERENCES jobs(id), attempt INTEGER,"
    "  state TEXT, started REAL, finished REAL, error TEXT, plan TEXT);"
    "CREATE TABLE metrics(job_id INTEGER NOT NULL REFERENCES jobs(id), run_id INTEGER REFERENCES runs(id),"
    "  step INTEGER NOT NULL, loss REAL, step_time REAL, tokens REAL, tokens_per_s REAL,"
    "  grad_norm REAL, lr REAL, time REAL, PRIMARY KEY(job_id, step));"
    "CREATE TABLE events(id INTEGER PRIMARY KEY, job_id INTEGER REFERENCES jobs(id), time REAL, kind TEXT,"
    "  message TEXT);"
    "INSERT INTO jobs(id, name, spec, state, steps) VALUES(1, 'old', '{}', 'running', 4);"
    "INSERT INTO runs(id, job_id, attempt, state) VALUES(1, 1, 1, 'failed'), (2, 1, 2, 'running');"
    "INSERT INTO metrics(job_id, run_id, step, loss) VALUES(1, 1, 0, 4.0), (1, 1, 1, 3.0), (1, 2, 2, 2.5);"
    "PRAGMA user_version = 1;";

static void test_migration_1_to_2(void **state) {
  char path[512];
  snprintf(path, sizeof path, "%s/v1.db", g_dir);
  raw_exec(path, V1);
  pw_store *s = NULL;
  pw_err err = {0};
  assert_int_equal(pw_store_open(path, &s, &err), 0);
  assert_int_equal(pw_store_schema_version(s), PW_TEST_SCHEMA); /* 1 -> 2 -> ... -> 5 in one go */
  json_t *j = NULL;
  assert_int_equal(pw_store_metrics_json(s, 1, 0, &j, &err), 0);
  json_t *rows = json_object_get(j, "metrics");
  assert_int_equal(json_array_size(rows), 3);
  assert_true(json_real_value(json_object_get(json_array_get(rows, 1), "loss")) == 3.0);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(rows, 2), "run")), 2);
  json_decref(j);
  /* run 2 repeats step 1: run 1's row stays (the old key would replace it) */
  pw_metric m = {.step = 1, .loss = 2.75};
  assert_int_equal(pw_store_metric_insert(s, 1, 2, &m, &err), 0);
  assert_int_equal(pw_store_metrics_all_json(s, 1, 0, &j, &err), 0);
  assert_int_equal(json_array_size(json_object_get(j, "metrics")), 4);
  json_decref(j);
  assert_int_equal(pw_store_metrics_json(s, 1, 1, &j, &err), 0);
  rows = json_object_get(j, "metrics");
  assert_int_equal(json_array_size(rows), 2);
  assert_true(json_real_value(json_object_get(json_array_get(rows, 0), "loss")) == 2.75);
  json_decref(j);
  pw_store_close(s);
  assert_int_equal(raw_int(path, "PRAGMA user_version"), PW_TEST_SCHEMA);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM metrics WHERE step = 1"), 2);
}

static int setup(void **state) {
  snprintf(g_dir, sizeof g_dir, "/tmp/pw_store_faults_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  return 0;
}

static int teardown(void **state) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fault_injection),
      cmocka_unit_test(test_retry_keeps_order_and_reconciles),
      cmocka_unit_test(test_retry_refused_and_bounded),
      cmocka_unit_test(test_migration_1_to_2),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
