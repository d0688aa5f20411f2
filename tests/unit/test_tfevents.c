/* test_tfevents: TensorBoard event files (common/io/tfevents.h).
 *
 * - The masked CRC-32C equals TensorBoard's masked_crc32c, and each event
 *   the writer encodes is byte for byte what protobuf's serializer gives
 *   for the same Event (the hex below came from tensorboard's event_pb2).
 * - A file written and read back gives every event as written: kinds,
 *   wall times, steps, tags, values (float32), in order, and a clean end.
 * - Every single-byte corruption of a small file (each of the 255 other
 *   values at every offset) is reported at the record it hits, worded as
 *   TensorBoard words it (header or event crc32 check); every event before
 *   that record still reads as written, and no event of a corrupted record
 *   ever comes back.
 * - Every truncation: at a record boundary the file reads as the events
 *   before it; anywhere else "truncated record at byte N (in SECTION)" with
 *   N the cut record's start and the section TensorBoard would name.
 * - What other writers put in (TF2 tensor scalars with metadata, a
 *   source_metadata field) is read past: the simple scalars still come out.
 * - A CRC-valid record whose protobuf is malformed is an error naming it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tfevents.h"

static size_t unhex(const char *h, uint8_t *out) {
  size_t n = 0;
  for (; h[0] && h[1]; h += 2) {
    unsigned v;
    sscanf(h, "%2x", &v);
    out[n++] = (uint8_t)v;
  }
  return n;
}

/* The data of the one record in b (which must hold exactly one). */
static const uint8_t *record_data(const pw_tf_buf *b, size_t *n) {
  uint64_t len = 0;
  for (int i = 0; i < 8; i++) len |= (uint64_t)b->data[i] << 8 * i;
  assert_int_equal(b->len, PW_TF_HEADER + len + PW_TF_TRAILER);
  *n = (size_t)len;
  return b->data + PW_TF_HEADER;
}

static void expect_encoding(const pw_tf_event *ev, const char *hex, const char *label) {
  uint8_t want[512];
  size_t wn = unhex(hex, want), n;
  pw_tf_buf b = {0};
  pw_err err = {0};
  assert_int_equal(pw_tf_append(&b, ev, &err), 0);
  const uint8_t *d = record_data(&b, &n);
  if (n != wn || memcmp(d, want, n)) {
    for (size_t i = 0; i < n || i < wn; i++)
      if (i >= n || i >= wn || d[i] != want[i]) {
        print_error("%s: byte %zu differs (got %zu bytes, protobuf %zu)\n", label, i, n, wn);
        break;
      }
    fail();
  }
  pw_tf_buf_free(&b);
}

static void test_masked_crc(void **state) {
  (void)state;
  /* tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c */
  assert_int_equal(pw_tf_masked_crc("", 0), 0xa282ead8u);
  assert_int_equal(pw_tf_masked_crc("a", 1), 0x28e46e78u);
  assert_int_equal(pw_tf_masked_crc("123456789", 9), 0xc78ab0e5u);
  const uint8_t len24[8] = {24};
  assert_int_equal(pw_tf_masked_crc(len24, 8), 0x224b7fa3u);
}

static void test_protobuf_bytes(void **state) {
  (void)state;
  pw_tf_event v = {.kind = PW_TF_VERSION, .wall_time = 1764331234.5};
  expect_encoding(&v, "090000a0b8634ada411a0d627261696e2e4576656e743a32", "file_version, step 0 left out");
  pw_tf_value two[] = {{"train/loss", 2.5f}, {"train/lr", 0.0f}};
  pw_tf_event s = {.kind = PW_TF_SCALARS, .wall_time = 1764331235.25, .step = 300, .values = two, .n_values = 2};
  expect_encoding(&s,
                  "090000d0b8634ada4110ac022a240a110a0a747261696e2f6c6f737315000020400a0f0a08747261696e2f6c72"
                  "1500000000",
                  "two scalars, a zero simple_value kept");
  pw_tf_value one[] = {{"x", -1.5f}};
  pw_tf_event neg = {.kind = PW_TF_SCALARS, .wall_time = 1764331236.0, .step = -2, .values = one, .n_values = 1};
  expect_encoding(&neg, "09000000b9634ada4110feffffffffffffffff012a0a0a080a0178150000c0bf", "a negative step: 10 bytes");
  pw_tf_event start = {.kind = PW_TF_START, .wall_time = 1764331237.0, .step = 100};
  expect_encoding(&start, "09000040b9634ada4110643a020801", "session_log START");
}

