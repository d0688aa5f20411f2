/* cmd_remote: the subcommands that speak the coordinator's REST API —
 * `pipewright submit | status | watch | cancel | workers`.
 *
 * Each is a thin view of one or two API calls (api/openapi.yaml): the
 * coordinator validates, plans and decides; these only format its answers.
 * Every API error is shown as the coordinator phrased it, with the JSON
 * path when the request's content was at fault, and a coordinator that
 * cannot be reached is named with its URL. Exit codes: 0 success, 1 an
 * error (or a watched job that did not succeed), 2 bad usage. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "control.h"
#include "http_client.h"

#define DEFAULT_COORDINATOR "http://127.0.0.1:8080"

typedef struct {
  const char *url_text;
  pw_http_url url;
  char token[PW_CONTROL_TOKEN_MAX + 1];
  int json;        /* --json: print the raw responses */
  double timeout;  /* per request */
  const char *cacert, *proxy; /* see pw_http_opts */
  char net_err[600]; /* the last transport error, as printed */
} remote;

enum { CALL_OK = 0, CALL_API = 1, CALL_NET = 2 };
enum { CALL_QUIET_NET = 1 };

/* ---- common options ---------------------------------------------------------- */

#define REMOTE_LONG_OPTS                                                                             \
  {"coordinator", required_argument, 0, 'C'}, {"token-file", required_argument, 0, 'T'},             \
      {"json", no_argument, 0, 'J'}, {"timeout", required_argument, 0, 'O'},                        \
      {"cacert", required_argument, 0, 'A'}, {"proxy", required_argument, 0, 'P'}, {"help", no_argument, 0, 'h'}

#define REMOTE_USAGE                                                                                 \
  "  --coordinator URL   the coordinator's API (default $PIPEWRIGHT_COORDINATOR or " DEFAULT_COORDINATOR ")\n" \
  "  --token-file FILE   bearer token for the API (default $PIPEWRIGHT_TOKEN_FILE)\n"                \
  "  --json              print the coordinator's JSON answer as it is\n"                             \
  "  --timeout SECS      bound on each request (default 30)\n"                                        \
  "  --cacert FILE       CA certificates (PEM) for an https coordinator (default $CURL_CA_BUNDLE,\n" \
  "                      else the system's)\n"                                                        \
  "  --proxy URL         proxy for every host, loopback included ('' for none; default\n"           \
  "                      $https_proxy / $http_proxy / $no_proxy, never for loopback)\n"              \
  "  --help\n"

typedef struct {
  const char *coordinator, *token_file, *cacert, *proxy;
  int json;
  double timeout;
} common_opts;

/* Handles a common option: 1 if c was one, 0 if not, -1 if its value is bad. */
static int common_opt(common_opts *o, int c, const char *arg) {
  switch (c) {
    case 'C': o->coordinator = arg; return 1;
    case 'T': o->token_file = arg; return 1;
    case 'J': o->json = 1; return 1;
    case 'A': o->cacert = arg; return 1;
    case 'P': o->proxy = arg; return 1;
    case 'O': {
      char *end;
      o->timeout = strtod(arg, &end);
      if (*end || !(o->timeout > 0)) {
        fprintf(stderr, "error: --timeout: want a positive number of seconds, got '%s'\n", arg);
        return -1;
      }
      return 1;
    }
    default: return 0;
  }
}

/* Parses a command that takes only the common options: -1 to go on, else
 * the exit code (0 after --help, 2 on bad usage). */
static int parse_common_only(int argc, char **argv, void (*usage)(FILE *), common_opts *co) {
  static const struct option opts[] = {REMOTE_LONG_OPTS, {0, 0, 0, 0}};
  int c, k;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if ((k = common_opt(co, c, optarg))) {
      if (k < 0) return 2;
      continue;
    }
    usage(c == 'h' ? stdout : stderr);
    return c == 'h' ? 0 : 2;
  }
  return -1;
}

