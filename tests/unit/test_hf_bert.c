/* test_hf_bert: BertForMaskedLM and BertForSequenceClassification
 * directories (common/io/hf_bert.c) without transformers — the config
 * mapping and every refusal naming its field; directories written here
 * (query, key, value joined into our rows; a saved tied decoder checked;
 * a pretraining checkpoint's pooler and next-sentence head passed over;
 * legacy gamma / beta; tokenizer.json's [MASK] and [SEP]); a missing,
 * mis-shaped or extra tensor refused by name; export -> import bit for
 * bit. tests/ref/hf_bert_ref.py holds the same against transformers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf.h"
#include "safetensors.h"
#include "spec_json.h"

static char g_dir[64];

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/pw_hf_bert_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* d 8, 2 heads, ffn 12, vocab 13, 10 positions, 1 layer */
static const char *MLM =
    "{\"architectures\": [\"BertForMaskedLM\"], \"model_type\": \"bert\", \"vocab_size\": 13, \"hidden_size\": 8,"
    " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"intermediate_size\": 12,"
    " \"max_position_embeddings\": 10, \"type_vocab_size\": 2, \"hidden_act\": \"gelu\", \"layer_norm_eps\": 1e-12,"
    " \"pad_token_id\": 0, \"position_embedding_type\": \"absolute\", \"hidden_dropout_prob\": 0.1,"
    " \"attention_probs_dropout_prob\": 0.1, \"initializer_range\": 0.02, \"use_cache\": true,"
    " \"classifier_dropout\": null, \"torch_dtype\": \"float32\", \"transformers_version\": \"4.49.0\"}";

static json_t *cfg_with(const char *key, json_t *v) {
  json_t *c = json_loads(MLM, 0, NULL);
  assert_non_null(c);
  if (key) json_object_set_new(c, key, v);
  return c;
}

static json_t *classifier_cfg(void) {
  json_t *c = cfg_with("architectures", json_pack("[s]", "BertForSequenceClassification"));
  json_object_set_new(c, "id2label", json_pack("{s:s, s:s, s:s}", "0", "neg", "1", "neu", "2", "pos"));
  json_object_set_new(c, "label2id", json_pack("{s:i, s:i, s:i}", "neg", 0, "neu", 1, "pos", 2));
  return c;
}

/* The model object of a config (taken), or NULL with err filled. */
static json_t *model_of(json_t *cfg, int seq_len, pw_err *err, char *notes) {
  json_t *m = NULL;
  char arch[PW_HF_ARCH_MAX], nb[PW_HF_NOTES_MAX];
  int rc = pw_hf_config_model(cfg, "config.json", seq_len, &m, arch, notes ? notes : nb, sizeof nb, err);
  json_decref(cfg);
  assert_true(rc ? m == NULL : m != NULL);
  return m;
}

/* element k of our tensor is what write_dir put there: i + j / 1000 */
static void expect_at(const pw_hf_import_result *r, const char *name, int k, int i, int j);

static long long geti(const json_t *m, const char *k) {
  const json_t *v = json_object_get(m, k);
  if (!v) fail_msg("model.%s missing", k);
  return json_integer_value(v);
}

