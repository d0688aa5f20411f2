/* control: the worker<->coordinator control protocol.
 *
 * Pure: no sockets, no event loop. A message on the wire is a 4-byte
 * big-endian length n (1..max) then n bytes of UTF-8 JSON: an object with a
 * string "type". The reader below never trusts the length: its buffer
 * grows with the bytes that actually arrive, never beyond max, and every
 * message it returns has passed pw_control_validate(). Any error (zero or
 * oversize length, invalid JSON, a non-object, an unknown type, a missing or
 * wrong-typed field) kills the stream: the daemon logs the reason and closes
 * the connection.
 *
 * Protocol version PW_PROTO_VERSION. The worker sends "register" first; the
 * coordinator answers "welcome" or "refused" (wrong token, wrong version:
 * those are checked by the coordinator, not by validation, so the refusal
 * can say why). Fields not listed are allowed and ignored (new optional
 * fields do not need a version bump); "?" marks optional fields. Ids and
 * counts are integers >= 0.
 *
 * worker -> coordinator
 *   register    version:int>=1, name:str, token:str, data_addr:str
 *               ("host:port" of the data-plane listener), cores:int>=1,
 *               threads:int>=1, software:str
 *   heartbeat   time:number>=0, state:str, job?:int
 *   step        job:int, run:int, rank:int, step:int, loss?:number,
 *               step_time:number>=0, tokens?:number>=0, peak_act?:int,
 *               actions?:[[kind:str, mb:int, stage:int, start:number,
 *               end:number], ...]   (loss omitted when not finite)
 *   checkpoint  job:int, run:int, rank:int, step:int, path:str, bytes:int
 *   done        job:int, run:int, rank:int
 *   error       job?:int, run?:int, rank?:int, message:str
 *
 * coordinator -> worker
 *   welcome     version:int>=1, worker_id:int, heartbeat_interval:number>0
 *   refused     reason:str
 *   assign      job:int, run:int, rank:int, slice:str (the rank's slice
 *               of the plan: canonical JSON text, lib/plan/slice.h),
 *               slice_sha256:str (SHA-256 hex of slice's bytes),
 *               peers:[{rank:int, addr:str}, ...],
 *               steps:int, start_step:int, checkpoint_dir?:str,
 *               resume?:str, trace_every?:int
 *   cancel      job:int, run:int, reason:str
 *   shutdown    (no fields)
 *
 * Validation errors are PW_EPROTO with the JSON path of the field, e.g.
 * "assign.peers[1].addr: must be a string", "register.cores: is required",
 * "step.actions[2][0]: must be a string". */
#ifndef PW_CONTROL_H
#define PW_CONTROL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_PROTO_VERSION 2 /* 2: assign carries the plan slice, not the spec */
#define PW_CONTROL_MAX ((size_t)16 << 20) /* default bound on one message */
#define PW_CONTROL_TOKEN_MAX 256

/* Who sends a message type. */
enum { PW_CONTROL_TO_COORD = 1, PW_CONTROL_TO_WORKER = 2 };

/* The direction of a known message type, or 0 when unknown. */
int pw_control_msg_dir(const char *type);
/* msg's "type" when it is a string, else NULL. */
const char *pw_control_type(const json_t *msg);

/* 0, or PW_EPROTO naming the field (see the table above). */
int pw_control_validate(const json_t *msg, pw_err *err);

/* A malloc'd wire frame (4-byte big-endian length + compact JSON) for any
 * JSON object; the caller frees *out. Does not validate (so tests can send
 * bad messages); PW_EINVAL for a non-object or unencodable value,
 * PW_ETOOBIG over PW_CONTROL_MAX, PW_ENOMEM. */
int pw_control_encode(const json_t *msg, uint8_t **out, size_t *len);

/* ---- the stream reader --------------------------------------------------
 *
 *   LEN  --4 bytes: 1..max-->  BODY  --n bytes: JSON object, valid-->  LEN
 *    \--0 or > max--> DEAD       \--invalid JSON / validation--> DEAD
 *
 * Use from libuv exactly like pw_frame_reader: next_buf in alloc_cb,
 * advance in read_cb. advance returns 1 with *msg set (a new reference the
 * caller must json_decref), 0 for "need more", or negative (PW_EPROTO,
 * PW_EJSON, PW_ETOOBIG, PW_ENOMEM; PW_EINVAL for misuse); once negative,
 * always the same code. next_buf gives len 0 only on a dead stream. */

enum { PW_CR_LEN, PW_CR_BODY, PW_CR_DEAD };

typedef struct {
  size_t max;        /* bound on one message's length */
  int state;
  int dead_code;
  uint8_t len_buf[4];
  size_t len_got;
  size_t len;        /* body length of the message being read */
  uint8_t *buf;      /* body buffer; cap <= max, always */
  size_t cap;
  size_t got;
  uint64_t messages; /* complete messages so far */
} pw_control_reader;

/* max 0 means PW_CONTROL_MAX; at most UINT32_MAX. */
void pw_control_reader_init(pw_control_reader *r, size_t max);
void pw_control_reader_free(pw_control_reader *r);
void pw_control_reader_next_buf(pw_control_reader *r, void **buf, size_t *len);
int pw_control_reader_advance(pw_control_reader *r, size_t n, json_t **msg, pw_err *err);
/* 1 at a message boundary (an EOF there is an orderly close). */
int pw_control_reader_idle(const pw_control_reader *r);

/* Copies data through next_buf/advance, calling cb for each message (cb
 * borrows it: json_incref to keep it). cb returns 0 to go on or negative to
 * stop. Returns the number of messages, or a negative code. */
typedef int (*pw_control_cb)(void *ctx, json_t *msg);
int pw_control_reader_feed(pw_control_reader *r, const void *data, size_t n, pw_control_cb cb,
                           void *ctx, pw_err *err);

/* ---- cluster token -------------------------------------------------------- */

/* 1 when the NUL-terminated strings are equal, else 0, in time that depends
 * only on the lengths (pass the secret as b). NULL is never equal. */
int pw_control_token_equal(const char *a, const char *b);

/* Reads a token file into buf (NUL-terminated), stripping trailing
 * whitespace. Returns the token's length, or PW_ENOENT / PW_EIO (cannot
 * read), PW_EAUTH (empty, over PW_CONTROL_TOKEN_MAX bytes, or holding
 * control characters), PW_EINVAL (cap too small for the token). Logs a
 * warning when the file is readable by group or others. */
int pw_control_read_token_file(const char *path, char *buf, size_t cap, pw_err *err);

#endif
