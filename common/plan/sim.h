/* sim: replay a schedule with per-action costs, prove it, and measure it.
 *
 * The simulator is the planner's proof that a plan is runnable before any
 * worker runs it. It checks the plan's structure (every (microbatch, stage)
 * has exactly one F, and exactly one B or one I plus one W with I before W;
 * every action on the rank that owns its stage), replays it, and reports
 * deadlocks with the ranks and actions involved. It never changes the plan.
 *
 * Execution model (what a worker does):
 * - each rank runs its list strictly in order, one unit at a time; a unit is
 *   one action, or a fused pair (schedule.h) which takes F + B and whose
 *   results are both available at its end;
 * - a unit starts when its rank is free and every input has arrived:
 *     F k@s   needs F k@s-1                    (activation, s -> s-1 edge)
 *     B/I k@s needs F k@s and B/I k@s+1         (gradient, s+1 -> s edge)
 *     W k@s   needs I k@s
 *   the last stage's B/I needs only its own F (the loss is computed there);
 * - an input made on another rank arrives latency + bytes / bandwidth after
 *   its producer ends; on the same rank it costs nothing. Transfers do not
 *   contend with each other or with compute (sends are asynchronous).
 * Times are seconds from the step's start.
 *
 * Memory, measured per rank on its own timeline:
 * - in-flight activations: the activation saved by F k@s is held from the
 *   START of that F until the END of its B (or I). peak_act is the largest
 *   number held at once (a release at time t happens before an F starting
 *   at t). 1f1b gives p - r on rank r, gpipe m.
 * - pending W: an I's layer inputs and output gradients are held from the
 *   END of the I until the END of its W. peak_pending_w counts them.
 * - peak_held: the largest (activations + pending W) at once. */
#ifndef PW_SIM_H
#define PW_SIM_H

#include <stddef.h>

#include <jansson.h>

#include "errors.h"
#include "schedule.h"

typedef struct {
  /* Per-stage costs in seconds, arrays of length S; NULL gives the
   * ZeroBubble unit costs. Defaults: f = 1; i = b/2 if b is given else 1;
   * w likewise; b = i + w. So an all-zero pw_sim_costs is F = I = W = 1,
   * B = 2. Negative costs are PW_EINVAL. */
  const double *f, *b, *i, *w;
  /* Bytes of one microbatch's activation crossing stage s -> s+1, length
   * S-1 (the gradient going back has the same size); NULL = 0. */
  const double *act_bytes;
  double latency;   /* seconds per cross-rank transfer */
  double bandwidth; /* bytes per second; 0 = infinite */
  /* The forward's activations on the wire relative to act_bytes (bf16
   * activations, float32 gradients: 0.5); 0 = 1. */
  double act_scale;
} pw_sim_costs;

typedef struct {
  pw_action act; /* as in the plan (flags included) */
  int rank;
  int index;     /* position in the rank's list */
  double start, end;
} pw_sim_event;

typedef struct {
  char name[32];
  int pp, V, S, m, forward_only;
  double makespan;      /* end of the last action */
  double bubble_ratio;  /* sum of idle / (pp * makespan); 0 if makespan is 0 */
  double *busy;         /* [pp] seconds computing */
  double *idle;         /* [pp] makespan - busy */
  int *peak_act;        /* [pp] peak in-flight activations */
  int *peak_pending_w;  /* [pp] peak pending W's */
  int *peak_held;       /* [pp] peak of activations + pending W's */
  double *link_bytes;   /* [pp * pp] bytes sent src -> dst, index src*pp+dst */
  int *link_transfers;  /* [pp * pp] number of transfers src -> dst */
  int n_events;
  pw_sim_event *events; /* rank 0's list in order, then rank 1's, ... */
  int *rank_first;      /* [pp + 1] rank r's events are [rank_first[r], rank_first[r+1]) */
  /* The data-parallel exchange at the step's end (pw_sim_add_dp): rank r's
   * runs [dp_start[r], dp_end[r]) right after its last action; NULL
   * without one. step_makespan: the step with it (set with them). */
  double *dp_start, *dp_end;
  double step_makespan;
} pw_sim_result;

