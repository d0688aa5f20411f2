/* wire: the worker<->worker data-plane frame format and its stream reader.
 *
 * Pure: no sockets, no event loop, no logging. A libuv daemon feeds the
 * reader from its alloc/read callbacks; tests feed it from buffers. Must
 * never trust a byte from the wire: every header field is validated before
 * any size in it is used, and nothing is allocated beyond max_payload.
 *
 * A frame is a 64-byte little-endian header, then payload_len bytes of
 * payload (the tensor, row-major, little-endian elements).
 *
 *   off size field        meaning
 *     0  4   magic        "PWF1" (bytes 'P','W','F','1'; PW_FRAME_MAGIC)
 *     4  2   version      PW_FRAME_VERSION (1)
 *     6  2   kind         pw_frame_kind
 *     8  8   job          job id
 *    16  4   step         training step
 *    20  4   microbatch   microbatch index (REDUCE: chunk index)
 *    24  4   stage        the stage the tensor is FOR (the receiver's stage)
 *    28  4   value        model value id: which tensor
 *    32  1   dtype        pw_frame_dtype
 *    33  1   ndim         0..4 (0 = a scalar, one element)
 *    34  2   flags        PW_FRAME_FLAG_* bits; unknown bits are an error
 *    36 16   dims[4]      u32 each; dims[i] for i >= ndim must be 0
 *    52  4   payload_len  bytes; must equal product(dims) * elem size
 *    56  4   payload_crc  crc32c of the payload
 *    60  4   header_crc   crc32c of bytes 0..59
 *
 * DESIGN note: the brief asked for a u64 payload_len, but the listed fields
 * then need 68 bytes; payload_len is u32 on the wire (a frame carries at
 * most PW_FRAME_MAX_PAYLOAD bytes; larger tensors are sent in chunks) so the
 * header stays one 64-byte cache line. pw_frame_hdr keeps it as u64.
 *
 * Per-kind rules checked by the decoder: HELLO is dtype U8, ndim 1, with a
 * non-empty payload of at most PW_FRAME_HELLO_MAX bytes; BYE is u8, ndim 1,
 * with at most PW_FRAME_HELLO_MAX bytes: empty for an orderly close, else
 * the reason the sender is aborting (so its peers can name the root cause). ndim 0 is a scalar: one
 * element (e.g. a REDUCE of the squared gradient norm). */
#ifndef PW_WIRE_H
#define PW_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_FRAME_HDR_SIZE 64
#define PW_FRAME_MAGIC 0x31465750u /* "PWF1" read as a little-endian u32 */
#define PW_FRAME_VERSION 1
#define PW_FRAME_MAX_DIMS 4
#define PW_FRAME_MAX_PAYLOAD 0xffffffffu
#define PW_FRAME_HELLO_MAX 4096

typedef enum {
  PW_FRAME_HELLO = 1,  /* peer handshake; payload JSON {job, rank, token} */
  PW_FRAME_ACT = 2,    /* activation, forward */
  PW_FRAME_GRAD = 3,   /* gradient w.r.t. an activation, backward */
  PW_FRAME_REDUCE = 4, /* all-reduce chunk or scalar reduction */
  PW_FRAME_TIED = 5,   /* tied-parameter gradient */
  PW_FRAME_BYE = 6     /* close; empty = orderly, else the abort reason (text) */
} pw_frame_kind;

typedef enum { PW_DTYPE_F32 = 0, PW_DTYPE_I32 = 1, PW_DTYPE_U8 = 2 } pw_frame_dtype;

/* Flag bits. LAST marks the last chunk of a multi-frame transfer. */
#define PW_FRAME_FLAG_LAST 0x0001u
#define PW_FRAME_FLAGS_KNOWN 0x0001u

/* A decoded header. magic is implied; version is always PW_FRAME_VERSION. */
typedef struct {
  uint16_t version;
  uint16_t kind;
  uint64_t job;
  uint32_t step;
  uint32_t microbatch;
  uint32_t stage;
  uint32_t value;
  uint8_t dtype;
  uint8_t ndim;
  uint16_t flags;
  uint32_t dims[PW_FRAME_MAX_DIMS];
  uint64_t payload_len; /* <= PW_FRAME_MAX_PAYLOAD */
  uint32_t payload_crc; /* filled by encode / decode */
  uint32_t header_crc;  /* filled by encode / decode */
} pw_frame_hdr;

