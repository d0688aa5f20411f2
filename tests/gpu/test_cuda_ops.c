/* test_cuda_ops: the CUDA backend (common/cuda/: cu_ops.cu's kernel table,
 * cu_optim.cu's loops, cu_backend.cu's memory and errors) on a GPU against
 * the CPU (kernels.c's rows, optim.c's step), on random inputs.
 *
 * - Every op of the table but rope and the attentions (test_cuda_attn) and
 *   LoRA (not on the GPU), at a small odd shape (13 channels: lanes'
 *   tails) and a GPT-2-small one (768 channels, 3072 outputs, a 50257
 *   vocabulary, 256 rows): forward (outputs and aux pre-filled with NaN on
 *   both sides: every element written), backward_input overwriting (into
 *   NaN) and accumulating, backward_weight accumulating into random
 *   gradients, the one-pass backward where the row has one; both
 *   backwards read the CPU forward's out and aux, so each kernel is
 *   checked alone. swiglu and add also with both inputs one value.
 * - Each result within 1e-5 of the largest |element| of the CPU's (the
 *   count of elements with the CPU's very bits printed too), and every GPU
 *   result computed twice: the same bits (deterministic kernels).
 * - AdamW and SGD over an MLP program's parameters against pw_optim_step
 *   (1e-5; the bits are expected to be the CPU's), sqnorm against
 *   pw_grad_sqnorm (1e-12) and twice the same bits, add_into.
 * - Errors: a failed copy says so and leaves nothing behind; a recorded
 *   failure comes back from sync once; a missing device is PW_ENOENT.
 * Exit 0 when all hold, 1 at the first difference, 77 with "SKIP
 * test_cuda_ops: why" where no CUDA device is visible. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pw_cuda.h"
#include "kernels.h"
#include "model.h"
#include "optim.h"
#include "prog.h"

#define GPUTEST_NAME "test_cuda_ops"
#include "gputest.h"

static const pw_backend *be;
static int checks;


static float *host(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  if (!p) die("%s%s", "out of host memory", "");
  return p;
}

static void must(int rc, const pw_err *err, const char *what) {
  if (!rc) return;
  char buf[600];
  die("%s: %s", what, pw_err_str(err, buf, sizeof buf));
}

static void up(float *d, const float *h, size_t n) {
  pw_err err = {0};
  must(be->upload(be, d, h, n * sizeof(float), &err), &err, "upload");
}
static void down(float *h, const float *d, size_t n) {
  pw_err err = {0};
  must(be->download(be, h, d, n * sizeof(float), &err), &err, "download");
}

/* |got - want| <= 1e-5 max |want| everywhere; NaN fails */
static void expect_close(const char *op, const char *what, const float *got, const float *want, size_t n) {
  double m = 0, worst = 0;
  size_t exact = 0;
  for (size_t i = 0; i < n; i++) m = fabs(want[i]) > m ? fabs(want[i]) : m;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= 1e-5 * m)) {
      fprintf(stderr, "test_cuda_ops: FAILED: %s %s[%zu]: %.9g, the CPU's %.9g (tolerance 1e-5 of %g)\n", op, what, i,
              (double)got[i], (double)want[i], m);
      exit(1);
    }
    worst = e > worst ? e : worst;
    exact += memcmp(&got[i], &want[i], sizeof(float)) == 0;
  }
  checks++;
  printf("ok %-34s %-22s max err %.2e of %.3g; %zu of %zu the CPU's bits\n", op, what, worst, m, exact, n);
}

static void expect_bits(const char *op, const char *what, const float *a, const float *b, size_t n) {
  checks++;
  if (memcmp(a, b, n * sizeof(float))) die("%s %s: two GPU runs differ (not deterministic)", op, what);
}

/* ---- one op ---------------------------------------------------------------------------- */

