/* analytics: a schedule measured without a model — what
 * GET /v1/schedules/{name}/analytics and `pipewright schedules NAME` show.
 *
 * The plan is built by pw_sched_build and replayed by the simulator (sim.h)
 * with model-free costs, so these figures are the job-level simulator's on
 * uniform stages and zero-cost links; nothing here times anything itself.
 *
 * Costs. costs[4] = {F, B, I, W} is the time of one microbatch's forward,
 * full backward, input-gradient and weight-gradient pass over ONE RANK'S
 * LAYERS (a flat stage). Default: ZeroBubble's unit costs F = I = W = 1,
 * B = 2 = I + W. A virtual schedule cuts a rank's layers into V stages, so
 * each of its S = pp·V stages costs 1/V of that: a rank's work per
 * microbatch is the same for every schedule and makespans compare.
 *
 * Units. "makespan" is in those cost units; "total_steps" is the makespan
 * counted in steps of one stage's unit action (makespan · V): with costs
 * 1,1,1,1 every action is one step and total_steps counts the cells of the
 * schedule's grid as SpectraX's total_steps(n) does (22 for 1f1b at p = 4,
 * m = 8). Peak activations count stage activations (each 1/V of a rank's
 * layers); "activation_units" divides by V. */
#ifndef PW_ANALYTICS_H
#define PW_ANALYTICS_H

#include <jansson.h>

#include "errors.h"

/* Bounds on what one request may make the planner build and render (the
 * catalogue's own limits are far larger: schedule_catalog.c). */
#define PW_ANALYTICS_MAX_PP 64
#define PW_ANALYTICS_MAX_V 8
#define PW_ANALYTICS_MAX_M 1024
#define PW_ANALYTICS_MAX_PVM 16384 /* pp · v · m: at most ~50k actions */
#define PW_ANALYTICS_MAX_COST 1e6

/* ZeroBubble's unit costs {F, B, I, W} = {1, 2, 1, 1}. */
extern const double pw_analytics_unit_costs[4];

/* "F,B,I,W" (four decimal numbers, each > 0 and <= PW_ANALYTICS_MAX_COST)
 * into costs. PW_EINVAL with path "costs" and the reason. */
PW_MUST_CHECK int pw_analytics_costs_parse(const char *text, double costs[4], pw_err *err);

/* The virtual_stages a schedule runs with when none is given: its
 * catalogue minimum (1 flat, 2 interleaved and dualpipev); 1 if unknown. */
int pw_analytics_default_v(const char *name);

/* Analytics of schedule `name` (any spelling pw_schedule_resolve takes) at
 * pp ranks, m microbatches, v virtual stages per rank; costs NULL gives the
 * unit costs. New reference:
 *   {"schedule", "family", "pp", "virtual_stages", "stages", "microbatches",
 *    "costs": {"f", "b", "i", "w"} (per rank's layers),
 *    "makespan", "total_steps", "bubble_ratio",
 *    "closed_form": {"formula", "bubble_ratio"} or null (the published
 *      bubble, given at the unit costs for the schedules that have one),
 *    "ranks": [{"rank", "busy", "idle", "peak_activations",
 *               "activation_units", "peak_pending_w", "actions"}],
 *    "grid": the text timeline (pw_sched_grid)}
 * NULL on error, err naming the parameter by its query name:
 *   "name" PW_ENOENT: unknown schedule, with "did you mean";
 *   "pp", "m", "v" PW_ESPEC: outside the bounds above, or the schedule's own
 *     constraint (pw_sched_check's message, e.g. "dualpipev needs
 *     microbatches >= 2*pp (got 5 < 8)");
 *   "costs" PW_EINVAL; PW_ENOMEM. */
json_t *pw_sched_analytics_json(const char *name, int pp, int m, int v, const double costs[4], pw_err *err);

#endif
