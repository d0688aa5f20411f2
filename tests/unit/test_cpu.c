/* test_cpu: the vector level switch (cpu.h) and what it promises.
 *   - PW_CPU is read once at first use: each value, in a fresh child
 *     process, gives the level asked for (capped by the CPU); an unknown
 *     value gives the baseline; pw_cpu_parse and pw_cpu_force agree.
 *   - crc32c obeys it: below AVX-512 its VPCLMULQDQ path is off, and the
 *     checksum is the same at every level.
 *   - Every PW_CPU_DISPATCH kernel of ops.c, ops_attn.c and ops_flash.c gives the same
 *     bits at every level this CPU has (outputs pre-filled with a pattern,
 *     so a variant that leaves an element unwritten or writes one too many
 *     differs), for acc = 0 and acc = 1, on shapes with vector tails.
 * The gradient checks of test_ops*.c run once per level too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu.h"
#include "crc32c.h"
#include "ops.h"
#include "optable.h"

/* ---- the switch ---------------------------------------------------------- */

/* pw_cpu_level() of a child started with PW_CPU=value (NULL: unset). */
static int level_in_child(const char *value) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (value)
      setenv("PW_CPU", value, 1);
    else
      unsetenv("PW_CPU");
    _exit((int)pw_cpu_level());
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  return WEXITSTATUS(st);
}

/* Runs first: the children must inherit a process that has not read the
 * level yet. */
static void test_env_switch(void **state) {
  int best = pw_cpu_detected();
  assert_int_equal(level_in_child(NULL), best);
  assert_int_equal(level_in_child(""), best);
  assert_int_equal(level_in_child("native"), best);
  assert_int_equal(level_in_child("avx512"), best);
  assert_int_equal(level_in_child("avx2"), best < PW_CPU_AVX2 ? best : PW_CPU_AVX2);
  assert_int_equal(level_in_child("sse"), PW_CPU_SSE);
  /* Unknown: warn and run the baseline, never more than was asked for. */
  assert_int_equal(level_in_child("avx-2"), PW_CPU_SSE);
  assert_int_equal(level_in_child("AVX2"), PW_CPU_SSE);
}

static void test_parse_force(void **state) {
  int best = pw_cpu_detected();
  assert_true(best >= PW_CPU_SSE && best <= PW_CPU_AVX512);
  assert_string_equal(pw_cpu_name(PW_CPU_SSE), "sse");
  assert_string_equal(pw_cpu_name(PW_CPU_AVX2), "avx2");
  assert_string_equal(pw_cpu_name(PW_CPU_AVX512), "avx512");
  assert_int_equal(pw_cpu_parse("sse"), PW_CPU_SSE);
  assert_int_equal(pw_cpu_parse("native"), best);
  assert_int_equal(pw_cpu_parse(NULL), best);
  assert_int_equal(pw_cpu_parse("avx2"), best < PW_CPU_AVX2 ? best : PW_CPU_AVX2);
  assert_int_equal(pw_cpu_parse("avx"), -1);
  int before = pw_cpu_level();
  for (int l = PW_CPU_AVX512; l >= PW_CPU_SSE; l--) {
    int got = pw_cpu_force((pw_cpu_isa)l);
    assert_int_equal(got, l < best ? l : best);
    assert_int_equal(pw_cpu_level(), got);
  }
  pw_cpu_force((pw_cpu_isa)before);
}

/* The kernel judgement the coordinator makes of a worker's report. */
static void test_blas_warning(void **state) {
  char b[256] = "";
  assert_int_equal(pw_cpu_blas_core_level("haswell"), PW_CPU_AVX2);
  assert_int_equal(pw_cpu_blas_core_level("Cooperlake"), PW_CPU_AVX512);
  assert_int_equal(pw_cpu_blas_core_level("Sandybridge"), PW_CPU_SSE);
  assert_int_equal(pw_cpu_blas_core_level("Zen9"), -1);
  assert_int_equal(pw_cpu_level_of("avx512"), PW_CPU_AVX512);
  assert_int_equal(pw_cpu_level_of("native"), -1);
  assert_int_equal(pw_cpu_blas_warning("Haswell", 1, "avx512", b, sizeof b), 1);
  assert_string_equal(b, "OpenBLAS kernel Haswell forced by OPENBLAS_CORETYPE; this CPU supports AVX-512 kernels "
                         "(about 2x sgemm): unset it");
  assert_int_equal(pw_cpu_blas_warning("Nehalem", 1, "avx2", b, sizeof b), 1);
  assert_non_null(strstr(b, "AVX2 kernels (faster sgemm)"));
  assert_int_equal(pw_cpu_blas_warning("Haswell", 0, "avx512", b, sizeof b), 0);   /* OpenBLAS's own pick */
  assert_int_equal(pw_cpu_blas_warning("Haswell", 1, "avx2", b, sizeof b), 0);     /* the best there is */
  assert_int_equal(pw_cpu_blas_warning("SkylakeX", 1, "avx512", b, sizeof b), 0);
  assert_int_equal(pw_cpu_blas_warning("Unknown", 1, "avx512", b, sizeof b), 0);
  assert_int_equal(pw_cpu_blas_warning("Haswell", 1, NULL, b, sizeof b), 0);
}