/* Resolves the URL and reads the token; prints and returns nonzero on error. */
static int remote_init(remote *r, const common_opts *o) {
  memset(r, 0, sizeof *r);
  r->url_text = o->coordinator ? o->coordinator : getenv("PIPEWRIGHT_COORDINATOR");
  if (!r->url_text || !*r->url_text) r->url_text = DEFAULT_COORDINATOR;
  r->json = o->json;
  r->timeout = o->timeout > 0 ? o->timeout : PW_HTTP_DEFAULT_TIMEOUT;
  /* as the curl command does: libcurl itself does not read it */
  r->cacert = o->cacert ? o->cacert : getenv("CURL_CA_BUNDLE");
  if (r->cacert && !*r->cacert) r->cacert = NULL;
  r->proxy = o->proxy;
  pw_err err = {0};
  if (pw_http_url_parse(r->url_text, &r->url, &err)) {
    fprintf(stderr, "error: bad coordinator URL '%s': %s\n", r->url_text, err.msg);
    return 1;
  }
  const char *tf = o->token_file ? o->token_file : getenv("PIPEWRIGHT_TOKEN_FILE");
  if (tf && *tf && pw_control_read_token_file(tf, r->token, sizeof r->token, &err) < 0) {
    pw_cli_report(&err);
    return 1;
  }
  return 0;
}

/* ---- calls ------------------------------------------------------------------- */

static void print_api_error(const remote *r, const pw_http_resp *resp) {
  json_t *j = json_loadb(resp->body, resp->len, 0, NULL);
  json_t *e = json_object_get(j, "error");
  const char *msg = json_string_value(json_object_get(e, "message"));
  const char *path = json_string_value(json_object_get(e, "path"));
  /* the path says what to change in what was sent: shown for those errors */
  int content = resp->status == 400 || resp->status == 413 || resp->status == 422;
  if (msg && path && *path && content)
    fprintf(stderr, "error: %s: %s\n", path, msg);
  else if (msg)
    fprintf(stderr, "error: %s\n", msg);
  else {
    size_t n = strcspn(resp->body, "\r\n");
    fprintf(stderr, "error: HTTP %d from %s%s%.*s\n", resp->status, r->url_text, n ? ": " : "",
            (int)(n > 200 ? 200 : n), resp->body);
  }
  if (resp->status == 401)
    fprintf(stderr, r->token[0] ? "hint: the coordinator refused the token given\n"
                                : "hint: this coordinator needs a token: --token-file FILE or $PIPEWRIGHT_TOKEN_FILE\n");
  json_decref(j);
}

/* One request. CALL_OK with resp filled and *out its parsed JSON body (out
 * may be NULL); CALL_API after printing the coordinator's error; CALL_NET
 * when it could not be reached (printed unless CALL_QUIET_NET; the text is
 * kept in r->net_err either way). */
static int call(remote *r, const char *method, const char *target, const char *body, size_t len, int flags,
                pw_http_resp *resp, json_t **out) {
  pw_http_opts ho = {.token = r->token, .timeout = r->timeout, .cacert = r->cacert, .proxy = r->proxy};
  pw_err err = {0};
  if (out) *out = NULL;
  int rc = pw_http_request(&r->url, method, target, body, len, &ho, resp, &err);
  if (rc) {
    if (rc == PW_EPEER)
      snprintf(r->net_err, sizeof r->net_err, "cannot reach the coordinator at %s: %s", r->url_text, err.msg);
    else
      snprintf(r->net_err, sizeof r->net_err, "coordinator at %s: %s", r->url_text, err.msg);
    if (!(flags & CALL_QUIET_NET)) {
      fprintf(stderr, "error: %s\n", r->net_err);
      if (rc == PW_EPEER && !strcmp(err.msg, "connection refused"))
        fprintf(stderr, "hint: is pipewright-coordinator running there?\n");
      else if (rc == PW_EAUTH)
        fprintf(stderr, "hint: for a private CA, --cacert FILE or $CURL_CA_BUNDLE\n");
    }
    return CALL_NET;
  }
  if (resp->status < 200 || resp->status > 299) {
    print_api_error(r, resp);
    pw_http_resp_free(resp);
    return CALL_API;
  }
  if (out) {
    json_error_t je;
    *out = json_loadb(resp->body, resp->len, 0, &je);
    if (!*out) {
      fprintf(stderr, "error: %s answered %s %s with something that is not JSON: %s\n", r->url_text, method, target,
              je.text);
      pw_http_resp_free(resp);
      return CALL_API;
    }
  }
  return CALL_OK;
}

static void print_raw(const pw_http_resp *resp) {
  fwrite(resp->body, 1, resp->len, stdout);
  if (!resp->len || resp->body[resp->len - 1] != '\n') putchar('\n');
}

/* ---- formatting ---------------------------------------------------------------- */

static const char *jstr(const json_t *o, const char *key, const char *def) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : def;
}

