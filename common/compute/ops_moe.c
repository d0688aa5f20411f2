/* ops_moe: the mixture-of-experts kernels (ops_moe.h). */
#include "ops_moe.h"

#include <math.h>
#include <string.h>

#include "gemm.h"
#include "ops_math.h"

/* ---- route ---------------------------------------------------------------- */

/* The K best of score[0..E) into ids (as floats), best first, ties to the
 * lower index (a strict > keeps the earlier of equals). K and E are small
 * (K <= E, tens): selection by repeated scans. */
static void top_k(float *ids, const float *score, const float *bias, int E, int K) {
  for (int k = 0; k < K; k++) {
    int best = -1;
    float bv = 0;
    for (int e = 0; e < E; e++) {
      int taken = 0;
      for (int j = 0; j < k && !taken; j++) taken = ids[j] == (float)e;
      if (taken) continue;
      float v = bias ? score[e] + bias[e] : score[e];
      if (best < 0 || v > bv) best = e, bv = v;
    }
    ids[k] = (float)best;
  }
}

void pw_moe_route_forward(float *r, float *probs, const float *logits, const float *bias, int N, int E, int K,
                          int gate, float scale) {
  for (int n = 0; n < N; n++) {
    const float *l = logits + (size_t)n * E;
    float *p = probs + (size_t)n * E, *w = r + (size_t)n * 2 * K, *id = w + K;
    if (gate == PW_MOE_SIGMOID) {
      for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + pw__exp(-l[e]));
      top_k(id, p, bias, E, K);
      float s = 0;
      for (int k = 0; k < K; k++) s += p[(int)id[k]];
      for (int k = 0; k < K; k++) w[k] = p[(int)id[k]] / s * scale;
    } else {
      float mx = pw__max(l, E), s = 0;
      for (int e = 0; e < E; e++) s += p[e] = pw__exp(l[e] - mx);
      for (int e = 0; e < E; e++) p[e] /= s;
      top_k(id, l, NULL, E, K);
      if (gate == PW_MOE_SOFTMAX_TOPK) { /* softmax over the selected logits: the best is their max */
        float t = 0;
        for (int k = 0; k < K; k++) t += w[k] = pw__exp(l[(int)id[k]] - l[(int)id[0]]);
        for (int k = 0; k < K; k++) w[k] /= t;
      } else {
        for (int k = 0; k < K; k++) w[k] = p[(int)id[k]];
      }
    }
  }
}

void pw_moe_route_backward_input(float *dlogits, const float *dr, const float *r, const float *probs, int N, int E,
                                 int K, int gate, float scale, int acc) {
  for (int n = 0; n < N; n++) {
    const float *p = probs + (size_t)n * E, *w = r + (size_t)n * 2 * K, *dw = dr + (size_t)n * 2 * K;
    float *dl = dlogits + (size_t)n * E;
    /* wd = sum_k w_k dw_k; SIGMOID's gates are scale s_k / S (S: the
     * selected scores' sum), and there wd is sum_k dw_k s_k / S, without
     * the scale: with one expert s / S is exactly 1, so its gradient is
     * exactly 0 as the constant gate's should be */
    float wd = 0, S = 0;
    if (gate == PW_MOE_SIGMOID) {
      for (int k = 0; k < K; k++) S += p[(int)w[K + k]];
      for (int k = 0; k < K; k++) wd += dw[k] * (p[(int)w[K + k]] / S);
    } else {
      for (int k = 0; k < K; k++) wd += w[k] * dw[k];
    }
    for (int e = 0; e < E; e++) {
      int k = 0;
      while (k < K && w[K + k] != (float)e) k++;
      float g;
      if (gate == PW_MOE_SOFTMAX_TOPK) /* softmax over the selected: w_k (dw_k - sum w dw) */
        g = k < K ? w[k] * (dw[k] - wd) : 0.0f;
      else if (gate == PW_MOE_SOFTMAX_ALL) /* w_k = p_e: p_e ([e selected] dw - sum w dw) */
        g = p[e] * ((k < K ? dw[k] : 0.0f) - wd);
      else /* w_k = scale s_k / S: ds_k = scale / S (dw_k - wd), times s (1 - s) */
        g = k < K ? scale / S * (dw[k] - wd) * p[e] * (1.0f - p[e]) : 0.0f;
      dl[e] = pw__acc(acc, dl[e], g);
    }
  }
}

/* ---- order, dispatch, combine ------------------------------------------------ */

void pw_moe_order(int *off, const float *r, int N, int E, int K) {
  for (int e = 0; e <= E; e++) off[e] = 0;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) off[(int)r[(size_t)n * 2 * K + K + k] + 1]++;
  for (int e = 0; e < E; e++) off[e + 1] += off[e];
}

/* The rows of the pairs (n, k) in ascending order come out of one cursor
 * per expert: its block's start, moved on by each pair it takes. */
static void cursors(int *cur, const int *off, int E) { memcpy(cur, off, (size_t)E * sizeof(int)); }
static int row_of(int *cur, const float *r, int n, int k, int K) { return cur[(int)r[(size_t)n * 2 * K + K + k]]++; }

void pw_moe_dispatch_forward(float *xs, const float *x, const float *r, const int *off, int *cur, int N, int E, int K,
                             int C) {
  cursors(cur, off, E);
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++)
      memcpy(xs + (size_t)row_of(cur, r, n, k, K) * C, x + (size_t)n * C, (size_t)C * sizeof(float));
}

