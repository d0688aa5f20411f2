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
 *     4  2   version      PW_FRAME_VERSION (2)
 *     6  2   kind         pw_frame_kind
 *     8  4   job          job id (below 2^32; see below)
 *    12  4   chunk        index of this frame in a chunked transfer, else 0
 *    16  4   step         training step
 *    20  4   microbatch   microbatch index (DP: the sending replica; NORM: the
 *                         sending pipeline rank; TP: the sending tp rank;
 *                         TIED: the holder stage)
 *    24  4   stage        the stage the tensor is FOR (the receiver's stage)
 *    28  4   value        model value id: which tensor
 *    32  1   dtype        pw_frame_dtype
 *    33  1   ndim         0..4 (0 = a scalar, one element)
 *    34  2   flags        PW_FRAME_FLAG_* bits; unknown bits are an error
 *    36 16   dims[4]      u32 each; dims[i] for i >= ndim must be 0
 *    52  4   payload_len  bytes in this frame: product(dims) * elem size,
 *                         or with flag CHUNK one chunk's share of that
 *    56  4   payload_crc  crc32c of this frame's payload
 *    60  4   header_crc   crc32c of bytes 0..59
 *
 * payload_len is u32 so the header stays one 64-byte cache line; a tensor
 * of more bytes than a frame may carry goes in chunks (below). The chunk
 * index took the upper half of version 1's u64 job: a link's job is fixed
 * by its HELLO, whose JSON payload carries the full id, and job ids are the
 * coordinator's row ids, counted from 1, so 32 bits tell any two apart.
 * pw_frame_hdr keeps job and payload_len as u64.
 *
 * Chunks. A sender splits a tensor of more than its chunk limit (at most
 * PW_FRAME_MAX_PAYLOAD bytes; PW_FRAME_CHUNK_DEFAULT unless lowered for
 * tests: the worker reads PW_WIRE_CHUNK=bytes) into consecutive frames on
 * one link, nothing between them: each repeats the tensor's header (dims
 * describe the whole tensor) with flag CHUNK, chunk 0, 1, 2, ... and
 * payload_len its share (the limit, less for the last), and the last also
 * has flag LAST. pw_frame_chunk makes those
 * headers. The reader below puts the chunks back together: the caller sees
 * one transfer as if it were one frame.
 *
 * Per-kind rules checked by the decoder: HELLO is dtype U8, ndim 1, with a
 * non-empty payload of at most PW_FRAME_HELLO_MAX bytes; BYE is u8, ndim 1,
 * with at most PW_FRAME_HELLO_MAX bytes: empty for an orderly close, else
 * the reason the sender is aborting (so its peers can name the root cause);
 * SEQS is i32, ndim 2, dims [n >= 1, PW_FRAME_SEQ_FIELDS]; TOKENS is i32,
 * ndim 1, dims [n >= 1]; neither is chunked. BF16 is for ACT frames only.
 * ndim 0 is a scalar: one
 * element. */
#ifndef PW_WIRE_H
#define PW_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_FRAME_HDR_SIZE 64
#define PW_FRAME_MAGIC 0x31465750u /* "PWF1" read as a little-endian u32 */
#define PW_FRAME_VERSION 2
#define PW_FRAME_MAX_DIMS 4
#define PW_FRAME_MAX_PAYLOAD 0xffffffffu /* bytes in one frame */
#define PW_FRAME_MAX_JOB 0xffffffffu
/* 256 KiB: each chunk's CRC is computed just before it goes, so the first
 * bytes leave at once (the CRC of a whole 16 MiB tensor took 0.4 ms before
 * them), and a chunk fits the core's L2: the CRC's read brings it in for
 * the kernel's copy, and the receiver checks what it just read. */
#define PW_FRAME_CHUNK_DEFAULT ((size_t)256 << 10)
#define PW_FRAME_HELLO_MAX 4096

typedef enum {
  PW_FRAME_HELLO = 1,  /* peer handshake; payload JSON {job, rank, token} */
  PW_FRAME_ACT = 2,    /* activation, forward */
  PW_FRAME_GRAD = 3,   /* gradient w.r.t. an activation, backward */
  PW_FRAME_DP = 4,     /* the data-parallel exchange between replicas (worker/dpx.h,
                          gradrs.h: a chunk, a shard's norm, a gradient piece) */
  PW_FRAME_TIED = 5,   /* tied-parameter gradient */
  PW_FRAME_BYE = 6,    /* close; empty = orderly, else the abort reason (text) */
  PW_FRAME_SNAP = 7,   /* a stage's state (value 0 parameters, 1 and 2 the
                          optimizer moments) after `step` steps: an in-memory
                          snapshot for a peer to hold, or a restore */
  PW_FRAME_SEQS = 8,   /* serving: the sequences of a microbatch, i32
                          [n, PW_FRAME_SEQ_FIELDS] (worker/serve.h), before its ACT */
  PW_FRAME_TOKENS = 9, /* serving: a microbatch's sampled tokens, i32 [n], in
                          its SEQS order, last stage -> rank 0 */
  PW_FRAME_TP = 10,    /* a tensor-parallel all-reduce's shard (worker/tpx.h) */
  PW_FRAME_NORM = 11   /* a pipeline rank's partial squared gradient norm, and
                          the barrier of a pass's end (worker/pipex.h) */
} pw_frame_kind;

