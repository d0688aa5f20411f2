/* tfevents: TensorBoard's event files — written from a job's metrics and
 * read back with every check TensorBoard makes. It must never hand back a
 * value from a record whose checksums do not hold.
 *
 * A file is a sequence of records (TFRecord framing), each
 *
 *   uint64  length of the data, little-endian
 *   uint32  masked CRC-32C of those 8 length bytes
 *   bytes   data: one protobuf `Event`
 *   uint32  masked CRC-32C of the data
 *
 * masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8, on CRC-32C
 * (common/base/crc32c.h). The protobuf messages, as far as they are used
 * here (tensorboard/compat/proto/event.proto, summary.proto):
 *
 *   Event      { double wall_time = 1; int64 step = 2;
 *                oneof what { string file_version = 3; Summary summary = 5;
 *                             SessionLog session_log = 7; ... } }
 *   Summary    { repeated Value value = 1; }
 *   Value      { string tag = 1; oneof value { float simple_value = 2; ... } }
 *   SessionLog { SessionStatus status = 1; }   START = 1
 *
 * A file starts with a file_version event "brain.Event:2"; a SessionLog
 * START at step N tells TensorBoard that a run restarted there: it drops
 * what it read at steps >= N before it (its purge_orphaned_data).
 *
 * The writer encodes exactly what protobuf's own serializer writes for the
 * same message (fields in number order, zero wall_time and step left out),
 * so the bytes can be compared with TensorBoard's. The reader accepts any
 * valid encoding: unknown fields are skipped, and summary values that are
 * not simple scalars (images, tensors, histograms) are counted, not read.
 * A record whose length, checksums or protobuf do not hold is an error
 * worded as TensorBoard's reader words it ("failed event crc32 check",
 * "truncated record in data"), with the record's offset; the events
 * before it stay good. */
#ifndef PW_TFEVENTS_H
#define PW_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_TF_FILE_VERSION "brain.Event:2"
#define PW_TF_HEADER 12  /* length + its CRC */
#define PW_TF_TRAILER 4  /* the data's CRC */

typedef enum {
  PW_TF_OTHER,   /* an event of another kind (a graph, run metadata ...): read past */
  PW_TF_VERSION, /* file_version */
  PW_TF_SCALARS, /* summary: its simple_value scalars */
  PW_TF_START    /* session_log START: a run (re)starts at step */
} pw_tf_kind;

typedef struct {
  const char *tag; /* NUL-terminated */
  float value;
} pw_tf_value;

/* One event. Written: the caller's pointers. Read: they point into the
 * reader and stay valid until its next read. */
typedef struct {
  pw_tf_kind kind;
  double wall_time;          /* seconds since the epoch */
  int64_t step;
  const char *version;       /* PW_TF_VERSION: the file_version text */
  const pw_tf_value *values; /* PW_TF_SCALARS */
  int n_values;
  int n_other;               /* read: summary values that are not simple scalars (skipped) */
  uint64_t offset;           /* read: where its record starts in the file */
} pw_tf_event;

/* A growing file in memory. Zero-initialised is empty. */
typedef struct {
  uint8_t *data;
  size_t len, cap;
} pw_tf_buf;

/* TensorBoard's masked CRC-32C of n bytes. */
uint32_t pw_tf_masked_crc(const void *p, size_t n);

/* Appends ev as one record: PW_TF_VERSION (ev->version, NULL for
 * PW_TF_FILE_VERSION), PW_TF_SCALARS (every value; a tag is 1..4096 bytes)
 * or PW_TF_START. PW_EINVAL for another kind or an empty or overlong tag,
 * PW_ENOMEM; b is unchanged on error. */
PW_MUST_CHECK int pw_tf_append(pw_tf_buf *b, const pw_tf_event *ev, pw_err *err);
void pw_tf_buf_free(pw_tf_buf *b);

/* Reads records out of a file held in memory (data[0..len), borrowed). */
typedef struct {
  const uint8_t *data;
  size_t len, off;           /* off: the next record's start */
  const char *name;          /* errors' path: the file's name */
  pw_tf_value *vals;         /* the current event's scalars */
  size_t *tag_at;            /* where each one's tag starts in text (text may move while it grows) */
  int cap_vals;
  char *text;                /* its tags and version text, NUL-terminated */
  size_t cap_text;
  pw_err failed;             /* the error that stopped it (code 0: none) */
} pw_tf_reader;

void pw_tf_reader_init(pw_tf_reader *r, const void *data, size_t len, const char *name);
/* The next event into *ev: 1, or 0 at the end (which must fall on a record
 * boundary), or a negative code with err naming the record's offset:
 *   PW_EFORMAT "truncated record at byte N (in header | header crc | data | data crc)"
 *   PW_EFORMAT "corrupted record at byte N: failed header crc32 check"
 *   PW_EFORMAT "corrupted record at byte N: failed event crc32 check"
 *   PW_EFORMAT "record at byte N is not an Event: <why>" (checksums hold, protobuf does not)
 *   PW_ENOMEM
 * After an error every later call returns the same error. */
PW_MUST_CHECK int pw_tf_read(pw_tf_reader *r, pw_tf_event *ev, pw_err *err);
void pw_tf_reader_free(pw_tf_reader *r);

#endif
