/* optable: the rows of optable.h. FLOP counts are the model's cost model
 * (docs/contracts.md): a linear 2*rows*C*OC each way, attention 4 T^2 C forward and
 * twice that back, other ops ~5 (forward), 8 (input) and 3 (weight, where
 * they have one) per element. */
#include "optable.h"

#define N_(c, a, b, d) {(c), {PW_DIM_##a, PW_DIM_##b, PW_DIM_##d}}
#define NONE_ N_(0, 1, 1, 1)
#define ELEM(f, i, w) {N_(f, ROWS, C, 1), N_(i, ROWS, C, 1), N_(w, ROWS, C, 1)}

static const pw_op_info table[PW_OP__COUNT] = {
    [PW_OP_EMBED] = {"embed", 1, 0, 0, 0, 0, {NONE_, NONE_, N_(1, ROWS, OC, 1)}, NONE_},
    [PW_OP_POSEMBED] = {"posembed", 1, 1, 0, 0, 0, ELEM(5, 8, 3), NONE_},
    [PW_OP_LINEAR] = {"linear", 1, 1, 0, 0, 0,
                      {N_(2, ROWS, C, OC), N_(2, ROWS, C, OC), N_(2, ROWS, C, OC)}, NONE_},
    [PW_OP_LAYERNORM] = {"layernorm", 1, 1, 0, 0, 0, ELEM(5, 8, 3), N_(2, ROWS, 1, 1)},   /* mean, rstd */
    [PW_OP_RMSNORM] = {"rmsnorm", 1, 1, 0, 0, 0, ELEM(5, 8, 3), N_(1, ROWS, 1, 1)},       /* rstd */
    [PW_OP_GELU] = {"gelu", 1, 1, 0, 0, 0, ELEM(5, 8, 0), N_(1, ROWS, C, 1)},             /* gelu'(in) */
    [PW_OP_RELU] = {"relu", 1, 1, 0, 0, 0, ELEM(5, 8, 0), NONE_},
    [PW_OP_SILU] = {"silu", 1, 1, 0, 0, 0, ELEM(5, 8, 0), NONE_},
    [PW_OP_SWIGLU] = {"swiglu", 2, 3, 0, 0, 0, ELEM(5, 8, 0), NONE_},
    [PW_OP_ADD] = {"add", 2, 3, 0, 0, 0, ELEM(5, 8, 0), NONE_},
    [PW_OP_ROPE] = {"rope", 1, 1, 0, 0, 0, ELEM(5, 8, 0), NONE_},
    [PW_OP_ATTENTION] = {"attention", 1, 1, 0, 0, 1, {N_(4, T, T, OC), N_(8, T, T, OC), NONE_},
                         N_(1, NH, T, T)},                                                 /* att */
    [PW_OP_XENT] = {"cross_entropy", 2, 1, 1, 0, 0, ELEM(5, 8, 0), N_(1, ROWS, C, 1)},     /* probs */
    [PW_OP_MSE] = {"mse", 2, 1, 1, 1, 0, ELEM(5, 8, 0), NONE_},
    /* rank NH: h = x A^T and y += h B^T forward; dh = dy B and dx += dh A
     * (I); dB, dh again, dA (W) */
    [PW_OP_LORA] = {"lora", 2, 3, 0, 0, 0, {N_(2, ROWS, NH, C_OC), N_(2, ROWS, NH, C_OC), N_(3, ROWS, NH, C_OC)},
                    N_(2, ROWS, NH, 1)},                                                   /* h, dh */
    /* copies: one pass over the output each way */
    [PW_OP_CONCAT] = {"concat", 2, 3, 0, 0, 0, {N_(1, ROWS, OC, 1), N_(1, ROWS, OC, 1), NONE_}, NONE_},
};

const pw_op_info *pw_op_info_of(int op) { return &table[op]; }

const char *pw_op_name(pw_op op) { return op < PW_OP__COUNT ? table[op].name : "?"; }

static double dim(const pw_node *n, const pw_value *in, int d) {
  switch ((pw_op_dim)d) {
    case PW_DIM_ROWS: return in->rows;
    case PW_DIM_C: return n->C;
    case PW_DIM_OC: return n->OC;
    case PW_DIM_T: return n->T;
    case PW_DIM_NH: return n->NH;
    case PW_DIM_C_OC: return n->C + n->OC;
    case PW_DIM_1: break;
  }
  return 1;
}

static double count(const pw_op_count *c, const pw_node *n, const pw_value *in) {
  return c->coef * dim(n, in, c->d[0]) * dim(n, in, c->d[1]) * dim(n, in, c->d[2]);
}

void pw_op_flops(const pw_node *n, const pw_value *in, double out[3]) {
  for (int k = 0; k < 3; k++) out[k] = count(&table[n->op].flops[k], n, in);
}

size_t pw_op_aux(const pw_node *n, const pw_value *in) { return (size_t)count(&table[n->op].aux, n, in); }
