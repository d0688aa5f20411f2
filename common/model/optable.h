/* optable: what each op kind is, declared as data — one row per pw_op, as
 * redis declares its commands. This is the model layer's half: name,
 * arity, which input gradients the backward writes, FLOPs and saved
 * auxiliaries, so the planner (which links no kernels) and the programs
 * read the same facts. common/compute/kernels.c is the other half: the kernel
 * functions, indexed by the same pw_op. Nothing else switches on an op. */
#ifndef PW_OPTABLE_H
#define PW_OPTABLE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* A node quantity a FLOP or auxiliary count multiplies (per sequence). */
typedef enum {
  PW_DIM_1,     /* 1 */
  PW_DIM_ROWS,  /* rows of input 0 (T or 1) */
  PW_DIM_C,     /* width of input 0 */
  PW_DIM_OC,    /* output width */
  PW_DIM_T,     /* rows per sequence (the node's T) */
  PW_DIM_NH,    /* heads (lora: rank) */
  PW_DIM_C_OC   /* input plus output width */
} pw_op_dim;

/* coef x d[0] x d[1] x d[2], multiplied in that order. */
typedef struct {
  double coef;
  uint8_t d[3]; /* pw_op_dim */
} pw_op_count;

typedef struct {
  const char *name;      /* as in specs and `pipewright inspect` */
  uint8_t n_in;          /* inputs read: 1, or 2 (a loss's second is the target) */
  uint8_t grad_in;       /* bit k: the backward writes input k's gradient */
  uint8_t is_loss;       /* outputs the scalar loss */
  uint8_t loss_per_elem; /* loss: a mean over elements (mse), not over rows */
  uint8_t scratch_tt;    /* the backward needs T x T floats of scratch */
  pw_op_count flops[3];  /* per sequence: forward, backward-input, backward-weight */
  pw_op_count aux;       /* floats saved for the backward, per sequence */
} pw_op_info;

/* The row of op kind `op` (a valid pw_op). */
const pw_op_info *pw_op_info_of(int op);
/* FLOPs per sequence of node n (in = its input 0): [forward, input, weight]. */
void pw_op_flops(const pw_node *n, const pw_value *in, double out[3]);
/* Floats of auxiliaries node n saves per sequence. */
size_t pw_op_aux(const pw_node *n, const pw_value *in);

#endif
