/* gemm: every single-precision matrix product of the kernels, on the path
 * this CPU runs fastest without anyone setting anything — and checked.
 *
 * OpenBLAS picks its kernel for the CPU when the library loads; on a CPU
 * its version does not know (Debian 12's 0.3.21 on a Sapphire Rapids) it
 * falls back to its Prescott kernel (SSE3, 2004) and says nothing: a 5x
 * slower step. oneDNN generates its code for the CPU it runs on. So the
 * products run on OpenBLAS when its kernel uses the vector ISA the CPU has
 * (cpu.h's level of its core name, the same table the coordinator's
 * warning uses), and on oneDNN when it does not: on a 2-core AMD EPYC
 * (AVX2), a d256 GPT step with OpenBLAS forced to Prescott took 1.17x the
 * default's with the products on oneDNN, 3.0x on OpenBLAS
 * (bench/results/dispatch/gemm-path.md). The rule depends only on the
 * core name and the CPU, so every process on a host takes the same path
 * and a pipelined run keeps equalling the single process bit for bit.
 *
 *   PW_GEMM=auto (or unset)  the rule above
 *   PW_GEMM=openblas         OpenBLAS whatever its kernel
 *   PW_GEMM=onednn           oneDNN
 *
 * Whatever is chosen is first checked: a probe product against a double-
 * precision reference. A path that computes it wrong is not used (the
 * other is tried, and the log says why); if neither is right the process
 * must not train (pw_gemm_check fails). Threads: the first call decides,
 * once, from any thread. */
#ifndef PW_GEMM_H
#define PW_GEMM_H

#include <stddef.h>

#include "errors.h"

typedef enum { PW_GEMM_OPENBLAS = 0, PW_GEMM_ONEDNN = 1 } pw_gemm_path;

typedef struct {
  pw_gemm_path path;
  int ok;                 /* the path computes the probe right */
  char core[32];          /* OpenBLAS's kernel, openblas_get_corename() */
  char why[200];          /* why this path (said in the log and the worker's report) */
  char refused[400];      /* the paths refused by the probe, and why; "" if none */
} pw_gemm_choice;

/* The path the rule gives for OpenBLAS kernel `core` on a CPU of level
 * cpu_level (pw_cpu_isa), with PW_GEMM's value `want` (NULL: auto); *why
 * says why. Pure: tests call it with any core. */
pw_gemm_path pw_gemm_prefer(const char *core, int cpu_level, const char *want, char *why, size_t cap);
/* The probe: path's product of odd-sized matrices in every transpose
 * against a double reference. corrupt != 0 simulates a kernel that
 * computes wrongly (one element off), for the tests. 0 or PW_EFORMAT with
 * err saying which element was how far off. */
PW_MUST_CHECK int pw_gemm_verify(pw_gemm_path path, int corrupt, pw_err *err);
/* The process's choice, made on first use (PW_GEMM, and PW_GEMM_CORRUPT
 * naming a path whose probe is to fail: tests). */
const pw_gemm_choice *pw_gemm_choice_get(void);
/* PW_EFORMAT when no path computes right (err says what each did). */
PW_MUST_CHECK int pw_gemm_check(pw_err *err);
/* "openblas" / "onednn". */
const char *pw_gemm_path_name(pw_gemm_path p);

/* C = alpha op(A) op(B) + beta C, row-major, op transposes when ta / tb
 * (cblas_sgemm's arguments in its row-major form). */
void pw_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc);

#endif
