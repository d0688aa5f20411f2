/* bench_kernels: case 1 of bench/run.sh — pipewright's kernels against the
 * machine's limit (raw cblas_sgemm on the same shapes, same thread count),
 * and where a training step's time goes, op by op.
 *
 *   bench_kernels [--reps N] [--target-ms MS] [--no-breakdown] JOB.json...
 *
 * For each job: the model is built from the spec, and
 *  - every distinct linear shape (N = tokens per microbatch, C, OC) is timed
 *    forward, backward-input and backward-weight through ops.h, interleaved
 *    with the bare cblas_sgemm call of the same shape and transposes;
 *  - every attention shape likewise, against the bare sgemms of the same
 *    matmuls done in full (QK^T and PV forward; dP, dQ, dK, dV backward, per
 *    batch and head, on the same packed strides). FLOPs are counted as
 *    model.c counts them (the full T x T products, 4 T^2 C forward and
 *    8 T^2 C backward per sequence), so a kernel that skips the masked half
 *    can exceed ratio 1;
 *  - unless --no-breakdown, every node's kernels once per distinct shape
 *    plus the optimizer (zero_grad, grad norm, AdamW) on a real program:
 *    an op-by-op estimate of one step (isolated calls: caches are warmer
 *    than in a real step, so it underestimates memory-bound ops slightly).
 * Prints one JSON document on stdout. Thread count: OPENBLAS_NUM_THREADS. */
#include <cblas.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kernels.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "prog.h"
#include "spec_json.h"

char *openblas_get_config(void);
char *openblas_get_corename(void);

static int g_reps = 5;
static double g_target = 0.03; /* seconds per timed batch */

static float *fbuf(size_t n, unsigned long long seed, float scale) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  if (!p) {
    fprintf(stderr, "bench_kernels: out of memory\n");
    exit(1);
  }
  bench_fill(p, n, seed, scale);
  return p;
}

/* ---- linear ------------------------------------------------------------ */

typedef struct {
  int N, C, OC;
  float *inp, *w, *b, *out, *dout, *dinp, *dw, *db;
} lin_ctx;

static void lin_run(void *p, int which) {
  lin_ctx *c = p;
  int N = c->N, C = c->C, OC = c->OC;
  switch (which) {
  case 0: pw_linear_forward(c->out, c->inp, c->w, c->b, N, C, OC); break;
  case 1:
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, c->inp, C, c->w, C, 0.0f,
                c->out, OC);
    break;
  case 2: pw_linear_backward_input(c->dinp, c->dout, c->w, N, C, OC, 1); break;
  case 3:
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, c->dout, OC, c->w, C,
                1.0f, c->dinp, C);
    break;
  case 4: pw_linear_backward_weight(c->dw, c->db, c->dout, c->inp, N, C, OC); break;
  case 5:
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, c->dout, OC, c->inp, C,
                1.0f, c->dw, C);
    break;
  }
}

static json_t *dir_json(double flops, double pw_s, double raw_s) {
  return json_pack("{s:f, s:f, s:f, s:f, s:f}", "pw_ms", pw_s * 1e3, "sgemm_ms", raw_s * 1e3,
                   "pw_gflops", flops / pw_s * 1e-9, "sgemm_gflops", flops / raw_s * 1e-9,
                   "efficiency", raw_s / pw_s);
}

/* Times one linear shape; adds the per-call seconds of pw and raw for the
 * three directions to pw_s[3], raw_s[3]. */
static json_t *bench_linear(int N, int C, int OC, int bias, double *pw_s, double *raw_s) {
  lin_ctx c = {.N = N, .C = C, .OC = OC};
  size_t nc = (size_t)N * C, no = (size_t)N * OC, wc = (size_t)OC * C;
  c.inp = fbuf(nc, 1, 1.0f);
  c.w = fbuf(wc, 2, 0.02f);
  c.b = bias ? fbuf(OC, 3, 0.02f) : NULL;
  c.out = fbuf(no, 4, 1.0f);
  c.dout = fbuf(no, 5, 1e-3f);
  c.dinp = fbuf(nc, 6, 0.0f);
  c.dw = fbuf(wc, 7, 0.0f);
  c.db = bias ? fbuf(OC, 8, 0.0f) : NULL;
  double flops = 2.0 * N * C * OC, s[2];
  json_t *j = json_pack("{s:i, s:i, s:i, s:b}", "N", N, "C", C, "OC", OC, "bias", bias);
  static const char *dirs[3] = {"forward", "backward_input", "backward_weight"};
  for (int d = 0; d < 3; d++) {
    int which[2] = {2 * d, 2 * d + 1};
    bench_interleave(lin_run, &c, which, 2, g_reps, g_target, s);
    pw_s[d] = s[0];
    raw_s[d] = s[1];
    json_object_set_new(j, dirs[d], dir_json(flops, s[0], s[1]));
  }
  free(c.inp), free(c.w), free(c.b), free(c.out), free(c.dout), free(c.dinp), free(c.dw),
      free(c.db);
  return j;
}

