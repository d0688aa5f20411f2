/* test_ops_moe: the mixture-of-experts kernels (ops_moe.h), as the chain a
 * MoE feed-forward runs (route, order, dispatch, the experts' SwiGLU MLPs
 * as grouped linears, combine), gradient-checked as one op against a
 * double-precision reference written per token (its K experts' MLPs,
 * weighted) for each gate kind, with experts no token chooses; and the
 * routing's determinism: ties go to the lower expert, the expert-major
 * order is (n, k) ascending inside each block. */
#include "opcheck.h"

#include "ops_moe.h"

/* d = {N, C, E, K, H, gate}; fp: the SIGMOID gates' scale.
 * inputs: x (N,C), logits (N,E), w1 (E,H,C), w3 (E,H,C), w2 (E,C,H), bias (E) */
enum { MX, ML, MW1, MW3, MW2, MB };

typedef struct {
  float *r, *probs, *xs, *a1, *a3, *u, *ys;
  int *off, *cur;
} moe_bufs;

static size_t saved_floats(int N, int C, int E, int K, int H) {
  size_t M = (size_t)N * K;
  return (size_t)N * 2 * K + (size_t)N * E + M * C + 3 * M * H + M * C + (size_t)(2 * E + 1);
}

static moe_bufs carve(float *saved, int N, int C, int E, int K, int H) {
  size_t M = (size_t)N * K;
  moe_bufs b;
  b.r = saved, b.probs = b.r + (size_t)N * 2 * K, b.xs = b.probs + (size_t)N * E, b.a1 = b.xs + M * C;
  b.a3 = b.a1 + M * H, b.u = b.a3 + M * H, b.ys = b.u + M * H;
  b.off = (int *)(b.ys + M * C), b.cur = b.off + E + 1;
  return b;
}

static void moe_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  int N = c->d[0], C = c->d[1], E = c->d[2], K = c->d[3], H = c->d[4], gate = c->d[5];
  moe_bufs b = carve(saved, N, C, E, K, H);
  pw_moe_route_forward(b.r, b.probs, in[ML], gate == PW_MOE_SIGMOID ? in[MB] : NULL, N, E, K, gate, c->fp);
  pw_moe_order(b.off, b.r, N, E, K);
  pw_moe_dispatch_forward(b.xs, in[MX], b.r, b.off, b.cur, N, E, K, C);
  pw_moe_glinear_forward(b.a1, b.xs, in[MW1], b.off, E, C, H);
  pw_moe_glinear_forward(b.a3, b.xs, in[MW3], b.off, E, C, H);
  pw_swiglu_forward(b.u, b.a1, b.a3, N * K * H);
  pw_moe_glinear_forward(b.ys, b.u, in[MW2], b.off, E, H, C);
  pw_moe_combine_forward(out, b.ys, b.r, b.off, b.cur, N, E, K, C);
}

static void moe_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                    float *const *g) {
  int N = c->d[0], C = c->d[1], E = c->d[2], K = c->d[3], H = c->d[4], gate = c->d[5];
  size_t M = (size_t)N * K;
  moe_bufs b = carve(saved, N, C, E, K, H);
  float *dys = oc_alloc(M * C, sizeof(float)), *dr = oc_alloc((size_t)N * 2 * K, sizeof(float));
  float *du = oc_alloc(M * H, sizeof(float)), *da1 = oc_alloc(M * H, sizeof(float));
  float *da3 = oc_alloc(M * H, sizeof(float)), *dxs = oc_alloc(M * C, sizeof(float));
  /* the input halves, in the graph's reverse order (each value's first writer overwrites) */
  pw_moe_combine_backward_input(dys, dr, dout, b.ys, b.r, b.off, b.cur, N, E, K, C, 0, 0);
  pw_moe_glinear_backward_input(du, dys, in[MW2], b.off, E, H, C, 0);
  pw_swiglu_backward_input(da1, da3, du, b.a1, b.a3, (int)(M * H), 0, 0);
  if (which == IN_DATA) {
    pw_moe_glinear_backward_input(dxs, da1, in[MW1], b.off, E, C, H, 0);
    pw_moe_glinear_backward_input(dxs, da3, in[MW3], b.off, E, C, H, 1);
    pw_moe_dispatch_backward_input(g[MX], dxs, b.r, b.off, b.cur, N, E, K, C, 1);
    pw_moe_route_backward_input(g[ML], dr, b.r, b.probs, N, E, K, gate, c->fp, 1);
  } else {
    pw_moe_glinear_backward_weight(g[MW2], dys, b.u, b.off, E, H, C);
    pw_moe_glinear_backward_weight(g[MW1], da1, b.xs, b.off, E, C, H);
    pw_moe_glinear_backward_weight(g[MW3], da3, b.xs, b.off, E, C, H);
  }
  free(dys), free(dr), free(du), free(da1), free(da3), free(dxs);
}

