/* collective: the arithmetic of the data plane's collectives over a flat
 * float buffer, shared by the worker (worker/collective.c moves the bytes)
 * and the planner (which counts them). Pure: no frames, no threads.
 *
 * A group is an ordered list of the run's global ranks (the data-parallel
 * replicas of one pipeline rank: worker/dpx.c; the tp members of a stage:
 * worker/tpx.c). The order is the sum order: every reduction adds the
 * members' copies in group order, ((0 + x_0) + x_1) + ..., the same bits
 * on every member and the same as the single-process trainer adding
 * replicas in order.
 *
 * Shards: n elements over k members are k contiguous ranges, the first
 * n % k of them one element longer (shard j starts at j * (n / k) +
 * min(j, n % k)). Member j owns shard j: a reduce-scatter leaves it the
 * sum of shard j, an all-gather gives every member every shard.
 * Chunks: a shard is moved in chunks of `chunk` elements (the last
 * shorter), so the next chunk's send overlaps the current one's sum. */
#ifndef PW_COLLECTIVE_H
#define PW_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "model.h"

/* Shard j of n elements over k members: [*lo, *hi). */
void pw_shard_range(size_t n, int k, int j, size_t *lo, size_t *hi);
/* The longest shard: ceil(n / k). */
size_t pw_shard_max(size_t n, int k);
/* Chunks of `chunk` elements in a range of len elements (0 for an empty
 * range); chunk c covers [c * chunk, min(len, (c + 1) * chunk)). */
int pw_chunk_count(size_t len, size_t chunk);

/* out[i] = ((0 + in[0][i]) + in[1][i]) + ... + in[k-1][i], in that order
 * (out may be one of the in[]: each element is read before it is written). */
void pw_reduce_ordered(float *out, const float *const *in, int k, size_t n);

/* Bytes member me of k sends in a reduce-scatter then an all-gather of n
 * floats: every shard but its own once, then its own to the k-1 others.
 * Summed over the group: exactly 2 (k-1) n floats, so 2 (k-1)/k of the
 * buffer per member on average (each member's share is within one chunk
 * of rounding: shards differ by one element at most). */
uint64_t pw_coll_bytes_rs_ag(size_t n, int k, int me);
/* Of that, the reduce-scatter's part (n minus its own shard). */
uint64_t pw_coll_bytes_rs(size_t n, int k, int me);

/* ---- the data-parallel exchange of a stage (worker/collective.c) ----------
 * Described once for the worker that allocates it and the planner that
 * counts it. Per stage, with dp > 1 replicas and train.zero z:
 *  - z = 0: the whole gradient arena (grad_numel floats, shadows included)
 *    is reduce-scattered, then the summed shards all-gathered back into
 *    it; the rank keeps dp - 1 received shards and the summed one it sends;
 *  - z = 1, 2: the main gradients (train_numel floats, after the shadows
 *    were added in) are reduce-scattered in place, each replica updates
 *    its shard with optimizer state for that shard only, and the updated
 *    parameters are all-gathered; the rank keeps dp - 1 received shards,
 *    the packed shard it sends, one chunk from each other replica and the
 *    shard's two moments.
 *    Gradients some replica needs whole before the reduce-scatter ends — a
 *    parameter's second uses inside the stage (shadows, added in by
 *    pw_prog_grads_finalize) and a parameter tied across stages (summed
 *    over its holders) — are all-reduced first, packed (pw_dp_full_ranges),
 *    so every sum keeps the contract's order: replicas, then uses, then
 *    holders; the reduce-scatter leaves those ranges as they are.
 * Chunks of PW_COLL_CHUNK floats (a test may lower it: PW_COLL_CHUNK in
 * the worker's environment). */
#define PW_COLL_CHUNK ((size_t)1 << 16)
/* The ranges {offset, end} of stage layout L's gradient arena that zero > 0
 * all-reduces whole: each shadow and the main gradient it adds into, and
 * the main gradient of each model parameter in tied[] (n_tied ids; frozen
 * ones have none), sorted and merged. out holds 2 n_shadow + n_tied
 * entries; returns how many it got. */
