/* sched: the job lifecycle on the control loop.
 *
 *   queued -> planning -> dispatching -> running -> succeeded | failed | cancelled
 *
 * A queued job waits, and says so in its status, until enough idle workers
 * are connected; then it is planned (the same pw_plan_build as
 * `pipewright plan`) once per run: the plan's canonical text is stored
 * (runs.plan) and hashed, its partition, action lists and rank -> worker
 * assignments are recorded, and each worker gets only its own slice of it
 * (common/plan/slice.h), which carries the plan's hash. Step reports are collected from every
 * rank and recorded as one metrics row per step. A worker that errs fails
 * the run with a reason naming it, and the others are told to stop; a
 * cancelled job's workers are stopped and freed. A worker that is lost (its
 * link closed, its heartbeats stopped, or its peers' links to it broke) is
 * fenced — its link dropped, so nothing it still says about the run counts
 * — and the run ends as interrupted: the job goes back to the queue, up to
 * train.max_restarts times, and its next run resumes from the workers'
 * in-memory snapshots or the newest checkpoint (recovery.c). A run
 * interrupted by a coordinator shutdown or crash goes back to the queue
 * too and resumes from the last complete checkpoint.
 *
 * Planning runs on a worker thread (uv_queue_work): a large spec plans
 * for seconds, and the loop must keep answering heartbeats. The job shows
 * as planning meanwhile, its workers reserved; cancelling it, losing one
 * of them or shutting down ends it, and the plan is dropped when it
 * comes back. Every store write goes through store_retry.h: checked,
 * logged when it fails, kept in memory until the store takes it; no new
 * run starts while writes are pending. A step whose loss or gradient norm
 * is not finite is recorded as such and fails the job ("diverged at step
 * N") unless the spec's train.on_nonfinite is "skip". Loop thread only. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spec_json.h"
#include "checkpoints.h"
#include "contention.h"
#include "ctl_int.h"
#include "gen.h"
#include "log.h"
#include "plan.h"
#include "budget.h"
#include "slice.h"
#include "store_retry.h"

static pw_ctl *ctl_of(pw_coord *c) { return c->ctl; }

/* ---- writes -------------------------------------------------------------- */

/* Every write of a running job goes through store_retry: checked, logged
 * when it fails and kept until the store takes it. */
static int write_state(pw_coord *c, int64_t job, int state, const char *reason, const char *error) {
  pw_write w = {.kind = PW_W_JOB_STATE, .job = job, .state = state, .text = reason, .text2 = error};
  return pw_write_do(c, &w, NULL);
}

static void write_status(pw_coord *c, int64_t job, const char *status) {
  pw_write w = {.kind = PW_W_JOB_STATUS, .job = job, .text = status};
  pw_write_do(c, &w, NULL); /* logged there; the next pass writes it again */
}

static void release_workers(pw_coord *c, pw_jobrt *jr, const char *cancel_reason) {
  for (int r = 0; r < jr->n_ranks; r++) {
    pw_wconn *w = jr->ranks[r];
    if (!w) continue;
    if (cancel_reason && !jr->planning) /* a reserved worker was sent nothing */
      pw_ctl_send_msg(w, PW_CONTROL_BUILD(PW_MSG_CANCEL, pw_msg_cancel, NULL, .job = jr->job, .run = jr->run,
                                          .reason = cancel_reason));
    w->job = NULL;
    w->rank = -1;
    pw_registry_update(c, w);
    jr->ranks[r] = NULL;
  }
}

static void jobrt_free(pw_jobrt *jr) {
  free(jr->ranks);
  free(jr->acc);
  free(jr);
}

/* Out of the list; freed now, or when its plan comes back. */
static void jobrt_remove(pw_coord *c, pw_jobrt *jr) {
  for (pw_jobrt **p = &ctl_of(c)->jobs; *p; p = &(*p)->next)
    if (*p == jr) {
      *p = jr->next;
      break;
    }
  if (jr->planning) jr->ended = 1;
  else jobrt_free(jr);
}

/* The run ends: workers told (unless they finished) and freed, the run and
 * the job recorded. job_state < 0 leaves the job's state alone. */
static void end_run(pw_coord *c, pw_jobrt *jr, const char *run_state, int job_state, const char *reason,
                    const char *cancel_reason) {
  release_workers(c, jr, cancel_reason);
  pw_gen_job_ended(c, jr->job, reason); /* a serve job's open requests */
  if (jr->run) {
    pw_write w = {.kind = PW_W_RUN_FINISH, .run = jr->run, .job = jr->job, .text = run_state,
                  .text2 = strcmp(run_state, "succeeded") ? reason : NULL};
    pw_write_do(c, &w, NULL);
  }
  if (job_state >= 0) write_state(c, jr->job, job_state, reason, job_state == PW_JOB_FAILED ? reason : NULL);
  if (job_state == PW_JOB_SUCCEEDED || job_state == PW_JOB_FAILED || job_state == PW_JOB_CANCELLED)
    pw_rec_forget(c, jr->job);
  pw_info("job %lld run %lld %s: %s", (long long)jr->job, (long long)jr->run, run_state, reason);
  jobrt_remove(c, jr);
}

/* A write of this run was given up (too many pending): the job cannot be
 * recorded as it ran, so it fails saying so. */
static void lost_write(pw_coord *c, pw_jobrt *jr, const char *what) {
  char why[300];
  snprintf(why, sizeof why, "the store could not record %s (the store is failing: see the coordinator's log)", what);
  end_run(c, jr, "failed", PW_JOB_FAILED, why, "the coordinator's store is failing");
}

/* ---- dispatch ----------------------------------------------------------- */

