/* cu_optim: the backend's optimizer loops (backend.h) on the device —
 * AdamW, SGD and add_into one thread per element with optim.c's float
 * expressions in its order (cu_ops_body.h; nvcc's --fmad=false keeps them
 * uncontracted, so the same bits as the CPU's), and the squared gradient
 * norm as a reduction of a fixed shape: PW_CU_SQ_BLOCKS x PW_CU_SQ_THREADS threads
 * whatever n and the device, each summing its strided elements in double,
 * each block's partials added in thread order by its first thread, the
 * blocks' in block order by one thread. The same bits run to run. */
#include "cu_int.h"
#include "cu_ops_body.h"

__global__ static void sqnorm_part_k(double *part, const float *g, size_t n) {
  __shared__ double s[PW_CU_SQ_THREADS];
  size_t nt = (size_t)gridDim.x * blockDim.x;
  s[threadIdx.x] = pw_cu_sqnorm_part(g, n, pw_cu__tid(), nt);
  __syncthreads();
  if (threadIdx.x == 0) {
    double b = 0.0;
    for (int k = 0; k < PW_CU_SQ_THREADS; k++) b += s[k];
    part[blockIdx.x] = b;
  }
}

__global__ static void sqnorm_total_k(double *out, const double *part, int np) {
  if (pw_cu__tid() != 0) return;
  double t = 0.0;
  for (int k = 0; k < np; k++) t += part[k];
  *out = t;
}

__global__ static void adamw_k(float *w, const float *g, float *m, float *v, size_t n, float gs, float decay, float b1,
                               float b2, float eps, float step, float bc2s) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_adamw_el(w, g, m, v, gs, decay, b1, b2, eps, step, bc2s, i);
}

__global__ static void sgd_k(float *w, const float *g, float *buf, size_t n, float gs, float wd, float mom, float lr,
                             int first) {
  size_t i = pw_cu__tid();
  if (i < n) pw_cu_sgd_el(w, g, buf, gs, wd, mom, lr, first, i);
}

__global__ static void add_into_k(float *out, const float *in, size_t n) {
  size_t i = pw_cu__tid();
  if (i < n) out[i] += in[i];
}

/* NaN when it fails (the failure recorded for the next sync): a NaN norm
 * skips or fails the step, never passes for a small one. */
extern "C" double pw_cu__sqnorm(const pw_backend *be, const float *g, size_t n) {
  if (n == 0) return 0.0;
  pw_cu__enter();
  double *part = (double *)pw_cu__scratch((PW_CU_SQ_BLOCKS + 1) * sizeof(double)), r = NAN;
  if (!part) return NAN;
  sqnorm_part_k<<<PW_CU_SQ_BLOCKS, PW_CU_SQ_THREADS>>>(part, g, n);
  pw_cu__launched("sqnorm");
  sqnorm_total_k<<<1, 1>>>(part + PW_CU_SQ_BLOCKS, part, PW_CU_SQ_BLOCKS);
  pw_cu__launched("sqnorm: total");
  cudaError_t e = cudaMemcpy(&r, part + PW_CU_SQ_BLOCKS, sizeof r, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    pw_cu_note_error((int)e, "sqnorm: the result back");
    return NAN;
  }
  return r;
}

extern "C" void pw_cu__adamw(const pw_backend *be, float *w, const float *g, float *m, float *v, size_t n, float gs,
                             float decay, float b1, float b2, float eps, float step, float bc2s) {
  pw_cu__enter();
  PW_CU_LAUNCH(adamw_k, n, "adamw", w, g, m, v, n, gs, decay, b1, b2, eps, step, bc2s);
}

extern "C" void pw_cu__sgd(const pw_backend *be, float *w, const float *g, float *buf, size_t n, float gs, float wd,
                           float mom, float lr, int first) {
  pw_cu__enter();
  PW_CU_LAUNCH(sgd_k, n, "sgd", w, g, buf, n, gs, wd, mom, lr, first);
}

extern "C" void pw_cu__add_into(const pw_backend *be, float *out, const float *in, size_t n) {
  pw_cu__enter();
  PW_CU_LAUNCH(add_into_k, n, "add_into", out, in, n);
}