const char *pw_frame_kind_name(int kind);   /* "ACT"; "?" when unknown */
const char *pw_frame_dtype_name(int dtype); /* "f32"; "?" when unknown */
size_t pw_frame_dtype_size(int dtype);      /* 4, 4, 1; 0 when unknown */

/* Fills h (version, flags 0, unused dims 0, payload_len = product(dims) *
 * elem size). dims may be NULL when ndim == 0 (a scalar). Returns 0, or
 * PW_EINVAL for an unknown kind/dtype or ndim > 4, or PW_ETOOBIG when the
 * payload would exceed PW_FRAME_MAX_PAYLOAD (h is then unusable). Set
 * h->flags afterwards if needed. (Brief said void; int is a compatible
 * extension so oversize tensors are caught at the sender.) */
int pw_frame_hdr_init(pw_frame_hdr *h, int kind, uint64_t job, uint32_t step, uint32_t mb,
                      uint32_t stage, uint32_t value, int dtype, int ndim, const uint32_t *dims);

/* Writes the 64 header bytes, computing the payload CRC over
 * h->payload_len bytes of payload (may be NULL when that is 0) and the
 * header CRC. */
void pw_frame_hdr_encode(const pw_frame_hdr *h, const void *payload, uint8_t out[PW_FRAME_HDR_SIZE]);
/* The same with a payload CRC the caller computed (e.g. over scattered
 * pieces with pw_crc32c's incremental form). */
void pw_frame_hdr_encode_crc(const pw_frame_hdr *h, uint32_t payload_crc,
                             uint8_t out[PW_FRAME_HDR_SIZE]);

/* Parses and validates every field of a header: magic, version, header
 * CRC, kind, dtype, ndim, flags, unused dims zero, payload_len equal to
 * product(dims) * elem size (overflow-safe) and <= max_payload, per-kind
 * rules. Returns 0, or PW_EPROTO (magic, version, CRC, kind, flags),
 * PW_EFORMAT (dtype, ndim, dims, payload_len vs dims, per-kind shape) or
 * PW_ETOOBIG (payload_len > max_payload), with err->path "frame" and a
 * message naming the field and the values, e.g.
 * "payload_len 4096 does not match dims [2,3] of f32 (24 bytes)".
 * The payload CRC is checked by the reader once the payload has arrived. */
int pw_frame_hdr_decode(const uint8_t in[PW_FRAME_HDR_SIZE], size_t max_payload, pw_frame_hdr *h,
                        pw_err *err);

/* "ACT job 3 step 7 mb 2 stage 1 value 12 f32 [4,64,32] 32768 bytes" */
const char *pw_frame_hdr_str(const pw_frame_hdr *h, char *buf, size_t cap);

/* HELLO payloads: compact JSON {"job":J,"rank":R,"token":"..."}.
 * pw_frame_hello_make fills h and a malloc'd payload (caller frees).
 * pw_frame_hello_parse checks the JSON and types (job and rank integers
 * >= 0, token a string of at most 256 bytes; token_cap must exceed it). */
int pw_frame_hello_make(uint64_t job, uint32_t rank, const char *token, pw_frame_hdr *h,
                        uint8_t **payload);
int pw_frame_hello_parse(const void *payload, size_t len, uint64_t *job, uint32_t *rank,
                         char *token, size_t token_cap, pw_err *err);

/* ---- the stream reader --------------------------------------------------
 *
 * State machine (r->state):
 *
 *   HEADER --64 bytes, valid--> HDR_READY --next_buf (or advance 0)--> PAYLOAD
 *    ^  |                       (set_dest allowed only here)             |
 *    |  +--invalid header--> DEAD                                        |
 *    |  (payload_len 0: advance returns 2 at once, stays in HEADER)      |
 *    +------- payload_len bytes in, CRC ok: advance returns 2 -----------+
 *                                   payload CRC mismatch --> DEAD
 *
 * Use from libuv:
 *   alloc_cb:  pw_frame_reader_next_buf(r, &base, &len)   (len 0: close link)
 *   read_cb:   rc = pw_frame_reader_advance(r, nread, &ev, &err)
 *                rc == 1: header ready (ev.hdr); optionally
 *                         pw_frame_reader_set_dest(r, slot) before the next
 *                         next_buf, to receive the payload in place
 *                rc == 2: frame complete: ev.hdr, ev.payload, ev.len
 *                rc == 0: need more bytes
 *                rc <  0: bad frame (err says why); the stream is dead
 * The region next_buf gives never spans two frames, so one advance yields
 * at most one event. The payload CRC is computed incrementally as bytes
 * arrive (while they are hot in cache).
 *
 * Without a destination the payload goes to an internal buffer that grows
 * geometrically as bytes arrive (never beyond max_payload, so a lying
 * header costs no more memory than the bytes actually sent) and is kept
 * for later frames. ev.payload then stays valid until the next call to
 * next_buf/advance/feed/free. */

