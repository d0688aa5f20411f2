/* layout: where everything of a stage program lives, computed from the
 * model alone — written once, for the program that allocates it
 * (common/compute/prog.c) and the planner that counts it before any worker
 * starts (common/plan/plan.c), which links no compute layer.
 *
 * A program over layers [lo, hi) with mb sequences per microbatch has:
 *   - a parameter arena of `numel` floats (the parameters its nodes use, in
 *     model order);
 *   - a gradient arena of `grad_numel` floats: the `train_numel` main
 *     gradients of the parameters that train (frozen ones, pw_param.frozen,
 *     have none), then a shadow gradient for each second and later use of a
 *     trainable parameter inside the stage (tied embeddings), added to the
 *     main one once per step; AdamW m and v have the main gradients' layout;
 *   - slots of `slot_floats` floats, one per microbatch in flight. The
 *     first `keep_floats` are the ports: the values of the input ports,
 *     then of the output ports, then the gradients of the float ones among
 *     them (same order) — what the network reads and writes while the
 *     microbatch waits, and all a recomputing (remat) stage keeps per
 *     microbatch. The rest, the work part: every other node output, the
 *     gradients of the float ones, then each node's saved auxiliaries. A
 *     remat stage allocates the work part once per microbatch between its
 *     recompute and its B (or W), not once per slot (prog.h);
 *   - `scratch_floats` of scratch (the largest node's pw_op_scratch:
 *     attention's T x T, the tiled attention's few tiles), one per program.
 * Never allocates an arena; the tables below are the only memory it takes. */
#ifndef PW_LAYOUT_H
#define PW_LAYOUT_H

#include <stddef.h>

#include "model.h"

#define PW_LAYOUT_NONE ((size_t)-1)

/* A value crossing the stage boundary: an input port is read but produced
 * elsewhere (data, targets or another stage's output), an output port
 * produced here and read by a later stage. */
typedef struct {
  int value;              /* model value id */
  int role;               /* pw_val_role of the value */
  size_t bytes;           /* per microbatch */
} pw_prog_port;

/* The sizes, in floats, that memory accounting needs. */
typedef struct {
  size_t numel;           /* parameter arena */
  size_t train_numel;     /* of which train: main gradients, AdamW m, v each */
  size_t grad_numel;      /* gradient arena: train_numel + shadows */
  size_t slot_floats;     /* one activation slot: keep_floats, then the work part */
  size_t keep_floats;     /* the ports, at the slot's start */
  size_t scratch_floats;  /* per program */
  int draws_data;         /* reads the model's input or targets */
} pw_prog_sizes;

typedef struct {
  int node_lo, node_hi;   /* nodes [lo, hi) */
  int mb;                 /* sequences per microbatch */
  pw_prog_sizes sz;
  /* parameters */
  int n_params;           /* used by the stage's nodes */
  int *param_model;       /* [n_params] model parameter id, ascending */
  size_t *param_off;      /* [n_params] float offset in the parameter arena */
  size_t *param_goff;     /* [n_params] offset in the gradient (and m, v) arenas;
                             PW_LAYOUT_NONE when frozen */
  int *param_local;       /* [model n_params] local index, or -1 */
  size_t *node_dw, *node_db; /* [nodes] gradient offset of the node's w, b; PW_LAYOUT_NONE when
                                absent or frozen */
  size_t (*shadow)[3];    /* [n_shadow] {main offset, shadow offset, count} */
  int n_shadow;
  /* slots */
  size_t *val_off;        /* [model n_values] float offset in a slot, or PW_LAYOUT_NONE */
  size_t *grad_off;       /* [model n_values] gradient offset, or PW_LAYOUT_NONE */
  size_t *aux_off;        /* [nodes] */
  pw_prog_port *inputs, *outputs;
  int n_inputs, n_outputs;
  int has_loss;           /* the stage computes the model's loss */
  void *tables;           /* the one allocation the tables above live in */
} pw_prog_layout;

/* Lays out layers [layer_lo, layer_hi) of m for mb sequences per
 * microbatch. 0, PW_EINVAL for a bad range or mb < 1, or PW_ENOMEM;
 * on error *out needs no free. The model must outlive the layout. */
PW_MUST_CHECK int pw_prog_layout_build(const pw_model *m, int layer_lo, int layer_hi, int mb, pw_prog_layout *out);
void pw_prog_layout_free(pw_prog_layout *l);
/* Just the sizes (builds the layout and frees it). */
PW_MUST_CHECK int pw_prog_sizes_of(const pw_model *m, int layer_lo, int layer_hi, int mb, pw_prog_sizes *out);

#endif
