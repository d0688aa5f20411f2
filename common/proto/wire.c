/* wire: frame header encode/decode, HELLO payloads and the stream reader.
 * See wire.h for the layout and the reader's state machine. Byte order is
 * explicit everywhere (no struct punning), so the format is the same on
 * any host. */
#include "wire.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"

_Static_assert(PW_FRAME_HDR_SIZE == 64, "the frame header is one 64-byte line");
_Static_assert(36 + 4 * PW_FRAME_MAX_DIMS + 4 + 4 + 4 == PW_FRAME_HDR_SIZE, "header layout");

#define HDR_CRC_OFF 60
#define GROW_FIRST ((size_t)64 * 1024)

/* ---- little-endian byte access ------------------------------------------ */

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- names ---------------------------------------------------------------- */

static const char *const kind_names[] = {NULL, "HELLO", "ACT", "GRAD", "DP", "TIED", "BYE", "SNAP", "SEQS", "TOKENS", "TP", "NORM"};
#define N_KINDS ((int)(sizeof kind_names / sizeof kind_names[0]))

const char *pw_frame_kind_name(int kind) {
  return kind > 0 && kind < N_KINDS ? kind_names[kind] : "?";
}

const char *pw_frame_dtype_name(int dtype) {
  switch (dtype) {
    case PW_DTYPE_F32: return "f32";
    case PW_DTYPE_I32: return "i32";
    case PW_DTYPE_U8: return "u8";
    case PW_DTYPE_BF16: return "bf16";
    default: return "?";
  }
}

size_t pw_frame_dtype_size(int dtype) {
  switch (dtype) {
    case PW_DTYPE_F32: return 4;
    case PW_DTYPE_I32: return 4;
    case PW_DTYPE_U8: return 1;
    case PW_DTYPE_BF16: return 2;
    default: return 0;
  }
}

/* product(dims[0..ndim)) * esize, or UINT64_MAX on overflow. */
static uint64_t shape_bytes(const uint32_t *dims, int ndim, size_t esize) {
  uint64_t b = esize;
  for (int i = 0; i < ndim; i++)
    if (__builtin_mul_overflow(b, (uint64_t)dims[i], &b)) return UINT64_MAX;
  return b;
}

static const char *dims_str(const uint32_t *dims, int ndim, char *buf, size_t cap) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, cap - o, "[");
  for (int i = 0; i < ndim && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%u", i ? "," : "", dims[i]);
  if (o < cap) snprintf(buf + o, cap - o, "]");
  return buf;
}

/* ---- header --------------------------------------------------------------- */

int pw_frame_hdr_init(pw_frame_hdr *h, int kind, uint64_t job, uint32_t step, uint32_t mb,
                      uint32_t stage, uint32_t value, int dtype, int ndim, const uint32_t *dims) {
  memset(h, 0, sizeof *h);
  if (kind <= 0 || kind >= N_KINDS || !pw_frame_dtype_size(dtype) || ndim < 0 ||
      ndim > PW_FRAME_MAX_DIMS || (ndim > 0 && !dims) || job > PW_FRAME_MAX_JOB)
    return PW_EINVAL;
  h->version = PW_FRAME_VERSION;
  h->kind = (uint16_t)kind;
  h->job = job;
  h->step = step;
  h->microbatch = mb;
  h->stage = stage;
  h->value = value;
  h->dtype = (uint8_t)dtype;
  h->ndim = (uint8_t)ndim;
  for (int i = 0; i < ndim; i++) h->dims[i] = dims[i];
  uint64_t b = shape_bytes(h->dims, ndim, pw_frame_dtype_size(dtype));
  if (b == UINT64_MAX) return PW_ETOOBIG;
  h->payload_len = b;
  return 0;
}

