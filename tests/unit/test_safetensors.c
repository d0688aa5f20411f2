/* test_safetensors: round trips, the exact on-disk layout, writer failures,
 * and a table of corrupted files that must each fail with the right error.
 *
 * Also a helper for tests/ref/test_safetensors_py.sh:
 *   test_safetensors --write-sample PATH   writes the sample below
 *   test_safetensors --check-sample PATH   reads a sample written by Python
 * (exit 0 when the file holds exactly the sample). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

static char g_dir[64];

static int setup(void **state) {
  snprintf(g_dir, sizeof g_dir, "/tmp/pw_st_test_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  DIR *d = opendir(g_dir);
  if (d) {
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
      if (rmdir(p) != 0) unlink(p);
    }
    closedir(d);
  }
  rmdir(g_dir);
  return 0;
}

static const char *tpath(const char *name) {
  static char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  return p;
}

/* Fails unless err's full text contains want. */
static void expect_err(const pw_err *err, const char *want) {
  char buf[600];
  pw_err_str(err, buf, sizeof buf);
  if (!strstr(buf, want)) fail_msg("error '%s' does not contain '%s'", buf, want);
}

/* ---- the sample shared with the Python cross-check ---------------------- */

static float s_w[12], s_scalar[1] = {2.5f};
static double s_b[5];
static int32_t s_idx[6];
static int64_t s_big[2] = {1LL << 40, -(1LL << 50) + 3};

static void sample_fill(void) {
  for (int i = 0; i < 12; i++) s_w[i] = (float)i * 0.25f - 1.0f;
  for (int i = 0; i < 5; i++) s_b[i] = (double)i / 3.0;
  for (int i = 0; i < 6; i++) s_idx[i] = i * 7 - 10;
}

/* Deliberately not in name order: the writer must sort. */
static int sample_tensors(pw_st_tensor *t) {
  sample_fill();
  t[0] = (pw_st_tensor){"w", PW_ST_F32, 2, {3, 4}, s_w};
  t[1] = (pw_st_tensor){"b", PW_ST_F64, 1, {5}, s_b};
  t[2] = (pw_st_tensor){"idx", PW_ST_I32, 2, {2, 3}, s_idx};
  t[3] = (pw_st_tensor){"big", PW_ST_I64, 1, {2}, s_big};
  t[4] = (pw_st_tensor){"scalar", PW_ST_F32, 0, {0}, s_scalar};
  t[5] = (pw_st_tensor){"empty", PW_ST_F32, 2, {0, 3}, NULL};
  return 6;
}

static const pw_st_meta sample_meta[] = {
    {"format", "pt"},
    {"job", "a \"quoted\" name \xc3\xa9"},
};

/* 0 if f holds exactly the sample; otherwise prints what differs. */
static int sample_check(const pw_st_file *f) {
  pw_st_tensor t[8];
  int n = sample_tensors(t), bad = 0;
  if (pw_st_count(f) != n) {
    fprintf(stderr, "count %d, expected %d\n", pw_st_count(f), n);
    return 1;
  }
  for (int k = 0; k < n; k++) {
    char buf[256] = {0};
    pw_err err = {0};
    if (pw_st_copy(f, t[k].name, t[k].dtype, t[k].ndim, t[k].shape, buf, &err)) {
      char e[600];
      fprintf(stderr, "%s\n", pw_err_str(&err, e, sizeof e));
      bad++;
      continue;
    }
    size_t nb = t[k].dtype == PW_ST_F32 || t[k].dtype == PW_ST_I32 ? 4 : 8;
    for (int d = 0; d < t[k].ndim; d++) nb *= (size_t)t[k].shape[d];
    if (nb && memcmp(buf, t[k].data, nb)) {
      fprintf(stderr, "tensor '%s': values differ\n", t[k].name);
      bad++;
    }
  }
  for (int k = 1; k < n; k++)
    if (strcmp(pw_st_get(f, k - 1)->name, pw_st_get(f, k)->name) >= 0) {
      fprintf(stderr, "pw_st_get not sorted at %d\n", k);
      bad++;
    }
  for (size_t j = 0; j < sizeof sample_meta / sizeof *sample_meta; j++) {
    const char *v = pw_st_meta_get(f, sample_meta[j].key);
    if (!v || strcmp(v, sample_meta[j].value)) {
      fprintf(stderr, "metadata '%s' = '%s'\n", sample_meta[j].key, v ? v : "(absent)");
      bad++;
    }
  }
  return bad;
}

