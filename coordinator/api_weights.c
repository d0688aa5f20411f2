/* api_weights: the stored-weights routes of the REST API — upload
 * (streamed, POST /v1/checkpoints), list, one, its bytes (for workers:
 * the cluster token is accepted), delete (409 while a live job starts
 * from them). The files and their checks are weights.c's.
 *
 * As with datasets (api_datasets.c), the body never sits in memory: the
 * sink writes and hashes each piece into a temporary file of
 * <state_dir>/weights on libmicrohttpd's thread; the handler, on the pool,
 * checks the file (safetensors, F32, finite, CRCs), renames it to its
 * sha256 and records it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "log.h"
#include "weights.h"

typedef struct {
  pw_ds_writer *w;
  char name[129];
} upload;

static int upload_begin(pw_req *r, int64_t declared) {
  upload *u = calloc(1, sizeof *u);
  if (!u) {
    pw_reply_oom(r);
    return -1;
  }
  const char *v = pw_req_arg(r, "name");
  if (v) { /* ?name=: 1..128 bytes of printable UTF-8 */
    size_t n = strlen(v);
    json_t *probe = json_stringn(v, n); /* NULL for invalid UTF-8 */
    int ok = probe && n >= 1 && n < sizeof u->name;
    json_decref(probe);
    for (size_t i = 0; ok && i < n; i++)
      if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f) ok = 0;
    if (!ok) {
      free(u);
      pw_reply_error(r, PW_EINVAL, "name", "name must be 1..%zu bytes of printable UTF-8", sizeof u->name - 1);
      return -1;
    }
    memcpy(u->name, v, n + 1);
  }
  int64_t room = declared > 0 ? pw_ds_free_bytes(r->c->state_dir) : -1;
  if (room >= 0 && declared > room) {
    free(u);
    pw_reply_error(r, PW_ENOSPC, "body", "the upload is %lld bytes; the coordinator's state directory has %lld free",
                   (long long)declared, (long long)room);
    return -1;
  }
  pw_err err = {0};
  if (pw_ds_writer_open_in(r->c->state_dir, PW_WEIGHTS_DIR, &u->w, &err)) {
    char b[600];
    pw_error("weights upload: %s", pw_err_str(&err, b, sizeof b));
    free(u);
    pw_reply_err(r, &err);
    return -1;
  }
  r->stream = u;
  return 0;
}

static int upload_chunk(pw_req *r, const char *data, size_t n) {
  upload *u = r->stream;
  pw_err err = {0};
  if (!pw_ds_writer_write(u->w, data, n, &err)) return 0;
  char b[600];
  pw_error("weights upload: %s", pw_err_str(&err, b, sizeof b));
  pw_reply_err(r, &err);
  pw_ds_writer_free(u->w); /* the disk back at once */
  u->w = NULL;
  return -1;
}

static void upload_done(pw_req *r) {
  upload *u = r->stream;
  if (!u) return;
  pw_ds_writer_free(u->w);
  free(u);
  r->stream = NULL;
}

const pw_stream_sink pw_api_weights_sink = {upload_begin, upload_chunk, upload_done};

/* POST /v1/checkpoints[?name=N] */
void pw_api_weights_upload(pw_req *r) {
  upload *u = r->stream;
  if (!u || !u->w) {
    pw_reply_error(r, PW_EINTERNAL, "body", "the upload was lost");
    return;
  }
  pw_store *s = pw_api_store(r);
  if (!s) return;
  pw_w_info info;
  pw_err err = {0};
  json_t *row = NULL;
  int created = 0;
  int rc = pw_ds_writer_size(u->w) == 0
               ? pw_err_set(&err, PW_EINVAL, "body", "the body is empty: send a safetensors file (application/octet-stream)")
               : pw_w_commit(u->w, "body", &info, &err);
  if (!rc) {
    pw_weights_new w = {.id = info.id, .size = info.size, .kind = "model", .name = u->name, .source = "upload",
                        .n_tensors = info.n_tensors, .params = info.params};
    rc = pw_store_weights_insert(s, &w, &created, &row, &err);
  }
  pw_ds_writer_free(u->w); /* closed, and removed unless committed, before the answer */
  u->w = NULL;
  if (rc) {
    char b[600];
    pw_error("weights upload: %s", pw_err_str(&err, b, sizeof b));
    pw_reply_err(r, &err);
    return;
  }
  if (created)
    pw_info("weights %s stored: %lld bytes, %lld tensors, %lld parameters%s%s", info.id, (long long)info.size,
            (long long)info.n_tensors, (long long)info.params, u->name[0] ? ", name " : "", u->name);
  char loc[96];
  snprintf(loc, sizeof loc, "/v1/checkpoints/%s", info.id);
  pw_reply_json(r, created ? MHD_HTTP_CREATED : MHD_HTTP_OK, row);
  pw_reply_header(r, MHD_HTTP_HEADER_LOCATION, loc);
}

