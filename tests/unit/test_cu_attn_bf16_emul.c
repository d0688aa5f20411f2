/* test_cu_attn_bf16_emul: the CUDA plain attention kernels of bf16
 * programs (common/cuda/cu_attn_bf16_body.h; the tiled attention's are
 * test_cu_fa_emul's) run on the CPU, every thread index of
 * every launch in a loop, the launches as cu_attn_bf16.cu's entry points
 * make them, against the CPU's bf16 rows (bf16.h's pw_attention_*_bf16).
 * The only check of their indexing and rounding on a machine without a GPU
 * (tests/gpu/test_cuda_bf16.c runs the real kernels where one is).
 *
 * - attention: forward (out and att; outputs
 *   pre-filled with NaN: every element written), backward overwriting
 *   (NaN pre-filled) and accumulating into random gradients, each within
 *   1e-4 of the largest |element| of the CPU's result but at a few
 *   elements, where a probability or dS the two compute a float32 rounding
 *   apart lies at a bf16 rounding boundary and the two round it one bf16
 *   step apart (expect_close says how many; both are products of the same
 *   bf16 values with float32 sums in another order). The backward reads
 *   the CPU forward's att.
 * - Multi-head (NKV = NH), grouped-query (NKV 2 of NH 4) and multi-query
 *   (NKV 1); T 1, 7 and 140,
 *   HD 4 and 12 with the bodies' sums over HD in chunks of 5 (the GPU's
 *   64): one partial chunk, two full and a partial one. */
#define PW_CU_ABF_CHUNK 5

#include "../../common/cuda/cu_attn_bf16_body.h"
#include "bf16.h"
#include "opcheck.h"

/* ---- cu_attn_bf16.cu's entry points, each launch a loop over its threads ---- */

static void emu_f(float *out, float *att, const float *qkv, pw_cu_abf_dims d) {
  for (size_t i = 0; i < pw_cu_abf_q_n(d); i++) pw_cu_abf_fwd_body(out, att, qkv, d, i);
}

/* D: the backward's scratch (B NH T floats) */
static void emu_i(float *dqkv, const float *dout, const float *qkv, const float *att, float *D, pw_cu_abf_dims d,
                  int acc) {
  pw_cu_abf_saved sv = {att, D};
  for (size_t i = 0; i < pw_cu_abf_q_n(d); i++) pw_cu_abf_bwd_q_body(dqkv, dout, qkv, sv, d, acc, i);
  for (size_t i = 0; i < pw_cu_abf_kv_n(d); i++) pw_cu_abf_bwd_kv_body(dqkv, dout, qkv, sv, d, acc, i);
}

/* ---- comparison ------------------------------------------------------------ */

/* Within 1e-4 of max |want| everywhere but at a few elements (at most 1 in
 * 1000, and 3), each within 2^-8 of it: where the two float32 sums put a
 * probability or dS on either side of a bf16 rounding boundary, the
 * products take values one bf16 step apart (P of 0.05 one step off moves
 * an output by 2e-4 of v). A missing rounding, or a wrong index, moves
 * most elements further. NaN fails. */
static void expect_close(const char *what, const float *got, const float *want, size_t n) {
  double m = 0, worst = 0;
  size_t tipped = 0, allowed = n / 1000 > 3 ? n / 1000 : 3;
  for (size_t i = 0; i < n; i++) m = fabs(want[i]) > m ? fabs(want[i]) : m;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= 1e-4 * m) && (!(e <= m / 256) || ++tipped > allowed))
      fail_msg("%s: element %zu of %zu is %.9g, expected %.9g (1e-4 of max %.3g; %zu beyond it)", what, i, n, got[i],
               want[i], m, tipped);
    worst = e > worst ? e : worst;
  }
  print_message("  %-48s max err %.2e of %.3g, %zu beyond 1e-4\n", what, worst, m, tipped);
}

static float *alloc_f(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  assert_non_null(p);
  return p;
}
static void fill_nan(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = NAN;
}
static float *random_f(size_t n, float scale) {
  float *p = alloc_f(n);
  oc_fill(p, n, scale);
  return p;
}

/* ---- one shape --------------------------------------------------------------- */

static void compare(int B, int T, int NH, int NKV, int HD) {
  int C = NH * HD;
  pw_cu_abf_dims d = pw_cu_abf_dims_make(B, T, C, NH, NKV);
  size_t nqkv = (size_t)B * T * d.W, no = (size_t)B * T * C, naux = (size_t)B * NH * T * T;
  float *qkv = random_f(nqkv, 2.0f), *dout = random_f(no, 1.0f), *sc = alloc_f((size_t)T * T);
  float *D = alloc_f((size_t)B * NH * T);
  pw_bf16 *bs = malloc(pw_attention_bf16_scratch(B, T, C) * sizeof *bs);
  assert_non_null(bs);
  float *out = alloc_f(no), *att = alloc_f(naux), *eout = alloc_f(no), *eatt = alloc_f(naux);
  fill_nan(out, no), fill_nan(att, naux), fill_nan(eout, no), fill_nan(eatt, naux);
  char what[160];
  pw_attention_forward_bf16(out, att, bs, qkv, B, T, C, NH, NKV);
  emu_f(eout, eatt, qkv, d);
  snprintf(what, sizeof what, "attention bf16 T %d NH %d NKV %d HD %d: out", T, NH, NKV, HD);
  expect_close(what, eout, out, no);
  snprintf(what, sizeof what, "attention bf16 T %d NH %d NKV %d HD %d: att", T, NH, NKV, HD);
  expect_close(what, eatt, att, naux);
  for (int acc = 0; acc <= 1; acc++) {
    float *dq = acc ? random_f(nqkv, 1.0f) : alloc_f(nqkv), *edq = alloc_f(nqkv);
    if (!acc) fill_nan(dq, nqkv);
    memcpy(edq, dq, nqkv * sizeof *dq);
    pw_attention_backward_input_bf16(dq, sc, bs, dout, qkv, att, B, T, C, NH, NKV, acc);
    emu_i(edq, dout, qkv, att, D, d, acc);
    snprintf(what, sizeof what, "attention bf16 T %d NH %d NKV %d HD %d: dqkv%s", T, NH, NKV, HD, acc ? " acc" : "");
    expect_close(what, edq, dq, nqkv);
    free(dq), free(edq);
  }
  free(qkv), free(dout), free(sc), free(D), free(bs), free(out), free(att), free(eout), free(eatt);
}

static void test_attention_bf16(void **state) {
  (void)state;
  static const int shapes[][5] = {
      /* B, T, NH, NKV, HD */
      {2, 7, 3, 3, 4}, {2, 1, 4, 2, 12}, {2, 7, 4, 2, 12}, {1, 7, 4, 1, 12}, {1, 140, 2, 2, 12}, {1, 140, 4, 2, 4},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    compare(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attention_bf16),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
