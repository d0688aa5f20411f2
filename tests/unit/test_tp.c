/* test_tp: tensor parallel's arithmetic (common/model/tp.h) and the
 * vocab-parallel cross-entropy (ops.h, pw_xent_vp_*):
 *   - the split of every parameter of gpt (tied and untied) and llama:
 *     qkv by heads, fc / gate / up by columns, proj / down by rows, the
 *     embedding and lm_head by vocabulary, norms and row biases whole;
 *   - shards tile the canonical tensor: unsharding every rank's shard
 *     rebuilds it bit for bit, so a checkpoint reshards across tp;
 *   - a gpt block's attention and MLP computed shard by shard, the row
 *     linears' partial products summed in tp-rank order, equal the tp = 1
 *     computation (forward and the column linears' input gradients);
 *   - the vocab-parallel loss and logits gradient equal the one-rank
 *     cross-entropy at tp 1, 2 and 4;
 *   - mesh.tp's errors name what it must divide;
 *   - the all-reduced floats per sequence follow from the model. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "model.h"
#include "ops.h"
#include "plan.h"
#include "prog.h"
#include "rng.h"
#include "spec.h"
#include "spec_json.h"
#include "tp.h"

/* A job around model with mesh {pp, tp, virtual_stages} and schedule sched
 * of 4 microbatches. */
static int parse_job(const char *model, int pp, int tp, int V, const char *sched, pw_job *job, pw_err *err) {
  char buf[1024];
  snprintf(buf, sizeof buf,
           "{\"name\": \"t\", \"model\": {%s}, \"mesh\": {\"pp\": %d, \"tp\": %d, \"virtual_stages\": %d},"
           " \"schedule\": {\"name\": \"%s\", \"microbatches\": 4},"
           " \"train\": {\"steps\": 1, \"batch_size\": 8}, \"data\": {\"kind\": \"%s\"}}",
           model, pp, tp, V, sched, strstr(model, "mlp\"") ? "regression" : "copy");
  json_t *j = json_loads(buf, 0, NULL);
  assert_non_null(j);
  int rc = pw_job_parse(j, NULL, job, err);
  json_decref(j);
  return rc;
}

static int job_of(const char *model, int tp, pw_job *job, pw_model *m, pw_err *err) {
  int rc = parse_job(model, 1, tp, 1, "1f1b", job, err);
  if (rc) return rc;
  assert_int_equal(pw_model_build(&job->model, m, err), 0);
  rc = pw_tp_check(job, m, err);
  if (rc) {
    pw_model_free(m);
    pw_job_free(job);
  }
  return rc;
}

#define GPT "\"template\": \"gpt\", \"vocab_size\": 64, \"seq_len\": 8, \"d_model\": 16, \"n_layers\": 2, \"n_heads\": 4"
#define LLAMA "\"template\": \"llama\", \"vocab_size\": 64, \"seq_len\": 8, \"d_model\": 16, \"n_layers\": 2, \"n_heads\": 4"

static int param_id(const pw_model *m, const char *name) {
  for (int i = 0; i < m->n_params; i++)
    if (!strcmp(m->params[i].name, name)) return i;
  fail_msg("no parameter %s", name);
  return -1;
}

static void expect(const pw_model *m, const uint8_t *k, const char *name, pw_tp_kind want) {
  int i = param_id(m, name);
  if (k[i] != want) fail_msg("%s: %s, expected %s", name, pw_tp_kind_name(k[i]), pw_tp_kind_name(want));
}

/* gpt untied, gpt tied, llama (v = 0, 1, 2) at tp, and its split. */
static void model_of(int v, int tp, pw_job *job, pw_model *m, uint8_t *k) {
  static const char *const models[] = {GPT ", \"tie_embeddings\": false", GPT ", \"tie_embeddings\": true", LLAMA};
  pw_err err = {0};
  assert_int_equal(job_of(models[v], tp, job, m, &err), 0);
  assert_true(m->n_params < 256);
  pw_tp_kinds(m, k);
}

