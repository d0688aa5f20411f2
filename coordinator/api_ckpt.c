/* api_ckpt: checkpoints in the coordinator's store — the routes.
 *
 *   PUT  /v1/jobs/{id}/runs/{run}/checkpoints/{step}/stages/{stage}[/optimizer]
 *        a rank's shard (cluster token), streamed into checkpoints.h's
 *        writer, checked against X-Pipewright-Crc32c (or -Sha256) and as
 *        safetensors, recorded; a step whose shards are all in is
 *        complete, and then retention (train.keep_checkpoints) runs.
 *   GET  /v1/jobs/{id}/checkpoints/{step}/stages/{stage}[/optimizer]
 *        a stored shard (cluster token: a resuming worker fetches it).
 *   GET  /v1/jobs/{id}/checkpoints      the retained complete steps.
 *   GET  /v1/jobs/{id}/checkpoint[?step=N][&optimizer=1]
 *        the whole model (or its optimizer state) of a retained step,
 *        gathered into one safetensors file.
 *   DELETE /v1/jobs/{id}?purge=1        a finished job's checkpoint files.
 *
 * The body never sits in memory: the sink writes each piece on
 * libmicrohttpd's thread; the handler (on the pool) does the fsync, the
 * checks, the store and retention. */
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "checkpoints.h"
#include "log.h"

static int optim_route(const pw_req *r) {
  size_t n = strlen(r->path), k = strlen("/optimizer");
  return n > k && !strcmp(r->path + n - k, "/optimizer");
}

/* The job's brief (404 when unknown); replies and returns nonzero on failure. */
static int brief(pw_req *r, pw_store *s, pw_job_brief *b) {
  pw_err err = {0};
  int rc = pw_store_job_brief(s, r->id, b, &err);
  if (rc == PW_ENOENT) pw_reply_error(r, PW_ENOENT, "id", "no job %lld", (long long)r->id);
  else if (rc) pw_reply_err(r, &err);
  return rc;
}

/* The stage count of the job's latest run (0 when it has none) and the
 * pipeline rank that holds `stage` in it (-1 when none does). */
static int run_stages(pw_store *s, int64_t job, int stage, int *prank) {
  json_t *run = NULL, *g;
  int n = 0;
  size_t i;
  *prank = -1;
  if (!pw_store_run_json(s, job, &run, NULL)) {
    json_t *stages = json_object_get(run, "stages");
    n = (int)json_array_size(stages);
    json_array_foreach(stages, i, g) if (json_integer_value(json_object_get(g, "stage")) == stage) *prank =
        (int)json_integer_value(json_object_get(g, "rank"));
  }
  json_decref(run);
  return n;
}

/* An integer of a spec at obj.key, def when absent or below lo. */
static int spec_int(const json_t *spec, const char *obj, const char *key, int lo, int def) {
  json_t *v = json_object_get(json_object_get(spec, obj), key);
  return json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= INT_MAX
             ? (int)json_integer_value(v)
             : def;
}

/* Whether the request carries the upload token of the rank that uploads
 * `stage` (replica 0, tp rank 0 of its pipeline rank prank): compared in
 * constant time. */
static int uploader(pw_req *r, int prank, int tp) {
  const char *got = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Pipewright-Upload-Token");
  char want[65];
  pw_coord_upload_token(r->c, r->id, r->run, prank * tp, want);
  if (!got || strlen(got) != 64) return 0;
  unsigned diff = 0;
  for (int i = 0; i < 64; i++) diff |= (unsigned)(got[i] ^ want[i]);
  return diff == 0;
}

/* ---- upload ------------------------------------------------------------------- */

typedef struct {
  pw_ck_writer *w;
  int n_stages, keep, optimizer;
  pw_ck_sum sum;
} upload;

/* The stated checksum: X-Pipewright-Crc32c, else X-Pipewright-Sha256. */
static int stated_sum(pw_req *r, pw_ck_sum *sum) {
  const char *c = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Pipewright-Crc32c");
  const char *h = c ? NULL : MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Pipewright-Sha256");
  if (!c && !h) {
    pw_reply_error(r, PW_EINVAL, "X-Pipewright-Crc32c",
                   "a checkpoint upload states its checksum: X-Pipewright-Crc32c (8 hex digits) or "
                   "X-Pipewright-Sha256 (64)");
    return -1;
  }
  pw_err err = {0};
  if (pw_ck_sum_parse(c ? 'c' : 's', c ? c : h, sum, &err)) {
    pw_reply_err(r, &err);
    return -1;
  }
  return 0;
}