/* ---- attention --------------------------------------------------------- */

typedef struct {
  int B, T, C, NH;
  float *qkv, *out, *att, *dout, *dqkv, *scratch;
} att_ctx;

/* The bare matmuls of attention, in full (no causal skipping, no softmax). */
static void att_raw(att_ctx *c, int backward) {
  int T = c->T, C = c->C, HD = C / c->NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)HD);
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->NH; h++) {
      const float *q = c->qkv + (size_t)b * T * C3 + (size_t)h * HD;
      const float *k = q + C, *v = q + 2 * (size_t)C;
      const float *P = c->att + ((size_t)b * c->NH + h) * T * T;
      float *S = c->scratch;
      if (!backward) {
        float *o = c->out + (size_t)b * T * C + (size_t)h * HD;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HD, scale, q, C3, k, C3, 0.0f,
                    S, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HD, T, 1.0f, S, T, v, C3, 0.0f,
                    o, C);
      } else {
        const float *dO = c->dout + (size_t)b * T * C + (size_t)h * HD;
        float *dq = c->dqkv + (size_t)b * T * C3 + (size_t)h * HD;
        float *dk = dq + C, *dv = dq + 2 * (size_t)C;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HD, 1.0f, dO, C, v, C3, 0.0f,
                    S, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HD, T, scale, S, T, k, C3, 1.0f,
                    dq, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HD, T, scale, S, T, q, C3, 1.0f,
                    dk, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HD, T, 1.0f, P, T, dO, C, 1.0f,
                    dv, C3);
      }
    }
}

static void att_run(void *p, int which) {
  att_ctx *c = p;
  switch (which) {
  case 0: pw_attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH, c->NH); break;
  case 1: att_raw(c, 0); break;
  case 2:
    pw_attention_backward_input(c->dqkv, c->scratch, c->dout, c->qkv, c->att, c->B, c->T, c->C,
                                c->NH, c->NH, 1);
    break;
  case 3: att_raw(c, 1); break;
  }
}

static json_t *bench_attention(int B, int T, int C, int NH, double *pw_s, double *raw_s) {
  att_ctx c = {.B = B, .T = T, .C = C, .NH = NH};
  size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C;
  c.qkv = fbuf(n3, 11, 1.0f);
  c.out = fbuf(n1, 12, 0.0f);
  c.att = fbuf((size_t)B * NH * T * T, 13, 0.0f);
  c.dout = fbuf(n1, 14, 1e-3f);
  c.dqkv = fbuf(n3, 15, 0.0f);
  c.scratch = fbuf((size_t)T * T, 16, 0.0f);
  att_run(&c, 0); /* real probabilities in att for the backward */
  double ff = 4.0 * B * T * (double)T * C, fb = 8.0 * B * T * (double)T * C, s[2];
  json_t *j = json_pack("{s:i, s:i, s:i, s:i}", "B", B, "T", T, "C", C, "NH", NH);
  int w0[2] = {0, 1}, w1[2] = {2, 3};
  bench_interleave(att_run, &c, w0, 2, g_reps, g_target, s);
  pw_s[0] = s[0], raw_s[0] = s[1];
  json_object_set_new(j, "forward", dir_json(ff, s[0], s[1]));
  bench_interleave(att_run, &c, w1, 2, g_reps, g_target, s);
  pw_s[1] = s[0], raw_s[1] = s[1];
  json_object_set_new(j, "backward_input", dir_json(fb, s[0], s[1]));
  free(c.qkv), free(c.out), free(c.att), free(c.dout), free(c.dqkv), free(c.scratch);
  return j;
}

/* ---- op-by-op breakdown ------------------------------------------------ */

