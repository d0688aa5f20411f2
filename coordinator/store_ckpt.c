/* store_ckpt: the checkpoint shards and complete steps (store.h). The
 * files are checkpoints.c's. Statements are prepared per call: these run
 * once per shard or step, never in a hot loop. Every write is one
 * transaction and goes through the store's fault injection. */
#include "store_int.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Prepares sql; NULL with err filled on failure. */
static sqlite3_stmt *prep(pw_store *s, const char *sql, pw_err *err) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
  if (rc != SQLITE_OK) {
    pw__store_fail(s, rc, err, "checkpoint statement");
    sqlite3_finalize(st);
    return NULL;
  }
  return st;
}

/* Steps a write statement to its end and finalizes it. */
static int run_done(pw_store *s, sqlite3_stmt *st, const char *what, pw_err *err) {
  int rc = sqlite3_step(st);
  int ret = rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : pw__store_fail(s, rc, err, what);
  sqlite3_finalize(st);
  return ret;
}

/* One integer from a query with a bound job (and optionally step); *found
 * says whether a row came. */
static int query_one(pw_store *s, const char *sql, int64_t job, int step, int64_t *v, int *found, pw_err *err) {
  sqlite3_stmt *st = prep(s, sql, err);
  if (!st) return err ? err->code : PW_EIO;
  sqlite3_bind_int64(st, 1, job);
  if (sqlite3_bind_parameter_count(st) >= 2) sqlite3_bind_int(st, 2, step);
  int rc = sqlite3_step(st), ret = 0;
  *found = rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL;
  if (*found) *v = sqlite3_column_int64(st, 0);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) ret = pw__store_fail(s, rc, err, "checkpoint");
  sqlite3_finalize(st);
  return ret;
}

int pw_store_ckpt_shard(pw_store *s, int64_t job_id, int64_t run_id, int step, int stage, int optimizer,
                        int64_t bytes, const char *checksum, int n_stages, int *complete, pw_err *err) {
  if (complete) *complete = 0;
  if (step < 1 || stage < 0 || n_stages < 1 || stage >= n_stages)
    return pw_err_set(err, PW_EINVAL, "checkpoint", "a shard needs step >= 1 and 0 <= stage < %d (got step %d, stage %d)",
                      n_stages, step, stage);
  int rc = pw__store_fault(s, err, "checkpoint shard");
  if (rc || (rc = pw__store_begin(s, 1, err))) return rc;
  sqlite3_stmt *st = prep(s,
                          "INSERT OR REPLACE INTO ckpt_shards(job_id, step, stage, kind, run_id, bytes, checksum, time) "
                          "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                          err);
  if (!st) goto fail_code;
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int(st, 2, step);
  sqlite3_bind_int(st, 3, stage);
  sqlite3_bind_text(st, 4, optimizer ? "optimizer" : "model", -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 5, run_id);
  sqlite3_bind_int64(st, 6, bytes);
  sqlite3_bind_text(st, 7, checksum ? checksum : "", -1, SQLITE_TRANSIENT);
  sqlite3_bind_double(st, 8, pw_store_now());
  if ((rc = run_done(s, st, "checkpoint shard", err))) goto fail;
  /* every stage's two shards, counting only stages of this partition */
  sqlite3_stmt *q = prep(s, "SELECT count(*) FROM ckpt_shards WHERE job_id = ?1 AND step = ?2 AND stage < ?3", err);
  if (!q) goto fail_code;
  sqlite3_bind_int64(q, 1, job_id);
  sqlite3_bind_int(q, 2, step);
  sqlite3_bind_int(q, 3, n_stages);
  int qr = sqlite3_step(q);
  int64_t have = qr == SQLITE_ROW ? sqlite3_column_int64(q, 0) : 0;
  sqlite3_finalize(q);
  if (qr != SQLITE_ROW) {
    rc = pw__store_fail(s, qr, err, "checkpoint shard");
    goto fail;
  }
  if (have == 2 * (int64_t)n_stages) {
    sqlite3_stmt *c = prep(s,
                           "INSERT OR IGNORE INTO ckpt_steps(job_id, step, n_stages, run_id, bytes, time) "
                           "SELECT ?1, ?2, ?3, ?4, total(bytes), ?5 FROM ckpt_shards WHERE job_id = ?1 AND step = ?2",
                           err);
    if (!c) goto fail_code;
    sqlite3_bind_int64(c, 1, job_id);
    sqlite3_bind_int(c, 2, step);
    sqlite3_bind_int(c, 3, n_stages);
    sqlite3_bind_int64(c, 4, run_id);
    sqlite3_bind_double(c, 5, pw_store_now());
    if ((rc = run_done(s, c, "checkpoint step", err))) goto fail;
    if (complete) *complete = 1;
  }
  return pw__store_commit(s, err);
fail_code:
  rc = err ? err->code : PW_EIO;
fail:
  pw__store_rollback(s);
  if (complete) *complete = 0;
  return rc;
}

int pw_store_ckpt_latest(pw_store *s, int64_t job_id, int *step, int *n_stages, pw_err *err) {
  return pw_store_ckpt_latest_upto(s, job_id, INT_MAX, step, n_stages, err);
}

int pw_store_ckpt_latest_upto(pw_store *s, int64_t job_id, int max_step, int *step, int *n_stages, pw_err *err) {
  sqlite3_stmt *st = prep(
      s, "SELECT step, n_stages FROM ckpt_steps WHERE job_id = ?1 AND step <= ?2 ORDER BY step DESC LIMIT 1", err);
  if (!st) return err ? err->code : PW_EIO;
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int(st, 2, max_step);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) {
    *step = sqlite3_column_int(st, 0);
    if (n_stages) *n_stages = sqlite3_column_int(st, 1);
  } else if (rc == SQLITE_DONE) {
    ret = pw_err_set(err, PW_ENOENT, "checkpoint", "job %lld has no complete checkpoint yet", (long long)job_id);
  } else {
    ret = pw__store_fail(s, rc, err, "checkpoint");
  }
  sqlite3_finalize(st);
  return ret;
}