static int upload_begin(pw_req *r, int64_t declared) {
  pw_store *s = pw_api_store(r);
  if (!s) return -1;
  pw_job_brief b;
  if (brief(r, s, &b)) return -1;
  json_t *spec = b.spec ? json_loads(b.spec, 0, NULL) : NULL;
  free(b.spec);
  /* keep_checkpoints: 3 for a spec from before the field */
  int prank = -1, keep = spec_int(spec, "train", "keep_checkpoints", 1, 3);
  int tp = spec_int(spec, "mesh", "tp", 1, 1), every = spec_int(spec, "train", "checkpoint_every", 0, 0);
  json_decref(spec);
  int n_stages = run_stages(s, r->id, r->stage, &prank);
  if (b.run != r->run) {
    pw_reply_error(r, PW_ECONFLICT, "run", "run %lld is not job %lld's current run (%d)", (long long)r->run,
                   (long long)r->id, b.run);
    return -1;
  }
  if (b.state != PW_JOB_RUNNING && b.state != PW_JOB_DISPATCHING) {
    pw_reply_error(r, PW_ECONFLICT, "id", "job %lld is %s: its checkpoints are taken only while it runs",
                   (long long)r->id, pw_job_state_name(b.state));
    return -1;
  }
  if (r->step < 1 || r->step > b.steps) {
    pw_reply_error(r, PW_EINVAL, "step", "step %d is not one of job %lld's steps (1..%d)", r->step, (long long)r->id,
                   b.steps);
    return -1;
  }
  if (r->stage >= n_stages || prank < 0) {
    pw_reply_error(r, PW_ENOENT, "stage", "job %lld's run %lld has %d stages: no stage %d", (long long)r->id,
                   (long long)r->run, n_stages, r->stage);
    return -1;
  }
  if (r->step != b.steps && r->step != b.stop_step && (every <= 0 || r->step % every)) {
    pw_reply_error(r, PW_EINVAL, "step",
                   "job %lld checkpoints at every %d steps and at its last (%d): not at step %d", (long long)r->id,
                   every, b.steps, r->step);
    return -1;
  }
  /* The cluster token says a worker of this cluster; the upload token, the
   * one worker assigned this stage in this run (a token holder otherwise
   * could store a "complete" step of any job and push out the real ones). */
  if (!uploader(r, prank, tp < 1 ? 1 : tp)) {
    pw_reply_error(r, PW_EFORBIDDEN, "X-Pipewright-Upload-Token",
                   "only the worker assigned stage %d in run %lld uploads its checkpoint (its assign's upload_token)",
                   r->stage, (long long)r->run);
    return -1;
  }
  upload *u = calloc(1, sizeof *u);
  if (!u) {
    pw_reply_oom(r);
    return -1;
  }
  u->keep = keep, u->n_stages = n_stages, u->optimizer = optim_route(r);
  if (stated_sum(r, &u->sum) || pw_api_body_fits(r, declared, "shard")) {
    free(u);
    return -1;
  }
  pw_err err = {0};
  if (pw_ck_writer_open(r->c->state_dir, r->id, r->step, r->stage, u->optimizer, &u->sum, &u->w, &err)) {
    char eb[600];
    pw_error("job %lld: checkpoint upload: %s", (long long)r->id, pw_err_str(&err, eb, sizeof eb));
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
  if (!pw_ck_writer_write(u->w, data, n, &err)) return 0;
  char b[600];
  pw_error("job %lld: checkpoint upload: %s", (long long)r->id, pw_err_str(&err, b, sizeof b));
  pw_reply_err(r, &err);
  pw_ck_writer_free(u->w); /* the bytes so far are of no use: the disk back at once */
  u->w = NULL;
  return -1;
}

static void upload_done(pw_req *r) {
  upload *u = r->stream;
  if (!u) return;
  pw_ck_writer_free(u->w);
  free(u);
  r->stream = NULL;
}

const pw_stream_sink pw_api_ckpt_sink = {upload_begin, upload_chunk, upload_done};

/* After a step completed: the rows of steps beyond retention go, then
 * their files. A file that cannot be removed is logged (it is no longer
 * served: its rows are gone). */
static void retain(pw_req *r, pw_store *s, int keep) {
  int *gone = NULL, n = 0;
  pw_err err = {0};
  char b[600];
  if (pw_store_ckpt_prune(s, r->id, keep, &gone, &n, &err)) {
    pw_warn("job %lld: checkpoint retention failed (older steps stay until the next one): %s", (long long)r->id,
            pw_err_str(&err, b, sizeof b));
    return;
  }
  for (int k = 0; k < n; k++)
    if (pw_ck_remove(r->c->state_dir, r->id, gone[k], &err))
      pw_warn("job %lld: cannot remove the files of checkpoint step %d: %s", (long long)r->id, gone[k],
              pw_err_str(&err, b, sizeof b));
  free(gone);
}

void pw_api_ckpt_upload(pw_req *r) {
  upload *u = r->stream;
  if (!u || !u->w) {
    pw_reply_error(r, PW_EINTERNAL, "body", "the upload was lost");
    return;
  }
  pw_store *s = pw_api_store(r);
  if (!s) return;
  pw_err err = {0};
  char b[600];
  uint64_t bytes = pw_ck_writer_size(u->w);
  int rc = pw_ck_writer_commit(u->w, &err), complete = 0;
  if (!rc)
    rc = pw_store_ckpt_shard(s, r->id, r->run, r->step, r->stage, u->optimizer, (int64_t)bytes, u->sum.hex,
                             u->n_stages, &complete, &err);
  if (rc) {
    pw_warn("job %lld: checkpoint shard (step %d, stage %d%s) refused: %s", (long long)r->id, r->step, r->stage,
            u->optimizer ? ", optimizer" : "", pw_err_str(&err, b, sizeof b));
    pw_reply_err(r, &err);
    return;
  }
  if (complete) {
    pw_info("job %lld: checkpoint of step %d complete (%d stages)", (long long)r->id, r->step, u->n_stages);
    retain(r, s, u->keep);
  }
  pw_reply_json(r, 201,
                json_pack("{s:I, s:I, s:i, s:i, s:s, s:I, s:s, s:b}", "job", (json_int_t)r->id, "run",
                          (json_int_t)r->run, "step", r->step, "stage", r->stage, "kind",
                          u->optimizer ? "optimizer" : "model", "bytes", (json_int_t)bytes,
                          u->sum.kind == 'c' ? "crc32c" : "sha256", u->sum.hex, "complete", complete));
}

/* ---- downloads ---------------------------------------------------------------- */

/* A retained step's stage count; replies 404 naming the step otherwise. */
static int retained(pw_req *r, pw_store *s, int step, int *n_stages) {
  pw_err err = {0};
  int rc = pw_store_ckpt_step(s, r->id, step, n_stages, &err);
  if (rc) pw_reply_err(r, &err);
  return rc;
}

static void send_file(pw_req *r, const char *path, const char *name) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    if (fd >= 0) close(fd);
    pw_reply_error(r, PW_EIO, "", "cannot read %s", name);
    return;
  }
  char cd[160];
  snprintf(cd, sizeof cd, "attachment; filename=\"%s\"", name);
  pw_reply_fd(r, MHD_HTTP_OK, "application/octet-stream", fd, (uint64_t)st.st_size);
  pw_reply_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, cd);
}

