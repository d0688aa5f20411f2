/* rng: deterministic hashing and random streams, the same on every machine.
 *
 * Everything random in pipewright (batches, synthetic tasks, parameter
 * initialisation) is a pure function of 64-bit keys, so any process can
 * recompute any draw without talking to another. Two tools:
 *
 *  - pw_hash64(a, b) combines two keys into one; chain it for more keys:
 *    pw_hash64(pw_hash64(seed, step), i). pw_hash_str(s) turns a name into a
 *    key ("teacher", "blocks.3.attn.qkv.weight").
 *  - pw_rng is a stream (xoshiro256**) started from one key.
 *
 * Exact definitions, so the draws can be reproduced outside pipewright
 * (all arithmetic mod 2^64):
 *   mix(z)     = splitmix64 finaliser: z ^= z >> 30; z *= 0xbf58476d1ce4e5b9;
 *                z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31
 *   hash64(a, b) = mix(mix(a + 0x9e3779b97f4a7c15) + b)
 *                  (for fixed a, distinct b give distinct hashes)
 *   hash_str(s)  = mix(FNV-1a 64 of the bytes of s)
 *   seed(k):     x = k; four times: x += 0x9e3779b97f4a7c15; s[j] = mix(x)
 *   u64():       xoshiro256** (Blackman & Vigna 2018)
 *   uniform():   (u64() >> 11) * 2^-53, in [0, 1)
 *   normal():    u1 = 1 - uniform(), u2 = uniform();
 *                sqrt(-2 ln u1) * cos(2 pi u2)   (one u64 pair per normal,
 *                the sine half is not kept, so the stream has no hidden state)
 *   below(n):    u64() % n (bias below n / 2^64; n > 0)
 *
 * Header-only: static inline functions, no state outside the pw_rng struct.
 * Never use it for anything secret. */
#ifndef PW_RNG_H
#define PW_RNG_H

#include <math.h>
#include <stdint.h>

#define PW_RNG_GOLDEN 0x9e3779b97f4a7c15ULL

static inline uint64_t pw_mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ULL;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return z;
}

/* Combine two keys. Not symmetric: hash64(a, b) != hash64(b, a). */
static inline uint64_t pw_hash64(uint64_t a, uint64_t b) {
  return pw_mix64(pw_mix64(a + PW_RNG_GOLDEN) + b);
}

/* A key for a name: FNV-1a over the bytes, then mixed. */
static inline uint64_t pw_hash_str(const char *s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ULL;
  }
  return pw_mix64(h);
}

typedef struct {
  uint64_t s[4]; /* xoshiro256** state; never all zero (splitmix seeding) */
} pw_rng;

static inline void pw_rng_seed(pw_rng *r, uint64_t key) {
  uint64_t x = key;
  for (int j = 0; j < 4; j++) {
    x += PW_RNG_GOLDEN;
    r->s[j] = pw_mix64(x);
  }
}

static inline uint64_t pw__rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t pw_rng_u64(pw_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = pw__rotl64(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = pw__rotl64(s[3], 45);
  return result;
}

/* Uniform double in [0, 1) with 53 random bits. */
static inline double pw_rng_uniform(pw_rng *r) {
  return (double)(pw_rng_u64(r) >> 11) * 0x1.0p-53;
}

/* Standard normal (Box-Muller, cosine half only). */
static inline double pw_rng_normal(pw_rng *r) {
  double u1 = 1.0 - pw_rng_uniform(r); /* (0, 1]: log is finite */
  double u2 = pw_rng_uniform(r);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/* Integer in [0, n), n > 0. */
static inline uint64_t pw_rng_below(pw_rng *r, uint64_t n) { return pw_rng_u64(r) % n; }

#endif