static int cmp_conn(const void *a, const void *b) {
  const pw_wconn *x = *(pw_wconn *const *)a, *y = *(pw_wconn *const *)b;
  return x->id < y->id ? -1 : x->id > y->id;
}

static int idle_workers(pw_coord *c, pw_wconn **out, int cap) {
  int n = 0;
  for (pw_wconn *w = ctl_of(c)->conns; w; w = w->next)
    if (w->registered && !w->closing && !w->job && !w->draining && n < cap) out[n++] = w;
  qsort(out, (size_t)n, sizeof *out, cmp_conn);
  return n;
}

/* Everything dispatch needs from the plan, built on a worker thread
 * (uv_queue_work): planning a large spec takes seconds, and the loop must
 * keep answering heartbeats meanwhile. The thread touches only this. */
typedef struct {
  uv_work_t req;
  pw_coord *c;
  pw_jobrt *jr;
  pw_job job;
  pw_budget budget;          /* the plan must fit the workers it was given */
  /* results */
  int rc;
  pw_err err;
  int S, pp, n;              /* stages, pipeline ranks, ranks */
  char *plan_text;           /* canonical plan (runs.plan) */
  char plan_sha[PW_SHA256_HEX_LEN + 1];
  char **slices;             /* [n] */
  char (*slice_sha)[PW_SHA256_HEX_LEN + 1];
  char **actions;            /* [pp] action lists, text form */
  char **layers;             /* [S] layer names, JSON */
  int *stage_rank;           /* [S] */
  int64_t *params;           /* [S] */
  double *flops;             /* [S] */
  int ckpt_upto;             /* resume from a checkpoint of at most this step */
  char skipped[600];         /* the checkpoints passed over as unreadable, said in the job's events */
} planwork;

static void planwork_free(planwork *pw) {
  for (int r = 0; pw->slices && r < pw->n; r++) free(pw->slices[r]);
  for (int r = 0; pw->actions && r < pw->pp; r++) free(pw->actions[r]);
  for (int s = 0; pw->layers && s < pw->S; s++) free(pw->layers[s]);
  free(pw->slices);
  free(pw->slice_sha);
  free(pw->actions);
  free(pw->layers);
  free(pw->stage_rank);
  free(pw->params);
  free(pw->flops);
  free(pw->plan_text);
  pw_job_free(&pw->job);
  free(pw);
}

static char *actions_text(const pw_sched *sc, int r) {
  int len = pw_actions_format(sc->actions[r], sc->n_actions[r], NULL, 0);
  char *t = malloc((size_t)len + 1);
  if (t) pw_actions_format(sc->actions[r], sc->n_actions[r], t, (size_t)len + 1);
  return t;
}

/* The newest complete checkpoint whose shards all read back intact: one
 * damaged on disk (a flipped bit, a lost file) is passed over, and said,
 * rather than handed to the workers, whose load would fail the run again
 * at every retry. Reads the shards: on the planning thread. */
static void intact_checkpoint(planwork *pw) {
  pw_store *s = pw_coord_store(pw->c);
  int upto = INT_MAX;
  size_t l = 0;
  pw->ckpt_upto = INT_MAX;
  pw->skipped[0] = 0;
  for (int tries = 0; s && tries < 64; tries++) {
    int step = 0, have = 0;
    if (pw_store_ckpt_latest_upto(s, pw->jr->job, upto, &step, &have, NULL)) return;
    pw_err err = {0};
    if (!pw_ck_step_check(pw->c->state_dir, pw->jr->job, step, have, &err)) return;
    char b[400];
    if (l < sizeof pw->skipped)
      l += (size_t)snprintf(pw->skipped + l, sizeof pw->skipped - l, "%sthe checkpoint of step %d (%s)", l ? "; " : "",
                            step, pw_err_str(&err, b, sizeof b));
    pw->ckpt_upto = upto = step - 1;
  }
}

/* Worker thread: the plan (once per run), its canonical text and hash,
 * every rank's slice, and what the store records of it. */
static void plan_work(uv_work_t *req) {
  planwork *pw = req->data;
  intact_checkpoint(pw);
  pw_plan p;
  if ((pw->rc = pw_plan_build(&pw->job, NULL, &p, &pw->err))) return;
  /* Submit checked the workers connected then; these may be smaller. */
  if ((pw->rc = pw_plan_check_fit(&pw->job, &p, &pw->budget, &pw->err))) goto out;
  pw->S = p.S;
  pw->pp = p.pp;
  json_t *pj = pw_plan_json(&pw->job, &p);
  pw->rc = pw_slice_plan_text(pj, &pw->plan_text, pw->plan_sha);
  json_decref(pj);
  pw->slices = calloc((size_t)pw->n, sizeof *pw->slices);
  pw->slice_sha = calloc((size_t)pw->n, sizeof *pw->slice_sha);
  pw->actions = calloc((size_t)p.pp, sizeof *pw->actions);
  pw->layers = calloc((size_t)p.S, sizeof *pw->layers);
  pw->stage_rank = calloc((size_t)p.S, sizeof *pw->stage_rank);
  pw->params = calloc((size_t)p.S, sizeof *pw->params);
  pw->flops = calloc((size_t)p.S, sizeof *pw->flops);
  if (pw->rc || !pw->slices || !pw->slice_sha || !pw->actions || !pw->layers || !pw->stage_rank || !pw->params ||
      !pw->flops) {
    pw->rc = pw_err_set(&pw->err, PW_ENOMEM, "plan", "out of memory");
    goto out;
  }
  for (int r = 0; r < pw->n && !pw->rc; r++)
    pw->rc = pw_slice_build(&pw->job, &p, r, pw->plan_sha, &pw->slices[r], pw->slice_sha[r], &pw->err);
  for (int r = 0; r < p.pp && !pw->rc; r++)
    if (!(pw->actions[r] = actions_text(p.sched, r))) pw->rc = pw_err_set(&pw->err, PW_ENOMEM, "plan", "out of memory");
  for (int st = 0; st < p.S && !pw->rc; st++) {
    const pw_stage *sg = &p.part.stages[st];
    json_t *names = json_array();
    for (int l = sg->layer_lo; l < sg->layer_hi; l++) json_array_append_new(names, json_string(p.model.layers[l].name));
    pw->layers[st] = json_dumps(names, JSON_COMPACT);
    json_decref(names);
    if (!pw->layers[st]) pw->rc = pw_err_set(&pw->err, PW_ENOMEM, "plan", "out of memory");
    pw->stage_rank[st] = p.sched->stage_to_rank[st];
    pw->params[st] = (int64_t)sg->params;
    pw->flops[st] = (sg->flops_f + sg->flops_i + sg->flops_w) * p.mb_size;
  }
out:
  pw_plan_free(&p);
}