static void test_kinds(void **state) {
  (void)state;
  for (int v = 0; v < 3; v++) {
    pw_job job;
    pw_model m;
    uint8_t k[256];
    model_of(v, 2, &job, &m, k);
    expect(&m, k, "embed.tok.weight", PW_TP_VOCAB);
    expect(&m, k, "blocks.1.attn.qkv.weight", PW_TP_QKV);
    expect(&m, k, "blocks.1.attn.proj.weight", PW_TP_ROW);
    if (v < 2) {
      expect(&m, k, "embed.pos.weight", PW_TP_REPLICATED);
      expect(&m, k, "blocks.0.ln1.weight", PW_TP_REPLICATED);
      expect(&m, k, "blocks.0.attn.qkv.bias", PW_TP_QKV);
      expect(&m, k, "blocks.0.attn.proj.bias", PW_TP_REPLICATED);
      expect(&m, k, "blocks.0.mlp.fc.weight", PW_TP_COLUMN);
      expect(&m, k, "blocks.0.mlp.fc.bias", PW_TP_COLUMN);
      expect(&m, k, "blocks.0.mlp.proj.weight", PW_TP_ROW);
      expect(&m, k, "blocks.0.mlp.proj.bias", PW_TP_REPLICATED);
    } else {
      expect(&m, k, "blocks.0.norm1.weight", PW_TP_REPLICATED);
      expect(&m, k, "blocks.0.mlp.gate.weight", PW_TP_COLUMN);
      expect(&m, k, "blocks.0.mlp.up.weight", PW_TP_COLUMN);
      expect(&m, k, "blocks.0.mlp.down.weight", PW_TP_ROW);
      expect(&m, k, "norm_f.weight", PW_TP_REPLICATED);
    }
    if (v == 0) expect(&m, k, "lm_head.weight", PW_TP_VOCAB);
    pw_model_free(&m);
    pw_job_free(&job);
  }
}

static void fill(float *x, size_t n, uint64_t seed) {
  pw_rng r;
  pw_rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++) x[i] = (float)(pw_rng_uniform(&r) * 2.0 - 1.0);
}

/* Every rank's shard, unsharded, rebuilds the canonical tensor, and every
 * canonical float belongs to exactly one shard of a split parameter. */
static void test_shards_tile(void **state) {
  (void)state;
  pw_job job;
  pw_model m;
  pw_err err = {0};
  assert_int_equal(job_of(LLAMA, 4, &job, &m, &err), 0);
  uint8_t k[256];
  pw_tp_kinds(&m, k);
  for (int tp = 1; tp <= 4; tp *= 2)
    for (int i = 0; i < m.n_params; i++) {
      const pw_param *p = &m.params[i];
      float *canon = malloc(p->numel * sizeof(float)), *back = malloc(p->numel * sizeof(float));
      float *sh = malloc(p->numel * sizeof(float));
      fill(canon, p->numel, (uint64_t)i + 1);
      for (size_t j = 0; j < p->numel; j++) back[j] = NAN;
      size_t n = pw_tp_numel(p, (pw_tp_kind)k[i], tp);
      assert_int_equal(n * (k[i] == PW_TP_REPLICATED ? 1 : (size_t)tp), p->numel);
      for (int r = 0; r < tp; r++) {
        pw_tp_shard(sh, canon, p, (pw_tp_kind)k[i], tp, r);
        pw_tp_unshard(back, sh, p, (pw_tp_kind)k[i], tp, r);
      }
      assert_memory_equal(back, canon, p->numel * sizeof(float));
      free(canon), free(back), free(sh);
    }
  pw_model_free(&m);
  pw_job_free(&job);
}

static void expect_close(const float *a, const float *b, size_t n, float tol, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (fabsf(a[i] - b[i]) > tol * (1.0f + fabsf(b[i]))) fail_msg("%s[%zu]: %g, expected %g", what, i, a[i], b[i]);
}

/* x -> qkv (QKV) -> attention -> proj (ROW) and x -> fc (COLUMN) -> gelu
 * -> proj (ROW), shard by shard against whole; then the column linears'
 * input gradient as the sum over ranks. */
