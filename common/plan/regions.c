/* regions: the joint plan of regions.h — cuts, the per-region schedules
 * renumbered into one, the stage graph — and the serial comparison. */
#include "regions.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "share.h"

/* A schedule's error about its own mesh or name, said of region r. */
static int region_err(pw_err *err, int r, int rc) {
  if (!err || !err->path[0] || strncmp(err->path, "model.", 6) == 0) return rc;
  char path[sizeof err->path], msg[sizeof err->msg];
  snprintf(msg, sizeof msg, "%s", err->msg);
  if (strncmp(err->path, "schedule.microbatches", 21) == 0) {
    snprintf(path, sizeof path, "%s", err->path);
    return pw_err_set(err, rc, path, "region %d: %s", r, msg);
  }
  const char *leaf = strchr(err->path, '.');
  snprintf(path, sizeof path, "model.regions[%d].%s%s", r, strncmp(err->path, "mesh", 4) ? "schedule" : "mesh",
           leaf ? leaf : "");
  return pw_err_set(err, rc, path, "%s", msg);
}

/* Region r's layers [*lo, *hi) and its stage_boundary cuts after cuts[*c]. */
static int region_cuts(const pw_model *m, const pw_region_spec *rg, int r, int *cuts, int *c, pw_region_span *sp,
                       pw_err *err) {
  int lo = 0, hi;
  while (lo < m->n_layers && m->layers[lo].region != r) lo++;
  for (hi = lo; hi < m->n_layers && m->layers[hi].region == r;) hi++;
  int n = 1;
  for (int k = 0; k < m->n_markers; k++) n += m->markers[k] > lo && m->markers[k] < hi;
  long long want = (long long)rg->pp * rg->virtual_stages;
  char path[40];
  snprintf(path, sizeof path, "model.regions[%d]", r);
  if (n != want)
    return pw_err_set(err, PW_ESPEC, path, "%d stage_boundary marker%s make%s %d stage%s, but its mesh runs pp * "
                      "virtual_stages = %d * %d = %lld", n - 1, n == 2 ? "" : "s", n == 2 ? "s" : "", n,
                      n == 1 ? "" : "s", rg->pp, rg->virtual_stages, want);
  sp->stage_lo = *c;
  cuts[(*c)++] = lo;
  for (int k = 0; k < m->n_markers; k++)
    if (m->markers[k] > lo && m->markers[k] < hi) cuts[(*c)++] = m->markers[k];
  sp->stage_hi = *c;
  return 0;
}

/* pred: for each stage, the stages producing a value it reads (ascending). */
static int stage_graph(pw_sched *s, const pw_partition *part, pw_err *err) {
  s->pred_first = calloc((size_t)s->S + 1, sizeof(int));
  s->pred = malloc(sizeof(int) * (size_t)(part->n_edges ? part->n_edges : 1));
  if (!s->pred_first || !s->pred) return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  int n = 0;
  for (int d = 0; d < s->S; d++) {
    s->pred_first[d] = n;
    for (int src = 0; src < d; src++) {
      int hit = 0;
      for (int e = 0; e < part->n_edges; e++) hit |= part->edges[e].src == src && part->edges[e].dst == d;
      if (!hit) continue;
      if (n - s->pred_first[d] == PW_SCHED_MAX_LINKS)
        return pw_err_set(err, PW_ESPEC, "model.graph", "stage %d reads more than %d stages", d, PW_SCHED_MAX_LINKS);
      s->pred[n++] = src;
    }
  }
  s->pred_first[s->S] = n;
  return 0;
}

/* Region r's action lists. A region with `depth` stages between it and
 * the loss is not the end of its pipeline: with one stage per rank, it
 * runs the first pp ranks' lists of its schedule over pp + depth ranks, so
 * it keeps as many microbatches in flight as the round trip through the
 * regions after it needs (1F1B's warm-up, ZB-H1's). Else (virtual stages,
 * or a schedule whose constraints the longer pipeline breaks) its own. */
static int region_sched(const pw_job *job, int r, int depth, pw_sched **out, pw_err *err) {
  const pw_region_spec *rg = &job->model.regions[r];
  int m = job->schedule.microbatches, fwd = job->mode == PW_MODE_FORWARD, rc;
  pw_sched *ext = NULL;
  if (depth > 0 && rg->virtual_stages == 1 && pw_sched_build(rg->schedule, rg->pp + depth, 1, m, fwd, &ext, NULL) == 0) {
    rc = pw_sched_new(rg->pp, 1, rg->pp, m, NULL, fwd, out, err);
    snprintf((*out)->name, sizeof (*out)->name, "%s", rg->schedule);
    for (int q = 0; q < rg->pp && !rc; q++)
      for (int i = 0; i < ext->n_actions[q] && !rc; i++)
        if (pw_sched_push(*out, q, ext->actions[q][i])) rc = pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
    pw_sched_free(ext);
    return rc;
  }
  rc = pw_sched_build(rg->schedule, rg->pp, rg->virtual_stages, m, fwd, out, err);
  return rc ? region_err(err, r, rc) : 0;
}

