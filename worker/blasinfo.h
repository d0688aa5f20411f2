/* blasinfo: what the worker tells the coordinator about its OpenBLAS at
 * registration — the kernel in use, whether OPENBLAS_CORETYPE forced it,
 * the CPU's vector level (cpu.h) and a measured one-thread sgemm rate —
 * so that a forced slow kernel (CI's Haswell on an AVX-512 host: half the
 * sgemm rate) shows on /v1/workers instead of only in the step times. */
#ifndef PW_BLASINFO_H
#define PW_BLASINFO_H

#include "cpu.h"

#define PW_GEMM_PROBE_N 256       /* the probe's square sgemm: 33.5 MFLOP a call */
#define PW_GEMM_PROBE_BUDGET 0.04 /* s of timed calls at most (plus one warm-up) */

typedef struct {
  char core[32];    /* openblas_get_corename(), "" if it says nothing */
  int forced;       /* OPENBLAS_CORETYPE is set (non-empty) */
  pw_cpu_isa cpu;   /* pw_cpu_detected(): what the CPU supports, whatever PW_CPU says */
  double gflops;    /* median one-thread sgemm GFLOP/s; 0 if not measured */
  double probe_s;   /* how long the whole probe took */
  int calls;        /* timed calls behind the median */
} pw_blasinfo;

/* Fills b; once per process, before registering. Leaves OpenBLAS at one
 * thread: the caller sets its own count afterwards. */
void pw_blasinfo_probe(pw_blasinfo *b);

#endif
