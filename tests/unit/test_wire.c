/* test_wire: the data-plane frame header (frozen byte layout,
 * every field validated), HELLO payloads, and the stream reader fed whole,
 * byte by byte, in random chunks and by partial reads, with zero-copy
 * destinations; then fuzzing with random bytes and mutated valid streams
 * (the reader must return frames or errors, never crash, never hold more
 * than max_payload). Deterministic: a fixed seed, PW_FUZZ_SEED overrides.
 * CRC-32C itself is tested in test_crc32c.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "wire.h"

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t g_rng = 0x5eed0001;

static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static void expect_err(const pw_err *err, const char *want) {
  char buf[600];
  pw_err_str(err, buf, sizeof buf);
  if (!strstr(buf, want)) fail_msg("error '%s' does not contain '%s'", buf, want);
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void refresh_hdr_crc(uint8_t *h) { put32(h + 60, pw_crc32c(0, h, 60)); }

/* Bit-at-a-time reference CRC-32C, independent of both implementations. */
static uint32_t crc_ref(const uint8_t *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  return ~c;
}

/* ---- header ----------------------------------------------------------------- */

static void test_hdr_layout(void **state) {
  pw_frame_hdr h, d;
  uint32_t dims[2] = {2, 3};
  float pay[6] = {1, 2, 3, 4, 5, 6};
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 0x05060708u, 0x11223344, 5, 6,
                                     7, PW_DTYPE_F32, 2, dims), 0);
  assert_int_equal(h.payload_len, 24);
  h.flags = PW_FRAME_FLAG_CHUNK | PW_FRAME_FLAG_LAST; /* a one-chunk transfer: every field set */
  h.chunk = 0x01020304;
  uint8_t b[PW_FRAME_HDR_SIZE];
  pw_frame_hdr_encode(&h, pay, b);
  const uint8_t want[52] = {'P', 'W', 'F', '1', 2, 0, 2, 0, 8, 7, 6, 5, 4, 3, 2, 1,
                            0x44, 0x33, 0x22, 0x11, 5, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0,
                            0, 2, 3, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  assert_memory_equal(b, want, sizeof want);
  assert_int_equal(get32(b + 52), 24);
  assert_int_equal(get32(b + 56), crc_ref((const uint8_t *)pay, 24));
  assert_int_equal(get32(b + 60), crc_ref(b, 60));

  pw_err err = {0};
  assert_int_equal(pw_frame_hdr_decode(b, 1 << 20, &d, &err), 0);
  assert_int_equal(d.version, 2);
  assert_int_equal(d.kind, PW_FRAME_ACT);
  assert_true(d.job == 0x05060708u);
  assert_int_equal(d.chunk, 0x01020304);
  assert_int_equal(d.step, 0x11223344);
  assert_int_equal(d.microbatch, 5);
  assert_int_equal(d.stage, 6);
  assert_int_equal(d.value, 7);
  assert_int_equal(d.dtype, PW_DTYPE_F32);
  assert_int_equal(d.ndim, 2);
  assert_int_equal(d.flags, PW_FRAME_FLAG_CHUNK | PW_FRAME_FLAG_LAST);
  assert_int_equal(d.dims[0], 2);
  assert_int_equal(d.dims[1], 3);
  assert_int_equal(d.dims[2], 0);
  assert_int_equal(d.payload_len, 24);
  assert_int_equal(d.payload_crc, get32(b + 56));
  char s[200];
  assert_string_equal(pw_frame_hdr_str(&d, s, sizeof s), "ACT job 84281096 step 287454020 mb 5 stage 6 value 7 "
                                                       "f32 [2,3] 24 bytes, chunk 16909060: 24 bytes, last");
  d.flags = 0;
  assert_string_equal(pw_frame_hdr_str(&d, s, sizeof s),
                      "ACT job 84281096 step 287454020 mb 5 stage 6 value 7 f32 [2,3] 24 bytes");
  /* encode_crc with the same CRC gives the same bytes */
  uint8_t b2[PW_FRAME_HDR_SIZE];
  pw_frame_hdr_encode_crc(&h, pw_crc32c(pw_crc32c(0, pay, 10), (uint8_t *)pay + 10, 14), b2);
  assert_memory_equal(b, b2, sizeof b);
}

