/* test_data: every dataset kind against the rules written in data.c's top
 * comment, recomputed here independently (128-bit offsets, rng.h draws). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "rng.h"

static char g_path[64];
static unsigned char g_bytes[1000];

/* A 1000-byte file whose bytes are a fixed pseudo-random pattern. */
static int setup(void **state) {
  snprintf(g_path, sizeof g_path, "/tmp/pw_data_test_XXXXXX");
  int fd = mkstemp(g_path);
  if (fd < 0) return -1;
  pw_rng r;
  pw_rng_seed(&r, 42);
  for (size_t k = 0; k < sizeof g_bytes; k++) g_bytes[k] = (unsigned char)pw_rng_u64(&r);
  int ok = write(fd, g_bytes, sizeof g_bytes) == (ssize_t)sizeof g_bytes;
  close(fd);
  return ok ? 0 : -1;
}

static int teardown(void **state) {
  unlink(g_path);
  return 0;
}

static pw_data_spec text_spec(const char *path, pw_sampler_kind sampler, double eval_fraction) {
  pw_data_spec s;
  memset(&s, 0, sizeof s);
  s.kind = PW_DATA_TEXT;
  if (strlen(path) >= sizeof s.path) fail_msg("path too long: %s", path);
  memcpy(s.path, path, strlen(path) + 1);
  s.sampler = sampler;
  s.eval_fraction = eval_fraction;
  return s;
}

static const pw_data_shape tok_shape = {.vocab_size = 256, .seq_len = 16, .tokens = 1};

static pw_dataset *open_ok(const pw_data_spec *spec, const pw_data_shape *shape,
                           unsigned long long seed) {
  pw_dataset *ds = NULL;
  pw_err err = {0};
  int rc = pw_dataset_open(spec, shape, seed, &ds, &err);
  if (rc) {
    char b[600];
    fail_msg("open failed: %s", pw_err_str(&err, b, sizeof b));
  }
  return ds;
}

static void expect_window(const int32_t *in, const int32_t *tg, const unsigned char *base,
                          uint64_t o, int T, const char *what, long k, int i) {
  for (int t = 0; t < T; t++) {
    if (in[t] != base[o + (uint64_t)t] || tg[t] != base[o + (uint64_t)t + 1])
      fail_msg("%s k=%ld i=%d t=%d: got (%d,%d), window at %llu has (%d,%d)", what, k, i, t,
               in[t], tg[t], (unsigned long long)o, base[o + t], base[o + t + 1]);
  }
}

/* L=1000, eval_fraction 0.1: N=900, eval 100 bytes, T=16: M=883 and 83. */
static void test_text_sequential(void **state) {
  pw_data_spec spec = text_spec(g_path, PW_SAMPLER_SEQUENTIAL, 0.1);
  pw_dataset *ds = open_ok(&spec, &tok_shape, 1);
  assert_int_equal(pw_dataset_train_len(ds), 900);
  const int T = 16, B = 4;
  const long ks[] = {0, 1, 13, 14, 55, 1000, 123456789L, 1000000000000000L, 9000000000000000000L};
  int32_t in[B * 16], tg[B * 16];
  for (size_t a = 0; a < sizeof ks / sizeof *ks; a++) {
    long k = ks[a];
    for (int split = 0; split < 2; split++) {
      pw_dataset_batch(ds, (pw_split)split, k, 0, B, B, in, tg);
      uint64_t M = split ? 83 : 883;
      const unsigned char *base = g_bytes + (split ? 900 : 0);
      for (int i = 0; i < B; i++) {
        uint64_t o = (uint64_t)((((unsigned __int128)k * B + i) * T) % M);
        expect_window(in + i * T, tg + i * T, base, o, T, split ? "eval" : "train", k, i);
      }
    }
  }
  /* wraparound really happens: step 14 of train starts at (56*16) mod 883 = 13 */
  pw_dataset_batch(ds, PW_SPLIT_TRAIN, 14, 0, 1, B, in, tg);
  assert_int_equal(in[0], g_bytes[13]);
  pw_dataset_close(ds);
}

