/* cost_auto: `plan --auto` — every (pp, schedule, virtual stages,
 * microbatches) the job could run with, planned and predicted under one
 * cost model, ranked by predicted step time under each rank's memory; and
 * for one host of many cores, the same over ranks x threads and dp, a
 * profile per thread count (pw_plan_auto_host). */
#include "cost_auto.h"

#include <stdlib.h>
#include <string.h>

static int by_time(const void *a, const void *b) {
  const pw_auto_row *x = a, *y = b;
  if (x->fits != y->fits) return y->fits - x->fits; /* fitting rows first */
  return (x->predicted > y->predicted) - (x->predicted < y->predicted);
}

/* One candidate: j's mesh and microbatches set; fills r (r->error when it
 * cannot run). */
static void try_one(const pw_job *job, const char *name, int pp, int m, const pw_cost_model *cm, const pw_budget *b,
                    pw_auto_row *r) {
  pw_job j = *job; /* shallow: only the mesh and schedule's scalars change */
  j.mesh.pp = pp;
  j.mesh.virtual_stages = 1;
  j.mesh.virtual_stages = pw_plan_virtual_stages(&j, name);
  j.mesh.placement_kind = PW_PLACEMENT_NONE;
  j.schedule.microbatches = m;
  j.schedule.custom_ranks = NULL;
  j.schedule.n_custom_ranks = 0;
  memset(r, 0, sizeof *r);
  snprintf(r->schedule, sizeof r->schedule, "%s", name);
  r->pp = pp;
  r->dp = j.mesh.dp;
  r->threads = cm && cm->profile ? cm->profile->threads : 1;
  r->V = j.mesh.virtual_stages;
  r->m = m;
  pw_err err = {0};
  pw_plan p;
  if (pw_plan_check_budget(&j, name, 0, b, &err) || pw_plan_build_costed(&j, name, cm, &p, &err)) {
    snprintf(r->error, sizeof r->error, "%s: %s", err.path, err.msg);
    return;
  }
  r->mb_size = p.mb_size;
  r->predicted = p.predicted;
  r->makespan = p.sim->makespan;
  r->step_end = p.step_end;
  r->bubble = p.sim->bubble_ratio;
  for (int k = 0; k < p.pp; k++)
    if (p.mem[k].total > r->peak_memory) r->peak_memory = p.mem[k].total;
  r->fits = !pw_plan_check_fit(&j, &p, b, &err);
  if (!r->fits) snprintf(r->error, sizeof r->error, "%s", err.msg);
  r->ok = 1;
  pw_plan_free(&p);
}

/* Room for the candidates of job (its dp) up to max_pp, appended to *out. */
static int grow(pw_auto_row **out, int n, int *cap, int more) {
  if (n + more <= *cap) return 0;
  int nc = (n + more) * 2;
  pw_auto_row *o = realloc(*out, sizeof *o * (size_t)nc);
  if (!o) return -1;
  *out = o;
  *cap = nc;
  return 0;
}

/* Every (pp <= max_pp, m, schedule) of job (its dp) under cm, the ones that
 * can run appended to *out. */
static int add_rows(const pw_job *job, const pw_cost_model *cm, const pw_budget *b, int max_pp, pw_auto_row **out,
                    int *n, int *cap) {
  int n_infos = 0;
  const pw_sched_info *infos = pw_sched_infos(&n_infos);
  int dp = job->mesh.dp, batch = job->train.batch_size;
  for (int pp = 1; pp <= max_pp; pp *= 2)
    for (int m = 1; m * dp <= batch; m *= 2) {
      if (batch % (m * dp)) continue;
      if (grow(out, *n, cap, n_infos)) return -1;
      for (int i = 0; i < n_infos; i++) {
        try_one(job, infos[i].name, pp, m, cm, b, &(*out)[*n]);
        if ((*out)[*n].ok) (*n)++; /* what cannot run at all is left out */
      }
    }
  return 0;
}

