/* fuzz_tfevents: the TensorBoard event file reader (common/io/tfevents.h)
 * on any file contents.
 *
 * The first byte's low bit asks the harness to fix up the checksums of the
 * records it finds first (so the fuzzer gets past both CRCs to the
 * protobuf decoder behind them); the rest is the file. Properties:
 *   - the reader never reads past the file, and an error, once reported,
 *     is reported again;
 *   - a file read whole re-encodes (pw_tf_append) into a file that reads
 *     back as the same events: kinds, wall time and value bits, steps,
 *     version text, tags;
 *   - one byte changed in a whole file is always caught, at the record that
 *     holds it: every event before it comes back as it was, none after;
 *   - a whole file cut short reads as its whole records when the cut falls
 *     between them, else ends in a "truncated record" error at the cut one. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tfevents.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_EVENTS 4096

/* What an event says, for comparing two reads (tags and text copied). */
typedef struct {
  int kind, n;
  uint64_t wall, offset;
  int64_t step;
  char *text; /* version, or the tags joined by '\n' */
  uint32_t *bits;
} rec;

static void rec_take(rec *r, const pw_tf_event *ev) {
  memcpy(&r->wall, &ev->wall_time, 8);
  r->kind = ev->kind, r->step = ev->step, r->offset = ev->offset, r->n = ev->n_values;
  size_t len = ev->version ? strlen(ev->version) + 1 : 1;
  for (int i = 0; i < ev->n_values; i++) len += strlen(ev->values[i].tag) + 1;
  r->text = calloc(1, len);
  r->bits = calloc((size_t)ev->n_values + 1, sizeof *r->bits);
  if (!r->text || !r->bits) abort();
  if (ev->version) strcpy(r->text, ev->version);
  for (int i = 0; i < ev->n_values; i++) {
    strcat(r->text, ev->values[i].tag);
    strcat(r->text, "\n");
    memcpy(&r->bits[i], &ev->values[i].value, 4);
  }
}

static int rec_same(const rec *a, const pw_tf_event *ev, int with_offset) {
  rec b;
  rec_take(&b, ev);
  int same = a->kind == b.kind && a->wall == b.wall && a->step == b.step && a->n == b.n &&
             !strcmp(a->text, b.text) && !memcmp(a->bits, b.bits, sizeof *a->bits * (size_t)a->n) &&
             (!with_offset || a->offset == b.offset);
  free(b.text);
  free(b.bits);
  return same;
}

/* Reads buf: the events into recs (when not NULL), their count, the end's code. */
static int read_all(const uint8_t *buf, size_t n, rec *recs, int *count, pw_err *err) {
  pw_tf_reader r;
  pw_tf_reader_init(&r, buf, n, "fuzz");
  pw_tf_event ev;
  int rc;
  *count = 0;
  while ((rc = pw_tf_read(&r, &ev, err)) == 1) {
    if (ev.offset + PW_TF_HEADER + PW_TF_TRAILER > n) abort(); /* a record past the file */
    if (recs && *count < MAX_EVENTS) rec_take(&recs[*count], &ev);
    (*count)++;
  }
  if (rc < 0) { /* an error stands */
    pw_err again = {0};
    if (pw_tf_read(&r, &ev, &again) != rc || strcmp(again.msg, err->msg)) abort();
  }
  pw_tf_reader_free(&r);
  return rc;
}

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << 8 * i;
  return v;
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t n = size - 1;
  uint8_t *file = malloc(n ? n : 1);
  if (!file) abort();
  memcpy(file, data + 1, n);
  if (data[0] & 1) /* fix up both CRCs of every record that fits */
    for (size_t off = 0; off + PW_TF_HEADER <= n;) {
      uint64_t len = le64(file + off);
      put32(file + off + 8, pw_tf_masked_crc(file + off, 8));
      if (len > n - off - PW_TF_HEADER || n - off - PW_TF_HEADER - len < PW_TF_TRAILER) break;
      put32(file + off + PW_TF_HEADER + len, pw_tf_masked_crc(file + off + PW_TF_HEADER, (size_t)len));
      off += PW_TF_HEADER + (size_t)len + PW_TF_TRAILER;
    }
  static rec recs[MAX_EVENTS];
  int count = 0;
  pw_err err = {0};
  int rc = read_all(file, n, recs, &count, &err);
  if (rc != 0 || count > MAX_EVENTS) goto out;

  /* whole: re-encoded, it reads back the same (what the writer can write) */
  pw_tf_buf b = {0};
  int kept = 0;
  static int keep[MAX_EVENTS];
  pw_tf_reader r;
  pw_tf_reader_init(&r, file, n, "fuzz");
  pw_tf_event ev;
  for (int k = 0; pw_tf_read(&r, &ev, &err) == 1; k++) {
    int ok = ev.kind == PW_TF_VERSION || ev.kind == PW_TF_START || ev.kind == PW_TF_SCALARS;
    for (int i = 0; ok && i < ev.n_values; i++) ok = ev.values[i].tag[0] && strlen(ev.values[i].tag) <= 4096;
    if (!ok) continue;
    if (ev.kind == PW_TF_SCALARS) ev.n_other = 0;
    if (pw_tf_append(&b, &ev, &err)) abort();
    keep[kept++] = k;
  }
  pw_tf_reader_free(&r);
  pw_tf_reader_init(&r, b.data, b.len, "again");
  int k = 0;
  while ((rc = pw_tf_read(&r, &ev, &err)) == 1) {
    if (k >= kept || !rec_same(&recs[keep[k]], &ev, 0)) abort(); /* written, it reads otherwise */
    k++;
  }
  if (rc != 0 || k != kept) abort();
  pw_tf_reader_free(&r);
  pw_tf_buf_free(&b);

  if (n == 0) goto out;
  /* one byte changed: caught at its record, the events before it intact */
  size_t at = (size_t)(le64((const uint8_t[8]){data[size / 2], data[size / 3], data[size - 1], 0}) % n);
  uint8_t old = file[at];
  file[at] ^= (uint8_t)(data[size - 1] | 1);
  int hit = 0;
  while (hit + 1 < count && recs[hit + 1].offset <= at) hit++;
  int got = 0;
  {
    pw_tf_reader_init(&r, file, n, "fuzz");
    while ((rc = pw_tf_read(&r, &ev, &err)) == 1) {
      if (got >= hit || !rec_same(&recs[got], &ev, 1)) abort(); /* a changed byte went unnoticed */
      got++;
    }
    pw_tf_reader_free(&r);
    char want[64];
    snprintf(want, sizeof want, "at byte %llu", (unsigned long long)recs[hit].offset);
    if (rc != PW_EFORMAT || got != hit || !strstr(err.msg, want)) abort();
  }
  file[at] = old;
  /* cut short at `at` */
  int whole = 0;
  while (whole < count && recs[whole].offset < at) whole++; /* records starting before the cut */
  int boundary = whole == count ? 0 : recs[whole].offset == at;
  rc = read_all(file, at, NULL, &got, &err);
  if (boundary || at == 0) {
    if (rc != 0 || got != whole) abort();
  } else {
    char want[64];
    snprintf(want, sizeof want, "truncated record at byte %llu", (unsigned long long)recs[whole - 1].offset);
    if (rc != PW_EFORMAT || got != whole - 1 || !strstr(err.msg, want)) abort();
  }
out:
  for (int i = 0; i < count && i < MAX_EVENTS; i++) {
    free(recs[i].text);
    free(recs[i].bits);
    recs[i] = (rec){0};
  }
  free(file);
  return 0;
}
