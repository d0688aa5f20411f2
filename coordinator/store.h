/* store: the coordinator's SQLite store — workers, jobs, runs, partitions,
 * schedules, step metrics, sampled action timings, checkpoints, events.
 *
 * WAL mode, synchronous=NORMAL (a kill -9 of the coordinator loses nothing
 * that was committed), foreign keys on, busy_timeout so that the HTTP
 * threads and the control loop can share the file. Every write that
 * belongs together is one transaction. Migrations are versioned
 * (PRAGMA user_version): each migration is a step from version k to k+1,
 * applied in order in one transaction at open; a database newer than this
 * code is refused.
 *
 * A pw_store is one connection and must be used by one thread at a time:
 * each thread opens its own (pw_store_open on the same path).
 * Queries that feed the API return jansson objects shaped as the API's
 * responses (see api/openapi.yaml), so handlers do not re-map fields.
 * Times are seconds since the epoch (REAL). All functions return 0 or a
 * negative PW_E* code (PW_ENOENT for a missing row, PW_EIO for SQLite
 * errors, with the SQLite message in err when err is given). Every
 * int-returning function is PW_MUST_CHECK: a write that failed (a full
 * disk, say) must be handled, never dropped (the control loop queues it,
 * store_retry.h). */
#ifndef PW_STORE_H
#define PW_STORE_H

#include <jansson.h>
#include <stdint.h>

#include "errors.h"
#include "tfevents.h"

typedef struct pw_store pw_store;

/* Job states, in lifecycle order. */
typedef enum {
  PW_JOB_QUEUED,
  PW_JOB_PLANNING,
  PW_JOB_DISPATCHING,
  PW_JOB_RUNNING,
  PW_JOB_SUCCEEDED,
  PW_JOB_FAILED,
  PW_JOB_CANCELLED,
  PW_JOB__N
} pw_job_state;

const char *pw_job_state_name(int state); /* "queued" */
int pw_job_state_parse(const char *s);    /* -1 if unknown */
int pw_job_state_terminal(int state);     /* succeeded, failed, cancelled */

PW_MUST_CHECK int pw_store_open(const char *path, pw_store **out, pw_err *err);
void pw_store_close(pw_store *s);
PW_MUST_CHECK int pw_store_schema_version(pw_store *s);
double pw_store_now(void);

/* ---- workers ------------------------------------------------------------- */

/* Insert or update by name; returns the worker's id. */
PW_MUST_CHECK int pw_store_worker_register(pw_store *s, const char *name, const char *addr, int cores, int threads,
                             const char *software, int64_t *id, pw_err *err);
PW_MUST_CHECK int pw_store_worker_seen(pw_store *s, int64_t id, const char *state, pw_err *err);

/* ---- jobs ---------------------------------------------------------------- */

typedef struct {
  const char *name;
  const char *spec;      /* canonical job spec JSON (pw_job_to_json) */
  int steps, pp, dp, virtual_stages, microbatches;
  const char *schedule;
  const char *model;     /* "gpt d=64 L=4", for lists */
  const char *dataset;   /* the dataset id the job reads, or NULL */
  const char *tokenizer; /* the dataset id of its tokenizer.json (data.tokenizer), or NULL */
  const char *weights[2]; /* init: the weights ids it starts from (model, optimizer), NULL or "" for none */
  const char *client_key; /* the submit's Idempotency-Key, or NULL */
  const char *client_sha; /* with it: SHA-256 hex of the request's body */
} pw_job_new;

/* Inserts a queued job and its "queued" event in one transaction; with a
 * dataset, also the link that keeps the dataset from being deleted while
 * the job is live (PW_ESPEC at data.dataset when no such dataset is
 * stored: nothing is inserted). */
PW_MUST_CHECK int pw_store_job_insert(pw_store *s, const pw_job_new *j, int64_t *id, pw_err *err);
/* The job submitted with Idempotency-Key key: its id and the SHA-256 hex
 * of the body it came with (PW_ENOENT: none). A client_key taken by
 * another insert makes pw_store_job_insert fail with PW_ECONFLICT. */
PW_MUST_CHECK int pw_store_job_by_key(pw_store *s, const char *key, int64_t *id, char sha[65], pw_err *err);

/* Changes the state (and error / status text, either may be NULL to keep),
 * stamps started (on running) / finished (on a terminal state), appends an
 * event {kind: "state", message: "<old> -> <new>: <reason>"}; all in one
 * transaction. Refuses (PW_ECONFLICT) to leave a terminal state. */
