/* ctl_int: the control loop's private state, shared by ctlsrv.c (worker
 * links), sched.c (jobs: following runs, cancel), dispatch.c (starting
 * them) and jobrt.c (ending them). Loop thread only. */
#ifndef PW_CTL_INT_H
#define PW_CTL_INT_H

#include <stdio.h>

#include "coord.h"
#include "cpuset.h"
#include "spec.h"

typedef struct pw_wconn pw_wconn;
typedef struct pw_jobrt pw_jobrt;

/* A snapshot a worker holds in memory: the state of a stage of a job after
 * `step` steps (held: a peer's stage; else its own). recovery.c mirrors
 * each worker's store from its "snapshot" messages, with the worker's own
 * rule: the newest PW_REC_GENS steps of each (job, stage, held). */
#define PW_REC_GENS 2
typedef struct {
  int64_t job;
  int stage, step, held;
} pw_snapinv;

/* A worker's control link. */
struct pw_wconn {
  uv_tcp_t tcp;
  pw_coord *c;
  pw_control_reader reader;
  int registered;
  int closing;
  int64_t id;              /* store id once registered */
  char name[64];
  char addr[96];
  char host[64];           /* its machine (register.host), "worker:<name>" without one: a host of its own */
  int64_t memory;          /* bytes it reported at register, 0: unknown */
  int threads;             /* register.threads: the CPUs a rank of it is given when pinned */
  char cpus[PW_CPUSET_TEXT]; /* register.cpus (its affinity mask), "" unknown: never pinned */
  char numa[PW_CPUSET_TEXT]; /* register.numa, "" one node */
  char pinned[PW_CPUSET_TEXT]; /* the CPUs its current rank runs on (assign.cpus), "" none (pin.c) */
  double last_seen;        /* monotonic seconds */
  pw_jobrt *job;           /* the run it serves, or NULL */
  int rank;
  int draining;            /* still busy with a run we do not know: not idle */
  pw_snapinv *snaps;       /* what it holds in memory (recovery.c) */
  int n_snaps, cap_snaps;
  pw_wconn *next;
};

/* A step's reports being collected from every rank. Ranks report a step
 * after the step's barrier, so at most a few steps are open at once, but
 * nothing bounds how late the coordinator reads one link: the table grows. */
typedef struct {
  int step;                /* -1: free */
  int reports;
  double loss, tokens, step_time, grad_norm, lr, eval_loss;
  int has_loss, has_grad, has_lr;
  int loss_ranks, has_eval; /* reports of a last stage, and those carrying an eval loss share */
  int nonfinite;           /* bits of the ranks' step.nonfinite: 1 loss, 2 grad norm */
} pw_step_acc;

/* A job running on workers. */
struct pw_jobrt {
  int64_t job, run;        /* run is 0 until the plan is recorded */
  int n_ranks, n_stages, steps, start_step;
  int pp, tp;              /* the mesh: rank r is pipeline rank r / tp % pp, replica r / tp / pp, tp rank r % tp */
  pw_wconn **ranks;        /* [n_ranks]: reserved while planning, then assigned */
  int planning;            /* its plan is being built on a worker thread */
  int ended;               /* ended while planning: freed when the plan is back */
  int on_nonfinite;        /* pw_nonfinite of the spec */
  int final_ckpt;          /* a training job: its last step's checkpoint must be stored before it succeeds */
  int max_restarts;        /* train.max_restarts */
  int steps_done;          /* steps every rank has reported (start_step at first) */
  double step_time;        /* the last step's seconds, as its slowest rank reported them */
  int stop_at;             /* a drain told the ranks to stop after this many steps (drain.c); 0: none */
  int done;
  pw_step_acc *acc;        /* open steps */
  int n_acc;
  pw_jobrt *next;
};

/* The job side of the control plane, as the transport (ctlsrv.c) sees
 * it: sched.c fills one (pw_sched_hooks) and main.c hands it to
 * pw_ctl_server_start, so ctlsrv.c never names a function of sched.c.
 * Handlers get ctx = the pw_coord, conn = the pw_wconn. */
struct pw_ctl_hooks {
  pw_control_handlers msgs;  /* messages of registered workers beyond register
                                and heartbeat (the transport's own) */
  void (*tick)(pw_coord *c); /* a scheduling pass: every second, on wake, and
                                when a worker registers or becomes idle */
  void (*lost)(pw_coord *c, pw_wconn *w, const char *why); /* a busy worker's link is gone */
  void (*shutdown)(pw_coord *c); /* the server stops: runs back to the queue */
};

/* Which worker ran which rank of a job's last run, so a restart gives the
 * survivors their ranks back (their own snapshots then restore in place). */
typedef struct pw_jobmem {
  int64_t job;
  int n;
  char (*names)[64];
  struct pw_jobmem *next;
} pw_jobmem;

typedef struct {
  uv_tcp_t listener;
  uv_timer_t tick;
  pw_wconn *conns;
  pw_jobrt *jobs;
  pw_jobmem *mem;          /* placements of jobs that may run again */
  double last_store_seen;  /* throttles worker heartbeats to the store */
  const pw_ctl_hooks *hooks;
  pw_control_handlers handlers; /* the transport's own and the hooks' messages */
} pw_ctl;

