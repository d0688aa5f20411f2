/* cuda_none: pw_cuda.h in a build without nvcc — every device call fails with
 * the reason, host memory is plain calloc. Compiled instead of cu_*.cu
 * (the top CMakeLists.txt's pw_layer: a layer's *_none.c files only when
 * CUDA is not built). */
#include <stdlib.h>

#include "pw_cuda.h"

#define NO_CUDA "built without CUDA: nvcc was not found when it was configured (or PW_CUDA=OFF)"

int pw_cuda_open(int device, const pw_backend **out, pw_err *err) {
  *out = NULL;
  return pw_err_set(err, PW_ENOTSUP, "cuda", "cuda:%d: %s", device, NO_CUDA);
}

void pw_cuda_close(const pw_backend *be) { (void)be; }

int pw_cuda_info_of(int device, pw_cuda_info *info, pw_err *err) {
  (void)info;
  return pw_err_set(err, PW_ENOTSUP, "cuda", "cuda:%d: %s", device, NO_CUDA);
}

int pw_cuda_device_count(void) { return 0; }

void *pw_cuda_host_alloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }

void pw_cuda_host_free(void *p) { free(p); }

int pw_cuda_built(void) { return 0; }

void pw_cu_note_error(int cuda_error, const char *where) {
  (void)cuda_error;
  (void)where;
}