/* The ranking of out[0..n) into *rows, or the error when none can run or fits. */
static int finish(pw_auto_row *out, int n, const char *none, pw_auto_row **rows, int *n_rows, pw_err *err) {
  if (!n) {
    free(out);
    return pw_err_set(err, PW_ESPEC, "mesh.pp", "%s", none);
  }
  qsort(out, (size_t)n, sizeof *out, by_time);
  if (!out[0].fits) {
    int rc = pw_err_set(err, PW_EBUDGET, "mesh.pp", "no configuration fits the memory budget (smallest needs: %s)",
                        out[0].error);
    free(out);
    return rc;
  }
  *rows = out;
  *n_rows = n;
  return 0;
}

int pw_plan_auto_host(const pw_job *job, const pw_cost_profile *profs, int n_profs, int cores, const pw_budget *b,
                      int max_pp, pw_auto_row **rows, int *n_rows, pw_err *err) {
  *rows = NULL;
  *n_rows = 0;
  if (job->model.tmpl == PW_TEMPLATE_REGIONS)
    return pw_err_set(err, PW_ESPEC, "model.regions", "--auto plans one pipeline: a regions model's schedules are "
                      "its regions' own");
  if (n_profs < 1 || cores < 1) return pw_err_set(err, PW_EINVAL, "profile", "a host needs cores and a profile");
  pw_auto_row *out = NULL;
  int n = 0, cap = 0;
  for (int k = 0; k < n_profs; k++) {
    int t = profs[k].threads > 0 ? profs[k].threads : 1;
    for (int q = 0; q < k; q++)
      if (profs[q].threads == t) {
        free(out);
        return pw_err_set(err, PW_EINVAL, "profile", "two profiles of %d thread%s: give one per thread count", t,
                          t == 1 ? "" : "s");
      }
    pw_cost_model cm = {.profile = &profs[k], .cores = cores};
    for (int dp = 1; dp * t <= cores; dp *= 2) {
      if (job->train.batch_size % dp) continue;
      int pp_max = 1;
      while (pp_max * 2 <= max_pp && pp_max * 2 * dp * t <= cores) pp_max *= 2;
      pw_job j = *job; /* shallow: only the mesh's scalars change */
      j.mesh.dp = dp;
      j.mesh.tp = 1;
      if (add_rows(&j, &cm, b, pp_max, &out, &n, &cap)) {
        free(out);
        return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
      }
    }
  }
  char none[160];
  snprintf(none, sizeof none, "no layout of ranks x threads on %d cores can run this job", cores);
  return finish(out, n, none, rows, n_rows, err);
}

int pw_plan_auto(const pw_job *job, const pw_cost_model *cm, const pw_budget *b, int max_pp, pw_auto_row **rows,
                 int *n_rows, pw_err *err) {
  *rows = NULL;
  *n_rows = 0;
  if (job->model.tmpl == PW_TEMPLATE_REGIONS)
    return pw_err_set(err, PW_ESPEC, "model.regions", "--auto plans one pipeline: a regions model's schedules are "
                      "its regions' own");
  pw_auto_row *out = NULL;
  int n = 0, cap = 0;
  if (add_rows(job, cm, b, max_pp, &out, &n, &cap)) {
    free(out);
    return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  }
  char none[96];
  snprintf(none, sizeof none, "no pipeline of pp 1..%d can run this job", max_pp);
  return finish(out, n, none, rows, n_rows, err);
}

json_t *pw_auto_json(const pw_auto_row *rows, int n, const char *cost_model) {
  json_t *a = json_array();
  for (int k = 0; k < n; k++) {
    const pw_auto_row *r = &rows[k];
    json_t *o = json_pack("{s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:b}", "pp", r->pp, "dp", r->dp,
                          "threads", r->threads, "schedule",
                          r->schedule, "virtual_stages", r->V, "microbatches", r->m, "microbatch_size", r->mb_size,
                          "predicted", r->predicted, "makespan", r->makespan, "step_end", r->step_end, "bubble_ratio",
                          r->bubble, "peak_memory_bytes", (json_int_t)r->peak_memory, "fits", r->fits);
    if (!r->fits) json_object_set_new(o, "error", json_string(r->error));
    json_array_append_new(a, o);
  }
  json_t *chosen = n ? json_incref(json_array_get(a, 0)) : json_null();
  return json_pack("{s:s, s:o, s:o}", "cost_model", cost_model, "chosen", chosen, "rows", a);
}
