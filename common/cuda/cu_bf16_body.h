/* cu_bf16_body: bf16 rounding for the CUDA backend's bf16 programs, in
 * plain C so that gcc compiles the very same bodies for
 * tests/unit/test_cu_emul.c, which checks them bit for bit against
 * bf16.c's conversions.
 *
 * The rule is bf16.c's round_bits: round to nearest, ties to even, on the
 * bit pattern; a NaN keeps its sign and top payload bits and is made
 * quiet; infinities stay; subnormals round like any other number (no
 * flush to zero). Integer arithmetic only, so the GPU gives the CPU's
 * bits (not __float2bfloat16, whose NaN and rounding we do not control).
 *
 * Must never: allocate, or touch memory outside the arguments. */
#ifndef PW_CU_BF16_BODY_H
#define PW_CU_BF16_BODY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hd.h"

/* x's nearest bf16, as its 16 bits (bf16.h's pw_bf16_of). */
static inline PW_HD uint16_t pw_cu_bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)(nan ? (u >> 16) | 0x40u : r);
}

/* x rounded to bf16 and back (bf16.h's pw_bf16_round_f32 of one value). */
static inline PW_HD float pw_cu_bf16_round(float x) {
  uint32_t u = (uint32_t)pw_cu_bf16_bits(x) << 16;
  float y;
  memcpy(&y, &u, sizeof y);
  return y;
}

/* Element i of the in-place round (the backend's round_bf16). */
static inline PW_HD void pw_cu_bf16_round_el(float *x, size_t i) { x[i] = pw_cu_bf16_round(x[i]); }

/* Element i of the conversion into bf16 (pw_bf16_from_f32): dst holds the
 * 16 bits of each (pw_bf16 is a uint16_t). */
static inline PW_HD void pw_cu_bf16_from_el(uint16_t *dst, const float *src, size_t i) {
  dst[i] = pw_cu_bf16_bits(src[i]);
}

#endif
