/* ops: the compute kernels, one plain function per layer and direction.
 *
 * Shape legend: B batch (sequences), T time, C channels, OC output
 * channels, N = B*T rows (tokens), V vocabulary, NH heads, HD = C/NH.
 * Everything is float32, row-major, contiguous unless a leading dimension
 * says otherwise. Every matmul goes through OpenBLAS cblas_sgemm (the bf16
 * linear layer of train.precision "bf16" is in bf16.h).
 *
 * Each op has a forward, a backward_input (gradient w.r.t. its inputs) and,
 * if it has parameters, a backward_weight (gradient w.r.t. its parameters).
 * The two backward halves are separately callable and need only what the
 * forward saved plus the output gradient: ZeroBubble schedules run them at
 * different times.
 *
 * backward_weight functions ACCUMULATE (+=) into their gradient outputs, as
 * llm.c does: parameter gradients sum over microbatches (and over two uses
 * of a parameter) without special cases. backward_input functions take an
 * `acc` flag per input gradient: acc != 0 adds into it (+=); acc == 0
 * overwrites it without reading it, storing exactly what adding into a
 * zeroed buffer would (0 + g, so -0 becomes +0, and sgemm beta = 0): a
 * value's first gradient writer overwrites, later ones (a value used twice)
 * accumulate, and nobody has to zero the buffers. Forwards overwrite
 * `out`. Outputs never alias inputs.
 *
 * These kernels must never allocate: scratch buffers are passed in. */
#ifndef PW_OPS_H
#define PW_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "ops_rope.h"

/* Token embedding: out[n,:] = wte[tok[n],:].  wte (V,C), tok (N), out (N,C).
 * Tokens must be in [0,V); the caller validated them. No backward_input. */
void pw_embed_forward(float *out, const int32_t *tok, const float *wte, int N, int C);
void pw_embed_backward_weight(float *dwte, const float *dout, const int32_t *tok, int N, int C);

/* Learned position embedding added to its input:
 * out[b,t,:] = inp[b,t,:] + wpe[t,:].  inp/out (B,T,C), wpe (Tmax>=T, C). */
void pw_posembed_forward(float *out, const float *inp, const float *wpe, int B, int T, int C);
void pw_posembed_backward_input(float *dinp, const float *dout, int B, int T, int C, int acc);
void pw_posembed_backward_weight(float *dwpe, const float *dout, int B, int T, int C);

/* Linear: out = inp @ w^T + bias.  inp (N,C), w (OC,C) as PyTorch lays it
 * out, bias (OC) or NULL, out (N,OC). */
void pw_linear_forward(float *out, const float *inp, const float *w, const float *bias,
                       int N, int C, int OC);
void pw_linear_backward_input(float *dinp, const float *dout, const float *w, int N, int C, int OC,
                              int acc);
/* dbias may be NULL (no bias). */
void pw_linear_backward_weight(float *dw, float *dbias, const float *dout, const float *inp,
                               int N, int C, int OC);

/* LayerNorm over C with affine weight and bias, eps as given (1e-5).
 * Saves mean (N) and rstd (N) for backward. */
void pw_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C, float eps);
void pw_layernorm_backward_input(float *dinp, const float *dout, const float *inp, const float *w,
                                 const float *mean, const float *rstd, int N, int C, int acc);
void pw_layernorm_backward_weight(float *dw, float *db, const float *dout, const float *inp,
                                  const float *mean, const float *rstd, int N, int C);
/* Both halves in one pass over the rows: the same bits as backward_weight
 * followed by backward_input (a full backward, when nothing splits them). */
void pw_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int N, int C,
                           int acc);

/* RMSNorm (no bias): out = inp * rstd * w, rstd = 1/sqrt(mean(inp^2) + eps).
 * Saves rstd (N). */
void pw_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                        float eps);
void pw_rmsnorm_backward_input(float *dinp, const float *dout, const float *inp, const float *w,
                               const float *rstd, int N, int C, int acc);
