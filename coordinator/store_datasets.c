/* store_datasets: the datasets table and the jobs' links to it (store.h).
 * The files themselves are datasets.c's. Every write is checked and goes
 * through the store's fault injection like the others. */
#include "store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STMT(var, id)                               \
  sqlite3_stmt *var = pw__store_stmt(s, (id), err); \
  if (!var) return err ? err->code : PW_EIO

/* A row of PW__DS_COLS as the API's dataset object. */
static json_t *ds_row(sqlite3_stmt *st) {
  json_t *o = json_object();
  if (!o) return NULL;
  json_object_set_new(o, "id", pw__store_col(st, 0));
  json_object_set_new(o, "sha256", pw__store_col(st, 0));
  json_object_set_new(o, "size", pw__store_col(st, 1));
  json_object_set_new(o, "format", pw__store_col(st, 2));
  json_object_set_new(o, "name", pw__store_col(st, 3));
  json_object_set_new(o, "created", pw__store_col(st, 4));
  const char *fmt = (const char *)sqlite3_column_text(st, 2);
  if (fmt && !strcmp(fmt, "tokens") && sqlite3_column_type(st, 5) != SQLITE_NULL) {
    json_object_set_new(o, "vocab_size", pw__store_col(st, 5));
    json_object_set_new(o, "width", pw__store_col(st, 6));
    json_object_set_new(o, "n_tokens", pw__store_col(st, 7));
  }
  return o;
}

/* One row by id: 0 with *out, PW_ENOENT, or a store error. */
static int ds_get(pw_store *s, const char *id, json_t **out, pw_err *err) {
  *out = NULL;
  STMT(st, PW_ST_DS_GET);
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) {
    if (!(*out = ds_row(st))) ret = pw_err_set(err, PW_ENOMEM, "ds", "out of memory");
  } else if (rc == SQLITE_DONE) {
    ret = pw_err_set(err, PW_ENOENT, "ds", "no dataset %.64s", id);
  } else {
    ret = pw__store_fail(s, rc, err, "dataset");
  }
  sqlite3_reset(st);
  return ret;
}

static void bind_opt_int(sqlite3_stmt *st, int i, int64_t v) {
  if (v < 0) sqlite3_bind_null(st, i);
  else sqlite3_bind_int64(st, i, v);
}

int pw_store_dataset_insert(pw_store *s, const pw_dataset_new *d, int *created, json_t **out, pw_err *err) {
  if (out) *out = NULL;
  int rc = pw__store_fault(s, err, "insert dataset");
  if (rc) return rc;
  if (!d || !d->id || strlen(d->id) != 64 || !d->format)
    return pw_err_set(err, PW_EINVAL, "dataset", "a dataset needs an id (64 hex digits) and a format");
  if ((rc = pw__store_begin(s, 1, err))) return rc;
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_DS_INSERT, err);
  if (!st) {
    rc = err ? err->code : PW_EIO;
    goto fail;
  }
  sqlite3_bind_text(st, 1, d->id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, d->size);
  sqlite3_bind_text(st, 3, d->format, -1, SQLITE_STATIC);
  if (d->name && d->name[0]) sqlite3_bind_text(st, 4, d->name, -1, SQLITE_STATIC);
  else sqlite3_bind_null(st, 4);
  sqlite3_bind_double(st, 5, pw_store_now());
  bind_opt_int(st, 6, d->vocab_size);
  bind_opt_int(st, 7, d->width);
  bind_opt_int(st, 8, d->n_tokens);
  int step = sqlite3_step(st);
  sqlite3_reset(st);
  if (step != SQLITE_DONE) {
    rc = pw__store_fail(s, step, err, "insert dataset");
    goto fail;
  }
  int added = sqlite3_changes(s->db) > 0;
  json_t *row = NULL;
  if ((out && (rc = ds_get(s, d->id, &row, err))) || (rc = pw__store_commit(s, err))) {
    json_decref(row);
    goto fail;
  }
  if (created) *created = added;
  if (out) *out = row;
  return 0;
fail:
  pw__store_rollback(s);
  return rc;
}

int pw_store_dataset_json(pw_store *s, const char *id, json_t **out, pw_err *err) { return ds_get(s, id, out, err); }

int pw_store_datasets_json(pw_store *s, json_t **out, pw_err *err) {
  *out = NULL;
  STMT(st, PW_ST_DS_LIST);
  json_t *arr = json_array();
  int rc, ret = 0;
  while (arr && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *o = ds_row(st);
    if (!o || json_array_append_new(arr, o)) {
      ret = pw_err_set(err, PW_ENOMEM, "datasets", "out of memory");
      break;
    }
  }
  if (!arr) ret = pw_err_set(err, PW_ENOMEM, "datasets", "out of memory");
  else if (!ret && rc != SQLITE_DONE) ret = pw__store_fail(s, rc, err, "datasets");
  sqlite3_reset(st);
  if (ret) {
    json_decref(arr);
    return ret;
  }
  *out = json_pack("{s:o}", "datasets", arr);
  return *out ? 0 : pw_err_set(err, PW_ENOMEM, "datasets", "out of memory");
}

int pw_store_dataset_delete(pw_store *s, const char *id, json_t **out, pw_err *err) {
  if (out) *out = NULL;
  int rc = pw__store_fault(s, err, "delete dataset");
  if (rc) return rc;
  if ((rc = pw__store_begin(s, 1, err))) return rc;
  json_t *row = NULL;
  if ((rc = ds_get(s, id, &row, err))) goto fail;
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_DS_USER, err);
  if (!st) goto fail_stmt;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    rc = pw_err_set(err, PW_ECONFLICT, "ds", "dataset %.12s... is in use by job %lld (%s): cancel it or wait for it to end",
                    id, (long long)sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1));
    sqlite3_reset(st);
    goto fail;
  }
  sqlite3_reset(st);
  if (step != SQLITE_DONE) {
    rc = pw__store_fail(s, step, err, "dataset users");
    goto fail;
  }
  if (!(st = pw__store_stmt(s, PW_ST_DS_DELETE, err))) goto fail_stmt;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  step = sqlite3_step(st);
  sqlite3_reset(st);
  if (step != SQLITE_DONE) {
    rc = pw__store_fail(s, step, err, "delete dataset");
    goto fail;
  }
  if ((rc = pw__store_commit(s, err))) goto fail;
  if (out) *out = row;
  else json_decref(row);
  return 0;
fail_stmt:
  rc = err ? err->code : PW_EIO;
fail:
  json_decref(row);
  pw__store_rollback(s);
  return rc;
}

int pw_store_job_dataset(pw_store *s, int64_t job_id, char id[65], pw_err *err) {
  id[0] = 0;
  STMT(st, PW_ST_JOB_DS_GET);
  sqlite3_bind_int64(st, 1, job_id);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) {
    const char *v = (const char *)sqlite3_column_text(st, 0);
    snprintf(id, 65, "%s", v ? v : "");
  } else if (rc != SQLITE_DONE) {
    ret = pw__store_fail(s, rc, err, "job dataset");
  }
  sqlite3_reset(st);
  return ret;
}