/* random sampler: start = key(train, k, i) mod M; eval stays sequential. */
static void test_text_random(void **state) {
  pw_data_spec spec = text_spec(g_path, PW_SAMPLER_RANDOM, 0.1);
  const int T = 16, B = 8;
  pw_dataset *a = open_ok(&spec, &tok_shape, 7), *b = open_ok(&spec, &tok_shape, 7),
             *c = open_ok(&spec, &tok_shape, 8);
  int32_t ia[B * 16], ta[B * 16], ib[B * 16], tb[B * 16], ic[B * 16], tc[B * 16];
  int differ = 0, distinct_starts = 0;
  for (long k = 0; k < 5; k++) {
    pw_dataset_batch(a, PW_SPLIT_TRAIN, k, 0, B, B, ia, ta);
    pw_dataset_batch(b, PW_SPLIT_TRAIN, k, 0, B, B, ib, tb);
    pw_dataset_batch(c, PW_SPLIT_TRAIN, k, 0, B, B, ic, tc);
    assert_memory_equal(ia, ib, sizeof ia);
    assert_memory_equal(ta, tb, sizeof ta);
    differ += memcmp(ia, ic, sizeof ia) != 0;
    for (int i = 0; i < B; i++) {
      uint64_t key = pw_hash64(pw_hash64(pw_hash64(7, pw_hash_str("train")), (uint64_t)k), (uint64_t)i);
      uint64_t o = key % 883;
      expect_window(ia + i * T, ta + i * T, g_bytes, o, T, "random", k, i);
      distinct_starts += o != (uint64_t)((k * B + i) * T % 883);
    }
    /* eval ignores the sampler */
    pw_dataset_batch(a, PW_SPLIT_EVAL, k, 0, B, B, ia, ta);
    for (int i = 0; i < B; i++)
      expect_window(ia + i * T, ta + i * T, g_bytes + 900, (uint64_t)((k * B + i) * T % 83), T,
                    "eval", k, i);
  }
  assert_int_equal(differ, 5);
  assert_true(distinct_starts > 30);
  pw_dataset_close(a);
  pw_dataset_close(b);
  pw_dataset_close(c);
}

/* Every window of each split lies inside that split, for both samplers. */
static void test_text_splits_disjoint(void **state) {
  const int T = 16, B = 8;
  for (int s = 0; s < 2; s++) {
    pw_data_spec spec = text_spec(g_path, s ? PW_SAMPLER_RANDOM : PW_SAMPLER_SEQUENTIAL, 0.25);
    pw_dataset *ds = open_ok(&spec, &tok_shape, 3);
    size_t N = pw_dataset_train_len(ds);
    assert_int_equal(N, 750);
    int32_t in[B * 16], tg[B * 16];
    for (long k = 0; k < 40; k++) {
      pw_dataset_batch(ds, PW_SPLIT_TRAIN, k, 0, B, B, in, tg);
      for (int i = 0; i < B; i++) {
        /* find the window: it must start below N - T - 1 */
        int found = 0;
        for (size_t o = 0; o + T + 1 <= N && !found; o++) {
          int same = 1;
          for (int t = 0; t < T && same; t++)
            same = in[i * T + t] == g_bytes[o + t] && tg[i * T + t] == g_bytes[o + t + 1];
          found = same;
        }
        if (!found) fail_msg("train window k=%ld i=%d is not inside the train split", k, i);
      }
      pw_dataset_batch(ds, PW_SPLIT_EVAL, k, 0, B, B, in, tg);
      for (int i = 0; i < B; i++) {
        uint64_t o = (uint64_t)((k * B + i) * T) % (250 - T - 1);
        expect_window(in + i * T, tg + i * T, g_bytes + N, o, T, "eval", k, i);
      }
    }
    pw_dataset_close(ds);
  }
}

/* Drawing sequences 0..7 at once equals 0..3 then 4..7, inputs and targets
 * drawn separately too, for every kind. */
