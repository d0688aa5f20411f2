/* test_coord_store_restarts: what the store keeps for issue 15 (surviving
 * lost workers), schema 5.
 *
 *  - migration 4 -> 5: a schema-4 database (a job with a run) opens as
 *    schema 5, its job with 0 restarts and its run's start unknown;
 *  - attempts: every run of a job, oldest first, each with its state,
 *    reason, where it started and its workers in rank order (not in the
 *    order they were assigned); a job that never ran has none; unknown
 *    jobs are PW_ENOENT;
 *  - restarts: read and set; unknown jobs are PW_ENOENT;
 *  - retry: only a failed or cancelled job goes back to queued (error,
 *    finished and status cleared, restarts 0, one "retry" event); from
 *    any other state it is PW_ECONFLICT naming the state and changes
 *    nothing; a write that fails leaves the job as it was;
 *  - the loop's write kinds PW_W_RUN_RESUME and PW_W_JOB_RESTARTS land,
 *    and are kept and written later when the store fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "store_retry.h"
#include "storetest.h"

static char g_dir[64];

static pw_store *open_at(const char *name, char *path, size_t cap) { return store_open_at(g_dir, name, path, cap); }


static void assign(pw_store *s, int64_t run, int rank, const char *name) {
  pw_err err = {0};
  if (pw_store_assignment_insert(s, run, rank, rank + 1, name, &err)) fail_msg("assign: %s", err.msg);
}

static void to_state(pw_store *s, int64_t job, int state, const char *error) {
  pw_err err = {0};
  if (pw_store_job_set_state(s, job, state, "test", error, &err)) fail_msg("state: %s", err.msg);
}

/* The workers of one attempt joined with ",". */
static void workers_of(json_t *a, char *buf, size_t cap) {
  size_t i, n = 0;
  json_t *w;
  buf[0] = 0;
  json_array_foreach(json_object_get(a, "workers"), i, w) {
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "," : "", json_string_value(w));
  }
}

static void test_migration_4_to_5(void **state) {
  (void)state;
  char path[256];
  pw_store *s = open_at("v4.db", path, sizeof path);
  int64_t job = store_new_job(s, 20), run = store_new_run(s, job);
  pw_store_close(s);
  raw_exec(path, PW_TEST_BACK_TO_4);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM pragma_table_info('jobs') WHERE name = 'restarts'"), 0);
  pw_err err = {0};
  assert_int_equal(pw_store_open(path, &s, &err), 0);
  assert_int_equal(pw_store_schema_version(s), PW_TEST_SCHEMA);
  int restarts = -1;
  assert_int_equal(pw_store_job_restarts(s, job, &restarts, &err), 0);
  assert_int_equal(restarts, 0);
  json_t *a = NULL;
  assert_int_equal(pw_store_attempts_json(s, job, &a, &err), 0);
  assert_int_equal(json_array_size(a), 1);
  assert_int_equal(jint(json_array_get(a, 0), "run"), run);
  jnull(json_array_get(a, 0), "start_step");
  jnull(json_array_get(a, 0), "resumed_from");
  json_decref(a);
  pw_store_close(s);
  assert_int_equal(raw_int(path, "PRAGMA user_version"), PW_TEST_SCHEMA);
}

