/* cost_auto: choose pp, schedule, virtual stages and microbatches for a
 * job — the configuration of least predicted step time (cost.h, plan.h's
 * pw_plan_predict) whose every rank fits the budget's memory.
 *
 * Candidates: pp = 1, 2, 4, ... up to max_pp; each of the nine schedules
 * with the virtual stages pw_plan_virtual_stages gives it; microbatches
 * m = 1, 2, 4, ... with m x mesh.dp dividing train.batch_size. The job's
 * partition mode, data parallelism and training settings stay; its
 * placement and custom lists do not (they belong to one mesh). A
 * candidate that cannot be planned (too few layers for its stages, a
 * schedule's rule, the action budget) is left out. */
#ifndef PW_COST_AUTO_H
#define PW_COST_AUTO_H

#include <jansson.h>

#include "budget.h"
#include "cost.h"
#include "plan.h"

typedef struct {
  char schedule[32];
  int pp, V, m, mb_size;
  int dp, threads;     /* the mesh's dp; the threads each rank computes with (its profile's) */
  double predicted, makespan, step_end, bubble;
  size_t peak_memory;  /* largest rank's pw_plan_mem.total */
  int fits;            /* under the budget's memory bound */
  int ok;              /* planned */
  char error[520];     /* !fits: why (pw_err's path and message) */
} pw_auto_row;

/* The ranking, best first (fitting rows before the others), into *rows
 * (malloc'ed, *n_rows of them). PW_ESPEC when nothing can be planned,
 * PW_EBUDGET when nothing fits, PW_ENOMEM. */
PW_MUST_CHECK int pw_plan_auto(const pw_job *job, const pw_cost_model *cm, const pw_budget *b, int max_pp,
                               pw_auto_row **rows, int *n_rows, pw_err *err);
/* One host of `cores` cores, a calibration profile per thread count a rank
 * may compute with (pipewright calibrate --threads T, one file each): every
 * layout of ranks x threads that fits the cores — for each profile's T, dp
 * = 1, 2, 4, ... and pp = 1, 2, 4, ... up to max_pp with pp x dp x T <=
 * cores — with every schedule and microbatch count as above, predicted with
 * that profile (its layer times at T threads, its sharing of the host's
 * cores) and ranked together. The job's batch must divide by dp x m. */
PW_MUST_CHECK int pw_plan_auto_host(const pw_job *job, const pw_cost_profile *profs, int n_profs, int cores,
                                    const pw_budget *b, int max_pp, pw_auto_row **rows, int *n_rows, pw_err *err);
/* {"cost_model", "chosen": row, "rows": [{"pp", "schedule", "virtual_stages",
 * "microbatches", "microbatch_size", "predicted", "makespan", "step_end",
 * "bubble_ratio", "peak_memory_bytes", "fits", "error"?}]} (new reference). */
json_t *pw_auto_json(const pw_auto_row *rows, int n, const char *cost_model);

#endif
