/* regions: the joint plan of a regions model (model.regions) — each region
 * on pipeline ranks of its own, under its own schedule, the stage graph no
 * longer a chain.
 *
 * Stages are numbered in model order, region after region (every region
 * after those feeding it), so an upstream stage always has the lower
 * number. Region r holds stages [stage_lo, stage_hi) on ranks [rank_lo,
 * rank_hi), in the order listed; its stages are its layers cut at its
 * stage_boundary markers (pp x virtual_stages of them); a fusion layer
 * rides with the first stage of the region it begins. Each region's
 * action lists are its schedule's, with stages and ranks renumbered; the
 * stage graph (pw_sched.pred) joins them: a fusion stage reads the last
 * stage of every region feeding it and sends each its gradient. */
#ifndef PW_REGIONS_H
#define PW_REGIONS_H

#include <jansson.h>

#include "cost.h"
#include "errors.h"
#include "partition.h"
#include "schedule.h"
#include "sim.h"
#include "spec.h"

typedef struct {
  int stage_lo, stage_hi;  /* its stages */
  int rank_lo, rank_hi;    /* its ranks */
} pw_region_span;

/* The partition (cuts at each region's markers) and the joint schedule of
 * job's regions model m. spans[n_regions]. Errors name the region:
 * "model.regions[1]: 0 stage_boundary markers make 1 stage, but its mesh
 * runs pp * virtual_stages = 2 * 1 = 2", or a schedule's constraint
 * ("model.regions[0].schedule.name: ..."). */
PW_MUST_CHECK int pw_regions_plan(const pw_job *job, const pw_model *m, pw_partition *part, pw_sched **out,
                                  pw_region_span *spans, pw_err *err);

/* The serial execution of the same plan (what a runtime that runs regions
 * one after another does), on the widest region's ranks: region r's stage
 * on rank q of the joint plan's region ranks runs on rank q. Each rank runs
 * the feeding regions' forwards (their lists' F's, region by region), the
 * last region's whole list, then the feeding regions' backwards (their
 * lists' B, I and W, last region first). Same stages, graph and
 * microbatches as joint. */
PW_MUST_CHECK int pw_regions_serial(const pw_job *job, const pw_sched *joint, const pw_region_span *spans,
                                    pw_sched **out, pw_err *err);

/* The joint (concurrent) plan against the serial one, replayed with the
 * same costs c (over all stages), and each region's own schedule alone on
 * its stages: {"regions": [{"name", "schedule", "ranks", "stages",
 * "makespan", "from" (the regions feeding it), "fusion"}], "serial": {"makespan", "ranks", "bubble_ratio"},
 * "concurrent": {...}, "speedup": serial / concurrent} (new reference),
 * NULL with err set. cores > 0 adds "cores": {"cores", "serial",
 * "concurrent", "speedup", "serial_busy", "concurrent_busy"}: both
 * replayed with every rank on one host of that many cores (share.h, with
 * prof's measured sharing when prof is given), as on one machine, each
 * rank's wall time computing in the replay in the _busy arrays; with prof and part (the plan's partition)
 * also "predicted": {"serial", "concurrent", "speedup"}, those makespans
 * plus the slowest rank's step end (cost.h) — the steps the calibrated
 * model predicts. */
json_t *pw_regions_compare_json(const pw_job *job, const pw_sched *joint, const pw_region_span *spans,
                                const pw_sim_costs *c, int cores, const pw_cost_profile *prof,
                                const pw_partition *part, pw_err *err);

/* From a plan document (pw_plan_json) of a regions model: [{"name",
 * "ranks": [pipeline rank, ...]}], each region with the ranks its stages
 * run on — what a timeline groups its lanes by. NULL for any other plan
 * (new reference). */
json_t *pw_regions_lanes_json(const json_t *plan_doc);

#endif
