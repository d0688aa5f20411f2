/* cu_blas: cuBLAS loaded when a device is opened, not linked.
 *
 * libcublas and libcublasLt are ~700 MB that the loader would map into
 * every process linking them, and relocate: 230 MB more resident for a
 * `pipewright --version`, and every binary of the Debian packages would
 * depend on them. So the CUDA runtime is linked statically (a few MB,
 * it opens the driver itself on first use) and cuBLAS is dlopen'ed here
 * by pw_cu__core_open: a build with CUDA costs nothing to a process that
 * never asks for a device, and runs where CUDA is not installed. */
#include <dlfcn.h>

#include "cu_int.h"

pw_cu_blas_api pw_cu__cublas;

/* Its soname for the toolkit we build with (13.x), then the bare name. */
static const char *const names[] = {"libcublas.so." PW_CU_STR(CUBLAS_VER_MAJOR), "libcublas.so"};

extern "C" int pw_cu__blas_load(pw_err *err) {
  if (pw_cu__cublas.sgemm) return 0;
  void *h = NULL;
  const char *tried = "";
  for (size_t i = 0; !h && i < sizeof names / sizeof names[0]; i++) h = dlopen(tried = names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h)
    return pw_err_set(err, PW_EUNAVAIL, "cuda", "cuBLAS could not be loaded (%s): %s; it comes with the CUDA toolkit "
                      "or its libcublas package", tried, dlerror());
  pw_cu_blas_api a;
  /* the _v2 entry points, which cublas_v2.h's names stand for */
  *(void **)&a.create = dlsym(h, "cublasCreate_v2");
  *(void **)&a.destroy = dlsym(h, "cublasDestroy_v2");
  *(void **)&a.set_math_mode = dlsym(h, "cublasSetMathMode");
  *(void **)&a.set_stream = dlsym(h, "cublasSetStream_v2");
  *(void **)&a.sgemm = dlsym(h, "cublasSgemm_v2");
  *(void **)&a.gemm_ex = dlsym(h, "cublasGemmEx");
  *(void **)&a.status_name = dlsym(h, "cublasGetStatusName");
  *(void **)&a.status_string = dlsym(h, "cublasGetStatusString");
  if (!a.create || !a.destroy || !a.set_math_mode || !a.set_stream || !a.sgemm || !a.gemm_ex || !a.status_name || !a.status_string) {
    dlclose(h);
    return pw_err_set(err, PW_EUNAVAIL, "cuda", "%s lacks an entry point pipewright uses (cublasCreate_v2, "
                      "cublasSgemm_v2, cublasGemmEx, ...): a cuBLAS older than CUDA 12?", tried);
  }
  pw_cu__cublas = a; /* kept loaded for the process's life */
  return 0;
}
