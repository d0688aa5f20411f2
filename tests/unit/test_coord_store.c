/* test_coord_store: the coordinator's SQLite store — migrations (fresh,
 * re-open, a newer file refused, a non-database refused), every function's
 * happy path and its errors, the job state machine (every pair of states),
 * list pagination, metric replacement, timeline and checkpoint selection,
 * crash recovery (pw_store_recover). Concurrency and kill -9 durability
 * are in test_coord_store_crash.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store.h"
#include "storetest.h"

#define SCHEMA PW_TEST_SCHEMA

/* ---- helpers --------------------------------------------------------------- */

static char g_dir[256];
static int g_seq;

static const char *SPEC = "{\"model\": {\"d_model\": 64, \"n_layers\": 4}, \"steps\": 10}";

static void db_path(char *buf, size_t cap) { snprintf(buf, cap, "%s/db%d.sqlite", g_dir, ++g_seq); }

static pw_store *open_new(char *path, size_t cap) {
  char local[512];
  if (!path) path = local, cap = sizeof local;
  db_path(path, cap);
  pw_store *s = NULL;
  pw_err err = {0};
  int rc = pw_store_open(path, &s, &err);
  if (rc) fail_msg("open %s: %s", path, err.msg);
  return s;
}

static void expect_err(const pw_err *err, const char *want) {
  char buf[600];
  pw_err_str(err, buf, sizeof buf);
  if (!strstr(buf, want)) fail_msg("error '%s' does not contain '%s'", buf, want);
}

static void raw_text(const char *path, const char *sql, char *out, size_t cap) {
  sqlite3 *db;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
  out[0] = 0;
  if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
    snprintf(out, cap, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
}

static int64_t new_job(pw_store *s, const char *name) {
  pw_job_new j = {.name = name, .spec = SPEC, .steps = 10, .pp = 4, .dp = 1, .virtual_stages = 1,
                  .microbatches = 8, .schedule = "1f1b", .model = "gpt d=64 L=4"};
  int64_t id = 0;
  pw_err err = {0};
  if (pw_store_job_insert(s, &j, &id, &err)) fail_msg("insert: %s", err.msg);
  assert_true(id > 0);
  return id;
}

static void set_state_ok(pw_store *s, int64_t id, int state) {
  pw_err err = {0};
  if (pw_store_job_set_state(s, id, state, "test", NULL, &err)) fail_msg("set_state: %s", err.msg);
}

static int64_t n_events(pw_store *s, int64_t job) {
  json_t *ev;
  assert_int_equal(pw_store_events_json(s, job, 0, &ev, NULL), 0);
  int64_t n = (int64_t)json_array_size(json_object_get(ev, "events"));
  json_decref(ev);
  return n;
}

/* ---- open, migrations ---------------------------------------------------- */

static void test_state_names(void **state) {
  for (int i = 0; i < PW_JOB__N; i++) assert_int_equal(pw_job_state_parse(pw_job_state_name(i)), i);
  assert_string_equal(pw_job_state_name(PW_JOB_DISPATCHING), "dispatching");
  assert_int_equal(pw_job_state_parse("bogus"), -1);
  assert_int_equal(pw_job_state_parse(NULL), -1);
  assert_false(pw_job_state_terminal(PW_JOB_RUNNING));
  assert_false(pw_job_state_terminal(PW_JOB_QUEUED));
  assert_true(pw_job_state_terminal(PW_JOB_SUCCEEDED));
  assert_true(pw_job_state_terminal(PW_JOB_FAILED));
  assert_true(pw_job_state_terminal(PW_JOB_CANCELLED));
}

static void test_open_fresh_and_reopen(void **state) {
  char path[512];
  pw_store *s = open_new(path, sizeof path);
  assert_int_equal(pw_store_schema_version(s), SCHEMA);
  int64_t id = new_job(s, "a");
  pw_store_close(s);

  char mode[32];
  raw_text(path, "PRAGMA journal_mode", mode, sizeof mode);
  assert_string_equal(mode, "wal");
  const char *tables[] = {"workers", "jobs",    "runs",        "stages", "assignments",
                          "actions", "metrics", "checkpoints", "events", "timings"};
  for (size_t i = 0; i < sizeof tables / sizeof *tables; i++) {
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='%s'", tables[i]);
    if (raw_int(path, sql) != 1) fail_msg("table %s missing", tables[i]);
  }
  assert_int_equal(raw_int(path, "SELECT count(*) FROM sqlite_master WHERE type='index' AND name='jobs_state'"), 1);

  /* re-open: no migration re-runs, data intact */
  pw_err err = {0};
  assert_int_equal(pw_store_open(path, &s, &err), 0);
  assert_int_equal(pw_store_schema_version(s), SCHEMA);
  json_t *j;
  assert_int_equal(pw_store_job_json(s, id, 0, &j, NULL), 0);
  assert_string_equal(jstr(j, "name"), "a");
  json_decref(j);
  /* foreign keys are on for this connection */
  assert_int_equal(pw_store_event(s, 999, "x", "y", &err), PW_ENOENT);
  pw_store_close(s);
  assert_int_equal(raw_int(path, "PRAGMA user_version"), SCHEMA);
}

static void test_open_newer_refused(void **state) {
  char path[512];
  pw_store *s = open_new(path, sizeof path);
  pw_store_close(s);
  raw_exec(path, "PRAGMA user_version = 8");
  pw_err err = {0};
  s = (pw_store *)1;
  assert_int_equal(pw_store_open(path, &s, &err), PW_ENOTSUP);
  assert_null(s);
  expect_err(&err, "version 8 is newer");
  expect_err(&err, "(7)");
  /* refused before touching anything: the file keeps its version */
  assert_int_equal(raw_int(path, "PRAGMA user_version"), 8);
}

static void test_open_errors(void **state) {
  char path[512];
  db_path(path, sizeof path);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 100; i++) fputs("this is not a database, just some text\n", f);
  fclose(f);
  pw_store *s = NULL;
  pw_err err = {0};
  assert_int_equal(pw_store_open(path, &s, &err), PW_EFORMAT);
  assert_null(s);
  expect_err(&err, "not a SQLite database");
  expect_err(&err, path);

  snprintf(path, sizeof path, "%s/no/such/dir/db.sqlite", g_dir);
  assert_int_equal(pw_store_open(path, &s, &err), PW_EIO);
  expect_err(&err, "cannot open");
  assert_int_equal(pw_store_open("", &s, &err), PW_EINVAL);

  /* an empty file is an empty database */
  db_path(path, sizeof path);
  f = fopen(path, "w");
  fclose(f);
  assert_int_equal(pw_store_open(path, &s, &err), 0);
  assert_int_equal(pw_store_schema_version(s), SCHEMA);
  pw_store_close(s);
}

/* ---- workers ------------------------------------------------------------- */

