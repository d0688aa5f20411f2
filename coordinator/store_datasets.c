/* store_datasets: the datasets table and the jobs' links to it (store.h).
 * The files themselves are datasets.c's. Every write is checked and goes
 * through the store's fault injection like the others. */
#include "store_int.h"

#include <stdio.h>
#include <string.h>

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

static const pw__store_kind kind = {.st_insert = PW_ST_DS_INSERT,
                                    .st_get = PW_ST_DS_GET,
                                    .st_list = PW_ST_DS_LIST,
                                    .st_user = PW_ST_DS_USER,
                                    .st_delete = PW_ST_DS_DELETE,
                                    .row = ds_row,
                                    .what = "dataset",
                                    .param = "ds",
                                    .missing = "dataset",
                                    .are = "is",
                                    .list = "datasets"};

static void bind_opt_int(sqlite3_stmt *st, int i, int64_t v) {
  if (v < 0) sqlite3_bind_null(st, i);
  else sqlite3_bind_int64(st, i, v);
}

static void ds_bind(sqlite3_stmt *st, const void *arg) {
  const pw_dataset_new *d = arg;
  sqlite3_bind_text(st, 1, d->id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, d->size);
  sqlite3_bind_text(st, 3, d->format, -1, SQLITE_STATIC);
  if (d->name && d->name[0]) sqlite3_bind_text(st, 4, d->name, -1, SQLITE_STATIC);
  else sqlite3_bind_null(st, 4);
  sqlite3_bind_double(st, 5, pw_store_now());
  bind_opt_int(st, 6, d->vocab_size);
  bind_opt_int(st, 7, d->width);
  bind_opt_int(st, 8, d->n_tokens);
}

int pw_store_dataset_insert(pw_store *s, const pw_dataset_new *d, int *created, json_t **out, pw_err *err) {
  if (!d || !d->id || strlen(d->id) != 64 || !d->format) {
    int rc = pw__store_fault(s, err, "insert dataset");
    if (out) *out = NULL;
    return rc ? rc : pw_err_set(err, PW_EINVAL, "dataset", "a dataset needs an id (64 hex digits) and a format");
  }
  return pw__store_obj_insert(s, &kind, d->id, ds_bind, d, created, out, err);
}

int pw_store_dataset_json(pw_store *s, const char *id, json_t **out, pw_err *err) {
  return pw__store_obj_get(s, &kind, id, out, err);
}

int pw_store_datasets_json(pw_store *s, json_t **out, pw_err *err) { return pw__store_obj_list(s, &kind, out, err); }

int pw_store_dataset_delete(pw_store *s, const char *id, json_t **out, pw_err *err) {
  return pw__store_obj_delete(s, &kind, id, out, err);
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
