/* test_coord_http: the coordinator's REST API over real HTTP.
 *
 * Starts the server (http.c) on 127.0.0.1, port 0, with a real pw_coord
 * whose store is a temporary SQLite file, and talks to it through a tiny
 * blocking HTTP/1.1 client. No control loop runs: jobs stay queued, and
 * the test plays the loop's part by writing runs, metrics, timings and
 * checkpoints through the store API. Checks every route's answer, and a
 * table of malformed and hostile requests (status, error code, path,
 * message), with the server still answering after each. */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <limits.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "httptest.h"

#include "api.h"
#include "coord.h"
#include "plan.h"
#include "crc32c.h"
#include "safetensors.h"
#include "sha256.h"
#include "spec_json.h"

#ifndef PW_SOURCE_DIR
#define PW_SOURCE_DIR "."
#endif

static pw_coord C;
static pw_store *S; /* the test's own connection: it plays the control loop */
static char tmpdir[64];

static const char *SPEC =
    "{\"name\": \"tiny\", \"model\": {\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 8, \"d_model\": 16,"
    " \"n_layers\": 2, \"n_heads\": 2}, \"mesh\": {\"pp\": 2}, \"schedule\": {\"name\": \"1f1b\", \"microbatches\": 2},"
    " \"train\": {\"steps\": 10, \"batch_size\": 4, \"checkpoint_every\": 2}, \"data\": {\"kind\": \"text\","
    " \"path\": \"examples/data/corpus.txt\"}}";

/* ---- the HTTP client (httptest.h) ----------------------------------------- */

static int dial(int port) { return ht_dial(port, 0); }

static void exchange(int fd, const char *req, size_t n, resp *out) {
  ht_exchange(fd, req, n, out);
  assert_true(out->status > 0); /* every request here gets an HTTP answer */
}

static void req_port(int port, const char *method, const char *target, const char *headers, const char *body,
                     resp *out) {
  ht_req(port, 0, method, target, headers, body, out);
  assert_true(out->status > 0);
}

static void req(const char *method, const char *target, const char *body, resp *out) {
  req_port(C.http_port, method, target, NULL, body, out);
}

/* The upload token of the rank that holds stage `stage` in the test's
 * runs (stage k on pipeline rank k, tp 1); -1: none is sent. */
static int token_rank = -2; /* -2: the stage's own */

/* PUT a checkpoint shard: the file's bytes with hdr as the checksum
 * header (NULL: the right X-Pipewright-Crc32c; "": none), and the upload
 * token of token_rank. */
static void put_shard(int64_t id, int64_t run, int step, int stage, int opt, const char *file, const char *hdr,
                      resp *out) {
  FILE *f = fopen(file, "rb");
  assert_non_null(f);
  static char body[1 << 16];
  size_t n = fread(body, 1, sizeof body, f);
  fclose(f);
  char crc[64], tok[128] = "", hex[65];
  snprintf(crc, sizeof crc, "X-Pipewright-Crc32c: %08x\r\n", pw_crc32c(0, body, n));
  if (token_rank != -1) {
    pw_coord_upload_token(&C, id, run, token_rank == -2 ? stage : token_rank, hex);
    snprintf(tok, sizeof tok, "X-Pipewright-Upload-Token: %s\r\n", hex);
  }
  char *req = malloc(n + 1024);
  assert_non_null(req);
  int k = snprintf(req, 1024,
                   "PUT /v1/jobs/%lld/runs/%lld/checkpoints/%d/stages/%d%s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   "Connection: close\r\n%s%sContent-Length: %zu\r\n\r\n",
                   (long long)id, (long long)run, step, stage, opt ? "/optimizer" : "", hdr ? hdr : crc, tok, n);
  memcpy(req + k, body, n);
  ht_exchange(dial(C.http_port), req, (size_t)k + n, out);
  free(req);
  assert_true(out->status > 0);
}

static json_t *get_json(const char *target) {
  resp r;
  req("GET", target, NULL, &r);
  if (r.status != 200) fprintf(stderr, "GET %s: %d %s\n", target, r.status, r.body);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(header(&r, "Content-Type"), "application/json"));
  json_t *j = body_json(&r);
  resp_free(&r);
  return j;
}

static void assert_alive(void) {
  resp r;
  req("GET", "/healthz", NULL, &r);
  assert_int_equal(r.status, 200);
  resp_free(&r);
}

static int64_t submit(const char *spec) {
  resp r;
  req("POST", "/v1/jobs", spec, &r);
  if (r.status != 201) fprintf(stderr, "submit: %d %s\n", r.status, r.body);
  assert_int_equal(r.status, 201);
  json_t *j = body_json(&r);
  int64_t id = json_integer_value(json_object_get(j, "id"));
  assert_true(id > 0);
  char loc[64];
  snprintf(loc, sizeof loc, "/v1/jobs/%lld", (long long)id);
  assert_string_equal(header(&r, "Location"), loc);
  assert_string_equal(json_string_value(json_object_get(j, "location")), loc);
  assert_string_equal(json_string_value(json_object_get(j, "state")), "queued");
  json_decref(j);
  resp_free(&r);
  return id;
}

static int64_t jobs_total(void) {
  json_t *j = get_json("/v1/jobs");
  int64_t n = json_integer_value(json_object_get(j, "total"));
  json_decref(j);
  return n;
}

/* text with the first `from` replaced by `to`, into out. */
static void replace(const char *text, const char *from, const char *to, char *out, size_t cap) {
  const char *k = strstr(text, from);
  assert_non_null(k);
  snprintf(out, cap, "%.*s%s%s", (int)(k - text), text, to, k + strlen(from));
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* ---- setup -------------------------------------------------------------- */

static void coord_init(pw_coord *c, const char *token) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  snprintf(c->http_host, sizeof c->http_host, "127.0.0.1");
  snprintf(c->db_path, sizeof c->db_path, "%s/coord.db", tmpdir);
  snprintf(c->web_dir, sizeof c->web_dir, "%s/web", tmpdir);
  snprintf(c->state_dir, sizeof c->state_dir, "%s", tmpdir);
  /* data.path in the specs is read under the source tree, as --data-root would allow */
  if (!realpath(PW_SOURCE_DIR, c->data_root)) fail_msg("realpath %s", PW_SOURCE_DIR);
  snprintf(c->api_token, sizeof c->api_token, "%s", token);
  c->max_body = 64 * 1024;
  pw_err err = {0};
  int rc = pw_http_start(c, &err);
  if (rc) fprintf(stderr, "pw_http_start: %s\n", err.msg);
  assert_int_equal(rc, 0);
  assert_true(c->http_port > 0);
}