/* ---- tests ------------------------------------------------------------- */

static void test_round_trip(void **state) {
  pw_st_tensor t[8];
  int n = sample_tensors(t);
  pw_err err = {0};
  const char *p = tpath("rt.safetensors");
  assert_int_equal(pw_st_write(p, t, n, sample_meta, 2, &err), 0);
  pw_st_file *f = NULL;
  assert_int_equal(pw_st_open(p, &f, &err), 0);
  assert_int_equal(sample_check(f), 0);
  /* sorted: b big empty idx scalar w */
  const char *want[] = {"b", "big", "empty", "idx", "scalar", "w"};
  for (int k = 0; k < n; k++) assert_string_equal(pw_st_get(f, k)->name, want[k]);
  assert_null(pw_st_get(f, n));
  assert_null(pw_st_find(f, "nope"));
  assert_null(pw_st_meta_get(f, "nope"));
  const pw_st_tensor *w = pw_st_find(f, "w");
  assert_non_null(w);
  assert_int_equal(w->dtype, PW_ST_F32);
  assert_int_equal(w->ndim, 2);
  assert_int_equal(w->shape[0], 3);
  assert_int_equal(w->shape[1], 4);
  pw_st_close(f);

  /* overwrite: the new content replaces the old, nothing else is left */
  float one = 7.0f;
  pw_st_tensor t2 = {"only", PW_ST_F32, 1, {1}, &one};
  assert_int_equal(pw_st_write(p, &t2, 1, NULL, 0, &err), 0);
  assert_int_equal(pw_st_open(p, &f, &err), 0);
  assert_int_equal(pw_st_count(f), 1);
  assert_null(pw_st_meta_get(f, "format"));
  float got = 0;
  int64_t sh[1] = {1};
  assert_int_equal(pw_st_copy(f, "only", PW_ST_F32, 1, sh, &got, &err), 0);
  assert_true(got == 7.0f);
  pw_st_close(f);

  /* no tensors at all is a valid file */
  assert_int_equal(pw_st_write(p, NULL, 0, NULL, 0, &err), 0);
  assert_int_equal(pw_st_open(p, &f, &err), 0);
  assert_int_equal(pw_st_count(f), 0);
  pw_st_close(f);
}

static unsigned char *slurp(const char *p, size_t *n) {
  FILE *fp = fopen(p, "rb");
  assert_non_null(fp);
  fseek(fp, 0, SEEK_END);
  *n = (size_t)ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *b = malloc(*n + 1);
  assert_int_equal(fread(b, 1, *n, fp), *n);
  fclose(fp);
  return b;
}

/* The bytes on disk follow the spec: LE length, padded JSON, packed data. */
static void test_layout(void **state) {
  pw_st_tensor t[8];
  int n = sample_tensors(t);
  pw_err err = {0};
  const char *p = tpath("layout.safetensors");
  assert_int_equal(pw_st_write(p, t, n, sample_meta, 2, &err), 0);
  size_t size;
  unsigned char *b = slurp(p, &size);
  uint64_t h = 0;
  for (int k = 0; k < 8; k++) h |= (uint64_t)b[k] << (8 * k);
  assert_true(h + 8 <= size);
  assert_int_equal(h % 8, 0);
  assert_int_equal(b[8], '{');
  json_error_t je;
  json_t *root = json_loadb((const char *)b + 8, h, 0, &je);
  assert_non_null(root);
  /* key order: metadata first, then tensors by name, packed from 0 */
  const char *order[] = {"__metadata__", "b", "big", "empty", "idx", "scalar", "w"};
  const size_t bytes[] = {0, 40, 16, 0, 24, 4, 48};
  int k = 0;
  json_int_t off = 0;
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    assert_true(k < 7);
    assert_string_equal(key, order[k]);
    if (k > 0) {
      json_t *o = json_object_get(v, "data_offsets");
      assert_int_equal(json_integer_value(json_array_get(o, 0)), off);
      off += (json_int_t)bytes[k];
      assert_int_equal(json_integer_value(json_array_get(o, 1)), off);
    }
    k++;
  }
  assert_int_equal(k, 7);
  assert_int_equal((size_t)off, size - 8 - h); /* data fully covered, nothing after */
  assert_string_equal(json_string_value(json_object_get(json_object_get(root, "__metadata__"), "job")),
                      sample_meta[1].value);
  /* w's bytes sit where its offsets say */
  json_t *wo = json_object_get(json_object_get(root, "w"), "data_offsets");
  assert_memory_equal(b + 8 + h + json_integer_value(json_array_get(wo, 0)), s_w, sizeof s_w);
  json_decref(root);
  free(b);
}

