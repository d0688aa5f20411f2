/* drain: a stop that keeps the work. With --drain-timeout, the
 * coordinator's SIGTERM (a cluster's preemption signal: Slurm's
 * --signal=B:TERM@N, a pod's termination) first has every training run
 * end at a step of its own choosing with that step's checkpoint, then
 * stops; the jobs go back to the queue and resume from that checkpoint
 * when a coordinator opens the same state directory again (the plain
 * shutdown loses the steps since the last checkpoint instead).
 *
 * Every rank of a run must stop at the same step, and its replicas and tp
 * groups must agree to write that step's checkpoint (the writes gather
 * across them). A rank decides a step's checkpoint before it begins it, so
 * the coordinator names a step no rank can have begun: a margin beyond the
 * last step every rank reported, of 2 steps and half a second of steps
 * more for fast runs (the reports may lag). A rank that has begun it all
 * the same refuses (worker/run.c: pw_run_stop_at), and the run ends at
 * once the plain way. Loop thread only. */
#include <math.h>
#include <stdio.h>

#include "ctl_int.h"
#include "log.h"
#include "store_retry.h"

static pw_ctl *ctl_of(pw_coord *c) { return c->ctl; }

/* The step count to stop at: 0 when the run's own end comes first. */
static int stop_step(const pw_jobrt *jr) {
  double per = jr->step_time > 0 ? jr->step_time : 1.0;
  double margin = 2.0 + ceil(0.5 / per);
  if (margin > 1e6) margin = 1e6;
  long s = (long)jr->steps_done + (long)margin;
  return s < jr->steps ? (int)s : 0;
}

/* A training run on its workers: what a drain stops and waits for (one
 * being planned, or that writes no checkpoint, the shutdown queues again). */
static int drainable(const pw_jobrt *jr) { return !jr->planning && jr->run && jr->final_ckpt; }

int pw_drain_start(pw_coord *c) {
  pw_ctl *ctl = ctl_of(c);
  int n = 0;
  for (pw_jobrt *jr = ctl ? ctl->jobs : NULL; jr; jr = jr->next) {
    if (!drainable(jr)) continue;
    n++;
    int s = stop_step(jr);
    if (!s) {
      pw_info("job %lld: drain: its last step (%d) comes first", (long long)jr->job, jr->steps);
      continue;
    }
    /* first in the store: the checkpoint uploads of step s are checked against it */
    pw_write w = {.kind = PW_W_RUN_STOP, .job = jr->job, .run = jr->run, .step = s};
    if (pw_write_do(c, &w, NULL)) {
      pw_warn("job %lld: drain: the stop step cannot be stored: the run stops the plain way", (long long)jr->job);
      continue;
    }
    jr->stop_at = s;
    char msg[160];
    snprintf(msg, sizeof msg, "the coordinator is stopping: the run ends after step %d with its checkpoint", s);
    pw_jobrt_event(c, jr->job, "drain", msg);
    pw_info("job %lld run %lld: %s (%d reported)", (long long)jr->job, (long long)jr->run, msg, jr->steps_done);
    for (int r = 0; r < jr->n_ranks; r++)
      if (jr->ranks[r])
        pw_ctl_send_msg(jr->ranks[r], PW_CONTROL_BUILD(PW_MSG_STOP, pw_msg_stop, NULL, .job = jr->job, .run = jr->run,
                                                       .steps = s));
  }
  return n;
}

int pw_drain_left(pw_coord *c) {
  pw_ctl *ctl = ctl_of(c);
  int n = 0;
  for (pw_jobrt *jr = ctl ? ctl->jobs : NULL; jr; jr = jr->next)
    n += drainable(jr);
  return n;
}

void pw_drain_run_done(pw_coord *c, pw_jobrt *jr) {
  char why[300];
  pw_store *s = pw_coord_store(c);
  pw_err err = {0};
  int n = 0;
  int stored = s && pw_store_ckpt_step(s, jr->job, jr->stop_at, &n, &err) == 0;
  snprintf(why, sizeof why, "the coordinator stopped (a drain): the run ended after step %d%s", jr->stop_at,
           stored ? " with its checkpoint; the job resumes from it" : ", but its checkpoint is not whole in the store; "
                                                                     "the job resumes from its last whole one");
  pw_jobrt_end(c, jr, "interrupted", PW_JOB_QUEUED, why, NULL);
}

void pw_drain_run_failed(pw_coord *c, pw_jobrt *jr, const char *why) {
  char b[900];
  snprintf(b, sizeof b, "the coordinator stopped (a drain) and the run could not stop at step %d (%s); the job "
           "resumes from its last checkpoint", jr->stop_at, why);
  pw_jobrt_end(c, jr, "interrupted", PW_JOB_QUEUED, b, "the coordinator is stopping");
}
