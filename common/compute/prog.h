/* prog: a stage program — the layers [lo, hi) of a model, made runnable.
 *
 * A program owns four flat arenas for its parameters (params, grads, AdamW
 * m and v, llm.c style: one allocation each, tensors wired into it, laid
 * out by common/model/layout.h, which the planner reads too; a frozen
 * parameter, pw_param.frozen, has no gradient and no m or v, and a node
 * whose parameters are all frozen skips its backward-weight) and
 * n_slots activation slots. A slot holds everything one microbatch needs
 * between its forward and its backward: every value the stage produces or
 * receives, the gradients of those values, and the ops' saved auxiliaries.
 * The caller decides which microbatch lives in which slot; the single-
 * process trainer uses one slot, a pipeline rank as many as its schedule
 * keeps in flight. A slot is allocated (and touched) once, at create or the
 * first time pw_prog_slot_ensure asks for it, and reused after: a
 * pipeline's slots grow during its first step and never again.
 *
 * Ports connect a program to the rest of the model: an input port is a
 * value the stage reads but does not produce (the model's tokens/features,
 * its targets, or another stage's output), an output port one it produces
 * that a later stage reads. The caller fills input ports before forward
 * (and the gradients of output ports before backward) through
 * pw_prog_value / pw_prog_grad, and reads the rest back from them.
 *
 * Recomputation (remat). A remat program keeps per slot only the ports
 * (layout.h's keep part: what the network fills and reads while the
 * microbatch waits) and runs everything else in work buffers: forward takes
 * one for the length of the F and gives it back; backward and
 * backward_input take one, re-run the forward into it (the same kernels in
 * the same order over the same inputs: the same bits), then the backward;
 * backward gives it back, backward_input keeps it for the slot's
 * backward_weight. So a stage holds as many work buffers as it has
 * microbatches between I and W, plus the one being computed on
 * (pw_plan's n_work); they are made on demand, up to max_slots, and kept.
 * pw_prog_value of a value outside the ports is NULL while its slot holds
 * no work buffer.
 *
 * bf16 (docs/contracts.md, "bf16"). A bf16 program runs its linear nodes
 * with bf16 operands and float32 accumulation (bf16.h): the weight is
 * rounded into a bf16 copy at each forward of the node (so a copy is never
 * older than the parameters: nothing changes them between a microbatch's
 * forward and its backward), the input or output gradient at each call,
 * into program scratch. Everything else stays float32. And every float
 * value a later layer reads is rounded to bf16 in place right after the
 * node that makes it: a pipeline sends such values, and only those, so its
 * stages send them as bf16 (pw_prog_wire) and lose nothing; the single-
 * process run computes the same bits.
 *
 * The model must outlive the program. */
#ifndef PW_PROG_H
#define PW_PROG_H

#include <stddef.h>

#include "backend.h"
#include "bf16.h"
#include "errors.h"
#include "layout.h"
#include "model.h"

typedef struct {
  int layer_lo, layer_hi; /* layers [lo, hi) of the model */
  int mb_size;            /* sequences per microbatch */
  int batch_size;         /* sequences per optimizer step in all (loss scale) */
  int n_slots;            /* slots made at create */
  int max_slots;          /* slots that may exist (0 = n_slots); more are made by
                             pw_prog_slot_ensure as a pipeline needs them */
  int remat;              /* recompute the forward before the backward (above) */
  int n_work;             /* remat: work buffers made at create */
  int no_moments;         /* 1: no m and v arenas (ZeRO keeps a shard of them
                             elsewhere; pw_prog_wire_moments lends whole ones
                             to a checkpoint's save or load) */
  int bf16;               /* train.precision "bf16": below */
  int no_grads;           /* 1: no gradient arena of its own (ZeRO-2 lends one:
                             pw_prog_set_wgrad) */
  const struct pw_backend *backend; /* where it runs (backend.h); NULL: the CPU */
  int no_params;          /* 1: no parameter arena of its own (ZeRO-3 lends one:
                             pw_prog_set_pgather) */
} pw_prog_config;

typedef struct {
  const pw_param *meta;   /* name, shape, decay */
  int model_index;        /* id in the model's parameter table */
  float *data, *grad, *m, *v;  /* grad, m, v NULL when frozen */
} pw_prog_param;

typedef struct pw_prog pw_prog;

PW_MUST_CHECK int pw_prog_create(const pw_model *m, const pw_prog_config *cfg, pw_prog **out, pw_err *err);
void pw_prog_free(pw_prog *p);

const pw_model *pw_prog_model(const pw_prog *p);
/* The program's backend (backend.h). The arenas and parameters below are
 * that backend's memory: on a device the caller moves them in and out
 * through these two (memcpy on the CPU), which also wait for the kernels
 * before them; 0 or a negative code with err. The ports are the host's on
 * every backend: off the CPU, pw_prog_value and pw_prog_grad give a slot's
 * host copies of its ports (and NULL for any other value), which the entry
 * points copy to the device and back — forward: the inputs' values in, the
 * outputs' out; backward and backward_input: the outputs' gradients in,
 * the inputs' out. So the trainer and a pipeline rank fill and read ports
 * the same way on either. */
