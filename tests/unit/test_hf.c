/* test_hf: Hugging Face model directories (common/io/hf.h) without
 * transformers — the config mapping, every refusal naming its field, a
 * Llama directory written here (q, k, v joined into our rows), a GPT-2 one
 * (Conv1D transposed), the sharded index, and export -> import bit for bit;
 * pw_st_to_f32's BF16 and F16 widening. tests/ref/test_hf_ref.sh holds the
 * same against transformers itself. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
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
  snprintf(g_dir, sizeof g_dir, "/tmp/pw_hf_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *LLAMA =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 11,"
    " \"hidden_size\": 8, \"intermediate_size\": 6, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"max_position_embeddings\": 16, \"rms_norm_eps\": 1e-06,"
    " \"rope_theta\": 500000.0, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\","
    " \"attention_bias\": false, \"mlp_bias\": false, \"torch_dtype\": \"float32\", \"bos_token_id\": 1}";

static json_t *cfg_with(const char *base, const char *key, json_t *v) {
  json_t *c = json_loads(base, 0, NULL);
  assert_non_null(c);
  if (key) json_object_set_new(c, key, v);
  return c;
}

/* The model object of a config, or NULL with err filled. */
static json_t *model_of(json_t *cfg, int seq_len, pw_err *err) {
  json_t *m = NULL;
  char arch[PW_HF_ARCH_MAX], notes[PW_HF_NOTES_MAX];
  int rc = pw_hf_config_model(cfg, "config.json", seq_len, &m, arch, notes, sizeof notes, err);
  json_decref(cfg);
  assert_true(rc ? m == NULL : m != NULL);
  return m;
}

static void test_config_llama(void **state) {
  (void)state;
  pw_err err = {0};
  json_t *m = model_of(cfg_with(LLAMA, NULL, NULL), 0, &err);
  assert_non_null(m);
  assert_string_equal(json_string_value(json_object_get(m, "template")), "llama");
  assert_int_equal(json_integer_value(json_object_get(m, "seq_len")), 16);
  assert_int_equal(json_integer_value(json_object_get(m, "n_kv_heads")), 1);
  assert_int_equal(json_integer_value(json_object_get(m, "ffn_hidden")), 6);
  assert_true(json_real_value(json_object_get(m, "rope_base")) == 500000.0);
  assert_true(json_real_value(json_object_get(m, "norm_eps")) == 1e-6);
  json_decref(m);
  m = model_of(cfg_with(LLAMA, NULL, NULL), 8, &err);
  assert_int_equal(json_integer_value(json_object_get(m, "seq_len")), 8);
  json_decref(m);
}

/* transformers 5's spelling (dtype, rope_parameters) reads as 4.x's: the
 * same model object; contradictions and strays refused by name. */