PW_MUST_CHECK int pw_store_job_set_state(pw_store *s, int64_t id, int state, const char *reason, const char *error,
                           pw_err *err);
/* The human-readable status line ("waiting for 4 idle workers (2 idle)"). */
PW_MUST_CHECK int pw_store_job_set_status(pw_store *s, int64_t id, const char *status, pw_err *err);
/* Progress after a step: steps done, latest loss, tokens/s. */
PW_MUST_CHECK int pw_store_job_progress(pw_store *s, int64_t id, int steps_done, double loss, double tokens_per_s,
                          pw_err *err);

/* The latest held-out loss (the job object's "eval_loss"). */
PW_MUST_CHECK int pw_store_job_eval_loss(pw_store *s, int64_t id, double eval_loss, pw_err *err);

/* A drain told run `run` to stop after `step` steps (drain.c): its ranks
 * upload that step's checkpoint. */
PW_MUST_CHECK int pw_store_run_stop(pw_store *s, int64_t run, int step, pw_err *err);

/* Minimal view for the scheduler. spec is malloc'd (caller frees). */
typedef struct {
  int64_t id;
  int state;
  int steps, steps_done;
  char *spec;
  int run;               /* latest run id, 0 if none */
  int stop_step;         /* the step a drain told that run to stop at (its checkpoint is taken there), 0: none */
} pw_job_brief;
PW_MUST_CHECK int pw_store_job_brief(pw_store *s, int64_t id, pw_job_brief *out, pw_err *err);
/* Ids of jobs in a state, oldest first (*ids malloc'd). */
PW_MUST_CHECK int pw_store_jobs_in_state(pw_store *s, int state, int64_t **ids, int *n, pw_err *err);
/* Jobs caught mid-flight by a crash (planning, dispatching, running): back
 * to queued, their open runs marked failed, an event each. Returns how many. */
PW_MUST_CHECK int pw_store_recover(pw_store *s, const char *reason, pw_err *err);

/* ---- restarts and retries (issue 15: surviving lost workers) ------------ */

/* How many times the job went back to the queue after losing a worker
 * (reset by a retry). PW_ENOENT for an unknown job. */
PW_MUST_CHECK int pw_store_job_restarts(pw_store *s, int64_t job, int *restarts, pw_err *err);
/* Sets that count (store_retry.h's PW_W_JOB_RESTARTS). */
PW_MUST_CHECK int pw_store_job_set_restarts(pw_store *s, int64_t job, int restarts, pw_err *err);
/* A failed or cancelled job back to queued, to resume from its newest
 * state: error and finished cleared, status "", restarts 0, and an event
 * {kind "retry"}; one transaction. PW_ENOENT for an unknown job,
 * PW_ECONFLICT naming the state for a job in any other state (nothing
 * changes then). */
PW_MUST_CHECK int pw_store_job_retry(pw_store *s, int64_t job, pw_err *err);

/* API views (new references):
 * job: {"id", "name", "state", "status", "error", "model", "schedule",
 *       "mesh": {"pp","dp","virtual_stages"}, "microbatches",
 *       "progress": {"step", "total"}, "loss", "tokens_per_s", "created",
 *       "started", "finished", "run", "restarts", "spec"?}  (spec only when with_spec)
 * list: {"jobs": [job...], "total", "limit", "offset"} filtered by state
 *       (-1 = all), newest first. */
PW_MUST_CHECK int pw_store_job_json(pw_store *s, int64_t id, int with_spec, json_t **out, pw_err *err);
PW_MUST_CHECK int pw_store_jobs_json(pw_store *s, int state, int limit, int offset, json_t **out, pw_err *err);

/* ---- runs, partition, schedule ------------------------------------------- */

/* A new attempt of a job (attempt numbers 1, 2, ...); sets jobs.run. */
PW_MUST_CHECK int pw_store_run_insert(pw_store *s, int64_t job_id, const char *plan_json, int64_t *run_id, pw_err *err);
PW_MUST_CHECK int pw_store_run_finish(pw_store *s, int64_t run_id, const char *state, const char *error, pw_err *err);
/* Where a run starts: its first step and what it resumes from ("snapshot",
 * "checkpoint" or "start"; store_retry.h's PW_W_RUN_RESUME). */
