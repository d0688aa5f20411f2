/* cu_fa: attention_tiled on the GPU, float32 and bf16 programs —
 * FlashAttention-2's forward and a deterministic backward (cu_attn.h's
 * pw_cu_attention_tiled_f/_i). The block programs are cu_fa_body.h's,
 * which the CPU test runs too; here only the kernels that run them, the
 * tensor-core product they call, and the launches.
 *
 * Launches: forward and dq one block per (query tile, query head,
 * sequence), the last query tiles first (a causal row's work grows with
 * it); dk/dv one block per (key tile, kv head, sequence), the first key
 * tiles first; before them the backward's D = rowsum(dout * out), a thread
 * a row, into the kernels' scratch, and in bf16 programs the bf16 copies of
 * qkv (and dout) into the node's bscratch, as the CPU makes them. All on
 * the legacy default stream; a failed launch is recorded for the
 * backend's sync.
 *
 * --fmad=false (CMakeLists.txt) holds here too: the float32 programs'
 * sums round as written. The bf16 products are WMMA's (bf16 operands,
 * float32 accumulation in the tensor cores' own order), which no flag
 * changes; their operands are rounded by cu_bf16_body.h's integer code. */
#include <mma.h>
#include <stdio.h>

#include "cu_int.h"

#include "cu_attn.h"

/* The backend's record of an asynchronous failure (cu_core.cu). */
extern "C" void pw_cu_note_error(int cuda_error, const char *where);

/* One warp's 16 x 16 block of C (row ldc, float32) (+)= op(A) op(B) over
 * K (a multiple of 16), bf16 operands: the tensor cores (cu_fa_body.h's
 * plain-C twin is what the CPU test runs). ta: A is stored transposed
 * (element (i, k) at A[k lda + i]); tb: B is ((k, j) at B[j ldb + k]). */
__device__ static inline void pw_cu_fa_mma16(float *Cm, int ldc, const uint16_t *A, int lda, int ta,
                                             const uint16_t *Bm, int ldb, int tb, int K, int acc) {
  using namespace nvcuda;
  const __nv_bfloat16 *a = (const __nv_bfloat16 *)A, *b = (const __nv_bfloat16 *)Bm;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  if (acc)
    wmma::load_matrix_sync(c, Cm, (unsigned)ldc, wmma::mem_row_major);
  else
    wmma::fill_fragment(c, 0.0f);
  for (int k = 0; k < K; k += 16) {
    if (!ta && !tb) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, a + k, (unsigned)lda);
      wmma::load_matrix_sync(fb, b + k * ldb, (unsigned)ldb);
      wmma::mma_sync(c, fa, fb, c);
    } else if (!ta) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + k, (unsigned)lda);
      wmma::load_matrix_sync(fb, b + k, (unsigned)ldb);
      wmma::mma_sync(c, fa, fb, c);
    } else if (!tb) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, a + k * lda, (unsigned)lda);
      wmma::load_matrix_sync(fb, b + k * ldb, (unsigned)ldb);
      wmma::mma_sync(c, fa, fb, c);
    } else {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + k * lda, (unsigned)lda);
      wmma::load_matrix_sync(fb, b + k, (unsigned)ldb);
      wmma::mma_sync(c, fa, fb, c);
    }
  }
  wmma::store_matrix_sync(Cm, c, (unsigned)ldc, wmma::mem_row_major);
}

#include "cu_bf16_body.h"
#include "cu_fa_body.h"

/* ---- kernels: one block program each ------------------------------------------------ */

__global__ static void __launch_bounds__(PW_FA_NT) fwd_k(pw_cu_fa d, float *out, float *lse, const float *qkv) {
  extern __shared__ __align__(128) unsigned char sm[];
  pw_cu_fa_fwd_block(&d, out, lse, qkv, (int)(gridDim.x - 1 - blockIdx.x), (int)blockIdx.y, (int)blockIdx.z, sm);
}

__global__ static void __launch_bounds__(PW_FA_NT) dq_k(pw_cu_fa d, float *dqkv, const float *dout, const float *qkv,
                                                        const float *lse, int acc) {
  extern __shared__ __align__(128) unsigned char sm[];
  pw_cu_fa_dq_block(&d, dqkv, dout, qkv, lse, acc, (int)(gridDim.x - 1 - blockIdx.x), (int)blockIdx.y,
                    (int)blockIdx.z, sm);
}

