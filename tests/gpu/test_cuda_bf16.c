/* test_cuda_bf16: the CUDA backend's bf16 rows (train.precision "bf16":
 * cu_ops.cu's linear with io->wb, cu_attn_bf16.cu's attentions, the
 * backend's round_bf16) on a GPU against the CPU's bf16 rows (kernels.c:
 * bf16.h's pw_linear_*_bf16, pw_attention_*_bf16), on random inputs.
 *
 * - round_bf16 bit for bit against pw_bf16_round_f32, over random floats
 *   and the edge patterns (ties, NaNs, infinities, subnormals).
 * - linear at a small odd shape and a GPT-2-small one (768 in, 3072 out,
 *   256 rows), with and without a bias: forward (out pre-filled with NaN;
 *   the weight's bf16 copy io->wb the CPU's bits), backward_input
 *   overwriting (into NaN) and accumulating, backward_weight accumulating
 *   into random gradients, the one-pass backward: within LIN_TOL of the
 *   largest |element| of the CPU's (both products of the same bf16 values
 *   with float32 sums: the CPU's in order, the tensor cores' in their own
 *   order and alignment of the addends).
 * - attention and attention_tiled (cu_fa.cu: WMMA on the tensor cores),
 *   multi-head and grouped-query, T up to 300 (the tiled forward's third
 *   key tile), HD 64 and 128: forward (out, att or
 *   lse), backward overwriting and accumulating, both reading the CPU
 *   forward's out and aux: within 1e-4 of the largest but at the few
 *   elements (1 in 1000 at most, within 2^-8) where the two sums put a
 *   probability or dS on either side of a bf16 rounding boundary.
 * - attention_tiled's masks: a sliding window, bidirectional with pad keys,
 *   a window with pads (rows whose keys are all pad), the same tolerance.
 * - Every GPU result computed twice: the same bits.
 * Exit 0 when all hold, 1 at the first difference, 77 with "SKIP
 * test_cuda_bf16: why" where no CUDA device is visible. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"
#include "model.h"
#include "ops.h"
#include "pw_cuda.h"

#define GPUTEST_NAME "test_cuda_bf16"
#include "gputest.h"

/* linear's products run on the tensor cores (cuBLAS's default math), whose
 * float32 accumulation adds in its own order and aligns addends its own
 * way: 1e-4 of the largest (the pedantic path met 1e-5). */
#define LIN_TOL 1e-4

static const pw_backend *be;
static int checks;


static void must(int rc, const pw_err *err, const char *what) {
  if (!rc) return;
  char buf[600];
  die("%s: %s", what, pw_err_str(err, buf, sizeof buf));
}

static void *host(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) die("%s%s", "out of host memory", "");
  return p;
}
static void *dev(size_t bytes) {
  void *p = be->alloc(be, bytes ? bytes : 1);
  if (!p) die("%s%s", "out of device memory", "");
  return p;
}
static void up(void *d, const void *h, size_t bytes) {
  pw_err err = {0};
  must(be->upload(be, d, h, bytes, &err), &err, "upload");
}
static void down(void *h, const void *d, size_t bytes) {
  pw_err err = {0};
  must(be->download(be, h, d, bytes, &err), &err, "download");
}
static void sync_dev(const char *what) {
  pw_err err = {0};
  must(be->sync(be, &err), &err, what);
}