static void test_workers(void **state) {
  char path[512];
  pw_store *s = open_new(path, sizeof path);
  pw_err err = {0};
  int64_t a = 0, b = 0, a2 = 0;
  assert_int_equal(pw_store_worker_register(s, "w0", "127.0.0.1:7000", 8, 4, "pw 0.1", &a, &err), 0);
  assert_int_equal(pw_store_worker_register(s, "w1", "127.0.0.1:7001", 8, 4, "pw 0.1", &b, &err), 0);
  assert_true(a > 0 && b > 0 && a != b);
  double first = (double)raw_int(path, "SELECT CAST(first_seen AS INTEGER) FROM workers WHERE name='w0'");
  /* re-register: same id, fields updated, first_seen kept */
  assert_int_equal(pw_store_worker_register(s, "w0", "127.0.0.1:7100", 16, 2, "pw 0.2", &a2, &err), 0);
  assert_int_equal(a2, a);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM workers"), 2);
  assert_int_equal(raw_int(path, "SELECT cores FROM workers WHERE name='w0'"), 16);
  char txt[128];
  raw_text(path, "SELECT addr || ' ' || software FROM workers WHERE name='w0'", txt, sizeof txt);
  assert_string_equal(txt, "127.0.0.1:7100 pw 0.2");
  assert_true((double)raw_int(path, "SELECT CAST(first_seen AS INTEGER) FROM workers WHERE name='w0'") == first);

  assert_int_equal(pw_store_worker_seen(s, b, "busy", &err), 0);
  raw_text(path, "SELECT state FROM workers WHERE name='w1'", txt, sizeof txt);
  assert_string_equal(txt, "busy");
  assert_int_equal(pw_store_worker_seen(s, b, NULL, &err), 0); /* NULL keeps the state */
  raw_text(path, "SELECT state FROM workers WHERE name='w1'", txt, sizeof txt);
  assert_string_equal(txt, "busy");
  assert_int_equal(pw_store_worker_seen(s, 12345, "idle", &err), PW_ENOENT);
  expect_err(&err, "12345");
  assert_int_equal(pw_store_worker_register(s, "", "x", 1, 1, "x", &a, &err), PW_EINVAL);
  assert_int_equal(pw_store_worker_register(s, NULL, "x", 1, 1, "x", &a, &err), PW_EINVAL);
  pw_store_close(s);
}

/* ---- jobs ---------------------------------------------------------------- */

static void test_job_insert_and_json(void **state) {
  pw_store *s = open_new(NULL, 0);
  pw_err err = {0};
  double t0 = pw_store_now();
  int64_t id = new_job(s, "first");
  json_t *j = NULL;
  assert_int_equal(pw_store_job_json(s, id, 0, &j, &err), 0);
  assert_int_equal(jint(j, "id"), id);
  assert_string_equal(jstr(j, "name"), "first");
  assert_string_equal(jstr(j, "state"), "queued");
  assert_string_equal(jstr(j, "model"), "gpt d=64 L=4");
  assert_string_equal(jstr(j, "schedule"), "1f1b");
  json_t *mesh = json_object_get(j, "mesh");
  assert_int_equal(jint(mesh, "pp"), 4);
  assert_int_equal(jint(mesh, "dp"), 1);
  assert_int_equal(jint(mesh, "virtual_stages"), 1);
  assert_int_equal(jint(j, "microbatches"), 8);
  json_t *prog = json_object_get(j, "progress");
  assert_int_equal(jint(prog, "step"), 0);
  assert_int_equal(jint(prog, "total"), 10);
  double created = jnum(j, "created");
  assert_true(created >= t0 - 1 && created <= pw_store_now() + 1);
  jnull(j, "status");
  jnull(j, "error");
  jnull(j, "loss");
  jnull(j, "tokens_per_s");
  jnull(j, "started");
  jnull(j, "finished");
  assert_int_equal(jint(j, "run"), 0);
  assert_null(json_object_get(j, "spec"));
  json_decref(j);

  /* with_spec: the spec as an object, not a string */
  assert_int_equal(pw_store_job_json(s, id, 1, &j, &err), 0);
  json_t *spec = json_object_get(j, "spec");
  assert_true(json_is_object(spec));
  assert_int_equal(jint(json_object_get(spec, "model"), "d_model"), 64);
  json_decref(j);

  /* the "queued" event came with it */
  json_t *ev;
  assert_int_equal(pw_store_events_json(s, id, 0, &ev, &err), 0);
  json_t *evs = json_object_get(ev, "events");
  assert_int_equal(json_array_size(evs), 1);
  assert_string_equal(jstr(json_array_get(evs, 0), "kind"), "state");
  assert_string_equal(jstr(json_array_get(evs, 0), "message"), "queued");
  json_decref(ev);

  /* NULL optional fields stay null */
  pw_job_new bare = {.spec = "{}"};
  int64_t id2;
  assert_int_equal(pw_store_job_insert(s, &bare, &id2, &err), 0);
  assert_int_equal(id2, id + 1);
  assert_int_equal(pw_store_job_json(s, id2, 0, &j, &err), 0);
  jnull(j, "name");
  jnull(j, "model");
  jnull(j, "schedule");
  json_decref(j);

  /* errors */
  j = (json_t *)1;
  assert_int_equal(pw_store_job_json(s, 999, 0, &j, &err), PW_ENOENT);
  assert_null(j);
  expect_err(&err, "job 999 not found");
  pw_job_new bad = {.spec = "{not json"};
  assert_int_equal(pw_store_job_insert(s, &bad, &id2, &err), PW_EINVAL);
  bad.spec = "[1, 2]";
  assert_int_equal(pw_store_job_insert(s, &bad, &id2, &err), PW_EINVAL);
  bad.spec = NULL;
  assert_int_equal(pw_store_job_insert(s, &bad, &id2, &err), PW_EINVAL);
  int64_t *ids;
  int n;
  assert_int_equal(pw_store_jobs_in_state(s, PW_JOB_QUEUED, &ids, &n, &err), 0);
  assert_int_equal(n, 2); /* refused inserts left nothing behind */
  free(ids);
  pw_store_close(s);
}

/* The lifecycle as the brief states it, written out independently of
 * the implementation: allowed[from][to]. */
static const int allowed[PW_JOB__N][PW_JOB__N] = {
    /*              Q  P  D  R  S  F  C */
    /* queued */ {0, 1, 0, 0, 0, 1, 1},
    /* planning */ {1, 0, 1, 0, 0, 1, 1},
    /* dispatching */ {1, 0, 0, 1, 0, 1, 1},
    /* running */ {1, 0, 0, 0, 1, 1, 1},
    /* succeeded */ {0, 0, 0, 0, 0, 0, 0},
    /* failed */ {0, 0, 0, 0, 0, 0, 0},
    /* cancelled */ {0, 0, 0, 0, 0, 0, 0},
};

static void drive_to(pw_store *s, int64_t id, int target) {
  static const int paths[PW_JOB__N][5] = {
      {-1},
      {PW_JOB_PLANNING, -1},
      {PW_JOB_PLANNING, PW_JOB_DISPATCHING, -1},
      {PW_JOB_PLANNING, PW_JOB_DISPATCHING, PW_JOB_RUNNING, -1},
      {PW_JOB_PLANNING, PW_JOB_DISPATCHING, PW_JOB_RUNNING, PW_JOB_SUCCEEDED, -1},
      {PW_JOB_FAILED, -1},
      {PW_JOB_CANCELLED, -1},
  };
  for (int i = 0; paths[target][i] >= 0; i++) set_state_ok(s, id, paths[target][i]);
}