static long long jint(const json_t *o, const char *key, long long def) {
  json_t *v = json_object_get(o, key);
  return json_is_integer(v) ? (long long)json_integer_value(v) : json_is_real(v) ? (long long)json_real_value(v) : def;
}

/* NAN when absent or null. */
static double jnum(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

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

static const char *fmt_time(double epoch, char *buf, int cap) {
  if (isnan(epoch) || epoch <= 0) return snprintf(buf, (size_t)cap, "-"), buf;
  time_t t = (time_t)epoch;
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(buf, (size_t)cap, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

static const char *fmt_mesh(const json_t *job, char *buf, int cap) {
  const json_t *m = json_object_get(job, "mesh");
  long long v = jint(m, "virtual_stages", 1);
  int n = snprintf(buf, (size_t)cap, "pp%lld x dp%lld", jint(m, "pp", 0), jint(m, "dp", 0));
  if (v > 1 && n < cap) snprintf(buf + n, (size_t)(cap - n), " v%lld", v);
  return buf;
}

static void bar(char *buf, int width, long long done, long long total) {
  int fill = total > 0 ? (int)(done * width / total) : 0;
  if (fill > width) fill = width;
  for (int i = 0; i < width; i++) buf[i] = i < fill ? '#' : '.';
  buf[width] = 0;
}

/* ---- submit --------------------------------------------------------------------- */

static char *read_all(const char *path, size_t *len) {
  FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (n == cap) {
      char *nb = cap < ((size_t)64 << 20) ? realloc(buf, cap * 2) : NULL;
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    size_t k = fread(buf + n, 1, cap - n, f);
    n += k;
    if (k == 0) break;
  }
  if (buf && ferror(f)) {
    free(buf);
    buf = NULL;
  }
  if (f != stdin) fclose(f);
  *len = n;
  return buf;
}

static void submit_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright submit --job FILE [options]\n"
          "  --job FILE          the job spec (JSON; - reads stdin), sent as it is: the coordinator\n"
          "                      validates and plans it, and resolves a relative data.path from its\n"
          "                      own working directory\n"
          "  --quiet             print only the new job's id\n" REMOTE_USAGE);
}

int pw_cmd_submit(int argc, char **argv) {
  static const struct option opts[] = {
      {"job", required_argument, 0, 'j'}, {"quiet", no_argument, 0, 'q'}, REMOTE_LONG_OPTS, {0, 0, 0, 0}};
  common_opts co = {0};
  const char *job_path = NULL;
  int quiet = 0, c, k;
  optind = 1;
  while ((c = getopt_long(argc, argv, "j:qh", opts, NULL)) != -1) {
    if ((k = common_opt(&co, c, optarg))) {
      if (k < 0) return 2;
      continue;
    }
    switch (c) {
      case 'j': job_path = optarg; break;
      case 'q': quiet = 1; break;
      case 'h': submit_usage(stdout); return 0;
      default: submit_usage(stderr); return 2;
    }
  }
  if (!job_path || optind < argc) {
    submit_usage(stderr);
    return 2;
  }
  remote r;
  if (remote_init(&r, &co)) return 1;
  size_t len;
  char *body = read_all(job_path, &len);
  if (!body) {
    fprintf(stderr, "error: cannot read %s\n", job_path);
    return 1;
  }
  pw_http_resp resp;
  json_t *j;
  int rc = call(&r, "POST", "/v1/jobs", body, len, 0, &resp, &j);
  free(body);
  if (rc) return 1;
  long long id = jint(j, "id", 0);
  if (r.json)
    print_raw(&resp);
  else if (quiet)
    printf("%lld\n", id);
  else
    printf("job %lld %s\n", id, jstr(j, "state", "queued"));
  json_decref(j);
  pw_http_resp_free(&resp);
  return 0;
}

/* ---- status ------------------------------------------------------------------------ */

static void status_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright status [ID] [options]\n"
          "  without ID: a table of jobs, newest first; with ID: that job in detail\n"
          "  --state STATE       only jobs in this state (queued, running, succeeded, ...)\n"
          "  --limit N           at most N jobs (default 50)\n" REMOTE_USAGE);
}

static int parse_id(const char *s, long long *id) {
  char *end;
  *id = strtoll(s, &end, 10);
  if (*s < '0' || *s > '9' || *end || *id <= 0) {
    fprintf(stderr, "error: '%s' is not a job id (a positive integer)\n", s);
    return -1;
  }
  return 0;
}

