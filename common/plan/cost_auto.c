/* cost_auto: `plan --auto` — every (pp, schedule, virtual stages,
 * microbatches) the job could run with, planned and predicted under one
 * cost model, ranked by predicted step time under each rank's memory. */
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

int pw_plan_auto(const pw_job *job, const pw_cost_model *cm, const pw_budget *b, int max_pp, pw_auto_row **rows,
                 int *n_rows, pw_err *err) {
  *rows = NULL;
  *n_rows = 0;
  if (job->model.tmpl == PW_TEMPLATE_REGIONS)
    return pw_err_set(err, PW_ESPEC, "model.regions", "--auto plans one pipeline: a regions model's schedules are "
                      "its regions' own");
  int n_infos = 0;
  const pw_sched_info *infos = pw_sched_infos(&n_infos);
  int dp = job->mesh.dp, batch = job->train.batch_size, cap = 0;
  for (int pp = 1; pp <= max_pp; pp *= 2)
    for (int m = 1; m * dp <= batch; m *= 2) cap += n_infos;
  pw_auto_row *out = calloc((size_t)(cap ? cap : 1), sizeof *out);
  if (!out) return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  int n = 0;
  for (int pp = 1; pp <= max_pp; pp *= 2)
    for (int m = 1; m * dp <= batch; m *= 2) {
      if (batch % (m * dp)) continue;
      for (int i = 0; i < n_infos; i++) {
        try_one(job, infos[i].name, pp, m, cm, b, &out[n]);
        if (out[n].ok) n++; /* what cannot run at all is left out */
      }
    }
  if (!n) {
    free(out);
    return pw_err_set(err, PW_ESPEC, "mesh.pp", "no pipeline of pp 1..%d can run this job", max_pp);
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

json_t *pw_auto_json(const pw_auto_row *rows, int n, const char *cost_model) {
  json_t *a = json_array();
  for (int k = 0; k < n; k++) {
    const pw_auto_row *r = &rows[k];
    json_t *o = json_pack("{s:i, s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:b}", "pp", r->pp, "schedule",
                          r->schedule, "virtual_stages", r->V, "microbatches", r->m, "microbatch_size", r->mb_size,
                          "predicted", r->predicted, "makespan", r->makespan, "step_end", r->step_end, "bubble_ratio",
                          r->bubble, "peak_memory_bytes", (json_int_t)r->peak_memory, "fits", r->fits);
    if (!r->fits) json_object_set_new(o, "error", json_string(r->error));
    json_array_append_new(a, o);
  }
  json_t *chosen = n ? json_incref(json_array_get(a, 0)) : json_null();
  return json_pack("{s:s, s:o, s:o}", "cost_model", cost_model, "chosen", chosen, "rows", a);
}