static void test_state_machine(void **state) {
  pw_store *s = open_new(NULL, 0);
  pw_err err = {0};
  for (int from = 0; from < PW_JOB__N; from++) {
    for (int to = 0; to < PW_JOB__N; to++) {
      int64_t id = new_job(s, "sm");
      drive_to(s, id, from);
      int64_t ev0 = n_events(s, id);
      memset(&err, 0, sizeof err);
      int rc = pw_store_job_set_state(s, id, to, "why not", NULL, &err);
      pw_job_brief b;
      assert_int_equal(pw_store_job_brief(s, id, &b, NULL), 0);
      free(b.spec);
      if (allowed[from][to]) {
        if (rc) fail_msg("%s -> %s refused: %s", pw_job_state_name(from), pw_job_state_name(to), err.msg);
        assert_int_equal(b.state, to);
        assert_int_equal(n_events(s, id), ev0 + 1);
        json_t *ev;
        assert_int_equal(pw_store_events_json(s, id, 0, &ev, NULL), 0);
        json_t *last = json_array_get(json_object_get(ev, "events"), (size_t)ev0);
        char want[128];
        snprintf(want, sizeof want, "%s -> %s: why not", pw_job_state_name(from), pw_job_state_name(to));
        assert_string_equal(jstr(last, "message"), want);
        assert_string_equal(jstr(last, "kind"), "state");
        json_decref(ev);
      } else {
        if (rc != PW_ECONFLICT)
          fail_msg("%s -> %s: rc %d, want PW_ECONFLICT", pw_job_state_name(from), pw_job_state_name(to), rc);
        expect_err(&err, pw_job_state_name(from));
        expect_err(&err, pw_job_state_name(to));
        assert_int_equal(b.state, from);
        assert_int_equal(n_events(s, id), ev0);
      }
    }
  }

  /* stamps: started on running (kept across a retry), finished on a terminal state */
  int64_t id = new_job(s, "stamps");
  json_t *j;
  drive_to(s, id, PW_JOB_DISPATCHING);
  assert_int_equal(pw_store_job_json(s, id, 0, &j, NULL), 0);
  jnull(j, "started");
  json_decref(j);
  set_state_ok(s, id, PW_JOB_RUNNING);
  assert_int_equal(pw_store_job_json(s, id, 0, &j, NULL), 0);
  double started = jnum(j, "started");
  assert_true(started > 0);
  jnull(j, "finished");
  json_decref(j);
  assert_int_equal(pw_store_job_set_state(s, id, PW_JOB_QUEUED, "retry", "first attempt died", &err), 0);
  assert_int_equal(pw_store_job_json(s, id, 0, &j, NULL), 0);
  assert_string_equal(jstr(j, "error"), "first attempt died");
  jnull(j, "finished");
  json_decref(j);
  drive_to(s, id, PW_JOB_RUNNING);
  assert_int_equal(pw_store_job_set_state(s, id, PW_JOB_FAILED, NULL, NULL, &err), 0);
  assert_int_equal(pw_store_job_json(s, id, 0, &j, NULL), 0);
  assert_true(jnum(j, "started") == started);
  assert_true(jnum(j, "finished") >= started);
  assert_string_equal(jstr(j, "error"), "first attempt died"); /* NULL keeps the error */
  assert_string_equal(jstr(j, "state"), "failed");
  json_decref(j);
  json_t *ev;
  assert_int_equal(pw_store_events_json(s, id, 0, &ev, NULL), 0);
  json_t *evs = json_object_get(ev, "events");
  /* no reason: the bare transition */
  assert_string_equal(jstr(json_array_get(evs, json_array_size(evs) - 1), "message"), "running -> failed");
  json_decref(ev);

  id = new_job(s, "err");
  assert_int_equal(pw_store_job_set_state(s, id, PW_JOB_FAILED, "no workers", "needs 4 workers", &err), 0);
  assert_int_equal(pw_store_job_json(s, id, 0, &j, NULL), 0);
  assert_string_equal(jstr(j, "error"), "needs 4 workers");
  assert_true(jnum(j, "finished") > 0);
  jnull(j, "started");
  json_decref(j);

  assert_int_equal(pw_store_job_set_state(s, 4242, PW_JOB_PLANNING, "x", NULL, &err), PW_ENOENT);
  assert_int_equal(pw_store_job_set_state(s, id, PW_JOB__N, "x", NULL, &err), PW_EINVAL);
  assert_int_equal(pw_store_job_set_state(s, id, -1, "x", NULL, &err), PW_EINVAL);
  pw_store_close(s);
}

static void test_status_progress_brief(void **state) {
  pw_store *s = open_new(NULL, 0);
  pw_err err = {0};
  int64_t a = new_job(s, "a"), b = new_job(s, "b"), c = new_job(s, "c");
  assert_int_equal(pw_store_job_set_status(s, a, "waiting for 4 idle workers (2 idle)", &err), 0);
  assert_int_equal(pw_store_job_progress(s, a, 3, 2.5, 1234.5, &err), 0);
  json_t *j;
  assert_int_equal(pw_store_job_json(s, a, 0, &j, &err), 0);
  assert_string_equal(jstr(j, "status"), "waiting for 4 idle workers (2 idle)");
  assert_int_equal(jint(json_object_get(j, "progress"), "step"), 3);
  assert_true(jnum(j, "loss") == 2.5);
  assert_true(jnum(j, "tokens_per_s") == 1234.5);
  json_decref(j);
  /* a NaN loss is stored as NULL and shown as null */
  assert_int_equal(pw_store_job_progress(s, a, 4, NAN, INFINITY, &err), 0);
  assert_int_equal(pw_store_job_json(s, a, 0, &j, &err), 0);
  jnull(j, "loss");
  jnull(j, "tokens_per_s");
  json_decref(j);
  assert_int_equal(pw_store_job_set_status(s, 77, "x", &err), PW_ENOENT);
  assert_int_equal(pw_store_job_progress(s, 77, 1, 1, 1, &err), PW_ENOENT);

  pw_job_brief br;
  assert_int_equal(pw_store_job_brief(s, a, &br, &err), 0);
  assert_int_equal(br.id, a);
  assert_int_equal(br.state, PW_JOB_QUEUED);
  assert_int_equal(br.steps, 10);
  assert_int_equal(br.steps_done, 4);
  assert_int_equal(br.run, 0);
  assert_string_equal(br.spec, SPEC);
  free(br.spec);
  assert_int_equal(pw_store_job_brief(s, 77, &br, &err), PW_ENOENT);
  assert_null(br.spec);

  set_state_ok(s, b, PW_JOB_PLANNING);
  int64_t *ids;
  int n;
  assert_int_equal(pw_store_jobs_in_state(s, PW_JOB_QUEUED, &ids, &n, &err), 0);
  assert_int_equal(n, 2);
  assert_int_equal(ids[0], a); /* oldest first */
  assert_int_equal(ids[1], c);
  free(ids);
  assert_int_equal(pw_store_jobs_in_state(s, PW_JOB_PLANNING, &ids, &n, &err), 0);
  assert_int_equal(n, 1);
  assert_int_equal(ids[0], b);
  free(ids);
  assert_int_equal(pw_store_jobs_in_state(s, PW_JOB_RUNNING, &ids, &n, &err), 0);
  assert_int_equal(n, 0);
  free(ids);
  assert_int_equal(pw_store_jobs_in_state(s, 99, &ids, &n, &err), PW_EINVAL);
  pw_store_close(s);
}