int pw_regions_plan(const pw_job *job, const pw_model *m, pw_partition *part, pw_sched **out, pw_region_span *spans,
                    pw_err *err) {
  const pw_model_spec *ms = &job->model;
  int R = ms->n_regions, S = 0, pp = 0, c = 0, rc = 0, fwd = job->mode == PW_MODE_FORWARD;
  int mb = job->schedule.microbatches;
  *out = NULL;
  int depth[PW_REGIONS_MAX] = {0};
  for (int r = R - 1; r >= 0; r--) {
    S += ms->regions[r].pp * ms->regions[r].virtual_stages;
    for (int q = r + 1; q < R; q++)
      for (int k = 0; k < ms->regions[q].n_from; k++)
        if (ms->regions[q].from[k] == r && ms->regions[q].pp * ms->regions[q].virtual_stages + depth[q] > depth[r])
          depth[r] = ms->regions[q].pp * ms->regions[q].virtual_stages + depth[q];
  }
  int *cuts = malloc(sizeof(int) * (size_t)(S + 1)), *s2r = malloc(sizeof(int) * (size_t)S);
  pw_sched *sub[PW_REGIONS_MAX] = {0};
  if (!cuts || !s2r) rc = pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  for (int r = 0; r < R && !rc; r++) {
    const pw_region_spec *rg = &ms->regions[r];
    int feeds = 0;
    for (int q = r + 1; q < R; q++)
      for (int k = 0; k < ms->regions[q].n_from; k++) feeds += ms->regions[q].from[k] == r;
    if (feeds > 1) {
      rc = pw_err_set(err, PW_ESPEC, "model.graph", "region '%s' feeds %d regions: a pipelined run sends a region's "
                      "output to one region (pipewright train runs the model as it is)", rg->name, feeds);
      break;
    }
    if ((rc = region_cuts(m, rg, r, cuts, &c, &spans[r], err))) break;
    spans[r].rank_lo = pp;
    spans[r].rank_hi = pp += rg->pp;
    if ((rc = region_sched(job, r, depth[r], &sub[r], err))) break;
    for (int s = 0; s < sub[r]->S; s++) s2r[spans[r].stage_lo + s] = spans[r].rank_lo + sub[r]->stage_to_rank[s];
  }
  if (!rc) {
    cuts[S] = m->n_layers;
    rc = pw_partition_from_cuts(m, &job->partition, cuts, S, part, err);
  }
  if (!rc) rc = pw_sched_new(pp, 1, S, mb, s2r, fwd, out, err);
  if (!rc) {
    snprintf((*out)->name, sizeof (*out)->name, "regions");
    rc = stage_graph(*out, part, err);
  }
  for (int r = 0; r < R && !rc; r++)
    for (int q = 0; q < sub[r]->pp && !rc; q++)
      for (int i = 0; i < sub[r]->n_actions[q] && !rc; i++) {
        pw_action a = sub[r]->actions[q][i];
        a.stage += spans[r].stage_lo;
        if (pw_sched_push(*out, spans[r].rank_lo + q, a)) rc = pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
      }
  for (int r = 0; r < R; r++) pw_sched_free(sub[r]);
  free(cuts);
  free(s2r);
  if (rc) {
    pw_sched_free(*out);
    *out = NULL;
  }
  return rc;
}

