/* crc32c: CRC-32C in software (slicing-by-8) and with SSE4.2.
 *
 * The hardware path runs three independent crc32 streams over adjacent
 * blocks (the instruction has a latency of 3 cycles but a throughput of 1),
 * then joins them by "shifting" the earlier CRCs over the later blocks'
 * lengths with precomputed zero-extension tables (Mark Adler's method).
 * Tables are built once, under pthread_once. */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define PW__CRC_X86 1
#endif

#define POLY 0x82f63b78u /* reflected Castagnoli polynomial */
#define LONG_BLK 8192
#define SHORT_BLK 256

static uint32_t sw_table[8][256];
static uint32_t zeros_long[4][256];  /* appends LONG_BLK zero bytes */
static uint32_t zeros_short[4][256]; /* appends SHORT_BLK zero bytes */
static int hw_ok;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* ---- GF(2) helpers for the zero-extension operators ---------------------- */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
  uint32_t sum = 0;
  while (vec) {
    if (vec & 1) sum ^= *mat;
    vec >>= 1;
    mat++;
  }
  return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat) {
  for (int n = 0; n < 32; n++) sq[n] = gf2_times(mat, mat[n]);
}

/* The operator that appends len zero bytes (len a power of two) to a raw CRC
 * register. */
static void zeros_op(uint32_t *even, size_t len) {
  uint32_t odd[32];
  uint32_t row = 1;
  odd[0] = POLY; /* one zero bit */
  for (int n = 1; n < 32; n++) {
    odd[n] = row;
    row <<= 1;
  }
  gf2_square(even, odd); /* two bits */
  gf2_square(odd, even); /* four bits */
  do {
    gf2_square(even, odd); /* doubles: first pass gives one byte */
    len >>= 1;
    if (len == 0) return;
    gf2_square(odd, even);
    len >>= 1;
  } while (len);
  memcpy(even, odd, sizeof odd);
}

static void zeros_tables(uint32_t z[4][256], size_t len) {
  uint32_t op[32];
  zeros_op(op, len);
  for (uint32_t n = 0; n < 256; n++) {
    z[0][n] = gf2_times(op, n);
    z[1][n] = gf2_times(op, n << 8);
    z[2][n] = gf2_times(op, n << 16);
    z[3][n] = gf2_times(op, n << 24);
  }
}

static inline uint32_t shift(uint32_t z[4][256], uint32_t crc) {
  return z[0][crc & 0xff] ^ z[1][(crc >> 8) & 0xff] ^ z[2][(crc >> 16) & 0xff] ^ z[3][crc >> 24];
}

static void init_once(void) {
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
    sw_table[0][n] = c;
  }
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = sw_table[0][n];
    for (int k = 1; k < 8; k++) {
      c = sw_table[0][c & 0xff] ^ (c >> 8);
      sw_table[k][n] = c;
    }
  }
  zeros_tables(zeros_long, LONG_BLK);
  zeros_tables(zeros_short, SHORT_BLK);
#ifdef PW__CRC_X86
  __builtin_cpu_init();
  hw_ok = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
}

int pw_crc32c_hw_available(void) {
  pthread_once(&once, init_once);
  return hw_ok;
}

/* ---- software: slicing-by-8 ---------------------------------------------- */

static inline uint64_t load64le(const unsigned char *p) {
  return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
         (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

uint32_t pw_crc32c_sw(uint32_t crc, const void *buf, size_t n) {
  pthread_once(&once, init_once);
  const unsigned char *p = buf;
  uint64_t c = crc ^ 0xffffffffu;
  while (n && ((uintptr_t)p & 7)) {
    c = sw_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    n--;
  }
  while (n >= 8) {
    c ^= load64le(p);
    c = sw_table[7][c & 0xff] ^ sw_table[6][(c >> 8) & 0xff] ^ sw_table[5][(c >> 16) & 0xff] ^
        sw_table[4][(c >> 24) & 0xff] ^ sw_table[3][(c >> 32) & 0xff] ^
        sw_table[2][(c >> 40) & 0xff] ^ sw_table[1][(c >> 48) & 0xff] ^ sw_table[0][c >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = sw_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return (uint32_t)c ^ 0xffffffffu;
}

/* ---- hardware: SSE4.2, three streams ------------------------------------- */

#ifdef PW__CRC_X86
__attribute__((target("sse4.2"))) static inline uint64_t crc_q(uint64_t c, const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return _mm_crc32_u64(c, v);
}

__attribute__((target("sse4.2"))) uint32_t pw_crc32c_hw(uint32_t crc, const void *buf, size_t n) {
  pthread_once(&once, init_once);
  const unsigned char *p = buf;
  uint64_t c0 = crc ^ 0xffffffffu;
  while (n && ((uintptr_t)p & 7)) {
    c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    n--;
  }
  while (n >= 3 * LONG_BLK) {
    uint64_t c1 = 0, c2 = 0;
    const unsigned char *end = p + LONG_BLK;
    do {
      c0 = crc_q(c0, p);
      c1 = crc_q(c1, p + LONG_BLK);
      c2 = crc_q(c2, p + 2 * LONG_BLK);
      p += 8;
    } while (p < end);
    c0 = shift(zeros_long, (uint32_t)c0) ^ c1;
    c0 = shift(zeros_long, (uint32_t)c0) ^ c2;
    p += 2 * LONG_BLK;
    n -= 3 * LONG_BLK;
  }
  while (n >= 3 * SHORT_BLK) {
    uint64_t c1 = 0, c2 = 0;
    const unsigned char *end = p + SHORT_BLK;
    do {
      c0 = crc_q(c0, p);
      c1 = crc_q(c1, p + SHORT_BLK);
      c2 = crc_q(c2, p + 2 * SHORT_BLK);
      p += 8;
    } while (p < end);
    c0 = shift(zeros_short, (uint32_t)c0) ^ c1;
    c0 = shift(zeros_short, (uint32_t)c0) ^ c2;
    p += 2 * SHORT_BLK;
    n -= 3 * SHORT_BLK;
  }
  while (n >= 8) {
    c0 = crc_q(c0, p);
    p += 8;
    n -= 8;
  }
  while (n--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
  return (uint32_t)c0 ^ 0xffffffffu;
}
#else
uint32_t pw_crc32c_hw(uint32_t crc, const void *buf, size_t n) { return pw_crc32c_sw(crc, buf, n); }
#endif

uint32_t pw_crc32c(uint32_t crc, const void *buf, size_t n) {
  return pw_crc32c_hw_available() ? pw_crc32c_hw(crc, buf, n) : pw_crc32c_sw(crc, buf, n);
}
