/* test_coord_store_weights: the store's weights table and the jobs' links
 * to it (schema 4, h-init).
 *
 *  - migration 3 -> 4: a schema-3 database (jobs, datasets) opens as
 *    schema 4 with its rows and an empty weights table;
 *  - weights are recorded once (the second insert keeps the first row and
 *    says so), listed, read, deleted;
 *  - a job naming weights that are not stored is refused (PW_ESPEC at init)
 *    and nothing is inserted; a job naming stored ones (model and optimizer)
 *    holds both: delete is PW_ECONFLICT naming the job until the job ends;
 *  - writes fail like the store's others under fault injection. */
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

#include "store.h"
#include "storetest.h"

static char g_dir[64];

static pw_store *open_at(const char *name, char *path, size_t cap) { return store_open_at(g_dir, name, path, cap); }

static const char *A = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
static const char *B = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
static const char *C = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";

static int job(pw_store *s, const char *w0, const char *w1, int64_t *id, pw_err *err) {
  pw_job_new j = {.name = "j", .spec = "{}", .steps = 1, .pp = 1, .dp = 1, .virtual_stages = 1, .microbatches = 1,
                  .schedule = "gpipe", .model = "m", .weights = {w0, w1}};
  return pw_store_job_insert(s, &j, id, err);
}

static int put(pw_store *s, const char *id, const char *kind, const char *name, int *created, json_t **out) {
  pw_weights_new w = {.id = id, .size = 100, .kind = kind, .name = name, .source = "upload", .n_tensors = 2,
                      .params = 20};
  pw_err err = {0};
  return pw_store_weights_insert(s, &w, created, out, &err);
}

static void test_migration_3_to_4(void **state) {
  (void)state;
  char path[256];
  pw_store *s = open_at("v3.db", path, sizeof path);
  int64_t id = 0;
  pw_err err = {0};
  assert_int_equal(job(s, NULL, NULL, &id, &err), 0);
  pw_store_close(s);
  raw_exec(path, PW_TEST_BACK_TO_4 "DROP TABLE job_weights; DROP TABLE weights; DROP TABLE ckpt_shards; DROP TABLE ckpt_steps; "
                 "PRAGMA user_version = 3;");
  assert_int_equal(pw_store_open(path, &s, &err), 0);
  assert_int_equal(pw_store_schema_version(s), PW_TEST_SCHEMA);
  json_t *j = NULL;
  assert_int_equal(pw_store_job_json(s, id, 0, &j, &err), 0);
  json_decref(j);
  assert_int_equal(pw_store_weights_list_json(s, &j, &err), 0);
  assert_int_equal(json_array_size(json_object_get(j, "checkpoints")), 0);
  json_decref(j);
  pw_store_close(s);
  assert_int_equal(raw_int(path, "PRAGMA user_version"), PW_TEST_SCHEMA);
}

static void test_weights(void **state) {
  (void)state;
  char path[256];
  pw_store *s = open_at("w.db", path, sizeof path);
  pw_err err = {0};
  int created = -1;
  json_t *row = NULL, *j = NULL;
  assert_int_equal(put(s, A, "model", "first", &created, &row), 0);
  assert_int_equal(created, 1);
  assert_string_equal(json_string_value(json_object_get(row, "sha256")), A);
  assert_string_equal(json_string_value(json_object_get(row, "kind")), "model");
  assert_int_equal(json_integer_value(json_object_get(row, "params")), 20);
  json_decref(row);
  assert_int_equal(put(s, A, "model", "second", &created, &row), 0);
  assert_int_equal(created, 0);
  assert_string_equal(json_string_value(json_object_get(row, "name")), "first"); /* the first row stays */
  json_decref(row);
  assert_int_equal(put(s, B, "optimizer", NULL, &created, NULL), 0);
  assert_int_equal(pw_store_weights_list_json(s, &j, &err), 0);
  assert_int_equal(json_array_size(json_object_get(j, "checkpoints")), 2);
  json_decref(j);
  assert_int_equal(pw_store_weights_json(s, C, &j, &err), PW_ENOENT);

  /* unknown weights: refused at init, nothing inserted */
  int64_t id = 0, before = raw_int(path, "SELECT count(*) FROM jobs");
  memset(&err, 0, sizeof err);
  assert_int_equal(job(s, A, C, &id, &err), PW_ESPEC);
  assert_string_equal(err.path, "init");
  assert_non_null(strstr(err.msg, C));
  assert_int_equal(raw_int(path, "SELECT count(*) FROM jobs"), before);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM job_weights"), 0);

  /* a live job holds both its model and its optimizer weights */
  assert_int_equal(job(s, A, B, &id, &err), 0);
  char jid[32];
  snprintf(jid, sizeof jid, "job %lld", (long long)id);
  const char *held[] = {A, B};
  for (int k = 0; k < 2; k++) {
    memset(&err, 0, sizeof err);
    assert_int_equal(pw_store_weights_delete(s, held[k], NULL, &err), PW_ECONFLICT);
    assert_non_null(strstr(err.msg, jid));
  }
  assert_int_equal(pw_store_job_set_state(s, id, PW_JOB_CANCELLED, "test", NULL, &err), 0);
  assert_int_equal(pw_store_weights_delete(s, A, &row, &err), 0);
  assert_string_equal(json_string_value(json_object_get(row, "id")), A);
  json_decref(row);
  assert_int_equal(pw_store_weights_delete(s, A, NULL, &err), PW_ENOENT);
  assert_int_equal(pw_store_weights_delete(s, B, NULL, &err), 0);

  /* writes fail under fault injection, and nothing is kept */
  pw_store_fault_inject(0, 1);
  assert_int_equal(put(s, C, "model", NULL, &created, NULL), PW_EIO);
  pw_store_fault_inject(-1, 0);
  assert_int_equal(pw_store_weights_json(s, C, &j, &err), PW_ENOENT);
  pw_store_close(s);
}

STORETEST_FIXTURE(g_dir, "w")

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_migration_3_to_4),
      cmocka_unit_test(test_weights),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