static void test_hdr_init(void **state) {
  pw_frame_hdr h;
  uint32_t d4[4] = {2, 3, 4, 5}, edge[2] = {65536, 65535};
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_GRAD, 1, 0, 0, 0, 0, PW_DTYPE_I32, 4, d4), 0);
  assert_int_equal(h.payload_len, 2 * 3 * 4 * 5 * 4);
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_DP, 1, 0, 0, 0, 0, PW_DTYPE_F32, 0, NULL), 0);
  assert_int_equal(h.payload_len, 4); /* scalar */
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 0, 0, PW_DTYPE_U8, 2, edge), 0);
  assert_true(h.payload_len == 65536ull * 65535); /* just under 4 GiB */
  /* sizes over one frame, the job's width: test_wire_chunk.c */
  assert_int_equal(pw_frame_hdr_init(&h, 0, 1, 0, 0, 0, 0, PW_DTYPE_F32, 1, d4), PW_EINVAL);
  assert_int_equal(pw_frame_hdr_init(&h, 12, 1, 0, 0, 0, 0, PW_DTYPE_F32, 1, d4), PW_EINVAL);
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 0, 0, 4, 1, d4), PW_EINVAL);
  /* bf16: 2 bytes an element, and only in ACT frames */
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 0, 0, PW_DTYPE_BF16, 4, d4), 0);
  assert_int_equal(h.payload_len, 2 * 3 * 4 * 5 * 2);
  assert_string_equal(pw_frame_dtype_name(PW_DTYPE_BF16), "bf16");
  static const uint8_t zeros[2 * 3 * 4 * 5 * 2];
  uint8_t enc[PW_FRAME_HDR_SIZE];
  pw_frame_hdr back;
  pw_err err = {0};
  pw_frame_hdr_encode(&h, zeros, enc);
  assert_int_equal(pw_frame_hdr_decode(enc, 1 << 20, &back, &err), 0);
  assert_int_equal(back.dtype, PW_DTYPE_BF16);
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_GRAD, 1, 0, 0, 0, 0, PW_DTYPE_BF16, 4, d4), 0);
  pw_frame_hdr_encode(&h, zeros, enc);
  assert_int_equal(pw_frame_hdr_decode(enc, 1 << 20, &back, &err), PW_EFORMAT);
  assert_non_null(strstr(err.msg, "dtype bf16 is only for ACT frames (got GRAD)"));
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 0, 0, PW_DTYPE_F32, 5, d4), PW_EINVAL);
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 0, 0, PW_DTYPE_F32, 1, NULL), PW_EINVAL);
  assert_int_equal(pw_frame_dtype_size(PW_DTYPE_U8), 1);
  assert_string_equal(pw_frame_kind_name(PW_FRAME_TIED), "TIED");
  assert_string_equal(pw_frame_kind_name(99), "?");
}

/* A valid ACT header [2,3] f32 in b, then one field changed. */
typedef struct {
  const char *what;
  int off, width;   /* bytes changed; width 0 = custom below */
  uint64_t value;
  int fix_crc;      /* recompute the header CRC after the change */
  int code;
  const char *msg;
} corruption;

static const corruption corruptions[] = {
    {"magic", 0, 4, 0x31465751, 1, PW_EPROTO, "magic 0x31465751 is not \"PWF1\""},
    {"version", 4, 2, 1, 1, PW_EPROTO, "version 1 is not supported (want 2)"},
    {"header crc", 60, 4, 0xdeadbeef, 0, PW_EPROTO, "header_crc 0xdeadbeef does not match"},
    {"unfixed step", 16, 4, 99, 0, PW_EPROTO, "header_crc"},
    {"kind 0", 6, 2, 0, 1, PW_EPROTO, "kind 0 is unknown"},
    {"kind 12", 6, 2, 12, 1, PW_EPROTO, "kind 12 is unknown"},
    {"kind huge", 6, 2, 0xffff, 1, PW_EPROTO, "kind 65535 is unknown"},
    {"flags", 34, 2, 0x8001, 1, PW_EPROTO, "flags 0x8001 has unknown bits 0x8000"},
    {"last alone", 34, 2, PW_FRAME_FLAG_LAST, 1, PW_EPROTO, "flag LAST without flag CHUNK"},
    {"chunk alone", 12, 4, 3, 1, PW_EPROTO, "chunk 3 without flag CHUNK"}, /* chunk frames: test_wire_chunk.c */
    {"dtype", 32, 1, 4, 1, PW_EFORMAT, "dtype 4 is unknown"},
    {"dtype bf16", 32, 1, PW_DTYPE_BF16, 1, PW_EFORMAT, "payload_len 24 does not match dims [2,3] of bf16 (12 bytes)"},
    {"ndim", 33, 1, 5, 1, PW_EFORMAT, "ndim 5 is over 4"},
    {"unused dim", 36 + 12, 4, 1, 1, PW_EFORMAT, "dims[3] is 1 but ndim is 2 (must be 0)"},
    {"dims vs len", 36, 4, 3, 1, PW_EFORMAT, "payload_len 24 does not match dims [3,3] of f32 (36 bytes)"},
    {"len vs dims", 52, 4, 4096, 1, PW_EFORMAT,
     "frame: payload_len 4096 does not match dims [2,3] of f32 (24 bytes)"},
    {"ndim 1", 33, 1, 1, 1, PW_EFORMAT, "dims[1] is 3 but ndim is 1"},
    {"dtype u8", 32, 1, PW_DTYPE_U8, 1, PW_EFORMAT, "dims [2,3] of u8 (6 bytes)"},
    {"huge dims", 0, 0, 1, 1, PW_EFORMAT, "(size overflows)"},
    {"too big", 0, 0, 2, 1, PW_ETOOBIG, "payload_len 400 is over the limit 256"},
    {"hello f32", 6, 2, PW_FRAME_HELLO, 1, PW_EFORMAT, "kind HELLO must carry"},
    {"bye f32", 6, 2, PW_FRAME_BYE, 1, PW_EFORMAT, "kind BYE must carry 0..4096 bytes of u8 with ndim 1 (got f32"},
};

