/* gradrs: ZeRO-2 (train.zero 2) — each node's weight gradients of a
 * microbatch reduce-scattered over the data-parallel replicas the moment
 * the W (or B) action makes them, so a replica accumulates only its shard
 * (common/model/collective.h has the arithmetic and what is kept; the
 * contract's sum order is docs/contracts.md's "Data-parallel sums and
 * shards").
 *
 * A stage's gradient arena is address space (mmap, PROT_NONE) in which
 * only the live ranges — our shard of the main gradients and the full
 * ranges the step end all-reduces whole (dpx.c) — are readable, writable
 * and touched; anything else reaching into it faults. The program
 * accumulates the full ranges in place as under zero 1 and hands every
 * other node's gradients to pw_gradrs_flush from a scratch
 * (pw_prog_set_wgrad).
 *
 * The flush is blocking, inside the action, the k-th flush of a run being
 * the same one on every replica (they run the same action lists over the
 * same programs): shard j of each span goes to replica j (an empty frame
 * when no span meets shard j); we wait for the other replicas' frames,
 * add the dp copies of our part in replica order and that sum into our
 * shard, and wait until our own sends are written (the scratch is the
 * next node's). A replica is at most one flush ahead of us (it needs our
 * frame to finish its own), so the copies land in one of two buffers by
 * the flush's parity.
 *
 * Frames: DP with step = the flush's index over the run, microbatch =
 * the sender's replica, stage = the stage, value = PW_GRADRS_PIECE | off <<
 * 4, off the piece's offset in our part (a node has at most two spans). */
#ifndef PW_GRADRS_H
#define PW_GRADRS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "rctx.h"

struct pw_dpx;
typedef struct pw_gradrs pw_gradrs;

enum { PW_GRADRS_PIECE = 11 }; /* the DP value's low 4 bits (dpx.h has 2-8) */

typedef struct {
  pw_gradrs *g;          /* the flush's context is this stage */
  int li;                /* local stage */
  float *arena;          /* [grad_numel] address space; only live is mapped read-write */
  size_t arena_bytes;    /* of the mapping */
  size_t (*live)[2];     /* [n_live] {offset, end}: our shard of the main part, the full ranges */
  int n_live;
  float *scratch;        /* [pw_dp_wgrad_floats] one node's gradients of one microbatch */
  float *rx[2];          /* per flush parity: [(dp-1) * cap] our part from each other replica */
  size_t cap;            /* floats of a piece at most */
} pw_gradrs_stage;

struct pw_gradrs {
  const pw_rctx *cx;
  struct pw_dpx *dp;     /* the exchange it is part of: its shards, full ranges, counters */
  pw_gradrs_stage *st;   /* [n_ls] */
  uint32_t call;         /* flushes done over the run */
  uint32_t rx_call[2];   /* the flush whose pieces rx[parity] holds */
  size_t rx_got[2];      /* frames of them arrived */
  atomic_int pending;    /* our sends the loop thread still writes */
};

/* pw_dpx_init, zero 2, once each stage's full ranges are known
 * (dp->st[li].full): the arenas lent to the programs, the scratches and
 * receive buffers. */
PW_MUST_CHECK int pw_gradrs_init(pw_gradrs *g, const pw_rctx *cx, struct pw_dpx *dp);
void pw_gradrs_close(pw_gradrs *g);

/* The programs' pw_prog_wgrad_fn (ctx: the stage's pw_gradrs_stage). On
 * failure err says what failed; the program's caller records it. */
PW_MUST_CHECK int pw_gradrs_flush(void *ctx, const float *scratch, const size_t (*spans)[2], int n_spans, pw_err *err);

/* Compute thread, the run's frame lock held: a DP frame whose value's low
 * 4 bits are PW_GRADRS_PIECE (dpx.c passes it on). */
PW_MUST_CHECK int pw_gradrs_dest(pw_gradrs *g, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
PW_MUST_CHECK int pw_gradrs_frame(pw_gradrs *g, int from, const pw_frame_hdr *h, pw_err *err);

#endif
