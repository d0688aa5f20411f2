/* store_weights: the weights table and the jobs' links to it (store.h).
 * The files themselves are weights.c's. Every write is checked and goes
 * through the store's fault injection like the others. */
#include "store_int.h"

#include <stdio.h>
#include <string.h>

#define STMT(var, id)                               \
  sqlite3_stmt *var = pw__store_stmt(s, (id), err); \
  if (!var) return err ? err->code : PW_EIO

/* A row of PW__W_COLS as the API's checkpoint object. */
static json_t *w_row(sqlite3_stmt *st) {
  json_t *o = json_object();
  if (!o) return NULL;
  json_object_set_new(o, "id", pw__store_col(st, 0));
  json_object_set_new(o, "sha256", pw__store_col(st, 0));
  json_object_set_new(o, "size", pw__store_col(st, 1));
  json_object_set_new(o, "kind", pw__store_col(st, 2));
  json_object_set_new(o, "name", pw__store_col(st, 3));
  json_object_set_new(o, "source", pw__store_col(st, 4));
  json_object_set_new(o, "created", pw__store_col(st, 5));
  json_object_set_new(o, "n_tensors", pw__store_col(st, 6));
  json_object_set_new(o, "params", pw__store_col(st, 7));
  return o;
}

static int w_get(pw_store *s, const char *id, json_t **out, pw_err *err) {
  *out = NULL;
  STMT(st, PW_ST_W_GET);
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) {
    if (!(*out = w_row(st))) ret = pw_err_set(err, PW_ENOMEM, "ck", "out of memory");
  } else if (rc == SQLITE_DONE) {
    ret = pw_err_set(err, PW_ENOENT, "ck", "no stored weights %.64s", id);
  } else {
    ret = pw__store_fail(s, rc, err, "weights");
  }
  sqlite3_reset(st);
  return ret;
}

int pw_store_weights_insert(pw_store *s, const pw_weights_new *w, int *created, json_t **out, pw_err *err) {
  if (out) *out = NULL;
  int rc = pw__store_fault(s, err, "insert weights");
  if (rc) return rc;
  if (!w || !w->id || strlen(w->id) != 64 || !w->kind)
    return pw_err_set(err, PW_EINVAL, "weights", "weights need an id (64 hex digits) and a kind");
  if ((rc = pw__store_begin(s, 1, err))) return rc;
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_W_INSERT, err);
  if (!st) {
    rc = err ? err->code : PW_EIO;
    goto fail;
  }
  sqlite3_bind_text(st, 1, w->id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, w->size);
  sqlite3_bind_text(st, 3, w->kind, -1, SQLITE_STATIC);
  if (w->name && w->name[0]) sqlite3_bind_text(st, 4, w->name, -1, SQLITE_STATIC);
  else sqlite3_bind_null(st, 4);
  if (w->source && w->source[0]) sqlite3_bind_text(st, 5, w->source, -1, SQLITE_STATIC);
  else sqlite3_bind_null(st, 5);
  sqlite3_bind_double(st, 6, pw_store_now());
  sqlite3_bind_int64(st, 7, w->n_tensors);
  sqlite3_bind_int64(st, 8, w->params);
  int step = sqlite3_step(st);
  sqlite3_reset(st);
  if (step != SQLITE_DONE) {
    rc = pw__store_fail(s, step, err, "insert weights");
    goto fail;
  }
  int added = sqlite3_changes(s->db) > 0;
  json_t *row = NULL;
  if ((out && (rc = w_get(s, w->id, &row, err))) || (rc = pw__store_commit(s, err))) {
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

int pw_store_weights_json(pw_store *s, const char *id, json_t **out, pw_err *err) { return w_get(s, id, out, err); }

int pw_store_weights_list_json(pw_store *s, json_t **out, pw_err *err) {
  *out = NULL;
  STMT(st, PW_ST_W_LIST);
  json_t *arr = json_array();
  int rc = SQLITE_DONE, ret = 0;
  while (arr && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *o = w_row(st);
    if (!o || json_array_append_new(arr, o)) {
      ret = pw_err_set(err, PW_ENOMEM, "checkpoints", "out of memory");
      break;
    }
  }
  if (!arr) ret = pw_err_set(err, PW_ENOMEM, "checkpoints", "out of memory");
  else if (!ret && rc != SQLITE_DONE) ret = pw__store_fail(s, rc, err, "checkpoints");
  sqlite3_reset(st);
  if (ret) {
    json_decref(arr);
    return ret;
  }
  *out = json_pack("{s:o}", "checkpoints", arr);
  return *out ? 0 : pw_err_set(err, PW_ENOMEM, "checkpoints", "out of memory");
}

int pw_store_weights_delete(pw_store *s, const char *id, json_t **out, pw_err *err) {
  if (out) *out = NULL;
  int rc = pw__store_fault(s, err, "delete weights");
  if (rc) return rc;
  if ((rc = pw__store_begin(s, 1, err))) return rc;
  json_t *row = NULL;
  if ((rc = w_get(s, id, &row, err))) goto fail;
  sqlite3_stmt *st = pw__store_stmt(s, PW_ST_W_USER, err);
  if (!st) goto fail_stmt;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    rc = pw_err_set(err, PW_ECONFLICT, "ck", "weights %.12s... are in use by job %lld (%s): cancel it or wait for it to end",
                    id, (long long)sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1));
    sqlite3_reset(st);
    goto fail;
  }
  sqlite3_reset(st);
  if (step != SQLITE_DONE) {
    rc = pw__store_fail(s, step, err, "weights users");
    goto fail;
  }
  if (!(st = pw__store_stmt(s, PW_ST_W_DELETE, err))) goto fail_stmt;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  step = sqlite3_step(st);
  sqlite3_reset(st);
  if (step != SQLITE_DONE) {
    rc = pw__store_fail(s, step, err, "delete weights");
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
