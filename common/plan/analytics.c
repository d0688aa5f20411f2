/* analytics: a schedule's model-free figures (analytics.h): its plan
 * replayed by the simulator at per-stage costs derived from four numbers,
 * and the published closed-form bubble where the schedule has one. Every
 * timed figure comes from sim.c; this file only sets the costs and names
 * what went wrong by the caller's parameter names. */
#include "analytics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"
#include "sim.h"
#include "spec.h"
#include "suggest.h"

const double pw_analytics_unit_costs[4] = {1, 2, 1, 1};

int pw_analytics_costs_parse(const char *text, double costs[4], pw_err *err) {
  static const char *const names[4] = {"F", "B", "I", "W"};
  const char *p = text ? text : "";
  for (int k = 0; k < 4; k++) {
    /* decimal only: strtod would take "inf", "nan" and hex too */
    size_t n = strcspn(p, ",");
    if (n == 0 || n > 32 || strspn(p, "0123456789.eE+-") < n)
      return pw_err_set(err, PW_EINVAL, "costs",
                        "want four numbers F,B,I,W such as 1,2,1,1 (%s is \"%.*s\")", names[k],
                        (int)(n > 32 ? 32 : n), p);
    char num[40], *end;
    memcpy(num, p, n);
    num[n] = '\0';
    errno = 0;
    double x = strtod(num, &end);
    if (*end || errno == ERANGE || !isfinite(x) || !(x > 0) || x > PW_ANALYTICS_MAX_COST)
      return pw_err_set(err, PW_EINVAL, "costs", "%s must be a number above 0 and at most %g (got \"%s\")",
                        names[k], PW_ANALYTICS_MAX_COST, num);
    costs[k] = x;
    p += n;
    if (k < 3 && *p++ != ',')
      return pw_err_set(err, PW_EINVAL, "costs", "want four numbers F,B,I,W such as 1,2,1,1 (got %d)", k + 1);
  }
  if (*p) return pw_err_set(err, PW_EINVAL, "costs", "want four numbers F,B,I,W such as 1,2,1,1 (more given)");
  return 0;
}

int pw_analytics_default_v(const char *name) {
  const pw_sched_info *in = pw_sched_info_find(pw_schedule_resolve(name));
  return in ? in->min_v : 1;
}

/* ---- closed forms ------------------------------------------------------ */

/* The bubble the literature gives at unit costs, where it applies: flat
 * GPipe and 1F1B (p-1)/(m+p-1) (Eager 1F1B's deeper warm-up adds no idle
 * time when links are free); ZeroBubble H1 (p-1)/(3m+p-1) for m >= p;
 * Megatron's interleaved 1F1B (p-1)/(vm+p-1); DualPipeV's makespan
 * 6m + 2(p-1) stage units over 6m of work, i.e. (p-1)/(3m+p-1). NULL when
 * the schedule has none (or none at these parameters). */
static const char *closed_form(const char *name, int p, int m, int v, double *bubble) {
  if (!strcmp(name, "gpipe") || !strcmp(name, "1f1b") || !strcmp(name, "eager1f1b")) {
    *bubble = (double)(p - 1) / (m + p - 1);
    return "(p-1)/(m+p-1)";
  }
  if ((!strcmp(name, "zb-h1") && m >= p) || !strcmp(name, "dualpipev")) {
    *bubble = (double)(p - 1) / (3.0 * m + p - 1);
    return "(p-1)/(3m+p-1)";
  }
  if (!strcmp(name, "interleaved-1f1b")) {
    *bubble = (double)(p - 1) / ((double)v * m + p - 1);
    return "(p-1)/(vm+p-1)";
  }
  return NULL;
}

/* ---- the figures ------------------------------------------------------- */

/* pw_sched_check's spec paths as this call's parameter names. */
static void rename_path(pw_err *err) {
  static const struct {
    const char *spec, *param;
  } map[] = {{"mesh.pp", "pp"}, {"mesh.virtual_stages", "v"}, {"schedule.microbatches", "m"}, {"schedule.name", "name"}};
  if (!err) return;
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (!strcmp(err->path, map[i].spec)) {
      snprintf(err->path, sizeof err->path, "%s", map[i].param);
      return;
    }
}

static int check_bounds(int pp, int m, int v, pw_err *err) {
  if (pp < 1 || pp > PW_ANALYTICS_MAX_PP)
    return pw_err_set(err, PW_ESPEC, "pp", "must be in 1..%d (got %d)", PW_ANALYTICS_MAX_PP, pp);
  if (m < 1 || m > PW_ANALYTICS_MAX_M)
    return pw_err_set(err, PW_ESPEC, "m", "must be in 1..%d (got %d)", PW_ANALYTICS_MAX_M, m);
  if (v < 1 || v > PW_ANALYTICS_MAX_V)
    return pw_err_set(err, PW_ESPEC, "v", "must be in 1..%d (got %d)", PW_ANALYTICS_MAX_V, v);
  if ((long)pp * v * m > PW_ANALYTICS_MAX_PVM)
    return pw_err_set(err, PW_ESPEC, "m", "pp * v * m = %ld is too large (limit %d)", (long)pp * v * m,
                      PW_ANALYTICS_MAX_PVM);
  return 0;
}

