/* gputest: what tests/gpu/test_cuda_*.c share — the random inputs (a
 * splitmix64 stream in [-1, 1); a test seeds rng as it likes) and the
 * fatal-failure exit, which names the test (GPUTEST_NAME, defined before
 * including this). */
#ifndef PW_GPUTEST_H
#define PW_GPUTEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static inline double uniform(void) { /* [-1, 1) */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static inline void die(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, GPUTEST_NAME ": FAILED: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n");
  exit(1);
}

#endif