static void test_config(void **state) {
  (void)state;
  pw_err err = {0};
  char notes[PW_HF_NOTES_MAX];
  json_t *m = model_of(cfg_with(NULL, NULL), 0, &err, notes);
  assert_string_equal(json_string_value(json_object_get(m, "template")), "bert");
  assert_string_equal(json_string_value(json_object_get(m, "bert_head")), "mlm");
  assert_true(geti(m, "seq_len") == 10 && geti(m, "d_model") == 8 && geti(m, "ffn_hidden") == 12);
  assert_true(geti(m, "n_heads") == 2 && geti(m, "type_vocab_size") == 2 && geti(m, "pad_token") == 0);
  assert_null(json_object_get(m, "sep_token"));
  assert_null(json_object_get(m, "n_labels"));
  assert_true(json_real_value(json_object_get(m, "norm_eps")) == 1e-12);
  assert_non_null(strstr(notes, "hidden_dropout_prob 0.1"));
  json_decref(m);
  /* --seq-len cuts; sep_token_id gives the types; pad_token_id null: none; absent: BertConfig's 0 */
  m = model_of(cfg_with("sep_token_id", json_integer(3)), 6, &err, NULL);
  assert_true(geti(m, "seq_len") == 6 && geti(m, "sep_token") == 3);
  json_decref(m);
  m = model_of(cfg_with("pad_token_id", json_null()), 0, &err, NULL);
  assert_null(json_object_get(m, "pad_token"));
  json_decref(m);
  json_t *c = cfg_with(NULL, NULL);
  json_object_del(c, "pad_token_id");
  json_object_del(c, "type_vocab_size");
  m = model_of(c, 0, &err, NULL);
  assert_true(geti(m, "pad_token") == 0 && geti(m, "type_vocab_size") == 2);
  json_decref(m);
  m = model_of(cfg_with("mlm_predictions", json_integer(4)), 0, &err, NULL);
  assert_true(geti(m, "mlm_predictions") == 4);
  json_decref(m);
  /* the classifier: labels from id2label, or num_labels, or BertConfig's 2 */
  m = model_of(classifier_cfg(), 0, &err, NULL);
  assert_string_equal(json_string_value(json_object_get(m, "bert_head")), "classify");
  assert_true(geti(m, "n_labels") == 3);
  json_decref(m);
  c = cfg_with("architectures", json_pack("[s]", "BertForSequenceClassification"));
  json_object_set_new(c, "num_labels", json_integer(5));
  json_object_set_new(c, "problem_type", json_string("single_label_classification"));
  m = model_of(c, 0, &err, NULL);
  assert_true(geti(m, "n_labels") == 5);
  json_decref(m);
  m = model_of(cfg_with("architectures", json_pack("[s]", "BertForSequenceClassification")), 0, &err, NULL);
  assert_true(geti(m, "n_labels") == 2);
  json_decref(m);
}

static void test_config_refusals(void **state) {
  (void)state;
  static const struct {
    const char *key, *value, *needle;
    int classify; /* 1: with id2label (3), 2: without */
  } bad[] = {
      {"hidden_act", "\"gelu_new\"", "hidden_act: \"gelu_new\" is not supported for BertForMaskedLM (only \"gelu\")", 0},
      {"position_embedding_type", "\"relative_key\"", "position_embedding_type: \"relative_key\"", 0},
      {"is_decoder", "true", "is_decoder: true is not supported", 0},
      {"add_cross_attention", "true", "add_cross_attention", 0},
      {"tie_word_embeddings", "false", "tie_word_embeddings: false is not supported for BertForMaskedLM", 0},
      {"num_labels", "1", "num_labels: 1 makes BertForSequenceClassification a regression", 2},
      {"num_labels", "2", "num_labels: 2, but id2label has 3", 1},
      {"problem_type", "\"multi_label_classification\"", "problem_type: \"multi_label_classification\"", 1},
      {"rotary_dim", "8", "rotary_dim: not a field pipewright reads for BertForMaskedLM", 0},
      {"rms_norm_eps", "1e-6", "rms_norm_eps: not a field pipewright reads for BertForMaskedLM", 0},
      {"num_labels", "3", "num_labels: not a field pipewright reads for BertForMaskedLM", 0},
      {"num_attention_heads", "3", "num_attention_heads: 3 must divide hidden_size 8", 0},
      {"sep_token_id", "0", "sep_token_id: 0 is also pad_token_id", 0},
      {"pad_token_id", "13", "pad_token_id: 13 is out of range", 0},
      {"mlm_predictions", "11", "mlm_predictions: 11 is out of range (1 ... 10)", 0},
      {"max_position_embeddings", "100000", "max_position_embeddings: 100000 is more than model.seq_len's", 0},
      {"layer_norm_eps", "0", "layer_norm_eps: 0 must be > 0", 0},
      {"hidden_dropout_prob", "1.5", "hidden_dropout_prob: 1.5 is not a probability", 0},
      {"model_type", "\"roberta\"", "model_type: must be \"bert\"", 0},
      {"architectures", "[\"BertForPreTraining\"]", "\"BertForPreTraining\" is not supported", 0},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_t *c = bad[i].classify == 1 ? classifier_cfg()
                : bad[i].classify ? cfg_with("architectures", json_pack("[s]", "BertForSequenceClassification"))
                                  : cfg_with(NULL, NULL);
    json_object_set_new(c, bad[i].key, json_loads(bad[i].value, JSON_DECODE_ANY, NULL));
    pw_err err = {0};
    assert_null(model_of(c, 0, &err, NULL));
    if (!strstr(err.msg, bad[i].needle)) fail_msg("%s=%s: got '%s', want '%s'", bad[i].key, bad[i].value, err.msg,
                                                  bad[i].needle);
  }
  pw_err err = {0};
  assert_null(model_of(cfg_with(NULL, NULL), 11, &err, NULL));
  assert_non_null(strstr(err.msg, "--seq-len 11 is more than max_position_embeddings 10"));
  json_t *c = cfg_with("type_vocab_size", json_integer(1));
  json_object_set_new(c, "sep_token_id", json_integer(3));
  assert_null(model_of(c, 0, &err, NULL));
  assert_non_null(strstr(err.msg, "sep_token_id: set with type_vocab_size 1"));
}