const struct pw_backend *pw_prog_backend(const pw_prog *p);
PW_MUST_CHECK int pw_prog_upload(pw_prog *p, void *dst, const void *src, size_t bytes, pw_err *err);
PW_MUST_CHECK int pw_prog_download(pw_prog *p, void *dst, const void *src, size_t bytes, pw_err *err);
const pw_prog_config *pw_prog_config_of(const pw_prog *p);
const pw_prog_layout *pw_prog_layout_of(const pw_prog *p);

int pw_prog_n_params(const pw_prog *p);
pw_prog_param *pw_prog_param_at(pw_prog *p, int i);
size_t pw_prog_numel(const pw_prog *p);  /* floats in the parameter arena */
/* The arenas themselves: parameters (numel floats) and gradients
 * (grad_numel floats: the train_numel main gradients of the trainable
 * parameters, then shadow gradients of second and later uses of one inside
 * this program). */
float *pw_prog_params(pw_prog *p);
float *pw_prog_grads(pw_prog *p);
/* The optimizer's arenas, train_numel floats each: AdamW's m (which 0;
 * SGD's momentum) and v (which 1). A stage's state is these and the
 * parameters. */
float *pw_prog_moment(pw_prog *p, int which);
size_t pw_prog_grad_numel(const pw_prog *p);
/* Points every trainable parameter's m and v into m and v (train_numel
 * floats each, laid out as the gradients' main part), or at NULL for both
 * NULL; pw_prog_moment then returns them. For a no_moments program. */
void pw_prog_wire_moments(pw_prog *p, float *m, float *v);
size_t pw_prog_train_numel(const pw_prog *p);
/* Adds each shadow gradient into its parameter's main gradient, in node
 * order (use 1 + use 2 + ...). Once per step, after all microbatches (and
 * after any data-parallel reduction of the whole gradient arena), before
 * norms and the optimizer. */
void pw_prog_grads_finalize(pw_prog *p);
/* Bytes of one slot (values, value gradients, auxiliaries); of a remat
 * program, of its keep part. */
size_t pw_prog_slot_bytes(const pw_prog *p);
/* Remat: bytes of one work buffer, and how many exist now. 0 otherwise. */
size_t pw_prog_work_bytes(const pw_prog *p);
int pw_prog_n_work(const pw_prog *p);
/* Make slot `slot` (< max_slots) exist. PW_EINVAL past max_slots, PW_ENOMEM.
 * Not thread-safe against itself; safe while other slots are computed on. */
PW_MUST_CHECK int pw_prog_slot_ensure(pw_prog *p, int slot);
int pw_prog_max_slots(const pw_prog *p);

int pw_prog_n_inputs(const pw_prog *p);
const pw_prog_port *pw_prog_input(const pw_prog *p, int i);
int pw_prog_n_outputs(const pw_prog *p);
const pw_prog_port *pw_prog_output(const pw_prog *p, int i);
int pw_prog_has_loss(const pw_prog *p);

/* Buffer of value `value` in `slot` (float or int32 data, per its dtype),
 * or NULL if the value is not held by this program. */
void *pw_prog_value(pw_prog *p, int slot, int value);
/* Gradient buffer of a float value in `slot`, or NULL if it has none. */
float *pw_prog_grad(pw_prog *p, int slot, int value);
/* bf16 programs: the slot's send buffer for float output port `value`
 * (its elements as bf16, filled by pw_prog_wire_fill), else NULL. */
pw_bf16 *pw_prog_wire(pw_prog *p, int slot, int value);
/* Rounds output port `value` of `slot` into its send buffer (exact: the
 * value holds bf16 numbers already) and returns it; NULL as above. */
const pw_bf16 *pw_prog_wire_fill(pw_prog *p, int slot, int value);

/* Each parameter drawn from a stream keyed by (seed, its name), so any
 * program holding a parameter initialises it identically. On a device,
 * drawn on the host and uploaded; a failed upload is returned by the next
 * entry point. */
void pw_prog_init_params(pw_prog *p, unsigned long long seed);
void pw_prog_zero_grad(pw_prog *p);

/* The four entry points return 0 or a negative code, and then fill err
 * (may be NULL) with what went wrong, "stage program: ..." (nothing is
 * computed, except after a callback's failure: below):
 * - PW_EINVAL: slot is not one create or pw_prog_slot_ensure made, or a
 *   backward_weight of a remat program with no backward_input before it;
 * - PW_ENOMEM (remat only): no work buffer could be had to recompute into;
 * - a failed tensor-parallel all-reduce or ZeRO-2 weight-gradient hand-off
 *   (pw_prog_set_tp, pw_prog_set_wgrad): the callback's code and err. */

/* Runs the stage's nodes for the microbatch in `slot`. Input ports must be
 * filled. If the stage holds the loss, *loss receives this microbatch's
 * share of the batch-mean loss (loss may be NULL). */
