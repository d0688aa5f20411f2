/* api_datasets: the dataset routes of the REST API — upload (streamed,
 * POST /v1/datasets), list, one, its bytes, delete — and what a submitted
 * job's data goes through (a data.path under --data-root imported as a
 * dataset, a data.dataset checked against the store).
 *
 * An upload never sits in memory: http.c hands each piece of the body to
 * the sink below, which writes and hashes it into a temporary file of the
 * dataset folder (datasets.h) on libmicrohttpd's thread; the handler runs
 * on the pool once the body is complete and does what may take seconds:
 * fsync, rename to the id, the store's row. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "datasets.h"
#include "log.h"

/* ---- upload ------------------------------------------------------------------ */

typedef struct {
  pw_ds_writer *w;
  char name[129];
} upload;

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

static int upload_begin(pw_req *r, int64_t declared) {
  upload *u = calloc(1, sizeof *u);
  if (!u) {
    pw_reply_oom(r);
    return -1;
  }
  if (upload_name(r, u->name, sizeof u->name)) {
    free(u);
    return -1;
  }
  /* a body the disk cannot hold is refused before a byte is written */
  int64_t room = declared > 0 ? pw_ds_free_bytes(r->c->state_dir) : -1;
  if (room >= 0 && declared > room) {
    free(u);
    pw_reply_error(r, PW_ENOSPC, "body", "the upload is %lld bytes; the coordinator's state directory has %lld free",
                   (long long)declared, (long long)room);
    return -1;
  }
  pw_err err = {0};
  if (pw_ds_writer_open(r->c->state_dir, &u->w, &err)) {
    char b[600];
    pw_error("dataset upload: %s", pw_err_str(&err, b, sizeof b));
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
  pw_error("dataset upload: %s", pw_err_str(&err, b, sizeof b));
  pw_reply_err(r, &err);
  /* the bytes so far are of no use now: give the disk back at once */
  pw_ds_writer_free(u->w);
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

const pw_stream_sink pw_api_dataset_sink = {upload_begin, upload_chunk, upload_done};

/* The dataset's row for a committed file: *created 1 when new. */
static int record(pw_store *s, const pw_ds_info *info, const char *name, int *created, json_t **out, pw_err *err) {
  pw_dataset_new d = {.id = info->id,
                      .size = info->size,
                      .format = info->format,
                      .name = name,
                      .vocab_size = info->vocab_size,
                      .width = info->width,
                      .n_tokens = info->n_tokens};
  return pw_store_dataset_insert(s, &d, created, out, err);
}

/* POST /v1/datasets[?name=N]: the body is in the sink's file by now. */
void pw_api_dataset_upload(pw_req *r) {
  upload *u = r->stream;
  if (!u || !u->w) {
    pw_reply_error(r, PW_EINTERNAL, "body", "the upload was lost");
    return;
  }
  if (pw_ds_writer_size(u->w) == 0) {
    pw_ds_writer_free(u->w);
    u->w = NULL;
    pw_reply_error(r, PW_EINVAL, "body", "the body is empty: send the dataset's bytes (application/octet-stream)");
    return;
  }
  pw_store *s = pw_api_store(r);
  if (!s) return;
  pw_ds_info info;
  pw_err err = {0};
  json_t *row = NULL;
  int created = 0;
  int rc = pw_ds_writer_commit(u->w, "body", &info, &err);
  if (!rc) rc = record(s, &info, u->name, &created, &row, &err);
  /* closed (and when not committed, removed) before the answer goes out */
  pw_ds_writer_free(u->w);
  u->w = NULL;
  if (rc) {
    char b[600];
    pw_error("dataset upload: %s", pw_err_str(&err, b, sizeof b));
    pw_reply_err(r, &err);
    return;
  }
  if (created)
    pw_info("dataset %s stored: %lld bytes, %s%s%s", info.id, (long long)info.size, info.format,
            u->name[0] ? ", name " : "", u->name);
  char loc[96];
  snprintf(loc, sizeof loc, "/v1/datasets/%s", info.id);
  pw_reply_json(r, created ? MHD_HTTP_CREATED : MHD_HTTP_OK, row);
  pw_reply_header(r, MHD_HTTP_HEADER_LOCATION, loc);
}

/* ---- list, one, content, delete ------------------------------------------------ */

void pw_api_dataset_list(pw_req *r) {
  pw_store *s = pw_api_store(r);
  if (!s) return;
  json_t *out = NULL;
  pw_err err = {0};
  if (pw_store_datasets_json(s, &out, &err)) pw_reply_err(r, &err);
  else pw_reply_json(r, MHD_HTTP_OK, out);
}

/* The stored row of r->ds, or a reply (404 naming ds) and NULL. */
static json_t *dataset_row(pw_req *r, pw_store *s) {
  json_t *row = NULL;
  pw_err err = {0};
  int rc = pw_store_dataset_json(s, r->ds, &row, &err);
  if (rc == PW_ENOENT) pw_reply_error(r, PW_ENOENT, "ds", "no dataset %s", r->ds);
  else if (rc) pw_reply_err(r, &err);
  return rc ? NULL : row;
}

void pw_api_dataset_get(pw_req *r) {
  pw_store *s = pw_api_store(r);
  json_t *row = s ? dataset_row(r, s) : NULL;
  if (row) pw_reply_json(r, MHD_HTTP_OK, row);
}

/* The bytes, for workers (the cluster token is accepted here). The file
 * is checked against its row's size: a file changed behind the store's
 * back is an error, never served. */
void pw_api_dataset_content(pw_req *r) {
  pw_store *s = pw_api_store(r);
  json_t *row = s ? dataset_row(r, s) : NULL;
  if (!row) return;
  json_int_t size = json_integer_value(json_object_get(row, "size"));
  json_decref(row);
  char path[PATH_MAX];
  pw_err err = {0};
  if (pw_ds_path(r->c->state_dir, r->ds, path, sizeof path, &err)) {
    pw_reply_err(r, &err);
    return;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size != (off_t)size) {
    const char *why = fd < 0 ? strerror(errno) : "its size is not the recorded one";
    pw_error("dataset %s: cannot serve %s: %s", r->ds, path, why);
    if (fd >= 0) close(fd);
    pw_reply_error(r, PW_EIO, "ds", "dataset %s: its file %s cannot be served: %s", r->ds, path, why);
    return;
  }
  pw_reply_fd(r, MHD_HTTP_OK, "application/octet-stream", fd, (uint64_t)st.st_size);
  char etag[72];
  snprintf(etag, sizeof etag, "\"%s\"", r->ds);
  pw_reply_header(r, MHD_HTTP_HEADER_ETAG, etag);
}

void pw_api_dataset_delete(pw_req *r) {
  pw_store *s = pw_api_store(r);
  if (!s) return;
  json_t *row = NULL;
  pw_err err = {0};
  int rc = pw_store_dataset_delete(s, r->ds, &row, &err);
  if (rc == PW_ENOENT) {
    pw_reply_error(r, PW_ENOENT, "ds", "no dataset %s", r->ds);
    return;
  }
  if (rc) {
    pw_reply_err(r, &err);
    return;
  }
  if (pw_ds_unlink(r->c->state_dir, r->ds, &err)) {
    char b[600];
    pw_error("dataset %s: deleted from the store, but %s", r->ds, pw_err_str(&err, b, sizeof b));
    json_decref(row);
    pw_reply_err(r, &err);
    return;
  }
  pw_info("dataset %s deleted", r->ds);
  pw_reply_json(r, MHD_HTTP_OK, row);
}