static int count_tmp_files(void) {
  DIR *d = opendir(g_dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".tmp.")) n++;
  closedir(d);
  return n;
}

static void test_write_errors(void **state) {
  float x[4] = {0};
  pw_err err = {0};
  const char *p = tpath("bad.safetensors");
  pw_st_tensor dup[2] = {{"a", PW_ST_F32, 1, {1}, x}, {"a", PW_ST_F32, 1, {2}, x}};
  assert_int_equal(pw_st_write(p, dup, 2, NULL, 0, &err), PW_EINVAL);
  expect_err(&err, "tensor name 'a' given twice");
  pw_st_tensor neg = {"n", PW_ST_F32, 2, {2, -1}, x};
  assert_int_equal(pw_st_write(p, &neg, 1, NULL, 0, &err), PW_EINVAL);
  expect_err(&err, "tensor 'n': dimension 1 is negative (-1)");
  pw_st_tensor res = {"__metadata__", PW_ST_F32, 1, {1}, x};
  assert_int_equal(pw_st_write(p, &res, 1, NULL, 0, &err), PW_EINVAL);
  expect_err(&err, "reserved");
  pw_st_tensor deep = {"d", PW_ST_F32, 9, {1, 1, 1, 1, 1, 1, 1, 1}, x};
  assert_int_equal(pw_st_write(p, &deep, 1, NULL, 0, &err), PW_EINVAL);
  expect_err(&err, "ndim 9");
  pw_st_meta dm[2] = {{"k", "1"}, {"k", "2"}};
  assert_int_equal(pw_st_write(p, NULL, 0, dm, 2, &err), PW_EINVAL);
  expect_err(&err, "metadata key 'k' given twice");
  assert_int_equal(access(p, F_OK), -1); /* nothing written */

  /* I/O failures: a missing folder, and a rename onto a folder. Both name
   * the path and the errno text and leave no temporary file behind. */
  pw_st_tensor ok = {"a", PW_ST_F32, 1, {4}, x};
  char missing[512];
  snprintf(missing, sizeof missing, "%s/no/such/dir/x.safetensors", g_dir);
  assert_int_equal(pw_st_write(missing, &ok, 1, NULL, 0, &err), PW_EIO);
  expect_err(&err, "No such file or directory");
  expect_err(&err, "x.safetensors");
  const char *dirp = tpath("adir");
  assert_int_equal(mkdir(dirp, 0755), 0);
  assert_int_equal(pw_st_write(dirp, &ok, 1, NULL, 0, &err), PW_EIO);
  expect_err(&err, "rename failed");
  expect_err(&err, "Is a directory");
  assert_int_equal(count_tmp_files(), 0);
}

static void test_copy_errors(void **state) {
  pw_st_tensor t[8];
  int n = sample_tensors(t);
  pw_err err = {0};
  const char *p = tpath("copy.safetensors");
  assert_int_equal(pw_st_write(p, t, n, NULL, 0, &err), 0);
  pw_st_file *f;
  assert_int_equal(pw_st_open(p, &f, &err), 0);
  float dst[12];
  int64_t s34[2] = {3, 4}, s43[2] = {4, 3};
  assert_int_equal(pw_st_copy(f, "missing", PW_ST_F32, 2, s34, dst, &err), PW_ENOENT);
  expect_err(&err, "tensor 'missing' not found");
  expect_err(&err, "copy.safetensors");
  assert_int_equal(pw_st_copy(f, "w", PW_ST_F64, 2, s34, dst, &err), PW_EFORMAT);
  expect_err(&err, "tensor 'w': dtype is F32, expected F64");
  assert_int_equal(pw_st_copy(f, "w", PW_ST_F32, 2, s43, dst, &err), PW_EFORMAT);
  expect_err(&err, "tensor 'w': shape is [3,4], expected [4,3]");
  assert_int_equal(pw_st_copy(f, "w", PW_ST_F32, 1, s34, dst, &err), PW_EFORMAT);
  expect_err(&err, "shape is [3,4], expected [3]");
  pw_st_close(f);
}

