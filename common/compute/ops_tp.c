/* ops_tp: the vocab-parallel cross-entropy of a tensor-parallel head
 * (ops.h, common/model/tp.h): each rank holds the logits of its vocabulary
 * shard only, and the row statistics meet in two all-reduces. */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "ops.h"
#include "ops_math.h"

void pw_xent_vp_max(float *mx, const float *logits, int N, int V) {
  for (int n = 0; n < N; n++) mx[n] = pw__max(logits + (size_t)n * V, V);
}

PW_CPU_DISPATCH(pw_xent_vp_partial, (float *part, float *probs, const float *logits, const float *mx,
                                     const int32_t *targets, int N, int V, int v0),
                (part, probs, logits, mx, targets, N, V, v0)) {
  for (int n = 0; n < N; n++) {
    const float *x = logits + (size_t)n * V;
    float *p = probs + (size_t)n * V;
    for (int v = 0; v < V; v++) p[v] = pw__exp(x[v] - mx[n]);
    int t = targets[n] - v0;
    part[2 * n] = (float)pw__sum_d(p, V);
    part[2 * n + 1] = t >= 0 && t < V ? x[t] - mx[n] : 0.0f;
  }
}

float pw_xent_vp_finish(float *probs, const float *part, int N, int V, float scale) {
  double tot = 0.0;
  for (int n = 0; n < N; n++) {
    float *p = probs + (size_t)n * V;
    float inv = (float)(1.0 / part[2 * n]);
    for (int v = 0; v < V; v++) p[v] *= inv;
    tot += log((double)part[2 * n]) - (double)part[2 * n + 1];
  }
  return (float)(tot * scale);
}

PW_CPU_DISPATCH(pw_xent_vp_backward_input, (float *dlogits, const float *probs, const int32_t *targets,
                                            int N, int V, int v0, float scale, int acc),
                (dlogits, probs, targets, N, V, v0, scale, acc)) {
  for (int n = 0; n < N; n++) {
    const float *p = probs + (size_t)n * V;
    float *d = dlogits + (size_t)n * V;
    for (int v = 0; v < V; v++) d[v] = pw__acc(acc, d[v], scale * p[v]);
    int t = targets[n] - v0;
    if (t >= 0 && t < V) d[t] -= scale;
  }
}

void pw_embed_vp_forward(float *out, const int32_t *tok, const float *wte, int N, int C, int V, int v0) {
  for (int n = 0; n < N; n++) {
    int t = tok[n] - v0;
    float *o = out + (size_t)n * C;
    if (t >= 0 && t < V)
      memcpy(o, wte + (size_t)t * C, (size_t)C * sizeof(float));
    else
      memset(o, 0, (size_t)C * sizeof(float));
  }
}

void pw_embed_vp_backward_weight(float *dwte, const float *dout, const int32_t *tok, int N, int C, int V,
                                 int v0) {
  for (int n = 0; n < N; n++) {
    int t = tok[n] - v0;
    if (t < 0 || t >= V) continue;
    float *dw = dwte + (size_t)t * C;
    const float *d = dout + (size_t)n * C;
    for (int c = 0; c < C; c++) dw[c] += d[c];
  }
}