static void coord_fini(pw_coord *c) {
  pw_http_stop(c);
  for (int i = 0; i < c->n_stores; i++) pw_store_close(c->stores[i]);
  free(c->stores);
  free(c->workers);
  pthread_mutex_destroy(&c->mu);
}

static int setup(void **state) {
  /* relative data paths in specs resolve from the coordinator's cwd */
  if (chdir(PW_SOURCE_DIR)) return -1;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/pw-http-XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  char p[256];
  snprintf(p, sizeof p, "%s/web", tmpdir);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/web/index.html", tmpdir);
  write_file(p, "<!doctype html><title>pipewright</title>\n");
  snprintf(p, sizeof p, "%s/web/app.js", tmpdir);
  write_file(p, "console.log('hi');\n");
  snprintf(p, sizeof p, "%s/secret.txt", tmpdir);
  write_file(p, "secret\n");
  coord_init(&C, "");
  pw_err err = {0};
  return pw_store_open(C.db_path, &S, &err);
}

static int teardown(void **state) {
  coord_fini(&C);
  pw_store_close(S);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  return system(cmd);
}

/* ---- the happy paths ------------------------------------------------------ */

static void test_health_metrics_workers_schedules(void **state) {
  json_t *j = get_json("/healthz");
  assert_string_equal(json_string_value(json_object_get(j, "status")), "ok");
  assert_non_null(json_string_value(json_object_get(j, "version")));
  json_decref(j);

  resp r;
  req("HEAD", "/healthz", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, 0);
  resp_free(&r);
  /* store writes failing (as the loop's store_retry records it): 503 */
  pthread_mutex_lock(&C.mu);
  snprintf(C.store_error, sizeof C.store_error, "metric: database or disk is full");
  C.store_pending = 3;
  pthread_mutex_unlock(&C.mu);
  req("GET", "/healthz", NULL, &r);
  assert_int_equal(r.status, 503);
  assert_non_null(strstr(r.body, "\"unavailable\""));
  assert_non_null(strstr(r.body, "disk is full"));
  assert_non_null(strstr(r.body, "3 pending"));
  resp_free(&r);
  pthread_mutex_lock(&C.mu);
  C.store_error[0] = 0;
  C.store_pending = 0;
  pthread_mutex_unlock(&C.mu);

  req("GET", "/metrics", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(header(&r, "Content-Type"), "text/plain"));
  assert_non_null(strstr(r.body, "pipewright_http_requests_total{code=\"2xx\"}"));
  assert_non_null(strstr(r.body, "pipewright_jobs{state=\"queued\"}"));
  resp_free(&r);

  j = get_json("/v1/workers");
  assert_true(json_is_array(json_object_get(j, "workers")));
  assert_int_equal(json_array_size(json_object_get(j, "workers")), 0);
  json_decref(j);

  j = get_json("/v1/schedules");
  json_t *arr = json_object_get(j, "schedules");
  int n = 0;
  pw_sched_infos(&n);
  assert_int_equal(json_array_size(arr), n);
  assert_int_equal(n, 9);
  int seen = 0;
  size_t i;
  json_t *s;
  json_array_foreach(arr, i, s) seen += !strcmp(json_string_value(json_object_get(s, "name")), "zb-h1");
  assert_int_equal(seen, 1);
  json_decref(j);
}

/* POST /v1/plans answers exactly what the planner gives in-process. */
static void test_plans_equal_cli(void **state) {
  json_t *spec = json_loads(SPEC, 0, NULL);
  pw_job job;
  pw_plan p;
  assert_int_equal(pw_job_parse(spec, NULL, &job, NULL), 0);
  assert_int_equal(pw_plan_build(&job, NULL, &p, NULL), 0);
  json_t *want = pw_plan_json(&job, &p), *want_cmp = pw_plan_compare_json(&job);
  pw_plan_free(&p);
  assert_int_equal(pw_plan_build(&job, "gpipe", &p, NULL), 0);
  json_t *want_gpipe = pw_plan_json(&job, &p);
  pw_plan_free(&p);
  pw_job_free(&job);

  resp r;
  req("POST", "/v1/plans", SPEC, &r);
  assert_int_equal(r.status, 200);
  json_t *got = body_json(&r);
  assert_true(json_equal(got, want));
  json_decref(got);
  resp_free(&r);

  req("POST", "/v1/plans?compare=1", SPEC, &r);
  assert_int_equal(r.status, 200);
  got = body_json(&r);
  assert_true(json_equal(got, want_cmp));
  assert_false(json_equal(got, want));
  json_decref(got);
  resp_free(&r);

  req("POST", "/v1/plans?schedule=gpipe", SPEC, &r);
  assert_int_equal(r.status, 200);
  got = body_json(&r);
  assert_true(json_equal(got, want_gpipe));
  json_decref(got);
  resp_free(&r);

  json_decref(want);
  json_decref(want_cmp);
  json_decref(want_gpipe);
  json_decref(spec);
}

