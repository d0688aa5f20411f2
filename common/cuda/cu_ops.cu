/* cu_ops: the CUDA backend's kernel table — kernels.c's rows with device
 * pointers, the same argument block unpacked the same way (rows, B, the
 * node's C, OC, T, eps; aux layouts: layernorm mean then rstd, rmsnorm
 * rstd, gelu gelu'(in), xent probs).
 *
 * Each row launches one kernel per pass, one thread per output element or
 * row, running a body of cu_ops_body.h (which the CPU test runs too) — but
 * the norms' and cross-entropy's rows, 16 lanes a row (cu_rows_body.h's
 * block programs); the
 * weight gradients that sum a column over the rows (a bias, a norm's
 * weight) in two launches, parts of 64 rows then their totals
 * (cu_ops_body.h's column sums); products go through one cuBLAS sgemm
 * wrapper. No atomics: a run gives the same bits every time. All on the
 * legacy default stream, asynchronous; failures are recorded (cu_core.cu)
 * for the backend's sync.
 *
 * bf16 programs (train.precision "bf16": io->wb set on a linear node,
 * io->bscratch on linear and attention ones) take kernels.c's bf16 rows:
 * a linear's weight converted into io->wb at the forward, x and dout into
 * io->bscratch (kernels.c's XB and DYB), the products by cublasGemmEx on
 * bf16 operands with float32 output and accumulation (bf16.c's
 * pw_gemm_bf16 calls, argument for argument), the bias and its gradient
 * in float32; the plain attention's bf16 rows are cu_attn_bf16.cu's, the
 * tiled one's cu_fa.cu's (FlashAttention-2, tensor cores). The
 * conversions and the backend's round_bf16 are cu_bf16_body.h's integer
 * rounding: the CPU's bits.
 *
 * Not here: rope and the float32 plain attention (cu_attn.cu), the tiled
 * attention (cu_fa.cu), LoRA (no forward: the caller refuses it by name),
 * the KV-cache decode (decode.c runs on the CPU: every decode entry is
 * NULL). */
#include "cu_int.h"
#include "cu_bf16_body.h"
#include "cu_ops_body.h"
#include "cu_rows_body.h"

#include "cu_attn.h"

#define TOK(p) ((const int32_t *)(p))

/* ---- kernels: a body over [0, n) ------------------------------------------------- */

