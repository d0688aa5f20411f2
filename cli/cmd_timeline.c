/* cmd_timeline: `pipewright timeline ID [--step N] [-o FILE]` — the
 * measured per-rank actions of a sampled step (GET
 * /v1/jobs/ID/timeline, api/openapi.yaml). By default a short summary:
 * the measured bubble next to the plan's, and each rank's busy time.
 * With -o, the answer saved to FILE (a Chrome trace for Perfetto unless
 * --format json), and only an HTTP 200's: it is written to FILE.tmp and
 * renamed, so an error never leaves a FILE holding the error, nor a
 * truncated one. Without --step, the newest sampled step. Exit codes: 0,
 * 1 an error (a step not sampled: the coordinator names those that are),
 * 2 bad usage. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "remote.h"

static void timeline_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright timeline ID [options]\n"
          "  a sampled step's measured per-rank actions: the bubble next to the plan's, each\n"
          "  rank's busy time\n"
          "  --step N            the step (default: the newest sampled)\n"
          "  -o, --output FILE   save the answer to FILE instead (only a successful one)\n"
          "  --format F          chrome (a trace for Perfetto; the default with -o) or json (the\n"
          "                      timeline as the API gives it); without -o, printed as it is\n" PW_REMOTE_USAGE);
}

/* "12.3 ms" / "1.23 s" */
static const char *fmt_secs(double s, char *buf, int cap) {
  snprintf(buf, (size_t)cap, s >= 1 ? "%.2f s" : "%.2f ms", s >= 1 ? s : s * 1e3);
  return buf;
}

static const char *fmt_pct(const json_t *v, char *buf, int cap) {
  if (!json_is_number(v)) return snprintf(buf, (size_t)cap, "-"), buf;
  snprintf(buf, (size_t)cap, "%.1f%%", json_number_value(v) * 100);
  return buf;
}

/* The summary of a timeline answer (openapi.yaml's Timeline). */
/* F, B, I or W: a pipeline action. The collectives a worker reports with
 * them (T a tensor-parallel all-reduce, inside those; D the data-parallel
 * exchange at the step's end) are summed apart, and the bubble leaves them
 * out, as the API's does. */
static int pipeline_action(const json_t *a) {
  const char *k = pw_jstr(a, "kind", "");
  return json_is_integer(json_object_get(a, "kind")) || (k[0] && strchr("FBIW", k[0]));
}

static void print_summary(long long id, const json_t *tl) {
  const json_t *bubble = json_object_get(tl, "bubble"), *planned = json_object_get(tl, "planned");
  char a[32], b[32], c[32];
  const char *sched = pw_jstr(planned, "schedule", "?");
  if (!json_is_integer(json_object_get(tl, "step"))) {
    printf("job %lld: no step sampled yet\nbubble  planned %s (%s)\n", id,
           fmt_pct(json_object_get(bubble, "planned"), a, 32), sched);
    return;
  }
  size_t ns = json_array_size(json_object_get(tl, "steps"));
  printf("job %lld step %lld (%zu sampled step%s)\n", id, pw_jint(tl, "step", -1), ns, ns == 1 ? "" : "s");
  printf("bubble  measured %s, planned %s (%s)\n", fmt_pct(json_object_get(bubble, "measured"), a, 32),
         fmt_pct(json_object_get(bubble, "planned"), b, 32), sched);
  if (json_is_number(json_object_get(bubble, "planned_shared"))) /* ranks share a host's cores */
    printf("        planned on shared cores %s: %s\n", fmt_pct(json_object_get(bubble, "planned_shared"), c, 32),
           pw_jstr(json_object_get(tl, "contention"), "message", "ranks share cores"));
  /* the step's span over every rank: each rank's idle is against it, as
   * the measured bubble is */
  double t0 = INFINITY, t1 = -INFINITY;
  const json_t *rk, *act;
  size_t i, k;
  json_array_foreach(json_object_get(tl, "ranks"), i, rk) json_array_foreach(json_object_get(rk, "actions"), k, act) {
    if (!pipeline_action(act)) continue;
    t0 = fmin(t0, pw_jnum(act, "start"));
    t1 = fmax(t1, pw_jnum(act, "end"));
  }
  double span = t1 > t0 ? t1 - t0 : 0;
  printf("step    %s measured\n", fmt_secs(span, a, 32));
  printf("%-5s %8s %12s %7s\n", "RANK", "ACTIONS", "BUSY", "IDLE");
  json_array_foreach(json_object_get(tl, "ranks"), i, rk) {
    double busy = 0, coll[2] = {0, 0}; /* T, D */
    size_t n = 0;
    json_array_foreach(json_object_get(rk, "actions"), k, act) {
      double d = pw_jnum(act, "end") - pw_jnum(act, "start");
      if (!pipeline_action(act)) {
        if (d > 0) coll[pw_jstr(act, "kind", "")[0] == 'D'] += d;
        continue;
      }
      n++;
      if (d > 0) busy += d;
    }
    snprintf(c, sizeof c, span > 0 ? "%.1f%%" : "-", span > 0 ? 100 * (1 - busy / span) : 0);
    printf("%-5lld %8zu %12s %7s", pw_jint(rk, "rank", -1), n, fmt_secs(busy, b, 32), c);
    if (coll[0] > 0 || coll[1] > 0)
      printf("  tp all-reduce %s, dp exchange %s", fmt_secs(coll[0], a, 32), fmt_secs(coll[1], b, 32));
    printf("\n");
  }
}

