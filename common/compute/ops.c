/* ops: dense, normalisation, activation, embedding and loss kernels
 * (attention and rotary embeddings live in ops_attn.c).
 *
 * Contracts are in ops.h: forwards overwrite, backward_weight accumulates
 * (+=), backward_input accumulates or overwrites as its `acc` flag says,
 * every matmul is one cblas_sgemm, and nothing here ever allocates.
 * Where it costs nothing, the float arithmetic follows PyTorch's CPU
 * kernels operation by operation (GELU, SiLU, LayerNorm, RMSNorm, softmax),
 * so whole-model losses agree with a PyTorch reference to ~1e-6.
 *
 * Speed: every loop here is written to vectorize at -O3 (Release): exp and
 * tanh come from ops_math.h (no libm calls in loops; correctly rounded),
 * and row reductions keep PW_LANES partial sums instead of one, since a
 * single float accumulator cannot be vectorized without reassociation.
 * The kernels with such loops are PW_CPU_DISPATCH functions (cpu.h):
 * compiled for the portable baseline, AVX2 and AVX-512, the variant picked
 * per call; all give the same bits. */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "gemm.h"
#include "ops_math.h"

/* ---- embeddings ---------------------------------------------------------- */

void pw_embed_forward(float *out, const int32_t *tok, const float *wte, int N, int C) {
  for (int n = 0; n < N; n++)
    memcpy(out + (size_t)n * C, wte + (size_t)tok[n] * C, (size_t)C * sizeof(float));
}

PW_CPU_DISPATCH(pw_embed_backward_weight, (float *dwte, const float *dout, const int32_t *tok,
                                           int N, int C),
                (dwte, dout, tok, N, C)) {
  for (int n = 0; n < N; n++) {
    float *dw = dwte + (size_t)tok[n] * C;
    const float *d = dout + (size_t)n * C;
    for (int c = 0; c < C; c++) dw[c] += d[c];
  }
}

PW_CPU_DISPATCH(pw_posembed_forward, (float *out, const float *inp, const float *wpe, int B, int T,
                                      int C),
                (out, inp, wpe, B, T, C)) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      size_t o = ((size_t)b * T + t) * C;
      const float *p = wpe + (size_t)t * C;
      for (int c = 0; c < C; c++) out[o + c] = inp[o + c] + p[c];
    }
}

PW_CPU_DISPATCH(pw_posembed_backward_input, (float *dinp, const float *dout, int B, int T, int C,
                                             int acc),
                (dinp, dout, B, T, C, acc)) {
  size_t n = (size_t)B * T * C;
  for (size_t i = 0; i < n; i++) dinp[i] = pw__acc(acc, dinp[i], dout[i]);
}

PW_CPU_DISPATCH(pw_posembed_backward_weight, (float *dwpe, const float *dout, int B, int T, int C),
                (dwpe, dout, B, T, C)) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *d = dout + ((size_t)b * T + t) * C;
      float *dw = dwpe + (size_t)t * C;
      for (int c = 0; c < C; c++) dw[c] += d[c];
    }
}

/* ---- linear -------------------------------------------------------------- */

void pw_linear_forward(float *out, const float *inp, const float *w, const float *bias,
                       int N, int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  float beta = 0.0f;
  if (bias) {
    /* Like torch.addmm: out starts as the broadcast bias, sgemm adds to it. */
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
    beta = 1.0f;
  }
  if (C <= 0) {
    if (!bias) memset(out, 0, (size_t)N * OC * sizeof(float));
    return;
  }
  /* out (N,OC) = inp (N,C) @ w^T, w (OC,C). */
  pw_sgemm(0, 1, N, OC, C, 1.0f, inp, C, w, C, beta, out,
              OC);
}

