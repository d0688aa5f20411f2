/* dispatch: a job's run started on the workers reserved for it. The plan
 * is built on a worker thread (plan_work: planning a large spec takes
 * seconds, and the loop must keep answering heartbeats), then, back on the
 * loop, plan_done records the run, chooses where it starts (step 0, a
 * checkpoint, or snapshots in the workers' memory) and sends each rank its
 * assign. It never follows a run once started: sched.c does. Loop thread,
 * except plan_work and what it calls. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "checkpoints.h"
#include "contention.h"
#include "ctl_int.h"
#include "log.h"
#include "plan.h"
#include "slice.h"
#include "store_retry.h"

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
  pw_jobrt_event(c, jr->job, "resume", msg);
  pw_info("job %lld: %s", (long long)jr->job, msg);
}

/* ---- the plan back on the loop: dispatch in named steps --------------------
 *
 * plan_done runs them in order: plan_usable (is there still a run to
 * start?), record_run (the store knows the run before any worker does),
 * choose_start (from where: the start, a checkpoint, or snapshots in
 * memory), send_assigns (each rank its slice and its peers), then
 * announce_running. Store writes that fail before the first assign put
 * the job back in the queue (nothing ran yet); after it, they are kept
 * for a retry like any run's. */

/* Where a run starts, as choose_start decided it. */
typedef struct {
  int step;                /* the first step the run computes */
  int snap;                /* > 0: restored from snapshots of this step in the workers' memory */
  char resume[1024];       /* "" or the checkpoint step the workers fetch ("12") */
  json_t *from;            /* with snap: per stage, the rank that sends it (the assign's restore_from) */
} start_point;

/* Whether the plan that came back still has a run to start: not when the
 * job ended meanwhile (cancelled, a worker lost), the coordinator is
 * stopping or draining, or planning failed — each ends the run here, as it should
 * end (dropped, back to the queue, failed). 1: go on. */
static int plan_usable(planwork *pw, int status) {
  pw_coord *c = pw->c;
  pw_jobrt *jr = pw->jr;
  char b[600], e[600];
  jr->planning = 0;
  if (jr->ended || c->stopping || c->draining) {
    pw_info("job %lld: its plan is ready but the job ended meanwhile: dropped", (long long)jr->job);
    if (!jr->ended) pw_jobrt_end(c, jr, "interrupted", PW_JOB_QUEUED, "coordinator shutting down", NULL);
    else pw_jobrt_free(jr);
    return 0;
  }
  if (status || pw->rc) {
    if (status) pw_err_set(&pw->err, PW_EINTERNAL, "plan", "planning was cancelled: %s", uv_strerror(status));
    snprintf(b, sizeof b, "planning failed: %s", pw_err_str(&pw->err, e, sizeof e));
    pw_jobrt_end(c, jr, "failed", PW_JOB_FAILED, b, NULL);
    return 0;
  }
  return 1;
}

/* The run's row (its plan text: jr->run from here), its stages and
 * action lists, and the job dispatching — before any worker hears of the
 * run, so nothing a worker reports is about a run the store lacks. A run
 * the store cannot take goes back to the queue when the store may recover
 * (EIO, ENOMEM), else fails; a job whose state changed meanwhile ends the
 * run. 0, or -1 when the run ended. */
