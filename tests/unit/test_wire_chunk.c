/* test_wire_chunk: tensors over the chunk limit, sent as consecutive chunk
 * frames (pw_frame_chunk, as worker/exec.c sends them) over a real socket
 * pair and put back together by the stream reader straight into a
 * destination (as worker/recv.c reads), byte-exact; and every chunk that
 * does not fit — out of order, overflowing, a wrong LAST, another frame in
 * between — refused with a reason, the link closed, nothing written past
 * the destination. The limit is lowered so that small buffers take the path
 * a >4 GiB tensor takes; the headers of a real >4 GiB tensor are checked
 * without its bytes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "crc32c.h"
#include "wire.h"

static void expect_err(const pw_err *err, const char *want) {
  char buf[600];
  pw_err_str(err, buf, sizeof buf);
  if (!strstr(buf, want)) fail_msg("error '%s' does not contain '%s'", buf, want);
}

static uint8_t *pattern(size_t n, unsigned seed) {
  uint8_t *p = malloc(n ? n : 1);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (uint8_t)(x >> 24);
  }
  return p;
}

/* ---- the sender: a list of frames, written by a thread ------------------- */

typedef struct {
  pw_frame_hdr h;          /* encoded as is (its CRC computed over payload) */
  const uint8_t *payload;
} wframe;

typedef struct {
  wframe f[256];
  int n;
} wlist;

/* Appends tensor h as exec.c sends it: one frame when it fits the limit,
 * else its chunks in order. Returns the frames added. */
static int add_tensor(wlist *w, const pw_frame_hdr *h, const uint8_t *payload, size_t limit) {
  if (h->payload_len <= limit) {
    w->f[w->n++] = (wframe){*h, payload};
    return 1;
  }
  int k = 0;
  pw_frame_hdr c;
  for (uint64_t off = 0; off < h->payload_len; off += c.payload_len, k++) {
    assert_int_equal(pw_frame_chunk(h, limit, off, &c), 0);
    assert_true(w->n < 256);
    w->f[w->n++] = (wframe){c, payload + off};
  }
  return k;
}

typedef struct {
  int fd;
  const wlist *w;
  int err;                 /* errno of a failed write (the peer closed), else 0 */
} sender;

static void *send_main(void *arg) {
  sender *s = arg;
  for (int i = 0; i < s->w->n && !s->err; i++) {
    const wframe *f = &s->w->f[i];
    uint8_t hdr[PW_FRAME_HDR_SIZE];
    pw_frame_hdr_encode(&f->h, f->payload, hdr);
    struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)f->payload, (size_t)f->h.payload_len}};
    size_t total = sizeof hdr + (size_t)f->h.payload_len, done = 0;
    while (done < total) {
      struct iovec v[2];
      int nv = 0;
      size_t skip = done;
      for (int k = 0; k < 2; k++) {
        if (skip >= iov[k].iov_len) {
          skip -= iov[k].iov_len;
          continue;
        }
        v[nv++] = (struct iovec){(uint8_t *)iov[k].iov_base + skip, iov[k].iov_len - skip};
        skip = 0;
      }
      struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)nv};
      ssize_t n = sendmsg(s->fd, &mh, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        s->err = errno ? errno : EPIPE;
        break;
      }
      done += (size_t)n;
    }
  }
  shutdown(s->fd, SHUT_WR);
  return NULL;
}

/* ---- the receiver: recv.c's loop, each payload into its destination ------ */

typedef struct {
  uint8_t *dest;           /* NULL: the reader's own buffer */
  size_t dest_cap;
  pw_frame_hdr hdr[32];    /* DONE events: the tensors' headers */
  uint8_t *got[32];        /* and copies of their payloads */
  int n, headers;
  int chunked[32];         /* the last frame of that tensor was a chunk */
  int rc;                  /* the reader's error, or 0 */
  pw_err err;
  size_t max_buf;          /* largest the reader's buffer grew */
} receiver;

static void recv_free(receiver *r) {
  for (int i = 0; i < r->n; i++) free(r->got[i]);
}

/* Runs the frames of w through a socket pair into rc. Reads in pieces of
 * at most `piece` bytes, so chunk and frame boundaries fall anywhere. */
