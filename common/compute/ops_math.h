/* ops_math: the scalar math of the kernels (exp, tanh, max and sums over a
 * row), written so the loops around it vectorize; internal to ops*.c.
 *
 * Why not libm: glibc's expf/tanhf are calls the compiler cannot vectorize,
 * and a tanh-GELU spent 40 % of a GPT training step in them. Here exp and
 * tanh are straight-line arithmetic without branches or calls (Cody-Waite
 * range reduction, a degree-11 polynomial, the exponent put in with integer
 * arithmetic), computed in double and rounded to float once. The relative
 * error before rounding is about 1e-14, so the float result is the
 * correctly rounded one (test_ops_math checks it against long-double libm;
 * a sweep of 44 million floats found no exception, where glibc's tanhf is
 * off by an ulp on 3 % of them). PyTorch's own vectorized exp/tanh are
 * 1-ulp functions, so the kernels stay what PyTorch's float formulas give,
 * operation by operation. Cost: about 1.0 ns per GELU element vectorized
 * (Release -O3, the AVX-512 variant of a PW_CPU_DISPATCH kernel) against
 * 18 ns for tanhf; -O2 builds do not vectorize these loops and take about
 * 13 ns, and the baseline (x86-64-v2) variant has no FMA instruction: each
 * fma() is a library call there. (Written with fma(), exp and
 * tanh return the same bits as with separate multiplies and adds for every
 * one of the 2^32 floats: checked exhaustively when fma() went in.)
 *
 * Reductions: a float sum or max over a row cannot be vectorized as written
 * (reassociation changes the result), so the helpers below keep PW_LANES
 * independent partial results, which the compiler maps onto vector
 * registers, and combine them in a fixed order: deterministic, and
 * independent of the build flags.
 *
 * Must never allocate, branch on data in the elementwise helpers, or call
 * a libm function that is not expanded inline (copysign and isless /
 * isgreater are; fma is one instruction where the target has FMA, as the
 * AVX2 and AVX-512 variants do, and an exact library call elsewhere: same
 * bits). */
#ifndef PW_OPS_MATH_H
#define PW_OPS_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define PW_LANES 16

/* e^y = 2^k (1 + p) for y in [-700, 700]: returns p = e^r - 1 and sets
 * *scale = 2^k. Outside that range the result is garbage: callers clamp. */
static inline double pw__exp_core(double y, double *scale) {
  const double log2e = 1.4426950408889634, ln2_hi = 6.93147180369123816490e-01,
               ln2_lo = 1.90821492927058770002e-10;
  const double shift = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer */
  /* fma(): one rounding instead of two, and half the instructions where
   * the target has FMA (the AVX2 and AVX-512 variants); the same bits
   * either way. */
  double kd = fma(y, log2e, shift);
  int64_t kb;
  memcpy(&kb, &kd, sizeof kb); /* low bits: k, offset by shift's bit pattern */
  kd -= shift;
  double r = fma(kd, -ln2_lo, fma(kd, -ln2_hi, y)); /* |r| <= ln2/2 */
  /* e^r - 1 = r + r^2/2! + ... + r^11/11!, error < 2e-14 relative;
   * evaluated by Estrin's scheme (pairs, then powers of r^2) rather than
   * Horner's: a dependency chain of 5 steps instead of 11. */
  double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
  double q01 = fma(r, 0.5, 1.0);                                       /* 1/1!, 1/2! */
  double q23 = fma(r, 4.1666666666666664e-02, 1.6666666666666666e-01); /* 1/3!, 1/4! */
  double q45 = fma(r, 1.388888888888889e-03, 8.333333333333333e-03);   /* 1/5!, 1/6! */
  double q67 = fma(r, 2.48015873015873e-05, 1.984126984126984e-04);    /* 1/7!, 1/8! */
  double q89 = fma(r, 2.755731922398589e-07, 2.7557319223985893e-06);  /* 1/9!, 1/10! */
  double q10 = 2.505210838544172e-08;                                   /* 1/11! */
  double p = r * fma(r8, fma(r2, q10, q89), fma(r4, fma(r2, q67, q45), fma(r2, q23, q01)));
  uint64_t sb = ((uint64_t)kb - 0x4338000000000000ULL + 1023) << 52; /* 2^k (unsigned: NaN is no UB) */
  memcpy(scale, &sb, sizeof *scale);
  return p;
}

