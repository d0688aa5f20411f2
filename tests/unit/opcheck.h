/* opcheck: the harness the ops tests share (test_ops.c, test_ops_attn.c).
 *
 * An op under test is an `opcase`: its inputs, a float runner for the
 * kernels (forward, backward_input, backward_weight) and an independent
 * double-precision reference forward. check_op() then verifies
 *   - the forward against the reference (outputs pre-filled with NaN, so a
 *     forward that leaves anything unwritten fails),
 *   - backward_input and backward_weight, each called alone, against
 *     central finite differences of L = sum(out * R) computed on the double
 *     reference (so FD noise is ~1e-10), and that each half leaves the other
 *     half's gradients untouched,
 *   - accumulation: with gradients pre-filled, two backward calls add twice.
 * Every failure names the op, the tensor, the element, expected and got.
 * Functions are static inline so a file may leave some unused. */
#ifndef PW_OPCHECK_H
#define PW_OPCHECK_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

enum { IN_DATA, IN_PARAM, IN_CONST };
#define OC_MAXIN 6

/* Tolerances: forward vs the double reference; gradients vs FD. A gradient
 * element passes if |got - fd| <= GRAD_RTOL*|fd| + GRAD_ATOL*max|fd|. */
#define FWD_RTOL 1e-5
#define FWD_ATOL 1e-5
#define GRAD_RTOL 1e-3
#define GRAD_ATOL 1e-4
#define FD_STEP 1e-5

typedef struct opcase opcase;
struct opcase {
  char name[96];
  int n_in;
  const char *in_name[OC_MAXIN];
  int in_kind[OC_MAXIN];
  size_t in_n[OC_MAXIN];
  size_t out_n, saved_n;
  int d[8];           /* op-specific shapes */
  const int32_t *tok; /* tokens or targets, if the op has them */
  float fp;           /* eps, rope base or loss scale */
  double init_scale;  /* inputs uniform in [-s, s] (+ init_shift); 0 means 1 */
  double init_shift;
  double init_gap;    /* keep |x| >= gap (kinks, e.g. relu at 0) */
  void (*fwd)(const opcase *c, float *const *in, float *out, float *saved);
  /* which == IN_DATA runs backward_input, IN_PARAM backward_weight. */
  void (*bwd)(const opcase *c, int which, float *const *in, float *saved, const float *dout,
              float *const *grad);
  void (*ref)(const opcase *c, double *const *in, double *out);
};

typedef struct {
  int fwd_fail, grad_fail, other_fail;
  double fwd_err, grad_err, grad_ratio; /* worst seen: abs error, error / tolerance */
} opresult;

/* ---- helpers ------------------------------------------------------------ */

static uint64_t oc_rng = 0x9e3779b97f4a7c15ull;
static inline void oc_seed(uint64_t s) { oc_rng = s * 0x9e3779b97f4a7c15ull + 1; }
static inline double oc_uniform(void) { /* [-1, 1) */
  uint64_t z = (oc_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static inline void oc_fill(float *x, size_t n, double scale) {
  for (size_t i = 0; i < n; i++) x[i] = (float)(scale * oc_uniform());
}
static inline void *oc_alloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz);
  assert_non_null(p);
  return p;
}
static inline double oc_maxabs(const double *x, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
  return m;
}

/* Compares got (float) to exp (double): |got - exp| <= rtol*|exp| +
 * atol*max|exp| + 1e-9. Prints the first few failures and returns how many
 * elements failed. Updates the worst absolute error and error/tolerance. */
static inline int oc_compare(const char *op, const char *what, const float *got, const double *exp,
                             size_t n, double rtol, double atol, double *worst_err,
                             double *worst_ratio) {
  double m = oc_maxabs(exp, n);
  int fails = 0;
  for (size_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - exp[i]);
    double tol = rtol * fabs(exp[i]) + atol * m + 1e-9;
    if (!(err <= tol)) { /* also catches NaN */
      if (fails < 5)
        printf("FAIL %s: %s[%zu]: expected %.9g got %.9g (|err| %.3g > tol %.3g)\n", op, what, i,
               exp[i], (double)got[i], err, tol);
      fails++;
    }
    if (worst_err && err > *worst_err) *worst_err = err;
    if (worst_ratio && err / tol > *worst_ratio) *worst_ratio = err / tol;
  }
  if (fails > 5) printf("FAIL %s: %s: %d elements in all\n", op, what, fails);
  return fails;
}

static inline double oc_objective(const opcase *c, double *const *din, const double *R,
                                  double *out) {
  c->ref(c, din, out);
  double L = 0;
  for (size_t i = 0; i < c->out_n; i++) L += out[i] * R[i];
  return L;
}

/* Central differences of L = sum(ref(in) * R) with respect to input k. */
static inline void oc_fd_grad(const opcase *c, double *const *din, const double *R, int k,
                              double *g) {
  double *o = oc_alloc(c->out_n, sizeof(double));
  for (size_t i = 0; i < c->in_n[k]; i++) {
    double save = din[k][i];
    din[k][i] = save + FD_STEP;
    double lp = oc_objective(c, din, R, o);
    din[k][i] = save - FD_STEP;
    double lm = oc_objective(c, din, R, o);
    din[k][i] = save;
    g[i] = (lp - lm) / (2 * FD_STEP);
  }
  free(o);
}

/* ---- the driver ----------------------------------------------------------- */

/* fwd_scale / grad_scale (normally 1) distort the kernel's results before
 * comparison: the meta-tests use them to prove the tolerances bite. */