static void test_hdr_corrupt_each_field(void **state) {
  pw_frame_hdr h, d;
  uint32_t dims[2] = {2, 3};
  float pay[6] = {0};
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 9, 1, 2, 3, 4, PW_DTYPE_F32, 2, dims), 0);
  uint8_t good[PW_FRAME_HDR_SIZE];
  pw_frame_hdr_encode(&h, pay, good);
  pw_err err = {0};
  assert_int_equal(pw_frame_hdr_decode(good, 256, &d, &err), 0);
  for (size_t i = 0; i < sizeof corruptions / sizeof *corruptions; i++) {
    const corruption *c = &corruptions[i];
    uint8_t b[PW_FRAME_HDR_SIZE];
    memcpy(b, good, sizeof b);
    for (int k = 0; k < c->width; k++) b[c->off + k] = (uint8_t)(c->value >> (8 * k));
    if (c->width == 0 && c->value == 1) { /* dims whose product overflows 64 bits */
      b[33] = 4;
      for (int k = 0; k < 4; k++) put32(b + 36 + 4 * k, 0xffffffffu);
    }
    if (c->width == 0 && c->value == 2) { /* valid but over the limit: [10,10] f32 */
      put32(b + 36, 10);
      put32(b + 40, 10);
      put32(b + 52, 400);
    }
    if (c->fix_crc) refresh_hdr_crc(b);
    memset(&err, 0, sizeof err);
    int rc = pw_frame_hdr_decode(b, 256, &d, &err);
    if (rc != c->code) fail_msg("%s: got %s, want %s", c->what, pw_err_name(rc), pw_err_name(c->code));
    assert_int_equal(err.code, c->code);
    assert_string_equal(err.path, "frame");
    expect_err(&err, c->msg);
  }
  /* Every single-bit flip anywhere in the header is caught. */
  for (int bit = 0; bit < 8 * PW_FRAME_HDR_SIZE; bit++) {
    uint8_t b[PW_FRAME_HDR_SIZE];
    memcpy(b, good, sizeof b);
    b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    assert_true(pw_frame_hdr_decode(b, 256, &d, &err) < 0);
  }
}

/* Serving's SEQS ([n, PW_FRAME_SEQ_FIELDS] i32) and TOKENS ([n] i32): any
 * other shape or dtype, an empty one, or a chunk of one is refused. */
