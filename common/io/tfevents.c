/* tfevents: TensorBoard event files (tfevents.h) — the record framing with
 * its two masked CRC-32Cs, and the few protobuf messages a scalar curve
 * needs, encoded and decoded by hand (varints, fixed64/fixed32 and
 * length-delimited fields). Never returns a value from a record whose
 * checksums fail, and never reads past the buffer it was given. */
#include "tfevents.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"

#define MAX_TAG 4096

/* Protobuf wire types and the field keys used here (number << 3 | type). */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };
enum {
  K_EV_WALL = 1 << 3 | WT_I64, K_EV_STEP = 2 << 3 | WT_VARINT, K_EV_VERSION = 3 << 3 | WT_LEN,
  K_EV_SUMMARY = 5 << 3 | WT_LEN, K_EV_SESSION = 7 << 3 | WT_LEN,
  K_SUM_VALUE = 1 << 3 | WT_LEN,
  K_VAL_TAG = 1 << 3 | WT_LEN, K_VAL_SIMPLE = 2 << 3 | WT_I32,
  K_LOG_STATUS = 1 << 3 | WT_VARINT
};
#define SESSION_START 1

uint32_t pw_tf_masked_crc(const void *p, size_t n) {
  uint32_t c = pw_crc32c(0, p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- writing --------------------------------------------------------------- */

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, n++;
  return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) *p++ = (uint8_t)(v | 0x80), v >>= 7;
  *p++ = (uint8_t)v;
  return p;
}

static uint8_t *put_le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) *p++ = (uint8_t)(v >> 8 * i);
  return p;
}

static uint64_t bits_of_double(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static uint32_t bits_of_float(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* A length-delimited field's size: key, length, body. */
static size_t ld_len(size_t body) { return 1 + varint_len(body) + body; }

static size_t value_len(const pw_tf_value *v) { return ld_len(strlen(v->tag)) + 1 + 4; }

/* The Event's "what" body (without its key and length). */
static size_t what_len(const pw_tf_event *ev, const char *version) {
  if (ev->kind == PW_TF_VERSION) return strlen(version);
  if (ev->kind == PW_TF_START) return 2;
  size_t n = 0;
  for (int i = 0; i < ev->n_values; i++) n += ld_len(value_len(&ev->values[i]));
  return n;
}

int pw_tf_append(pw_tf_buf *b, const pw_tf_event *ev, pw_err *err) {
  if (ev->kind != PW_TF_VERSION && ev->kind != PW_TF_SCALARS && ev->kind != PW_TF_START)
    return pw_err_set(err, PW_EINVAL, "event", "cannot write an event of kind %d", (int)ev->kind);
  if (ev->kind == PW_TF_SCALARS && (ev->n_values < 0 || (ev->n_values && !ev->values)))
    return pw_err_set(err, PW_EINVAL, "event", "%d values", ev->n_values);
  for (int i = 0; ev->kind == PW_TF_SCALARS && i < ev->n_values; i++) {
    size_t t = ev->values[i].tag ? strlen(ev->values[i].tag) : 0;
    if (t == 0 || t > MAX_TAG)
      return pw_err_set(err, PW_EINVAL, "tag", "value %d: a tag must be 1 to %d bytes (got %zu)", i, MAX_TAG, t);
  }
  const char *version = ev->version ? ev->version : PW_TF_FILE_VERSION;
  /* proto3: a zero wall_time or step is not written (protobuf's own encoding) */
  uint64_t wall = bits_of_double(ev->wall_time);
  size_t what = what_len(ev, version);
  size_t data = (wall ? 9 : 0) + (ev->step ? 1 + varint_len((uint64_t)ev->step) : 0) + ld_len(what);
  size_t need = PW_TF_HEADER + data + PW_TF_TRAILER;
  if (b->cap - b->len < need) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < need) cap *= 2;
    uint8_t *nd = realloc(b->data, cap);
    if (!nd) return pw_err_set(err, PW_ENOMEM, "event", "out of memory for a %zu-byte record", need);
    b->data = nd;
    b->cap = cap;
  }
  uint8_t *rec = b->data + b->len, *p = rec;
  p = put_le(p, data, 8);
  p = put_le(p, pw_tf_masked_crc(rec, 8), 4);
  uint8_t *d = p;
  if (wall) *p++ = K_EV_WALL, p = put_le(p, wall, 8);
  if (ev->step) *p++ = K_EV_STEP, p = put_varint(p, (uint64_t)ev->step);
  if (ev->kind == PW_TF_VERSION) {
    *p++ = K_EV_VERSION, p = put_varint(p, what);
    memcpy(p, version, what), p += what;
  } else if (ev->kind == PW_TF_START) {
    *p++ = K_EV_SESSION, p = put_varint(p, what);
    *p++ = K_LOG_STATUS, *p++ = SESSION_START;
  } else {
    *p++ = K_EV_SUMMARY, p = put_varint(p, what);
    for (int i = 0; i < ev->n_values; i++) {
      const pw_tf_value *v = &ev->values[i];
      size_t t = strlen(v->tag);
      *p++ = K_SUM_VALUE, p = put_varint(p, value_len(v));
      *p++ = K_VAL_TAG, p = put_varint(p, t);
      memcpy(p, v->tag, t), p += t;
      *p++ = K_VAL_SIMPLE, p = put_le(p, bits_of_float(v->value), 4);
    }
  }
  p = put_le(p, pw_tf_masked_crc(d, data), 4);
  b->len += need;
  return 0;
}

