/* plan: model -> schedule -> partition -> simulation, and the plan's JSON. */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

int pw_plan_build(const pw_job *job, const char *schedule, pw_plan *p, pw_err *err) {
  memset(p, 0, sizeof *p);
  const char *name = schedule ? schedule : job->schedule.name;
  p->pp = job->mesh.pp;
  p->dp = job->mesh.dp;
  p->V = job->mesh.virtual_stages;
  p->m = job->schedule.microbatches;
  if (job->train.batch_size % (p->m * p->dp))
    return pw_err_set(err, PW_ESPEC, "train.batch_size",
                      "must be divisible by schedule.microbatches * mesh.dp (%d %% %d != 0)",
                      job->train.batch_size, p->m * p->dp);
  p->mb_size = job->train.batch_size / (p->m * p->dp);
  int rc = pw_model_build(&job->model, &p->model, err);
  if (rc) return rc;
  rc = pw_sched_build(name, p->pp, p->V, p->m, job->mode == PW_MODE_FORWARD, &p->sched, err);
  if (rc) goto fail;
  p->S = p->sched->S;
  rc = pw_partition_build(&p->model, &job->partition, p->S, &p->part, err);
  if (rc) goto fail;
  int S = p->S;
  p->cost_f = calloc((size_t)S, sizeof(double));
  p->cost_i = calloc((size_t)S, sizeof(double));
  p->cost_w = calloc((size_t)S, sizeof(double));
  p->cost_b = calloc((size_t)S, sizeof(double));
  p->act_bytes = calloc((size_t)(S > 1 ? S - 1 : 1), sizeof(double));
  if (!p->cost_f || !p->cost_i || !p->cost_w || !p->cost_b || !p->act_bytes) {
    rc = pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
    goto fail;
  }
  /* Measured layer times replace FLOPs: split them F:I:W in the FLOP ratio. */
  for (int s = 0; s < S; s++) {
    const pw_stage *st = &p->part.stages[s];
    double fl = st->flops_f + st->flops_i + st->flops_w;
    double scale = job->partition.layer_times && fl > 0 ? st->cost / fl : 1.0 / PW_PLAN_FLOPS_PER_S;
    if (job->partition.layer_times && fl > 0) scale /= p->mb_size; /* layer_times are per microbatch */
    p->cost_f[s] = st->flops_f * p->mb_size * scale;
    p->cost_i[s] = st->flops_i * p->mb_size * scale;
    p->cost_w[s] = st->flops_w * p->mb_size * scale;
    p->cost_b[s] = p->cost_i[s] + p->cost_w[s];
  }
  for (int e = 0; e < p->part.n_edges; e++) {
    const pw_stage_edge *ed = &p->part.edges[e];
    if (ed->dst == ed->src + 1) p->act_bytes[ed->src] += (double)ed->bytes * p->mb_size;
  }
  pw_sim_costs c = {.f = p->cost_f, .b = p->cost_b, .i = p->cost_i, .w = p->cost_w,
                    .act_bytes = S > 1 ? p->act_bytes : NULL, .latency = PW_PLAN_LINK_LATENCY,
                    .bandwidth = PW_PLAN_LINK_BW};
  rc = pw_sim_run(p->sched, &c, &p->sim, err);
  if (rc) goto fail;
  return 0;
fail:
  pw_plan_free(p);
  return rc;
}

void pw_plan_free(pw_plan *p) {
  pw_sim_result_free(p->sim);
  pw_sched_free(p->sched);
  pw_partition_free(&p->part);
  pw_model_free(&p->model);
  free(p->cost_f);
  free(p->cost_i);
  free(p->cost_w);
  free(p->cost_b);
  free(p->act_bytes);
  memset(p, 0, sizeof *p);
}

int pw_plan_rank_stages(const pw_plan *p, int r, int *stages, int cap) {
  int n = 0;
  for (int s = 0; s < p->S; s++)
    if (p->sched->stage_to_rank[s] == r) {
      if (n < cap) stages[n] = s;
      n++;
    }
  return n;
}

json_t *pw_plan_json(const pw_job *job, const pw_plan *p) {
  json_t *s2r = json_array();
  for (int s = 0; s < p->S; s++) json_array_append_new(s2r, json_integer(p->sched->stage_to_rank[s]));
  json_t *part = pw_partition_json(&p->model, &p->part, p->mb_size);
  /* annotate each stage with its rank */
  json_t *stages = json_object_get(part, "stages");
  for (size_t i = 0; i < json_array_size(stages); i++)
    json_object_set_new(json_array_get(stages, i), "rank", json_integer(p->sched->stage_to_rank[i]));
  json_t *costs = json_array();
  for (int s = 0; s < p->S; s++)
    json_array_append_new(costs, json_pack("{s:i, s:f, s:f, s:f, s:f}", "stage", s, "f", p->cost_f[s], "b",
                                           p->cost_b[s], "i", p->cost_i[s], "w", p->cost_w[s]));
  int len = pw_sched_grid(p->sched, p->sim, NULL, 0);
  char *grid = len >= 0 ? malloc((size_t)len + 1) : NULL;
  if (grid) pw_sched_grid(p->sched, p->sim, grid, (size_t)len + 1);
  json_t *out = json_pack(
      "{s:s, s:s, s:{s:i, s:i, s:i}, s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:s}", "job", job->name, "schedule",
      p->sched->name, "mesh", "pp", p->pp, "dp", p->dp, "virtual_stages", p->V, "stages", p->S, "microbatches", p->m,
      "microbatch_size", p->mb_size, "partition", part, "stage_to_rank", s2r, "costs", costs, "plan",
      pw_sched_to_json(p->sched), "analytics", pw_sim_result_json(p->sim), "grid", grid ? grid : "");
  free(grid);
  return out;
}

json_t *pw_plan_compare_json(const pw_job *job) {
  json_t *rows = json_array();
  int n = 0;
  const pw_sched_info *infos = pw_sched_infos(&n);
  for (int i = 0; i < n; i++) {
    pw_job j = *job; /* shallow: only mesh.virtual_stages changes */
    int V = job->mesh.virtual_stages;
    j.mesh.virtual_stages = infos[i].max_v == 1 ? 1 : (V > 2 ? V : 2);
    if (infos[i].min_v == infos[i].max_v) j.mesh.virtual_stages = infos[i].min_v;
    pw_plan p;
    pw_err err = {0};
    json_t *row;
    if (pw_plan_build(&j, infos[i].name, &p, &err) == 0) {
      int peak = 0, pend = 0, acts = 0;
      for (int r = 0; r < p.pp; r++) {
        if (p.sim->peak_act[r] > peak) peak = p.sim->peak_act[r];
        if (p.sim->peak_pending_w[r] > pend) pend = p.sim->peak_pending_w[r];
        acts += p.sched->n_actions[r];
      }
      row = json_pack("{s:s, s:b, s:i, s:i, s:f, s:f, s:i, s:i, s:i}", "schedule", infos[i].name, "ok", 1,
                      "virtual_stages", p.V, "stages", p.S, "makespan", p.sim->makespan, "bubble_ratio",
                      p.sim->bubble_ratio, "peak_activations", peak, "peak_pending_w", pend, "actions", acts);
      pw_plan_free(&p);
    } else {
      char buf[600];
      row = json_pack("{s:s, s:b, s:i, s:s}", "schedule", infos[i].name, "ok", 0, "virtual_stages",
                      j.mesh.virtual_stages, "error", pw_err_str(&err, buf, sizeof buf));
    }
    json_array_append_new(rows, row);
  }
  return json_pack("{s:s, s:o}", "job", job->name, "rows", rows);
}