static void print_job_table(const json_t *list) {
  const json_t *jobs = json_object_get(list, "jobs"), *job;
  size_t i;
  int nw = 4;
  json_array_foreach(jobs, i, job) {
    int n = (int)strlen(jstr(job, "name", ""));
    if (n > nw) nw = n > 24 ? 24 : n;
  }
  printf("%-5s %-*s %-11s %-11s %-9s %-8s %-26s %s\n", "ID", nw, "NAME", "STATE", "PROGRESS", "LOSS", "TOK/S",
         "SCHEDULE", "MESH");
  json_array_foreach(jobs, i, job) {
    const json_t *p = json_object_get(job, "progress");
    char prog[32], loss[32], rate[32], mesh[64];
    snprintf(prog, sizeof prog, "%lld/%lld", jint(p, "step", 0), jint(p, "total", 0));
    printf("%-5lld %-*.*s %-11s %-11s %-9s %-8s %-26s %s\n", jint(job, "id", 0), nw, nw, jstr(job, "name", ""),
           jstr(job, "state", "?"), prog, fmt_loss(jnum(job, "loss"), loss, 32),
           fmt_rate(jnum(job, "tokens_per_s"), rate, 32), jstr(job, "schedule", "-"), fmt_mesh(job, mesh, 64));
  }
  long long total = jint(list, "total", -1), shown = (long long)json_array_size(jobs);
  if (total == 0)
    printf("(no jobs)\n");
  else if (total > shown)
    printf("(%lld of %lld jobs; --limit N for more)\n", shown, total);
}

static void print_job(const json_t *job) {
  char a[64], b[64], c[64];
  const json_t *p = json_object_get(job, "progress");
  long long step = jint(p, "step", 0), total = jint(p, "total", 0);
  printf("job %lld (%s): %s\n", jint(job, "id", 0), jstr(job, "name", ""), jstr(job, "state", "?"));
  const char *status = jstr(job, "status", "");
  if (*status) printf("  %-10s %s\n", "status", status);
  printf("  %-10s %s\n", "model", jstr(job, "model", "-"));
  printf("  %-10s %s, %s, %lld microbatches\n", "schedule", jstr(job, "schedule", "-"), fmt_mesh(job, a, 64),
         jint(job, "microbatches", 0));
  char pb[32];
  bar(pb, 20, step, total);
  printf("  %-10s %lld/%lld [%s] %lld%%\n", "progress", step, total, pb, total > 0 ? step * 100 / total : 0);
  printf("  %-10s %s\n", "loss", fmt_loss(jnum(job, "loss"), a, 64));
  printf("  %-10s %s\n", "tokens/s", fmt_rate(jnum(job, "tokens_per_s"), a, 64));
  const char *state = jstr(job, "state", "");
  if (!strcmp(state, "running") || !strcmp(state, "dispatching") || !strcmp(state, "planning"))
    printf("  %-10s %s\n", "eta", fmt_duration(jnum(job, "eta_seconds"), a, 64));
  double created = jnum(job, "created"), started = jnum(job, "started"), finished = jnum(job, "finished");
  printf("  %-10s %s\n", "created", fmt_time(created, a, 64));
  if (!isnan(started)) printf("  %-10s %s\n", "started", fmt_time(started, b, 64));
  if (!isnan(finished))
    printf("  %-10s %s (ran %s)\n", "finished", fmt_time(finished, c, 64),
           fmt_duration(isnan(started) ? NAN : finished - started, a, 64));
  const json_t *ranks = json_object_get(job, "ranks"), *rk;
  size_t i;
  if (json_array_size(ranks)) {
    printf("  %-10s", "ranks");
    json_array_foreach(ranks, i, rk) {
      const json_t *w = json_object_get(rk, "worker");
      printf("%s%lld -> %s", i ? ", " : " ", jint(rk, "rank", -1),
             json_is_string(w) ? json_string_value(w) : json_is_object(w) ? jstr(w, "name", "?") : "-");
    }
    printf("\n");
  }
  const char *error = jstr(job, "error", "");
  if (*error) printf("  %-10s %s\n", "error", error);
}

