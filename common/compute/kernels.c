/* kernels: the rows of kernels.h — each adapter unpacks the argument block
 * into one ops.h call, with the shapes the node records. */
#include "kernels.h"

#include <stdint.h>
#include <string.h>

#include "decode.h"
#include "log.h"
#include "lora.h"
#include "ops.h"
#include "ops_enc.h"
#include "ops_moe.h"
#include "rowmm.h"

#define TOK(p) ((const int32_t *)(p))

static void embed_f(const pw_kernel_io *io) { pw_embed_forward(io->out, TOK(io->in0), io->w, io->rows, io->n->OC); }
static void embed_w(const pw_kernel_io *io) {
  pw_embed_backward_weight(io->dw, io->dout, TOK(io->in0), io->rows, io->n->OC);
}

static void posembed_f(const pw_kernel_io *io) { pw_posembed_forward(io->out, io->in0, io->w, io->B, io->n->T, io->n->C); }
static void posembed_i(const pw_kernel_io *io) {
  pw_posembed_backward_input(io->din0, io->dout, io->B, io->n->T, io->n->C, io->acc0);
}
static void posembed_w(const pw_kernel_io *io) { pw_posembed_backward_weight(io->dw, io->dout, io->B, io->n->T, io->n->C); }

/* bf16 (io->wb set): the operands as bf16, x in bscratch, dout after it. */
#define XB(io) ((io)->bscratch)
#define DYB(io) ((io)->bscratch + (size_t)(io)->rows * (size_t)(io)->n->C)
static void linear_f(const pw_kernel_io *io) {
  if (io->wb)
    pw_linear_forward_bf16(io->out, io->in0, io->w, io->wb, XB(io), io->b, io->rows, io->n->C, io->n->OC);
  else
    pw_linear_forward(io->out, io->in0, io->w, io->b, io->rows, io->n->C, io->n->OC);
}
static void linear_i(const pw_kernel_io *io) {
  if (io->wb)
    pw_linear_backward_input_bf16(io->din0, io->dout, io->wb, DYB(io), io->rows, io->n->C, io->n->OC, io->acc0);
  else
    pw_linear_backward_input(io->din0, io->dout, io->w, io->rows, io->n->C, io->n->OC, io->acc0);
}
static void linear_w(const pw_kernel_io *io) {
  if (io->wb)
    pw_linear_backward_weight_bf16(io->dw, io->db, io->dout, io->in0, DYB(io), XB(io), io->rows, io->n->C,
                                   io->n->OC);
  else
    pw_linear_backward_weight(io->dw, io->db, io->dout, io->in0, io->rows, io->n->C, io->n->OC);
}

/* W then I (pw_prog_backward's order) with one conversion of dout in bf16 */
static void linear_b(const pw_kernel_io *io) {
  if (io->wb) {
    pw_linear_backward_bf16(io->din0, io->dw, io->db, io->dout, io->in0, io->wb, DYB(io), XB(io), io->rows, io->n->C,
                            io->n->OC, io->acc0);
    return;
  }
  linear_w(io);
  linear_i(io);
}

/* aux: mean (rows), then rstd (rows) */
static void layernorm_f(const pw_kernel_io *io) {
  pw_layernorm_forward(io->out, io->aux, io->aux + io->rows, io->in0, io->w, io->b, io->rows, io->n->C, io->n->eps);
}
static void layernorm_i(const pw_kernel_io *io) {
  pw_layernorm_backward_input(io->din0, io->dout, io->in0, io->w, io->aux, io->aux + io->rows, io->rows, io->n->C,
                              io->acc0);
}
static void layernorm_w(const pw_kernel_io *io) {
  pw_layernorm_backward_weight(io->dw, io->db, io->dout, io->in0, io->aux, io->aux + io->rows, io->rows, io->n->C);
}
static void layernorm_b(const pw_kernel_io *io) {
  pw_layernorm_backward(io->din0, io->dw, io->db, io->dout, io->in0, io->w, io->aux, io->aux + io->rows, io->rows,
                        io->n->C, io->acc0);
}