static void test_config_v5(void **state) {
  (void)state;
  static const char *const L3 = "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
                                " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8";
  char v4s[256], v5s[256];
  snprintf(v4s, sizeof v4s, "%s}", L3);
  snprintf(v5s, sizeof v5s, "%s, \"rope_theta\": 500000.0}", L3);
  pw_err err = {0};
  json_t *v4 = model_of(cfg_with(LLAMA, "rope_scaling", json_loads(v4s, 0, NULL)), 0, &err);
  json_t *c = cfg_with(LLAMA, "rope_parameters", json_loads(v5s, 0, NULL));
  json_object_del(c, "rope_theta");
  json_object_del(c, "torch_dtype");
  json_object_set_new(c, "dtype", json_string("bfloat16"));
  json_t *v5 = model_of(c, 0, &err);
  assert_non_null(v4);
  if (!v5) fail_msg("rope_parameters llama3: %s", err.msg);
  assert_true(json_equal(v4, v5));
  assert_non_null(json_object_get(v5, "rope_scaling"));
  json_decref(v5);
  /* the default rope: rope_theta alone, no rope_scaling */
  c = cfg_with(LLAMA, "rope_parameters", json_loads("{\"rope_type\": \"default\", \"rope_theta\": 500000.0}", 0, NULL));
  json_object_del(c, "rope_theta");
  v5 = model_of(c, 0, &err);
  json_t *plain = model_of(cfg_with(LLAMA, NULL, NULL), 0, &err);
  assert_non_null(v5);
  assert_true(json_equal(plain, v5));
  json_decref(v5), json_decref(plain), json_decref(v4);
  static const struct {
    const char *value, *needle;
  } bad[] = {
      {"{\"rope_type\": \"default\", \"rope_theta\": 10000.0}", "rope_theta and rope_parameters.rope_theta differ"},
      {"{\"rope_type\": \"default\", \"rope_theta\": 500000.0, \"factor\": 2.0}", "rope_parameters.factor"},
      {"{\"rope_type\": \"default\"}", "rope_parameters.rope_theta"},
      {"{\"rope_type\": \"yarn\", \"rope_theta\": 500000.0, \"factor\": 4.0}", "rope_scaling.rope_type"},
      {"[1]", "rope_parameters: must be an object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_t *v = json_loads(bad[i].value, JSON_DECODE_ANY, NULL);
    assert_non_null(v);
    json_t *m = model_of(cfg_with(LLAMA, "rope_parameters", v), 0, &err);
    if (m || !strstr(err.msg, bad[i].needle)) fail_msg("rope_parameters = %s: got '%s'", bad[i].value, err.msg);
  }
}

/* Qwen3-MoE's config (transformers 5's spelling): the mixture's fields,
 * its dense first blocks as first_dense, decoder_sparse_step as every;
 * what first_dense and every cannot say is refused by name. Mixtral's:
 * every block, softmax top-k. */
static void test_config_moe(void **state) {
  (void)state;
  static const char *const Q3M =
      "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 11,"
      " \"hidden_size\": 8, \"intermediate_size\": 12, \"moe_intermediate_size\": 4, \"num_hidden_layers\": 3,"
      " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 6, \"max_position_embeddings\": 16,"
      " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"norm_topk_prob\": true, \"mlp_only_layers\": [0],"
      " \"decoder_sparse_step\": 1, \"output_router_logits\": false, \"router_aux_loss_coef\": 0.001,"
      " \"dtype\": \"float32\", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}";
  pw_err err = {0};
  json_t *m = model_of(cfg_with(Q3M, NULL, NULL), 0, &err);
  if (!m) fail_msg("Qwen3-MoE: %s", err.msg);
  json_t *moe = json_object_get(m, "moe");
  assert_non_null(moe);
  assert_int_equal(json_integer_value(json_object_get(moe, "experts")), 4);
  assert_int_equal(json_integer_value(json_object_get(moe, "top_k")), 2);
  assert_int_equal(json_integer_value(json_object_get(moe, "ffn_hidden")), 4);
  assert_int_equal(json_integer_value(json_object_get(moe, "first_dense")), 1);
  assert_null(json_object_get(moe, "gate")); /* norm_topk_prob: the default softmax_topk */
  assert_int_equal(json_integer_value(json_object_get(m, "ffn_hidden")), 12); /* the dense blocks' */
  assert_true(json_is_true(json_object_get(m, "qk_norm")));
  json_decref(m);
  m = model_of(cfg_with(Q3M, "norm_topk_prob", json_false()), 0, &err);
  assert_string_equal(json_string_value(json_object_get(json_object_get(m, "moe"), "gate")), "softmax");
  json_decref(m);
  json_t *c = cfg_with(Q3M, "decoder_sparse_step", json_integer(2));
  json_object_set_new(c, "mlp_only_layers", json_array());
  m = model_of(c, 0, &err); /* blocks 1, 3, ...: (i + 1) % 2 == 0 */
  assert_int_equal(json_integer_value(json_object_get(json_object_get(m, "moe"), "every")), 2);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(m, "moe"), "first_dense")), 1);
  json_decref(m);
  static const struct {
    const char *key, *value, *needle;
  } bad[] = {
      {"mlp_only_layers", "[1]", "mlp_only_layers: only the first blocks"},
      {"decoder_sparse_step", "2", "mlp_only_layers: only the first blocks"},
      {"mlp_only_layers", "[0, 1, 2]", "no block is a mixture"},
      {"output_router_logits", "true", "output_router_logits"},
      {"num_experts_per_tok", "5", "num_experts_per_tok"},
      {"num_experts", "3", "num_experts and num_local_experts differ"},
      {"router_jitter_noise", "0.1", "router_jitter_noise: not a field"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_t *v = json_loads(bad[i].value, JSON_DECODE_ANY, NULL);
    json_t *got = model_of(cfg_with(Q3M, bad[i].key, v), 0, &err);
    if (got || !strstr(err.msg, bad[i].needle)) fail_msg("%s = %s: got '%s'", bad[i].key, bad[i].value, err.msg);
  }
}