int pw_regions_serial(const pw_job *job, const pw_sched *joint, const pw_region_span *spans, pw_sched **out,
                      pw_err *err) {
  int R = job->model.n_regions, P = 0, rc;
  for (int r = 0; r < R; r++)
    if (spans[r].rank_hi - spans[r].rank_lo > P) P = spans[r].rank_hi - spans[r].rank_lo;
  int *s2r = malloc(sizeof(int) * (size_t)joint->S);
  if (!s2r) return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  for (int r = 0; r < R; r++)
    for (int s = spans[r].stage_lo; s < spans[r].stage_hi; s++) s2r[s] = joint->stage_to_rank[s] - spans[r].rank_lo;
  rc = pw_sched_new(P, 1, joint->S, joint->m, s2r, joint->forward_only, out, err);
  free(s2r);
  if (!rc && pw_sched_copy_graph(*out, joint)) rc = pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  if (rc) {
    pw_sched_free(*out);
    *out = NULL;
    return rc;
  }
  snprintf((*out)->name, sizeof (*out)->name, "regions-serial");
  /* phases: each feeding region's forwards, the last region whole, the
   * feeding regions' backwards in reverse */
  for (int phase = 0; phase < 2 * R - 1 && !rc; phase++) {
    int r = phase < R ? phase : 2 * R - 2 - phase, whole = r == R - 1, fwd = phase < R - 1;
    for (int q = 0; q < spans[r].rank_hi - spans[r].rank_lo && !rc; q++) {
      int jr = spans[r].rank_lo + q;
      for (int i = 0; i < joint->n_actions[jr] && !rc; i++) {
        pw_action a = joint->actions[jr][i];
        if (!whole && (a.kind == PW_ACT_F) != fwd) continue;
        if (!whole) a.flags = 0;
        if (pw_sched_push(*out, q, a)) rc = pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
      }
    }
  }
  return rc;
}

/* Region r's own schedule replayed alone on its stages' costs. */
static int region_alone(const pw_job *job, int r, const pw_region_span *sp, const pw_sim_costs *c, double *makespan,
                        pw_err *err) {
  const pw_region_spec *rg = &job->model.regions[r];
  pw_sched *s = NULL;
  pw_sim_result *res = NULL;
  int rc = pw_sched_build(rg->schedule, rg->pp, rg->virtual_stages, job->schedule.microbatches,
                          job->mode == PW_MODE_FORWARD, &s, err);
  if (rc) return region_err(err, r, rc);
  int lo = sp->stage_lo;
  pw_sim_costs one = *c;
  one.f = c->f ? c->f + lo : NULL;
  one.b = c->b ? c->b + lo : NULL;
  one.i = c->i ? c->i + lo : NULL;
  one.w = c->w ? c->w + lo : NULL;
  one.act_bytes = c->act_bytes && sp->stage_hi - lo > 1 ? c->act_bytes + lo : NULL;
  rc = pw_sim_run(s, &one, &res, err);
  if (!rc) *makespan = res->makespan;
  pw_sim_result_free(res);
  pw_sched_free(s);
  return rc;
}

/* Plan s replayed with every rank on one host of `cores` cores, one
 * thread each (share.h; prof's measured sharing when it has one); its
 * makespan, or -1 on error; *busy (new reference) each rank's time
 * computing in that replay, wall time, to set beside a traced run's. */
static double shared_makespan(const pw_sched *s, const pw_sim_costs *c, int cores, const pw_cost_profile *prof,
                              json_t **busy, pw_err *err) {
  int *host = calloc((size_t)s->pp, sizeof(int)), *threads = malloc(sizeof(int) * (size_t)s->pp);
  double out = -1;
  pw_sim_result *res = NULL;
  *busy = NULL;
  if (host && threads) {
    for (int r = 0; r < s->pp; r++) threads[r] = 1;
    pw_share sh = {.n_ranks = s->pp, .host = host, .threads = threads, .n_hosts = 1, .cores = &cores,
                   .speed = prof ? prof->speed : NULL, .n_speed = prof ? prof->n_speed : 0};
    if (!pw_sim_run_shared(s, c, &sh, &res, err)) {
      out = res->makespan;
      *busy = json_array();
      for (int r = 0; r < s->pp; r++) json_array_append_new(*busy, json_real(res->busy[r]));
    }
  }
  pw_sim_result_free(res);
  free(host);
  free(threads);
  return out;
}

/* The slowest rank's step end under prof: each rank's stages' parameters. */
static double step_end(const pw_sched *s, const pw_partition *part, const pw_cost_profile *prof) {
  double end = 0;
  for (int r = 0; r < s->pp; r++) {
    size_t params = 0;
    for (int st = 0; st < s->S; st++)
      if (s->stage_to_rank[st] == r) params += part->stages[st].params;
    double e = pw_cost_step_end(prof, params);
    if (e > end) end = e;
  }
  return end;
}

