/* model: the model IR — an SSA graph of ops over value slots — built from a
 * model spec, with shapes, parameter counts, FLOPs and activation bytes.
 *
 * A model is a list of nodes (one op each) that read and write values by
 * id; residuals and multi-input ops need no special cases. Nodes are grouped
 * into layers (the units a pipeline partition cuts between: "embed",
 * "blocks.3", "head", or one entry of an explicit layers list); stage
 * boundary markers from the spec are kept as cut positions. Parameters are
 * named as in docs/contracts.md's checkpoint contract and referenced by id, so a
 * parameter used by two nodes (tied embeddings) is one entry.
 *
 * Every value has a per-sequence shape (rows, width): rows = T for
 * token-shaped values and 1 for feature-shaped ones; a microbatch of b
 * sequences holds b*rows*width elements. The loss is a scalar.
 * This module never allocates activations or runs anything: prog.c does. */
#ifndef PW_MODEL_H
#define PW_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "spec.h"

typedef enum {
  PW_OP_EMBED,      /* in: tokens (T,1,i32)      out (T,C)   params: w (V,C) */
  PW_OP_POSEMBED,   /* in: (T,C)                 out (T,C)   params: w (T,C) */
  PW_OP_LINEAR,     /* in: (r,C)                 out (r,OC)  params: w (OC,C), b (OC)? */
  PW_OP_LAYERNORM,  /* in: (r,C)                 out (r,C)   params: w, b (C); aux mean,rstd */
  PW_OP_RMSNORM,    /* in: (r,C)                 out (r,C)   params: w (C); aux rstd */
  PW_OP_GELU,       /* in: (r,C)                 out (r,C); aux gelu'(in) (r,C) */
  PW_OP_RELU,
  PW_OP_SILU,
  PW_OP_SWIGLU,     /* in: gate (r,H), up (r,H)  out (r,H) */
  PW_OP_ADD,        /* in: a, b                  out: same shape */
  PW_OP_ROPE,       /* in: qkv (T,W)             out (T,W); W = C + 2 NKV HD (ops.h's packed rows) */
  PW_OP_ATTENTION,  /* in: qkv (T,W)             out (T,C); aux att (NH,T,T) */
  PW_OP_XENT,       /* in: logits (r,V), targets (r,1,i32)  out: loss; aux probs (r,V) */
  PW_OP_MSE,        /* in: pred (r,O), targets (r,O)        out: loss */
  PW_OP_LORA,       /* in: x (r,C), y0 (r,OC) = linear(x)   out (r,OC) = y0 + scale (x A^T) B^T
                       params: w = A (NH,C), b = B (OC,NH); NH = rank, base = scale; aux h, dh (r,NH) each */
  PW_OP_CONCAT,     /* in: a (r,C), b (r,OC-C)   out (r,OC): a's columns, then b's (a fusion) */
  PW_OP_ATTENTION_TILED, /* PW_OP_ATTENTION computed in tiles (ops_flash.c); aux lse (NH,T).
                            New ops go last: the numbers travel in plan slices */
  PW_OP_QKNORM,     /* in: qkv (T,W)             out (T,W): RMSNorm of each q and k head (Qwen3)
                       params: w = q's (HD), b = k's (HD); aux rstd (T,NH+NKV) */
  PW_OP_GEGLU,      /* in: gate (r,H), up (r,H)  out (r,H): gelu_tanh(gate) * up (Gemma) */
  PW_OP_SCALE,      /* in: (r,C)                 out (r,C) = in * base (Gemma's embeddings: sqrt(d)) */
  PW_OP_RMSNORM_OFFSET, /* in: (r,C)             out (r,C): RMSNorm scaled by base + w (Gemma: 1 + w)
                           params: w (C); aux rstd */
  /* an encoder's (BERT, model_bert.c; kernels in ops_enc.h) */
  PW_OP_GELU_ERF,   /* in: (r,C)                 out (r,C): x * Phi(x), the erf GELU; aux gelu'(in) */
  PW_OP_TANH,       /* in: (r,C)                 out (r,C); the backward reads out */
  PW_OP_TOKTYPE,    /* in: x (T,C), tokens (T,1,i32)  out (T,C) = x + w[type(t)]
                       params: w (types, C); NH: the separator token, pad: the padding token
                       (-1 each: none); the types from the tokens (ops_enc.h) */
  PW_OP_FIRST_ROW,  /* in: (T,C)                 out (1,C): each sequence's row 0 ([CLS]) */
  PW_OP_EMBED_PAD,  /* PW_OP_EMBED whose rows of token `pad` take no gradient (padding_idx) */
  PW_OP_XENT_MLM,   /* in: logits (r,V), targets (r,1,i32)  out: loss over the rows whose target
                       is >= 0, averaged over NH = K of them a sequence; aux probs (r,V) */
  /* a mixture of experts (ops_moe.h): NH = E experts, HD = K chosen a token;
   * route's pad = the gate (pw_moe_gate), base = its routed scale */
  PW_OP_MOE_ROUTE,  /* in: logits (T,E)          out r (T,2K): K weights, K expert ids (floats)
                       params: b = the balance bias (E) of sigmoid gates, or -1; aux probs (T,E) */
  PW_OP_MOE_DISPATCH, /* in: x (T,C), r (T,2K)   out (T*K,C): each token in its K experts' rows */
  PW_OP_MOE_GLINEAR, /* in: xs (T*K,C), r        out (T*K,OC): each row times its expert's
                        matrix; params: w (E*OC, C), expert e's rows e*OC .. */
  PW_OP_MOE_COMBINE, /* in: ys (T*K,C), r        out (T,C): each token's K rows, weighted */
  PW_OP_SIGMOID_GATE, /* in: y (T,C), g (T,1)     out (T,C) = y * sigmoid(g), g per row (Qwen2-MoE's shared
                         expert gate) */
  PW_OP__COUNT
} pw_op;

