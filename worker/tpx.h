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
 * Frames: REDUCE, step = the call's index (from 0, over the run), the
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

#include "errors.h"
#include "prog.h"
#include "wire.h"

typedef struct pw_run pw_run;

enum { PW_TPX_RS = 9, PW_TPX_AG = 10 }; /* REDUCE values (dpx.h has 2 .. 8) */

typedef struct {
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
  /* a traced step's all-reduces (from the step's start), back to back
   * ones merged: [2 * n_iv], for the step report's timeline (pw_tpx_spans) */
  double *iv;
  int n_iv, cap_iv;
} pw_tpx;

/* pw_run_create, tp > 1, once the slice is decoded: the slice's graph
 * becomes r->canon, r->model the group's (pw_tp_model), snapshots off
 * (a snapshot is of a whole stage: not taken under tp). */
PW_MUST_CHECK int pw_tpx_setup(pw_run *r, pw_err *err);
/* pw_run_open_files, tp > 1: load (or draw) the canonical parameters as
 * load runs them on the local stages' programs, then keep our shard. */
PW_MUST_CHECK int pw_tpx_load(pw_run *r, int (*load)(pw_run *, const char *, pw_err *), pw_err *err);
/* pw_run_create, tp > 1: the buffers. */
PW_MUST_CHECK int pw_tpx_alloc(pw_run *r);
void pw_tpx_free(pw_run *r);
/* pw_prog_allreduce_fn for the run's programs (ctx: the pw_run), and the
 * step end's. On failure err says what failed; the caller records it
 * (pw_exec_fail: a program's caller through the entry point's err). */
PW_MUST_CHECK int pw_tpx_allreduce(void *ctx, float *buf, size_t n, int op, pw_err *err);
/* Compute thread, at a traced step's end: its all-reduces as timeline
 * entries ["T", 0, stage, start, end] (appended to acts), then none. */
void pw_tpx_spans(pw_run *r, json_t *acts, int stage);
/* The squared gradient norm of p's split parameters (split 1) or of its
 * replicated ones (0), the model ids in skip[ns] left out: a tp = 1
 * rank's is the first summed over the group plus the second. */
double pw_tpx_sqnorm(const pw_run *r, pw_prog *p, const int *skip, int ns, int split);
/* Compute thread: tp = 1 programs of the local stages (in canon[]), and
 * back to nothing. */
PW_MUST_CHECK int pw_tpx_canon(pw_run *r, pw_err *err);
void pw_tpx_canon_free(pw_run *r);
/* Compute thread: canon[] from the group's shards (parameters, m, v): an
 * all-reduce on every member. */
PW_MUST_CHECK int pw_tpx_gather(pw_run *r);
/* Our shard of canon[] into our programs (parameters, m, v). */
void pw_tpx_scatter(pw_run *r);

/* Compute thread, sh.mu held: a REDUCE frame with one of the values above. */
PW_MUST_CHECK int pw_tpx_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
PW_MUST_CHECK int pw_tpx_frame(pw_run *r, int from, const pw_frame_hdr *h, pw_err *err);

#endif
