/* safetensors: the real safetensors format, written atomically, read warily.
 *
 * Writing: tensors go out in name order (as the Python library does),
 * packed back to back from offset 0; the JSON header is compact, with
 * "__metadata__" first when there is any, and padded with spaces so that
 * 8 + header length is a multiple of 8. The bytes go to "<path>.tmp.<pid>",
 * which is fsynced, renamed over path, and then the folder is fsynced: a
 * reader sees the old file or the new one, never half of one.
 *
 * Reading: the whole file is read into one buffer. Nothing in it is trusted:
 * the header length is checked against the file size and a 100 MiB bound,
 * every tensor entry must have exactly dtype / shape / data_offsets with the
 * right types, the byte range must lie inside the data and match the shape,
 * and no two ranges may overlap (gaps are allowed). Errors put the file name
 * in err->path and say which tensor and what is wrong in err->msg.
 *
 * Checksums: every file written here carries, for each tensor, the CRC32C
 * of its bytes in the metadata ("pw.crc32c.<name>": 8 hex digits), and a
 * reader verifies every checksum a file carries before it hands out a
 * byte: a bit flipped on disk or in transit is an error naming the tensor.
 * Files from other writers (PyTorch's) carry none and are read as they are.
 *
 * This file never reads a size from a file without checking it first, and
 * never leaves a temporary file behind on failure. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c writes host-order data and assumes a little-endian host"
#endif

#define PW__ST_MAX_HEADER (100ull << 20)

static const char *const dtype_names[] = {"F32", "I32", "I64", "F64", "BF16", "F16"};
static const int dtype_sizes[] = {4, 4, 8, 8, 2, 2};

static int dtype_valid(int d) { return d >= PW_ST_F32 && d <= PW_ST_F16; }

/* "[2,3]" */
static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, cap - k, "[");
  for (int d = 0; d < ndim && k < cap; d++)
    k += (size_t)snprintf(buf + k, cap - k, d ? ",%lld" : "%lld", (long long)shape[d]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* Bytes of a tensor, or -1 on overflow. */
static int64_t tensor_bytes(pw_st_dtype dt, int ndim, const int64_t *shape) {
  int64_t n = dtype_sizes[dt];
  for (int d = 0; d < ndim; d++)
    if (__builtin_mul_overflow(n, shape[d], &n)) return -1;
  return n;
}

/* ---- writing ---------------------------------------------------------- */

static int cmp_tensor_ptr(const void *a, const void *b) {
  return strcmp((*(const pw_st_tensor *const *)a)->name, (*(const pw_st_tensor *const *)b)->name);
}

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* fsync the folder holding path so the rename itself is durable. */
static int fsync_parent(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) {
    snprintf(dir, sizeof dir, ".");
  } else if (slash == path) {
    snprintf(dir, sizeof dir, "/");
  } else {
    size_t n = (size_t)(slash - path);
    if (n >= sizeof dir) return 0; /* absurd path: skip, the data is already synced */
    memcpy(dir, path, n);
    dir[n] = 0;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  if (rc < 0 && errno == EINVAL) rc = 0; /* some filesystems cannot sync folders */
  int saved = errno;
  close(fd);
  errno = saved;
  return rc;
}

/* Validates the arguments and builds the padded header. */
static int build_header(const char *path, const pw_st_tensor *const *order, int n,
                        const pw_st_meta *meta, int n_meta, char **out, size_t *out_len,
                        pw_err *err) {
  json_t *root = json_object();
  if (!root) return pw_err_set(err, PW_ENOMEM, path, "out of memory building the header");
  int rc = 0;
  if (n_meta > 0 || n > 0) {
    json_t *m = json_object();
    json_object_set_new(root, "__metadata__", m);
    for (int j = 0; j < n_meta; j++) {
      if (!meta[j].key || !meta[j].value) {
        rc = pw_err_set(err, PW_EINVAL, path, "metadata entry %d has a NULL key or value", j);
        goto done;
      }
      if (!strncmp(meta[j].key, PW_ST_CRC_PREFIX, strlen(PW_ST_CRC_PREFIX))) {
        rc = pw_err_set(err, PW_EINVAL, path, "metadata key '%s': the prefix " PW_ST_CRC_PREFIX " is reserved",
                        meta[j].key);
        goto done;
      }
      if (json_object_get(m, meta[j].key)) {
        rc = pw_err_set(err, PW_EINVAL, path, "metadata key '%s' given twice", meta[j].key);
        goto done;
      }
      if (json_object_set_new(m, meta[j].key, json_string(meta[j].value)) < 0) {
        rc = pw_err_set(err, PW_EINVAL, path, "metadata '%s' is not valid UTF-8", meta[j].key);
        goto done;
      }
    }
    for (int k = 0; k < n; k++) {
      char key[PW_ST_CRC_KEY_MAX], hex[9];
      if (snprintf(key, sizeof key, PW_ST_CRC_PREFIX "%s", order[k]->name) >= (int)sizeof key) {
        rc = pw_err_set(err, PW_EINVAL, path, "tensor name '%.64s...' is too long", order[k]->name);
        goto done;
      }
      int64_t nb = tensor_bytes(order[k]->dtype, order[k]->ndim, order[k]->shape);
      snprintf(hex, sizeof hex, "%08x", pw_crc32c(0, order[k]->data, nb > 0 ? (size_t)nb : 0));
      json_object_set_new(m, key, json_string(hex));
    }
  }
  int64_t off = 0;
  for (int k = 0; k < n; k++) {
    const pw_st_tensor *t = order[k];
    int64_t nb = tensor_bytes(t->dtype, t->ndim, t->shape);
    if (nb < 0 || __builtin_add_overflow(off, nb, &off) || off > (int64_t)(SIZE_MAX / 2)) {
      rc = pw_err_set(err, PW_EINVAL, path, "tensor '%s': size overflows", t->name);
      goto done;
    }
    json_t *e = json_object(), *shape = json_array(), *offs = json_array();
    for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    json_array_append_new(offs, json_integer(off - nb));
    json_array_append_new(offs, json_integer(off));
    json_object_set_new(e, "dtype", json_string(dtype_names[t->dtype]));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets", offs);
    if (json_object_set_new(root, t->name, e) < 0) {
      rc = pw_err_set(err, PW_EINVAL, path, "tensor name '%s' is not valid UTF-8", t->name);
      goto done;
    }
  }
  char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
  if (!s) {
    rc = pw_err_set(err, PW_EINVAL, path, "cannot encode the header (names must be UTF-8)");
    goto done;
  }
  size_t len = strlen(s), padded = (len + 7) & ~(size_t)7;
  char *buf = malloc(padded ? padded : 1);
  if (!buf) {
    free(s);
    rc = pw_err_set(err, PW_ENOMEM, path, "out of memory building the header");
    goto done;
  }
  memcpy(buf, s, len);
  memset(buf + len, ' ', padded - len);
  free(s);
  *out = buf;
  *out_len = padded;
done:
  json_decref(root);
  return rc;
}

static int check_tensors(const char *path, const pw_st_tensor *const *order, int n, pw_err *err) {
  for (int k = 0; k < n; k++) {
    const pw_st_tensor *t = order[k];
    if (!dtype_valid((int)t->dtype))
      return pw_err_set(err, PW_EINVAL, path, "tensor '%s': unknown dtype %d", t->name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > PW_ST_MAX_DIMS)
      return pw_err_set(err, PW_EINVAL, path, "tensor '%s': ndim %d outside 0..%d", t->name,
                        t->ndim, PW_ST_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++)
      if (t->shape[d] < 0)
        return pw_err_set(err, PW_EINVAL, path, "tensor '%s': dimension %d is negative (%lld)",
                          t->name, d, (long long)t->shape[d]);
    if (strcmp(t->name, "__metadata__") == 0)
      return pw_err_set(err, PW_EINVAL, path, "'__metadata__' is reserved, not a tensor name");
    if (!t->data && tensor_bytes(t->dtype, t->ndim, t->shape) != 0)
      return pw_err_set(err, PW_EINVAL, path, "tensor '%s': data is NULL", t->name);
    if (k > 0 && strcmp(order[k - 1]->name, t->name) == 0)
      return pw_err_set(err, PW_EINVAL, path, "tensor name '%s' given twice", t->name);
  }
  return 0;
}

int pw_st_write(const char *path, const pw_st_tensor *tensors, int n_tensors,
                const pw_st_meta *meta, int n_meta, pw_err *err) {
  if (!path || n_tensors < 0 || n_meta < 0 || (n_tensors > 0 && !tensors) || (n_meta > 0 && !meta))
    return pw_err_set(err, PW_EINVAL, path ? path : "", "bad arguments to pw_st_write");
  for (int i = 0; i < n_tensors; i++)
    if (!tensors[i].name)
      return pw_err_set(err, PW_EINVAL, path, "tensor %d has no name", i);

  /* Sort pointers, not indices: no global qsort context, so threads may write at once. */
  const pw_st_tensor **order = malloc(sizeof *order * (size_t)(n_tensors ? n_tensors : 1));
  if (!order) return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  for (int i = 0; i < n_tensors; i++) order[i] = &tensors[i];
  qsort(order, (size_t)n_tensors, sizeof *order, cmp_tensor_ptr);

  char *header = NULL;
  size_t hlen = 0;
  int rc = check_tensors(path, order, n_tensors, err);
  if (rc == 0) rc = build_header(path, order, n_tensors, meta, n_meta, &header, &hlen, err);
  if (rc) {
    free((void *)order);
    return rc;
  }

  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
    free((void *)order);
    free(header);
    return pw_err_set(err, PW_EINVAL, path, "path too long");
  }
  const char *what = "cannot create temporary file";
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) goto fail;

  unsigned char len8[8];
  for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
  what = "write failed";
  if (write_all(fd, len8, 8) < 0 || write_all(fd, header, hlen) < 0) goto fail;
  for (int k = 0; k < n_tensors; k++) {
    const pw_st_tensor *t = order[k];
    size_t nb = (size_t)tensor_bytes(t->dtype, t->ndim, t->shape);
    if (nb && write_all(fd, t->data, nb) < 0) goto fail;
  }
  what = "fsync failed";
  if (fsync(fd) < 0) goto fail;
  what = "close failed";
  int crc = close(fd);
  fd = -1;
  if (crc < 0) goto fail;
  what = "rename failed";
  if (rename(tmp, path) < 0) goto fail;
  free((void *)order);
  free(header);
  if (fsync_parent(path) < 0)
    return pw_err_set(err, PW_EIO, path, "fsync of the folder failed: %s", strerror(errno));
  return 0;