/* Structural checks only (no timing): PW_ESCHEDULE with the first violation,
 * e.g. "rank 1 #4: F3@s0 is on stage 0, which belongs to rank 0". */
PW_MUST_CHECK int pw_sim_check(const pw_sched *s, pw_err *err);

/* Check and replay. c may be NULL (unit costs). Errors: PW_ESCHEDULE (a
 * structural violation, e.g. "B3@s1 (or I3@s1 and W3@s1) is missing: stage 1
 * (rank 1) has no backward of microbatch 3; B3@s0 on rank 0 needs it"),
 * PW_EDEADLOCK (the ranks that wait on each other, in a cycle, each with
 * the action it waits at, the input it needs and, when that input is not
 * the next thing its rank runs, what that rank waits at first: "deadlock:
 * rank 0 waits at B0@s0 for B0@s1 (rank 1) which comes after F1@s1, rank 1
 * waits at F1@s1 for F1@s0 (rank 0) which comes after B0@s0"), PW_EINVAL (costs),
 * PW_ENOMEM. On success *out is owned by the caller (pw_sim_result_free). */
PW_MUST_CHECK int pw_sim_run(const pw_sched *s, const pw_sim_costs *c, pw_sim_result **out, pw_err *err);
void pw_sim_result_free(pw_sim_result *r);

/* Adds the data-parallel gradient exchange as each rank's last action:
 * seconds[r] (latency + bytes / bandwidth of the link model: the planner's
 * dp_seconds) from the end of rank r's last action, which is when a worker
 * has every gradient of its stages. The pipeline's makespan, busy, idle
 * and bubble stay the schedule's; step_makespan is the step with the
 * exchange. Again replaces the previous one. PW_EINVAL for a negative or
 * non-finite cost, PW_ENOMEM. */
PW_MUST_CHECK int pw_sim_add_dp(pw_sim_result *r, const double *seconds, pw_err *err);

/* Analytics and timeline (new reference):
 * {"schedule", "pp", "virtual_stages", "stages", "microbatches",
 *  "forward_only", "makespan", "bubble_ratio",
 *  "ranks": [{"rank", "busy", "idle", "peak_activations", "peak_pending_w",
 *             "peak_held", "actions"}],
 *  "links": [{"src", "dst", "bytes", "transfers"}]   (pairs that moved data),
 *  "timeline": [[{"action": "F0@s0", "start", "end", "fused"?}], ...]}
 * with a data-parallel exchange (pw_sim_add_dp) also "step_makespan" and,
 * last in each rank's row, {"action": "DP", "start", "end"}. */
json_t *pw_sim_result_json(const pw_sim_result *r);

/* Chrome trace-event JSON (opens in Perfetto): {"traceEvents": [...],
 * "displayTimeUnit": "ms"}; one "X" event per action with ts/dur in
 * microseconds, pid 0, tid = rank, args {mb, stage, kind, fused}, plus
 * "thread_name" metadata naming each rank. */
json_t *pw_sim_trace_json(const pw_sim_result *r);

/* The action grid as text: one row per rank ("r0 | F0 F1 . B0 B0 ..."),
 * time flowing right, one cell per unit of the smallest action duration,
 * an action of duration d spanning round(d / unit) cells, "." for idle.
 * Cells show "F3" (or "F3@s1" when V > 1); rows longer than 4096 cells use a
 * coarser cell (makespan / 4096). r may be NULL: the plan is then
 * replayed with unit costs first. Returns the length of the full text (as
 * snprintf; buf may be NULL when cap is 0), or a negative PW_E* code. */
int pw_sched_grid(const pw_sched *s, const pw_sim_result *r, char *buf, size_t cap);

#endif