__global__ static void __launch_bounds__(PW_FA_NT) dkv_k(pw_cu_fa d, float *dqkv, const float *dout, const float *qkv,
                                                         const float *lse, int acc) {
  extern __shared__ __align__(128) unsigned char sm[];
  pw_cu_fa_dkv_block(&d, dqkv, dout, qkv, lse, acc, (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, sm);
}

/* the backward's first launch: D, a thread a row */
__global__ static void d_k(pw_cu_fa d, float *D, const float *dout, const float *out) {
  size_t i = pw_cu__tid();
  if (i < pw_cu_fa_d_n(&d)) pw_cu_fa_d_row(&d, D, dout, out, i);
}

/* a bf16 copy of n floats (the CPU's conversion: cu_bf16_body.h) */
__global__ static void to_bf16_k(uint16_t *dst, const float *src, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_bf16_from_el(dst, src, i);
}

/* ---- launches -------------------------------------------------------------------------- */

/* The call's shapes with kernel kind's tiles; 0 when there is nothing to do
 * or it cannot run (recorded: HD too wide for the shared memory). */
static int plan(const pw_kernel_io *io, int kind, pw_cu_fa *d) {
  const pw_node *n = io->n;
  *d = pw_cu_fa_make(io->B, n->T, n->OC, n->NH, n->NKV, io->bscratch != NULL);
  /* the node's mask, as kernels.c's mask_of */
  d->causal = !n->bidir, d->window = n->window, d->pad = n->pad;
  d->tok = n->in[1] >= 0 ? (const int32_t *)io->in1 : NULL;
  if (d->B <= 0 || d->T <= 0 || d->NH <= 0 || d->HD <= 0) return 0;
  if (pw_cu_fa_plan(d, kind)) {
    char where[160];
    snprintf(where, sizeof where, "attention_tiled: head width %d: even 16 x 16 tiles need more than %u bytes of "
             "shared memory", d->HD, PW_FA_SMEM_MAX);
    pw_cu_note_error((int)cudaErrorInvalidValue, where);
    return 0;
  }
  return 1;
}

/* The kernel may take d's shared memory (over 48 KiB is opt-in). */
static int allow_smem(const void *kernel, const pw_cu_fa *d, const char *where) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)d->bytes);
  if (e == cudaSuccess) return 1;
  (void)cudaGetLastError();
  pw_cu_note_error((int)e, where);
  return 0;
}

/* bf16 programs (bscratch bound: train.precision "bf16"): qkv, and for the
 * backward dout, converted into bscratch first (the CPU's bf16 copies, its
 * layout: qkv's B T W, then dout's B T C; within bf16.h's
 * pw_attention_tiled_bf16_scratch), the tiles staged from them */
static void bf16_copies(const pw_kernel_io *io, pw_cu_fa *d, int backward) {
  if (!d->bf16) return;
  uint16_t *b = (uint16_t *)io->bscratch;
  size_t nq = (size_t)d->B * d->T * d->W, no = (size_t)d->B * d->T * d->C;
  PW_CU_LAUNCH(to_bf16_k, nq, "attention_tiled: qkv to bf16", b, io->in0, nq);
  d->qkvb = b;
  if (backward) {
    PW_CU_LAUNCH(to_bf16_k, no, "attention_tiled: dout to bf16", b + nq, io->dout, no);
    d->doutb = b + nq;
  }
}

/* bf16 when the program binds bscratch (train.precision "bf16") */
extern "C" void pw_cu_attention_tiled_f(const pw_kernel_io *io) {
  pw_cu_fa d;
  if (!plan(io, PW_FA_FWD, &d)) return;
  pw_cu__enter();
  if (!allow_smem((const void *)fwd_k, &d, "attention_tiled forward")) return;
  bf16_copies(io, &d, 0);
  dim3 grid((unsigned)pw_cu_fa_tiles(d.T, d.BQ), (unsigned)d.NH, (unsigned)d.B);
  fwd_k<<<grid, PW_FA_NT, d.bytes>>>(d, io->out, io->aux, io->in0);
  pw_cu__launched("attention_tiled forward");
}

/* reads the forward's out (the node's output) and lse (aux); D (B NH T
 * floats) in the kernels' scratch (pw_cu__scratch) for the two kernels */
extern "C" void pw_cu_attention_tiled_i(const pw_kernel_io *io) {
  pw_cu_fa dq, dkv;
  if (!io->din0 || !plan(io, PW_FA_DQ, &dq) || !plan(io, PW_FA_DKV, &dkv)) return;
  pw_cu__enter();
  if (!allow_smem((const void *)dq_k, &dq, "attention_tiled backward (dq)") ||
      !allow_smem((const void *)dkv_k, &dkv, "attention_tiled backward (dk, dv)"))
    return;
  float *D = (float *)pw_cu__scratch(pw_cu_fa_d_n(&dq) * sizeof(float));
  if (!D) return;
  PW_CU_LAUNCH(d_k, pw_cu_fa_d_n(&dq), "attention_tiled backward (D)", dq, D, io->dout, io->out);
  bf16_copies(io, &dq, 1);
  dq.D = D, dkv.D = D, dkv.qkvb = dq.qkvb, dkv.doutb = dq.doutb;
  dim3 gq((unsigned)pw_cu_fa_tiles(dq.T, dq.BQ), (unsigned)dq.NH, (unsigned)dq.B);
  dq_k<<<gq, PW_FA_NT, dq.bytes>>>(dq, io->din0, io->dout, io->in0, io->aux, io->acc0);
  pw_cu__launched("attention_tiled backward (dq)");
  dim3 gk((unsigned)pw_cu_fa_tiles(dkv.T, dkv.BK), (unsigned)dkv.NKV, (unsigned)dkv.B);
  dkv_k<<<gk, PW_FA_NT, dkv.bytes>>>(dkv, io->din0, io->dout, io->in0, io->aux, io->acc0);
  pw_cu__launched("attention_tiled backward (dk, dv)");
}
