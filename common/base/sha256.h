/* sha256: SHA-256 (FIPS 180-4) of bytes, whole or streamed, and its hex form.
 *
 * Used to name content: a run's plan and each worker's slice of it
 * (common/plan/slice.h), and content-addressed data later. Plain C, no
 * allocation, no I/O; not constant-time (nothing secret is hashed). */
#ifndef PW_SHA256_H
#define PW_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define PW_SHA256_LEN 32
#define PW_SHA256_HEX_LEN 64 /* the hex form, without its NUL */

typedef struct {
  uint32_t h[8];
  uint64_t bytes;      /* message bytes so far */
  uint8_t buf[64];     /* the block being filled */
  size_t fill;
} pw_sha256_ctx;

void pw_sha256_init(pw_sha256_ctx *c);
void pw_sha256_update(pw_sha256_ctx *c, const void *data, size_t n);
/* The digest; c must be init'ed again before reuse. */
void pw_sha256_final(pw_sha256_ctx *c, uint8_t out[PW_SHA256_LEN]);

/* One call: the digest of data[0..n). */
void pw_sha256(const void *data, size_t n, uint8_t out[PW_SHA256_LEN]);
/* One call: lowercase hex, NUL-terminated (65 bytes written). */
void pw_sha256_hex(const void *data, size_t n, char out[PW_SHA256_HEX_LEN + 1]);
/* digest -> lowercase hex, NUL-terminated. */
void pw_sha256_to_hex(const uint8_t d[PW_SHA256_LEN], char out[PW_SHA256_HEX_LEN + 1]);
/* HMAC-SHA256 (RFC 2104) of msg under key (at most 64 bytes). */
void pw_hmac_sha256(const void *key, size_t klen, const void *msg, size_t n, uint8_t out[PW_SHA256_LEN]);

#endif
