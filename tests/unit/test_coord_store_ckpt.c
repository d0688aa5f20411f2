/* test_coord_store_ckpt: checkpoints in the coordinator's store.
 *  - migration 3 -> 4: a schema-3 database (a job in it) opens as schema 4
 *    with the checkpoint tables, the job intact;
 *  - shards and completeness: a step is complete only once every stage's
 *    model AND optimizer shard is in; a repeated shard changes nothing;
 *    shards of stages beyond the partition do not count;
 *  - retention: the newest keep complete steps stay, older complete ones
 *    and incomplete ones older than the newest complete go; the newest
 *    complete step always stays (keep 1);
 *  - purge: every row of the job goes, another job's stay;
 *  - a write failing as on a full disk changes nothing;
 *  - the files: a writer refuses a wrong CRC32C and a body that is not
 *    safetensors and leaves no temporary file; pw_ck_remove of a step and
 *    of a job. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoints.h"
#include "crc32c.h"
#include "safetensors.h"
#include "store.h"
#include "storetest.h"

static char g_dir[64];

static pw_store *open_at(const char *name, char *path, size_t cap) { return store_open_at(g_dir, name, path, cap); }

static int64_t job(pw_store *s) {
  pw_job_new j = {.name = "j", .spec = "{}", .steps = 20, .pp = 2, .dp = 1, .virtual_stages = 1, .microbatches = 1,
                  .schedule = "gpipe", .model = "m"};
  int64_t id = 0;
  pw_err err = {0};
  assert_int_equal(pw_store_job_insert(s, &j, &id, &err), 0);
  return id;
}

/* Both stages' two shards of step; returns whether the last completed it. */
static int whole_step(pw_store *s, int64_t id, int step) {
  pw_err err = {0};
  int complete = 0;
  for (int k = 0; k < 4; k++) {
    assert_int_equal(pw_store_ckpt_shard(s, id, 1, step, k / 2, k % 2, 100, "0badc0de", 2, &complete, &err), 0);
    if (k < 3) assert_false(complete);
  }
  return complete;
}

static int n_steps(pw_store *s, int64_t id) {
  json_t *j = NULL;
  pw_err err = {0};
  assert_int_equal(pw_store_ckpts_json(s, id, &j, &err), 0);
  int n = (int)json_array_size(json_object_get(j, "checkpoints"));
  json_decref(j);
  return n;
}

static void test_migration_3_to_4(void **state) {
  char path[256];
  pw_store *s = open_at("v3.db", path, sizeof path);
  int64_t id = job(s);
  pw_store_close(s);
  raw_exec(path, PW_TEST_BACK_TO_4 "DROP TABLE ckpt_shards; DROP TABLE ckpt_steps; DROP TABLE job_weights; DROP TABLE weights; "
                 "PRAGMA user_version = 3;");
  pw_err err = {0};
  assert_int_equal(pw_store_open(path, &s, &err), 0);
  assert_int_equal(pw_store_schema_version(s), PW_TEST_SCHEMA);
  json_t *j = NULL;
  assert_int_equal(pw_store_job_json(s, id, 0, &j, &err), 0);
  json_decref(j);
  assert_int_equal(n_steps(s, id), 0);
  int step = 0;
  assert_int_equal(pw_store_ckpt_latest(s, id, &step, NULL, &err), PW_ENOENT);
  pw_store_close(s);
}