static json_t *result_json(const pw_sched *s, const pw_sim_result *r, const pw_sched_info *info, const double c[4],
                           int unit, char *grid) {
  int v = s->V;
  json_t *j = json_object(), *ranks = json_array(), *cf = json_null();
  json_object_set_new(j, "schedule", json_string(s->name));
  json_object_set_new(j, "family", json_string(info->family));
  json_object_set_new(j, "pp", json_integer(s->pp));
  json_object_set_new(j, "virtual_stages", json_integer(v));
  json_object_set_new(j, "stages", json_integer(s->S));
  json_object_set_new(j, "microbatches", json_integer(s->m));
  json_object_set_new(j, "costs", json_pack("{s:f, s:f, s:f, s:f}", "f", c[0], "b", c[1], "i", c[2], "w", c[3]));
  json_object_set_new(j, "makespan", json_real(r->makespan));
  json_object_set_new(j, "total_steps", json_real(r->makespan * v));
  json_object_set_new(j, "bubble_ratio", json_real(r->bubble_ratio));
  double b;
  const char *formula = unit ? closed_form(s->name, s->pp, s->m, v, &b) : NULL;
  if (formula) {
    json_decref(cf);
    cf = json_pack("{s:s, s:f}", "formula", formula, "bubble_ratio", b);
  }
  json_object_set_new(j, "closed_form", cf);
  for (int k = 0; k < r->pp; k++)
    json_array_append_new(
        ranks, json_pack("{s:i, s:f, s:f, s:i, s:f, s:i, s:i}", "rank", k, "busy", r->busy[k], "idle", r->idle[k],
                         "peak_activations", r->peak_act[k], "activation_units", (double)r->peak_act[k] / v,
                         "peak_pending_w", r->peak_pending_w[k], "actions", r->rank_first[k + 1] - r->rank_first[k]));
  json_object_set_new(j, "ranks", ranks);
  json_object_set_new(j, "grid", json_string(grid));
  return j;
}

json_t *pw_sched_analytics_json(const char *name, int pp, int m, int v, const double costs[4], pw_err *err) {
  const char *canon = pw_schedule_resolve(name);
  const pw_sched_info *info = pw_sched_info_find(canon);
  if (!info) {
    char near[96];
    pw_err_set(err, PW_ENOENT, "name", "unknown schedule \"%.64s\"%s", name ? name : "",
               pw_suggest_text(name ? name : "", pw_schedule_names, pw_n_schedule_names, "", near, sizeof near));
    return NULL;
  }
  const double *c = costs ? costs : pw_analytics_unit_costs;
  for (int k = 0; k < 4; k++)
    if (!isfinite(c[k]) || !(c[k] > 0) || c[k] > PW_ANALYTICS_MAX_COST) {
      pw_err_set(err, PW_EINVAL, "costs", "each cost must be above 0 and at most %g (got %g)", PW_ANALYTICS_MAX_COST,
                 c[k]);
      return NULL;
    }
  pw_sched *s = NULL;
  if (check_bounds(pp, m, v, err) || pw_sched_build(canon, pp, v, m, 0, &s, err)) {
    rename_path(err);
    return NULL;
  }
  /* every stage costs 1/V of a rank's layers (analytics.h) */
  int S = s->S;
  double *per = malloc(4 * (size_t)S * sizeof(double));
  pw_sim_result *r = NULL;
  char *grid = NULL;
  json_t *j = NULL;
  if (!per) goto oom;
  for (int k = 0; k < 4; k++)
    for (int st = 0; st < S; st++) per[k * S + st] = c[k] / v;
  pw_sim_costs sc = {.f = per, .b = per + S, .i = per + 2 * S, .w = per + 3 * S};
  if (pw_sim_run(s, &sc, &r, err)) goto out; /* a catalogue plan always replays; kept for PW_ENOMEM */
  int len = pw_sched_grid(s, r, NULL, 0);
  if (len < 0 || !(grid = malloc((size_t)len + 1))) goto oom;
  pw_sched_grid(s, r, grid, (size_t)len + 1);
  int unit = 1;
  for (int k = 0; k < 4; k++) unit &= c[k] == pw_analytics_unit_costs[k];
  if (!(j = result_json(s, r, info, c, unit, grid))) goto oom;
  goto out;
oom:
  pw_err_set(err, PW_ENOMEM, "", "out of memory");
out:
  free(grid);
  free(per);
  pw_sim_result_free(r);
  pw_sched_free(s);
  return j;
}
