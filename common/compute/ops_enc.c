/* ops_enc: the encoder's kernels (ops_enc.h). Where it costs nothing the
 * float arithmetic is PyTorch's CPU kernels' operation by operation (the
 * erf GELU and its backward, tanh's backward, the cross-entropy's rows as
 * ops.c computes them), so a BERT's logits agree with transformers' to
 * float rounding. */
#include "ops_enc.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "ops_math.h"

/* ---- erf GELU ------------------------------------------------------------ */

/* PyTorch's GeluKernel (approximate 'none'): kAlpha = 1/sqrt(2),
 * kBeta = 2/sqrt(pi) * 1/sqrt(2) * 0.5 = 1/sqrt(2 pi), both as floats. */
#define GELU_ALPHA ((float)M_SQRT1_2)
#define GELU_ERF_BETA ((float)(M_2_SQRTPI * M_SQRT1_2 * 0.5))

/* libm's erff (no vectorized erf here: an encoder's GELU is a few percent
 * of its step); the derivative saved with the backward's formula term for
 * term: cdf + x * pdf. */
void pw_gelu_erf_forward(float *out, float *dgelu, const float *inp, int n) {
  for (int i = 0; i < n; i++) {
    float x = inp[i];
    float e = erff(x * GELU_ALPHA);
    float cdf = 0.5f * (1.0f + e);
    out[i] = x * 0.5f * (1.0f + e);
    float pdf = GELU_ERF_BETA * pw__exp(x * x * -0.5f);
    dgelu[i] = cdf + x * pdf;
  }
}

PW_CPU_DISPATCH(pw_gelu_erf_backward_input, (float *dinp, const float *dout, const float *dgelu, int n, int acc),
                (dinp, dout, dgelu, n, acc)) {
  for (int i = 0; i < n; i++) dinp[i] = pw__acc(acc, dinp[i], dout[i] * dgelu[i]);
}

/* ---- tanh ---------------------------------------------------------------- */

PW_CPU_DISPATCH(pw_tanh_forward, (float *out, const float *inp, int n), (out, inp, n)) {
  for (int i = 0; i < n; i++) out[i] = pw__tanh(inp[i]);
}

PW_CPU_DISPATCH(pw_tanh_backward_input, (float *dinp, const float *dout, const float *out, int n, int acc),
                (dinp, dout, out, n, acc)) {
  for (int i = 0; i < n; i++) dinp[i] = pw__acc(acc, dinp[i], dout[i] * (1.0f - out[i] * out[i]));
}

/* ---- token types --------------------------------------------------------- */

/* Row t's type given `after`, whether a separator came before it. */
static inline int toktype(int after, int32_t tok, int pad) { return after && tok != pad ? 1 : 0; }

PW_CPU_DISPATCH(pw_toktype_forward, (float *out, const float *inp, const int32_t *tok, const float *wtt, int B,
                                     int T, int C, int sep, int pad),
                (out, inp, tok, wtt, B, T, C, sep, pad)) {
  for (int b = 0; b < B; b++) {
    int after = 0;
    for (int t = 0; t < T; t++) {
      size_t o = ((size_t)b * T + t) * C;
      int32_t k = tok[(size_t)b * T + t];
      const float *w = wtt + (size_t)toktype(after, k, pad) * C;
      for (int c = 0; c < C; c++) out[o + c] = inp[o + c] + w[c];
      after |= sep >= 0 && k == sep;
    }
  }
}

PW_CPU_DISPATCH(pw_toktype_backward_input, (float *dinp, const float *dout, int B, int T, int C, int acc),
                (dinp, dout, B, T, C, acc)) {
  size_t n = (size_t)B * T * C;
  for (size_t i = 0; i < n; i++) dinp[i] = pw__acc(acc, dinp[i], dout[i]);
}

PW_CPU_DISPATCH(pw_toktype_backward_weight, (float *dwtt, const float *dout, const int32_t *tok, int B, int T,
                                             int C, int sep, int pad),
                (dwtt, dout, tok, B, T, C, sep, pad)) {
  for (int b = 0; b < B; b++) {
    int after = 0;
    for (int t = 0; t < T; t++) {
      int32_t k = tok[(size_t)b * T + t];
      const float *d = dout + ((size_t)b * T + t) * C;
      float *dw = dwtt + (size_t)toktype(after, k, pad) * C;
      for (int c = 0; c < C; c++) dw[c] += d[c];
      after |= sep >= 0 && k == sep;
    }
  }
}

/* ---- first row ----------------------------------------------------------- */

void pw_first_row_forward(float *out, const float *inp, int B, int T, int C) {
  for (int b = 0; b < B; b++) memcpy(out + (size_t)b * C, inp + (size_t)b * T * C, (size_t)C * sizeof(float));
}

PW_CPU_DISPATCH(pw_first_row_backward_input, (float *dinp, const float *dout, int B, int T, int C, int acc),
                (dinp, dout, B, T, C, acc)) {
  for (int b = 0; b < B; b++) {
    float *d = dinp + (size_t)b * T * C;
    for (int c = 0; c < C; c++) d[c] = pw__acc(acc, d[c], dout[(size_t)b * C + c]);
    if (!acc) memset(d + C, 0, (size_t)(T - 1) * C * sizeof(float)); /* 0 + 0: +0, as a zeroed buffer */
  }
}

/* ---- embedding with a padding row ---------------------------------------- */

PW_CPU_DISPATCH(pw_embed_pad_backward_weight, (float *dwte, const float *dout, const int32_t *tok, int N, int C,
                                               int pad),
                (dwte, dout, tok, N, C, pad)) {
  for (int n = 0; n < N; n++) {
    if (tok[n] == pad) continue;
    float *dw = dwte + (size_t)tok[n] * C;
    const float *d = dout + (size_t)n * C;
    for (int c = 0; c < C; c++) dw[c] += d[c];
  }
}

/* ---- masked-LM cross-entropy --------------------------------------------- */

/* The rows of ops.c's crossentropy_rows, those with a target only. */
static PW_CPU_DISPATCH(xent_mlm_rows, (double *total, float *probs, const float *logits, const int32_t *targets,
                                       int N, int V),
                       (total, probs, logits, targets, N, V)) {
  double tot = 0.0;
  for (int n = 0; n < N; n++)
    if (targets[n] >= 0) tot += pw__xent_row(probs + (size_t)n * V, logits + (size_t)n * V, V, targets[n]);
  *total = tot;
}

float pw_xent_mlm_forward(float *probs, const float *logits, const int32_t *targets, int N, int V, float scale) {
  double total;
  xent_mlm_rows(&total, probs, logits, targets, N, V);
  return (float)(total * scale);
}

PW_CPU_DISPATCH(pw_xent_mlm_backward_input, (float *dlogits, const float *probs, const int32_t *targets, int N,
                                             int V, float scale, int acc),
                (dlogits, probs, targets, N, V, scale, acc)) {
  for (int n = 0; n < N; n++) {
    const float *p = probs + (size_t)n * V;
    float *d = dlogits + (size_t)n * V;
    if (targets[n] < 0) { /* ignored: no gradient (the probabilities were never computed) */
      for (int v = 0; v < V; v++) d[v] = pw__acc(acc, d[v], 0.0f);
      continue;
    }
    for (int v = 0; v < V; v++) d[v] = pw__acc(acc, d[v], scale * p[v]);
    d[targets[n]] -= scale;
  }
}