static void test_serve_kinds(void **state) {
  (void)state;
  struct {
    int kind, dtype, ndim;
    uint32_t d0, d1;
    uint16_t flags;
    int ok;
  } cases[] = {
      {PW_FRAME_SEQS, PW_DTYPE_I32, 2, 3, PW_FRAME_SEQ_FIELDS, 0, 1},
      {PW_FRAME_SEQS, PW_DTYPE_I32, 2, 3, PW_FRAME_SEQ_FIELDS - 1, 0, 0},
      {PW_FRAME_SEQS, PW_DTYPE_I32, 2, 0, PW_FRAME_SEQ_FIELDS, 0, 0},
      {PW_FRAME_SEQS, PW_DTYPE_F32, 2, 3, PW_FRAME_SEQ_FIELDS, 0, 0},
      {PW_FRAME_SEQS, PW_DTYPE_I32, 1, 3 * PW_FRAME_SEQ_FIELDS, 0, 0, 0},
      {PW_FRAME_SEQS, PW_DTYPE_I32, 2, 3, PW_FRAME_SEQ_FIELDS, PW_FRAME_FLAG_CHUNK | PW_FRAME_FLAG_LAST, 0},
      {PW_FRAME_TOKENS, PW_DTYPE_I32, 1, 5, 0, 0, 1},
      {PW_FRAME_TOKENS, PW_DTYPE_I32, 1, 0, 0, 0, 0},
      {PW_FRAME_TOKENS, PW_DTYPE_U8, 1, 5, 0, 0, 0},
      {PW_FRAME_TOKENS, PW_DTYPE_I32, 2, 5, 1, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pw_frame_hdr h, d;
    uint32_t dims[2] = {cases[i].d0, cases[i].d1};
    assert_int_equal(pw_frame_hdr_init(&h, cases[i].kind, 1, 0, 0, 0, 0, cases[i].dtype, cases[i].ndim, dims), 0);
    h.flags = cases[i].flags;
    static const uint8_t zeros[1024];
    uint8_t b[PW_FRAME_HDR_SIZE];
    assert_true(h.payload_len <= sizeof zeros);
    pw_frame_hdr_encode(&h, zeros, b);
    pw_err err = {0};
    int rc = pw_frame_hdr_decode(b, 1 << 20, &d, &err);
    if (cases[i].ok != (rc == 0)) fail_msg("case %zu: decode gave %d: %s", i, rc, err.msg);
    if (!cases[i].ok && !strstr(err.msg, pw_frame_kind_name(cases[i].kind)) && !strstr(err.msg, "chunk"))
      fail_msg("case %zu: the error does not name the kind: %s", i, err.msg);
  }
  assert_string_equal(pw_frame_kind_name(PW_FRAME_SEQS), "SEQS");
  assert_string_equal(pw_frame_kind_name(PW_FRAME_TOKENS), "TOKENS");
}

static void test_hello(void **state) {
  pw_frame_hdr h, d;
  uint8_t *p;
  assert_int_equal(pw_frame_hello_make(42, 7, 3, "s3cr\"et", &h, &p), 0);
  assert_int_equal(h.kind, PW_FRAME_HELLO);
  assert_int_equal(h.dtype, PW_DTYPE_U8);
  assert_int_equal(h.payload_len, strlen((char *)p));
  uint8_t b[PW_FRAME_HDR_SIZE];
  pw_frame_hdr_encode(&h, p, b);
  pw_err err = {0};
  assert_int_equal(pw_frame_hdr_decode(b, 1 << 20, &d, &err), 0);
  uint64_t job;
  uint32_t rank, run;
  char tok[300];
  assert_int_equal(pw_frame_hello_parse(p, (size_t)h.payload_len, &job, &run, &rank, tok, sizeof tok, &err), 0);
  assert_true(job == 42);
  assert_int_equal(run, 7);
  assert_int_equal(rank, 3);
  assert_string_equal(tok, "s3cr\"et");
  free(p);
  assert_int_equal(pw_frame_hello_make(1, 1, 0, NULL, &h, &p), 0); /* empty token */
  assert_int_equal(pw_frame_hello_parse(p, (size_t)h.payload_len, &job, &run, &rank, tok, sizeof tok, &err), 0);
  assert_string_equal(tok, "");
  free(p);
  char longtok[300];
  memset(longtok, 'a', 257);
  longtok[257] = 0;
  assert_int_equal(pw_frame_hello_make(1, 1, 0, longtok, &h, &p), PW_EINVAL);
  assert_null(p);

  static const struct { const char *json, *msg; } bad[] = {
      {"{\"job\":1,\"run\":1,\"rank\":0", "hello: invalid JSON"},
      {"[1]", "hello: must be a JSON object"},
      {"{\"rank\":0,\"token\":\"\"}", "hello.job: must be an integer >= 0"},
      {"{\"job\":1,\"rank\":0,\"token\":\"\"}", "hello.run: must be an integer >= 0"},
      {"{\"job\":1,\"run\":-2,\"rank\":0,\"token\":\"\"}", "hello.run"},
      {"{\"job\":-1,\"run\":1,\"rank\":0,\"token\":\"\"}", "hello.job"},
      {"{\"job\":1,\"run\":1,\"rank\":\"0\",\"token\":\"\"}", "hello.rank"},
      {"{\"job\":1,\"run\":1,\"rank\":4294967296,\"token\":\"\"}", "hello.rank"},
      {"{\"job\":1,\"run\":1,\"rank\":0}", "hello.token: must be a string"},
      {"{\"job\":1,\"run\":1,\"rank\":0,\"token\":5}", "hello.token: must be a string"},
      {"{\"job\":1,\"run\":1,\"rank\":0,\"token\":\"a\",\"token\":\"b\"}", "hello: invalid JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    memset(&err, 0, sizeof err);
    assert_true(pw_frame_hello_parse(bad[i].json, strlen(bad[i].json), &job, &run, &rank, tok, sizeof tok, &err) < 0);
    expect_err(&err, bad[i].msg);
  }
  /* token longer than the caller's buffer */
  const char *j = "{\"job\":1,\"run\":1,\"rank\":0,\"token\":\"abcdefgh\"}";
  assert_int_equal(pw_frame_hello_parse(j, strlen(j), &job, &run, &rank, tok, 8, &err), PW_EPROTO);
  expect_err(&err, "hello.token: is too long");
}

/* ---- streams ----------------------------------------------------------------- */

typedef struct {
  pw_frame_hdr hdr;
  uint8_t *payload;
  size_t len;
} tframe;

typedef struct {
  tframe *f;
  int n, cap;
  int headers;         /* HEADER events seen */
  uint8_t *dest;       /* if set, every payload goes here (zero-copy test) */
  size_t dest_cap;
} sink;

static void sink_free(sink *s) {
  for (int i = 0; i < s->n; i++) free(s->f[i].payload);
  free(s->f);
  memset(s, 0, sizeof *s);
}

/* The reader's callback: records frames and checks that every frame it
 * hands out re-encodes to the exact header bytes it arrived as. */
static int on_event(void *ctx, pw_frame_reader *r, const pw_frame_event *ev) {
  sink *s = ctx;
  if (ev->type == PW_FRAME_HEADER) {
    s->headers++;
    assert_null(ev->payload);
    if (s->dest) {
      assert_true(ev->hdr.payload_len <= s->dest_cap);
      assert_int_equal(pw_frame_reader_set_dest(r, s->dest), 0);
    }
    return 0;
  }
  assert_int_equal(ev->type, PW_FRAME_DONE);
  assert_int_equal(ev->len, ev->hdr.payload_len);
  if (s->dest && ev->len) assert_ptr_equal(ev->payload, s->dest);
  if (r->hdr.flags & PW_FRAME_FLAG_CHUNK) { /* reassembled (a fuzzed header can be a valid chunk) */
    assert_true(ev->hdr.flags == 0 && ev->hdr.chunk == 0 && ev->hdr.kind == r->hdr.kind);
  } else {
    uint8_t b[PW_FRAME_HDR_SIZE];
    pw_frame_hdr_encode(&ev->hdr, ev->payload, b);
    assert_memory_equal(b, r->hdr_buf, PW_FRAME_HDR_SIZE);
  }
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 16;
    s->f = realloc(s->f, (size_t)s->cap * sizeof *s->f);
  }
  tframe *t = &s->f[s->n++];
  t->hdr = ev->hdr;
  t->len = ev->len;
  t->payload = malloc(ev->len + 1);
  if (ev->len) memcpy(t->payload, ev->payload, ev->len);
  return 0;
}

/* A random valid frame appended to a growing stream buffer. */
static void add_frame(uint8_t **buf, size_t *len, size_t *cap, tframe *out, size_t max_bytes) {
  pw_frame_hdr h;
  uint8_t *payload = NULL;
  int kind = 1 + (int)below(7);
  if (kind == PW_FRAME_HELLO) {
    char tok[40];
    snprintf(tok, sizeof tok, "tok%u", (unsigned)below(1000));
    assert_int_equal(pw_frame_hello_make(below(100), (uint32_t)below(5), (uint32_t)below(8), tok, &h, &payload), 0);
  } else {
    uint32_t dims[4] = {0};
    int dtype = (int)below(3), ndim = kind == PW_FRAME_BYE ? 1 : (int)below(5);
    if (kind == PW_FRAME_BYE) dtype = PW_DTYPE_U8;
    size_t n = pw_frame_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
      dims[i] = kind == PW_FRAME_BYE ? 0 : (uint32_t)below(7);
      if (n * (dims[i] ? dims[i] : 1) > max_bytes) dims[i] = 1;
      n *= dims[i];
    }
    assert_int_equal(pw_frame_hdr_init(&h, kind, rnd() & PW_FRAME_MAX_JOB, (uint32_t)rnd(), (uint32_t)below(64),
                                       (uint32_t)below(8), (uint32_t)below(1000), dtype, ndim, dims), 0);
    payload = malloc(h.payload_len + 1);
    for (size_t i = 0; i < h.payload_len; i++) payload[i] = (uint8_t)rnd();
  }
  size_t need = PW_FRAME_HDR_SIZE + (size_t)h.payload_len;
  if (*len + need > *cap) {
    *cap = 2 * (*len + need);
    *buf = realloc(*buf, *cap);
  }
  pw_frame_hdr_encode(&h, payload, *buf + *len);
  if (h.payload_len) memcpy(*buf + *len + PW_FRAME_HDR_SIZE, payload, (size_t)h.payload_len);
  *len += need;
  if (out) {
    out->hdr = h;
    out->payload = payload;
    out->len = (size_t)h.payload_len;
  } else {
    free(payload);
  }
}