static void test_attempts(void **state) {
  (void)state;
  char path[256];
  pw_store *s = open_at("attempts.db", path, sizeof path);
  pw_err err = {0};
  int64_t job = store_new_job(s, 20), other = store_new_job(s, 20);
  json_t *a = NULL;
  assert_int_equal(pw_store_attempts_json(s, job, &a, &err), 0); /* never ran: none */
  assert_true(json_is_array(a));
  assert_int_equal(json_array_size(a), 0);
  json_decref(a);
  a = (json_t *)1;
  assert_int_equal(pw_store_attempts_json(s, 999, &a, &err), PW_ENOENT);
  assert_null(a);

  /* attempt 1: assigned out of rank order, lost a worker */
  int64_t r1 = store_new_run(s, job);
  assign(s, r1, 1, "w1");
  assign(s, r1, 0, "w0");
  assert_int_equal(pw_store_run_resume(s, r1, 0, "start", &err), 0);
  assert_int_equal(pw_store_run_finish(s, r1, "interrupted", "worker w1 lost at step 13", &err), 0);
  int64_t ro = store_new_run(s, other); /* another job's run is not this job's attempt */
  assign(s, ro, 0, "x0");
  /* attempt 2: open, resumed from a snapshot; ranks 0..2 */
  int64_t r2 = store_new_run(s, job);
  assign(s, r2, 2, "w4");
  assign(s, r2, 0, "w0");
  assign(s, r2, 1, "w3");
  assert_int_equal(pw_store_run_resume(s, r2, 12, "snapshot", &err), 0);

  assert_int_equal(pw_store_attempts_json(s, job, &a, &err), 0);
  assert_int_equal(json_array_size(a), 2);
  json_t *a1 = json_array_get(a, 0), *a2 = json_array_get(a, 1);
  char ws[64];
  assert_int_equal(jint(a1, "attempt"), 1);
  assert_int_equal(jint(a1, "run"), r1);
  assert_string_equal(jstr(a1, "state"), "interrupted");
  assert_string_equal(jstr(a1, "reason"), "worker w1 lost at step 13");
  assert_true(json_is_number(json_object_get(a1, "started")) && json_is_number(json_object_get(a1, "finished")));
  assert_int_equal(jint(a1, "start_step"), 0);
  assert_string_equal(jstr(a1, "resumed_from"), "start");
  workers_of(a1, ws, sizeof ws);
  assert_string_equal(ws, "w0,w1");
  assert_int_equal(jint(a2, "attempt"), 2);
  assert_int_equal(jint(a2, "run"), r2);
  assert_string_equal(jstr(a2, "state"), "running");
  jnull(a2, "finished");
  jnull(a2, "reason");
  assert_int_equal(jint(a2, "start_step"), 12);
  assert_string_equal(jstr(a2, "resumed_from"), "snapshot");
  workers_of(a2, ws, sizeof ws);
  assert_string_equal(ws, "w0,w3,w4");
  json_decref(a);

  /* where a run starts: one of three sources, a step >= 0, a known run */
  assert_int_equal(pw_store_run_resume(s, r2, 12, "backup", &err), PW_EINVAL);
  assert_int_equal(pw_store_run_resume(s, r2, 12, NULL, &err), PW_EINVAL);
  assert_int_equal(pw_store_run_resume(s, r2, -1, "checkpoint", &err), PW_EINVAL);
  assert_int_equal(pw_store_run_resume(s, 999, 3, "checkpoint", &err), PW_ENOENT);
  /* refused: attempt 2 still starts at 12 from the snapshot */
  char sql[128];
  snprintf(sql, sizeof sql, "SELECT start_step FROM runs WHERE id = %lld AND resumed_from = 'snapshot'", (long long)r2);
  assert_int_equal(raw_int(path, sql), 12);
  pw_store_close(s);
}

static void test_restarts(void **state) {
  (void)state;
  char path[256];
  pw_store *s = open_at("restarts.db", path, sizeof path);
  pw_err err = {0};
  int64_t job = store_new_job(s, 20);
  int n = -1;
  assert_int_equal(pw_store_job_restarts(s, job, &n, &err), 0);
  assert_int_equal(n, 0);
  assert_int_equal(pw_store_job_set_restarts(s, job, 2, &err), 0);
  assert_int_equal(pw_store_job_restarts(s, job, &n, &err), 0);
  assert_int_equal(n, 2);
  json_t *j = NULL;
  assert_int_equal(pw_store_job_json(s, job, 0, &j, &err), 0); /* the job views show it */
  assert_int_equal(jint(j, "restarts"), 2);
  json_decref(j);
  assert_int_equal(pw_store_jobs_json(s, -1, 10, 0, &j, &err), 0);
  assert_int_equal(jint(json_array_get(json_object_get(j, "jobs"), 0), "restarts"), 2);
  json_decref(j);
  assert_int_equal(pw_store_job_restarts(s, 999, &n, &err), PW_ENOENT);
  assert_int_equal(pw_store_job_set_restarts(s, 999, 1, &err), PW_ENOENT);
  assert_int_equal(pw_store_job_set_restarts(s, job, -1, &err), PW_EINVAL);
  pw_store_close(s);
}

