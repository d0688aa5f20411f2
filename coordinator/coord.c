/* coord: the shared model of coord.h — per-thread store connections, the
 * worker registry snapshot, counters, and the Prometheus exposition. */
#include "coord.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "log.h"
#include "sha256.h"
#include "spec.h" /* pw_nonfinite */

static _Thread_local pw_store *tls_store;
static _Thread_local pw_coord *tls_owner;

pw_store *pw_coord_store(pw_coord *c) {
  if (tls_store && tls_owner == c) return tls_store;
  pw_store *s = NULL;
  pw_err err = {0};
  if (pw_store_open(c->db_path, &s, &err)) {
    char b[512];
    pw_error("cannot open the store %s: %s", c->db_path, pw_err_str(&err, b, sizeof b));
    return NULL;
  }
  pthread_mutex_lock(&c->mu);
  pw_store **ns = realloc(c->stores, sizeof *ns * (size_t)(c->n_stores + 1));
  if (ns) {
    c->stores = ns;
    c->stores[c->n_stores++] = s;
  }
  pthread_mutex_unlock(&c->mu);
  if (!ns) {
    pw_store_close(s);
    return NULL;
  }
  tls_store = s;
  tls_owner = c;
  return s;
}

void pw_coord_wake(pw_coord *c) {
  if (c->loop) uv_async_send(&c->wake);
}

void pw_coord_upload_token(const pw_coord *c, int64_t job, int64_t run, int rank, char out[65]) {
  char msg[96];
  int n = snprintf(msg, sizeof msg, "pipewright upload %lld %lld %d", (long long)job, (long long)run, rank);
  uint8_t mac[PW_SHA256_LEN];
  pw_hmac_sha256(c->upload_key, sizeof c->upload_key, msg, (size_t)n, mac);
  pw_sha256_to_hex(mac, out);
}

static const char *worker_state(const pw_worker_info *w) {
  return !w->connected ? "lost" : w->job ? "busy" : "idle";
}

/* null for "" and for a worker's string cut inside a UTF-8 sequence. */
static json_t *str_or_null(const char *s) {
  json_t *v = s[0] ? json_string(s) : NULL;
  return v ? v : json_null();
}

/* What an operator should fix on a worker, one sentence each (the CLI and
 * the dashboard print them as they are). */
static json_t *worker_warnings(const pw_worker_info *w) {
  json_t *a = json_array();
  char b[256];
  /* a slow OpenBLAS kernel matters only where the products run on it */
  if (strcmp(w->gemm_path, "onednn") && pw_cpu_blas_warning(w->blas_core, w->blas_forced == 1, w->cpu_level, b, sizeof b))
    json_array_append_new(a, json_string(b));
  return a;
}

json_t *pw_coord_coordinate_json(int rank, int pp, int tp) {
  pp = pp > 0 ? pp : 1, tp = tp > 0 ? tp : 1;
  return json_pack("{s:i, s:i, s:i}", "pipeline_rank", rank / tp % pp, "replica", rank / tp / pp, "tp_rank", rank % tp);
}