static void assert_same_frames(const tframe *want, int nwant, const sink *got) {
  assert_int_equal(got->n, nwant);
  for (int i = 0; i < nwant; i++) {
    const pw_frame_hdr *a = &want[i].hdr, *b = &got->f[i].hdr;
    assert_int_equal(a->kind, b->kind);
    assert_true(a->job == b->job);
    assert_int_equal(a->step, b->step);
    assert_int_equal(a->microbatch, b->microbatch);
    assert_int_equal(a->stage, b->stage);
    assert_int_equal(a->value, b->value);
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->ndim, b->ndim);
    assert_int_equal(a->flags, b->flags);
    assert_memory_equal(a->dims, b->dims, sizeof a->dims);
    assert_int_equal(want[i].len, got->f[i].len);
    if (want[i].len) assert_memory_equal(want[i].payload, got->f[i].payload, want[i].len);
  }
}

/* Feeds through next_buf/advance, each "read" delivering a random part of
 * the region offered, as a socket would. Returns frames or an error. */
static int feed_partial(pw_frame_reader *r, const uint8_t *data, size_t n, sink *s, pw_err *err) {
  size_t off = 0;
  int frames = 0;
  while (off < n) {
    void *dst;
    size_t room;
    pw_frame_reader_next_buf(r, &dst, &room);
    if (!room) {
      pw_frame_event ev;
      return pw_frame_reader_advance(r, 0, &ev, err);
    }
    size_t k = 1 + below(room < n - off ? room : n - off);
    memcpy(dst, data + off, k);
    off += k;
    pw_frame_event ev;
    int rc = pw_frame_reader_advance(r, k, &ev, err);
    if (rc < 0) return rc;
    if (rc == PW_FRAME_DONE) frames++;
    if (rc > 0) on_event(s, r, &ev);
  }
  return frames;
}

#define NFRAMES 60

static void test_reader_chunkings(void **state) {
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  tframe want[NFRAMES];
  for (int i = 0; i < NFRAMES; i++) add_frame(&buf, &len, &cap, &want[i], 4096);
  pw_err err = {0};
  for (int mode = 0; mode < 4; mode++) {
    pw_frame_reader r;
    pw_frame_reader_init(&r, 1 << 20);
    sink s = {0};
    int total = 0;
    if (mode == 0) { /* all at once */
      total = pw_frame_reader_feed(&r, buf, len, on_event, &s, &err);
    } else if (mode == 1) { /* byte by byte */
      for (size_t i = 0; i < len; i++) {
        int rc = pw_frame_reader_feed(&r, buf + i, 1, on_event, &s, &err);
        assert_true(rc >= 0);
        total += rc;
      }
    } else if (mode == 2) { /* random chunks */
      for (size_t i = 0; i < len;) {
        size_t k = 1 + below(200);
        if (k > len - i) k = len - i;
        int rc = pw_frame_reader_feed(&r, buf + i, k, on_event, &s, &err);
        assert_true(rc >= 0);
        total += rc;
        i += k;
      }
    } else { /* partial reads into next_buf */
      total = feed_partial(&r, buf, len, &s, &err);
    }
    assert_int_equal(total, NFRAMES);
    assert_same_frames(want, NFRAMES, &s);
    int nonempty = 0;
    for (int i = 0; i < NFRAMES; i++) nonempty += want[i].len > 0;
    assert_int_equal(s.headers, nonempty); /* empty payloads complete at once */
    assert_int_equal(r.state, PW_FR_HEADER);
    assert_true(r.frames == NFRAMES);
    sink_free(&s);
    pw_frame_reader_free(&r);
  }
  for (int i = 0; i < NFRAMES; i++) free(want[i].payload);
  free(buf);
}

/* missing(): what the reader still needs before its next event, through
 * every state, with and without a destination, and 0 once dead. */