static void test_block_shards(void **state) {
  (void)state;
  enum { B = 2, T = 8, C = 16, NH = 4, H = 64, TP = 2, N = B * T };
  pw_job job;
  pw_model m;
  pw_err err = {0};
  assert_int_equal(job_of(GPT, TP, &job, &m, &err), 0);
  uint8_t k[256];
  pw_tp_kinds(&m, k);
  const char *names[] = {"blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight",
                         "blocks.0.attn.proj.bias",  "blocks.0.mlp.fc.weight",  "blocks.0.mlp.fc.bias",
                         "blocks.0.mlp.proj.weight", "blocks.0.mlp.proj.bias"};
  float *w[8], *ws[8][TP];
  for (int i = 0; i < 8; i++) {
    const pw_param *p = &m.params[param_id(&m, names[i])];
    w[i] = malloc(p->numel * sizeof(float));
    fill(w[i], p->numel, (uint64_t)i + 7);
    for (int r = 0; r < TP; r++) {
      ws[i][r] = malloc(p->numel * sizeof(float));
      pw_tp_shard(ws[i][r], w[i], p, (pw_tp_kind)k[param_id(&m, names[i])], TP, r);
    }
  }
  static float x[N * C], qkv[N * 3 * C], att[B * NH * T * T], a[N * C], y[N * C], h[N * H], g[N * H],
      dg[N * H], y2[N * C];
  static float qkv_r[N * 3 * C], a_r[N * C], part[TP][N * C], ysum[N * C], h_r[N * H], g_r[N * H];
  static float dy[N * 3 * C], dx[N * C], dx_r[TP][N * C], dxsum[N * C];
  fill(x, N * C, 99);
  /* attention, whole then per rank */
  pw_linear_forward(qkv, x, w[0], w[1], N, C, 3 * C);
  pw_attention_forward(a, att, qkv, B, T, C, NH, NH);
  pw_linear_forward(y, a, w[2], w[3], N, C, C);
  for (int r = 0; r < TP; r++) {
    pw_linear_forward(qkv_r, x, ws[0][r], ws[1][r], N, C, 3 * C / TP);
    pw_attention_forward(a_r, att, qkv_r, B, T, C / TP, NH / TP, NH / TP);
    pw_linear_forward(part[r], a_r, ws[2][r], NULL, N, C / TP, C);
  }
  const float *in[TP] = {part[0], part[1]};
  pw_reduce_ordered(ysum, in, TP, N * C);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) ysum[n * C + c] += w[3][c];
  expect_close(ysum, y, N * C, 1e-5f, "attention");
  /* MLP */
  pw_linear_forward(h, x, w[4], w[5], N, C, H);
  pw_gelu_forward(g, dg, h, N * H);
  pw_linear_forward(y2, g, w[6], w[7], N, H, C);
  for (int r = 0; r < TP; r++) {
    pw_linear_forward(h_r, x, ws[4][r], ws[5][r], N, C, H / TP);
    pw_gelu_forward(g_r, dg, h_r, N * H / TP);
    pw_linear_forward(part[r], g_r, ws[6][r], NULL, N, H / TP, C);
  }
  pw_reduce_ordered(ysum, in, TP, N * C);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) ysum[n * C + c] += w[7][c];
  expect_close(ysum, y2, N * C, 1e-5f, "mlp");
  /* qkv's input gradient: each rank's part from its heads, summed */
  fill(dy, N * 3 * C, 5);
  pw_linear_backward_input(dx, dy, w[0], N, C, 3 * C, 0);
  const pw_param *pq = &m.params[param_id(&m, names[1])];
  for (int r = 0; r < TP; r++) {
    static float dy_r[N * 3 * C];
    for (int n = 0; n < N; n++) pw_tp_shard(dy_r + n * 3 * C / TP, dy + n * 3 * C, pq, PW_TP_QKV, TP, r);
    pw_linear_backward_input(dx_r[r], dy_r, ws[0][r], N, C, 3 * C / TP, 0);
  }
  const float *din[TP] = {dx_r[0], dx_r[1]};
  pw_reduce_ordered(dxsum, din, TP, N * C);
  expect_close(dxsum, dx, N * C, 1e-5f, "qkv input gradient");
  for (int i = 0; i < 8; i++) {
    free(w[i]);
    for (int r = 0; r < TP; r++) free(ws[i][r]);
  }
  pw_model_free(&m);
  pw_job_free(&job);
}