static void rmsnorm_f(const pw_kernel_io *io) {
  pw_rmsnorm_forward(io->out, io->aux, io->in0, io->w, io->rows, io->n->C, io->n->eps);
}
static void rmsnorm_i(const pw_kernel_io *io) {
  pw_rmsnorm_backward_input(io->din0, io->dout, io->in0, io->w, io->aux, io->rows, io->n->C, io->acc0);
}
static void rmsnorm_w(const pw_kernel_io *io) {
  pw_rmsnorm_backward_weight(io->dw, io->dout, io->in0, io->aux, io->rows, io->n->C);
}

/* base: the offset (Gemma's 1 + w); the weight's gradient is rmsnorm's */
static void rmsnorm_offset_f(const pw_kernel_io *io) {
  pw_rmsnorm_offset_forward(io->out, io->aux, io->in0, io->w, io->n->base, io->rows, io->n->C, io->n->eps);
}
static void rmsnorm_offset_i(const pw_kernel_io *io) {
  pw_rmsnorm_offset_backward_input(io->din0, io->dout, io->in0, io->w, io->n->base, io->aux, io->rows, io->n->C,
                                   io->acc0);
}

/* Elementwise ops run over N*C elements. */
#define NC(io) ((io)->rows * (io)->n->C)
static void gelu_f(const pw_kernel_io *io) { pw_gelu_forward(io->out, io->aux, io->in0, NC(io)); }
static void gelu_i(const pw_kernel_io *io) { pw_gelu_backward_input(io->din0, io->dout, io->aux, NC(io), io->acc0); }
static void relu_f(const pw_kernel_io *io) { pw_relu_forward(io->out, io->in0, NC(io)); }
static void relu_i(const pw_kernel_io *io) { pw_relu_backward_input(io->din0, io->dout, io->in0, NC(io), io->acc0); }
static void silu_f(const pw_kernel_io *io) { pw_silu_forward(io->out, io->in0, NC(io)); }
static void silu_i(const pw_kernel_io *io) { pw_silu_backward_input(io->din0, io->dout, io->in0, NC(io), io->acc0); }
static void swiglu_f(const pw_kernel_io *io) { pw_swiglu_forward(io->out, io->in0, io->in1, NC(io)); }
static void swiglu_i(const pw_kernel_io *io) {
  pw_swiglu_backward_input(io->din0, io->din1, io->dout, io->in0, io->in1, NC(io), io->acc0, io->acc1);
}
static void geglu_f(const pw_kernel_io *io) { pw_geglu_forward(io->out, io->in0, io->in1, NC(io)); }
static void geglu_i(const pw_kernel_io *io) {
  pw_geglu_backward_input(io->din0, io->din1, io->dout, io->in0, io->in1, NC(io), io->acc0, io->acc1);
}
static void scale_f(const pw_kernel_io *io) { pw_scale_forward(io->out, io->in0, io->n->base, NC(io)); }
static void scale_i(const pw_kernel_io *io) { pw_scale_backward_input(io->din0, io->dout, io->n->base, NC(io), io->acc0); }
static void add_f(const pw_kernel_io *io) { pw_add_forward(io->out, io->in0, io->in1, NC(io)); }
static void add_i(const pw_kernel_io *io) { pw_add_backward_input(io->din0, io->din1, io->dout, NC(io), io->acc0, io->acc1); }

/* Rope and attention read packed qkv rows (ops.h): input width n->C = W =
 * (NH + 2 NKV) HD, the model width (attention's OC) NH HD. */
static int nkv_of(const pw_node *n) { return n->NKV > 0 ? n->NKV : n->NH; }
static int qwidth_of(const pw_node *n) { return n->NH * (n->C / (n->NH + 2 * nkv_of(n))); }
static pw_rope rope_of(const pw_node *n) {
  return (pw_rope){.theta = n->base, .factor = n->rope_factor, .low_freq_factor = n->rope_low_freq,
                   .high_freq_factor = n->rope_high_freq, .original_max_pos = n->rope_orig_max_pos};
}