__global__ static void embed_f_k(float *out, const int32_t *tok, const float *wte, int C, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_embed_f_el(out, tok, wte, C, i);
}
__global__ static void embed_w_k(float *dwte, const float *dout, const int32_t *tok, int N, int C) {
  size_t c = pw_cu__tid();
  if (c < (size_t)C) pw_cu_embed_w_col(dwte, dout, tok, N, C, (int)c);
}
__global__ static void posembed_f_k(float *out, const float *inp, const float *wpe, int T, int C, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_posembed_f_el(out, inp, wpe, T, C, i);
}
__global__ static void pass_k(float *din, const float *dout, int acc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_pass_el(din, dout, acc, i);
}
__global__ static void posembed_w_k(float *dwpe, const float *dout, int B, int T, int C, size_t n) {
  size_t j = pw_cu__tid();
  if (j < n) pw_cu_posembed_w_el(dwpe, dout, B, T, C, j);
}
__global__ static void bias_fill_k(float *out, const float *bias, int OC, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_bias_fill_el(out, bias, OC, i);
}
/* the two-stage column sums (cu_ops_body.h): blockIdx.y the part */
__global__ static void bias_w_part_k(float *part, const float *dout, int N, int OC) {
  size_t o = pw_cu__tid();
  if (o < (size_t)OC) pw_cu_bias_w_part(part, dout, N, OC, (int)o, (int)blockIdx.y);
}
__global__ static void col_total_k(float *d, const float *part, int np, int C) {
  size_t c = pw_cu__tid();
  if (c < (size_t)C) pw_cu_col_total(d, part, np, C, (int)c);
}
/* the norms' rows: cu_rows_body.h's block programs, 16 rows a block */
__global__ static void __launch_bounds__(PW_PH_NT) layernorm_f_k(float *out, float *mean, float *rstd,
                                                                 const float *inp, const float *w, const float *b,
                                                                 int N, int C, float eps) {
  __shared__ double sm[4 * PW_PH_NT];
  pw_cu_layernorm_f_block(out, mean, rstd, inp, w, b, N, C, eps, (int)blockIdx.x, (unsigned char *)sm);
}
__global__ static void __launch_bounds__(PW_PH_NT) layernorm_i_k(float *dinp, const float *dout, const float *inp,
                                                                 const float *w, const float *mean,
                                                                 const float *rstd, int N, int C, int acc) {
  __shared__ double sm[4 * PW_PH_NT];
  pw_cu_layernorm_i_block(dinp, dout, inp, w, mean, rstd, N, C, acc, (int)blockIdx.x, (unsigned char *)sm);
}
__global__ static void layernorm_w_part_k(float *pw, float *pb, const float *dout, const float *inp,
                                          const float *mean, const float *rstd, int N, int C) {
  size_t c = pw_cu__tid();
  if (c < (size_t)C) pw_cu_layernorm_w_part(pw, pb, dout, inp, mean, rstd, N, C, (int)c, (int)blockIdx.y);
}
__global__ static void __launch_bounds__(PW_PH_NT) rmsnorm_f_k(float *out, float *rstd, const float *inp,
                                                               const float *w, float off, int N, int C, float eps) {
  __shared__ double sm[4 * PW_PH_NT];
  pw_cu_rmsnorm_f_block(out, rstd, inp, w, off, N, C, eps, (int)blockIdx.x, (unsigned char *)sm);
}
__global__ static void __launch_bounds__(PW_PH_NT) rmsnorm_i_k(float *dinp, const float *dout, const float *inp,
                                                               const float *w, float off, const float *rstd, int N,
                                                               int C, int acc) {
  __shared__ double sm[4 * PW_PH_NT];
  pw_cu_rmsnorm_i_block(dinp, dout, inp, w, off, rstd, N, C, acc, (int)blockIdx.x, (unsigned char *)sm);
}
__global__ static void rmsnorm_w_part_k(float *part, const float *dout, const float *inp, const float *rstd, int N,
                                        int C) {
  size_t c = pw_cu__tid();
  if (c < (size_t)C) pw_cu_rmsnorm_w_part(part, dout, inp, rstd, N, C, (int)c, (int)blockIdx.y);
}
__global__ static void gelu_f_k(float *out, float *dgelu, const float *inp, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_gelu_f_el(out, dgelu, inp, i);
}
__global__ static void gelu_i_k(float *dinp, const float *dout, const float *dgelu, int acc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_gelu_i_el(dinp, dout, dgelu, acc, i);
}
__global__ static void relu_f_k(float *out, const float *inp, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_relu_f_el(out, inp, i);
}
__global__ static void relu_i_k(float *dinp, const float *dout, const float *inp, int acc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_relu_i_el(dinp, dout, inp, acc, i);
}
__global__ static void silu_f_k(float *out, const float *inp, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_silu_f_el(out, inp, i);
}
__global__ static void silu_i_k(float *dinp, const float *dout, const float *inp, int acc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_silu_i_el(dinp, dout, inp, acc, i);
}
__global__ static void swiglu_f_k(float *out, const float *gate, const float *up, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_swiglu_f_el(out, gate, up, i);
}
/* dgate and dup may alias (gate == up): no __restrict__ anywhere here */
__global__ static void qknorm_f_k(float *out, float *rstd, const float *inp, const float *wq, const float *wk, int NH,
                                  int NKV, int HD, float eps, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_qknorm_f_seg(out, rstd, inp, wq, wk, NH, NKV, HD, eps, i);
}
__global__ static void qknorm_i_k(float *dinp, const float *dout, const float *inp, const float *wq, const float *wk,
                                  const float *rstd, int NH, int NKV, int HD, int acc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_qknorm_i_seg(dinp, dout, inp, wq, wk, rstd, NH, NKV, HD, acc, i);
}
__global__ static void qknorm_w_k(float *dwq, float *dwk, const float *dout, const float *inp, const float *rstd, int N,
                                  int NH, int NKV, int HD) {
  size_t c = pw_cu__tid();
  if (c < 2 * (size_t)HD) pw_cu_qknorm_w_col(dwq, dwk, dout, inp, rstd, N, NH, NKV, HD, (int)c);
}
__global__ static void geglu_f_k(float *out, const float *gate, const float *up, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_geglu_f_el(out, gate, up, i);
}
__global__ static void geglu_i_k(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                 int acc_gate, int acc_up, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_geglu_i_el(dgate, dup, dout, gate, up, acc_gate, acc_up, i);
}
__global__ static void scale_f_k(float *out, const float *inp, float sc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_scale_f_el(out, inp, sc, i);
}
__global__ static void scale_i_k(float *dinp, const float *dout, float sc, int acc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_scale_i_el(dinp, dout, sc, acc, i);
}
__global__ static void swiglu_i_k(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                  int acc_gate, int acc_up, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_swiglu_i_el(dgate, dup, dout, gate, up, acc_gate, acc_up, i);
}
__global__ static void add_f_k(float *out, const float *a, const float *b, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_add_f_el(out, a, b, i);
}
__global__ static void add_i_k(float *da, float *db, const float *dout, int acc_a, int acc_b, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_add_i_el(da, db, dout, acc_a, acc_b, i);
}
__global__ static void __launch_bounds__(PW_PH_NT) xent_f_k(float *probs, double *rowloss, const float *logits,
                                                            const int32_t *targets, int N, int V) {
  __shared__ double sm[4 * PW_PH_NT];
  pw_cu_xent_f_block(probs, rowloss, logits, targets, N, V, (int)blockIdx.x, (unsigned char *)sm);
}
/* one thread: the rows' losses in row order */
__global__ static void xent_total_k(float *loss, const double *rowloss, int N, float scale) {
  if (pw_cu__tid() == 0) loss[0] = pw_cu_xent_total(rowloss, N, scale);
}
__global__ static void xent_i_k(float *dlogits, const float *probs, const int32_t *targets, int V, float scale, int acc,
                                size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_xent_i_el(dlogits, probs, targets, V, scale, acc, i);
}
/* one thread: the sum in element order */
__global__ static void mse_f_k(float *loss, const float *pred, const float *target, size_t n, float scale) {
  if (pw_cu__tid() == 0) loss[0] = pw_cu_mse_f(pred, target, n, scale);
}
__global__ static void mse_i_k(float *dpred, const float *pred, const float *target, float scale, int acc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_mse_i_el(dpred, pred, target, scale, acc, i);
}
__global__ static void concat_f_k(float *out, const float *a, const float *b, int C, int D, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_concat_f_el(out, a, b, C, D, i);
}
__global__ static void bf16_round_k(float *x, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_bf16_round_el(x, i);
}
__global__ static void bf16_from_k(uint16_t *dst, const float *src, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_bf16_from_el(dst, src, i);
}
__global__ static void concat_i_k(float *din, const float *dout, int w, int off, int stride, int acc, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_concat_i_el(din, dout, w, off, stride, acc, i);
}

