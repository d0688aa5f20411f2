/* plan: a job's whole plan — model, partition, schedule, and the
 * simulator's proof and analytics — built one way for everyone:
 * `pipewright plan` and the coordinator's POST /v1/plans and dispatch. Built
 * once per run at dispatch; each worker gets only its slice of it
 * (slice.h) and never plans.
 *
 * Costs for the simulator come from the cost model: each stage's F, I and
 * W FLOPs for one microbatch over an assumed compute rate, and each cut's
 * activation bytes over an assumed link (defaults below; measured per-layer
 * times from partition.layer_times replace FLOPs when given) — or, given a
 * calibration profile (cost.h, pw_plan_build_costed), the host's measured
 * layer times and link.
 *
 * Memory per rank (pw_plan_mem) is what the worker will allocate for the
 * plan, counted from the model and the action lists alone — the programs'
 * layout (common/model/layout.h) and the step-end buffers below, the same
 * descriptions the worker allocates from — so a plan that does not fit is
 * seen before any worker starts. */
#ifndef PW_PLAN_H
#define PW_PLAN_H

#include <jansson.h>

#include "cost.h"
#include "errors.h"
#include "layout.h"
#include "model.h"
#include "partition.h"
#include "regions.h"
#include "schedule.h"
#include "sim.h"
#include "spec.h"

#define PW_PLAN_FLOPS_PER_S 50e9    /* assumed compute rate of one rank */
#define PW_PLAN_LINK_LATENCY 50e-6  /* seconds per transfer */
#define PW_PLAN_LINK_BW 3e9         /* bytes per second */

/* ---- step-end buffers ---------------------------------------------------
 * What a pipeline rank keeps for the step end (worker/stepend.c), described
 * once for the worker that allocates it and the planner that counts it:
 *  - per stage it runs, when training with dp > 1: the buffers of the
 *    data-parallel reduce-scatter and all-gather, pw_dp_floats floats
 *    (common/model/collective.h says which), and under train.zero > 0 only
 *    pw_dp_state_floats of optimizer state;
 *  - per shared parameter it holds a copy of: one block of
 *    pw_tied_floats() floats, wired by pw_tied_wire into holder j's
 *    gradient (received from a remote holder, or the copy a local holder
 *    sends) and the sum. */
#define PW_TIED_MAX_HOLDERS 4
_Static_assert(sizeof ((pw_shared_param *)0)->holders == PW_TIED_MAX_HOLDERS * sizeof(int),
               "pw_tied_bufs has one buffer per possible holder");


typedef struct {
  float *block;                          /* the one allocation */
  float *holder[PW_TIED_MAX_HOLDERS];    /* [n_holders] holder j's gradient */
  float *sum;                            /* the holders' gradients summed in stage order */
} pw_tied_bufs;

/* Floats of one shared parameter's block: (1 + n_holders) x numel. */
size_t pw_tied_floats(const pw_model *m, const pw_shared_param *sp);
/* Points t's buffers into block (pw_tied_floats floats). */
void pw_tied_wire(pw_tied_bufs *t, float *block, const pw_model *m, const pw_shared_param *sp);

/* Bytes one pipeline rank allocates and touches for the plan: its stage
 * programs, the data set it draws from, and the worker's step-end buffers
 * (worker/stepend.c). The process baseline (code, libraries, thread
 * stacks, OpenBLAS's workspace: about 6 MiB here) is excluded. */
