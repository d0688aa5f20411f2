/* fuzz_control: the control-link message reader and validator on any byte
 * stream, cut into reads by the first byte. Every message the reader
 * delivers is validated as the daemons do; an accepted message must encode
 * again. */
#include <stdint.h>
#include <stdlib.h>

#include "control.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int on_msg(void *ctx, json_t *msg) {
  (void)ctx;
  pw_err err = {0};
  if (pw_control_validate(msg, &err) == 0) {
    uint8_t *out;
    size_t len;
    if (pw_control_encode(msg, &out, &len) == 0) free(out);
    (void)pw_control_type(msg);
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t cut = (size_t)data[0] + 1;
  data++, size--;
  pw_control_reader r;
  pw_control_reader_init(&r, 1u << 16);
  pw_err err = {0};
  for (size_t off = 0; off < size; off += cut) {
    size_t n = size - off < cut ? size - off : cut;
    if (pw_control_reader_feed(&r, data + off, n, on_msg, NULL, &err) < 0) break;
  }
  pw_control_reader_free(&r);
  return 0;
}
