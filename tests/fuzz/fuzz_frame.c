/* fuzz_frame: the data-link frame reader on any byte stream.
 *
 * The first byte picks how the stream is cut into reads (as a socket would
 * deliver it), whether payloads go to a caller's buffer (set_dest), as the
 * worker does for activations, and whether the harness first fixes up the
 * checksums of the frames it finds (so the fuzzer gets past the CRCs to the
 * field checks behind them); the rest is the stream. The reader must
 * never write past the buffers it was given, and once it reports an error
 * it must keep reporting it. A complete HELLO's payload goes through the
 * HELLO parser as the worker's would (its job, run, rank and token). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_PAYLOAD (1u << 16)

static uint8_t slot[MAX_PAYLOAD];

static int on_frame(void *ctx, pw_frame_reader *r, const pw_frame_event *ev) {
  int use_dest = *(int *)ctx;
  if (ev->type == PW_FRAME_HEADER && use_dest) {
    if (ev->hdr.payload_len > sizeof slot) return -1;
    if (pw_frame_reader_set_dest(r, slot)) abort();
  }
  if (ev->type == PW_FRAME_DONE && ev->len && !ev->payload) abort();
  if (ev->type == PW_FRAME_DONE && ev->hdr.kind == PW_FRAME_HELLO && ev->payload) {
    uint64_t job;
    uint32_t run, rank;
    char token[257];
    pw_err err = {0};
    if (pw_frame_hello_parse(ev->payload, ev->len, &job, &run, &rank, token, sizeof token, &err) == 0 &&
        strlen(token) > 256)
      abort(); /* an accepted token always fits */
  }
  return 0;
}

static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Frame after frame: payload CRC over what follows (as much as there is),
 * then the header CRC over bytes 0..59. */
static void fix_crcs(uint8_t *s, size_t n) {
  for (size_t off = 0; off + PW_FRAME_HDR_SIZE <= n;) {
    uint8_t *h = s + off;
    size_t len = get32(h + 52), have = n - off - PW_FRAME_HDR_SIZE;
    if (len > have) len = have;
    put32(h + 56, pw_crc32c(0, h + PW_FRAME_HDR_SIZE, len));
    put32(h + 60, pw_crc32c(0, h, 60));
    off += PW_FRAME_HDR_SIZE + len;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size) {
  if (size < 1) return 0;
  int use_dest = in[0] & 1, fix = in[0] & 2;
  size_t cut = (size_t)(in[0] >> 2) + 1; /* bytes per read: 1..64 */
  uint8_t *data = malloc(size);
  if (!data) abort();
  memcpy(data, in + 1, --size);
  if (fix) fix_crcs(data, size);
  pw_frame_reader r;
  pw_frame_reader_init(&r, MAX_PAYLOAD);
  pw_err err = {0};
  int dead = 0;
  for (size_t off = 0; off < size; off += cut) {
    size_t n = size - off < cut ? size - off : cut;
    int rc = pw_frame_reader_feed(&r, data + off, n, on_frame, &use_dest, &err);
    if (dead && rc >= 0) abort(); /* a dead stream stays dead */
    if (rc < 0) dead = rc;
  }
  (void)pw_frame_reader_idle(&r);
  (void)pw_frame_reader_missing(&r);
  pw_frame_reader_free(&r);
  free(data);
  return 0;
}
