/* test_tokfile: token files (common/io/tokfile.h) and datasets read from
 * them and from stored copies (common/io/data.c).
 *
 * The anchor: a text file and its byte-level conversion give the same
 * batches, train and eval, for both samplers. Then a width-4 file with
 * large ids, every malformed header refused with the field named, an id
 * outside the vocabulary found by index, and a stored dataset's copy
 * whose bytes no longer hash to its id refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "rng.h"
#include "sha256.h"
#include "tokfile.h"

static char g_dir[64];

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }

static void write_file(const char *path, const void *buf, size_t n) {
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(buf, 1, n, fp), n);
  assert_int_equal(fclose(fp), 0);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/pw_tokfile_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static pw_data_spec file_spec(pw_data_kind kind, const char *path, pw_sampler_kind sampler) {
  pw_data_spec s;
  memset(&s, 0, sizeof s);
  s.kind = kind;
  snprintf(s.path, sizeof s.path, "%s", path);
  s.sampler = sampler;
  s.eval_fraction = 0.1;
  return s;
}

static pw_dataset *open_ok(const pw_data_spec *spec, const pw_data_shape *shape) {
  pw_dataset *ds = NULL;
  pw_err err = {0};
  char b[600];
  if (pw_dataset_open(spec, shape, 7, &ds, &err)) fail_msg("open failed: %s", pw_err_str(&err, b, sizeof b));
  return ds;
}

static void expect_open_error(const pw_data_spec *spec, const pw_data_shape *shape, int code, const char *msg) {
  pw_dataset *ds = NULL;
  pw_err err = {0};
  char b[600];
  int rc = pw_dataset_open(spec, shape, 7, &ds, &err);
  pw_err_str(&err, b, sizeof b);
  if (rc != code || !strstr(b, msg)) fail_msg("got %d '%s', expected %d '%s'", rc, b, code, msg);
  assert_null(ds);
}

/* 3000 pseudo-random bytes as text, converted, opened both ways. */
static void test_text_and_conversion_agree(void **state) {
  (void)state;
  unsigned char bytes[3000];
  pw_rng r;
  pw_rng_seed(&r, 3);
  for (size_t k = 0; k < sizeof bytes; k++) bytes[k] = (unsigned char)pw_rng_u64(&r);
  char txt[128], tok[128];
  path_in(txt, sizeof txt, "a.txt");
  path_in(tok, sizeof tok, "a.tok");
  write_file(txt, bytes, sizeof bytes);
  pw_tokfile_hdr h;
  pw_err err = {0};
  assert_int_equal(pw_tokfile_from_text(txt, tok, &h, &err), 0);
  assert_int_equal(h.n_tokens, sizeof bytes);
  assert_int_equal(h.width, 2);
  assert_int_equal(h.vocab_size, 256);
  pw_tokfile_hdr h2;
  assert_int_equal(pw_tokfile_check(tok, &h2, &err), 0);
  assert_memory_equal(&h, &h2, sizeof h);
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.tmp-%ld", tok, (long)getpid());
  assert_int_equal(access(tmp, F_OK), -1); /* renamed, nothing left behind */

  pw_data_shape sh = {.vocab_size = 300, .seq_len = 24, .tokens = 1};
  for (int sampler = 0; sampler < 2; sampler++) {
    pw_data_spec st = file_spec(PW_DATA_TEXT, txt, (pw_sampler_kind)sampler);
    pw_data_spec sk = file_spec(PW_DATA_TOKENS, tok, (pw_sampler_kind)sampler);
    pw_dataset *a = open_ok(&st, &sh), *b = open_ok(&sk, &sh);
    assert_int_equal(pw_dataset_train_len(a), pw_dataset_train_len(b));
    int32_t ia[8 * 24], ta[8 * 24], ib[8 * 24], tb[8 * 24];
    for (long step = 0; step < 20; step++)
      for (int split = 0; split < 2; split++) {
        pw_dataset_batch(a, (pw_split)split, step, 0, 8, 8, ia, ta);
        pw_dataset_batch(b, (pw_split)split, step, 0, 8, 8, ib, tb);
        assert_memory_equal(ia, ib, sizeof ia);
        assert_memory_equal(ta, tb, sizeof ta);
      }
    pw_dataset_close(a);
    pw_dataset_close(b);
  }
}