void pw_tf_buf_free(pw_tf_buf *b) {
  free(b->data);
  *b = (pw_tf_buf){0};
}

/* ---- reading --------------------------------------------------------------- */

void pw_tf_reader_init(pw_tf_reader *r, const void *data, size_t len, const char *name) {
  *r = (pw_tf_reader){.data = data, .len = len, .name = name ? name : "events"};
}

void pw_tf_reader_free(pw_tf_reader *r) {
  free(r->vals);
  free(r->tag_at);
  free(r->text);
  r->vals = NULL;
  r->tag_at = NULL;
  r->text = NULL;
  r->cap_vals = 0;
  r->cap_text = 0;
}

static uint64_t get_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << 8 * i;
  return v;
}

/* A cursor over one protobuf message. */
typedef struct {
  const uint8_t *p, *end;
  const char *why; /* set on the first malformed field */
} pb;

static int pb_varint(pb *m, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) { /* at most 10 bytes */
    if (m->p >= m->end) return m->why = "a varint runs past its message", -1;
    uint8_t byte = *m->p++;
    v |= (uint64_t)(byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return m->why = "a varint longer than 10 bytes", -1;
}

/* The next field: its key, and its value (a varint or fixed number in
 * *num, a length-delimited body in *body). 1 when one was read, 0 at the
 * message's end, -1 when malformed (m->why). */
static int pb_field(pb *m, uint64_t *key, uint64_t *num, pb *body) {
  if (m->p >= m->end) return 0;
  if (pb_varint(m, key)) return -1;
  if (*key >> 3 == 0) return m->why = "field number 0", -1;
  switch (*key & 7) {
    case WT_VARINT: return pb_varint(m, num) ? -1 : 1;
    case WT_I64:
    case WT_I32: {
      size_t n = (*key & 7) == WT_I64 ? 8 : 4;
      if ((size_t)(m->end - m->p) < n) return m->why = "a fixed-size field runs past its message", -1;
      *num = get_le(m->p, (int)n);
      m->p += n;
      return 1;
    }
    case WT_LEN: {
      uint64_t n;
      if (pb_varint(m, &n)) return -1;
      if (n > (uint64_t)(m->end - m->p)) return m->why = "a length-delimited field runs past its message", -1;
      *body = (pb){m->p, m->p + n, NULL};
      m->p += n;
      return 1;
    }
    default: return m->why = "a group or an unknown wire type", -1;
  }
}

/* Copies a string field's bytes into the reader's text, NUL-terminated;
 * where they start in *at. */
static int take_text(pw_tf_reader *r, const uint8_t *p, size_t n, size_t *used, size_t *at) {
  if (*used + n + 1 > r->cap_text) {
    size_t cap = r->cap_text ? r->cap_text : 256;
    while (cap < *used + n + 1) cap *= 2;
    char *nt = realloc(r->text, cap);
    if (!nt) return -1;
    r->text = nt;
    r->cap_text = cap;
  }
  if (n) memcpy(r->text + *used, p, n);
  r->text[*used + n] = 0;
  *at = *used;
  *used += n + 1;
  return 0;
}

/* One more scalar: value and the text offset of its tag. */
static int add_value(pw_tf_reader *r, int *n_vals, float v, size_t tag_at) {
  if (*n_vals >= r->cap_vals) {
    int cap = r->cap_vals ? r->cap_vals * 2 : 16;
    pw_tf_value *nv = realloc(r->vals, sizeof *nv * (size_t)cap);
    if (nv) r->vals = nv;
    size_t *nt = nv ? realloc(r->tag_at, sizeof *nt * (size_t)cap) : NULL;
    if (!nt) return -1;
    r->tag_at = nt;
    r->cap_vals = cap;
  }
  r->vals[*n_vals].value = v;
  r->tag_at[(*n_vals)++] = tag_at;
  return 0;
}

/* A Summary.Value: a simple scalar (1) with its tag added, or another
 * kind of value (0), or -1 malformed (*why), -2 out of memory. Within the
 * value oneof the last member written wins, as protobuf reads it. */
static int decode_value(pw_tf_reader *r, pb *val, size_t *used, int *n_vals, const char **why) {
  uint64_t key = 0, num = 0; /* (pb_field sets both when it returns 1; -O3 cannot see it) */
  pb f = {0};
  int rc, simple_set = 0;
  size_t tag_at = 0;
  const uint8_t *tag = NULL;
  size_t tag_n = 0;
  float simple = 0;
  while ((rc = pb_field(val, &key, &num, &f)) == 1) {
    unsigned field = (unsigned)(key >> 3);
    if (key == K_VAL_TAG) {
      tag = f.p, tag_n = (size_t)(f.end - f.p);
    } else if (key == K_VAL_SIMPLE) {
      uint32_t u = (uint32_t)num;
      memcpy(&simple, &u, sizeof simple);
      simple_set = 1;
    } else if (field >= 3 && field <= 8 && field != 7) {
      simple_set = 0; /* histogram, image, histo, audio or tensor */
    }
  }
  if (rc < 0) return *why = val->why, -1;
  if (!simple_set) return 0;
  if (take_text(r, tag, tag_n, used, &tag_at) || add_value(r, n_vals, simple, tag_at)) return -2;
  return 1;
}

/* Decodes the Event in d[0..n) into ev: 0, PW_EFORMAT (*why), PW_ENOMEM. */
static int decode_event(pw_tf_reader *r, const uint8_t *d, size_t n, pw_tf_event *ev, const char **why) {
  pb m = {d, d + n, NULL}, sub = {0};
  uint64_t key = 0, num = 0; /* (pb_field sets both when it returns 1; -O3 cannot see it) */
  size_t used = 0, version_at = 0;
  int rc, n_vals = 0;
  ev->kind = PW_TF_OTHER;
  while ((rc = pb_field(&m, &key, &num, &sub)) == 1) {
    if (key == K_EV_WALL) {
      memcpy(&ev->wall_time, &num, sizeof ev->wall_time);
    } else if (key == K_EV_STEP) {
      ev->step = (int64_t)num;
    } else if (key == K_EV_VERSION) {
      if (take_text(r, sub.p, (size_t)(sub.end - sub.p), &used, &version_at)) return PW_ENOMEM;
      ev->kind = PW_TF_VERSION;
    } else if (key == K_EV_SESSION) {
      pb f;
      uint64_t status = 0;
      while ((rc = pb_field(&sub, &key, &num, &f)) == 1)
        if (key == K_LOG_STATUS) status = num;
      if (rc < 0) return *why = sub.why, PW_EFORMAT;
      ev->kind = status == SESSION_START ? PW_TF_START : PW_TF_OTHER;
    } else if (key == K_EV_SUMMARY) { /* a repeated summary merges, as protobuf merges it */
      ev->kind = PW_TF_SCALARS;
      pb val = {0};
      while ((rc = pb_field(&sub, &key, &num, &val)) == 1) {
        if (key != K_SUM_VALUE) continue;
        int v = decode_value(r, &val, &used, &n_vals, why);
        if (v == -1) return PW_EFORMAT;
        if (v == -2) return PW_ENOMEM;
        if (v == 0) ev->n_other++;
      }
      if (rc < 0) return *why = sub.why, PW_EFORMAT;
    } else if ((key >> 3) >= 3 && (key >> 3) <= 9) {
      ev->kind = PW_TF_OTHER; /* another member of the what oneof */
    }
  }
  if (rc < 0) return *why = m.why, PW_EFORMAT;
  /* the text is complete: its addresses are final now */
  for (int i = 0; i < n_vals; i++) r->vals[i].tag = r->text + r->tag_at[i];
  ev->version = ev->kind == PW_TF_VERSION ? r->text + version_at : NULL;
  ev->values = ev->kind == PW_TF_SCALARS ? r->vals : NULL;
  ev->n_values = ev->kind == PW_TF_SCALARS ? n_vals : 0;
  if (ev->kind != PW_TF_SCALARS) ev->n_other = 0;
  return 0;
}

/* Stops the reader at an error, which every later call repeats. */
static int fail(pw_tf_reader *r, pw_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(pw_tf_reader *r, pw_err *err, int code, const char *fmt, ...) {
  char msg[sizeof r->failed.msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pw_err_set(&r->failed, code, r->name, "%s", msg);
  r->off = r->len;
  if (err) *err = r->failed;
  return code;
}

int pw_tf_read(pw_tf_reader *r, pw_tf_event *ev, pw_err *err) {
  *ev = (pw_tf_event){0};
  if (r->failed.code) {
    if (err) *err = r->failed;
    return r->failed.code;
  }
  size_t off = r->off, left = r->len - off;
  unsigned long long at = (unsigned long long)off;
  if (left == 0) return 0;
  const uint8_t *rec = r->data + off;
  /* TensorBoard's order: the length's CRC before the length is trusted */
  if (left < 8) return fail(r, err, PW_EFORMAT, "truncated record at byte %llu (in %s)", at, "header");
  if (left < PW_TF_HEADER) return fail(r, err, PW_EFORMAT, "truncated record at byte %llu (in %s)", at, "header crc");
  if (get_le(rec + 8, 4) != pw_tf_masked_crc(rec, 8))
    return fail(r, err, PW_EFORMAT, "corrupted record at byte %llu: failed %s crc32 check", at, "header");
  uint64_t n = get_le(rec, 8);
  if (n > left - PW_TF_HEADER) return fail(r, err, PW_EFORMAT, "truncated record at byte %llu (in %s)", at, "data");
  if (n + PW_TF_TRAILER > left - PW_TF_HEADER)
    return fail(r, err, PW_EFORMAT, "truncated record at byte %llu (in %s)", at, "data crc");
  const uint8_t *d = rec + PW_TF_HEADER;
  if (get_le(d + n, 4) != pw_tf_masked_crc(d, (size_t)n))
    return fail(r, err, PW_EFORMAT, "corrupted record at byte %llu: failed %s crc32 check", at, "event");
  const char *why = "";
  int rc = decode_event(r, d, (size_t)n, ev, &why);
  if (rc) {
    *ev = (pw_tf_event){0};
    if (rc == PW_ENOMEM) return fail(r, err, PW_ENOMEM, "out of memory reading the record at byte %llu", at);
    return fail(r, err, PW_EFORMAT, "record at byte %llu is not an Event: %s", at, why);
  }
  ev->offset = off;
  r->off = off + PW_TF_HEADER + (size_t)n + PW_TF_TRAILER;
  return 1;
}