/* y clamped to [-110, 100]: e^-110 is 0 and e^100 infinite once rounded to
 * float; NaN stays NaN. The clamp must stay a select for loops to
 * vectorize. Quiet comparisons (isless, isgreater): GCC if-converts those
 * under -ftrapping-math, not a plain < or >. The "+ copysign(0, y)" (which
 * adds a zero) keeps the clamped value from being a compile-time constant:
 * otherwise GCC folds the whole exp for it and threads the branch, which it
 * then cannot vectorize. */
static inline double pw__exp_clamp(double y) {
  y = isless(y, -110.0) ? -110.0 + copysign(0.0, y) : y;
  return isgreater(y, 100.0) ? 100.0 + copysign(0.0, y) : y;
}

/* e^y - 1 for y in [-700, 0], to ~1e-14 relative. */
static inline double pw__expm1_neg(double y) {
  double s, p = pw__exp_core(y, &s);
  return fma(s, p, s - 1.0);
}

/* e^x in float (inf above ~88.7, 0 below ~-103.9). */
static inline float pw__exp(float x) {
  double s, p = pw__exp_core(pw__exp_clamp((double)x), &s);
  return (float)fma(s, p, s);
}

/* e^x in float arithmetic, within 1 ulp (correctly rounded for 99 % of the
 * floats in [-87, 88]: every one checked against long-double libm when it
 * went in; test_ops_math samples it), for the tiled attention's
 * probabilities (ops_flash.c), where pw__exp's double polynomial was a
 * seventh of the backward: 8 float lanes where pw__exp has 4 double ones.
 * x is clamped to [-87, 88] (e^-87 ~ 1.6e-38 stands for anything below; the
 * kernels zero what is masked). Cody-Waite reduction with ln 2 in two
 * parts and Cephes' expf polynomial; fma() where it says so, so every CPU
 * level computes the same bits. */
static inline float pw__expf(float x) {
  x = isless(x, -87.0f) ? -87.0f + copysignf(0.0f, x) : x; /* see pw__exp_clamp */
  x = isgreater(x, 88.0f) ? 88.0f + copysignf(0.0f, x) : x;
  const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  float kf = fmaf(x, 1.44269504088896341f, shift);
  int32_t kb;
  memcpy(&kb, &kf, sizeof kb); /* low bits: k, offset by shift's bit pattern */
  kf -= shift;
  float r = fmaf(kf, 2.12194440e-4f, fmaf(kf, -0.693359375f, x)); /* |r| <= ln2/2 */
  float p = fmaf(fmaf(fmaf(fmaf(fmaf(1.9875691500e-4f, r, 1.3981999507e-3f), r, 8.3334519073e-3f), r,
                           4.1665795894e-2f),
                      r, 1.6666665459e-1f),
                 r, 5.0000001201e-1f);
  p = fmaf(p, r * r, r);                                          /* e^r - 1 */
  uint32_t sb = ((uint32_t)kb - 0x4B400000u + 127u) << 23;        /* 2^k */
  float s;
  memcpy(&s, &sb, sizeof s);
  return fmaf(s, p, s);
}

/* tanh(x) in float, correctly rounded but for ~1e-6 of inputs (1 ulp). */
static inline float pw__tanh(float x) {
  double a = (double)x;
  a = a < 0 ? -a : a;
  a = isgreater(a, 20.0) ? 20.0 : a; /* tanh(20) is 1 in float */
  double e = pw__expm1_neg(-2.0 * a); /* e^(-2a) - 1, in (-1, 0] */
  double t = (0.0 - e) / (2.0 + e); /* (1 - e^-2a) / (1 + e^-2a); +0 at 0 */
  return (float)copysign(t, (double)x);
}

/* What a backward_input kernel stores into a gradient element: old + g
 * when accumulating, else 0 + g (not g: the add turns -0 into +0, bit for
 * bit what a zeroed buffer gave). acc is loop-invariant, so -O3 unswitches
 * the loop and the overwriting version never loads old. */