static void run_link(const wlist *w, receiver *rc, size_t piece) {
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  sender s = {.fd = sv[0], .w = w};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, send_main, &s), 0);
  pw_frame_reader rd;
  pw_frame_reader_init(&rd, (size_t)1 << 20);
  for (;;) {
    void *buf;
    size_t len;
    pw_frame_reader_next_buf(&rd, &buf, &len);
    if (len > piece) len = piece;
    ssize_t n = len ? recv(sv[1], buf, len, 0) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) { /* EOF: only at a frame boundary is it orderly */
      if (n == 0 && !pw_frame_reader_idle(&rd)) rc->rc = pw_err_set(&rc->err, PW_EPROTO, "link", "truncated");
      if (len == 0) {
        pw_frame_event ev;
        rc->rc = pw_frame_reader_advance(&rd, 0, &ev, &rc->err);
      }
      break;
    }
    pw_frame_event ev;
    int r = pw_frame_reader_advance(&rd, (size_t)n, &ev, &rc->err);
    if (rd.buf_cap > rc->max_buf) rc->max_buf = rd.buf_cap;
    if (r < 0) {
      rc->rc = r;
      break;
    }
    if (r == PW_FRAME_HEADER) {
      rc->headers++;
      assert_int_equal(ev.hdr.flags, 0); /* a transfer looks like one frame */
      assert_int_equal(ev.hdr.chunk, 0);
      if (rc->dest) {
        assert_true(ev.hdr.payload_len <= rc->dest_cap); /* as run.c's frame_dest checks */
        assert_int_equal(pw_frame_reader_set_dest(&rd, rc->dest), 0);
      }
    } else if (r == PW_FRAME_DONE) {
      assert_true(rc->n < 32);
      assert_int_equal(ev.len, ev.hdr.payload_len);
      if (rc->dest && ev.len) assert_ptr_equal(ev.payload, rc->dest);
      rc->hdr[rc->n] = ev.hdr;
      rc->chunked[rc->n] = (rd.hdr.flags & PW_FRAME_FLAG_CHUNK) != 0;
      rc->got[rc->n] = malloc(ev.len + 1);
      if (ev.len) memcpy(rc->got[rc->n], ev.payload, ev.len);
      rc->n++;
    }
  }
  close(sv[1]); /* the link closes: a sender still writing gets EPIPE, no crash */
  pthread_join(t, NULL);
  close(sv[0]);
  pw_frame_reader_free(&rd);
}

static pw_frame_hdr tensor(int kind, uint32_t step, uint32_t value, int dtype, uint32_t n) {
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init_vec(&h, kind, 7, step, 1, 2, value, dtype, n), 0);
  return h;
}

/* ---- headers ------------------------------------------------------------------ */

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Sizes past one frame's u32 make valid tensors; 64-bit overflow, a job
 * over 32 bits and a vector over 2^32 elements do not. */
static void test_hdr_sizes(void **state) {
  pw_frame_hdr h;
  uint32_t big[3] = {65536, 65536, 2}, d1 = 4;
  uint32_t huge[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 0, 0, PW_DTYPE_U8, 3, big), 0);
  assert_true(h.payload_len == 1ull << 33);
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 0, 0, PW_DTYPE_F32, 4, huge), PW_ETOOBIG);
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, PW_FRAME_MAX_JOB, 0, 0, 0, 0, PW_DTYPE_F32, 1, &d1), 0);
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, PW_FRAME_MAX_JOB + 1ull, 0, 0, 0, 0, PW_DTYPE_F32, 1, &d1),
                   PW_EINVAL); /* the wire has 32 bits of job */
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TIED, 7, 1, 2, 3, 4, PW_DTYPE_F32, 0xffffffffu), 0);
  assert_int_equal(h.ndim, 1);
  assert_int_equal(h.dims[0], 0xffffffffu);
  assert_true(h.payload_len == 4ull * 0xffffffffu);
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TIED, 7, 1, 2, 3, 4, PW_DTYPE_F32, 0x100000000ull),
                   PW_ETOOBIG); /* not silently cut to 0 elements */

  /* A chunk header alone: its own rules, before any stream state. */
  static const struct {
    uint32_t len, d0;
    int kind, code;
    const char *msg;
  } bad[] = {
      {28, 6, PW_FRAME_ACT, PW_EFORMAT, "chunk 0: payload_len 28 is not in 1..24 (dims [6] of f32)"},
      {0, 6, PW_FRAME_ACT, PW_EFORMAT, "chunk 0: payload_len 0 is not in 1..24"},
      {100, 100, PW_FRAME_ACT, PW_ETOOBIG, "chunked tensor of 400 bytes is over the limit 256"},
      {4, 6, PW_FRAME_HELLO, PW_EPROTO, "kind HELLO cannot be chunked"},
      {4, 6, PW_FRAME_BYE, PW_EPROTO, "kind BYE cannot be chunked"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    uint32_t d = 6;
    assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 1, 0, 0, 0, 0, PW_DTYPE_F32, 1, &d), 0);
    h.flags = PW_FRAME_FLAG_CHUNK;
    uint8_t b[PW_FRAME_HDR_SIZE];
    pw_frame_hdr_encode_crc(&h, 0, b);
    b[6] = (uint8_t)bad[i].kind;
    put32(b + 36, bad[i].d0);
    put32(b + 52, bad[i].len);
    put32(b + 60, pw_crc32c(0, b, 60));
    pw_frame_hdr d_;
    pw_err err = {0};
    assert_int_equal(pw_frame_hdr_decode(b, 256, &d_, &err), bad[i].code);
    expect_err(&err, bad[i].msg);
  }
}

