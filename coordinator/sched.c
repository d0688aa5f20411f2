/* sched: the job lifecycle on the control loop.
 *
 *   queued -> planning -> dispatching -> running -> succeeded | failed | cancelled
 *
 * A queued job waits, and says so in its status, until enough idle workers
 * are connected; then it is planned (the same pw_plan_build as
 * `pipewright plan`) once per run: the plan's canonical text is stored
 * (runs.plan) and hashed, its partition, action lists and rank -> worker
 * assignments are recorded, and each worker gets only its own slice of it
 * (lib/plan/slice.h), which carries the plan's hash. Step reports are collected from every
 * rank and recorded as one metrics row per step. A worker that errs or is
 * lost fails the run with a reason naming it, and the others are told to
 * stop; a cancelled job's workers are stopped and freed. A run interrupted
 * by a coordinator shutdown or crash goes back to the queue and resumes
 * from the last complete checkpoint. Loop thread only. */
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec_json.h"
#include "ctl_int.h"
#include "log.h"
#include "plan.h"
#include "slice.h"

static pw_ctl *ctl_of(pw_coord *c) { return c->ctl; }

static void release_workers(pw_coord *c, pw_jobrt *jr, const char *cancel_reason) {
  for (int r = 0; r < jr->n_ranks; r++) {
    pw_wconn *w = jr->ranks[r];
    if (!w) continue;
    if (cancel_reason)
      pw_ctl_send_msg(w, PW_CONTROL_BUILD(PW_MSG_CANCEL, pw_msg_cancel, NULL, .job = jr->job, .run = jr->run,
                                          .reason = cancel_reason));
    w->job = NULL;
    w->rank = -1;
    pw_registry_update(c, w);
    jr->ranks[r] = NULL;
  }
}

static void jobrt_remove(pw_coord *c, pw_jobrt *jr) {
  for (pw_jobrt **p = &ctl_of(c)->jobs; *p; p = &(*p)->next)
    if (*p == jr) {
      *p = jr->next;
      break;
    }
  free(jr->ranks);
  free(jr->acc);
  free(jr);
}

/* The run ends: workers told (unless they finished) and freed, the run and
 * the job recorded. job_state < 0 leaves the job's state alone. */
static void end_run(pw_coord *c, pw_jobrt *jr, const char *run_state, int job_state, const char *reason,
                    const char *cancel_reason) {
  pw_store *s = pw_coord_store(c);
  release_workers(c, jr, cancel_reason);
  if (s) {
    pw_store_run_finish(s, jr->run, run_state, strcmp(run_state, "succeeded") ? reason : NULL, NULL);
    if (job_state >= 0)
      pw_store_job_set_state(s, jr->job, job_state, reason, job_state == PW_JOB_FAILED ? reason : NULL, NULL);
  }
  pw_info("job %lld run %lld %s: %s", (long long)jr->job, (long long)jr->run, run_state, reason);
  jobrt_remove(c, jr);
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

static char *actions_text(const pw_sched *sc, int r) {
  int len = pw_actions_format(sc->actions[r], sc->n_actions[r], NULL, 0);
  char *t = malloc((size_t)len + 1);
  if (t) pw_actions_format(sc->actions[r], sc->n_actions[r], t, (size_t)len + 1);
  return t;
}

static void record_plan(pw_store *s, int64_t run, const pw_plan *p) {
  for (int st = 0; st < p->S; st++) {
    const pw_stage *sg = &p->part.stages[st];
    json_t *names = json_array();
    for (int l = sg->layer_lo; l < sg->layer_hi; l++) json_array_append_new(names, json_string(p->model.layers[l].name));
    char *js = json_dumps(names, JSON_COMPACT);
    pw_store_stage_insert(s, run, st, p->sched->stage_to_rank[st], js ? js : "[]", (int64_t)sg->params,
                          (sg->flops_f + sg->flops_i + sg->flops_w) * p->mb_size, NULL);
    free(js);
    json_decref(names);
  }
  for (int r = 0; r < p->pp; r++) {
    char *t = actions_text(p->sched, r);
    if (t) pw_store_actions_insert(s, run, r, t, NULL);
    free(t);
  }
}

/* Where to resume: the last step every stage checkpointed (previous runs). */
static int resume_point(pw_store *s, int64_t job, int n_stages, char *dir, size_t cap) {
  json_t *ck = NULL;
  if (pw_store_checkpoint_latest_json(s, job, n_stages, &ck, NULL)) return 0;
  int step = (int)json_integer_value(json_object_get(ck, "step"));
  const char *p0 = json_string_value(json_object_get(json_array_get(json_object_get(ck, "stages"), 0), "path"));
  int ok = p0 && step > 0 && strlen(p0) < cap;
  if (ok) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", p0);
    snprintf(dir, cap, "%s", dirname(tmp));
  }
  json_decref(ck);
  return ok ? step : 0;
}

