/* cmd_remote: the subcommands that follow the coordinator's jobs and
 * workers — `pipewright status | watch | cancel | retry | workers` (submit is in
 * cmd_submit.c, datasets in cmd_dataset.c; what they share in remote.c).
 *
 * Each is a thin view of one or two API calls (api/openapi.yaml): the
 * coordinator validates, plans and decides; these only format its answers.
 * Every API error is shown as the coordinator phrased it, with the JSON
 * path when the request's content was at fault, and a coordinator that
 * cannot be reached is named with its URL. Exit codes: 0 success, 1 an
 * error (or a watched job that did not succeed), 2 bad usage. */
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "json_short.h"
#include "args.h"
#include "cli.h"
#include "suggest.h"
#include "remote.h"

/* ---- formatting ---------------------------------------------------------------- */

static const char *fmt_loss(double x, char *buf, int cap) {
  snprintf(buf, (size_t)cap, isnan(x) ? "-" : "%.4f", x);
  return buf;
}

static const char *fmt_rate(double x, char *buf, int cap) {
  if (isnan(x) || x <= 0) return snprintf(buf, (size_t)cap, "-"), buf;
  return pw_cli_si(x, buf, cap);
}

/* 42s, 3m05s, 2h03m, 4d05h. */
static const char *fmt_duration(double s, char *buf, int cap) {
  if (isnan(s) || s < 0) return snprintf(buf, (size_t)cap, "-"), buf;
  long long t = llround(s);
  if (s < 10)
    snprintf(buf, (size_t)cap, "%.1fs", s);
  else if (t < 60)
    snprintf(buf, (size_t)cap, "%llds", t);
  else if (t < 3600)
    snprintf(buf, (size_t)cap, "%lldm%02llds", t / 60, t % 60);
  else if (t < 86400)
    snprintf(buf, (size_t)cap, "%lldh%02lldm", t / 3600, t % 3600 / 60);
  else
    snprintf(buf, (size_t)cap, "%lldd%02lldh", t / 86400, t % 86400 / 3600);
  return buf;
}


static const char *fmt_mesh(const json_t *job, char *buf, int cap) {
  const json_t *m = json_object_get(job, "mesh");
  long long v = pw_jint(m, "virtual_stages", 1), tp = pw_jint(m, "tp", 1);
  int n = snprintf(buf, (size_t)cap, "pp%lld x dp%lld", pw_jint(m, "pp", 0), pw_jint(m, "dp", 0));
  if (tp > 1 && n < cap) n += snprintf(buf + n, (size_t)(cap - n), " x tp%lld", tp);
  if (v > 1 && n < cap) snprintf(buf + n, (size_t)(cap - n), " v%lld", v);
  return buf;
}

static void bar(char *buf, int width, long long done, long long total) {
  int fill = total > 0 ? (int)(done * width / total) : 0;
  if (fill > width) fill = width;
  for (int i = 0; i < width; i++) buf[i] = i < fill ? '#' : '.';
  buf[width] = 0;
}

/* ---- status ------------------------------------------------------------------------ */

static void status_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright status [ID] [options]\n"
          "  without ID: a table of jobs, newest first; with ID: that job in detail\n"
          "  --state STATE       only jobs in this state (queued, running, succeeded, ...)\n"
          "  --limit N           at most N jobs (default 50)\n" PW_REMOTE_USAGE);
}

static const char *const job_states[] = {"queued",    "planning", "dispatching", "running",
                                         "succeeded", "failed",   "cancelled"};

/* --state: one of the API's job states, or the nearest named. */
static int parse_state(const char *s) {
  int n = (int)(sizeof job_states / sizeof job_states[0]);
  for (int i = 0; i < n; i++)
    if (!strcmp(s, job_states[i])) return 0;
  char near[160];
  pw_cli_usage_error("--state: '%s' is not a job state (queued, planning, dispatching, running, succeeded, failed, "
                     "cancelled)%s", s, pw_suggest_text(s, job_states, n, "", near, sizeof near));
  return -1;
}