static float *rand_f(size_t n, double scale) {
  float *p = host(n * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = (float)(scale * uniform());
  return p;
}
static float *nan_f(size_t n) {
  float *p = host(n * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = NAN;
  return p;
}
static float *dup_f(const float *x, size_t n) {
  float *p = host(n * sizeof *p);
  memcpy(p, x, n * sizeof *p);
  return p;
}

/* Within tol of max |want| everywhere, but (tipped) at up to 1 in 1000
 * elements (and 3) within 2^-8 of it: a bf16 rounding tipped. NaN fails. */
static void expect_close(const char *what, const float *got, const float *want, size_t n, double tol, int tipped_ok) {
  double m = 0, worst = 0;
  size_t exact = 0, tipped = 0, allowed = tipped_ok ? (n / 1000 > 3 ? n / 1000 : 3) : 0;
  for (size_t i = 0; i < n; i++) m = fabs(want[i]) > m ? fabs(want[i]) : m;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= tol * m) && (!(e <= m / 256) || ++tipped > allowed)) {
      fprintf(stderr, "test_cuda_bf16: FAILED: %s[%zu]: %.9g, the CPU's %.9g (tolerance %g of %g; %zu tipped)\n", what,
              i, (double)got[i], (double)want[i], tol, m, tipped);
      exit(1);
    }
    worst = e > worst ? e : worst;
    exact += memcmp(&got[i], &want[i], sizeof(float)) == 0;
  }
  checks++;
  printf("ok %-58s max err %.2e of %.3g; %zu tipped; %zu of %zu the CPU's bits\n", what, worst, m, tipped, exact, n);
}

static void expect_bits(const char *what, const void *a, const void *b, size_t bytes) {
  checks++;
  if (memcmp(a, b, bytes)) die("%s: %s", what, "two GPU runs differ (not deterministic)");
}

/* ---- round_bf16 ------------------------------------------------------------------------ */

static void check_round(void) {
  size_t n = 1 << 20;
  float *x = rand_f(n, 1000.0);
  static const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                  0xffffffffu, 0x00000001u, 0x00008000u, 0x00018000u, 0x3f808000u, 0x3f818000u,
                                  0x3f807fffu, 0x3f808001u, 0x7f7fffffu, 0x807fffffu};
  for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) memcpy(&x[i], &edge[i], sizeof x[i]);
  for (size_t i = 64; i < 64 + 65536; i++) { /* every high half, a tie below it */
    uint32_t u = (uint32_t)(i - 64) << 16 | 0x8000u;
    memcpy(&x[i], &u, sizeof u);
  }
  float *want = dup_f(x, n), *got = host(n * sizeof *got), *again = host(n * sizeof *again);
  pw_bf16_round_f32(want, n);
  float *d = dev(n * sizeof *d);
  for (int r = 0; r < 2; r++) {
    up(d, x, n * sizeof *x);
    be->round_bf16(be, d, n);
    sync_dev("round_bf16");
    down(r ? again : got, d, n * sizeof *d);
  }
  checks++;
  if (memcmp(got, want, n * sizeof *got))
    for (size_t i = 0; i < n; i++)
      if (memcmp(&got[i], &want[i], sizeof got[i])) {
        uint32_t a, b, s;
        memcpy(&a, &got[i], 4), memcpy(&b, &want[i], 4), memcpy(&s, &x[i], 4);
        fprintf(stderr, "test_cuda_bf16: FAILED: round_bf16 of 0x%08x: 0x%08x, the CPU's 0x%08x\n", (unsigned)s,
                (unsigned)a, (unsigned)b);
        exit(1);
      }
  expect_bits("round_bf16", got, again, n * sizeof *got);
  printf("ok %-58s the CPU's bits, %zu values\n", "round_bf16", n);
  be->free(be, d);
  free(x), free(want), free(got), free(again);
}

/* ---- one row on both sides -------------------------------------------------------------- */

/* A row's buffers: host (the CPU's) and device, each n floats. */
typedef struct {
  float *h, *d;
  size_t n;
} buf;

static buf mk(size_t n, const float *init) {
  buf b = {host(n * sizeof(float)), dev(n * sizeof(float)), n};
  if (init) memcpy(b.h, init, n * sizeof(float)), up(b.d, b.h, n * sizeof(float));
  return b;
}
static void drop(buf *b) {
  free(b->h);
  if (b->d) be->free(be, b->d);
  memset(b, 0, sizeof *b);
}

/* Runs cpu on hio and gpu on dio (twice, outs reset to start before each:
 * the same bits) from the same start; compares each out. */