void pw_linear_backward_input(float *dinp, const float *dout, const float *w, int N, int C,
                              int OC, int acc) {
  if (N <= 0 || C <= 0) return;
  if (OC <= 0) {
    if (!acc) memset(dinp, 0, (size_t)N * C * sizeof(float));
    return;
  }
  /* dinp (N,C) (+)= dout (N,OC) @ w (OC,C). OpenBLAS does beta = 0 as a
   * zeroing pass and then the same kernel as beta = 1: the same bits. */
  pw_sgemm(0, 0, N, C, OC, 1.0f, dout, OC, w, C,
              acc ? 1.0f : 0.0f, dinp, C);
}

PW_CPU_DISPATCH(pw_linear_backward_weight, (float *dw, float *dbias, const float *dout,
                                            const float *inp, int N, int C, int OC),
                (dw, dbias, dout, inp, N, C, OC)) {
  if (N <= 0 || OC <= 0) return;
  /* dw (OC,C) += dout^T (OC,N) @ inp (N,C); NULL: the weight is frozen. */
  if (C > 0 && dw)
    pw_sgemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                dw, C);
  if (dbias)
    for (int n = 0; n < N; n++) {
      const float *d = dout + (size_t)n * OC;
      for (int o = 0; o < OC; o++) dbias[o] += d[o];
    }
}

/* ---- layernorm ----------------------------------------------------------- */

#define LN_CHUNK 256 /* the backward's double sums run over chunks of this many floats */
#define LN_ROW 1024  /* rows up to this wide keep g and xhat on the stack between passes */

PW_CPU_DISPATCH(pw_layernorm_forward, (float *out, float *mean, float *rstd, const float *inp,
                                       const float *w, const float *b, int N, int C, float eps),
                (out, mean, rstd, inp, w, b, N, C, eps)) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float *y = out + (size_t)n * C;
    /* Statistics accumulated in double, rounded once: within an ulp of
     * PyTorch's (Welford, float) and independent of summation order. */
    double m = pw__sum_d(x, C) / C;
    double v = pw__sqdev_d(x, m, C);
    float mf = (float)m;
    float rs = 1.0f / sqrtf((float)(v / C) + eps);
    /* PyTorch: y = (x * rstd + (-mean * rstd)) * w + b. */
    float shift = -mf * rs;
    for (int c = 0; c < C; c++) y[c] = (x[c] * rs + shift) * w[c] + b[c];
    mean[n] = mf;
    rstd[n] = rs;
  }
}

/* One row of the backward: dx (+)= rstd * (g - mean(g) - xhat * mean(g *
 * xhat)), g = dy * w; with dw != NULL also the row's backward_weight, dw
 * += dy * xhat and db += dy, the same float operations as
 * pw_layernorm_backward_weight (one pass over the row instead of two). g
 * and xhat go through arrays so that both the elementwise part and the
 * double sums vectorize; a row wider than LN_ROW recomputes them.
 * always_inline: a copy of its own would be compiled for the baseline, not
 * for the PW_CPU_DISPATCH variant that calls it. */
static inline __attribute__((always_inline)) void ln_backward_row(float *dx, float *dw, float *db, const float *dy,
                                   const float *x, const float *w, float m, float rs, int C,
                                   int acc) {
  float gb[LN_ROW], xb[LN_ROW];
  int keep = C <= LN_ROW;
  double sg = 0.0, sgx = 0.0;
  for (int c0 = 0; c0 < C; c0 += LN_CHUNK) {
    int len = C - c0 < LN_CHUNK ? C - c0 : LN_CHUNK;
    float *g = keep ? gb + c0 : gb, *xh = keep ? xb + c0 : xb;
    for (int c = 0; c < len; c++) {
      g[c] = dy[c0 + c] * w[c0 + c];
      xh[c] = (x[c0 + c] - m) * rs;
    }
    sg += pw__sum_d(g, len);
    sgx += pw__dot_d(g, xh, len);
  }
  float mg = (float)(sg / C), mgx = (float)(sgx / C);
  for (int c0 = 0; c0 < C; c0 += LN_CHUNK) {
    int len = C - c0 < LN_CHUNK ? C - c0 : LN_CHUNK;
    float *g = keep ? gb + c0 : gb, *xh = keep ? xb + c0 : xb;
    if (!keep)
      for (int c = 0; c < len; c++) {
        g[c] = dy[c0 + c] * w[c0 + c];
        xh[c] = (x[c0 + c] - m) * rs;
      }
    for (int c = 0; c < len; c++)
      dx[c0 + c] = pw__acc(acc, dx[c0 + c], rs * (g[c] - mg - xh[c] * mgx));
    if (dw)
      for (int c = 0; c < len; c++) {
        dw[c0 + c] += dy[c0 + c] * xh[c];
        db[c0 + c] += dy[c0 + c];
      }
  }
}

