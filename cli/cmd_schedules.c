/* cmd_schedules: `pipewright schedules` — the schedule catalogue, or one
 * schedule's figures without a model (common/plan/analytics.h: what
 * GET /v1/schedules/{name}/analytics returns). Offline, like `plan`. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analytics.h"
#include "args.h"
#include "cli.h"
#include "json_short.h"
#include "schedule.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pipewright schedules [--json]                       the nine schedules\n"
          "       pipewright schedules NAME --pp P --m M [options]    one schedule's figures, no model\n"
          "  --pp P            pipeline ranks (1..%d)\n"
          "  --m M             microbatches (1..%d; pp * v * m at most %d)\n"
          "  --v V             stages per rank (default: the schedule's least, 1 flat, 2 the others)\n"
          "  --costs F,B,I,W   one microbatch's forward, backward, input- and weight-gradient time over\n"
          "                    one rank's layers (default 1,2,1,1); a virtual stage costs 1/V of it\n"
          "  --json            the same as JSON (GET /v1/schedules[/NAME/analytics?pp=P&m=M])\n"
          "  --help\n",
          PW_ANALYTICS_MAX_PP, PW_ANALYTICS_MAX_M, PW_ANALYTICS_MAX_PVM);
}

static int print_json(json_t *j) {
  char *s = j ? pw_json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  json_decref(j);
  if (!s) return 1;
  puts(s);
  free(s);
  return 0;
}

/* The catalogue, as GET /v1/schedules: name, family, aliases (when the
 * catalogue lists them) and constraints. */
static int list(int as_json) {
  int n;
  const pw_sched_info *in = pw_sched_infos(&n);
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(arr, pw_sched_info_json(&in[i]));
  if (as_json) return print_json(json_pack("{s:o}", "schedules", arr));
  size_t i;
  json_t *e;
  int any = 0; /* the aliases column only when the catalogue lists some */
  json_array_foreach(arr, i, e) any |= json_array_size(json_object_get(e, "aliases")) > 0;
  printf("%-26s %-12s %s%s\n", "schedule", "family", any ? "aliases                      " : "", "constraints");
  json_array_foreach(arr, i, e) {
    char al[128] = "";
    size_t k, len = 0;
    json_t *a;
    json_array_foreach(json_object_get(e, "aliases"), k, a)
      if (len < sizeof al)
        len += (size_t)snprintf(al + len, sizeof al - len, "%s%s", k ? ", " : "", json_string_value(a));
    printf("%-26s %-12s ", json_string_value(json_object_get(e, "name")), json_string_value(json_object_get(e, "family")));
    if (any) printf("%-28s ", al[0] ? al : "-");
    printf("%s\n", json_string_value(json_object_get(e, "constraints")));
  }
  json_decref(arr);
  printf("\n'pipewright schedules NAME --pp P --m M' shows one's bubble, steps, peaks and grid.\n");
  return 0;
}

static double get(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

static void print_analytics(const json_t *j) {
  int v = (int)json_integer_value(json_object_get(j, "virtual_stages"));
  const json_t *c = json_object_get(j, "costs"), *cf = json_object_get(j, "closed_form");
  printf("%s (%s): pp %d, %d stage%s per rank (%d stages), %d microbatches; costs F %g, B %g, I %g, W %g per "
         "rank's layers%s\n",
         json_string_value(json_object_get(j, "schedule")), json_string_value(json_object_get(j, "family")),
         (int)json_integer_value(json_object_get(j, "pp")), v, v == 1 ? "" : "s",
         (int)json_integer_value(json_object_get(j, "stages")),
         (int)json_integer_value(json_object_get(j, "microbatches")), get(c, "f"), get(c, "b"), get(c, "i"),
         get(c, "w"), v > 1 ? " (1/V each stage)" : "");
  printf("bubble %.4f", get(j, "bubble_ratio"));
  if (json_is_object(cf))
    printf(" (closed form %s = %.4f)", json_string_value(json_object_get(cf, "formula")), get(cf, "bubble_ratio"));
  printf(", total steps %g, makespan %g\n\n", get(j, "total_steps"), get(j, "makespan"));
  printf("%-5s %9s %9s %9s %9s %9s %8s\n", "rank", "busy", "idle", "peak act", "act units", "pending W", "actions");
  size_t i;
  json_t *r;
  json_array_foreach(json_object_get(j, "ranks"), i, r)
    printf("%-5d %9g %9g %9d %9g %9d %8d\n", (int)json_integer_value(json_object_get(r, "rank")), get(r, "busy"),
           get(r, "idle"), (int)json_integer_value(json_object_get(r, "peak_activations")), get(r, "activation_units"),
           (int)json_integer_value(json_object_get(r, "peak_pending_w")),
           (int)json_integer_value(json_object_get(r, "actions")));
  printf("\nper-rank actions (time flows right):\n%s", json_string_value(json_object_get(j, "grid")));
}

int pw_cmd_schedules(int argc, char **argv) {
  static const struct option opts[] = {{"pp", required_argument, 0, 'p'},    {"m", required_argument, 0, 'm'},
                                       {"v", required_argument, 0, 'v'},     {"costs", required_argument, 0, 'c'},
                                       {"json", no_argument, 0, 'J'},        {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *pp_s = NULL, *m_s = NULL, *v_s = NULL, *costs_s = NULL;
  int as_json = 0, c;
  optind = 1;
  while ((c = pw_getopt(argc, argv, "p:m:v:c:Jh", opts)) != -1) {
    switch (c) {
      case 'p': pp_s = optarg; break;
      case 'm': m_s = optarg; break;
      case 'v': v_s = optarg; break;
      case 'c': costs_s = optarg; break;
      case 'J': as_json = 1; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (pw_args_operands(argc, argv, 0, 1, NULL)) {
    usage(stderr);
    return 2;
  }
  const char *name = optind < argc ? argv[optind] : NULL;
  if (!name) {
    if (pp_s || m_s || v_s || costs_s) {
      pw_cli_usage_error("--pp, --m, --v and --costs need a schedule NAME");
      usage(stderr);
      return 2;
    }
    return list(as_json);
  }
  int pp, m, v = pw_analytics_default_v(name);
  double costs[4];
  pw_err err = {0};
  char buf[600];
  if (pw_args_required(pp_s, "--pp P") || pw_args_required(m_s, "--m M") ||
      pw_arg_int("--pp", pp_s, 1, PW_ANALYTICS_MAX_PP, &pp) || pw_arg_int("--m", m_s, 1, PW_ANALYTICS_MAX_M, &m) ||
      (v_s && pw_arg_int("--v", v_s, 1, PW_ANALYTICS_MAX_V, &v))) {
    usage(stderr);
    return 2;
  }
  if (costs_s && pw_analytics_costs_parse(costs_s, costs, &err)) {
    pw_cli_usage_error("--%s: %s", err.path, err.msg);
    return 2;
  }
  json_t *j = pw_sched_analytics_json(name, pp, m, v, costs_s ? costs : NULL, &err);
  if (!j) {
    /* the parameter as this command spells it: --pp, --m, --v, or the NAME */
    if (!strcmp(err.path, "name"))
      pw_cli_usage_error("%s ('pipewright schedules' lists them)", err.msg);
    else if (err.path[0])
      pw_cli_usage_error("--%s: %s", err.path, err.msg);
    else
      fprintf(stderr, "error: %s\n", pw_err_str(&err, buf, sizeof buf));
    return err.code == PW_ENOMEM ? 1 : 2;
  }
  if (as_json) return print_json(j);
  print_analytics(j);
  json_decref(j);
  return 0;
}