static void test_vocab_parallel_xent(void **state) {
  (void)state;
  enum { N = 6, V = 48 };
  static float logits[N * V], probs[N * V], dl[N * V];
  int32_t tg[N] = {0, 47, 11, 24, 23, 5};
  fill(logits, N * V, 3);
  for (int i = 0; i < N * V; i++) logits[i] *= 8.0f;
  float scale = 1.0f / 12.0f;
  float want = pw_crossentropy_forward(probs, logits, tg, N, V, scale);
  pw_crossentropy_backward_input(dl, probs, tg, N, V, scale, 0);
  for (int tp = 1; tp <= 4; tp *= 2) {
    int Vr = V / tp;
    static float lr[4][N * V], pr[4][N * V], dr[4][N * V], mx[4][N], part[4][2 * N], gmx[N], sum[2 * N];
    for (int r = 0; r < tp; r++) {
      for (int n = 0; n < N; n++) memcpy(lr[r] + n * Vr, logits + n * V + r * Vr, (size_t)Vr * sizeof(float));
      pw_xent_vp_max(mx[r], lr[r], N, Vr);
    }
    for (int n = 0; n < N; n++) {
      gmx[n] = mx[0][n];
      for (int r = 1; r < tp; r++) gmx[n] = fmaxf(gmx[n], mx[r][n]);
    }
    for (int r = 0; r < tp; r++) pw_xent_vp_partial(part[r], pr[r], lr[r], gmx, tg, N, Vr, r * Vr);
    const float *in[4] = {part[0], part[1], part[2], part[3]};
    pw_reduce_ordered(sum, in, tp, 2 * N);
    for (int r = 0; r < tp; r++) {
      float loss = pw_xent_vp_finish(pr[r], sum, N, Vr, scale);
      assert_float_equal(loss, want, 1e-6 * fabs(want));
      pw_xent_vp_backward_input(dr[r], pr[r], tg, N, Vr, r * Vr, scale, 0);
      for (int n = 0; n < N; n++) expect_close(dr[r] + n * Vr, dl + n * V + r * Vr, (size_t)Vr, 1e-5f, "dlogits");
    }
  }
}

/* The vocab-parallel embedding: the ordered sum of the ranks' rows is the
 * whole table's lookup (every other rank adds a zero), and each rank's
 * gradient is its rows of the whole gradient, bit for bit. */
static void test_vocab_parallel_embed(void **state) {
  (void)state;
  enum { N = 7, C = 5, V = 12, TP = 3, VR = V / TP };
  static float wte[V * C], out[N * C], dout[N * C], dw[V * C], o_r[TP][N * C], dw_r[TP][VR * C], sum[N * C];
  int32_t tok[N] = {0, 11, 4, 4, 7, 3, 8};
  fill(wte, V * C, 17);
  fill(dout, N * C, 18);
  pw_embed_forward(out, tok, wte, N, C);
  pw_embed_backward_weight(dw, dout, tok, N, C);
  for (int r = 0; r < TP; r++) {
    pw_embed_vp_forward(o_r[r], tok, wte + r * VR * C, N, C, VR, r * VR);
    pw_embed_vp_backward_weight(dw_r[r], dout, tok, N, C, VR, r * VR);
    assert_memory_equal(dw_r[r], dw + r * VR * C, sizeof dw_r[r]);
  }
  const float *in[TP] = {o_r[0], o_r[1], o_r[2]};
  pw_reduce_ordered(sum, in, TP, N * C);
  assert_memory_equal(sum, out, sizeof out);
}

/* A whole model's forward at tp ranks, node by node on the kernels with
 * the split of tp.h — what a tensor-parallel stage computes — against the
 * single-process program's loss. Values are per rank: [tp][value]. */
enum { XB = 2, XMAX = 4 };

static void allreduce(float *const *v, int tp, size_t n) {
  const float *in[XMAX] = {0};
  for (int r = 0; r < tp; r++) in[r] = v[r];
  pw_reduce_ordered(v[0], in, tp, n);
  for (int r = 1; r < tp; r++) memcpy(v[r], v[0], n * sizeof(float));
}