/* ---- helpers ------------------------------------------------------------------------ */

/* The one GEMM: g is pw_sgemm's row-major call already turned into
 * cuBLAS's column-major one (cu_ops_body.h's pw_cu_gemm_of says how; the
 * CPU test checks it against ops.c). beta 0 does not read C. */
static void sgemm(pw_cu_gemm g, float alpha, float beta, const char *where) {
  cublasStatus_t s = pw_cu__cublas.sgemm(pw_cu__blas(), g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 g.m, g.n, g.k, &alpha, g.a, g.lda, g.b, g.ldb, &beta, g.c, g.ldc);
  if (s != CUBLAS_STATUS_SUCCESS) pw_cu__note_blas((int)s, where);
}

/* The parts' scratch of a two-stage column sum: `sets` sets of parts of
 * N rows' C columns; NULL (recorded) when out of memory. */
static float *col_parts(int N, int C, int sets) {
  return (float *)pw_cu__scratch((size_t)sets * (size_t)pw_cu_col_parts(N) * (size_t)C * sizeof(float));
}
/* The parts' grid: a thread per column, blockIdx.y the part. */
static dim3 col_grid(int N, int C) { return dim3(pw_cu__blocks((size_t)C), (unsigned)pw_cu_col_parts(N)); }
/* d (C) += part's np parts, column by column (nothing for d NULL) */
static void col_total(float *d, const float *part, int N, int C, const char *where) {
  if (d) PW_CU_LAUNCH(col_total_k, (size_t)C, where, d, part, pw_cu_col_parts(N), C);
}

static void zero(float *p, size_t n, const char *where) {
  cudaError_t e = cudaMemsetAsync(p, 0, n * sizeof(float), 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    pw_cu_note_error((int)e, where);
  }
}

/* dst[i] = src[i] rounded to bf16 (pw_bf16_from_f32) */
static void to_bf16(pw_bf16 *dst, const float *src, size_t n, const char *where) {
  PW_CU_LAUNCH(bf16_from_k, n, where, dst, src, n);
}

/* bf16.h's pw_gemm_bf16 (row major: C (M,N) (+)= op(A) op(B), bf16
 * operands, float32 C) by cublasGemmEx: float32 accumulation, cuBLAS's
 * default algorithm, on the tensor-core handle (pedantic math would keep
 * bf16 off the tensor cores); turned column-major by the sgemm path's
 * mapping (pw_cu_gemm_of: only the pointers' element type differs). */
