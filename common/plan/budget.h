/* budget: what a job may ask of the planner and of the cluster, checked
 * before a plan is built and before a job is accepted, so a spec that
 * passes every field check but would wedge the coordinator (a plan of
 * millions of actions, an assign message that cannot be encoded, a rank
 * bigger than any worker's memory) is refused with the field to change and
 * the limit it broke.
 *
 * Two steps, cheapest first:
 *   pw_plan_check_budget  the spec alone, in microseconds: the spec reads
 *                         back from its canonical form (what the store
 *                         keeps and dispatch parses again, derived fields
 *                         included) and the plan's action and stage
 *                         counts stay under their bounds. Run it BEFORE pw_plan_build:
 *                         the action bound is what keeps planning short.
 *   pw_plan_check_fit     the built plan: its canonical text (runs.plan),
 *                         the largest slices (one per assign message) and
 *                         every pipeline rank's memory (pw_plan_mem.total).
 * Used by the coordinator (POST /v1/plans, POST /v1/jobs) and by
 * `pipewright plan` alike. Errors are PW_EBUDGET (422, "over_budget") with
 * the JSON path of the field to change, or the spec's own PW_ESPEC. */
#ifndef PW_BUDGET_H
#define PW_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "plan.h"
#include "spec.h"

#define PW_BUDGET_MAX_ACTIONS (1 << 15)                /* ~0.5 s of planning, a ~5 MiB plan */
#define PW_BUDGET_MAX_STAGES 1024                      /* the simulator's link tables grow as ranks^2 */
#define PW_BUDGET_MAX_PLAN_BYTES ((size_t)32 << 20)    /* runs.plan in the store */
/* Layers x ranks: every rank's slice describes every layer, and the
 * slices are built whole (measured on 2 cores: 4096 blocks x 64 ranks took
 * 27 s of one core, ~0.1 ms each; the bound is ~7 s). */
#define PW_BUDGET_MAX_LAYER_RANKS (1 << 16)

typedef struct {
  int64_t max_actions;    /* actions over every pipeline rank's list; 0: no bound */
  int max_stages;         /* pipeline stages (mesh.pp x virtual stages); 0: no bound */
  int64_t max_layer_ranks; /* the model's layers x the job's ranks (pp x dp x tp); 0: no bound */
  size_t max_plan_bytes;  /* the plan's canonical text; 0: no bound */
  size_t max_slice_bytes; /* one rank's slice (it travels in one assign
                             message: the coordinator passes its message
                             bound less the envelope); 0: no bound */
  size_t max_rank_memory; /* pw_plan_mem.total of any pipeline rank; 0: no bound */
  char memory_from[96];   /* who set max_rank_memory, for the message:
                             "--max-rank-memory", "worker w3's memory" */
} pw_budget;

/* The defaults above; no slice or memory bound. */
void pw_budget_init(pw_budget *b);

/* Room for a slice in an assign message of at most message_max bytes for
 * a job of n_ranks ranks: the message's other fields (the peers list
 * above all, up to 128 bytes a rank) and 4 KiB of envelope left out; 0
 * when nothing is left. Slices are measured as they travel: escaped in a
 * JSON string. */
size_t pw_budget_slice_room(size_t message_max, int64_t n_ranks);

/* Upper bound of the actions the plan of job holds: microbatches x stages
 * x actions per (microbatch, stage) (F and B, or F, I and W when the
 * schedule splits the backward). schedule overrides the job's; compare:
 * every schedule as pw_plan_compare_json plans them (virtual_stages at
 * least 2 for those that interleave, the splitting factor 3). */
int64_t pw_plan_actions_bound(const pw_job *job, const char *schedule, int compare);

/* The spec-only checks (see above). 0, PW_ESPEC from reading the canonical
 * spec back (path of the derived field, the message saying it is derived
 * when the caller's JSON lacks it is the caller's business), PW_EBUDGET
 * ("schedule.microbatches" for the action bound, "mesh.pp" for the stages,
 * "model.n_layers" or "mesh.pp" for layers x ranks), PW_ENOMEM. */
PW_MUST_CHECK int pw_plan_check_budget(const pw_job *job, const char *schedule, int compare, const pw_budget *b, pw_err *err);

/* The built plan's checks (see above). 0, PW_EBUDGET naming the field to
 * change and the limit, PW_ENOMEM. */
PW_MUST_CHECK int pw_plan_check_fit(const pw_job *job, const pw_plan *p, const pw_budget *b, pw_err *err);

#endif