enum { IN0, IN1, OUT, AUX, W, BIAS, DW, DB, DIN0, DIN1, DOUT, NBUF };
static const char *buf_name[NBUF] = {"in0", "in1", "out", "aux", "w", "b", "dw", "db", "din0", "din1", "dout"};

typedef struct {
  char name[64];
  pw_node node;
  int rows, B;
  size_t n[NBUF];  /* floats of each buffer, 0: none */
  int tok0, tok1;  /* in0 / in1 hold int32 tokens below this (0: floats) */
  int alias;       /* x op x: in1 is in0, din1 is din0 (acc1 1) */
  float loss_scale;
} opcase;

typedef struct {
  float *h[NBUF], *d[NBUF];
} bufs;

static void fill(float *x, size_t n, int tok) {
  for (size_t i = 0; i < n; i++) {
    if (tok) {
      int32_t t = (int32_t)((uniform() + 1.0) * 0.5 * tok) % tok;
      memcpy(&x[i], &t, sizeof t);
    } else {
      x[i] = (float)(2.0 * uniform());
    }
  }
}
static void fill_nan(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = NAN;
}

static pw_kernel_io io_of(const opcase *c, float *const *p, int acc) {
  pw_kernel_io io;
  memset(&io, 0, sizeof io);
  io.n = &c->node;
  io.in0 = p[IN0], io.in1 = c->alias ? p[IN0] : p[IN1], io.out = p[OUT], io.aux = p[AUX];
  io.w = p[W], io.b = p[BIAS], io.dw = p[DW], io.db = p[DB];
  io.din0 = p[DIN0], io.din1 = c->alias ? p[DIN0] : p[DIN1], io.dout = p[DOUT];
  io.rows = c->rows, io.B = c->B, io.acc0 = acc, io.acc1 = c->alias ? 1 : acc;
  io.loss_scale = c->loss_scale;
  return io;
}

/* the GPU's copy of buffer k set to the host's */
static void sync_buf(const opcase *c, bufs *b, int k) {
  if (c->n[k]) up(b->d[k], b->h[k], c->n[k]);
}

/* GPU run of f twice from the same start (buffers ks uploaded from `start`
 * first), results downloaded after the first; the second must repeat it */
static void gpu_twice(const opcase *c, bufs *b, pw_kernel_fn f, int acc, const int *ks, int nk, float **start,
                      float **got, const char *what) {
  float *again[NBUF] = {0};
  for (int r = 0; r < 2; r++) {
    for (int j = 0; j < nk; j++) up(b->d[ks[j]], start[j], c->n[ks[j]]);
    pw_kernel_io io = io_of(c, b->d, acc);
    f(&io);
    pw_err err = {0};
    must(be->sync(be, &err), &err, c->name);
    for (int j = 0; j < nk; j++) {
      float *dst = r == 0 ? got[j] : (again[j] = host(c->n[ks[j]]));
      down(dst, b->d[ks[j]], c->n[ks[j]]);
    }
  }
  for (int j = 0; j < nk; j++) {
    expect_bits(c->name, what, got[j], again[j], c->n[ks[j]]);
    free(again[j]);
  }
}

/* one pass (forward, I, W or both) on the CPU and the GPU from the same
 * start; ks: the buffers it writes, compared */
static void pass(const opcase *c, bufs *b, pw_kernel_fn cpu, pw_kernel_fn gpu, int acc, const int *ks, int nk,
                 int nan_start, const char *what) {
  float *start[NBUF], *got[NBUF];
  for (int j = 0; j < nk; j++) {
    size_t n = c->n[ks[j]];
    start[j] = host(n), got[j] = host(n);
    if (nan_start)
      fill_nan(start[j], n);
    else
      fill(start[j], n, 0);
    memcpy(b->h[ks[j]], start[j], n * sizeof(float));
  }
  pw_kernel_io io = io_of(c, b->h, acc);
  cpu(&io);
  gpu_twice(c, b, gpu, acc, ks, nk, start, got, what);
  for (int j = 0; j < nk; j++) {
    char label[64];
    snprintf(label, sizeof label, "%s %s", what, buf_name[ks[j]]);
    expect_close(c->name, label, got[j], b->h[ks[j]], c->n[ks[j]]);
    free(start[j]), free(got[j]);
  }
}