json_t *pw_regions_compare_json(const pw_job *job, const pw_sched *joint, const pw_region_span *spans,
                                const pw_sim_costs *c, int cores, const pw_cost_profile *prof,
                                const pw_partition *part, pw_err *err) {
  json_t *rows = json_array();
  pw_sched *ser = NULL;
  pw_sim_result *sr = NULL, *cr = NULL;
  int rc = 0;
  for (int r = 0; r < job->model.n_regions && !rc; r++) {
    const pw_region_spec *rg = &job->model.regions[r];
    double alone = 0;
    json_t *from = json_array();
    for (int k = 0; k < rg->n_from; k++) json_array_append_new(from, json_string(job->model.regions[rg->from[k]].name));
    if (!(rc = region_alone(job, r, &spans[r], c, &alone, err)))
      json_array_append_new(rows, json_pack("{s:s, s:s, s:i, s:[i,i], s:f, s:o, s:s}", "name", rg->name, "schedule",
                                            rg->schedule, "ranks", spans[r].rank_hi - spans[r].rank_lo, "stages",
                                            spans[r].stage_lo, spans[r].stage_hi, "makespan", alone, "from", from,
                                            "fusion", rg->n_from > 1 ? (rg->fusion ? "add" : "concat") : ""));
    else
      json_decref(from);
  }
  if (!rc) rc = pw_regions_serial(job, joint, spans, &ser, err);
  /* on shared cores a transfer's wake-ups cost what they do beside each
   * plan's own ranks (c's latency is for the job's mesh, either one) */
  pw_sim_costs sc = *c, jc = *c;
  if (!rc && prof && cores > 0) {
    sc.latency = pw_cost_transfer_latency(prof, ser->pp * job->mesh.dp);
    jc.latency = pw_cost_transfer_latency(prof, joint->pp * job->mesh.dp);
  }
  if (!rc) rc = pw_sim_run(ser, &sc, &sr, err);
  if (!rc) rc = pw_sim_run(joint, &jc, &cr, err);
  json_t *out = rc ? NULL
                   : json_pack("{s:o, s:{s:f, s:i, s:f}, s:{s:f, s:i, s:f}, s:f}", "regions", rows, "serial",
                               "makespan", sr->makespan, "ranks", sr->pp, "bubble_ratio", sr->bubble_ratio,
                               "concurrent", "makespan", cr->makespan, "ranks", cr->pp, "bubble_ratio",
                               cr->bubble_ratio, "speedup", cr->makespan > 0 ? sr->makespan / cr->makespan : 0.0);
  if (rc) json_decref(rows);
  if (out && cores > 0) {
    json_t *sb, *cb;
    double ss = shared_makespan(ser, &sc, cores, prof, &sb, err);
    double cs = shared_makespan(joint, &jc, cores, prof, &cb, err);
    if (ss < 0 || cs < 0) {
      json_decref(sb);
      json_decref(cb);
      json_decref(out);
      out = NULL;
    } else {
      json_object_set_new(out, "cores", json_pack("{s:i, s:f, s:f, s:f, s:o, s:o}", "cores", cores, "serial", ss,
                                                  "concurrent", cs, "speedup", cs > 0 ? ss / cs : 0.0, "serial_busy", sb,
                                                  "concurrent_busy", cb));
    }
    if (out && prof && part && !joint->forward_only) { /* the predicted steps: the step end too */
      double se = ss + step_end(ser, part, prof), ce = cs + step_end(joint, part, prof);
      json_object_set_new(out, "predicted", json_pack("{s:f, s:f, s:f}", "serial", se, "concurrent", ce, "speedup",
                                                      ce > 0 ? se / ce : 0.0));
    }
  }
  pw_sched_free(ser);
  pw_sim_result_free(sr);
  pw_sim_result_free(cr);
  return out;
}

json_t *pw_regions_lanes_json(const json_t *plan_doc) {
  const json_t *rows = json_object_get(json_object_get(plan_doc, "regions"), "regions");
  const json_t *s2r = json_object_get(plan_doc, "stage_to_rank");
  if (!json_is_array(rows) || !json_is_array(s2r)) return NULL;
  json_t *out = json_array();
  size_t i;
  const json_t *row;
  json_array_foreach(rows, i, row) {
    const json_t *st = json_object_get(row, "stages");
    json_t *ranks = json_array();
    for (json_int_t s = json_integer_value(json_array_get(st, 0)); s < json_integer_value(json_array_get(st, 1)); s++) {
      json_int_t r = json_integer_value(json_array_get(s2r, (size_t)s));
      int seen = 0;
      for (size_t k = 0; k < json_array_size(ranks); k++) seen |= json_integer_value(json_array_get(ranks, k)) == r;
      if (!seen) json_array_append_new(ranks, json_integer(r));
    }
    json_array_append_new(out, json_pack("{s:O, s:o}", "name", json_object_get(row, "name"), "ranks", ranks));
  }
  return out;
}