#define PW_FRAME_SEQ_FIELDS 14 /* i32 per sequence of a SEQS frame */

/* BF16: the top half of a float32 (train.precision "bf16"); only in ACT
 * frames. */
typedef enum { PW_DTYPE_F32 = 0, PW_DTYPE_I32 = 1, PW_DTYPE_U8 = 2, PW_DTYPE_BF16 = 3 } pw_frame_dtype;

/* Flag bits. CHUNK: the frame is one chunk of a transfer; LAST (only with
 * CHUNK): it is the transfer's last. */
#define PW_FRAME_FLAG_LAST 0x0001u
#define PW_FRAME_FLAG_CHUNK 0x0002u
#define PW_FRAME_FLAGS_KNOWN 0x0003u

/* A decoded header. magic is implied; version is always PW_FRAME_VERSION. */
typedef struct {
  uint16_t version;
  uint16_t kind;
  uint64_t job;         /* <= PW_FRAME_MAX_JOB */
  uint32_t chunk;       /* with flag CHUNK: index in the transfer; else 0 */
  uint32_t step;
  uint32_t microbatch;
  uint32_t stage;
  uint32_t value;
  uint8_t dtype;
  uint8_t ndim;
  uint16_t flags;
  uint32_t dims[PW_FRAME_MAX_DIMS];
  uint64_t payload_len; /* this frame's bytes (<= PW_FRAME_MAX_PAYLOAD) or,
                           in a reader's event, the whole transfer's */
  uint32_t payload_crc; /* filled by encode / decode */
  uint32_t header_crc;  /* filled by encode / decode */
} pw_frame_hdr;

const char *pw_frame_kind_name(int kind);   /* "ACT"; "?" when unknown */
const char *pw_frame_dtype_name(int dtype); /* "f32"; "?" when unknown */
size_t pw_frame_dtype_size(int dtype);      /* 4, 4, 1, 2; 0 when unknown */

/* Fills h (version, flags 0, chunk 0, unused dims 0, payload_len =
 * product(dims) * elem size, which may exceed what one frame carries: see
 * pw_frame_chunk). dims may be NULL when ndim == 0 (a scalar). Returns 0,
 * or PW_EINVAL for an unknown kind/dtype, ndim > 4 or job over
 * PW_FRAME_MAX_JOB, or PW_ETOOBIG when the size overflows 64 bits (h is
 * then unusable). Set h->flags afterwards if needed. */
PW_MUST_CHECK int pw_frame_hdr_init(pw_frame_hdr *h, int kind, uint64_t job, uint32_t step, uint32_t mb,
                                    uint32_t stage, uint32_t value, int dtype, int ndim, const uint32_t *dims);
/* The same for a vector of n elements (ndim 1); PW_ETOOBIG when n does not
 * fit a u32 dim. */
PW_MUST_CHECK int pw_frame_hdr_init_vec(pw_frame_hdr *h, int kind, uint64_t job, uint32_t step, uint32_t mb,
                                        uint32_t stage, uint32_t value, int dtype, size_t n);

/* Chunk i of the transfer h (i = off / limit): *c gets h's fields with
 * flag CHUNK (and LAST on the last chunk), chunk i and payload_len
 * min(limit, rest); its payload is h's bytes [off, off + c->payload_len).
 * Send chunks in order, each right after the one before. Returns 0, or
 * PW_EINVAL when limit is not in 1..PW_FRAME_MAX_PAYLOAD, off is not a
 * multiple of limit below h->payload_len, or h is itself a chunk, or
 * PW_ETOOBIG when the transfer needs more than 2^32 chunks.
 * A sender chunks exactly the tensors over its limit: the rest go as one
 * frame, as they always did. */
PW_MUST_CHECK int pw_frame_chunk(const pw_frame_hdr *h, size_t limit, uint64_t off, pw_frame_hdr *c);

/* Writes the 64 header bytes, computing the payload CRC over
 * h->payload_len bytes of payload (may be NULL when that is 0) and the
 * header CRC. h->payload_len must fit one frame (a header from hdr_init of
 * a larger tensor goes through pw_frame_chunk first): a larger one would be
 * cut to 32 bits, a frame every reader refuses. */
void pw_frame_hdr_encode(const pw_frame_hdr *h, const void *payload, uint8_t out[PW_FRAME_HDR_SIZE]);
/* The same with a payload CRC the caller computed (e.g. over scattered
 * pieces with pw_crc32c's incremental form). */
void pw_frame_hdr_encode_crc(const pw_frame_hdr *h, uint32_t payload_crc,
                             uint8_t out[PW_FRAME_HDR_SIZE]);

