/* sha256: FIPS 180-4 SHA-256, written from the standard (section 6.2). */
#include "sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return x >> n | x << (32 - n); }

static void block(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int t = 0; t < 16; t++)
    w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
  for (int t = 16; t < 64; t++) {
    uint32_t s0 = ror(w[t - 15], 7) ^ ror(w[t - 15], 18) ^ w[t - 15] >> 3;
    uint32_t s1 = ror(w[t - 2], 17) ^ ror(w[t - 2], 19) ^ w[t - 2] >> 10;
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int t = 0; t < 64; t++) {
    uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
    uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void pw_sha256_init(pw_sha256_ctx *c) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(c->h, h0, sizeof h0);
  c->bytes = 0;
  c->fill = 0;
}

void pw_sha256_update(pw_sha256_ctx *c, const void *data, size_t n) {
  const uint8_t *p = data;
  c->bytes += n;
  if (c->fill) {
    size_t k = 64 - c->fill < n ? 64 - c->fill : n;
    memcpy(c->buf + c->fill, p, k);
    c->fill += k, p += k, n -= k;
    if (c->fill < 64) return;
    block(c->h, c->buf);
    c->fill = 0;
  }
  for (; n >= 64; p += 64, n -= 64) block(c->h, p);
  memcpy(c->buf, p, n);
  c->fill = n;
}

void pw_sha256_final(pw_sha256_ctx *c, uint8_t out[PW_SHA256_LEN]) {
  uint64_t bits = c->bytes * 8;
  c->buf[c->fill++] = 0x80;
  if (c->fill > 56) { /* no room for the length: pad out this block */
    memset(c->buf + c->fill, 0, 64 - c->fill);
    block(c->h, c->buf);
    c->fill = 0;
  }
  memset(c->buf + c->fill, 0, 56 - c->fill);
  for (int i = 0; i < 8; i++) c->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
  block(c->h, c->buf);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(c->h[i] >> (24 - 8 * j));
}

void pw_sha256(const void *data, size_t n, uint8_t out[PW_SHA256_LEN]) {
  pw_sha256_ctx c;
  pw_sha256_init(&c);
  pw_sha256_update(&c, data, n);
  pw_sha256_final(&c, out);
}

void pw_sha256_to_hex(const uint8_t d[PW_SHA256_LEN], char out[PW_SHA256_HEX_LEN + 1]) {
  static const char hx[] = "0123456789abcdef";
  for (int i = 0; i < PW_SHA256_LEN; i++) out[2 * i] = hx[d[i] >> 4], out[2 * i + 1] = hx[d[i] & 15];
  out[PW_SHA256_HEX_LEN] = 0;
}

void pw_sha256_hex(const void *data, size_t n, char out[PW_SHA256_HEX_LEN + 1]) {
  uint8_t d[PW_SHA256_LEN];
  pw_sha256(data, n, d);
  pw_sha256_to_hex(d, out);
}

void pw_hmac_sha256(const void *key, size_t klen, const void *msg, size_t n, uint8_t out[PW_SHA256_LEN]) {
  uint8_t k[64] = {0}, pad[64], inner[PW_SHA256_LEN];
  memcpy(k, key, klen < sizeof k ? klen : sizeof k);
  pw_sha256_ctx c;
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
  pw_sha256_init(&c);
  pw_sha256_update(&c, pad, sizeof pad);
  pw_sha256_update(&c, msg, n);
  pw_sha256_final(&c, inner);
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
  pw_sha256_init(&c);
  pw_sha256_update(&c, pad, sizeof pad);
  pw_sha256_update(&c, inner, sizeof inner);
  pw_sha256_final(&c, out);
}
