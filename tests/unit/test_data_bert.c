/* test_data_bert: BERT's data — masked-LM corruption of text and token
 * windows, and labeled sequences from JSON Lines — against the rules in
 * data.c's top comment, the draws recomputed here from rng.h. */
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
#include "spec_json.h"
#include "tokfile.h"

static char g_dir[64];

static int setup(void **state) {
  snprintf(g_dir, sizeof g_dir, "/tmp/pw_data_bert_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* g_dir/name with the given bytes; the path in out. */
static void write_file(const char *name, const void *b, size_t n, char out[256]) {
  snprintf(out, 256, "%s/%s", g_dir, name);
  FILE *f = fopen(out, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

/* A token file of ids (tokfile.h's writer), its path in out. */
static void write_tokens(const char *name, const uint32_t *ids, size_t n, uint32_t vocab, char out[256]) {
  snprintf(out, 256, "%s/%s", g_dir, name);
  pw_err err = {0};
  pw_tokfile_hdr h;
  assert_int_equal(pw_tokfile_write(out, ids, n, vocab, &h, &err), 0);
}

static pw_data_spec file_spec(pw_data_kind kind, const char *path, pw_sampler_kind s, double ef, int mask) {
  pw_data_spec d;
  memset(&d, 0, sizeof d);
  d.kind = kind;
  snprintf(d.path, sizeof d.path, "%s", path);
  d.sampler = s;
  d.eval_fraction = ef;
  d.mask_token = mask;
  return d;
}

static pw_dataset *open_ok(const pw_data_spec *spec, const pw_data_shape *sh, unsigned long long seed) {
  pw_dataset *ds = NULL;
  pw_err err = {0};
  if (pw_dataset_open(spec, sh, seed, &ds, &err)) {
    char b[700];
    fail_msg("open failed: %s", pw_err_str(&err, b, sizeof b));
  }
  return ds;
}

/* The open fails with code and a message holding want. */
static void open_fails(const pw_data_spec *spec, const pw_data_shape *sh, int code, const char *want) {
  pw_dataset *ds = (pw_dataset *)&ds;
  pw_err err = {0};
  int rc = pw_dataset_open(spec, sh, 1, &ds, &err);
  char b[700];
  pw_err_str(&err, b, sizeof b);
  if (rc != code || !strstr(b, want)) fail_msg("got %d '%s', expected %d '%s'", rc, b, code, want);
  assert_null(ds);
}

/* ---- masked LM ------------------------------------------------------------ */

/* The corruption recomputed from the rule, written out anew. */
static void mlm_expect(uint64_t key, const int32_t *orig, int T, int K, int V, int mask, int pad, int32_t *x,
                       int32_t *tg) {
  int p[256], n = 0;
  for (int t = 0; t < T; t++)
    if (pad < 0 || orig[t] != pad) p[n++] = t;
  pw_rng r;
  pw_rng_seed(&r, pw_hash64(key, pw_hash_str("mlm")));
  for (int j = 0; j < K; j++) {
    int s = j + (int)(pw_rng_u64(&r) % (uint64_t)(n - j)), q = p[s];
    p[s] = p[j], p[j] = q;
  }
  memcpy(x, orig, sizeof(int32_t) * (size_t)T);
  for (int t = 0; t < T; t++) tg[t] = -100;
  for (int j = 0; j < K; j++) {
    tg[p[j]] = orig[p[j]];
    uint64_t u = pw_rng_u64(&r) % 10;
    if (u < 8) x[p[j]] = mask;
    else if (u == 8) x[p[j]] = (int32_t)(pw_rng_u64(&r) % (uint64_t)V);
  }
}

static uint64_t key_of(uint64_t seed, const char *split, long k, int i) {
  return pw_hash64(pw_hash64(pw_hash64(seed, pw_hash_str(split)), (uint64_t)k), (uint64_t)i);
}

/* Token windows (sequential) corrupted as the rule says: exactly K targets,
 * never at a pad, the original token there; 80/10/10 over many draws. */
static void test_mlm_tokens(void **state) {
  enum { T = 24, K = 5, V = 300, MASK = 299, PAD = 0, B = 6, N = 4000 };
  uint32_t *ids = malloc(sizeof *ids * N);
  pw_rng r;
  pw_rng_seed(&r, 5);
  for (int i = 0; i < N; i++) ids[i] = i % 37 < 6 ? PAD : 1 + (uint32_t)pw_rng_below(&r, V - 2); /* runs of pads */
  char path[256];
  write_tokens("mlm.tokens", ids, N, V, path);
  pw_data_spec spec = file_spec(PW_DATA_TOKENS, path, PW_SAMPLER_SEQUENTIAL, 0.1, MASK);
  pw_data_shape sh = {.vocab_size = V, .seq_len = T, .tokens = 1, .mlm_predictions = K, .pad_token = PAD};
  pw_dataset *ds = open_ok(&spec, &sh, 9);
  int32_t in[B * T], tg[B * T], x[T], y[T], orig[T];
  long fate[3] = {0}, chosen_pad = 0;
  for (long k = 0; k < 300; k++)
    for (int split = 0; split < 2; split++) {
      pw_dataset_batch(ds, (pw_split)split, k, 0, B, B, in, tg);
      size_t base = split ? N - N / 10 : 0, S = split ? N / 10 : N - N / 10, M = S - T - 1;
      for (int i = 0; i < B; i++) {
        size_t o = (size_t)(((unsigned __int128)k * B + (unsigned)i) * T % M);
        for (int t = 0; t < T; t++) orig[t] = (int32_t)ids[base + o + (size_t)t];
        mlm_expect(key_of(9, split ? "eval" : "train", k, i), orig, T, K, V, MASK, PAD, x, y);
        if (memcmp(x, in + i * T, sizeof x) || memcmp(y, tg + i * T, sizeof y))
          fail_msg("split %d k=%ld i=%d: not the rule's corruption", split, k, i);
        int n_tg = 0;
        for (int t = 0; t < T; t++) {
          int32_t a = in[i * T + t], b = tg[i * T + t];
          if (b == -100) {
            assert_int_equal(a, orig[t]);
            continue;
          }
          n_tg++;
          chosen_pad += orig[t] == PAD;
          assert_int_equal(b, orig[t]);
          fate[a == MASK ? 0 : a == orig[t] ? 2 : 1]++;
        }
        assert_int_equal(n_tg, K);
      }
    }
  assert_int_equal(chosen_pad, 0);
  long all = fate[0] + fate[1] + fate[2]; /* 18000 positions: the shares within 1.5 % */
  assert_int_equal(all, 300 * 2 * B * K);
  if (labs(fate[0] * 1000 / all - 800) > 15 || labs(fate[1] * 1000 / all - 100) > 15 || labs(fate[2] * 1000 / all - 100) > 15)
    fail_msg("mask / random / kept: %ld %ld %ld of %ld", fate[0], fate[1], fate[2], all);
  pw_dataset_close(ds);
  free(ids);
}

/* Bytes (text) under the random sampler: the window at key mod M, and the
 * corruption keyed by the same sequence key; first/last stage draws agree. */
static void test_mlm_text_random(void **state) {
  enum { T = 16, K = 3, B = 8 };
  char text[2000];
  for (int i = 0; i < (int)sizeof text; i++) text[i] = (char)('a' + (i * 7 + i / 13) % 26);
  char path[256];
  write_file("mlm.txt", text, sizeof text, path);
  pw_data_spec spec = file_spec(PW_DATA_TEXT, path, PW_SAMPLER_RANDOM, 0.1, 4);
  pw_data_shape sh = {.vocab_size = 256, .seq_len = T, .tokens = 1, .mlm_predictions = K, .pad_token = -1};
  pw_dataset *ds = open_ok(&spec, &sh, 3);
  int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T], x[T], y[T], orig[T];
  for (long k = 0; k < 20; k++) {
    pw_dataset_batch(ds, PW_SPLIT_TRAIN, k, 0, B, B, in, tg);
    pw_dataset_batch(ds, PW_SPLIT_TRAIN, k, 0, 3, B, in2, NULL);
    pw_dataset_batch(ds, PW_SPLIT_TRAIN, k, 3, 5, B, in2 + 3 * T, NULL);
    pw_dataset_batch(ds, PW_SPLIT_TRAIN, k, 5, 3, B, NULL, tg2 + 5 * T);
    pw_dataset_batch(ds, PW_SPLIT_TRAIN, k, 0, 5, B, NULL, tg2);
    assert_memory_equal(in, in2, sizeof in);
    assert_memory_equal(tg, tg2, sizeof tg);
    for (int i = 0; i < B; i++) {
      uint64_t key = key_of(3, "train", k, i), o = key % (1800 - T - 1);
      for (int t = 0; t < T; t++) orig[t] = (unsigned char)text[o + (uint64_t)t];
      mlm_expect(key, orig, T, K, 256, 4, -1, x, y);
      assert_memory_equal(x, in + i * T, sizeof x);
      assert_memory_equal(y, tg + i * T, sizeof y);
    }
  }
  pw_dataset_close(ds);
}

/* K = T: every position is chosen; pads leave too few: refused at open. */
static void test_mlm_limits(void **state) {
  enum { T = 8, V = 50 };
  uint32_t ids[400];
  for (int i = 0; i < 400; i++) ids[i] = 1 + (uint32_t)(i % 40);
  ids[100] = ids[101] = ids[103] = 0; /* three pads within 8 ids of the train split */
  char path[256];
  write_tokens("lim.tokens", ids, 400, V, path);
  pw_data_spec spec = file_spec(PW_DATA_TOKENS, path, PW_SAMPLER_SEQUENTIAL, 0.25, 49);
  pw_data_shape sh = {.vocab_size = V, .seq_len = T, .tokens = 1, .mlm_predictions = T, .pad_token = -1};
  pw_dataset *ds = open_ok(&spec, &sh, 1);
  int32_t in[T], tg[T];
  pw_dataset_batch(ds, PW_SPLIT_TRAIN, 2, 1, 1, 4, in, tg);
  for (int t = 0; t < T; t++) assert_int_equal(tg[t], (int32_t)ids[(2 * 4 + 1) * T + t]);
  pw_dataset_close(ds);
  sh.pad_token = 0;
  sh.mlm_predictions = 5;
  ds = open_ok(&spec, &sh, 1); /* 8 - 3 = 5 */
  pw_dataset_close(ds);
  sh.mlm_predictions = 6;
  open_fails(&spec, &sh, PW_ESPEC, "offset 96 of the train split holds 3 pad tokens (id 0), leaving 5 of the 6");
  sh.mlm_predictions = T + 1;
  open_fails(&spec, &sh, PW_ESPEC, "model.mlm_predictions: 9 masked positions do not fit in seq_len 8");
  sh.mlm_predictions = 2;
  spec.mask_token = -1;
  open_fails(&spec, &sh, PW_ESPEC, "data.mask_token: a masked-LM model needs the id");
  spec.mask_token = V;
  open_fails(&spec, &sh, PW_ESPEC, "data.mask_token: 50 is not below vocab_size 50");
  spec.mask_token = 1;
  spec.kind = PW_DATA_COPY;
  open_fails(&spec, &sh, PW_ESPEC, "data.kind: a masked-LM model masks the windows of kind text or tokens");
}

/* pw_mlm_corrupt alone: the same key gives the same corruption, another
 * key another; with tg NULL the inputs are unchanged. */
static void test_mlm_corrupt_pure(void **state) {
  int32_t a[40], b[40], c[40], ta[40], tc[40];
  for (int t = 0; t < 40; t++) a[t] = b[t] = c[t] = 10 + t;
  pw_mlm_corrupt(77, 40, 12, 1000, 3, -1, a, ta);
  pw_mlm_corrupt(77, 40, 12, 1000, 3, -1, b, NULL);
  pw_mlm_corrupt(78, 40, 12, 1000, 3, -1, c, tc);
  assert_memory_equal(a, b, sizeof a);
  assert_true(memcmp(a, c, sizeof a) != 0 || memcmp(ta, tc, sizeof ta) != 0);
}

/* ---- labeled sequences ---------------------------------------------------- */

static const char labeled_text[] =
    "{\"tokens\": [1, 5, 6, 2], \"label\": 0}\n"
    "\n"
    "{\"tokens\": [1, 7, 2, 8, 9, 2], \"label\": 2, \"text\": \"a b\"}\r\n"
    "{\"label\": 1, \"tokens\": [1, 3, 3, 3, 3, 3, 3, 3, 3, 2]}\n"
    "{\"tokens\": [1, 4, 2], \"label\": 1}\n"
    "   \n"
    "{\"tokens\": [1, 9, 9, 2], \"label\": 0}"; /* no final newline */

/* Rows padded / cut to T, labels in order, the last eval_fraction the
 * eval split; sequential and random order as the rule says. */
static void test_labeled(void **state) {
  enum { T = 6, PAD = 0, B = 3 };
  char path[256];
  write_file("lab.jsonl", labeled_text, strlen(labeled_text), path);
  static const int32_t rows[5][T] = {{1, 5, 6, 2, 0, 0}, {1, 7, 2, 8, 9, 2}, {1, 3, 3, 3, 3, 3},
                                     {1, 4, 2, 0, 0, 0}, {1, 9, 9, 2, 0, 0}};
  static const int32_t labels[5] = {0, 2, 1, 1, 0};
  pw_data_shape sh = {.vocab_size = 10, .seq_len = T, .tokens = 1, .out_dim = 3, .pad_token = PAD};
  for (int s = 0; s < 2; s++) {
    pw_data_spec spec = file_spec(PW_DATA_LABELED, path, s ? PW_SAMPLER_RANDOM : PW_SAMPLER_SEQUENTIAL, 0.25, -1);
    pw_dataset *ds = open_ok(&spec, &sh, 4); /* 5 sequences: 4 train, 1 eval */
    int32_t in[B * T], tg[B];
    for (long k = 0; k < 12; k++) {
      pw_dataset_batch(ds, PW_SPLIT_TRAIN, k, 0, B, B, in, tg);
      for (int i = 0; i < B; i++) {
        uint64_t j = s ? key_of(4, "train", k, i) % 4 : (uint64_t)(k * B + i) % 4;
        assert_memory_equal(in + i * T, rows[j], sizeof rows[j]);
        assert_int_equal(tg[i], labels[j]);
      }
      pw_dataset_batch(ds, PW_SPLIT_EVAL, k, 1, 2, B, in, tg);
      for (int i = 0; i < 2; i++) {
        assert_memory_equal(in + i * T, rows[4], sizeof rows[4]);
        assert_int_equal(tg[i], 0);
      }
    }
    pw_dataset_close(ds);
  }
  /* sequences one at a time equal the batch, inputs and targets apart */
  pw_data_spec spec = file_spec(PW_DATA_LABELED, path, PW_SAMPLER_RANDOM, 0.25, -1);
  pw_dataset *ds = open_ok(&spec, &sh, 4);
  int32_t in[B * T], tg[B], in1[T], tg1;
  pw_dataset_batch(ds, PW_SPLIT_TRAIN, 7, 0, B, B, in, tg);
  for (int i = 0; i < B; i++) {
    pw_dataset_batch(ds, PW_SPLIT_TRAIN, 7, i, 1, B, in1, NULL);
    pw_dataset_batch(ds, PW_SPLIT_TRAIN, 7, i, 1, B, NULL, &tg1);
    assert_memory_equal(in1, in + i * T, sizeof in1);
    assert_int_equal(tg1, tg[i]);
  }
  pw_dataset_close(ds);
}

typedef struct {
  const char *text, *want;
} lab_err;

static void test_labeled_errors(void **state) {
  pw_data_shape sh = {.vocab_size = 10, .seq_len = 4, .tokens = 1, .out_dim = 2, .pad_token = 0};
  const char *ok = "{\"tokens\": [1, 2], \"label\": 1}\n";
  const lab_err cases[] = {
      {"{\"tokens\": [1, 2], \"label\": 2}\n", "line 1: label 2 is out of range: the model has 2 labels (0 ... 1)"},
      {"{\"tokens\": [1, 2], \"label\": -1}\n", "line 1: label -1 is out of range"},
      {"\n{\"tokens\": [1, 2], \"label\": 1}\n{\"tokens\": [1, 2, \"label\": 1}\n", "line 3 column"},
      {"{\"tokens\": [1, 2], \"label\": 1, \"token_type_ids\": [0, 0]}\n", "line 1: unknown field \"token_type_ids\""},
      {"{\"tokens\": [1, 10], \"label\": 1}\n", "line 1: tokens[1] must be a token id in 0 ... 9"},
      {"{\"tokens\": [1, 2.5], \"label\": 1}\n", "line 1: tokens[1] must be a token id"},
      {"{\"tokens\": [], \"label\": 1}\n", "line 1: \"tokens\" must be a non-empty list"},
      {"{\"tokens\": [1], \"label\": \"pos\"}\n", "line 1: \"label\" must be an integer class"},
      {"{\"tokens\": [1], \"label\": 0}\n[1, 2]\n", "line 2: must be a JSON object"},
      {"{\"tokens\": [1], \"label\": 0} {\"tokens\": [1], \"label\": 0}\n", "line 1 column"},
      {"\n \n", "holds no sequences"},
      {"", "holds no sequences"},
  };
  char path[256];
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    char name[32];
    snprintf(name, sizeof name, "bad%zu.jsonl", k);
    write_file(name, cases[k].text, strlen(cases[k].text), path);
    pw_data_spec spec = file_spec(PW_DATA_LABELED, path, PW_SAMPLER_SEQUENTIAL, 0.5, -1);
    open_fails(&spec, &sh, PW_ESPEC, cases[k].want);
  }
  /* no pad token: a short line is refused, a full one is read */
  write_file("nopad.jsonl", ok, strlen(ok), path);
  pw_data_spec spec = file_spec(PW_DATA_LABELED, path, PW_SAMPLER_SEQUENTIAL, 0.5, -1);
  pw_data_shape np = sh;
  np.pad_token = -1;
  open_fails(&spec, &np, PW_ESPEC, "line 1: 2 tokens, fewer than seq_len 4, and the model has no pad_token");
  /* one sequence cannot make two splits */
  open_fails(&spec, &sh, PW_ESPEC, "has 1 sequences: eval_fraction 0.5 leaves 1 for training and 0 for eval");
  /* the model must take one label per sequence, and such a model only this kind */
  pw_data_shape lm = {.vocab_size = 10, .seq_len = 4, .tokens = 1};
  open_fails(&spec, &lm, PW_ESPEC, "data.kind: 'labeled' sequences need a token model with one label per sequence");
  spec.kind = PW_DATA_COPY;
  open_fails(&spec, &sh, PW_ESPEC, "data.kind: a model with one label per sequence reads kind labeled (got 'copy')");
}

/* ---- the job spec's rules ------------------------------------------------ */

/* pw_job_parse of a job with this model and data: 0, or the error's path. */
static int parse(const char *model, const char *data, char *path, size_t cap) {
  char text[1024];
  snprintf(text, sizeof text, "{\"name\": \"b\", \"model\": %s, \"data\": %s, \"train\": {\"batch_size\": 2}}",
           model, data);
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  if (!j) fail_msg("bad test JSON: %s", je.text);
  pw_job job;
  pw_err err = {0};
  int rc = pw_job_parse(j, NULL, &job, &err);
  if (!rc) {
    json_t *back = pw_job_to_json(&job); /* data.mask_token written back only where it is read */
    const json_t *mt = json_object_get(json_object_get(back, "data"), "mask_token");
    assert_true(mt ? json_integer_value(mt) == job.data.mask_token : job.data.mask_token == -1);
    json_decref(back);
    pw_job_free(&job);
  }
  snprintf(path, cap, "%s", rc ? err.path : "");
  json_decref(j);
  return rc;
}

static void test_spec_rules(void **state) {
  const char *mlm = "{\"template\": \"bert\", \"vocab_size\": 30, \"seq_len\": 8, \"d_model\": 8, \"n_layers\": 1, "
                    "\"n_heads\": 2, \"pad_token\": 0}";
  const char *cls = "{\"template\": \"bert\", \"bert_head\": \"classify\", \"n_labels\": 3, \"vocab_size\": 30, "
                    "\"seq_len\": 8, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 2, \"pad_token\": 0}";
  const char *gpt = "{\"template\": \"gpt\", \"seq_len\": 8, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 2}";
  static const struct {
    int which; /* 0 mlm, 1 cls, 2 gpt */
    const char *data, *path;
  } cases[] = {
      {0, "{\"kind\": \"tokens\", \"path\": \"x.tokens\", \"mask_token\": 29}", ""},
      {0, "{\"kind\": \"text\", \"path\": \"x.txt\", \"mask_token\": 3}", "model.vocab_size"}, /* bytes: 256 */
      {0, "{\"kind\": \"tokens\", \"path\": \"x.tokens\"}", "data.mask_token"},
      {0, "{\"kind\": \"tokens\", \"path\": \"x.tokens\", \"mask_token\": 30}", "data.mask_token"},
      {0, "{\"kind\": \"labeled\", \"path\": \"x.jsonl\"}", "data.kind"},
      {0, "{\"kind\": \"copy\"}", "data.kind"},
      {1, "{\"kind\": \"labeled\", \"path\": \"x.jsonl\", \"sampler\": \"sequential\"}", ""},
      {1, "{\"kind\": \"labeled\", \"path\": \"x.jsonl\", \"mask_token\": 3}", "data"}, /* not a field of labeled */
      {1, "{\"kind\": \"tokens\", \"path\": \"x.tokens\"}", "data.kind"},
      {2, "{\"kind\": \"labeled\", \"path\": \"x.jsonl\"}", "data.kind"},
      {2, "{\"kind\": \"text\", \"path\": \"x.txt\", \"mask_token\": 3}", "data.mask_token"},
      {2, "{\"kind\": \"text\", \"path\": \"x.txt\"}", ""},
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    char path[256];
    const char *model = cases[k].which == 0 ? mlm : cases[k].which == 1 ? cls : gpt;
    int rc = parse(model, cases[k].data, path, sizeof path);
    if ((rc != 0) != (cases[k].path[0] != 0) || strncmp(path, cases[k].path, strlen(cases[k].path)))
      fail_msg("case %zu (%s): rc %d at '%s', want '%s'", k, cases[k].data, rc, path, cases[k].path);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlm_tokens),      cmocka_unit_test(test_mlm_text_random),
      cmocka_unit_test(test_mlm_limits),      cmocka_unit_test(test_mlm_corrupt_pure),
      cmocka_unit_test(test_labeled),         cmocka_unit_test(test_labeled_errors),
      cmocka_unit_test(test_spec_rules),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
