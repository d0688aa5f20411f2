/* api_datasets: the dataset routes of the REST API — upload (streamed,
 * POST /v1/datasets), list, one, its bytes, delete — and what a submitted
 * job's data goes through (a data.path under --data-root imported as a
 * dataset, a data.dataset checked against the store).
 *
 * An upload never sits in memory: http.c hands each piece of the body to
 * the sink below, which writes and hashes it into a temporary file of the
 * dataset folder (datasets.h) on libmicrohttpd's thread; the handler runs
 * on the pool once the body is complete and does what may take seconds:
 * fsync, rename to the id, the store's row. The sink and the other
 * routes are api_objects.c's, shared with stored weights. */
#include "api_objects.h"
#include "datasets.h"
#include "log.h"

static const pw_api_kind kind = {.what = "dataset",
                                 .missing = "dataset",
                                 .its = "its",
                                 .param = "ds",
                                 .url = "/v1/datasets/",
                                 .sub = "datasets",
                                 .row = pw_store_dataset_json,
                                 .list = pw_store_datasets_json,
                                 .del = pw_store_dataset_delete,
                                 .path = pw_ds_path,
                                 .unlink = pw_ds_unlink};

/* ---- upload ------------------------------------------------------------------ */

static int upload_begin(pw_req *r, int64_t declared) { return pw_api_object_begin(r, declared, &kind); }

const pw_stream_sink pw_api_dataset_sink = {upload_begin, pw_api_object_chunk, pw_api_object_done};

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
  pw_api_upload *u = r->stream;
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
  if (!rc && created)
    pw_info("dataset %s stored: %lld bytes, %s%s%s", info.id, (long long)info.size, info.format,
            u->name[0] ? ", name " : "", u->name);
  pw_api_object_reply(r, &kind, rc, &err, info.id, created, row);
}

/* ---- list, one, content, delete ------------------------------------------------ */

void pw_api_dataset_list(pw_req *r) { pw_api_object_list(r, &kind); }
void pw_api_dataset_get(pw_req *r) { pw_api_object_get(r, &kind); }
void pw_api_dataset_content(pw_req *r) { pw_api_object_content(r, &kind); }
void pw_api_dataset_delete(pw_req *r) { pw_api_object_delete(r, &kind); }