/* Writes an arbitrary file: length word (or hlen if nonzero), header, data. */
static void write_raw(const char *p, uint64_t hlen, const char *header, size_t data_len,
                      long keep) {
  size_t hl = strlen(header), n = 8 + hl + data_len;
  unsigned char *b = calloc(1, n);
  uint64_t h = hlen ? hlen : hl;
  for (int k = 0; k < 8; k++) b[k] = (unsigned char)(h >> (8 * k));
  memcpy(b + 8, header, hl);
  for (size_t k = 0; k < data_len; k++) b[8 + hl + k] = (unsigned char)(k * 37);
  FILE *fp = fopen(p, "wb");
  assert_non_null(fp);
  fwrite(b, 1, keep >= 0 ? (size_t)keep : n, fp);
  fclose(fp);
  free(b);
}

typedef struct {
  const char *what;
  const char *header;
  size_t data_len;
  uint64_t hlen;  /* 0: strlen(header) */
  long keep;      /* bytes to keep; -1 all */
  int code;
  const char *msg;
} corrupt_case;

#define T1(x) "{\"x\":" x "}"
static const corrupt_case corrupt[] = {
    {"truncated length", "{}", 0, 0, 5, PW_EFORMAT, "file too short for a safetensors header (5 bytes"},
    {"empty file", "{}", 0, 0, 0, PW_EFORMAT, "(0 bytes"},
    {"header beyond file", "{}", 0, 1000, -1, PW_EFORMAT,
     "header length 1000 runs past the end of the file (10 bytes)"},
    {"header over 100 MiB", "{}", 0, 200ull << 20, -1, PW_EFORMAT, "exceeds the 100 MiB limit"},
    {"truncated header", T1("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"), 4, 0, 30,
     PW_EFORMAT, "runs past the end of the file"},
    {"bad JSON", "{\"x\": {\"dtype\": }", 0, 0, -1, PW_EFORMAT, "header is not valid JSON"},
    {"not an object", "[1, 2]", 0, 0, -1, PW_EFORMAT, "header is not a JSON object"},
    {"duplicate key", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
     4, 0, -1, PW_EFORMAT, "header is not valid JSON: duplicate object key"},
    {"entry not object", T1("[1]"), 0, 0, -1, PW_EFORMAT, "tensor 'x': entry is not an object"},
    {"unknown dtype", T1("{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}"), 4, 0, -1,
     PW_EFORMAT, "tensor 'x': dtype 'Q4' is not supported"},
    {"dtype not string", T1("{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}"), 4, 0, -1,
     PW_EFORMAT, "tensor 'x': dtype is not a string"},
    {"missing offsets", T1("{\"dtype\":\"F32\",\"shape\":[1]}"), 4, 0, -1, PW_EFORMAT,
     "tensor 'x': missing 'data_offsets'"},
    {"unknown field", T1("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"z\":1}"), 4, 0,
     -1, PW_EFORMAT, "tensor 'x': unknown field 'z'"},
    {"offsets out of range", T1("{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}"), 8, 0,
     -1, PW_EFORMAT, "tensor 'x': data_offsets [0, 16] run past the data (8 bytes)"},
    {"offsets reversed", T1("{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}"), 8, 0, -1,
     PW_EFORMAT, "end before they begin"},
    {"offsets negative", T1("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}"), 8, 0, -1,
     PW_EFORMAT, "data_offsets must be non-negative integers"},
    {"offsets not a pair", T1("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}"), 8, 0, -1,
     PW_EFORMAT, "data_offsets is not [begin, end]"},
    {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
     24, 0, -1, PW_EFORMAT, "tensor 'b': data_offsets [8, 24] overlap tensor 'a' [0, 16]"},
    {"shape mismatch", T1("{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}"), 16, 0, -1,
     PW_EFORMAT, "tensor 'x': data_offsets [0, 12] do not match shape [2,2] of F32 (16 bytes)"},
    {"negative dim", T1("{\"dtype\":\"F32\",\"shape\":[-1,4],\"data_offsets\":[0,16]}"), 16, 0, -1,
     PW_EFORMAT, "tensor 'x': shape[0] is not a non-negative integer"},
    {"float dim", T1("{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}"), 8, 0, -1,
     PW_EFORMAT, "tensor 'x': shape[0] is not a non-negative integer"},
    {"too many dims", T1("{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}"),
     4, 0, -1, PW_EFORMAT, "tensor 'x': shape has 9 dimensions (at most 8)"},
    {"shape overflow",
     T1("{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}"), 8, 0, -1,
     PW_EFORMAT, "tensor 'x': shape [4294967296,4294967296] of F64 overflows"},
    {"metadata non-string", "{\"__metadata__\":{\"a\":1}}", 0, 0, -1, PW_EFORMAT,
     "__metadata__ 'a' is not a string"},
    {"metadata not object", "{\"__metadata__\":\"x\"}", 0, 0, -1, PW_EFORMAT,
     "__metadata__ is not an object"},
};

