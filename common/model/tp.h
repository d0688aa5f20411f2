/* tp: tensor parallelism inside a stage, as Megatron-LM splits a
 * transformer — the arithmetic the planner, the kernels and the checkpoint
 * code share. Pure: no threads, no frames.
 *
 * A stage runs on a group of mesh.tp ranks; rank r of the group holds one
 * shard of each split parameter and the whole of the others:
 *  - COLUMN (attention's qkv, the MLP's first linears: fc, or gate and up
 *    together): output rows split, so rank r computes its own heads / its
 *    own hidden units from the whole input. qkv splits by heads: rank r
 *    holds rows [q of its heads; k of its heads; v of its heads], each a
 *    block of C/tp rows, so its packed qkv is that of a model with NH/tp
 *    heads. A column linear's bias splits with its rows.
 *  - ROW (attention's proj, the MLP's last linear): input columns split;
 *    each rank's product is a partial sum, all-reduced in tp-rank order;
 *    the bias is replicated and added once, after the sum.
 *  - VOCAB (the token embedding, lm_head, or the tied embedding serving as
 *    both): vocabulary rows split. The embedding's output is all-reduced
 *    (each token's row lives on one rank, the others add zeros); the loss
 *    is a vocab-parallel cross-entropy (common/compute/ops.h, pw_xent_vp_*): no
 *    rank ever holds a row's whole logits.
 *  - REPLICATED: norms, position embeddings, row biases.
 * Communication, all-reduces of (rows, C) activations in tp-rank order:
 * forward after each ROW linear and the embedding, backward at each COLUMN
 * or VOCAB linear's input gradient (once per input, before its producer's
 * backward); the cross-entropy all-reduces 3 floats
 * per row (max, sum of exponentials, target logit). Weight gradients need
 * none: a ZeroBubble W stays local.
 *
 * Checkpoints stay canonical: a shard is a copy of a slice of the tp = 1
 * tensor (pw_tp_shard), and gathering every rank's shard back
 * (pw_tp_unshard) rebuilds it, so resuming at another tp is gathering at
 * the old one and sharding at the new one. */
#ifndef PW_TP_H
#define PW_TP_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "layout.h"
#include "model.h"
#include "spec.h"

typedef enum { PW_TP_REPLICATED, PW_TP_COLUMN, PW_TP_QKV, PW_TP_ROW, PW_TP_VOCAB } pw_tp_kind;

const char *pw_tp_kind_name(pw_tp_kind k);

/* The split of every parameter of m into kinds[n_params] (an unused id:
 * REPLICATED). A row linear's bias is REPLICATED; a column or qkv linear's
 * bias takes its weight's kind. */
void pw_tp_kinds(const pw_model *m, uint8_t *kinds);

/* The rule mesh.tp must follow: 1, or a gpt / llama template without LoRA
 * whose n_heads, MLP width and vocab_size it divides. PW_ESPEC naming
 * mesh.tp and the value it must divide. */
PW_MUST_CHECK int pw_tp_check(const pw_job *job, const pw_model *m, pw_err *err);

/* Floats of parameter p on one of tp ranks. */
size_t pw_tp_numel(const pw_param *p, pw_tp_kind k, int tp);
/* Copy rank r's shard of the canonical tensor src into dst (pw_tp_numel
 * floats), and back: pw_tp_unshard writes shard src into its place in the
 * canonical dst. */
void pw_tp_shard(float *dst, const float *src, const pw_param *p, pw_tp_kind k, int tp, int r);
void pw_tp_unshard(float *dst, const float *src, const pw_param *p, pw_tp_kind k, int tp, int r);

/* The all-reduces over the tp group in layers [lo, hi), per sequence:
 * floats and count, forward (after ROW linears and the embedding; the
 * cross-entropy's max, then its sum and target logit: 3 floats per row in
 * 2) and backward (at COLUMN, QKV and VOCAB linears' input gradients,
 * once per input: llama's gate and up add theirs, then one all-reduce). */
typedef struct {
  size_t fwd, bwd; /* floats */
  int n_fwd, n_bwd;
} pw_tp_comm;
void pw_tp_comm_layers(const pw_model *m, const uint8_t *kinds, int lo, int hi, pw_tp_comm *out);

/* The graph one of tp ranks runs: a copy of m with each split
 * parameter's shape (and numel) divided by tp along its split, each split
 * linear's output width, the heads (NH / tp) and the widths of the values
 * between a column (qkv, vocab) linear and the row linear (or loss) after
 * it divided too, aux sizes recomputed. Ids of values, nodes, parameters
 * and layers are m's; the ports between layers (the residual stream) keep
 * their widths. kinds (m->n_params) receives the split. Free with
 * pw_model_free. PW_ENOMEM only. */
PW_MUST_CHECK int pw_tp_model(const pw_model *m, int tp, pw_model *out, uint8_t *kinds);

/* Shrinks sz, the tp = 1 sizes of nodes [node_lo, node_hi) (layout.h), to
 * what one of tp ranks holds: each split parameter's arena, gradient (and a
 * second use's shadow) and optimizer state by 1/tp. Activations and
 * scratch are left whole (an upper bound). */
void pw_tp_shrink_sizes(const pw_model *m, const uint8_t *kinds, int node_lo, int node_hi, int tp,
                        pw_prog_sizes *sz);

#endif