static void print_job_table(const json_t *list) {
  const json_t *jobs = json_object_get(list, "jobs"), *job;
  size_t i;
  int nw = 4;
  json_array_foreach(jobs, i, job) {
    int n = (int)strlen(pw_jstr(job, "name", ""));
    if (n > nw) nw = n > 24 ? 24 : n;
  }
  printf("%-5s %-*s %-11s %-11s %-9s %-8s %-26s %s\n", "ID", nw, "NAME", "STATE", "PROGRESS", "LOSS", "TOK/S",
         "SCHEDULE", "MESH");
  json_array_foreach(jobs, i, job) {
    const json_t *p = json_object_get(job, "progress");
    char prog[32], loss[32], rate[32], mesh[64];
    snprintf(prog, sizeof prog, "%lld/%lld", pw_jint(p, "step", 0), pw_jint(p, "total", 0));
    printf("%-5lld %-*.*s %-11s %-11s %-9s %-8s %-26s %s\n", pw_jint(job, "id", 0), nw, nw, pw_jstr(job, "name", ""),
           pw_jstr(job, "state", "?"), prog, fmt_loss(pw_jnum(job, "loss"), loss, 32),
           fmt_rate(pw_jnum(job, "tokens_per_s"), rate, 32), pw_jstr(job, "schedule", "-"), fmt_mesh(job, mesh, 64));
  }
  long long total = pw_jint(list, "total", -1), shown = (long long)json_array_size(jobs);
  if (total == 0)
    printf("(no jobs)\n");
  else if (total > shown)
    printf("(%lld of %lld jobs; --limit N for more)\n", shown, total);
}

/* A rank's place in the mesh (the API's coordinate): "pp1 dp0 tp1" —
 * pipeline rank, replica, tp rank; "" without one (an older coordinator). */
static const char *fmt_coord(const json_t *c, char *buf, size_t n) {
  if (!json_is_object(c)) return "";
  snprintf(buf, n, "pp%lld dp%lld tp%lld", pw_jint(c, "pipeline_rank", 0), pw_jint(c, "replica", 0),
           pw_jint(c, "tp_rank", 0));
  return buf;
}

/* One line per attempt: "attempt 2 (run 5) interrupted at TIME workers
 * w0,w1, resumed at step 12 from snapshot: REASON". */
static void print_attempts(const json_t *job) {
  const json_t *attempts = json_object_get(job, "attempts"), *a, *w;
  size_t i, k;
  if (!json_array_size(attempts)) return;
  printf("  %-10s %lld of %lld\n", "restarts", pw_jint(job, "restarts", 0), pw_jint(job, "max_restarts", 0));
  json_array_foreach(attempts, i, a) {
    char t[64];
    double finished = pw_jnum(a, "finished");
    printf("  attempt %lld (run %lld) %s %s %s workers ", pw_jint(a, "attempt", 0), pw_jint(a, "run", 0),
           pw_jstr(a, "state", "?"), isnan(finished) ? "since" : "at",
           pw_cli_fmt_time(isnan(finished) ? pw_jnum(a, "started") : finished, t, 64));
    const json_t *ws = json_object_get(a, "workers");
    json_array_foreach(ws, k, w) printf("%s%s", k ? "," : "", json_is_string(w) ? json_string_value(w) : "?");
    if (!json_array_size(ws)) printf("-");
    long long start = pw_jint(a, "start_step", -1);
    const char *from = pw_jstr(a, "resumed_from", "");
    if (start >= 0 && !strcmp(from, "start"))
      printf(", started at step %lld", start);
    else if (start >= 0)
      printf(", resumed at step %lld from %s", start, *from ? from : "?");
    const char *reason = pw_jstr(a, "reason", "");
    printf("%s%s\n", *reason ? ": " : "", reason);
  }
}