fail:;
  int saved = errno;
  if (fd >= 0) close(fd);
  unlink(tmp);
  free((void *)order);
  free(header);
  return pw_err_set(err, PW_EIO, path, "%s (%s): %s", what, tmp, strerror(saved));
}

/* ---- reading ---------------------------------------------------------- */

struct pw_st_file {
  char *path;           /* for error messages */
  unsigned char *buf;   /* the whole file */
  size_t size;
  int n;
  pw_st_tensor *tensors; /* sorted by name; names and data point into names/buf */
  int n_meta;
  pw_st_meta *meta;     /* sorted by key */
};

static int cmp_tensor_name(const void *a, const void *b) {
  return strcmp(((const pw_st_tensor *)a)->name, ((const pw_st_tensor *)b)->name);
}
static int cmp_meta_key(const void *a, const void *b) {
  return strcmp(((const pw_st_meta *)a)->key, ((const pw_st_meta *)b)->key);
}

typedef struct {
  int64_t begin, end;
  const char *name;
} range;

static int cmp_range(const void *a, const void *b) {
  const range *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int read_file(const char *path, unsigned char **out, size_t *out_size, pw_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return pw_err_set(err, errno == ENOENT ? PW_ENOENT : PW_EIO, path, "cannot open: %s",
                      strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int e = errno;
    close(fd);
    return pw_err_set(err, PW_EIO, path, "cannot stat: %s", strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return pw_err_set(err, PW_EIO, path, "not a regular file");
  }
  size_t size = (size_t)st.st_size;
  if ((uint64_t)st.st_size > SIZE_MAX / 2) {
    close(fd);
    return pw_err_set(err, PW_ETOOBIG, path, "file too large (%lld bytes)", (long long)st.st_size);
  }
  unsigned char *buf = malloc(size ? size : 1);
  if (!buf) {
    close(fd);
    return pw_err_set(err, PW_ENOMEM, path, "out of memory reading %zu bytes", size);
  }
  size_t got = 0;
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = errno;
      free(buf);
      close(fd);
      return pw_err_set(err, PW_EIO, path, "read failed: %s",
                        r == 0 ? "file shrank while reading" : strerror(e));
    }
    got += (size_t)r;
  }
  close(fd);
  *out = buf;
  *out_size = size;
  return 0;
}

