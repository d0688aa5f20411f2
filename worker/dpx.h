/* dpx: the data-parallel exchange of a pipeline rank's
 * stages with the same rank of the other replicas — a reduce-scatter and
 * an all-gather over each stage's flat buffers, chunked, the frames and
 * their bookkeeping. The arithmetic (shards, chunks, the ordered sum, what
 * is kept) is common/compute/collective.h's; stepend.c decides when each
 * runs.
 *
 * The group is the replicas in replica order (global ranks d * pp +
 * prank); replica d owns shard d of each stage's buffer. Reduce-scatter:
 * every replica sends shard j of its buffer to replica j, which sums the
 * dp copies in replica order, chunk by chunk, and sends each summed chunk
 * on (train.zero 0: the all-gather of the gradients) while it sums the
 * next. With train.zero 1 or 2 the summed shard stays (the update uses
 * it and the shard's optimizer state) and the updated parameters are
 * all-gathered instead; the ranges every replica needs whole (shadows,
 * tied parameters: pw_dp_full_ranges) are all-reduced first, packed, so
 * every sum keeps the order of zero 0 and the single-process trainer.
 *
 * Frames: DP, step = the training step, microbatch = the sending
 * replica, stage = the stage, value = what (low 4 bits, PW_DPX_*) and the
 * chunk index (value >> 4). No buffer needs a copy per step parity: a
 * replica sends step t + 1's reduce-scatter only once it has every chunk
 * of our step-t all-gather, which we send only after summing all of our
 * step-t shard. */
#ifndef PW_DPX_H
#define PW_DPX_H

#include <stddef.h>
#include <stdint.h>

#include "gradrs.h"
#include "pgather.h"
#include "rctx.h"

#define PW_DPX_MAX 4096 /* replicas summed at once: mesh.dp's bound (common/spec) */

/* What a DP frame carries (its value's low 4 bits; gradrs.h has 11,
 * pgather.h 12). */
enum {
  PW_DPX_RS = 2,    /* a chunk of the sender's copy of our shard */
  PW_DPX_AG = 3,    /* a chunk of the sender's summed gradients (zero 0) or updated parameters */
  PW_DPX_NORM = 4,  /* zero > 0: the sender's partial squared norm of its shards (8 bytes) */
  PW_DPX_GM = 5,    /* zero > 0, to replica 0 at a checkpoint: a chunk of the sender's m shard */
  PW_DPX_GV = 6,    /* ... of its v shard */
  PW_DPX_FRS = 7,   /* zero > 0: PW_DPX_RS of the packed full ranges */
  PW_DPX_FAG = 8,   /* zero > 0: PW_DPX_AG of their sums */
  PW_DPX_GP = 9     /* zero 3, to replica 0 at a checkpoint: a chunk of the sender's parameter shard */
};

/* Per local stage. */
typedef struct {
  float *buf;            /* [n] what is exchanged: the gradient arena, or the packed full ranges */
  size_t n;              /* floats exchanged: grad_numel (zero 0), train_numel, or the full ranges' */
  size_t lo, hi;         /* our shard of them */
  size_t smax;           /* the longest shard */
  int n_chunks;          /* of our shard */
  float *rx;             /* [(dp-1) * smax] our shard from each other replica (replica d at d - (d > replica)) */
  float *out;            /* [smax] what our all-gather sends: the summed gradients (zero 0), else the packed parameters */
  float *ag;             /* zero > 0: [(dp-1) * chunk] a parameter chunk from each other replica, scattered on arrival */
  float *m, *v;          /* zero > 0: the shard's optimizer state */
  float *gm, *gv;        /* zero > 0, replica 0 at a checkpoint (and at a load): [n] the whole state: m in
                            the gradient arena (idle then), v made by the first frame */
  float *gp;             /* zero 3, likewise: [n] the whole parameters, lent to the program (pw_pgather_lend) */
  int *rs_step, *rs_got; /* [n_chunks] copies of our chunk c that arrived for step rs_step[c] */
  int ag_step, ag_got, ag_need; /* all-gather chunks arrived for ag_step, of ag_need */
  int g_step, g_got, g_need;    /* gathered state chunks arrived for g_step, of g_need */
  size_t (*full)[2];     /* zero > 0: [n_full] the ranges of the gradient arena all-reduced whole */
  int n_full;
} pw_dpx_stage;