int pw_frame_hdr_init_vec(pw_frame_hdr *h, int kind, uint64_t job, uint32_t step, uint32_t mb,
                          uint32_t stage, uint32_t value, int dtype, size_t n) {
  if (n > UINT32_MAX) {
    memset(h, 0, sizeof *h);
    return PW_ETOOBIG;
  }
  uint32_t dims[1] = {(uint32_t)n};
  return pw_frame_hdr_init(h, kind, job, step, mb, stage, value, dtype, 1, dims);
}

int pw_frame_chunk(const pw_frame_hdr *h, size_t limit, uint64_t off, pw_frame_hdr *c) {
  if (limit == 0 || limit > PW_FRAME_MAX_PAYLOAD || off >= h->payload_len || off % limit ||
      (h->flags & PW_FRAME_FLAG_CHUNK))
    return PW_EINVAL;
  if ((h->payload_len - 1) / limit > UINT32_MAX) return PW_ETOOBIG; /* the last index must fit */
  uint64_t rest = h->payload_len - off;
  *c = *h;
  c->chunk = (uint32_t)(off / limit);
  c->payload_len = rest < limit ? rest : limit;
  c->flags = (uint16_t)(h->flags | PW_FRAME_FLAG_CHUNK | (rest <= limit ? PW_FRAME_FLAG_LAST : 0));
  return 0;
}

void pw_frame_hdr_encode_crc(const pw_frame_hdr *h, uint32_t payload_crc,
                             uint8_t out[PW_FRAME_HDR_SIZE]) {
  put32(out + 0, PW_FRAME_MAGIC);
  put16(out + 4, h->version);
  put16(out + 6, h->kind);
  put32(out + 8, (uint32_t)h->job);
  put32(out + 12, h->chunk);
  put32(out + 16, h->step);
  put32(out + 20, h->microbatch);
  put32(out + 24, h->stage);
  put32(out + 28, h->value);
  out[32] = h->dtype;
  out[33] = h->ndim;
  put16(out + 34, h->flags);
  for (int i = 0; i < PW_FRAME_MAX_DIMS; i++) put32(out + 36 + 4 * i, h->dims[i]);
  put32(out + 52, (uint32_t)h->payload_len);
  put32(out + 56, payload_crc);
  put32(out + HDR_CRC_OFF, pw_crc32c(0, out, HDR_CRC_OFF));
}

void pw_frame_hdr_encode(const pw_frame_hdr *h, const void *payload, uint8_t out[PW_FRAME_HDR_SIZE]) {
  uint32_t crc = h->payload_len ? pw_crc32c(0, payload, (size_t)h->payload_len) : 0;
  pw_frame_hdr_encode_crc(h, crc, out);
}