PW_CPU_DISPATCH(pw_layernorm_backward_input, (float *dinp, const float *dout, const float *inp,
                                              const float *w, const float *mean, const float *rstd,
                                              int N, int C, int acc),
                (dinp, dout, inp, w, mean, rstd, N, C, acc)) {
  for (int n = 0; n < N; n++) {
    size_t o = (size_t)n * C;
    ln_backward_row(dinp + o, NULL, NULL, dout + o, inp + o, w, mean[n], rstd[n], C, acc);
  }
}

PW_CPU_DISPATCH(pw_layernorm_backward, (float *dinp, float *dw, float *db, const float *dout,
                                        const float *inp, const float *w, const float *mean,
                                        const float *rstd, int N, int C, int acc),
                (dinp, dw, db, dout, inp, w, mean, rstd, N, C, acc)) {
  for (int n = 0; n < N; n++) {
    size_t o = (size_t)n * C;
    ln_backward_row(dinp + o, dw, db, dout + o, inp + o, w, mean[n], rstd[n], C, acc);
  }
}

PW_CPU_DISPATCH(pw_layernorm_backward_weight, (float *dw, float *db, const float *dout,
                                               const float *inp, const float *mean,
                                               const float *rstd, int N, int C),
                (dw, db, dout, inp, mean, rstd, N, C)) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    const float *dy = dout + (size_t)n * C;
    float m = mean[n], rs = rstd[n];
    if (dw && db)
      for (int c = 0; c < C; c++) {
        dw[c] += dy[c] * ((x[c] - m) * rs);
        db[c] += dy[c];
      }
    else if (dw) /* the other one is frozen */
      for (int c = 0; c < C; c++) dw[c] += dy[c] * ((x[c] - m) * rs);
    else if (db)
      for (int c = 0; c < C; c++) db[c] += dy[c];
  }
}

/* ---- rmsnorm ------------------------------------------------------------- */

/* The scale is off + w: off 0 is Llama's RMSNorm (w + 0 is w but for the
 * sign of a zero weight), off 1 Gemma's (1 + w, w stored as is). */
PW_CPU_DISPATCH(pw_rmsnorm_offset_forward, (float *out, float *rstd, const float *inp, const float *w,
                                            float off, int N, int C, float eps),
                (out, rstd, inp, w, off, N, C, eps)) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float *y = out + (size_t)n * C;
    double ss = pw__dot_d(x, x, C);
    float rs = 1.0f / sqrtf((float)(ss / C) + eps);
    /* Hugging Face LlamaRMSNorm: w * (x * rstd); GemmaRMSNorm: (x * rstd) * (1 + w). */
    for (int c = 0; c < C; c++) y[c] = (off + w[c]) * (x[c] * rs);
    rstd[n] = rs;
  }
}

void pw_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
  pw_rmsnorm_offset_forward(out, rstd, inp, w, 0.0f, N, C, eps);
}