/* ---- chunk headers ------------------------------------------------------------ */

static void test_chunk_headers(void **state) {
  pw_frame_hdr h = tensor(PW_FRAME_DP, 3, 0, PW_DTYPE_U8, 10000), c;
  size_t lens[3] = {4096, 4096, 1808};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(pw_frame_chunk(&h, 4096, (uint64_t)i * 4096, &c), 0);
    assert_int_equal(c.chunk, i);
    assert_int_equal(c.payload_len, lens[i]);
    assert_int_equal(c.flags, PW_FRAME_FLAG_CHUNK | (i == 2 ? PW_FRAME_FLAG_LAST : 0));
    assert_int_equal(c.step, 3);
    assert_int_equal(c.dims[0], 10000); /* the whole tensor's */
  }
  assert_int_equal(pw_frame_chunk(&h, 4096, 100, &c), PW_EINVAL);   /* not a chunk start */
  assert_int_equal(pw_frame_chunk(&h, 4096, 12288, &c), PW_EINVAL); /* past the end */
  assert_int_equal(pw_frame_chunk(&h, 0, 0, &c), PW_EINVAL);
  assert_int_equal(pw_frame_chunk(&h, (size_t)PW_FRAME_MAX_PAYLOAD + 1, 0, &c), PW_EINVAL);
  assert_int_equal(pw_frame_chunk(&h, 4096, 0, &c), 0);
  assert_int_equal(pw_frame_chunk(&c, 4096, 0, &h), PW_EINVAL); /* a chunk is not chunked again */

  /* A tensor of 5 GiB + 4 bytes of f32 at a 1 GiB limit: 6 chunks, the
   * last of 4 bytes; chunk headers decode with the tensor's size. */
  const size_t gib = (size_t)1 << 30;
  uint32_t dims[2] = {0x50000001u, 4};
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_DP, 7, 1, 0, 2, 0, PW_DTYPE_U8, 2, dims), 0);
  assert_true(h.payload_len == 5ull * (1ull << 30) + 4);
  assert_true(h.payload_len > PW_FRAME_MAX_PAYLOAD);
  assert_int_equal(pw_frame_chunk(&h, gib, 5ull << 30, &c), 0);
  assert_int_equal(c.chunk, 5);
  assert_int_equal(c.payload_len, 4);
  assert_int_equal(c.flags, PW_FRAME_FLAG_CHUNK | PW_FRAME_FLAG_LAST);
  uint8_t b[PW_FRAME_HDR_SIZE], four[4] = {1, 2, 3, 4};
  pw_frame_hdr_encode(&c, four, b);
  pw_frame_hdr d;
  pw_err err = {0};
  assert_int_equal(pw_frame_hdr_decode(b, SIZE_MAX, &d, &err), 0);
  assert_int_equal(d.chunk, 5);
  assert_int_equal(d.payload_len, 4);
  assert_int_equal(pw_frame_hdr_decode(b, (size_t)4 << 30, &d, &err), PW_ETOOBIG);
  expect_err(&err, "chunked tensor of 5368709124 bytes is over the limit 4294967296");
  char s[200];
  assert_string_equal(pw_frame_hdr_str(&c, s, sizeof s), "DP job 7 step 1 mb 0 stage 2 value 0 u8 "
                                                       "[1342177281,4] 5368709124 bytes, chunk 5: 4 bytes, last");

  /* The reader announces the whole 5 GiB at chunk 0, before any payload. */
  assert_int_equal(pw_frame_chunk(&h, gib, 0, &c), 0);
  pw_frame_hdr_encode_crc(&c, 0, b);
  pw_frame_reader rd;
  pw_frame_reader_init(&rd, SIZE_MAX);
  pw_frame_event ev;
  void *p;
  size_t room;
  pw_frame_reader_next_buf(&rd, &p, &room);
  memcpy(p, b, room);
  assert_int_equal(pw_frame_reader_advance(&rd, room, &ev, &err), PW_FRAME_HEADER);
  assert_true(ev.hdr.payload_len == h.payload_len);
  assert_int_equal(pw_frame_reader_missing(&rd), gib); /* this chunk's bytes */
  assert_int_equal(pw_frame_reader_idle(&rd), 0);
  pw_frame_reader_free(&rd);

  /* More than 2^32 chunks cannot be numbered. */
  uint32_t big[2] = {0x80000000u, 4}; /* 2^33 bytes */
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_ACT, 7, 1, 0, 2, 0, PW_DTYPE_U8, 2, big), 0);
  assert_int_equal(pw_frame_chunk(&h, 1, 0, &c), PW_ETOOBIG);
  assert_int_equal(pw_frame_chunk(&h, 2, (1ull << 33) - 2, &c), 0); /* 2^32 chunks: the last is 2^32-1 */
  assert_int_equal(c.chunk, 0xffffffffu);
}

