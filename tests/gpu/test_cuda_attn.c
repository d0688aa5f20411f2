/* test_cuda_attn: the CUDA rope, attention (common/cuda/cu_attn.cu) and
 * attention_tiled kernels (cu_fa.cu: FlashAttention-2, float32 here) on a
 * GPU against the CPU rows of the op table (kernels.c: ops.h's kernels), on
 * random inputs.
 *
 * - Each op forward (outputs pre-filled with NaN: every element written;
 *   att or lse too) and backward overwriting (NaN pre-filled) and
 *   accumulating into random gradients, within 1e-5 of the largest
 *   |element| of the CPU's result; both backwards read the CPU forward's
 *   out and aux, so each kernel is checked alone.
 * - Every GPU result twice, the same bits (deterministic kernels).
 * - Shapes: those of the CPU emulation (test_cu_attn_emul) plus HD 64 and
 *   128 (one and two chunks of the plain kernels' 64 accumulators; the
 *   tiled attention's 32 x 128 forward and 64 x 64 / 32 x 64 backward
 *   tiles) and T 130, 300 and 1024
 *   (partial tiles, several, and rope's angles as far as a GPT-2's
 *   context).
 * - attention_tiled's masks (a sliding window, bidirectional, pad keys with
 *   rows whose keys are all pad) against the CPU's _mask rows.
 * Exit 0 when all hold, 1 with the first difference, 77 (skip) with a line
 * saying why where no CUDA device is visible. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/cuda/cu_attn.h"
#include "kernels.h"
#include "ops.h"

#define GPUTEST_NAME "test_cuda_attn"
#include "gputest.h"

#define CU(call)                                                                                    \
  do {                                                                                              \
    cudaError_t e_ = (call);                                                                        \
    if (e_ != cudaSuccess) {                                                                        \
      fprintf(stderr, "test_cuda_attn: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                                      \
    }                                                                                               \
  } while (0)

static void fill(float *x, size_t n, double s) {
  for (size_t i = 0; i < n; i++) x[i] = (float)(s * uniform());
}
static void fill_nan(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = NAN;
}
static float *host(size_t n) {
  float *p = calloc(n ? n : 1, sizeof(float));
  if (!p) {
    fprintf(stderr, "test_cuda_attn: out of memory\n");
    exit(1);
  }
  return p;
}
static float *dev(size_t n) {
  void *p = NULL;
  if (n) CU(cudaMalloc(&p, n * sizeof(float)));
  return p;
}
static void up(float *d, const float *h, size_t n) {
  if (n) CU(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
}
static void down(float *h, const float *d, size_t n) {
  if (n) CU(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
}

static int checks, failed;

/* |got - want| <= 1e-5 max|want| for every element (NaN fails); the first
 * difference said. */
static void expect_close(const char *what, const float *got, const float *want, size_t n) {
  double m = 0, worst = 0;
  for (size_t i = 0; i < n; i++) m = fabs(want[i]) > m ? fabs(want[i]) : m;
  checks++;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= 1e-5 * m)) {
      fprintf(stderr, "FAIL %s: element %zu of %zu is %.9g, expected %.9g (1e-5 of max %.3g)\n", what, i, n, got[i],
              want[i], m);
      failed++;
      return;
    }
    worst = e > worst ? e : worst;
  }
  printf("ok   %s: worst %.2e of max %.3g\n", what, m ? worst / m : 0.0, m);
}

static void expect_same_bits(const char *what, const float *a, const float *b, size_t n) {
  checks++;
  if (memcmp(a, b, n * sizeof(float))) {
    fprintf(stderr, "FAIL %s: two runs differ\n", what);
    failed++;
  }
}

/* Runs fn, waits for it, and fails on any error it queued. */
static void run(void (*fn)(const pw_kernel_io *), const pw_kernel_io *io) {
  fn(io);
  CU(cudaGetLastError());
  CU(cudaDeviceSynchronize());
}

typedef struct {
  int op;
  const char *name;
  void (*fwd)(const pw_kernel_io *io);
  void (*bwd)(const pw_kernel_io *io);
} gpu_op;

