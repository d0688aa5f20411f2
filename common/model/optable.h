/* optable: what each op kind is, declared as data — one row per pw_op, as
 * redis declares its commands. This is the model layer's half: name,
 * arity, which input gradients the backward writes, FLOPs and saved
 * auxiliaries, its part in a tensor-parallel split, how the KV-cache
 * decode treats it, its bf16 copies, so the planner (which links no
 * kernels) and the programs read the same facts. common/compute/kernels.c
 * is the other half: the kernel functions, indexed by the same pw_op.
 * Nothing else switches on an op. */
#ifndef PW_OPTABLE_H
#define PW_OPTABLE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* The tiled attention's tiles (common/compute/ops_flash.c): query rows per
 * tile of the forward and of the backward, keys per tile. Here because the
 * op table counts its scratch from them. */
#define PW_ATTN_TILE_Q 64
#define PW_ATTN_TILE_B 256
#define PW_ATTN_TILE_K 128

/* A node quantity a FLOP or auxiliary count multiplies (per sequence). */
typedef enum {
  PW_DIM_1,     /* 1 */
  PW_DIM_ROWS,  /* rows of input 0 (T or 1) */
  PW_DIM_C,     /* width of input 0 */
  PW_DIM_OC,    /* output width */
  PW_DIM_T,     /* rows per sequence (the node's T) */
  PW_DIM_NH,    /* heads (lora: rank) */
  PW_DIM_C_OC,  /* input plus output width */
  PW_DIM_HD,    /* output width per head (OC / NH) */
  PW_DIM_KVW,   /* attention: width of its keys (or values), (C - OC) / 2 = NKV HD */
  PW_DIM_GROUP, /* attention: query heads per key/value head, NH / NKV */
  PW_DIM_QK,    /* query plus key heads, NH + NKV */
  PW_DIM_TOPK   /* a mixture of experts' node: the experts a token takes (its HD) */
} pw_op_dim;

/* coef x d[0] x d[1] x d[2], multiplied in that order. */
typedef struct {
  double coef;
  uint8_t d[3]; /* pw_op_dim */
} pw_op_count;

/* How the KV-cache decode (common/compute/decode.h) treats a node of the
 * op. Every row declares one; 0 is a row that forgot (test_optable). */
typedef enum {
  PW_DECODE_UNDECLARED,
  PW_DECODE_RUN,     /* runs the decode entry of its kernel row (kernels.h) */
  PW_DECODE_SKIP,    /* a loss: not run; the stage hands out its input (the logits) */
  PW_DECODE_REFUSED  /* a stage holding one is not decoded */
} pw_op_decode;

/* What an op is to the tensor-parallel split (tp.h): a linear's kind
 * follows from the roles of the first op reading its output and of the op
 * making its input. Every row declares one; 0 is a row that forgot. */
typedef enum {
  PW_TP_ROLE_UNDECLARED,
  PW_TP_ROLE_WHOLE,      /* works on whole values, the same on every rank (norms, adds, positions) */
  PW_TP_ROLE_LINEAR,     /* a linear: column, qkv, vocab, row or replicated by its neighbours */
  PW_TP_ROLE_ACTIVATION, /* elementwise over hidden units: the linear making its input is a
                            column, the one reading its output a row */
  PW_TP_ROLE_HEADS,      /* reads qkv head by head (rope, attention): the linear making its
                            input is qkv, the one reading its output a row */
  PW_TP_ROLE_EMBED,      /* a table of vocabulary rows: its weight splits by vocabulary, its
                            output is all-reduced */
  PW_TP_ROLE_VOCAB_LOSS  /* a loss over vocab-split logits (the vocab-parallel cross-entropy):
                            the linear making them is vocab */
} pw_op_tp_role;

typedef struct {
  const char *name;      /* as in specs and `pipewright inspect` */
  uint8_t n_in;          /* inputs read: 1, or 2 (a loss's second is the target) */
  uint8_t grad_in;       /* bit k: the backward writes input k's gradient */
  uint8_t is_loss;       /* outputs the scalar loss */
  uint8_t loss_per_elem; /* loss: a mean over elements (mse), not over rows */
  pw_op_count flops[3];  /* per sequence: forward, backward-input, backward-weight */
  pw_op_count aux;       /* floats saved for the backward, per sequence */
  pw_op_count scratch[3]; /* floats of scratch its kernels need, whatever the microbatch: the sum
                             (a program allocates its largest node's) */
  uint8_t tp_role;       /* pw_op_tp_role */
  /* decode (pw_op_decode_*) */
  uint8_t decode;        /* pw_op_decode */
  uint8_t decode_pack;   /* its weight and bias packed into a pw_rowmm at create (rowmm.h) */
  uint8_t positions;     /* its weight's rows are positions: a decode's max_pos may not pass them */
  pw_op_count decode_aux; /* auxiliary floats per row of a call */
  pw_op_count decode_kv; /* KV-cache floats per position of a sequence */
  /* train.precision "bf16" (pw_op_bf16_*; common/compute/prog.h) */
  pw_op_count bf16_weight; /* elements of the node's bf16 weight copy */
  pw_op_count bf16_scratch[2]; /* elements of bf16 operand scratch: per sequence, and once */
  /* after the positional fields */
  uint8_t loss_per_nh;   /* loss: a mean over the node's NH terms a sequence (masked LM: its K
                            predictions), not over rows */
} pw_op_info;

/* The row of op kind `op` (a valid pw_op). */
const pw_op_info *pw_op_info_of(int op);
/* FLOPs per sequence of node n (in = its input 0): [forward, input, weight]. */
void pw_op_flops(const pw_node *n, const pw_value *in, double out[3]);
/* Floats of auxiliaries node n saves per sequence. */
size_t pw_op_aux(const pw_node *n, const pw_value *in);
/* Floats of scratch node n's kernels need (attention's; 0 for most). */
size_t pw_op_scratch(const pw_node *n);
/* Decode: floats of auxiliaries node n needs per row of a call, and of KV
 * cache per position of a sequence. */
size_t pw_op_decode_aux(const pw_node *n);
size_t pw_op_decode_kv(const pw_node *n);
/* bf16 programs: elements of node n's bf16 weight copy (0 for none), and
 * of the bf16 scratch it needs at mb sequences a microbatch (in = its input
 * 0). The programs (prog.c) allocate these and the planner (plan.c) counts
 * them: one formula. */
size_t pw_op_bf16_weight(const pw_node *n);
size_t pw_op_bf16_scratch(const pw_node *n, const pw_value *in, int mb);

#endif