static void pass(const char *what, pw_kernel_fn cpu, pw_kernel_fn gpu, const pw_kernel_io *hio, const pw_kernel_io *dio,
                 buf *const *outs, const char *const *names, int nout, int nan_start, double tol, int tipped_ok) {
  float *start[4], *got[4], *again[4];
  for (int j = 0; j < nout; j++) {
    start[j] = nan_start ? nan_f(outs[j]->n) : rand_f(outs[j]->n, 1.0);
    memcpy(outs[j]->h, start[j], outs[j]->n * sizeof(float));
    got[j] = host(outs[j]->n * sizeof(float)), again[j] = host(outs[j]->n * sizeof(float));
  }
  cpu(hio);
  for (int r = 0; r < 2; r++) {
    for (int j = 0; j < nout; j++) up(outs[j]->d, start[j], outs[j]->n * sizeof(float));
    gpu(dio);
    sync_dev(what);
    for (int j = 0; j < nout; j++) down(r ? again[j] : got[j], outs[j]->d, outs[j]->n * sizeof(float));
  }
  for (int j = 0; j < nout; j++) {
    char label[200]; /* what (160) and a name */
    snprintf(label, sizeof label, "%s %s", what, names[j]);
    expect_bits(label, got[j], again[j], outs[j]->n * sizeof(float));
    expect_close(label, got[j], outs[j]->h, outs[j]->n, tol, tipped_ok);
    free(start[j]), free(got[j]), free(again[j]);
  }
}

/* ---- linear ------------------------------------------------------------------------------ */

static void check_linear(int N, int C, int OC, int with_bias) {
  char name[128];
  snprintf(name, sizeof name, "linear bf16 N %d C %d OC %d%s:", N, C, OC, with_bias ? " bias" : "");
  pw_node nd;
  memset(&nd, 0, sizeof nd);
  nd.op = PW_OP_LINEAR, nd.C = C, nd.OC = OC, nd.T = N;
  size_t nx = (size_t)N * C, ny = (size_t)N * OC, nw = (size_t)OC * C;
  float *x0 = rand_f(nx, 1.0), *w0 = rand_f(nw, 0.1), *b0 = rand_f((size_t)OC, 0.5), *dy0 = rand_f(ny, 1.0);
  buf x = mk(nx, x0), w = mk(nw, w0), b = mk((size_t)OC, b0), dy = mk(ny, dy0);
  buf out = mk(ny, NULL), dx = mk(nx, NULL), dw = mk(nw, NULL), db = mk((size_t)OC, NULL);
  pw_bf16 *wb_h = host(nw * sizeof(pw_bf16)), *sc_h = host((nx + ny) * sizeof(pw_bf16));
  pw_bf16 *wb_d = dev(nw * sizeof(pw_bf16)), *sc_d = dev((nx + ny) * sizeof(pw_bf16));
  pw_kernel_io h, d;
  memset(&h, 0, sizeof h);
  h.n = &nd, h.rows = N, h.B = 1;
  d = h;
  h.in0 = x.h, h.w = w.h, h.b = with_bias ? b.h : NULL, h.out = out.h, h.dout = dy.h, h.din0 = dx.h, h.dw = dw.h;
  h.db = with_bias ? db.h : NULL, h.wb = wb_h, h.bscratch = sc_h;
  d.in0 = x.d, d.w = w.d, d.b = with_bias ? b.d : NULL, d.out = out.d, d.dout = dy.d, d.din0 = dx.d, d.dw = dw.d;
  d.db = with_bias ? db.d : NULL, d.wb = wb_d, d.bscratch = sc_d;
  const pw_kernel *kc = pw_kernel_of(PW_OP_LINEAR), *kg = be->kernel_of(PW_OP_LINEAR);
  char what[160];
  buf *o1[] = {&out};
  static const char *const n_out[] = {"out"};
  snprintf(what, sizeof what, "%s forward", name);
  pass(what, kc->forward, kg->forward, &h, &d, o1, n_out, 1, 1, LIN_TOL, 0);
  { /* the weight's copy the backward reads: the CPU's bits */
    pw_bf16 *got = host(nw * sizeof(pw_bf16));
    down(got, wb_d, nw * sizeof(pw_bf16));
    snprintf(what, sizeof what, "%s io->wb", name);
    checks++;
    if (memcmp(got, wb_h, nw * sizeof(pw_bf16))) die("%s: %s", what, "not the CPU's bf16 bits");
    printf("ok %-58s the CPU's bits\n", what);
    free(got);
  }
  buf *oi[] = {&dx};
  static const char *const n_i[] = {"dinp"};
  for (int acc = 0; acc <= 1; acc++) {
    h.acc0 = d.acc0 = acc;
    snprintf(what, sizeof what, "%s backward_input%s", name, acc ? " acc" : "");
    pass(what, kc->backward_input, kg->backward_input, &h, &d, oi, n_i, 1, !acc, LIN_TOL, 0);
  }
  buf *ow[] = {&dw, &db};
  static const char *const n_w[] = {"dw", "db"};
  snprintf(what, sizeof what, "%s backward_weight", name);
  pass(what, kc->backward_weight, kg->backward_weight, &h, &d, ow, n_w, with_bias ? 2 : 1, 0, LIN_TOL, 0);
  buf *ob[] = {&dx, &dw, &db};
  static const char *const n_b[] = {"dinp", "dw", "db"};
  h.acc0 = d.acc0 = 1;
  snprintf(what, sizeof what, "%s backward (W then I) acc", name);
  pass(what, kc->backward, kg->backward, &h, &d, ob, n_b, with_bias ? 3 : 2, 0, LIN_TOL, 0);
  drop(&x), drop(&w), drop(&b), drop(&dy), drop(&out), drop(&dx), drop(&dw), drop(&db);
  free(x0), free(w0), free(b0), free(dy0), free(wb_h), free(sc_h);
  be->free(be, wb_d), be->free(be, sc_d);
}