static void rope_f(const pw_kernel_io *io) {
  pw_rope r = rope_of(io->n);
  pw_rope_forward(io->out, io->in0, io->B, io->n->T, qwidth_of(io->n), io->n->NH, nkv_of(io->n), &r);
}
static void rope_i(const pw_kernel_io *io) {
  pw_rope r = rope_of(io->n);
  pw_rope_backward_input(io->din0, io->dout, io->B, io->n->T, qwidth_of(io->n), io->n->NH, nkv_of(io->n), &r,
                         io->acc0);
}
/* The node's mask (ops.h's pw_attn_mask): a sliding window, no causal
 * mask, and with in[1] (the model's tokens, io->in1) keys whose token is
 * pad masked. Its heads are OC / NH wide (HD where the node sets it). */
static pw_attn_mask mask_of(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  PW_ASSERT(!n->HD || n->HD * n->NH == n->OC);
  return (pw_attn_mask){.window = n->window, .bidir = n->bidir, .tok = n->in[1] >= 0 ? TOK(io->in1) : NULL,
                        .pad = n->pad};
}

/* bf16 programs bind bscratch for attention too (pw_attention_*_bf16) */
static void attention_f(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  pw_attn_mask mk = mask_of(io);
  if (io->bscratch) {
    pw_attention_forward_bf16_mask(io->out, io->aux, io->bscratch, io->in0, io->B, n->T, n->OC, n->NH, nkv_of(n), &mk);
    return;
  }
  pw_attention_forward_mask(io->out, io->aux, io->in0, io->B, n->T, n->OC, n->NH, nkv_of(n), &mk);
}
static void attention_i(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  pw_attn_mask mk = mask_of(io);
  if (io->bscratch) {
    pw_attention_backward_input_bf16_mask(io->din0, io->scratch, io->bscratch, io->dout, io->in0, io->aux, io->B,
                                          n->T, n->OC, n->NH, nkv_of(n), io->acc0, &mk);
    return;
  }
  pw_attention_backward_input_mask(io->din0, io->scratch, io->dout, io->in0, io->aux, io->B, n->T, n->OC, n->NH,
                                   nkv_of(n), io->acc0, &mk);
}

/* w: q's norm weight, b: k's (HD each); aux rstd (rows, NH + NKV) */
#define QKN(io) (io)->rows, (io)->n->NH, nkv_of((io)->n), (io)->n->C / ((io)->n->NH + 2 * nkv_of((io)->n))
static void qknorm_f(const pw_kernel_io *io) {
  pw_qknorm_forward(io->out, io->aux, io->in0, io->w, io->b, QKN(io), io->n->eps);
}
static void qknorm_i(const pw_kernel_io *io) {
  pw_qknorm_backward_input(io->din0, io->dout, io->in0, io->w, io->b, io->aux, QKN(io), io->acc0);
}
static void qknorm_w(const pw_kernel_io *io) {
  pw_qknorm_backward_weight(io->dw, io->db, io->dout, io->in0, io->aux, QKN(io));
}

/* aux: lse (B, NH, T); the backward reads the forward's out */
static void attention_tiled_f(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  pw_attn_mask mk = mask_of(io);
  if (io->bscratch)
    pw_attention_tiled_forward_bf16_mask(io->out, io->aux, io->scratch, io->bscratch, io->in0, io->B, n->T, n->OC,
                                         n->NH, nkv_of(n), &mk);
  else
    pw_attention_tiled_forward_mask(io->out, io->aux, io->scratch, io->in0, io->B, n->T, n->OC, n->NH, nkv_of(n),
                                    &mk);
}
static void attention_tiled_i(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  pw_attn_mask mk = mask_of(io);
  if (io->bscratch)
    pw_attention_tiled_backward_input_bf16_mask(io->din0, io->scratch, io->bscratch, io->dout, io->out, io->in0,
                                                io->aux, io->B, n->T, n->OC, n->NH, nkv_of(n), io->acc0, &mk);
  else
    pw_attention_tiled_backward_input_mask(io->din0, io->scratch, io->dout, io->out, io->in0, io->aux, io->B, n->T,
                                           n->OC, n->NH, nkv_of(n), io->acc0, &mk);
}

