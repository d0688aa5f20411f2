/* test_coord_admission: what the coordinator's REST API admits — the
 * resource budget of a spec (common/plan/budget.h) at POST /v1/jobs and
 * POST /v1/plans, the bounded pool for expensive handlers, and the
 * connection bounds — over real HTTP on 127.0.0.1, as test_coord_http.c
 * does (no control loop runs).
 *
 * No timing: the pool is filled deterministically through a hook that holds
 * each expensive handler until the test releases it, and every wait is for
 * a state (a count in /metrics, a closed socket), never for a duration. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "httptest.h"

#include "api.h"
#include "coord.h"
#include "spec_json.h"

#ifndef PW_SOURCE_DIR
#define PW_SOURCE_DIR "."
#endif

static pw_coord C;
static char tmpdir[64];

/* pp 2, microbatches 2, batch 4: MB, a few KiB of memory per rank. */
static const char *SPEC =
    "{\"name\": \"tiny\", \"model\": {\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 8, \"d_model\": 16,"
    " \"n_layers\": 2, \"n_heads\": 2}, \"mesh\": {\"pp\": 2}, \"schedule\": {\"name\": \"1f1b\", \"microbatches\": 2},"
    " \"train\": {\"steps\": 10, \"batch_size\": 4}, \"data\": {\"kind\": \"text\", \"path\": \"examples/data/corpus.txt\"}}";

enum { WORKERS = 2, QUEUE = 2, MAX_RANK_MEMORY = 32 << 20 };

/* ---- the HTTP client (httptest.h), from a chosen loopback address ----------- */

static int dial_from(int port, int src) { return ht_dial(port, src); }

static void req_from(int port, int src, const char *method, const char *target, const char *body, resp *out) {
  ht_req(port, src, method, target, NULL, body, out);
}

static void req(const char *method, const char *target, const char *body, resp *out) {
  req_from(C.http_port, 1, method, target, body, out);
}

/* A /metrics sample's value (the line starting with `name `), from 127.0.0.<src>. */
static long long metric_of(pw_coord *c, int src, const char *name) {
  resp r;
  req_from(c->http_port, src, "GET", "/metrics", NULL, &r);
  assert_int_equal(r.status, 200);
  char key[160];
  snprintf(key, sizeof key, "\n%s ", name);
  const char *p = strstr(r.body, key);
  if (!p) fprintf(stderr, "no %s in /metrics\n", name);
  assert_non_null(p);
  long long v = atoll(p + strlen(key));
  resp_free(&r);
  return v;
}

static long long metric(const char *name) { return metric_of(&C, 1, name); }

static int64_t jobs_total(void) {
  resp r;
  req("GET", "/v1/jobs", NULL, &r);
  assert_int_equal(r.status, 200);
  json_error_t je;
  json_t *j = json_loadb(r.body, r.len, 0, &je);
  int64_t n = json_integer_value(json_object_get(j, "total"));
  json_decref(j);
  resp_free(&r);
  return n;
}

/* text with `from` replaced by `to` (malloc'd). */
static char *replaced(const char *text, const char *from, const char *to) {
  const char *k = strstr(text, from);
  assert_non_null(k);
  size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
  char *out = malloc(n);
  snprintf(out, n, "%.*s%s%s", (int)(k - text), text, to, k + strlen(from));
  return out;
}

/* ---- the hook that holds expensive handlers -------------------------------- */

static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hook_cv = PTHREAD_COND_INITIALIZER;
static int hook_entered, hook_released;

static void holding_hook(const char *path) {
  (void)path;
  pthread_mutex_lock(&hook_mu);
  hook_entered++;
  pthread_cond_broadcast(&hook_cv);
  while (!hook_released) pthread_cond_wait(&hook_cv, &hook_mu);
  pthread_mutex_unlock(&hook_mu);
}

static void hold(void) {
  pthread_mutex_lock(&hook_mu);
  hook_entered = 0;
  hook_released = 0;
  pthread_mutex_unlock(&hook_mu);
  pw_http_set_pool_hook(holding_hook);
}

/* Until n handlers are held (a guard of a minute against a server that
 * never runs them, not a timing assertion). */
static void wait_entered(int n) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 60;
  pthread_mutex_lock(&hook_mu);
  while (hook_entered < n && pthread_cond_timedwait(&hook_cv, &hook_mu, &dl) == 0) {
  }
  int got = hook_entered;
  pthread_mutex_unlock(&hook_mu);
  assert_int_equal(got, n);
}