static void gemm_bf16(int ta, int tb, int M, int N, int K, const pw_bf16 *A, int lda, const pw_bf16 *B, int ldb,
                      int acc, float *C, int ldc, const char *where) {
  pw_cu_gemm g = pw_cu_gemm_of(ta, tb, M, N, K, (const float *)(const void *)A, lda, (const float *)(const void *)B,
                               ldb, C, ldc);
  float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
  cublasStatus_t s = pw_cu__cublas.gemm_ex(pw_cu__blas_tc(), g.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &alpha, g.a, CUDA_R_16BF,
                                           g.lda, g.b, CUDA_R_16BF, g.ldb, &beta, g.c, CUDA_R_32F, g.ldc,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) pw_cu__note_blas((int)s, where);
}

/* backend.h's round_bf16 */
extern "C" void pw_cu__round_bf16(const pw_backend *be, float *x, size_t n) {
  (void)be;
  pw_cu__enter();
  PW_CU_LAUNCH(bf16_round_k, n, "round_bf16", x, n);
}

/* The plain attention: bf16 programs (bscratch bound) through
 * cu_attn_bf16.cu; the tiled one's rows (cu_fa.cu) take both */
static void attention_f(const pw_kernel_io *io) {
  if (io->bscratch) pw_cu__attention_bf16_f(io);
  else pw_cu_attention_f(io);
}
static void attention_i(const pw_kernel_io *io) {
  if (io->bscratch) pw_cu__attention_bf16_i(io);
  else pw_cu_attention_i(io);
}

static size_t nc(const pw_kernel_io *io) { return (size_t)io->rows * (size_t)io->n->C; } /* elementwise ops */

/* ---- rows (kernels.c's adapters) ------------------------------------------------------ */

static void embed_f(const pw_kernel_io *io) {
  int C = io->n->OC;
  pw_cu__enter();
  PW_CU_LAUNCH(embed_f_k, (size_t)io->rows * (size_t)C, "embed_f", io->out, TOK(io->in0), io->w, C,
               (size_t)io->rows * (size_t)C);
}
static void embed_w(const pw_kernel_io *io) {
  if (!io->dw) return;
  pw_cu__enter();
  PW_CU_LAUNCH(embed_w_k, (size_t)io->n->OC, "embed_w", io->dw, io->dout, TOK(io->in0), io->rows, io->n->OC);
}

static void posembed_f(const pw_kernel_io *io) {
  size_t n = (size_t)io->B * (size_t)io->n->T * (size_t)io->n->C;
  pw_cu__enter();
  PW_CU_LAUNCH(posembed_f_k, n, "posembed_f", io->out, io->in0, io->w, io->n->T, io->n->C, n);
}
static void posembed_i(const pw_kernel_io *io) {
  size_t n = (size_t)io->B * (size_t)io->n->T * (size_t)io->n->C;
  pw_cu__enter();
  PW_CU_LAUNCH(pass_k, n, "posembed_i", io->din0, io->dout, io->acc0, n);
}
static void posembed_w(const pw_kernel_io *io) {
  size_t n = (size_t)io->n->T * (size_t)io->n->C;
  if (!io->dw) return;
  pw_cu__enter();
  PW_CU_LAUNCH(posembed_w_k, n, "posembed_w", io->dw, io->dout, io->B, io->n->T, io->n->C, n);
}

/* bf16 (io->wb set): the operands as bf16, x in bscratch, dout after it (kernels.c's) */
#define XB(io) ((io)->bscratch)
#define DYB(io) ((io)->bscratch + (size_t)(io)->rows * (size_t)(io)->n->C)

/* ops.c's pw_linear_* with its edge cases: no rows or no outputs do
 * nothing; no inputs leave the bias (or zeros, or the old gradient). bf16:
 * bf16.c's pw_linear_*_bf16, the same edge cases. */