PW_MUST_CHECK int pw_store_run_resume(pw_store *s, int64_t run_id, int start_step, const char *from, pw_err *err);
/* Every attempt of the job, oldest first (a JSON array, new reference):
 * [{"attempt", "run", "state", "started", "finished" (null while open),
 *   "reason" (the run's error, null when none), "start_step" and
 *   "resumed_from" (null when unknown), "workers": [names by rank]}].
 * [] for a job that never ran; PW_ENOENT for an unknown job. */
PW_MUST_CHECK int pw_store_attempts_json(pw_store *s, int64_t job, json_t **out, pw_err *err);
/* The partition: one row per stage. */
PW_MUST_CHECK int pw_store_stage_insert(pw_store *s, int64_t run_id, int stage, int rank, const char *layers_json,
                          int64_t params, double flops, pw_err *err);
/* Which worker runs which rank. */
PW_MUST_CHECK int pw_store_assignment_insert(pw_store *s, int64_t run_id, int rank, int64_t worker_id,
                               const char *worker_name, pw_err *err);
/* A rank's action list in the text form ("F0@s0 F1@s0 B0@s0 ..."). */
PW_MUST_CHECK int pw_store_actions_insert(pw_store *s, int64_t run_id, int rank, const char *actions, pw_err *err);
/* {"run", "attempt", "state", "stages": [{"stage","rank","layers","params","flops"}],
 *  "ranks": [{"rank","worker","actions"}]} of the job's latest run. */
PW_MUST_CHECK int pw_store_run_json(pw_store *s, int64_t job_id, json_t **out, pw_err *err);
/* The plan document the latest run was dispatched with (runs.plan, parsed):
 * pw_plan_json's shape. PW_ENOENT when the job has no run (or its plan is
 * not an object). */
PW_MUST_CHECK int pw_store_run_plan_json(pw_store *s, int64_t job_id, json_t **out, pw_err *err);
/* The step the latest run's plan predicts, in seconds: its simulated
 * makespan, with the data-parallel exchange when it has one
 * (analytics.step_makespan, else analytics.makespan), and whether the
 * spec's partition.layer_times costed it (*measured 1) or the FLOP model
 * did (0). Read inside the stored texts (SQLite's json_extract), not
 * parsed: /metrics asks for it per running job at every scrape.
 * PW_ENOENT when the job has no run or its plan no makespan. */
PW_MUST_CHECK int pw_store_run_planned_step(pw_store *s, int64_t job_id, double *seconds, int *measured, pw_err *err);

/* ---- metrics, timings, checkpoints, events ------------------------------- */

typedef struct {
  int step;
  double loss, step_time, tokens, tokens_per_s, grad_norm, lr;
  double eval_loss;      /* train.eval_every: held-out loss; NaN (NULL) when the step did not evaluate */
} pw_metric;
/* One row per (job, run, step): a later run repeating a step adds a row
 * and keeps the earlier run's (writing the same (job, run, step) again
 * replaces it, so a retried write is harmless). A NaN value (a diverged
 * loss, say) is stored as NULL and shown as null, never as 0. */
PW_MUST_CHECK int pw_store_metric_insert(pw_store *s, int64_t job_id, int64_t run_id, const pw_metric *m, pw_err *err);
/* {"metrics": [{"step","loss","step_time","tokens","tokens_per_s","grad_norm","lr","time","run","eval_loss"}]}
 * for steps >= since, ascending, one row per step: the latest run's. */
PW_MUST_CHECK int pw_store_metrics_json(pw_store *s, int64_t job_id, int since, json_t **out, pw_err *err);
/* The same with every run's row of each step (by step, then run). */
PW_MUST_CHECK int pw_store_metrics_all_json(pw_store *s, int64_t job_id, int since, json_t **out, pw_err *err);
/* A metrics row's keys in the order above: the columns of its CSV. */
#define PW_STORE_METRICS_NKEYS 10
extern const char *const pw_store_metrics_keys[PW_STORE_METRICS_NKEYS];
/* The job's scalars as a TensorBoard event file (common/io/tfevents.h),
 * appended to *out (store_tfevents.c); *created (may be NULL) gets the
 * job's created time. run > 0: that run's rows only (--tensorboard-dir
 * keeps a file per run); 0: every run's, oldest first. The file is
 *   file_version "brain.Event:2" at the job's created time, then for each
 *   run that has rows, a SessionLog START at its first step (TensorBoard
 *   drops what an earlier run recorded from that step on, so each step
 *   shows the latest run's row, as the metrics view does), then one event
 *   per row, at the row's time and step: train/loss, train/lr,
 *   train/grad_norm, train/tokens_per_s, train/step_time and eval/loss (a
 *   null leaves its scalar out), and at the steps whose per-rank action
 *   timings that run sampled pipeline/bubble (the timeline view's measured
 *   bubble), pipeline/rankR/busy_s (the seconds of rank R's F/B/I/W
 *   actions) and pipeline/rankR/bubble (its idle share of the step's span).
 * Values are float32, as TensorBoard keeps them. While a run is the job's
 * latest, its rows and timings only grow (a step's timings are written
 * before its row), so its file (run > 0) only grows, by whole events.
 * PW_ENOENT for an unknown job; on an error *out is as it was. */