static void test_reader_missing(void **state) {
  uint32_t d = 100;
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 2, 3, 4, 5, PW_DTYPE_F32, 1, &d), 0);
  float pay[100];
  for (int i = 0; i < 100; i++) pay[i] = (float)i;
  uint8_t hb[PW_FRAME_HDR_SIZE];
  pw_frame_hdr_encode(&h, pay, hb);
  float mine[100];
  pw_frame_reader r;
  pw_frame_reader_init(&r, 4096);
  pw_err err = {0};
  pw_frame_event ev;
  void *p;
  size_t room;
  for (int with_dest = 0; with_dest < 2; with_dest++) {
    assert_int_equal(pw_frame_reader_missing(&r), PW_FRAME_HDR_SIZE);
    pw_frame_reader_next_buf(&r, &p, &room);
    memcpy(p, hb, 10);
    assert_int_equal(pw_frame_reader_advance(&r, 10, &ev, &err), PW_FRAME_NEED_MORE);
    assert_int_equal(pw_frame_reader_missing(&r), PW_FRAME_HDR_SIZE - 10);
    pw_frame_reader_next_buf(&r, &p, &room);
    memcpy(p, hb + 10, room);
    assert_int_equal(pw_frame_reader_advance(&r, room, &ev, &err), PW_FRAME_HEADER);
    assert_int_equal(pw_frame_reader_missing(&r), 400); /* before next_buf too */
    if (with_dest) assert_int_equal(pw_frame_reader_set_dest(&r, mine), 0);
    size_t got = 0;
    while (got < 400) {
      pw_frame_reader_next_buf(&r, &p, &room);
      size_t k = room < 150 ? room : 150;
      memcpy(p, (uint8_t *)pay + got, k);
      got += k;
      int rc = pw_frame_reader_advance(&r, k, &ev, &err);
      assert_int_equal(rc, got < 400 ? PW_FRAME_NEED_MORE : PW_FRAME_DONE);
      assert_int_equal(pw_frame_reader_missing(&r), got < 400 ? 400 - got : PW_FRAME_HDR_SIZE);
    }
    assert_memory_equal(ev.payload, pay, 400);
  }
  /* An empty payload completes with the header: a new header is missing. */
  uint32_t zero = 0;
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_BYE, 1, 0, 0, 0, 0, PW_DTYPE_U8, 1, &zero), 0);
  pw_frame_hdr_encode(&h, NULL, hb);
  assert_int_equal(pw_frame_reader_feed(&r, hb, sizeof hb, NULL, NULL, &err), 1);
  assert_int_equal(pw_frame_reader_missing(&r), PW_FRAME_HDR_SIZE);
  /* Dead: nothing more is wanted. */
  hb[0] ^= 1;
  assert_true(pw_frame_reader_feed(&r, hb, sizeof hb, NULL, NULL, &err) < 0);
  assert_int_equal(pw_frame_reader_missing(&r), 0);
  pw_frame_reader_free(&r);
}

static void test_reader_zero_copy(void **state) {
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  tframe want[20];
  for (int i = 0; i < 20; i++) add_frame(&buf, &len, &cap, &want[i], 4096);
  uint8_t slot[4096];
  sink s = {0};
  s.dest = slot;
  s.dest_cap = sizeof slot;
  pw_frame_reader r;
  pw_frame_reader_init(&r, 4096);
  pw_err err = {0};
  assert_int_equal(feed_partial(&r, buf, len, &s, &err), 20);
  assert_same_frames(want, 20, &s);
  assert_null(r.buf); /* the internal buffer was never needed */
  assert_int_equal(r.buf_cap, 0);
  sink_free(&s);

  /* set_dest only right after a header */
  assert_int_equal(pw_frame_reader_set_dest(&r, slot), PW_EINVAL);
  uint32_t d = 8;
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_GRAD, 1, 2, 3, 4, 5, PW_DTYPE_F32, 1, &d), 0);
  float pay[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint8_t hb[PW_FRAME_HDR_SIZE];
  pw_frame_hdr_encode(&h, pay, hb);
  void *p;
  size_t room;
  pw_frame_event ev;
  pw_frame_reader_next_buf(&r, &p, &room);
  assert_int_equal(room, PW_FRAME_HDR_SIZE);
  memcpy(p, hb, room);
  assert_int_equal(pw_frame_reader_advance(&r, room, &ev, &err), PW_FRAME_HEADER);
  assert_int_equal(ev.hdr.payload_len, 32);
  float mine[8] = {0};
  assert_int_equal(pw_frame_reader_set_dest(&r, mine), 0);
  pw_frame_reader_next_buf(&r, &p, &room);
  assert_ptr_equal(p, mine);
  assert_int_equal(room, 32);
  assert_int_equal(pw_frame_reader_set_dest(&r, slot), PW_EINVAL); /* too late */
  memcpy(p, pay, 32);
  assert_int_equal(pw_frame_reader_advance(&r, 20, &ev, &err), PW_FRAME_NEED_MORE);
  pw_frame_reader_next_buf(&r, &p, &room);
  assert_ptr_equal(p, (uint8_t *)mine + 20);
  assert_int_equal(room, 12);
  assert_int_equal(pw_frame_reader_advance(&r, 13, &ev, &err), PW_EINVAL); /* past the region */
  assert_int_equal(pw_frame_reader_advance(&r, 12, &ev, &err), PW_FRAME_DONE);
  assert_ptr_equal(ev.payload, mine);
  assert_memory_equal(mine, pay, 32);
  pw_frame_reader_free(&r);
  for (int i = 0; i < 20; i++) free(want[i].payload);
  free(buf);
}

static void test_reader_truncated(void **state) {
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  size_t ends[8];
  for (int i = 0; i < 8; i++) {
    add_frame(&buf, &len, &cap, NULL, 300);
    ends[i] = len;
  }
  pw_err err = {0};
  for (size_t cut = 0; cut <= len; cut++) {
    pw_frame_reader r;
    pw_frame_reader_init(&r, 4096);
    int rc = pw_frame_reader_feed(&r, buf, cut, NULL, NULL, &err);
    int complete = 0;
    while (complete < 8 && ends[complete] <= cut) complete++;
    assert_int_equal(rc, complete); /* never an error, just fewer frames */
    assert_int_equal(pw_frame_reader_idle(&r), cut == 0 || ends[complete ? complete - 1 : 0] == cut);
    /* the rest completes the stream */
    rc = pw_frame_reader_feed(&r, buf + cut, len - cut, NULL, NULL, &err);
    assert_int_equal(rc, 8 - complete);
    pw_frame_reader_free(&r);
  }
  free(buf);
}