static void print_job(const json_t *job) {
  char a[64], b[64], c[64];
  const json_t *p = json_object_get(job, "progress");
  long long step = pw_jint(p, "step", 0), total = pw_jint(p, "total", 0);
  printf("job %lld (%s): %s\n", pw_jint(job, "id", 0), pw_jstr(job, "name", ""), pw_jstr(job, "state", "?"));
  const char *status = pw_jstr(job, "status", "");
  if (*status) printf("  %-10s %s\n", "status", status);
  printf("  %-10s %s\n", "model", pw_jstr(job, "model", "-"));
  printf("  %-10s %s, %s, %lld microbatches\n", "schedule", pw_jstr(job, "schedule", "-"), fmt_mesh(job, a, 64),
         pw_jint(job, "microbatches", 0));
  char pb[32];
  bar(pb, 20, step, total);
  printf("  %-10s %lld/%lld [%s] %lld%%\n", "progress", step, total, pb, total > 0 ? step * 100 / total : 0);
  printf("  %-10s %s\n", "loss", fmt_loss(pw_jnum(job, "loss"), a, 64));
  if (!isnan(pw_jnum(job, "eval_loss"))) printf("  %-10s %s\n", "eval loss", fmt_loss(pw_jnum(job, "eval_loss"), a, 64));
  printf("  %-10s %s\n", "tokens/s", fmt_rate(pw_jnum(job, "tokens_per_s"), a, 64));
  const char *state = pw_jstr(job, "state", "");
  if (!strcmp(state, "running") || !strcmp(state, "dispatching") || !strcmp(state, "planning"))
    printf("  %-10s %s\n", "eta", fmt_duration(pw_jnum(job, "eta_seconds"), a, 64));
  double created = pw_jnum(job, "created"), started = pw_jnum(job, "started"), finished = pw_jnum(job, "finished");
  printf("  %-10s %s\n", "created", pw_cli_fmt_time(created, a, 64));
  if (!isnan(started)) printf("  %-10s %s\n", "started", pw_cli_fmt_time(started, b, 64));
  if (!isnan(finished))
    printf("  %-10s %s (ran %s)\n", "finished", pw_cli_fmt_time(finished, c, 64),
           fmt_duration(isnan(started) ? NAN : finished - started, a, 64));
  const json_t *ranks = json_object_get(job, "ranks"), *rk;
  size_t i;
  if (json_array_size(ranks)) {
    printf("  %-10s", "ranks");
    json_array_foreach(ranks, i, rk) {
      const json_t *w = json_object_get(rk, "worker");
      char co[64];
      const char *cs = fmt_coord(json_object_get(rk, "coordinate"), co, sizeof co);
      printf("%s%lld -> %s%s%s%s", i ? ", " : " ", pw_jint(rk, "rank", -1),
             json_is_string(w) ? json_string_value(w) : json_is_object(w) ? pw_jstr(w, "name", "?") : "-",
             *cs ? " (" : "", cs, *cs ? ")" : "");
    }
    printf("\n");
  }
  const char *error = pw_jstr(job, "error", "");
  if (*error) printf("  %-10s %s\n", "error", error);
  print_attempts(job);
}

int pw_cmd_status(int argc, char **argv) {
  static const struct option opts[] = {
      {"state", required_argument, 0, 's'}, {"limit", required_argument, 0, 'l'}, PW_REMOTE_LONG_OPTS, {0, 0, 0, 0}};
  pw_remote_opts co = {0};
  const char *state = NULL;
  int limit = 0, c;
  optind = 1;
  while ((c = pw_remote_getopt(argc, argv, "s:l:h", opts, &co)) != -1) {
    switch (c) {
      case 's':
        if (parse_state(state = optarg)) return status_usage(stderr), 2;
        break;
      case 'l':
        if (pw_arg_int("--limit", optarg, 1, 500, &limit)) return status_usage(stderr), 2;
        break;
      case 'h': status_usage(stdout); return 0;
      default: status_usage(stderr); return 2;
    }
  }
  long long id = 0;
  if (pw_args_operands(argc, argv, 0, 1, NULL) || (optind < argc && pw_cli_job_id(argv[optind], &id))) {
    status_usage(stderr);
    return 2;
  }
  pw_remote r;
  if (pw_remote_init(&r, &co)) return 1;
  char target[128];
  if (id)
    snprintf(target, sizeof target, "/v1/jobs/%lld", id);
  else {
    int n = snprintf(target, sizeof target, "/v1/jobs");
    char sep = '?';
    if (state) n += snprintf(target + n, sizeof target - (size_t)n, "%cstate=%s", sep, state), sep = '&';
    if (limit) snprintf(target + n, sizeof target - (size_t)n, "%climit=%d", sep, limit);
  }
  pw_http_resp resp;
  json_t *j;
  if (pw_remote_call(&r, "GET", target, NULL, 0, 0, &resp, &j)) return 1;
  if (r.json)
    pw_remote_print_raw(&resp);
  else if (id)
    print_job(j);
  else
    print_job_table(j);
  json_decref(j);
  pw_http_resp_free(&resp);
  return 0;
}

/* ---- watch ---------------------------------------------------------------------------- */

static void watch_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright watch ID [options]\n"
          "  follows a job until it ends: a progress bar and the loss on a terminal, a line per\n"
          "  step otherwise; exits 0 when it succeeded, 1 when it failed or was cancelled\n"
          "  --interval SECS     time between polls (default 0.5)\n"
          "  --json              one JSON line per step, then the final job\n" PW_REMOTE_USAGE);
}

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* How long watch keeps trying while the coordinator cannot be reached
 * (a restart, say) before giving up. */