static void linear_f(const pw_kernel_io *io) {
  int N = io->rows, C = io->n->C, OC = io->n->OC;
  if (N <= 0 || OC <= 0) return;
  pw_cu__enter();
  size_t n = (size_t)N * (size_t)OC;
  float beta = 0.0f;
  if (io->b) { /* torch.addmm: out starts as the broadcast bias, the GEMM adds to it */
    PW_CU_LAUNCH(bias_fill_k, n, "linear_f: bias", io->out, io->b, OC, n);
    beta = 1.0f;
  }
  if (C <= 0) {
    if (!io->b) zero(io->out, n, "linear_f: zero");
    return;
  }
  if (io->wb) { /* out (N,OC) (+)= x (N,C) @ w^T, w (OC,C) */
    to_bf16(io->wb, io->w, (size_t)OC * (size_t)C, "linear_f: w to bf16");
    to_bf16(XB(io), io->in0, (size_t)N * (size_t)C, "linear_f: x to bf16");
    gemm_bf16(0, 1, N, OC, C, XB(io), C, io->wb, C, io->b != NULL, io->out, OC, "linear_f: cublasGemmEx");
    return;
  }
  sgemm(pw_cu_linear_f_gemm(io->out, io->in0, io->w, N, C, OC), 1.0f, beta, "linear_f: cublasSgemm");
}
/* dy_ready: bf16 programs' dout already in DYB (linear_b's W made it) */
static void linear_i_dy(const pw_kernel_io *io, int dy_ready) {
  int N = io->rows, C = io->n->C, OC = io->n->OC;
  if (N <= 0 || C <= 0 || !io->din0) return;
  pw_cu__enter();
  if (OC <= 0) {
    if (!io->acc0) zero(io->din0, (size_t)N * (size_t)C, "linear_i: zero");
    return;
  }
  if (io->wb) { /* dinp (N,C) (+)= dout (N,OC) @ w (OC,C), w as the forward converted it */
    if (!dy_ready) to_bf16(DYB(io), io->dout, (size_t)N * (size_t)OC, "linear_i: dout to bf16");
    gemm_bf16(0, 0, N, C, OC, DYB(io), OC, io->wb, C, io->acc0, io->din0, C, "linear_i: cublasGemmEx");
    return;
  }
  sgemm(pw_cu_linear_i_gemm(io->din0, io->dout, io->w, N, C, OC), 1.0f, io->acc0 ? 1.0f : 0.0f,
        "linear_i: cublasSgemm");
}
static void linear_i(const pw_kernel_io *io) { linear_i_dy(io, 0); }
static void linear_w(const pw_kernel_io *io) {
  int N = io->rows, C = io->n->C, OC = io->n->OC;
  if (N <= 0 || OC <= 0) return;
  pw_cu__enter();
  if (C > 0 && io->dw && io->wb) { /* dw (OC,C) += dout^T (OC,N) @ x (N,C) */
    to_bf16(DYB(io), io->dout, (size_t)N * (size_t)OC, "linear_w: dout to bf16");
    to_bf16(XB(io), io->in0, (size_t)N * (size_t)C, "linear_w: x to bf16");
    gemm_bf16(1, 0, OC, C, N, DYB(io), OC, XB(io), C, 1, io->dw, C, "linear_w: cublasGemmEx");
  } else if (C > 0 && io->dw) sgemm(pw_cu_linear_w_gemm(io->dw, io->dout, io->in0, N, C, OC), 1.0f, 1.0f, "linear_w: cublasSgemm");
  float *part;
  if (io->db && (part = col_parts(N, OC, 1))) {
    bias_w_part_k<<<col_grid(N, OC), PW_CU_THREADS>>>(part, io->dout, N, OC);
    pw_cu__launched("linear_w: bias parts");
    col_total(io->db, part, N, OC, "linear_w: bias");
  }
}
/* W then I, as kernels.c's (bf16: dout converted once, by W when it
 * converts it, for both products: bf16.c's once) */
static void linear_b(const pw_kernel_io *io) {
  linear_w(io);
  linear_i_dy(io, io->wb && io->dw && io->rows > 0 && io->n->C > 0 && io->n->OC > 0);
}

/* kernel<<<>>>(args) over the norms' row blocks (none for no rows) */
#define PW_CU_ROWS(kernel, N, where, ...)                              \
  do {                                                                  \
    if ((N) > 0) {                                                      \
      kernel<<<pw_cu_rows_blocks(N), PW_PH_NT>>>(__VA_ARGS__);          \
      pw_cu__launched(where);                                           \
    }                                                                   \
  } while (0)