int pw_store_ckpt_step(pw_store *s, int64_t job_id, int step, int *n_stages, pw_err *err) {
  int64_t v = 0;
  int found = 0;
  int rc = query_one(s, "SELECT n_stages FROM ckpt_steps WHERE job_id = ?1 AND step = ?2", job_id, step, &v, &found,
                     err);
  if (rc) return rc;
  if (!found)
    return pw_err_set(err, PW_ENOENT, "step", "job %lld has no retained complete checkpoint of step %d",
                      (long long)job_id, step);
  if (n_stages) *n_stages = (int)v;
  return 0;
}

int pw_store_ckpts_json(pw_store *s, int64_t job_id, json_t **out, pw_err *err) {
  *out = NULL;
  sqlite3_stmt *st =
      prep(s, "SELECT step, n_stages, bytes, time, run_id FROM ckpt_steps WHERE job_id = ?1 ORDER BY step", err);
  if (!st) return err ? err->code : PW_EIO;
  sqlite3_bind_int64(st, 1, job_id);
  json_t *arr = json_array();
  int rc, ret = 0;
  while (arr && (rc = sqlite3_step(st)) == SQLITE_ROW)
    json_array_append_new(arr, json_pack("{s:o, s:o, s:o, s:o, s:o}", "step", pw__store_col(st, 0), "stages",
                                         pw__store_col(st, 1), "bytes", pw__store_col(st, 2), "time",
                                         pw__store_col(st, 3), "run", pw__store_col(st, 4)));
  if (!arr) ret = pw_err_set(err, PW_ENOMEM, "checkpoints", "out of memory");
  else if (rc != SQLITE_DONE) ret = pw__store_fail(s, rc, err, "checkpoints");
  sqlite3_finalize(st);
  if (ret) {
    json_decref(arr);
    return ret;
  }
  *out = json_pack("{s:o}", "checkpoints", arr);
  return *out ? 0 : pw_err_set(err, PW_ENOMEM, "checkpoints", "out of memory");
}