void pw_rmsnorm_backward_weight(float *dw, const float *dout, const float *inp, const float *rstd,
                                int N, int C);
/* RMSNorm scaled by off + w (Gemma: off 1, out = inp * rstd * (1 + w),
 * the weight stored as w and initialised 0); off 0 is pw_rmsnorm_*, which
 * call these. The weight's gradient is pw_rmsnorm_backward_weight's (the
 * offset is a constant). */
void pw_rmsnorm_offset_forward(float *out, float *rstd, const float *inp, const float *w, float off, int N, int C,
                               float eps);
void pw_rmsnorm_offset_backward_input(float *dinp, const float *dout, const float *inp, const float *w, float off,
                                      const float *rstd, int N, int C, int acc);

/* Elementwise activations over n floats. GELU is the tanh approximation
 * (PyTorch's gelu(approximate='tanh')); its forward also saves the
 * derivative gelu'(inp) in dgelu (n), which is all its backward needs. */
void pw_gelu_forward(float *out, float *dgelu, const float *inp, int n);
void pw_gelu_backward_input(float *dinp, const float *dout, const float *dgelu, int n, int acc);
void pw_relu_forward(float *out, const float *inp, int n);
void pw_relu_backward_input(float *dinp, const float *dout, const float *inp, int n, int acc);
void pw_silu_forward(float *out, const float *inp, int n);
void pw_silu_backward_input(float *dinp, const float *dout, const float *inp, int n, int acc);

/* SwiGLU gate: out = silu(gate) * up, all (n). */
void pw_swiglu_forward(float *out, const float *gate, const float *up, int n);
/* dgate and dup may be the same buffer (gate == up): acc_up then must be 1. */
void pw_swiglu_backward_input(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, int n, int acc_gate, int acc_up);

/* GeGLU gate (Gemma): out = gelu(gate) * up with the tanh GELU above, all
 * (n). Nothing saved: the backward recomputes the tanh. dgate and dup may
 * be the same buffer (gate == up): acc_up then must be 1. */
void pw_geglu_forward(float *out, const float *gate, const float *up, int n);
void pw_geglu_backward_input(float *dgate, float *dup, const float *dout, const float *gate,
                             const float *up, int n, int acc_gate, int acc_up);

/* Scale by a constant: out = inp * s, all (n) (Gemma's embeddings times
 * sqrt(d), s rounded to float). */
void pw_scale_forward(float *out, const float *inp, float s, int n);
void pw_scale_backward_input(float *dinp, const float *dout, float s, int n, int acc);

/* Residual add: out = a + b, all (n). */
void pw_add_forward(float *out, const float *a, const float *b, int n);
/* da and db may be the same buffer (a + a): acc_b then must be 1. */
void pw_add_backward_input(float *da, float *db, const float *dout, int n, int acc_a, int acc_b);

/* Attention's packed qkv rows (B,T,W): the NH query heads (columns 0..C-1,
 * C = NH*HD the model width), then the NKV key heads and the NKV value
 * heads (NKV*HD columns each), W = C + 2*NKV*HD. NKV divides NH: query
 * head h reads key/value head h / (NH/NKV) (grouped-query attention, as
 * Hugging Face's repeat_kv; NKV == NH is multi-head, NKV == 1 multi-query). */

/* Rotary position embedding on packed qkv rows: the q and k heads are
 * rotated per head in the rotate-half convention of Hugging Face Llama
 * (pairs (i, i+HD/2) of each head, angle t * inv_freq_i, ops_rope.h's
 * frequencies of r: theta and Llama-3's rope_scaling); v is copied through. */
void pw_rope_forward(float *out, const float *inp, int B, int T, int C, int NH, int NKV, const pw_rope *r);
void pw_rope_backward_input(float *dinp, const float *dout, int B, int T, int C, int NH, int NKV,
                            const pw_rope *r, int acc);
/* The forward on T rows of one sequence at positions t0 .. t0+T-1 (a
 * KV-cache decode): the same angles, so the same bits, as those rows of
 * pw_rope_forward over the whole sequence. */