static void check_op(const opcase *c) {
  const pw_kernel *kc = pw_kernel_of(c->node.op), *kg = be->kernel_of(c->node.op);
  if (!kg->forward) die("%s: no CUDA forward%s", c->name, "");
  bufs b;
  memset(&b, 0, sizeof b);
  for (int k = 0; k < NBUF; k++) {
    if (!c->n[k]) continue;
    b.h[k] = host(c->n[k]);
    fill(b.h[k], c->n[k], k == IN0 ? c->tok0 : k == IN1 ? c->tok1 : 0);
    if (!(b.d[k] = be->alloc(be, c->n[k] * sizeof(float)))) die("%s: %s: no device memory", c->name, buf_name[k]);
    sync_buf(c, &b, k);
  }
  int fwd[2] = {OUT, AUX};
  pass(c, &b, kc->forward, kg->forward, 0, fwd, c->n[AUX] ? 2 : 1, 1, "forward");
  /* the backwards read the CPU's out and aux */
  sync_buf(c, &b, OUT), sync_buf(c, &b, AUX);
  if (kc->backward_input) {
    if (!kg->backward_input) die("%s: no CUDA backward_input%s", c->name, "");
    int ki[2] = {DIN0, DIN1};
    int nk = c->n[DIN1] && !c->alias ? 2 : 1;
    pass(c, &b, kc->backward_input, kg->backward_input, 0, ki, nk, 1, "backward_input");
    pass(c, &b, kc->backward_input, kg->backward_input, 1, ki, nk, 0, "backward_input acc");
  }
  if (kc->backward_weight) {
    if (!kg->backward_weight) die("%s: no CUDA backward_weight%s", c->name, "");
    int kw[2] = {DW, DB};
    pass(c, &b, kc->backward_weight, kg->backward_weight, 0, kw, c->n[DB] ? 2 : 1, 0, "backward_weight");
  }
  if (kc->backward && kg->backward) {
    int kb[3] = {DIN0, DW, DB};
    pass(c, &b, kc->backward, kg->backward, 1, kb, c->n[DB] ? 3 : 2, 0, "backward (W, I)");
  }
  for (int k = 0; k < NBUF; k++) {
    free(b.h[k]);
    if (b.d[k]) be->free(be, b.d[k]);
  }
}

/* ---- the cases ------------------------------------------------------------------------------ */

typedef struct {
  const char *tag;
  int B, T, C, OC, V;
} shape;

static opcase base_case(const shape *s, const char *op, int kind) {
  opcase c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "%s (%s)", op, s->tag);
  c.node.op = (uint8_t)kind;
  c.node.C = s->C, c.node.OC = s->C, c.node.T = s->T, c.node.eps = 1e-5f, c.node.w = -1, c.node.b = -1;
  c.rows = s->B * s->T, c.B = s->B;
  c.loss_scale = 1.0f / (float)(c.rows * 3);
  return c;
}

/* unary ops over (N, C): in0, out, din0, dout */
static opcase unary(const shape *s, const char *op, int kind, size_t aux) {
  opcase c = base_case(s, op, kind);
  size_t nc = (size_t)c.rows * s->C;
  c.n[IN0] = c.n[OUT] = c.n[DIN0] = c.n[DOUT] = nc;
  c.n[AUX] = aux;
  return c;
}

