/* cpu: which vector instructions the hot loops may use, decided once per
 * process from the CPU and the PW_CPU environment variable.
 *
 * Builds target x86-64-v2 (SSE4.2) so that one binary runs on every
 * host of a mixed cluster (-DPW_NATIVE=ON ties a build to its host
 * instead). The loops that vectorize are compiled three times, for this
 * baseline, for AVX2 + FMA and for AVX-512 (F, VL, BW, DQ), by putting
 * PW_CPU_DISPATCH on them; each call runs the variant pw_cpu_level() names.
 *
 *   PW_CPU=native  (or unset) the best level the CPU and the OS support
 *   PW_CPU=avx512  the same, at most AVX-512
 *   PW_CPU=avx2    at most AVX2 + FMA: no AVX-512 instruction runs in the
 *                  kernels or in crc32c (how CI proves the AVX2 paths)
 *   PW_CPU=sse     the baseline code only
 * Anything else warns on stderr and runs the baseline (never more than
 * what was asked for). A level above what the CPU has is lowered to it.
 * In a -DPW_NATIVE=ON build every variant may use all the build host has
 * (target attributes only add): PW_CPU then picks among the variants but
 * cannot take instructions away.
 *
 * The variants compute the same float operations in the same order (no
 * -ffast-math, no FMA contraction: -std=c11; fma() where the source says
 * so), so they give the same bits; test_cpu checks it for every kernel.
 * Threads: pw_cpu_level() may be called from any thread. */
#ifndef PW_CPU_H
#define PW_CPU_H

#include <stddef.h>

typedef enum {
  PW_CPU_SSE = 0,    /* the build's baseline: x86-64-v2, or what -march says */
  PW_CPU_AVX2 = 1,   /* + AVX2, FMA */
  PW_CPU_AVX512 = 2, /* + AVX-512 F, VL, BW, DQ */
} pw_cpu_isa;

/* The level in use: the first call reads PW_CPU and the CPU; cheap after. */
pw_cpu_isa pw_cpu_level(void);
/* The best level the CPU and the OS support, whatever PW_CPU says. */
pw_cpu_isa pw_cpu_detected(void);
/* "sse", "avx2", "avx512". */
const char *pw_cpu_name(pw_cpu_isa level);
/* Parses a PW_CPU value: the level it asks for (native: pw_cpu_detected()),
 * lowered to what the CPU has; -1 if s is not one of the names above.
 * NULL or "" is native. */
int pw_cpu_parse(const char *s);
/* For tests and benchmarks: use min(level, detected) from now on, in every
 * thread; returns that level. Not for use while kernels run elsewhere. */
pw_cpu_isa pw_cpu_force(pw_cpu_isa level);
/* 1 when the CPU has AVX512_BF16 (vdpbf16ps) and the level in use is
 * PW_CPU_AVX512: PW_CPU=avx2 (or pw_cpu_force) turns it off too. */
int pw_cpu_bf16(void);

/* OpenBLAS's kernels, as a worker reports them (openblas_get_corename(),
 * whether OPENBLAS_CORETYPE chose them) and the coordinator judges them.
 * Pure string functions: the coordinator has no OpenBLAS and judges a
 * worker on another host by the cpu level that worker reported. */
/* The level a kernel's name needs ("Haswell": PW_CPU_AVX2, "SkylakeX",
 * "Cooperlake", "SapphireRapids": PW_CPU_AVX512, the AVX-only and SSE
 * kernels: PW_CPU_SSE), case-insensitive; -1 for a name not known here. */
int pw_cpu_blas_core_level(const char *core);
/* pw_cpu_name()'s inverse for any host (no lowering): -1 if unknown. */
int pw_cpu_level_of(const char *name);
/* When `forced` and the kernel's level is below cpu_level (a pw_cpu_name),
 * writes a one-line warning with the fix into buf and returns 1; else 0. */
int pw_cpu_blas_warning(const char *core, int forced, const char *cpu_level, char *buf, size_t cap);

/* PW_CPU_DISPATCH(name, (params), (args)) { body } defines
 * void name(params) so that the body is compiled once per level and each
 * call runs the variant for pw_cpu_level(). args names the parameters in
 * order. Put `static` before it for a file-local function. The body must
 * not use `return` with a value (the function returns void); a result goes
 * out through a pointer. What the body calls runs the variant's code only
 * if it is inlined: static inline helpers usually are, but mark a big or
 * twice-used one always_inline, or it is compiled once, for the baseline.
 * Example:
 *   PW_CPU_DISPATCH(pw_add, (float *o, const float *a, int n), (o, a, n)) {
 *     for (int i = 0; i < n; i++) o[i] += a[i];
 *   } */
#if defined(__x86_64__) && defined(__GNUC__)
/* Feature lists, not arch=: a function whose arch differs from its callee's
 * does not get the callee (the ops_math.h helpers) inlined. */
#define PW_CPU_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define PW_CPU_TARGET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq")))
#define PW_CPU_DISPATCH(name, params, args)                                    \
  void name params;                                                            \
  static inline __attribute__((always_inline)) void name##__body params;       \
  PW_CPU_TARGET_AVX512 static void name##__avx512 params { name##__body args; } \
  PW_CPU_TARGET_AVX2 static void name##__avx2 params { name##__body args; }    \
  static void name##__base params { name##__body args; }                       \
  void name params {                                                           \
    switch (pw_cpu_level()) {                                                  \
      case PW_CPU_AVX512: name##__avx512 args; break;                          \
      case PW_CPU_AVX2: name##__avx2 args; break;                              \
      default: name##__base args; break;                                       \
    }                                                                          \
  }                                                                            \
  static inline __attribute__((always_inline)) void name##__body params
#else
#define PW_CPU_DISPATCH(name, params, args) void name params
#endif

#endif
