/* rowmm: a frozen linear layer's product over a few rows, where every
 * row's result is the same bits whatever rows it is multiplied with —
 * what batched decoding needs (decode.h: a served sequence's tokens must
 * not depend on its batch-mates).
 *
 *   out (N, OC) = inp (N, C) @ w^T + bias,   w (OC, C) row-major, bias (OC)
 *
 * OpenBLAS cannot give that property cheaply: sgemm's rounding of a row
 * depends on how many rows it multiplies and where the row sits, and it
 * packs the whole weight matrix on every call (slower per row than sgemv
 * at 2-8 rows). oneDNN's f32 matmul with the weights reordered once into
 * its blocked format runs a kernel per row count whose summation order, on
 * AVX-512 hosts, does not depend on the row count or position, and is
 * 1.1-1.6x (1 row) and 4.4-5.3x (8 rows) faster per row than sgemv at
 * d256 shapes (one thread; the commit that added it has the figures).
 *
 * Two paths, chosen per rowmm at create:
 *   - "onednn:<impl>": the weights packed once; a call runs in chunks of
 *     at most PW_ROWMM_MAX_M rows, one primitive per chunk size. Taken only
 *     if the PROBE at create passes: random weights of the layer's shape
 *     packed, random rows multiplied at every chunk size 1..PW_ROWMM_MAX_M,
 *     each row's result compared bit for bit with the row alone. Summation
 *     order does not depend on the data, so random data catches any kernel
 *     whose order changes with the row count or position (AVX2 hosts'
 *     gemm:jit, where one row differs from two); the layer's own weights
 *     might not (zeros agree under any order). Then the layer's are packed.
 *   - "sgemv": one OpenBLAS sgemv per row, reading w and bias in place:
 *     when the probe fails, oneDNN has no fast kernel, PW_CPU is below
 *     avx512 (oneDNN's kernels are capped at that level too), or a test
 *     forced it. Deterministic too, slower from 2 rows on.
 * Either way a row's result depends only on the row (and the host kind and
 * path): pw_rowmm_run over N rows equals N calls over one row each.
 *
 * Weights are read at create (packed) and must not change afterwards:
 * make a new rowmm for new weights. One thread, not thread-safe: one call
 * at a time per rowmm. */
#ifndef PW_ROWMM_H
#define PW_ROWMM_H

#include "errors.h"

#define PW_ROWMM_MAX_M 16 /* rows per oneDNN call: the chunk sizes probed */

typedef struct pw_rowmm pw_rowmm;

/* w (OC, C), bias (OC) or NULL; C, OC >= 1. Never fails for a probe that
 * fails (that is the sgemv path); PW_ENOMEM, or PW_EINVAL for bad sizes. */
PW_MUST_CHECK int pw_rowmm_create(const float *w, const float *bias, int C, int OC, pw_rowmm **out, pw_err *err);
void pw_rowmm_free(pw_rowmm *r);

/* out (N, OC) = inp (N, C) @ w^T + bias, any N >= 0. */
void pw_rowmm_run(pw_rowmm *r, float *out, const float *inp, int N);

/* 1 on the oneDNN path (every N is fast), 0 on the sgemv path. */
int pw_rowmm_packed(const pw_rowmm *r);
/* "onednn:brg:avx512_core" or "sgemv". */
const char *pw_rowmm_path(const pw_rowmm *r);

/* Tests: 1 forces the sgemv path on rowmms created from now on, 0 lets
 * the probe decide again. */
void pw_rowmm_force_sgemv(int on);

#endif