static void run_shape(const shape *s) {
  size_t N = (size_t)s->B * s->T, NC = N * s->C;
  opcase c;

  c = base_case(s, "embed", PW_OP_EMBED);
  c.n[IN0] = N, c.tok0 = s->V, c.n[OUT] = c.n[DOUT] = NC, c.n[W] = c.n[DW] = (size_t)s->V * s->C;
  check_op(&c);

  c = unary(s, "posembed", PW_OP_POSEMBED, 0);
  c.n[W] = c.n[DW] = (size_t)s->T * s->C;
  check_op(&c);

  for (int bias = 0; bias <= 1; bias++) {
    c = base_case(s, bias ? "linear, bias" : "linear", PW_OP_LINEAR);
    c.node.OC = s->OC;
    c.n[IN0] = c.n[DIN0] = NC, c.n[OUT] = c.n[DOUT] = N * s->OC, c.n[W] = c.n[DW] = (size_t)s->OC * s->C;
    if (bias) c.n[BIAS] = c.n[DB] = s->OC;
    check_op(&c);
  }

  c = unary(s, "layernorm", PW_OP_LAYERNORM, 2 * N);
  c.n[W] = c.n[DW] = c.n[BIAS] = c.n[DB] = s->C;
  check_op(&c);
  c = unary(s, "rmsnorm", PW_OP_RMSNORM, N);
  c.node.eps = 1e-6f;
  c.n[W] = c.n[DW] = s->C;
  check_op(&c);
  c = unary(s, "rmsnorm_offset", PW_OP_RMSNORM_OFFSET, N); /* Gemma's 1 + w */
  c.node.eps = 1e-6f, c.node.base = 1.0f;
  c.n[W] = c.n[DW] = s->C;
  check_op(&c);
  if (s->C % 8 == 0) { /* Qwen3's qk_norm: the width as 4 q, 2 k and 2 v heads of C/8 */
    c = unary(s, "qk_norm", PW_OP_QKNORM, N * 6);
    c.node.NH = 4, c.node.NKV = 2, c.node.eps = 1e-6f;
    c.n[W] = c.n[DW] = c.n[BIAS] = c.n[DB] = s->C / 8;
    check_op(&c);
  }
  c = unary(s, "scale", PW_OP_SCALE, 0); /* Gemma's embedding scale */
  c.node.base = 27.7128129f;
  check_op(&c);

  c = unary(s, "gelu", PW_OP_GELU, NC);
  check_op(&c);
  c = unary(s, "relu", PW_OP_RELU, 0);
  check_op(&c);
  c = unary(s, "silu", PW_OP_SILU, 0);
  check_op(&c);
  for (int alias = 0; alias <= 1; alias++) {
    c = unary(s, alias ? "swiglu x*x" : "swiglu", PW_OP_SWIGLU, 0);
    c.n[IN1] = c.n[DIN1] = NC, c.alias = alias;
    check_op(&c);
    c = unary(s, alias ? "geglu x*x" : "geglu", PW_OP_GEGLU, 0);
    c.n[IN1] = c.n[DIN1] = NC, c.alias = alias;
    check_op(&c);
    c = unary(s, alias ? "add x+x" : "add", PW_OP_ADD, 0);
    c.n[IN1] = c.n[DIN1] = NC, c.alias = alias;
    check_op(&c);
  }

  c = base_case(s, "xent", PW_OP_XENT);
  c.node.C = s->V;
  c.n[IN0] = c.n[DIN0] = c.n[AUX] = N * s->V, c.n[IN1] = N, c.tok1 = s->V, c.n[OUT] = 1;
  check_op(&c);
  c = unary(s, "mse", PW_OP_MSE, 0);
  c.n[IN1] = NC, c.n[OUT] = 1;
  check_op(&c);

  c = base_case(s, "concat", PW_OP_CONCAT);
  c.node.OC = s->C + s->OC;
  c.n[IN0] = c.n[DIN0] = NC, c.n[IN1] = c.n[DIN1] = N * s->OC, c.n[OUT] = c.n[DOUT] = N * (s->C + s->OC);
  check_op(&c);
}

/* ---- optimizer --------------------------------------------------------------------------------- */

