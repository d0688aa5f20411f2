/* cu_backend: pw_cuda.h — the pw_backend of one GPU (memory, copies, sync, the
 * kernel table of cu_ops.cu, the optimizer loops of cu_optim.cu) and what
 * a worker reports about the GPUs it sees.
 *
 * Memory is plain cudaMalloc, zeroed (never managed memory: a host read
 * of it must go through download). Everything runs on the legacy default
 * stream, so kernels and copies run in call order; upload and download are
 * cudaMemcpy (download returns once the data is on the host), copy and
 * zero are queued. Each data call and sync returns the first failure
 * recorded since the last one reported (a kernel's launch, cuBLAS).
 *
 * Must never hand out managed or host-mapped memory, or run work on any
 * stream but the default one. */
#include <stdio.h>
#include <string.h>

#include "cu_int.h"

static pw_backend be_cuda;
static char be_name[16];

static void *cu_alloc(const pw_backend *be, size_t bytes) {
  void *p = NULL;
  pw_cu__enter();
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    (void)cudaGetLastError(); /* out of memory is the caller's to report: NULL */
    return NULL;
  }
  cudaError_t e = cudaMemset(p, 0, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    cudaFree(p);
    return NULL;
  }
  return p;
}

static void cu_free(const pw_backend *be, void *p) {
  if (!p) return;
  pw_cu__enter();
  cudaError_t e = cudaFree(p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    pw_cu_note_error((int)e, "cudaFree");
  }
}

/* the copy's own failure, else the first one recorded before it */
static int copied(cudaError_t e, const char *where, pw_err *err) {
  int rc = pw_cu__check(e, where, err);
  return rc ? rc : pw_cu__take_error(err);
}

static int cu_upload(const pw_backend *be, void *dst, const void *src, size_t bytes, pw_err *err) {
  pw_cu__enter();
  return copied(bytes ? cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) : cudaSuccess, "upload", err);
}

static int cu_download(const pw_backend *be, void *dst, const void *src, size_t bytes, pw_err *err) {
  pw_cu__enter();
  return copied(bytes ? cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) : cudaSuccess, "download", err);
}

static int cu_copy(const pw_backend *be, void *dst, const void *src, size_t bytes, pw_err *err) {
  pw_cu__enter();
  return copied(bytes ? cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0) : cudaSuccess, "copy", err);
}

static int cu_zero(const pw_backend *be, void *p, size_t bytes, pw_err *err) {
  pw_cu__enter();
  return copied(bytes ? cudaMemsetAsync(p, 0, bytes, 0) : cudaSuccess, "zero", err);
}

static int cu_sync(const pw_backend *be, pw_err *err) {
  pw_cu__enter();
  return copied(cudaDeviceSynchronize(), "sync", err);
}

int pw_cuda_open(int device, const pw_backend **out, pw_err *err) {
  *out = NULL;
  int rc = pw_cu__core_open(device, err);
  if (rc) return rc;
  snprintf(be_name, sizeof be_name, "cuda:%d", device);
  be_cuda.name = be_name;
  be_cuda.host = 0;
  be_cuda.alloc = cu_alloc;
  be_cuda.free = cu_free;
  be_cuda.upload = cu_upload;
  be_cuda.download = cu_download;
  be_cuda.copy = cu_copy;
  be_cuda.zero = cu_zero;
  be_cuda.sync = cu_sync;
  be_cuda.kernel_of = pw_cu__kernel_of;
  be_cuda.sqnorm = pw_cu__sqnorm;
  be_cuda.adamw = pw_cu__adamw;
  be_cuda.sgd = pw_cu__sgd;
  be_cuda.add_into = pw_cu__add_into;
  be_cuda.round_bf16 = pw_cu__round_bf16; /* with it, prog.c runs bf16 programs here */
  be_cuda.ctx = NULL;
  *out = &be_cuda;
  return 0;
}

void pw_cuda_close(const pw_backend *be) {
  if (be) pw_cu__core_close();
}

int pw_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

int pw_cuda_info_of(int device, pw_cuda_info *info, pw_err *err) {
  memset(info, 0, sizeof *info);
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return pw_err_set(err, PW_EUNAVAIL, "cuda", "cuda:%d: no CUDA device visible: %s (%s)", device,
                      cudaGetErrorString(e), cudaGetErrorName(e));
  }
  if (device < 0 || device >= count)
    return pw_err_set(err, PW_ENOENT, "cuda", "cuda:%d: no such device (%d visible: cuda:0 .. cuda:%d)", device, count,
                      count - 1);
  cudaDeviceProp p;
  int prev = 0;
  cudaGetDevice(&prev);
  size_t fr = 0, tot = 0;
  if ((e = cudaGetDeviceProperties(&p, device)) != cudaSuccess || (e = cudaSetDevice(device)) != cudaSuccess ||
      (e = cudaMemGetInfo(&fr, &tot)) != cudaSuccess || (e = cudaDriverGetVersion(&info->driver_version)) != cudaSuccess ||
      (e = cudaRuntimeGetVersion(&info->runtime_version)) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaSetDevice(prev);
    return pw_err_set(err, e == cudaErrorMemoryAllocation ? PW_ENOMEM : PW_EIO, "cuda", "cuda:%d: %s (%s)", device,
                      cudaGetErrorString(e), cudaGetErrorName(e));
  }
  cudaSetDevice(prev); /* the caller's current device as it was */
  memcpy(info->name, p.name, sizeof info->name - 1); /* zeroed above: ends in a NUL */
  info->mem_total = tot;
  info->mem_free = fr;
  info->cc_major = p.major;
  info->cc_minor = p.minor;
  info->sms = p.multiProcessorCount;
  return 0;
}

void *pw_cuda_host_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  memset(p, 0, bytes);
  return p;
}

void pw_cuda_host_free(void *p) {
  if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

int pw_cuda_built(void) { return 1; }