int pw_frame_hdr_decode(const uint8_t in[PW_FRAME_HDR_SIZE], size_t max_payload, pw_frame_hdr *h,
                        pw_err *err) {
  memset(h, 0, sizeof *h);
  uint32_t magic = get32(in);
  if (magic != PW_FRAME_MAGIC)
    return pw_err_set(err, PW_EPROTO, "frame", "magic 0x%08x is not \"PWF1\" (0x%08x)", magic,
                      PW_FRAME_MAGIC);
  h->version = get16(in + 4);
  if (h->version != PW_FRAME_VERSION)
    return pw_err_set(err, PW_EPROTO, "frame", "version %u is not supported (want %d)", h->version,
                      PW_FRAME_VERSION);
  h->header_crc = get32(in + HDR_CRC_OFF);
  uint32_t crc = pw_crc32c(0, in, HDR_CRC_OFF);
  if (crc != h->header_crc)
    return pw_err_set(err, PW_EPROTO, "frame", "header_crc 0x%08x does not match the header (0x%08x)",
                      h->header_crc, crc);
  h->kind = get16(in + 6);
  h->job = get32(in + 8);
  h->chunk = get32(in + 12);
  h->step = get32(in + 16);
  h->microbatch = get32(in + 20);
  h->stage = get32(in + 24);
  h->value = get32(in + 28);
  h->dtype = in[32];
  h->ndim = in[33];
  h->flags = get16(in + 34);
  for (int i = 0; i < PW_FRAME_MAX_DIMS; i++) h->dims[i] = get32(in + 36 + 4 * i);
  h->payload_len = get32(in + 52);
  h->payload_crc = get32(in + 56);

  if (h->kind == 0 || h->kind >= N_KINDS)
    return pw_err_set(err, PW_EPROTO, "frame", "kind %u is unknown", h->kind);
  if (h->flags & ~PW_FRAME_FLAGS_KNOWN)
    return pw_err_set(err, PW_EPROTO, "frame", "flags 0x%04x has unknown bits 0x%04x", h->flags,
                      h->flags & ~PW_FRAME_FLAGS_KNOWN);
  int chunked = (h->flags & PW_FRAME_FLAG_CHUNK) != 0;
  if (!chunked && (h->flags & PW_FRAME_FLAG_LAST))
    return pw_err_set(err, PW_EPROTO, "frame", "flag LAST without flag CHUNK");
  if (!chunked && h->chunk)
    return pw_err_set(err, PW_EPROTO, "frame", "chunk %u without flag CHUNK", h->chunk);
  if (chunked && (h->kind == PW_FRAME_HELLO || h->kind == PW_FRAME_BYE || h->kind == PW_FRAME_SEQS ||
                  h->kind == PW_FRAME_TOKENS))
    return pw_err_set(err, PW_EPROTO, "frame", "kind %s cannot be chunked", pw_frame_kind_name(h->kind));
  size_t esize = pw_frame_dtype_size(h->dtype);
  if (!esize) return pw_err_set(err, PW_EFORMAT, "frame", "dtype %u is unknown", h->dtype);
  if (h->ndim > PW_FRAME_MAX_DIMS)
    return pw_err_set(err, PW_EFORMAT, "frame", "ndim %u is over %d", h->ndim, PW_FRAME_MAX_DIMS);
  for (int i = h->ndim; i < PW_FRAME_MAX_DIMS; i++)
    if (h->dims[i])
      return pw_err_set(err, PW_EFORMAT, "frame", "dims[%d] is %u but ndim is %u (must be 0)", i,
                        h->dims[i], h->ndim);
  uint64_t want = shape_bytes(h->dims, h->ndim, esize);
  if (chunked && want != UINT64_MAX) {
    if (h->payload_len == 0 || h->payload_len > want) {
      char ds[64];
      dims_str(h->dims, h->ndim, ds, sizeof ds);
      return pw_err_set(err, PW_EFORMAT, "frame", "chunk %u: payload_len %llu is not in 1..%llu (dims %s of %s)",
                        h->chunk, (unsigned long long)h->payload_len, (unsigned long long)want, ds,
                        pw_frame_dtype_name(h->dtype));
    }
    if (want > max_payload)
      return pw_err_set(err, PW_ETOOBIG, "frame", "chunked tensor of %llu bytes is over the limit %zu",
                        (unsigned long long)want, max_payload);
  } else if (want != h->payload_len) {
    char ds[64];
    dims_str(h->dims, h->ndim, ds, sizeof ds);
    if (want == UINT64_MAX)
      return pw_err_set(err, PW_EFORMAT, "frame",
                        "payload_len %llu does not match dims %s of %s (size overflows)",
                        (unsigned long long)h->payload_len, ds, pw_frame_dtype_name(h->dtype));
    return pw_err_set(err, PW_EFORMAT, "frame", "payload_len %llu does not match dims %s of %s (%llu bytes)",
                      (unsigned long long)h->payload_len, ds, pw_frame_dtype_name(h->dtype),
                      (unsigned long long)want);
  }
  if (h->payload_len > max_payload)
    return pw_err_set(err, PW_ETOOBIG, "frame", "payload_len %llu is over the limit %zu",
                      (unsigned long long)h->payload_len, max_payload);
  if (h->kind == PW_FRAME_HELLO &&
      (h->dtype != PW_DTYPE_U8 || h->ndim != 1 || h->payload_len == 0 ||
       h->payload_len > PW_FRAME_HELLO_MAX))
    return pw_err_set(err, PW_EFORMAT, "frame",
                      "kind HELLO must carry 1..%d bytes of u8 with ndim 1 (got %s, ndim %u, %llu bytes)",
                      PW_FRAME_HELLO_MAX, pw_frame_dtype_name(h->dtype), h->ndim,
                      (unsigned long long)h->payload_len);
  if (h->dtype == PW_DTYPE_BF16 && h->kind != PW_FRAME_ACT)
    return pw_err_set(err, PW_EFORMAT, "frame", "dtype bf16 is only for ACT frames (got %s)",
                      pw_frame_kind_name(h->kind));
  if (h->kind == PW_FRAME_BYE &&
      (h->dtype != PW_DTYPE_U8 || h->ndim != 1 || h->payload_len > PW_FRAME_HELLO_MAX))
    return pw_err_set(err, PW_EFORMAT, "frame",
                      "kind BYE must carry 0..%d bytes of u8 with ndim 1 (got %s, ndim %u, %llu bytes)",
                      PW_FRAME_HELLO_MAX, pw_frame_dtype_name(h->dtype), h->ndim,
                      (unsigned long long)h->payload_len);
  if (h->kind == PW_FRAME_SEQS &&
      (h->dtype != PW_DTYPE_I32 || h->ndim != 2 || h->dims[0] == 0 || h->dims[1] != PW_FRAME_SEQ_FIELDS))
    return pw_err_set(err, PW_EFORMAT, "frame", "kind SEQS must carry i32 [n >= 1, %d] (got %s, ndim %u, dims[1] %u)",
                      PW_FRAME_SEQ_FIELDS, pw_frame_dtype_name(h->dtype), h->ndim, h->dims[1]);
  if (h->kind == PW_FRAME_TOKENS && (h->dtype != PW_DTYPE_I32 || h->ndim != 1 || h->dims[0] == 0))
    return pw_err_set(err, PW_EFORMAT, "frame", "kind TOKENS must carry i32 [n >= 1] (got %s, ndim %u)",
                      pw_frame_dtype_name(h->dtype), h->ndim);
  return 0;
}