void pw_moe_dispatch_backward_input(float *dx, const float *dxs, const float *r, const int *off, int *cur, int N,
                                    int E, int K, int C, int acc) {
  cursors(cur, off, E);
  for (int n = 0; n < N; n++) {
    float *d = dx + (size_t)n * C;
    for (int k = 0; k < K; k++) {
      const float *s = dxs + (size_t)row_of(cur, r, n, k, K) * C;
      int a = acc || k > 0; /* the first slot overwrites (0 + g), the rest add */
      for (int c = 0; c < C; c++) d[c] = pw__acc(a, d[c], s[c]);
    }
  }
}

void pw_moe_combine_forward(float *y, const float *ys, const float *r, const int *off, int *cur, int N, int E, int K,
                            int C) {
  cursors(cur, off, E);
  for (int n = 0; n < N; n++) {
    float *o = y + (size_t)n * C;
    const float *w = r + (size_t)n * 2 * K;
    for (int c = 0; c < C; c++) o[c] = 0.0f;
    for (int k = 0; k < K; k++) {
      const float *s = ys + (size_t)row_of(cur, r, n, k, K) * C;
      for (int c = 0; c < C; c++) o[c] += w[k] * s[c];
    }
  }
}

void pw_moe_combine_backward_input(float *dys, float *dr, const float *dy, const float *ys, const float *r,
                                   const int *off, int *cur, int N, int E, int K, int C, int acc_ys, int acc_r) {
  cursors(cur, off, E);
  for (int n = 0; n < N; n++) {
    const float *d = dy + (size_t)n * C, *w = r + (size_t)n * 2 * K;
    float *g = dr ? dr + (size_t)n * 2 * K : NULL;
    for (int k = 0; k < K; k++) {
      size_t row = (size_t)row_of(cur, r, n, k, K) * C;
      float dot = 0;
      for (int c = 0; c < C; c++) {
        dot += d[c] * ys[row + c];
        dys[row + c] = pw__acc(acc_ys, dys[row + c], w[k] * d[c]);
      }
      if (!dr) continue; /* nothing before the router takes a gradient */
      g[k] = pw__acc(acc_r, g[k], dot);
      g[K + k] = pw__acc(acc_r, g[K + k], 0.0f); /* the ids: constants */
    }
  }
}

/* ---- the shared expert's gate ------------------------------------------------- */

void pw_sigmoid_gate_forward(float *y, const float *x, const float *g, int N, int C) {
  for (int n = 0; n < N; n++) {
    float s = 1.0f / (1.0f + pw__exp(-g[n]));
    for (int c = 0; c < C; c++) y[(size_t)n * C + c] = x[(size_t)n * C + c] * s;
  }
}

void pw_sigmoid_gate_backward_input(float *dx, float *dg, const float *dy, const float *x, const float *g, int N,
                                    int C, int acc_x, int acc_g) {
  for (int n = 0; n < N; n++) {
    float s = 1.0f / (1.0f + pw__exp(-g[n])), dot = 0;
    const float *d = dy + (size_t)n * C, *xr = x + (size_t)n * C;
    for (int c = 0; c < C; c++) {
      dot += d[c] * xr[c];
      dx[(size_t)n * C + c] = pw__acc(acc_x, dx[(size_t)n * C + c], d[c] * s);
    }
    dg[n] = pw__acc(acc_g, dg[n], dot * s * (1.0f - s));
  }
}

/* ---- grouped linear --------------------------------------------------------- */

void pw_moe_glinear_forward(float *ys, const float *xs, const float *w, const int *off, int E, int C, int OC) {
  for (int e = 0; e < E; e++) {
    int m = off[e + 1] - off[e];
    if (m <= 0) continue;
    /* ys[block e] (m,OC) = xs[block e] (m,C) @ w[e]^T */
    pw_sgemm(0, 1, m, OC, C, 1.0f, xs + (size_t)off[e] * C, C, w + (size_t)e * OC * C, C, 0.0f,
             ys + (size_t)off[e] * OC, OC);
  }
}

void pw_moe_glinear_forward_rows(float *ys, const float *xs, const float *w, const int *off, int E, int C, int OC) {
  for (int e = 0; e < E; e++)
    for (int i = off[e]; i < off[e + 1]; i++)
      pw_sgemm(0, 1, 1, OC, C, 1.0f, xs + (size_t)i * C, C, w + (size_t)e * OC * C, C, 0.0f, ys + (size_t)i * OC, OC);
}

void pw_moe_glinear_backward_input(float *dxs, const float *dys, const float *w, const int *off, int E, int C, int OC,
                                   int acc) {
  for (int e = 0; e < E; e++) {
    int m = off[e + 1] - off[e];
    if (m <= 0) continue;
    pw_sgemm(0, 0, m, C, OC, 1.0f, dys + (size_t)off[e] * OC, OC, w + (size_t)e * OC * C, C, acc ? 1.0f : 0.0f,
             dxs + (size_t)off[e] * C, C);
  }
}

void pw_moe_glinear_backward_weight(float *dw, const float *dys, const float *xs, const int *off, int E, int C,
                                    int OC) {
  for (int e = 0; e < E; e++) {
    int m = off[e + 1] - off[e];
    if (m <= 0) continue; /* an expert no token chose: its gradient stays as it was */
    pw_sgemm(1, 0, OC, C, m, 1.0f, dys + (size_t)off[e] * OC, OC, xs + (size_t)off[e] * C, C, 1.0f,
             dw + (size_t)e * OC * C, C);
  }
}