int pw_cmd_status(int argc, char **argv) {
  static const struct option opts[] = {
      {"state", required_argument, 0, 's'}, {"limit", required_argument, 0, 'l'}, REMOTE_LONG_OPTS, {0, 0, 0, 0}};
  common_opts co = {0};
  const char *state = NULL;
  int limit = 0, c, k;
  optind = 1;
  while ((c = getopt_long(argc, argv, "s:l:h", opts, NULL)) != -1) {
    if ((k = common_opt(&co, c, optarg))) {
      if (k < 0) return 2;
      continue;
    }
    switch (c) {
      case 's': state = optarg; break;
      case 'l': limit = atoi(optarg); break;
      case 'h': status_usage(stdout); return 0;
      default: status_usage(stderr); return 2;
    }
  }
  if (argc - optind > 1 || limit < 0 || (state && strspn(state, "abcdefghijklmnopqrstuvwxyz") != strlen(state))) {
    status_usage(stderr);
    return 2;
  }
  long long id = 0;
  if (optind < argc && parse_id(argv[optind], &id)) return 2;
  remote r;
  if (remote_init(&r, &co)) return 1;
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
  if (call(&r, "GET", target, NULL, 0, 0, &resp, &j)) return 1;
  if (r.json)
    print_raw(&resp);
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
          "  --json              one JSON line per step, then the final job\n" REMOTE_USAGE);
}

static void sleep_s(double s) {
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
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
  static const struct option opts[] = {{"interval", required_argument, 0, 'i'}, REMOTE_LONG_OPTS, {0, 0, 0, 0}};
  common_opts co = {0};
  double interval = 0.5;
  int c, k;
  optind = 1;
  while ((c = getopt_long(argc, argv, "i:h", opts, NULL)) != -1) {
    if ((k = common_opt(&co, c, optarg))) {
      if (k < 0) return 2;
      continue;
    }
    switch (c) {
      case 'i': interval = atof(optarg); break;
      case 'h': watch_usage(stdout); return 0;
      default: watch_usage(stderr); return 2;
    }
  }
  if (argc - optind != 1 || !(interval > 0) || interval > 3600) {
    watch_usage(stderr);
    return 2;
  }
  long long id;
  if (parse_id(argv[optind], &id)) return 2;
  remote r;
  if (remote_init(&r, &co)) return 1;
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
    int rc = call(&r, "GET", job_target, NULL, 0, reached ? CALL_QUIET_NET : 0, &resp, &job);
    if (rc == CALL_NET && reached) {
      double now = mono_now();
      if (down_since < 0) {
        down_since = now;
        if (bar_shown) putchar('\n'), bar_shown = 0;
        fprintf(stderr, "warning: %s; retrying for up to %.0f s\n", r.net_err, WATCH_RETRY_SECONDS);
      } else if (now - down_since > WATCH_RETRY_SECONDS) {
        fprintf(stderr, "error: %s\n", r.net_err);
        return 1;
      }
      sleep_s(interval);
      continue;
    }
    if (rc) {
      if (bar_shown) putchar('\n');
      return 1;
    }
    reached = 1;
    down_since = -1;
    pw_http_resp_free(&resp);
    const char *state = jstr(job, "state", "?");
    const char *status = jstr(job, "status", "");
    const json_t *p = json_object_get(job, "progress");
    long long total = jint(p, "total", 0);
    int terminal = !strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled");

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
    rc = call(&r, "GET", mt, NULL, 0, CALL_QUIET_NET, &resp, &m);
    if (rc == CALL_API) {
      json_decref(job);
      return 1;
    }
    if (rc == CALL_OK) {
      pw_http_resp_free(&resp);
      const json_t *row;
      size_t i;
      json_array_foreach(json_object_get(m, "metrics"), i, row) {
        long long step = jint(row, "step", -1);
        if (step < since) continue;
        since = step + 1;
        loss = jnum(row, "loss");
        rate = jnum(row, "tokens_per_s");
        if (r.json) {
          char *s = json_dumps(row, JSON_COMPACT | JSON_PRESERVE_ORDER);
          if (s) puts(s);
          free(s);
        } else if (!tty) {
          char a[32], b[32];
          printf("step %lld/%lld loss %s tokens/s %s\n", step + 1, total, fmt_loss(loss, a, 32),
                 fmt_rate(rate, b, 32));
        }
      }
      json_decref(m);
    }
    if (tty && !terminal && !strcmp(state, "running")) {
      char pb[40], a[32], b[32], e[32];
      long long step = jint(p, "step", 0);
      bar(pb, 30, step, total);
      printf("\r[%s] %lld/%lld loss %s  %s tok/s  eta %s\033[K", pb, step, total, fmt_loss(loss, a, 32),
             fmt_rate(rate, b, 32), fmt_duration(jnum(job, "eta_seconds"), e, 32));
      bar_shown = 1;
    }
    fflush(stdout);
    if (terminal) {
      if (bar_shown) putchar('\n');
      int ok = !strcmp(state, "succeeded");
      if (r.json) {
        char *s = json_dumps(job, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s) puts(s);
        free(s);
      } else if (ok) {
        char a[32];
        printf("job %lld succeeded: %lld/%lld steps, loss %s\n", id, jint(p, "step", 0), total,
               fmt_loss(jnum(job, "loss"), a, 32));
      } else {
        const char *error = jstr(job, "error", "");
        printf("job %lld %s after %lld/%lld steps\n", id, state, jint(p, "step", 0), total);
        fprintf(stderr, "error: job %lld %s%s%s\n", id, state, *error ? ": " : "", error);
      }
      fflush(stdout);
      json_decref(job);
      return ok ? 0 : 1;
    }
    json_decref(job);
    sleep_s(interval);
  }
}