const char *pw_op_name(pw_op op);

typedef enum { PW_DT_F32 = 0, PW_DT_I32 = 1 } pw_dtype;
typedef enum { PW_VAL_ACT, PW_VAL_INPUT, PW_VAL_TARGET, PW_VAL_LOSS } pw_val_role;

typedef struct {
  int rows;         /* per sequence: T or 1; 0 for the loss */
  int width;        /* channels */
  uint8_t dtype;    /* pw_dtype */
  uint8_t role;     /* pw_val_role */
  int producer;     /* node id, or -1 for the model's input and target */
} pw_value;

typedef struct {
  uint8_t op;       /* pw_op */
  int layer;        /* layer id */
  int in[2];        /* value ids; in[1] = -1 when unary */
  int out;          /* value id */
  int w, b;         /* parameter ids, -1 when absent */
  int C, OC, NH;    /* input width, output width, heads (as the op needs) */
  int NKV;          /* rope, attention: key/value heads (NH, or fewer: grouped-query);
                       0 reads as NH */
  int T;            /* rows per sequence of the input */
  float eps;        /* norms */
  float base;       /* rope (theta); lora: scale = alpha / rank; scale: the factor;
                       rmsnorm_offset: the offset */
  /* rope: Llama-3's rope_scaling (ops_rope.h); factor 0 = none */
  float rope_factor, rope_low_freq, rope_high_freq;
  int rope_orig_max_pos;
  /* attention (and the rope, qk_norm before it): the options real models
   * add. HD: head width, 0 reads as C / NH (head_dim other than d / heads:
   * Qwen3, Gemma-7B); window: a query sees only the last `window` keys up
   * to itself (Mistral's sliding window), 0 = all; bidir: 1 = every query
   * sees every key (encoders: BERT), 0 = causal; pad: with in[1] the
   * model's token ids, keys whose token is `pad` are masked (BERT's
   * padding mask, a function of the tokens, so every stage can make it) */
  int HD, window, bidir, pad;
  size_t aux;       /* floats of saved auxiliaries per sequence (mean/rstd, gelu', att, probs) */
} pw_node;

#define PW_PARAM_NAME_MAX 96

/* UNIFORM: U(-init_std, init_std) (LoRA's A: kaiming-uniform, a = sqrt(5),
 * as PEFT: the bound is 1/sqrt(in_features)) */
typedef enum { PW_INIT_NORMAL, PW_INIT_ZEROS, PW_INIT_ONES, PW_INIT_UNIFORM } pw_init_kind;