/* A non-negative JSON integer, or -1. */
static int64_t json_nonneg(const json_t *v) {
  if (!json_is_integer(v)) return -1;
  json_int_t x = json_integer_value(v);
  return x < 0 ? -1 : (int64_t)x;
}

/* Parses one tensor entry into t (name already set). data_len: bytes after the header. */
static int parse_entry(const char *path, const char *name, json_t *e, size_t data_len,
                       pw_st_tensor *t, range *r, pw_err *err) {
  if (!json_is_object(e))
    return pw_err_set(err, PW_EFORMAT, path, "tensor '%s': entry is not an object", name);
  const char *key;
  json_t *v;
  json_object_foreach(e, key, v) {
    if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
      return pw_err_set(err, PW_EFORMAT, path, "tensor '%s': unknown field '%s'", name, key);
  }
  json_t *dt = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape"),
         *offs = json_object_get(e, "data_offsets");
  if (!dt || !shape || !offs)
    return pw_err_set(err, PW_EFORMAT, path, "tensor '%s': missing '%s'", name,
                      !dt ? "dtype" : !shape ? "shape" : "data_offsets");
  if (!json_is_string(dt))
    return pw_err_set(err, PW_EFORMAT, path, "tensor '%s': dtype is not a string", name);
  int d = -1;
  for (int k = 0; k <= PW_ST_F16; k++)
    if (strcmp(json_string_value(dt), dtype_names[k]) == 0) d = k;
  if (d < 0)
    return pw_err_set(err, PW_EFORMAT, path,
                      "tensor '%s': dtype '%.32s' is not supported (F32, I32, I64, F64, BF16, F16)", name,
                      json_string_value(dt));
  t->dtype = (pw_st_dtype)d;

  if (!json_is_array(shape))
    return pw_err_set(err, PW_EFORMAT, path, "tensor '%s': shape is not an array", name);
  if (json_array_size(shape) > PW_ST_MAX_DIMS)
    return pw_err_set(err, PW_EFORMAT, path, "tensor '%s': shape has %zu dimensions (at most %d)",
                      name, json_array_size(shape), PW_ST_MAX_DIMS);
  t->ndim = (int)json_array_size(shape);
  for (int k = 0; k < t->ndim; k++) {
    t->shape[k] = json_nonneg(json_array_get(shape, (size_t)k));
    if (t->shape[k] < 0)
      return pw_err_set(err, PW_EFORMAT, path,
                        "tensor '%s': shape[%d] is not a non-negative integer", name, k);
  }

  if (!json_is_array(offs) || json_array_size(offs) != 2)
    return pw_err_set(err, PW_EFORMAT, path, "tensor '%s': data_offsets is not [begin, end]", name);
  int64_t b = json_nonneg(json_array_get(offs, 0)), en = json_nonneg(json_array_get(offs, 1));
  if (b < 0 || en < 0)
    return pw_err_set(err, PW_EFORMAT, path,
                      "tensor '%s': data_offsets must be non-negative integers", name);
  if (b > en)
    return pw_err_set(err, PW_EFORMAT, path, "tensor '%s': data_offsets [%lld, %lld] end before they begin",
                      name, (long long)b, (long long)en);
  if ((uint64_t)en > data_len)
    return pw_err_set(err, PW_EFORMAT, path,
                      "tensor '%s': data_offsets [%lld, %lld] run past the data (%zu bytes)", name,
                      (long long)b, (long long)en, data_len);
  char sh[160];
  fmt_shape(sh, sizeof sh, t->ndim, t->shape);
  int64_t nb = tensor_bytes(t->dtype, t->ndim, t->shape);
  if (nb < 0)
    return pw_err_set(err, PW_EFORMAT, path, "tensor '%s': shape %s of %s overflows", name, sh,
                      dtype_names[d]);
  if (nb != en - b)
    return pw_err_set(err, PW_EFORMAT, path,
                      "tensor '%s': data_offsets [%lld, %lld] do not match shape %s of %s (%lld bytes)",
                      name, (long long)b, (long long)en, sh, dtype_names[d], (long long)nb);
  r->begin = b;
  r->end = en;
  r->name = name;
  return 0;
}

