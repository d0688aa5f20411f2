/* optable: the rows of optable.h. FLOP counts are the model's cost model
 * (docs/contracts.md): a linear 2*rows*C*OC each way, attention 4 T^2 C forward and
 * twice that back (the tiled one 2.5 times: it recomputes the scores), other
 * ops ~5 (forward), 8 (input) and 3 (weight, where they have one) per element. */
#include "optable.h"

#define N_(c, a, b, d) {(c), {PW_DIM_##a, PW_DIM_##b, PW_DIM_##d}}
#define NONE_ N_(0, 1, 1, 1)
#define ELEM(f, i, w) {N_(f, ROWS, C, 1), N_(i, ROWS, C, 1), N_(w, ROWS, C, 1)}

/* Roles and decode, the designated fields after each row's positional ones. */
#define WHOLE_ .tp_role = PW_TP_ROLE_WHOLE
#define RUN_ .decode = PW_DECODE_RUN

static const pw_op_info table[PW_OP__COUNT] = {
    [PW_OP_EMBED] = {"embed", 1, 0, 0, 0, {NONE_, NONE_, N_(1, ROWS, OC, 1)}, NONE_,
                     .tp_role = PW_TP_ROLE_EMBED, RUN_},
    [PW_OP_POSEMBED] = {"posembed", 1, 1, 0, 0, ELEM(5, 8, 3), NONE_, WHOLE_, RUN_, .positions = 1},
    /* bf16: the weight's copy, and x then dout as bf16 (rows x (C + OC)) */
    [PW_OP_LINEAR] = {"linear", 1, 1, 0, 0,
                      {N_(2, ROWS, C, OC), N_(2, ROWS, C, OC), N_(2, ROWS, C, OC)}, NONE_,
                      .tp_role = PW_TP_ROLE_LINEAR, RUN_, .decode_pack = 1, .bf16_weight = N_(1, OC, C, 1),
                      .bf16_scratch = {N_(1, ROWS, C_OC, 1), NONE_}},
    [PW_OP_LAYERNORM] = {"layernorm", 1, 1, 0, 0, ELEM(5, 8, 3), N_(2, ROWS, 1, 1), WHOLE_, RUN_,  /* mean, rstd */
                         .decode_aux = N_(2, 1, 1, 1)},
    [PW_OP_RMSNORM] = {"rmsnorm", 1, 1, 0, 0, ELEM(5, 8, 3), N_(1, ROWS, 1, 1), WHOLE_, RUN_,        /* rstd */
                       .decode_aux = N_(1, 1, 1, 1)},
    [PW_OP_GELU] = {"gelu", 1, 1, 0, 0, ELEM(5, 8, 0), N_(1, ROWS, C, 1),                          /* gelu'(in) */
                    .tp_role = PW_TP_ROLE_ACTIVATION, RUN_, .decode_aux = N_(1, C, 1, 1)},
    [PW_OP_RELU] = {"relu", 1, 1, 0, 0, ELEM(5, 8, 0), NONE_, .tp_role = PW_TP_ROLE_ACTIVATION, RUN_},
    [PW_OP_SILU] = {"silu", 1, 1, 0, 0, ELEM(5, 8, 0), NONE_, .tp_role = PW_TP_ROLE_ACTIVATION, RUN_},
    [PW_OP_SWIGLU] = {"swiglu", 2, 3, 0, 0, ELEM(5, 8, 0), NONE_, .tp_role = PW_TP_ROLE_ACTIVATION, RUN_},
    [PW_OP_ADD] = {"add", 2, 3, 0, 0, ELEM(5, 8, 0), NONE_, WHOLE_, RUN_},
    [PW_OP_ROPE] = {"rope", 1, 1, 0, 0, ELEM(5, 8, 0), NONE_, .tp_role = PW_TP_ROLE_HEADS, RUN_},
    /* decode: K and V of each position (NKV HD each); bf16: bf16.h's
     * pw_attention_bf16_scratch, 4 B T OC + 2 T^2 (grouped-query rows
     * need less); the backward's T x T scratch */
    [PW_OP_ATTENTION] = {"attention", 1, 1, 0, 0, {N_(4, T, T, OC), N_(8, T, T, OC), NONE_},
                         N_(1, NH, T, T),                                                  /* att */
                         .scratch = {N_(1, T, T, 1)}, .tp_role = PW_TP_ROLE_HEADS, RUN_, .decode_kv = N_(2, KVW, 1, 1),
                         .bf16_scratch = {N_(4, T, OC, 1), N_(2, T, T, 1)}},
    /* tiled (ops_flash.c): the backward recomputes the scores (2 T^2 OC
     * more); scratch ops.h's pw_attention_tiled_scratch (two score tiles,
     * a key tile's dK and dV, D of T rows a head of a group), bf16 bf16.h's
     * pw_attention_tiled_bf16_scratch (two tiles); the decode is the same */
    [PW_OP_ATTENTION_TILED] = {"attention_tiled", 1, 1, 0, 0, {N_(4, T, T, OC), N_(10, T, T, OC), NONE_},
                               N_(1, NH, T, 1),                                            /* lse */
                               .scratch = {N_(2 * PW_ATTN_TILE_B * PW_ATTN_TILE_K, 1, 1, 1),
                                           N_(2 * PW_ATTN_TILE_K, HD, 1, 1), N_(1, T, GROUP, 1)},
                               .tp_role = PW_TP_ROLE_HEADS, RUN_, .decode_kv = N_(2, KVW, 1, 1),
                               .bf16_scratch = {N_(4, T, OC, 1), N_(2 * PW_ATTN_TILE_B * PW_ATTN_TILE_K, 1, 1, 1)}},
    /* rmsnorm's counts over the input; rstd of each q and k head */
    [PW_OP_QKNORM] = {"qk_norm", 1, 1, 0, 0, ELEM(5, 8, 3), N_(1, ROWS, QK, 1), .tp_role = PW_TP_ROLE_HEADS, RUN_,
                      .decode_aux = N_(1, QK, 1, 1)},
    /* Gemma's: the GeGLU as swiglu (its tanh recomputed backward, nothing
     * saved); the scale one product each way; the offset norm as rmsnorm */
    [PW_OP_GEGLU] = {"geglu", 2, 3, 0, 0, ELEM(5, 8, 0), NONE_, .tp_role = PW_TP_ROLE_ACTIVATION, RUN_},
    [PW_OP_SCALE] = {"scale", 1, 1, 0, 0, {N_(1, ROWS, C, 1), N_(1, ROWS, C, 1), NONE_}, NONE_, WHOLE_, RUN_},
    [PW_OP_RMSNORM_OFFSET] = {"rmsnorm_offset", 1, 1, 0, 0, ELEM(5, 8, 3), N_(1, ROWS, 1, 1), WHOLE_, RUN_, /* rstd */
                              .decode_aux = N_(1, 1, 1, 1)},
    [PW_OP_XENT] = {"cross_entropy", 2, 1, 1, 0, ELEM(5, 8, 0), N_(1, ROWS, C, 1),      /* probs */
                    .tp_role = PW_TP_ROLE_VOCAB_LOSS, .decode = PW_DECODE_SKIP},
    [PW_OP_MSE] = {"mse", 2, 1, 1, 1, ELEM(5, 8, 0), NONE_, WHOLE_, .decode = PW_DECODE_SKIP},
    /* rank NH: h = x A^T and y += h B^T forward; dh = dy B and dx += dh A
     * (I); dB, dh again, dA (W). Not split (tp.h refuses LoRA); decode: h */
    [PW_OP_LORA] = {"lora", 2, 3, 0, 0, {N_(2, ROWS, NH, C_OC), N_(2, ROWS, NH, C_OC), N_(3, ROWS, NH, C_OC)},
                    N_(2, ROWS, NH, 1),                                                    /* h, dh */
                    WHOLE_, RUN_, .decode_aux = N_(1, NH, 1, 1)},
    /* copies: one pass over the output each way; regions models are not
     * split or decoded */
    [PW_OP_CONCAT] = {"concat", 2, 3, 0, 0, {N_(1, ROWS, OC, 1), N_(1, ROWS, OC, 1), NONE_}, NONE_, WHOLE_,
                      .decode = PW_DECODE_REFUSED},
    /* the encoder's (BERT): the erf GELU as the tanh one (its derivative
     * saved); tanh elementwise, reading its output back; token types and
     * the padded embedding as their position and token cousins; the first
     * row one copy each way (the backward writes the zeros of T rows);
     * the masked LM's loss as cross_entropy. Token types depend on the
     * whole sequence (its first separator) and the first row on row 0, so
     * neither runs in a decode: a BERT is not decoded. */
    [PW_OP_GELU_ERF] = {"gelu_erf", 1, 1, 0, 0, ELEM(5, 8, 0), N_(1, ROWS, C, 1),          /* gelu'(in) */
                        .tp_role = PW_TP_ROLE_ACTIVATION, RUN_, .decode_aux = N_(1, C, 1, 1)},
    [PW_OP_TANH] = {"tanh", 1, 1, 0, 0, ELEM(5, 8, 0), NONE_, .tp_role = PW_TP_ROLE_ACTIVATION, RUN_},
    [PW_OP_TOKTYPE] = {"toktype", 2, 1, 0, 0, ELEM(5, 8, 3), NONE_, WHOLE_, .decode = PW_DECODE_REFUSED},
    [PW_OP_FIRST_ROW] = {"first_row", 1, 1, 0, 0, {N_(1, OC, 1, 1), N_(1, ROWS, C, 1), NONE_}, NONE_, WHOLE_,
                         .decode = PW_DECODE_REFUSED},
    [PW_OP_EMBED_PAD] = {"embed_pad", 1, 0, 0, 0, {NONE_, NONE_, N_(1, ROWS, OC, 1)}, NONE_,
                         .tp_role = PW_TP_ROLE_EMBED, RUN_},
    [PW_OP_XENT_MLM] = {"mlm_cross_entropy", 2, 1, 1, 0, ELEM(5, 8, 0), N_(1, ROWS, C, 1), /* probs */
                        WHOLE_, .decode = PW_DECODE_SKIP, .loss_per_nh = 1},
    /* a mixture of experts (ops_moe.h; NH = E, TOPK = K): route a softmax
     * (or sigmoid) over E a row, saving it; dispatch and combine copy and
     * weigh K rows a token, with an expert-major order's cursors as
     * scratch (2E + 1 ints); glinear a linear over the T K rows (scratch:
     * its order, E + 1 ints). Row by row: the decode runs them as they are.
     * Not split by tensor parallel (tp.c refuses model.moe) */
    [PW_OP_MOE_ROUTE] = {"moe_route", 1, 1, 0, 0, {N_(5, ROWS, NH, 1), N_(5, ROWS, NH, 1), NONE_},
                         N_(1, ROWS, NH, 1), WHOLE_, RUN_, .decode_aux = N_(1, NH, 1, 1)},         /* probs */
    [PW_OP_MOE_DISPATCH] = {"moe_dispatch", 2, 1, 0, 0, {N_(1, ROWS, C, TOPK), N_(1, ROWS, C, TOPK), NONE_}, NONE_,
                            .scratch = {N_(2, NH, 1, 1), N_(1, 1, 1, 1)}, WHOLE_, RUN_},
    [PW_OP_MOE_GLINEAR] = {"moe_glinear", 2, 1, 0, 0,
                           {N_(2, ROWS, C, OC), N_(2, ROWS, C, OC), N_(2, ROWS, C, OC)}, NONE_,
                           .scratch = {N_(1, NH, 1, 1), N_(1, 1, 1, 1)}, WHOLE_, RUN_},
    [PW_OP_MOE_COMBINE] = {"moe_combine", 2, 3, 0, 0, {N_(2, ROWS, C, 1), N_(4, ROWS, C, 1), NONE_}, NONE_,
                           .scratch = {N_(2, NH, 1, 1), N_(1, 1, 1, 1)}, WHOLE_, RUN_},
    /* a row's sigmoid (recomputed backward) times the row: ~ a product an element each way */
    [PW_OP_SIGMOID_GATE] = {"sigmoid_gate", 2, 3, 0, 0, {N_(1, ROWS, C, 1), N_(3, ROWS, C, 1), NONE_}, NONE_, WHOLE_,
                            RUN_},
};