/* ---- directories ---------------------------------------------------------- */

typedef struct {
  char name[96];
  int ndim;
  int64_t shape[2];
} spec_t;

/* The tensors of the MLM (classify 0) or classifier directory, in order. */
static int bert_tensors(int classify, int pretraining, spec_t *s) {
  int n = 0;
#define T1(nm, a) (snprintf(s[n].name, sizeof s[n].name, "%s", nm), s[n].ndim = 1, s[n].shape[0] = a, n++)
#define T2(nm, a, b) (snprintf(s[n].name, sizeof s[n].name, "%s", nm), s[n].ndim = 2, s[n].shape[0] = a, s[n].shape[1] = b, n++)
  T2("bert.embeddings.word_embeddings.weight", 13, 8);
  T2("bert.embeddings.position_embeddings.weight", 10, 8);
  T2("bert.embeddings.token_type_embeddings.weight", 2, 8);
  T1("bert.embeddings.LayerNorm.weight", 8);
  T1("bert.embeddings.LayerNorm.bias", 8);
  const char *L = "bert.encoder.layer.0.";
  char b[96];
#define LY2(x, r, c) (snprintf(b, sizeof b, "%s%s", L, x), T2(b, r, c))
#define LY1(x, r) (snprintf(b, sizeof b, "%s%s", L, x), T1(b, r))
  LY2("attention.self.query.weight", 8, 8), LY1("attention.self.query.bias", 8);
  LY2("attention.self.key.weight", 8, 8), LY1("attention.self.key.bias", 8);
  LY2("attention.self.value.weight", 8, 8), LY1("attention.self.value.bias", 8);
  LY2("attention.output.dense.weight", 8, 8), LY1("attention.output.dense.bias", 8);
  LY1("attention.output.LayerNorm.weight", 8), LY1("attention.output.LayerNorm.bias", 8);
  LY2("intermediate.dense.weight", 12, 8), LY1("intermediate.dense.bias", 12);
  LY2("output.dense.weight", 8, 12), LY1("output.dense.bias", 8);
  LY1("output.LayerNorm.weight", 8), LY1("output.LayerNorm.bias", 8);
  if (classify || pretraining) T2("bert.pooler.dense.weight", 8, 8), T1("bert.pooler.dense.bias", 8);
  if (classify) {
    T2("classifier.weight", 3, 8), T1("classifier.bias", 3);
  } else {
    T2("cls.predictions.transform.dense.weight", 8, 8), T1("cls.predictions.transform.dense.bias", 8);
    T1("cls.predictions.transform.LayerNorm.weight", 8), T1("cls.predictions.transform.LayerNorm.bias", 8);
    T1("cls.predictions.bias", 13);
  }
  if (pretraining) {
    T2("cls.seq_relationship.weight", 2, 8), T1("cls.seq_relationship.bias", 2);
    T2("cls.predictions.decoder.weight", 13, 8), T1("cls.predictions.decoder.bias", 13);
  }
  return n;
}