/* Where to resume: the newest complete step in the coordinator's store
 * (every stage's model and optimizer shard arrived, from any earlier run)
 * up to `upto`.
 * The assign's resume names it ("12"): each worker fetches its stages'
 * shards from GET /v1/jobs/{id}/checkpoints/{step}/stages/{stage}. */
static int resume_point(pw_store *s, int64_t job, int n_stages, int upto, char *resume, size_t cap) {
  pw_err err = {0};
  char b[600];
  int step = 0, have = 0;
  int rc = pw_store_ckpt_latest_upto(s, job, upto, &step, &have, &err);
  if (rc) {
    if (rc != PW_ENOENT) pw_warn("job %lld: cannot read its checkpoints (%s): starting from step 0", (long long)job,
                                 pw_err_str(&err, b, sizeof b));
    return 0;
  }
  if (have != n_stages) { /* the same spec plans the same stages: this is not expected */
    pw_warn("job %lld: its checkpoint of step %d has %d stages, the plan %d: starting from step 0", (long long)job,
            step, have, n_stages);
    return 0;
  }
  snprintf(resume, cap, "%d", step);
  return step;
}

static void event(pw_coord *c, int64_t job, const char *kind, const char *msg) {
  pw_write ev = {.kind = PW_W_EVENT, .job = job, .text = kind, .text2 = msg};
  pw_write_do(c, &ev, NULL); /* kept when the store fails; logged there */
}

/* The attempt a run is (1, 2, ...), from the store; 0 when unknown. */
static int attempt_of(pw_coord *c, const pw_jobrt *jr) {
  pw_store *s = pw_coord_store(c);
  json_t *a = NULL;
  int n = 0;
  if (s && !pw_store_attempts_json(s, jr->job, &a, NULL)) {
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) if (json_integer_value(json_object_get(x, "run")) == jr->run) n =
        (int)json_integer_value(json_object_get(x, "attempt"));
  }
  json_decref(a);
  return n;
}

/* Where the run starts, in its row and as the job's event. */
static void record_start(pw_coord *c, pw_jobrt *jr, int step, const char *source) {
  pw_write w = {.kind = PW_W_RUN_RESUME, .run = jr->run, .step = step, .text = source};
  pw_write_do(c, &w, NULL);
  char msg[160];
  int n = attempt_of(c, jr);
  if (!strcmp(source, "snapshot"))
    snprintf(msg, sizeof msg, "attempt %d resumes at step %d from snapshots in worker memory", n, step);
  else if (!strcmp(source, "checkpoint"))
    snprintf(msg, sizeof msg, "attempt %d resumes at step %d from the checkpoint of step %d", n, step, step);
  else
    snprintf(msg, sizeof msg, "attempt %d starts at step 0", n);
  event(c, jr->job, "resume", msg);
  pw_info("job %lld: %s", (long long)jr->job, msg);
}

/* Loop: the run recorded, each rank sent its slice. Store writes that
 * fail before the first assign put the job back in the queue (nothing ran
 * yet); after it, they are kept for a retry like any run's. */