/* One call of a node in direction which (0 forward, 1 backward_input,
 * 2 backward_weight) through its row of the kernel table, as prog.c runs
 * it (accumulating into its gradients). NULL: the op has no such half. */
static pw_kernel_fn node_fn(const pw_node *n, int which) {
  const pw_kernel *k = pw_kernel_of(n->op);
  return which == 0 ? k->forward : which == 1 ? k->backward_input : k->backward_weight;
}

static void node_run(void *p, int which) {
  const pw_kernel_io *io = p;
  node_fn(io->n, which)(io);
}

typedef struct {
  char op[24];
  int dir;
  double sec_per_step;
  int calls_per_step;
} brk_row;

static int same_shape(const pw_model *m, const pw_node *a, const pw_node *b) {
  return a->op == b->op && a->C == b->C && a->OC == b->OC && a->NH == b->NH && a->T == b->T &&
         (a->w >= 0) == (b->w >= 0) && (a->b >= 0) == (b->b >= 0) &&
         m->values[a->in[0]].rows == m->values[b->in[0]].rows &&
         (a->w < 0 || m->params[a->w].numel == m->params[b->w].numel);
}

static void add_row(brk_row *rows, int *n_rows, const char *op, int dir, double sec, int calls) {
  for (int i = 0; i < *n_rows; i++)
    if (strcmp(rows[i].op, op) == 0 && rows[i].dir == dir) {
      rows[i].sec_per_step += sec;
      rows[i].calls_per_step += calls;
      return;
    }
  brk_row *r = &rows[(*n_rows)++];
  snprintf(r->op, sizeof r->op, "%s", op);
  r->dir = dir;
  r->sec_per_step = sec;
  r->calls_per_step = calls;
}

static void opt_run(void *p, int which) {
  void **a = p;
  pw_prog *prog = a[0];
  const pw_optim_spec *o = a[1];
  if (which == 0) pw_prog_zero_grad(prog);
  else if (which == 1) (void)pw_grad_sqnorm(prog, NULL, 0);
  else pw_optim_step(prog, o, 10, 1e-4, 0.5f);
}