static int64_t events_of(const char *path, int64_t job, const char *kind) {
  char sql[160];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM events WHERE job_id = %lld AND kind = '%s'", (long long)job, kind);
  return raw_int(path, sql);
}

static void test_retry(void **state) {
  (void)state;
  char path[256];
  pw_store *s = open_at("retry.db", path, sizeof path);
  pw_err err = {0};
  /* refused from every state but failed and cancelled, and nothing changes */
  static const int refused[] = {PW_JOB_QUEUED, PW_JOB_PLANNING, PW_JOB_DISPATCHING, PW_JOB_RUNNING,
                                PW_JOB_SUCCEEDED};
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
    int64_t job = store_new_job(s, 20);
    for (int st = PW_JOB_PLANNING; st <= refused[i]; st++) to_state(s, job, st, NULL);
    assert_int_equal(pw_store_job_set_status(s, job, "busy", &err), 0);
    assert_int_equal(pw_store_job_set_restarts(s, job, 1, &err), 0);
    int64_t events = raw_int(path, "SELECT count(*) FROM events");
    assert_int_equal(pw_store_job_retry(s, job, &err), PW_ECONFLICT);
    char want[128];
    snprintf(want, sizeof want, "job %lld is %s: only a failed or cancelled job can be retried", (long long)job,
             pw_job_state_name(refused[i]));
    if (!strstr(err.msg, want)) fail_msg("'%s' does not say '%s'", err.msg, want);
    json_t *j = NULL;
    assert_int_equal(pw_store_job_json(s, job, 0, &j, &err), 0);
    assert_string_equal(jstr(j, "state"), pw_job_state_name(refused[i]));
    assert_string_equal(jstr(j, "status"), "busy");
    assert_int_equal(jint(j, "restarts"), 1);
    json_decref(j);
    assert_int_equal(raw_int(path, "SELECT count(*) FROM events"), events);
  }
  assert_int_equal(pw_store_job_retry(s, 999, &err), PW_ENOENT);

  /* failed, after two restarts: back to queued, cleared, one event */
  int64_t job = store_new_job(s, 20);
  to_state(s, job, PW_JOB_PLANNING, NULL);
  to_state(s, job, PW_JOB_DISPATCHING, NULL);
  to_state(s, job, PW_JOB_RUNNING, NULL);
  assert_int_equal(pw_store_job_progress(s, job, 7, 2.5, 100, &err), 0);
  assert_int_equal(pw_store_job_set_restarts(s, job, 3, &err), 0);
  assert_int_equal(pw_store_job_set_status(s, job, "lost w1", &err), 0);
  to_state(s, job, PW_JOB_FAILED, "attempt 1: lost w1; attempt 2: lost w2");
  assert_int_equal(pw_store_job_retry(s, job, &err), 0);
  json_t *j = NULL;
  assert_int_equal(pw_store_job_json(s, job, 0, &j, &err), 0);
  assert_string_equal(jstr(j, "state"), "queued");
  jnull(j, "error");
  jnull(j, "finished");
  assert_string_equal(jstr(j, "status"), "");
  assert_int_equal(jint(j, "restarts"), 0);
  assert_true(json_is_number(json_object_get(j, "started"))); /* kept: it did start once */
  assert_int_equal(jint(json_object_get(j, "progress"), "step"), 7); /* it resumes: progress stays */
  json_decref(j);
  assert_int_equal(events_of(path, job, "retry"), 1);
  json_t *ev = NULL;
  assert_int_equal(pw_store_events_json(s, job, 0, &ev, &err), 0);
  json_t *events = json_object_get(ev, "events"), *last = json_array_get(events, json_array_size(events) - 1);
  assert_string_equal(jstr(last, "kind"), "retry");
  assert_string_equal(jstr(last, "message"), "retried by request: resumes from its newest state");
  json_decref(ev);
  /* and the lifecycle goes on from queued */
  to_state(s, job, PW_JOB_PLANNING, NULL);
  assert_int_equal(pw_store_job_retry(s, job, &err), PW_ECONFLICT);

  /* cancelled, while the store fails: nothing changes; then it works */
  job = store_new_job(s, 20);
  to_state(s, job, PW_JOB_CANCELLED, NULL);
  pw_store_fault_inject(0, 1);
  assert_int_equal(pw_store_job_retry(s, job, &err), PW_EIO);
  assert_int_equal(events_of(path, job, "retry"), 0);
  assert_int_equal(pw_store_job_json(s, job, 0, &j, &err), 0);
  assert_string_equal(jstr(j, "state"), "cancelled");
  json_decref(j);
  assert_int_equal(pw_store_job_retry(s, job, &err), 0);
  pw_store_fault_inject(-1, 0);
  assert_int_equal(events_of(path, job, "retry"), 1);
  pw_store_close(s);
}