static inline float pw__acc(int acc, float old, float g) { return (acc ? old : 0.0f) + g; }

/* Max of x[0..n) (n >= 1), NaN-free inputs assumed. */
static inline float pw__max(const float *x, int n) {
  float m[PW_LANES];
  int j = 0;
  for (int l = 0; l < PW_LANES; l++) m[l] = x[0];
  for (; j + PW_LANES <= n; j += PW_LANES)
    for (int l = 0; l < PW_LANES; l++) m[l] = isgreater(x[j + l], m[l]) ? x[j + l] : m[l];
  float r = m[0];
  for (int l = 1; l < PW_LANES; l++) r = isgreater(m[l], r) ? m[l] : r;
  for (; j < n; j++) r = isgreater(x[j], r) ? x[j] : r;
  return r;
}

/* Sum of x[0..n) in float lanes. */
static inline float pw__sum(const float *x, int n) {
  float s[PW_LANES] = {0};
  int j = 0;
  for (; j + PW_LANES <= n; j += PW_LANES)
    for (int l = 0; l < PW_LANES; l++) s[l] += x[j + l];
  float r = 0;
  for (int l = 0; l < PW_LANES; l++) r += s[l];
  for (; j < n; j++) r += x[j];
  return r;
}

/* One row of the cross-entropy's forward (ops.c's, ops_enc.c's masked
 * one): p[0..V) = softmax(x), and -log p[t] = log(sum) - (x_t - max) in
 * double (no log(0) for a tiny p). */
static inline double pw__xent_row(float *p, const float *x, int V, int32_t t);

/* Sum of x[0..n) in double lanes. */
static inline double pw__sum_d(const float *x, int n) {
  double s[PW_LANES] = {0};
  int j = 0;
  for (; j + PW_LANES <= n; j += PW_LANES)
    for (int l = 0; l < PW_LANES; l++) s[l] += (double)x[j + l];
  double r = 0;
  for (int l = 0; l < PW_LANES; l++) r += s[l];
  for (; j < n; j++) r += (double)x[j];
  return r;
}

/* Dot product of x and y over n, products and sums in double lanes. */
static inline double pw__dot_d(const float *x, const float *y, int n) {
  double s[PW_LANES] = {0};
  int j = 0;
  for (; j + PW_LANES <= n; j += PW_LANES)
    for (int l = 0; l < PW_LANES; l++) s[l] += (double)x[j + l] * y[j + l];
  double r = 0;
  for (int l = 0; l < PW_LANES; l++) r += s[l];
  for (; j < n; j++) r += (double)x[j] * y[j];
  return r;
}

/* Sum of (x - m)^2 over n, in double lanes. */
static inline double pw__sqdev_d(const float *x, double m, int n) {
  double s[PW_LANES] = {0};
  int j = 0;
  for (; j + PW_LANES <= n; j += PW_LANES)
    for (int l = 0; l < PW_LANES; l++) {
      double d = x[j + l] - m;
      s[l] += d * d;
    }
  double r = 0;
  for (int l = 0; l < PW_LANES; l++) r += s[l];
  for (; j < n; j++) {
    double d = x[j] - m;
    r += d * d;
  }
  return r;
}

/* Dot product of x and y over n in float lanes. */
static inline float pw__dot(const float *x, const float *y, int n) {
  float s[PW_LANES] = {0};
  int j = 0;
  for (; j + PW_LANES <= n; j += PW_LANES)
    for (int l = 0; l < PW_LANES; l++) s[l] += x[j + l] * y[j + l];
  float r = 0;
  for (int l = 0; l < PW_LANES; l++) r += s[l];
  for (; j < n; j++) r += x[j] * y[j];
  return r;
}

static inline double pw__xent_row(float *p, const float *x, int V, int32_t t) {
  float mx = pw__max(x, V);
  for (int v = 0; v < V; v++) p[v] = pw__exp(x[v] - mx);
  double sum = pw__sum_d(p, V);
  float inv = (float)(1.0 / sum);
  for (int v = 0; v < V; v++) p[v] *= inv;
  return log(sum) - ((double)x[t] - mx);
}

#endif
