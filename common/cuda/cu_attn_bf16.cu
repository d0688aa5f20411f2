/* cu_attn_bf16: the plain attention of bf16 programs on the GPU
 * (io->bscratch set: train.precision "bf16"; the tiled one is cu_fa.cu's),
 * forward and backward_input, called from cu_ops.cu's rows: the CPU rows'
 * bf16 semantics (bf16.h's pw_attention_*_bf16; what is rounded where:
 * cu_attn_bf16_body.h), one thread per output row, serial fixed-order
 * sums, no atomics, so every result is the same bits run to run.
 * Grouped-query heads included.
 *
 * The operands are rounded as the bodies read them, so bscratch (the
 * CPU's bf16 copies) is not used; the backward keeps D (B NH T floats) in
 * the kernels' scratch (pw_cu__scratch) between its two kernels. Launches
 * on the legacy default stream, failures recorded (pw_cu__launched) for
 * the backend's sync. */
#include "cu_int.h"

#include "cu_attn_bf16_body.h"

/* ---- kernels: the bodies over [0, n) -------------------------------------------------- */

__global__ static void fwd_k(float *out, float *att, const float *qkv, pw_cu_abf_dims d, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_abf_fwd_body(out, att, qkv, d, i);
}
__global__ static void bwd_q_k(float *dqkv, const float *dout, const float *qkv, pw_cu_abf_saved sv,
                               pw_cu_abf_dims d, int acc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_abf_bwd_q_body(dqkv, dout, qkv, sv, d, acc, i);
}
__global__ static void bwd_kv_k(float *dqkv, const float *dout, const float *qkv, pw_cu_abf_saved sv,
                                pw_cu_abf_dims d, int acc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_abf_bwd_kv_body(dqkv, dout, qkv, sv, d, acc, i);
}

/* ---- entry points (kernels.c's rows: the node's OC the model width) ------------------- */

static pw_cu_abf_dims dims_of(const pw_kernel_io *io) {
  const pw_node *n = io->n;
  return pw_cu_abf_dims_make(io->B, n->T, n->OC, n->NH, n->NKV);
}

extern "C" void pw_cu__attention_bf16_f(const pw_kernel_io *io) {
  pw_cu_abf_dims d = dims_of(io);
  pw_cu__enter();
  PW_CU_LAUNCH(fwd_k, pw_cu_abf_q_n(d), "attention forward (bf16)", io->out, io->aux, io->in0, d, pw_cu_abf_q_n(d));
}

/* the q kernel leaves D for the kv kernel */
extern "C" void pw_cu__attention_bf16_i(const pw_kernel_io *io) {
  pw_cu_abf_dims d = dims_of(io);
  if (!io->din0 || !pw_cu_abf_q_n(d)) return;
  pw_cu__enter();
  pw_cu_abf_saved sv = {io->aux, NULL};
  if (!(sv.D = (float *)pw_cu__scratch(pw_cu_abf_q_n(d) * sizeof(float)))) return;
  PW_CU_LAUNCH(bwd_q_k, pw_cu_abf_q_n(d), "attention backward dq (bf16)", io->din0, io->dout, io->in0, sv, d,
               io->acc0, pw_cu_abf_q_n(d));
  PW_CU_LAUNCH(bwd_kv_k, pw_cu_abf_kv_n(d), "attention backward dk, dv (bf16)", io->din0, io->dout, io->in0, sv, d,
               io->acc0, pw_cu_abf_kv_n(d));
}