/* The events of the test file, and the file. */
static pw_tf_value vals[4][3] = {
    {{"train/loss", 5.5451f}, {"train/lr", 3e-4f}, {"eval/loss", 5.6f}},
    {{"train/loss", 4.25f}, {"train/lr", 6e-4f}, {"pipeline/rank1/bubble", 0.125f}},
    {{"train/loss", -0.0f}, {"train/grad_norm", 1e30f}, {"t", 1.17549435e-38f}},
    {{"train/loss", 3.0f}, {0}, {0}},
};
static pw_tf_event evs[] = {
    {.kind = PW_TF_VERSION, .wall_time = 1700000000.0},
    {.kind = PW_TF_SCALARS, .wall_time = 1700000001.125, .step = 0, .values = vals[0], .n_values = 3},
    {.kind = PW_TF_SCALARS, .wall_time = 1700000002.5, .step = 1, .values = vals[1], .n_values = 3},
    {.kind = PW_TF_SCALARS, .wall_time = 1700000003.75, .step = 2, .values = vals[2], .n_values = 3},
    {.kind = PW_TF_START, .wall_time = 1700000010.0, .step = 1},
    {.kind = PW_TF_SCALARS, .wall_time = 1700000011.0, .step = 1, .values = vals[3], .n_values = 1},
};
#define N_EVS ((int)(sizeof evs / sizeof evs[0]))

static size_t starts[N_EVS + 1]; /* each record's offset, then the file's length */

static void make_file(pw_tf_buf *b) {
  pw_err err = {0};
  *b = (pw_tf_buf){0};
  for (int i = 0; i < N_EVS; i++) {
    starts[i] = b->len;
    assert_int_equal(pw_tf_append(b, &evs[i], &err), 0);
  }
  starts[N_EVS] = b->len;
}

/* The record k holds byte `at`. */
static int record_of(size_t at) {
  int k = 0;
  while (starts[k + 1] <= at) k++;
  return k;
}

/* ev equals evs[k], value bits included; a label says what differs. */
static int same_event(const pw_tf_event *ev, int k, char *why, size_t cap) {
  const pw_tf_event *w = &evs[k];
  if (ev->kind != w->kind) return snprintf(why, cap, "event %d: kind %d, wrote %d", k, ev->kind, w->kind), 0;
  if (memcmp(&ev->wall_time, &w->wall_time, sizeof(double)) || ev->step != w->step)
    return snprintf(why, cap, "event %d: wall %.17g step %lld", k, ev->wall_time, (long long)ev->step), 0;
  if (ev->offset != starts[k]) return snprintf(why, cap, "event %d: offset %llu", k, (unsigned long long)ev->offset), 0;
  if (w->kind == PW_TF_VERSION && strcmp(ev->version, PW_TF_FILE_VERSION))
    return snprintf(why, cap, "event %d: version %s", k, ev->version), 0;
  if (ev->n_values != (w->kind == PW_TF_SCALARS ? w->n_values : 0) || ev->n_other)
    return snprintf(why, cap, "event %d: %d values, %d other", k, ev->n_values, ev->n_other), 0;
  for (int i = 0; i < ev->n_values; i++)
    if (strcmp(ev->values[i].tag, w->values[i].tag) || memcmp(&ev->values[i].value, &w->values[i].value, 4))
      return snprintf(why, cap, "event %d value %d: %s = %.9g", k, i, ev->values[i].tag, ev->values[i].value), 0;
  return 1;
}

/* Reads data[0..n): the good events before the first error into *n_good;
 * the result code of the last read (0 clean end, < 0 error) and err. */
