/* hd: PW_HD marks a function both the CPU and a CUDA kernel run — the
 * plain-C per-thread bodies of common/cuda/cu_*_body.h and ops_rope.h —
 * so gcc compiles them for the CPU tests and nvcc for the GPU. */
#ifndef PW_HD_H
#define PW_HD_H

#ifdef __CUDACC__
#define PW_HD __host__ __device__
#else
#define PW_HD
#endif

#endif