static void test_completeness(void **state) {
  char path[256];
  pw_store *s = open_at("c.db", path, sizeof path);
  int64_t id = job(s);
  pw_err err = {0};
  int complete = -1, step = 0, n = 0;
  /* every model shard but no optimizer one: not a step */
  assert_int_equal(pw_store_ckpt_shard(s, id, 1, 5, 0, 0, 10, "x", 2, &complete, &err), 0);
  assert_int_equal(pw_store_ckpt_shard(s, id, 1, 5, 1, 0, 10, "x", 2, &complete, &err), 0);
  assert_false(complete);
  /* the same shard again, and a stage beyond the partition: still not */
  assert_int_equal(pw_store_ckpt_shard(s, id, 1, 5, 1, 0, 10, "x", 2, &complete, &err), 0);
  assert_int_equal(pw_store_ckpt_shard(s, id, 1, 5, 0, 1, 10, "x", 2, &complete, &err), 0);
  assert_false(complete);
  assert_int_equal(pw_store_ckpt_step(s, id, 5, NULL, &err), PW_ENOENT);
  assert_non_null(strstr(err.msg, "step 5"));
  assert_int_equal(pw_store_ckpt_latest(s, id, &step, NULL, &err), PW_ENOENT);
  /* bad arguments are refused before the store */
  assert_int_equal(pw_store_ckpt_shard(s, id, 1, 5, 2, 1, 10, "x", 2, &complete, &err), PW_EINVAL);
  assert_int_equal(pw_store_ckpt_shard(s, id, 1, 0, 0, 1, 10, "x", 2, &complete, &err), PW_EINVAL);
  /* the last shard completes it */
  assert_int_equal(pw_store_ckpt_shard(s, id, 1, 5, 1, 1, 10, "x", 2, &complete, &err), 0);
  assert_true(complete);
  assert_int_equal(pw_store_ckpt_step(s, id, 5, &n, &err), 0);
  assert_int_equal(n, 2);
  assert_int_equal(pw_store_ckpt_latest(s, id, &step, &n, &err), 0);
  assert_int_equal(step, 5);
  json_t *j = NULL;
  assert_int_equal(pw_store_ckpts_json(s, id, &j, &err), 0);
  json_t *row = json_array_get(json_object_get(j, "checkpoints"), 0);
  assert_int_equal(json_integer_value(json_object_get(row, "bytes")), 40);
  assert_int_equal(json_integer_value(json_object_get(row, "stages")), 2);
  json_decref(j);
  /* a full disk: the shard is not recorded */
  pw_store_fault_inject(0, 1);
  assert_int_equal(pw_store_ckpt_shard(s, id, 1, 6, 0, 0, 10, "x", 2, &complete, &err), PW_EIO);
  pw_store_fault_inject(-1, 0);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM ckpt_shards WHERE step = 6"), 0);
  pw_store_close(s);
}

static void test_retention_and_purge(void **state) {
  char path[256];
  pw_store *s = open_at("r.db", path, sizeof path);
  int64_t id = job(s), other = job(s);
  pw_err err = {0};
  int *gone = NULL, n_gone = 0;
  for (int st = 1; st <= 20; st++) {
    assert_true(whole_step(s, id, st));
    assert_int_equal(pw_store_ckpt_prune(s, id, 3, &gone, &n_gone, &err), 0);
    /* from step 4 on, exactly the step falling out of the newest 3 goes */
    assert_int_equal(n_gone, st > 3 ? 1 : 0);
    if (st > 3) assert_int_equal(gone[0], st - 3);
    free(gone);
  }
  assert_true(whole_step(s, other, 1));
  assert_int_equal(n_steps(s, id), 3);
  assert_int_equal(pw_store_ckpt_step(s, id, 17, NULL, &err), PW_ENOENT);
  assert_int_equal(pw_store_ckpt_step(s, id, 18, NULL, &err), 0);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM ckpt_shards WHERE job_id = 1"), 12);
  /* a partial newer step stays (it may complete); a partial older one goes */
  int complete = 0;
  assert_int_equal(pw_store_ckpt_shard(s, id, 2, 21, 0, 0, 10, "x", 2, &complete, &err), 0);
  /* step 19 made partial, as a run that died mid-upload leaves one */
  raw_exec(path, "DELETE FROM ckpt_shards WHERE job_id = 1 AND step = 19 AND NOT (stage = 0 AND kind = 'model');"
                 "DELETE FROM ckpt_steps WHERE job_id = 1 AND step = 19");
  assert_int_equal(pw_store_ckpt_prune(s, id, 3, &gone, &n_gone, &err), 0);
  assert_int_equal(n_gone, 1);
  assert_int_equal(gone[0], 19);
  free(gone);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM ckpt_shards WHERE job_id = 1 AND step = 21"), 1);
  /* keep 1: only the newest complete step, the one a resume needs */
  assert_int_equal(pw_store_ckpt_prune(s, id, 1, &gone, &n_gone, &err), 0);
  assert_int_equal(n_gone, 1);
  assert_int_equal(gone[0], 18);
  free(gone);
  int latest = 0;
  assert_int_equal(pw_store_ckpt_latest(s, id, &latest, NULL, &err), 0);
  assert_int_equal(latest, 20);
  assert_int_equal(pw_store_ckpt_prune(s, id, 0, &gone, &n_gone, &err), PW_EINVAL);
  /* purge: all of this job's rows, none of the other's */
  assert_int_equal(pw_store_ckpt_purge(s, id, &err), 0);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM ckpt_shards WHERE job_id = 1"), 0);
  assert_int_equal(n_steps(s, id), 0);
  assert_int_equal(n_steps(s, other), 1);
  pw_store_close(s);
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.' || strncmp(e->d_name, ".upload", 7) == 0;
  closedir(d);
  return n;
}