static float tp_forward(const pw_model *m, pw_prog *ref, const uint8_t *k, int tp, const int32_t *tok,
                        const int32_t *tg) {
  float *val[XMAX][256] = {{0}}, *w[XMAX][256] = {{0}}, loss = 0;
  assert_true(m->n_values < 256 && m->n_params < 256);
  for (int i = 0; i < pw_prog_n_params(ref); i++) {
    pw_prog_param *pp = pw_prog_param_at(ref, i);
    for (int r = 0; r < tp; r++) {
      w[r][pp->model_index] = malloc(pp->meta->numel * sizeof(float));
      pw_tp_shard(w[r][pp->model_index], pp->data, pp->meta, (pw_tp_kind)k[pp->model_index], tp, r);
    }
  }
  for (int i = 0; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    const pw_value *o = &m->values[n->out];
    int N = XB * m->values[n->in[0]].rows, Cin = m->values[n->in[0]].width;
    float *out[XMAX];
    for (int r = 0; r < tp; r++) val[r][n->out] = out[r] = calloc((size_t)N * (size_t)(o->width ? o->width : 1), 4);
    int kw = n->w >= 0 ? k[n->w] : PW_TP_REPLICATED, split = kw != PW_TP_REPLICATED && kw != PW_TP_ROW;
    for (int r = 0; r < tp; r++) {
      float *x = val[r][n->in[0]], *x2 = n->in[1] >= 0 ? val[r][n->in[1]] : NULL;
      float *W = n->w >= 0 ? w[r][n->w] : NULL, *bias = n->b >= 0 ? w[r][n->b] : NULL;
      static float aux[1 << 16], aux2[1 << 16];
      int C = o->width, wc = split ? C / tp : C, hc = Cin / (n->op == PW_OP_ATTENTION || n->op == PW_OP_ROPE ? 3 : 1);
      switch ((pw_op)n->op) {
        case PW_OP_EMBED: {
          int V = m->params[n->w].shape[0] / tp;
          pw_embed_vp_forward(out[r], tok, W, N, C, V, r * V);
          break;
        }
        case PW_OP_POSEMBED: pw_posembed_forward(out[r], x, W, XB, m->values[n->out].rows, C); break;
        case PW_OP_LAYERNORM: pw_layernorm_forward(out[r], aux, aux2, x, W, bias, N, C, n->eps); break;
        case PW_OP_RMSNORM: pw_rmsnorm_forward(out[r], aux, x, W, N, C, n->eps); break;
        case PW_OP_LINEAR:
          if (kw == PW_TP_ROW) pw_linear_forward(out[r], x, W, NULL, N, Cin / tp, C);
          else pw_linear_forward(out[r], x, W, bias, N, Cin, wc);
          break;
        case PW_OP_ROPE: pw_rope_forward(out[r], x, XB, n->T, hc / tp, n->NH / tp, n->NH / tp, &(pw_rope){.theta = n->base}); break;
        case PW_OP_ATTENTION: pw_attention_forward(out[r], aux, x, XB, n->T, hc / tp, n->NH / tp, n->NH / tp); break;
        case PW_OP_GELU: pw_gelu_forward(out[r], aux, x, N * C / tp); break;
        case PW_OP_SWIGLU: pw_swiglu_forward(out[r], x, x2, N * C / tp); break;
        case PW_OP_ADD: pw_add_forward(out[r], x, x2, N * C); break;
        case PW_OP_XENT: {
          int V = Cin / tp; /* the logits' width on a rank */
          static float mx[XMAX][64], part[XMAX][128], gmx[64];
          assert_true(N <= 64);
          pw_xent_vp_max(mx[r], x, N, V);
          if (r < tp - 1) break;
          for (int j = 0; j < N; j++)
            for (int q = 0; q < tp; q++) gmx[j] = q ? fmaxf(gmx[j], mx[q][j]) : mx[0][j];
          float *parts[XMAX];
          for (int q = 0; q < tp; q++) {
            pw_xent_vp_partial(part[q], aux, val[q][n->in[0]], gmx, tg, N, V, q * V);
            parts[q] = part[q];
          }
          allreduce(parts, tp, 2 * (size_t)N);
          loss = pw_xent_vp_finish(aux, part[0], N, V, 1.0f / (float)N);
          break;
        }
        default: fail_msg("op %s", pw_op_name((pw_op)n->op));
      }
    }
    if (n->op == PW_OP_EMBED || kw == PW_TP_ROW) allreduce(out, tp, (size_t)N * (size_t)o->width);
    if (kw == PW_TP_ROW && n->b >= 0)
      for (int r = 0; r < tp; r++)
        for (int j = 0; j < N * o->width; j++) out[r][j] += w[r][n->b][j % o->width];
  }
  for (int r = 0; r < tp; r++) {
    for (int v = 0; v < 256; v++) free(val[r][v]);
    for (int v = 0; v < 256; v++) free(w[r][v]);
  }
  return loss;
}