json_t *pw_coord_workers_json(pw_coord *c) {
  json_t *arr = json_array();
  double now = pw_store_now();
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < c->n_workers; i++) {
    const pw_worker_info *w = &c->workers[i];
    json_t *o = json_pack("{s:I, s:s, s:s, s:s, s:f, s:i, s:i, s:s}", "id", (json_int_t)w->id, "name", w->name, "addr",
                          w->addr, "state", worker_state(w), "heartbeat_age", now - w->last_heartbeat, "cores",
                          w->cores, "threads", w->threads, "software", w->software);
    json_object_set_new(o, "job", w->job ? json_integer((json_int_t)w->job) : json_null());
    json_object_set_new(o, "rank", w->job ? json_integer(w->rank) : json_null());
    json_object_set_new(o, "coordinate", w->job ? pw_coord_coordinate_json(w->rank, w->pp, w->tp) : json_null());
    json_object_set_new(o, "memory", w->memory > 0 ? json_integer((json_int_t)w->memory) : json_null());
    json_object_set_new(o, "blas_core", str_or_null(w->blas_core));
    json_object_set_new(o, "blas_forced", w->blas_forced >= 0 ? json_boolean(w->blas_forced) : json_null());
    json_object_set_new(o, "cpu_level", str_or_null(w->cpu_level));
    json_object_set_new(o, "gemm_gflops", w->gemm_gflops > 0 ? json_real(w->gemm_gflops) : json_null());
    json_object_set_new(o, "gemm_path", str_or_null(w->gemm_path));
    json_object_set_new(o, "host", str_or_null(w->host));
    json_object_set_new(o, "hostname", str_or_null(w->hostname));
    json_object_set_new(o, "cores_from", str_or_null(w->cores_from));
    json_object_set_new(o, "memory_from", str_or_null(w->memory_from));
    json_object_set_new(o, "warnings", worker_warnings(w));
    json_array_append_new(arr, o);
  }
  pthread_mutex_unlock(&c->mu);
  return json_pack("{s:o}", "workers", arr);
}

int pw_coord_store_health(pw_coord *c, char *error, size_t cap, int *pending) {
  pthread_mutex_lock(&c->mu);
  int bad = c->store_error[0] || c->store_pending;
  snprintf(error, cap, "%s", c->store_error);
  *pending = c->store_pending;
  pthread_mutex_unlock(&c->mu);
  return bad;
}

int pw_coord_workers_expire(pw_coord *c, double now) {
  if (c->worker_expiry <= 0) return 0;
  int gone = 0;
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < c->n_workers;) {
    pw_worker_info *w = &c->workers[i];
    if (!w->connected && now - w->last_heartbeat > c->worker_expiry) {
      pw_info("worker %s lost for %.0f s: removed from the registry", w->name, now - w->last_heartbeat);
      c->workers[i] = c->workers[--c->n_workers];
      gone++;
    } else {
      i++;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return gone;
}

void pw_coord_worker_counts(pw_coord *c, int *idle, int *busy, int *lost) {
  int i0 = 0, b0 = 0, l0 = 0;
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < c->n_workers; i++) {
    const pw_worker_info *w = &c->workers[i];
    if (!w->connected) l0++;
    else if (w->job) b0++;
    else i0++;
  }
  pthread_mutex_unlock(&c->mu);
  if (idle) *idle = i0;
  if (busy) *busy = b0;
  if (lost) *lost = l0;
}

void pw_coord_count_http(pw_coord *c, int status) {
  int k = status / 100;
  if (k < 1 || k > 5) return;
  pthread_mutex_lock(&c->mu);
  c->http_requests[k]++;
  pthread_mutex_unlock(&c->mu);
}

void pw_coord_count_step(pw_coord *c, double seconds) {
  pthread_mutex_lock(&c->mu);
  int b = 0;
  double le = 0.001;
  while (b < PW_HIST_BUCKETS && seconds > le) {
    le *= 2;
    b++;
  }
  c->step_hist[b]++;
  c->step_time_sum += seconds;
  c->step_count++;
  pthread_mutex_unlock(&c->mu);
}

void pw_coord_count_nonfinite(pw_coord *c, int on_nonfinite) {
  pthread_mutex_lock(&c->mu);
  c->steps_nonfinite[on_nonfinite == PW_NONFINITE_SKIP]++;
  pthread_mutex_unlock(&c->mu);
}

/* A growing string for the exposition. */
typedef struct {
  char *s;
  size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t nc = b->cap ? b->cap * 2 : 4096;
    while (nc < b->n + (size_t)k + 1) nc *= 2;
    char *ns = realloc(b->s, nc);
    if (!ns) return;
    b->s = ns;
    b->cap = nc;
  }
}

/* A label value in the text format: backslash, double quote and newline
 * escaped (a job's name is the user's). */
static void sb_label(sbuf *b, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"') sb_printf(b, "\\%c", *v);
    else if (*v == '\n') sb_printf(b, "\\n");
    else sb_printf(b, "%c", *v);
  }
}