void pw_st_close(pw_st_file *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) free((char *)f->tensors[i].name);
  for (int i = 0; i < f->n_meta; i++) {
    free((char *)f->meta[i].key);
    free((char *)f->meta[i].value);
  }
  free(f->tensors);
  free(f->meta);
  free(f->buf);
  free(f->path);
  free(f);
}

static int parse_header(const char *path, pw_st_file *f, json_t *root, size_t data_off,
                        pw_err *err) {
  size_t data_len = f->size - data_off;
  size_t n_keys = json_object_size(root);
  json_t *meta = json_object_get(root, "__metadata__");
  size_t n_t = n_keys - (meta ? 1 : 0);
  f->tensors = calloc(n_t ? n_t : 1, sizeof *f->tensors);
  range *ranges = calloc(n_t ? n_t : 1, sizeof *ranges);
  if (!f->tensors || !ranges) {
    free(ranges);
    return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  }
  int rc = 0;
  if (meta) {
    if (!json_is_object(meta)) {
      rc = pw_err_set(err, PW_EFORMAT, path, "__metadata__ is not an object");
      goto out;
    }
    f->meta = calloc(json_object_size(meta) ? json_object_size(meta) : 1, sizeof *f->meta);
    if (!f->meta) {
      rc = pw_err_set(err, PW_ENOMEM, path, "out of memory");
      goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
      if (!json_is_string(v)) {
        rc = pw_err_set(err, PW_EFORMAT, path, "__metadata__ '%s' is not a string", k);
        goto out;
      }
      pw_st_meta *m = &f->meta[f->n_meta];
      m->key = strdup(k);
      m->value = strdup(json_string_value(v));
      f->n_meta++;
      if (!m->key || !m->value) {
        rc = pw_err_set(err, PW_ENOMEM, path, "out of memory");
        goto out;
      }
    }
    qsort(f->meta, (size_t)f->n_meta, sizeof *f->meta, cmp_meta_key);
  }
  const char *name;
  json_t *e;
  json_object_foreach(root, name, e) {
    if (strcmp(name, "__metadata__") == 0) continue;
    pw_st_tensor *t = &f->tensors[f->n];
    t->name = strdup(name);
    if (!t->name) {
      rc = pw_err_set(err, PW_ENOMEM, path, "out of memory");
      goto out;
    }
    f->n++;
    if ((rc = parse_entry(path, name, e, data_len, t, &ranges[f->n - 1], err))) goto out;
    t->data = f->buf + data_off + ranges[f->n - 1].begin;
  }
  qsort(ranges, (size_t)f->n, sizeof *ranges, cmp_range);
  const range *prev = NULL;
  for (int i = 0; i < f->n; i++) {
    if (ranges[i].begin == ranges[i].end) continue; /* empty tensors overlap nothing */
    if (prev && ranges[i].begin < prev->end) {
      rc = pw_err_set(err, PW_EFORMAT, path,
                      "tensor '%s': data_offsets [%lld, %lld] overlap tensor '%s' [%lld, %lld]",
                      ranges[i].name, (long long)ranges[i].begin, (long long)ranges[i].end,
                      prev->name, (long long)prev->begin, (long long)prev->end);
      goto out;
    }
    prev = &ranges[i];
  }
  qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_tensor_name);