static void test_model_forward(void **state) {
  (void)state;
  for (int v = 0; v < 3; v++) {
    pw_job job;
    pw_model m;
    pw_err err = {0};
    uint8_t k[256];
    model_of(v, 4, &job, &m, k);
    pw_prog_config cfg = {.layer_hi = m.n_layers, .mb_size = XB, .batch_size = XB, .n_slots = 1};
    pw_prog *p;
    assert_int_equal(pw_prog_create(&m, &cfg, &p, &err), 0);
    pw_prog_init_params(p, 11);
    int32_t *tok = pw_prog_value(p, 0, m.input_value), *tg = pw_prog_value(p, 0, m.target_value);
    for (int i = 0; i < XB * 8; i++) tok[i] = (i * 37 + 5) % 64, tg[i] = (i * 11 + 3) % 64;
    float want;
    assert_int_equal(pw_prog_forward(p, 0, &want, NULL), 0);
    for (int tp = 1; tp <= 4; tp *= 2) {
      float got = tp_forward(&m, p, k, tp, tok, tg);
      printf("model %d tp %d: loss %.9g, single process %.9g, relative %.2e\n", v, tp, (double)got, (double)want,
             fabs((double)got - want) / want);
      assert_float_equal(got, want, 1e-5 * want);
    }
    pw_prog_free(p);
    pw_model_free(&m);
    pw_job_free(&job);
  }
}