typedef struct {
  size_t params;   /* parameter arenas; train.zero 3: each stage's shard of them (pages rounded
                      out: pw_z3_param_floats) and the rank's gather ring, PW_Z3_RING buffers of its
                      largest layer (common/model/zero3.h) */
  size_t grads;    /* gradient arenas (shadows included); train.zero 2 and 3: what replica 0 keeps
                      of them, its shard of the main part and the full ranges (pw_dp_live_ranges) */
  size_t adam;     /* AdamW m and v (train.zero > 0: of the rank's shard) */
  size_t slots;    /* activation slots: per stage, slot bytes x peak slots (a
                      remat stage's slot is its keep part: the ports) */
  int n_slots;     /* peak slots over the rank's stages */
  size_t work;     /* remat stages: work bytes (slot minus keep) x n_work */
  size_t remat_saved; /* what slots + work are below the same stages without remat */
  size_t scratch;  /* attention scratch */
  size_t dp;       /* dp > 1: the data-parallel exchange's buffers (pw_dp_floats; zero 2 also
                      pw_dp_wgrad_bufs_floats: the weight-gradient scratch and its pieces) */
  uint64_t dp_sent;   /* bytes replica 0's rank sends per step in it (pw_dp_step_bytes, zero 2
                         plus m x pw_dp_wgrad_bytes: m x the zero 1 reduce-scatter; zero 3 also
                         m x its F's and I's (or B's) per-layer gathers, pw_z3_pass_bytes, and a
                         remat recompute's; each replica receives as many, within a shard's
                         rounding) */
  double dp_seconds; /* the step end's part of it on the plan's link (latency per chunk sent and
                         its bytes / bandwidth; after the pipeline's last action, not in the
                         simulated makespan); zero 2's per-microbatch reduce-scatters are not
                         here but in the W (or B) that makes them (cost_w, cost_b) */
  size_t ckpt_gather; /* train.zero > 0: replica 0 holds the whole v of its stages while it
                         writes a checkpoint (m goes where the gradients are; zero 2 has no
                         whole gradient arena: m and v; zero 3 the parameters too); the other
                         replicas' peak is total minus this */
  uint64_t tp_sent;  /* mesh.tp > 1: bytes tp rank 0 of each of its stages sends per step in the
                        tensor-parallel all-reduces (common/model/tp.h; the others within a shard's
                        rounding) */
  double tp_seconds; /* those on the link model (in the simulated F and I: plan_tp.c) */
  size_t tied;     /* tied parameters held here: pw_tied_floats of each */
  size_t data;     /* ranks drawing inputs or targets: a text file whole (its
                      size where the planner can stat it, else 0), the
                      regression / classify teacher matrix */
  size_t snapshots; /* train.snapshot_every > 0: two generations of its own
                       stages' state (parameters, m, v) and two of the
                       previous rank's, which it holds (worker/snap.h) */
  uint64_t snap_sent; /* bytes one snapshot sends to the holder: its stages' parameters, m and
                         v, 3 x params (0 without snapshots, or with one rank: no holder) */
  double snap_seconds; /* per step on the plan's link: three frames' latency and snap_sent /
                          bandwidth, over snapshot_every (not in the predicted step: plan_snap.c) */
  size_t total;    /* the sum */
} pw_plan_mem;

typedef struct {
  int pp, dp, V, S, m;     /* mesh and schedule shape */
  int tp;                  /* ranks per stage (tensor parallel); 1 = none */
  uint8_t *tp_kinds;       /* tp > 1: [model.n_params] pw_tp_kind of each parameter */
  double act_scale;        /* bytes on the wire per float activation byte: 0.5 under bf16 */
  int mb_size;             /* sequences per microbatch (per replica) */
  pw_model model;
  pw_partition part;
  pw_sched *sched;
  pw_sim_result *sim;
  double *cost_f, *cost_i, *cost_w, *cost_b; /* [S] seconds per microbatch (with the exchanges run
                                                inside them: tensor parallel's in F and I, ZeRO-2's
                                                reduce-scatter in W and B) */
  double *act_bytes;       /* [S-1] bytes crossing s -> s+1 per microbatch */
  pw_prog_sizes *stage_mem; /* [S] each stage program's layout (common/model/layout.h) */
  int *peak_slots;         /* [S] activation slots stage s's program grows to */
  int *n_work;             /* [S] remat stages: work buffers (pw_plan_work); 0 = no remat */
  pw_plan_mem *mem;        /* [pp] per pipeline rank (every replica alike) */
  pw_region_span *regions; /* [model.n_regions] a regions model's spans (regions.h), else NULL */
  pw_sched *joint;         /* a regions model's concurrent plan (sched when it runs concurrently) */
  /* the cost model (cost.h): a calibration profile, else the FLOP model */
  int calibrated;          /* costs from a profile */
  double latency, bandwidth; /* the link the simulator costs transfers on */
  double step_end;         /* profile: the slowest rank's step end (seconds), else 0 */
  double predicted;        /* predicted step: makespan (ranks sharing cores when the
                              cost model says so) + step_end */
  int snapshot_every;      /* a training plan's train.snapshot_every, else 0 */
} pw_plan;

