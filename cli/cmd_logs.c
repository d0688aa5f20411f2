/* cmd_logs: `pipewright logs ID [--follow]` — a job's events (GET
 * /v1/jobs/ID/events?since=N, api/openapi.yaml): every state change with
 * its time and reason, and the coordinator's other notes, one line each.
 * With --follow it polls until the job ends, asking only for the events
 * after the last one printed, so each is printed once. Exit codes: 0
 * (with --follow: the job succeeded), 1 an error (or a followed job that
 * failed or was cancelled), 2 bad usage. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_short.h"
#include "args.h"
#include "cli.h"
#include "remote.h"

static void logs_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright logs ID [options]\n"
          "  the job's events, oldest first: time, kind, message\n"
          "  --since N           only the events after event N (default 0: all)\n"
          "  --follow            keep polling until the job ends; exit 0 if it succeeded, 1 if not\n"
          "  --interval SECS     time between polls with --follow (default 1)\n"
          "  --json              one JSON line per event, as the API gives it\n" PW_REMOTE_USAGE);
}

/* Prints the events after *since and moves *since past them. */
static int print_events(pw_remote *r, long long id, long long *since) {
  char target[96];
  snprintf(target, sizeof target, "/v1/jobs/%lld/events?since=%lld", id, *since);
  pw_http_resp resp;
  json_t *j;
  if (pw_remote_call(r, "GET", target, NULL, 0, 0, &resp, &j)) return 1;
  pw_http_resp_free(&resp);
  const json_t *ev;
  size_t i;
  json_array_foreach(json_object_get(j, "events"), i, ev) {
    long long eid = pw_jint(ev, "id", -1);
    if (eid <= *since) continue; /* never twice, whatever the server sends */
    *since = eid;
    if (r->json) {
      char *s = pw_json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
      if (s) puts(s);
      free(s);
    } else {
      char t[64];
      printf("%s  %-10s %s\n", pw_cli_fmt_time(pw_jnum(ev, "time"), t, 64), pw_jstr(ev, "kind", "-"),
             pw_jstr(ev, "message", ""));
    }
  }
  fflush(stdout);
  json_decref(j);
  return 0;
}

int pw_cmd_logs(int argc, char **argv) {
  static const struct option opts[] = {{"since", required_argument, 0, 's'},
                                       {"follow", no_argument, 0, 'f'},
                                       {"interval", required_argument, 0, 'i'},
                                       PW_REMOTE_LONG_OPTS,
                                       {0, 0, 0, 0}};
  pw_remote_opts co = {0};
  long long since = 0;
  double interval = 1;
  int follow = 0, c;
  optind = 1;
  while ((c = pw_remote_getopt(argc, argv, "s:fi:h", opts, &co)) != -1) {
    switch (c) {
      case 's':
        if (pw_arg_ll("--since", optarg, 0, LLONG_MAX, &since)) return logs_usage(stderr), 2;
        break;
      case 'f': follow = 1; break;
      case 'i':
        if (pw_arg_num("--interval", optarg, 0, 3600, &interval)) return logs_usage(stderr), 2;
        break;
      case 'h': logs_usage(stdout); return 0;
      default: logs_usage(stderr); return 2;
    }
  }
  long long id;
  if (pw_cli_job_operand(argc, argv, &id)) {
    logs_usage(stderr);
    return 2;
  }
  pw_remote r;
  if (pw_remote_init(&r, &co)) return 1;
  if (!follow) return print_events(&r, id, &since);
  char job_target[64];
  snprintf(job_target, sizeof job_target, "/v1/jobs/%lld", id);
  for (;;) {
    /* the state before the events: once it has ended, the events read
     * after it are the last */
    pw_http_resp resp;
    json_t *job;
    if (pw_remote_call(&r, "GET", job_target, NULL, 0, 0, &resp, &job)) return 1;
    pw_http_resp_free(&resp);
    char state[32];
    snprintf(state, sizeof state, "%s", pw_jstr(job, "state", "?"));
    json_decref(job);
    if (print_events(&r, id, &since)) return 1;
    if (pw_cli_job_ended(state)) return strcmp(state, "succeeded") ? 1 : 0;
    pw_cli_sleep(interval);
  }
}