static void test_microbatch_independence(void **state) {
  pw_data_spec specs[5];
  pw_data_shape shapes[5];
  specs[0] = text_spec(g_path, PW_SAMPLER_RANDOM, 0.1);
  shapes[0] = tok_shape;
  for (int k = 1; k < 5; k++) {
    memset(&specs[k], 0, sizeof specs[k]);
    specs[k].kind = (pw_data_kind[]){0, PW_DATA_COPY, PW_DATA_REVERSE, PW_DATA_REGRESSION,
                                     PW_DATA_CLASSIFY}[k];
  }
  shapes[1] = shapes[2] = (pw_data_shape){.vocab_size = 10, .seq_len = 9, .tokens = 1};
  shapes[3] = shapes[4] = (pw_data_shape){.seq_len = 1, .in_dim = 5, .out_dim = 3, .tokens = 0};
  for (int k = 0; k < 5; k++) {
    pw_dataset *ds = open_ok(&specs[k], &shapes[k], 11);
    int tok = shapes[k].tokens;
    size_t in_w = tok ? (size_t)shapes[k].seq_len : (size_t)shapes[k].in_dim;
    size_t tg_w = tok ? (size_t)shapes[k].seq_len : specs[k].kind == PW_DATA_CLASSIFY ? 1 : 3;
    size_t in_b = 8 * in_w * 4, tg_b = 8 * tg_w * 4;
    unsigned char *i1 = calloc(1, in_b), *t1 = calloc(1, tg_b), *i2 = calloc(1, in_b),
                  *t2 = calloc(1, tg_b);
    for (int split = 0; split < 2; split++) {
      memset(i2, 0, in_b);
      memset(t2, 0, tg_b);
      pw_dataset_batch(ds, (pw_split)split, 5, 0, 8, 8, i1, t1);
      pw_dataset_batch(ds, (pw_split)split, 5, 0, 4, 8, i2, NULL);
      pw_dataset_batch(ds, (pw_split)split, 5, 4, 4, 8, i2 + in_b / 2, NULL);
      pw_dataset_batch(ds, (pw_split)split, 5, 4, 4, 8, NULL, t2 + tg_b / 2);
      pw_dataset_batch(ds, (pw_split)split, 5, 0, 4, 8, NULL, t2);
      if (memcmp(i1, i2, in_b) || memcmp(t1, t2, tg_b))
        fail_msg("kind %d split %d: microbatched draw differs from whole batch", k, split);
      /* and the sequences are not all the same */
      assert_true(memcmp(i1, i1 + in_b / 2, in_b / 2) != 0);
    }
    free(i1);
    free(t1);
    free(i2);
    free(t2);
    pw_dataset_close(ds);
  }
}

static void check_copy_kind(pw_data_kind kind, int T) {
  pw_data_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.kind = kind;
  pw_data_shape sh = {.vocab_size = 7, .seq_len = T, .tokens = 1};
  pw_dataset *ds = open_ok(&spec, &sh, 5), *ds2 = open_ok(&spec, &sh, 6);
  enum { B = 6 };
  int32_t *in = calloc((size_t)(B * T), 4), *tg = calloc((size_t)(B * T), 4),
          *ev = calloc((size_t)(B * T), 4), *o2 = calloc((size_t)(B * T), 4);
  int h = T / 2, seen[7] = {0};
  pw_dataset_batch(ds, PW_SPLIT_TRAIN, 3, 0, B, B, in, tg);
  pw_dataset_batch(ds, PW_SPLIT_EVAL, 3, 0, B, B, ev, NULL);
  pw_dataset_batch(ds2, PW_SPLIT_TRAIN, 3, 0, B, B, o2, NULL);
  assert_true(memcmp(in, ev, (size_t)(B * T) * 4) != 0);
  assert_true(memcmp(in, o2, (size_t)(B * T) * 4) != 0);
  for (int i = 0; i < B; i++) {
    const int32_t *x = in + i * T, *y = tg + i * T;
    /* the sequence s[0..T]: x = s[0..T-1], y = s[1..T] */
    for (int t = 0; t + 1 < T; t++) assert_int_equal(y[t], x[t + 1]);
    int32_t s[64];
    memcpy(s, x, sizeof(int32_t) * (size_t)T);
    s[T] = y[T - 1];
    /* the rng draws, recomputed */
    pw_rng r;
    pw_rng_seed(&r, pw_hash64(pw_hash64(pw_hash64(5, pw_hash_str("train")), 3), (uint64_t)i));
    for (int j = 0; j < h; j++) {
      assert_int_equal(s[j], 1 + (int)pw_rng_below(&r, 6));
      seen[s[j]]++;
    }
    assert_int_equal(s[h], 0);
    for (int j = 0; j < h; j++)
      assert_int_equal(s[h + 1 + j], kind == PW_DATA_COPY ? s[j] : s[h - 1 - j]);
    if (T % 2) assert_int_equal(s[T], 0);
  }
  assert_int_equal(seen[0], 0);
  if (h * B >= 48) /* enough draws that every symbol shows up */
    for (int v = 1; v < 7; v++) assert_true(seen[v] > 0);
  free(in);
  free(tg);
  free(ev);
  free(o2);
  pw_dataset_close(ds);
  pw_dataset_close(ds2);
}