PW_CPU_DISPATCH(pw_rmsnorm_offset_backward_input, (float *dinp, const float *dout, const float *inp,
                                                   const float *w, float off, const float *rstd, int N, int C,
                                                   int acc),
                (dinp, dout, inp, w, off, rstd, N, C, acc)) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    const float *dy = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float rs = rstd[n];
    /* dx = rstd * (g - xhat * mean(g * xhat)), g = dy * (off + w), xhat = x * rstd. */
    float gb[LN_CHUNK], xb[LN_CHUNK];
    double sgx = 0.0;
    for (int c0 = 0; c0 < C; c0 += LN_CHUNK) {
      int len = C - c0 < LN_CHUNK ? C - c0 : LN_CHUNK;
      for (int c = 0; c < len; c++) {
        gb[c] = dy[c0 + c] * (off + w[c0 + c]);
        xb[c] = x[c0 + c] * rs;
      }
      sgx += pw__dot_d(gb, xb, len);
    }
    float mgx = (float)(sgx / C);
    for (int c = 0; c < C; c++) dx[c] = pw__acc(acc, dx[c], rs * (dy[c] * (off + w[c]) - (x[c] * rs) * mgx));
  }
}

void pw_rmsnorm_backward_input(float *dinp, const float *dout, const float *inp, const float *w, const float *rstd,
                               int N, int C, int acc) {
  pw_rmsnorm_offset_backward_input(dinp, dout, inp, w, 0.0f, rstd, N, C, acc);
}

PW_CPU_DISPATCH(pw_rmsnorm_backward_weight, (float *dw, const float *dout, const float *inp,
                                             const float *rstd, int N, int C),
                (dw, dout, inp, rstd, N, C)) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    const float *dy = dout + (size_t)n * C;
    float rs = rstd[n];
    for (int c = 0; c < C; c++) dw[c] += dy[c] * (x[c] * rs);
  }
}

/* ---- activations --------------------------------------------------------- */

/* sqrt(2/pi) and 0.044715 exactly as PyTorch spells them. */
#define GELU_BETA ((float)(M_SQRT2 * M_2_SQRTPI * 0.5))
#define GELU_KAPPA 0.044715f

#define GELU_CHUNK 256 /* tanh values held on the stack between the two passes */

/* The forward also saves the local derivative, computed with the
 * backward's formula term for term (the same float operations, so the same
 * bits), so that the backward is one multiply per element instead of a
 * second tanh. Two passes per chunk of GELU_CHUNK: one loop doing both
 * took 17 % longer than the tanh loop alone. */
PW_CPU_DISPATCH(pw_gelu_forward, (float *out, float *dgelu, const float *inp, int n),
                (out, dgelu, inp, n)) {
  float tb[GELU_CHUNK];
  for (int i0 = 0; i0 < n; i0 += GELU_CHUNK) {
    int len = n - i0 < GELU_CHUNK ? n - i0 : GELU_CHUNK;
    const float *xc = inp + i0;
    for (int k = 0; k < len; k++) {
      float x = xc[k];
      tb[k] = pw__tanh(GELU_BETA * (x + GELU_KAPPA * (x * x * x)));
    }
    for (int k = 0; k < len; k++) {
      float x = xc[k], th = tb[k];
      float left = 0.5f * x;
      float right = 1.0f + th;
      out[i0 + k] = left * right;
      float dleft = 0.5f * right;
      float dtanh = 1.0f - th * th;
      float dinner = GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * (x * x));
      dgelu[i0 + k] = dleft + left * dtanh * dinner;
    }
  }
}

PW_CPU_DISPATCH(pw_gelu_backward_input, (float *dinp, const float *dout, const float *dgelu, int n,
                                         int acc),
                (dinp, dout, dgelu, n, acc)) {
  for (int i = 0; i < n; i++) dinp[i] = pw__acc(acc, dinp[i], dout[i] * dgelu[i]);
}