static void test_list(void **state) {
  pw_store *s = open_new(NULL, 0);
  pw_err err = {0};
  int64_t ids[25];
  for (int i = 0; i < 25; i++) {
    char name[16];
    snprintf(name, sizeof name, "job%d", i);
    ids[i] = new_job(s, name);
    if (i % 3 == 0) set_state_ok(s, ids[i], PW_JOB_CANCELLED); /* 0,3,...,24: 9 jobs */
  }
  json_t *l;
  assert_int_equal(pw_store_jobs_json(s, -1, 10, 0, &l, &err), 0);
  assert_int_equal(jint(l, "total"), 25);
  assert_int_equal(jint(l, "limit"), 10);
  assert_int_equal(jint(l, "offset"), 0);
  json_t *jobs = json_object_get(l, "jobs");
  assert_int_equal(json_array_size(jobs), 10);
  for (int i = 0; i < 10; i++) assert_int_equal(jint(json_array_get(jobs, (size_t)i), "id"), ids[24 - i]);
  assert_null(json_object_get(json_array_get(jobs, 0), "spec")); /* lists carry no spec */
  assert_string_equal(jstr(json_array_get(jobs, 1), "name"), "job23");
  json_decref(l);

  assert_int_equal(pw_store_jobs_json(s, -1, 10, 20, &l, &err), 0);
  jobs = json_object_get(l, "jobs");
  assert_int_equal(json_array_size(jobs), 5);
  assert_int_equal(jint(json_array_get(jobs, 4), "id"), ids[0]);
  assert_int_equal(jint(l, "offset"), 20);
  json_decref(l);

  assert_int_equal(pw_store_jobs_json(s, PW_JOB_CANCELLED, 4, 2, &l, &err), 0);
  assert_int_equal(jint(l, "total"), 9);
  jobs = json_object_get(l, "jobs");
  assert_int_equal(json_array_size(jobs), 4);
  assert_int_equal(jint(json_array_get(jobs, 0), "id"), ids[18]);
  for (size_t i = 0; i < 4; i++) assert_string_equal(jstr(json_array_get(jobs, i), "state"), "cancelled");
  json_decref(l);

  assert_int_equal(pw_store_jobs_json(s, PW_JOB_QUEUED, 100, 0, &l, &err), 0);
  assert_int_equal(jint(l, "total"), 16);
  assert_int_equal(json_array_size(json_object_get(l, "jobs")), 16);
  json_decref(l);
  assert_int_equal(pw_store_jobs_json(s, PW_JOB_RUNNING, 10, 0, &l, &err), 0);
  assert_int_equal(jint(l, "total"), 0);
  assert_int_equal(json_array_size(json_object_get(l, "jobs")), 0);
  json_decref(l);
  assert_int_equal(pw_store_jobs_json(s, -1, 0, 0, &l, &err), 0); /* limit 0: just the total */
  assert_int_equal(jint(l, "total"), 25);
  assert_int_equal(json_array_size(json_object_get(l, "jobs")), 0);
  json_decref(l);
  assert_int_equal(pw_store_jobs_json(s, -1, 10, 100, &l, &err), 0);
  assert_int_equal(json_array_size(json_object_get(l, "jobs")), 0);
  json_decref(l);

  assert_int_equal(pw_store_jobs_json(s, -1, -1, 0, &l, &err), PW_EINVAL);
  assert_int_equal(pw_store_jobs_json(s, -1, 10, -1, &l, &err), PW_EINVAL);
  assert_int_equal(pw_store_jobs_json(s, 7, 10, 0, &l, &err), PW_EINVAL);
  assert_int_equal(pw_store_jobs_json(s, -2, 10, 0, &l, &err), PW_EINVAL);
  pw_store_close(s);
}

/* ---- runs ---------------------------------------------------------------- */

static void test_runs(void **state) {
  char path[512];
  pw_store *s = open_new(path, sizeof path);
  pw_err err = {0};
  int64_t job = new_job(s, "r"), other = new_job(s, "o");
  json_t *r;
  assert_int_equal(pw_store_run_json(s, job, &r, &err), PW_ENOENT); /* no run yet */
  expect_err(&err, "no run");
  assert_int_equal(pw_store_run_json(s, 555, &r, &err), PW_ENOENT);
  expect_err(&err, "job 555 not found");

  int64_t r1, r2, ro;
  assert_int_equal(pw_store_run_insert(s, job, "{\"pp\": 2}", &r1, &err), 0);
  assert_int_equal(pw_store_run_insert(s, other, NULL, &ro, &err), 0);
  assert_int_equal(pw_store_run_finish(s, r1, "failed", "worker w1 lost", &err), 0);
  assert_int_equal(pw_store_run_insert(s, job, "{\"pp\": 2}", &r2, &err), 0);
  assert_true(r1 != r2);
  assert_int_equal(raw_int(path, "SELECT attempt FROM runs WHERE id = (SELECT run FROM jobs WHERE name='r')"), 2);
  assert_int_equal(raw_int(path, "SELECT attempt FROM runs WHERE job_id = (SELECT id FROM jobs WHERE name='o')"), 1);
  pw_job_brief b;
  assert_int_equal(pw_store_job_brief(s, job, &b, &err), 0);
  assert_int_equal(b.run, r2);
  free(b.spec);
  char txt[128];
  raw_text(path, "SELECT state || '/' || error FROM runs WHERE attempt = 1 AND job_id = 1", txt, sizeof txt);
  assert_string_equal(txt, "failed/worker w1 lost");
  assert_int_equal(raw_int(path, "SELECT finished IS NOT NULL FROM runs WHERE attempt = 1 AND job_id = 1"), 1);

  /* the partition and the schedule, inserted out of order */
  assert_int_equal(pw_store_stage_insert(s, r2, 1, 1, "[\"h.2\", \"h.3\", \"ln_f\"]", 2000, 3.5e9, &err), 0);
  assert_int_equal(pw_store_stage_insert(s, r2, 0, 0, "[\"wte\", \"h.0\", \"h.1\"]", 3000, 4.5e9, &err), 0);
  assert_int_equal(pw_store_assignment_insert(s, r2, 1, 7, "w7", &err), 0);
  assert_int_equal(pw_store_assignment_insert(s, r2, 0, 3, "w3", &err), 0);
  assert_int_equal(pw_store_actions_insert(s, r2, 0, "F0@s0 F1@s0 B0@s0 B1@s0", &err), 0);
  assert_int_equal(pw_store_actions_insert(s, r2, 1, "F0@s1 B0@s1 F1@s1 B1@s1", &err), 0);
  /* stale rows of the earlier run stay out of the view */
  assert_int_equal(pw_store_stage_insert(s, r1, 0, 0, "[\"wte\"]", 1, 1, &err), 0);
  assert_int_equal(pw_store_assignment_insert(s, r1, 5, 9, "w9", &err), 0);

  assert_int_equal(pw_store_run_json(s, job, &r, &err), 0);
  assert_int_equal(jint(r, "run"), r2);
  assert_int_equal(jint(r, "attempt"), 2);
  assert_string_equal(jstr(r, "state"), "running");
  json_t *stages = json_object_get(r, "stages");
  assert_int_equal(json_array_size(stages), 2);
  json_t *g0 = json_array_get(stages, 0);
  assert_int_equal(jint(g0, "stage"), 0);
  assert_int_equal(jint(g0, "rank"), 0);
  assert_int_equal(jint(g0, "params"), 3000);
  assert_true(jnum(g0, "flops") == 4.5e9);
  json_t *layers = json_object_get(g0, "layers");
  assert_true(json_is_array(layers));
  assert_int_equal(json_array_size(layers), 3);
  assert_string_equal(json_string_value(json_array_get(layers, 0)), "wte");
  json_t *ranks = json_object_get(r, "ranks");
  assert_int_equal(json_array_size(ranks), 2);
  json_t *k1 = json_array_get(ranks, 1);
  assert_int_equal(jint(k1, "rank"), 1);
  assert_string_equal(jstr(k1, "worker"), "w7");
  assert_string_equal(jstr(k1, "actions"), "F0@s1 B0@s1 F1@s1 B1@s1");
  json_decref(r);

  /* a rank with actions but no worker yet: worker null */
  int64_t r3;
  assert_int_equal(pw_store_run_insert(s, other, NULL, &r3, &err), 0);
  assert_int_equal(pw_store_actions_insert(s, r3, 0, "F0@s0", &err), 0);
  assert_int_equal(pw_store_run_json(s, other, &r, &err), 0);
  assert_int_equal(jint(r, "attempt"), 2);
  assert_int_equal(json_array_size(json_object_get(r, "stages")), 0);
  jnull(json_array_get(json_object_get(r, "ranks"), 0), "worker");
  json_decref(r);

  /* errors */
  assert_int_equal(pw_store_run_insert(s, 999, NULL, &r3, &err), PW_ENOENT);
  assert_int_equal(pw_store_run_finish(s, 999, "failed", NULL, &err), PW_ENOENT);
  assert_int_equal(pw_store_run_finish(s, r2, NULL, NULL, &err), PW_EINVAL);
  assert_int_equal(pw_store_stage_insert(s, 999, 0, 0, "[]", 0, 0, &err), PW_ENOENT);
  assert_int_equal(pw_store_stage_insert(s, r2, 0, 0, "[]", 0, 0, &err), PW_ECONFLICT);
  assert_int_equal(pw_store_stage_insert(s, r2, 2, 2, "{\"not\": \"an array\"}", 0, 0, &err), PW_EINVAL);
  assert_int_equal(pw_store_stage_insert(s, r2, 2, 2, "[", 0, 0, &err), PW_EINVAL);
  assert_int_equal(pw_store_assignment_insert(s, 999, 0, 1, "w", &err), PW_ENOENT);
  assert_int_equal(pw_store_assignment_insert(s, r2, 0, 1, "w", &err), PW_ECONFLICT);
  assert_int_equal(pw_store_actions_insert(s, 999, 0, "F0@s0", &err), PW_ENOENT);
  assert_int_equal(pw_store_actions_insert(s, r2, 0, "F0@s0", &err), PW_ECONFLICT);
  assert_int_equal(pw_store_actions_insert(s, r2, 3, NULL, &err), PW_EINVAL);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM runs"), 4); /* the refused insert left nothing */
  pw_store_close(s);
}