/* Writes a token file of n ids (width w, vocab v) with id i = f(i). */
static void write_tokens(const char *path, uint32_t w, uint32_t v, uint64_t n, uint32_t mul) {
  size_t size = PW_TOKFILE_HEADER + (size_t)n * w;
  uint8_t *buf = calloc(1, size);
  assert_non_null(buf);
  pw_tokfile_hdr h = {.version = 1, .width = w, .vocab_size = v, .n_tokens = n};
  pw_tokfile_header_write(&h, buf);
  for (uint64_t i = 0; i < n; i++) {
    uint32_t id = (uint32_t)((i * mul) % v);
    for (uint32_t b = 0; b < w; b++) buf[PW_TOKFILE_HEADER + i * w + b] = (uint8_t)(id >> (8 * b));
  }
  write_file(path, buf, size);
  free(buf);
}

/* Width 4, ids above 65535: sequential batches are the ids at the rule's offsets. */
static void test_wide_ids(void **state) {
  (void)state;
  char p[128];
  path_in(p, sizeof p, "wide.tok");
  const uint32_t V = 100003, MUL = 7919;
  write_tokens(p, 4, V, 1000, MUL);
  pw_data_spec s = file_spec(PW_DATA_TOKENS, p, PW_SAMPLER_SEQUENTIAL);
  pw_data_shape sh = {.vocab_size = (int)V, .seq_len = 10, .tokens = 1};
  pw_dataset *ds = open_ok(&s, &sh);
  assert_int_equal(pw_dataset_train_len(ds), 900);
  int32_t in[4 * 10], tg[4 * 10];
  pw_dataset_batch(ds, PW_SPLIT_TRAIN, 3, 0, 4, 4, in, tg);
  uint64_t M = 900 - 10 - 1;
  for (int i = 0; i < 4; i++) {
    uint64_t o = ((3 * 4 + (uint64_t)i) * 10) % M;
    for (int t = 0; t < 10; t++) {
      assert_int_equal(in[i * 10 + t], (int32_t)(((o + (uint64_t)t) * MUL) % V));
      assert_int_equal(tg[i * 10 + t], (int32_t)(((o + (uint64_t)t + 1) * MUL) % V));
    }
  }
  pw_dataset_close(ds);
  /* the model's vocabulary must hold the file's */
  sh.vocab_size = (int)V - 1;
  expect_open_error(&s, &sh, PW_ESPEC, "model.vocab_size: the token file");
}

