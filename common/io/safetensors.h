/* safetensors: read and write the real safetensors format.
 *
 * Layout: 8-byte little-endian header length n, n bytes of JSON header
 * {"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}, ...,
 *  "__metadata__": {"key": "string", ...}}, then the raw little-endian data.
 * Offsets are relative to the end of the header. The header is padded with
 * spaces to a multiple of 8 bytes so the data is aligned.
 *
 * Writes go to "<path>.tmp.<pid>", are fsynced, then renamed over path: a
 * reader never sees a half-written file. Reads validate everything (header
 * length against the file size, JSON, dtypes, shapes against byte ranges,
 * ranges inside the data and non-overlapping) and never trust a size. */
#ifndef PW_SAFETENSORS_H
#define PW_SAFETENSORS_H

#include <stdint.h>

#include "errors.h"

#define PW_ST_MAX_DIMS 8
/* Metadata key of a tensor's checksum: PW_ST_CRC_PREFIX + its name (see
 * safetensors.c); writers add them, readers verify them. */
#define PW_ST_CRC_PREFIX "pw.crc32c."
#define PW_ST_CRC_KEY_MAX 256

/* BF16 and F16 are read (Hugging Face's checkpoints; pw_st_to_f32 widens
 * them exactly); our own files are F32. */
typedef enum { PW_ST_F32, PW_ST_I32, PW_ST_I64, PW_ST_F64, PW_ST_BF16, PW_ST_F16 } pw_st_dtype;

typedef struct {
  const char *name;
  pw_st_dtype dtype;
  int ndim;
  int64_t shape[PW_ST_MAX_DIMS];
  const void *data;  /* product(shape) elements of dtype */
} pw_st_tensor;

/* Metadata is a list of string key/value pairs (safetensors allows strings only). */
typedef struct {
  const char *key;
  const char *value;
} pw_st_meta;

PW_MUST_CHECK int pw_st_write(const char *path, const pw_st_tensor *tensors, int n_tensors,
                const pw_st_meta *meta, int n_meta, pw_err *err);

typedef struct pw_st_file pw_st_file;

/* Loads and validates the whole file. Errors name the file and what is wrong. */
PW_MUST_CHECK int pw_st_open(const char *path, pw_st_file **out, pw_err *err);
void pw_st_close(pw_st_file *f);
int pw_st_count(const pw_st_file *f);
/* Tensor i (sorted by name) — name, dtype, shape; data is not aligned-safe: use pw_st_copy. */
const pw_st_tensor *pw_st_get(const pw_st_file *f, int i);
/* NULL if absent. */
const pw_st_tensor *pw_st_find(const pw_st_file *f, const char *name);
/* Metadata value for key, or NULL. */
const char *pw_st_meta_get(const pw_st_file *f, const char *key);
/* Copy tensor `name` into dst after checking dtype and shape equal the
 * given ones; errors say which tensor and what differs. */
PW_MUST_CHECK int pw_st_copy(const pw_st_file *f, const char *name, pw_st_dtype dtype, int ndim,
               const int64_t *shape, void *dst, pw_err *err);

/* Tensor t's elements as float32 into dst (numel of them): F32 copied,
 * BF16 and F16 widened exactly; any other dtype is PW_EFORMAT naming the
 * tensor and its dtype (what names the file in the error). */
PW_MUST_CHECK int pw_st_to_f32(const pw_st_tensor *t, float *dst, const char *what, pw_err *err);

#endif
