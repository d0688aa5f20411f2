/* test_coord_store_crash: the store under pressure — two writer threads
 * and a reader on one file (each its own connection; the file is fresh, so
 * the writers also race to migrate it) with no SQLITE_BUSY reaching the
 * caller, and durability across kill -9: a child process inserts jobs and
 * reports each commit, is SIGKILLed, and the reopened file holds every
 * reported commit, keeps each transaction whole, and passes
 * integrity_check. Three rounds on the same file.
 *
 * `test_coord_store_crash --bench` times pw_store_job_json instead. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store.h"
#include "storetest.h"

/* ---- helpers --------------------------------------------------------------- */

static char g_dir[256];
static int g_seq;

static const char *SPEC = "{\"model\": {\"d_model\": 64, \"n_layers\": 4}, \"steps\": 10}";

static void db_path(char *buf, size_t cap) { snprintf(buf, cap, "%s/db%d.sqlite", g_dir, ++g_seq); }

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

/* ---- concurrency --------------------------------------------------------- */

typedef struct {
  const char *path;
  int n;               /* writer: jobs to insert */
  volatile int *done;  /* set by the writers */
  int errors;
  char first[400];
  long reads;
} conc_arg;

static void conc_fail(conc_arg *a, const char *what, const pw_err *err) {
  if (!a->errors++) snprintf(a->first, sizeof a->first, "%s: %s", what, err->msg);
}

static void *conc_writer(void *p) {
  conc_arg *a = p;
  pw_store *s;
  pw_err err = {0};
  if (pw_store_open(a->path, &s, &err)) {
    conc_fail(a, "open", &err);
    return NULL;
  }
  pw_job_new j = {.name = "c", .spec = SPEC, .steps = 10};
  for (int i = 0; i < a->n; i++) {
    int64_t id, run;
    pw_metric m = {.step = 0, .loss = 1, .tokens = 1};
    if (pw_store_job_insert(s, &j, &id, &err)) conc_fail(a, "insert", &err);
    else if (pw_store_job_set_state(s, id, PW_JOB_PLANNING, "go", NULL, &err)) conc_fail(a, "state", &err);
    else if (pw_store_run_insert(s, id, NULL, &run, &err)) conc_fail(a, "run", &err);
    else if (pw_store_metric_insert(s, id, run, &m, &err)) conc_fail(a, "metric", &err);
    else if (pw_store_job_progress(s, id, 1, 1.0, 10.0, &err)) conc_fail(a, "progress", &err);
  }
  pw_store_close(s);
  __atomic_add_fetch(a->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

static void *conc_reader(void *p) {
  conc_arg *a = p;
  pw_store *s;
  pw_err err = {0};
  if (pw_store_open(a->path, &s, &err)) {
    conc_fail(a, "open", &err);
    return NULL;
  }
  /* At least a few reads even if the writers finish before this thread
   * is first scheduled (a loaded machine). */
  while (__atomic_load_n(a->done, __ATOMIC_SEQ_CST) < 2 || a->reads < 5) {
    json_t *l, *j;
    if (pw_store_jobs_json(s, -1, 5, 0, &l, &err)) {
      conc_fail(a, "list", &err);
      continue;
    }
    json_t *first = json_array_get(json_object_get(l, "jobs"), 0);
    if (first) {
      int64_t id = json_integer_value(json_object_get(first, "id"));
      if (pw_store_job_json(s, id, 1, &j, &err)) conc_fail(a, "job", &err);
      else json_decref(j);
      if (pw_store_metrics_json(s, id, 0, &j, &err)) conc_fail(a, "metrics", &err);
      else json_decref(j);
      if (pw_store_events_json(s, id, 0, &j, &err)) conc_fail(a, "events", &err);
      else json_decref(j);
    }
    json_decref(l);
    int64_t counts[PW_JOB__N], steps;
    double tokens;
    if (pw_store_totals(s, counts, &steps, &tokens, &err)) conc_fail(a, "totals", &err);
    a->reads++;
  }
  pw_store_close(s);
  return NULL;
}

static void test_concurrency(void **state) {
  char path[512];
  db_path(path, sizeof path); /* not created yet: both writers race to migrate it */
  volatile int done = 0;
  conc_arg w1 = {.path = path, .n = 150, .done = &done}, w2 = w1, r = w1;
  pthread_t t1, t2, t3;
  pthread_create(&t1, NULL, conc_writer, &w1);
  pthread_create(&t2, NULL, conc_writer, &w2);
  pthread_create(&t3, NULL, conc_reader, &r);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  pthread_join(t3, NULL);
  if (w1.errors) fail_msg("writer 1: %d errors, first %s", w1.errors, w1.first);
  if (w2.errors) fail_msg("writer 2: %d errors, first %s", w2.errors, w2.first);
  if (r.errors) fail_msg("reader: %d errors, first %s", r.errors, r.first);
  assert_true(r.reads > 0);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM jobs"), 300);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM metrics"), 300);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM events"), 600);
  assert_int_equal(raw_int(path, "PRAGMA user_version"), PW_TEST_SCHEMA);
}

/* ---- durability across kill -9 ------------------------------------------- */

/* The child: insert jobs (each with a run, two transactions) forever,
 * writing each committed job id to fd. Never returns. */