out:
  free(ranges);
  return rc;
}

/* Every checksum the metadata carries must name a tensor and match its bytes. */
static int check_crcs(const pw_st_file *f, pw_err *err) {
  size_t pl = strlen(PW_ST_CRC_PREFIX);
  for (int i = 0; i < f->n_meta; i++) {
    const char *key = f->meta[i].key, *val = f->meta[i].value;
    if (strncmp(key, PW_ST_CRC_PREFIX, pl)) continue;
    const pw_st_tensor *t = pw_st_find(f, key + pl);
    if (!t) return pw_err_set(err, PW_EFORMAT, f->path, "__metadata__ '%s' names no tensor", key);
    char *end;
    unsigned long want = strtoul(val, &end, 16);
    if (strlen(val) != 8 || *end) return pw_err_set(err, PW_EFORMAT, f->path, "__metadata__ '%s' is not 8 hex digits", key);
    uint32_t got = pw_crc32c(0, t->data, (size_t)tensor_bytes(t->dtype, t->ndim, t->shape));
    if (got != (uint32_t)want)
      return pw_err_set(err, PW_EFORMAT, f->path,
                        "tensor '%s': checksum mismatch (crc32c %08x, the file says %08lx): its bytes changed "
                        "after they were written", t->name, got, want);
  }
  return 0;
}