PW_CPU_DISPATCH(pw_relu_forward, (float *out, const float *inp, int n),
                (out, inp, n)) {
  for (int i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

PW_CPU_DISPATCH(pw_relu_backward_input, (float *dinp, const float *dout, const float *inp, int n,
                                         int acc),
                (dinp, dout, inp, n, acc)) {
  for (int i = 0; i < n; i++) {
    float base = acc ? dinp[i] : 0.0f; /* where inp <= 0, the old value (or 0) stays */
    dinp[i] = inp[i] > 0.0f ? base + dout[i] : base;
  }
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + pw__exp(-x)); }

PW_CPU_DISPATCH(pw_silu_forward, (float *out, const float *inp, int n),
                (out, inp, n)) {
  /* PyTorch: x / (1 + exp(-x)). */
  for (int i = 0; i < n; i++) out[i] = inp[i] / (1.0f + pw__exp(-inp[i]));
}

PW_CPU_DISPATCH(pw_silu_backward_input, (float *dinp, const float *dout, const float *inp, int n,
                                         int acc),
                (dinp, dout, inp, n, acc)) {
  for (int i = 0; i < n; i++) {
    float x = inp[i], s = sigmoidf(x);
    dinp[i] = pw__acc(acc, dinp[i], dout[i] * (s * (1.0f + x * (1.0f - s))));
  }
}

PW_CPU_DISPATCH(pw_swiglu_forward, (float *out, const float *gate, const float *up, int n),
                (out, gate, up, n)) {
  for (int i = 0; i < n; i++) out[i] = gate[i] / (1.0f + pw__exp(-gate[i])) * up[i];
}

PW_CPU_DISPATCH(pw_swiglu_backward_input, (float *dgate, float *dup, const float *dout,
                                           const float *gate, const float *up, int n, int acc_gate,
                                           int acc_up),
                (dgate, dup, dout, gate, up, n, acc_gate, acc_up)) {
  for (int i = 0; i < n; i++) {
    float g = gate[i], e = pw__exp(-g), s = 1.0f / (1.0f + e);
    float silu = g / (1.0f + e);
    dgate[i] = pw__acc(acc_gate, dgate[i], dout[i] * up[i] * (s * (1.0f + g * (1.0f - s))));
    dup[i] = pw__acc(acc_up, dup[i], dout[i] * silu);
  }
}

/* GeGLU: gelu(gate) * up with pw_gelu_forward's tanh GELU, operation for
 * operation (PyTorch's gelu(approximate='tanh') times up). The backward
 * recomputes the tanh (nothing saved) and takes PyTorch's order: dgate =
 * (dout * up) * gelu'(gate), dup = dout * gelu(gate). Chunked as the GELU. */
PW_CPU_DISPATCH(pw_geglu_forward, (float *out, const float *gate, const float *up, int n),
                (out, gate, up, n)) {
  float tb[GELU_CHUNK];
  for (int i0 = 0; i0 < n; i0 += GELU_CHUNK) {
    int len = n - i0 < GELU_CHUNK ? n - i0 : GELU_CHUNK;
    const float *xc = gate + i0;
    for (int k = 0; k < len; k++) {
      float x = xc[k];
      tb[k] = pw__tanh(GELU_BETA * (x + GELU_KAPPA * (x * x * x)));
    }
    for (int k = 0; k < len; k++) out[i0 + k] = 0.5f * xc[k] * (1.0f + tb[k]) * up[i0 + k];
  }
}

PW_CPU_DISPATCH(pw_geglu_backward_input, (float *dgate, float *dup, const float *dout, const float *gate,
                                          const float *up, int n, int acc_gate, int acc_up),
                (dgate, dup, dout, gate, up, n, acc_gate, acc_up)) {
  float tb[GELU_CHUNK];
  for (int i0 = 0; i0 < n; i0 += GELU_CHUNK) {
    int len = n - i0 < GELU_CHUNK ? n - i0 : GELU_CHUNK;
    const float *xc = gate + i0;
    for (int k = 0; k < len; k++) {
      float x = xc[k];
      tb[k] = pw__tanh(GELU_BETA * (x + GELU_KAPPA * (x * x * x)));
    }
    for (int k = 0; k < len; k++) {
      float x = xc[k], th = tb[k];
      float left = 0.5f * x;
      float right = 1.0f + th;
      float dleft = 0.5f * right;
      float dtanh = 1.0f - th * th;
      float dinner = GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * (x * x));
      float dg = dout[i0 + k] * up[i0 + k] * (dleft + left * dtanh * dinner);
      float du = dout[i0 + k] * (left * right);
      dgate[i0 + k] = pw__acc(acc_gate, dgate[i0 + k], dg);
      dup[i0 + k] = pw__acc(acc_up, dup[i0 + k], du); /* after dgate's store: they may be one buffer */
    }
  }
}