/* A job's gauges: the newest running jobs only, so the label sets stay few
 * (a running job holds at least one worker; the cap guards the rest).
 * The job's id is the label job_id, never job: Prometheus sets job (and
 * instance) on every series it scrapes, and renames a scraped one to
 * exported_job, which no rule or dashboard would expect. */
#define PW_PROM_JOBS 64

/* Per running job that has step series (job_series' n jobs), the step its
 * latest run's plan predicts, beside pipewright_job_step_seconds: the
 * alert "slower than its plan" divides one by the other (deploy/prometheus/).
 * cost_model says what the prediction is worth: "layer_times" (the spec's
 * measured per-layer seconds) forecasts this cluster's step, "flops" (the
 * FLOP model's assumed rate, PW_PLAN_FLOPS_PER_S) only ranks schedules. */
static void planned_steps(sbuf *b, pw_store *s, const json_int_t *ids, const char *const *names, int n) {
  sb_printf(b, "# HELP pipewright_job_planned_step_seconds Step time the running job's plan predicts "
               "(its simulated makespan, with the data-parallel exchange), under cost_model.\n"
               "# TYPE pipewright_job_planned_step_seconds gauge\n");
  for (int r = 0; r < n; r++) {
    double sec;
    int measured;
    pw_err err = {0};
    char eb[600];
    if (pw_store_run_planned_step(s, ids[r], &sec, &measured, &err)) {
      pw_warn("metrics: job %lld's planned step: %s", (long long)ids[r], pw_err_str(&err, eb, sizeof eb));
      continue;
    }
    sb_printf(b, "pipewright_job_planned_step_seconds{job_id=\"%lld\",name=\"", (long long)ids[r]);
    sb_label(b, names[r] ? names[r] : "");
    sb_printf(b, "\",cost_model=\"%s\"} %.17g\n", measured ? "layer_times" : "flops", sec);
  }
}

/* Per running job, its last recorded step's series as the dashboard charts
 * them: the row of step progress.step - 1, the latest run's. A value that
 * was not finite (stored as null) is NaN. The eval loss is the job's
 * latest (train.eval_every), only for a job that has one. */
static void job_series(sbuf *b, pw_store *s) {
  static const struct {
    const char *name, *key, *help;
  } g[] = {
    {"pipewright_job_loss", "loss", "Training loss at the running job's last recorded step."},
    {"pipewright_job_lr", "lr", "Learning rate at the running job's last recorded step."},
    {"pipewright_job_grad_norm", "grad_norm", "Gradient norm at the running job's last recorded step."},
    {"pipewright_job_tokens_per_second", "tokens_per_s", "Tokens per second of the running job's last recorded step."},
    {"pipewright_job_step_seconds", "step_time", "Wall time of the running job's last recorded step."},
    {"pipewright_job_eval_loss", "eval_loss", "Held-out loss of the running job's latest evaluated step."},
  };
  json_t *list = NULL, *last[PW_PROM_JOBS] = {0}, *jobs[PW_PROM_JOBS];
  const char *names[PW_PROM_JOBS];
  json_int_t ids[PW_PROM_JOBS];
  int n = 0;
  pw_err err = {0};
  char eb[600];
  if (s && pw_store_jobs_json(s, PW_JOB_RUNNING, PW_PROM_JOBS, 0, &list, &err))
    pw_warn("metrics: cannot list the running jobs: %s", pw_err_str(&err, eb, sizeof eb));
  size_t i;
  json_t *j;
  json_array_foreach(json_object_get(list, "jobs"), i, j) {
    if (n == PW_PROM_JOBS) break;
    json_int_t id = json_integer_value(json_object_get(j, "id"));
    json_int_t step = json_integer_value(json_object_get(json_object_get(j, "progress"), "step")) - 1;
    json_t *rows = NULL;
    if (step < 0) continue; /* no step recorded yet */
    if (pw_store_metrics_json(s, id, (int)step, &rows, &err)) {
      pw_warn("metrics: cannot read job %lld's metrics: %s", (long long)id, pw_err_str(&err, eb, sizeof eb));
      continue;
    }
    json_t *row = json_array_get(json_object_get(rows, "metrics"), 0);
    if (row && json_integer_value(json_object_get(row, "step")) == step) {
      ids[n] = id;
      names[n] = json_string_value(json_object_get(j, "name"));
      jobs[n] = j;
      last[n++] = json_incref(row);
    }
    json_decref(rows);
  }
  for (size_t k = 0; k < sizeof g / sizeof g[0]; k++) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", g[k].name, g[k].help, g[k].name);
    for (int r = 0; r < n; r++) {
      int of_job = !strcmp(g[k].key, "eval_loss");
      json_t *v = json_object_get(of_job ? jobs[r] : last[r], g[k].key);
      if (of_job && !json_is_number(v)) continue; /* a job that has not evaluated (yet) */
      sb_printf(b, "%s{job_id=\"%lld\",name=\"", g[k].name, (long long)ids[r]);
      sb_label(b, names[r] ? names[r] : "");
      if (json_is_number(v)) sb_printf(b, "\"} %.17g\n", json_number_value(v));
      else sb_printf(b, "\"} NaN\n");
    }
  }
  planned_steps(b, s, ids, names, n);
  for (int r = 0; r < n; r++) json_decref(last[r]);
  json_decref(list);
}

