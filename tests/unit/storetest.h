/* storetest: the store tests' raw SQLite access (one copy, not one per
 * test): run SQL on a store's file behind its back, read one integer.
 * Include after cmocka.h. */
#ifndef PW_STORETEST_H
#define PW_STORETEST_H

#include <sqlite3.h>
#include <stdint.h>

/* The schema version this code writes (store.c's migrations). */
#define PW_TEST_SCHEMA 5
/* Takes a file of the current schema back to schema 4: the tests of older
 * migrations run this, then undo their own schema's tables. */
#define PW_TEST_BACK_TO_4                                                                   \
  "ALTER TABLE jobs DROP COLUMN restarts; ALTER TABLE runs DROP COLUMN start_step; "        \
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

#endif