static int record_run(planwork *pw) {
  pw_coord *c = pw->c;
  pw_jobrt *jr = pw->jr;
  pw_store *s = pw_coord_store(c);
  pw_err err = {0};
  char b[600], e[600];
  int rc = s ? pw_store_run_insert(s, jr->job, pw->plan_text, &jr->run, &err)
             : pw_err_set(&err, PW_EIO, "store", "the store cannot be opened");
  if (rc) {
    snprintf(b, sizeof b, "cannot record the run: %s", pw_err_str(&err, e, sizeof e));
    pw_error("job %lld: %s", (long long)jr->job, b);
    pw_jobrt_end(c, jr, "failed", rc == PW_EIO || rc == PW_ENOMEM ? PW_JOB_QUEUED : PW_JOB_FAILED, b, NULL);
    return -1;
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
  if (pw_jobrt_set_state(c, jr->job, PW_JOB_DISPATCHING, "plan recorded", NULL) < 0) {
    pw_jobrt_end(c, jr, "failed", -1, "the job changed state while it was planned", NULL);
    return -1;
  }
  return 0;
}

/* Where the run starts: the newest checkpoint that reads back intact and
 * whose predecessors' metrics are all recorded (a lost rank's last
 * reports may never have come: a step the store has no metrics for is run
 * again rather than left a hole), unless the workers' memory holds
 * snapshots at least as new (memory first: it reads no disk); step 0
 * otherwise, or when the checkpoint is the job's last step. Recorded in
 * the run's row and said in the job's events. */
static void choose_start(planwork *pw, start_point *sp) {
  pw_coord *c = pw->c;
  pw_jobrt *jr = pw->jr;
  const pw_job *job = &pw->job;
  pw_store *s = pw_coord_store(c);
  pw_err err = {0};
  pw_job_brief jb = {0};
  int recorded = 0;
  if (!pw_store_job_brief(s, jr->job, &jb, &err)) recorded = jb.steps_done;
  free(jb.spec);
  sp->resume[0] = 0;
  if (pw->skipped[0]) {
    char msg[700];
    snprintf(msg, sizeof msg, "passed over as unreadable: %s", pw->skipped);
    pw_warn("job %lld: %s", (long long)jr->job, msg);
    pw_jobrt_event(c, jr->job, "resume", msg);
  }
  sp->step = resume_point(s, jr->job, pw->S, recorded < pw->ckpt_upto ? recorded : pw->ckpt_upto, sp->resume,
                          sizeof sp->resume);
  if (sp->step >= job->train.steps) sp->step = 0, sp->resume[0] = 0;
  sp->from = NULL;
  int before = recorded + 1 < job->train.steps ? recorded + 1 : job->train.steps;
  sp->snap = pw_rec_restore_point(jr, pw->S, pw->pp, pw->stage_rank, sp->step - 1, before, &sp->from);
  if (sp->snap) sp->step = sp->snap, sp->resume[0] = 0;
  jr->n_stages = pw->S;
  jr->start_step = jr->steps_done = sp->step;
  record_start(c, jr, sp->step, sp->snap ? "snapshot" : sp->resume[0] ? "checkpoint" : "start");
}

/* Each rank its assign: its own slice of the plan, every rank's address
 * and host (peers), where to start (sp), its upload token; and, per rank,
 * the worker's registry entry and the run's assignment row. The worker
 * keeps only this job's snapshots from here. *names gets the workers'
 * names, for the job's state. */
static void send_assigns(planwork *pw, const start_point *sp, char *names, size_t cap) {
  pw_coord *c = pw->c;
  pw_jobrt *jr = pw->jr;
  const pw_job *job = &pw->job;
  json_t *peers = json_array();
  for (int r = 0; r < jr->n_ranks; r++)
    json_array_append_new(peers, json_pack("{s:i, s:s, s:s}", "rank", r, "addr", jr->ranks[r]->addr, "host",
                                           jr->ranks[r]->host));
  int trace_every = job->train.steps <= 200 ? 1 : job->train.steps / 100;
  int serve = job->mode == PW_MODE_SERVE; /* runs until cancelled: its steps are not run */
  names[0] = 0;
  pw_pin_ranks(c, jr); /* ranks sharing a host: disjoint CPUs (assign.cpus) */
  for (int r = 0; r < jr->n_ranks; r++) {
    pw_wconn *w = jr->ranks[r];
    char upload[65];
    pw_coord_upload_token(c, jr->job, jr->run, r, upload);
    json_t *as = PW_CONTROL_BUILD(PW_MSG_ASSIGN, pw_msg_assign, NULL, .job = jr->job, .run = jr->run, .rank = r,
                                  .slice = pw->slices[r], .slice_sha256 = pw->slice_sha[r], .peers = peers,
                                  .steps = job->train.steps, .start_step = sp->step, .checkpoint_dir = NULL,
                                  .resume = sp->resume[0] ? sp->resume : NULL, .trace_every = trace_every,
                                  .restore_step = sp->snap ? sp->snap : -1, .restore_from = sp->from,
                                  .serve_seqs = serve ? job->serve.max_sequences : -1,
                                  .serve_len = serve ? job->serve.max_len : -1,
                                  .serve_queue = serve ? job->serve.max_queue : -1, .upload_token = upload,
                                  .cpus = w->pinned[0] ? w->pinned : NULL);
    pw_rec_snapshots_keep(w, jr->job);
    pw_registry_update(c, w);
    pw_write aw = {.kind = PW_W_ASSIGN, .job = jr->job, .run = jr->run, .rank = r, .worker = w->id, .text = w->name};
    pw_write_do(c, &aw, NULL);
    pw_ctl_send_msg(w, as);
    size_t l = strlen(names);
    snprintf(names + l, cap - l, "%s%s", r ? ", " : "", w->name);
  }
  json_decref(peers);
}

/* The job running: ranks that share a host's cores said (once per run),
 * its state naming the workers and where it resumed, its status cleared
 * ("serving" for a serve job). */
static void announce_running(planwork *pw, const start_point *sp, const char *names) {
  pw_coord *c = pw->c;
  pw_jobrt *jr = pw->jr;
  char b[600];
  pw_contention_note(c, jr);
  snprintf(b, sizeof b, "dispatched %d ranks to %s%s", jr->n_ranks, names, sp->step ? " (resuming)" : "");
  if (sp->step) {
    size_t l = strlen(b);
    snprintf(b + l, sizeof b - l, sp->snap ? " from snapshots of step %d in memory" : " from the checkpoint of step %d",
             sp->step);
  }
  pw_jobrt_set_state(c, jr->job, PW_JOB_RUNNING, b, NULL);
  pw_jobrt_set_status(c, jr->job, pw->job.mode == PW_MODE_SERVE ? "serving" : "");
}

/* Loop: the plan is back (plan_work). */
static void plan_done(uv_work_t *req, int status) {
  planwork *pw = req->data;
  start_point sp = {0};
  char names[512];
  if (plan_usable(pw, status) && record_run(pw) == 0) {
    choose_start(pw, &sp);
    send_assigns(pw, &sp, names, sizeof names);
    announce_running(pw, &sp, names);
    json_decref(sp.from);
  }
  planwork_free(pw);
}

/* Reserves the workers, marks the job planning and hands the plan to a
 * worker thread; takes job (freed with the work). */
void pw_dispatch(pw_coord *c, pw_store *s, int64_t id, pw_job *job, pw_wconn **ws) {
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
    pw_jobrt_set_state(c, id, PW_JOB_FAILED, "out of memory", "out of memory");
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
  pw_ctl *ctl = c->ctl;
  jr->next = ctl->jobs;
  ctl->jobs = jr;
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
  pw_jobrt_set_status(c, id, "planning");
  if ((rc = uv_queue_work(c->loop, &pw->req, plan_work, plan_done))) {
    jr->planning = 0;
    snprintf(b, sizeof b, "cannot start planning: %s", uv_strerror(rc));
    pw_jobrt_end(c, jr, "failed", PW_JOB_FAILED, b, NULL);
    planwork_free(pw);
  }
}