PW_MUST_CHECK int pw_store_tfevents(pw_store *s, int64_t job_id, int64_t run, pw_tf_buf *out, double *created,
                                    pw_err *err);
/* actions_json: [[kind, mb, stage, start, end], ...] of one rank at one step. */
PW_MUST_CHECK int pw_store_timing_insert(pw_store *s, int64_t job_id, int64_t run_id, int step, int rank,
                           const char *actions_json, pw_err *err);
/* {"step", "ranks": [{"rank", "actions": [{"kind","mb","stage","start","end"}]}]}
 * for the given step, or the latest sampled step when step < 0 (PW_ENOENT
 * when none). Also "steps": [the sampled steps]. */
PW_MUST_CHECK int pw_store_timeline_json(pw_store *s, int64_t job_id, int step, json_t **out, pw_err *err);
PW_MUST_CHECK int pw_store_checkpoint_insert(pw_store *s, int64_t job_id, int64_t run_id, int step, int stage, int rank,
                               const char *path, int64_t bytes, pw_err *err);
/* {"step", "stages": [{"stage","rank","path","bytes"}]}: the latest step at
 * which one run of the job checkpointed exactly the stages 0..n_stages-1
 * (on a tie, the later run's files); earlier runs count, so a retry can
 * resume from its predecessor's checkpoint (PW_ENOENT if none). */
PW_MUST_CHECK int pw_store_checkpoint_latest_json(pw_store *s, int64_t job_id, int n_stages, json_t **out, pw_err *err);
PW_MUST_CHECK int pw_store_event(pw_store *s, int64_t job_id, const char *kind, const char *message, pw_err *err);
/* {"events": [{"id","time","kind","message"}]} with id > since, ascending. */
PW_MUST_CHECK int pw_store_events_json(pw_store *s, int64_t job_id, int64_t since, json_t **out, pw_err *err);

/* ---- datasets (store_datasets.c; the files are datasets.h's) ------------- */

typedef struct {
  const char *id;         /* sha256, 64 lowercase hex */
  int64_t size;
  const char *format;     /* "text" | "tokens" */
  const char *name;       /* NULL: none */
  int64_t vocab_size, width, n_tokens; /* tokens; -1: unknown or not tokens */
} pw_dataset_new;

/* Records a dataset unless its id is already there (then the stored row,
 * name included, stays). *created: 1 when this call added it. *out (when
 * not NULL): the row as the API shows it:
 *   {"id", "sha256", "size", "format", "name" (null when none), "created",
 *    and for tokens with a known header "vocab_size", "width", "n_tokens"} */
PW_MUST_CHECK int pw_store_dataset_insert(pw_store *s, const pw_dataset_new *d, int *created, json_t **out,
                                          pw_err *err);
/* One dataset (PW_ENOENT at "ds" when unknown). */
PW_MUST_CHECK int pw_store_dataset_json(pw_store *s, const char *id, json_t **out, pw_err *err);
/* {"datasets": [dataset...]}, newest first. */
PW_MUST_CHECK int pw_store_datasets_json(pw_store *s, json_t **out, pw_err *err);
/* Deletes the row: PW_ENOENT when unknown, PW_ECONFLICT (naming the job)
 * while a job that is not finished uses it. *out (when not NULL) gets the
 * deleted row. The caller removes the file after. */
PW_MUST_CHECK int pw_store_dataset_delete(pw_store *s, const char *id, json_t **out, pw_err *err);
/* The dataset a job reads (id[65], "" when none). */
PW_MUST_CHECK int pw_store_job_dataset(pw_store *s, int64_t job_id, char id[65], pw_err *err);

/* ---- checkpoint shards (store_ckpt.c; the files are checkpoints.h's) ----- */

/* Records one shard of step `step` (optimizer: the optimizer file, else
 * the model file; a repeat replaces the row). n_stages is the job's stage
 * count: when every stage's two shards are in, the step is recorded
 * complete and *complete (may be NULL) is 1; it stays complete. */