/* ---- cancel --------------------------------------------------------------------------- */

static void cancel_usage(FILE *f) {
  fprintf(f, "usage: pipewright cancel ID [options]\n  stops a queued or running job\n" REMOTE_USAGE);
}

int pw_cmd_cancel(int argc, char **argv) {
  common_opts co = {0};
  int rc = parse_common_only(argc, argv, cancel_usage, &co);
  if (rc >= 0) return rc;
  if (argc - optind != 1) {
    cancel_usage(stderr);
    return 2;
  }
  long long id;
  if (parse_id(argv[optind], &id)) return 2;
  remote r;
  if (remote_init(&r, &co)) return 1;
  char target[64];
  snprintf(target, sizeof target, "/v1/jobs/%lld", id);
  pw_http_resp resp;
  json_t *j;
  if (call(&r, "DELETE", target, NULL, 0, 0, &resp, &j)) return 1;
  if (r.json)
    print_raw(&resp);
  else
    printf("job %lld %s\n", id, jstr(j, "state", "cancelled"));
  json_decref(j);
  pw_http_resp_free(&resp);
  return 0;
}

/* ---- workers -------------------------------------------------------------------------- */

static void workers_usage(FILE *f) {
  fprintf(f, "usage: pipewright workers [options]\n  the registered workers\n" REMOTE_USAGE);
}

int pw_cmd_workers(int argc, char **argv) {
  common_opts co = {0};
  int rc = parse_common_only(argc, argv, workers_usage, &co);
  if (rc >= 0) return rc;
  if (optind != argc) {
    workers_usage(stderr);
    return 2;
  }
  remote r;
  if (remote_init(&r, &co)) return 1;
  pw_http_resp resp;
  json_t *j;
  if (call(&r, "GET", "/v1/workers", NULL, 0, 0, &resp, &j)) return 1;
  if (r.json) {
    print_raw(&resp);
  } else {
    const json_t *ws = json_object_get(j, "workers"), *w;
    size_t i;
    int nw = 4, aw = 7;
    json_array_foreach(ws, i, w) {
      int n = (int)strlen(jstr(w, "name", "")), a = (int)strlen(jstr(w, "addr", ""));
      if (n > nw) nw = n > 32 ? 32 : n;
      if (a > aw) aw = a > 48 ? 48 : a;
    }
    printf("%-*s %-*s %-6s %-10s %-12s %s\n", nw, "NAME", aw, "ADDRESS", "STATE", "HEARTBEAT", "JOB", "THREADS");
    json_array_foreach(ws, i, w) {
      char age[32], hb[40], jb[40] = "-";
      snprintf(hb, sizeof hb, "%s ago", fmt_duration(jnum(w, "heartbeat_age"), age, 32));
      if (jint(w, "job", 0) > 0) {
        long long rank = jint(w, "rank", -1);
        if (rank >= 0)
          snprintf(jb, sizeof jb, "%lld (rank %lld)", jint(w, "job", 0), rank);
        else
          snprintf(jb, sizeof jb, "%lld", jint(w, "job", 0));
      }
      printf("%-*.*s %-*.*s %-6s %-10s %-12s %lld\n", nw, nw, jstr(w, "name", ""), aw, aw, jstr(w, "addr", ""),
             jstr(w, "state", "?"), hb, jb, jint(w, "threads", 0));
    }
    if (!json_array_size(ws)) printf("(no workers registered)\n");
  }
  json_decref(j);
  pw_http_resp_free(&resp);
  return 0;
}
