/* tpx: the tensor-parallel all-reduces of a stage group (common/model/tp.h)
 * over the data plane, and the group's canonical view of its parameters
 * for checkpoints and loads.
 *
 * The group is the tp workers (replica * pp + pipeline rank) * tp + t,
 * t = 0 .. tp-1: they run the same action list on their shards, so their
 * programs call pw_tpx_allreduce in the same order, and the k-th call of
 * each is the same all-reduce. A call over n floats is a reduce-scatter
 * then an all-gather (collective.h): member j owns shard j of the buffer;
 * every member sends shard j of its copy to j, j sums the tp copies in
 * member order (pw_reduce_ordered; the largest of them for PW_PROG_MAX)
 * and sends the result to the others. Every member ends with the same
 * bits, and sends 2 (tp-1)/tp of the buffer on average (what the planner
 * counts: pw_coll_bytes_rs_ag).
 *
 * Frames: TP, step = the call's index (from 0, over the run), the
 * microbatch = the sender's t, stage 0, value PW_TPX_RS or PW_TPX_AG.
 * A member may be one call ahead of us, never more: it needs our
 * all-gather of call k to finish k. So a reduce-scatter frame goes into one
 * of two buffers by the call's parity; an all-gather frame is always of the
 * call we are in, and goes straight into its buffer. What we send stays
 * still until it is read: the reduce-scatter's shards of the caller's
 * buffer are read before anyone sends us our last all-gather piece, and
 * the all-gather goes from our own copy (out), not rewritten before
 * every member has finished the call.
 *
 * Checkpoints are canonical (docs/contracts.md): pw_tpx_canon makes a
 * tp = 1 program per local stage; pw_tpx_gather fills it from the group's
 * shards (each shard placed in a zeroed canonical tensor, all-reduced: the
 * other members add zeros), pw_tpx_scatter copies this member's shard of
 * it back. */
#ifndef PW_TPX_H
#define PW_TPX_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "rctx.h"

enum { PW_TPX_RS = 0, PW_TPX_AG = 1 }; /* TP frame values */

typedef struct {
  const pw_rctx *cx;
  pw_model canon_model;  /* the slice's graph, tp = 1 shapes (checkpoints) */
  uint8_t *kinds;        /* [canon_model.n_params] pw_tp_kind of each */
  uint32_t call;         /* index of the call we are in, or of the next one */
  float *buf;            /* the call's buffer, while in it */
  size_t n, lo, hi;      /* its floats, and our shard [lo, hi) */
  size_t smax;           /* the longest shard any call can have */
  float *rx[2];          /* [(tp-1) * smax] each: our shard from each other member, by call parity */
  uint32_t *rx_len[2];   /* [tp] their payload bytes, by sender */
  int rs_got[2];
  uint32_t rs_call[2];
  int ag_got, ag_want;
  float *out;            /* [smax] our summed shard, as sent */
  pw_prog **canon;       /* [n_ls] pw_tpx_canon's programs, or NULL */
  uint64_t bytes;        /* payload bytes sent since the step began */
  double seconds;        /* and the time spent in the calls */
  /* a traced step's all-reduces (from the step's start), back to back
   * ones merged: [2 * n_iv], for the step report's timeline (pw_tpx_spans) */
  double *iv;
  int n_iv, cap_iv;
} pw_tpx;

/* pw_run_create, tp > 1, once the slice is decoded and before the run's
 * context is made: the slice's graph becomes canon_model, cfg's the
 * group's (pw_tp_model), snapshots off (a snapshot is of a whole stage: not
 * taken under tp). */
PW_MUST_CHECK int pw_tpx_setup(pw_tpx *x, pw_runcfg *cfg, pw_err *err);
/* The buffers (none when tp == 1). */
PW_MUST_CHECK int pw_tpx_init(pw_tpx *x, const pw_rctx *cx);
void pw_tpx_close(pw_tpx *x);
/* pw_run_open_files, tp > 1: load (or draw) the canonical parameters as
 * load(arg) does on the local stages' programs, then keep our shard. */
PW_MUST_CHECK int pw_tpx_load(pw_tpx *x, int (*load)(void *arg, pw_err *err), void *arg, pw_err *err);
/* pw_prog_allreduce_fn for the run's programs (ctx: the pw_tpx). On
 * failure err says what failed. */
PW_MUST_CHECK int pw_tpx_allreduce(void *ctx, float *buf, size_t n, int op, pw_err *err);
/* Compute thread, at a traced step's end: its all-reduces as timeline
 * entries ["T", 0, stage, start, end] (appended to acts), then none. */
void pw_tpx_spans(pw_tpx *x, json_t *acts, int stage);
/* The squared gradient norm of p's split parameters (split 1) or of its
 * replicated ones (0), the model ids in skip[ns] left out: a tp = 1
 * rank's is the first summed over the group plus the second. */
double pw_tpx_sqnorm(const pw_tpx *x, pw_prog *p, const int *skip, int ns, int split);
/* Compute thread: tp = 1 programs of the local stages (in canon[]), and
 * back to nothing. */
PW_MUST_CHECK int pw_tpx_canon(pw_tpx *x, pw_err *err);
void pw_tpx_canon_free(pw_tpx *x);
/* Compute thread: canon[] from the group's shards (parameters, m, v): an
 * all-reduce on every member. */
PW_MUST_CHECK int pw_tpx_gather(pw_tpx *x);
/* Our shard of canon[] into our programs (parameters, m, v). */
void pw_tpx_scatter(pw_tpx *x);

/* Compute thread, the run's frame lock held: a TP frame. */
PW_MUST_CHECK int pw_tpx_dest(pw_tpx *x, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
PW_MUST_CHECK int pw_tpx_frame(pw_tpx *x, int from, const pw_frame_hdr *h, pw_err *err);

#endif