/* Tensor i holds i + j / 1000 at element j (the decoder copies: the tied
 * tensors' values, unless `untie`). `rename`: a name to replace ("old=new")
 * or to drop ("old="); shape_of: a name given another first dimension. */
static void write_dir(const char *dir, const char *cfg, int classify, int pretraining, const char *rename,
                      const char *reshape, int untie, int tokenizer) {
  spec_t s[48];
  int n = bert_tensors(classify, pretraining, s);
  pw_st_tensor t[48];
  int k = 0;
  char rn_old[96] = "", rn_new[96] = "";
  if (rename) {
    const char *eq = strchr(rename, '=');
    snprintf(rn_old, sizeof rn_old, "%.*s", (int)(eq - rename), rename);
    snprintf(rn_new, sizeof rn_new, "%s", eq + 1);
  }
  for (int i = 0; i < n; i++) {
    const char *nm = s[i].name;
    if (rename && !strcmp(nm, rn_old)) {
      if (!rn_new[0]) continue;
      nm = rn_new;
    }
    int64_t r = s[i].shape[0] + (reshape && !strcmp(nm, reshape)), c = s[i].ndim == 2 ? s[i].shape[1] : 1;
    float *d = malloc(sizeof *d * (size_t)(r * c));
    assert_non_null(d);
    int src = i;
    if (!strcmp(nm, "cls.predictions.decoder.weight")) src = 0;
    if (!strcmp(nm, "cls.predictions.decoder.bias")) src = n - 5; /* cls.predictions.bias: before the 4 pretraining ones */
    for (int64_t j = 0; j < r * c; j++) d[j] = (float)src + (float)j / 1000.0f + (untie && src != i ? 1.0f : 0.0f);
    t[k] = (pw_st_tensor){.name = strdup(nm), .dtype = PW_ST_F32, .ndim = s[i].ndim, .data = d};
    t[k].shape[0] = r;
    t[k].shape[1] = c;
    k++;
  }
  mkdir(dir, 0777);
  char p[256];
  pw_err err = {0};
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  pw_st_meta meta = {"format", "pt"};
  assert_int_equal(pw_st_write(p, t, k, &meta, 1, &err), 0);
  for (int i = 0; i < k; i++) {
    free((void *)t[i].name);
    free((void *)t[i].data);
  }
  snprintf(p, sizeof p, "%s/config.json", dir);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(cfg, f);
  fclose(f);
  snprintf(p, sizeof p, "%s/tokenizer.json", dir);
  unlink(p);
  if (tokenizer) {
    f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 0, \"content\": \"[PAD]\"}, {\"id\": 3, \"content\": "
          "\"[SEP]\"}, {\"id\": 12, \"content\": \"[MASK]\"}], \"model\": {\"type\": \"WordPiece\"}}",
          f);
    fclose(f);
  }
}

static const pw_st_tensor *find(const pw_hf_import_result *r, const char *name) {
  for (int i = 0; i < r->n_tensors; i++)
    if (!strcmp(r->tensors[i].name, name)) return &r->tensors[i];
  fail_msg("no tensor %s", name);
  return NULL;
}

static void expect_at(const pw_hf_import_result *r, const char *name, int k, int i, int j) {
  float got = ((const float *)find(r, name)->data)[k], want = (float)i + (float)j / 1000.0f;
  if (got != want) fail_msg("%s[%d] = %g, want tensor %d's element %d (%g)", name, k, got, i, j, want);
}

static char *cfg_text(json_t *c) {
  char *s = json_dumps(c, 0);
  json_decref(c);
  return s;
}