static void xent_f(const pw_kernel_io *io) {
  io->out[0] = pw_crossentropy_forward(io->aux, io->in0, TOK(io->in1), io->rows, io->n->C, io->loss_scale);
}
static void xent_i(const pw_kernel_io *io) {
  pw_crossentropy_backward_input(io->din0, io->aux, TOK(io->in1), io->rows, io->n->C, io->loss_scale, io->acc0);
}
static void mse_f(const pw_kernel_io *io) { io->out[0] = pw_mse_forward(io->in0, io->in1, NC(io), io->loss_scale); }
static void mse_i(const pw_kernel_io *io) {
  pw_mse_backward_input(io->din0, io->in0, io->in1, NC(io), io->loss_scale, io->acc0);
}

/* aux: h (rows x rank), then dh (rows x rank) */
static void lora_f(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  memcpy(io->out, io->in1, (size_t)io->rows * (size_t)n->OC * sizeof(float));
  pw_lora_forward(io->out, io->aux, io->in0, io->w, io->b, io->rows, n->C, n->OC, n->NH, n->base);
}
static void lora_i(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  size_t ny = (size_t)io->rows * (size_t)n->OC, nx = (size_t)io->rows * (size_t)n->C;
  if (io->din1) {
    if (io->acc1)
      for (size_t k = 0; k < ny; k++) io->din1[k] += io->dout[k];
    else
      memcpy(io->din1, io->dout, ny * sizeof(float));
  }
  if (!io->din0) return;
  if (!io->acc0) memset(io->din0, 0, nx * sizeof(float));
  pw_lora_backward_input(io->din0, io->aux + (size_t)io->rows * n->NH, io->dout, io->w, io->b, io->rows, n->C, n->OC,
                         n->NH, n->base);
}
static void lora_w(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  pw_lora_backward_weight(io->dw, io->db, io->aux + (size_t)io->rows * n->NH, io->dout, io->in0, io->aux, io->b,
                          io->rows, n->C, n->OC, n->NH, n->base);
}

/* concat: row r of out is row r of a (C floats), then of b (OC - C) */
static void concat_f(const pw_kernel_io *io) {
  size_t C = (size_t)io->n->C, D = (size_t)io->n->OC - C;
  for (size_t r = 0; r < (size_t)io->rows; r++) {
    memcpy(io->out + r * (C + D), io->in0 + r * C, C * sizeof(float));
    memcpy(io->out + r * (C + D) + C, io->in1 + r * D, D * sizeof(float));
  }
}
static void concat_part(float *din, const float *dout, size_t rows, size_t w, size_t off, size_t stride, int acc) {
  for (size_t r = 0; r < rows; r++)
    for (size_t k = 0; k < w; k++) din[r * w + k] = (acc ? din[r * w + k] : 0.0f) + dout[r * stride + off + k];
}
static void concat_i(const pw_kernel_io *io) {
  size_t C = (size_t)io->n->C, OC = (size_t)io->n->OC;
  if (io->din0) concat_part(io->din0, io->dout, (size_t)io->rows, C, 0, OC, io->acc0);
  if (io->din1) concat_part(io->din1, io->dout, (size_t)io->rows, OC - C, C, OC, io->acc1);
}

/* the encoder's (ops_enc.h): toktype's separator in NH, padding in pad
 * (-1: none); embed_pad's padding in pad; mlm's loss NH = K a sequence,
 * which prog.c's loss_scale already divides by */