/* The steps (any shard) that retention removes: complete ones older than
 * the newest `keep`, incomplete ones older than the newest complete. */
#define PRUNE_WHERE                                                                                         \
  " WHERE job_id = ?1 AND (step IN (SELECT step FROM ckpt_steps WHERE job_id = ?1 ORDER BY step DESC "     \
  "   LIMIT -1 OFFSET ?2) OR (step NOT IN (SELECT step FROM ckpt_steps WHERE job_id = ?1) AND step < "      \
  "   (SELECT max(step) FROM ckpt_steps WHERE job_id = ?1)))"

int pw_store_ckpt_prune(pw_store *s, int64_t job_id, int keep, int **gone, int *n_gone, pw_err *err) {
  *gone = NULL;
  *n_gone = 0;
  if (keep < 1) return pw_err_set(err, PW_EINVAL, "train.keep_checkpoints", "must be >= 1 (got %d)", keep);
  int rc = pw__store_fault(s, err, "checkpoint retention");
  if (rc || (rc = pw__store_begin(s, 1, err))) return rc;
  int *steps = NULL, n = 0, cap = 0;
  sqlite3_stmt *st = prep(s, "SELECT DISTINCT step FROM ckpt_shards" PRUNE_WHERE " ORDER BY step", err);
  if (!st) goto fail_code;
  sqlite3_bind_int64(st, 1, job_id);
  sqlite3_bind_int(st, 2, keep);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      int *ns = realloc(steps, sizeof *steps * (size_t)cap);
      if (!ns) {
        sqlite3_finalize(st);
        rc = pw_err_set(err, PW_ENOMEM, "checkpoints", "out of memory");
        goto fail;
      }
      steps = ns;
    }
    steps[n++] = sqlite3_column_int(st, 0);
  }
  rc = rc == SQLITE_DONE ? 0 : pw__store_fail(s, rc, err, "checkpoint retention");
  sqlite3_finalize(st);
  if (rc || !n) goto fail; /* nothing to delete: no write */
  for (int k = 0; k < n; k++) {
    static const char *const del[2] = {"DELETE FROM ckpt_shards WHERE job_id = ?1 AND step = ?2",
                                       "DELETE FROM ckpt_steps WHERE job_id = ?1 AND step = ?2"};
    for (int d = 0; d < 2; d++) {
      sqlite3_stmt *x = prep(s, del[d], err);
      if (!x) goto fail_code;
      sqlite3_bind_int64(x, 1, job_id);
      sqlite3_bind_int(x, 2, steps[k]);
      if ((rc = run_done(s, x, "checkpoint retention", err))) goto fail;
    }
  }
  if ((rc = pw__store_commit(s, err))) goto out;
  *gone = steps;
  *n_gone = n;
  return 0;
fail_code:
  rc = err ? err->code : PW_EIO;
fail:
  pw__store_rollback(s);
out:
  free(steps);
  return rc;
}

int pw_store_ckpt_purge(pw_store *s, int64_t job_id, pw_err *err) {
  int rc = pw__store_fault(s, err, "checkpoint purge");
  if (rc || (rc = pw__store_begin(s, 1, err))) return rc;
  static const char *const del[2] = {"DELETE FROM ckpt_shards WHERE job_id = ?1",
                                     "DELETE FROM ckpt_steps WHERE job_id = ?1"};
  for (int d = 0; d < 2; d++) {
    sqlite3_stmt *x = prep(s, del[d], err);
    if (!x) {
      rc = err ? err->code : PW_EIO;
      pw__store_rollback(s);
      return rc;
    }
    sqlite3_bind_int64(x, 1, job_id);
    if ((rc = run_done(s, x, "checkpoint purge", err))) {
      pw__store_rollback(s);
      return rc;
    }
  }
  return pw__store_commit(s, err);
}