int pw_st_open(const char *path, pw_st_file **out, pw_err *err) {
  *out = NULL;
  pw_st_file *f = calloc(1, sizeof *f);
  if (!f) return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  f->path = strdup(path);
  int rc = f->path ? read_file(path, &f->buf, &f->size, err)
                   : pw_err_set(err, PW_ENOMEM, path, "out of memory");
  if (rc) {
    free(f->path);
    free(f);
    return rc;
  }
  if (f->size < 8) {
    rc = pw_err_set(err, PW_EFORMAT, path,
                    "file too short for a safetensors header (%zu bytes, need at least 8)", f->size);
    goto fail;
  }
  uint64_t hlen = 0;
  for (int b = 0; b < 8; b++) hlen |= (uint64_t)f->buf[b] << (8 * b);
  if (hlen > PW__ST_MAX_HEADER) {
    rc = pw_err_set(err, PW_EFORMAT, path, "header length %llu exceeds the 100 MiB limit",
                    (unsigned long long)hlen);
    goto fail;
  }
  if (hlen > f->size - 8) {
    rc = pw_err_set(err, PW_EFORMAT, path,
                    "header length %llu runs past the end of the file (%zu bytes)",
                    (unsigned long long)hlen, f->size);
    goto fail;
  }
  json_error_t jerr;
  json_t *root = json_loadb((const char *)f->buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    rc = pw_err_set(err, PW_EFORMAT, path, "header is not valid JSON: %s (line %d, column %d)",
                    jerr.text, jerr.line, jerr.column);
    goto fail;
  }
  if (!json_is_object(root)) {
    json_decref(root);
    rc = pw_err_set(err, PW_EFORMAT, path, "header is not a JSON object");
    goto fail;
  }
  rc = parse_header(path, f, root, 8 + (size_t)hlen, err);
  json_decref(root);
  if (rc || (rc = check_crcs(f, err))) goto fail;
  *out = f;
  return 0;
fail:
  pw_st_close(f);
  return rc;
}