/* ---- attention ---------------------------------------------------------------------------- */

/* window > 0, bidir, pads (pad 0 ending each sequence and starting the
 * first: rows whose keys are all pad): the tiled attention's masks */
static void check_attention(int op, int B, int T, int NH, int NKV, int HD, int window, int bidir, int pads) {
  int tiled = op == PW_OP_ATTENTION_TILED, C = NH * HD;
  size_t W = (size_t)C + 2 * (size_t)NKV * HD;
  char name[128];
  snprintf(name, sizeof name, "%s bf16 B %d T %d NH %d NKV %d HD %d%s%s%s:", tiled ? "attention_tiled" : "attention",
           B, T, NH, NKV, HD, window ? " window" : "", bidir ? " bidir" : "", pads ? " pads" : "");
  pw_node nd;
  memset(&nd, 0, sizeof nd);
  nd.op = (uint8_t)op, nd.C = (int)W, nd.OC = C, nd.NH = NH, nd.NKV = NKV, nd.T = T;
  nd.window = window, nd.bidir = bidir, nd.pad = 0, nd.in[1] = pads ? 1 : -1;
  int32_t *tok_h = NULL, *tok_d = NULL;
  if (pads) {
    tok_h = host((size_t)B * T * sizeof *tok_h);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        tok_h[(size_t)b * T + t] = t >= T - 1 - (T / 3 + b) % (T / 2 + 1) || (b == 0 && t < T / 5) ? 0 : 1 + t % 50;
    tok_d = dev((size_t)B * T * sizeof *tok_d);
    up(tok_d, tok_h, (size_t)B * T * sizeof *tok_h);
  }
  size_t nqkv = (size_t)B * T * W, no = (size_t)B * T * C;
  size_t naux = tiled ? (size_t)B * NH * T : (size_t)B * NH * T * T;
  size_t nsc = tiled ? pw_attention_tiled_scratch(T, C, NH, NKV) : (size_t)T * T;
  size_t nbs = tiled ? pw_attention_tiled_bf16_scratch(B, T, C) : pw_attention_bf16_scratch(B, T, C);
  float *qkv0 = rand_f(nqkv, 2.0), *dy0 = rand_f(no, 1.0);
  buf qkv = mk(nqkv, qkv0), dy = mk(no, dy0), out = mk(no, NULL), aux = mk(naux, NULL), dq = mk(nqkv, NULL);
  buf sc = mk(nsc, NULL);
  pw_bf16 *bs_h = host(nbs * sizeof(pw_bf16)), *bs_d = dev(nbs * sizeof(pw_bf16));
  pw_kernel_io h, d;
  memset(&h, 0, sizeof h);
  h.n = &nd, h.rows = B * T, h.B = B;
  d = h;
  h.in0 = qkv.h, h.out = out.h, h.aux = aux.h, h.dout = dy.h, h.din0 = dq.h, h.scratch = sc.h, h.bscratch = bs_h;
  d.in0 = qkv.d, d.out = out.d, d.aux = aux.d, d.dout = dy.d, d.din0 = dq.d, d.scratch = sc.d, d.bscratch = bs_d;
  h.in1 = (float *)tok_h, d.in1 = (float *)tok_d;
  const pw_kernel *kc = pw_kernel_of(op), *kg = be->kernel_of(op);
  char what[160];
  buf *of[] = {&out, &aux};
  static const char *const n_f[] = {"out", "aux"};
  snprintf(what, sizeof what, "%s forward", name);
  pass(what, kc->forward, kg->forward, &h, &d, of, n_f, 2, 1, 1e-4, 1);
  /* the backwards read the CPU forward's out and aux */
  up(out.d, out.h, no * sizeof(float));
  up(aux.d, aux.h, naux * sizeof(float));
  buf *oi[] = {&dq};
  static const char *const n_i[] = {"dqkv"};
  for (int acc = 0; acc <= 1; acc++) {
    h.acc0 = d.acc0 = acc;
    snprintf(what, sizeof what, "%s backward_input%s", name, acc ? " acc" : "");
    pass(what, kc->backward_input, kg->backward_input, &h, &d, oi, n_i, 1, !acc, 1e-4, 1);
  }
  drop(&qkv), drop(&dy), drop(&out), drop(&aux), drop(&dq), drop(&sc);
  free(qkv0), free(dy0), free(bs_h), free(tok_h);
  be->free(be, bs_d);
  if (tok_d) be->free(be, tok_d);
}