static void plan_done(uv_work_t *req, int status) {
  planwork *pw = req->data;
  pw_coord *c = pw->c;
  pw_jobrt *jr = pw->jr;
  const pw_job *job = &pw->job;
  jr->planning = 0;
  if (jr->ended || c->stopping) { /* cancelled, a worker lost, or shutting down meanwhile */
    pw_info("job %lld: its plan is ready but the job ended meanwhile: dropped", (long long)jr->job);
    if (!jr->ended) end_run(c, jr, "interrupted", PW_JOB_QUEUED, "coordinator shutting down", NULL);
    else jobrt_free(jr);
    planwork_free(pw);
    return;
  }
  pw_err err = {0};
  char b[600];
  pw_store *s = pw_coord_store(c);
  if (status || pw->rc) {
    char e[600];
    if (status) pw_err_set(&pw->err, PW_EINTERNAL, "plan", "planning was cancelled: %s", uv_strerror(status));
    snprintf(b, sizeof b, "planning failed: %s", pw_err_str(&pw->err, e, sizeof e));
    end_run(c, jr, "failed", PW_JOB_FAILED, b, NULL);
    planwork_free(pw);
    return;
  }
  int rc = s ? pw_store_run_insert(s, jr->job, pw->plan_text, &jr->run, &err)
             : pw_err_set(&err, PW_EIO, "store", "the store cannot be opened");
  if (rc) {
    char e[600];
    snprintf(b, sizeof b, "cannot record the run: %s", pw_err_str(&err, e, sizeof e));
    pw_error("job %lld: %s", (long long)jr->job, b);
    end_run(c, jr, "failed", rc == PW_EIO || rc == PW_ENOMEM ? PW_JOB_QUEUED : PW_JOB_FAILED, b, NULL);
    planwork_free(pw);
    return;
  }
  for (int st = 0; st < pw->S; st++) {
    pw_write w = {.kind = PW_W_STAGE, .job = jr->job, .run = jr->run, .stage = st, .rank = pw->stage_rank[st],
                  .text = pw->layers[st], .bytes = pw->params[st], .flops = pw->flops[st]};
    pw_write_do(c, &w, NULL);
  }
  for (int r = 0; r < pw->pp; r++) {
    pw_write w = {.kind = PW_W_ACTIONS, .job = jr->job, .run = jr->run, .rank = r, .text = pw->actions[r]};
    pw_write_do(c, &w, NULL);
  }
  if (write_state(c, jr->job, PW_JOB_DISPATCHING, "plan recorded", NULL) < 0) {
    end_run(c, jr, "failed", -1, "the job changed state while it was planned", NULL);
    planwork_free(pw);
    return;
  }
  /* A run resumes at a step whose predecessors are all recorded: a lost
   * rank's last reports may never have come, and a step the store has no
   * metrics for is run again rather than left a hole. */
  pw_job_brief jb = {0};
  int recorded = 0;
  if (!pw_store_job_brief(s, jr->job, &jb, &err)) recorded = jb.steps_done;
  free(jb.spec);
  char resume[1024] = "";
  if (pw->skipped[0]) {
    char msg[700];
    snprintf(msg, sizeof msg, "passed over as unreadable: %s", pw->skipped);
    pw_warn("job %lld: %s", (long long)jr->job, msg);
    event(c, jr->job, "resume", msg);
  }
  int start = resume_point(s, jr->job, pw->S, recorded < pw->ckpt_upto ? recorded : pw->ckpt_upto, resume,
                           sizeof resume);
  if (start >= job->train.steps) start = 0, resume[0] = 0;
  json_t *from = NULL; /* the in-memory snapshots, when newer than the checkpoint */
  int before = recorded + 1 < job->train.steps ? recorded + 1 : job->train.steps;
  /* memory first: a snapshot as new as the checkpoint reads no disk */
  int snap = pw_rec_restore_point(jr, pw->S, pw->pp, pw->stage_rank, start - 1, before, &from);
  if (snap) start = snap, resume[0] = 0;
  jr->n_stages = pw->S;
  jr->start_step = jr->steps_done = start;
  record_start(c, jr, start, snap ? "snapshot" : resume[0] ? "checkpoint" : "start");
  json_t *peers = json_array();
  for (int r = 0; r < jr->n_ranks; r++)
    json_array_append_new(peers, json_pack("{s:i, s:s, s:s}", "rank", r, "addr", jr->ranks[r]->addr, "host",
                                           jr->ranks[r]->host));
  int trace_every = job->train.steps <= 200 ? 1 : job->train.steps / 100;
  int serve = job->mode == PW_MODE_SERVE; /* runs until cancelled: its steps are not run */
  char names[512] = "";
  for (int r = 0; r < jr->n_ranks; r++) {
    pw_wconn *w = jr->ranks[r];
    char upload[65];
    pw_coord_upload_token(c, jr->job, jr->run, r, upload);
    json_t *as = PW_CONTROL_BUILD(PW_MSG_ASSIGN, pw_msg_assign, NULL, .job = jr->job, .run = jr->run, .rank = r,
                                  .slice = pw->slices[r], .slice_sha256 = pw->slice_sha[r], .peers = peers,
                                  .steps = job->train.steps, .start_step = start, .checkpoint_dir = NULL,
                                  .resume = resume[0] ? resume : NULL, .trace_every = trace_every,
                                  .restore_step = snap ? snap : -1, .restore_from = from,
                                  .serve_seqs = serve ? job->serve.max_sequences : -1,
                                  .serve_len = serve ? job->serve.max_len : -1,
                                  .serve_queue = serve ? job->serve.max_queue : -1, .upload_token = upload);
    pw_rec_snapshots_keep(w, jr->job); /* the worker keeps only this job's from here */
    pw_registry_update(c, w);
    pw_write aw = {.kind = PW_W_ASSIGN, .job = jr->job, .run = jr->run, .rank = r, .worker = w->id, .text = w->name};
    pw_write_do(c, &aw, NULL);
    pw_ctl_send_msg(w, as);
    size_t l = strlen(names);
    snprintf(names + l, sizeof names - l, "%s%s", r ? ", " : "", w->name);
  }
  json_decref(peers);
  json_decref(from);
  pw_contention_note(c, jr); /* ranks that share a host's cores: said once per run */
  snprintf(b, sizeof b, "dispatched %d ranks to %s%s", jr->n_ranks, names, start ? " (resuming)" : "");
  if (start) {
    size_t l = strlen(b);
    snprintf(b + l, sizeof b - l, snap ? " from snapshots of step %d in memory" : " from the checkpoint of step %d",
             start);
  }
  write_state(c, jr->job, PW_JOB_RUNNING, b, NULL);
  write_status(c, jr->job, serve ? "serving" : "");
  planwork_free(pw);
}

/* Reserves the workers, marks the job planning and hands the plan to a
 * worker thread; takes job (freed with the work). */