/* ---- metrics, timings, checkpoints, events ------------------------------- */

static void test_metrics(void **state) {
  char path[512];
  pw_store *s = open_new(path, sizeof path);
  pw_err err = {0};
  int64_t job = new_job(s, "m"), run1, run2;
  assert_int_equal(pw_store_run_insert(s, job, NULL, &run1, &err), 0);
  assert_int_equal(pw_store_run_insert(s, job, NULL, &run2, &err), 0);
  json_t *m;
  assert_int_equal(pw_store_metrics_json(s, job, 0, &m, &err), 0);
  assert_int_equal(json_array_size(json_object_get(m, "metrics")), 0);
  json_decref(m);
  for (int i = 4; i >= 0; i--) { /* out of order */
    pw_metric x = {.step = i, .loss = 5.0 - i, .step_time = 0.1, .tokens = 512, .tokens_per_s = 5120,
                   .grad_norm = 1.5, .lr = 1e-3};
    assert_int_equal(pw_store_metric_insert(s, job, run1, &x, &err), 0);
  }
  /* the later run redoes step 2 */
  pw_metric redo = {.step = 2, .loss = 0.25, .step_time = 0.2, .tokens = 512, .tokens_per_s = 2560,
                    .grad_norm = NAN, .lr = 1e-3};
  assert_int_equal(pw_store_metric_insert(s, job, run2, &redo, &err), 0);
  assert_int_equal(pw_store_metrics_json(s, job, 2, &m, &err), 0);
  json_t *arr = json_object_get(m, "metrics");
  assert_int_equal(json_array_size(arr), 3);
  for (int i = 0; i < 3; i++) assert_int_equal(jint(json_array_get(arr, (size_t)i), "step"), 2 + i);
  json_t *m2 = json_array_get(arr, 0);
  assert_true(jnum(m2, "loss") == 0.25);
  assert_true(jnum(m2, "step_time") == 0.2);
  assert_true(jnum(m2, "tokens_per_s") == 2560);
  jnull(m2, "grad_norm");
  assert_true(jnum(m2, "time") > 0);
  json_t *m4 = json_array_get(arr, 2);
  assert_true(jnum(m4, "loss") == 1.0);
  assert_true(jnum(m4, "lr") == 1e-3);
  assert_true(jnum(m4, "tokens") == 512);
  json_decref(m);
  assert_int_equal(pw_store_metrics_json(s, job, 0, &m, &err), 0);
  assert_int_equal(json_array_size(json_object_get(m, "metrics")), 5);
  assert_int_equal(jint(json_array_get(json_object_get(m, "metrics"), 2), "run"), run2);
  assert_int_equal(jint(json_array_get(json_object_get(m, "metrics"), 3), "run"), run1);
  json_decref(m);
  /* every attempt is kept: run 1's step 2 is still there, before run 2's */
  assert_int_equal(pw_store_metrics_all_json(s, job, 0, &m, &err), 0);
  arr = json_object_get(m, "metrics");
  assert_int_equal(json_array_size(arr), 6);
  assert_int_equal(jint(json_array_get(arr, 2), "step"), 2);
  assert_int_equal(jint(json_array_get(arr, 2), "run"), run1);
  assert_true(jnum(json_array_get(arr, 2), "loss") == 3.0);
  assert_int_equal(jint(json_array_get(arr, 3), "step"), 2);
  assert_int_equal(jint(json_array_get(arr, 3), "run"), run2);
  json_decref(m);
  /* the same (run, step) written again (a retried write) replaces its row */
  assert_int_equal(pw_store_metric_insert(s, job, run2, &redo, &err), 0);
  assert_int_equal(pw_store_metrics_all_json(s, job, 0, &m, &err), 0);
  assert_int_equal(json_array_size(json_object_get(m, "metrics")), 6);
  json_decref(m);
  /* a diverged step: NaN is stored as NULL and shown as null, never 0 */
  pw_metric nan_step = {.step = 5, .loss = NAN, .step_time = 0.1, .grad_norm = INFINITY * 0, .lr = 1e-3};
  assert_int_equal(pw_store_metric_insert(s, job, run2, &nan_step, &err), 0);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM metrics WHERE step = 5 AND loss IS NULL AND grad_norm IS NULL"), 1);
  assert_int_equal(pw_store_metrics_json(s, job, 5, &m, &err), 0);
  jnull(json_array_get(json_object_get(m, "metrics"), 0), "loss");
  jnull(json_array_get(json_object_get(m, "metrics"), 0), "grad_norm");
  json_decref(m);
  assert_int_equal(pw_store_metrics_json(s, job, 100, &m, &err), 0);
  assert_int_equal(json_array_size(json_object_get(m, "metrics")), 0);
  json_decref(m);

  int64_t counts[PW_JOB__N], steps;
  double tokens;
  assert_int_equal(pw_store_totals(s, counts, &steps, &tokens, &err), 0);
  assert_int_equal(steps, 7); /* every attempt's steps were trained */
  assert_true(tokens == 6 * 512);
  assert_int_equal(counts[PW_JOB_QUEUED], 1);
  assert_int_equal(counts[PW_JOB_RUNNING], 0);

  pw_metric x = {.step = 1};
  assert_int_equal(pw_store_metric_insert(s, 999, run1, &x, &err), PW_ENOENT);
  assert_int_equal(pw_store_metric_insert(s, job, 999, &x, &err), PW_ENOENT);
  assert_int_equal(pw_store_metrics_json(s, 999, 0, &m, &err), PW_ENOENT);
  pw_store_close(s);
}

