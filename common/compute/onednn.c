/* onednn: the shared engine (onednn.h). */
#include "onednn.h"

#include <pthread.h>

#include "cpu.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine;

static void init(void) {
  pw_cpu_isa l = pw_cpu_level();
  if (l < PW_CPU_AVX512) dnnl_set_max_cpu_isa(l == PW_CPU_AVX2 ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_sse41);
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) engine = NULL;
}

dnnl_engine_t pw_onednn_engine(void) {
  pthread_once(&once, init);
  return engine;
}

const char *pw_onednn_isa(void) {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_sse41: return "sse41";
    default: return "other";
  }
}
