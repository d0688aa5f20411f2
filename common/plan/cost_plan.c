/* cost_plan: a built plan's predicted step time under a cost model. */
#include "plan.h"
#include "share.h"

#include <stdlib.h>

int pw_plan_predict(pw_plan *p, const pw_sim_costs *c, const pw_cost_model *cm, pw_err *err) {
  double makespan = p->sim->makespan, end = 0;
  const pw_cost_profile *prof = cm ? cm->profile : NULL;
  int threads = prof ? prof->threads : 1, n = p->pp * p->dp;
  /* shared cores: when the ranks oversubscribe them, or (measured sharing)
   * whenever more than one computes there */
  if (cm && cm->cores > 0 && (n * threads > cm->cores || (n > 1 && prof && prof->n_speed))) {
    int *host = calloc((size_t)n, sizeof(int)), *thr = malloc(sizeof(int) * (size_t)n);
    if (!host || !thr) {
      free(host);
      free(thr);
      return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
    }
    for (int r = 0; r < n; r++) thr[r] = threads;
    pw_share sh = {.n_ranks = n, .host = host, .threads = thr, .n_hosts = 1, .cores = &cm->cores,
                   .speed = prof ? prof->speed : NULL, .n_speed = prof ? prof->n_speed : 0};
    pw_sim_result *res = NULL;
    int rc = pw_sim_run_shared(p->sched, c, &sh, &res, err);
    free(host);
    free(thr);
    if (rc) return rc;
    makespan = res->makespan;
    pw_sim_result_free(res);
  }
  for (int r = 0; r < p->pp; r++) {
    double e = p->mem[r].dp_seconds;
    if (prof && !p->sched->forward_only) e += pw_cost_step_end(prof, p->mem[r].grads / sizeof(float));
    if (e > end) end = e;
  }
  p->step_end = end;
  p->predicted = makespan + end;
  return 0;
}
