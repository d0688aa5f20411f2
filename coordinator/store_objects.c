/* store_objects: the row, list, insert-or-keep and guarded delete shared
 * by the content-addressed kinds (store_int.h's pw__store_kind):
 * store_datasets.c and store_weights.c describe their tables, this does
 * the transactions. Every write is checked and goes through the store's
 * fault injection like the others. */
#include "store_int.h"

#include <stdio.h>
#include <string.h>

int pw__store_obj_get(pw_store *s, const pw__store_kind *k, const char *id, json_t **out, pw_err *err) {
  *out = NULL;
  sqlite3_stmt *st = pw__store_stmt(s, k->st_get, err);
  if (!st) return err ? err->code : PW_EIO;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) {
    if (!(*out = k->row(st))) ret = pw_err_set(err, PW_ENOMEM, k->param, "out of memory");
  } else if (rc == SQLITE_DONE) {
    ret = pw_err_set(err, PW_ENOENT, k->param, "no %s %.64s", k->missing, id);
  } else {
    ret = pw__store_fail(s, rc, err, k->what);
  }
  sqlite3_reset(st);
  return ret;
}

int pw__store_obj_insert(pw_store *s, const pw__store_kind *k, const char *id,
                         void (*bind)(sqlite3_stmt *st, const void *arg), const void *arg, int *created, json_t **out,
                         pw_err *err) {
  char what[64];
  snprintf(what, sizeof what, "insert %s", k->what);
  if (out) *out = NULL;
  int rc = pw__store_fault(s, err, what);
  if (rc) return rc;
  if ((rc = pw__store_begin(s, 1, err))) return rc;
  sqlite3_stmt *st = pw__store_stmt(s, k->st_insert, err);
  if (!st) {
    rc = err ? err->code : PW_EIO;
    goto fail;
  }
  bind(st, arg);
  int step = sqlite3_step(st);
  sqlite3_reset(st);
  if (step != SQLITE_DONE) {
    rc = pw__store_fail(s, step, err, what);
    goto fail;
  }
  int added = sqlite3_changes(s->db) > 0;
  json_t *row = NULL;
  if ((out && (rc = pw__store_obj_get(s, k, id, &row, err))) || (rc = pw__store_commit(s, err))) {
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

int pw__store_obj_list(pw_store *s, const pw__store_kind *k, json_t **out, pw_err *err) {
  *out = NULL;
  sqlite3_stmt *st = pw__store_stmt(s, k->st_list, err);
  if (!st) return err ? err->code : PW_EIO;
  json_t *arr = json_array();
  int rc = SQLITE_DONE, ret = 0;
  while (arr && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *o = k->row(st);
    if (!o || json_array_append_new(arr, o)) {
      ret = pw_err_set(err, PW_ENOMEM, k->list, "out of memory");
      break;
    }
  }
  if (!arr) ret = pw_err_set(err, PW_ENOMEM, k->list, "out of memory");
  else if (!ret && rc != SQLITE_DONE) ret = pw__store_fail(s, rc, err, k->list);
  sqlite3_reset(st);
  if (ret) {
    json_decref(arr);
    return ret;
  }
  *out = json_pack("{s:o}", k->list, arr);
  return *out ? 0 : pw_err_set(err, PW_ENOMEM, k->list, "out of memory");
}

int pw__store_obj_delete(pw_store *s, const pw__store_kind *k, const char *id, json_t **out, pw_err *err) {
  char what[64], users[64];
  snprintf(what, sizeof what, "delete %s", k->what);
  snprintf(users, sizeof users, "%s users", k->what);
  if (out) *out = NULL;
  int rc = pw__store_fault(s, err, what);
  if (rc) return rc;
  if ((rc = pw__store_begin(s, 1, err))) return rc;
  json_t *row = NULL;
  if ((rc = pw__store_obj_get(s, k, id, &row, err))) goto fail;
  sqlite3_stmt *st = pw__store_stmt(s, k->st_user, err);
  if (!st) goto fail_stmt;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    rc = pw_err_set(err, PW_ECONFLICT, k->param, "%s %.12s... %s in use by job %lld (%s): cancel it or wait for it to end",
                    k->what, id, k->are, (long long)sqlite3_column_int64(st, 0),
                    (const char *)sqlite3_column_text(st, 1));
    sqlite3_reset(st);
    goto fail;
  }
  sqlite3_reset(st);
  if (step != SQLITE_DONE) {
    rc = pw__store_fail(s, step, err, users);
    goto fail;
  }
  if (!(st = pw__store_stmt(s, k->st_delete, err))) goto fail_stmt;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  step = sqlite3_step(st);
  sqlite3_reset(st);
  if (step != SQLITE_DONE) {
    rc = pw__store_fail(s, step, err, what);
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