static json_t *breakdown(const pw_job *job, const pw_model *m, int mb, int n_mb) {
  brk_row rows[64];
  int n_rows = 0;
  char *done = calloc((size_t)m->n_nodes, 1);
  for (int i = 0; i < m->n_nodes; i++) {
    if (done[i]) continue;
    const pw_node *n = &m->nodes[i];
    int count = 0;
    for (int j = i; j < m->n_nodes; j++)
      if (!done[j] && same_shape(m, n, &m->nodes[j])) done[j] = 1, count++;
    const pw_value *vin = &m->values[n->in[0]], *vout = &m->values[n->out];
    int N = mb * vin->rows;
    size_t nin = (size_t)N * vin->width, nout = vout->role == PW_VAL_LOSS ? 1 : (size_t)N * vout->width;
    size_t nin1 = n->in[1] >= 0 ? (size_t)N * m->values[n->in[1]].width : 1;
    pw_kernel_io c = {.n = n, .B = mb, .rows = N, .acc0 = 1, .acc1 = 1};
    c.loss_scale = 1.0f / (float)((double)job->train.batch_size * vin->rows);
    c.in0 = fbuf(nin, 21, 1.0f);
    c.in1 = fbuf(nin1, 22, 1.0f);
    c.out = fbuf(nout, 23, 0.0f);
    c.dout = fbuf(nout, 24, 1e-3f);
    c.din0 = fbuf(nin, 25, 0.0f);
    c.din1 = fbuf(nin1, 26, 0.0f);
    c.aux = fbuf((size_t)mb * n->aux + 1, 27, 0.0f);
    size_t nw = n->w >= 0 ? m->params[n->w].numel : 1, nb = n->b >= 0 ? m->params[n->b].numel : 1;
    c.w = fbuf(nw, 28, 0.02f);
    c.b = n->b >= 0 ? fbuf(nb, 29, 0.02f) : NULL;
    c.dw = fbuf(nw, 30, 0.0f);
    c.db = n->b >= 0 ? fbuf(nb, 31, 0.0f) : NULL;
    c.scratch = fbuf((size_t)n->T * n->T + 1, 32, 0.0f);
    int V = n->w >= 0 ? m->params[n->w].shape[0] : 1;
    /* int32 data where the model has it: the tokens an embedding reads,
     * the class targets of a cross entropy */
    const pw_value *v1 = n->in[1] >= 0 ? &m->values[n->in[1]] : NULL;
    int32_t *ints[2] = {vin->dtype == PW_DT_I32 ? (int32_t *)c.in0 : NULL,
                        v1 && v1->dtype == PW_DT_I32 ? (int32_t *)c.in1 : NULL};
    for (int k = 0; k < N; k++) {
      if (ints[0]) ints[0][k] = (int32_t)((k * 131u + 7u) % (unsigned)(V > 0 ? V : 1));
      if (ints[1]) ints[1][k] = (int32_t)((k * 97u + 3u) % (unsigned)(vin->width > 0 ? vin->width : 1));
    }
    node_run(&c, 0); /* forward once: aux (mean/rstd, att, probs) for the backward */
    for (int d = 0; d < 3; d++) {
      if (!node_fn(n, d) || (d == 2 && n->w < 0)) continue;
      double s;
      bench_interleave(node_run, &c, &d, 1, g_reps, g_target / 3, &s);
      add_row(rows, &n_rows, pw_op_name((pw_op)n->op), d, s * count * n_mb, count * n_mb);
    }
    free(c.in0), free(c.in1), free(c.out), free(c.dout), free(c.din0), free(c.din1), free(c.aux), free(c.w),
        free(c.b), free(c.dw), free(c.db), free(c.scratch);
  }
  free(done);
  /* The optimizer on a real program: zero_grad, grad norm, AdamW. */
  pw_prog *prog = NULL;
  pw_err err = {0};
  pw_prog_config cfg = {.layer_lo = 0, .layer_hi = m->n_layers, .mb_size = 1,
                        .batch_size = job->train.batch_size, .n_slots = 1};
  if (pw_prog_create(m, &cfg, &prog, &err) == 0) {
    pw_prog_init_params(prog, 1);
    bench_fill(pw_prog_grads(prog), pw_prog_numel(prog), 41, 1e-3f);
    void *a[2] = {prog, (void *)&job->train.optim};
    static const char *names[3] = {"zero_grad", "grad_norm", "adamw"};
    for (int d = 0; d < 3; d++) {
      double s;
      bench_interleave(opt_run, a, &d, 1, g_reps, g_target / 3, &s);
      add_row(rows, &n_rows, names[d], 3, s, 1);
    }
    pw_prog_free(prog);
  }
  static const char *dname[4] = {"forward", "backward_input", "backward_weight", "optimizer"};
  json_t *arr = json_array();
  for (int i = 0; i < n_rows; i++)
    json_array_append_new(arr, json_pack("{s:s, s:s, s:i, s:f}", "op", rows[i].op, "dir",
                                         dname[rows[i].dir], "calls", rows[i].calls_per_step,
                                         "ms_per_step", rows[i].sec_per_step * 1e3));
  return arr;
}

/* ---- per job ----------------------------------------------------------- */