char *pw_coord_metrics_text(pw_coord *c) {
  sbuf b = {0};
  int64_t counts[PW_JOB__N] = {0}, steps = 0;
  double tokens = 0;
  pw_store *s = pw_coord_store(c);
  pw_err err = {0};
  char eb[600];
  if (!s) pw_warn("metrics: the store is not available");
  else if (pw_store_totals(s, counts, &steps, &tokens, &err))
    pw_warn("metrics: cannot read the store's totals: %s", pw_err_str(&err, eb, sizeof eb));
  sb_printf(&b, "# HELP pipewright_jobs Jobs by state.\n# TYPE pipewright_jobs gauge\n");
  for (int st = 0; st < PW_JOB__N; st++)
    sb_printf(&b, "pipewright_jobs{state=\"%s\"} %lld\n", pw_job_state_name(st), (long long)counts[st]);
  int idle, busy, lost;
  pw_coord_worker_counts(c, &idle, &busy, &lost);
  sb_printf(&b, "# HELP pipewright_workers Workers by state.\n# TYPE pipewright_workers gauge\n");
  sb_printf(&b, "pipewright_workers{state=\"idle\"} %d\npipewright_workers{state=\"busy\"} %d\n"
                "pipewright_workers{state=\"lost\"} %d\n", idle, busy, lost);
  sb_printf(&b, "# HELP pipewright_steps_total Training steps recorded.\n# TYPE pipewright_steps_total counter\n"
                "pipewright_steps_total %lld\n", (long long)steps);
  sb_printf(&b, "# HELP pipewright_tokens_total Tokens trained on.\n# TYPE pipewright_tokens_total counter\n"
                "pipewright_tokens_total %.0f\n", tokens);
  job_series(&b, s);
  pthread_mutex_lock(&c->mu);
  uint64_t hist[PW_HIST_BUCKETS + 1], req[6], count = c->step_count;
  double sum = c->step_time_sum;
  memcpy(hist, c->step_hist, sizeof hist);
  memcpy(req, c->http_requests, sizeof req);
  uint64_t st_failed = c->store_failures, st_dropped = c->store_dropped;
  int st_pending = c->store_pending;
  uint64_t nf_fail = c->steps_nonfinite[PW_NONFINITE_FAIL], nf_skip = c->steps_nonfinite[PW_NONFINITE_SKIP];
  pthread_mutex_unlock(&c->mu);
  /* Both label values always, from 0: rate() and increase() then see a
   * series' first non-finite step (a series born at 1 shows no increase). */
  sb_printf(&b, "# HELP pipewright_steps_nonfinite_total Steps whose loss or gradient norm was not finite, by the "
                "job's train.on_nonfinite (fail: the job failed, diverged; skip: the step updated nothing).\n"
                "# TYPE pipewright_steps_nonfinite_total counter\n"
                "pipewright_steps_nonfinite_total{on_nonfinite=\"fail\"} %llu\n"
                "pipewright_steps_nonfinite_total{on_nonfinite=\"skip\"} %llu\n",
            (unsigned long long)nf_fail, (unsigned long long)nf_skip);
  sb_printf(&b, "# HELP pipewright_store_write_failures_total Store writes that failed (kept for a retry or lost).\n"
                "# TYPE pipewright_store_write_failures_total counter\npipewright_store_write_failures_total %llu\n",
            (unsigned long long)st_failed);
  sb_printf(&b, "# HELP pipewright_store_writes_lost_total Store writes given up (too many pending).\n"
                "# TYPE pipewright_store_writes_lost_total counter\npipewright_store_writes_lost_total %llu\n",
            (unsigned long long)st_dropped);
  sb_printf(&b, "# HELP pipewright_store_writes_pending Store writes kept in memory until the store works.\n"
                "# TYPE pipewright_store_writes_pending gauge\npipewright_store_writes_pending %d\n", st_pending);
  sb_printf(&b, "# HELP pipewright_step_seconds Wall time of a training step.\n"
                "# TYPE pipewright_step_seconds histogram\n");
  uint64_t cum = 0;
  double le = 0.001;
  for (int i = 0; i < PW_HIST_BUCKETS; i++, le *= 2) {
    cum += hist[i];
    sb_printf(&b, "pipewright_step_seconds_bucket{le=\"%g\"} %llu\n", le, (unsigned long long)cum);
  }
  cum += hist[PW_HIST_BUCKETS];
  sb_printf(&b, "pipewright_step_seconds_bucket{le=\"+Inf\"} %llu\npipewright_step_seconds_sum %.6f\n"
                "pipewright_step_seconds_count %llu\n", (unsigned long long)cum, sum, (unsigned long long)count);
  sb_printf(&b, "# HELP pipewright_http_requests_total HTTP requests answered, by status class.\n"
                "# TYPE pipewright_http_requests_total counter\n");
  for (int k = 1; k <= 5; k++)
    sb_printf(&b, "pipewright_http_requests_total{code=\"%dxx\"} %llu\n", k, (unsigned long long)req[k]);
  pthread_mutex_lock(&c->mu);
  pw_http_adm a = c->http_adm; /* http.c's admission counts */
  pthread_mutex_unlock(&c->mu);
  sb_printf(&b, "# HELP pipewright_http_connections Open HTTP connections.\n"
                "# TYPE pipewright_http_connections gauge\npipewright_http_connections %d\n"
                "# HELP pipewright_http_connection_limit Bounds on open HTTP connections.\n"
                "# TYPE pipewright_http_connection_limit gauge\n"
                "pipewright_http_connection_limit{scope=\"total\"} %d\n"
                "pipewright_http_connection_limit{scope=\"per_address\"} %d\n"
                "# HELP pipewright_http_connections_refused_total Connections refused at accept, by bound.\n"
                "# TYPE pipewright_http_connections_refused_total counter\n"
                "pipewright_http_connections_refused_total{limit=\"total\"} %llu\n"
                "pipewright_http_connections_refused_total{limit=\"per_address\"} %llu\n",
            a.open, a.max_conns, a.max_per_ip, (unsigned long long)a.refused_total,
            (unsigned long long)a.refused_per_ip);
  sb_printf(&b, "# HELP pipewright_http_pool Expensive requests (plans, submissions, timelines, checkpoints).\n"
                "# TYPE pipewright_http_pool gauge\npipewright_http_pool{state=\"running\"} %d\n"
                "pipewright_http_pool{state=\"queued\"} %d\n"
                "# HELP pipewright_http_pool_capacity Pool workers and queue places.\n"
                "# TYPE pipewright_http_pool_capacity gauge\npipewright_http_pool_capacity{kind=\"workers\"} %d\n"
                "pipewright_http_pool_capacity{kind=\"queue\"} %d\n"
                "# HELP pipewright_http_busy_total Requests answered 429: the pool and its queue were full.\n"
                "# TYPE pipewright_http_busy_total counter\npipewright_http_busy_total %llu\n",
            a.running, a.queued, a.workers, a.queue, (unsigned long long)a.busy);
  sb_printf(&b, "# HELP pipewright_http_upload_pool Workers' checkpoint uploads (their own lane of the pool).\n"
                "# TYPE pipewright_http_upload_pool gauge\npipewright_http_upload_pool{state=\"running\"} %d\n"
                "pipewright_http_upload_pool{state=\"queued\"} %d\n"
                "# HELP pipewright_http_upload_pool_capacity Upload lane workers and queue places.\n"
                "# TYPE pipewright_http_upload_pool_capacity gauge\n"
                "pipewright_http_upload_pool_capacity{kind=\"workers\"} %d\n"
                "pipewright_http_upload_pool_capacity{kind=\"queue\"} %d\n"
                "# HELP pipewright_http_upload_busy_total Checkpoint uploads answered 429: their lane was full.\n"
                "# TYPE pipewright_http_upload_busy_total counter\npipewright_http_upload_busy_total %llu\n",
            a.c_running, a.c_queued, a.c_workers, a.c_queue, (unsigned long long)a.c_busy);
  pthread_mutex_lock(&c->mu);
  uint64_t gs = c->gen_sequences, gt = c->gen_tokens, gf = c->gen_failed;
  pthread_mutex_unlock(&c->mu);
  sb_printf(&b, "# HELP pipewright_generate_sequences_total Prompts of serve jobs answered, by outcome.\n"
                "# TYPE pipewright_generate_sequences_total counter\n"
                "pipewright_generate_sequences_total{outcome=\"complete\"} %llu\n"
                "pipewright_generate_sequences_total{outcome=\"failed\"} %llu\n"
                "# HELP pipewright_generate_tokens_total Tokens serve jobs generated.\n"
                "# TYPE pipewright_generate_tokens_total counter\npipewright_generate_tokens_total %llu\n",
            (unsigned long long)gs, (unsigned long long)gf, (unsigned long long)gt);
  pthread_mutex_lock(&c->mu);
  uint64_t tbw = c->tb_writes, tbf = c->tb_failures; /* tbdir.c: --tensorboard-dir */
  pthread_mutex_unlock(&c->mu);
  sb_printf(&b, "# HELP pipewright_tensorboard_writes_total Event files written to --tensorboard-dir.\n"
                "# TYPE pipewright_tensorboard_writes_total counter\npipewright_tensorboard_writes_total %llu\n"
                "# HELP pipewright_tensorboard_write_failures_total Event file writes to --tensorboard-dir that "
                "failed (logged; tried again).\n"
                "# TYPE pipewright_tensorboard_write_failures_total counter\n"
                "pipewright_tensorboard_write_failures_total %llu\n",
            (unsigned long long)tbw, (unsigned long long)tbf);
  return b.s;
}

int pw_coord_cancel(pw_coord *c, int64_t job, pw_err *err) {
  pw_store *s = pw_coord_store(c);
  if (!s) return pw_err_set(err, PW_EIO, "store", "the store is not available");
  pw_job_brief jb;
  int rc = pw_store_job_brief(s, job, &jb, err);
  if (rc) return rc;
  free(jb.spec);
  if (pw_job_state_terminal(jb.state))
    return pw_err_set(err, PW_ECONFLICT, "job", "job %lld is already %s", (long long)job, pw_job_state_name(jb.state));
  rc = pw_store_job_set_state(s, job, PW_JOB_CANCELLED, "cancelled by request", NULL, err);
  if (!rc) pw_coord_wake(c); /* the loop stops its workers */
  return rc;
}