static void test_corrupt_files(void **state) {
  for (size_t c = 0; c < sizeof corrupt / sizeof *corrupt; c++) {
    const corrupt_case *k = &corrupt[c];
    const char *p = tpath("corrupt.safetensors");
    write_raw(p, k->hlen, k->header, k->data_len, k->keep);
    pw_st_file *f = (pw_st_file *)&f; /* must be reset to NULL */
    pw_err err = {0};
    int rc = pw_st_open(p, &f, &err);
    if (rc != k->code) fail_msg("case '%s': code %d, expected %d", k->what, rc, k->code);
    assert_null(f);
    char buf[600];
    pw_err_str(&err, buf, sizeof buf);
    if (!strstr(buf, k->msg) || !strstr(buf, "corrupt.safetensors"))
      fail_msg("case '%s': error '%s' does not contain '%s' and the file name", k->what, buf, k->msg);
  }
  pw_st_file *f;
  pw_err err = {0};
  assert_int_equal(pw_st_open(tpath("absent.safetensors"), &f, &err), PW_ENOENT);
  expect_err(&err, "absent.safetensors: cannot open: No such file or directory");
}

/* Files from other writers: unpadded header, unaligned data, gaps between
 * tensors, zero-size tensors anywhere. All of it is valid. */
/* Each tensor's CRC32C travels in the metadata: a flipped bit anywhere in
 * a tensor's bytes is refused naming the tensor; checksum keys are the
 * writer's own, and one naming no tensor, or not 8 hex digits, is refused. */