static void dispatch(pw_coord *c, pw_store *s, int64_t id, const pw_job *job, pw_wconn **ws) {
  pw_err err = {0};
  char b[600];
  int n = job->mesh.pp * job->mesh.dp;
  pw_store_job_set_state(s, id, PW_JOB_PLANNING, "enough idle workers", NULL, NULL);
  pw_plan p;
  if (pw_plan_build(job, NULL, &p, &err)) {
    pw_store_job_set_state(s, id, PW_JOB_FAILED, "planning failed", pw_err_str(&err, b, sizeof b), NULL);
    return;
  }
  /* The plan is built here, once per run: its canonical text is what
   * runs.plan stores and what its hash names; every worker gets a slice. */
  json_t *pj = pw_plan_json(job, &p);
  char *pjs = NULL, plan_sha[PW_SHA256_HEX_LEN + 1];
  int64_t run = 0;
  int rc = pw_slice_plan_text(pj, &pjs, plan_sha);
  json_decref(pj);
  if (rc) pw_err_set(&err, rc, "plan", "out of memory");
  else rc = pw_store_run_insert(s, id, pjs, &run, &err);
  free(pjs);
  if (rc) {
    pw_store_job_set_state(s, id, PW_JOB_FAILED, "cannot record the run", pw_err_str(&err, b, sizeof b), NULL);
    pw_plan_free(&p);
    return;
  }
  record_plan(s, run, &p);
  pw_store_job_set_state(s, id, PW_JOB_DISPATCHING, "plan recorded", NULL, NULL);
  char resume[1024] = "";
  int start = resume_point(s, id, p.S, resume, sizeof resume);
  if (start >= job->train.steps) start = 0, resume[0] = 0;
  pw_jobrt *jr = calloc(1, sizeof *jr);
  if (jr) jr->ranks = calloc((size_t)n, sizeof *jr->ranks);
  if (!jr || !jr->ranks) {
    free(jr);
    pw_store_job_set_state(s, id, PW_JOB_FAILED, "out of memory", "out of memory", NULL);
    pw_plan_free(&p);
    return;
  }
  jr->job = id;
  jr->run = run;
  jr->n_ranks = n;
  jr->n_stages = p.S;
  jr->steps = job->train.steps;
  jr->start_step = start;
  json_t *peers = json_array();
  for (int r = 0; r < n; r++) json_array_append_new(peers, json_pack("{s:i, s:s}", "rank", r, "addr", ws[r]->addr));
  int trace_every = job->train.steps <= 200 ? 1 : job->train.steps / 100;
  char names[512] = "";
  for (int r = 0; r < n; r++) {
    pw_wconn *w = ws[r];
    char *slice = NULL, slice_sha[PW_SHA256_HEX_LEN + 1];
    if (pw_slice_build(job, &p, r, plan_sha, &slice, slice_sha, &err)) {
      /* Only out of memory: the ranks sent so far are stopped by end_run. */
      jr->next = ctl_of(c)->jobs;
      ctl_of(c)->jobs = jr;
      json_decref(peers);
      pw_plan_free(&p);
      end_run(c, jr, "failed", PW_JOB_FAILED, pw_err_str(&err, b, sizeof b), "dispatch failed");
      return;
    }
    json_t *as = PW_CONTROL_BUILD(PW_MSG_ASSIGN, pw_msg_assign, NULL, .job = id, .run = run, .rank = r,
                                  .slice = slice, .slice_sha256 = slice_sha, .peers = peers,
                                  .steps = job->train.steps, .start_step = start, .checkpoint_dir = NULL,
                                  .resume = resume[0] ? resume : NULL, .trace_every = trace_every);
    free(slice);
    w->job = jr;
    w->rank = r;
    jr->ranks[r] = w;
    pw_registry_update(c, w);
    pw_store_assignment_insert(s, run, r, w->id, w->name, NULL);
    pw_ctl_send_msg(w, as);
    size_t l = strlen(names);
    snprintf(names + l, sizeof names - l, "%s%s", r ? ", " : "", w->name);
  }
  json_decref(peers);
  jr->next = ctl_of(c)->jobs;
  ctl_of(c)->jobs = jr;
  snprintf(b, sizeof b, "dispatched %d ranks to %s%s", n, names, start ? " (resuming)" : "");
  if (start) {
    size_t l = strlen(b);
    snprintf(b + l, sizeof b - l, " from the checkpoint of step %d", start);
  }
  pw_store_job_set_state(s, id, PW_JOB_RUNNING, b, NULL, NULL);
  pw_store_job_set_status(s, id, "", NULL);
  pw_plan_free(&p);
}