const char *pw_frame_hdr_str(const pw_frame_hdr *h, char *buf, size_t cap) {
  char ds[64];
  int ndim = h->ndim > 4 ? 4 : h->ndim;
  dims_str(h->dims, ndim, ds, sizeof ds);
  if (!(h->flags & PW_FRAME_FLAG_CHUNK)) {
    snprintf(buf, cap, "%s job %llu step %u mb %u stage %u value %u %s %s %llu bytes",
             pw_frame_kind_name(h->kind), (unsigned long long)h->job, h->step, h->microbatch, h->stage,
             h->value, pw_frame_dtype_name(h->dtype), ds, (unsigned long long)h->payload_len);
    return buf;
  }
  snprintf(buf, cap, "%s job %llu step %u mb %u stage %u value %u %s %s %llu bytes, chunk %u: %llu bytes%s",
           pw_frame_kind_name(h->kind), (unsigned long long)h->job, h->step, h->microbatch, h->stage, h->value,
           pw_frame_dtype_name(h->dtype), ds,
           (unsigned long long)shape_bytes(h->dims, ndim, pw_frame_dtype_size(h->dtype)), h->chunk,
           (unsigned long long)h->payload_len, h->flags & PW_FRAME_FLAG_LAST ? ", last" : "");
  return buf;
}

/* ---- HELLO ------------------------------------------------------------------ */

#define TOKEN_MAX 256

