/* snaprun: a run's side of the in-memory snapshots (snap.h) — taking a
 * copy of each local stage after every train.snapshot_every-th step and
 * sending it to the holder rank, holding what peers send, and restoring
 * the stages from memory when a run starts after a loss (snaprun.c says
 * how). */
#ifndef PW_SNAPRUN_H
#define PW_SNAPRUN_H

#include "control.h"
#include "rctx.h"
#include "snap.h"

typedef struct {
  const pw_rctx *cx;
  pw_snapstore *store;     /* the worker's snapshots, or NULL (none taken) */
  int holder;              /* global rank this rank's snapshots go to, or -1 */
  int restore_step;        /* > 0: the run starts from the snapshots of this step */
  int *restore_from;       /* [S] global rank sending each stage's snapshot, or NULL */
  int restore_failed;      /* a snapshot the assign named was not here (said to the coordinator) */
  int restore_got, restore_want; /* stages restored from a peer, of those to wait for */
  pw_snap **rx;            /* [n_ranks] entry a peer's SNAP frames are going into, or NULL */
  int *rx_next;            /* [n_ranks] part expected next from that peer */
  int *rx_step;            /* [n_ranks] the step its part 0 named */
  int report_stage, report_step; /* a held snapshot completed, to report (report_step 0: none) */
  int due;                 /* a snapshot of the state after this many steps is to be taken (0: none) */
  int late;                /* snapshots left to the step end, net of those a wait took */
  double seconds;          /* spent taking snapshots (copies and queueing their sends) */
  int taken, skipped;
} pw_snaprun;

/* The receive tables; store may be NULL (no snapshots). */
PW_MUST_CHECK int pw_snaprun_init(pw_snaprun *x, const pw_rctx *cx, pw_snapstore *store);
void pw_snaprun_close(pw_snaprun *x); /* half-received entries given back, invalid */
/* The rank that keeps rank g's snapshots: the next rank (cyclically) on
 * another host, else the next rank; -1 for a one-rank run. */
int pw_snaprun_holder(const pw_rctx *cx, int g);
/* assign.restore_step / restore_from, checked against the mesh before
 * anything waits on them. */
PW_MUST_CHECK int pw_snaprun_assign(pw_snaprun *x, const pw_msg_assign *a, pw_err *err);
/* Compute thread, after a step's update: when the step is due, its
 * snapshot is marked for the next step (due). */
void pw_snaprun_due(pw_snaprun *x);
/* Compute thread: the due snapshot, if any — a copy of each local stage
 * into the store and to the holder — in a wait that would idle (idle), or
 * at the step end when no wait took it (overdue). Never fails the run: a
 * snapshot that cannot be taken is logged and skipped. */
void pw_snaprun_idle(pw_snaprun *x);
void pw_snaprun_overdue(pw_snaprun *x);
/* Compute thread, before the first step of a run with restore_step: each
 * local stage's state from memory (its own or sent by restore_from), and
 * what this rank holds sent to the ranks that need it. */
PW_MUST_CHECK int pw_snaprun_restore(pw_snaprun *x, pw_err *err);
/* Compute thread, the run's frame lock held: a SNAP frame's destination,
 * and its end. */
PW_MUST_CHECK int pw_snaprun_dest(pw_snaprun *x, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
PW_MUST_CHECK int pw_snaprun_frame(pw_snaprun *x, int from, const pw_frame_hdr *h, pw_err *err);

#endif
