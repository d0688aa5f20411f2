/* cu_attn: rope, attention and attention_tiled on the GPU (cu_attn.h): one
 * thread per output row (a query row forward and for dq, a key row for dk
 * and dv, a rotated pair for rope), the arithmetic in cu_attn_body.h,
 * which the CPU test runs too. Simple rather than fast: serial loops in a
 * thread, no shared memory, no atomics, so every result is the same bits
 * run to run. Launches go to stream 0; each is checked and a failure
 * reported through pw_cu_note_error (the backend's sync returns it).
 *
 * Must never synchronize the device or allocate: the backend does both. */
#include <cuda_runtime.h>

#include "cu_attn.h"
#include "cu_attn_body.h"

/* The backend's record of an asynchronous failure (common/cuda/). */
extern "C" void pw_cu_note_error(int cuda_error, const char *where);

#define THREADS 128

static unsigned blocks_of(size_t n) { return (unsigned)((n + THREADS - 1) / THREADS); }

static void check_launch(const char *where) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) pw_cu_note_error((int)e, where);
}


__device__ static size_t tid(void) { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }

/* ---- kernels: the bodies over [0, n) ---------------------------------------- */

__global__ static void rope_k(float *out, const float *inp, int T, int C, int NH, float base, int backward, int acc,
                              size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_rope_body(out, inp, T, C, NH, base, backward, acc, i);
}

__global__ static void attn_fwd_k(float *out, float *att, const float *qkv, pw_cu_attn_dims d, size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_attn_fwd_body(out, att, qkv, d, i);
}

__global__ static void attn_bwd_q_k(float *dqkv, float *D, const float *dout, const float *qkv, const float *att,
                                    pw_cu_attn_dims d, int acc, size_t p0, size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_attn_bwd_q_body(dqkv, D, dout, qkv, att, d, acc, p0, i);
}

__global__ static void attn_bwd_kv_k(float *dqkv, const float *D, const float *dout, const float *qkv,
                                     const float *att, pw_cu_attn_dims d, int acc, size_t p0, size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_attn_bwd_kv_body(dqkv, D, dout, qkv, att, d, acc, p0, i);
}

__global__ static void tiled_fwd_k(float *out, float *lse, const float *qkv, pw_cu_attn_dims d, size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_attn_tiled_fwd_body(out, lse, qkv, d, i);
}

__global__ static void tiled_bwd_q_k(float *dqkv, const float *dout, const float *out, const float *qkv,
                                     const float *lse, pw_cu_attn_dims d, int acc, size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_attn_tiled_bwd_q_body(dqkv, dout, out, qkv, lse, d, acc, i);
}

__global__ static void tiled_bwd_kv_k(float *dqkv, const float *dout, const float *out, const float *qkv,
                                      const float *lse, pw_cu_attn_dims d, int acc, size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_attn_tiled_bwd_kv_body(dqkv, dout, out, qkv, lse, d, acc, i);
}

/* ---- entry points (kernels.c's rows: qkv's C = 3 x the model width) --------- */

/* Grouped-query heads and Llama-3's rope scaling (model.n_kv_heads,
 * model.rope_scaling) are not in these bodies yet: such a node fails the
 * step with its reason rather than compute a multi-head result. */
static int refused(const pw_node *nd, const char *op) {
  if ((nd->NKV && nd->NKV != nd->NH) || nd->rope_factor) {
    pw_cu_note_error((int)cudaErrorNotSupported,
                     nd->rope_factor ? "rope: Llama-3's rope_scaling is not on the GPU yet (model.rope_scaling)"
                                     : op);
    return 1;
  }
  return 0;
}
#define REFUSE(io, op) \
  if (refused((io)->n, op " on the GPU: grouped-query heads (model.n_kv_heads) are not there yet")) return

static pw_cu_attn_dims dims_of(const pw_kernel_io *io) {
  return pw_cu_attn_dims_make(io->B, io->n->T, io->n->C / 3, io->n->NH);
}

extern "C" void pw_cu_rope_f(const pw_kernel_io *io) {
  REFUSE(io, "rope");
  const pw_node *nd = io->n;
  size_t n = pw_cu_rope_n(io->B, nd->T, nd->C / 3);
  if (!n) return;
  rope_k<<<blocks_of(n), THREADS>>>(io->out, io->in0, nd->T, nd->C / 3, nd->NH, nd->base, 0, 0, n);
  check_launch("rope forward");
}

extern "C" void pw_cu_rope_i(const pw_kernel_io *io) {
  REFUSE(io, "rope");
  const pw_node *nd = io->n;
  size_t n = pw_cu_rope_n(io->B, nd->T, nd->C / 3);
  if (!n) return;
  rope_k<<<blocks_of(n), THREADS>>>(io->din0, io->dout, nd->T, nd->C / 3, nd->NH, nd->base, 1, io->acc0, n);
  check_launch("rope backward");
}

extern "C" void pw_cu_attention_f(const pw_kernel_io *io) {
  REFUSE(io, "attention");
  pw_cu_attn_dims d = dims_of(io);
  size_t n = pw_cu_attn_n(d);
  if (!n) return;
  attn_fwd_k<<<blocks_of(n), THREADS>>>(io->out, io->aux, io->in0, d, n);
  check_launch("attention forward");
}

/* D of a group of pairs in the scratch between the two kernels of the group */
extern "C" void pw_cu_attention_i(const pw_kernel_io *io) {
  REFUSE(io, "attention");
  pw_cu_attn_dims d = dims_of(io);
  size_t pairs = (size_t)d.B * d.NH, g = (size_t)pw_cu_attn_bwd_group(d.T);
  if (!pairs || !d.T) return;
  for (size_t p0 = 0; p0 < pairs; p0 += g) {
    size_t n = (pairs - p0 < g ? pairs - p0 : g) * (size_t)d.T;
    attn_bwd_q_k<<<blocks_of(n), THREADS>>>(io->din0, io->scratch, io->dout, io->in0, io->aux, d, io->acc0, p0, n);
    check_launch("attention backward (dq)");
    attn_bwd_kv_k<<<blocks_of(n), THREADS>>>(io->din0, io->scratch, io->dout, io->in0, io->aux, d, io->acc0, p0,
                                             n);
    check_launch("attention backward (dk, dv)");
  }
}

extern "C" void pw_cu_attention_tiled_f(const pw_kernel_io *io) {
  REFUSE(io, "attention_tiled");
  pw_cu_attn_dims d = dims_of(io);
  size_t n = pw_cu_attn_n(d);
  if (!n) return;
  tiled_fwd_k<<<blocks_of(n), THREADS>>>(io->out, io->aux, io->in0, d, n);
  check_launch("attention_tiled forward");
}

extern "C" void pw_cu_attention_tiled_i(const pw_kernel_io *io) {
  REFUSE(io, "attention_tiled");
  pw_cu_attn_dims d = dims_of(io);
  size_t n = pw_cu_attn_n(d);
  if (!n) return;
  tiled_bwd_q_k<<<blocks_of(n), THREADS>>>(io->din0, io->dout, io->out, io->in0, io->aux, d, io->acc0, n);
  check_launch("attention_tiled backward (dq)");
  tiled_bwd_kv_k<<<blocks_of(n), THREADS>>>(io->din0, io->dout, io->out, io->in0, io->aux, d, io->acc0, n);
  check_launch("attention_tiled backward (dk, dv)");
}