/* ---- in-memory snapshots (plan_snap.c) ------------------------------------
 * Their memory and link time per rank (pw_plan_mem.snapshots, snap_sent,
 * snap_seconds), and what share of the predicted step that time is: the
 * plan warns above PW_PLAN_SNAP_SHARE. */
#define PW_PLAN_SNAP_SHARE 0.05
/* Sets p->snapshot_every and each rank's snapshot fields from its params. */
void pw_plan_snap(const pw_job *job, pw_plan *p);
/* Rank r's snap_seconds over p->predicted (0 when there is none). */
double pw_plan_snap_share(const pw_plan *p, int r);
/* The rank whose snapshots take the most seconds (the first of equals). */
int pw_plan_snap_worst(const pw_plan *p);
/* The smallest snapshot_every whose share (the worst rank's) is at most
 * PW_PLAN_SNAP_SHARE; 0 without snapshots. */
int pw_plan_snap_every(const pw_plan *p);
/* When the worst rank's share exceeds PW_PLAN_SNAP_SHARE: writes a note
 * naming it, its bytes and train.snapshot_every's pw_plan_snap_every into
 * buf, returns 1; else 0. */
int pw_plan_snap_note(const pw_plan *p, char *buf, size_t cap);
/* {"every", "share", "rank", "suggested_every", "note": string or null}. */
json_t *pw_plan_snap_json(const pw_plan *p);

/* Tensor parallel (plan_tp.c): checks mesh.tp and splits each stage's
 * costs over its tp ranks, adding the all-reduces (called by
 * pw_plan_build before the simulation); and per stage s, shrinks its
 * layout sizes to one tp rank's and adds its all-reduces to rank r's step. */
PW_MUST_CHECK int pw_plan_tp(const pw_job *job, pw_plan *p, pw_err *err);
void pw_plan_tp_rank(const pw_plan *p, int s, pw_prog_sizes *sz, pw_plan_mem *r);

/* What pw_plan_build_costed costs a plan with: a profile (NULL: the FLOP
 * model), and cores > 0 when every rank runs on one host of that many
 * cores (share.h's model enters the prediction). */
typedef struct {
  const pw_cost_profile *profile;
  int cores;
} pw_cost_model;

/* Build and prove the plan. `schedule` (one of the nine names) overrides the
 * job's schedule when not NULL; else the job's own is used: its name, or
 * its custom lists (schedule.custom, pw_sched_from_ranks), which must make
 * mesh.pp x mesh.virtual_stages stages. Errors carry the JSON path of what
 * to change. */
PW_MUST_CHECK int pw_plan_build(const pw_job *job, const char *schedule, pw_plan *out, pw_err *err);
/* pw_plan_build under cost model cm (NULL: the FLOP model on separate hosts). */
PW_MUST_CHECK int pw_plan_build_costed(const pw_job *job, const char *schedule, const pw_cost_model *cm, pw_plan *out,
                                       pw_err *err);
void pw_plan_free(pw_plan *p);
/* Sets p->step_end and p->predicted from p's simulation and memory under
 * cm, c being p's costs (cost_plan.c; pw_plan_build_costed calls it): the
 * makespan, replayed
 * with every rank (pp x dp) on one host of cm->cores cores when that
 * oversubscribes it, plus the slowest rank's step end (the profile's cost
 * for its gradients, and its data-parallel exchange). */
