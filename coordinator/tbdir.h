/* tbdir: --tensorboard-dir DIR — the coordinator keeps each run of each
 * job as a TensorBoard event file,
 *
 *   DIR/job-<id>/events.out.tfevents.<created>.pipewright.<run>
 *
 * (<created> the job's creation time in whole seconds, <run> the run's id
 * in ten digits, so a job's files sort in the order its runs ran), made
 * from the store by pw_store_tfevents (store.h): a run's file begins with
 * a SessionLog START at its first step, so TensorBoard, reading a job's
 * files in name order, shows at each step the latest run's row, as the
 * metrics API does. `tensorboard --logdir DIR` shows one curve per job;
 * `wandb sync --sync-tensorboard DIR` uploads them.
 *
 * A file is written again within about a second of each recorded step (at
 * most once a second per run, and a large file no faster than 1 MiB a
 * second: each write is the whole file) and at the run's end, always
 * whole: the bytes go to a temporary file in the same folder (whose name
 * has no "tfevents" in it: no reader picks it up), then a rename puts it
 * in place, so a reader — or a kill -9 of the coordinator — never sees
 * half a record. While a run is its job's latest its file only grows, so
 * TensorBoard reading it as it grows stays in step. The store reads and
 * the file writes run on libuv's thread pool, never on the loop. A write
 * that fails is logged (the path and why) and counted
 * (pipewright_tensorboard_write_failures_total in /metrics), and tried
 * again 10 s later (an ended run's three times at most, then given up:
 * its rows stay in the store, GET /v1/jobs/ID/events.tfevents has them).
 * Nothing is written while the store is keeping writes
 * back (store_retry.h): the file would lack them.
 *
 * Every function is a no-op when the coordinator has no --tensorboard-dir.
 * Loop thread only. */
#ifndef PW_TBDIR_H
#define PW_TBDIR_H

#include <stdint.h>

#include "coord.h"

/* Starts keeping files under dir (created when missing: its parent must
 * exist). PW_EIO naming dir when it cannot be made or written. */
PW_MUST_CHECK int pw_tbdir_open(pw_coord *c, const char *dir, pw_err *err);
/* A step of run `run` of job `job` was recorded: its file is due. */
void pw_tbdir_step(pw_coord *c, int64_t job, int64_t run);
/* The run ended: its file is written now (or as soon as the write under
 * way ends), then forgotten. */
void pw_tbdir_end(pw_coord *c, int64_t job, int64_t run);
/* The periodic pass: writes the files that are due. store_pending: the
 * store's kept-back writes (none is written while there are some). */
void pw_tbdir_tick(pw_coord *c, int store_pending);
/* After the loop has ended (no write is under way then): frees it all. */
void pw_tbdir_close(pw_coord *c);

#endif
