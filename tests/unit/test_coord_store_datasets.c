/* test_coord_store_datasets: the store's datasets table and the jobs'
 * links to it.
 *
 *  - migration 2 -> 3: a schema-2 database (jobs and all) opens as schema 3
 *    with its rows and an empty datasets table;
 *  - a dataset is recorded once (the second insert keeps the first row and
 *    says so), listed, read, deleted;
 *  - a job naming a dataset that is not stored is refused (PW_ESPEC at
 *    data.dataset) and nothing is inserted; a job naming a stored one
 *    holds it: delete is PW_ECONFLICT naming the job until the job ends;
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

static int job(pw_store *s, const char *dataset, int64_t *id, pw_err *err) {
  pw_job_new j = {.name = "j", .spec = "{}", .steps = 1, .pp = 1, .dp = 1, .virtual_stages = 1, .microbatches = 1,
                  .schedule = "gpipe", .model = "m", .dataset = dataset};
  return pw_store_job_insert(s, &j, id, err);
}

static void test_migration_2_to_3(void **state) {
  char path[256];
  pw_store *s = open_at("v2.db", path, sizeof path);
  int64_t id = 0;
  pw_err err = {0};
  assert_int_equal(job(s, NULL, &id, &err), 0);
  pw_store_close(s);
  /* back to schema 2 as it was: no datasets tables (nor schema 4's) */
  raw_exec(path, PW_TEST_BACK_TO_4 "DROP TABLE job_datasets; DROP TABLE datasets; DROP TABLE ckpt_shards; DROP TABLE ckpt_steps; "
                 "DROP TABLE job_weights; DROP TABLE weights; PRAGMA user_version = 2;");
  assert_int_equal(pw_store_open(path, &s, &err), 0);
  assert_int_equal(pw_store_schema_version(s), PW_TEST_SCHEMA);
  json_t *j = NULL;
  assert_int_equal(pw_store_job_json(s, id, 0, &j, &err), 0);
  json_decref(j);
  assert_int_equal(pw_store_datasets_json(s, &j, &err), 0);
  assert_int_equal(json_array_size(json_object_get(j, "datasets")), 0);
  json_decref(j);
  pw_store_close(s);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM sqlite_master WHERE name = 'job_datasets'"), 1);
}

static void test_datasets(void **state) {
  char path[256];
  pw_store *s = open_at("ds.db", path, sizeof path);
  pw_err err = {0};
  int created = -1;
  json_t *row = NULL;
  pw_dataset_new d = {.id = A, .size = 10, .format = "text", .name = "first", .vocab_size = -1, .width = -1,
                      .n_tokens = -1};
  assert_int_equal(pw_store_dataset_insert(s, &d, &created, &row, &err), 0);
  assert_int_equal(created, 1);
  assert_string_equal(json_string_value(json_object_get(row, "sha256")), A);
  assert_null(json_object_get(row, "vocab_size")); /* text: no token fields */
  json_decref(row);
  d.name = "second";
  assert_int_equal(pw_store_dataset_insert(s, &d, &created, &row, &err), 0);
  assert_int_equal(created, 0);
  assert_string_equal(json_string_value(json_object_get(row, "name")), "first");
  json_decref(row);
  pw_dataset_new t = {.id = B, .size = 42, .format = "tokens", .name = NULL, .vocab_size = 300, .width = 2,
                      .n_tokens = 5};
  assert_int_equal(pw_store_dataset_insert(s, &t, &created, NULL, &err), 0);
  assert_int_equal(pw_store_dataset_json(s, B, &row, &err), 0);
  assert_true(json_is_null(json_object_get(row, "name")));
  assert_int_equal(json_integer_value(json_object_get(row, "vocab_size")), 300);
  assert_int_equal(json_integer_value(json_object_get(row, "n_tokens")), 5);
  json_decref(row);
  assert_int_equal(pw_store_datasets_json(s, &row, &err), 0);
  assert_int_equal(json_array_size(json_object_get(row, "datasets")), 2);
  json_decref(row);

  /* a job naming an unknown dataset: refused, nothing inserted */
  int64_t id = 0;
  char c[] = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
  assert_int_equal(job(s, c, &id, &err), PW_ESPEC);
  assert_string_equal(err.path, "data.dataset");
  assert_int_equal(raw_int(path, "SELECT count(*) FROM jobs"), 0);
  /* a job naming A holds it until it ends */
  assert_int_equal(job(s, A, &id, &err), 0);
  char got[65];
  assert_int_equal(pw_store_job_dataset(s, id, got, &err), 0);
  assert_string_equal(got, A);
  assert_int_equal(pw_store_dataset_delete(s, A, NULL, &err), PW_ECONFLICT);
  char want[32];
  snprintf(want, sizeof want, "job %lld", (long long)id);
  assert_non_null(strstr(err.msg, want));
  assert_int_equal(pw_store_job_set_state(s, id, PW_JOB_PLANNING, NULL, NULL, &err), 0);
  assert_int_equal(pw_store_dataset_delete(s, A, NULL, &err), PW_ECONFLICT);
  assert_int_equal(pw_store_job_set_state(s, id, PW_JOB_CANCELLED, "test", NULL, &err), 0);
  assert_int_equal(pw_store_dataset_delete(s, A, &row, &err), 0);
  assert_string_equal(json_string_value(json_object_get(row, "id")), A);
  json_decref(row);
  assert_int_equal(pw_store_dataset_json(s, A, &row, &err), PW_ENOENT);
  assert_int_equal(pw_store_dataset_delete(s, A, NULL, &err), PW_ENOENT);
  /* the finished job still says what it read */
  assert_int_equal(pw_store_job_dataset(s, id, got, &err), 0);
  assert_string_equal(got, A);

  /* writes fail as a full disk would, and nothing changes */
  pw_store_fault_inject(0, 1);
  assert_int_equal(pw_store_dataset_delete(s, B, NULL, &err), PW_EIO);
  assert_int_equal(pw_store_dataset_json(s, B, &row, &err), 0);
  json_decref(row);
  pw_store_fault_inject(0, 1);
  d.id = A;
  assert_int_equal(pw_store_dataset_insert(s, &d, &created, NULL, &err), PW_EIO);
  pw_store_fault_inject(-1, 0);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM datasets"), 1);
  pw_store_close(s);
}

STORETEST_FIXTURE(g_dir, "ds")

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_migration_2_to_3),
      cmocka_unit_test(test_datasets),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