void pw_api_ckpt_shard(pw_req *r) {
  pw_store *s = pw_api_store(r);
  pw_job_brief b;
  if (!s || brief(r, s, &b)) return;
  free(b.spec);
  int n_stages = 0, opt = optim_route(r);
  if (retained(r, s, r->step, &n_stages)) return;
  if (r->stage >= n_stages) {
    pw_reply_error(r, PW_ENOENT, "stage", "step %d of job %lld has %d stages: no stage %d", r->step, (long long)r->id,
                   n_stages, r->stage);
    return;
  }
  char path[PATH_MAX], name[96];
  pw_err err = {0};
  if (pw_ck_shard_path(r->c->state_dir, r->id, r->step, r->stage, opt, path, sizeof path, &err)) {
    pw_reply_err(r, &err);
    return;
  }
  snprintf(name, sizeof name, "job-%lld-step-%d-stage-%d%s.safetensors", (long long)r->id, r->step, r->stage,
           opt ? ".optim" : "");
  send_file(r, path, name);
}

void pw_api_job_checkpoints(pw_req *r) {
  pw_store *s = pw_api_store(r);
  pw_job_brief b;
  if (!s || brief(r, s, &b)) return;
  free(b.spec);
  json_t *out = NULL;
  pw_err err = {0};
  if (pw_store_ckpts_json(s, r->id, &out, &err)) pw_reply_err(r, &err);
  else pw_reply_json(r, MHD_HTTP_OK, out);
}