/* train.eval_every: a row's eval_loss (null when the step did not
 * evaluate), the job's latest, and migration 5 -> 6 leaving older rows
 * null. */
static void test_eval_loss(void **state) {
  char path[512];
  pw_store *s = open_new(path, sizeof path);
  pw_err err = {0};
  int64_t job = new_job(s, "e"), run;
  assert_int_equal(pw_store_run_insert(s, job, NULL, &run, &err), 0);
  pw_metric old = {.step = 0, .loss = 3, .eval_loss = NAN};
  assert_int_equal(pw_store_metric_insert(s, job, run, &old, &err), 0);
  pw_store_close(s);
  raw_exec(path, PW_TEST_BACK_TO_5);
  assert_int_equal(pw_store_open(path, &s, &err), 0);
  assert_int_equal(pw_store_schema_version(s), PW_TEST_SCHEMA);
  for (int k = 1; k < 4; k++) {
    pw_metric m = {.step = k, .loss = 3 - k, .eval_loss = k == 2 ? 2.75 : NAN};
    assert_int_equal(pw_store_metric_insert(s, job, run, &m, &err), 0);
  }
  json_t *m, *j;
  assert_int_equal(pw_store_metrics_json(s, job, 0, &m, &err), 0);
  json_t *arr = json_object_get(m, "metrics");
  assert_int_equal(json_array_size(arr), 4);
  for (int k = 0; k < 4; k++) {
    json_t *row = json_array_get(arr, (size_t)k);
    if (k == 2) assert_true(jnum(row, "eval_loss") == 2.75);
    else jnull(row, "eval_loss"); /* the migrated row too: null, never 0 */
  }
  json_decref(m);
  /* the job's latest: kept by progress without one (NaN), replaced by a new one */
  assert_int_equal(pw_store_job_json(s, job, 0, &j, &err), 0);
  jnull(j, "eval_loss");
  json_decref(j);
  assert_int_equal(pw_store_job_eval_loss(s, job, 2.75, &err), 0);
  assert_int_equal(pw_store_job_progress(s, job, 4, 1.0, 10, &err), 0);
  assert_int_equal(pw_store_job_json(s, job, 0, &j, &err), 0);
  assert_true(jnum(j, "eval_loss") == 2.75);
  json_decref(j);
  assert_int_equal(pw_store_job_eval_loss(s, job, 1.5, &err), 0);
  assert_int_equal(pw_store_job_json(s, job, 0, &j, &err), 0);
  assert_true(jnum(j, "eval_loss") == 1.5);
  json_decref(j);
  assert_int_equal(pw_store_job_eval_loss(s, 999, 1, &err), PW_ENOENT);
  pw_store_close(s);
}

static void test_timeline(void **state) {
  pw_store *s = open_new(NULL, 0);
  pw_err err = {0};
  int64_t job = new_job(s, "t"), run;
  assert_int_equal(pw_store_run_insert(s, job, NULL, &run, &err), 0);
  json_t *t;
  assert_int_equal(pw_store_timeline_json(s, job, -1, &t, &err), PW_ENOENT); /* none sampled */
  assert_int_equal(pw_store_timing_insert(s, job, run, 10, 1, "[[\"F\", 0, 1, 0.5, 0.75]]", &err), 0);
  assert_int_equal(pw_store_timing_insert(s, job, run, 10, 0, "[[\"F\", 0, 0, 0.0, 0.5], [\"B\", 0, 0, 1.0, 2.0]]",
                                          &err), 0);
  assert_int_equal(pw_store_timing_insert(s, job, run, 20, 1, "[[\"F\", 0, 1, 0.0, 0.25]]", &err), 0);
  assert_int_equal(pw_store_timing_insert(s, job, run, 20, 0, "[[\"W\", 3, 0, 0.0, 0.125]]", &err), 0);
  /* a re-report of the same step and rank replaces it */
  assert_int_equal(pw_store_timing_insert(s, job, run, 20, 0, "[[\"I\", 1, 0, 0.0, 0.375]]", &err), 0);

  assert_int_equal(pw_store_timeline_json(s, job, -1, &t, &err), 0);
  assert_int_equal(jint(t, "step"), 20);
  json_t *steps = json_object_get(t, "steps");
  assert_int_equal(json_array_size(steps), 2);
  assert_int_equal(json_integer_value(json_array_get(steps, 0)), 10);
  assert_int_equal(json_integer_value(json_array_get(steps, 1)), 20);
  json_t *ranks = json_object_get(t, "ranks");
  assert_int_equal(json_array_size(ranks), 2);
  json_t *r0 = json_array_get(ranks, 0);
  assert_int_equal(jint(r0, "rank"), 0);
  json_t *acts = json_object_get(r0, "actions");
  assert_int_equal(json_array_size(acts), 1);
  json_t *a = json_array_get(acts, 0);
  assert_string_equal(jstr(a, "kind"), "I");
  assert_int_equal(jint(a, "mb"), 1);
  assert_int_equal(jint(a, "stage"), 0);
  assert_true(jnum(a, "start") == 0.0);
  assert_true(jnum(a, "end") == 0.375);
  json_decref(t);

  assert_int_equal(pw_store_timeline_json(s, job, 10, &t, &err), 0);
  assert_int_equal(jint(t, "step"), 10);
  acts = json_object_get(json_array_get(json_object_get(t, "ranks"), 0), "actions");
  assert_int_equal(json_array_size(acts), 2);
  assert_string_equal(jstr(json_array_get(acts, 1), "kind"), "B");
  assert_true(jnum(json_array_get(acts, 1), "end") == 2.0);
  assert_int_equal(jint(json_array_get(json_object_get(t, "ranks"), 1), "rank"), 1);
  json_decref(t);

  /* a newer step only rank 0 has reported yet (the job runs on): the
   * newest complete one stays the default, the partial one is listed */
  assert_int_equal(pw_store_timing_insert(s, job, run, 25, 0, "[[\"F\", 0, 0, 0.0, 0.5]]", &err), 0);
  assert_int_equal(pw_store_timeline_json(s, job, -1, &t, &err), 0);
  assert_int_equal(jint(t, "step"), 20);
  assert_int_equal(json_array_size(json_object_get(t, "ranks")), 2);
  assert_int_equal(json_array_size(json_object_get(t, "steps")), 3);
  json_decref(t);

  assert_int_equal(pw_store_timeline_json(s, job, 15, &t, &err), PW_ENOENT);
  expect_err(&err, "step 15");
  assert_int_equal(pw_store_timeline_json(s, 999, -1, &t, &err), PW_ENOENT);
  assert_int_equal(pw_store_timing_insert(s, job, run, 30, 0, "{\"F\": 1}", &err), PW_EINVAL);
  assert_int_equal(pw_store_timing_insert(s, job, run, 30, 0, NULL, &err), PW_EINVAL);
  assert_int_equal(pw_store_timing_insert(s, 999, run, 30, 0, "[]", &err), PW_ENOENT);
  pw_store_close(s);
}