const pw_op_info *pw_op_info_of(int op) { return &table[op]; }

const char *pw_op_name(pw_op op) { return op < PW_OP__COUNT ? table[op].name : "?"; }

/* rows: of input 0 (the per-sequence counts), or 1 (per-row ones). */
static double dim(const pw_node *n, double rows, int d) {
  switch ((pw_op_dim)d) {
    case PW_DIM_ROWS: return rows;
    case PW_DIM_C: return n->C;
    case PW_DIM_OC: return n->OC;
    case PW_DIM_T: return n->T;
    case PW_DIM_NH: return n->NH;
    case PW_DIM_C_OC: return n->C + n->OC;
    case PW_DIM_HD: return n->NH ? (double)(n->OC / n->NH) : 0;
    case PW_DIM_KVW: return (double)((n->C - n->OC) / 2);
    case PW_DIM_QK: return n->NH + (n->NKV > 0 ? n->NKV : n->NH);
    case PW_DIM_GROUP: return n->NH && n->NKV > 0 ? (double)(n->NH / n->NKV) : 1;
    case PW_DIM_TOPK: return n->HD;
    case PW_DIM_1: break;
  }
  return 1;
}

static double count(const pw_op_count *c, const pw_node *n, double rows) {
  return c->coef * dim(n, rows, c->d[0]) * dim(n, rows, c->d[1]) * dim(n, rows, c->d[2]);
}

