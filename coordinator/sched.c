/* sched: the job lifecycle on the control loop.
 *
 *   queued -> planning -> dispatching -> running -> succeeded | failed | cancelled
 *
 * A queued job waits, and says so in its status, until enough idle workers
 * are connected; then dispatch.c plans it (the same pw_plan_build as
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
 * Planning runs on a worker thread (dispatch.c): a large spec plans for
 * seconds, and the loop must keep answering heartbeats. The job shows
 * as planning meanwhile, its workers reserved; cancelling it, losing one
 * of them or shutting down ends it, and the plan is dropped when it
 * comes back. Runs end through jobrt.c. Every store write goes through store_retry.h: checked,
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
#include "ctl_int.h"
#include "gen.h"
#include "log.h"
#include "store_retry.h"
#include "tbdir.h"

static pw_ctl *ctl_of(pw_coord *c) { return c->ctl; }

/* ---- dispatch ------------------------------------------------------------ */

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

/* ---- the periodic pass -------------------------------------------------- */

static void sched_tick(pw_coord *c) {
  pw_ctl *ctl = ctl_of(c);
  if (!ctl || c->stopping) return;
  pw_gen_pump(c);
  /* Writes kept while the store failed go first; no new run starts while
   * some are pending (its own writes would only join the queue). */
  int pending = pw_write_flush(c);
  pw_tbdir_tick(c, pending); /* event files due (none while writes are kept back) */
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
    if (jb.state == PW_JOB_CANCELLED) pw_jobrt_end(c, jr, "cancelled", -1, "cancelled by request", "job cancelled");
    /* cancelled and retried before this pass saw it: the old run stops
     * here, before the queued job is dispatched again below */
    else if (jb.state == PW_JOB_QUEUED)
      pw_jobrt_end(c, jr, "cancelled", -1, "cancelled by request (the job was retried since)", "job cancelled");
  }
  if (c->draining) return; /* nothing new starts while the coordinator drains */
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
      pw_jobrt_set_state(c, ids[i], PW_JOB_FAILED, "stored spec is invalid", spec ? pw_err_str(&err, b, sizeof b) : je.text);
      json_decref(spec);
      continue;
    }
    json_decref(spec);
    int need = job.mesh.pp * job.mesh.dp * job.mesh.tp, idle_n, busy, lost;
    pw_wconn *ws[1024];
    idle_n = idle_workers(c, ws, 1024);
    if (pending) {
      snprintf(b, sizeof b, "waiting for the store: %d write%s pending", pending, pending == 1 ? "" : "s");
      pw_jobrt_set_status(c, ids[i], b);
    } else if (idle_n >= need) {
      pw_wconn *chosen[1024];
      pw_rec_choose(c, ids[i], need, ws, idle_n, chosen);
      pw_dispatch(c, s, ids[i], &job, chosen); /* takes job */
      continue;
    } else {
      pw_coord_worker_counts(c, NULL, &busy, &lost);
      snprintf(b, sizeof b, "waiting for %d idle worker%s (%d idle, %d busy connected)", need, need == 1 ? "" : "s",
               idle_n, busy);
      pw_jobrt_set_status(c, ids[i], b);
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
  jr->step_time = a->step_time;
  pw_write w = {.kind = PW_W_METRIC, .job = jr->job, .run = jr->run, .m = mt};
  if (pw_write_do(c, &w, NULL) == PW_ETOOBIG) {
    char what[64];
    snprintf(what, sizeof what, "step %d's metrics", step);
    pw_jobrt_lost_write(c, jr, what);
    return;
  }
  pw_tbdir_step(c, jr->job, jr->run); /* --tensorboard-dir: the run's file is due */
  pw_write pg = {.kind = PW_W_PROGRESS, .job = jr->job, .step = step + 1, .m = mt};
  pw_write_do(c, &pg, NULL); /* kept when it fails; a lost one is the next step's to fix */
  pw_coord_count_step(c, mt.step_time);
  if (!nonfinite) return;
  pw_coord_count_nonfinite(c, jr->on_nonfinite); /* /metrics: the alert "a job diverged" */
  char why[160];
  snprintf(why, sizeof why, "diverged at step %d: %s not finite", step,
           nonfinite == 3 ? "the loss and the gradient norm are" : nonfinite & 1 ? "the loss is" : "the gradient norm is");
  if (jr->on_nonfinite == PW_NONFINITE_SKIP) {
    char msg[240];
    snprintf(msg, sizeof msg, "%s (train.on_nonfinite: skip)", why);
    pw_jobrt_event(c, jr->job, "nonfinite", msg);
    pw_warn("job %lld: %s", (long long)jr->job, msg);
    return;
  }
  pw_jobrt_end(c, jr, "failed", PW_JOB_FAILED, why, "the job diverged");
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
    pw_jobrt_lost_write(c, jr, "a step report (out of memory)");
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
  if (pw_write_do(c, &cw, NULL) == PW_ETOOBIG) pw_jobrt_lost_write(c, jr, "a checkpoint");
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
    if (jr->stop_at) {
      pw_drain_run_done(c, jr);
    } else if (final_missing(c, jr, why, sizeof why)) {
      pw_error("job %lld: %s", (long long)jr->job, why);
      pw_jobrt_event(c, jr->job, "checkpoint", why);
      pw_jobrt_end(c, jr, "failed", PW_JOB_FAILED, why, NULL);
    } else {
      pw_jobrt_end(c, jr, "succeeded", PW_JOB_SUCCEEDED, "all ranks done", NULL);
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
  if (jr->stop_at) { /* draining: whatever failed, the job resumes from its checkpoint */
    pw_drain_run_failed(c, jr, why);
    sched_tick(c);
    return 0;
  }
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
    pw_jobrt_event(c, jr->job, "resume", why);
    pw_jobrt_end(c, jr, "interrupted", PW_JOB_QUEUED, why, "restoring from snapshots failed");
  } else {
    pw_jobrt_end(c, jr, "failed", PW_JOB_FAILED, why, "another rank failed");
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
    pw_jobrt_end(c, jr, "failed", PW_JOB_QUEUED, b, "a worker of this run was lost");
    return;
  }
  pw_jobrt_event(c, jr->job, "worker_lost", reason);
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
    pw_jobrt_end(c, jr, "interrupted", PW_JOB_QUEUED, reason, cancel);
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
  pw_jobrt_end(c, jr, "failed", PW_JOB_FAILED, final, "a worker of this run was lost");
}

/* SIGTERM: running jobs go back to the queue (they resume from their last
 * checkpoint when the coordinator is back); their workers stop. */
static void on_shutdown(pw_coord *c) {
  pw_ctl *ctl = ctl_of(c);
  while (ctl && ctl->jobs) {
    pw_jobrt *jr = ctl->jobs;
    pw_jobrt_end(c, jr, "interrupted", PW_JOB_QUEUED, "coordinator shutting down; the job will run again",
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
