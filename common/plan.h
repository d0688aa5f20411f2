/* plan: a job's whole plan — model, partition, schedule, and the
 * simulator's proof and analytics — built one way for everyone:
 * `pipewright plan`, the coordinator's POST /v1/plans and its dispatch, and
 * the workers (which rebuild their own stage programs from the same spec).
 *
 * Costs for the simulator come from the cost model: each stage's F, I and
 * W FLOPs for one microbatch over an assumed compute rate, and each cut's
 * activation bytes over an assumed link (defaults below; measured per-layer
 * times from partition.layer_times replace FLOPs when given). */
#ifndef PW_PLAN_H
#define PW_PLAN_H

#include <jansson.h>

#include "errors.h"
#include "model.h"
#include "partition.h"
#include "schedule.h"
#include "sim.h"
#include "spec.h"

#define PW_PLAN_FLOPS_PER_S 50e9    /* assumed compute rate of one rank */
#define PW_PLAN_LINK_LATENCY 50e-6  /* seconds per transfer */
#define PW_PLAN_LINK_BW 3e9         /* bytes per second */

typedef struct {
  int pp, dp, V, S, m;     /* mesh and schedule shape */
  int mb_size;             /* sequences per microbatch (per replica) */
  pw_model model;
  pw_partition part;
  pw_sched *sched;
  pw_sim_result *sim;
  double *cost_f, *cost_i, *cost_w, *cost_b; /* [S] seconds per microbatch */
  double *act_bytes;       /* [S-1] bytes crossing s -> s+1 per microbatch */
} pw_plan;

/* Build and prove the plan. `schedule` overrides job->schedule.name when not
 * NULL. Errors carry the JSON path of what to change. */
int pw_plan_build(const pw_job *job, const char *schedule, pw_plan *out, pw_err *err);
void pw_plan_free(pw_plan *p);

/* Stages run by pipeline rank r, ascending; returns the count. */
int pw_plan_rank_stages(const pw_plan *p, int r, int *stages, int cap);

/* The document `pipewright plan --json` prints and POST /v1/plans returns:
 * {"job", "schedule", "mesh", "microbatches", "microbatch_size",
 *  "partition": {...}, "stage_to_rank", "plan": (schedule JSON),
 *  "analytics": (simulator JSON), "grid": "text"} (new reference). */
json_t *pw_plan_json(const pw_job *job, const pw_plan *p);



/* Every schedule that can run the job, side by side: the job's own mesh,
 * with virtual_stages set to 1 for flat schedules and to max(2, V) for the
 * others. {"job", "rows": [{"schedule", "ok", "error"?, "virtual_stages",
 * "stages", "makespan", "bubble_ratio", "peak_activations", "peak_pending_w",
 * "actions"}]} (new reference). */
json_t *pw_plan_compare_json(const pw_job *job);
#endif
