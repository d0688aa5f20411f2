/* storetest: what the store tests share (one copy, not one per test):
 * raw SQLite access (run SQL on a store's file behind its back, read one
 * integer), typed reads of the JSON views, the scratch folder. Include
 * after cmocka.h. */
#ifndef PW_STORETEST_H
#define PW_STORETEST_H

#include <jansson.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "store.h"

/* The schema version this code writes (store.c's migrations). */
#define PW_TEST_SCHEMA 7
/* Take a file of the current schema back to schema 5, or 4: the tests of
 * older migrations run these, then undo their own schema's tables. */
#define PW_TEST_BACK_TO_6                                                                   \
  "DROP INDEX jobs_client_key; ALTER TABLE jobs DROP COLUMN client_key; ALTER TABLE jobs DROP COLUMN client_sha; " \
  "ALTER TABLE runs DROP COLUMN stop_step; PRAGMA user_version = 6;"
#define PW_TEST_BACK_TO_5                                                                   \
  PW_TEST_BACK_TO_6 "ALTER TABLE metrics DROP COLUMN eval_loss; ALTER TABLE jobs DROP COLUMN eval_loss; "     \
  "PRAGMA user_version = 5;"
#define PW_TEST_BACK_TO_4                                                                   \
  PW_TEST_BACK_TO_5 "ALTER TABLE jobs DROP COLUMN restarts; ALTER TABLE runs DROP COLUMN start_step; " \
  "ALTER TABLE runs DROP COLUMN resumed_from; PRAGMA user_version = 4;"

static inline void raw_exec(const char *path, const char *sql) {
  sqlite3 *db;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  char *msg = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) fail_msg("%s: %s", sql, msg);
  sqlite3_close(db);
}

/* The first column of the first row, on a connection of its own (waiting
 * out a writer's lock). */
static inline int64_t raw_int(const char *path, const char *sql) {
  sqlite3 *db;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
  int64_t v = -1;
  if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

/* A field of a JSON view, failing the test when it is not of that type. */
static inline const char *jstr(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_string(v)) fail_msg("'%s' is not a string", key);
  return json_string_value(v);
}
static inline json_int_t jint(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v)) fail_msg("'%s' is not an integer", key);
  return json_integer_value(v);
}
static inline double jnum(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_number(v)) fail_msg("'%s' is not a number", key);
  return json_number_value(v);
}
static inline void jnull(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_null(v)) fail_msg("'%s' is not null (%s)", key, v ? "some value" : "missing");
}

/* The test's scratch folder, /tmp/pw-store-NAME-XXXXXX (setup), and its
 * removal with everything in it (teardown). */
static inline int store_tmpdir(char *dir, size_t cap, const char *name) {
  snprintf(dir, cap, "/tmp/pw-store-%s-XXXXXX", name);
  return mkdtemp(dir) ? 0 : -1;
}
static inline int store_rmdir(const char *dir) {
  char cmd[320];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}
/* A new store at dir/name (any older file there removed first); its path
 * into path. */
static inline pw_store *store_open_at(const char *dir, const char *name, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", dir, name);
  unlink(path);
  pw_store *s = NULL;
  pw_err err = {0};
  if (pw_store_open(path, &s, &err)) fail_msg("open %s: %s", path, err.msg);
  return s;
}

/* The group's setup and teardown for a test file that works in the
 * scratch folder dir (a char array): STORETEST_FIXTURE(g_dir, "w"). */
/* A queued job of `steps` steps (pp 2, 1f1b) with a "{}" spec, and a run of
 * it: the rows the store tests hang their writes on. */
static inline int64_t store_new_job(pw_store *s, int steps) {
  pw_job_new j = {.name = "j", .spec = "{}", .steps = steps, .pp = 2, .dp = 1, .virtual_stages = 1,
                  .microbatches = 2, .schedule = "1f1b", .model = "m"};
  int64_t id = 0;
  pw_err err = {0};
  if (pw_store_job_insert(s, &j, &id, &err)) fail_msg("insert: %s", err.msg);
  return id;
}

static inline int64_t store_new_run(pw_store *s, int64_t job) {
  int64_t run = 0;
  pw_err err = {0};
  if (pw_store_run_insert(s, job, "{}", &run, &err)) fail_msg("run: %s", err.msg);
  return run;
}

#define STORETEST_FIXTURE(dir, name)                                                         \
  static int setup(void **state) {                                                           \
    (void)state;                                                                             \
    return store_tmpdir(dir, sizeof dir, name);                                              \
  }                                                                                          \
  static int teardown(void **state) {                                                        \
    (void)state;                                                                             \
    return store_rmdir(dir);                                                                 \
  }

#endif