/* GET /v1/jobs/{id}/checkpoint[?step=N][&optimizer=1]: the latest (or the
 * given retained) complete step, gathered. */
void pw_api_job_checkpoint(pw_req *r) {
  static atomic_uint seq;
  int64_t step;
  int opt;
  if (pw_req_int_arg(r, "step", 0, 1, INT_MAX, &step) || pw_req_bool_arg(r, "optimizer", 0, &opt)) return;
  pw_store *s = pw_api_store(r);
  pw_job_brief b;
  if (!s || brief(r, s, &b)) return;
  pw_err err = {0};
  int n_stages = 0, st = (int)step, rc;
  if (st) rc = retained(r, s, st, &n_stages);
  else if ((rc = pw_store_ckpt_latest(s, r->id, &st, &n_stages, &err))) pw_reply_err(r, &err);
  if (rc) {
    free(b.spec);
    return;
  }
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s/.checkpoint-%lld-%d-%d-%u.safetensors", r->c->state_dir[0] ? r->c->state_dir : "/tmp",
           (long long)r->id, st, (int)getpid(), atomic_fetch_add(&seq, 1));
  rc = pw_ckpt_gather(r->c->state_dir, r->id, st, n_stages, opt, b.spec, tmp, &err);
  free(b.spec);
  if (rc) {
    char eb[600];
    pw_warn("job %lld: cannot gather the checkpoint of step %d: %s", (long long)r->id, st,
            pw_err_str(&err, eb, sizeof eb));
    pw_reply_error(r, rc == PW_ENOENT ? PW_ENOENT : PW_EIO, "step", "%s", err.msg);
    return;
  }
  /* Unlinked at once: the open fd keeps the data until the reply is sent. */
  int fd = open(tmp, O_RDONLY | O_CLOEXEC);
  unlink(tmp);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb)) {
    if (fd >= 0) close(fd);
    pw_reply_error(r, PW_EIO, "", "cannot read the gathered checkpoint");
    return;
  }
  char cd[128];
  snprintf(cd, sizeof cd, "attachment; filename=\"job-%lld-step-%d%s.safetensors\"", (long long)r->id, st,
           opt ? ".optim" : "");
  pw_reply_fd(r, MHD_HTTP_OK, "application/octet-stream", fd, (uint64_t)sb.st_size);
  pw_reply_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, cd);
}

/* ---- purge ---------------------------------------------------------------------- */

void pw_api_job_purge(pw_req *r) {
  pw_store *s = pw_api_store(r);
  pw_job_brief b;
  if (!s || brief(r, s, &b)) return;
  free(b.spec);
  if (!pw_job_state_terminal(b.state)) {
    pw_reply_error(r, PW_ECONFLICT, "purge", "job %lld is %s: cancel it first (DELETE without purge), then purge",
                   (long long)r->id, pw_job_state_name(b.state));
    return;
  }
  pw_err err = {0};
  char eb[600];
  if (pw_store_ckpt_purge(s, r->id, &err)) {
    pw_reply_err(r, &err);
    return;
  }
  if (pw_ck_remove(r->c->state_dir, r->id, -1, &err)) {
    pw_error("job %lld: purge: %s", (long long)r->id, pw_err_str(&err, eb, sizeof eb));
    pw_reply_err(r, &err);
    return;
  }
  pw_info("job %lld: checkpoint files purged", (long long)r->id);
  pw_reply_json(r, MHD_HTTP_OK, json_pack("{s:I, s:s, s:b}", "id", (json_int_t)r->id, "state",
                                          pw_job_state_name(b.state), "purged", 1));
}