static void release(void) {
  pthread_mutex_lock(&hook_mu);
  hook_released = 1;
  pthread_cond_broadcast(&hook_cv);
  pthread_mutex_unlock(&hook_mu);
  pw_http_set_pool_hook(NULL);
}

/* Until /metrics shows `name` in [lo, hi] (a state the server reaches on
 * its own threads); each look is itself a cheap request answered meanwhile. */
static void wait_range(pw_coord *c, int src, const char *name, long long lo, long long hi) {
  long long v = metric_of(c, src, name);
  for (int i = 0; i < 5000 && (v < lo || v > hi); i++) {
    usleep(1000);
    v = metric_of(c, src, name);
  }
  if (v < lo || v > hi) fprintf(stderr, "%s = %lld, not in [%lld, %lld]\n", name, v, lo, hi);
  assert_true(v >= lo && v <= hi);
}

static void wait_metric(pw_coord *c, int src, const char *name, long long v) { wait_range(c, src, name, v, v); }

/* Open connections, as /metrics counts them: the look itself and the
 * previous look (closed, but its thread may not have given its place back
 * yet) besides the n the test holds. */
static void wait_open(pw_coord *c, int src, long long n) {
  wait_range(c, src, "pipewright_http_connections", n + 1, n + 2);
}

/* ---- setup ------------------------------------------------------------------ */

static void coord_start(pw_coord *c) {
  pw_err err = {0};
  int rc = pw_http_start(c, &err);
  if (rc) fprintf(stderr, "pw_http_start: %s\n", err.msg);
  assert_int_equal(rc, 0);
}

static void coord_init(pw_coord *c) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  snprintf(c->http_host, sizeof c->http_host, "127.0.0.1");
  snprintf(c->db_path, sizeof c->db_path, "%s/coord.db", tmpdir);
  snprintf(c->state_dir, sizeof c->state_dir, "%s", tmpdir);
  /* data.path in the specs is read under the source tree, as --data-root would allow */
  if (!realpath(PW_SOURCE_DIR, c->data_root)) fail_msg("realpath %s", PW_SOURCE_DIR);
  c->max_body = 64 * 1024;
  c->http_workers = WORKERS;
  c->http_queue = QUEUE;
  c->max_rank_memory = MAX_RANK_MEMORY;
}

static void coord_fini(pw_coord *c) {
  pw_http_stop(c);
  for (int i = 0; i < c->n_stores; i++) pw_store_close(c->stores[i]);
  free(c->stores);
  free(c->workers);
  pthread_mutex_destroy(&c->mu);
}

static int setup(void **state) {
  (void)state;
  if (chdir(PW_SOURCE_DIR)) return -1;
  /* room for the test's 1100 connections and the server's */
  struct rlimit rl;
  if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl)) return -1;
  }
  snprintf(tmpdir, sizeof tmpdir, "/tmp/pw-adm-XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  coord_init(&C);
  coord_start(&C);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  coord_fini(&C);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  return system(cmd);
}

/* ---- budgets ---------------------------------------------------------------- */

/* Specs that pass every field check but would wedge the cluster get 422
 * naming the field and the limit, and nothing is stored. */
static void test_budget_refusals(void **state) {
  (void)state;
  int64_t before = jobs_total();
  resp r;
  /* 2^19 microbatches (batch 2^23): refused before planning */
  char *a = replaced(SPEC, "\"microbatches\": 2", "\"microbatches\": 524288");
  char *huge = replaced(a, "\"batch_size\": 4", "\"batch_size\": 8388608");
  free(a);
  req("POST", "/v1/jobs", huge, &r);
  check_error(&r, 422, "over_budget", "schedule.microbatches", "the limit is 32768");
  resp_free(&r);
  req("POST", "/v1/plans?compare=1", huge, &r);
  check_error(&r, 422, "over_budget", "schedule.microbatches", "largest schedule compared");
  resp_free(&r);
  req("POST", "/v1/plans", huge, &r);
  check_error(&r, 422, "over_budget", "schedule.microbatches", "2097152 actions");
  resp_free(&r);
  free(huge);

  /* d_model 1e6: its derived ffn_hidden is out of range, as dispatch
   * would find when it parses the stored spec */
  char *wide = replaced(SPEC, "\"d_model\": 16", "\"d_model\": 1000000");
  req("POST", "/v1/jobs", wide, &r);
  check_error(&r, 422, "invalid_spec", "model.ffn_hidden", "derived");
  resp_free(&r);
  free(wide);

  /* a rank needing more than --max-rank-memory (32 MiB): d_model 512 */
  char *big = replaced(SPEC, "\"d_model\": 16", "\"d_model\": 512");
  req("POST", "/v1/jobs", big, &r);
  check_error(&r, 422, "over_budget", "model", "--max-rank-memory");
  resp_free(&r);
  req("POST", "/v1/plans", big, &r);
  check_error(&r, 422, "over_budget", "model", "the limit is 32.0 MiB");
  resp_free(&r);
  free(big);
  assert_int_equal(jobs_total(), before);

  /* a connected worker smaller than the job's ranks bounds submissions,
   * not dry-run plans (they may plan for other workers) */
  pthread_mutex_lock(&C.mu);
  C.workers = calloc(1, sizeof *C.workers);
  C.n_workers = C.cap_workers = 1;
  snprintf(C.workers[0].name, sizeof C.workers[0].name, "w-small");
  C.workers[0].connected = 1;
  C.workers[0].memory = 4096;
  pthread_mutex_unlock(&C.mu);
  req("POST", "/v1/jobs", SPEC, &r);
  check_error(&r, 422, "over_budget", NULL, "worker w-small");
  resp_free(&r);
  req("POST", "/v1/plans", SPEC, &r);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  pthread_mutex_lock(&C.mu);
  C.workers[0].connected = 0; /* a lost worker bounds nothing */
  pthread_mutex_unlock(&C.mu);
  req("POST", "/v1/jobs", SPEC, &r);
  assert_int_equal(r.status, 201);
  resp_free(&r);
  assert_int_equal(jobs_total(), before + 1);
}