static void gelu_erf_f(const pw_kernel_io *io) { pw_gelu_erf_forward(io->out, io->aux, io->in0, NC(io)); }
static void gelu_erf_i(const pw_kernel_io *io) {
  pw_gelu_erf_backward_input(io->din0, io->dout, io->aux, NC(io), io->acc0);
}
static void tanh_f(const pw_kernel_io *io) { pw_tanh_forward(io->out, io->in0, NC(io)); }
static void tanh_i(const pw_kernel_io *io) { pw_tanh_backward_input(io->din0, io->dout, io->out, NC(io), io->acc0); }
static void toktype_f(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  pw_toktype_forward(io->out, io->in0, TOK(io->in1), io->w, io->B, n->T, n->C, n->NH, n->pad);
}
static void toktype_i(const pw_kernel_io *io) {
  pw_toktype_backward_input(io->din0, io->dout, io->B, io->n->T, io->n->C, io->acc0);
}
static void toktype_w(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  pw_toktype_backward_weight(io->dw, io->dout, TOK(io->in1), io->B, n->T, n->C, n->NH, n->pad);
}
static void first_row_f(const pw_kernel_io *io) { pw_first_row_forward(io->out, io->in0, io->B, io->n->T, io->n->C); }
static void first_row_i(const pw_kernel_io *io) {
  pw_first_row_backward_input(io->din0, io->dout, io->B, io->n->T, io->n->C, io->acc0);
}
static void embed_pad_w(const pw_kernel_io *io) {
  pw_embed_pad_backward_weight(io->dw, io->dout, TOK(io->in0), io->rows, io->n->OC, io->n->pad);
}
static void xent_mlm_f(const pw_kernel_io *io) {
  io->out[0] = pw_xent_mlm_forward(io->aux, io->in0, TOK(io->in1), io->rows, io->n->C, io->loss_scale);
}
static void xent_mlm_i(const pw_kernel_io *io) {
  pw_xent_mlm_backward_input(io->din0, io->aux, TOK(io->in1), io->rows, io->n->C, io->loss_scale, io->acc0);
}

/* ---- decode (decode.h): each sequence's rows at its own position ---------- */

/* Sequence s's rows start at row r, the earlier sequences' lens summed. */

static void posembed_d(const pw_kernel_io *io) {
  int C = io->n->C;
  for (int s = 0, r = 0; s < io->n_seqs; r += io->seqs[s++].len) {
    const pw_decode_seq *q = &io->seqs[s];
    size_t o = (size_t)r * (size_t)C;
    pw_posembed_forward(io->out + o, io->in0 + o, io->w + (size_t)q->pos * C, 1, q->len, C);
  }
}

static void rope_d(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  pw_rope rp = rope_of(n);
  for (int s = 0, r = 0; s < io->n_seqs; r += io->seqs[s++].len) {
    size_t o = (size_t)r * (size_t)n->C;
    pw_rope_forward_at(io->out + o, io->in0 + o, io->seqs[s].len, io->seqs[s].pos, qwidth_of(n), n->NH, nkv_of(n),
                       &rp);
  }
}

/* qkv (W) in, OC out; the slot's K then V, max_pos x (W - OC) / 2 each
 * (decode.c refuses a node with bidir or a pad mask) */
static void attention_d(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  size_t W = (size_t)n->C, OC = (size_t)n->OC, KW = (W - OC) / 2;
  for (int s = 0, r = 0; s < io->n_seqs; r += io->seqs[s++].len) {
    const pw_decode_seq *q = &io->seqs[s];
    float *k = io->kv + (size_t)q->slot * io->kv_slot;
    float *v = k + (size_t)io->max_pos * KW;
    pw_attention_kv_forward(io->out + (size_t)r * OC, k, v, io->scratch, io->in0 + (size_t)r * W, q->len, q->pos,
                            n->OC, n->NH, nkv_of(n), n->window);
  }
}

/* All the call's rows at once when the rowmm is packed; else each
 * sequence's rows alone: one row through the rowmm (an sgemv), several
 * through sgemm (whose rounding depends on how many rows it multiplies, so
 * it never sees another sequence's). */
static void linear_d(const pw_kernel_io *io) {
  int C = io->n->C, OC = io->n->OC;
  if (io->mm && pw_rowmm_packed(io->mm)) {
    pw_rowmm_run(io->mm, io->out, io->in0, io->rows);
    return;
  }
  for (int s = 0, r = 0; s < io->n_seqs; r += io->seqs[s++].len) {
    int N = io->seqs[s].len;
    float *o = io->out + (size_t)r * (size_t)OC;
    const float *x = io->in0 + (size_t)r * (size_t)C;
    if (io->mm && N == 1)
      pw_rowmm_run(io->mm, o, x, 1);
    else
      pw_linear_forward(o, x, io->w, io->b, N, C, OC);
  }
}

/* per sequence: aux holds h */
static void lora_d(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  for (int s = 0, r = 0; s < io->n_seqs; r += io->seqs[s++].len) {
    int N = io->seqs[s].len;
    float *o = io->out + (size_t)r * (size_t)n->OC;
    memcpy(o, io->in1 + (size_t)r * (size_t)n->OC, (size_t)N * (size_t)n->OC * sizeof(float));
    pw_lora_forward(o, io->aux, io->in0 + (size_t)r * (size_t)n->C, io->w, io->b, N, n->C, n->OC, n->NH, n->base);
  }
}