#define WATCH_RETRY_SECONDS 60.0

int pw_cmd_watch(int argc, char **argv) {
  static const struct option opts[] = {{"interval", required_argument, 0, 'i'}, PW_REMOTE_LONG_OPTS, {0, 0, 0, 0}};
  pw_remote_opts co = {0};
  double interval = 0.5;
  int c;
  optind = 1;
  while ((c = pw_remote_getopt(argc, argv, "i:h", opts, &co)) != -1) {
    switch (c) {
      case 'i':
        if (pw_arg_num("--interval", optarg, 0, 3600, &interval)) return watch_usage(stderr), 2;
        break;
      case 'h': watch_usage(stdout); return 0;
      default: watch_usage(stderr); return 2;
    }
  }
  long long id;
  if (pw_cli_job_operand(argc, argv, &id)) {
    watch_usage(stderr);
    return 2;
  }
  pw_remote r;
  if (pw_remote_init(&r, &co)) return 1;
  int tty = !r.json && isatty(STDOUT_FILENO);
  char job_target[64];
  snprintf(job_target, sizeof job_target, "/v1/jobs/%lld", id);

  long long since = 0;           /* the next step to fetch */
  double loss = NAN, rate = NAN; /* of the latest step */
  char last_state[32] = "", last_status[256] = "";
  int reached = 0, bar_shown = 0;
  double down_since = -1;
  for (;;) {
    pw_http_resp resp;
    json_t *job;
    int rc = pw_remote_call(&r, "GET", job_target, NULL, 0, reached ? PW_CALL_QUIET_NET : 0, &resp, &job);
    if (rc == PW_CALL_NET && reached) {
      double now = mono_now();
      if (down_since < 0) {
        down_since = now;
        if (bar_shown) putchar('\n'), bar_shown = 0;
        fprintf(stderr, "warning: %s; retrying for up to %.0f s\n", r.net_err, WATCH_RETRY_SECONDS);
      } else if (now - down_since > WATCH_RETRY_SECONDS) {
        fprintf(stderr, "error: %s\n", r.net_err);
        return 1;
      }
      pw_cli_sleep(interval);
      continue;
    }
    if (rc) {
      if (bar_shown) putchar('\n');
      return 1;
    }
    reached = 1;
    down_since = -1;
    pw_http_resp_free(&resp);
    const char *state = pw_jstr(job, "state", "?");
    const char *status = pw_jstr(job, "status", "");
    const json_t *p = json_object_get(job, "progress");
    long long total = pw_jint(p, "total", 0);
    int terminal = pw_cli_job_ended(state);

    if (!r.json && (strcmp(state, last_state) || strcmp(status, last_status))) {
      if (bar_shown) putchar('\n'), bar_shown = 0;
      if (!terminal) printf("job %lld: %s%s%s\n", id, state, *status ? ": " : "", status);
    }
    snprintf(last_state, sizeof last_state, "%s", state);
    snprintf(last_status, sizeof last_status, "%s", status);
    /* the steps since the last poll (after the job: a finished job's
     * steps are all there) */
    char mt[96];
    snprintf(mt, sizeof mt, "/v1/jobs/%lld/metrics?since=%lld", id, since);
    json_t *m;
    rc = pw_remote_call(&r, "GET", mt, NULL, 0, PW_CALL_QUIET_NET, &resp, &m);
    if (rc == PW_CALL_API) {
      json_decref(job);
      return 1;
    }
    if (rc == PW_CALL_OK) {
      pw_http_resp_free(&resp);
      const json_t *row;
      size_t i;
      json_array_foreach(json_object_get(m, "metrics"), i, row) {
        long long step = pw_jint(row, "step", -1);
        if (step < since) continue;
        since = step + 1;
        loss = pw_jnum(row, "loss");
        rate = pw_jnum(row, "tokens_per_s");
        if (r.json) {
          char *s = pw_json_dumps(row, JSON_COMPACT | JSON_PRESERVE_ORDER);
          if (s) puts(s);
          free(s);
        } else if (!tty) {
          char a[32], b[32], e[32];
          double ev = pw_jnum(row, "eval_loss");
          printf("step %lld/%lld loss %s tokens/s %s%s%s\n", step + 1, total, fmt_loss(loss, a, 32),
                 fmt_rate(rate, b, 32), isnan(ev) ? "" : " eval_loss ", isnan(ev) ? "" : fmt_loss(ev, e, 32));
        }
      }
      json_decref(m);
    }
    if (tty && !terminal && !strcmp(state, "running")) {
      char pb[40], a[32], b[32], e[32];
      long long step = pw_jint(p, "step", 0);
      bar(pb, 30, step, total);
      printf("\r[%s] %lld/%lld loss %s  %s tok/s  eta %s\033[K", pb, step, total, fmt_loss(loss, a, 32),
             fmt_rate(rate, b, 32), fmt_duration(pw_jnum(job, "eta_seconds"), e, 32));
      bar_shown = 1;
    }
    fflush(stdout);
    if (terminal) {
      if (bar_shown) putchar('\n');
      int ok = !strcmp(state, "succeeded");
      if (r.json) {
        char *s = pw_json_dumps(job, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s) puts(s);
        free(s);
      } else if (ok) {
        char a[32], e[32];
        double ev = pw_jnum(job, "eval_loss");
        printf("job %lld succeeded: %lld/%lld steps, loss %s%s%s\n", id, pw_jint(p, "step", 0), total,
               fmt_loss(pw_jnum(job, "loss"), a, 32), isnan(ev) ? "" : ", eval loss ",
               isnan(ev) ? "" : fmt_loss(ev, e, 32));
      } else {
        const char *error = pw_jstr(job, "error", "");
        printf("job %lld %s after %lld/%lld steps\n", id, state, pw_jint(p, "step", 0), total);
        fprintf(stderr, "error: job %lld %s%s%s\n", id, state, *error ? ": " : "", error);
      }
      fflush(stdout);
      json_decref(job);
      return ok ? 0 : 1;
    }
    json_decref(job);
    pw_cli_sleep(interval);
  }
}

