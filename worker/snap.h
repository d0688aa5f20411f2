/* snap: in-memory snapshots of stage state, so a run that loses a worker
 * resumes at most train.snapshot_every steps back without reading a disk.
 *
 * After every K-th step each rank copies its stages' state (parameters and
 * the optimizer's two moments; the step is the rest of it: the learning
 * rate, AdamW's t and every batch are functions of the step) into an entry
 * of its own (kind OWN) and sends the same bytes to a peer, which keeps
 * them as a HELD entry. A worker keeps the newest PW_SNAP_GENS steps of
 * each (job, stage, kind): ranks finish a step at most one step apart (the
 * global norm is every step's barrier), so two generations always share a
 * step every rank still has. The coordinator mirrors what each worker
 * holds from the worker's "snapshot" messages, and after a loss names, per
 * stage, who sends it to the new run (kind RESTORE at the receiver).
 *
 * The store belongs to the worker daemon and outlives its runs: a run that
 * is cancelled after a loss leaves its snapshots for the next run of the
 * same job. Entries are found and claimed under the store's mutex; their
 * data is written by the one thread that claimed it (users) and read by
 * writes to the network (sending), and an entry in either use is never
 * handed to another writer nor freed. */
#ifndef PW_SNAP_H
#define PW_SNAP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define PW_SNAP_GENS 2

typedef enum { PW_SNAP_OWN = 0, PW_SNAP_HELD = 1, PW_SNAP_RESTORE = 2 } pw_snap_kind;

typedef struct pw_snap {
  uint64_t job;
  int stage;
  int kind;                /* pw_snap_kind */
  int step;                /* the state after `step` steps; 0 while written (or abandoned) */
  size_t numel;            /* floats of each part: parameters, m, v */
  float *data;             /* [3 * numel] */
  int users;               /* a writer or readers (under the store's mutex) */
  atomic_int sending;      /* queued network writes reading data */
  struct pw_snap *next;
} pw_snap;

typedef struct {
  uv_mutex_t mu;
  pw_snap *list;
  size_t bytes;            /* held in all entries */
} pw_snapstore;

int pw_snapstore_init(pw_snapstore *s);
/* Frees every entry: no run may use the store any more. */
void pw_snapstore_free(pw_snapstore *s);
/* Frees the entries of every job but `keep` (0: of every job) that no one
 * uses; returns how many bytes remain. */
size_t pw_snapstore_drop_others(pw_snapstore *s, uint64_t keep);

/* An entry to write the state of (job, stage) after `step` steps into:
 * the one of that kind already at that step, else a new one while fewer
 * than PW_SNAP_GENS exist, else the oldest that no one uses. It is claimed
 * and invalid (step 0) until pw_snap_end_write. NULL when every candidate
 * is in use, or out of memory. */
pw_snap *pw_snap_begin_write(pw_snapstore *s, uint64_t job, int stage, int kind, int step, size_t numel);
/* The write is over: the entry holds step `step` (0: abandoned, invalid). */
void pw_snap_end_write(pw_snapstore *s, pw_snap *e, int step);
/* A valid entry of (job, stage) at `step` of any kind (OWN first), claimed
 * for reading; NULL when there is none. */
pw_snap *pw_snap_acquire(pw_snapstore *s, uint64_t job, int stage, int step);
void pw_snap_release(pw_snapstore *s, pw_snap *e);

#endif