static void test_crc32c_obeys(void **state) {
  static unsigned char buf[20000];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + (i >> 7));
  int before = pw_cpu_level();
  uint32_t want = pw_crc32c_sw(0, buf, sizeof buf);
  for (int l = before; l >= PW_CPU_SSE; l--) {
    pw_cpu_force((pw_cpu_isa)l);
    if (l < PW_CPU_AVX512) assert_false(pw_crc32c_vec_available());
    assert_int_equal(pw_crc32c(0, buf, sizeof buf), want);
    assert_int_equal(pw_crc32c(0, buf + 3, 300), pw_crc32c_sw(0, buf + 3, 300));
  }
  pw_cpu_force((pw_cpu_isa)before);
}

/* ---- the kernels at every level ------------------------------------------ */

/* Shapes with tails: T crosses ATTN_BLOCK (64) and no size is a multiple of
 * 16 lanes; CW is wider than the layernorm backward's row buffer (1024). */
enum { B = 2, T = 70, C = 56, NH = 4, N = B * T, V = 67, CW = 1100, NW = 3, NE = N * C - 5 };
enum { SZ = B * NH * T * T, NOUT = 4 };

static float in[6][SZ];
static int32_t tok[N];
static float out[NOUT][SZ], ref[NOUT][SZ];

typedef struct {
  const char *name;
  void (*run)(int acc); /* writes out[0..NOUT) from in[] */
} kcase;

static void k_embed(int acc) { pw_embed_backward_weight(out[0], in[0], tok, N, C); }
static void k_posembed(int acc) {
  pw_posembed_forward(out[0], in[0], in[1], B, T, C);
  pw_posembed_backward_input(out[1], in[2], B, T, C, acc);
  pw_posembed_backward_weight(out[2], in[2], B, T, C);
}
static void k_linear_bw(int acc) { pw_linear_backward_weight(out[0], out[1], in[0], in[1], N, C, 9); }
static void k_layernorm(int acc) {
  pw_layernorm_forward(out[0], out[1], out[2], in[0], in[1], in[2], N, C, 1e-5f);
  pw_layernorm_backward_input(out[3], in[3], in[0], in[1], out[1], out[2], N, C, acc);
}
static void k_layernorm_bwd(int acc) {
  /* mean and rstd: in[4] and 1 + |in[5]| (kept in in[5]). */
  pw_layernorm_backward(out[0], out[1], out[2], in[3], in[0], in[1], in[4], in[5], N, C, acc);
  pw_layernorm_backward_weight(out[3], out[3] + C, in[3], in[0], in[4], in[5], N, C);
}
static void k_layernorm_wide(int acc) {
  pw_layernorm_forward(out[0], out[1], out[2], in[0], in[1], in[2], NW, CW, 1e-5f);
  pw_layernorm_backward(out[3], out[1] + 8, out[2] + 8, in[3], in[0], in[1], in[4], in[5], NW,
                        CW, acc);
}
static void k_rmsnorm(int acc) {
  pw_rmsnorm_forward(out[0], out[1], in[0], in[1], N, C, 1e-5f);
  pw_rmsnorm_backward_input(out[2], in[3], in[0], in[1], in[5], N, C, acc);
  pw_rmsnorm_backward_weight(out[3], in[3], in[0], in[5], N, C);
}
static void k_gelu(int acc) {
  pw_gelu_forward(out[0], out[1], in[0], NE);
  pw_gelu_backward_input(out[2], in[3], out[1], NE, acc);
}
static void k_relu(int acc) {
  pw_relu_forward(out[0], in[0], NE);
  pw_relu_backward_input(out[1], in[3], in[0], NE, acc);
}
static void k_silu(int acc) {
  pw_silu_forward(out[0], in[0], NE);
  pw_silu_backward_input(out[1], in[3], in[0], NE, acc);
}
static void k_swiglu(int acc) {
  pw_swiglu_forward(out[0], in[0], in[1], NE);
  pw_swiglu_backward_input(out[1], out[2], in[3], in[0], in[1], NE, acc, acc);
}
static void k_add(int acc) {
  pw_add_forward(out[0], in[0], in[1], NE);
  pw_add_backward_input(out[1], out[2], in[3], NE, acc, acc);
}
static void k_crossentropy(int acc) {
  out[1][0] = pw_crossentropy_forward(out[0], in[0], tok, N, V, 1.0f / N);
  pw_crossentropy_backward_input(out[2], in[1], tok, N, V, 1.0f / N, acc);
  pw_mse_backward_input(out[3], in[0], in[1], NE, 0.25f, acc);
}
static void k_rope(int acc) {
  pw_rope_forward(out[0], in[0], B, T, C, NH, NH, &(pw_rope){.theta = 10000.0f});
  pw_rope_backward_input(out[1], in[3], B, T, C, NH, NH, &(pw_rope){.theta = 10000.0f}, acc);
}
static void k_attention(int acc) {
  pw_attention_forward(out[0], out[1], in[0], B, T, C, NH, NH);
  /* the backward on the forward's own probabilities */
  pw_attention_backward_input(out[2], out[3], in[3], in[0], out[1], B, T, C, NH, NH, acc);
}