int pw_st_count(const pw_st_file *f) { return f->n; }

const pw_st_tensor *pw_st_get(const pw_st_file *f, int i) {
  return i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const pw_st_tensor *pw_st_find(const pw_st_file *f, const char *name) {
  if (f->n == 0) return NULL;
  pw_st_tensor key = {.name = name};
  return bsearch(&key, f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_tensor_name);
}

const char *pw_st_meta_get(const pw_st_file *f, const char *key) {
  if (f->n_meta == 0) return NULL; /* f->meta may be NULL: not for bsearch */
  pw_st_meta k = {.key = key};
  const pw_st_meta *m = bsearch(&k, f->meta, (size_t)f->n_meta, sizeof *f->meta, cmp_meta_key);
  return m ? m->value : NULL;
}

int pw_st_copy(const pw_st_file *f, const char *name, pw_st_dtype dtype, int ndim,
               const int64_t *shape, void *dst, pw_err *err) {
  const pw_st_tensor *t = pw_st_find(f, name);
  if (!t) return pw_err_set(err, PW_ENOENT, f->path, "tensor '%s' not found", name);
  if (!dtype_valid((int)dtype) || ndim < 0 || ndim > PW_ST_MAX_DIMS)
    return pw_err_set(err, PW_EINVAL, f->path, "tensor '%s': bad dtype or ndim requested", name);
  if (t->dtype != dtype)
    return pw_err_set(err, PW_EFORMAT, f->path, "tensor '%s': dtype is %s, expected %s", name,
                      dtype_names[t->dtype], dtype_names[dtype]);
  int same = t->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  if (!same) {
    char a[160], b[160];
    fmt_shape(a, sizeof a, t->ndim, t->shape);
    fmt_shape(b, sizeof b, ndim, shape);
    return pw_err_set(err, PW_EFORMAT, f->path, "tensor '%s': shape is %s, expected %s", name, a, b);
  }
  size_t nb = (size_t)tensor_bytes(t->dtype, t->ndim, t->shape);
  if (nb) memcpy(dst, t->data, nb);
  return 0;
}

/* IEEE half to float, exactly (subnormals, infinities and NaN included). */
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  if (e == 0x1f) bits = sign | 0x7f800000u | m << 13;
  else if (e) bits = sign | (e + 112) << 23 | m << 13;
  else if (!m) bits = sign;
  else { /* subnormal: m * 2^-24 */
    float f = (float)m * 0x1p-24f;
    memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

int pw_st_to_f32(const pw_st_tensor *t, float *dst, const char *what, pw_err *err) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  const uint8_t *src = t->data;
  if (t->dtype == PW_ST_F32) {
    memcpy(dst, src, (size_t)n * 4);
    return 0;
  }
  if (t->dtype != PW_ST_BF16 && t->dtype != PW_ST_F16)
    return pw_err_set(err, PW_EFORMAT, what, "tensor '%s': dtype %s; only F32, BF16 and F16 are read here", t->name,
                      dtype_valid((int)t->dtype) ? dtype_names[t->dtype] : "?");
  for (int64_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, src + 2 * i, 2);
    if (t->dtype == PW_ST_F16) {
      dst[i] = f16_to_f32(h);
    } else {
      uint32_t bits = (uint32_t)h << 16;
      memcpy(&dst[i], &bits, 4);
    }
  }
  return 0;
}