/* ---- the pool ---------------------------------------------------------------- */

/* With WORKERS expensive requests held and QUEUE more waiting, cheap
 * routes still answer; the next expensive request of any kind gets 429
 * with Retry-After; once released, every admitted request gets its plan. */
static void test_pool_full_cheap_flow(void **state) {
  (void)state;
  resp r;
  req("POST", "/v1/jobs", SPEC, &r); /* a job to look at meanwhile */
  assert_int_equal(r.status, 201);
  char loc[512];
  snprintf(loc, sizeof loc, "%s", header(&r, "Location"));
  resp_free(&r);
  long long busy0 = metric("pipewright_http_busy_total");

  hold();
  int fds[WORKERS + QUEUE];
  for (int i = 0; i < WORKERS; i++) {
    fds[i] = dial_from(C.http_port, 1);
    ht_send(fds[i], "POST", "/v1/plans?compare=1", NULL, SPEC);
  }
  wait_entered(WORKERS);
  for (int i = WORKERS; i < WORKERS + QUEUE; i++) {
    fds[i] = dial_from(C.http_port, 1);
    ht_send(fds[i], "POST", "/v1/plans", NULL, SPEC);
  }
  wait_metric(&C, 1, "pipewright_http_pool{state=\"queued\"}", QUEUE);
  assert_int_equal(metric("pipewright_http_pool{state=\"running\"}"), WORKERS);

  const char *cheap[] = {"/healthz", "/metrics", "/v1/workers", loc, "/v1/jobs"};
  for (size_t i = 0; i < sizeof cheap / sizeof cheap[0]; i++) {
    req("GET", cheap[i], NULL, &r);
    if (r.status != 200) fprintf(stderr, "GET %s: %d\n", cheap[i], r.status);
    assert_int_equal(r.status, 200);
    resp_free(&r);
  }
  char timeline[600];
  snprintf(timeline, sizeof timeline, "%s/timeline", loc);
  struct {
    const char *method, *target, *body;
  } over[] = {{"POST", "/v1/plans?compare=1", SPEC}, {"POST", "/v1/jobs", SPEC}, {"GET", timeline, NULL}};
  for (size_t i = 0; i < sizeof over / sizeof over[0]; i++) {
    req(over[i].method, over[i].target, over[i].body, &r);
    check_error(&r, 429, "busy", "", "try again");
    assert_string_equal(header(&r, "Retry-After"), "1");
    resp_free(&r);
  }
  assert_int_equal(metric("pipewright_http_busy_total"), busy0 + 3);
  /* still held: nothing admitted beyond the bound ran */
  pthread_mutex_lock(&hook_mu);
  assert_int_equal(hook_entered, WORKERS);
  pthread_mutex_unlock(&hook_mu);

  release();
  for (int i = 0; i < WORKERS + QUEUE; i++) {
    ht_read(fds[i], &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, i < WORKERS ? "\"rows\"" : "\"analytics\""));
    resp_free(&r);
  }
  assert_int_equal(metric("pipewright_http_pool{state=\"running\"}"), 0);
  assert_int_equal(metric("pipewright_http_pool{state=\"queued\"}"), 0);
  req("POST", "/v1/plans", SPEC, &r); /* admitted again */
  assert_int_equal(r.status, 200);
  resp_free(&r);
}

