/* fuzz_control: the control-link message reader and validator on any byte
 * stream, cut into reads by the first byte. Every message the reader
 * delivers is validated as the daemons do; an accepted message must encode
 * again, decode into its struct (nested objects such as step.trace
 * included) and build again from that struct into an equal message:
 * whatever the reader accepts, the typed side can carry. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "control.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every key of a is in b with the same value: numbers equal as numbers
 * (an integer read into a number field comes back a real), objects by the
 * same rule (b may hold fields the table does not name). */
static int within(const json_t *a, const json_t *b) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)a, k, v) {
    json_t *w = json_object_get(b, k);
    if (!w) return 0;
    if (json_is_number(v) ? !json_is_number(w) || json_number_value(v) != json_number_value(w)
                          : json_is_object(v) ? !json_is_object(w) || !within(v, w) : !json_equal(v, w))
      return 0;
  }
  return 1;
}

static size_t struct_size(pw_msg_type t) {
  switch (t) {
#define SZ(id, name, dir, type) \
  case PW_MSG_##id: return sizeof(type);
    PW_CONTROL_MSGS(SZ)
#undef SZ
    default: return 0;
  }
}

static int on_msg(void *ctx, json_t *msg) {
  (void)ctx;
  pw_err err = {0};
  if (pw_control_validate(msg, &err)) abort(); /* the reader returns only valid messages */
  uint8_t *out;
  size_t len;
  if (pw_control_encode(msg, &out, &len) == 0) free(out);
  pw_msg_type t;
  pw_msg_any m;
  if (pw_control_read(msg, &t, &m, &err)) {
    fprintf(stderr, "read refused a valid message: %s: %s\n", err.path, err.msg);
    abort();
  }
  json_t *again = pw_control_build(t, &m, struct_size(t), &err);
  if (!again && err.code == PW_ENOMEM) return 0;
  if (!again) {
    fprintf(stderr, "build refused what read gave: %s: %s\n", err.path, err.msg);
    abort();
  }
  if (!within(again, msg)) abort(); /* a field built from another's slot, or changed */
  json_decref(again);
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