static void test_submit_list_get(void **state) {
  int64_t before = jobs_total();
  int64_t id = submit(SPEC);
  assert_int_equal(jobs_total(), before + 1);

  char t[128];
  snprintf(t, sizeof t, "/v1/jobs/%lld", (long long)id);
  json_t *j = get_json(t);
  assert_string_equal(json_string_value(json_object_get(j, "state")), "queued");
  assert_string_equal(json_string_value(json_object_get(j, "name")), "tiny");
  assert_string_equal(json_string_value(json_object_get(j, "model")), "gpt d=16 L=2 H=2");
  assert_string_equal(json_string_value(json_object_get(j, "schedule")), "1f1b");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "progress"), "total")), 10);
  assert_true(json_is_null(json_object_get(j, "eta_seconds")));
  assert_int_equal(json_array_size(json_object_get(j, "ranks")), 0);
  /* the data path (under the data root) is stored as the dataset it was
   * imported as, with every default filled */
  json_t *spec = json_object_get(j, "spec");
  json_t *data = json_object_get(spec, "data");
  assert_null(json_object_get(data, "path"));
  const char *ds = json_string_value(json_object_get(data, "dataset"));
  assert_non_null(ds);
  char dpath[4200];
  snprintf(dpath, sizeof dpath, "%s/datasets/%s", tmpdir, ds);
  struct stat st;
  assert_int_equal(stat(dpath, &st), 0);
  FILE *f = fopen("examples/data/corpus.txt", "rb");
  assert_non_null(f);
  char *bytes = malloc((size_t)st.st_size + 1);
  assert_int_equal(fread(bytes, 1, (size_t)st.st_size + 1, f), (size_t)st.st_size);
  fclose(f);
  char hex[65];
  pw_sha256_hex(bytes, (size_t)st.st_size, hex);
  free(bytes);
  assert_string_equal(ds, hex);
  assert_true(json_is_object(json_object_get(spec, "train")));
  json_decref(j);

  j = get_json("/v1/jobs?state=queued&limit=1");
  assert_int_equal(json_integer_value(json_object_get(j, "limit")), 1);
  assert_int_equal(json_array_size(json_object_get(j, "jobs")), 1);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(j, "jobs"), 0), "id")), id);
  json_decref(j);
  j = get_json("/v1/jobs?state=running");
  assert_int_equal(json_integer_value(json_object_get(j, "total")), 0);
  json_decref(j);
  j = get_json("/v1/jobs?offset=1000");
  assert_int_equal(json_array_size(json_object_get(j, "jobs")), 0);
  json_decref(j);
}

/* The loop's part played by hand: a run with two ranks, three steps of
 * metrics, a sampled step, a checkpoint of both stages. */