/* Per token, in double: the gates, then the K experts' SwiGLU MLPs. */
static void moe_ref(const opcase *c, double *const *in, double *out) {
  int N = c->d[0], C = c->d[1], E = c->d[2], K = c->d[3], H = c->d[4], gate = c->d[5];
  for (int n = 0; n < N; n++) {
    const double *l = in[ML] + (size_t)n * E, *x = in[MX] + (size_t)n * C;
    double score[64], p[64], w[8];
    int id[8], used[64] = {0};
    double mx = l[0], s = 0;
    for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    for (int e = 0; e < E; e++) s += p[e] = exp(l[e] - mx);
    for (int e = 0; e < E; e++) {
      p[e] = gate == PW_MOE_SIGMOID ? 1.0 / (1.0 + exp(-l[e])) : p[e] / s;
      score[e] = gate == PW_MOE_SIGMOID ? p[e] + in[MB][e] : l[e];
    }
    for (int k = 0; k < K; k++) {
      int best = -1;
      for (int e = 0; e < E; e++)
        if (!used[e] && (best < 0 || score[e] > score[best])) best = e;
      used[best] = 1, id[k] = best;
    }
    double t = 0;
    for (int k = 0; k < K; k++) t += gate == PW_MOE_SOFTMAX_TOPK ? exp(l[id[k]]) : gate == PW_MOE_SIGMOID ? p[id[k]] : 0;
    for (int k = 0; k < K; k++)
      w[k] = gate == PW_MOE_SOFTMAX_TOPK ? exp(l[id[k]]) / t : gate == PW_MOE_SIGMOID ? p[id[k]] / t * c->fp : p[id[k]];
    double *o = out + (size_t)n * C;
    for (int j = 0; j < C; j++) o[j] = 0;
    for (int k = 0; k < K; k++) {
      int e = id[k];
      const double *w1 = in[MW1] + (size_t)e * H * C, *w3 = in[MW3] + (size_t)e * H * C;
      const double *w2 = in[MW2] + (size_t)e * C * H;
      for (int j = 0; j < C; j++) {
        double y = 0;
        for (int h = 0; h < H; h++) {
          double a1 = 0, a3 = 0;
          for (int i = 0; i < C; i++) a1 += w1[(size_t)h * C + i] * x[i], a3 += w3[(size_t)h * C + i] * x[i];
          y += w2[(size_t)j * H + h] * a1 / (1.0 + exp(-a1)) * a3;
        }
        o[j] += w[k] * y;
      }
    }
  }
}

static opcase moe_case(int N, int C, int E, int K, int H, int gate) {
  static const char *const kinds[] = {"softmax-topk", "softmax-all", "sigmoid"};
  opcase c = {.n_in = 6,
              .in_name = {"x", "logits", "w1", "w3", "w2", "bias"},
              .in_kind = {IN_DATA, IN_DATA, IN_PARAM, IN_PARAM, IN_PARAM, IN_CONST},
              .in_n = {(size_t)N * C, (size_t)N * E, (size_t)E * H * C, (size_t)E * H * C, (size_t)E * C * H,
                       (size_t)E},
              .out_n = (size_t)N * C,
              .saved_n = saved_floats(N, C, E, K, H),
              .d = {N, C, E, K, H, gate},
              .fp = gate == PW_MOE_SIGMOID ? 2.5f : 1.0f,
              .fwd = moe_fwd, .bwd = moe_bwd, .ref = moe_ref};
  snprintf(c.name, sizeof c.name, "moe %s N=%d C=%d E=%d K=%d H=%d", kinds[gate], N, C, E, K, H);
  return c;
}

