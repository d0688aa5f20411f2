/* sample: the next token from a row of logits — greedy, or temperature,
 * top-k and top-p sampling from a seeded stream.
 *
 * The exact algorithm is part of the contract (docs/contracts.md,
 * "Generation"), so that another implementation given the same logits and
 * seed draws the same tokens:
 *   temperature 0: the index of the largest logit, the lowest index on ties;
 *                  no draw.
 *   otherwise, in double: z_i = logit_i / temperature; candidates sorted by
 *   z descending, ties by ascending index; top_k > 0 keeps the first
 *   min(top_k, V); w_i = exp(z_i - z_max); top_p < 1 keeps the shortest
 *   prefix whose running sum of w reaches top_p * (sum of w kept), at least
 *   one; u = uniform() (one draw per token), r = u * (sum of w kept); the
 *   token is the first candidate whose running sum of w exceeds r (the last
 *   kept one if rounding leaves none).
 * The stream is pw_rng seeded with hash64(seed, hash_str("generate")). */
#ifndef PW_SAMPLE_H
#define PW_SAMPLE_H

#include <stdint.h>

#include "errors.h"
#include "rng.h"

typedef struct {
  double temperature; /* 0 = greedy; else > 0 */
  int top_k;          /* 0 = all */
  double top_p;       /* (0, 1]; 1 = all */
  uint64_t seed;
} pw_sample_config;

typedef struct {
  pw_sample_config cfg;
  int V;
  pw_rng rng;
  struct pw_sample_cand { double z; int i; } *cand; /* [V] scratch */
} pw_sampler;

/* PW_EINVAL for a bad config (temperature < 0, top_k < 0, top_p not in
 * (0, 1], V < 1), PW_ENOMEM. */
PW_MUST_CHECK int pw_sampler_init(pw_sampler *s, int V, const pw_sample_config *cfg, pw_err *err);
void pw_sampler_free(pw_sampler *s);
/* The sampler made anew for cfg (its stream from cfg->seed), keeping its
 * scratch: a served sequence's sampler, reused by the next request. */
PW_MUST_CHECK int pw_sampler_reset(pw_sampler *s, const pw_sample_config *cfg, pw_err *err);
/* The next token for logits (V); never allocates. */
int pw_sampler_next(pw_sampler *s, const float *logits);
/* The greedy token: the first index of the largest logit. */
int pw_argmax(const float *logits, int V);

#endif
