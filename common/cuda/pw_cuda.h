/* pw_cuda: the CUDA backend (backend.h) of one NVIDIA GPU, and what a worker
 * reports about the GPUs it sees.
 *
 * A build with nvcc (CMake option PW_CUDA, on when nvcc is found) compiles
 * cu_*.cu; a build without it compiles cuda_none.c, the same API whose
 * calls fail with the reason, so callers need no #ifdef.
 *
 * The backend's memory is cudaMalloc'd (never managed memory), zeroed;
 * kernels, cuBLAS and copies all run on the legacy default stream, so they
 * run in the order they were called; float32 products through cuBLAS in
 * pedantic math (no TF32), bf16 programs' products in cuBLAS's default
 * math (the tensor cores). Every kernel is deterministic: the same inputs
 * give the same bits run to run. One device per process: pw_cuda_open of
 * the open device again shares it (closed when every open is), of another
 * one is refused. Not thread-safe: one thread at a time, like a backend.
 *
 * Kernels run asynchronously: a failed launch or a failed cuBLAS call is
 * recorded (pw_cu_note_error), and the backend's sync (or download)
 * returns the first one recorded since the last sync. */
#ifndef PW_CUDA_H
#define PW_CUDA_H

#include <stddef.h>

#include "backend.h"
#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 0 and *out, the backend of device `device` (its name "cuda:N"); or a
 * negative code with err filled: PW_ENOTSUP for a build without CUDA,
 * PW_EUNAVAIL when no device is visible (cudaGetDeviceCount's reason),
 * PW_ENOENT for a device number that is not there, PW_ECONFLICT for a
 * second device in one process, PW_EIO or PW_ENOMEM when it does not
 * start (cuBLAS, memory). */
PW_MUST_CHECK int pw_cuda_open(int device, const pw_backend **out, pw_err *err);
/* One pw_cuda_open undone; the last one waits for the device and frees
 * the backend's own memory (not what alloc handed out). NULL is a no-op. */
void pw_cuda_close(const pw_backend *be);

typedef struct {
  char name[128];             /* "NVIDIA H200" */
  size_t mem_total, mem_free; /* bytes */
  int driver_version, runtime_version; /* 13000 for 13.0 */
  int cc_major, cc_minor;     /* compute capability: 9, 0 for sm_90 */
  int sms;                    /* streaming multiprocessors */
} pw_cuda_info;
/* 0 and *info for device `device` (its memory figures make a context on
 * it); the errors of pw_cuda_open. */
PW_MUST_CHECK int pw_cuda_info_of(int device, pw_cuda_info *info, pw_err *err);
/* Devices visible; 0 when none, or built without CUDA. */
int pw_cuda_device_count(void);

/* Pinned (page-locked) host memory for frames staged to and from the
 * device; NULL when there is none (no device, out of memory). Without
 * CUDA: calloc. Freed by pw_cuda_host_free only (NULL is a no-op). */
void *pw_cuda_host_alloc(size_t bytes);
void pw_cuda_host_free(void *p);

/* 1 when this build has the CUDA backend, else 0. */
int pw_cuda_built(void);

/* Records the first failure since the last sync (a cudaError_t, where:
 * the kernel or call); the backend's sync returns it. For the kernels of
 * every cu_*.cu file. */
void pw_cu_note_error(int cuda_error, const char *where);

#ifdef __cplusplus
}
#endif

#endif