static int64_t ckpt_step(pw_store *s, int64_t job, int n_stages, const char *path0) {
  json_t *c;
  pw_err err = {0};
  int rc = pw_store_checkpoint_latest_json(s, job, n_stages, &c, &err);
  if (rc == PW_ENOENT) return -1;
  if (rc) fail_msg("checkpoint_latest: %s", err.msg);
  json_t *st = json_object_get(c, "stages");
  assert_int_equal(json_array_size(st), n_stages);
  for (int i = 0; i < n_stages; i++) assert_int_equal(jint(json_array_get(st, (size_t)i), "stage"), i);
  if (path0) assert_string_equal(jstr(json_array_get(st, 0), "path"), path0);
  int64_t step = jint(c, "step");
  json_decref(c);
  return step;
}

static void test_checkpoints(void **state) {
  pw_store *s = open_new(NULL, 0);
  pw_err err = {0};
  int64_t job = new_job(s, "c"), r1, r2, r3;
  json_t *c;
  assert_int_equal(pw_store_run_insert(s, job, NULL, &r1, &err), 0);
  assert_int_equal(pw_store_checkpoint_latest_json(s, job, 2, &c, &err), PW_ENOENT);
  expect_err(&err, "no complete checkpoint");
  /* run 1: step 10 complete, step 20 only stage 1 */
  assert_int_equal(pw_store_checkpoint_insert(s, job, r1, 10, 1, 1, "/ck/r1/10/s1", 200, &err), 0);
  assert_int_equal(ckpt_step(s, job, 2, NULL), -1); /* one stage of two is not a checkpoint */
  assert_int_equal(pw_store_checkpoint_insert(s, job, r1, 10, 0, 0, "/ck/r1/10/s0", 100, &err), 0);
  assert_int_equal(pw_store_checkpoint_insert(s, job, r1, 20, 1, 1, "/ck/r1/20/s1", 200, &err), 0);
  assert_int_equal(ckpt_step(s, job, 2, "/ck/r1/10/s0"), 10);

  /* run 2, a retry: run 1's checkpoint stays the one to resume from */
  assert_int_equal(pw_store_run_insert(s, job, NULL, &r2, &err), 0);
  assert_int_equal(ckpt_step(s, job, 2, "/ck/r1/10/s0"), 10);
  /* run 2 at step 20 with stage 0 only: run 1's stage 1 at step 20 does not complete it */
  assert_int_equal(pw_store_checkpoint_insert(s, job, r2, 20, 0, 0, "/ck/r2/20/s0", 300, &err), 0);
  assert_int_equal(ckpt_step(s, job, 2, "/ck/r1/10/s0"), 10);
  assert_int_equal(pw_store_checkpoint_insert(s, job, r2, 20, 1, 1, "/ck/r2/20/s1", 400, &err), 0);
  assert_int_equal(pw_store_checkpoint_insert(s, job, r2, 30, 0, 0, "/ck/r2/30/s0", 500, &err), 0);
  assert_int_equal(pw_store_checkpoint_latest_json(s, job, 2, &c, &err), 0);
  assert_int_equal(jint(c, "step"), 20);
  json_t *st = json_object_get(c, "stages");
  assert_int_equal(json_array_size(st), 2);
  assert_string_equal(jstr(json_array_get(st, 0), "path"), "/ck/r2/20/s0");
  assert_int_equal(jint(json_array_get(st, 0), "bytes"), 300);
  assert_int_equal(jint(json_array_get(st, 0), "rank"), 0);
  assert_int_equal(jint(json_array_get(st, 1), "rank"), 1);
  assert_string_equal(jstr(json_array_get(st, 1), "path"), "/ck/r2/20/s1");
  json_decref(c);
  /* a re-report of a stage: the later file */
  assert_int_equal(pw_store_checkpoint_insert(s, job, r2, 20, 0, 0, "/ck/r2/20/s0.b", 301, &err), 0);
  assert_int_equal(ckpt_step(s, job, 2, "/ck/r2/20/s0.b"), 20);
  /* one stage: step 30 */
  assert_int_equal(ckpt_step(s, job, 1, "/ck/r2/30/s0"), 30);
  /* three stages: none */
  assert_int_equal(ckpt_step(s, job, 3, NULL), -1);

  /* run 3 with another partition (4 stages) at step 40: complete for 4
   * stages, not for 2 — a stage beyond n_stages disqualifies the step */
  assert_int_equal(pw_store_run_insert(s, job, NULL, &r3, &err), 0);
  for (int g = 0; g < 4; g++) {
    char p[64];
    snprintf(p, sizeof p, "/ck/r3/40/s%d", g);
    assert_int_equal(pw_store_checkpoint_insert(s, job, r3, 40, g, g, p, 10, &err), 0);
  }
  assert_int_equal(ckpt_step(s, job, 4, "/ck/r3/40/s0"), 40);
  assert_int_equal(ckpt_step(s, job, 2, "/ck/r2/20/s0.b"), 20);
  /* a tie at the same step between runs: the later run's files */
  assert_int_equal(pw_store_checkpoint_insert(s, job, r3, 20, 0, 0, "/ck/r3/20/s0", 1, &err), 0);
  assert_int_equal(pw_store_checkpoint_insert(s, job, r3, 20, 1, 1, "/ck/r3/20/s1", 1, &err), 0);
  assert_int_equal(ckpt_step(s, job, 2, "/ck/r3/20/s0"), 20);
  /* a checkpoint without a stage (recorded as -1) completes nothing */
  assert_int_equal(pw_store_checkpoint_insert(s, job, r3, 50, -1, 0, "/ck/r3/50/x", 1, &err), 0);
  assert_int_equal(ckpt_step(s, job, 1, "/ck/r2/30/s0"), 30);

  assert_int_equal(pw_store_checkpoint_latest_json(s, 999, 2, &c, &err), PW_ENOENT);
  assert_int_equal(pw_store_checkpoint_latest_json(s, job, 0, &c, &err), PW_EINVAL);
  assert_int_equal(pw_store_checkpoint_insert(s, 999, r2, 1, 0, 0, "/x", 1, &err), PW_ENOENT);
  assert_int_equal(pw_store_checkpoint_insert(s, job, 999, 1, 0, 0, "/x", 1, &err), PW_ENOENT);
  assert_int_equal(pw_store_checkpoint_insert(s, job, r2, 1, 0, 0, NULL, 1, &err), PW_EINVAL);
  pw_store_close(s);
}

