/* fuzz_slice: the worker's plan-slice decoder on any text. The harness
 * hashes the bytes itself, as a coordinator would, so the fuzzer gets past
 * the hash check to the decoder's field and range checks: whatever it
 * accepts must be safe for a worker to build its programs from (every id
 * and range in bounds), and nothing may crash or leak. */
#include <stdint.h>
#include <stdlib.h>

#include "sha256.h"
#include "slice.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char hex[PW_SHA256_HEX_LEN + 1];
  pw_sha256_hex(data, size, hex);
  pw_slice s;
  pw_err err = {0};
  if (pw_slice_decode((const char *)data, size, hex, &s, &err) == 0) pw_slice_free(&s);
  return 0;
}