/* Import, export, import: bit for bit and the same model. */
static void round_trip(const pw_hf_import_result *r, const char *tag) {
  char ck[160], ex[160];
  pw_err err = {0};
  snprintf(ck, sizeof ck, "%s/%s-ck.safetensors", g_dir, tag);
  snprintf(ex, sizeof ex, "%s/%s-export", g_dir, tag);
  assert_int_equal(pw_st_write(ck, r->tensors, r->n_tensors, NULL, 0, &err), 0);
  pw_job job;
  assert_int_equal(pw_job_parse(r->job, NULL, &job, &err), 0);
  assert_int_equal(pw_hf_export(&job.model, ck, ex, &err), 0);
  pw_hf_import_result r2;
  const json_t *mt = json_object_get(json_object_get(r->job, "data"), "mask_token");
  pw_hf_import_opts o = {.name = "x", .has_mask_token = mt != NULL, .mask_token = (int)json_integer_value(mt)};
  if (pw_hf_import(ex, &o, &r2, &err)) fail_msg("re-import: %s: %s", err.path, err.msg);
  assert_true(json_equal(json_object_get(r->job, "model"), json_object_get(r2.job, "model")));
  assert_int_equal(r2.n_tensors, r->n_tensors);
  for (int i = 0; i < r->n_tensors; i++) {
    assert_string_equal(r->tensors[i].name, r2.tensors[i].name);
    size_t n = (size_t)r->tensors[i].shape[0] * (size_t)(r->tensors[i].ndim == 2 ? r->tensors[i].shape[1] : 1);
    assert_memory_equal(r->tensors[i].data, r2.tensors[i].data, n * 4);
  }
  pw_hf_import_free(&r2);
  pw_job_free(&job);
}

static void test_mlm_dir(void **state) {
  (void)state;
  char dir[128];
  snprintf(dir, sizeof dir, "%s/mlm", g_dir);
  write_dir(dir, MLM, 0, 1, NULL, NULL, 0, 1); /* a pretraining checkpoint, with tokenizer.json */
  pw_hf_import_result r;
  pw_err err = {0};
  if (pw_hf_import(dir, &(pw_hf_import_opts){0}, &r, &err)) fail_msg("%s: %s", err.path, err.msg);
  assert_string_equal(r.arch, "BertForMaskedLM");
  assert_int_equal(r.n_tensors, 5 + 12 + 5); /* embeddings, the block (qkv joined), the head */
  const json_t *m = json_object_get(r.job, "model"), *d = json_object_get(r.job, "data");
  assert_true(geti(m, "sep_token") == 3); /* tokenizer.json's [SEP] */
  assert_string_equal(json_string_value(json_object_get(d, "kind")), "tokens");
  assert_true(geti(d, "mask_token") == 12);
  assert_true(r.data_placeholder);
  assert_non_null(strstr(r.notes, "sep_token 3 is tokenizer.json's [SEP]"));
  assert_non_null(strstr(r.notes, "4 tensors of bert.pooler / cls.seq_relationship are not read"));
  /* qkv: query's 8 rows (tensor 5), key's (7), value's (9); the bias likewise */
  const float *w = find(&r, "blocks.0.attn.qkv.weight")->data, *b = find(&r, "blocks.0.attn.qkv.bias")->data;
  assert_true(w[0] == 5.0f && w[8 * 8] == 7.0f && w[16 * 8] == 9.0f && b[0] == 6.0f && b[8] == 8.0f && b[16] == 10.0f);
  expect_at(&r, "blocks.0.attn.qkv.weight", 16 * 8 + 1, 9, 1);
  expect_at(&r, "head.decoder.bias", 2, 27, 2); /* cls.predictions.bias */
  expect_at(&r, "embed.type.weight", 9, 2, 9);
  expect_at(&r, "blocks.0.mlp.proj.weight", 13, 17, 13);
  round_trip(&r, "mlm");
  pw_hf_import_free(&r);
  /* --mask-token wins over tokenizer.json; no tokenizer.json needs it */
  pw_hf_import_opts o = {.has_mask_token = 1, .mask_token = 11};
  assert_int_equal(pw_hf_import(dir, &o, &r, &err), 0);
  assert_true(geti(json_object_get(r.job, "data"), "mask_token") == 11);
  pw_hf_import_free(&r);
  write_dir(dir, MLM, 0, 0, NULL, NULL, 0, 0);
  assert_int_equal(pw_hf_import(dir, &(pw_hf_import_opts){0}, &r, &err), PW_EINVAL);
  assert_string_equal(err.path, "--mask-token");
  assert_null(r.job);
  o.mask_token = 13;
  assert_int_equal(pw_hf_import(dir, &o, &r, &err), PW_EINVAL);
  assert_non_null(strstr(err.msg, "13 is not below vocab_size 13"));
}