static void dispatch(pw_coord *c, pw_store *s, int64_t id, pw_job *job, pw_wconn **ws) {
  pw_err err = {0};
  char b[600];
  int n = job->mesh.pp * job->mesh.dp * job->mesh.tp;
  int rc = pw_store_job_set_state(s, id, PW_JOB_PLANNING, "enough idle workers", NULL, &err);
  if (rc) { /* stays queued: the next pass tries again */
    pw_error("job %lld: cannot start planning: %s", (long long)id, pw_err_str(&err, b, sizeof b));
    pw_job_free(job);
    return;
  }
  planwork *pw = calloc(1, sizeof *pw);
  pw_jobrt *jr = calloc(1, sizeof *jr);
  if (jr) jr->ranks = calloc((size_t)n, sizeof *jr->ranks);
  if (!pw || !jr || !jr->ranks) {
    free(pw);
    if (jr) free(jr->ranks);
    free(jr);
    pw_job_free(job);
    write_state(c, id, PW_JOB_FAILED, "out of memory", "out of memory");
    return;
  }
  jr->job = id;
  jr->n_ranks = n;
  jr->pp = job->mesh.pp;
  jr->tp = job->mesh.tp;
  jr->steps = job->train.steps;
  jr->on_nonfinite = job->train.on_nonfinite;
  jr->final_ckpt = job->mode == PW_MODE_TRAIN;
  jr->max_restarts = job->train.max_restarts;
  jr->planning = 1;
  for (int r = 0; r < n; r++) { /* reserved: no other job takes them meanwhile */
    jr->ranks[r] = ws[r];
    ws[r]->job = jr;
    ws[r]->rank = r;
    pw_registry_update(c, ws[r]);
  }
  jr->next = ctl_of(c)->jobs;
  ctl_of(c)->jobs = jr;
  pw->c = c;
  pw->jr = jr;
  pw->job = *job; /* moved */
  pw->n = n;
  pw_budget_init(&pw->budget);
  if (c->max_plan_actions > 0) pw->budget.max_actions = c->max_plan_actions;
  pw->budget.max_slice_bytes = pw_budget_slice_room(PW_CONTROL_MAX, n);
  pw->budget.max_rank_memory = c->max_rank_memory;
  snprintf(pw->budget.memory_from, sizeof pw->budget.memory_from, "--max-rank-memory");
  for (int r = 0; r < n; r++)
    if (ws[r]->memory > 0 && (!pw->budget.max_rank_memory || (size_t)ws[r]->memory < pw->budget.max_rank_memory)) {
      pw->budget.max_rank_memory = (size_t)ws[r]->memory;
      snprintf(pw->budget.memory_from, sizeof pw->budget.memory_from, "the memory of worker %.40s", ws[r]->name);
    }
  pw->req.data = pw;
  write_status(c, id, "planning");
  if ((rc = uv_queue_work(c->loop, &pw->req, plan_work, plan_done))) {
    jr->planning = 0;
    snprintf(b, sizeof b, "cannot start planning: %s", uv_strerror(rc));
    end_run(c, jr, "failed", PW_JOB_FAILED, b, NULL);
    planwork_free(pw);
  }
}

/* ---- the periodic pass -------------------------------------------------- */

static void sched_tick(pw_coord *c) {
  pw_ctl *ctl = ctl_of(c);
  if (!ctl || c->stopping) return;
  pw_gen_pump(c);
  /* Writes kept while the store failed go first; no new run starts while
   * some are pending (its own writes would only join the queue). */
  int pending = pw_write_flush(c);
  pw_store *s = pw_coord_store(c);
  if (!s) return;
  pw_err err = {0};
  char b[600];
  /* Runs whose job was cancelled (or otherwise ended) through the API. */
  pw_jobrt *next;
  for (pw_jobrt *jr = ctl->jobs; jr; jr = next) {
    next = jr->next;
    pw_job_brief jb;
    if (pw_store_job_brief(s, jr->job, &jb, &err)) {
      pw_warn("job %lld: cannot read its state: %s", (long long)jr->job, pw_err_str(&err, b, sizeof b));
      continue;
    }
    free(jb.spec);
    if (jb.state == PW_JOB_CANCELLED) end_run(c, jr, "cancelled", -1, "cancelled by request", "job cancelled");
    /* cancelled and retried before this pass saw it: the old run stops
     * here, before the queued job is dispatched again below */
    else if (jb.state == PW_JOB_QUEUED)
      end_run(c, jr, "cancelled", -1, "cancelled by request (the job was retried since)", "job cancelled");
  }
  /* Queued jobs, oldest first; a job that does not fit does not hold back
   * a later one that does. */
  int64_t *ids = NULL;
  int nq = 0;
  if (pw_store_jobs_in_state(s, PW_JOB_QUEUED, &ids, &nq, &err)) {
    pw_warn("cannot list the queued jobs: %s", pw_err_str(&err, b, sizeof b));
    return;
  }
  for (int i = 0; i < nq; i++) {
    pw_job_brief jb;
    if (pw_store_job_brief(s, ids[i], &jb, &err)) {
      pw_warn("job %lld: cannot read it: %s", (long long)ids[i], pw_err_str(&err, b, sizeof b));
      continue;
    }
    json_error_t je;
    json_t *spec = json_loads(jb.spec, 0, &je);
    free(jb.spec);
    pw_job job;
    if (!spec || pw_job_parse(spec, NULL, &job, &err)) {
      write_state(c, ids[i], PW_JOB_FAILED, "stored spec is invalid", spec ? pw_err_str(&err, b, sizeof b) : je.text);
      json_decref(spec);
      continue;
    }
    json_decref(spec);
    int need = job.mesh.pp * job.mesh.dp * job.mesh.tp, idle_n, busy, lost;
    pw_wconn *ws[1024];
    idle_n = idle_workers(c, ws, 1024);
    if (pending) {
      snprintf(b, sizeof b, "waiting for the store: %d write%s pending", pending, pending == 1 ? "" : "s");
      write_status(c, ids[i], b);
    } else if (idle_n >= need) {
      pw_wconn *chosen[1024];
      pw_rec_choose(c, ids[i], need, ws, idle_n, chosen);
      dispatch(c, s, ids[i], &job, chosen); /* takes job */
      continue;
    } else {
      pw_coord_worker_counts(c, NULL, &busy, &lost);
      snprintf(b, sizeof b, "waiting for %d idle worker%s (%d idle, %d busy connected)", need, need == 1 ? "" : "s",
               idle_n, busy);
      write_status(c, ids[i], b);
    }
    pw_job_free(&job);
  }
  free(ids);
}

