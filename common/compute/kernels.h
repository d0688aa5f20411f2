/* kernels: the compute layer's half of the op table (common/model/optable.h
 * is the other): for each pw_op, the kernels (ops.h) that run it forward
 * and backward, and forward in the KV-cache decode (decode.h), one row per
 * op, called through one argument block. A NULL entry: the op has no such
 * half (no weights, no input that takes a gradient, or a decode that does
 * not run it: optable.h's decode says which). */
#ifndef PW_KERNELS_H
#define PW_KERNELS_H

#include "bf16.h"
#include "model.h"

/* One node's buffers for one microbatch (prog.c binds them). */
typedef struct {
  const pw_node *n;
  float *in0, *in1, *out;      /* data (int32 tokens/targets cast) */
  float *din0, *din1, *dout;   /* gradients (NULL where none) */
  float *aux;                  /* saved auxiliaries */
  float *w, *b, *dw, *db;      /* parameters and where their gradients accumulate */
  float *scratch;              /* the program's scratch */
  int rows;                    /* N: microbatch sequences x rows per sequence of input 0 */
  int B;                       /* microbatch sequences */
  int acc0, acc1;              /* the input gradient accumulates (1) or is overwritten (0) */
  float loss_scale;            /* microbatch losses sum to the batch mean */
  pw_bf16 *wb;                 /* bf16 programs' linear nodes: the weight's bf16 copy */
  pw_bf16 *bscratch;           /* and room for rows x (C + OC) bf16 operands; attention nodes too */
  /* decode only (decode.c binds them): rows are the call's new rows, its
   * sequences' one after another; scratch is the decode's */
  const struct pw_decode_seq *seqs;  /* [n_seqs] (decode.h) */
  int n_seqs;
  float *kv;                   /* a node with a KV cache (optable.h decode_kv): its part of slot 0 */
  size_t kv_slot;              /* floats from one slot's cache to the next */
  int max_pos;                 /* positions a slot holds */
  struct pw_rowmm *mm;         /* a decode_pack node: its packed weights (rowmm.h), or NULL */
} pw_kernel_io;

typedef void (*pw_kernel_fn)(const pw_kernel_io *io);

typedef struct {
  pw_kernel_fn forward;
  pw_kernel_fn backward_input;   /* ZeroBubble's I */
  pw_kernel_fn backward_weight;  /* ZeroBubble's W, accumulating */
  pw_kernel_fn backward;         /* both in one pass (weight-then-input bits), or NULL */
  pw_kernel_fn decode;           /* the forward of decode.h: the same kernel as forward over
                                    the call's rows where no row's position matters */
} pw_kernel;

/* The row of op kind `op` (a valid pw_op). */
const pw_kernel *pw_kernel_of(int op);

#endif
