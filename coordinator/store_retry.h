/* store_retry: the control loop's writes to the store — every one checked,
 * and kept when the store cannot take it.
 *
 * A write the loop makes (a step's metrics, a timing, a state change ...)
 * is a pw_write: what to write, as data. pw_write_do applies it, behind
 * any writes still pending so that order is kept. A write that fails for
 * the store's sake (PW_EIO or PW_ENOMEM: a full disk, a locked or broken
 * file) is logged — naming the job, the run, the step and SQLite's
 * message — counted, and kept in memory; pw_write_flush (every tick)
 * retries the kept writes in order, so once the store works again
 * everything lands as it would have, state changes included (a run whose
 * ranks all finished meanwhile ends in its right state then). A write the
 * store refuses for its content (a state change a cancelled job no longer
 * allows) is logged and dropped: retrying cannot help.
 *
 * The queue is bounded (PW_WRITEQ_MAX writes): past it a write is dropped,
 * logged and counted, and pw_write_do says so, so that the caller fails
 * the job it belongs to; state changes, run ends, events, where a run
 * started and restart counts are kept even past the bound (there are few
 * of them, and they are what says why).
 * Status lines and worker "last seen" stamps are rewritten all the time:
 * they are logged and counted when they fail, never kept.
 *
 * What /healthz and /metrics show (pw_coord: store_failures, store_pending,
 * store_dropped, store_error) is updated under the coordinator's mutex.
 * Loop thread only otherwise. */
#ifndef PW_STORE_RETRY_H
#define PW_STORE_RETRY_H

#include <stdint.h>

#include "coord.h"
#include "store.h"

#define PW_WRITEQ_MAX 20000

typedef enum {
  PW_W_METRIC,      /* job, run, m */
  PW_W_PROGRESS,    /* job, step (= steps done), m.loss, m.tokens_per_s */
  PW_W_TIMING,      /* job, run, step, rank, text = actions JSON */
  PW_W_CHECKPOINT,  /* job, run, step, stage, rank, text = path, bytes */
  PW_W_RUN_FINISH,  /* run, text = run state, text2 = error (may be NULL) */
  PW_W_JOB_STATE,   /* job, state, text = reason, text2 = error (may be NULL) */
  PW_W_JOB_STATUS,  /* job, text = status line (never kept) */
  PW_W_STAGE,       /* run, stage, rank, text = layers JSON, bytes = params, flops */
  PW_W_ACTIONS,     /* run, rank, text = action list */
  PW_W_ASSIGN,      /* run, rank, worker, text = worker name */
  PW_W_WORKER_SEEN, /* worker, text = state (never kept) */
  PW_W_EVENT,       /* job, text = kind, text2 = message */
  PW_W_RUN_RESUME,  /* run, step = the step it starts at, text = "snapshot" | "checkpoint" | "start" */
  PW_W_JOB_RESTARTS, /* job, step = the new restart count */
  PW_W_RUN_STOP,    /* run, step = the step a drain stops it at */
  PW_W__N
} pw_write_kind;

typedef struct {
  pw_write_kind kind;
  int64_t job, run, worker;
  int step, rank, stage, state;
  int64_t bytes;
  double flops;
  pw_metric m;
  const char *text, *text2; /* borrowed by pw_write_do; copied when kept */
} pw_write;

/* Applies w now (or keeps it behind the pending ones). Returns 0 when
 * written, 1 when kept for later (the store is failing), PW_ETOOBIG when
 * dropped because too many writes are pending, another negative PW_E*
 * code when the store refused it (logged; err filled when given). */
int pw_write_do(pw_coord *c, const pw_write *w, pw_err *err);
/* Retries the pending writes in order, stopping at the first that fails
 * again. Returns how many are still pending. */
int pw_write_flush(pw_coord *c);
/* Writes still pending (0 when the store is keeping up). */
int pw_write_pending(pw_coord *c);
/* At shutdown: a last flush, then what could not be written is logged
 * (one line per write) and freed. */
void pw_write_shutdown(pw_coord *c);
/* "job 3 run 5 step 59: metrics" (for logs). */
const char *pw_write_describe(const pw_write *w, char *buf, size_t cap);

#endif