/* ---- the loop's write kinds ------------------------------------------------ */

static void test_write_kinds(void **state) {
  (void)state;
  static pw_coord c; /* pw_coord_store keeps this thread's connection by its address */
  memset(&c, 0, sizeof c);
  snprintf(c.db_path, sizeof c.db_path, "%s/writes.db", g_dir);
  pthread_mutex_init(&c.mu, NULL);
  pw_store *s = pw_coord_store(&c);
  assert_non_null(s);
  int64_t job = store_new_job(s, 20), run = store_new_run(s, job);
  pw_err err = {0};
  pw_write w = {.kind = PW_W_RUN_RESUME, .run = run, .step = 12, .text = "snapshot"};
  assert_int_equal(pw_write_do(&c, &w, &err), 0);
  w = (pw_write){.kind = PW_W_JOB_RESTARTS, .job = job, .step = 1};
  assert_int_equal(pw_write_do(&c, &w, &err), 0);
  assert_int_equal(raw_int(c.db_path, "SELECT start_step FROM runs"), 12);
  assert_int_equal(raw_int(c.db_path, "SELECT count(*) FROM runs WHERE resumed_from = 'snapshot'"), 1);
  assert_int_equal(raw_int(c.db_path, "SELECT restarts FROM jobs"), 1);
  char d[160];
  assert_non_null(strstr(pw_write_describe(&w, d, sizeof d), "restart count (1)"));
  /* a refused write is dropped (its content, not the store) */
  w = (pw_write){.kind = PW_W_RUN_RESUME, .run = run, .step = 3, .text = "nowhere"};
  assert_int_equal(pw_write_do(&c, &w, &err), PW_EINVAL);
  assert_int_equal(pw_write_pending(&c), 0);
  /* the store fails: both kept, in order, and written once it works */
  pw_store_fault_inject(0, -1);
  w = (pw_write){.kind = PW_W_JOB_RESTARTS, .job = job, .step = 2};
  assert_int_equal(pw_write_do(&c, &w, &err), 1);
  char from[] = "checkpoint"; /* borrowed only for the call: the queue keeps a copy */
  w = (pw_write){.kind = PW_W_RUN_RESUME, .run = run, .step = 20, .text = from};
  assert_int_equal(pw_write_do(&c, &w, &err), 1);
  memset(from, 'x', sizeof from - 1);
  assert_int_equal(pw_write_pending(&c), 2);
  assert_int_equal(pw_write_flush(&c), 2);
  pw_store_fault_inject(-1, 0);
  assert_int_equal(pw_write_flush(&c), 0);
  assert_int_equal(raw_int(c.db_path, "SELECT restarts FROM jobs"), 2);
  assert_int_equal(raw_int(c.db_path, "SELECT start_step FROM runs"), 20);
  assert_int_equal(raw_int(c.db_path, "SELECT count(*) FROM runs WHERE resumed_from = 'checkpoint'"), 1);
  pw_write_shutdown(&c);
  for (int i = 0; i < c.n_stores; i++) pw_store_close(c.stores[i]);
  free(c.stores);
  pthread_mutex_destroy(&c.mu);
}

STORETEST_FIXTURE(g_dir, "r")

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_migration_4_to_5),
      cmocka_unit_test(test_attempts),
      cmocka_unit_test(test_restarts),
      cmocka_unit_test(test_retry),
      cmocka_unit_test(test_write_kinds),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
