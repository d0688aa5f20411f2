/* event: what a run's compute thread asks of its loop thread (a frame
 * to write, a step or checkpoint to report, a message to the coordinator,
 * its end), queued in order (exec.c posts, run.c acts on them). */
#ifndef PW_EVENT_H
#define PW_EVENT_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "schedule.h"
#include "wire.h"

/* A sampled action timing, for the step report's timeline (seconds from
 * the step's start): waiting for its inputs from `ready` to `start`,
 * computing to `end`, handing its outputs on (sends, local copies) to
 * `routed`. */
typedef struct {
  pw_action a;
  double ready, start, end, routed;
} pw_timing;

/* Traced steps' timings travel to the loop in a few buffers made at start
 * (a malloc per step on the compute thread, freed on the loop thread,
 * would creep its heap a page at a time); a step finding none free goes
 * untraced. */
#define PW_TRACE_BUFS 4

/* What the compute thread asks of the loop thread, in order. */
typedef enum {
  PW_EV_SEND,              /* write a frame (header encoded, CRC included) */
  PW_EV_STEP,              /* a step is complete: report it */
  PW_EV_DONE,              /* the last step is complete */
  PW_EV_FAIL,              /* failed with sh.error */
  PW_EV_SNAP,              /* a snapshot of `stage` after `step` steps is in memory (held: a peer's) */
  PW_EV_CKPT,              /* `stage`'s checkpoint after `step` steps is written (and uploaded) */
  PW_EV_CTL,               /* send msg to the coordinator (serving's tokens) */
  PW_EV_EXIT               /* the compute thread has returned */
} pw_event_kind;

typedef struct {
  pw_event_kind kind;
  /* SEND */
  int to;                  /* global rank */
  int li, slot;            /* slot the payload points into, or -1 */
  const void *payload;
  atomic_int *pending;     /* counts the write while it reads a snapshot, or NULL */
  uint64_t len;            /* payload bytes */
  uint64_t off;            /* bytes of header + payload already written */
  uint8_t hdr[PW_FRAME_HDR_SIZE];
  /* STEP (and DONE: peak_act) */
  int step, peak_act, has_loss, has_eval;
  int stage, held;         /* SNAP, CKPT (and step) */
  double step_time, loss, grad_norm, lr, eval_loss;
  uint64_t dp_bytes;       /* STEP: payload bytes this rank sent in the data-parallel exchange */
  uint64_t tp_bytes;       /* STEP: ... in the tensor-parallel all-reduces of the step's actions */
  double tp_seconds;       /* STEP: spent in them (sending, waiting, adding) */
  double dp_seconds;       /* STEP: spent in the data-parallel exchange (dpx.c) */
  json_t *colls;           /* STEP, traced: the collectives' timeline entries (the loop's reference), or NULL */
  double end_wait, end_work; /* STEP: the step end's seconds waiting for peers, and the rest of it */
  double after;            /* STEP: seconds after step_time's mark (eval, snapshot) before the report */
  double t0;               /* STEP: the step's start, CLOCK_MONOTONIC seconds (ranks on a host share it) */
  int sleeps;              /* STEP: waits that slept in poll() since the last report */
  pw_timing *timings;      /* [n_acts] on traced steps (one of trace_buf's), else NULL */
  json_t *msg;             /* CTL: the message (the loop's reference) */
} pw_event;

/* Seconds on CLOCK_MONOTONIC (ranks on one host share it). */
static inline double pw_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