int pw_frame_hello_make(uint64_t job, uint32_t run, uint32_t rank, const char *token, pw_frame_hdr *h,
                        uint8_t **payload) {
  *payload = NULL;
  if (!token) token = "";
  if (strlen(token) > TOKEN_MAX || job > (uint64_t)INT64_MAX) return PW_EINVAL;
  json_t *o = json_pack("{s:I,s:I,s:I,s:s}", "job", (json_int_t)job, "run", (json_int_t)run, "rank", (json_int_t)rank,
                        "token", token);
  if (!o) return PW_EINVAL; /* token not valid UTF-8 */
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (!s) return PW_ENOMEM;
  uint32_t n = (uint32_t)strlen(s);
  int rc = pw_frame_hdr_init(h, PW_FRAME_HELLO, job, 0, 0, 0, 0, PW_DTYPE_U8, 1, &n);
  if (rc < 0 || n > PW_FRAME_HELLO_MAX) {
    free(s);
    return rc < 0 ? rc : PW_EINVAL;
  }
  *payload = (uint8_t *)s;
  return 0;
}

int pw_frame_hello_parse(const void *payload, size_t len, uint64_t *job, uint32_t *run, uint32_t *rank,
                         char *token, size_t token_cap, pw_err *err) {
  json_error_t je;
  json_t *o = json_loadb(payload, len, JSON_REJECT_DUPLICATES, &je);
  if (!o) return pw_err_set(err, PW_EJSON, "hello", "invalid JSON: %s", je.text);
  int rc = 0;
  json_t *j = json_object_get(o, "job"), *r = json_object_get(o, "rank"), *t = json_object_get(o, "token");
  json_t *u = json_object_get(o, "run");
  if (!json_is_object(o))
    rc = pw_err_set(err, PW_EPROTO, "hello", "must be a JSON object");
  else if (!json_is_integer(j) || json_integer_value(j) < 0)
    rc = pw_err_set(err, PW_EPROTO, "hello.job", "must be an integer >= 0");
  else if (!json_is_integer(u) || json_integer_value(u) < 0 || json_integer_value(u) > UINT32_MAX)
    rc = pw_err_set(err, PW_EPROTO, "hello.run", "must be an integer >= 0");
  else if (!json_is_integer(r) || json_integer_value(r) < 0 || json_integer_value(r) > UINT32_MAX)
    rc = pw_err_set(err, PW_EPROTO, "hello.rank", "must be an integer >= 0");
  else if (!json_is_string(t))
    rc = pw_err_set(err, PW_EPROTO, "hello.token", "must be a string");
  else if (json_string_length(t) > TOKEN_MAX || json_string_length(t) >= token_cap)
    rc = pw_err_set(err, PW_EPROTO, "hello.token", "is too long (%zu bytes)", json_string_length(t));
  else if (strlen(json_string_value(t)) != json_string_length(t))
    rc = pw_err_set(err, PW_EPROTO, "hello.token", "contains a NUL byte");
  if (rc == 0) {
    *job = (uint64_t)json_integer_value(j);
    *run = (uint32_t)json_integer_value(u);
    *rank = (uint32_t)json_integer_value(r);
    memcpy(token, json_string_value(t), json_string_length(t) + 1);
  }
  json_decref(o);
  return rc;
}

/* ---- reader ----------------------------------------------------------------- */

void pw_frame_reader_init(pw_frame_reader *r, size_t max_payload) {
  memset(r, 0, sizeof *r);
  r->max_payload = max_payload;
  r->state = PW_FR_HEADER;
}

void pw_frame_reader_free(pw_frame_reader *r) {
  free(r->buf);
  r->buf = NULL;
  r->buf_cap = 0;
  r->dest = NULL;
  r->state = PW_FR_DEAD;
  r->dead_code = PW_EINVAL;
  r->xfer_on = 0;
  r->xfer_got = 0;
}

void pw_frame_reader_set_max(pw_frame_reader *r, size_t max_payload) {
  r->max_payload = max_payload;
  if (r->state == PW_FR_HEADER && !r->xfer_on && r->buf_cap > r->max_payload) { /* keep the bound true */
    free(r->buf);
    r->buf = NULL;
    r->buf_cap = 0;
  }
}

static int die(pw_frame_reader *r, int code) {
  r->state = PW_FR_DEAD;
  r->dead_code = code;
  r->dest = NULL;
  return code;
}