/* ---- through a socket pair ---------------------------------------------------- */

/* Tensors over the limit (odd sizes, a multiple of it, one byte over) between
 * frames under it: every one arrives byte-exact, as one event pair, chunks
 * having crossed the socket for exactly the ones over the limit. */
static void test_chunk_roundtrip(void **state) {
  const size_t limit = 4096;
  const uint32_t sizes[] = {100, 25001, 3 * 1024, 1024, 4097, 1, 50000};
  const int dtypes[] = {PW_DTYPE_F32, PW_DTYPE_F32, PW_DTYPE_I32, PW_DTYPE_F32, PW_DTYPE_U8, PW_DTYPE_F32, PW_DTYPE_U8};
  const int nt = (int)(sizeof sizes / sizeof *sizes);
  for (int mode = 0; mode < 3; mode++) {
    wlist w = {.n = 0};
    pw_frame_hdr want[8];
    uint8_t *pay[8];
    int frames = 0;
    for (int i = 0; i < nt; i++) {
      want[i] = tensor(i % 2 ? PW_FRAME_DP : PW_FRAME_ACT, (uint32_t)i, (uint32_t)(10 + i), dtypes[i], sizes[i]);
      pay[i] = pattern((size_t)want[i].payload_len, (unsigned)(i + 17 * mode));
      int k = add_tensor(&w, &want[i], pay[i], limit);
      assert_int_equal(k, (int)((want[i].payload_len + limit - 1) / limit));
      frames += k;
    }
    assert_true(frames > 2 * nt); /* most went in chunks */
    static uint8_t dest[200000];
    receiver rc = {0};
    if (mode < 2) { /* into a destination, as recv.c does */
      rc.dest = dest;
      rc.dest_cap = sizeof dest;
    }
    run_link(&w, &rc, mode == 1 ? 1000 : SIZE_MAX);
    assert_int_equal(rc.rc, 0);
    assert_int_equal(rc.n, nt);
    assert_int_equal(rc.headers, nt);
    for (int i = 0; i < nt; i++) {
      const pw_frame_hdr *g = &rc.hdr[i];
      assert_int_equal(g->kind, want[i].kind);
      assert_int_equal(g->step, want[i].step);
      assert_int_equal(g->value, want[i].value);
      assert_int_equal(g->dtype, want[i].dtype);
      assert_int_equal(g->dims[0], want[i].dims[0]);
      assert_true(g->payload_len == want[i].payload_len);
      assert_int_equal(g->flags, 0);
      assert_memory_equal(rc.got[i], pay[i], (size_t)want[i].payload_len);
      assert_int_equal(rc.chunked[i], want[i].payload_len > limit);
      free(pay[i]);
    }
    if (mode == 2) assert_int_equal(rc.max_buf, 100004); /* the own buffer: grown to the largest tensor, no more */
    recv_free(&rc);
  }
}

/* What a broken or hostile sender can do to a chunked transfer of a
 * 10000-byte tensor (chunks of 4096, 4096, 1808), each refused with its
 * reason; the destination is never written past its end. */
typedef struct {
  const char *what;
  const char *msg;
} bad_case;

