/* jobrt: a run's end and the job writes that sched.c (following runs) and
 * dispatch.c (starting them) both make: the job's state, status line and
 * events, each through store_retry (checked, logged, kept while the store
 * fails); the run's end (workers told and freed, run and job recorded).
 * It never decides when a run ends: its callers do. Loop thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_int.h"
#include "gen.h"
#include "log.h"
#include "store_retry.h"
#include "tbdir.h"

int pw_jobrt_set_state(pw_coord *c, int64_t job, int state, const char *reason, const char *error) {
  pw_write w = {.kind = PW_W_JOB_STATE, .job = job, .state = state, .text = reason, .text2 = error};
  return pw_write_do(c, &w, NULL);
}

void pw_jobrt_set_status(pw_coord *c, int64_t job, const char *status) {
  pw_write w = {.kind = PW_W_JOB_STATUS, .job = job, .text = status};
  pw_write_do(c, &w, NULL); /* logged there; the next pass writes it again */
}

void pw_jobrt_event(pw_coord *c, int64_t job, const char *kind, const char *msg) {
  pw_write ev = {.kind = PW_W_EVENT, .job = job, .text = kind, .text2 = msg};
  pw_write_do(c, &ev, NULL); /* kept when the store fails; logged there */
}

/* The run's workers are free again; told to stop first, with cancel_reason. */
static void release_workers(pw_coord *c, pw_jobrt *jr, const char *cancel_reason) {
  for (int r = 0; r < jr->n_ranks; r++) {
    pw_wconn *w = jr->ranks[r];
    if (!w) continue;
    if (cancel_reason && !jr->planning) /* a reserved worker was sent nothing */
      pw_ctl_send_msg(w, PW_CONTROL_BUILD(PW_MSG_CANCEL, pw_msg_cancel, NULL, .job = jr->job, .run = jr->run,
                                          .reason = cancel_reason));
    w->job = NULL;
    w->rank = -1;
    w->pinned[0] = 0; /* its CPUs are free for the next run */
    pw_registry_update(c, w);
    jr->ranks[r] = NULL;
  }
}

void pw_jobrt_free(pw_jobrt *jr) {
  free(jr->ranks);
  free(jr->acc);
  free(jr);
}

/* Out of the list; freed now, or when its plan comes back (dispatch.c). */
static void jobrt_remove(pw_coord *c, pw_jobrt *jr) {
  pw_ctl *ctl = c->ctl;
  for (pw_jobrt **p = &ctl->jobs; *p; p = &(*p)->next)
    if (*p == jr) {
      *p = jr->next;
      break;
    }
  if (jr->planning) jr->ended = 1;
  else pw_jobrt_free(jr);
}

void pw_jobrt_end(pw_coord *c, pw_jobrt *jr, const char *run_state, int job_state, const char *reason,
                  const char *cancel_reason) {
  release_workers(c, jr, cancel_reason);
  pw_gen_job_ended(c, jr->job, reason); /* a serve job's open requests */
  if (jr->run) {
    pw_write w = {.kind = PW_W_RUN_FINISH, .run = jr->run, .job = jr->job, .text = run_state,
                  .text2 = strcmp(run_state, "succeeded") ? reason : NULL};
    pw_write_do(c, &w, NULL);
  }
  if (job_state >= 0) pw_jobrt_set_state(c, jr->job, job_state, reason, job_state == PW_JOB_FAILED ? reason : NULL);
  if (job_state == PW_JOB_SUCCEEDED || job_state == PW_JOB_FAILED || job_state == PW_JOB_CANCELLED)
    pw_rec_forget(c, jr->job);
  pw_tbdir_end(c, jr->job, jr->run); /* --tensorboard-dir: the run's file, whole, now */
  pw_info("job %lld run %lld %s: %s", (long long)jr->job, (long long)jr->run, run_state, reason);
  jobrt_remove(c, jr);
}

void pw_jobrt_lost_write(pw_coord *c, pw_jobrt *jr, const char *what) {
  char why[300];
  snprintf(why, sizeof why, "the store could not record %s (the store is failing: see the coordinator's log)", what);
  pw_jobrt_end(c, jr, "failed", PW_JOB_FAILED, why, "the coordinator's store is failing");
}