static const gpu_op OPS[] = {
    {PW_OP_ROPE, "rope", pw_cu_rope_f, pw_cu_rope_i},
    {PW_OP_ATTENTION, "attention", pw_cu_attention_f, pw_cu_attention_i},
    {PW_OP_ATTENTION_TILED, "attention_tiled", pw_cu_attention_tiled_f, pw_cu_attention_tiled_i},
};

/* mk (attention_tiled only; NULL: causal): window, bidir, pads (the
 * tokens' pad 0 at the end of each sequence and at the start of the first:
 * rows whose keys are all pad; 2: the second sequence all pad) */
static void check_op(const gpu_op *o, int B, int T, int NH, int NKV, int HD, const int *mk) {
  int C = NH * HD, W = C + 2 * NKV * HD, rope = o->op == PW_OP_ROPE;
  pw_node nd = {.op = (uint8_t)o->op, .C = W, .OC = rope ? W : C, .NH = NH, .NKV = NKV, .T = T, .base = 10000.0f};
  int32_t *tok = NULL, *d_tok = NULL;
  char mname[48] = "";
  if (mk) {
    nd.window = mk[0], nd.bidir = mk[1], nd.pad = 0, nd.in[1] = 1;
    if (mk[2]) {
      tok = (int32_t *)host((size_t)B * T);
      for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
          tok[(size_t)b * T + t] = t >= T - 1 - (T / 3 + b) % (T / 2 + 1) || (b == 0 && t < T / 5) ||
                                           (mk[2] == 2 && b == 1)
                                       ? 0
                                       : 1 + t % 50;
      d_tok = (int32_t *)dev((size_t)B * T);
      up((float *)d_tok, (const float *)tok, (size_t)B * T);
    } else {
      nd.in[1] = -1;
    }
    snprintf(mname, sizeof mname, " window %d%s%s", mk[0], mk[1] ? " bidir" : "", mk[2] ? " pads" : "");
  }
  if (NKV < NH) /* grouped-query shapes get Llama-3's rope scaling too */
    nd.rope_factor = 8.0f, nd.rope_low_freq = 1.0f, nd.rope_high_freq = 4.0f, nd.rope_orig_max_pos = 64;
  size_t nq = (size_t)B * T * W, no = rope ? nq : (size_t)B * T * C;
  size_t naux = o->op == PW_OP_ATTENTION ? (size_t)B * NH * T * T : o->op == PW_OP_ATTENTION_TILED ? (size_t)B * NH * T : 0;
  size_t nscr = o->op == PW_OP_ATTENTION ? (size_t)T * T : o->op == PW_OP_ATTENTION_TILED ? pw_attention_tiled_scratch(T, C, NH, NKV) : 0;
  float *qkv = host(nq), *dout = host(no), *out = host(no), *aux = host(naux), *scr = host(nscr), *din = host(nq);
  float *g1 = host(nq > naux ? nq : naux), *g2 = host(nq > naux ? nq : naux), *pre = host(nq);
  float *d_qkv = dev(nq), *d_dout = dev(no), *d_out = dev(no), *d_aux = dev(naux), *d_scr = dev(nscr), *d_din = dev(nq);
  char what[160];
  rng = (uint64_t)(o->op * 100000 + B * 10000 + T * 100 + NH * 10 + HD) * 0x9e3779b97f4a7c15ull + 1;
  fill(qkv, nq, 2.0); /* peaky softmax rows */
  fill(dout, no, 1.0);
  up(d_qkv, qkv, nq);
  up(d_dout, dout, no);

  /* forward: CPU, then the GPU twice from NaN */
  pw_kernel_io c = {.n = &nd, .in0 = qkv, .in1 = (float *)tok, .out = out, .aux = aux, .scratch = scr, .rows = B * T,
                    .B = B};
  pw_kernel_io g = {.n = &nd, .in0 = d_qkv, .in1 = (float *)d_tok, .out = d_out, .aux = d_aux, .scratch = d_scr,
                    .rows = B * T, .B = B};
  pw_kernel_of(o->op)->forward(&c);
  for (int k = 0; k < 2; k++) { /* poisoned from pre and din, not g1: it holds the first run's out */
    fill_nan(pre, nq);
    fill_nan(din, nq);
    up(d_out, pre, no);
    for (size_t at = 0; at < naux; at += nq) up(d_aux + at, din, naux - at < nq ? naux - at : nq);
    run(o->fwd, &g);
    down(k ? g2 : g1, d_out, no);
  }
  snprintf(what, sizeof what, "%s B=%d T=%d NH=%d NKV=%d HD=%d%s: out", o->name, B, T, NH, NKV, HD, mname);
  expect_close(what, g1, out, no);
  expect_same_bits(what, g1, g2, no);
  if (naux) {
    down(g1, d_aux, naux);
    snprintf(what, sizeof what, "%s B=%d T=%d NH=%d NKV=%d HD=%d%s: %s", o->name, B, T, NH, NKV, HD, mname,
             o->op == PW_OP_ATTENTION ? "att" : "lse");
    expect_close(what, g1, aux, naux);
  }

  /* backward from the CPU's forward, overwriting and accumulating */
  up(d_out, out, no);
  up(d_aux, aux, naux);
  c.dout = dout, c.din0 = din;
  g.dout = d_dout, g.din0 = d_din;
  for (int acc = 0; acc <= 1; acc++) {
    c.acc0 = g.acc0 = acc;
    if (acc)
      fill(pre, nq, 0.5);
    else
      fill_nan(pre, nq);
    memcpy(din, pre, nq * sizeof(float));
    pw_kernel_of(o->op)->backward_input(&c);
    for (int k = 0; k < 2; k++) {
      up(d_din, pre, nq);
      run(o->bwd, &g);
      down(k ? g2 : g1, d_din, nq);
    }
    snprintf(what, sizeof what, "%s B=%d T=%d NH=%d NKV=%d HD=%d%s acc=%d: dqkv", o->name, B, T, NH, NKV, HD, mname,
             acc);
    expect_close(what, g1, din, nq);
    expect_same_bits(what, g1, g2, nq);
  }
  free(qkv), free(dout), free(out), free(aux), free(scr), free(din), free(g1), free(g2), free(pre), free(tok);
  if (d_tok) CU(cudaFree(d_tok));
  float *d[] = {d_qkv, d_dout, d_out, d_aux, d_scr, d_din};
  for (size_t k = 0; k < sizeof d / sizeof *d; k++) CU(cudaFree(d[k]));
}