static void layernorm_f(const pw_kernel_io *io) {
  int N = io->rows;
  pw_cu__enter();
  PW_CU_ROWS(layernorm_f_k, N, "layernorm_f", io->out, io->aux, io->aux + N, io->in0, io->w, io->b, N, io->n->C,
             io->n->eps);
}
static void layernorm_i(const pw_kernel_io *io) {
  int N = io->rows;
  if (!io->din0) return;
  pw_cu__enter();
  PW_CU_ROWS(layernorm_i_k, N, "layernorm_i", io->din0, io->dout, io->in0, io->w, io->aux, io->aux + N, N, io->n->C,
             io->acc0);
}
static void layernorm_w(const pw_kernel_io *io) {
  int N = io->rows, C = io->n->C;
  float *part;
  if ((!io->dw && !io->db) || N <= 0 || C <= 0) return;
  pw_cu__enter();
  if (!(part = col_parts(N, C, 2))) return;
  float *pb = part + (size_t)pw_cu_col_parts(N) * (size_t)C;
  layernorm_w_part_k<<<col_grid(N, C), PW_CU_THREADS>>>(part, pb, io->dout, io->in0, io->aux, io->aux + N, N, C);
  pw_cu__launched("layernorm_w: parts");
  col_total(io->dw, part, N, C, "layernorm_w: w");
  col_total(io->db, pb, N, C, "layernorm_w: b");
}
/* W then I: ops.c's one-pass backward gives the same bits as the two */
static void layernorm_b(const pw_kernel_io *io) {
  layernorm_w(io);
  layernorm_i(io);
}

/* off 0: rmsnorm; the node's base (1) for Gemma's rmsnorm_offset */
static void rmsnorm_fo(const pw_kernel_io *io, float off) {
  pw_cu__enter();
  PW_CU_ROWS(rmsnorm_f_k, io->rows, "rmsnorm_f", io->out, io->aux, io->in0, io->w, off, io->rows, io->n->C,
             io->n->eps);
}
static void rmsnorm_io(const pw_kernel_io *io, float off) {
  if (!io->din0) return;
  pw_cu__enter();
  PW_CU_ROWS(rmsnorm_i_k, io->rows, "rmsnorm_i", io->din0, io->dout, io->in0, io->w, off, io->aux, io->rows,
             io->n->C, io->acc0);
}
static void rmsnorm_f(const pw_kernel_io *io) { rmsnorm_fo(io, 0.0f); }
static void rmsnorm_i(const pw_kernel_io *io) { rmsnorm_io(io, 0.0f); }
static void rmsnorm_offset_f(const pw_kernel_io *io) { rmsnorm_fo(io, io->n->base); }
static void rmsnorm_offset_i(const pw_kernel_io *io) { rmsnorm_io(io, io->n->base); }
static void rmsnorm_w(const pw_kernel_io *io) {
  int N = io->rows, C = io->n->C;
  float *part;
  if (!io->dw || N <= 0 || C <= 0) return;
  pw_cu__enter();
  if (!(part = col_parts(N, C, 1))) return;
  rmsnorm_w_part_k<<<col_grid(N, C), PW_CU_THREADS>>>(part, io->dout, io->in0, io->aux, N, C);
  pw_cu__launched("rmsnorm_w: parts");
  col_total(io->dw, part, N, C, "rmsnorm_w");
}

