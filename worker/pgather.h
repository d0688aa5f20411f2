/* pgather: ZeRO-3 (train.zero 3) — a replica keeps only its shard of each
 * stage's parameters and gathers a layer's whole parameters from the
 * other replicas of its data-parallel group right before the layer
 * computes (common/model/zero3.h has the units, runs and pieces;
 * docs/contracts.md "Data-parallel sums and shards" the policy).
 *
 * A stage's parameter arena is address space (mmap, PROT_NONE) in which
 * only our shard's pages are readable and writable: the optimizer updates
 * the shard in place (pw_optim_update_range, as under zero 1 and 2) and
 * anything else reaching into the arena faults. The program calls
 * pw_pgather_unit before each layer of a forward, a backward_input or a
 * backward (pw_prog_set_pgather): the layer's gather is issued — our
 * pieces of it sent to every other replica straight from the arena, and
 * copied into a gather buffer — unless a prefetch issued it already; we
 * wait for its frames, issue the next layer's gather (the prefetch: its
 * frames travel while this layer computes; after an action's last layer,
 * the first layer of the list's next action that gathers:
 * pw_pgather_next_action) and point the layer's parameters into its
 * buffer. At the entry point's end they point back into the arena. Keep/regather policy: nothing is kept across entry
 * points; every F, I (or B) and remat recompute gathers each layer again;
 * W reads no parameter and gathers nothing.
 *
 * The k-th gather of the run is the same (stage, layer) on every replica
 * (they run the same action lists over the same programs). A replica
 * issues gather k + 1 only once it has gather k whole, our pieces
 * included: no frame comes for a gather more than one past the last we
 * issued. Computing on gather j we have issued at most j + 1 (the
 * prefetch), so frames come for j + 2 at most, and of three buffers, by k
 * mod 3, the one computed on never takes a frame; each gather sends every
 * other replica at least one frame (an empty one when it has no piece of
 * the layer) so none runs further ahead.
 *
 * Our sends read the arena's shard, which changes only at the update:
 * pw_pgather_quiesce waits for them to be written before it.
 *
 * Frames: DP, step = the gather's index over the run, microbatch = the
 * sender's replica | the unit (the layer less the stage's first) << 12,
 * stage = the stage, value = PW_PGATHER_PIECE | off << 4, off the piece's
 * offset in the unit buffer. */
#ifndef PW_PGATHER_H
#define PW_PGATHER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "rctx.h"
#include "zero3.h"

struct pw_dpx;
typedef struct pw_pgather pw_pgather;

enum { PW_PGATHER_PIECE = 12 }; /* the DP value's low 4 bits (dpx.h has 2-9, gradrs.h 11) */

typedef struct {
  pw_pgather *g;        /* the callback's context is this stage */
  int li;               /* local stage */
  pw_z3_units z;
  size_t lo, hi;        /* our shard of the arena */
  float *arena;         /* [numel] address space; [lo, hi) mapped read-write */
  size_t arena_bytes;
  size_t *want;         /* [n_units] frames a gather of unit u receives */
  size_t numel;
  pw_z3_piece *pc;      /* room for one unit's pieces */
} pw_pgather_stage;

typedef struct {
  uint32_t call;        /* the gather whose frames it holds (UINT32_MAX: none yet) */
  int li, unit;         /* of which local stage and unit */
  size_t got;           /* frames arrived */
} pw_pgather_slot;

struct pw_pgather {
  const pw_rctx *cx;
  struct pw_dpx *dp;    /* the exchange it is part of: its counters */
  pw_pgather_stage *st; /* [n_ls] */
  float *buf[PW_Z3_RING]; /* gather buffers of the largest unit of any local stage */
  size_t buf_floats;
  pw_pgather_slot slot[PW_Z3_RING];
  uint32_t issued, done; /* gathers issued and completed over the run */
  int pre_li, pre_unit;  /* the prefetched gather (index done when the layer asks), or pre_li -1 */
  int bound_li, bound_unit; /* the unit whose parameters point into a buffer, or bound_li -1 */
  int after_li, after_unit; /* the first layer the next gathering action of the list gathers, or after_li -1 */
  atomic_int pending;    /* our sends the loop thread still writes */
  uint64_t gathers;      /* gathers completed over the run (what a test counts) */
};

/* pw_dpx_init, zero 3: the arenas lent to the programs (no_params), the
 * gather buffers. PW_ENOTSUP when a unit is too large for a piece's
 * offset (2^28 floats) or a stage has a frozen parameter. */
PW_MUST_CHECK int pw_pgather_init(pw_pgather *g, const pw_rctx *cx, struct pw_dpx *dp);
void pw_pgather_close(pw_pgather *g);

/* The programs' pw_prog_unit_fn (ctx: the stage's pw_pgather_stage). */
PW_MUST_CHECK int pw_pgather_unit(void *ctx, int layer, int next, pw_err *err);

/* Compute thread, before action acts[at] of a list of n: the first layer
 * the next action after it that gathers (an F, I or B of ours) asks for,
 * so this action's last layer prefetches it; none past the list's end
 * (the update comes between steps). */
void pw_pgather_next_action(pw_pgather *g, const pw_action *acts, int at, int n);

/* Compute thread: wait until every piece we sent is written (before the
 * update changes the shard). */
PW_MUST_CHECK int pw_pgather_quiesce(pw_pgather *g);

/* Points stage li's parameters into `whole` (numel floats: a checkpoint's
 * gathered copy, a file being loaded), or back into the arena (NULL). */
void pw_pgather_lend(pw_pgather *g, int li, float *whole);

/* Compute thread, the run's frame lock held: a DP frame whose value's low
 * 4 bits are PW_PGATHER_PIECE (dpx.c passes it on). */
PW_MUST_CHECK int pw_pgather_dest(pw_pgather *g, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
PW_MUST_CHECK int pw_pgather_frame(pw_pgather *g, int from, const pw_frame_hdr *h, pw_err *err);

#endif