/* Each header field, wrong, is named. */
static void test_bad_headers(void **state) {
  (void)state;
  char p[128];
  path_in(p, sizeof p, "bad.tok");
  struct {
    int off;
    uint32_t value;
    const char *msg;
  } cases[] = {
      {0, 0x4b4f5457, "does not start with \"PWTOKENS\""}, /* "WTOK": not the magic */
      {8, 2, "token file version 2"},
      {12, 3, "token width 3 bytes"},
      {16, 0, "vocab_size is 0"},
      {16, 70000, "vocab_size 70000 does not fit 2-byte ids"},
      {20, 1, "reserved header bytes"},
      {24, 101, "header says 101 tokens of 2 bytes"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    uint8_t buf[PW_TOKFILE_HEADER + 200] = {0};
    pw_tokfile_hdr h = {.version = 1, .width = 2, .vocab_size = 256, .n_tokens = 100};
    pw_tokfile_header_write(&h, buf);
    for (int b = 0; b < 4; b++) buf[cases[k].off + b] = (uint8_t)(cases[k].value >> (8 * b));
    write_file(p, buf, sizeof buf);
    pw_tokfile_hdr got;
    pw_err err = {0};
    char m[600];
    int rc = pw_tokfile_check(p, &got, &err);
    pw_err_str(&err, m, sizeof m);
    if (rc != PW_EFORMAT || !strstr(m, cases[k].msg) || !strstr(m, p))
      fail_msg("case %zu: got %d '%s', expected '%s' naming %s", k, rc, m, cases[k].msg, p);
    /* the dataset opener says the same, at data.path */
    pw_data_spec s = file_spec(PW_DATA_TOKENS, p, PW_SAMPLER_SEQUENTIAL);
    pw_data_shape sh = {.vocab_size = 70000, .seq_len = 4, .tokens = 1};
    expect_open_error(&s, &sh, PW_EFORMAT, cases[k].msg);
  }
  /* a header cut short */
  write_file(p, "PWTOKENS\1\0\0\0", 12);
  pw_tokfile_hdr got;
  pw_err err = {0};
  assert_int_equal(pw_tokfile_check(p, &got, &err), PW_EFORMAT);
  assert_non_null(strstr(err.msg, "cut short (12 of 32 bytes)"));
}

/* An id outside the vocabulary: its index and value, even past the first read block. */
static void test_id_out_of_vocab(void **state) {
  (void)state;
  char p[128];
  path_in(p, sizeof p, "oov.tok");
  const uint64_t n = 50000, bad = 40001; /* beyond the 32768 ids of the first block */
  size_t size = PW_TOKFILE_HEADER + n * 2;
  uint8_t *buf = calloc(1, size);
  assert_non_null(buf);
  pw_tokfile_hdr h = {.version = 1, .width = 2, .vocab_size = 500, .n_tokens = n};
  pw_tokfile_header_write(&h, buf);
  buf[PW_TOKFILE_HEADER + bad * 2] = 0xf4, buf[PW_TOKFILE_HEADER + bad * 2 + 1] = 0x01; /* 500 */
  write_file(p, buf, size);
  free(buf);
  pw_tokfile_hdr got;
  pw_err err = {0};
  assert_int_equal(pw_tokfile_check(p, &got, &err), PW_EFORMAT);
  assert_string_equal(err.msg, "token 40001 is 500, outside the vocabulary of 500");
  pw_data_spec s = file_spec(PW_DATA_TOKENS, p, PW_SAMPLER_SEQUENTIAL);
  pw_data_shape sh = {.vocab_size = 512, .seq_len = 4, .tokens = 1};
  expect_open_error(&s, &sh, PW_EFORMAT, "token 40001 is 500");
}

/* A stored dataset's local copy: the right bytes open, changed bytes are refused. */
static void test_dataset_hash(void **state) {
  (void)state;
  char p[128];
  path_in(p, sizeof p, "stored.txt");
  unsigned char bytes[2000];
  for (size_t k = 0; k < sizeof bytes; k++) bytes[k] = (unsigned char)('a' + k % 26);
  write_file(p, bytes, sizeof bytes);
  pw_data_spec s = file_spec(PW_DATA_TEXT, p, PW_SAMPLER_RANDOM);
  pw_sha256_hex(bytes, sizeof bytes, s.dataset);
  pw_data_shape sh = {.vocab_size = 256, .seq_len = 8, .tokens = 1};
  pw_dataset_close(open_ok(&s, &sh));
  bytes[1234] ^= 1;
  write_file(p, bytes, sizeof bytes);
  char want[200];
  snprintf(want, sizeof want, "data.dataset: %s holds bytes whose sha256 is", p);
  expect_open_error(&s, &sh, PW_EIO, want);
  /* an id alone: the opener needs the local copy's path */
  s.path[0] = 0;
  expect_open_error(&s, &sh, PW_ESPEC, "data.path: no local file for dataset");
  assert_true(pw_data_id_valid(s.dataset));
  s.dataset[63] = 'G';
  assert_false(pw_data_id_valid(s.dataset));
  s.dataset[63] = 0;
  assert_false(pw_data_id_valid(s.dataset));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_and_conversion_agree), cmocka_unit_test(test_wide_ids),
      cmocka_unit_test(test_bad_headers),               cmocka_unit_test(test_id_out_of_vocab),
      cmocka_unit_test(test_dataset_hash),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
