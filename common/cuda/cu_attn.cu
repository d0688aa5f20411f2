/* cu_attn: rope and the plain attention on the GPU (cu_attn.h; the tiled
 * one is cu_fa.cu's): one thread per output row (a query row forward and
 * for dq, a key row for dk and dv, a rotated pair for rope), the
 * arithmetic in cu_attn_body.h,
 * which the CPU test runs too. Simple rather than fast: serial loops in a
 * thread, no shared memory, no atomics, so every result is the same bits
 * run to run; grouped-query heads and Llama-3's rope scaling as the CPU's.
 * Launches go to stream 0; each is checked and a failure
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

__global__ static void rope_k(float *out, const float *inp, int T, int NH, int NKV, int HD, pw_rope rp, int backward,
                              int acc, size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_rope_body(out, inp, T, NH, NKV, HD, rp, backward, acc, i);
}

__global__ static void attn_fwd_k(float *out, float *att, const float *qkv, pw_cu_attn_dims d, size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_attn_fwd_body(out, att, qkv, d, i);
}

__global__ static void attn_bwd_q_k(float *dqkv, const float *dout, const float *out, const float *qkv,
                                    const float *att, pw_cu_attn_dims d, int acc, size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_attn_bwd_q_body(dqkv, dout, out, qkv, att, d, acc, i);
}

__global__ static void attn_bwd_kv_k(float *dqkv, const float *dout, const float *out, const float *qkv,
                                     const float *att, pw_cu_attn_dims d, int acc, size_t n) {
  size_t i = tid();
  if (i < n) pw_cu_attn_bwd_kv_body(dqkv, dout, out, qkv, att, d, acc, i);
}

/* ---- entry points (kernels.c's rows) ------------------------------------------- */

static int nkv_of(const pw_node *nd) { return nd->NKV > 0 ? nd->NKV : nd->NH; }

/* an attention node: OC its query width NH HD, C its qkv row (with kv heads) */
static pw_cu_attn_dims dims_of(const pw_kernel_io *io) {
  return pw_cu_attn_dims_make(io->B, io->n->T, io->n->OC, io->n->NH, nkv_of(io->n));
}

/* a rope node's rows are NH + 2 NKV heads of HD (kernels.c's rope_of) */
static void rope(const pw_kernel_io *io, float *out, const float *inp, int backward, int acc) {
  const pw_node *nd = io->n;
  int nkv = nkv_of(nd), HD = nd->C / (nd->NH + 2 * nkv);
  pw_rope rp = {nd->base, nd->rope_factor, nd->rope_low_freq, nd->rope_high_freq, nd->rope_orig_max_pos};
  size_t n = pw_cu_rope_n(io->B, nd->T, nd->NH, nkv, HD);
  if (!n) return;
  rope_k<<<blocks_of(n), THREADS>>>(out, inp, nd->T, nd->NH, nkv, HD, rp, backward, acc, n);
  check_launch(backward ? "rope backward" : "rope forward");
}

extern "C" void pw_cu_rope_f(const pw_kernel_io *io) { rope(io, io->out, io->in0, 0, 0); }
extern "C" void pw_cu_rope_i(const pw_kernel_io *io) { rope(io, io->din0, io->dout, 1, io->acc0); }

extern "C" void pw_cu_attention_f(const pw_kernel_io *io) {
  pw_cu_attn_dims d = dims_of(io);
  size_t n = pw_cu_attn_n(d);
  if (!n) return;
  attn_fwd_k<<<blocks_of(n), THREADS>>>(io->out, io->aux, io->in0, d, n);
  check_launch("attention forward");
}

/* dq per query row, then dk and dv per key row: D_i = dout_i . out_i in
 * both (the forward's out is the node's value), so nothing passes between
 * the two kernels */
extern "C" void pw_cu_attention_i(const pw_kernel_io *io) {
  pw_cu_attn_dims d = dims_of(io);
  size_t n = pw_cu_attn_n(d), nkv = pw_cu_attn_kv_n(d);
  if (!n) return;
  attn_bwd_q_k<<<blocks_of(n), THREADS>>>(io->din0, io->dout, io->out, io->in0, io->aux, d, io->acc0, n);
  check_launch("attention backward (dq)");
  attn_bwd_kv_k<<<blocks_of(nkv), THREADS>>>(io->din0, io->dout, io->out, io->in0, io->aux, d, io->acc0, nkv);
  check_launch("attention backward (dk, dv)");
}