static void test_run_views(void **state) {
  int64_t id = submit(SPEC), run = 0;
  pw_err err = {0};
  assert_int_equal(pw_store_job_set_state(S, id, PW_JOB_PLANNING, "t", NULL, &err), 0);
  assert_int_equal(pw_store_job_set_state(S, id, PW_JOB_DISPATCHING, "t", NULL, &err), 0);
  /* A stored plan no planner would make (bubble 0.25 exactly): the
   * timeline must show this one, not one rebuilt from the spec. */
  assert_int_equal(pw_store_run_insert(S, id,
                                       "{\"analytics\":{\"schedule\":\"1f1b\",\"makespan\":1.5,"
                                       "\"bubble_ratio\":0.25,\"timeline\":[[],[]]}}",
                                       &run, &err),
                   0);
  for (int k = 0; k < 2; k++) {
    char nm[8];
    snprintf(nm, sizeof nm, "w%d", k);
    assert_int_equal(pw_store_stage_insert(S, run, k, k, "[]", 100, 1e6, &err), 0);
    assert_int_equal(pw_store_assignment_insert(S, run, k, 0, nm, &err), 0);
    assert_int_equal(pw_store_actions_insert(S, run, k, "F0@s0 B0@s0", &err), 0);
  }
  assert_int_equal(pw_store_job_set_state(S, id, PW_JOB_RUNNING, "t", NULL, &err), 0);
  for (int k = 0; k < 3; k++) {
    pw_metric m = {.step = k, .loss = 4.0 - k, .step_time = 0.5, .tokens = 32, .tokens_per_s = 64, .lr = 1e-3};
    assert_int_equal(pw_store_metric_insert(S, id, run, &m, &err), 0);
  }
  assert_int_equal(pw_store_job_progress(S, id, 3, 2.0, 64, &err), 0);
  /* rank 0 busy 4 of 7, rank 1 busy 4 of 7: bubble 6/14 */
  assert_int_equal(pw_store_timing_insert(S, id, run, 2, 0, "[[\"F\",0,0,0,1],[\"F\",1,0,1,2],[\"B\",0,0,4,6]]", &err), 0);
  assert_int_equal(pw_store_timing_insert(S, id, run, 2, 1, "[[\"F\",0,1,1,2],[\"B\",0,1,2,4],[\"B\",1,1,6,7]]", &err), 0);

  char t[128];
  snprintf(t, sizeof t, "/v1/jobs/%lld", (long long)id);
  json_t *j = get_json(t);
  assert_string_equal(json_string_value(json_object_get(j, "state")), "running");
  assert_true(json_is_number(json_object_get(j, "eta_seconds")));
  assert_float_equal(json_number_value(json_object_get(j, "eta_seconds")), 0.5 * 7, 1e-9);
  json_t *ranks = json_object_get(j, "ranks");
  assert_int_equal(json_array_size(ranks), 2);
  json_t *r1 = json_array_get(ranks, 1);
  assert_int_equal(json_integer_value(json_object_get(r1, "rank")), 1);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(r1, "stages"), 0)), 1);
  assert_non_null(json_object_get(r1, "worker"));
  json_decref(j);

  snprintf(t, sizeof t, "/v1/jobs/%lld/metrics?since=1", (long long)id);
  j = get_json(t);
  json_t *ms = json_object_get(j, "metrics");
  assert_int_equal(json_array_size(ms), 2);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(ms, 0), "step")), 1);
  json_decref(j);

  snprintf(t, sizeof t, "/v1/jobs/%lld/events", (long long)id);
  j = get_json(t);
  json_t *ev = json_object_get(j, "events");
  assert_true(json_array_size(ev) >= 4); /* queued + three transitions */
  json_int_t last = json_integer_value(json_object_get(json_array_get(ev, json_array_size(ev) - 1), "id"));
  json_decref(j);
  snprintf(t, sizeof t, "/v1/jobs/%lld/events?since=%lld", (long long)id, (long long)last);
  j = get_json(t);
  assert_int_equal(json_array_size(json_object_get(j, "events")), 0);
  json_decref(j);

  snprintf(t, sizeof t, "/v1/jobs/%lld/timeline?step=2", (long long)id);
  j = get_json(t);
  assert_int_equal(json_array_size(json_object_get(j, "ranks")), 2);
  json_t *bub = json_object_get(j, "bubble");
  assert_float_equal(json_number_value(json_object_get(bub, "measured")), 6.0 / 14.0, 1e-9);
  json_t *planned = json_object_get(j, "planned");
  assert_int_equal(json_array_size(json_object_get(planned, "timeline")), 2);
  assert_float_equal(json_number_value(json_object_get(planned, "bubble_ratio")), 0.25, 0);
  assert_float_equal(json_number_value(json_object_get(planned, "makespan")), 1.5, 0);
  assert_float_equal(json_number_value(json_object_get(bub, "planned")), 0.25, 0);
  json_decref(j);

  resp r;
  snprintf(t, sizeof t, "/v1/jobs/%lld/timeline?step=2&format=chrome", (long long)id);
  req("GET", t, NULL, &r);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(header(&r, "Content-Disposition"), "attachment"));
  j = body_json(&r);
  json_t *tev = json_object_get(j, "traceEvents"), *e;
  size_t i;
  int xs = 0;
  json_array_foreach(tev, i, e) {
    if (strcmp(json_string_value(json_object_get(e, "ph")), "X")) continue;
    xs++;
    if (!strcmp(json_string_value(json_object_get(e, "name")), "B0@s1")) {
      assert_int_equal(json_integer_value(json_object_get(e, "tid")), 1);
      assert_float_equal(json_number_value(json_object_get(e, "ts")), 2e6, 1e-3);
      assert_float_equal(json_number_value(json_object_get(e, "dur")), 2e6, 1e-3);
    }
  }
  assert_int_equal(xs, 6);
  json_decref(j);
  resp_free(&r);

  snprintf(t, sizeof t, "/v1/jobs/%lld/timeline?step=7", (long long)id);
  req("GET", t, NULL, &r);
  /* not check_error: this 404 carries a fourth field, the sampled steps */
  assert_int_equal(r.status, 404);
  j = body_json(&r);
  json_t *e404 = json_object_get(j, "error");
  assert_string_equal(json_string_value(json_object_get(e404, "code")), "not_found");
  assert_string_equal(json_string_value(json_object_get(e404, "path")), "step");
  assert_non_null(strstr(json_string_value(json_object_get(e404, "message")), "step 7 of job"));
  assert_non_null(strstr(json_string_value(json_object_get(e404, "message")), "was not sampled; sampled steps: 2"));
  assert_int_equal(json_array_size(json_object_get(e404, "sampled")), 1);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(e404, "sampled"), 0)), 2);
  json_decref(j);
  resp_free(&r);

  /* checkpoint: none yet, then both stages' shards of step 2 uploaded */
  snprintf(t, sizeof t, "/v1/jobs/%lld/checkpoint", (long long)id);
  req("GET", t, NULL, &r);
  check_error(&r, 404, "not_found", NULL, "no complete checkpoint");
  resp_free(&r);
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {6, 5, 4, 3, 2, 1}, s0[2] = {7, 8}, s1[2] = {-1, -1};
  pw_st_tensor st0[2] = {{"embed.tok.weight", PW_ST_F32, 2, {2, 3}, a}, {"shared.weight", PW_ST_F32, 1, {2}, s0}};
  pw_st_tensor st1[2] = {{"lm_head.weight", PW_ST_F32, 2, {2, 3}, b}, {"shared.weight", PW_ST_F32, 1, {2}, s1}};
  pw_st_tensor ot0[1] = {{"exp_avg.embed.tok.weight", PW_ST_F32, 2, {2, 3}, b}};
  pw_st_tensor ot1[1] = {{"exp_avg.lm_head.weight", PW_ST_F32, 2, {2, 3}, a}};
  char f0[128], f1[128], o0[128], o1[128], junk[128];
  snprintf(f0, sizeof f0, "%s/s0.safetensors", tmpdir);
  snprintf(f1, sizeof f1, "%s/s1.safetensors", tmpdir);
  snprintf(o0, sizeof o0, "%s/o0.safetensors", tmpdir);
  snprintf(o1, sizeof o1, "%s/o1.safetensors", tmpdir);
  snprintf(junk, sizeof junk, "%s/junk.safetensors", tmpdir);
  assert_int_equal(pw_st_write(f0, st0, 2, NULL, 0, &err), 0);
  assert_int_equal(pw_st_write(f1, st1, 2, NULL, 0, &err), 0);
  assert_int_equal(pw_st_write(o0, ot0, 1, NULL, 0, &err), 0);
  assert_int_equal(pw_st_write(o1, ot1, 1, NULL, 0, &err), 0);
  write_file(junk, "this is not a safetensors file");
  put_shard(id, run, 2, 0, 0, f0, NULL, &r);
  assert_int_equal(r.status, 201);
  j = body_json(&r);
  assert_false(json_is_true(json_object_get(j, "complete")));
  assert_string_equal(json_string_value(json_object_get(j, "kind")), "model");
  json_decref(j);
  resp_free(&r);
  req("GET", t, NULL, &r); /* one shard is not a whole model */
  check_error(&r, 404, "not_found", NULL, "no complete checkpoint");
  resp_free(&r);
  /* refused: a checksum that does not match (corrupted in transit), none,
   * not a safetensors file, a run that is not the job's, no such stage */
  put_shard(id, run, 2, 1, 0, f1, "X-Pipewright-Crc32c: 00000000\r\n", &r);
  check_error(&r, 400, "malformed_data", "body", "corrupted in transit");
  resp_free(&r);
  put_shard(id, run, 2, 1, 0, f1, "", &r);
  check_error(&r, 400, "invalid_argument", "X-Pipewright-Crc32c", "states its checksum");
  resp_free(&r);
  put_shard(id, run, 2, 1, 0, junk, NULL, &r);
  check_error(&r, 400, "malformed_data", "body", "not a valid safetensors file");
  resp_free(&r);
  put_shard(id, run + 7, 2, 1, 0, f1, NULL, &r);
  check_error(&r, 409, "conflict", "run", "not job");
  resp_free(&r);
  put_shard(id, run, 2, 2, 0, f1, NULL, &r);
  check_error(&r, 404, "not_found", "stage", "no stage 2");
  resp_free(&r);
  /* the cluster token alone stores nothing: no upload token, another
   * rank's, or a step the job does not checkpoint (it checkpoints at 2) */
  token_rank = -1;
  put_shard(id, run, 2, 1, 0, f1, NULL, &r);
  check_error(&r, 403, "forbidden", "X-Pipewright-Upload-Token", "only the worker assigned stage 1");
  resp_free(&r);
  token_rank = 0;
  put_shard(id, run, 2, 1, 0, f1, NULL, &r);
  check_error(&r, 403, "forbidden", "X-Pipewright-Upload-Token", "only the worker assigned stage 1");
  resp_free(&r);
  token_rank = -2;
  put_shard(id, run, 3, 1, 0, f1, NULL, &r);
  check_error(&r, 400, "invalid_argument", "step", "not at step 3");
  resp_free(&r);
  put_shard(id, run, 2, 1, 0, f1, NULL, &r);
  assert_int_equal(r.status, 201);
  resp_free(&r);
  put_shard(id, run, 2, 0, 1, o0, NULL, &r);
  assert_int_equal(r.status, 201);
  resp_free(&r);
  req("GET", t, NULL, &r); /* the model shards alone are not a step: stage 1's optimizer is missing */
  check_error(&r, 404, "not_found", NULL, "no complete checkpoint");
  resp_free(&r);
  put_shard(id, run, 2, 1, 1, o1, NULL, &r);
  assert_int_equal(r.status, 201);
  j = body_json(&r);
  assert_true(json_is_true(json_object_get(j, "complete")));
  json_decref(j);
  resp_free(&r);
  /* no temporary upload file is left in the step's folder */
  char cmd[256];
  snprintf(cmd, sizeof cmd, "ls -a %s/checkpoints/job-%lld/step-2 | grep -q '^\\.upload'", tmpdir, (long long)id);
  assert_int_not_equal(system(cmd), 0);
  req("GET", t, NULL, &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(header(&r, "Content-Type"), "application/octet-stream");
  char cd[128];
  snprintf(cd, sizeof cd, "attachment; filename=\"job-%lld-step-2.safetensors\"", (long long)id);
  assert_string_equal(header(&r, "Content-Disposition"), cd);
  char out[128];
  snprintf(out, sizeof out, "%s/merged.safetensors", tmpdir);
  FILE *f = fopen(out, "wb");
  fwrite(r.body, 1, r.len, f);
  fclose(f);
  resp_free(&r);
  pw_st_file *m;
  assert_int_equal(pw_st_open(out, &m, &err), 0);
  assert_int_equal(pw_st_count(m), 3);
  float got[6];
  int64_t sh2[1] = {2}, sh23[2] = {2, 3};
  assert_int_equal(pw_st_copy(m, "shared.weight", PW_ST_F32, 1, sh2, got, &err), 0);
  assert_true(got[0] == 7 && got[1] == 8); /* from the lowest stage */
  assert_int_equal(pw_st_copy(m, "lm_head.weight", PW_ST_F32, 2, sh23, got, &err), 0);
  assert_true(got[0] == 6 && got[5] == 1);
  assert_string_equal(pw_st_meta_get(m, "step"), "2");
  pw_st_close(m);
  /* the optimizer state, gathered the same way */
  snprintf(t, sizeof t, "/v1/jobs/%lld/checkpoint?step=2&optimizer=1", (long long)id);
  req("GET", t, NULL, &r);
  assert_int_equal(r.status, 200);
  f = fopen(out, "wb");
  fwrite(r.body, 1, r.len, f);
  fclose(f);
  resp_free(&r);
  assert_int_equal(pw_st_open(out, &m, &err), 0);
  assert_int_equal(pw_st_count(m), 2);
  assert_int_equal(pw_st_copy(m, "exp_avg.lm_head.weight", PW_ST_F32, 2, sh23, got, &err), 0);
  assert_true(got[0] == 1 && got[5] == 6);
  pw_st_close(m);
  /* a step that is not retained is a 404 naming it */
  snprintf(t, sizeof t, "/v1/jobs/%lld/checkpoint?step=3", (long long)id);
  req("GET", t, NULL, &r);
  check_error(&r, 404, "not_found", "step", "step 3");
  resp_free(&r);
  /* one stored shard, byte for byte (what a resuming worker fetches) */
  snprintf(t, sizeof t, "/v1/jobs/%lld/checkpoints/2/stages/1/optimizer", (long long)id);
  req("GET", t, NULL, &r);
  assert_int_equal(r.status, 200);
  f = fopen(o1, "rb");
  char want[4096];
  size_t wn = fread(want, 1, sizeof want, f);
  fclose(f);
  assert_int_equal(r.len, wn);
  assert_memory_equal(r.body, want, wn);
  resp_free(&r);
  snprintf(t, sizeof t, "/v1/jobs/%lld/checkpoints", (long long)id);
  j = get_json(t);
  json_t *cks = json_object_get(j, "checkpoints");
  assert_int_equal(json_array_size(cks), 1);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(cks, 0), "step")), 2);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(cks, 0), "stages")), 2);
  json_decref(j);
  /* a running job's files cannot be purged */
  snprintf(t, sizeof t, "/v1/jobs/%lld?purge=1", (long long)id);
  req("DELETE", t, NULL, &r);
  check_error(&r, 409, "conflict", "purge", "cancel it first");
  resp_free(&r);
  /* the temporary gathered file is gone from the state dir */
  snprintf(cmd, sizeof cmd, "ls -a %s | grep -q '^\\.checkpoint'", tmpdir);
  assert_int_not_equal(system(cmd), 0);

  /* a second run repeats step 2: one row per step by default (its), both with all=1 */
  int64_t run2 = 0;
  assert_int_equal(pw_store_run_insert(S, id, NULL, &run2, &err), 0);
  pw_metric again = {.step = 2, .loss = 1.5, .step_time = 0.5};
  assert_int_equal(pw_store_metric_insert(S, id, run2, &again, &err), 0);
  snprintf(t, sizeof t, "/v1/jobs/%lld/metrics?since=1", (long long)id);
  j = get_json(t);
  ms = json_object_get(j, "metrics");
  assert_int_equal(json_array_size(ms), 2);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(ms, 1), "run")), run2);
  json_decref(j);
  snprintf(t, sizeof t, "/v1/jobs/%lld/metrics?since=1&all=1", (long long)id);
  j = get_json(t);
  ms = json_object_get(j, "metrics");
  assert_int_equal(json_array_size(ms), 3);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(ms, 1), "run")), run);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(ms, 2), "run")), run2);
  json_decref(j);
  /* cancel: once, then 409 */
  snprintf(t, sizeof t, "/v1/jobs/%lld", (long long)id);
  req("DELETE", t, NULL, &r);
  assert_int_equal(r.status, 200);
  j = body_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "state")), "cancelled");
  assert_int_equal(json_integer_value(json_object_get(j, "id")), id);
  json_decref(j);
  resp_free(&r);
  req("DELETE", t, NULL, &r);
  check_error(&r, 409, "conflict", NULL, "already");
  resp_free(&r);
  j = get_json(t);
  assert_string_equal(json_string_value(json_object_get(j, "state")), "cancelled");
  json_decref(j);
}

