/* cu_attn: the CUDA kernels of the ops rope, attention (cu_attn.cu) and
 * attention_tiled (cu_fa.cu), forward and backward_input, called through
 * the op table's argument block (kernels.h) with device pointers: the same
 * contracts as the CPU rows of kernels.c (ops.h). rope and attention take
 * float32 products (bscratch, the bf16 programs' operands, is not read;
 * cu_ops.cu routes bf16 programs' attention to cu_attn_bf16.cu);
 * attention_tiled takes bf16 products where bscratch is bound (bf16.h's
 * pw_attention_tiled_*_bf16 semantics; bscratch holds the bf16 copies of
 * qkv and dout, as the CPU's), float32 ones where it is NULL. Queued on the legacy default stream (stream 0),
 * asynchronous; a failed launch is reported through pw_cu_note_error.
 * attention's backward keeps D (T floats per (b, h), in groups of at most
 * T heads) in io->scratch, within ops.h's T x T floats; attention_tiled's
 * keeps D (B NH T floats) in the kernels' own scratch (pw_cu__scratch). */
#ifndef PW_CU_ATTN_H
#define PW_CU_ATTN_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

void pw_cu_rope_f(const pw_kernel_io *io);
void pw_cu_rope_i(const pw_kernel_io *io);
void pw_cu_attention_f(const pw_kernel_io *io);
void pw_cu_attention_i(const pw_kernel_io *io);
void pw_cu_attention_tiled_f(const pw_kernel_io *io);
void pw_cu_attention_tiled_i(const pw_kernel_io *io);

#ifdef __cplusplus
}
#endif

#endif
