/* sample: the sampler of sample.h, step by step as its header states it
 * (and docs/contracts.md), with no shortcut that could change a draw. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>

int pw_argmax(const float *logits, int V) {
  int best = 0;
  for (int i = 1; i < V; i++)
    if (logits[i] > logits[best]) best = i;
  return best;
}

int pw_sampler_reset(pw_sampler *s, const pw_sample_config *cfg, pw_err *err) {
  if (!(cfg->temperature >= 0) || cfg->top_k < 0 || !(cfg->top_p > 0 && cfg->top_p <= 1))
    return pw_err_set(err, PW_EINVAL, "sample",
                      "temperature must be >= 0, top_k >= 0 and top_p in (0, 1] (got %g, %d, %g)",
                      cfg->temperature, cfg->top_k, cfg->top_p);
  s->cfg = *cfg;
  pw_rng_seed(&s->rng, pw_hash64(cfg->seed, pw_hash_str("generate")));
  return 0;
}

int pw_sampler_init(pw_sampler *s, int V, const pw_sample_config *cfg, pw_err *err) {
  s->cand = NULL;
  if (V < 1) return pw_err_set(err, PW_EINVAL, "sample", "V must be >= 1 (got %d)", V);
  int rc = pw_sampler_reset(s, cfg, err);
  if (rc) return rc;
  s->V = V;
  if (!(s->cand = malloc(sizeof *s->cand * (size_t)V))) return pw_err_set(err, PW_ENOMEM, "sample", "out of memory");
  return 0;
}

void pw_sampler_free(pw_sampler *s) {
  free(s->cand);
  s->cand = NULL;
}

/* z descending, then index ascending: a total order, so any sort gives it. */
static int by_z(const void *a, const void *b) {
  const struct pw_sample_cand *x = a, *y = b;
  if (x->z != y->z) return x->z > y->z ? -1 : 1;
  return (x->i > y->i) - (x->i < y->i);
}

int pw_sampler_next(pw_sampler *s, const float *logits) {
  if (s->cfg.temperature == 0) return pw_argmax(logits, s->V);
  int V = s->V;
  struct pw_sample_cand *c = s->cand;
  for (int i = 0; i < V; i++) c[i] = (struct pw_sample_cand){(double)logits[i] / s->cfg.temperature, i};
  qsort(c, (size_t)V, sizeof *c, by_z);
  int n = s->cfg.top_k > 0 && s->cfg.top_k < V ? s->cfg.top_k : V;
  double zmax = c[0].z, total = 0;
  for (int k = 0; k < n; k++) total += c[k].z = exp(c[k].z - zmax); /* z now holds the weight */
  if (s->cfg.top_p < 1) {
    double run = 0, want = s->cfg.top_p * total;
    int k = 0;
    do run += c[k++].z; while (k < n && run < want); /* the shortest prefix reaching want */
    n = k;
    total = run;
  }
  double r = pw_rng_uniform(&s->rng) * total, run = 0;
  for (int k = 0; k < n; k++)
    if ((run += c[k].z) > r) return c[k].i;
  return c[n - 1].i;
}
