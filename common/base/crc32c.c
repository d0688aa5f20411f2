/* crc32c: CRC-32C in software (slicing-by-8), with SSE4.2, and with
 * AVX-512 carry-less multiplication (VPCLMULQDQ).
 *
 * The SSE4.2 path runs three independent crc32 streams over adjacent
 * blocks (the instruction has a latency of 3 cycles but a throughput of 1),
 * then joins them by "shifting" the earlier CRCs over the later blocks'
 * lengths with precomputed zero-extension tables (Mark Adler's method):
 * ~8 bytes/cycle, ~26 GB/s on the CI machines. The VPCLMULQDQ path folds
 * 256 bytes per step in sixteen 128-bit lanes (the classic PCLMUL folding,
 * four zmm registers wide) while three crc32 streams run alongside on the
 * integer unit: ~70 GB/s there. It takes over from 256 bytes on CPUs that
 * have it and when PW_CPU allows AVX-512 (cpu.h: PW_CPU=avx2 or sse
 * turns it off; SSE4.2 is part of the x86-64-v2 baseline and stays); every
 * frame payload goes through here once at each end, on the critical path
 * of a transfer. Tables and fold constants are built once,
 * under pthread_once, from the polynomial: no magic numbers. */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#include "cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PW__CRC_X86 1
#endif

#define POLY 0x82f63b78u /* reflected Castagnoli polynomial */
#define LONG_BLK 8192
#define SHORT_BLK 256

static uint32_t sw_table[8][256];
static uint32_t zeros_long[4][256];  /* appends LONG_BLK zero bytes */
static uint32_t zeros_short[4][256]; /* appends SHORT_BLK zero bytes */
static int hw_ok, vec_ok; /* what the CPU has; vec also needs pw_cpu_level() */
/* Fold constants: k[d] = {x^(D+31) mod P, x^(D-33) mod P} (bit-reflected)
 * moves a 128-bit lane D = 128 * (d + 1) bits further down the message;
 * d = 0, 1, 2 (the last lanes of a zmm), 3 (one zmm), 15 (four zmm). */
static uint64_t fold_k[16][2];
/* The VPCLMULQDQ path's hybrid blocks (see there): HYB_STEPS steps of 256
 * folded bytes and HYB_Q 8-byte crc32's on each of three streams. */
#define HYB_STEPS 32
#define HYB_Q 5
#define HYB_V (HYB_STEPS * 256)
#define HYB_S (HYB_STEPS * HYB_Q * 8)
#define HYB_BLK (HYB_V + 3 * HYB_S)
static uint64_t hyb_k; /* x^(8 * HYB_S - 33) mod P: shifts a CRC over HYB_S bytes */
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
  /* x^n mod P, reflected (bit 31 is x^0): n multiplications by x. */
  uint32_t xn = 0x80000000u;
  for (int n = 1; n <= 8 * HYB_S - 33; n++) {
    xn = (xn >> 1) ^ (xn & 1 ? POLY : 0);
    if (n % 128 == 95 && n < 16 * 128) fold_k[(n + 33) / 128 - 1][1] = xn; /* n = D - 33 */
    if (n % 128 == 31 && n > 128 && n <= 16 * 128 + 31) fold_k[(n - 31) / 128 - 1][0] = xn; /* n = D + 31 */
  }
  hyb_k = xn;
#ifdef PW__CRC_X86
  __builtin_cpu_init();
  hw_ok = __builtin_cpu_supports("sse4.2") ? 1 : 0;
  vec_ok = hw_ok && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("vpclmulqdq");
#endif
}

int pw_crc32c_vec_available(void) {
  pthread_once(&once, init_once);
  return vec_ok && pw_cpu_level() >= PW_CPU_AVX512;
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

/* ---- AVX-512 VPCLMULQDQ: folding -------------------------------------------
 *
 * A 128-bit lane L of the message stands for L(x) * x^(bits after it). Moving
 * it D bits further on is L * x^D mod P, which for the two 64-bit halves is
 * clmul(lo, x^(D+31) mod P) ^ clmul(hi, x^(D-33) mod P) (the -1 in each
 * exponent is the bit the reflected product is shifted by). Folding keeps
 * sixteen lanes that are congruent to everything read so far; the last lane
 * left at the end, run through the crc32 instruction from 0, is the CRC.
 *
 * The carry-less multiplier is the limit (~27 bytes/cycle here), and the
 * integer unit's crc32 sits idle meanwhile: in blocks of HYB_BLK bytes the
 * first HYB_V are folded while three crc32 streams run over the three
 * HYB_S-byte runs after them, in the same loop (~35 % faster than folding
 * alone on the CI machines' Zen 5); the four raw CRCs are then joined by
 * shifting. */
#define VEC_TARGET __attribute__((target("sse4.2,pclmul,avx512f,avx512vl,vpclmulqdq")))

VEC_TARGET static inline __m512i fold(__m512i x, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                   _mm512_clmulepi64_epi128(x, k, 0x11), next, 0x96); /* a^b^c */
}