void pw_rope_forward_at(float *out, const float *inp, int T, int t0, int C, int NH, int NKV, const pw_rope *r);

/* QK-norm (Qwen3) on packed qkv rows (N,W): an RMSNorm (pw_rmsnorm_*, eps
 * as given) over each of the NH query heads' HD columns with weight wq
 * (HD) and each of the NKV key heads' with wk (HD), shared by the heads; v
 * copied through. Saves rstd (N, NH+NKV): row n's query heads, then its
 * key heads. backward_weight accumulates into dwq and dwk. */
void pw_qknorm_forward(float *out, float *rstd, const float *inp, const float *wq, const float *wk, int N, int NH,
                       int NKV, int HD, float eps);
void pw_qknorm_backward_input(float *dinp, const float *dout, const float *inp, const float *wq, const float *wk,
                              const float *rstd, int N, int NH, int NKV, int HD, int acc);
void pw_qknorm_backward_weight(float *dwq, float *dwk, const float *dout, const float *inp, const float *rstd, int N,
                               int NH, int NKV, int HD);

/* Attention's masks besides the causal one (pw_node's window, bidir and
 * pad; docs/contracts.md#attention). The _mask entries below take one;
 * NULL (or all zero) is causal, what the entries without _mask compute.
 * A query row whose keys are all pad attends uniformly to them (the
 * softmax HF BERT's additive finfo.min mask gives such a row): a constant,
 * so no gradient reaches its q or those keys' k from it (v's share does). */
typedef struct pw_attn_mask {
  int window;         /* > 0: the query at position p sees keys (p - window, p] only,
                         Mistral's sliding_window (transformers masks k <= p - window);
                         0: all. Causal only */
  int bidir;          /* 1: no causal mask, every query sees every key (encoders) */
  const int32_t *tok; /* (B,T) the sequences' tokens, or NULL: keys whose token is pad
                         are masked (BERT's padding mask) */
  int32_t pad;
} pw_attn_mask;

/* Causal grouped-query self-attention on packed qkv (B,T,W) -> out (B,T,C),
 * C = NH*HD the width of the queries (the model width unless the heads have
 * a width of their own: model.head_dim). Scores scaled by 1/sqrt(HD). att
 * (B,NH,T,T) saves the softmax probabilities (zero where masked). scratch
 * holds at least T*T floats. The key/value gradients of a group's heads are
 * summed in head order. No parameters, so no backward_weight. */
void pw_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH, int NKV);
void pw_attention_backward_input(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                 const float *att, int B, int T, int C, int NH, int NKV, int acc);
void pw_attention_forward_mask(float *out, float *att, const float *qkv, int B, int T, int C, int NH, int NKV,
                               const pw_attn_mask *mk);
void pw_attention_backward_input_mask(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                      const float *att, int B, int T, int C, int NH, int NKV, int acc,
                                      const pw_attn_mask *mk);

/* The same attention, tiled with an online softmax (FlashAttention-2;
 * ops_flash.c): no T x T buffer. The forward saves lse (B,NH,T), each
 * row's log-sum-exp of its scaled scores, instead of the probabilities;
 * the backward recomputes them tile by tile from qkv and lse, and reads
 * the forward's out. scratch holds pw_attention_tiled_scratch(T, C, NH,
 * NKV) floats (a few tiles and T per head of a group: O(T), not O(T^2)).
 * The same results as pw_attention_* to float rounding (test_ops_flash: 1e-5). */
size_t pw_attention_tiled_scratch(int T, int C, int NH, int NKV);
void pw_attention_tiled_forward(float *out, float *lse, float *scratch, const float *qkv, int B, int T, int C,
                                int NH, int NKV);
void pw_attention_tiled_backward_input(float *dqkv, float *scratch, const float *dout, const float *out,
                                       const float *qkv, const float *lse, int B, int T, int C, int NH, int NKV,
                                       int acc);
void pw_attention_tiled_forward_mask(float *out, float *lse, float *scratch, const float *qkv, int B, int T, int C,
                                     int NH, int NKV, const pw_attn_mask *mk);