/* A mixture of experts (ops_moe.h): NH experts, HD taken a token; the
 * expert-major order's off (E + 1 ints) then cursors (E) in scratch. A
 * call's rows are those of input 0: K a token for glinear and combine (in
 * the decode too, decode.c). */
#define MOE_E(io) ((io)->n->NH)
#define MOE_K(io) ((io)->n->HD)
#define MOE_OFF(io) ((int *)(io)->scratch)
#define MOE_CUR(io) (MOE_OFF(io) + MOE_E(io) + 1)
static int moe_order(const pw_kernel_io *io, int tokens) {
  pw_moe_order(MOE_OFF(io), io->in1, tokens, MOE_E(io), MOE_K(io));
  return tokens;
}
static void moe_route_f(const pw_kernel_io *io) {
  pw_moe_route_forward(io->out, io->aux, io->in0, NULL, io->rows, MOE_E(io), MOE_K(io), io->n->pad, io->n->base);
}
static void moe_route_i(const pw_kernel_io *io) {
  pw_moe_route_backward_input(io->din0, io->dout, io->out, io->aux, io->rows, MOE_E(io), MOE_K(io), io->n->pad,
                              io->n->base, io->acc0);
}
static void moe_dispatch_f(const pw_kernel_io *io) {
  int N = moe_order(io, io->rows);
  pw_moe_dispatch_forward(io->out, io->in0, io->in1, MOE_OFF(io), MOE_CUR(io), N, MOE_E(io), MOE_K(io), io->n->C);
}
static void moe_dispatch_i(const pw_kernel_io *io) {
  int N = moe_order(io, io->rows);
  pw_moe_dispatch_backward_input(io->din0, io->dout, io->in1, MOE_OFF(io), MOE_CUR(io), N, MOE_E(io), MOE_K(io),
                                 io->n->C, io->acc0);
}
static void moe_glinear_f(const pw_kernel_io *io) {
  moe_order(io, io->rows / MOE_K(io));
  pw_moe_glinear_forward(io->out, io->in0, io->w, MOE_OFF(io), MOE_E(io), io->n->C, io->n->OC);
}
static void moe_glinear_d(const pw_kernel_io *io) {
  moe_order(io, io->rows / MOE_K(io));
  pw_moe_glinear_forward_rows(io->out, io->in0, io->w, MOE_OFF(io), MOE_E(io), io->n->C, io->n->OC);
}
static void moe_glinear_i(const pw_kernel_io *io) {
  moe_order(io, io->rows / MOE_K(io));
  pw_moe_glinear_backward_input(io->din0, io->dout, io->w, MOE_OFF(io), MOE_E(io), io->n->C, io->n->OC, io->acc0);
}
static void moe_glinear_w(const pw_kernel_io *io) {
  moe_order(io, io->rows / MOE_K(io));
  pw_moe_glinear_backward_weight(io->dw, io->dout, io->in0, MOE_OFF(io), MOE_E(io), io->n->C, io->n->OC);
}
static void moe_combine_f(const pw_kernel_io *io) {
  int N = moe_order(io, io->rows / MOE_K(io));
  pw_moe_combine_forward(io->out, io->in0, io->in1, MOE_OFF(io), MOE_CUR(io), N, MOE_E(io), MOE_K(io), io->n->C);
}
static void moe_combine_i(const pw_kernel_io *io) {
  int N = moe_order(io, io->rows / MOE_K(io));
  pw_moe_combine_backward_input(io->din0, io->din1, io->dout, io->in0, io->in1, MOE_OFF(io), MOE_CUR(io), N,
                                MOE_E(io), MOE_K(io), io->n->C, io->acc0, io->acc1);
}

static void sigmoid_gate_f(const pw_kernel_io *io) {
  pw_sigmoid_gate_forward(io->out, io->in0, io->in1, io->rows, io->n->C);
}
static void sigmoid_gate_i(const pw_kernel_io *io) {
  pw_sigmoid_gate_backward_input(io->din0, io->din1, io->dout, io->in0, io->in1, io->rows, io->n->C, io->acc0,
                                 io->acc1);
}

