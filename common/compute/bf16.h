/* bf16: bfloat16 numbers and the matrix multiply train.precision "bf16"
 * runs its linear layers with.
 *
 * A bf16 is the top 16 bits of a float32 (8 exponent bits, 7 mantissa
 * bits). Rounding is to nearest, ties to even, on the bit pattern; a NaN
 * stays a (quiet) NaN, infinities stay, subnormals round like any other
 * number (no flush to zero). Every CPU level computes the same bits: the
 * conversions are integer arithmetic (PW_CPU_DISPATCH loops), not
 * vcvtneps2bf16 (which flushes subnormal inputs).
 *
 * pw_gemm_bf16 multiplies bf16 matrices with float32 accumulation into a
 * float32 result. Two paths, chosen once per process:
 *   - oneDNN's bf16 matmul (vdpbf16ps) when the CPU has AVX512_BF16, the
 *     OS saves AVX-512 state, and PW_CPU allows AVX-512 (pw_cpu_level());
 *   - otherwise the operands are widened to float32 (exactly) and OpenBLAS's
 *     sgemm multiplies them: the products are the same exact products, only
 *     the accumulation order and rounding differ, so both paths agree to
 *     float32 accumulation error (test_bf16 bounds it).
 * Within one process and one path the result is deterministic (one
 * thread: OpenBLAS's thread count is also oneDNN's), so two processes on
 * the same kind of host compute the same bits for the same call.
 * Threads: pw_gemm_bf16 may be called from several threads at once. */
#ifndef PW_BF16_H
#define PW_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "optable.h"

typedef uint16_t pw_bf16;

/* dst[i] = src[i] rounded to bf16 (n elements). */
void pw_bf16_from_f32(pw_bf16 *dst, const float *src, size_t n);
/* dst[i] = src[i] as float32 (exact). */
void pw_bf16_to_f32(float *dst, const pw_bf16 *src, size_t n);
/* x holds n bf16 in its first 2n bytes: widens them in place to n floats
 * (what a bf16 frame received into a float buffer needs). */
void pw_bf16_widen_inplace(float *x, size_t n);
/* x[i] = x[i] rounded to bf16 and back: a float holding a bf16 value. */
void pw_bf16_round_f32(float *x, size_t n);
/* One value, for tests and tools. */
pw_bf16 pw_bf16_of(float x);
float pw_bf16_value(pw_bf16 b);

/* C (M,N) = op(A) op(B) (acc == 0) or C += op(A) op(B) (acc != 0), row
 * major. op(A) is (M,K): A as stored (M,K) with leading dimension lda, or,
 * with ta, A stored (K,M) and transposed. Likewise op(B) (K,N): B stored
 * (K,N), or with tb stored (N,K). M, N, K >= 1. Never fails: a primitive
 * oneDNN refuses to make sends that shape down the sgemm path (warned once). */
void pw_gemm_bf16(int ta, int tb, int M, int N, int K, const pw_bf16 *A, int lda, const pw_bf16 *B,
                  int ldb, int acc, float *C, int ldc);

/* The linear layer (ops.h's pw_linear_*) with bf16 operands: the same
 * contracts, plus where the bf16 copies go. wb (OC,C) is the weight's copy,
 * which the forward refreshes from w and the backward-input reads; xb
 * (N,C) and dyb (N,OC) hold the converted input and output gradient. The
 * bias and its gradient stay float32. */
void pw_linear_forward_bf16(float *out, const float *inp, const float *w, pw_bf16 *wb, pw_bf16 *xb,
                            const float *bias, int N, int C, int OC);
void pw_linear_backward_input_bf16(float *dinp, const float *dout, const pw_bf16 *wb, pw_bf16 *dyb, int N, int C,
                                   int OC, int acc);
void pw_linear_backward_weight_bf16(float *dw, float *dbias, const float *dout, const float *inp, pw_bf16 *dyb,
                                    pw_bf16 *xb, int N, int C, int OC);
/* backward_weight then backward_input, dout converted once: the same bits
 * as the two calls. */