static void test_checksums(void **state) {
  pw_st_tensor t[8];
  int n = sample_tensors(t);
  pw_err err = {0};
  const char *p = tpath("crc.safetensors");
  assert_int_equal(pw_st_write(p, t, n, NULL, 0, &err), 0);
  pw_st_file *f;
  assert_int_equal(pw_st_open(p, &f, &err), 0);
  assert_string_equal(pw_st_meta_get(f, PW_ST_CRC_PREFIX "scalar"), "7697b579"); /* crc32c of 2.5f, LE */
  size_t size = 0;
  FILE *fp = fopen(p, "rb");
  assert_non_null(fp);
  static unsigned char raw[1 << 16];
  size = fread(raw, 1, sizeof raw, fp);
  fclose(fp);
  const pw_st_tensor *w = pw_st_find(f, "w");
  size_t off = (size_t)((const unsigned char *)w->data - (const unsigned char *)pw_st_get(f, 0)->data);
  size_t data0 = 8; /* the data follows the 8-byte length and the header */
  for (int b = 0; b < 8; b++) data0 += (size_t)raw[b] << (8 * b);
  pw_st_close(f);
  /* every bit of one byte of w, in turn */
  for (int bit = 0; bit < 8; bit++) {
    raw[data0 + off + 5] ^= (unsigned char)(1u << bit);
    const char *q = tpath("flip.safetensors");
    fp = fopen(q, "wb");
    assert_int_equal(fwrite(raw, 1, size, fp), size);
    fclose(fp);
    assert_int_equal(pw_st_open(q, &f, &err), PW_EFORMAT);
    expect_err(&err, "tensor 'w': checksum mismatch");
    raw[data0 + off + 5] ^= (unsigned char)(1u << bit);
  }
  pw_st_meta bad[1] = {{PW_ST_CRC_PREFIX "w", "00000000"}};
  assert_int_equal(pw_st_write(tpath("r.safetensors"), t, n, bad, 1, &err), PW_EINVAL);
  expect_err(&err, "is reserved");
  /* a reader's view of hand-made metadata: no such tensor, not hex */
  const char *hdrs[] = {"{\"__metadata__\":{\"pw.crc32c.x\":\"00000000\"},"
                        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                        "{\"__metadata__\":{\"pw.crc32c.a\":\"zz\"},"
                        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}"};
  const char *want[] = {"'pw.crc32c.x' names no tensor", "is not 8 hex digits"};
  for (int i = 0; i < 2; i++) {
    const char *q = tpath("hand.safetensors");
    fp = fopen(q, "wb");
    uint64_t hl = strlen(hdrs[i]);
    unsigned char l8[8];
    for (int b = 0; b < 8; b++) l8[b] = (unsigned char)(hl >> (8 * b));
    fwrite(l8, 1, 8, fp);
    fwrite(hdrs[i], 1, hl, fp);
    fwrite("\0\0\0\0", 1, 4, fp);
    fclose(fp);
    assert_int_equal(pw_st_open(q, &f, &err), PW_EFORMAT);
    expect_err(&err, want[i]);
  }
}

static void test_foreign_layout(void **state) {
  const char *hdr = "{\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[3,19]},"
                    "\"e\":{\"dtype\":\"I32\",\"shape\":[0],\"data_offsets\":[5,5]}}";
  size_t hl = strlen(hdr);
  assert_true((8 + hl) % 8 != 0);
  const char *p = tpath("foreign.safetensors");
  size_t n = 8 + hl + 19;
  unsigned char *b = calloc(1, n);
  for (int k = 0; k < 8; k++) b[k] = (unsigned char)((uint64_t)hl >> (8 * k));
  memcpy(b + 8, hdr, hl);
  double v[2] = {1.5, -2.25};
  memcpy(b + 8 + hl + 3, v, 16);
  FILE *fp = fopen(p, "wb");
  fwrite(b, 1, n, fp);
  fclose(fp);
  free(b);
  pw_st_file *f;
  pw_err err = {0};
  assert_int_equal(pw_st_open(p, &f, &err), 0);
  double got[2];
  int64_t s2[1] = {2}, s0[1] = {0};
  assert_int_equal(pw_st_copy(f, "d", PW_ST_F64, 1, s2, got, &err), 0);
  assert_true(got[0] == 1.5 && got[1] == -2.25);
  assert_int_equal(pw_st_copy(f, "e", PW_ST_I32, 1, s0, NULL, &err), 0);
  pw_st_close(f);
}

int main(int argc, char **argv) {
  if (argc == 3 && (!strcmp(argv[1], "--write-sample") || !strcmp(argv[1], "--check-sample"))) {
    pw_err err = {0};
    char buf[600];
    if (!strcmp(argv[1], "--write-sample")) {
      pw_st_tensor t[8];
      int n = sample_tensors(t);
      if (pw_st_write(argv[2], t, n, sample_meta, 2, &err) == 0) return 0;
      fprintf(stderr, "%s\n", pw_err_str(&err, buf, sizeof buf));
      return 1;
    }
    pw_st_file *f;
    if (pw_st_open(argv[2], &f, &err)) {
      fprintf(stderr, "%s\n", pw_err_str(&err, buf, sizeof buf));
      return 1;
    }
    int bad = sample_check(f);
    pw_st_close(f);
    return bad ? 1 : 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_layout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_write_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_copy_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_corrupt_files, setup, teardown),
      cmocka_unit_test_setup_teardown(test_checksums, setup, teardown),
      cmocka_unit_test_setup_teardown(test_foreign_layout, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
