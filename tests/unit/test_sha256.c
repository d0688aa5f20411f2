/* test_sha256: SHA-256 against the FIPS 180-2 appendix vectors ("abc",
 * the two-block 448-bit message, a million 'a's), the empty string, every
 * split point of the streamed form, and lengths around the padding edge
 * (55, 56, 63, 64 bytes) checked against one-shot hashing of the same
 * bytes fed a byte at a time. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "sha256.h"

static void expect_hex(const void *data, size_t n, const char *want) {
  char got[PW_SHA256_HEX_LEN + 1];
  pw_sha256_hex(data, n, got);
  assert_string_equal(got, want);
}

static void test_fips_vectors(void **state) {
  (void)state;
  expect_hex("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  expect_hex(two, strlen(two), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  expect_hex("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

static void test_million_a(void **state) {
  (void)state;
  /* Streamed in uneven pieces, so the buffering path is exercised too. */
  char chunk[997];
  memset(chunk, 'a', sizeof chunk);
  pw_sha256_ctx c;
  pw_sha256_init(&c);
  size_t left = 1000000;
  while (left) {
    size_t k = left < sizeof chunk ? left : sizeof chunk;
    pw_sha256_update(&c, chunk, k);
    left -= k;
  }
  uint8_t d[PW_SHA256_LEN];
  char hex[PW_SHA256_HEX_LEN + 1];
  pw_sha256_final(&c, d);
  pw_sha256_to_hex(d, hex);
  assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void test_splits_and_edges(void **state) {
  (void)state;
  uint8_t msg[200];
  for (size_t i = 0; i < sizeof msg; i++) msg[i] = (uint8_t)(i * 37 + 11);
  size_t lens[] = {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 200};
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
    size_t n = lens[li];
    uint8_t one[PW_SHA256_LEN], part[PW_SHA256_LEN];
    pw_sha256(msg, n, one);
    for (size_t cut = 0; cut <= n; cut++) {
      pw_sha256_ctx c;
      pw_sha256_init(&c);
      pw_sha256_update(&c, msg, cut);
      pw_sha256_update(&c, msg + cut, n - cut);
      pw_sha256_final(&c, part);
      if (memcmp(one, part, sizeof one)) fail_msg("length %zu split at %zu differs from one shot", n, cut);
    }
    /* A changed byte changes the digest. */
    if (n) {
      uint8_t flipped[200];
      memcpy(flipped, msg, n);
      flipped[n / 2] ^= 1;
      pw_sha256(flipped, n, part);
      assert_memory_not_equal(one, part, sizeof one);
    }
  }
  /* 64 zero bytes (a full block, then a padding-only block), as Python hashlib gives it. */
  uint8_t z[64] = {0};
  expect_hex(z, 64, "f5a5fd42d16a20302798ef6ed309979b43003d2320d9f0e8ea9831a92759fb4b");
}

/* RFC 4231, test cases 1 and 2. */
static void test_hmac_vectors(void **state) {
  (void)state;
  uint8_t key1[20], mac[PW_SHA256_LEN];
  char hex[PW_SHA256_HEX_LEN + 1];
  memset(key1, 0x0b, sizeof key1);
  pw_hmac_sha256(key1, sizeof key1, "Hi There", 8, mac);
  pw_sha256_to_hex(mac, hex);
  assert_string_equal(hex, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  pw_hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, mac);
  pw_sha256_to_hex(mac, hex);
  assert_string_equal(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fips_vectors),
      cmocka_unit_test(test_million_a),
      cmocka_unit_test(test_splits_and_edges),
      cmocka_unit_test(test_hmac_vectors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