/* ---- what workers report ------------------------------------------------- */

static pw_step_acc *acc_for(pw_jobrt *jr, int step) {
  pw_step_acc *free_slot = NULL;
  for (int k = 0; k < jr->n_acc; k++) {
    if (jr->acc[k].step == step) return &jr->acc[k];
    if (jr->acc[k].step < 0 && !free_slot) free_slot = &jr->acc[k];
  }
  if (!free_slot) {
    pw_step_acc *na = realloc(jr->acc, sizeof *na * (size_t)(jr->n_acc + 8));
    if (!na) return NULL;
    jr->acc = na;
    for (int k = jr->n_acc; k < jr->n_acc + 8; k++) jr->acc[k].step = -1;
    free_slot = &jr->acc[jr->n_acc];
    jr->n_acc += 8;
  }
  memset(free_slot, 0, sizeof *free_slot);
  free_slot->step = step;
  return free_slot;
}

/* The run a worker's message is about, or NULL: late news of a run that
 * ended (e.g. its error after we cancelled it) is dropped. run < 0: the
 * message names no run. */
static pw_jobrt *current_run(pw_wconn *w, const json_t *raw, int64_t job, int64_t run) {
  pw_jobrt *jr = w->job;
  if (!jr || jr->job != job || (run >= 0 && jr->run != run)) {
    pw_debug("worker %s: %s for job %lld run %lld, not its current run", w->name, pw_control_type(raw),
             (long long)job, (long long)run);
    return NULL;
  }
  return jr;
}

/* The step's metrics row once every rank reported. A NaN or inf is
 * recorded as such (null), never as 0; unless the spec says
 * train.on_nonfinite "skip", the job fails: "diverged at step N". */
static void step_complete(pw_coord *c, pw_jobrt *jr, pw_step_acc *a) {
  int step = a->step;
  pw_metric mt = {.step = step,
                  .loss = a->has_loss && !(a->nonfinite & 1) ? a->loss : NAN,
                  .step_time = a->step_time,
                  .tokens = a->tokens,
                  .tokens_per_s = a->step_time > 0 ? a->tokens / a->step_time : 0,
                  .grad_norm = a->has_grad && !(a->nonfinite & 2) ? a->grad_norm : NAN,
                  .lr = a->has_lr ? a->lr : NAN,
                  /* every replica's share, or none */
                  .eval_loss = a->has_eval && a->has_eval == a->loss_ranks ? a->eval_loss : NAN};
  int nonfinite = a->nonfinite;
  a->step = -1;
  if (step + 1 > jr->steps_done) jr->steps_done = step + 1;
  pw_write w = {.kind = PW_W_METRIC, .job = jr->job, .run = jr->run, .m = mt};
  if (pw_write_do(c, &w, NULL) == PW_ETOOBIG) {
    char what[64];
    snprintf(what, sizeof what, "step %d's metrics", step);
    lost_write(c, jr, what);
    return;
  }
  pw_write pg = {.kind = PW_W_PROGRESS, .job = jr->job, .step = step + 1, .m = mt};
  pw_write_do(c, &pg, NULL); /* kept when it fails; a lost one is the next step's to fix */
  pw_coord_count_step(c, mt.step_time);
  if (!nonfinite) return;
  char why[160];
  snprintf(why, sizeof why, "diverged at step %d: %s not finite", step,
           nonfinite == 3 ? "the loss and the gradient norm are" : nonfinite & 1 ? "the loss is" : "the gradient norm is");
  if (jr->on_nonfinite == PW_NONFINITE_SKIP) {
    char msg[240];
    snprintf(msg, sizeof msg, "%s (train.on_nonfinite: skip)", why);
    event(c, jr->job, "nonfinite", msg);
    pw_warn("job %lld: %s", (long long)jr->job, msg);
    return;
  }
  end_run(c, jr, "failed", PW_JOB_FAILED, why, "the job diverged");
}

static int on_step(void *ctx, void *conn, const pw_msg_any *msg, const json_t *raw, pw_err *err) {
  pw_coord *c = ctx;
  pw_wconn *w = conn;
  const pw_msg_step *m = &msg->STEP;
  pw_jobrt *jr = current_run(w, raw, m->job, m->run);
  if (!jr) return 0;
  int step = (int)m->step;
  if (m->actions) {
    char *t = json_dumps(m->actions, JSON_COMPACT);
    pw_write tw = {.kind = PW_W_TIMING, .job = jr->job, .run = jr->run, .step = step, .rank = w->rank, .text = t};
    if (!t) pw_error("job %lld step %d rank %d: out of memory for its timings", (long long)jr->job, step, w->rank);
    else pw_write_do(c, &tw, NULL); /* a sample: a lost one is logged and counted there */
    free(t);
  }
  pw_step_acc *a = acc_for(jr, step);
  if (!a) {
    pw_error("job %lld: out of memory for step %d's reports", (long long)jr->job, step);
    lost_write(c, jr, "a step report (out of memory)");
    return 0;
  }
  a->reports++;
  if (!isnan(m->loss)) a->loss += m->loss, a->has_loss = 1;
  if (!isnan(m->tokens)) a->tokens += m->tokens;
  if (!isnan(m->loss) || (m->nonfinite > 0 && (m->nonfinite & 1))) a->loss_ranks++;
  if (!isnan(m->eval_loss)) a->eval_loss += m->eval_loss, a->has_eval++; /* the replicas' shares */
  if (!isnan(m->grad_norm)) a->grad_norm = m->grad_norm, a->has_grad = 1;
  if (!isnan(m->lr)) a->lr = m->lr, a->has_lr = 1;
  if (m->nonfinite > 0) a->nonfinite |= (int)(m->nonfinite & 3);
  if (m->step_time > a->step_time) a->step_time = m->step_time;
  if (a->reports == jr->n_ranks) step_complete(c, jr, a);
  return 0;
}