/* Each refusal names the field. */
static void test_config_refusals(void **state) {
  (void)state;
  static const struct {
    const char *key, *value, *needle;
  } bad[] = {
      {"hidden_act", "\"gelu\"", "hidden_act"},
      {"attention_bias", "true", "attention_bias"},
      {"mlp_bias", "true", "mlp_bias"},
      {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope_scaling.rope_type"},
      {"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                       "\"original_max_position_embeddings\": 8, \"beta\": 1}", "rope_scaling.beta"},
      {"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0}", "rope_scaling.low_freq_factor"},
      {"quantization_config", "{}", "quantization_config"},
      {"head_dim", "7", "head_dim"}, /* odd: rope rotates pairs */
      {"num_key_value_heads", "3", "num_key_value_heads"},
      {"vocab_size", "1.5", "vocab_size"},
      {"hidden_size", "null", "hidden_size"},
      {"layer_types", "[\"sliding_attention\"]", "layer_types[0]"},
      {"architectures", "[\"Gemma2ForCausalLM\"]", "\"Gemma2ForCausalLM\" is not supported"},
      {"model_type", "\"mistral\"", "model_type"},
      {"pruned_heads", "{\"0\": [1]}", "pruned_heads"},
      {"is_encoder_decoder", "true", "is_encoder_decoder"},
      {"attention_dropout", "1.5", "attention_dropout"},
      {"max_position_embeddings", "100000", "--seq-len"},
      {"rms_norm_eps", "0", "rms_norm_eps"},
      {"sliding_window", "4", "sliding_window"}, /* not a Llama field */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    pw_err err = {0};
    json_t *v = json_loads(bad[i].value, JSON_DECODE_ANY, NULL);
    assert_non_null(v);
    json_t *m = model_of(cfg_with(LLAMA, bad[i].key, v), 0, &err);
    if (m || !strstr(err.msg, bad[i].needle)) fail_msg("%s = %s: got '%s'", bad[i].key, bad[i].value, err.msg);
  }
  /* Mistral's window: model.sliding_window where it is shorter than the
   * positions (absent: MistralConfig's 4096; null: none); head_dim of its
   * own width: model.head_dim */
  static const struct {
    const char *sw;
    int want;
  } win[] = {{"8", 8}, {"null", 0}, {NULL, 0}, {"100000", 0}};
  for (size_t i = 0; i < sizeof win / sizeof win[0]; i++) {
    json_t *c = cfg_with(LLAMA, "head_dim", json_integer(6));
    json_object_set_new(c, "architectures", json_loads("[\"MistralForCausalLM\"]", 0, NULL));
    json_object_set_new(c, "model_type", json_string("mistral"));
    json_object_del(c, "attention_bias");
    json_object_del(c, "mlp_bias");
    if (win[i].sw) json_object_set_new(c, "sliding_window", json_loads(win[i].sw, JSON_DECODE_ANY, NULL));
    pw_err err = {0};
    json_t *m = model_of(c, 0, &err);
    if (!m) fail_msg("sliding_window %s: %s", win[i].sw ? win[i].sw : "absent", err.msg);
    json_t *sw = json_object_get(m, "sliding_window");
    if ((sw ? (int)json_integer_value(sw) : 0) != win[i].want)
      fail_msg("sliding_window %s: model.sliding_window %d, want %d", win[i].sw ? win[i].sw : "absent",
               sw ? (int)json_integer_value(sw) : 0, win[i].want);
    assert_int_equal(json_integer_value(json_object_get(m, "head_dim")), 6);
    json_decref(m);
  }
}

/* ---- a directory written here --------------------------------------------- */

static float *ramp(int n, float base) {
  float *v = malloc(sizeof *v * (size_t)n);
  for (int i = 0; i < n; i++) v[i] = base + 0.001f * (float)i;
  return v;
}

static void write_cfg(const char *dir, const char *text) {
  char p[256];
  snprintf(p, sizeof p, "%s/config.json", dir);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* The Llama of LLAMA: d 8, 2 heads of 4, 1 kv head, ffn 6, V 11. */
static void write_llama(const char *dir, int n_files, const char *drop) {
  static const struct {
    const char *name;
    int r, c;
  } ts[] = {{"model.embed_tokens.weight", 11, 8},
            {"model.layers.0.input_layernorm.weight", 8, 0},
            {"model.layers.0.self_attn.q_proj.weight", 8, 8},
            {"model.layers.0.self_attn.k_proj.weight", 4, 8},
            {"model.layers.0.self_attn.v_proj.weight", 4, 8},
            {"model.layers.0.self_attn.o_proj.weight", 8, 8},
            {"model.layers.0.post_attention_layernorm.weight", 8, 0},
            {"model.layers.0.mlp.gate_proj.weight", 6, 8},
            {"model.layers.0.mlp.up_proj.weight", 6, 8},
            {"model.layers.0.mlp.down_proj.weight", 8, 6},
            {"model.norm.weight", 8, 0},
            {"lm_head.weight", 11, 8},
            {"model.layers.0.self_attn.rotary_emb.inv_freq", 2, 0}};
  int n = (int)(sizeof ts / sizeof ts[0]);
  pw_st_tensor t[16];
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (drop && !strcmp(drop, ts[i].name)) continue;
    t[k] = (pw_st_tensor){.name = ts[i].name, .dtype = PW_ST_F32, .ndim = ts[i].c ? 2 : 1,
                          .data = ramp(ts[i].r * (ts[i].c ? ts[i].c : 1), (float)i)};
    t[k].shape[0] = ts[i].r;
    t[k].shape[1] = ts[i].c;
    k++;
  }
  write_cfg(dir, LLAMA);
  char p[256];
  pw_st_meta meta = {"format", "pt"};
  pw_err err = {0};
  if (n_files == 1) {
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(pw_st_write(p, t, k, &meta, 1, &err), 0);
  } else { /* two shards and an index */
    json_t *wm = json_object();
    int half = k / 2;
    for (int s = 0; s < 2; s++) {
      char fn[64];
      snprintf(fn, sizeof fn, "model-0000%d-of-00002.safetensors", s + 1);
      snprintf(p, sizeof p, "%s/%s", dir, fn);
      int lo = s ? half : 0, hi = s ? k : half;
      assert_int_equal(pw_st_write(p, t + lo, hi - lo, &meta, 1, &err), 0);
      for (int i = lo; i < hi; i++) json_object_set_new(wm, t[i].name, json_string(fn));
    }
    json_t *idx = json_pack("{s:{}, s:o}", "metadata", "weight_map", wm);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(idx, p, 0), 0);
    json_decref(idx);
  }
  for (int i = 0; i < k; i++) free((void *)t[i].data);
}