/* the tiled attention (ops_flash.c): forward, then the backward on its
 * own out and lse; its tiles' scratch apart (bigger than SZ) */
static float tiled_ws[2 * PW_ATTN_TILE_B * PW_ATTN_TILE_K + 2 * PW_ATTN_TILE_K * C + T];
static void k_attention_tiled(int acc) {
  assert_true(pw_attention_tiled_scratch(T, C, NH, NH) <= sizeof tiled_ws / sizeof tiled_ws[0]);
  pw_attention_tiled_forward(out[0], out[1], tiled_ws, in[0], B, T, C, NH, NH);
  pw_attention_tiled_backward_input(out[2], tiled_ws, in[3], out[0], in[0], out[1], B, T, C, NH, NH, acc);
}

static const kcase cases[] = {
    {"embed", k_embed},       {"posembed", k_posembed},
    {"linear_bw", k_linear_bw}, {"layernorm", k_layernorm},
    {"layernorm_bwd", k_layernorm_bwd}, {"layernorm_wide", k_layernorm_wide},
    {"rmsnorm", k_rmsnorm},   {"gelu", k_gelu},
    {"relu", k_relu},         {"silu", k_silu},
    {"swiglu", k_swiglu},     {"add", k_add},
    {"crossentropy", k_crossentropy}, {"rope", k_rope},
    {"attention", k_attention}, {"attention_tiled", k_attention_tiled},
};

static void fill(float *x, size_t n, uint32_t seed, float scale) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = scale * ((float)(seed >> 8) / 8388608.0f - 1.0f);
  }
}

static void prefill_out(void) {
  for (int k = 0; k < NOUT; k++) fill(out[k], SZ, 100u + (uint32_t)k, 0.5f);
}

static void test_kernels_same_bits(void **state) {
  for (int k = 0; k < 6; k++) fill(in[k], SZ, 1u + (uint32_t)k, k == 0 ? 3.0f : 1.0f);
  for (int i = 0; i < SZ; i++) in[5][i] = 1.0f + (in[5][i] < 0 ? -in[5][i] : in[5][i]);
  for (int i = 0; i < N; i++) tok[i] = (i * 29 + 3) % V;
  int before = pw_cpu_level();
  int levels = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int acc = 0; acc <= 1; acc++) {
      /* the reference: the baseline variant */
      pw_cpu_force(PW_CPU_SSE);
      prefill_out();
      cases[c].run(acc);
      memcpy(ref, out, sizeof out);
      levels = 0;
      for (int l = before; l > PW_CPU_SSE; l--, levels++) {
        assert_int_equal(pw_cpu_force((pw_cpu_isa)l), l);
        prefill_out();
        cases[c].run(acc);
        for (int k = 0; k < NOUT; k++)
          for (int i = 0; i < SZ; i++)
            if (memcmp(&out[k][i], &ref[k][i], sizeof(float)) != 0)
              fail_msg("%s acc=%d: out[%d][%d] is %.9g at %s, %.9g at sse", cases[c].name, acc,
                       k, i, (double)out[k][i], pw_cpu_name((pw_cpu_isa)l), (double)ref[k][i]);
      }
    }
  pw_cpu_force((pw_cpu_isa)before);
  fprintf(stderr, "compared %d level(s) above sse with sse (PW_CPU level %s)\n", levels,
          pw_cpu_name((pw_cpu_isa)before));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env_switch),
      cmocka_unit_test(test_parse_force),
      cmocka_unit_test(test_blas_warning),
      cmocka_unit_test(test_crc32c_obeys),
      cmocka_unit_test(test_kernels_same_bits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