/* HDR_READY -> PAYLOAD: fix where the payload goes. */
static void begin_payload(pw_frame_reader *r) {
  r->state = PW_FR_PAYLOAD;
  r->pay_got = 0;
  r->crc = 0;
}

/* Bytes of the whole payload: the frame's, or the chunked transfer's. */
static size_t total_len(const pw_frame_reader *r) {
  return (size_t)(r->xfer_on ? r->xfer.payload_len : r->hdr.payload_len);
}

/* Makes the internal buffer hold at least xfer_got + pay_got + 1 bytes
 * (growing geometrically toward the whole payload). 0 or PW_ENOMEM. */
static int grow(pw_frame_reader *r) {
  size_t len = total_len(r), at = r->xfer_got + r->pay_got;
  if (r->buf_cap > at) return 0;
  size_t cap = r->buf_cap ? r->buf_cap * 2 : GROW_FIRST;
  if (cap < r->buf_cap || cap > len) cap = len;
  uint8_t *p = realloc(r->buf, cap);
  if (!p) return PW_ENOMEM;
  r->buf = p;
  r->buf_cap = cap;
  return 0;
}

void pw_frame_reader_next_buf(pw_frame_reader *r, void **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  switch (r->state) {
    case PW_FR_HEADER:
      *buf = r->hdr_buf + r->hdr_got;
      *len = PW_FRAME_HDR_SIZE - r->hdr_got;
      return;
    case PW_FR_HDR_READY:
      begin_payload(r);
      /* fallthrough */
    case PW_FR_PAYLOAD: {
      /* this frame's payload is bytes [xfer_got, end) of the destination */
      size_t at = r->xfer_got + r->pay_got, end = r->xfer_got + (size_t)r->hdr.payload_len;
      if (r->dest) {
        *buf = r->dest + at;
        *len = end - at;
        return;
      }
      if (grow(r) < 0) {
        die(r, PW_ENOMEM);
        return;
      }
      if (r->buf_cap < end) end = r->buf_cap;
      *buf = r->buf + at;
      *len = end - at;
      return;
    }
    default:
      return;
  }
}

int pw_frame_reader_set_dest(pw_frame_reader *r, void *dst) {
  if (r->state != PW_FR_HDR_READY) return PW_EINVAL;
  r->dest = dst;
  return 0;
}

int pw_frame_reader_idle(const pw_frame_reader *r) {
  return r->state == PW_FR_HEADER && r->hdr_got == 0 && !r->xfer_on;
}

size_t pw_frame_reader_missing(const pw_frame_reader *r) {
  switch (r->state) {
    case PW_FR_HEADER: return PW_FRAME_HDR_SIZE - r->hdr_got;
    case PW_FR_HDR_READY: return (size_t)r->hdr.payload_len; /* pay_got is reset by next_buf */
    case PW_FR_PAYLOAD: return (size_t)r->hdr.payload_len - r->pay_got;
    default: return 0;
  }
}

static int finish(pw_frame_reader *r, pw_frame_event *ev, pw_err *err) {
  if (r->crc != r->hdr.payload_crc) {
    char hs[200];
    pw_err_set(err, PW_EPROTO, "frame", "payload_crc 0x%08x does not match the payload (0x%08x) of %s",
               r->hdr.payload_crc, r->crc, pw_frame_hdr_str(&r->hdr, hs, sizeof hs));
    return die(r, PW_EPROTO);
  }
  r->state = PW_FR_HEADER;
  r->hdr_got = 0;
  if (r->xfer_on) {
    r->xfer_got += (size_t)r->hdr.payload_len;
    r->xfer_next++;
    if (r->xfer_got < (size_t)r->xfer.payload_len) return PW_FRAME_NEED_MORE; /* the next chunk's header */
    ev->type = PW_FRAME_DONE;
    ev->hdr = r->xfer;
    ev->len = r->xfer_got;
    ev->payload = r->dest ? r->dest : r->buf;
    r->xfer_on = 0;
    r->xfer_got = 0;
    r->dest = NULL;
    r->frames++;
    return PW_FRAME_DONE;
  }
  ev->type = PW_FRAME_DONE;
  ev->hdr = r->hdr;
  ev->len = (size_t)r->hdr.payload_len;
  ev->payload = ev->len ? (r->dest ? r->dest : r->buf) : NULL;
  r->dest = NULL;
  r->frames++;
  return PW_FRAME_DONE;
}