/* Writes len bytes to path through path.tmp and a rename: path is
 * untouched unless all of them were written. */
static int save(const char *path, const char *data, size_t len) {
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
    fprintf(stderr, "error: %s: name too long\n", path);
    return 1;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "error: %s: %s\n", tmp, strerror(errno));
    return 1;
  }
  size_t off = 0;
  while (off < len) {
    ssize_t n = write(fd, data + off, len - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += (size_t)n;
  }
  int e = off < len ? errno : 0;
  if (close(fd) && !e) e = errno;
  if (!e && rename(tmp, path)) e = errno;
  if (e) {
    fprintf(stderr, "error: %s: %s\n", off < len ? tmp : path, strerror(e ? e : EIO));
    unlink(tmp);
    return 1;
  }
  return 0;
}

int pw_cmd_timeline(int argc, char **argv) {
  static const struct option opts[] = {{"step", required_argument, 0, 's'},
                                       {"output", required_argument, 0, 'o'},
                                       {"format", required_argument, 0, 'F'},
                                       PW_REMOTE_LONG_OPTS,
                                       {0, 0, 0, 0}};
  pw_remote_opts co = {0};
  long long step = -1;
  const char *out = NULL, *format = NULL;
  int c;
  optind = 1;
  while ((c = pw_remote_getopt(argc, argv, "o:h", opts, &co)) != -1) {
    switch (c) {
      case 's':
        if (pw_arg_ll("--step", optarg, 0, INT_MAX, &step)) return timeline_usage(stderr), 2;
        break;
      case 'o': out = optarg; break;
      case 'F':
        if (strcmp(optarg, "chrome") && strcmp(optarg, "json")) {
          pw_cli_usage_error("--format: '%s' is not chrome or json", optarg);
          return timeline_usage(stderr), 2;
        }
        format = optarg;
        break;
      case 'h': timeline_usage(stdout); return 0;
      default: timeline_usage(stderr); return 2;
    }
  }
  long long id;
  if (pw_cli_job_operand(argc, argv, &id)) {
    timeline_usage(stderr);
    return 2;
  }
  if (out && !*out) {
    pw_cli_usage_error("-o: the file name is empty");
    return timeline_usage(stderr), 2;
  }
  if (out && !format) format = "chrome";
  pw_remote r;
  if (pw_remote_init(&r, &co)) return 1;
  char target[128], st[40] = "";
  if (step >= 0) snprintf(st, sizeof st, "step=%lld&", step);
  snprintf(target, sizeof target, "/v1/jobs/%lld/timeline?%sformat=%s", id, st, format ? format : "json");
  pw_http_resp resp;
  json_t *j;
  /* parsed even when only saved: a 200 that is not JSON is not saved */
  if (pw_remote_call(&r, "GET", target, NULL, 0, 0, &resp, &j)) return 1;
  int rc = 0;
  if (out) {
    rc = save(out, resp.body, resp.len);
    if (!rc && !strcmp(format, "chrome"))
      printf("wrote %s: %zu trace events\n", out, json_array_size(json_object_get(j, "traceEvents")));
    else if (!rc)
      printf("wrote %s\n", out);
  } else if (format || r.json) {
    pw_remote_print_raw(&resp);
  } else {
    print_summary(id, j);
  }
  json_decref(j);
  pw_http_resp_free(&resp);
  return rc;
}