void pw_attention_tiled_backward_input_mask(float *dqkv, float *scratch, const float *dout, const float *out,
                                            const float *qkv, const float *lse, int B, int T, int C, int NH, int NKV,
                                            int acc, const pw_attn_mask *mk);

/* Causal attention of T new rows of one sequence at positions t0 .. t0+T-1
 * against its KV cache (ops_kv.c). qkv (T,W) packed as above (q and k
 * already rotated for llama); kc, vc (>= t0+T, NKV*HD) the sequence's
 * cached keys and values of this layer, rows 0 .. t0-1 filled by earlier
 * calls: rows t0 .. t0+T-1 are written from qkv first, then new row i
 * attends over cache rows 0 .. t0+i (window > 0: the last `window` of
 * them, pw_attn_mask's). out (T,C). scratch holds at least
 * pw_attention_kv_scratch(T, t0) floats. */
void pw_attention_kv_forward(float *out, float *kc, float *vc, float *scratch, const float *qkv, int T,
                             int t0, int C, int NH, int NKV, int window);
size_t pw_attention_kv_scratch(int T, int t0);

/* Softmax cross-entropy. logits (N,V), targets (N) in [0,V). probs (N,V)
 * saves the softmax. Returns scale * sum_n -log softmax(logits)[n, t_n]
 * (the caller passes scale = 1/(tokens in the whole batch), so microbatch
 * losses sum to the batch mean). The sum is accumulated in double. */
float pw_crossentropy_forward(float *probs, const float *logits, const int32_t *targets, int N,
                              int V, float scale);
void pw_crossentropy_backward_input(float *dlogits, const float *probs, const int32_t *targets,
                                    int N, int V, float scale, int acc);

/* Vocab-parallel token embedding (ops_tp.c): wte (V,C) holds rows [v0,
 * v0+V) of the whole table; a token outside them gives a zero row, so the
 * tensor-parallel group's all-reduce of out (N,C) is pw_embed_forward of
 * the whole table (each row is one rank's plus zeros). The backward adds
 * into the rows it holds only. */
void pw_embed_vp_forward(float *out, const int32_t *tok, const float *wte, int N, int C, int V, int v0);
void pw_embed_vp_backward_weight(float *dwte, const float *dout, const int32_t *tok, int N, int C, int V,
                                 int v0);

/* Vocab-parallel softmax cross-entropy (ops_tp.c): each tensor-parallel
 * rank holds logits (N,V) of vocabulary rows [v0, v0+V); targets (N) are
 * global ids. Three steps around two all-reduces of the tp group:
 *  1. pw_xent_vp_max: mx (N), each row's local max -> all-reduce (max);
 *  2. pw_xent_vp_partial: probs = exp(logits - mx), part (N,2) = [the
 *     shard's sum of them, the target's logit - mx on the rank holding
 *     it, else 0] -> all-reduce (sum, in tp-rank order);
 *  3. pw_xent_vp_finish: normalizes probs and returns scale * sum_n
 *     (log part[n][0] - part[n][1]), accumulated in double.
 * At one rank (v0 0, V the vocabulary) this is pw_crossentropy_forward up
 * to the float rounding of the row sums. */
void pw_xent_vp_max(float *mx, const float *logits, int N, int V);
void pw_xent_vp_partial(float *part, float *probs, const float *logits, const float *mx,
                        const int32_t *targets, int N, int V, int v0);
float pw_xent_vp_finish(float *probs, const float *part, int N, int V, float scale);
void pw_xent_vp_backward_input(float *dlogits, const float *probs, const int32_t *targets, int N, int V,
                               int v0, float scale, int acc);

/* Mean-squared error: returns scale * sum_i (pred_i - target_i)^2 over n
 * elements (scale = 1/(elements in the whole batch)). */
float pw_mse_forward(const float *pred, const float *target, int n, float scale);
void pw_mse_backward_input(float *dpred, const float *pred, const float *target, int n, float scale,
                           int acc);

#endif