static void test_reader_errors(void **state) {
  uint32_t d = 16;
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 1, 2, PW_DTYPE_F32, 1, &d), 0);
  uint8_t frame[PW_FRAME_HDR_SIZE + 64];
  for (int i = 0; i < 64; i++) frame[PW_FRAME_HDR_SIZE + i] = (uint8_t)i;
  pw_frame_hdr_encode(&h, frame + PW_FRAME_HDR_SIZE, frame);
  pw_err err = {0};

  /* payload corrupted: the frame is refused at its end, the stream is dead */
  frame[PW_FRAME_HDR_SIZE + 10] ^= 4;
  pw_frame_reader r;
  pw_frame_reader_init(&r, 4096);
  assert_int_equal(pw_frame_reader_feed(&r, frame, sizeof frame, NULL, NULL, &err), PW_EPROTO);
  expect_err(&err, "payload_crc");
  expect_err(&err, "ACT job 1");
  void *p;
  size_t room;
  pw_frame_reader_next_buf(&r, &p, &room);
  assert_int_equal(room, 0);
  assert_null(p);
  pw_frame_event ev;
  assert_int_equal(pw_frame_reader_advance(&r, 0, &ev, &err), PW_EPROTO);
  frame[PW_FRAME_HDR_SIZE + 10] ^= 4;
  assert_int_equal(pw_frame_reader_feed(&r, frame, sizeof frame, NULL, NULL, &err), PW_EPROTO);
  pw_frame_reader_free(&r);

  /* over max_payload: refused at the header, before any allocation */
  pw_frame_reader_init(&r, 63);
  assert_int_equal(pw_frame_reader_feed(&r, frame, sizeof frame, NULL, NULL, &err), PW_ETOOBIG);
  expect_err(&err, "payload_len 64 is over the limit 63");
  assert_int_equal(r.buf_cap, 0);
  pw_frame_reader_free(&r);

  /* a lying header (1 MiB promised, 100 bytes sent) costs at most the first
   * growth step, not the promised size */
  uint32_t big = 1 << 18;
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 1, 2, PW_DTYPE_F32, 1, &big), 0);
  pw_frame_hdr_encode_crc(&h, 0, frame);
  pw_frame_reader_init(&r, 1 << 20);
  assert_int_equal(pw_frame_reader_feed(&r, frame, sizeof frame, NULL, NULL, &err), 0);
  assert_true(r.buf_cap <= 64 * 1024);
  pw_frame_reader_set_max(&r, 1000); /* mid-frame: the buffer is kept */
  assert_true(r.buf_cap > 0);
  pw_frame_reader_free(&r);

  /* set_max between frames frees a buffer over the new bound */
  pw_frame_reader_init(&r, 1 << 20);
  uint8_t *sbuf = NULL;
  size_t slen = 0, scap = 0;
  d = 1000;
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 1, 2, PW_DTYPE_F32, 1, &d), 0);
  slen = PW_FRAME_HDR_SIZE + 4000;
  scap = slen;
  sbuf = calloc(1, scap);
  pw_frame_hdr_encode(&h, sbuf + PW_FRAME_HDR_SIZE, sbuf);
  assert_int_equal(pw_frame_reader_feed(&r, sbuf, slen, NULL, NULL, &err), 1);
  assert_int_equal(r.buf_cap, 4000);
  pw_frame_reader_set_max(&r, 100);
  assert_int_equal(r.buf_cap, 0);
  assert_int_equal(pw_frame_reader_feed(&r, sbuf, slen, NULL, NULL, &err), PW_ETOOBIG);
  free(sbuf);
  pw_frame_reader_free(&r);

  /* advance past the header buffer is misuse, not a frame error */
  pw_frame_reader_init(&r, 100);
  assert_int_equal(pw_frame_reader_advance(&r, 65, &ev, &err), PW_EINVAL);
  assert_int_equal(pw_frame_reader_advance(&r, 10, &ev, &err), 0);
  pw_frame_reader_free(&r);
}

/* A payload larger than the first growth step: the internal buffer grows
 * while the bytes arrive, the CRC spans the reallocations. */
static void test_reader_large(void **state) {
  uint32_t dims[2] = {300, 257}; /* 308400 bytes of f32 */
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_DP, 5, 1, 0, 2, 3, PW_DTYPE_F32, 2, dims), 0);
  size_t n = (size_t)h.payload_len, len = 2 * (PW_FRAME_HDR_SIZE + n);
  uint8_t *buf = malloc(len);
  for (size_t i = 0; i < n; i++) buf[PW_FRAME_HDR_SIZE + i] = (uint8_t)rnd();
  pw_frame_hdr_encode(&h, buf + PW_FRAME_HDR_SIZE, buf);
  memcpy(buf + PW_FRAME_HDR_SIZE + n, buf, PW_FRAME_HDR_SIZE + n); /* the same frame twice */
  tframe want[2] = {{h, buf + PW_FRAME_HDR_SIZE, n}, {h, buf + PW_FRAME_HDR_SIZE, n}};
  for (int mode = 0; mode < 2; mode++) {
    pw_frame_reader r;
    pw_frame_reader_init(&r, n);
    sink s = {0};
    pw_err err = {0};
    int rc = mode ? feed_partial(&r, buf, len, &s, &err)
                  : pw_frame_reader_feed(&r, buf, len, on_event, &s, &err);
    assert_int_equal(rc, 2);
    assert_same_frames(want, 2, &s);
    assert_int_equal(r.buf_cap, n); /* grown to exactly the payload, no more */
    sink_free(&s);
    pw_frame_reader_free(&r);
  }
  free(buf);
}

