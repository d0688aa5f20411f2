/* api_weights: the stored-weights routes of the REST API — upload
 * (streamed, POST /v1/checkpoints), list, one, its bytes (for workers:
 * the cluster token is accepted), delete (409 while a live job starts
 * from them). The files and their checks are weights.c's.
 *
 * As with datasets (api_datasets.c), the body never sits in memory: the
 * sink writes and hashes each piece into a temporary file of
 * <state_dir>/weights on libmicrohttpd's thread; the handler, on the pool,
 * checks the file (safetensors, F32, finite, CRCs), renames it to its
 * sha256 and records it. The sink and the other routes are
 * api_objects.c's, shared with datasets. */
#include "api_objects.h"
#include "log.h"
#include "weights.h"

static const pw_api_kind kind = {.what = "weights",
                                 .missing = "stored weights",
                                 .its = "the",
                                 .param = "ck",
                                 .url = "/v1/checkpoints/",
                                 .sub = PW_WEIGHTS_DIR,
                                 .row = pw_store_weights_json,
                                 .list = pw_store_weights_list_json,
                                 .del = pw_store_weights_delete,
                                 .path = pw_w_path,
                                 .unlink = pw_w_unlink};

static int upload_begin(pw_req *r, int64_t declared) { return pw_api_object_begin(r, declared, &kind); }

const pw_stream_sink pw_api_weights_sink = {upload_begin, pw_api_object_chunk, pw_api_object_done};

/* POST /v1/checkpoints[?name=N] */
void pw_api_weights_upload(pw_req *r) {
  pw_api_upload *u = r->stream;
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
  if (!rc && created)
    pw_info("weights %s stored: %lld bytes, %lld tensors, %lld parameters%s%s", info.id, (long long)info.size,
            (long long)info.n_tensors, (long long)info.params, u->name[0] ? ", name " : "", u->name);
  pw_api_object_reply(r, &kind, rc, &err, info.id, created, row);
}

void pw_api_weights_list(pw_req *r) { pw_api_object_list(r, &kind); }
void pw_api_weights_get(pw_req *r) { pw_api_object_get(r, &kind); }
void pw_api_weights_content(pw_req *r) { pw_api_object_content(r, &kind); }
void pw_api_weights_delete(pw_req *r) { pw_api_object_delete(r, &kind); }