static void gelu_f(const pw_kernel_io *io) {
  pw_cu__enter();
  PW_CU_LAUNCH(gelu_f_k, nc(io), "gelu_f", io->out, io->aux, io->in0, nc(io));
}
static void gelu_i(const pw_kernel_io *io) {
  if (!io->din0) return;
  pw_cu__enter();
  PW_CU_LAUNCH(gelu_i_k, nc(io), "gelu_i", io->din0, io->dout, io->aux, io->acc0, nc(io));
}
static void relu_f(const pw_kernel_io *io) {
  pw_cu__enter();
  PW_CU_LAUNCH(relu_f_k, nc(io), "relu_f", io->out, io->in0, nc(io));
}
static void relu_i(const pw_kernel_io *io) {
  if (!io->din0) return;
  pw_cu__enter();
  PW_CU_LAUNCH(relu_i_k, nc(io), "relu_i", io->din0, io->dout, io->in0, io->acc0, nc(io));
}
static void silu_f(const pw_kernel_io *io) {
  pw_cu__enter();
  PW_CU_LAUNCH(silu_f_k, nc(io), "silu_f", io->out, io->in0, nc(io));
}
static void silu_i(const pw_kernel_io *io) {
  if (!io->din0) return;
  pw_cu__enter();
  PW_CU_LAUNCH(silu_i_k, nc(io), "silu_i", io->din0, io->dout, io->in0, io->acc0, nc(io));
}
static void swiglu_f(const pw_kernel_io *io) {
  pw_cu__enter();
  PW_CU_LAUNCH(swiglu_f_k, nc(io), "swiglu_f", io->out, io->in0, io->in1, nc(io));
}
/* ops.c writes both gradients (the program binds both) */
static void swiglu_i(const pw_kernel_io *io) {
  if (!io->din0 || !io->din1) {
    pw_cu_note_error((int)cudaErrorInvalidValue, "swiglu_i: a NULL input gradient");
    return;
  }
  pw_cu__enter();
  PW_CU_LAUNCH(swiglu_i_k, nc(io), "swiglu_i", io->din0, io->din1, io->dout, io->in0, io->in1, io->acc0, io->acc1,
               nc(io));
}
/* qk_norm: w is q's norm weight, b k's (HD each); aux rstd (rows, NH + NKV) */
static int qk_nkv(const pw_node *n) { return n->NKV > 0 ? n->NKV : n->NH; }
static int qk_hd(const pw_node *n) { return n->C / (n->NH + 2 * qk_nkv(n)); }
static void qknorm_f(const pw_kernel_io *io) {
  const pw_node *nd = io->n;
  size_t segs = (size_t)io->rows * (size_t)(nd->NH + 2 * qk_nkv(nd));
  pw_cu__enter();
  PW_CU_LAUNCH(qknorm_f_k, segs, "qk_norm_f", io->out, io->aux, io->in0, io->w, io->b, nd->NH, qk_nkv(nd), qk_hd(nd),
               nd->eps, segs);
}
static void qknorm_i(const pw_kernel_io *io) {
  if (!io->din0) return;
  const pw_node *nd = io->n;
  size_t segs = (size_t)io->rows * (size_t)(nd->NH + 2 * qk_nkv(nd));
  pw_cu__enter();
  PW_CU_LAUNCH(qknorm_i_k, segs, "qk_norm_i", io->din0, io->dout, io->in0, io->w, io->b, io->aux, nd->NH, qk_nkv(nd),
               qk_hd(nd), io->acc0, segs);
}
static void qknorm_w(const pw_kernel_io *io) {
  if (!io->dw && !io->db) return;
  const pw_node *nd = io->n;
  pw_cu__enter();
  PW_CU_LAUNCH(qknorm_w_k, 2 * (size_t)qk_hd(nd), "qk_norm_w", io->dw, io->db, io->dout, io->in0, io->aux, io->rows,
               nd->NH, qk_nkv(nd), qk_hd(nd));
}
static void geglu_f(const pw_kernel_io *io) {
  pw_cu__enter();
  PW_CU_LAUNCH(geglu_f_k, nc(io), "geglu_f", io->out, io->in0, io->in1, nc(io));
}
static void geglu_i(const pw_kernel_io *io) {
  if (!io->din0 || !io->din1) {
    pw_cu_note_error((int)cudaErrorInvalidValue, "geglu_i: a NULL input gradient");
    return;
  }
  pw_cu__enter();
  PW_CU_LAUNCH(geglu_i_k, nc(io), "geglu_i", io->din0, io->din1, io->dout, io->in0, io->in1, io->acc0, io->acc1,
               nc(io));
}
static void scale_f(const pw_kernel_io *io) {
  pw_cu__enter();
  PW_CU_LAUNCH(scale_f_k, nc(io), "scale_f", io->out, io->in0, io->n->base, nc(io));
}
static void scale_i(const pw_kernel_io *io) {
  if (!io->din0) return;
  pw_cu__enter();
  PW_CU_LAUNCH(scale_i_k, nc(io), "scale_i", io->din0, io->dout, io->n->base, io->acc0, nc(io));
}
static void add_f(const pw_kernel_io *io) {
  pw_cu__enter();
  PW_CU_LAUNCH(add_f_k, nc(io), "add_f", io->out, io->in0, io->in1, nc(io));
}
static void add_i(const pw_kernel_io *io) {
  if (!io->din0 || !io->din1) {
    pw_cu_note_error((int)cudaErrorInvalidValue, "add_i: a NULL input gradient");
    return;
  }
  pw_cu__enter();
  PW_CU_LAUNCH(add_i_k, nc(io), "add_i", io->din0, io->din1, io->dout, io->acc0, io->acc1, nc(io));
}

/* The loss to io->out[0] on the device: each row's -log p in double in
 * the scratch, then one thread adds them in row order (ops.c's order). */
