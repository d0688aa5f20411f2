/* share: the simulator's step when ranks share CPU cores.
 *
 * pw_sim_run assumes each rank has its own cores. When several ranks run
 * on one host with more threads than cores, the operating system splits
 * the cores among the threads that want them. This replays the same plan
 * under processor sharing: at every moment a host's cores are split
 * evenly among the threads of its ranks that are computing right then
 * (plus any other busy work on the host, counted as always busy), so a
 * rank runs at min(1, cores / busy threads) of its planned rate. A rank
 * that idles in a bubble leaves its share to the others; that is why this
 * bubble can be lower than the plain plan's, never above the pessimistic
 * bound of every rank slowed by cores / threads all the time.
 *
 * Limits: the share is assumed fair and fine-grained (Linux's CFS is
 * close at millisecond scale), a rank's threads are all busy while it
 * computes, transfers and the step end cost no CPU, and with dp > 1 a
 * pipeline rank runs at its slowest replica's rate (replicas run the same
 * lists in step with each other). Times are wall seconds as the workers
 * measure them: an action's duration includes the time it waited for a
 * core, so busy + idle = makespan still holds per rank. */
#ifndef PW_SHARE_H
#define PW_SHARE_H

#include "errors.h"
#include "sim.h"

typedef struct {
  int n_ranks;        /* the job's ranks: replica * pp + pipeline rank (a multiple of pp) */
  const int *host;    /* [n_ranks] host index in 0..n_hosts-1 */
  const int *threads; /* [n_ranks] threads each rank computes with (>= 1) */
  int n_hosts;
  const int *cores;   /* [n_hosts] >= 1 */
  const int *other;   /* [n_hosts] threads of other busy work there, or NULL */
} pw_share;

/* Replays s under sharing sh (sim.h's model otherwise, c as there). A
 * host whose threads never exceed its cores changes nothing: with no
 * oversubscription the result equals pw_sim_run's. Errors: pw_sim_run's,
 * and PW_EINVAL for an sh that does not fit s (path "share"). */
PW_MUST_CHECK int pw_sim_run_shared(const pw_sched *s, const pw_sim_costs *c, const pw_share *sh, pw_sim_result **out,
                                    pw_err *err);

#endif