static void *stop_thread(void *arg) {
  pw_http_stop(arg);
  return NULL;
}

/* Stopping the server with a request queued answers it 503 (nothing is
 * left suspended) and waits for the running one. */
static void test_stop_with_queue(void **state) {
  (void)state;
  pw_coord T;
  coord_init(&T);
  T.http_workers = 1;
  T.http_queue = 1;
  coord_start(&T);
  hold();
  int running = dial_from(T.http_port, 1);
  ht_send(running, "POST", "/v1/plans", NULL, SPEC);
  wait_entered(1);
  int queued = dial_from(T.http_port, 1);
  ht_send(queued, "POST", "/v1/plans", NULL, SPEC);
  wait_metric(&T, 1, "pipewright_http_pool{state=\"queued\"}", 1);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, stop_thread, &T), 0);
  resp r;
  ht_read(queued, &r); /* answered while the stop waits for the held worker */
  check_error(&r, 503, "unavailable", "", "stopping");
  resp_free(&r);
  release();
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_null(T.http);
  ht_read(running, &r); /* answered or closed by the stop: either way not left hanging */
  assert_true(r.status == 200 || r.status == 0);
  resp_free(&r);
  coord_fini(&T);
}

/* ---- connections -------------------------------------------------------------- */

enum { IDLE = 1100 };

/* 1100 idle connections from one address take its share (the per-address
 * bound, 256 by default), not the server: another address is answered at
 * once, every refusal is counted, and once they close that address is
 * answered again. */
static void test_idle_connections_no_lockout(void **state) {
  (void)state;
  int per_ip = (int)metric("pipewright_http_connection_limit{scope=\"per_address\"}");
  assert_int_equal(per_ip, 256);
  assert_true(metric("pipewright_http_connection_limit{scope=\"total\"}") > IDLE);
  long long refused0 = metric("pipewright_http_connections_refused_total{limit=\"per_address\"}");
  wait_open(&C, 2, 0);
  int *fds = malloc(sizeof *fds * IDLE);
  for (int i = 0; i < IDLE; i++) fds[i] = dial_from(C.http_port, 1);
  /* every one of them either holds a place or was refused */
  wait_metric(&C, 2, "pipewright_http_connections_refused_total{limit=\"per_address\"}",
              refused0 + IDLE - per_ip);
  wait_open(&C, 2, per_ip);
  resp r;
  req_from(C.http_port, 2, "GET", "/healthz", NULL, &r);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  req_from(C.http_port, 1, "GET", "/healthz", NULL, &r); /* its own address is full */
  assert_int_equal(r.status, 0);
  resp_free(&r);
  for (int i = 0; i < IDLE; i++) close(fds[i]);
  free(fds);
  wait_open(&C, 2, 0);
  req("GET", "/healthz", NULL, &r);
  assert_int_equal(r.status, 200);
  resp_free(&r);
}

/* Idle connections are closed by the server after the idle timeout, so
 * even the address that held them all is answered again without closing
 * them itself. */
static void test_idle_timeout_frees_places(void **state) {
  (void)state;
  pw_coord T;
  coord_init(&T);
  T.http_idle_timeout = 1;
  T.http_max_conns_per_ip = 4;
  coord_start(&T);
  int fds[4];
  for (int i = 0; i < 4; i++) fds[i] = dial_from(T.http_port, 1);
  wait_open(&T, 2, 4); /* all 4 accepted before the 5th comes */
  resp r;
  req_from(T.http_port, 1, "GET", "/healthz", NULL, &r);
  assert_int_equal(r.status, 0); /* refused: the address holds its 4 */
  resp_free(&r);
  char b;
  for (int i = 0; i < 4; i++) {
    assert_true(recv(fds[i], &b, 1, 0) <= 0); /* blocks until the server closes it */
    close(fds[i]);
  }
  wait_open(&T, 2, 0);
  req_from(T.http_port, 1, "GET", "/healthz", NULL, &r);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  assert_true(metric_of(&T, 2, "pipewright_http_connections_refused_total{limit=\"per_address\"}") >= 1);
  coord_fini(&T);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_budget_refusals),
      cmocka_unit_test(test_pool_full_cheap_flow),
      cmocka_unit_test(test_stop_with_queue),
      cmocka_unit_test(test_idle_connections_no_lockout),
      cmocka_unit_test(test_idle_timeout_frees_places),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