double pw_mono(void);
/* ctlsrv.c */
void pw_ctl_send_msg(pw_wconn *w, json_t *msg);  /* steals msg; NULL (a build that failed) is logged */
void pw_ctl_drop(pw_wconn *w, const char *why);
void pw_registry_update(pw_coord *c, pw_wconn *w);
/* welcome.http_url for a worker whose control link came in on local
 * (NULL: unknown); "" when none can be known. */
struct sockaddr;
void pw_ctl_http_url(pw_coord *c, const struct sockaddr *local, char *out, size_t cap);

/* jobrt.c: a run's end and its job's writes, for sched.c and dispatch.c.
 * Every write goes through store_retry: checked, logged when it fails and
 * kept until the store takes it. */
int pw_jobrt_set_state(pw_coord *c, int64_t job, int state, const char *reason, const char *error);
void pw_jobrt_set_status(pw_coord *c, int64_t job, const char *status); /* never kept: the next pass writes it again */
void pw_jobrt_event(pw_coord *c, int64_t job, const char *kind, const char *msg);
/* The run ends: workers told (with cancel_reason, unless NULL) and freed,
 * the run and the job recorded (job_state < 0 leaves the job's state
 * alone); jr out of the list, freed unless its plan is still being built
 * (then dispatch.c frees it when the plan comes back: jr->ended). */
void pw_jobrt_end(pw_coord *c, pw_jobrt *jr, const char *run_state, int job_state, const char *reason,
                  const char *cancel_reason);
/* A write of the run was given up (too many pending): the job cannot be
 * recorded as it ran, so it fails saying so. */
void pw_jobrt_lost_write(pw_coord *c, pw_jobrt *jr, const char *what);
void pw_jobrt_free(pw_jobrt *jr);

/* drain.c (pw_drain_start, pw_drain_left: coord.h). A drained run's end:
 * all ranks done (it goes back to the queue, to resume from that
 * checkpoint), or a rank failed or could not stop there (back to the
 * queue at once). */
void pw_drain_run_done(pw_coord *c, pw_jobrt *jr);
void pw_drain_run_failed(pw_coord *c, pw_jobrt *jr, const char *why);

/* pin.c: the CPUs of each rank of jr on a host it shares with other ranks
 * of the run, disjoint from each other's and from what other runs' ranks
 * on that host hold (w->pinned; common/base/cpuset.h's choice); a host
 * whose ranks do not all fit is left unpinned, and the log says why. */
void pw_pin_ranks(pw_coord *c, pw_jobrt *jr);

/* dispatch.c: starts a run of job `id` on the workers ws (job's mesh size
 * of them, rank order): reserves them, marks the job planning and plans on
 * a worker thread; back on the loop the run is recorded, its start chosen
 * and every rank assigned. Takes job (freed with the work). */
void pw_dispatch(pw_coord *c, pw_store *s, int64_t id, pw_job *job, pw_wconn **ws);

/* recovery.c: what a restart after a lost worker starts from. */
void pw_rec_snapshot_add(pw_wconn *w, int64_t job, int stage, int step, int held);
/* w keeps only job's snapshots (0: none), as the worker does. */
void pw_rec_snapshots_keep(pw_wconn *w, int64_t job);
/* No worker's snapshots of job are to be used (a restore from them failed). */
void pw_rec_snapshots_forget(pw_coord *c, int64_t job);
void pw_rec_conn_free(pw_wconn *w);
/* Remembers jr's placement (rank -> worker name) for its next run; forget
 * drops it when the job will not run again. */
void pw_rec_remember(pw_coord *c, const pw_jobrt *jr);
void pw_rec_forget(pw_coord *c, int64_t job);
void pw_rec_free_all(pw_coord *c);
/* The `need` workers of the `n_idle` idle ones a run of job gets, in rank
 * order: the last run's workers keep their ranks, then workers holding the
 * job's snapshots, then the rest by id. */
void pw_rec_choose(pw_coord *c, int64_t job, int need, pw_wconn **idle, int n_idle, pw_wconn **out);
/* The newest step after `after` and before `before` whose every stage
 * (S, on pipeline rank stage_rank[st]) is in the memory of one of jr's
 * ranks; *from gets, per stage, the global rank that sends it (a rank of
 * the stage's own when one holds it). 0 when there is none. */
int pw_rec_restore_point(const pw_jobrt *jr, int S, int pp, const int *stage_rank, int after, int before,
                         json_t **from);

/* A worker's host: the machine id it registered with, or "worker:<name>"
 * (a host of its own) when it sent none. Ranks on one host share its cores
 * (contention.c) and a worker's peers learn it (assign.peers[].host). */
static inline void pw_host_key(char *key, size_t cap, const char *host, const char *name) {
  if (host && host[0])
    snprintf(key, cap, "%s", host);
  else
    snprintf(key, cap, "worker:%.56s", name);
}

#endif
