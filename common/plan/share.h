/* share: the simulator's step when ranks share CPU cores.
 *
 * pw_sim_run assumes each rank has its own cores. When several ranks run
 * on one host with more threads than cores, they take turns. The model
 * here: a host's cores are slots. A rank whose inputs are there starts its
 * next unit when the threads computing on its host plus its own fit in the
 * cores (or nothing else of the job computes there); otherwise it waits,
 * idle, until a unit there ends. A rank that ends a unit and can go on
 * keeps its cores (no switch happens); the others take free cores in the
 * order they became ready. A unit, once started, runs at full rate unless
 * other busy work shares the host (rate cores / (threads computing +
 * other threads)) or the rank alone has more threads than cores.
 *
 * Why slots and not processor sharing (every busy thread slowed to cores /
 * busy threads, idle ranks leaving their share to the others): the
 * workers time an action from its start to its end, so a rank waiting for
 * a core before it starts is idle in the measured timeline, and actions
 * of a few milliseconds mostly run to their end once on a core. Processor
 * sharing stretches actions instead and predicts a bubble below the plain
 * plan's; on a 2-core machine with 4 one-thread ranks the measured bubble
 * was above both, and near this model's (docs/architecture.md, "Ranks
 * that share cores", has the figures).
 *
 * Measured sharing (speed, from a calibration profile: cost.h): n busy
 * one-thread processes on a host each compute at speed[n-1] of one alone,
 * as measured by running n at once — below 1 even within the cores
 * (shared caches, memory bandwidth), and above them the time slicing with
 * its own cost (switches, caches refilled). Then no rank waits for a
 * core: every ready rank computes, at the speed of the threads computing
 * on its host (processor sharing). Workers' timelines on an
 * oversubscribed host show that: a rank's actions stretch (4 one-thread
 * ranks on 2 cores: 8 ms units took 13-16 ms), and with the measured
 * speeds this model's step came 2-8 % below the measured one where the
 * slots' came 4-9 % below (docs/architecture.md, "Ranks that share
 * cores").
 *
 * Limits: no scheduler is this tidy (long actions are preempted and
 * stretch; waking a rank costs time), transfers and the step end cost no
 * CPU, and with dp > 1 a pipeline rank waits for cores on every replica's
 * host (replicas run the same lists in step with each other). Times are
 * wall seconds as the workers measure them. */
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
  const double *speed; /* [n_speed] measured speed of each of n busy threads ([n-1]), or NULL: slots */
  int n_speed;         /* beyond it: speed[n_speed-1] x n_speed / n */
} pw_share;

/* Replays s under sharing sh (sim.h's model otherwise, c as there). A
 * host whose threads never exceed its cores changes nothing unless sh has
 * measured speeds: with neither the result equals pw_sim_run's. Errors: pw_sim_run's,
 * and PW_EINVAL for an sh that does not fit s (path "share"). */
PW_MUST_CHECK int pw_sim_run_shared(const pw_sched *s, const pw_sim_costs *c, const pw_share *sh, pw_sim_result **out,
                                    pw_err *err);

#endif