/* ---- cancel, retry --------------------------------------------------------------------- */

/* `pipewright cancel|retry ID`: one call on the job (method, the path after
 * /v1/jobs/ID), then "job ID <its new state>" (state: when the answer
 * names none). */
static int job_action(int argc, char **argv, void (*usage)(FILE *), const char *method, const char *suffix,
                      const char *state) {
  pw_remote_opts co = {0};
  int rc = pw_remote_parse_only(argc, argv, usage, &co);
  if (rc >= 0) return rc;
  long long id;
  if (pw_cli_job_operand(argc, argv, &id)) {
    usage(stderr);
    return 2;
  }
  pw_remote r;
  if (pw_remote_init(&r, &co)) return 1;
  char target[96];
  snprintf(target, sizeof target, "/v1/jobs/%lld%s", id, suffix);
  pw_http_resp resp;
  json_t *j;
  if (pw_remote_call(&r, method, target, NULL, 0, 0, &resp, &j)) return 1;
  if (r.json)
    pw_remote_print_raw(&resp);
  else
    printf("job %lld %s\n", id, pw_jstr(j, "state", state));
  json_decref(j);
  pw_http_resp_free(&resp);
  return 0;
}

static void cancel_usage(FILE *f) {
  fprintf(f, "usage: pipewright cancel ID [options]\n  stops a queued or running job\n" PW_REMOTE_USAGE);
}

int pw_cmd_cancel(int argc, char **argv) { return job_action(argc, argv, cancel_usage, "DELETE", "", "cancelled"); }

static void retry_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright retry ID [options]\n"
          "  queues a failed or cancelled job again; it resumes from its newest state\n" PW_REMOTE_USAGE);
}

int pw_cmd_retry(int argc, char **argv) { return job_action(argc, argv, retry_usage, "POST", "/retry", "queued"); }

/* ---- workers -------------------------------------------------------------------------- */

static void workers_usage(FILE *f) {
  fprintf(f, "usage: pipewright workers [options]\n  the registered workers: host, state, job, OpenBLAS kernel, one-core sgemm rate,\n  the cores and memory each may use and where those came from (its cgroup, its\n  affinity mask, the machine), and any warning (a forced slow kernel)\n" PW_REMOTE_USAGE);
}