enum { PW_FRAME_NEED_MORE = 0, PW_FRAME_HEADER = 1, PW_FRAME_DONE = 2 };
enum { PW_FR_HEADER, PW_FR_HDR_READY, PW_FR_PAYLOAD, PW_FR_DEAD };

typedef struct {
  int type;            /* PW_FRAME_HEADER or PW_FRAME_DONE */
  pw_frame_hdr hdr;
  void *payload;       /* DONE only; NULL when len is 0 */
  size_t len;
} pw_frame_event;

typedef struct {
  size_t max_payload;
  int state;
  int dead_code;                    /* the error that killed the stream */
  uint8_t hdr_buf[PW_FRAME_HDR_SIZE];
  size_t hdr_got;
  pw_frame_hdr hdr;                 /* the frame being received */
  uint8_t *dest;                    /* where the payload goes */
  size_t pay_got;
  uint32_t crc;                     /* running CRC of the payload so far */
  uint8_t *buf;                     /* internal payload buffer */
  size_t buf_cap;                   /* <= max_payload, always */
  uint64_t frames;                  /* complete frames so far */
} pw_frame_reader;

void pw_frame_reader_init(pw_frame_reader *r, size_t max_payload);
void pw_frame_reader_free(pw_frame_reader *r);
/* Changes the bound for later headers (e.g. small until HELLO is accepted). */
void pw_frame_reader_set_max(pw_frame_reader *r, size_t max_payload);

/* Where the next bytes must be written, and at most how many. *len is 0
 * (and *buf NULL) when the stream is dead or the internal buffer could not
 * grow; advance(r, 0, ...) then returns the error. */
void pw_frame_reader_next_buf(pw_frame_reader *r, void **buf, size_t *len);
/* Consumes n bytes the caller wrote at the last next_buf location (n must
 * not exceed the length given). Returns PW_FRAME_NEED_MORE / HEADER / DONE,
 * or negative: PW_EPROTO, PW_EFORMAT, PW_ETOOBIG for a bad frame (payload
 * CRC mismatch is PW_EPROTO), PW_ENOMEM, PW_EINVAL for misuse. Once
 * negative, every later call returns the same code. */
int pw_frame_reader_advance(pw_frame_reader *r, size_t n, pw_frame_event *ev, pw_err *err);
/* Only right after advance returned PW_FRAME_HEADER: receive this frame's
 * payload at dst (at least hdr.payload_len bytes; NULL = internal buffer).
 * Returns 0 or PW_EINVAL when called in another state. */
int pw_frame_reader_set_dest(pw_frame_reader *r, void *dst);
/* 1 at a frame boundary (no partial frame buffered): an EOF there is an
 * orderly close, elsewhere a truncated frame. */
int pw_frame_reader_idle(const pw_frame_reader *r);
/* Bytes the reader still needs before its next event: the rest of the
 * header, or, once a header is in, the rest of that frame's payload; 0 when
 * dead. A socket reader can wait for that many (SO_RCVLOWAT) instead of
 * waking for every segment of a large payload. */
size_t pw_frame_reader_missing(const pw_frame_reader *r);

/* Copies data through next_buf/advance, calling cb for every event
 * (HEADER events too: cb may call set_dest). cb returns 0 to go on or a
 * negative code to stop. Returns the number of complete frames, or a
 * negative code (the reader's or cb's). */
typedef int (*pw_frame_cb)(void *ctx, pw_frame_reader *r, const pw_frame_event *ev);
int pw_frame_reader_feed(pw_frame_reader *r, const void *data, size_t n, pw_frame_cb cb, void *ctx,
                         pw_err *err);

#endif