static void test_copy_reverse(void **state) {
  check_copy_kind(PW_DATA_COPY, 32);
  check_copy_kind(PW_DATA_COPY, 33);
  check_copy_kind(PW_DATA_REVERSE, 32);
  check_copy_kind(PW_DATA_REVERSE, 17);
  check_copy_kind(PW_DATA_REVERSE, 2);
}

/* Targets equal tanh(A x) / argmax(A x) with A recomputed from the seed. */
static void test_regression_classify(void **state) {
  enum { I = 6, O = 4, B = 5 };
  double A[O][I];
  pw_rng r;
  pw_rng_seed(&r, pw_hash64(99, pw_hash_str("teacher")));
  for (int o = 0; o < O; o++)
    for (int j = 0; j < I; j++) A[o][j] = pw_rng_normal(&r) / sqrt((double)I);
  pw_data_shape sh = {.seq_len = 1, .in_dim = I, .out_dim = O, .tokens = 0};
  pw_data_spec reg, cls;
  memset(&reg, 0, sizeof reg);
  memset(&cls, 0, sizeof cls);
  reg.kind = PW_DATA_REGRESSION;
  cls.kind = PW_DATA_CLASSIFY;
  pw_dataset *dr = open_ok(&reg, &sh, 99), *dc = open_ok(&cls, &sh, 99);
  float x[B][I], y[B][O], xc[B][I], xe[B][I];
  int32_t c[B];
  int class_seen[O] = {0};
  double sum = 0, sumsq = 0;
  for (long k = 0; k < 40; k++) {
    pw_dataset_batch(dr, PW_SPLIT_TRAIN, k, 0, B, B, x, y);
    pw_dataset_batch(dc, PW_SPLIT_TRAIN, k, 0, B, B, xc, c);
    assert_memory_equal(x, xc, sizeof x); /* same x for both kinds */
    for (int i = 0; i < B; i++) {
      int best = 0;
      double by = -INFINITY;
      for (int o = 0; o < O; o++) {
        double a = 0;
        for (int j = 0; j < I; j++) a += A[o][j] * (double)x[i][j];
        if (fabsf(y[i][o] - (float)tanh(a)) > 1e-6f)
          fail_msg("k=%ld i=%d o=%d: target %g, tanh(Ax) %g", k, i, o, y[i][o], tanh(a));
        if (a > by) by = a, best = o;
      }
      assert_int_equal(c[i], best);
      class_seen[best]++;
      for (int j = 0; j < I; j++) sum += x[i][j], sumsq += (double)x[i][j] * x[i][j];
    }
    pw_dataset_batch(dr, PW_SPLIT_EVAL, k, 0, B, B, xe, NULL);
    assert_true(memcmp(x, xe, sizeof x) != 0);
  }
  /* x ~ N(0,1): 1200 draws */
  double mean = sum / (40 * B * I), var = sumsq / (40 * B * I) - mean * mean;
  assert_true(fabs(mean) < 0.15);
  assert_true(fabs(var - 1.0) < 0.2);
  for (int o = 0; o < O; o++) assert_true(class_seen[o] > 0);
  pw_dataset_close(dr);
  pw_dataset_close(dc);
}

typedef struct {
  const char *what;
  pw_data_kind kind;
  const char *path;   /* NULL: the test file */
  double eval_fraction;
  pw_data_shape shape;
  int code;
  const char *msg;
} err_case;