static int on_checkpoint(void *ctx, void *conn, const pw_msg_any *msg, const json_t *raw, pw_err *err) {
  pw_coord *c = ctx;
  pw_wconn *w = conn;
  const pw_msg_checkpoint *m = &msg->CHECKPOINT;
  pw_jobrt *jr = current_run(w, raw, m->job, m->run);
  if (!jr) return 0;
  pw_write cw = {.kind = PW_W_CHECKPOINT, .job = jr->job, .run = jr->run, .step = (int)m->step,
                 .stage = (int)m->stage, .rank = w->rank, .text = m->path, .bytes = m->bytes};
  if (pw_write_do(c, &cw, NULL) == PW_ETOOBIG) lost_write(c, jr, "a checkpoint");
  return 0;
}

/* A training job succeeds only with its model: its last step's
 * checkpoint complete in the store. Ranks say done only once their shards
 * of it are stored (they retry until then), so this holds unless an upload
 * was refused; then why says which stages are missing and where they are,
 * and the job fails. 0 when the checkpoint is there (or none is due). */
static int final_missing(pw_coord *c, const pw_jobrt *jr, char *why, size_t cap) {
  if (!jr->final_ckpt || jr->steps <= 0) return 0;
  pw_store *s = pw_coord_store(c);
  pw_err err = {0};
  int n = 0, rc = s ? pw_store_ckpt_step(s, jr->job, jr->steps, &n, &err) : PW_EIO;
  if (!rc) return 0;
  size_t l = (size_t)snprintf(why, cap, "all ranks done, but the final checkpoint (step %d) is not stored: ", jr->steps);
  if (rc != PW_ENOENT) { /* the store cannot say: not a success either */
    char b[400];
    snprintf(why + l, cap - l, "the store cannot be read (%s)", pw_err_str(&err, b, sizeof b));
    return 1;
  }
  l += (size_t)snprintf(why + l, cap - l, "missing");
  for (int st = 0; st < jr->n_stages && l < cap; st++) {
    char m[PATH_MAX], o[PATH_MAX];
    if (pw_ck_shard_path(c->state_dir, jr->job, jr->steps, st, 0, m, sizeof m, NULL) ||
        pw_ck_shard_path(c->state_dir, jr->job, jr->steps, st, 1, o, sizeof o, NULL))
      continue;
    int hm = access(m, F_OK) == 0, ho = access(o, F_OK) == 0;
    if (!hm || !ho)
      l += (size_t)snprintf(why + l, cap - l, " stage %d (%s)", st, !hm && !ho ? "model and optimizer" : !hm ? "model" : "optimizer");
  }
  if (l < cap)
    snprintf(why + l, cap - l, "; the workers keep their files (job-%lld/step-%d/stage-K.safetensors in their "
             "checkpoint folder; their logs name each one)", (long long)jr->job, jr->steps);
  return 1;
}

static int on_done(void *ctx, void *conn, const pw_msg_any *msg, const json_t *raw, pw_err *err) {
  pw_coord *c = ctx;
  pw_jobrt *jr = current_run(conn, raw, msg->DONE.job, msg->DONE.run);
  if (!jr) return 0;
  if (++jr->done == jr->n_ranks) {
    for (int r = 0; r < jr->n_ranks; r++) /* the workers drop them once done */
      if (jr->ranks[r]) pw_rec_snapshots_keep(jr->ranks[r], 0);
    char why[1500];
    if (final_missing(c, jr, why, sizeof why)) {
      pw_error("job %lld: %s", (long long)jr->job, why);
      event(c, jr->job, "checkpoint", why);
      end_run(c, jr, "failed", PW_JOB_FAILED, why, NULL);
    } else {
      end_run(c, jr, "succeeded", PW_JOB_SUCCEEDED, "all ranks done", NULL);
    }
  }
  sched_tick(c);
  return 0;
}

static int on_error(void *ctx, void *conn, const pw_msg_any *msg, const json_t *raw, pw_err *err) {
  pw_coord *c = ctx;
  pw_wconn *w = conn;
  const pw_msg_error *m = &msg->ERROR;
  pw_jobrt *jr = current_run(w, raw, m->job, m->run);
  if (!jr) return 0;
  char why[700];
  snprintf(why, sizeof why, "rank %d (worker %s): %s", w->rank, w->name, m->message);
  pw_wconn *peer = m->lost_rank >= 0 && m->lost_rank < jr->n_ranks ? jr->ranks[m->lost_rank] : NULL;
  if (m->peer_aborted >= 0 && m->lost_rank < 0 && m->restore_failed <= 0) {
    /* A consequence: the aborting peer says why itself (or is lost). */
    pw_info("job %lld: %s", (long long)jr->job, why);
    return 0;
  }
  if (peer && peer != w) {
    /* The peer's link broke under a rank of the run: that worker is lost
     * (its process or host is gone, or it cannot reach its peers). Its
     * link is dropped — its late messages can never count — and on_lost
     * restarts the run. */
    char cause[800];
    snprintf(cause, sizeof cause, "rank %d's link to it broke (%s)", w->rank, m->message);
    pw_ctl_drop(peer, cause);
  } else if (m->restore_failed > 0) {
    /* A snapshot named in the assign was gone: start again from the
     * checkpoint; no restart is spent on it. */
    pw_rec_snapshots_forget(c, jr->job);
    event(c, jr->job, "resume", why);
    end_run(c, jr, "interrupted", PW_JOB_QUEUED, why, "restoring from snapshots failed");
  } else {
    end_run(c, jr, "failed", PW_JOB_FAILED, why, "another rank failed");
  }
  sched_tick(c);
  return 0;
}