static void check_optim(int kind, double momentum) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_MLP;
  s.in_dim = 300, s.hidden_dim = 700, s.out_dim = 10, s.n_layers = 2;
  s.activation = PW_ACT_RELU, s.loss = PW_LOSS_MSE;
  pw_model m;
  pw_err err = {0};
  must(pw_model_build(&s, &m, &err), &err, "pw_model_build");
  pw_prog_config cfg = {.layer_lo = 0, .layer_hi = m.n_layers, .mb_size = 1, .batch_size = 1, .n_slots = 1};
  pw_prog *p = NULL;
  must(pw_prog_create(&m, &cfg, &p, &err), &err, "pw_prog_create");
  size_t n = pw_prog_numel(p);
  float *w = pw_prog_params(p), *g = pw_prog_grads(p);
  for (size_t i = 0; i < n; i++) w[i] = (float)uniform(), g[i] = (float)uniform();
  float *dw = be->alloc(be, n * 4), *dg = be->alloc(be, n * 4), *dm = be->alloc(be, n * 4), *dv = be->alloc(be, n * 4);
  if (!dw || !dg || !dm || !dv) die("%s%s", "optimizer: no device memory", "");
  up(dw, w, n), up(dg, g, n);
  pw_optim_spec o;
  memset(&o, 0, sizeof o);
  o.kind = kind, o.lr = 3e-3, o.beta1 = 0.9, o.beta2 = 0.95, o.eps = 1e-8, o.weight_decay = 0.1, o.momentum = momentum;
  const char *name = kind == PW_OPT_SGD ? (momentum != 0 ? "sgd, momentum" : "sgd") : "adamw";
  float gs = 0.75f, *got = host(n);
  for (int t = 1; t <= 3; t++) {
    double lr = o.lr * t;
    pw_optim_step(p, &o, t, lr, gs);
    for (int k = 0; k < pw_prog_n_params(p); k++) { /* optim.c's per-parameter scalars */
      pw_prog_param *pp = pw_prog_param_at(p, k);
      size_t at = (size_t)(pp->data - w), len = pp->meta->numel;
      if (kind == PW_OPT_SGD) {
        float wd = pp->meta->decay ? (float)o.weight_decay : 0.0f;
        be->sgd(be, dw + at, dg + at, dm + at, len, gs, wd, (float)momentum, (float)lr, t == 1);
      } else {
        float decay = pp->meta->decay ? (float)(1.0 - lr * o.weight_decay) : 1.0f;
        double bc1 = 1.0 - pow(o.beta1, t), bc2 = 1.0 - pow(o.beta2, t);
        be->adamw(be, dw + at, dg + at, dm + at, dv + at, len, gs, decay, (float)o.beta1, (float)o.beta2,
                  (float)o.eps, (float)(lr / bc1), (float)sqrt(bc2));
      }
    }
    must(be->sync(be, &err), &err, name);
    down(got, dw, n);
    expect_close(name, "weights", got, w, n);
    if (kind == PW_OPT_ADAMW || momentum != 0) {
      down(got, dm, n);
      expect_close(name, "moment 1", got, pw_prog_moment(p, 0), n);
    }
    if (kind == PW_OPT_ADAMW) {
      down(got, dv, n);
      expect_close(name, "moment 2", got, pw_prog_moment(p, 1), n);
    }
  }
  if (kind == PW_OPT_ADAMW) {
    double want = pw_grad_sqnorm(p, NULL, 0), s1 = be->sqnorm(be, dg, n), s2 = be->sqnorm(be, dg, n);
    must(be->sync(be, &err), &err, "sqnorm");
    if (!(fabs(s1 - want) <= 1e-12 * want)) {
      fprintf(stderr, "test_cuda_ops: FAILED: sqnorm %.17g, the CPU's %.17g\n", s1, want);
      exit(1);
    }
    if (memcmp(&s1, &s2, sizeof s1)) die("%s%s", "sqnorm: two runs differ", "");
    printf("ok sqnorm %zu floats: %.17g, the CPU's %.17g\n", n, s1, want);
    checks++;
    if (be->sqnorm(be, dg, 0) != 0.0) die("%s%s", "sqnorm of nothing is not 0", "");
    /* add_into: dw += dg */
    float *want_w = host(n);
    down(want_w, dw, n);
    for (size_t i = 0; i < n; i++) want_w[i] += g[i];
    be->add_into(be, dw, dg, n);
    must(be->sync(be, &err), &err, "add_into");
    down(got, dw, n);
    expect_close("add_into", "out", got, want_w, n);
    free(want_w);
  }
  free(got);
  be->free(be, dw), be->free(be, dg), be->free(be, dm), be->free(be, dv);
  pw_prog_free(p);
  pw_model_free(&m);
}