int pw_cmd_workers(int argc, char **argv) {
  pw_remote_opts co = {0};
  int rc = pw_remote_parse_only(argc, argv, workers_usage, &co);
  if (rc >= 0) return rc;
  if (pw_args_operands(argc, argv, 0, 0, NULL)) {
    workers_usage(stderr);
    return 2;
  }
  pw_remote r;
  if (pw_remote_init(&r, &co)) return 1;
  pw_http_resp resp;
  json_t *j;
  if (pw_remote_call(&r, "GET", "/v1/workers", NULL, 0, 0, &resp, &j)) return 1;
  if (r.json) {
    pw_remote_print_raw(&resp);
  } else {
    const json_t *ws = json_object_get(j, "workers"), *w;
    size_t i;
    int nw = 4, aw = 7, hw = 4, jw = 12;
    json_array_foreach(ws, i, w) {
      if (json_is_object(json_object_get(w, "coordinate"))) jw = 26; /* "12 (rank 3: pp1 dp0 tp1)" */
      int n = (int)strlen(pw_jstr(w, "name", "")), a = (int)strlen(pw_jstr(w, "addr", ""));
      int h = (int)strlen(pw_jstr(w, "hostname", "-"));
      if (n > nw) nw = n > 32 ? 32 : n;
      if (a > aw) aw = a > 48 ? 48 : a;
      if (h > hw) hw = h > 32 ? 32 : h;
    }
    printf("%-*s %-*s %-*s %-6s %-10s %-*s %-7s %-22s %s\n", nw, "NAME", aw, "ADDRESS", hw, "HOST", "STATE",
           "HEARTBEAT", jw, "JOB", "THREADS", "KERNEL", "SGEMM");
    json_array_foreach(ws, i, w) {
      char age[32], hb[40], jb[64] = "-", cbuf[40];
      snprintf(hb, sizeof hb, "%s ago", fmt_duration(pw_jnum(w, "heartbeat_age"), age, 32));
      if (pw_jint(w, "job", 0) > 0) {
        long long rank = pw_jint(w, "rank", -1);
        const char *cs = fmt_coord(json_object_get(w, "coordinate"), cbuf, sizeof cbuf);
        if (rank >= 0)
          snprintf(jb, sizeof jb, "%lld (rank %lld%s%s)", pw_jint(w, "job", 0), rank, *cs ? ": " : "", cs);
        else
          snprintf(jb, sizeof jb, "%lld", pw_jint(w, "job", 0));
      }
      /* what the products run on: oneDNN, or the OpenBLAS kernel, "(forced)"
       * when OPENBLAS_CORETYPE chose it; "-" for an older worker */
      char kern[48] = "-", gf[32] = "-";
      const json_t *fv = json_object_get(w, "blas_forced");
      if (!strcmp(pw_jstr(w, "gemm_path", ""), "onednn"))
        snprintf(kern, sizeof kern, "oneDNN");
      else if (json_is_string(json_object_get(w, "blas_core")))
        snprintf(kern, sizeof kern, "%.31s%s", pw_jstr(w, "blas_core", ""), json_is_true(fv) ? " (forced)" : "");
      double g = pw_jnum(w, "gemm_gflops");
      if (g > 0) snprintf(gf, sizeof gf, "%.0f GF/s", g);
      /* its machine's name: workers on one host share its cores; "-" for an older worker */
      printf("%-*.*s %-*.*s %-*.*s %-6s %-10s %-*s %-7lld %-22s %s\n", nw, nw, pw_jstr(w, "name", ""), aw, aw,
             pw_jstr(w, "addr", ""), hw, hw, pw_jstr(w, "hostname", "-"), pw_jstr(w, "state", "?"), hb, jw, jb,
             pw_jint(w, "threads", 0), kern, gf);
      /* what the worker may use and why (its cgroup, its affinity mask, the
       * machine): an older worker says nothing */
      if (json_is_string(json_object_get(w, "cores_from")) || json_is_string(json_object_get(w, "memory_from"))) {
        long long cores = pw_jint(w, "cores", 0);
        printf("  resources: %lld core%s (%.200s), %.1f GiB (%.200s)\n", cores, cores == 1 ? "" : "s",
               pw_jstr(w, "cores_from", "?"), pw_jnum(w, "memory") / (1 << 30), pw_jstr(w, "memory_from", "?"));
      }
      const json_t *wv;
      size_t k;
      json_array_foreach(json_object_get(w, "warnings"), k, wv)
        if (json_is_string(wv)) printf("  warning: %s\n", json_string_value(wv));
    }
    if (!json_array_size(ws)) printf("(no workers registered)\n");
  }
  json_decref(j);
  pw_http_resp_free(&resp);
  return 0;
}