static int on_snapshot(void *ctx, void *conn, const pw_msg_any *msg, const json_t *raw, pw_err *err) {
  pw_wconn *w = conn;
  const pw_msg_snapshot *m = &msg->SNAPSHOT;
  /* Not fenced by run: it says what the worker's memory holds, which
   * outlives the run (a late one, from a run that just ended, counts). A
   * worker given to another job drops this job's, as it will. */
  if (!w->job || w->job->job == m->job) pw_rec_snapshot_add(w, m->job, (int)m->stage, (int)m->step, (int)m->held);
  return 0;
}

/* "attempt 1: why; attempt 2: why; ..." of the job's earlier runs. */
static void earlier_reasons(pw_coord *c, int64_t job, char *out, size_t cap) {
  out[0] = 0;
  pw_store *s = pw_coord_store(c);
  json_t *a = NULL;
  if (!s || pw_store_attempts_json(s, job, &a, NULL)) return;
  size_t i, l = 0;
  json_t *x;
  json_array_foreach(a, i, x) {
    const char *why = json_string_value(json_object_get(x, "reason"));
    if (!why || l >= cap) continue;
    int n = snprintf(out + l, cap - l, "attempt %lld: %s; ", (long long)json_integer_value(json_object_get(x, "attempt")),
                     why);
    if (n > 0) l += (size_t)n;
  }
  json_decref(a);
}

static void on_lost(pw_coord *c, pw_wconn *w, const char *why) {
  pw_jobrt *jr = w->job;
  if (!jr) return;
  char reason[600];
  int planning = jr->planning;
  snprintf(reason, sizeof reason, "worker %s (%s, rank %d) lost at step %d: %s", w->name, w->addr, w->rank,
           jr->steps_done, why);
  pw_rec_remember(c, jr); /* before the lost one leaves it: the survivors keep their ranks */
  jr->ranks[w->rank] = NULL;
  w->job = NULL;
  if (planning) { /* nothing ran yet: the job waits for workers again */
    char b[700];
    snprintf(b, sizeof b, "%s while the job was planned; queued again", reason);
    end_run(c, jr, "failed", PW_JOB_QUEUED, b, "a worker of this run was lost");
    return;
  }
  event(c, jr->job, "worker_lost", reason);
  pw_warn("job %lld: %s", (long long)jr->job, reason);
  pw_store *s = pw_coord_store(c);
  int used = 0;
  pw_err err = {0};
  char b[600];
  if (s && pw_store_job_restarts(s, jr->job, &used, &err))
    pw_warn("job %lld: cannot read its restarts (%s): counting from 0", (long long)jr->job, pw_err_str(&err, b, sizeof b));
  if (used < jr->max_restarts) {
    pw_write rw = {.kind = PW_W_JOB_RESTARTS, .job = jr->job, .step = used + 1};
    pw_write_do(c, &rw, NULL);
    char cancel[700];
    snprintf(cancel, sizeof cancel, "worker %s was lost: the job restarts", w->name);
    end_run(c, jr, "interrupted", PW_JOB_QUEUED, reason, cancel);
    sched_tick(c); /* a spare may be idle already */
    return;
  }
  char all[4096];
  earlier_reasons(c, jr->job, all, sizeof all);
  char final[4800];
  snprintf(final, sizeof final, "%s; no restart left (train.max_restarts %d)%s%s", reason, jr->max_restarts,
           all[0] ? "; earlier: " : "", all);
  size_t fl = strlen(final);
  if (fl >= 2 && !strcmp(final + fl - 2, "; ")) final[fl - 2] = 0;
  end_run(c, jr, "failed", PW_JOB_FAILED, final, "a worker of this run was lost");
}

/* SIGTERM: running jobs go back to the queue (they resume from their last
 * checkpoint when the coordinator is back); their workers stop. */
static void on_shutdown(pw_coord *c) {
  pw_ctl *ctl = ctl_of(c);
  while (ctl && ctl->jobs) {
    pw_jobrt *jr = ctl->jobs;
    end_run(c, jr, "interrupted", PW_JOB_QUEUED, "coordinator shutting down; the job will run again",
            "coordinator shutting down");
  }
  pw_gen_job_ended(c, 0, "the coordinator is shutting down");
}

static const pw_ctl_hooks hooks = {
    .msgs = {.on = {[PW_MSG_STEP] = on_step, [PW_MSG_CHECKPOINT] = on_checkpoint, [PW_MSG_DONE] = on_done,
                    [PW_MSG_ERROR] = on_error, [PW_MSG_SNAPSHOT] = on_snapshot, [PW_MSG_TOKENS] = pw_gen_on_tokens,
                    [PW_MSG_GEN_FAILED] = pw_gen_on_failed}},
    .tick = sched_tick,
    .lost = on_lost,
    .shutdown = on_shutdown,
};

const pw_ctl_hooks *pw_sched_hooks(void) { return &hooks; }