static int read_all(const uint8_t *data, size_t n, int *n_good, pw_err *err, char *why, size_t cap) {
  pw_tf_reader r;
  pw_tf_reader_init(&r, data, n, "f.tfevents");
  pw_tf_event ev;
  int rc;
  *n_good = 0;
  why[0] = 0;
  while ((rc = pw_tf_read(&r, &ev, err)) == 1) {
    if (*n_good >= N_EVS || !same_event(&ev, *n_good, why, cap)) {
      if (!why[0]) snprintf(why, cap, "an event past the last written");
      rc = 2;
      break;
    }
    (*n_good)++;
  }
  if (rc < 0) { /* the error stands */
    pw_err again = {0};
    if (pw_tf_read(&r, &ev, &again) != rc || strcmp(again.msg, err->msg)) snprintf(why, cap, "a second read differs");
  }
  pw_tf_reader_free(&r);
  return rc;
}

static void test_round_trip(void **state) {
  (void)state;
  pw_tf_buf b;
  make_file(&b);
  int good;
  pw_err err = {0};
  char why[200];
  int rc = read_all(b.data, b.len, &good, &err, why, sizeof why);
  if (why[0]) fail_msg("%s", why);
  assert_int_equal(rc, 0);
  assert_int_equal(good, N_EVS);
  /* an empty file is a clean end; appending refuses what it cannot write */
  assert_int_equal(read_all(b.data, 0, &good, &err, why, sizeof why), 0);
  assert_int_equal(good, 0);
  pw_tf_value bad[] = {{"", 1.0f}};
  pw_tf_event e = {.kind = PW_TF_SCALARS, .values = bad, .n_values = 1};
  size_t len = b.len;
  assert_int_equal(pw_tf_append(&b, &e, &err), PW_EINVAL);
  e.kind = PW_TF_OTHER;
  assert_int_equal(pw_tf_append(&b, &e, &err), PW_EINVAL);
  assert_int_equal(b.len, len);
  pw_tf_buf_free(&b);
}

static void test_every_corruption(void **state) {
  (void)state;
  pw_tf_buf b;
  make_file(&b);
  uint8_t *c = malloc(b.len);
  assert_non_null(c);
  int cases = 0;
  for (size_t at = 0; at < b.len; at++) {
    int k = record_of(at);
    size_t in = at - starts[k];
    const char *check = in < PW_TF_HEADER ? "failed header crc32 check" : "failed event crc32 check";
    char want[96];
    snprintf(want, sizeof want, "corrupted record at byte %zu: %s", starts[k], check);
    for (int x = 1; x < 256; x++) {
      memcpy(c, b.data, b.len);
      c[at] ^= (uint8_t)x;
      int good;
      pw_err err = {0};
      char why[200];
      int rc = read_all(c, b.len, &good, &err, why, sizeof why);
      if (why[0]) fail_msg("byte %zu ^ 0x%02x: %s", at, x, why);
      if (rc != PW_EFORMAT || good != k || strcmp(err.msg, want) || strcmp(err.path, "f.tfevents"))
        fail_msg("byte %zu ^ 0x%02x (record %d): rc %d after %d good events: %s (wanted: %s)", at, x, k, rc, good,
                 err.msg, want);
      cases++;
    }
  }
  assert_int_equal(cases, (int)b.len * 255);
  free(c);
  pw_tf_buf_free(&b);
}

static void test_every_truncation(void **state) {
  (void)state;
  pw_tf_buf b;
  make_file(&b);
  for (size_t cut = 0; cut < b.len; cut++) {
    int k = record_of(cut), good;
    size_t in = cut - starts[k], n = starts[k + 1] - starts[k] - PW_TF_HEADER - PW_TF_TRAILER;
    pw_err err = {0};
    char why[200], want[96];
    int rc = read_all(b.data, cut, &good, &err, why, sizeof why);
    if (why[0]) fail_msg("cut at %zu: %s", cut, why);
    if (in == 0) { /* a boundary: the records before it, whole */
      if (rc != 0 || good != k) fail_msg("cut at boundary %zu: rc %d, %d events: %s", cut, rc, good, err.msg);
      continue;
    }
    const char *section = in < 8 ? "header" : in < PW_TF_HEADER ? "header crc" : in < PW_TF_HEADER + n ? "data"
                                                                                                        : "data crc";
    snprintf(want, sizeof want, "truncated record at byte %zu (in %s)", starts[k], section);
    if (rc != PW_EFORMAT || good != k || strcmp(err.msg, want))
      fail_msg("cut at %zu: rc %d after %d events: %s (wanted: %s)", cut, rc, good, err.msg, want);
  }
  pw_tf_buf_free(&b);
}