/* ---- fuzz ---------------------------------------------------------------------- */

#define FUZZ_MAX 2048

static int fuzz_one(const uint8_t *data, size_t n, int partial) {
  pw_frame_reader r;
  pw_frame_reader_init(&r, FUZZ_MAX);
  sink s = {0};
  pw_err err = {0};
  int rc;
  if (partial) {
    rc = feed_partial(&r, data, n, &s, &err);
  } else {
    rc = 0;
    for (size_t i = 0; i < n;) {
      size_t k = 1 + below(97);
      if (k > n - i) k = n - i;
      int x = pw_frame_reader_feed(&r, data + i, k, on_event, &s, &err);
      assert_true(r.buf_cap <= FUZZ_MAX);
      if (x < 0) {
        rc = x;
        break;
      }
      rc += x;
      i += k;
    }
  }
  assert_true(r.buf_cap <= FUZZ_MAX);
  if (rc < 0) {
    if (rc != PW_EPROTO && rc != PW_EFORMAT && rc != PW_ETOOBIG)
      fail_msg("unexpected error %s", pw_err_name(rc));
    assert_true(err.msg[0] != 0);
    assert_int_equal(r.state, PW_FR_DEAD);
  } else {
    assert_int_equal(rc, s.n);
  }
  sink_free(&s);
  pw_frame_reader_free(&r);
  return rc;
}

static void test_fuzz_random(void **state) {
  uint8_t b[400];
  int errors = 0;
  for (int it = 0; it < 20000; it++) {
    size_t n = below(sizeof b);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rnd();
    /* a plausible start reaches deeper checks */
    if (it % 2 && n >= 8) memcpy(b, "PWF1\x02\x00", 6);
    if (it % 4 == 3 && n >= PW_FRAME_HDR_SIZE) {
      b[33] = (uint8_t)below(6);
      refresh_hdr_crc(b);
    }
    errors += fuzz_one(b, n, it % 3 == 0) < 0;
  }
  assert_true(errors > 10000); /* random bytes are (almost) never frames */
}

static void test_fuzz_mutations(void **state) {
  int ok = 0, bad = 0;
  for (int it = 0; it < 12000; it++) {
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    size_t starts[5];
    int nf = 1 + (int)below(4);
    for (int i = 0; i < nf; i++) {
      starts[i] = len;
      add_frame(&buf, &len, &cap, NULL, 600);
    }
    buf = realloc(buf, len + 64);
    uint8_t *f = buf + starts[below((size_t)nf)]; /* a header to lie in */
    int mut = (int)below(8);
    switch (mut) {
      case 0: /* bit flips */
        for (int k = 1 + (int)below(8); k > 0; k--) buf[below(len)] ^= (uint8_t)(1u << below(8));
        break;
      case 1: /* truncation */
        len = below(len);
        break;
      case 2: /* payload_len lie, header CRC fixed */
        put32(f + 52, (uint32_t)(below(2) ? rnd() : get32(f + 52) + below(9) - 4));
        refresh_hdr_crc(f);
        break;
      case 3: /* huge dims with matching length, CRC fixed */
        put32(f + 36, (uint32_t)rnd());
        put32(f + 52, get32(f + 36) * 4);
        f[32] = PW_DTYPE_F32;
        f[33] = 1;
        memset(f + 40, 0, 12);
        refresh_hdr_crc(f);
        break;
      case 4: /* random header field byte, CRC fixed */
        f[below(60)] = (uint8_t)rnd();
        refresh_hdr_crc(f);
        break;
      case 5: /* delete a byte */
        if (len) {
          size_t at = below(len);
          memmove(buf + at, buf + at + 1, len - at - 1);
          len--;
        }
        break;
      case 6: /* insert garbage */
        {
          size_t at = below(len + 1), k = 1 + below(32);
          memmove(buf + at + k, buf + at, len - at);
          for (size_t i = 0; i < k; i++) buf[at + i] = (uint8_t)rnd();
          len += k;
        }
        break;
      default: /* payload byte changed, header intact: payload CRC must catch */
        if (len > starts[0] + PW_FRAME_HDR_SIZE && get32(buf + 52) > 0)
          buf[PW_FRAME_HDR_SIZE + below(get32(buf + 52))] ^= (uint8_t)(1 + below(255));
        break;
    }
    int rc = fuzz_one(buf, len, it & 1);
    if (mut == 7 && get32(buf + 52) > 0) assert_int_equal(rc, PW_EPROTO);
    if (rc < 0) bad++; else ok++;
    free(buf);
  }
  assert_true(ok > 100 && bad > 1000); /* both outcomes exercised */
}

int main(void) {
  const char *seed = getenv("PW_FUZZ_SEED");
  if (seed) g_rng = strtoull(seed, NULL, 0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hdr_layout),
      cmocka_unit_test(test_hdr_init),
      cmocka_unit_test(test_hdr_corrupt_each_field),
      cmocka_unit_test(test_hello),
      cmocka_unit_test(test_serve_kinds),
      cmocka_unit_test(test_reader_chunkings),
      cmocka_unit_test(test_reader_zero_copy),
      cmocka_unit_test(test_reader_missing),
      cmocka_unit_test(test_reader_truncated),
      cmocka_unit_test(test_reader_errors),
      cmocka_unit_test(test_reader_large),
      cmocka_unit_test(test_fuzz_random),
      cmocka_unit_test(test_fuzz_mutations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
