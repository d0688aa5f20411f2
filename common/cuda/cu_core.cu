/* cu_core: the process's one CUDA device — its number, the cuBLAS handles,
 * the kernels' scratch, and the record of the first failure (cu_int.h).
 *
 * Kernel launches and cuBLAS calls are asynchronous and return nothing to
 * their callers (a kernel row is void): a failure is recorded here, the
 * first one kept with where it happened, and the backend's next sync,
 * download, upload, copy or zero reports it.
 *
 * Must never call into cu_ops, cu_optim or cu_backend (they call it). */
#include <stdio.h>
#include <string.h>

#include "cu_int.h"

static struct {
  int open;               /* pw_cu__core_open calls not yet closed */
  int device;
  cublasHandle_t blas;    /* pedantic: float32 as written, no TF32 */
  cublasHandle_t blas_tc; /* default math: bf16 products on the tensor cores */
  void *scratch;          /* device memory, scratch_cap bytes */
  size_t scratch_cap;
  int err_code;           /* the first failure since the last report (a PW_E code), 0 none */
  char err_msg[320];
} g;

/* The runtime's last error cleared: a failure already handled must not
 * show up again in the next launch's check. */
static void clear_last(void) { (void)cudaGetLastError(); }

static void note(int code, const char *fmt_where, const char *name, const char *what) {
  if (g.err_code) return;
  g.err_code = code;
  snprintf(g.err_msg, sizeof g.err_msg, "cuda:%d: %s: %s (%s)", g.device, fmt_where ? fmt_where : "?", what, name);
}

extern "C" void pw_cu_note_error(int cuda_error, const char *where) {
  cudaError_t e = (cudaError_t)cuda_error;
  if (e == cudaSuccess) return;
  note(e == cudaErrorMemoryAllocation ? PW_ENOMEM : PW_EIO, where, cudaGetErrorName(e), cudaGetErrorString(e));
}

extern "C" void pw_cu__note_blas(int status, const char *where) {
  cublasStatus_t s = (cublasStatus_t)status;
  if (s == CUBLAS_STATUS_SUCCESS) return;
  note(s == CUBLAS_STATUS_ALLOC_FAILED ? PW_ENOMEM : PW_EIO, where, pw_cu__cublas.status_name(s),
       pw_cu__cublas.status_string(s));
  clear_last(); /* a failed cuBLAS launch may leave the runtime's error set too */
}

extern "C" void pw_cu__launched(const char *where) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) pw_cu_note_error((int)e, where);
}

extern "C" int pw_cu__take_error(pw_err *err) {
  if (!g.err_code) return 0;
  int code = g.err_code;
  g.err_code = 0;
  return pw_err_set(err, code, "cuda", "%s", g.err_msg);
}

extern "C" int pw_cu__check(cudaError_t e, const char *where, pw_err *err) {
  if (e == cudaSuccess) return 0;
  clear_last();
  pw_cu_note_error((int)e, where);
  return pw_cu__take_error(err);
}

extern "C" void pw_cu__enter(void) {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess || d != g.device) {
    cudaError_t e = cudaSetDevice(g.device);
    if (e != cudaSuccess) {
      clear_last();
      pw_cu_note_error((int)e, "cudaSetDevice");
    }
  }
}

extern "C" cublasHandle_t pw_cu__blas(void) { return g.blas; }
extern "C" cublasHandle_t pw_cu__blas_tc(void) { return g.blas_tc; }

extern "C" void *pw_cu__scratch(size_t bytes) {
  if (bytes <= g.scratch_cap) return g.scratch;
  size_t cap = g.scratch_cap ? g.scratch_cap : 1 << 20;
  while (cap < bytes) cap *= 2;
  if (g.scratch) cudaFree(g.scratch); /* waits for the kernels that used it */
  g.scratch = NULL;
  g.scratch_cap = 0;
  cudaError_t e = cudaMalloc(&g.scratch, cap);
  if (e != cudaSuccess) {
    clear_last();
    g.scratch = NULL;
    pw_cu_note_error((int)e, "the kernels' scratch");
    return NULL;
  }
  g.scratch_cap = cap;
  return g.scratch;
}

extern "C" int pw_cu__core_open(int device, pw_err *err) {
  if (g.open && device == g.device) {
    g.open++;
    return 0;
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    clear_last();
    return pw_err_set(err, PW_EUNAVAIL, "cuda", "cuda:%d: no CUDA device visible: %s (%s)", device,
                      cudaGetErrorString(e), cudaGetErrorName(e));
  }
  if (count == 0) return pw_err_set(err, PW_EUNAVAIL, "cuda", "cuda:%d: no CUDA device visible", device);
  if (device < 0 || device >= count)
    return pw_err_set(err, PW_ENOENT, "cuda", "cuda:%d: no such device (%d visible: cuda:0 .. cuda:%d)", device, count,
                      count - 1);
  if (g.open)
    return pw_err_set(err, PW_ECONFLICT, "cuda", "cuda:%d: this process already uses cuda:%d (one device a process)",
                      device, g.device);
  memset(&g, 0, sizeof g);
  g.device = device;
  if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaFree(0)) != cudaSuccess) { /* the context, now */
    clear_last();
    return pw_err_set(err, e == cudaErrorMemoryAllocation ? PW_ENOMEM : PW_EIO, "cuda", "cuda:%d: does not start: %s (%s)",
                      device, cudaGetErrorString(e), cudaGetErrorName(e));
  }
  int rc = pw_cu__blas_load(err);
  if (rc) return rc;
  const pw_cu_blas_api *b = &pw_cu__cublas;
  /* Two handles: pedantic math for float32 (the products as written, no
   * TF32: the equality tests), and the default math for the bf16
   * programs' cublasGemmEx, whose pedantic compute type keeps bf16 off the
   * tensor cores (cuBLAS: "standardized arithmetic for all phases"). The
   * default math does not turn TF32 on for float32 either, but float32
   * never goes through that handle. */
  cublasStatus_t s = b->create(&g.blas);
  if (s == CUBLAS_STATUS_SUCCESS) s = b->set_math_mode(g.blas, CUBLAS_PEDANTIC_MATH);
  if (s == CUBLAS_STATUS_SUCCESS) s = b->set_stream(g.blas, 0); /* the legacy default stream */
  if (s == CUBLAS_STATUS_SUCCESS) s = b->create(&g.blas_tc);
  if (s == CUBLAS_STATUS_SUCCESS) s = b->set_math_mode(g.blas_tc, CUBLAS_DEFAULT_MATH);
  if (s == CUBLAS_STATUS_SUCCESS) s = b->set_stream(g.blas_tc, 0);
  if (s != CUBLAS_STATUS_SUCCESS) {
    if (g.blas) b->destroy(g.blas);
    if (g.blas_tc) b->destroy(g.blas_tc);
    g.blas = g.blas_tc = NULL;
    clear_last();
    return pw_err_set(err, s == CUBLAS_STATUS_ALLOC_FAILED ? PW_ENOMEM : PW_EIO, "cuda", "cuda:%d: cuBLAS: %s (%s)",
                      device, b->status_string(s), b->status_name(s));
  }
  g.open = 1;
  return 0;
}

extern "C" void pw_cu__core_close(void) {
  if (!g.open || --g.open) return;
  pw_cu__enter();
  cudaDeviceSynchronize();
  if (g.scratch) cudaFree(g.scratch);
  pw_cu__cublas.destroy(g.blas);
  pw_cu__cublas.destroy(g.blas_tc);
  clear_last();
  int device = g.device;
  memset(&g, 0, sizeof g);
  g.device = device;
}