static json_t *bench_job(const char *path, int do_breakdown) {
  pw_job job;
  pw_model m;
  pw_err err = {0};
  char buf[600];
  if (pw_job_load_file(path, &job, &err) || pw_model_build(&job.model, &m, &err)) {
    fprintf(stderr, "bench_kernels: %s: %s\n", path, pw_err_str(&err, buf, sizeof buf));
    exit(1);
  }
  int n_mb = job.schedule.microbatches > 0 ? job.schedule.microbatches : 1;
  int mb = job.train.batch_size / n_mb;
  fprintf(stderr, "bench_kernels: %s (%d x %d sequences of %d)\n", job.name, n_mb, mb, m.seq_len);
  json_t *lin = json_array(), *att = json_array();
  double lin_flops = 0, att_flops = 0, lin_raw = 0, lin_pw = 0, att_raw_s = 0, att_pw_s = 0;
  char *done = calloc((size_t)m.n_nodes, 1);
  for (int i = 0; i < m.n_nodes; i++) {
    const pw_node *n = &m.nodes[i];
    int N = mb * m.values[n->in[0]].rows;
    if (n->op == PW_OP_LINEAR) {
      lin_flops += 6.0 * N * n->C * n->OC * n_mb;
      if (done[i]) continue;
      int count = 0;
      for (int j = i; j < m.n_nodes; j++)
        if (m.nodes[j].op == PW_OP_LINEAR && m.nodes[j].C == n->C && m.nodes[j].OC == n->OC &&
            (m.nodes[j].b >= 0) == (n->b >= 0) && m.values[m.nodes[j].in[0]].rows == m.values[n->in[0]].rows)
          done[j] = 1, count++;
      double pw_s[3], raw_s[3];
      json_t *j = bench_linear(N, n->C, n->OC, n->b >= 0, pw_s, raw_s);
      json_object_set_new(j, "count", json_integer(count));
      json_array_append_new(lin, j);
      for (int d = 0; d < 3; d++) lin_raw += raw_s[d] * count * n_mb, lin_pw += pw_s[d] * count * n_mb;
    } else if (n->op == PW_OP_ATTENTION) {
      int C = n->OC, T = n->T;
      /* only the work done: the causal half, T(T+1)/2 query-key pairs per
       * sequence and head; Q·Kᵀ and P·V forward (2 products), twice that
       * backward: 6 products of 2·C·T(T+1)/2 FLOPs */
      att_flops += 6.0 * mb * C * (double)T * (T + 1) * n_mb;
      if (done[i]) continue;
      int count = 0;
      for (int j = i; j < m.n_nodes; j++)
        if (m.nodes[j].op == PW_OP_ATTENTION && m.nodes[j].OC == C && m.nodes[j].T == T &&
            m.nodes[j].NH == n->NH)
          done[j] = 1, count++;
      double pw_s[2], raw_s[2];
      json_t *j = bench_attention(mb, T, C, n->NH, pw_s, raw_s);
      json_object_set_new(j, "count", json_integer(count));
      json_array_append_new(att, j);
      for (int d = 0; d < 2; d++) att_raw_s += raw_s[d] * count * n_mb, att_pw_s += pw_s[d] * count * n_mb;
    }
  }
  free(done);
  json_t *out = json_pack(
      "{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:{s:f, s:f, s:f}, s:o, s:o, s:{s:f, s:f, s:f, s:f}, s:f}",
      "name", job.name, "job", path, "batch_size", job.train.batch_size, "microbatches", n_mb,
      "seq_len", m.seq_len, "d_model", job.model.d_model, "n_layers", job.model.n_layers,
      "params", (double)pw_model_param_count(&m), "flops_per_step", "linear", lin_flops,
      "attention", att_flops, "total", lin_flops + att_flops, "linear", lin, "attention", att,
      "per_step", "linear_pw_ms", lin_pw * 1e3, "linear_sgemm_ms", lin_raw * 1e3,
      "attention_pw_ms", att_pw_s * 1e3, "attention_sgemm_ms", att_raw_s * 1e3,
      /* the sgemm rate this model's linear shapes allow: the step's peak */
      "sgemm_gflops_linear_shapes", lin_flops / lin_raw * 1e-9);
  if (do_breakdown) json_object_set_new(out, "breakdown", breakdown(&job, &m, mb, n_mb));
  pw_model_free(&m);
  pw_job_free(&job);
  return out;
}

int main(int argc, char **argv) {
  int do_breakdown = 1;
  json_t *jobs = json_array();
  for (int i = 1; i < argc; i++) { /* options first, wherever they are */
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) g_reps = atoi(argv[i + 1]), argv[i + 1] = NULL, i++;
    else if (strcmp(argv[i], "--target-ms") == 0 && i + 1 < argc)
      g_target = atof(argv[i + 1]) * 1e-3, argv[i + 1] = NULL, i++;
    else if (strcmp(argv[i], "--no-breakdown") == 0) do_breakdown = 0;
    else if (argv[i][0] == '-') {
      fprintf(stderr, "usage: bench_kernels [--reps N] [--target-ms MS] [--no-breakdown] JOB.json...\n");
      return 2;
    }
  }
  if (g_reps < 1) g_reps = 1;
  for (int i = 1; i < argc; i++)
    if (argv[i] && argv[i][0] != '-') json_array_append_new(jobs, bench_job(argv[i], do_breakdown));
  json_t *root = json_pack("{s:s, s:s, s:i, s:i, s:f, s:o}", "openblas_config", openblas_get_config(),
                           "openblas_corename", openblas_get_corename(), "openblas_threads",
                           openblas_get_num_threads(), "reps", g_reps, "target_ms", g_target * 1e3,
                           "jobs", jobs);
  char *s = json_dumps(root, JSON_INDENT(1));
  puts(s);
  free(s);
  json_decref(root);
  return 0;
}