static void test_events(void **state) {
  pw_store *s = open_new(NULL, 0);
  pw_err err = {0};
  int64_t a = new_job(s, "a"), b = new_job(s, "b");
  assert_int_equal(pw_store_event(s, a, "worker", "w1 lost", &err), 0);
  assert_int_equal(pw_store_event(s, b, "note", NULL, &err), 0);
  assert_int_equal(pw_store_event(s, a, "plan", "pp=4 1f1b", &err), 0);
  json_t *e;
  assert_int_equal(pw_store_events_json(s, a, 0, &e, &err), 0);
  json_t *arr = json_object_get(e, "events");
  assert_int_equal(json_array_size(arr), 3); /* queued + 2; b's are not here */
  json_int_t id1 = jint(json_array_get(arr, 1), "id");
  assert_true(id1 > jint(json_array_get(arr, 0), "id"));
  assert_string_equal(jstr(json_array_get(arr, 1), "kind"), "worker");
  assert_string_equal(jstr(json_array_get(arr, 1), "message"), "w1 lost");
  assert_true(jnum(json_array_get(arr, 1), "time") > 0);
  json_decref(e);
  assert_int_equal(pw_store_events_json(s, a, id1, &e, &err), 0);
  arr = json_object_get(e, "events");
  assert_int_equal(json_array_size(arr), 1);
  assert_string_equal(jstr(json_array_get(arr, 0), "message"), "pp=4 1f1b");
  json_decref(e);
  assert_int_equal(pw_store_events_json(s, a, 1000000, &e, &err), 0);
  assert_int_equal(json_array_size(json_object_get(e, "events")), 0);
  json_decref(e);
  assert_int_equal(pw_store_events_json(s, b, 0, &e, &err), 0);
  jnull(json_array_get(json_object_get(e, "events"), 1), "message");
  json_decref(e);
  /* invalid UTF-8 from a worker still yields a string */
  assert_int_equal(pw_store_event(s, b, "worker", "bad \xff\xfe bytes", &err), 0);
  assert_int_equal(pw_store_events_json(s, b, 0, &e, &err), 0);
  assert_string_equal(jstr(json_array_get(json_object_get(e, "events"), 2), "message"), "bad ?? bytes");
  json_decref(e);

  assert_int_equal(pw_store_event(s, 999, "x", "y", &err), PW_ENOENT);
  assert_int_equal(pw_store_event(s, a, NULL, "y", &err), PW_EINVAL);
  assert_int_equal(pw_store_events_json(s, 999, 0, &e, &err), PW_ENOENT);
  pw_store_close(s);
}

static void test_recover(void **state) {
  char path[512];
  pw_store *s = open_new(path, sizeof path);
  pw_err err = {0};
  int64_t j[7];
  for (int st = 0; st < PW_JOB__N; st++) {
    j[st] = new_job(s, pw_job_state_name(st));
    drive_to(s, j[st], st);
  }
  int64_t run_p, run_r, run_done, run_s;
  assert_int_equal(pw_store_run_insert(s, j[PW_JOB_PLANNING], NULL, &run_p, &err), 0);
  assert_int_equal(pw_store_run_insert(s, j[PW_JOB_RUNNING], NULL, &run_done, &err), 0);
  assert_int_equal(pw_store_run_finish(s, run_done, "failed", "earlier", &err), 0);
  assert_int_equal(pw_store_run_insert(s, j[PW_JOB_RUNNING], NULL, &run_r, &err), 0);
  assert_int_equal(pw_store_run_insert(s, j[PW_JOB_SUCCEEDED], NULL, &run_s, &err), 0);
  int64_t ev[7];
  for (int st = 0; st < PW_JOB__N; st++) ev[st] = n_events(s, j[st]);
  pw_store_close(s);

  /* "restart" */
  assert_int_equal(pw_store_open(path, &s, &err), 0);
  assert_int_equal(pw_store_recover(s, "coordinator restarted", &err), 3);
  for (int st = 0; st < PW_JOB__N; st++) {
    pw_job_brief b;
    assert_int_equal(pw_store_job_brief(s, j[st], &b, &err), 0);
    free(b.spec);
    int midflight = st == PW_JOB_PLANNING || st == PW_JOB_DISPATCHING || st == PW_JOB_RUNNING;
    assert_int_equal(b.state, midflight ? PW_JOB_QUEUED : st);
    assert_int_equal(n_events(s, j[st]), ev[st] + midflight);
    if (midflight) {
      json_t *e;
      assert_int_equal(pw_store_events_json(s, j[st], 0, &e, &err), 0);
      json_t *arr = json_object_get(e, "events");
      char want[128];
      snprintf(want, sizeof want, "%s -> queued: coordinator restarted", pw_job_state_name(st));
      assert_string_equal(jstr(json_array_get(arr, json_array_size(arr) - 1), "message"), want);
      json_decref(e);
    }
  }
  char txt[256], sql[256];
  snprintf(sql, sizeof sql, "SELECT state || '/' || error FROM runs WHERE id = %lld", (long long)run_r);
  raw_text(path, sql, txt, sizeof txt);
  assert_string_equal(txt, "interrupted/coordinator restarted"); /* the job runs again */
  snprintf(sql, sizeof sql, "SELECT finished IS NOT NULL FROM runs WHERE id = %lld", (long long)run_p);
  assert_int_equal(raw_int(path, sql), 1);
  snprintf(sql, sizeof sql, "SELECT state || '/' || error FROM runs WHERE id = %lld", (long long)run_done);
  raw_text(path, sql, txt, sizeof txt);
  assert_string_equal(txt, "failed/earlier"); /* an already finished run keeps its reason */
  snprintf(sql, sizeof sql, "SELECT state FROM runs WHERE id = %lld", (long long)run_s);
  raw_text(path, sql, txt, sizeof txt);
  assert_string_equal(txt, "running"); /* a terminal job's runs are not touched */

  int64_t counts[PW_JOB__N], steps;
  double tokens;
  assert_int_equal(pw_store_totals(s, counts, &steps, &tokens, &err), 0);
  assert_int_equal(counts[PW_JOB_QUEUED], 4);
  assert_int_equal(counts[PW_JOB_RUNNING], 0);
  assert_int_equal(counts[PW_JOB_SUCCEEDED], 1);
  assert_int_equal(counts[PW_JOB_FAILED], 1);
  assert_int_equal(counts[PW_JOB_CANCELLED], 1);
  assert_int_equal(steps, 0);
  assert_int_equal(pw_store_recover(s, "again", &err), 0); /* nothing left mid-flight */
  pw_store_close(s);
}

/* ---- main ---------------------------------------------------------------- */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }

static int setup(void **state) {
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/pw_store_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) { return nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_state_names),
      cmocka_unit_test(test_open_fresh_and_reopen),
      cmocka_unit_test(test_open_newer_refused),
      cmocka_unit_test(test_open_errors),
      cmocka_unit_test(test_workers),
      cmocka_unit_test(test_job_insert_and_json),
      cmocka_unit_test(test_state_machine),
      cmocka_unit_test(test_status_progress_brief),
      cmocka_unit_test(test_list),
      cmocka_unit_test(test_runs),
      cmocka_unit_test(test_metrics),
      cmocka_unit_test(test_eval_loss),
      cmocka_unit_test(test_timeline),
      cmocka_unit_test(test_checkpoints),
      cmocka_unit_test(test_events),
      cmocka_unit_test(test_recover),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