typedef struct pw_dpx {
  const pw_rctx *cx;
  pw_dpx_stage *st;        /* [n_ls] the gradient arenas' (or zero > 0: the trained parameters') exchange, or NULL */
  pw_dpx_stage *fr;        /* [n_ls] zero > 0: the full ranges' all-reduce (buf is the packed ranges) */
  size_t chunk;            /* floats per chunk */
  double *norm;            /* [2 * dp] zero > 0: each replica's shard norm, by step parity */
  int *norm_step;
  pw_gradrs *gradrs;       /* zero 2 and 3: the reduce-scatter inside W and B actions (gradrs.c) */
  pw_pgather *pgather;     /* zero 3: the per-layer gathers of parameters (pgather.c) */
  uint64_t bytes;          /* payload bytes sent this step */
  double seconds;          /* and the time spent in the exchange */
  double t0, t1;           /* its first start and last end, from the step's start (t0 < 0: none yet) */
} pw_dpx;

/* The buffers (none when dp == 1 or forward only); the stages' programs
 * exist. */
PW_MUST_CHECK int pw_dpx_init(pw_dpx *x, const pw_rctx *cx);
void pw_dpx_close(pw_dpx *x);
/* The train.zero in effect: 0 when dp == 1 or not training. */
int pw_dpx_zero(const pw_rctx *cx);

/* Compute thread, zero 0: every local stage's gradient arena summed over
 * the replicas in replica order (reduce-scatter, then all-gather). */
PW_MUST_CHECK int pw_dpx_allreduce(pw_dpx *x);
/* Compute thread, zero > 0, first: the full ranges (pw_dp_full_ranges)
 * of every stage's gradient arena all-reduced in replica order, so the
 * shadows can be added in and tied parameters summed over their holders
 * as under zero 0. */
PW_MUST_CHECK int pw_dpx_reduce_full(pw_dpx *x);
/* Compute thread, zero > 0, then: each stage's main gradients
 * reduce-scattered in place (our shard of the arena holds the sum; the
 * full ranges keep theirs; the rest is stale). */
PW_MUST_CHECK int pw_dpx_reduce_scatter(pw_dpx *x);
/* Compute thread, zero > 0: the replicas' partial squared norms (each its
 * shards') summed in replica order into *total, the same on all. */
PW_MUST_CHECK int pw_dpx_norm(pw_dpx *x, double part, double *total);
/* Compute thread, zero > 0, after the update: our updated parameter shards
 * to the other replicas, and theirs into our parameters. */
PW_MUST_CHECK int pw_dpx_allgather_params(pw_dpx *x);
/* Compute thread, zero > 0, at a checkpoint step: replicas other than 0
 * send their optimizer shards to replica 0; replica 0 waits for them and
 * lends the whole state to its programs (pw_prog_wire_moments) until
 * pw_dpx_state_release. */
PW_MUST_CHECK int pw_dpx_state_gather(pw_dpx *x);
void pw_dpx_state_release(pw_dpx *x);
/* Compute thread, zero > 0, around loading parameters and optimizer state
 * from a checkpoint or init weights: whole moments lent to the programs,
 * then our shard kept of them. */
PW_MUST_CHECK int pw_dpx_load_begin(pw_dpx *x);
void pw_dpx_load_end(pw_dpx *x);

/* Compute thread, the run's frame lock held: a DP frame (route.c). */
PW_MUST_CHECK int pw_dpx_dest(pw_dpx *x, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
PW_MUST_CHECK int pw_dpx_frame(pw_dpx *x, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);

#endif
