/* test_crc32c: CRC-32C, every implementation (slicing-by-8, SSE4.2 three
 * streams, AVX-512 VPCLMULQDQ folding, and the dispatcher) against a
 * bit-at-a-time reference and each other: standard check values, every
 * split point of the incremental form, and lengths around each path's
 * block edges at every alignment with random seeds. Implementations the
 * CPU lacks are skipped (the dispatcher is always tested). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"

static uint64_t g_rng = 0x5eed0c4c;

static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Bit-at-a-time reference CRC-32C, independent of every implementation. */
static uint32_t crc_ref(uint32_t crc, const uint8_t *p, size_t n) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  return ~c;
}

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);
typedef struct {
  const char *name;
  crc_fn fn;
  int ok;
} impl;

static int impls(impl *out) {
  out[0] = (impl){"dispatch", pw_crc32c, 1};
  out[1] = (impl){"sw", pw_crc32c_sw, 1};
  out[2] = (impl){"hw", pw_crc32c_hw, pw_crc32c_hw_available()};
  out[3] = (impl){"vec", pw_crc32c_vec, pw_crc32c_vec_available()};
  return 4;
}

static void test_check_values(void **state) {
  impl im[4];
  int n = impls(im);
  uint8_t z[32] = {0}, f[32];
  memset(f, 0xff, sizeof f);
  assert_int_equal(crc_ref(0, (const uint8_t *)"123456789", 9), 0xE3069283u);
  for (int i = 0; i < n; i++) {
    if (!im[i].ok) continue;
    assert_int_equal(im[i].fn(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(im[i].fn(0, "", 0), 0);
    assert_int_equal(im[i].fn(0x12345678u, "", 0), 0x12345678u);
    /* RFC 3720 B.4: 32 bytes of zeros, of 0xff. */
    assert_int_equal(im[i].fn(0, z, 32), 0x8A9136AAu);
    assert_int_equal(im[i].fn(0, f, 32), 0x62A8AB43u);
  }
}

/* Every split point of a buffer long enough for every path's blocks gives
 * the whole-buffer value, for each implementation. */
static void test_incremental(void **state) {
  impl im[4];
  int n = impls(im);
  static uint8_t b[1600];
  for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)rnd();
  uint32_t whole = crc_ref(0, b, sizeof b);
  for (int i = 0; i < n; i++) {
    if (!im[i].ok) continue;
    assert_int_equal(im[i].fn(0, b, sizeof b), whole);
    for (size_t k = 0; k <= sizeof b; k++)
      if (im[i].fn(im[i].fn(0, b, k), b + k, sizeof b - k) != whole)
        fail_msg("%s: split at %zu of %zu gives a different CRC", im[i].name, k, sizeof b);
  }
}

/* Lengths around the block edges (SSE4.2: 3*256, 3*8192; VPCLMULQDQ: 64,
 * 256, 512, the switch at 256 and its 12032-byte hybrid blocks) and random
 * ones, at offsets 0..8 and 63
 * (every alignment), seeds 0 and random: all equal slicing-by-8, which is
 * itself checked against the reference on a subset. */
static void test_paths_agree(void **state) {
  impl im[4];
  int ni = impls(im);
  size_t cap = 3 * 8192 * 3 + 4096;
  uint8_t *b = malloc(cap + 64);
  for (size_t i = 0; i < cap + 64; i++) b[i] = (uint8_t)rnd();
  const size_t lens[] = {0,     1,     7,     8,     9,     63,    64,    65,    127,   128,
                         191,   192,   255,   256,   257,   319,   320,   383,   447,   511,
                         512,   513,   767,   768,   769,   1023,  1024,  1087,  1536,  2303,
                         4095,  4096,  4159,  12031, 12032, 12033, 12096, 12287, 12288, 12351,
                         24064, 24575, 24576, 24577, 49152, 49153, 73728, cap};
  const size_t offs[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 63};
  size_t nl = sizeof lens / sizeof *lens, checked = 0;
  for (size_t li = 0; li < nl + 150; li++) {
    size_t n = li < nl ? lens[li] : (size_t)(rnd() % cap);
    for (size_t oi = 0; oi < sizeof offs / sizeof *offs; oi++) {
      size_t off = offs[oi];
      uint32_t seed = oi & 1 ? (uint32_t)rnd() : 0;
      uint32_t s = pw_crc32c_sw(seed, b + off, n);
      if (li < nl && n <= 12288) {
        assert_int_equal(s, crc_ref(seed, b + off, n));
        checked++;
      }
      for (int i = 0; i < ni; i++)
        if (im[i].ok && im[i].fn(seed, b + off, n) != s)
          fail_msg("%s: length %zu at offset %zu seed 0x%08x: 0x%08x, want 0x%08x", im[i].name, n,
                   off, seed, im[i].fn(seed, b + off, n), s);
    }
  }
  assert_true(checked > 300);
  free(b);
}

/* A single flipped bit anywhere in a buffer of two hybrid blocks and a
 * folded tail changes every path's CRC to the right value (a fold or join
 * that dropped a lane or a stream would miss flips there). Reference:
 * slicing-by-8, itself checked against the bit-at-a-time CRC above. */
static void test_bit_flips(void **state) {
  impl im[4];
  int ni = impls(im);
  size_t n = 2 * 12032 + 4096 + 200;
  uint8_t *b = malloc(n);
  for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rnd();
  uint32_t base = pw_crc32c_sw(0, b, n);
  for (size_t at = 0; at < n; at += 53) {
    b[at] ^= (uint8_t)(1u << (at % 8));
    uint32_t want = pw_crc32c_sw(0, b, n);
    assert_int_not_equal(want, base);
    for (int i = 0; i < ni; i++)
      if (im[i].ok && im[i].fn(0, b, n) != want)
        fail_msg("%s: flip at byte %zu: 0x%08x, want 0x%08x", im[i].name, at, im[i].fn(0, b, n), want);
    b[at] ^= (uint8_t)(1u << (at % 8));
  }
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_check_values),
      cmocka_unit_test(test_incremental),
      cmocka_unit_test(test_paths_agree),
      cmocka_unit_test(test_bit_flips),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