static void test_errors(void **state) {
  (void)state;
  static const struct {
    const char *model;
    int tp;
    const char *msg;
  } cases[] = {
      {GPT, 3, "must divide model.n_heads (4 % 3 != 0)"},
      {"\"template\": \"gpt\", \"vocab_size\": 66, \"seq_len\": 8, \"d_model\": 16, \"n_layers\": 1, \"n_heads\": 4",
       4, "must divide model.vocab_size (66 % 4 != 0)"},
      {GPT ", \"ffn_hidden\": 30", 4, "must divide the MLP width (model.ffn_hidden: 30 % 4 != 0)"},
      {"\"template\": \"mlp\", \"in_dim\": 4, \"hidden_dim\": 8, \"n_layers\": 2, \"out_dim\": 2, \"loss\": \"mse\"", 2, "splits the gpt and llama templates only"},
      {GPT ", \"lora\": {\"rank\": 4, \"targets\": [\"*.qkv\"]}", 2, "does not split LoRA adapters"},
      {GPT ", \"moe\": {\"experts\": 4}", 2, "does not split experts (model.moe)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    pw_job job;
    pw_model m;
    pw_err err = {0};
    if (job_of(cases[i].model, cases[i].tp, &job, &m, &err) != PW_ESPEC) fail_msg("case %zu accepted", i);
    assert_string_equal(err.path, "mesh.tp");
    if (!strstr(err.msg, cases[i].msg)) fail_msg("case %zu: %s", i, err.msg);
  }
}

/* gpt: embedding + each block's two row linears forward, 3 per row at the
 * loss; each block's qkv and fc and the lm_head backward. llama: gate and
 * up read one input, summed once for both: two per block as well. */
static void test_comm(void **state) {
  (void)state;
  enum { T = 8, C = 16, L = 2 };
  for (int v = 0; v < 2; v++) {
    pw_job job;
    pw_model m;
    pw_err err = {0};
    assert_int_equal(job_of(v ? LLAMA : GPT, 2, &job, &m, &err), 0);
    uint8_t k[256];
    pw_tp_kinds(&m, k);
    pw_tp_comm c;
    pw_tp_comm_layers(&m, k, 0, m.n_layers, &c);
    assert_int_equal(c.fwd, T * C + L * 2 * T * C + 3 * T);
    assert_int_equal(c.n_fwd, 1 + 2 * L + 2);
    assert_int_equal(c.bwd, (size_t)L * 2 * T * C + T * C);
    assert_int_equal(c.n_bwd, L * 2 + 1);
    pw_model_free(&m);
    pw_job_free(&job);
  }
}

/* The plan at tp 2 against tp 1: each rank's parameters and AdamW state
 * are its shards, its F, I and W a half of the FLOPs' cost plus the
 * all-reduces, its tp bytes per step the model's all-reduced floats; and
 * every schedule is still proved by the simulator. */
static void test_plan(void **state) {
  (void)state;
  enum { T = 8, C = 16, L = 2, MB = 2, M = 4 };
  pw_job j1, j2;
  pw_plan p1, p2;
  pw_err err = {0};
  assert_int_equal(parse_job(GPT, 1, 1, 1, "1f1b", &j1, &err), 0);
  assert_int_equal(parse_job(GPT, 1, 2, 1, "1f1b", &j2, &err), 0);
  assert_int_equal(pw_plan_build(&j1, NULL, &p1, &err), 0);
  assert_int_equal(pw_plan_build(&j2, NULL, &p2, &err), 0);
  size_t whole = 0, split = 0;
  for (int i = 0; i < p2.model.n_params; i++)
    *(p2.tp_kinds[i] == PW_TP_REPLICATED ? &whole : &split) += p2.model.params[i].numel;
  assert_int_equal(p1.mem[0].params, (whole + split) * 4);
  assert_int_equal(p2.mem[0].params, (whole + split / 2) * 4);
  assert_int_equal(p2.mem[0].adam, 2 * (whole + split / 2) * 4);
  assert_int_equal(p1.mem[0].tp_sent, 0);
  size_t fwd = T * C + L * 2 * T * C + 3 * T, bwd = L * 2 * T * C + T * C; /* test_comm */
  assert_int_equal(p2.mem[0].tp_sent, (fwd + bwd) * MB * M * 4);    /* 2(tp-1)/tp = 1 */
  double link = (double)fwd * MB * 4 / PW_PLAN_LINK_BW + (1 + 2 * L + 2) * 2 * PW_PLAN_LINK_LATENCY;
  assert_float_equal(p2.cost_f[0], p1.cost_f[0] / 2 + link, 1e-12);
  assert_float_equal(p2.cost_w[0], p1.cost_w[0] / 2, 1e-12);
  pw_plan_free(&p1), pw_plan_free(&p2);
  pw_job_free(&j1), pw_job_free(&j2);
  static const struct {
    const char *sched;
    int pp, V;
  } cases[] = {{"1f1b", 2, 1}, {"zb-h1", 2, 1}, {"interleaved-1f1b", 4, 2}, {"dualpipev", 2, 2}, {"gpipe", 2, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (int v = 0; v < 2; v++) {
      const char *model = v ? LLAMA ", \"n_layers\": 8" : GPT ", \"n_layers\": 8, \"tie_embeddings\": true";
      pw_job job;
      assert_int_equal(parse_job(model, cases[i].pp, 2, cases[i].V, cases[i].sched, &job, &err), 0);
      pw_plan p;
      if (pw_plan_build(&job, NULL, &p, &err)) fail_msg("%s: %s: %s", cases[i].sched, err.path, err.msg);
      uint64_t sent = 0;
      for (int r = 0; r < p.pp; r++) sent += p.mem[r].tp_sent;
      assert_true(sent > 0);
      pw_plan_free(&p);
      pw_job_free(&job);
    }
  pw_job job;
  assert_int_equal(parse_job(GPT, 2, 3, 1, "1f1b", &job, &err), 0);
  assert_int_equal(pw_plan_build(&job, NULL, &p1, &err), PW_ESPEC);
  assert_string_equal(err.path, "mesh.tp");
  pw_job_free(&job);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kinds),      cmocka_unit_test(test_shards_tile), cmocka_unit_test(test_block_shards),
      cmocka_unit_test(test_vocab_parallel_xent), cmocka_unit_test(test_errors), cmocka_unit_test(test_comm),
      cmocka_unit_test(test_model_forward),
      cmocka_unit_test(test_vocab_parallel_embed),
      cmocka_unit_test(test_plan),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
