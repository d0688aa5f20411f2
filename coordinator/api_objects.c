/* api_objects: upload sink, list, one, content and delete for the stored,
 * content-addressed kinds (api_objects.h). The upload never sits in
 * memory: the sink writes and hashes each piece of the body into a
 * temporary file of the kind's folder on libmicrohttpd's thread; the
 * kind's handler commits it on the pool. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api_objects.h"
#include "log.h"

/* ---- upload ------------------------------------------------------------------ */

int pw_api_body_fits(pw_req *r, int64_t declared, const char *what) {
  /* a body the disk cannot hold is refused before a byte is written */
  int64_t room = declared > 0 ? pw_ds_free_bytes(r->c->state_dir) : -1;
  if (room < 0 || declared <= room) return 0;
  pw_reply_error(r, PW_ENOSPC, "body", "the %s is %lld bytes; the coordinator's state directory has %lld free", what,
                 (long long)declared, (long long)room);
  return -1;
}

/* ?name=: at most 128 bytes of printable UTF-8. */
static int upload_name(pw_req *r, char *out, size_t cap) {
  const char *v = pw_req_arg(r, "name");
  out[0] = 0;
  if (!v) return 0;
  size_t n = strlen(v);
  json_t *probe = json_stringn(v, n); /* NULL for invalid UTF-8 */
  int ok = probe && n >= 1 && n < cap;
  json_decref(probe);
  for (size_t i = 0; ok && i < n; i++)
    if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f) ok = 0;
  if (!ok) {
    pw_reply_error(r, PW_EINVAL, "name", "name must be 1..%zu bytes of printable UTF-8", cap - 1);
    return -1;
  }
  memcpy(out, v, n + 1);
  return 0;
}

int pw_api_object_begin(pw_req *r, int64_t declared, const pw_api_kind *k) {
  pw_api_upload *u = calloc(1, sizeof *u);
  if (!u) {
    pw_reply_oom(r);
    return -1;
  }
  u->k = k;
  if (upload_name(r, u->name, sizeof u->name) || pw_api_body_fits(r, declared, "upload")) {
    free(u);
    return -1;
  }
  pw_err err = {0};
  if (pw_ds_writer_open_in(r->c->state_dir, k->sub, &u->w, &err)) {
    char b[600];
    pw_error("%s upload: %s", k->what, pw_err_str(&err, b, sizeof b));
    free(u);
    pw_reply_err(r, &err);
    return -1;
  }
  r->stream = u;
  return 0;
}

int pw_api_object_chunk(pw_req *r, const char *data, size_t n) {
  pw_api_upload *u = r->stream;
  pw_err err = {0};
  if (!pw_ds_writer_write(u->w, data, n, &err)) return 0;
  char b[600];
  pw_error("%s upload: %s", u->k->what, pw_err_str(&err, b, sizeof b));
  pw_reply_err(r, &err);
  /* the bytes so far are of no use now: give the disk back at once */
  pw_ds_writer_free(u->w);
  u->w = NULL;
  return -1;
}

void pw_api_object_done(pw_req *r) {
  pw_api_upload *u = r->stream;
  if (!u) return;
  pw_ds_writer_free(u->w);
  free(u);
  r->stream = NULL;
}

void pw_api_object_reply(pw_req *r, const pw_api_kind *k, int rc, const pw_err *err, const char *id, int created,
                         json_t *row) {
  if (rc) {
    char b[600];
    pw_error("%s upload: %s", k->what, pw_err_str(err, b, sizeof b));
    pw_reply_err(r, err);
    return;
  }
  char loc[96];
  snprintf(loc, sizeof loc, "%s%s", k->url, id);
  pw_reply_json(r, created ? MHD_HTTP_CREATED : MHD_HTTP_OK, row);
  pw_reply_header(r, MHD_HTTP_HEADER_LOCATION, loc);
}

/* ---- list, one, content, delete ------------------------------------------------ */

void pw_api_object_list(pw_req *r, const pw_api_kind *k) {
  pw_store *s = pw_api_store(r);
  if (!s) return;
  json_t *out = NULL;
  pw_err err = {0};
  if (k->list(s, &out, &err)) pw_reply_err(r, &err);
  else pw_reply_json(r, MHD_HTTP_OK, out);
}

/* The stored row of r->ds, or a reply (404 naming the id) and NULL. */
static json_t *object_row(pw_req *r, pw_store *s, const pw_api_kind *k) {
  json_t *row = NULL;
  pw_err err = {0};
  int rc = k->row(s, r->ds, &row, &err);
  if (rc == PW_ENOENT) pw_reply_error(r, PW_ENOENT, k->param, "no %s %s", k->missing, r->ds);
  else if (rc) pw_reply_err(r, &err);
  return rc ? NULL : row;
}

void pw_api_object_get(pw_req *r, const pw_api_kind *k) {
  pw_store *s = pw_api_store(r);
  json_t *row = s ? object_row(r, s, k) : NULL;
  if (row) pw_reply_json(r, MHD_HTTP_OK, row);
}

/* The bytes, for workers (the cluster token is accepted here). The file
 * is checked against its row's size: a file changed behind the store's
 * back is an error, never served. */
void pw_api_object_content(pw_req *r, const pw_api_kind *k) {
  pw_store *s = pw_api_store(r);
  json_t *row = s ? object_row(r, s, k) : NULL;
  if (!row) return;
  json_int_t size = json_integer_value(json_object_get(row, "size"));
  json_decref(row);
  char path[PATH_MAX];
  pw_err err = {0};
  if (k->path(r->c->state_dir, r->ds, path, sizeof path, &err)) {
    pw_reply_err(r, &err);
    return;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size != (off_t)size) {
    const char *why = fd < 0 ? strerror(errno) : "its size is not the recorded one";
    pw_error("%s %s: cannot serve %s: %s", k->what, r->ds, path, why);
    if (fd >= 0) close(fd);
    pw_reply_error(r, PW_EIO, k->param, "%s %s: %s file %s cannot be served: %s", k->what, r->ds, k->its, path, why);
    return;
  }
  pw_reply_fd(r, MHD_HTTP_OK, "application/octet-stream", fd, (uint64_t)st.st_size);
  char etag[72];
  snprintf(etag, sizeof etag, "\"%s\"", r->ds);
  pw_reply_header(r, MHD_HTTP_HEADER_ETAG, etag);
}

void pw_api_object_delete(pw_req *r, const pw_api_kind *k) {
  pw_store *s = pw_api_store(r);
  if (!s) return;
  json_t *row = NULL;
  pw_err err = {0};
  int rc = k->del(s, r->ds, &row, &err);
  if (rc == PW_ENOENT) {
    pw_reply_error(r, PW_ENOENT, k->param, "no %s %s", k->missing, r->ds);
    return;
  }
  if (rc) {
    pw_reply_err(r, &err);
    return;
  }
  if (k->unlink(r->c->state_dir, r->ds, &err)) {
    char b[600];
    pw_error("%s %s: deleted from the store, but %s", k->what, r->ds, pw_err_str(&err, b, sizeof b));
    json_decref(row);
    pw_reply_err(r, &err);
    return;
  }
  pw_info("%s %s deleted", k->what, r->ds);
  pw_reply_json(r, MHD_HTTP_OK, row);
}
