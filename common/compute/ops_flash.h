/* ops_flash: the tiled attention's one general entry (ops_flash.c), internal
 * to the ops*.c files: ops.h's and bf16.h's pw_attention_tiled_* are this
 * for causal multi-head attention on a packed qkv, ops_kv.c's prefill is
 * this against a sequence's KV cache.
 *
 * One problem is B sequences of Tq query rows against Tk keys, NH query
 * heads over NKV key/value heads (NH % NKV == 0: query head h reads key and
 * value head h / (NH / NKV), grouped-query attention; NKV == NH: multi-head).
 * Heads sit side by side in their rows (head h's HD columns at h * HD).
 * Query row i is at key position p = off + i: causal, it sees keys [0, p]
 * (off 0 in training, a prefill's start in decoding), else all Tk keys;
 * window > 0 (causal only) keeps keys (p - window, p] (Mistral's sliding
 * window); tok (stok apart per sequence) masks the keys whose token is
 * pad. A row all of whose keys are pad attends uniformly to them (ops.h's
 * pw_attn_mask: HF BERT's finfo.min mask), a constant: no gradient to q or
 * k from it. Scores are scaled by 1/sqrt(HD).
 *
 * With bf16 copies (qb, kb, vb, dob: the same layout as the float32
 * operands) the products take bf16 operands with float32 accumulation
 * (pw_gemm_bf16), as ops_attn.c's bf16 attention: Q K^T, then the scale in
 * float32; bf16(P) V; dO V^T; bf16(scale * dS) K and its transpose with Q;
 * bf16(P)^T dO. Softmax and its gradient stay float32.
 *
 * Never allocates: work is pw__attn_work floats, bwork (bf16 runs) 2 x
 * PW_ATTN_TILE_B x PW_ATTN_TILE_K bf16. */
#ifndef PW_OPS_FLASH_H
#define PW_OPS_FLASH_H

#include <stddef.h>
#include <stdint.h>

#include "bf16.h"

typedef struct {
  int B, Tq, Tk;     /* sequences; query rows and keys per sequence */
  int NH, NKV, HD;   /* query heads, key/value heads, head width */
  int off;           /* query row i sits at key position off + i */
  int causal;        /* 1: row i sees keys [0, off + i]; 0: every key */
  int window;        /* > 0 (causal): row i sees keys (off + i - window, off + i] */
  const int32_t *tok; /* key j of sequence b is masked when tok[b * stok + j] == pad; NULL: none */
  size_t stok;
  int32_t pad;
  /* float32 operands: element (row, column) of sequence b at
   * p + b * s + row * ld + column. q and dq share ldq and sq; k, v, dk,
   * dv share ldk and sk; o and dout share ldo and so. */
  const float *q, *k, *v;
  size_t ldq, ldk, ldo, sq, sk, so;
  /* bf16 copies of q, k, v (and dout in the backward), same layout; NULL:
   * float32 products */
  const pw_bf16 *qb, *kb, *vb, *dob;
} pw__attn;

/* The first key query position p sees under a sliding window (0: none). */
static inline int pw__attn_first_key(int p, int window) { return window > 0 && p + 1 > window ? p + 1 - window : 0; }

/* 1 when keys [lo, hi) of tok (NULL: no mask) are all pad: the row that
 * sees them attends uniformly to them. */
static inline int pw__attn_all_pad(const int32_t *tok, int32_t pad, int lo, int hi) {
  if (!tok) return 0;
  for (int j = lo; j < hi; j++)
    if (tok[j] != pad) return 0;
  return 1;
}

/* Floats of work for a problem's forward and backward. */
size_t pw__attn_work(int Tq, int HD, int NH, int NKV);

/* o (Tq rows of NH*HD) = softmax(scale Q K^T) V, each row normalized;
 * lse (B, NH, Tq), or NULL: each row's log-sum-exp of its scaled scores
 * (what the backward recomputes the probabilities from). */
void pw__attn_forward(const pw__attn *a, float *o, float *lse, float *work, pw_bf16 *bwork);

/* dq, dk, dv (+)= the gradients of o given dout (acc: add, else overwrite),
 * from q, k, v, the forward's o and lse. Every element of dq, dk and dv
 * the problem covers is written. */
void pw__attn_backward(const pw__attn *a, float *dq, float *dk, float *dv, const float *dout, const float *o,
                       const float *lse, int acc, float *work, pw_bf16 *bwork);

#endif