PW_MUST_CHECK int pw_plan_predict(pw_plan *p, const pw_sim_costs *c, const pw_cost_model *cm, pw_err *err);
/* The virtual_stages schedule `schedule` is planned with when the job's
 * do not suit it, as --compare does: its fixed value (dualpipev 2, the
 * flat ones 1), else max(2, the job's) for the interleaved ones. Unknown
 * names: the job's. */
int pw_plan_virtual_stages(const pw_job *job, const char *schedule);

/* Activation slots each stage's program grows to under the worker's slot
 * rule (worker/run.c): microbatch k holds a slot of stage s from when its
 * input activation arrives (or its F starts, when it has none from another
 * stage) until its B ends, or its W after an I; slots are reused, never
 * freed. Worst case over timings: for every point of rank r's list, every
 * other rank is assumed as far ahead as the dependencies allow, so early
 * arrivals count (a rank slow next to the others reaches it). Not counted:
 * the worker frees a B's slot only once the gradient it sends has been
 * written, which on an oversubscribed machine can cost one more slot now
 * and then. peak[S]. Returns 0 or PW_ENOMEM. */
PW_MUST_CHECK int pw_plan_peak_slots(const pw_sched *s, int *peak);

/* Work buffers each remat stage (remat[s] != 0) needs, into n_work[S] (0
 * for the others): its rank runs its list in order, and a stage's program
 * holds a work buffer during each F, B and I, and from an I until its W
 * (common/compute/prog.h) — so the most microbatches between I and W at any
 * F, B or I, plus that one. */
void pw_plan_work(const pw_sched *s, const int *remat, int *n_work);

/* Stages run by pipeline rank r, ascending; returns the count. */
int pw_plan_rank_stages(const pw_plan *p, int r, int *stages, int cap);

/* The document `pipewright plan --json` prints and POST /v1/plans returns:
 * {"job", "schedule", "mesh", "microbatches", "microbatch_size",
 *  "partition": {...}, "stage_to_rank", "plan": (schedule JSON),
 *  "analytics": (simulator JSON), "grid": "text"} (new reference).
 * Memory: each partition stage gains "slot_bytes" (a remat stage's: its
 * keep part), "peak_slots", "remat" (bool), "work_bytes" and "n_work" (remat
 * stages: one work buffer and how many), each analytics rank
 * "memory_bytes" (pw_plan_mem.total) and "memory" {"params", "grads",
 * "adam", "slots", "n_slots", "work", "remat_saved", "scratch", "dp", "tied",
 * "data", "snapshots"}, "dp_bytes_per_step", "dp_seconds_per_step" and
 * "snapshot_bytes_per_step", "snapshot_seconds_per_step", "snapshot_share";
 * a training plan "snapshots" (pw_plan_snap_json). A remat stage's costs
 * "b" and "i" include its F again (the recompute), a zero 2 stage's "w"
 * and "b" its reduce-scatter of the microbatch's weight gradients. A regions model adds "regions": the comparison of
 * pw_regions_compare_json (each region's ranks, stages, schedule and
 * makespan alone; serial against concurrent). */
json_t *pw_plan_json(const pw_job *job, const pw_plan *p);
/* The simulator's costs of p (its arrays; valid while p is). */
pw_sim_costs pw_plan_costs(const pw_plan *p);
/* bytes over the plan's link bandwidth (0 when it has none: a profile
 * without a measured link prices transfers as free, as the simulator does) */
static inline double pw_plan_wire_seconds(const pw_plan *p, double bytes) {
  return p->bandwidth > 0 ? bytes / p->bandwidth : 0;
}

/* Every schedule that can run the job, side by side: the job's own mesh,
 * with virtual_stages as pw_plan_virtual_stages gives it; a job with a
 * custom schedule gets it as a last row, "schedule": "custom"; a regions
 * model one row, "schedule": "regions" (its regions' own schedules).
 * {"job", "rows": [{"schedule", "ok", "error"?, "virtual_stages",
 * "stages", "makespan", "bubble_ratio", "peak_activations", "peak_pending_w",
 * "peak_memory_bytes" (largest rank's pw_plan_mem.total), "actions"}]}
 * (new reference). */
json_t *pw_plan_compare_json(const pw_job *job);
#endif
