/* store_weights: the weights table and the jobs' links to it (store.h).
 * The files themselves are weights.c's. Every write is checked and goes
 * through the store's fault injection like the others. */
#include "store_int.h"

#include <string.h>

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

static const pw__store_kind kind = {.st_insert = PW_ST_W_INSERT,
                                    .st_get = PW_ST_W_GET,
                                    .st_list = PW_ST_W_LIST,
                                    .st_user = PW_ST_W_USER,
                                    .st_delete = PW_ST_W_DELETE,
                                    .row = w_row,
                                    .what = "weights",
                                    .param = "ck",
                                    .missing = "stored weights",
                                    .are = "are",
                                    .list = "checkpoints"};

static void w_bind(sqlite3_stmt *st, const void *arg) {
  const pw_weights_new *w = arg;
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
}

int pw_store_weights_insert(pw_store *s, const pw_weights_new *w, int *created, json_t **out, pw_err *err) {
  if (!w || !w->id || strlen(w->id) != 64 || !w->kind) {
    int rc = pw__store_fault(s, err, "insert weights");
    if (out) *out = NULL;
    return rc ? rc : pw_err_set(err, PW_EINVAL, "weights", "weights need an id (64 hex digits) and a kind");
  }
  return pw__store_obj_insert(s, &kind, w->id, w_bind, w, created, out, err);
}

int pw_store_weights_json(pw_store *s, const char *id, json_t **out, pw_err *err) {
  return pw__store_obj_get(s, &kind, id, out, err);
}

int pw_store_weights_list_json(pw_store *s, json_t **out, pw_err *err) {
  return pw__store_obj_list(s, &kind, out, err);
}

int pw_store_weights_delete(pw_store *s, const char *id, json_t **out, pw_err *err) {
  return pw__store_obj_delete(s, &kind, id, out, err);
}