/* Qwen2-MoE's shared expert gate: y = x sigmoid(g), g one a row.
 * d = {N, C}; inputs x (N,C), g (N). */
static void sgate_fwd(const opcase *c, float *const *in, float *out, float *saved) {
  (void)saved;
  pw_sigmoid_gate_forward(out, in[0], in[1], c->d[0], c->d[1]);
}
static void sgate_bwd(const opcase *c, int which, float *const *in, float *saved, const float *dout,
                      float *const *g) {
  (void)saved;
  if (which == IN_DATA) pw_sigmoid_gate_backward_input(g[0], g[1], dout, in[0], in[1], c->d[0], c->d[1], 1, 1);
}
static void sgate_ref(const opcase *c, double *const *in, double *out) {
  for (int n = 0; n < c->d[0]; n++)
    for (int j = 0; j < c->d[1]; j++) out[n * c->d[1] + j] = in[0][n * c->d[1] + j] / (1.0 + exp(-in[1][n]));
}

static void test_sigmoid_gate(void **state) {
  (void)state;
  opcase c = {.n_in = 2, .in_name = {"x", "g"}, .in_kind = {IN_DATA, IN_DATA}, .in_n = {7 * 5, 7}, .out_n = 7 * 5,
              .d = {7, 5}, .init_scale = 3.0, .fwd = sgate_fwd, .bwd = sgate_bwd, .ref = sgate_ref};
  snprintf(c.name, sizeof c.name, "sigmoid_gate N=7 C=5");
  check_op(&c);
}

static void test_moe_grad(void **state) {
  (void)state;
  static const int shapes[][5] = {{6, 5, 4, 2, 3}, {5, 4, 8, 1, 6}, {9, 3, 6, 3, 4}};
  for (int gate = 0; gate < 3; gate++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      opcase c = moe_case(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4], gate);
      check_op(&c);
    }
}

/* Routing is a pure function of the logits: equal scores go to the lower
 * expert; the blocks are expert-major, (n, k) ascending inside. */
static void test_moe_order(void **state) {
  (void)state;
  enum { N = 3, E = 4, K = 2 };
  const float logits[N * E] = {0, 1, 1, 0, /* tie 1 = 2: expert 1 first */
                               5, 0, 0, 5, /* tie 0 = 3 */
                               0, 0, 2, 1};
  float r[N * 2 * K], probs[N * E];
  int off[E + 1], cur[E];
  pw_moe_route_forward(r, probs, logits, NULL, N, E, K, PW_MOE_SOFTMAX_TOPK, 1.0f);
  const float ids[N][K] = {{1, 2}, {0, 3}, {2, 3}};
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) assert_true(r[n * 2 * K + K + k] == ids[n][k]);
  assert_true(r[0] == 0.5f && r[1] == 0.5f); /* equal logits: equal weights */
  pw_moe_order(off, r, N, E, K);
  const int want_off[E + 1] = {0, 1, 2, 4, 6};
  assert_memory_equal(off, want_off, sizeof off);
  /* expert 0: (1,0); 1: (0,0); 2: (0,1), (2,0); 3: (1,1), (2,1): token n's
   * feature c = 10 n + c lands in those rows */
  float x[N * 2], xs[N * K * 2];
  for (int i = 0; i < N * 2; i++) x[i] = (float)(10 * (i / 2) + i % 2);
  pw_moe_dispatch_forward(xs, x, r, off, cur, N, E, K, 2);
  const float want_xs[N * K * 2] = {10, 11, 0, 1, 0, 1, 20, 21, 10, 11, 20, 21};
  assert_memory_equal(xs, want_xs, sizeof xs);
  /* DeepSeek's bias moves the choice, not the weights */
  const float bias[E] = {0, 0, 0, 10};
  pw_moe_route_forward(r, probs, logits, bias, 1, E, 1, PW_MOE_SIGMOID, 1.0f);
  assert_true(r[1] == 3.0f && r[0] == 1.0f); /* one expert: its own weight, s / s */
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_moe_grad), cmocka_unit_test(test_moe_order),
                                     cmocka_unit_test(test_sigmoid_gate)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