typedef struct {
  char name[PW_PARAM_NAME_MAX]; /* "blocks.3.attn.qkv.weight" */
  int ndim;
  int shape[2];
  size_t numel;
  int decay;           /* weight decay applies: 2+ dims */
  uint8_t init;        /* pw_init_kind */
  uint8_t frozen;      /* train.trainable leaves it out: no gradient, no optimizer state */
  float init_std;
} pw_param;

typedef struct {
  char name[48];       /* "embed", "blocks.3", "head", "layers.5", "text.layers.2", "head.fuse" */
  int region;          /* regions model: the region (model.regions index) it belongs to; else 0 */
  int node_lo, node_hi;/* nodes [lo, hi) */
  int spec_index;      /* position in the spec's layers list, or -1 for templates */
  int is_block;        /* member of the homogeneous blocks stack ("even" splits these) */
  int is_loss;         /* holds only the loss (a layers list's cross_entropy/mse):
                          never the first layer of a stage */
  size_t params;       /* parameters owned (first use) by this layer */
  double flops_f;      /* per sequence: forward */
  double flops_i;      /* per sequence: backward w.r.t. inputs */
  double flops_w;      /* per sequence: backward w.r.t. weights */
  size_t act_bytes;    /* per sequence: activations saved for backward */
  size_t out_bytes;    /* per sequence: bytes of the value(s) it hands the next layer */
} pw_layer;

typedef struct {
  int seq_len;         /* T (1 for feature models) */
  pw_value *values;  int n_values;
  pw_node *nodes;    int n_nodes;
  pw_param *params;  int n_params;
  pw_layer *layers;  int n_layers;
  int *markers;      int n_markers; /* stage cut before layer markers[i] */
  int input_value, target_value, loss_value;
  int feature_value;   /* a regions model's float features input (T, feature_dim), or -1;
                          input_value is then its tokens input, or -1 when no region reads tokens */
  pw_data_shape data;  /* what the data must supply */
} pw_model;

/* Expand a spec into the graph and infer every shape. Errors name the JSON
 * path ("model.layers[4].in: expected 64 (the previous layer's output), got 32"). */
PW_MUST_CHECK int pw_model_build(const pw_model_spec *spec, pw_model *m, pw_err *err);
void pw_model_free(pw_model *m);
/* Freezes every parameter no pattern of tr->trainable matches (fnmatch;
 * none = all train, or with model.lora only the adapters), and takes the frozen weights' backward-weight FLOPs
 * out of their layers' flops_w (the W a frozen node skips). A pattern
 * matching no parameter is PW_ESPEC naming it ("train.trainable[1]"),
 * with the nearest parameter name. */
PW_MUST_CHECK int pw_model_set_trainable(pw_model *m, const pw_train_spec *tr, pw_err *err);
/* The attention op for a node of T rows per sequence and heads of HD
 * channels under train.attention impl (pw_attn_impl):
 * PW_OP_ATTENTION_TILED for "tiled", PW_OP_ATTENTION for "plain"; "auto"
 * (what pw_model_build gives every node) takes the plain one for T <=
 * PW_ATTN_PLAIN_T_PER_HD x HD, the tiled one above: measured, the plain
 * kernel is the faster below about 4 to 6 HD, the tiled one above
 * (HD 16 to 128; bench/results/attention/), and there the plain one's
 * saved probabilities, NH x T floats a row, are at most 4 C: a tenth of
 * what a block saves besides them (docs/contracts.md#attention). */
#define PW_ATTN_PLAIN_T_PER_HD 4
int pw_attention_op(int impl, int T, int HD);
/* Every attention node to pw_attention_op(impl, its T), its auxiliaries,
 * FLOPs and its layer's activation bytes with it. */
void pw_model_set_attention(pw_model *m, int impl);
/* A LoRA adapter: "<linear>.lora_A.weight" or "<linear>.lora_B.weight". */
int pw_param_is_adapter(const pw_param *p);
/* Parameters that train (a tied parameter counts once). */
size_t pw_model_trainable_count(const pw_model *m);

/* Parameters in the whole model (a tied parameter counts once). */
size_t pw_model_param_count(const pw_model *m);
/* Llama's default MLP width: round_up(8*d/3, 32). */
int pw_llama_ffn_default(int d);
/* Bytes of one value for b sequences. */
size_t pw_value_bytes(const pw_value *v, int b);

#endif