static inline opresult check_op_scaled(const opcase *c, double fwd_scale, double grad_scale) {
  opresult r = {0};
  float *fin[OC_MAXIN] = {0}, *g[OC_MAXIN] = {0}, *gkeep[OC_MAXIN] = {0};
  double *din[OC_MAXIN] = {0}, *fd[OC_MAXIN] = {0};
  oc_seed((uint64_t)strlen(c->name) * 1000003u + (uint64_t)c->d[0] * 7919u + (uint64_t)c->d[1]);
  double s = c->init_scale > 0 ? c->init_scale : 1.0;
  for (int k = 0; k < c->n_in; k++) {
    size_t n = c->in_n[k];
    fin[k] = oc_alloc(n, sizeof(float));
    din[k] = oc_alloc(n, sizeof(double));
    g[k] = oc_alloc(n, sizeof(float));
    gkeep[k] = oc_alloc(n, sizeof(float));
    fd[k] = oc_alloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) {
      double x = s * oc_uniform();
      if (c->init_gap > 0 && fabs(x) < c->init_gap) x = x < 0 ? -c->init_gap : c->init_gap;
      fin[k][i] = (float)(x + (c->in_kind[k] == IN_DATA ? c->init_shift : 0.0));
      din[k][i] = fin[k][i];
    }
  }
  float *out = oc_alloc(c->out_n, sizeof(float));
  float *saved = oc_alloc(c->saved_n, sizeof(float));
  double *ref = oc_alloc(c->out_n, sizeof(double));
  float *dout = oc_alloc(c->out_n, sizeof(float));
  double *R = oc_alloc(c->out_n, sizeof(double));
  char what[64];

  /* forward */
  for (size_t i = 0; i < c->out_n; i++) out[i] = NAN;
  for (size_t i = 0; i < c->saved_n; i++) saved[i] = NAN;
  c->fwd(c, fin, out, saved);
  c->ref(c, din, ref);
  for (size_t i = 0; i < c->out_n; i++) out[i] = (float)(out[i] * fwd_scale);
  r.fwd_fail = oc_compare(c->name, "out", out, ref, c->out_n, FWD_RTOL, FWD_ATOL, &r.fwd_err,
                          NULL);

  /* backward, each half alone, into zeroed gradients */
  oc_fill(dout, c->out_n, 1.0);
  for (size_t i = 0; i < c->out_n; i++) R[i] = dout[i];
  for (int k = 0; k < c->n_in; k++)
    if (c->in_kind[k] != IN_CONST) oc_fd_grad(c, din, R, k, fd[k]);
  for (int half = IN_DATA; half <= IN_PARAM; half++) {
    for (int k = 0; k < c->n_in; k++) memcpy(gkeep[k], g[k], c->in_n[k] * sizeof(float));
    c->bwd(c, half, fin, saved, dout, g);
    for (int k = 0; k < c->n_in; k++) {
      if (c->in_kind[k] == half) {
        for (size_t i = 0; i < c->in_n[k]; i++) g[k][i] = (float)(g[k][i] * grad_scale);
        snprintf(what, sizeof what, "d%s", c->in_name[k]);
        r.grad_fail += oc_compare(c->name, what, g[k], fd[k], c->in_n[k], GRAD_RTOL, GRAD_ATOL,
                                  &r.grad_err, &r.grad_ratio);
        for (size_t i = 0; i < c->in_n[k]; i++) g[k][i] = (float)(g[k][i] / grad_scale);
      } else if (memcmp(gkeep[k], g[k], c->in_n[k] * sizeof(float)) != 0) {
        printf("FAIL %s: backward half %d wrote d%s, which is not its output\n", c->name, half,
               c->in_name[k]);
        r.other_fail++;
      }
    }
  }

  /* accumulation: pre-filled gradients, two backward calls add twice */
  float *acc[OC_MAXIN] = {0};
  double *expect = NULL;
  for (int k = 0; k < c->n_in; k++) {
    acc[k] = oc_alloc(c->in_n[k], sizeof(float));
    oc_fill(acc[k], c->in_n[k], 1.0);
    memcpy(gkeep[k], acc[k], c->in_n[k] * sizeof(float));
  }
  for (int rep = 0; rep < 2; rep++)
    for (int half = IN_DATA; half <= IN_PARAM; half++) c->bwd(c, half, fin, saved, dout, acc);
  for (int k = 0; k < c->n_in; k++) {
    if (c->in_kind[k] == IN_CONST) continue;
    expect = oc_alloc(c->in_n[k], sizeof(double));
    for (size_t i = 0; i < c->in_n[k]; i++) expect[i] = (double)gkeep[k][i] + 2.0 * g[k][i];
    snprintf(what, sizeof what, "d%s accumulated twice onto a pre-filled buffer", c->in_name[k]);
    r.other_fail +=
        oc_compare(c->name, what, acc[k], expect, c->in_n[k], 1e-5, 1e-5, NULL, NULL);
    free(expect);
  }

  printf("  %-44s fwd max|err| %.2e   grad max|err| %.2e (%.3f of tol)\n", c->name, r.fwd_err,
         r.grad_err, r.grad_ratio);
  for (int k = 0; k < c->n_in; k++) {
    free(fin[k]); free(din[k]); free(g[k]); free(gkeep[k]); free(fd[k]); free(acc[k]);
  }
  free(out); free(saved); free(ref); free(dout); free(R);
  return r;
}

static inline void check_op(const opcase *c) {
  opresult r = check_op_scaled(c, 1.0, 1.0);
  assert_int_equal(r.fwd_fail, 0);
  assert_int_equal(r.grad_fail, 0);
  assert_int_equal(r.other_fail, 0);
}

#endif
