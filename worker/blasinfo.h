/* blasinfo: what the worker tells the coordinator about its matrix
 * products at registration — the path they run on (gemm.h: OpenBLAS, or
 * oneDNN when OpenBLAS's kernel is below the CPU), OpenBLAS's kernel and
 * whether OPENBLAS_CORETYPE forced it, the CPU's vector level (cpu.h) and
 * the measured one-thread sgemm rate of that path — so that a slow kernel
 * shows on /v1/workers instead of only in the step times. */
#ifndef PW_BLASINFO_H
#define PW_BLASINFO_H

#include "cpu.h"
#include "gemm.h"

#define PW_GEMM_PROBE_N 256       /* the probe's square sgemm: 33.5 MFLOP a call */
#define PW_GEMM_PROBE_BUDGET 0.04 /* s of timed calls at most (plus one warm-up) */

typedef struct {
  char core[32];    /* openblas_get_corename(), "" if it says nothing */
  int forced;       /* OPENBLAS_CORETYPE is set (non-empty) */
  pw_cpu_isa cpu;   /* pw_cpu_detected(): what the CPU supports, whatever PW_CPU says */
  const pw_gemm_choice *gemm; /* the products' path, and why */
  double gflops;    /* median one-thread sgemm GFLOP/s; 0 if not measured */
  double probe_s;   /* how long the whole probe took */
  int calls;        /* timed calls behind the median */
} pw_blasinfo;

/* Fills b; once per process, before registering. Leaves OpenBLAS at one
 * thread: the caller sets its own count afterwards. */
void pw_blasinfo_probe(pw_blasinfo *b);

#endif