static void xent_f(const pw_kernel_io *io) {
  int N = io->rows, V = io->n->C;
  pw_cu__enter();
  double *rowloss = (double *)pw_cu__scratch(((size_t)N + 1) * sizeof(double));
  if (!rowloss) return;
  PW_CU_ROWS(xent_f_k, N, "xent_f", io->aux, rowloss, io->in0, TOK(io->in1), N, V);
  PW_CU_LAUNCH(xent_total_k, 1, "xent_f: total", io->out, rowloss, N, io->loss_scale);
}
static void xent_i(const pw_kernel_io *io) {
  size_t n = (size_t)io->rows * (size_t)io->n->C;
  if (!io->din0) return;
  pw_cu__enter();
  PW_CU_LAUNCH(xent_i_k, n, "xent_i", io->din0, io->aux, TOK(io->in1), io->n->C, io->loss_scale, io->acc0, n);
}
static void mse_f(const pw_kernel_io *io) {
  pw_cu__enter();
  PW_CU_LAUNCH(mse_f_k, 1, "mse_f", io->out, io->in0, io->in1, nc(io), io->loss_scale);
}
static void mse_i(const pw_kernel_io *io) {
  if (!io->din0) return;
  pw_cu__enter();
  PW_CU_LAUNCH(mse_i_k, nc(io), "mse_i", io->din0, io->in0, io->in1, io->loss_scale, io->acc0, nc(io));
}

/* concat: row r of out is row r of a (C floats), then of b (OC - C) */
static void concat_f(const pw_kernel_io *io) {
  int C = io->n->C, D = io->n->OC - io->n->C;
  size_t n = (size_t)io->rows * (size_t)io->n->OC;
  pw_cu__enter();
  PW_CU_LAUNCH(concat_f_k, n, "concat_f", io->out, io->in0, io->in1, C, D, n);
}
static void concat_i(const pw_kernel_io *io) {
  int C = io->n->C, OC = io->n->OC;
  pw_cu__enter();
  if (io->din0)
    PW_CU_LAUNCH(concat_i_k, (size_t)io->rows * (size_t)C, "concat_i: a", io->din0, io->dout, C, 0, OC, io->acc0,
                 (size_t)io->rows * (size_t)C);
  if (io->din1)
    PW_CU_LAUNCH(concat_i_k, (size_t)io->rows * (size_t)(OC - C), "concat_i: b", io->din1, io->dout, OC - C, C, OC,
                 io->acc1, (size_t)io->rows * (size_t)(OC - C));
}

/* forward, backward_input, backward_weight, backward, decode (none: decode.c is the CPU's) */
static const pw_kernel table[PW_OP__COUNT] = {
    [PW_OP_EMBED] = {embed_f, NULL, embed_w, NULL, NULL},
    [PW_OP_POSEMBED] = {posembed_f, posembed_i, posembed_w, NULL, NULL},
    [PW_OP_LINEAR] = {linear_f, linear_i, linear_w, linear_b, NULL},
    [PW_OP_LAYERNORM] = {layernorm_f, layernorm_i, layernorm_w, layernorm_b, NULL},
    [PW_OP_RMSNORM] = {rmsnorm_f, rmsnorm_i, rmsnorm_w, NULL, NULL},
    [PW_OP_GELU] = {gelu_f, gelu_i, NULL, NULL, NULL},
    [PW_OP_RELU] = {relu_f, relu_i, NULL, NULL, NULL},
    [PW_OP_SILU] = {silu_f, silu_i, NULL, NULL, NULL},
    [PW_OP_SWIGLU] = {swiglu_f, swiglu_i, NULL, NULL, NULL},
    [PW_OP_ADD] = {add_f, add_i, NULL, NULL, NULL},
    [PW_OP_ROPE] = {pw_cu_rope_f, pw_cu_rope_i, NULL, NULL, NULL},
    [PW_OP_ATTENTION] = {attention_f, attention_i, NULL, NULL, NULL},
    [PW_OP_XENT] = {xent_f, xent_i, NULL, NULL, NULL},
    [PW_OP_MSE] = {mse_f, mse_i, NULL, NULL, NULL},
    [PW_OP_LORA] = {NULL, NULL, NULL, NULL, NULL}, /* not on the GPU: the caller refuses it by name */
    [PW_OP_CONCAT] = {concat_f, concat_i, NULL, NULL, NULL},
    [PW_OP_ATTENTION_TILED] = {pw_cu_attention_tiled_f, pw_cu_attention_tiled_i, NULL, NULL, NULL},
    [PW_OP_QKNORM] = {qknorm_f, qknorm_i, qknorm_w, NULL, NULL},
    [PW_OP_GEGLU] = {geglu_f, geglu_i, NULL, NULL, NULL},
    [PW_OP_SCALE] = {scale_f, scale_i, NULL, NULL, NULL},
    [PW_OP_RMSNORM_OFFSET] = {rmsnorm_offset_f, rmsnorm_offset_i, rmsnorm_w, NULL, NULL},
};

extern "C" const pw_kernel *pw_cu__kernel_of(int op) { return &table[op]; }