int pw_dp_full_ranges(const pw_model *m, const pw_prog_layout *L, const int *tied, int n_tied, size_t (*out)[2]);
/* Floats in n ranges. */
size_t pw_ranges_floats(const size_t (*r)[2], int n);
/* Floats of the exchange's buffers for one stage (not the optimizer state);
 * full: pw_ranges_floats of its pw_dp_full_ranges (used when zero > 0).
 * zero 2 has no step-end reduce-scatter of the main gradients, so no
 * received shards (and pw_dp_wgrad_bufs_floats on top); zero 3 no
 * all-gather of parameters either: the full ranges' buffers alone. */
size_t pw_dp_floats(size_t grad_numel, size_t train_numel, size_t full, int dp, int zero, size_t chunk);
/* ---- ZeRO-2: weight gradients reduce-scattered as they are made ----------
 * (worker/gradrs.c). A replica keeps, of a stage's gradient arena, only
 * its shard of the main part and the full ranges (pw_dp_live_ranges; the
 * rest is address space never touched). A node's weight gradients whose
 * range is not inside a full range (pw_dp_wgrad_parts) are computed per
 * microbatch into a scratch of pw_dp_wgrad_floats floats, and at once
 * reduce-scattered over the replicas: shard j of each span to replica j,
 * which adds the dp copies in replica order and that sum into its shard
 * (pw_reduce_ordered_add). Buffers: the scratch and, per call parity, a
 * piece from each other replica (pw_dp_wgrad_bufs_floats). */
/* Bit k set: part k (0 the node's w, 1 its b) of local node `node` (0 =
 * L->node_lo) has a gradient outside the n_full ranges `full`. */
int pw_dp_wgrad_parts(const pw_model *m, const pw_prog_layout *L, int node, const size_t (*full)[2], int n_full);
/* The largest node's such gradients: the scratch. */
size_t pw_dp_wgrad_floats(const pw_model *m, const pw_prog_layout *L, const size_t (*full)[2], int n_full);
/* Scratch plus receive buffers: 2 parities x (dp - 1) pieces of at most
 * min(scratch, the longest shard of train_numel) floats. */
size_t pw_dp_wgrad_bufs_floats(size_t scratch, size_t train_numel, int dp);
/* Bytes replica `me` sends per microbatch of a stage: every span but the
 * part in its own shard. */
uint64_t pw_dp_wgrad_bytes(const pw_model *m, const pw_prog_layout *L, const size_t (*full)[2], int n_full, int dp,
                           int me);
/* The ranges of the gradient arena replica `me` keeps: its shard of
 * [0, train_numel) and the n_full ranges, sorted and merged into out (n_full
 * + 1 entries); returns how many. */
int pw_dp_live_ranges(size_t train_numel, int dp, int me, const size_t (*full)[2], int n_full, size_t (*out)[2]);
/* acc[i] += ((0 + in[0][i]) + in[1][i]) + ... + in[k-1][i]. */
void pw_reduce_ordered_add(float *acc, const float *const *in, int k, size_t n);

/* Floats of one stage's optimizer state (m and v): 2 x train_numel, or
 * twice the longest shard under zero > 0. */
size_t pw_dp_state_floats(size_t train_numel, int dp, int zero);
/* Bytes a replica sends per step in the exchange of one stage: zero 0 the
 * reduce-scatter and all-gather of the gradient arena, else the
 * reduce-scatter of the main gradients, the all-gather of the updated
 * parameters (the same count) and the all-reduce of the full ranges; zero
 * 2 without the reduce-scatter (add m x pw_dp_wgrad_bytes), zero 3 without
 * the all-gather too (add its per-layer gathers: zero3.h). */
uint64_t pw_dp_step_bytes(size_t grad_numel, size_t train_numel, size_t full, int dp, int zero, int replica);

#endif