/* An Event with a TF2 tensor scalar (metadata, tensor) beside an old-style
 * simple_value, and a source_metadata field (10) we do not know. */
/* data[0..n) as one record of an event file into file (n + 16 bytes): the
 * length, its masked CRC, the bytes, theirs. */
static void frame(uint8_t *file, const uint8_t *data, size_t n) {
  for (int k = 0; k < 8; k++) file[k] = (uint8_t)((uint64_t)n >> 8 * k);
  uint32_t c = pw_tf_masked_crc(file, 8);
  memcpy(file + 8, &c, 4);
  memcpy(file + 12, data, n);
  c = pw_tf_masked_crc(data, n);
  memcpy(file + 12 + n, &c, 4);
}

static void test_foreign_fields(void **state) {
  (void)state;
  uint8_t data[512];
  size_t n = unhex("09000000000000f83f10072a330a210a087466322f6c6f7373420808012a040000a03f4a0b0a090a077363616c61"
                   "72730a0e0a076f6c642f616363150000403f52090a077079746f726368",
                   data);
  uint8_t file[600];
  frame(file, data, n);
  pw_tf_reader r;
  pw_tf_reader_init(&r, file, n + 16, "torch");
  pw_tf_event ev;
  pw_err err = {0};
  assert_int_equal(pw_tf_read(&r, &ev, &err), 1);
  assert_int_equal(ev.kind, PW_TF_SCALARS);
  assert_int_equal(ev.step, 7);
  assert_true(ev.wall_time == 1.5);
  assert_int_equal(ev.n_values, 1);
  assert_int_equal(ev.n_other, 1);
  assert_string_equal(ev.values[0].tag, "old/acc");
  assert_true(ev.values[0].value == 0.75f);
  assert_int_equal(pw_tf_read(&r, &ev, &err), 0);
  pw_tf_reader_free(&r);
}

/* Checksums that hold over bytes that are no Event. */
static void test_malformed_protobuf(void **state) {
  (void)state;
  static const struct {
    const char *hex, *why;
  } cases[] = {
      {"2aff", "a varint runs past its message"},
      {"2a05", "a length-delimited field runs past its message"},
      {"0900", "a fixed-size field runs past its message"},
      {"10ffffffffffffffffffff01", "a varint longer than 10 bytes"},
      {"0b", "a group or an unknown wire type"},
      {"0001", "field number 0"},
      {"2a030a0115", "a fixed-size field runs past its message"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t data[64], file[96];
    size_t n = unhex(cases[i].hex, data);
    frame(file, data, n);
    pw_tf_reader r;
    pw_tf_reader_init(&r, file, n + 16, "x");
    pw_tf_event ev;
    pw_err err = {0};
    char want[160];
    snprintf(want, sizeof want, "record at byte 0 is not an Event: %s", cases[i].why);
    assert_int_equal(pw_tf_read(&r, &ev, &err), PW_EFORMAT);
    if (strcmp(err.msg, want)) fail_msg("case %zu (%s): %s", i, cases[i].hex, err.msg);
    pw_tf_reader_free(&r);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_masked_crc),       cmocka_unit_test(test_protobuf_bytes),
      cmocka_unit_test(test_round_trip),       cmocka_unit_test(test_every_corruption),
      cmocka_unit_test(test_every_truncation), cmocka_unit_test(test_foreign_fields),
      cmocka_unit_test(test_malformed_protobuf),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