static void test_errors(void **state) {
  const err_case cases[] = {
      {"missing file", PW_DATA_TEXT, "/nonexistent/pw/corpus.txt", 0.1, tok_shape, PW_ENOENT,
       "data.path: cannot open /nonexistent/pw/corpus.txt: No such file or directory"},
      {"too short", PW_DATA_TEXT, NULL, 0.1, {.vocab_size = 256, .seq_len = 899, .tokens = 1},
       PW_ESPEC, "has only 1000 bytes (900 in the train split); seq_len 899 needs at least 901"},
      {"eval too short", PW_DATA_TEXT, NULL, 0.01, tok_shape, PW_ESPEC,
       "data.eval_fraction: the eval split of"},
      {"no eval split", PW_DATA_TEXT, NULL, 0.0, tok_shape, PW_ESPEC, "has only 0 bytes"},
      {"text small vocab", PW_DATA_TEXT, NULL, 0.1, {.vocab_size = 100, .seq_len = 8, .tokens = 1},
       PW_ESPEC, "model.vocab_size: text data uses byte tokens and needs vocab_size >= 256"},
      {"text for features", PW_DATA_TEXT, NULL, 0.1, {.seq_len = 1, .in_dim = 3, .out_dim = 2},
       PW_ESPEC, "data.kind: 'text' gives token sequences but the model takes float features"},
      {"regression for tokens", PW_DATA_REGRESSION, NULL, 0, tok_shape, PW_ESPEC,
       "data.kind: 'regression' gives float features but the model takes tokens"},
      {"classify one class", PW_DATA_CLASSIFY, NULL, 0, {.seq_len = 1, .in_dim = 3, .out_dim = 1},
       PW_ESPEC, "model.out_dim: 'classify' data needs at least 2 classes"},
      {"copy seq_len 1", PW_DATA_COPY, NULL, 0, {.vocab_size = 8, .seq_len = 1, .tokens = 1},
       PW_ESPEC, "model.seq_len: 'copy' data needs seq_len >= 2"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    const err_case *c = &cases[k];
    pw_data_spec spec = text_spec(c->path ? c->path : g_path, PW_SAMPLER_SEQUENTIAL,
                                  c->eval_fraction);
    spec.kind = c->kind;
    pw_dataset *ds = (pw_dataset *)&ds;
    pw_err err = {0};
    int rc = pw_dataset_open(&spec, &c->shape, 1, &ds, &err);
    char buf[600];
    pw_err_str(&err, buf, sizeof buf);
    if (rc != c->code || !strstr(buf, c->msg))
      fail_msg("case '%s': got %d '%s', expected %d '%s'", c->what, rc, buf, c->code, c->msg);
    assert_null(ds);
  }
}

/* The bundled corpus opens for the example GPT shape and is mostly text. */
static void test_bundled_corpus(void **state) {
  char path[1024];
  const char *src = getenv("PW_SOURCE_DIR");
#ifdef PW_SOURCE_DIR
  if (!src) src = PW_SOURCE_DIR;
#endif
  if (!src) skip();
  snprintf(path, sizeof path, "%s/examples/data/corpus.txt", src);
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  fseek(fp, 0, SEEK_END);
  long L = ftell(fp);
  fclose(fp);
  assert_true(L > 500000 && L < 2200000);
  pw_data_spec spec = text_spec(path, PW_SAMPLER_SEQUENTIAL, 0.1);
  pw_data_shape sh = {.vocab_size = 256, .seq_len = 64, .tokens = 1};
  pw_dataset *ds = open_ok(&spec, &sh, 1);
  assert_int_equal(pw_dataset_train_len(ds), (size_t)L - (size_t)floor((double)L * 0.1));
  int32_t in[4 * 64];
  pw_dataset_batch(ds, PW_SPLIT_TRAIN, 0, 0, 4, 4, in, NULL);
  int letters = 0;
  for (int t = 0; t < 4 * 64; t++) letters += (in[t] >= 'a' && in[t] <= 'z') || in[t] == ' ';
  assert_true(letters > 4 * 64 / 2);
  pw_dataset_close(ds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_sequential),
      cmocka_unit_test(test_text_random),
      cmocka_unit_test(test_text_splits_disjoint),
      cmocka_unit_test(test_microbatch_independence),
      cmocka_unit_test(test_copy_reverse),
      cmocka_unit_test(test_regression_classify),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_bundled_corpus),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