/* One shard through a writer with the stated CRC (NULL: the right one). */
static int write_shard(const void *bytes, size_t n, int stage, const char *crc, pw_err *err) {
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", pw_crc32c(0, bytes, n));
  pw_ck_sum sum;
  assert_int_equal(pw_ck_sum_parse('c', crc ? crc : hex, &sum, err), 0);
  pw_ck_writer *w = NULL;
  assert_int_equal(pw_ck_writer_open(g_dir, 7, 3, stage, 0, &sum, &w, err), 0);
  int rc = pw_ck_writer_write(w, bytes, n / 2, err);
  if (!rc) rc = pw_ck_writer_write(w, (const char *)bytes + n / 2, n - n / 2, err);
  if (!rc) rc = pw_ck_writer_commit(w, err);
  pw_ck_writer_free(w);
  return rc;
}

static void test_files(void **state) {
  pw_err err = {0};
  pw_ck_sum sum;
  assert_int_equal(pw_ck_sum_parse('c', "12345", &sum, &err), PW_EINVAL);
  assert_non_null(strstr(err.msg, "X-Pipewright-Crc32c"));
  assert_int_equal(pw_ck_sum_parse('c', "1234567g", &sum, &err), PW_EINVAL);
  assert_int_equal(pw_ck_sum_parse('c', "DEADBEEF", &sum, &err), 0);
  assert_string_equal(sum.hex, "deadbeef");
  char src[256], dir[256];
  snprintf(src, sizeof src, "%s/src.safetensors", g_dir);
  float v[4] = {1, 2, 3, 4};
  pw_st_tensor t = {"w", PW_ST_F32, 1, {4}, v};
  assert_int_equal(pw_st_write(src, &t, 1, NULL, 0, &err), 0);
  FILE *f = fopen(src, "rb");
  char bytes[4096];
  size_t n = fread(bytes, 1, sizeof bytes, f);
  fclose(f);
  assert_int_equal(pw_ck_dir(g_dir, 7, 3, dir, sizeof dir, &err), 0);
  /* a wrong checksum: refused naming both, nothing left */
  assert_int_equal(write_shard(bytes, n, 0, "00000000", &err), PW_EFORMAT);
  assert_non_null(strstr(err.msg, "corrupted in transit"));
  assert_non_null(strstr(err.msg, "00000000"));
  assert_int_equal(count_entries(dir), 0);
  /* not safetensors (the CRC right): refused */
  assert_int_equal(write_shard("not a safetensors file", 22, 0, NULL, &err), PW_EFORMAT);
  assert_non_null(strstr(err.msg, "safetensors"));
  assert_int_equal(count_entries(dir), 0);
  /* right: in place under its name, byte for byte */
  assert_int_equal(write_shard(bytes, n, 0, NULL, &err), 0);
  assert_int_equal(write_shard(bytes, n, 1, NULL, &err), 0);
  assert_int_equal(count_entries(dir), 2);
  char p[300];
  assert_int_equal(pw_ck_shard_path(g_dir, 7, 3, 1, 0, p, sizeof p, &err), 0);
  struct stat sb;
  assert_int_equal(stat(p, &sb), 0);
  assert_int_equal((size_t)sb.st_size, n);
  /* gather: a shard missing (no optimizer files) is PW_ENOENT naming it */
  char out[300];
  snprintf(out, sizeof out, "%s/g.safetensors", g_dir);
  assert_int_equal(pw_ckpt_gather(g_dir, 7, 3, 2, 1, NULL, out, &err), PW_ENOENT);
  assert_non_null(strstr(err.msg, "stage 0's optimizer state"));
  assert_int_equal(pw_ckpt_gather(g_dir, 7, 3, 2, 0, "{\"a\":1}", out, &err), 0);
  pw_st_file *g = NULL;
  assert_int_equal(pw_st_open(out, &g, &err), 0);
  assert_int_equal(pw_st_count(g), 1); /* "w" in both stages: taken once */
  assert_string_equal(pw_st_meta_get(g, "step"), "3");
  pw_st_close(g);
  /* removal: a step, then the job's folder */
  assert_int_equal(pw_ck_remove(g_dir, 7, 3, &err), 0);
  assert_int_not_equal(stat(dir, &sb), 0);
  assert_int_equal(pw_ck_remove(g_dir, 7, 3, &err), 0); /* gone already: fine */
  assert_int_equal(write_shard(bytes, n, 0, NULL, &err), 0);
  assert_int_equal(pw_ck_remove(g_dir, 7, -1, &err), 0);
  assert_int_equal(pw_ck_dir(g_dir, 7, -1, dir, sizeof dir, &err), 0);
  assert_int_not_equal(stat(dir, &sb), 0);
}

STORETEST_FIXTURE(g_dir, "ck")

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_migration_3_to_4),
      cmocka_unit_test(test_completeness),
      cmocka_unit_test(test_retention_and_purge),
      cmocka_unit_test(test_files),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