static void make_bad(int c, wlist *w, const uint8_t *pay, const uint8_t *big) {
  pw_frame_hdr h = tensor(PW_FRAME_DP, 3, 0, PW_DTYPE_U8, 10000);
  w->n = 0;
  assert_int_equal(add_tensor(w, &h, pay, 4096), 3);
  wframe t;
  switch (c) {
    case 0: /* out of order */
      t = w->f[1], w->f[1] = w->f[2], w->f[2] = t;
      break;
    case 1: /* chunk 0 lost */
      w->f[0] = w->f[1], w->f[1] = w->f[2], w->n = 2;
      break;
    case 2: /* the last chunk claims more than is left (4096 > 1808) */
      w->f[2].h.payload_len = 4096;
      w->f[2].payload = big;
      break;
    case 3: /* the tensor ends on a chunk without LAST */
      w->f[2].h.flags = PW_FRAME_FLAG_CHUNK;
      break;
    case 4: /* LAST before the end */
      w->f[1].h.flags |= PW_FRAME_FLAG_LAST;
      break;
    case 5: { /* another tensor's frame in between */
      static uint8_t small[16];
      w->f[3] = w->f[2];
      w->f[2] = (wframe){tensor(PW_FRAME_ACT, 3, 1, PW_DTYPE_U8, 16), small};
      w->n = 4;
      break;
    }
    case 6: /* a chunk of the same step and value but another stage */
      w->f[1].h.stage = 9;
      break;
    case 7: /* a chunk index repeated */
      w->f[2] = w->f[1];
      break;
    default: /* the sender stops between chunks: EOF mid-transfer */
      w->n = 2;
      break;
  }
}

static void test_chunk_refused(void **state) {
  static const bad_case cases[] = {
      {"out of order", "chunk 2 came where chunk 1 was due"},
      {"chunk 0 lost", "chunk 1 came first; a transfer starts with chunk 0"},
      {"overflow", "chunk 2 of 4096 bytes overflows DP job 7 step 3 mb 1 stage 2 value 0 u8 [10000] 10000 bytes: "
                   "1808 bytes are left"},
      {"no LAST", "chunk 2 ends the tensor but is not marked LAST"},
      {"early LAST", "chunk 1 is marked LAST but bytes are still missing after it"},
      {"interleaved", "ACT job 7 step 3 mb 1 stage 2 value 1 u8 [16] 16 bytes came inside the chunked transfer of "
                      "DP job 7 step 3 mb 1 stage 2 value 0 u8 [10000] 10000 bytes (chunk 2 due)"},
      {"other stage", "stage 9 value 0 u8 [10000] 10000 bytes, chunk 1: 4096 bytes came inside the chunked transfer"},
      {"repeated", "chunk 1 came where chunk 2 was due"},
      {"truncated", "link: truncated"},
  };
  uint8_t *pay = pattern(10000, 5), *big = pattern(4096, 6);
  for (int c = 0; c < (int)(sizeof cases / sizeof *cases); c++) {
    wlist w;
    make_bad(c, &w, pay, big);
    /* the destination sits between guard bytes that must stay untouched */
    uint8_t mem[10000 + 8192];
    memset(mem, 0xA5, sizeof mem);
    receiver rc = {.dest = mem + 4096, .dest_cap = 10000};
    run_link(&w, &rc, c % 2 ? 777 : SIZE_MAX);
    if (rc.rc >= 0) fail_msg("%s: accepted", cases[c].what);
    assert_int_equal(rc.n, 0);
    expect_err(&rc.err, cases[c].msg);
    for (size_t i = 0; i < 4096; i++)
      if (mem[i] != 0xA5 || mem[4096 + 10000 + i] != 0xA5) fail_msg("%s: wrote outside the destination", cases[c].what);
    recv_free(&rc);
  }
  free(pay);
  free(big);
}

/* A sender aborting mid-tensor sends BYE with its reason: the transfer is
 * dropped and the reason gets through; the stream is at a boundary again. */
static void test_chunk_bye(void **state) {
  uint8_t *pay = pattern(10000, 9);
  wlist w = {.n = 0};
  pw_frame_hdr h = tensor(PW_FRAME_TIED, 3, 4, PW_DTYPE_U8, 10000);
  assert_int_equal(add_tensor(&w, &h, pay, 4096), 3);
  static const char why[] = "rank 1 failed: out of memory";
  w.f[2] = (wframe){tensor(PW_FRAME_BYE, 0, 0, PW_DTYPE_U8, sizeof why - 1), (const uint8_t *)why};
  receiver rc = {0};
  run_link(&w, &rc, SIZE_MAX);
  assert_int_equal(rc.rc, 0);
  assert_int_equal(rc.headers, 2); /* the tensor's and BYE's */
  assert_int_equal(rc.n, 1);
  assert_int_equal(rc.hdr[0].kind, PW_FRAME_BYE);
  assert_memory_equal(rc.got[0], why, sizeof why - 1);
  recv_free(&rc);
  free(pay);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hdr_sizes),
      cmocka_unit_test(test_chunk_headers),
      cmocka_unit_test(test_chunk_roundtrip),
      cmocka_unit_test(test_chunk_refused),
      cmocka_unit_test(test_chunk_bye),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