int main(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    printf("SKIP test_cuda_attn: no CUDA device visible (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  static const int shapes[][5] = {/* B, T, NH, NKV, HD: multi-head, then grouped-query and multi-query */
                                  {2, 1, 1, 1, 4},    {2, 1, 3, 3, 16},  {2, 4, 3, 3, 4},    {2, 7, 3, 3, 16},
                                  {2, 33, 1, 1, 4},   {2, 33, 3, 3, 16}, {2, 130, 2, 2, 64}, {2, 300, 2, 2, 128},
                                  {1, 1024, 4, 4, 64}, {2, 33, 4, 2, 16}, {2, 130, 8, 2, 64}, {1, 300, 4, 1, 64}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
    for (size_t k = 0; k < sizeof OPS / sizeof *OPS; k++)
      check_op(&OPS[k], shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4], NULL);
  /* the tiled attention's masks (the plain one's are the CPU's only) */
  static const int masked[][8] = {/* B, T, NH, NKV, HD, window, bidir, pads */
                                  {2, 200, 4, 2, 64, 37, 0, 0},
                                  {2, 130, 4, 2, 64, 0, 1, 2},
                                  {2, 130, 4, 4, 64, 0, 0, 1},
                                  {2, 300, 2, 2, 128, 100, 0, 1},
                                  {2, 1024, 2, 2, 64, 0, 1, 1}};
  for (size_t s = 0; s < sizeof masked / sizeof *masked; s++)
    check_op(&OPS[2], masked[s][0], masked[s][1], masked[s][2], masked[s][3], masked[s][4], masked[s] + 5);
  printf("test_cuda_attn: %d of %d checks passed\n", checks - failed, checks);
  return failed ? 1 : 0;
}