static const pw_st_tensor *find(const pw_hf_import_result *r, const char *name) {
  for (int i = 0; i < r->n_tensors; i++)
    if (!strcmp(r->tensors[i].name, name)) return &r->tensors[i];
  fail_msg("no tensor %s", name);
  return NULL;
}

static void test_llama_dir(void **state) {
  (void)state;
  char dir[128];
  snprintf(dir, sizeof dir, "%s/llama", g_dir);
  assert_int_equal(mkdir(dir, 0777), 0);
  write_llama(dir, 1, NULL);
  pw_hf_import_result r;
  pw_err err = {0};
  assert_int_equal(pw_hf_import(dir, &(pw_hf_import_opts){0}, &r, &err), 0);
  assert_string_equal(r.arch, "LlamaForCausalLM");
  assert_int_equal(r.n_tensors, 10);
  assert_true(r.data_placeholder);
  assert_string_equal(json_string_value(json_object_get(r.job, "name")), "llama");
  /* qkv: q's 8 rows (index 2 in the list: base 2.0), then k's 4 (3.0), v's 4 (4.0) */
  const pw_st_tensor *qkv = find(&r, "blocks.0.attn.qkv.weight");
  assert_int_equal(qkv->shape[0], 16);
  const float *w = qkv->data;
  assert_true(w[0] == 2.0f && w[8 * 8] == 3.0f && w[12 * 8] == 4.0f && w[12 * 8 + 1] == 4.001f);
  /* a sharded copy imports to the same tensors */
  char dir2[128];
  snprintf(dir2, sizeof dir2, "%s/llama-sharded", g_dir);
  assert_int_equal(mkdir(dir2, 0777), 0);
  write_llama(dir2, 2, NULL);
  pw_hf_import_result r2;
  assert_int_equal(pw_hf_import(dir2, &(pw_hf_import_opts){.name = "llama"}, &r2, &err), 0);
  assert_int_equal(r2.n_tensors, r.n_tensors);
  for (int i = 0; i < r.n_tensors; i++) {
    assert_string_equal(r.tensors[i].name, r2.tensors[i].name);
    size_t n = (size_t)r.tensors[i].shape[0] * (size_t)(r.tensors[i].ndim == 2 ? r.tensors[i].shape[1] : 1);
    assert_memory_equal(r.tensors[i].data, r2.tensors[i].data, n * 4);
  }
  pw_hf_import_free(&r2);

  /* export -> import: bit for bit, and the same model */
  char ck[160], ex[160];
  snprintf(ck, sizeof ck, "%s/ck.safetensors", g_dir);
  snprintf(ex, sizeof ex, "%s/export", g_dir);
  assert_int_equal(pw_st_write(ck, r.tensors, r.n_tensors, NULL, 0, &err), 0);
  pw_job job;
  assert_int_equal(pw_job_parse(r.job, NULL, &job, &err), 0);
  assert_int_equal(pw_hf_export(&job.model, ck, ex, &err), 0);
  assert_int_equal(pw_hf_import(ex, &(pw_hf_import_opts){.name = "llama"}, &r2, &err), 0);
  assert_true(json_equal(json_object_get(r.job, "model"), json_object_get(r2.job, "model")));
  for (int i = 0; i < r.n_tensors; i++) {
    size_t n = (size_t)r.tensors[i].shape[0] * (size_t)(r.tensors[i].ndim == 2 ? r.tensors[i].shape[1] : 1);
    assert_memory_equal(r.tensors[i].data, r2.tensors[i].data, n * 4);
  }
  pw_hf_import_free(&r2);
  /* export refusals: LoRA, qk_norm with qkv_bias, the mlp template */
  job.model.lora_rank = 4;
  assert_int_equal(pw_hf_export(&job.model, ck, ex, &err), PW_ENOTSUP);
  assert_string_equal(err.path, "model.lora");
  job.model.lora_rank = 0;
  job.model.qk_norm = job.model.qkv_bias = 1;
  assert_int_equal(pw_hf_export(&job.model, ck, ex, &err), PW_ENOTSUP);
  job.model.qk_norm = job.model.qkv_bias = 0;
  job.model.embed_scale = 1; /* a part of Gemma's options */
  assert_int_equal(pw_hf_export(&job.model, ck, ex, &err), PW_ENOTSUP);
  assert_string_equal(err.path, "model.mlp_act");
  job.model.embed_scale = 0;
  job.model.n_layers = 2; /* blocks.1 is not in the checkpoint */
  assert_int_not_equal(pw_hf_export(&job.model, ck, ex, &err), 0);
  assert_non_null(strstr(err.msg, "blocks.1."));
  pw_job_free(&job);
  pw_hf_import_free(&r);
}