void pw_op_flops(const pw_node *n, const pw_value *in, double out[3]) {
  for (int k = 0; k < 3; k++) out[k] = count(&table[n->op].flops[k], n, in->rows);
}

size_t pw_op_aux(const pw_node *n, const pw_value *in) { return (size_t)count(&table[n->op].aux, n, in->rows); }

size_t pw_op_scratch(const pw_node *n) {
  double f = 0;
  for (int k = 0; k < 3; k++) f += count(&table[n->op].scratch[k], n, 1);
  return (size_t)f;
}

size_t pw_op_decode_aux(const pw_node *n) { return (size_t)count(&table[n->op].decode_aux, n, 1); }

size_t pw_op_decode_kv(const pw_node *n) { return (size_t)count(&table[n->op].decode_kv, n, 1); }

size_t pw_op_bf16_weight(const pw_node *n) {
  return n->w >= 0 ? (size_t)count(&table[n->op].bf16_weight, n, 1) : 0;
}

size_t pw_op_bf16_scratch(const pw_node *n, const pw_value *in, int mb) {
  const pw_op_info *o = &table[n->op];
  if (o->bf16_weight.coef && n->w < 0) return 0; /* a weight to convert, and none: nothing */
  return (size_t)mb * (size_t)count(&o->bf16_scratch[0], n, in->rows) + (size_t)count(&o->bf16_scratch[1], n, 1);
}