static void kill9_child(const char *path, int fd) {
  pw_store *s;
  pw_err err = {0};
  if (pw_store_open(path, &s, &err)) _exit(2);
  pw_job_new j = {.name = "k", .spec = SPEC, .steps = 10};
  for (;;) {
    int64_t id, run;
    if (pw_store_job_insert(s, &j, &id, &err)) _exit(3);
    if (write(fd, &id, sizeof id) != sizeof id) _exit(4);
    if (pw_store_run_insert(s, id, "{}", &run, &err)) _exit(5);
  }
}

static void test_kill9(void **state) {
  char path[512];
  db_path(path, sizeof path);
  int64_t reported_total = 0, last_id = 0;
  for (int round = 0; round < 3; round++) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(fds[0]);
      kill9_child(path, fds[1]);
    }
    close(fds[1]);
    int64_t id, n = 0;
    while (n < 150 && read(fds[0], &id, sizeof id) == sizeof id) {
      assert_true(id > last_id);
      last_id = id;
      n++;
    }
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(fds[0]);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) fail_msg("child ended on its own, status %d", status);
    assert_int_equal(n, 150);
    reported_total += n;

    /* reopen through the store (WAL recovery), then check with raw SQL */
    pw_store *s;
    pw_err err = {0};
    if (pw_store_open(path, &s, &err)) fail_msg("reopen: %s", err.msg);
    json_t *j;
    assert_int_equal(pw_store_job_json(s, last_id, 0, &j, &err), 0); /* the last reported commit */
    json_decref(j);
    pw_store_close(s);
    char ok[64];
    raw_text(path, "PRAGMA integrity_check", ok, sizeof ok);
    assert_string_equal(ok, "ok");
    assert_int_equal(raw_int(path, "PRAGMA foreign_key_check"), -1); /* no rows */
    int64_t jobs = raw_int(path, "SELECT count(*) FROM jobs");
    assert_true(jobs >= reported_total);
    assert_int_equal(raw_int(path, "SELECT max(id) FROM jobs"), jobs); /* no holes */
    /* every job has its event; a run was inserted with jobs.run in the same transaction */
    assert_int_equal(raw_int(path, "SELECT count(*) FROM jobs j WHERE NOT EXISTS "
                                   "(SELECT 1 FROM events e WHERE e.job_id = j.id)"), 0);
    assert_int_equal(raw_int(path, "SELECT count(*) FROM jobs j WHERE (j.run = 0) != (NOT EXISTS "
                                   "(SELECT 1 FROM runs r WHERE r.job_id = j.id))"), 0);
    assert_int_equal(raw_int(path, "SELECT count(*) FROM jobs j WHERE j.run != 0 AND j.run != "
                                   "(SELECT max(id) FROM runs r WHERE r.job_id = j.id)"), 0);
    last_id = raw_int(path, "SELECT max(id) FROM jobs");
    reported_total = jobs;
  }
}

/* ---- bench --------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench(void) {
  pw_store *s;
  pw_err err = {0};
  char path[512];
  db_path(path, sizeof path);
  if (pw_store_open(path, &s, &err)) return fprintf(stderr, "open: %s\n", err.msg), 1;
  pw_job_new j = {.name = "bench", .spec = SPEC, .steps = 1000, .pp = 4, .dp = 1, .virtual_stages = 1,
                  .microbatches = 8, .schedule = "1f1b", .model = "gpt d=64 L=4"};
  int64_t id;
  double t = now_s();
  for (int i = 0; i < 1000; i++)
    if (pw_store_job_insert(s, &j, &id, &err)) return fprintf(stderr, "insert: %s\n", err.msg), 1;
  printf("job_insert:            %8.2f us/call\n", (now_s() - t) / 1000 * 1e6);
  for (int with_spec = 0; with_spec < 2; with_spec++) {
    t = now_s();
    for (int i = 0; i < 10000; i++) {
      json_t *o;
      if (pw_store_job_json(s, 1 + i % 1000, with_spec, &o, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
      json_decref(o);
    }
    printf("job_json(with_spec=%d): %8.2f us/call\n", with_spec, (now_s() - t) / 10000 * 1e6);
  }
  t = now_s();
  for (int i = 0; i < 10000; i++) {
    json_t *o;
    if (pw_store_job_json(s, 1 + i % 1000, 0, &o, &err)) return 1;
    char *txt = json_dumps(o, JSON_COMPACT);
    free(txt);
    json_decref(o);
  }
  printf("job_json + json_dumps: %8.2f us/call\n", (now_s() - t) / 10000 * 1e6);
  t = now_s();
  for (int i = 0; i < 1000; i++) {
    json_t *o;
    if (pw_store_jobs_json(s, -1, 50, 0, &o, &err)) return 1;
    json_decref(o);
  }
  printf("jobs_json(limit=50):   %8.2f us/call\n", (now_s() - t) / 1000 * 1e6);
  pw_store_close(s);
  return 0;
}

/* ---- main ---------------------------------------------------------------- */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }

static int setup(void **state) {
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/pw_store_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) { return nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--bench")) {
    setup(NULL);
    int rc = bench();
    teardown(NULL);
    return rc;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrency),
      cmocka_unit_test(test_kill9),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