static void test_llama_dir_refusals(void **state) {
  (void)state;
  char dir[128];
  pw_hf_import_result r;
  pw_err err = {0};
  snprintf(dir, sizeof dir, "%s/miss", g_dir);
  assert_int_equal(mkdir(dir, 0777), 0);
  write_llama(dir, 1, "model.layers.0.self_attn.v_proj.weight");
  assert_int_not_equal(pw_hf_import(dir, &(pw_hf_import_opts){0}, &r, &err), 0);
  assert_non_null(strstr(err.msg, "'model.layers.0.self_attn.v_proj.weight' is missing"));
  assert_null(r.job);
  assert_int_equal(r.n_tensors, 0);
  snprintf(dir, sizeof dir, "%s/none", g_dir);
  assert_int_equal(mkdir(dir, 0777), 0);
  assert_int_equal(pw_hf_import(dir, &(pw_hf_import_opts){0}, &r, &err), PW_ENOENT);
  write_cfg(dir, "{\"architectures\": [\"LlamaForCausalLM\"], \"architectures\": []}");
  assert_int_equal(pw_hf_import(dir, &(pw_hf_import_opts){0}, &r, &err), PW_EJSON);
  write_cfg(dir, LLAMA);
  assert_int_equal(pw_hf_import(dir, &(pw_hf_import_opts){0}, &r, &err), PW_ENOENT);
  assert_non_null(strstr(err.msg, "model.safetensors"));
}