PW_MUST_CHECK int pw_prog_forward(pw_prog *p, int slot, float *loss, pw_err *err);
/* Gradients w.r.t. the stage's values and input ports (ZeroBubble's I).
 * The gradients of output ports must be filled; all other value gradients
 * of the slot are overwritten (what they held before does not matter; the
 * result is bit for bit that of zeroing them and accumulating). */
PW_MUST_CHECK int pw_prog_backward_input(pw_prog *p, int slot, pw_err *err);
/* Gradients w.r.t. the parameters, accumulated (ZeroBubble's W). Needs the
 * slot's value gradients from backward_input. */
PW_MUST_CHECK int pw_prog_backward_weight(pw_prog *p, int slot, pw_err *err);
/* Both halves (a full B), node by node. */
PW_MUST_CHECK int pw_prog_backward(pw_prog *p, int slot, pw_err *err);

/* Tensor parallel (common/model/tp.h, docs/contracts.md "Tensor parallel").
 * A program of rank `rank` of a tp group is made over the group's graph
 * (pw_tp_model: split shapes, which say the group's size) and then told its
 * place here, once, before any entry point. It then all-reduces through `fn` (blocking, the same
 * calls in the same order on every member): a row linear's output before
 * its bias is added, the vocab-parallel embedding's output, the
 * cross-entropy's row maxima (PW_PROG_MAX) and its row sums, and in the
 * backward a value's gradient before its producer's backward when every
 * reader of the value is a column, qkv or vocab linear (each adds a
 * partial sum). fn returns 0, or a negative code with its err (never NULL)
 * filled; the first failure is kept (no further call is made) and returned,
 * with that err, by this entry point and every later one (the numbers are
 * garbage then). */
enum { PW_PROG_SUM, PW_PROG_MAX };
typedef int (*pw_prog_allreduce_fn)(void *ctx, float *buf, size_t n, int op, pw_err *err);
PW_MUST_CHECK int pw_prog_set_tp(pw_prog *p, int rank, pw_prog_allreduce_fn fn, void *ctx);

/* ZeRO-2 (worker/gradrs.c, docs/contracts.md "Data-parallel sums and
 * shards"). A no_grads program is lent its gradient arena `g`: grad_numel
 * floats of address space of which only the n_live ranges {offset, end}
 * `live` exist (pw_prog_zero_grad zeroes those, nothing else). A node's
 * weight gradients accumulate in the arena only where their range lies
 * inside one of the n_direct ranges `direct`; the others (the parameters
 * of one node, w's then b's) are computed per microbatch into `scratch`
 * (zeroed first; pw_dp_wgrad_floats floats) and handed to fn right after
 * the node's backward-weight: spans[k] = {arena offset, floats} of
 * scratch's consecutive parts. fn adds them where they belong and returns
 * 0, or a negative code with its err (never NULL) filled; the first failure
 * is kept and returned as fn's is above. Once, before any entry point. */
typedef int (*pw_prog_wgrad_fn)(void *ctx, const float *scratch, const size_t (*spans)[2], int n_spans,
                                pw_err *err);
PW_MUST_CHECK int pw_prog_set_wgrad(pw_prog *p, float *g, const size_t (*live)[2], int n_live, const size_t (*direct)[2],
                                     int n_direct, float *scratch, pw_prog_wgrad_fn fn, void *ctx);

/* ZeRO-3 (worker/pgather.c, docs/contracts.md "Data-parallel sums and
 * shards"). A no_params program is lent its parameter arena `a`: numel
 * floats of address space of which only [lo, hi) exists (the replica's
 * shard; every parameter trains: PW_ENOTSUP when one is frozen), and
 * every parameter's data points into it; pw_prog_init_params then draws
 * each parameter whole and keeps only its elements in [lo, hi). Before the
 * nodes of a layer run in a forward, a backward_input or a backward (and a
 * remat recompute), the program calls fn(ctx, layer, next, err): fn points
 * the data of every parameter those nodes read at the whole values
 * (pw_prog_param_at) and may start fetching layer `next`, the one this
 * entry point asks for after it (-1: none; a recompute's last layer is
 * followed by the layer below it, the backward going on from the layer
 * the recompute ended on); a layer run twice in a row (a recompute's
 * last, then the backward's first) is asked for once. At the
 * end of each of those entry points fn(ctx, -1, -1, err) points them back
 * into `a`. backward_weight reads no parameter and calls nothing. fn
 * returns 0, or a negative code with its err (never NULL) filled; the
 * entry point then stops computing (the parameters are not there) and it
 * and every later one return that failure. Once, before any entry point. */
typedef int (*pw_prog_unit_fn)(void *ctx, int layer, int next, pw_err *err);
PW_MUST_CHECK int pw_prog_set_pgather(pw_prog *p, float *a, size_t lo, size_t hi, pw_prog_unit_fn fn, void *ctx);


#endif