int main(void) {
  rng = 0x2545f4914f6cdd1dull; /* its inputs as before */
  pw_err err = {0};
  char buf_[600];
  if (!pw_cuda_built()) {
    printf("SKIP test_cuda_bf16: built without CUDA\n");
    return 77;
  }
  int rc = pw_cuda_open(0, &be, &err);
  if (rc == PW_EUNAVAIL) {
    printf("SKIP test_cuda_bf16: %s\n", pw_err_str(&err, buf_, sizeof buf_));
    return 77;
  }
  must(rc, &err, "pw_cuda_open(0)");
  printf("%s; CPU bf16 products: %s\n", be->name, pw_gemm_bf16_name());
  check_round();
  check_linear(10, 13, 7, 1);
  check_linear(10, 13, 7, 0);
  check_linear(256, 768, 3072, 1);
  check_linear(256, 3072, 768, 0);
  static const int shapes[][5] = {
      /* B, T, NH, NKV, HD */
      {2, 7, 3, 3, 4},
      {2, 64, 4, 2, 16},
      {2, 300, 4, 4, 64},
      {1, 300, 8, 2, 64},
      {2, 130, 2, 2, 128},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int *s = shapes[i];
    check_attention(PW_OP_ATTENTION, s[0], s[1], s[2], s[3], s[4], 0, 0, 0);
    check_attention(PW_OP_ATTENTION_TILED, s[0], s[1], s[2], s[3], s[4], 0, 0, 0);
  }
  /* the tiled attention's masks on the GPU (the plain one's are the CPU's only) */
  check_attention(PW_OP_ATTENTION_TILED, 2, 300, 4, 2, 64, 70, 0, 0);
  check_attention(PW_OP_ATTENTION_TILED, 2, 130, 4, 4, 64, 0, 1, 1);
  check_attention(PW_OP_ATTENTION_TILED, 2, 200, 2, 2, 128, 40, 0, 1);
  pw_cuda_close(be);
  printf("test_cuda_bf16: all %d checks passed\n", checks);
  return 0;
}