/* forward, backward_input, backward_weight, backward, decode */
static const pw_kernel table[PW_OP__COUNT] = {
    [PW_OP_EMBED] = {embed_f, NULL, embed_w, NULL, embed_f},
    [PW_OP_POSEMBED] = {posembed_f, posembed_i, posembed_w, NULL, posembed_d},
    [PW_OP_LINEAR] = {linear_f, linear_i, linear_w, linear_b, linear_d},
    [PW_OP_LAYERNORM] = {layernorm_f, layernorm_i, layernorm_w, layernorm_b, layernorm_f},
    [PW_OP_RMSNORM] = {rmsnorm_f, rmsnorm_i, rmsnorm_w, NULL, rmsnorm_f},
    [PW_OP_GELU] = {gelu_f, gelu_i, NULL, NULL, gelu_f},
    [PW_OP_RELU] = {relu_f, relu_i, NULL, NULL, relu_f},
    [PW_OP_SILU] = {silu_f, silu_i, NULL, NULL, silu_f},
    [PW_OP_SWIGLU] = {swiglu_f, swiglu_i, NULL, NULL, swiglu_f},
    [PW_OP_ADD] = {add_f, add_i, NULL, NULL, add_f},
    [PW_OP_ROPE] = {rope_f, rope_i, NULL, NULL, rope_d},
    [PW_OP_ATTENTION] = {attention_f, attention_i, NULL, NULL, attention_d},
    [PW_OP_XENT] = {xent_f, xent_i, NULL, NULL, NULL},     /* decode skips a loss */
    [PW_OP_MSE] = {mse_f, mse_i, NULL, NULL, NULL},
    [PW_OP_LORA] = {lora_f, lora_i, lora_w, NULL, lora_d},
    [PW_OP_CONCAT] = {concat_f, concat_i, NULL, NULL, NULL}, /* regions models are not decoded */
    [PW_OP_ATTENTION_TILED] = {attention_tiled_f, attention_tiled_i, NULL, NULL, attention_d},
    [PW_OP_QKNORM] = {qknorm_f, qknorm_i, qknorm_w, NULL, qknorm_f},
    [PW_OP_GEGLU] = {geglu_f, geglu_i, NULL, NULL, geglu_f},
    [PW_OP_SCALE] = {scale_f, scale_i, NULL, NULL, scale_f},
    [PW_OP_RMSNORM_OFFSET] = {rmsnorm_offset_f, rmsnorm_offset_i, rmsnorm_w, NULL, rmsnorm_offset_f},
    [PW_OP_GELU_ERF] = {gelu_erf_f, gelu_erf_i, NULL, NULL, gelu_erf_f},
    [PW_OP_TANH] = {tanh_f, tanh_i, NULL, NULL, tanh_f},
    [PW_OP_TOKTYPE] = {toktype_f, toktype_i, toktype_w, NULL, NULL}, /* not decoded (optable.c) */
    [PW_OP_FIRST_ROW] = {first_row_f, first_row_i, NULL, NULL, NULL},
    [PW_OP_EMBED_PAD] = {embed_f, NULL, embed_pad_w, NULL, embed_f},
    [PW_OP_XENT_MLM] = {xent_mlm_f, xent_mlm_i, NULL, NULL, NULL},
    [PW_OP_MOE_ROUTE] = {moe_route_f, moe_route_i, NULL, NULL, moe_route_f},
    [PW_OP_MOE_DISPATCH] = {moe_dispatch_f, moe_dispatch_i, NULL, NULL, moe_dispatch_f},
    [PW_OP_MOE_GLINEAR] = {moe_glinear_f, moe_glinear_i, moe_glinear_w, NULL, moe_glinear_d},
    [PW_OP_MOE_COMBINE] = {moe_combine_f, moe_combine_i, NULL, NULL, moe_combine_f},
    [PW_OP_SIGMOID_GATE] = {sigmoid_gate_f, sigmoid_gate_i, NULL, NULL, sigmoid_gate_f},
};

const pw_kernel *pw_kernel_of(int op) { return &table[op]; }