static void test_classifier_dir(void **state) {
  (void)state;
  char dir[128];
  snprintf(dir, sizeof dir, "%s/cls", g_dir);
  char *cfg = cfg_text(classifier_cfg());
  write_dir(dir, cfg, 1, 0, NULL, NULL, 0, 0);
  pw_hf_import_result r;
  pw_err err = {0};
  if (pw_hf_import(dir, &(pw_hf_import_opts){0}, &r, &err)) fail_msg("%s: %s", err.path, err.msg);
  assert_string_equal(r.arch, "BertForSequenceClassification");
  const json_t *m = json_object_get(r.job, "model"), *d = json_object_get(r.job, "data");
  assert_true(geti(m, "n_labels") == 3);
  assert_string_equal(json_string_value(json_object_get(d, "kind")), "labeled");
  assert_null(json_object_get(d, "mask_token"));
  assert_int_equal(find(&r, "head.classifier.weight")->shape[0], 3);
  expect_at(&r, "head.pooler.bias", 1, 22, 1);
  expect_at(&r, "head.classifier.weight", 20, 23, 20);
  round_trip(&r, "cls");
  pw_hf_import_free(&r);
  pw_hf_import_opts o = {.has_mask_token = 1, .mask_token = 1};
  assert_int_equal(pw_hf_import(dir, &o, &r, &err), PW_EINVAL);
  assert_non_null(strstr(err.msg, "only for BertForMaskedLM"));
  free(cfg);
}

/* A missing, mis-shaped or extra tensor and an untied decoder: refused by
 * name, nothing returned; legacy LayerNorm names read. */
static void test_dir_refusals(void **state) {
  (void)state;
  static const struct {
    const char *rename, *reshape;
    int untie;
    const char *needle;
  } bad[] = {
      {"bert.encoder.layer.0.attention.self.key.weight=", NULL, 0,
       "'bert.encoder.layer.0.attention.self.key.weight' is missing (BertForMaskedLM's blocks.0.attn.qkv.weight)"},
      {NULL, "bert.encoder.layer.0.intermediate.dense.weight", 0,
       "'bert.encoder.layer.0.intermediate.dense.weight' is [13, 8]; config.json gives BertForMaskedLM [12, 8]"},
      {"cls.seq_relationship.bias=bert.encoder.layer.0.attention.self.distance_embedding.weight", NULL, 0,
       "'bert.encoder.layer.0.attention.self.distance_embedding.weight' (in model.safetensors) is not part of"},
      {NULL, NULL, 1, "'cls.predictions.decoder.weight' differs from 'bert.embeddings.word_embeddings.weight'"},
      {"cls.predictions.decoder.weight=", NULL, 1, "'cls.predictions.decoder.bias' differs from 'cls.predictions.bias'"},
  };
  char dir[128];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(dir, sizeof dir, "%s/bad%zu", g_dir, i);
    write_dir(dir, MLM, 0, 1, bad[i].rename, bad[i].reshape, bad[i].untie, 1);
    pw_hf_import_result r;
    pw_err err = {0};
    assert_int_not_equal(pw_hf_import(dir, &(pw_hf_import_opts){0}, &r, &err), 0);
    if (!strstr(err.msg, bad[i].needle)) fail_msg("case %zu: got '%s', want '%s'", i, err.msg, bad[i].needle);
    assert_null(r.job);
    assert_int_equal(r.n_tensors, 0);
  }
  /* a legacy file: LayerNorm.gamma / .beta */
  snprintf(dir, sizeof dir, "%s/legacy", g_dir);
  write_dir(dir, MLM, 0, 0, "bert.embeddings.LayerNorm.weight=bert.embeddings.LayerNorm.gamma", NULL, 0, 1);
  pw_hf_import_result r;
  pw_err err = {0};
  if (pw_hf_import(dir, &(pw_hf_import_opts){0}, &r, &err)) fail_msg("%s: %s", err.path, err.msg);
  expect_at(&r, "embed.ln.weight", 3, 3, 3);
  pw_hf_import_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),         cmocka_unit_test(test_config_refusals),
      cmocka_unit_test(test_mlm_dir),        cmocka_unit_test(test_classifier_dir),
      cmocka_unit_test(test_dir_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
