/* cu_int: what cu_core.cu, cu_ops.cu, cu_optim.cu and cu_backend.cu share
 * (nvcc only; internal to common/cuda/).
 *
 * The process's one device (pw_cuda.h) is cu_core.cu's state: its number, the
 * cuBLAS handles, a scratch buffer the kernels grow, and the first failure
 * recorded since it was last reported. Files call one another one way
 * only: backend -> ops, optim -> core, ops -> attn_bf16 (tests/layers checks it). */
#ifndef PW_CU_INT_H
#define PW_CU_INT_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "errors.h"
#include "kernels.h"
#include "backend.h"
#include "pw_cuda.h"

/* ---- cu_core.cu: the device ---------------------------------------------------- */

/* Makes `device` the process's (a context, the cuBLAS handle); 0 or a
 * negative code with err filled (cuda.h's pw_cuda_open). */
int pw_cu__core_open(int device, pw_err *err);
/* Frees what pw_cu__core_open made (after the device finished). */
void pw_cu__core_close(void);
/* This thread's current device made the open one: every entry point calls
 * it first (the runtime's current device is per thread). */
void pw_cu__enter(void);
/* cuBLAS handles: pedantic math (float32 products: no TF32), and the
 * default math (bf16 programs' products: tensor cores) */
cublasHandle_t pw_cu__blas(void);
cublasHandle_t pw_cu__blas_tc(void);
/* A device buffer of at least `bytes`, the kernels' own (xent's row
 * losses, sqnorm's partials): valid until the next call, which may free it
 * once the device has finished with it; NULL (recorded) when out of memory. */
void *pw_cu__scratch(size_t bytes);
/* After a launch: a launch failure recorded under `where`. */
void pw_cu__launched(const char *where);
/* A cuBLAS call's failure recorded under `where`. */
void pw_cu__note_blas(int status, const char *where);
/* After a runtime call returned e: 0 for success; else the failure
 * recorded (the runtime's last error cleared, so no later launch check
 * sees it again) and the first recorded one returned in err. */
int pw_cu__check(cudaError_t e, const char *where, pw_err *err);
/* The first failure recorded since the last report, in err, and forgotten;
 * 0 when none. */
int pw_cu__take_error(pw_err *err);

/* ---- cu_blas.cu: cuBLAS, loaded by pw_cu__core_open (not linked) -------------- */

#define PW_CU_STR_(x) #x
#define PW_CU_STR(x) PW_CU_STR_(x)
typedef struct {
  cublasStatus_t (*create)(cublasHandle_t *h);
  cublasStatus_t (*destroy)(cublasHandle_t h);
  cublasStatus_t (*set_math_mode)(cublasHandle_t h, cublasMath_t mode);
  cublasStatus_t (*set_stream)(cublasHandle_t h, cudaStream_t s);
  cublasStatus_t (*sgemm)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                          const float *alpha, const float *a, int lda, const float *b, int ldb, const float *beta,
                          float *c, int ldc);
  /* bf16 programs' products: bf16 operands, float32 output and accumulation */
  cublasStatus_t (*gemm_ex)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *a, cudaDataType_t at, int lda, const void *b,
                            cudaDataType_t bt, int ldb, const void *beta, void *c, cudaDataType_t ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);
  const char *(*status_name)(cublasStatus_t s);
  const char *(*status_string)(cublasStatus_t s);
} pw_cu_blas_api;
extern pw_cu_blas_api pw_cu__cublas;
/* 0, or PW_EUNAVAIL with err: no libcublas, or one without these entries. */
int pw_cu__blas_load(pw_err *err);

/* ---- cu_ops.cu: the kernel table ------------------------------------------------ */
const pw_kernel *pw_cu__kernel_of(int op);
/* backend.h's round_bf16: x[i] rounded to bf16 in place (bf16.c's rule, bit for bit) */
void pw_cu__round_bf16(const pw_backend *be, float *x, size_t n);

/* ---- cu_attn_bf16.cu: the plain attention of bf16 programs ------------------------ */
/* kernels.c's bf16 rows (io->bscratch set) with device pointers; cu_ops.cu's rows route here */
void pw_cu__attention_bf16_f(const pw_kernel_io *io);
void pw_cu__attention_bf16_i(const pw_kernel_io *io);

/* ---- cu_optim.cu: the optimizer loops (backend.h's) ------------------------------ */
double pw_cu__sqnorm(const pw_backend *be, const float *g, size_t n);
void pw_cu__adamw(const pw_backend *be, float *w, const float *g, float *m, float *v, size_t n, float gs,
                  float decay, float b1, float b2, float eps, float step, float bc2s);
void pw_cu__sgd(const pw_backend *be, float *w, const float *g, float *buf, size_t n, float gs, float wd, float mom,
                float lr, int first);
void pw_cu__add_into(const pw_backend *be, float *out, const float *in, size_t n);
}

/* Launch shape of the one-thread-per-item kernels: n items, 256 a block. */
#define PW_CU_THREADS 256
static inline unsigned pw_cu__blocks(size_t n) { return (unsigned)((n + PW_CU_THREADS - 1) / PW_CU_THREADS); }
__device__ static inline size_t pw_cu__tid(void) { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }

/* kernel<<<>>>(args) over n items (none launched for 0: a zero grid is an
 * error), the launch checked under `where`. */
#define PW_CU_LAUNCH(kernel, n, where, ...)                                 \
  do {                                                                       \
    size_t n_ = (n);                                                         \
    if (n_) {                                                                \
      kernel<<<pw_cu__blocks(n_), PW_CU_THREADS>>>(__VA_ARGS__);             \
      pw_cu__launched(where);                                                \
    }                                                                        \
  } while (0)

#endif