/* ---- errors ----------------------------------------------------------------------------------- */

static void check_errors(void) {
  pw_err err = {0};
  char buf[600];
  float x = 1.0f;
  /* a copy to nowhere fails by itself and leaves nothing for the next sync */
  if (be->upload(be, NULL, &x, sizeof x, &err) == 0) die("%s%s", "upload to NULL succeeded", "");
  printf("ok upload to NULL: %s\n", pw_err_str(&err, buf, sizeof buf));
  must(be->sync(be, &err), &err, "sync after a failed upload");
  /* a recorded failure comes back from the next sync, once */
  pw_cu_note_error(1 /* cudaErrorInvalidValue */, "test_cuda_ops: a planted failure");
  memset(&err, 0, sizeof err);
  if (be->sync(be, &err) == 0 || !strstr(err.msg, "a planted failure"))
    die("%s%s", "a recorded failure did not come back from sync", "");
  printf("ok recorded failure: %s\n", pw_err_str(&err, buf, sizeof buf));
  must(be->sync(be, &err), &err, "the sync after");
  const pw_backend *other = NULL;
  int rc = pw_cuda_open(999, &other, &err);
  if (rc != PW_ENOENT || other) die("%s%s", "cuda:999 was not PW_ENOENT", "");
  printf("ok cuda:999: %s\n", pw_err_str(&err, buf, sizeof buf));
  void *pin = pw_cuda_host_alloc(1 << 20);
  if (!pin) die("%s%s", "no pinned host memory", "");
  pw_cuda_host_free(pin);
  checks += 4;
}

int main(void) {
  pw_err err = {0};
  char buf[600];
  if (!pw_cuda_built()) {
    printf("SKIP test_cuda_ops: built without CUDA\n");
    return 77;
  }
  int rc = pw_cuda_open(0, &be, &err);
  if (rc == PW_EUNAVAIL) {
    printf("SKIP test_cuda_ops: %s\n", pw_err_str(&err, buf, sizeof buf));
    return 77;
  }
  must(rc, &err, "pw_cuda_open(0)");
  pw_cuda_info info;
  must(pw_cuda_info_of(0, &info, &err), &err, "pw_cuda_info_of");
  printf("%s: %s, sm_%d%d, %d SMs, %.1f of %.1f GiB free, driver %d, runtime %d\n", be->name, info.name, info.cc_major,
         info.cc_minor, info.sms, info.mem_free / 1073741824.0, info.mem_total / 1073741824.0, info.driver_version,
         info.runtime_version);

  check_errors();
  static const shape shapes[] = {
      {"small: B 2, T 5, C 13, OC 7, V 11", 2, 5, 13, 7, 11},
      {"gpt2: B 4, T 64, C 768, OC 3072, V 50257", 4, 64, 768, 3072, 50257},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run_shape(&shapes[i]);
  check_optim(PW_OPT_ADAMW, 0);
  check_optim(PW_OPT_SGD, 0.9);
  check_optim(PW_OPT_SGD, 0);
  pw_cuda_close(be);
  printf("test_cuda_ops: all %d checks passed\n", checks);
  return 0;
}