/* out = inp * s: PyTorch's float32 product by a float32 scalar. */
PW_CPU_DISPATCH(pw_scale_forward, (float *out, const float *inp, float s, int n), (out, inp, s, n)) {
  for (int i = 0; i < n; i++) out[i] = inp[i] * s;
}

PW_CPU_DISPATCH(pw_scale_backward_input, (float *dinp, const float *dout, float s, int n, int acc),
                (dinp, dout, s, n, acc)) {
  for (int i = 0; i < n; i++) dinp[i] = pw__acc(acc, dinp[i], dout[i] * s);
}

PW_CPU_DISPATCH(pw_add_forward, (float *out, const float *a, const float *b, int n),
                (out, a, b, n)) {
  for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* da and db may be the same buffer (x + x): da's store comes first. */
PW_CPU_DISPATCH(pw_add_backward_input, (float *da, float *db, const float *dout, int n, int acc_a,
                                        int acc_b),
                (da, db, dout, n, acc_a, acc_b)) {
  for (int i = 0; i < n; i++) {
    da[i] = pw__acc(acc_a, da[i], dout[i]);
    db[i] = pw__acc(acc_b, db[i], dout[i]);
  }
}

/* ---- losses -------------------------------------------------------------- */

/* The rows of the forward; *total gets sum_n -log softmax(logits)[n, t_n]. */
static PW_CPU_DISPATCH(crossentropy_rows, (double *total, float *probs, const float *logits,
                                           const int32_t *targets, int N, int V),
                       (total, probs, logits, targets, N, V)) {
  double tot = 0.0;
  for (int n = 0; n < N; n++) tot += pw__xent_row(probs + (size_t)n * V, logits + (size_t)n * V, V, targets[n]);
  *total = tot;
}

float pw_crossentropy_forward(float *probs, const float *logits, const int32_t *targets, int N,
                              int V, float scale) {
  double total;
  crossentropy_rows(&total, probs, logits, targets, N, V);
  return (float)(total * scale);
}

PW_CPU_DISPATCH(pw_crossentropy_backward_input, (float *dlogits, const float *probs,
                                                 const int32_t *targets, int N, int V, float scale,
                                                 int acc),
                (dlogits, probs, targets, N, V, scale, acc)) {
  for (int n = 0; n < N; n++) {
    const float *p = probs + (size_t)n * V;
    float *d = dlogits + (size_t)n * V;
    for (int v = 0; v < V; v++) d[v] = pw__acc(acc, d[v], scale * p[v]);
    d[targets[n]] -= scale;
  }
}

float pw_mse_forward(const float *pred, const float *target, int n, float scale) {
  double s = 0.0;
  for (int i = 0; i < n; i++) {
    double d = (double)pred[i] - target[i];
    s += d * d;
  }
  return (float)(s * scale);
}

PW_CPU_DISPATCH(pw_mse_backward_input, (float *dpred, const float *pred, const float *target, int n,
                                        float scale, int acc),
                (dpred, pred, target, n, scale, acc)) {
  float s2 = 2.0f * scale;
  for (int i = 0; i < n; i++) dpred[i] = pw__acc(acc, dpred[i], s2 * (pred[i] - target[i]));
}
