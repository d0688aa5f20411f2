/* cpu: the implementation of cpu.h. The level lives in one atomic int,
 * set at first use from PW_CPU and the CPU (each read once, under
 * pthread_once) or by pw_cpu_force(). */
#include "cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <strings.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static atomic_int level = -1;
static pw_cpu_isa detected;
static int detected_bf16;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT, level_once = PTHREAD_ONCE_INIT;

/* __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512
 * registers (XCR0), not only the CPUID bits. */
static void detect(void) {
  detected = PW_CPU_SSE;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    detected = PW_CPU_AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")) {
      detected = PW_CPU_AVX512;
      detected_bf16 = __builtin_cpu_supports("avx512bf16");
    }
  }
#endif
}

static void init_level(void) {
  const char *s = getenv("PW_CPU");
  int l = pw_cpu_parse(s);
  if (l < 0) {
    pw_warn("PW_CPU=%s: expected native, avx512, avx2 or sse; using sse", s);
    l = PW_CPU_SSE;
  }
  int unset = -1;
  atomic_compare_exchange_strong(&level, &unset, l); /* pw_cpu_force() may have won */
}

pw_cpu_isa pw_cpu_level(void) {
  int l = atomic_load_explicit(&level, memory_order_relaxed);
  if (l >= 0) return (pw_cpu_isa)l;
  pthread_once(&level_once, init_level);
  return (pw_cpu_isa)atomic_load(&level);
}

pw_cpu_isa pw_cpu_detected(void) {
  pthread_once(&detect_once, detect);
  return detected;
}

int pw_cpu_bf16(void) {
  pthread_once(&detect_once, detect);
  return detected_bf16 && pw_cpu_level() == PW_CPU_AVX512;
}

const char *pw_cpu_name(pw_cpu_isa l) {
  static const char *const names[] = {"sse", "avx2", "avx512"};
  return l >= PW_CPU_SSE && l <= PW_CPU_AVX512 ? names[l] : "?";
}

int pw_cpu_parse(const char *s) {
  pw_cpu_isa best = pw_cpu_detected();
  if (!s || !*s || strcmp(s, "native") == 0) return best;
  for (int l = PW_CPU_SSE; l <= PW_CPU_AVX512; l++)
    if (strcmp(s, pw_cpu_name(l)) == 0) return l < (int)best ? l : (int)best;
  return -1;
}

pw_cpu_isa pw_cpu_force(pw_cpu_isa l) {
  pw_cpu_isa best = pw_cpu_detected();
  if (l > best) l = best;
  if (l < PW_CPU_SSE) l = PW_CPU_SSE;
  atomic_store(&level, (int)l);
  return l;
}

int pw_cpu_level_of(const char *name) {
  for (int l = PW_CPU_SSE; l <= PW_CPU_AVX512; l++)
    if (name && strcmp(name, pw_cpu_name(l)) == 0) return l;
  return -1;
}

/* OpenBLAS's x86-64 core names (0.3.21); the AVX-only ones (Sandybridge,
 * the Bulldozer family) count as SSE: below the AVX2 + FMA we compare with. */
int pw_cpu_blas_core_level(const char *core) {
  static const struct { const char *name; int level; } cores[] = {
      {"SkylakeX", PW_CPU_AVX512}, {"Cooperlake", PW_CPU_AVX512}, {"SapphireRapids", PW_CPU_AVX512},
      {"Haswell", PW_CPU_AVX2},    {"Zen", PW_CPU_AVX2},          {"Sandybridge", PW_CPU_SSE},
      {"Bulldozer", PW_CPU_SSE},   {"Piledriver", PW_CPU_SSE},    {"Steamroller", PW_CPU_SSE},
      {"Excavator", PW_CPU_SSE},   {"Nehalem", PW_CPU_SSE},       {"Core2", PW_CPU_SSE},
      {"Penryn", PW_CPU_SSE},      {"Dunnington", PW_CPU_SSE},    {"Barcelona", PW_CPU_SSE},
      {"Prescott", PW_CPU_SSE},    {"Atom", PW_CPU_SSE},          {"Nano", PW_CPU_SSE},
      {"Opteron", PW_CPU_SSE},     {"Opteron_SSE3", PW_CPU_SSE},  {"Bobcat", PW_CPU_SSE},
  };
  for (size_t i = 0; core && i < sizeof cores / sizeof cores[0]; i++)
    if (strcasecmp(core, cores[i].name) == 0) return cores[i].level;
  return -1;
}

int pw_cpu_blas_warning(const char *core, int forced, const char *cpu_level, char *buf, size_t cap) {
  int k = pw_cpu_blas_core_level(core), c = pw_cpu_level_of(cpu_level);
  if (!forced || k < 0 || c < 0 || k >= c) return 0;
  /* AVX2 -> AVX-512 is what we measured (Zen 4: 110 -> 211 GFLOP/s); say
   * no number for the other steps. */
  snprintf(buf, cap, "OpenBLAS kernel %s forced by OPENBLAS_CORETYPE; this CPU supports %s kernels (%s): unset it",
           core, c == PW_CPU_AVX512 ? "AVX-512" : "AVX2",
           c == PW_CPU_AVX512 && k == PW_CPU_AVX2 ? "about 2x sgemm" : "faster sgemm");
  return 1;
}