VEC_TARGET static inline __m512i kvec(int d) {
  return _mm512_broadcast_i32x4(_mm_set_epi64x((long long)fold_k[d][1], (long long)fold_k[d][0]));
}

/* Four zmm of lanes congruent to the message so far, in message order ->
 * the raw CRC register. */
VEC_TARGET static uint32_t reduce4(__m512i x0, __m512i x1, __m512i x2, __m512i x3) {
  __m512i k = kvec(3); /* 512 bits: one zmm on */
  x0 = fold(x0, k, x1);
  x0 = fold(x0, k, x2);
  x0 = fold(x0, k, x3);
  /* Lanes 0, 1, 2 move 384, 256, 128 bits on onto lane 3. */
  k = _mm512_set_epi64(0, 0, (long long)fold_k[0][1], (long long)fold_k[0][0],
                       (long long)fold_k[1][1], (long long)fold_k[1][0], (long long)fold_k[2][1],
                       (long long)fold_k[2][0]);
  __m512i t = _mm512_xor_si512(_mm512_clmulepi64_epi128(x0, k, 0x00), _mm512_clmulepi64_epi128(x0, k, 0x11));
  t = _mm512_mask_mov_epi64(t, 0xc0, x0); /* lane 3 as it is */
  __m256i h = _mm256_xor_si256(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
  __m128i l = _mm_xor_si128(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(l));
  return (uint32_t)_mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(l, 1));
}

/* The raw register enters as the first 4 message bytes xor'ed with it. */
VEC_TARGET static inline __m512i load_first(const unsigned char *p, uint32_t c) {
  return _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, (long long)c));
}

/* Raw register c times x^(8 * HYB_S) mod P. */
VEC_TARGET static inline uint32_t shift_hyb(uint32_t c) {
  __m128i m = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)c), _mm_cvtsi64_si128((long long)hyb_k), 0);
  return (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(m));
}

VEC_TARGET static uint32_t hyb_block(uint32_t c, const unsigned char *p) {
  const unsigned char *s = p + HYB_V;
  __m512i x0 = load_first(p, c), x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128),
          x3 = _mm512_loadu_si512(p + 192);
  __m512i k = kvec(15); /* 2048 bits: four zmm on */
  uint64_t c0 = 0, c1 = 0, c2 = 0;
  for (int i = 0;; i++) {
    for (int q = 0; q < HYB_Q; q++, s += 8) {
      c0 = crc_q(c0, s);
      c1 = crc_q(c1, s + HYB_S);
      c2 = crc_q(c2, s + 2 * HYB_S);
    }
    if (i == HYB_STEPS - 1) break;
    p += 256;
    x0 = fold(x0, k, _mm512_loadu_si512(p));
    x1 = fold(x1, k, _mm512_loadu_si512(p + 64));
    x2 = fold(x2, k, _mm512_loadu_si512(p + 128));
    x3 = fold(x3, k, _mm512_loadu_si512(p + 192));
  }
  c = shift_hyb(reduce4(x0, x1, x2, x3)) ^ (uint32_t)c0;
  c = shift_hyb(c) ^ (uint32_t)c1;
  return shift_hyb(c) ^ (uint32_t)c2;
}

VEC_TARGET uint32_t pw_crc32c_vec(uint32_t crc, const void *buf, size_t n) {
  pthread_once(&once, init_once);
  const unsigned char *p = buf;
  uint32_t c = crc ^ 0xffffffffu;
  for (; n >= HYB_BLK; p += HYB_BLK, n -= HYB_BLK) c = hyb_block(c, p);
  if (n >= 256) {
    __m512i x0 = load_first(p, c), x1 = _mm512_loadu_si512(p + 64),
            x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
    __m512i k = kvec(15);
    for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
      x0 = fold(x0, k, _mm512_loadu_si512(p));
      x1 = fold(x1, k, _mm512_loadu_si512(p + 64));
      x2 = fold(x2, k, _mm512_loadu_si512(p + 128));
      x3 = fold(x3, k, _mm512_loadu_si512(p + 192));
    }
    /* Up to three more zmm: fold them in as the last ones. */
    while (n >= 64) {
      x0 = fold(x0, kvec(3), x1);
      x1 = x2;
      x2 = x3;
      x3 = _mm512_loadu_si512(p);
      p += 64;
      n -= 64;
    }
    c = reduce4(x0, x1, x2, x3);
  }
  return pw_crc32c_hw(c ^ 0xffffffffu, p, n);
}
#else
uint32_t pw_crc32c_hw(uint32_t crc, const void *buf, size_t n) { return pw_crc32c_sw(crc, buf, n); }
uint32_t pw_crc32c_vec(uint32_t crc, const void *buf, size_t n) { return pw_crc32c_sw(crc, buf, n); }
#endif

uint32_t pw_crc32c(uint32_t crc, const void *buf, size_t n) {
  pthread_once(&once, init_once);
  if (n >= 256 && vec_ok && pw_cpu_level() >= PW_CPU_AVX512) return pw_crc32c_vec(crc, buf, n);
  return hw_ok ? pw_crc32c_hw(crc, buf, n) : pw_crc32c_sw(crc, buf, n);
}