static int same_tensor(const pw_frame_hdr *a, const pw_frame_hdr *b) {
  return a->kind == b->kind && a->job == b->job && a->step == b->step && a->microbatch == b->microbatch &&
         a->stage == b->stage && a->value == b->value && a->dtype == b->dtype && a->ndim == b->ndim &&
         !memcmp(a->dims, b->dims, sizeof a->dims);
}

/* A chunk's header is in (r->hdr, decoded): check it against the transfer
 * and make its payload the next bytes of the tensor. Chunk 0 starts the
 * transfer (returns PW_FRAME_HEADER: the caller reports the tensor's
 * header); a later chunk goes straight to PAYLOAD (PW_FRAME_NEED_MORE).
 * Negative, with err set, when the chunk does not fit. */
static int chunk_begin(pw_frame_reader *r, pw_err *err) {
  const pw_frame_hdr *h = &r->hdr;
  char hs[200], xs[200];
  if (!r->xfer_on) {
    if (h->chunk != 0)
      return pw_err_set(err, PW_EPROTO, "frame", "chunk %u came first; a transfer starts with chunk 0 (%s)", h->chunk,
                        pw_frame_hdr_str(h, hs, sizeof hs));
    r->xfer = *h;
    r->xfer.flags = 0;
    r->xfer.payload_len = shape_bytes(h->dims, h->ndim, pw_frame_dtype_size(h->dtype)); /* decode bounded it */
    r->xfer.payload_crc = r->xfer.header_crc = 0;
    r->xfer_got = 0;
    r->xfer_next = 0;
  } else if (!(h->flags & PW_FRAME_FLAG_CHUNK) || !same_tensor(h, &r->xfer)) {
    return pw_err_set(err, PW_EPROTO, "frame", "%s came inside the chunked transfer of %s (chunk %u due)",
                      pw_frame_hdr_str(h, hs, sizeof hs), pw_frame_hdr_str(&r->xfer, xs, sizeof xs), r->xfer_next);
  } else if (h->chunk != r->xfer_next) {
    return pw_err_set(err, PW_EPROTO, "frame", "chunk %u came where chunk %u was due, in %s", h->chunk,
                      r->xfer_next, pw_frame_hdr_str(&r->xfer, xs, sizeof xs));
  }
  size_t left = (size_t)r->xfer.payload_len - r->xfer_got;
  if (h->payload_len > left)
    return pw_err_set(err, PW_EPROTO, "frame", "chunk %u of %llu bytes overflows %s: %zu bytes are left", h->chunk,
                      (unsigned long long)h->payload_len, pw_frame_hdr_str(&r->xfer, xs, sizeof xs), left);
  int ends = h->payload_len == left, last = (h->flags & PW_FRAME_FLAG_LAST) != 0;
  if (ends != last)
    return pw_err_set(err, PW_EPROTO, "frame", "chunk %u %s, in %s", h->chunk,
                      last ? "is marked LAST but bytes are still missing after it"
                           : "ends the tensor but is not marked LAST",
                      pw_frame_hdr_str(&r->xfer, xs, sizeof xs));
  if (r->xfer_on) {
    begin_payload(r);
    return PW_FRAME_NEED_MORE;
  }
  r->xfer_on = 1;
  r->dest = NULL;
  r->state = PW_FR_HDR_READY;
  return PW_FRAME_HEADER;
}