void pw_api_weights_list(pw_req *r) {
  pw_store *s = pw_api_store(r);
  if (!s) return;
  json_t *out = NULL;
  pw_err err = {0};
  if (pw_store_weights_list_json(s, &out, &err)) pw_reply_err(r, &err);
  else pw_reply_json(r, MHD_HTTP_OK, out);
}

static json_t *weights_row(pw_req *r, pw_store *s) {
  json_t *row = NULL;
  pw_err err = {0};
  int rc = pw_store_weights_json(s, r->ds, &row, &err);
  if (rc == PW_ENOENT) pw_reply_error(r, PW_ENOENT, "ck", "no stored weights %s", r->ds);
  else if (rc) pw_reply_err(r, &err);
  return rc ? NULL : row;
}

void pw_api_weights_get(pw_req *r) {
  pw_store *s = pw_api_store(r);
  json_t *row = s ? weights_row(r, s) : NULL;
  if (row) pw_reply_json(r, MHD_HTTP_OK, row);
}

/* The bytes, checked against the row's size (a file changed behind the
 * store's back is never served). */
void pw_api_weights_content(pw_req *r) {
  pw_store *s = pw_api_store(r);
  json_t *row = s ? weights_row(r, s) : NULL;
  if (!row) return;
  json_int_t size = json_integer_value(json_object_get(row, "size"));
  json_decref(row);
  char path[PATH_MAX];
  pw_err err = {0};
  if (pw_w_path(r->c->state_dir, r->ds, path, sizeof path, &err)) {
    pw_reply_err(r, &err);
    return;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size != (off_t)size) {
    const char *why = fd < 0 ? strerror(errno) : "its size is not the recorded one";
    pw_error("weights %s: cannot serve %s: %s", r->ds, path, why);
    if (fd >= 0) close(fd);
    pw_reply_error(r, PW_EIO, "ck", "weights %s: the file %s cannot be served: %s", r->ds, path, why);
    return;
  }
  pw_reply_fd(r, MHD_HTTP_OK, "application/octet-stream", fd, (uint64_t)st.st_size);
  char etag[72];
  snprintf(etag, sizeof etag, "\"%s\"", r->ds);
  pw_reply_header(r, MHD_HTTP_HEADER_ETAG, etag);
}

void pw_api_weights_delete(pw_req *r) {
  pw_store *s = pw_api_store(r);
  if (!s) return;
  json_t *row = NULL;
  pw_err err = {0};
  int rc = pw_store_weights_delete(s, r->ds, &row, &err);
  if (rc == PW_ENOENT) {
    pw_reply_error(r, PW_ENOENT, "ck", "no stored weights %s", r->ds);
    return;
  }
  if (rc) {
    pw_reply_err(r, &err);
    return;
  }
  if (pw_w_unlink(r->c->state_dir, r->ds, &err)) {
    char b[600];
    pw_error("weights %s: deleted from the store, but %s", r->ds, pw_err_str(&err, b, sizeof b));
    json_decref(row);
    pw_reply_err(r, &err);
    return;
  }
  pw_info("weights %s deleted", r->ds);
  pw_reply_json(r, MHD_HTTP_OK, row);
}