/* GPT-2: Conv1D [in, out] transposed to our [out, in]; the
 * "transformer." prefix or none; wpe cut by seq_len. */
static void test_gpt2_dir(void **state) {
  (void)state;
  char dir[128];
  snprintf(dir, sizeof dir, "%s/gpt2", g_dir);
  assert_int_equal(mkdir(dir, 0777), 0);
  write_cfg(dir, "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", \"vocab_size\": 256,"
                 " \"n_positions\": 8, \"n_embd\": 4, \"n_layer\": 1, \"n_head\": 2, \"n_inner\": null,"
                 " \"attn_pdrop\": 0.1, \"activation_function\": \"gelu_new\"}");
  static const struct {
    const char *name;
    int r, c;
  } ts[] = {{"wte.weight", 256, 4},        {"wpe.weight", 8, 4},          {"h.0.ln_1.weight", 4, 0},
            {"h.0.ln_1.bias", 4, 0},       {"h.0.attn.c_attn.weight", 4, 12}, {"h.0.attn.c_attn.bias", 12, 0},
            {"h.0.attn.c_proj.weight", 4, 4}, {"h.0.attn.c_proj.bias", 4, 0}, {"h.0.ln_2.weight", 4, 0},
            {"h.0.ln_2.bias", 4, 0},       {"h.0.mlp.c_fc.weight", 4, 16}, {"h.0.mlp.c_fc.bias", 16, 0},
            {"h.0.mlp.c_proj.weight", 16, 4}, {"h.0.mlp.c_proj.bias", 4, 0}, {"ln_f.weight", 4, 0},
            {"ln_f.bias", 4, 0},           {"h.0.attn.bias", 1, 0}};
  pw_st_tensor t[20];
  int n = (int)(sizeof ts / sizeof ts[0]);
  for (int i = 0; i < n; i++) {
    t[i] = (pw_st_tensor){.name = ts[i].name, .dtype = PW_ST_F32, .ndim = ts[i].c ? 2 : 1,
                          .data = ramp(ts[i].r * (ts[i].c ? ts[i].c : 1), (float)i)};
    t[i].shape[0] = ts[i].r;
    t[i].shape[1] = ts[i].c;
  }
  char p[256];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  pw_err err = {0};
  assert_int_equal(pw_st_write(p, t, n, NULL, 0, &err), 0);
  pw_hf_import_result r;
  assert_int_equal(pw_hf_import(dir, &(pw_hf_import_opts){.seq_len = 5}, &r, &err), 0);
  assert_non_null(strstr(r.notes, "attn_pdrop 0.1"));
  assert_false(r.data_placeholder); /* vocab 256: the example corpus */
  assert_string_equal(json_string_value(json_object_get(json_object_get(r.job, "data"), "kind")), "text");
  const pw_st_tensor *q = find(&r, "blocks.0.attn.qkv.weight");
  assert_int_equal(q->shape[0], 12);
  assert_int_equal(q->shape[1], 4);
  const float *w = q->data, *src = t[4].data; /* ours[o][i] = hf[i][o] */
  for (int o = 0; o < 12; o++)
    for (int i = 0; i < 4; i++) assert_true(w[o * 4 + i] == src[i * 12 + o]);
  const pw_st_tensor *pos = find(&r, "embed.pos.weight");
  assert_int_equal(pos->shape[0], 5);
  assert_memory_equal(pos->data, t[1].data, 5 * 4 * 4);
  /* export writes transformer.-prefixed names, and imports back the same */
  pw_job job;
  assert_int_equal(pw_job_parse(r.job, NULL, &job, &err), 0);
  char ck[160], ex[160];
  snprintf(ck, sizeof ck, "%s/gck.safetensors", g_dir);
  snprintf(ex, sizeof ex, "%s/gexport", g_dir);
  assert_int_equal(pw_st_write(ck, r.tensors, r.n_tensors, NULL, 0, &err), 0);
  assert_int_equal(pw_hf_export(&job.model, ck, ex, &err), 0);
  pw_st_file *f;
  snprintf(p, sizeof p, "%s/model.safetensors", ex);
  assert_int_equal(pw_st_open(p, &f, &err), 0);
  assert_non_null(pw_st_find(f, "transformer.h.0.mlp.c_fc.weight"));
  assert_int_equal(pw_st_find(f, "transformer.h.0.mlp.c_fc.weight")->shape[0], 4);
  pw_st_close(f);
  pw_hf_import_result r2;
  assert_int_equal(pw_hf_import(ex, &(pw_hf_import_opts){0}, &r2, &err), 0);
  assert_int_equal(r2.n_tensors, r.n_tensors);
  for (int i = 0; i < r.n_tensors; i++) {
    size_t k = (size_t)r.tensors[i].shape[0] * (size_t)(r.tensors[i].ndim == 2 ? r.tensors[i].shape[1] : 1);
    assert_memory_equal(r.tensors[i].data, r2.tensors[i].data, k * 4);
  }
  pw_hf_import_free(&r2);
  pw_job_free(&job);
  pw_hf_import_free(&r);
  for (int i = 0; i < n; i++) free((void *)t[i].data);
}