/* Parses and validates every field of a header: magic, version, header
 * CRC, kind, dtype, ndim, flags, chunk, unused dims zero, payload_len equal
 * to product(dims) * elem size (overflow-safe; with CHUNK: 1..that), the
 * tensor's size <= max_payload, per-kind rules. Returns 0, or PW_EPROTO
 * (magic, version, CRC, kind, flags, chunk), PW_EFORMAT (dtype, ndim,
 * dims, payload_len vs dims, per-kind shape) or PW_ETOOBIG (over
 * max_payload), with err->path "frame" and a message naming the field and
 * the values, e.g.
 * "payload_len 4096 does not match dims [2,3] of f32 (24 bytes)".
 * That chunks come in order is the reader's to check; the payload CRC
 * too, once the payload has arrived. */
PW_MUST_CHECK int pw_frame_hdr_decode(const uint8_t in[PW_FRAME_HDR_SIZE], size_t max_payload,
                                      pw_frame_hdr *h, pw_err *err);

/* "ACT job 3 step 7 mb 2 stage 1 value 12 f32 [4,64,32] 32768 bytes", and
 * for a chunk ", chunk 2: 1024 bytes" (", last" on the last one). */
const char *pw_frame_hdr_str(const pw_frame_hdr *h, char *buf, size_t cap);

/* HELLO payloads: compact JSON {"job":J,"run":U,"rank":R,"token":"..."}.
 * The run is the link's epoch: a job restarted after a lost worker runs
 * again under a new run id, and a link from its old run is never taken
 * for one of the new.
 * pw_frame_hello_make fills h and a malloc'd payload (caller frees).
 * pw_frame_hello_parse checks the JSON and types (job, run and rank
 * integers >= 0, token a string of at most 256 bytes; token_cap must
 * exceed it). */
PW_MUST_CHECK int pw_frame_hello_make(uint64_t job, uint32_t run, uint32_t rank, const char *token, pw_frame_hdr *h,
                                      uint8_t **payload);
PW_MUST_CHECK int pw_frame_hello_parse(const void *payload, size_t len, uint64_t *job, uint32_t *run, uint32_t *rank,
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
 * A chunked transfer reads as one frame: chunk 0's header gives the HEADER
 * event, with the tensor's header (flags 0, chunk 0, payload_len the whole
 * tensor's bytes, CRCs 0), so set_dest takes a buffer for all of it; the
 * later chunks' headers are checked and consumed without an event, each
 * chunk's payload lands after the one before and is CRC-checked at its
 * end; after the last, DONE gives the whole tensor. The reader refuses
 * (PW_EPROTO, stream dead) a chunk out of order, one that differs from
 * chunk 0 in any field but chunk, payload_len and flags, one that would
 * overflow the tensor, a LAST flag on a chunk that does not end it (or its
 * absence on one that does), and any other frame before the last chunk —
 * but for BYE, which abandons the transfer (a sender aborting mid-tensor
 * still gets its reason through).
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
  size_t pay_got;                   /* of this frame's payload */
  uint32_t crc;                     /* running CRC of the payload so far */
  uint8_t *buf;                     /* internal payload buffer */
  size_t buf_cap;                   /* <= max_payload, always */
  uint64_t frames;                  /* complete frames (transfers) so far */
  /* A chunked transfer under way: the tensor's header, the bytes of it in
   * (where this chunk's payload starts; 0 outside transfers), and the index
   * of the chunk due next. */
  int xfer_on;
  pw_frame_hdr xfer;
  size_t xfer_got;
  uint32_t xfer_next;
} pw_frame_reader;

/* max_payload bounds the payload of a frame, or of a chunked transfer as a
 * whole: a header announcing more is refused (PW_ETOOBIG). */
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
PW_MUST_CHECK int pw_frame_reader_advance(pw_frame_reader *r, size_t n, pw_frame_event *ev, pw_err *err);
/* Only right after advance returned PW_FRAME_HEADER: receive this frame's
 * (or transfer's) payload at dst (at least ev.hdr.payload_len bytes; NULL =
 * internal buffer). Returns 0 or PW_EINVAL when called in another state. */
PW_MUST_CHECK int pw_frame_reader_set_dest(pw_frame_reader *r, void *dst);
/* 1 at a frame boundary (no partial frame or transfer buffered): an EOF
 * there is an orderly close, elsewhere a truncated frame. */
PW_MUST_CHECK int pw_frame_reader_idle(const pw_frame_reader *r);
/* Bytes the reader still needs before its next event or chunk boundary:
 * the rest of the header, or, once a header is in, the rest of that
 * frame's payload (a chunk's, in a transfer); 0 when dead. A socket reader
 * can wait for that many (SO_RCVLOWAT) instead of waking for every segment
 * of a large payload. */
size_t pw_frame_reader_missing(const pw_frame_reader *r);

/* Copies data through next_buf/advance, calling cb for every event
 * (HEADER events too: cb may call set_dest). cb returns 0 to go on or a
 * negative code to stop. Returns the number of complete frames, or a
 * negative code (the reader's or cb's). */
typedef int (*pw_frame_cb)(void *ctx, pw_frame_reader *r, const pw_frame_event *ev);
PW_MUST_CHECK int pw_frame_reader_feed(pw_frame_reader *r, const void *data, size_t n, pw_frame_cb cb,
                                       void *ctx, pw_err *err);

#endif
