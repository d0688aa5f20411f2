/* backend: where a stage program's memory lives and its kernels run —
 * ggml's backend interface, cut to what a training step needs.
 *
 * A program (prog.h) made with a backend takes its arenas, slots and
 * scratch from the backend's alloc, runs each node through the backend's
 * kernel table (kernels.h: the same argument block, its pointers now the
 * backend's memory) and its optimizer through the backend's loops. The
 * caller moves data in and out of the program (input ports, output-port
 * gradients, the loss, checkpoints) through upload/download: on the CPU
 * backend those are memcpy, so the code that calls them is the same for
 * both.
 *
 * The CPU backend (pw_backend_cpu) is the reference every other backend
 * is checked against: its kernels are ops.h's. A GPU backend lives in its
 * own layer (common/cuda/) and hands out its pw_backend from there.
 *
 * Calls on one backend come from one thread at a time (a worker's compute
 * thread); the kernels may run asynchronously and in order: download and
 * sync wait for everything before them. */
#ifndef PW_BACKEND_H
#define PW_BACKEND_H

#include <stddef.h>

#include "errors.h"
#include "kernels.h"

typedef struct pw_backend pw_backend;

struct pw_backend {
  const char *name;  /* "cpu", "cuda:0" */
  int host;          /* 1: its memory is the process's (pointers may be read directly) */
  /* bytes of zeroed memory, or NULL when there is none */
  void *(*alloc)(const pw_backend *be, size_t bytes);
  void (*free)(const pw_backend *be, void *p);
  /* host -> backend, backend -> host, backend -> backend; 0 or a negative code with err filled */
  int (*upload)(const pw_backend *be, void *dst, const void *src, size_t bytes, pw_err *err);
  int (*download)(const pw_backend *be, void *dst, const void *src, size_t bytes, pw_err *err);
  int (*copy)(const pw_backend *be, void *dst, const void *src, size_t bytes, pw_err *err);
  int (*zero)(const pw_backend *be, void *p, size_t bytes, pw_err *err);
  /* waits for every queued kernel; the first asynchronous failure since the last sync */
  int (*sync)(const pw_backend *be, pw_err *err);
  /* the row of op kind `op`; a NULL forward: this backend does not run the op */
  const pw_kernel *(*kernel_of)(int op);
  /* optim.c's loops over one parameter's elements, with its arithmetic:
   * sum of g[i]^2 in double (any fixed order: the same bits run to run);
   * AdamW and SGD element by element as optim.c writes them */
  double (*sqnorm)(const pw_backend *be, const float *g, size_t n);
  void (*adamw)(const pw_backend *be, float *w, const float *g, float *m, float *v, size_t n, float gs, float decay,
                float b1, float b2, float eps, float step, float bc2s);
  void (*sgd)(const pw_backend *be, float *w, const float *g, float *buf, size_t n, float gs, float wd, float mom,
              float lr, int first);
  /* out[i] += in[i] over n floats (a tied parameter's shadow gradient into its main one) */
  void (*add_into)(const pw_backend *be, float *out, const float *in, size_t n);
  /* x[i] rounded to the nearest bf16, kept as float (bf16.h's pw_bf16_round_f32): a bf16
   * program's values that a later layer reads */
  void (*round_bf16)(const pw_backend *be, float *x, size_t n);
  void *ctx;         /* the backend's own state */
};

/* n zeroed floats with every page mapped now (2 MiB aligned, transparent
 * huge pages asked for, from 2 MiB up): the CPU backend's memory, and the
 * host buffers of programs (decode.h's caches, the worker's exchanges).
 * NULL when out of memory; freed with free(). */
float *pw_alloc_floats(size_t n);

/* The process's CPU backend (static; nothing to free). */
const pw_backend *pw_backend_cpu(void);

#endif