static void test_static_files(void **state) {
  resp r;
  req("GET", "/", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(header(&r, "Content-Type"), "text/html; charset=utf-8");
  assert_non_null(strstr(r.body, "<title>pipewright</title>"));
  resp_free(&r);
  req("GET", "/app.js", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(header(&r, "Content-Type"), "text/javascript; charset=utf-8");
  assert_string_equal(r.body, "console.log('hi');\n");
  resp_free(&r);
}

/* ---- malformed and hostile requests -------------------------------------- */

typedef struct {
  const char *method, *target, *body, *headers;
  int status;
  const char *code, *path, *msg;
  const char *allow; /* expected Allow header (405) */
} hostile;

static void test_hostile_table(void **state) {
  char long_url[3100];
  snprintf(long_url, sizeof long_url, "/v1/jobs?x=");
  memset(long_url + 11, 'a', 3000);
  long_url[3011] = 0;
  static char bad_type[1024], bad_plan[1024], bad_tp[1024], tp2[1024], tp3[1024], not_object[] = "[1, 2]";
  replace(SPEC, "\"d_model\": 16", "\"d_model\": \"big\"", bad_type, sizeof bad_type);
  /* valid as a spec, refused by the planner: dualpipev needs two stages per rank */
  replace(SPEC, "\"1f1b\"", "\"dualpipev\"", bad_plan, sizeof bad_plan);
  /* tensor parallel: not with bf16; a tp not dividing n_heads refused by the planner */
  replace(SPEC, "\"batch_size\": 4", "\"batch_size\": 4, \"precision\": \"bf16\"", bad_tp, sizeof bad_tp);
  replace(bad_tp, "\"pp\": 2}", "\"pp\": 2, \"tp\": 2}", tp2, sizeof tp2);
  replace(SPEC, "\"pp\": 2", "\"pp\": 2, \"tp\": 3", tp3, sizeof tp3);
  const hostile cases[] = {
      {"POST", "/v1/jobs", "{\"name\": ", NULL, 400, "malformed_json", "", "line 1", NULL},
      {"POST", "/v1/jobs", "", NULL, 400, "malformed_json", "", "empty", NULL},
      {"POST", "/v1/jobs", "{\"a\": 1, \"a\": 2}", NULL, 400, "malformed_json", "", "duplicate", NULL},
      {"POST", "/v1/plans", "{\"x\": 1} trailing", NULL, 400, "malformed_json", "", "column", NULL},
      {"POST", "/v1/jobs", not_object, NULL, 422, "invalid_spec", "", "object", NULL},
      {"POST", "/v1/jobs", bad_type, NULL, 422, "invalid_spec", "model.d_model", "", NULL},
      {"POST", "/v1/plans", bad_type, NULL, 422, "invalid_spec", "model.d_model", "", NULL},
      {"POST", "/v1/jobs", bad_plan, NULL, 422, "invalid_spec", "mesh.virtual_stages", "dualpipev", NULL},
      {"POST", "/v1/jobs", "{\"model\": {\"template\": \"gpt\"}, \"data\": {\"kind\": \"copy\"}, \"bogus\": 1}", NULL,
       422, "invalid_spec", "bogus", "", NULL},
      {"POST", "/v1/jobs", tp2, NULL, 422, "invalid_spec", "mesh.tp", "runs train.precision \"fp32\" only", NULL},
      {"POST", "/v1/plans", tp3, NULL, 422, "invalid_spec", "mesh.tp", "must divide model.n_heads (2 % 3", NULL},
      {"POST", "/v1/plans?compare=maybe", SPEC, NULL, 400, "invalid_argument", "compare", "maybe", NULL},
      {"POST", "/v1/plans?schedule=nope", SPEC, NULL, 400, "invalid_argument", "schedule", "nope", NULL},
      {"GET", "/v1/nope", NULL, NULL, 404, "not_found", "", "no route for GET /v1/nope", NULL},
      {"GET", "/v1", NULL, NULL, 404, "not_found", "", "no route", NULL},
      {"GET", "/v1/jobs/abc", NULL, NULL, 404, "not_found", "", "no route", NULL},
      {"GET", "/v1/jobs/0", NULL, NULL, 404, "not_found", "", "no route", NULL},
      {"GET", "/v1/jobs/99999", NULL, NULL, 404, "not_found", "id", "no job 99999", NULL},
      {"DELETE", "/v1/jobs/99999", NULL, NULL, 404, "not_found", "id", "no job 99999", NULL},
      {"GET", "/v1/jobs/99999/metrics", NULL, NULL, 404, "not_found", "id", "no job", NULL},
      {"GET", "/v1/jobs/99999/events", NULL, NULL, 404, "not_found", "id", "no job", NULL},
      {"GET", "/v1/jobs/99999/timeline", NULL, NULL, 404, "not_found", "id", "no job", NULL},
      {"GET", "/v1/jobs/99999/checkpoint", NULL, NULL, 404, "not_found", "id", "no job", NULL},
      {"PUT", "/v1/jobs", "{}", NULL, 405, "method_not_allowed", "", "PUT", "POST, GET, HEAD"},
      {"DELETE", "/v1/workers", NULL, NULL, 405, "method_not_allowed", "", "DELETE", "GET, HEAD"},
      {"POST", "/v1/jobs/1", "{}", NULL, 405, "method_not_allowed", "", "POST", "GET, HEAD, DELETE"},
      {"POST", "/index.html", "{}", NULL, 405, "method_not_allowed", "", "static", "GET, HEAD"},
      {"GET", "/v1/jobs?limit=0", NULL, NULL, 400, "invalid_argument", "limit", "[1, 500]", NULL},
      {"GET", "/v1/jobs?limit=501", NULL, NULL, 400, "invalid_argument", "limit", "501", NULL},
      {"GET", "/v1/jobs?limit=abc", NULL, NULL, 400, "invalid_argument", "limit", "abc", NULL},
      {"GET", "/v1/jobs?offset=-1", NULL, NULL, 400, "invalid_argument", "offset", "-1", NULL},
      {"GET", "/v1/jobs?state=bogus", NULL, NULL, 400, "invalid_argument", "state", "queued", NULL},
      {"GET", "/v1/jobs/1/metrics?since=x", NULL, NULL, 400, "invalid_argument", "since", "since", NULL},
      {"GET", "/v1/jobs/1/timeline?format=xml", NULL, NULL, 400, "invalid_argument", "format", "chrome", NULL},
      {"GET", "/v1/jobs?state=a%00b", NULL, NULL, 400, "invalid_argument", "url", "NUL", NULL},
      {"GET", long_url, NULL, NULL, 414, "too_large", "url", "limit is 2048", NULL},
      {"GET", "/../secret.txt", NULL, NULL, 404, "not_found", "", "no such file", NULL},
      {"GET", "/%2e%2e/secret.txt", NULL, NULL, 404, "not_found", "", "no such file", NULL},
      {"GET", "/app.js%00.html", NULL, NULL, 404, "not_found", "url", "NUL", NULL},
      {"GET", "/nope.html", NULL, NULL, 404, "not_found", "", "no such file", NULL},
      {"POST", "/v1/jobs", NULL, "Content-Length: 10000000\r\n", 413, "too_large", "body", "limit is 65536", NULL},
  };
  int64_t before = jobs_total();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const hostile *h = &cases[i];
    resp r;
    fprintf(stderr, "  case %zu: %s %.60s\n", i, h->method, h->target);
    req_port(C.http_port, h->method, h->target, h->headers, h->body, &r);
    check_error(&r, h->status, h->code, h->path, h->msg);
    if (h->allow) assert_string_equal(header(&r, "Allow"), h->allow);
    resp_free(&r);
    assert_alive();
  }
  assert_int_equal(jobs_total(), before); /* nothing refused was stored */
}

/* Bodies over the bound: declared (answered before reading), sent whole,
 * and chunked (read, dropped, answered at the end). */
static void test_huge_bodies(void **state) {
  size_t n = 200 * 1024;
  char *big = malloc(n + 1);
  memset(big, ' ', n);
  big[0] = '{';
  big[n - 1] = '}';
  big[n] = 0;
  resp r;
  req("POST", "/v1/jobs", big, &r);
  check_error(&r, 413, "too_large", "body", "limit is 65536");
  resp_free(&r);
  assert_alive();

  /* chunked: 4 chunks of 32 KiB */
  size_t cap = n + 1024, len = 0;
  char *q = malloc(cap);
  len += (size_t)snprintf(q, cap, "POST /v1/plans HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n");
  for (int c = 0; c < 4; c++) {
    len += (size_t)snprintf(q + len, cap - len, "%x\r\n", 32768);
    memset(q + len, ' ', 32768);
    len += 32768;
    len += (size_t)snprintf(q + len, cap - len, "\r\n");
  }
  len += (size_t)snprintf(q + len, cap - len, "0\r\n\r\n");
  exchange(dial(C.http_port), q, len, &r);
  check_error(&r, 413, "too_large", "body", "over the limit");
  resp_free(&r);
  free(q);
  free(big);
  assert_alive();

  /* a body just under the bound is read and parsed */
  char *ok = malloc(60 * 1024);
  snprintf(ok, 60 * 1024, "%s", SPEC);
  size_t l = strlen(ok);
  memset(ok + l, ' ', 60 * 1024 - l - 1);
  ok[60 * 1024 - 1] = 0;
  req("POST", "/v1/plans", ok, &r);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  free(ok);
}

static void test_token(void **state) {
  static pw_coord T; /* a second server over the same store, with a token */
  coord_init(&T, "s3cret-token");
  const struct {
    const char *target, *headers;
    int status;
    const char *msg;
  } cases[] = {
      {"/v1/jobs", NULL, 401, "needs a bearer token"},
      {"/v1/jobs", "Authorization: Bearer wrong\r\n", 401, "wrong"},
      {"/v1/jobs", "Authorization: Bearer s3cret-token-and-more\r\n", 401, "wrong"},
      {"/v1/jobs", "Authorization: Basic czNjcmV0LXRva2Vu\r\n", 401, "wrong"},
      {"/v1/jobs", "Authorization: Bearer \r\n", 401, "wrong"},
      {"/metrics", NULL, 401, "bearer"},
      {"/v1/nope", NULL, 401, "bearer"}, /* routes are not revealed without the token */
      {"/v1/jobs", "Authorization: Bearer s3cret-token\r\n", 200, NULL},
      {"/v1/jobs", "Authorization: bearer s3cret-token\r\n", 200, NULL},
      {"/healthz", NULL, 200, NULL},
      {"/", NULL, 200, NULL}, /* the dashboard asks for the token itself */
      {"/v1/nope", "Authorization: Bearer s3cret-token\r\n", 404, "no route"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    resp r;
    req_port(T.http_port, "GET", cases[i].target, cases[i].headers, NULL, &r);
    if (cases[i].status == 401) {
      check_error(&r, 401, "unauthorized", "Authorization", cases[i].msg);
      assert_non_null(header(&r, "WWW-Authenticate"));
      assert_int_equal(strncmp(header(&r, "WWW-Authenticate"), "Bearer", 6), 0);
    } else if (cases[i].msg) {
      check_error(&r, cases[i].status, "not_found", "", cases[i].msg);
    } else {
      assert_int_equal(r.status, cases[i].status);
    }
    resp_free(&r);
  }
  coord_fini(&T);
}

/* Every answer above was counted by status class. */
static void test_counted(void **state) {
  resp r;
  req("GET", "/metrics", NULL, &r);
  assert_int_equal(r.status, 200);
  unsigned long long n4 = 0, n2 = 0;
  const char *p = strstr(r.body, "pipewright_http_requests_total{code=\"4xx\"} ");
  assert_non_null(p);
  sscanf(p + strlen("pipewright_http_requests_total{code=\"4xx\"} "), "%llu", &n4);
  p = strstr(r.body, "pipewright_http_requests_total{code=\"2xx\"} ");
  sscanf(p + strlen("pipewright_http_requests_total{code=\"2xx\"} "), "%llu", &n2);
  assert_true(n4 >= 40);
  assert_true(n2 >= 40);
  resp_free(&r);
}

/* ---- the pool's lanes ---------------------------------------------------------- */

static pthread_mutex_t lane_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lane_cv = PTHREAD_COND_INITIALIZER;
static int plans_held, plans_released;

/* Holds every plan until released; lets anything else through. */
static void plans_hook(const char *path) {
  if (strncmp(path, "/v1/plans", 9)) return;
  pthread_mutex_lock(&lane_mu);
  plans_held++;
  pthread_cond_broadcast(&lane_cv);
  while (!plans_released) pthread_cond_wait(&lane_cv, &lane_mu);
  pthread_mutex_unlock(&lane_mu);
}

static long long metric_value(const char *name) {
  resp r;
  req("GET", "/metrics", NULL, &r);
  assert_int_equal(r.status, 200);
  char key[160];
  snprintf(key, sizeof key, "\n%s ", name);
  const char *p = strstr(r.body, key);
  assert_non_null(p);
  long long v = atoll(p + strlen(key));
  resp_free(&r);
  return v;
}

/* Workers' checkpoint uploads have a lane of their own: with every thread
 * and queue place of the users' lane taken by plans (held here), a plan
 * gets 429 and a shard is still stored (it used to get 429 too, and after
 * the worker's three tries the model of that step was lost). */
static void test_uploads_own_lane(void **state) {
  (void)state;
  pw_err err = {0};
  resp r;
  req("POST", "/v1/jobs", SPEC, &r);
  assert_int_equal(r.status, 201);
  json_t *j = body_json(&r);
  int64_t id = json_integer_value(json_object_get(j, "id")), run = 0;
  json_decref(j);
  resp_free(&r);
  assert_int_equal(pw_store_job_set_state(S, id, PW_JOB_PLANNING, "t", NULL, &err), 0);
  assert_int_equal(pw_store_job_set_state(S, id, PW_JOB_DISPATCHING, "t", NULL, &err), 0);
  assert_int_equal(pw_store_run_insert(S, id, NULL, &run, &err), 0);
  for (int k = 0; k < 2; k++) assert_int_equal(pw_store_stage_insert(S, run, k, k, "[]", 100, 1e6, &err), 0);
  assert_int_equal(pw_store_job_set_state(S, id, PW_JOB_RUNNING, "t", NULL, &err), 0);
  float a[6] = {1, 2, 3, 4, 5, 6};
  pw_st_tensor t0[1] = {{"embed.tok.weight", PW_ST_F32, 2, {2, 3}, a}};
  char f0[128];
  snprintf(f0, sizeof f0, "%s/lane.safetensors", tmpdir);
  assert_int_equal(pw_st_write(f0, t0, 1, NULL, 0, &err), 0);

  plans_held = plans_released = 0;
  pw_http_set_pool_hook(plans_hook);
  int n = C.http_adm.workers + C.http_adm.queue, fds[64];
  assert_true(n <= 64);
  for (int i = 0; i < n; i++) {
    fds[i] = ht_dial(C.http_port, 0);
    ht_send(fds[i], "POST", "/v1/plans", NULL, SPEC);
  }
  for (int tries = 0; tries < 6000; tries++) { /* until the lane is full (a guard, not a timing) */
    pthread_mutex_lock(&lane_mu);
    int held = plans_held;
    pthread_mutex_unlock(&lane_mu);
    if (held == C.http_adm.workers && metric_value("pipewright_http_pool{state=\"queued\"}") == C.http_adm.queue)
      break;
    usleep(10000);
  }
  assert_int_equal(metric_value("pipewright_http_pool{state=\"queued\"}"), C.http_adm.queue);
  req("POST", "/v1/plans", SPEC, &r);
  check_error(&r, 429, "busy", "", "try again");
  resp_free(&r);

  put_shard(id, run, 2, 0, 0, f0, NULL, &r);
  if (r.status != 201) fprintf(stderr, "upload: %d %s\n", r.status, r.body);
  assert_int_equal(r.status, 201);
  resp_free(&r);
  assert_int_equal(metric_value("pipewright_http_upload_busy_total"), 0);

  pthread_mutex_lock(&lane_mu);
  plans_released = 1;
  pthread_cond_broadcast(&lane_cv);
  pthread_mutex_unlock(&lane_mu);
  pw_http_set_pool_hook(NULL);
  for (int i = 0; i < n; i++) {
    ht_read(fds[i], &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
  }
  assert_int_equal(pw_store_job_set_state(S, id, PW_JOB_CANCELLED, "t", NULL, &err), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_health_metrics_workers_schedules),
      cmocka_unit_test(test_plans_equal_cli),
      cmocka_unit_test(test_submit_list_get),
      cmocka_unit_test(test_run_views),
      cmocka_unit_test(test_uploads_own_lane),
      cmocka_unit_test(test_static_files),
      cmocka_unit_test(test_hostile_table),
      cmocka_unit_test(test_huge_bodies),
      cmocka_unit_test(test_token),
      cmocka_unit_test(test_counted),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