void pw_linear_backward_bf16(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                             const pw_bf16 *wb, pw_bf16 *dyb, pw_bf16 *xb, int N, int C, int OC, int acc);

/* Causal attention (ops.h's pw_attention_*) with the four products on bf16
 * operands (pw_gemm_bf16): Q K^T on bf16 q and k, then the scale in
 * float32; P V on bf16(P) and v; dP = dO V^T on bf16 dout and v; dQ and dK
 * on bf16(scale * dS) with k and q; dV on bf16(P) and dout. Softmax, its
 * gradient and the saved P (att) stay float32. bs holds at least
 * pw_attention_bf16_scratch(B, T, C) bf16 (C the model width: grouped-query
 * rows are narrower); scratch T*T floats as ops.h's. */
static inline size_t pw_attention_bf16_scratch(int B, int T, int C) {
  return 4 * (size_t)B * T * C + 2 * (size_t)T * T; /* the planner counts it too */
}
void pw_attention_forward_bf16(float *out, float *att, pw_bf16 *bs, const float *qkv, int B, int T, int C,
                               int NH, int NKV);
void pw_attention_backward_input_bf16(float *dqkv, float *scratch, pw_bf16 *bs, const float *dout,
                                      const float *qkv, const float *att, int B, int T, int C, int NH,
                                      int NKV, int acc);
/* with ops.h's pw_attn_mask (NULL: causal) */
struct pw_attn_mask;
void pw_attention_forward_bf16_mask(float *out, float *att, pw_bf16 *bs, const float *qkv, int B, int T, int C,
                                    int NH, int NKV, const struct pw_attn_mask *mk);
void pw_attention_backward_input_bf16_mask(float *dqkv, float *scratch, pw_bf16 *bs, const float *dout,
                                           const float *qkv, const float *att, int B, int T, int C, int NH,
                                           int NKV, int acc, const struct pw_attn_mask *mk);

/* The tiled attention (ops.h's pw_attention_tiled_*) with the same five
 * products on bf16 operands: bs holds at least
 * pw_attention_tiled_bf16_scratch(B, T, C) bf16 (the operands, then two
 * tiles: no T x T); scratch and lse as ops.h's. */
static inline size_t pw_attention_tiled_bf16_scratch(int B, int T, int C) {
  return 4 * (size_t)B * T * C + 2 * (size_t)PW_ATTN_TILE_B * PW_ATTN_TILE_K; /* the planner counts it too */
}
void pw_attention_tiled_forward_bf16(float *out, float *lse, float *scratch, pw_bf16 *bs, const float *qkv, int B,
                                     int T, int C, int NH, int NKV);
void pw_attention_tiled_backward_input_bf16(float *dqkv, float *scratch, pw_bf16 *bs, const float *dout,
                                            const float *out, const float *qkv, const float *lse, int B, int T,
                                            int C, int NH, int NKV, int acc);
void pw_attention_tiled_forward_bf16_mask(float *out, float *lse, float *scratch, pw_bf16 *bs, const float *qkv,
                                          int B, int T, int C, int NH, int NKV, const struct pw_attn_mask *mk);
void pw_attention_tiled_backward_input_bf16_mask(float *dqkv, float *scratch, pw_bf16 *bs, const float *dout,
                                                 const float *out, const float *qkv, const float *lse, int B, int T,
                                                 int C, int NH, int NKV, int acc, const struct pw_attn_mask *mk);

/* 1 when pw_gemm_bf16 runs oneDNN's AVX512_BF16 kernels, 0 for the sgemm
 * path. Decided at the first call of either (PW_CPU read then). */
int pw_gemm_bf16_native(void);
/* For tests and benchmarks: 0 forces the sgemm path, 1 the native one (if
 * the CPU has it); returns the path now in use. Not while gemms run. */
int pw_gemm_bf16_force(int native);
/* "onednn:<implementation>" or "sgemm": what a worker reports. */
const char *pw_gemm_bf16_name(void);

#endif