int pw_frame_reader_advance(pw_frame_reader *r, size_t n, pw_frame_event *ev, pw_err *err) {
  switch (r->state) {
    case PW_FR_DEAD:
      if (r->dead_code == PW_ENOMEM)
        pw_err_set(err, PW_ENOMEM, "frame", "out of memory for a %zu-byte payload", total_len(r));
      else
        pw_err_set(err, r->dead_code, "frame", "stream is dead after an earlier error");
      return r->dead_code;
    case PW_FR_HEADER: {
      if (n > PW_FRAME_HDR_SIZE - r->hdr_got)
        return pw_err_set(err, PW_EINVAL, "frame", "advance(%zu) past the header buffer", n);
      r->hdr_got += n;
      if (r->hdr_got < PW_FRAME_HDR_SIZE) return PW_FRAME_NEED_MORE;
      int rc = pw_frame_hdr_decode(r->hdr_buf, r->max_payload, &r->hdr, err);
      if (rc < 0) return die(r, rc);
      if (r->xfer_on && r->hdr.kind == PW_FRAME_BYE) { /* the sender gave up mid-tensor: hear why */
        r->xfer_on = 0;
        r->xfer_got = 0;
      }
      if (r->xfer_on || (r->hdr.flags & PW_FRAME_FLAG_CHUNK)) {
        if ((rc = chunk_begin(r, err)) < 0) return die(r, rc);
        if (rc == PW_FRAME_NEED_MORE) return rc; /* a later chunk: no event */
        ev->type = PW_FRAME_HEADER;
        ev->hdr = r->xfer;
        ev->payload = NULL;
        ev->len = 0;
        return PW_FRAME_HEADER;
      }
      r->dest = NULL;
      if (r->hdr.payload_len == 0) {
        begin_payload(r);
        return finish(r, ev, err);
      }
      r->state = PW_FR_HDR_READY;
      ev->type = PW_FRAME_HEADER;
      ev->hdr = r->hdr;
      ev->payload = NULL;
      ev->len = 0;
      return PW_FRAME_HEADER;
    }
    case PW_FR_HDR_READY:
      if (n) return pw_err_set(err, PW_EINVAL, "frame", "advance(%zu) without next_buf", n);
      return PW_FRAME_NEED_MORE;
    case PW_FR_PAYLOAD: {
      size_t len = (size_t)r->hdr.payload_len, at = r->xfer_got + r->pay_got;
      uint8_t *base = r->dest ? r->dest : r->buf;
      size_t end = r->xfer_got + len; /* at <= end */
      if (!r->dest && r->buf_cap < end) end = r->buf_cap;
      size_t room = end - at;
      if (n > room)
        return pw_err_set(err, PW_EINVAL, "frame", "advance(%zu) past the %zu bytes given", n, room);
      if (n) r->crc = pw_crc32c(r->crc, base + at, n);
      r->pay_got += n;
      if (r->pay_got < len) return PW_FRAME_NEED_MORE;
      return finish(r, ev, err);
    }
    default:
      return pw_err_set(err, PW_EINVAL, "frame", "bad reader state %d", r->state);
  }
}

int pw_frame_reader_feed(pw_frame_reader *r, const void *data, size_t n, pw_frame_cb cb, void *ctx,
                         pw_err *err) {
  const uint8_t *p = data;
  int frames = 0;
  pw_frame_event ev;
  /* Loop also with n == 0 left while events are pending (an empty payload
   * completes without bytes, a HEADER event needs next_buf to move on). */
  for (;;) {
    void *dst;
    size_t room;
    pw_frame_reader_next_buf(r, &dst, &room);
    if (!room) return pw_frame_reader_advance(r, 0, &ev, err); /* dead: report */
    if (!n) return frames;
    size_t k = n < room ? n : room;
    memcpy(dst, p, k);
    p += k;
    n -= k;
    int rc = pw_frame_reader_advance(r, k, &ev, err);
    if (rc < 0) return rc;
    if (rc == PW_FRAME_NEED_MORE) continue;
    if (rc == PW_FRAME_DONE) frames++;
    if (cb) {
      int crc = cb(ctx, r, &ev);
      if (crc < 0) return crc;
    }
  }
}