static void test_to_f32(void **state) {
  (void)state;
  uint16_t bf[3] = {0x3f80, 0xc000, 0x7f80}, hf[6] = {0x3c00, 0xc000, 0x0001, 0x7c00, 0x3555, 0x8000};
  float out[6];
  pw_err err = {0};
  pw_st_tensor t = {.name = "x", .dtype = PW_ST_BF16, .ndim = 1, .shape = {3}, .data = bf};
  assert_int_equal(pw_st_to_f32(&t, out, "f", &err), 0);
  assert_true(out[0] == 1.0f && out[1] == -2.0f && isinf(out[2]));
  t = (pw_st_tensor){.name = "x", .dtype = PW_ST_F16, .ndim = 1, .shape = {6}, .data = hf};
  assert_int_equal(pw_st_to_f32(&t, out, "f", &err), 0);
  assert_true(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0x1p-24f && isinf(out[3]));
  assert_true(out[4] == 0x1.554p-2f && out[5] == 0.0f && signbit(out[5]));
  t.dtype = PW_ST_I32;
  assert_int_equal(pw_st_to_f32(&t, out, "f", &err), PW_EFORMAT);
  assert_non_null(strstr(err.msg, "I32"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_llama),       cmocka_unit_test(test_config_refusals),
      cmocka_unit_test(test_config_v5),          cmocka_unit_test(test_config_moe),
      cmocka_unit_test(test_llama_dir),          cmocka_unit_test(test_llama_dir_refusals),
      cmocka_unit_test(test_gpt2_dir),           cmocka_unit_test(test_to_f32),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