PW_MUST_CHECK int pw_store_ckpt_shard(pw_store *s, int64_t job_id, int64_t run_id, int step, int stage, int optimizer,
                                      int64_t bytes, const char *checksum, int n_stages, int *complete, pw_err *err);
/* The newest complete step (its stage count in *n_stages, may be NULL);
 * PW_ENOENT naming the job when there is none. */
PW_MUST_CHECK int pw_store_ckpt_latest(pw_store *s, int64_t job_id, int *step, int *n_stages, pw_err *err);
/* The same among the steps <= max_step. */
PW_MUST_CHECK int pw_store_ckpt_latest_upto(pw_store *s, int64_t job_id, int max_step, int *step, int *n_stages,
                                            pw_err *err);
/* Step `step` complete and retained: 0 (stage count in *n_stages, may be
 * NULL), else PW_ENOENT naming the step. */
PW_MUST_CHECK int pw_store_ckpt_step(pw_store *s, int64_t job_id, int step, int *n_stages, pw_err *err);
/* {"checkpoints": [{"step","stages","bytes","time","run"}]}: the retained
 * complete steps, ascending. */
PW_MUST_CHECK int pw_store_ckpts_json(pw_store *s, int64_t job_id, json_t **out, pw_err *err);
/* Retention: deletes the rows of every complete step older than the
 * newest `keep` (>= 1) and of every incomplete step older than the newest
 * complete one (no resume ever repeats it: a run resumes from the newest
 * complete step). The newest complete step always stays: it is the one a
 * queued resume needs. The steps whose rows went are in *gone (malloc'd,
 * ascending, *n_gone of them; the caller removes their files and frees). */
PW_MUST_CHECK int pw_store_ckpt_prune(pw_store *s, int64_t job_id, int keep, int **gone, int *n_gone, pw_err *err);
/* Deletes every checkpoint row of the job (the caller removes its folder). */
PW_MUST_CHECK int pw_store_ckpt_purge(pw_store *s, int64_t job_id, pw_err *err);

/* ---- weights (store_weights.c; the files are weights.h's) --------------- */

typedef struct {
  const char *id;         /* sha256, 64 lowercase hex */
  int64_t size;
  const char *kind;       /* "model" | "optimizer" */
  const char *name;       /* NULL: none */
  const char *source;     /* "upload", "job 3 step 10": where it came from */
  int64_t n_tensors, params;
} pw_weights_new;

/* Records weights unless the id is there (then the stored row stays).
 * *created: 1 when added. *out (when not NULL): the row as the API shows it:
 *   {"id", "sha256", "size", "kind", "name", "source", "created",
 *    "n_tensors", "params"} */
PW_MUST_CHECK int pw_store_weights_insert(pw_store *s, const pw_weights_new *w, int *created, json_t **out,
                                          pw_err *err);
/* One row (PW_ENOENT at "ck" when unknown). */
PW_MUST_CHECK int pw_store_weights_json(pw_store *s, const char *id, json_t **out, pw_err *err);
/* {"checkpoints": [row...]}, newest first. */
PW_MUST_CHECK int pw_store_weights_list_json(pw_store *s, json_t **out, pw_err *err);
/* Deletes the row: PW_ENOENT when unknown, PW_ECONFLICT (naming the job)
 * while a job that is not finished uses it; *out gets the deleted row. */
PW_MUST_CHECK int pw_store_weights_delete(pw_store *s, const char *id, json_t **out, pw_err *err);

/* ---- totals for /metrics -------------------------------------------------- */

/* counts[state] of jobs; steps and tokens recorded in all. */
PW_MUST_CHECK int pw_store_totals(pw_store *s, int64_t counts[PW_JOB__N], int64_t *steps, double *tokens, pw_err *err);

/* ---- fault injection (tests) ---------------------------------------------- */

/* Makes writes fail as on a full disk (PW_EIO, "database or disk is full
 * (sqlite 13, injected)"), process-wide, for every connection: the
 * writes numbered after+1 .. after+count from now fail, then writes work
 * again (count < 0: until called again; after < 0: off). The coordinator
 * reads PW_STORE_FAIL_AFTER=N and PW_STORE_FAIL_COUNT=M from the
 * environment at its first open, and PW_STORE_FAIL_FILE=PATH makes every
 * write fail while PATH exists (a test creates and removes it). */
void pw_store_fault_inject(int64_t after, int64_t count);
void pw_store_fault_file(const char *path);

#endif
