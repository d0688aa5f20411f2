/* tokfile: token files — the output of a real tokenizer as training data.
 *
 * A small fixed header, then the ids (docs/contracts.md, "Token files"):
 *
 *   bytes  0..7   magic "PWTOKENS"
 *          8..11  u32 version, 1
 *         12..15  u32 width: bytes per id, 2 or 4
 *         16..19  u32 vocab_size: >= 1; at most 65536 when width is 2
 *         20..23  u32 reserved, 0
 *         24..31  u64 n_tokens
 *         32..    n_tokens ids, each < vocab_size
 *
 * All integers little-endian; the file is exactly 32 + n_tokens * width
 * bytes. Like llm.c's .bin files, but the header says the vocabulary and
 * the width, so a file cannot be read with the wrong one.
 * A file that does not start with the magic is byte-level text. */
#ifndef PW_TOKFILE_H
#define PW_TOKFILE_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_TOKFILE_MAGIC "PWTOKENS"
#define PW_TOKFILE_HEADER 32
#define PW_TOKFILE_VERSION 1

typedef struct {
  uint32_t version, width, vocab_size;
  uint64_t n_tokens;
} pw_tokfile_hdr;

/* 1 when buf starts with the magic (a token file, good or bad), else 0. */
int pw_tokfile_is_tokens(const uint8_t *buf, size_t n);

/* Checks the header in buf[0..n) and, when file_size is not 0, that the
 * file holds exactly its ids. Errors are PW_EFORMAT at path `what`
 * ("data.path", a file name, ...) and say which field is wrong. */
PW_MUST_CHECK int pw_tokfile_header_parse(const uint8_t *buf, size_t n, uint64_t file_size,
                                          pw_tokfile_hdr *h, const char *what, pw_err *err);
void pw_tokfile_header_write(const pw_tokfile_hdr *h, uint8_t out[PW_TOKFILE_HEADER]);

/* The first id >= h->vocab_size among n ids of h->width bytes, as an
 * error naming its index (first + its place in ids) and value; 0 when
 * every id fits. */
PW_MUST_CHECK int pw_tokfile_check_ids(const uint8_t *ids, uint64_t n, uint64_t first, const pw_tokfile_hdr *h,
                                       const char *what, pw_err *err);
/* Id i of a checked buffer. */
static inline uint32_t pw_tokfile_id(const uint8_t *ids, uint32_t width, uint64_t i) {
  const uint8_t *p = ids + i * width;
  return width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                    : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads a whole file and checks header and ids (h filled on success). */
PW_MUST_CHECK int pw_tokfile_check(const char *path, pw_tokfile_hdr *h, pw_err *err);

/* Byte-level text -> token file (width 2, vocab 256: id = byte), streamed;
 * written to out.tmp-PID, fsynced and renamed. h gets the header written. */
PW_MUST_CHECK int pw_tokfile_from_text(const char *in, const char *out, pw_tokfile_hdr *h, pw_err *err);

/* ids[0..n) (each < vocab_size) -> a token file, 2-byte ids when
 * vocab_size <= 65536 else 4; written to out.tmp-PID, fsynced and renamed,
 * so a reader never sees half a file. h gets the header written. */
PW_MUST_CHECK int pw_tokfile_write(const char *out, const uint32_t *ids, uint64_t n, uint32_t vocab_size,
                                   pw_tokfile_hdr *h, pw_err *err);

#endif