/* ---- the periodic pass -------------------------------------------------- */

static void sched_tick(pw_coord *c) {
  pw_ctl *ctl = ctl_of(c);
  if (!ctl || c->stopping) return;
  pw_store *s = pw_coord_store(c);
  if (!s) return;
  /* Runs whose job was cancelled (or otherwise ended) through the API. */
  pw_jobrt *next;
  for (pw_jobrt *jr = ctl->jobs; jr; jr = next) {
    next = jr->next;
    pw_job_brief jb;
    if (pw_store_job_brief(s, jr->job, &jb, NULL)) continue;
    free(jb.spec);
    if (jb.state == PW_JOB_CANCELLED) end_run(c, jr, "cancelled", -1, "cancelled by request", "job cancelled");
  }
  /* Queued jobs, oldest first; a job that does not fit does not hold back
   * a later one that does. */
  int64_t *ids = NULL;
  int nq = 0;
  if (pw_store_jobs_in_state(s, PW_JOB_QUEUED, &ids, &nq, NULL)) return;
  for (int i = 0; i < nq; i++) {
    pw_job_brief jb;
    if (pw_store_job_brief(s, ids[i], &jb, NULL)) continue;
    json_error_t je;
    json_t *spec = json_loads(jb.spec, 0, &je);
    free(jb.spec);
    pw_job job;
    pw_err err = {0};
    char b[600];
    if (!spec || pw_job_parse(spec, NULL, &job, &err)) {
      pw_store_job_set_state(s, ids[i], PW_JOB_FAILED, "stored spec is invalid",
                             spec ? pw_err_str(&err, b, sizeof b) : je.text, NULL);
      json_decref(spec);
      continue;
    }
    int need = job.mesh.pp * job.mesh.dp, idle_n, busy, lost;
    pw_wconn *ws[1024];
    idle_n = idle_workers(c, ws, 1024);
    if (idle_n >= need) {
      dispatch(c, s, ids[i], &job, ws);
    } else {
      pw_coord_worker_counts(c, NULL, &busy, &lost);
      snprintf(b, sizeof b, "waiting for %d idle worker%s (%d idle, %d busy connected)", need, need == 1 ? "" : "s",
               idle_n, busy);
      pw_store_job_set_status(s, ids[i], b, NULL);
    }
    pw_job_free(&job);
    json_decref(spec);
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

static int on_step(void *ctx, void *conn, const pw_msg_any *msg, const json_t *raw, pw_err *err) {
  pw_coord *c = ctx;
  pw_wconn *w = conn;
  const pw_msg_step *m = &msg->STEP;
  pw_store *s = pw_coord_store(c);
  pw_jobrt *jr = current_run(w, raw, m->job, m->run);
  if (!s || !jr) return 0;
  int step = (int)m->step;
  if (m->actions) {
    char *t = json_dumps(m->actions, JSON_COMPACT);
    if (t) pw_store_timing_insert(s, jr->job, jr->run, step, w->rank, t, NULL);
    free(t);
  }
  pw_step_acc *a = acc_for(jr, step);
  if (!a) {
    pw_error("job %lld: out of memory for step %d's reports", (long long)jr->job, step);
    return 0;
  }
  a->reports++;
  if (!isnan(m->loss)) a->loss += m->loss, a->has_loss = 1;
  if (!isnan(m->tokens)) a->tokens += m->tokens;
  if (!isnan(m->grad_norm)) a->grad_norm = m->grad_norm;
  if (!isnan(m->lr)) a->lr = m->lr;
  if (m->step_time > a->step_time) a->step_time = m->step_time;
  if (a->reports < jr->n_ranks) return 0;
  pw_metric mt = {.step = step, .loss = a->loss, .step_time = a->step_time, .tokens = a->tokens,
                  .tokens_per_s = a->step_time > 0 ? a->tokens / a->step_time : 0, .grad_norm = a->grad_norm,
                  .lr = a->lr};
  pw_store_metric_insert(s, jr->job, jr->run, &mt, NULL);
  pw_store_job_progress(s, jr->job, step + 1, mt.loss, mt.tokens_per_s, NULL);
  pw_coord_count_step(c, mt.step_time);
  a->step = -1;
  return 0;
}

static int on_checkpoint(void *ctx, void *conn, const pw_msg_any *msg, const json_t *raw, pw_err *err) {
  pw_coord *c = ctx;
  pw_wconn *w = conn;
  const pw_msg_checkpoint *m = &msg->CHECKPOINT;
  pw_store *s = pw_coord_store(c);
  pw_jobrt *jr = current_run(w, raw, m->job, m->run);
  if (s && jr)
    pw_store_checkpoint_insert(s, jr->job, jr->run, (int)m->step, (int)m->stage, w->rank, m->path, m->bytes, NULL);
  return 0;
}

static int on_done(void *ctx, void *conn, const pw_msg_any *msg, const json_t *raw, pw_err *err) {
  pw_coord *c = ctx;
  pw_jobrt *jr = current_run(conn, raw, msg->DONE.job, msg->DONE.run);
  if (!pw_coord_store(c) || !jr) return 0;
  if (++jr->done == jr->n_ranks) end_run(c, jr, "succeeded", PW_JOB_SUCCEEDED, "all ranks done", NULL);
  sched_tick(c);
  return 0;
}

static int on_error(void *ctx, void *conn, const pw_msg_any *msg, const json_t *raw, pw_err *err) {
  pw_coord *c = ctx;
  pw_wconn *w = conn;
  const pw_msg_error *m = &msg->ERROR;
  pw_jobrt *jr = current_run(w, raw, m->job, m->run);
  if (!pw_coord_store(c) || !jr) return 0;
  char why[700];
  snprintf(why, sizeof why, "rank %d (worker %s): %s", w->rank, w->name, m->message);
  end_run(c, jr, "failed", PW_JOB_FAILED, why, "another rank failed");
  sched_tick(c);
  return 0;
}

static void on_lost(pw_coord *c, pw_wconn *w, const char *why) {
  pw_jobrt *jr = w->job;
  if (!jr) return;
  char reason[512];
  snprintf(reason, sizeof reason, "worker %s (rank %d) lost: %s", w->name, w->rank, why);
  jr->ranks[w->rank] = NULL;
  w->job = NULL;
  end_run(c, jr, "failed", PW_JOB_FAILED, reason, "a worker of this run was lost");
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
}

static const pw_ctl_hooks hooks = {
    .msgs = {.on = {[PW_MSG_STEP] = on_step, [PW_MSG_CHECKPOINT] = on_checkpoint, [PW_MSG_DONE] = on_done,
                    [PW_MSG_ERROR] = on_error}},
    .tick = sched_tick,
    .lost = on_lost,
    .shutdown = on_shutdown,
};

const pw_ctl_hooks *pw_sched_hooks(void) { return &hooks; }
