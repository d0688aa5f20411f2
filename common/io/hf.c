/* hf: Hugging Face model directories <-> our model spec and checkpoint
 * names (hf.h). One table of config fields says what each one means to us;
 * one list of name entries (hf_map) drives both directions. Never writes a
 * file before everything it will write has been built. */
#include "hf.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_int.h"
#include "json_short.h"
#include "spec_json.h"

#define HF_NAME PW__HF_NAME
#define HF_MAX_POS PW__HF_MAX_POS

/* ---- architectures and their config fields ----------------------------- */

enum { A_GPT2 = 1, A_LLAMA = 2, A_MISTRAL = 4, A_QWEN2 = 8, A_QWEN3 = 16, A_GEMMA = 32, A_MIXTRAL = 256,
       A_QWEN3MOE = 512, A_QWEN2MOE = 1024, A_QMOE = A_QWEN3MOE | A_QWEN2MOE, A_MOE = A_MIXTRAL | A_QMOE,
       A_LL = 62 | A_MOE, A_BERT_MLM = 64, A_BERT_CLS = 128, A_BERT = 192, A_ALL = 2047 };
#define ARCH_LIST "GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, " \
                  "Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, GemmaForCausalLM, BertForMaskedLM, " \
                  "BertForSequenceClassification"

static const struct {
  const char *arch, *model_type;
  int bit;
} archs[] = {
    {"GPT2LMHeadModel", "gpt2", A_GPT2},       {"LlamaForCausalLM", "llama", A_LLAMA},
    {"MistralForCausalLM", "mistral", A_MISTRAL}, {"Qwen2ForCausalLM", "qwen2", A_QWEN2},
    {"MixtralForCausalLM", "mixtral", A_MIXTRAL}, {"Qwen3MoeForCausalLM", "qwen3_moe", A_QWEN3MOE},
    {"Qwen2MoeForCausalLM", "qwen2_moe", A_QWEN2MOE},
    {"Qwen3ForCausalLM", "qwen3", A_QWEN3},    {"GemmaForCausalLM", "gemma", A_GEMMA},
    {"BertForMaskedLM", "bert", A_BERT_MLM},   {"BertForSequenceClassification", "bert", A_BERT_CLS},
};
#define N_ARCHS ((int)(sizeof archs / sizeof archs[0]))

/* Every field an architecture's config.json may hold. `why` set: the field
 * leaves the arithmetic alone and is passed over; NULL: read below (mapped,
 * or checked to hold what we compute). Anything not listed is refused. */
static const struct {
  const char *name;
  int archs;
  const char *why;
} fields[] = {
    /* bookkeeping, token ids, generation defaults (PretrainedConfig's own) */
    {"architectures", A_ALL, NULL}, {"model_type", A_ALL, NULL},
    {"torch_dtype", A_ALL, "storage"}, {"dtype", A_ALL, "storage (transformers 5's torch_dtype)"},
    {"transformers_version", A_ALL, "bookkeeping"},
    {"_name_or_path", A_ALL, "bookkeeping"}, {"use_cache", A_ALL, "inference"},
    {"bos_token_id", A_ALL, "token id"}, {"eos_token_id", A_ALL, "token id"},
    {"pad_token_id", A_ALL, "token id"}, {"sep_token_id", A_ALL, "token id"},
    {"decoder_start_token_id", A_ALL, "token id"}, {"tokenizer_class", A_ALL, "tokenizer"},
    {"id2label", A_ALL, "labels"}, {"label2id", A_ALL, "labels"}, {"finetuning_task", A_ALL, "bookkeeping"},
    {"task_specific_params", A_ALL, "generation"}, {"prefix", A_ALL, "generation"},
    {"return_dict", A_ALL, "outputs"}, {"output_hidden_states", A_ALL, "outputs"},
    {"output_attentions", A_ALL, "outputs"}, {"torchscript", A_ALL, "export"},
    {"use_bfloat16", A_ALL, "storage"}, {"tf_legacy_loss", A_ALL, "TensorFlow"},
    {"chunk_size_feed_forward", A_ALL, "memory"}, {"is_decoder", A_ALL, "causal either way"},
    {"_attn_implementation", A_ALL, "kernel choice"}, {"_attn_implementation_autoset", A_ALL, "kernel choice"},
    {"max_length", A_ALL, "generation"}, {"min_length", A_ALL, "generation"}, {"do_sample", A_ALL, "generation"},
    {"early_stopping", A_ALL, "generation"}, {"num_beams", A_ALL, "generation"},
    {"num_beam_groups", A_ALL, "generation"}, {"diversity_penalty", A_ALL, "generation"},
    {"temperature", A_ALL, "generation"}, {"top_k", A_ALL, "generation"}, {"top_p", A_ALL, "generation"},
    {"typical_p", A_ALL, "generation"}, {"repetition_penalty", A_ALL, "generation"},
    {"length_penalty", A_ALL, "generation"}, {"no_repeat_ngram_size", A_ALL, "generation"},
    {"encoder_no_repeat_ngram_size", A_ALL, "generation"}, {"bad_words_ids", A_ALL, "generation"},
    {"num_return_sequences", A_ALL, "generation"}, {"output_scores", A_ALL, "generation"},
    {"return_dict_in_generate", A_ALL, "generation"}, {"forced_bos_token_id", A_ALL, "generation"},
    {"forced_eos_token_id", A_ALL, "generation"}, {"remove_invalid_values", A_ALL, "generation"},
    {"exponential_decay_length_penalty", A_ALL, "generation"}, {"suppress_tokens", A_ALL, "generation"},
    {"begin_suppress_tokens", A_ALL, "generation"},
    /* checked: must be off */
    {"is_encoder_decoder", A_ALL, NULL}, {"add_cross_attention", A_ALL, NULL},
    {"tie_encoder_decoder", A_ALL, NULL}, {"pruned_heads", A_ALL, NULL},
    {"tie_word_embeddings", A_ALL, NULL}, {"initializer_range", A_ALL, NULL},
    /* GPT-2 */
    {"vocab_size", A_ALL, NULL}, {"n_positions", A_GPT2, NULL}, {"n_ctx", A_GPT2, NULL},
    {"n_embd", A_GPT2, NULL}, {"n_layer", A_GPT2, NULL}, {"n_head", A_GPT2, NULL}, {"n_inner", A_GPT2, NULL},
    {"activation_function", A_GPT2, NULL}, {"layer_norm_epsilon", A_GPT2, NULL},
    {"resid_pdrop", A_GPT2, NULL}, {"embd_pdrop", A_GPT2, NULL}, {"attn_pdrop", A_GPT2, NULL},
    {"scale_attn_weights", A_GPT2, NULL}, {"scale_attn_by_inverse_layer_idx", A_GPT2, NULL},
    {"reorder_and_upcast_attn", A_GPT2, "float32 either way"},
    {"summary_type", A_GPT2, "GPT2DoubleHeadsModel only"}, {"summary_use_proj", A_GPT2, "GPT2DoubleHeadsModel only"},
    {"summary_activation", A_GPT2, "GPT2DoubleHeadsModel only"},
    {"summary_proj_to_labels", A_GPT2, "GPT2DoubleHeadsModel only"},
    {"summary_first_dropout", A_GPT2, "GPT2DoubleHeadsModel only"},
    /* Llama, Mistral, Qwen2, Qwen3 */
    {"hidden_size", A_LL, NULL}, {"intermediate_size", A_LL, NULL}, {"num_hidden_layers", A_LL, NULL},
    {"num_attention_heads", A_LL, NULL}, {"num_key_value_heads", A_LL, NULL}, {"hidden_act", A_LL, NULL},
    {"max_position_embeddings", A_LL, NULL}, {"rms_norm_eps", A_LL, NULL}, {"rope_theta", A_LL, NULL},
    {"rope_scaling", A_LL, NULL}, {"attention_dropout", A_LL, NULL}, {"head_dim", A_LL, NULL},
    {"layer_types", A_LL, NULL}, {"pretraining_tp", A_LLAMA, "the same products in slices"},
    {"attention_bias", A_LLAMA | A_QWEN3 | A_QWEN3MOE | A_GEMMA, NULL}, {"mlp_bias", A_LLAMA, NULL},
    {"hidden_activation", A_GEMMA, NULL},
    {"sliding_window", A_MISTRAL | A_MIXTRAL | A_QWEN2 | A_QWEN3 | A_QMOE, NULL},
    /* the mixtures (model.moe): Mixtral's, Qwen3-MoE's */
    {"num_local_experts", A_MOE, NULL}, {"num_experts", A_QMOE, NULL}, {"num_experts_per_tok", A_MOE, NULL},
    {"router_jitter_noise", A_MIXTRAL, NULL}, {"output_router_logits", A_MOE, NULL},
    {"router_aux_loss_coef", A_MOE, "the auxiliary loss's weight, read with output_router_logits only"},
    {"moe_intermediate_size", A_QMOE, NULL}, {"norm_topk_prob", A_QMOE, NULL},
    {"decoder_sparse_step", A_QMOE, NULL}, {"mlp_only_layers", A_QMOE, NULL},
    {"shared_expert_intermediate_size", A_QWEN2MOE, NULL}, {"use_sliding_window", A_QWEN2 | A_QWEN3 | A_QMOE, NULL},
    {"max_window_layers", A_QWEN2 | A_QWEN3 | A_QMOE, "only with use_sliding_window"},
    /* BERT (hf_bert.c reads them) */
    {"hidden_size", A_BERT, NULL}, {"intermediate_size", A_BERT, NULL}, {"num_hidden_layers", A_BERT, NULL},
    {"num_attention_heads", A_BERT, NULL}, {"hidden_act", A_BERT, NULL}, {"max_position_embeddings", A_BERT, NULL},
    {"type_vocab_size", A_BERT, NULL}, {"layer_norm_eps", A_BERT, NULL}, {"position_embedding_type", A_BERT, NULL},
    {"hidden_dropout_prob", A_BERT, NULL}, {"attention_probs_dropout_prob", A_BERT, NULL},
    {"classifier_dropout", A_BERT, NULL}, {"num_labels", A_BERT_CLS, NULL}, {"problem_type", A_BERT, NULL},
    {"mlm_predictions", A_BERT_MLM, NULL}, {"gradient_checkpointing", A_BERT, "memory"},
};
#define N_FIELDS ((int)(sizeof fields / sizeof fields[0]))

typedef pw__hf_cfg cfgr; /* hf_int.h */

/* rope_scaling: null, or Llama-3's {rope_type|type "llama3", factor,
 * low_freq_factor, high_freq_factor, original_max_position_embeddings}. */
static int rope_scaling(const cfgr *c, json_t *model) {
  const json_t *r = json_object_get(c->cfg, "rope_scaling");
  if (!r || json_is_null(r)) return 0;
  if (!json_is_object(r))
    return pw_err_set(c->err, PW_ESPEC, c->what, "rope_scaling: must be an object or null (got %s)", pw__hf_type_name(r));
  const json_t *t1 = json_object_get(r, "rope_type"), *t2 = json_object_get(r, "type");
  const json_t *t = t1 ? t1 : t2;
  if (!t || !json_is_string(t))
    return pw_err_set(c->err, PW_ESPEC, c->what, "rope_scaling.rope_type: missing or not a string");
  if (t1 && t2 && !json_equal(t1, t2))
    return pw_err_set(c->err, PW_ESPEC, c->what, "rope_scaling: type and rope_type differ");
  if (strcmp(json_string_value(t), "llama3"))
    return pw_err_set(c->err, PW_ENOTSUP, c->what, "rope_scaling.rope_type: \"%.32s\" is not supported (only \"llama3\")",
                      json_string_value(t));
  static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings"};
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)r, key, v) {
    int known = !strcmp(key, "rope_type") || !strcmp(key, "type");
    for (int i = 0; i < 4; i++) known |= !strcmp(key, keys[i]);
    if (!known)
      return pw_err_set(c->err, PW_ENOTSUP, c->what, "rope_scaling.%.48s: not a field of llama3 scaling we compute",
                        key);
  }
  json_t *o = json_object();
  json_object_set_new(o, "rope_type", json_string("llama3"));
  for (int i = 0; i < 4; i++) {
    const json_t *x = json_object_get(r, keys[i]);
    if (!x || !json_is_number(x)) {
      json_decref(o);
      return pw_err_set(c->err, PW_ESPEC, c->what, "rope_scaling.%s: missing or not a number", keys[i]);
    }
    json_object_set_new(o, keys[i], i == 3 ? json_integer((json_int_t)json_number_value(x))
                                            : json_real(json_number_value(x)));
    if (i == 3 && !json_is_integer(x)) {
      json_decref(o);
      return pw_err_set(c->err, PW_ESPEC, c->what, "rope_scaling.%s: must be an integer", keys[i]);
    }
  }
  json_object_set_new(model, "rope_scaling", o);
  return 0;
}

static int arch_of(const cfgr *c, int *bit) {
  const json_t *a = json_object_get(c->cfg, "architectures");
  if (!a || !json_is_array(a) || json_array_size(a) != 1 || !json_is_string(json_array_get(a, 0)))
    return pw_err_set(c->err, PW_ESPEC, c->what,
                      "architectures: must be a list of one name (" ARCH_LIST ")");
  const char *name = json_string_value(json_array_get(a, 0));
  for (int i = 0; i < N_ARCHS; i++)
    if (!strcmp(name, archs[i].arch)) {
      const json_t *mt = json_object_get(c->cfg, "model_type");
      if (mt && (!json_is_string(mt) || strcmp(json_string_value(mt), archs[i].model_type)))
        return pw_err_set(c->err, PW_ESPEC, c->what, "model_type: must be \"%s\" for %s", archs[i].model_type, name);
      *bit = archs[i].bit;
      return 0;
    }
  return pw_err_set(c->err, PW_ENOTSUP, c->what,
                    "architectures: \"%.64s\" is not supported (" ARCH_LIST ")", name);
}

static int config_model(const json_t *cfg, const char *what, int seq_len, json_t **model, char arch[PW_HF_ARCH_MAX],
                        char *notes, size_t notes_cap, pw_err *err) {
  *model = NULL;
  if (notes && notes_cap) notes[0] = 0;
  cfgr c = {cfg, what, "?", err};
  if (!json_is_object(cfg)) return pw_err_set(err, PW_ESPEC, what, "must be a JSON object");
  int bit = 0, rc = arch_of(&c, &bit);
  if (rc) return rc;
  c.arch = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
  snprintf(arch, PW_HF_ARCH_MAX, "%s", c.arch);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)cfg, key, v) {
    int k = 0;
    while (k < N_FIELDS && !(!strcmp(fields[k].name, key) && (fields[k].archs & bit))) k++;
    if (k == N_FIELDS)
      return pw_err_set(err, PW_ENOTSUP, what,
                        "%.64s: not a field pipewright reads for %s; it may change the model's arithmetic, so it is "
                        "refused (docs/contracts.md#hugging-face-models lists the fields read)",
                        key, c.arch);
  }
  static const char *const nope = "encoder-decoder and cross-attention models are not read";
  if ((rc = pw__hf_want_bool(&c, "is_encoder_decoder", 0, 0, nope)) || (rc = pw__hf_want_bool(&c, "add_cross_attention", 0, 0, nope)) ||
      (rc = pw__hf_want_bool(&c, "tie_encoder_decoder", 0, 0, nope)))
    return rc;
  const json_t *pr = json_object_get(cfg, "pruned_heads");
  if (pr && !json_is_null(pr) && !(json_is_object(pr) && json_object_size(pr) == 0))
    return pw_err_set(err, PW_ENOTSUP, what, "pruned_heads: pruned attention heads are not supported");
  if (bit & A_BERT) return pw__hf_bert_model(&c, bit == A_BERT_CLS, seq_len, model, notes, notes_cap);

  int V, P, d, L, H, ff, kv, tie, head_dim = 0, sliding = 0;
  double eps, init, theta = 10000;
  json_t *m = json_object(), *rs = json_object(), *moe = NULL; /* rs: rope_scaling, set last; moe: Mixtral's */
  if (bit == A_GPT2) {
    static const char *const gelu[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
    int inner, nctx;
    if ((rc = pw__hf_get_int(&c, "vocab_size", -1, 2, 1 << 20, &V)) || (rc = pw__hf_get_int(&c, "n_positions", -1, 1, INT_MAX, &P)) ||
        (rc = pw__hf_get_int(&c, "n_embd", -1, 1, 1 << 20, &d)) || (rc = pw__hf_get_int(&c, "n_layer", -1, 1, 4096, &L)) ||
        (rc = pw__hf_get_int(&c, "n_head", -1, 1, 1 << 20, &H)) || (rc = pw__hf_get_int(&c, "n_inner", 0, 1, 1 << 20, &inner)) ||
        (rc = pw__hf_get_int(&c, "n_ctx", P, 1, INT_MAX, &nctx)) ||
        (rc = pw__hf_want_str(&c, "activation_function", gelu)) ||
        (rc = pw__hf_get_num(&c, "layer_norm_epsilon", 1e-5, &eps)) || (rc = pw__hf_get_bool(&c, "tie_word_embeddings", 1, &tie)) ||
        (rc = pw__hf_want_bool(&c, "scale_attn_weights", 1, 1, "attention is scaled by 1/sqrt(head width)")) ||
        (rc = pw__hf_want_bool(&c, "scale_attn_by_inverse_layer_idx", 0, 0, "attention is scaled by 1/sqrt(head width) only")) ||
        (rc = pw__hf_dropout(&c, "resid_pdrop", notes, notes_cap)) || (rc = pw__hf_dropout(&c, "embd_pdrop", notes, notes_cap)) ||
        (rc = pw__hf_dropout(&c, "attn_pdrop", notes, notes_cap)))
      goto fail;
    if (nctx != P) {
      rc = pw_err_set(err, PW_ESPEC, what, "n_ctx: %d differs from n_positions %d", nctx, P);
      goto fail;
    }
    if (d % H) {
      rc = pw_err_set(err, PW_ESPEC, what, "n_head: %d must divide n_embd %d", H, d);
      goto fail;
    }
    ff = inner ? inner : 4 * d;
    kv = H;
  } else {
    static const char *const silu[] = {"silu", NULL};
    /* Gemma: GeGLU with tanh GELU (transformers 4.49 reads hidden_act; earlier ones hidden_activation) */
    static const char *const gelu_tanh[] = {"gelu_pytorch_tanh", "gelu_new", NULL};
    int hd, sw, use_sw;
    if ((rc = pw__hf_get_int(&c, "vocab_size", -1, 2, 1 << 20, &V)) ||
        (rc = pw__hf_get_int(&c, "max_position_embeddings", -1, 1, INT_MAX, &P)) ||
        (rc = pw__hf_get_int(&c, "hidden_size", -1, 1, 1 << 20, &d)) ||
        (rc = pw__hf_get_int(&c, "num_hidden_layers", -1, 1, 4096, &L)) ||
        (rc = pw__hf_get_int(&c, "num_attention_heads", -1, 1, 1 << 20, &H)) ||
        (rc = pw__hf_get_int(&c, "intermediate_size", -1, 1, 1 << 20, &ff)) ||
        (rc = pw__hf_get_int(&c, "num_key_value_heads", bit == A_LLAMA ? H : -1, 1, 1 << 20, &kv)) ||
        (rc = pw__hf_get_int(&c, "head_dim", bit == A_GEMMA ? 256 : d / H, 1, 1 << 20, &hd)) ||
        (rc = pw__hf_want_str(&c, "hidden_act", bit == A_GEMMA ? gelu_tanh : silu)) ||
        (rc = pw__hf_want_str(&c, "hidden_activation", gelu_tanh)) ||
        (rc = pw__hf_get_num(&c, "rms_norm_eps", 1e-6, &eps)) || (rc = pw__hf_get_num(&c, "rope_theta", 10000, &theta)) ||
        (rc = pw__hf_get_bool(&c, "tie_word_embeddings", bit == A_GEMMA, &tie)) ||
        (rc = pw__hf_want_bool(&c, "attention_bias", 0, 0, "o_proj has no bias here; Qwen2's q/k/v biases are read")) ||
        (rc = pw__hf_want_bool(&c, "mlp_bias", 0, 0, "the MLP has no biases")) ||
        (rc = pw__hf_dropout(&c, "attention_dropout", notes, notes_cap)) || (rc = rope_scaling(&c, rs)))
      goto fail;
    if (bit == A_GEMMA && json_object_get(rs, "rope_scaling")) {
      rc = pw_err_set(err, PW_ENOTSUP, what, "rope_scaling: not read for GemmaForCausalLM here (null only)");
      goto fail;
    }
    if (hd % 2) { /* head_dim: any even width (model.head_dim) */
      rc = pw_err_set(err, PW_ENOTSUP, what, "head_dim: %d must be even (rotary embeddings rotate pairs)", hd);
      goto fail;
    }
    if (kv < 1 || H % kv) {
      rc = pw_err_set(err, PW_ESPEC, what, "num_key_value_heads: %d must divide num_attention_heads %d", kv, H);
      goto fail;
    }
    const json_t *lt = json_object_get(cfg, "layer_types");
    if (lt && !json_is_null(lt)) {
      size_t i;
      json_t *x;
      if (!json_is_array(lt)) {
        rc = pw_err_set(err, PW_ESPEC, what, "layer_types: must be a list");
        goto fail;
      }
      json_array_foreach(lt, i, x) if (!json_is_string(x) || strcmp(json_string_value(x), "full_attention")) {
        rc = pw_err_set(err, PW_ENOTSUP, what, "layer_types[%zu]: only \"full_attention\" is supported", i);
        goto fail;
      }
    }
    if ((rc = pw__hf_get_bool(&c, "use_sliding_window", 0, &use_sw))) goto fail;
    if (use_sw && bit != A_MISTRAL && bit != A_MIXTRAL) {
      rc = pw_err_set(err, PW_ENOTSUP, what, "use_sliding_window: true is not supported (attention is full causal)");
      goto fail;
    }
    /* Mistral's sliding window (absent: MistralConfig's 4096; null: none):
     * model.sliding_window where it is shorter than the positions */
    if ((bit == A_MISTRAL || bit == A_MIXTRAL) && !json_is_null(json_object_get(cfg, "sliding_window"))) {
      if ((rc = pw__hf_get_int(&c, "sliding_window", 4096, 1, INT_MAX, &sw))) goto fail;
      if (sw < P && sw > HF_MAX_POS) {
        rc = pw_err_set(err, PW_ENOTSUP, what, "sliding_window: %d is more than model.sliding_window's %d", sw,
                        HF_MAX_POS);
        goto fail;
      }
      if (sw < P) sliding = sw;
    }
    if (hd * H != d) head_dim = hd;
    if (bit & A_MOE) { /* Mixtral: every block's MLP a mixture of intermediate_size-wide experts, top-k by
                          softmax; Qwen3-MoE: moe_intermediate_size-wide, on the blocks decoder_sparse_step and
                          mlp_only_layers say, the top-k's softmax renormalised or not (norm_topk_prob) */
      int E, K, out_logits, eh = ff, norm_topk = 1, step = 1, first = 0, shared = 0;
      double jitter;
      const char *ne = json_object_get(cfg, "num_experts") ? "num_experts" : "num_local_experts";
      if ((rc = pw__hf_get_int(&c, ne, 8, 2, 4096, &E)) ||
          (rc = pw__hf_get_int(&c, "num_experts_per_tok", 2, 1, E, &K)) || (rc = pw__hf_get_num(&c, "router_jitter_noise", 0, &jitter)) ||
          (rc = pw__hf_get_bool(&c, "output_router_logits", 0, &out_logits)))
        goto fail;
      if (bit == A_QWEN2MOE && (rc = pw__hf_get_int(&c, "shared_expert_intermediate_size", 5632, 1, 1 << 20, &shared)))
        goto fail;
      if (bit & A_QMOE) {
        const json_t *mo = json_object_get(cfg, "mlp_only_layers");
        size_t i;
        json_t *x;
        if ((rc = pw__hf_get_int(&c, "moe_intermediate_size", 768, 1, 1 << 20, &eh)) ||
            (rc = pw__hf_get_bool(&c, "norm_topk_prob", 0, &norm_topk)) ||
            (rc = pw__hf_get_int(&c, "decoder_sparse_step", 1, 1, 4096, &step)))
          goto fail;
        if (json_object_get(cfg, "num_experts") && json_object_get(cfg, "num_local_experts") &&
            !json_equal(json_object_get(cfg, "num_experts"), json_object_get(cfg, "num_local_experts"))) {
          rc = pw_err_set(err, PW_ESPEC, what, "num_experts and num_local_experts differ");
          goto fail;
        }
        /* block i sparse: i not in mlp_only_layers and (i + 1) % step == 0; built as first_dense and every,
         * so mlp_only_layers may only be the first blocks, with step 1 */
        if (mo && !json_is_null(mo)) {
          if (!json_is_array(mo)) {
            rc = pw_err_set(err, PW_ESPEC, what, "mlp_only_layers: must be a list");
            goto fail;
          }
          json_array_foreach(mo, i, x) if (!json_is_integer(x) || json_integer_value(x) != (json_int_t)i ||
                                           step != 1) {
            rc = pw_err_set(err, PW_ENOTSUP, what,
                            "mlp_only_layers: only the first blocks (0, 1, ...) with decoder_sparse_step 1 are "
                            "built (model.moe.first_dense)");
            goto fail;
          }
          first = (int)json_array_size(mo);
        }
        if (step > 1) first = step - 1;
        if (first >= L) {
          rc = pw_err_set(err, PW_ENOTSUP, what, "mlp_only_layers / decoder_sparse_step: no block is a mixture");
          goto fail;
        }
      }
      if (jitter != 0) {
        rc = pw_err_set(err, PW_ENOTSUP, what, "router_jitter_noise: %g (training noise on the router) is not computed; 0 only",
                        jitter);
        goto fail;
      }
      if (out_logits) {
        rc = pw_err_set(err, PW_ENOTSUP, what,
                        "output_router_logits: true adds the router's auxiliary loss to the training loss, which "
                        "pipewright does not compute yet; false only");
        goto fail;
      }
      moe = json_pack("{s:i, s:i, s:i}", "experts", E, "top_k", K, "ffn_hidden", eh);
      if (!norm_topk) json_object_set_new(moe, "gate", json_string("softmax"));
      if (step > 1) json_object_set_new(moe, "every", json_integer(step));
      if (first) json_object_set_new(moe, "first_dense", json_integer(first));
      if (shared) { /* Qwen2-MoE: one shared expert of its own width, behind a sigmoid gate */
        json_object_set_new(moe, "shared_experts", json_integer(1));
        json_object_set_new(moe, "shared_ffn_hidden", json_integer(shared));
        json_object_set_new(moe, "shared_gate", json_true());
      }
    }
  }
  if ((rc = pw__hf_get_num(&c, "initializer_range", 0.02, &init))) goto fail;
  if (!(init > 0)) {
    rc = pw_err_set(err, PW_ESPEC, what, "initializer_range: must be > 0");
    goto fail;
  }
  if (!(eps > 0 && eps <= 1)) {
    rc = pw_err_set(err, PW_ESPEC, what, "%s: %g must be > 0 and <= 1", bit == A_GPT2 ? "layer_norm_epsilon" : "rms_norm_eps",
                    eps);
    goto fail;
  }
  const char *pos = bit == A_GPT2 ? "n_positions" : "max_position_embeddings";
  if (seq_len > P) {
    rc = pw_err_set(err, PW_EINVAL, what, "--seq-len %d is more than %s %d", seq_len, pos, P);
    goto fail;
  }
  if (!seq_len && P > HF_MAX_POS) {
    rc = pw_err_set(err, PW_EINVAL, what, "%s: %d is more than model.seq_len's %d: give --seq-len N (at most %d)", pos, P,
                    HF_MAX_POS, HF_MAX_POS);
    goto fail;
  }
  json_object_set_new(m, "template", json_string(bit == A_GPT2 ? "gpt" : "llama"));
  json_object_set_new(m, "vocab_size", json_integer(V));
  json_object_set_new(m, "seq_len", json_integer(seq_len ? seq_len : P));
  json_object_set_new(m, "d_model", json_integer(d));
  json_object_set_new(m, "n_layers", json_integer(L));
  json_object_set_new(m, "n_heads", json_integer(H));
  if (kv != H) json_object_set_new(m, "n_kv_heads", json_integer(kv));
  if (head_dim) json_object_set_new(m, "head_dim", json_integer(head_dim));
  if (sliding) json_object_set_new(m, "sliding_window", json_integer(sliding));
  json_object_set_new(m, "ffn_hidden", json_integer(ff));
  json_object_set_new(m, "tie_embeddings", json_boolean(tie));
  if (bit != A_GPT2) json_object_set_new(m, "rope_base", json_real(theta));
  if (bit == A_QWEN2 || bit == A_QWEN2MOE) json_object_set_new(m, "qkv_bias", json_true());
  if (bit == A_QWEN3 || bit == A_QWEN3MOE) json_object_set_new(m, "qk_norm", json_true());
  if (bit == A_GEMMA) { /* GeGLU, embeddings times sqrt(d), RMSNorm scaled by 1 + w */
    json_object_set_new(m, "mlp_act", json_string("gelu_tanh"));
    json_object_set_new(m, "embed_scale", json_true());
    json_object_set_new(m, "norm_offset", json_integer(1));
  }
  json_object_set_new(m, "norm_eps", json_real(eps));
  json_object_set_new(m, "init_std", json_real(init));
  if (moe) json_object_set_new(m, "moe", moe), moe = NULL;
  if (json_object_get(rs, "rope_scaling")) json_object_set(m, "rope_scaling", json_object_get(rs, "rope_scaling"));
  json_decref(rs);
  *model = m;
  return 0;
fail:
  json_decref(m);
  json_decref(rs);
  json_decref(moe);
  return rc;
}

/* ---- tensor names ------------------------------------------------------ */

typedef pw__hf_entry hf_entry; /* hf_int.h */
typedef pw__hf_map hf_map;

#define ADD(ours, nd, r, cc, hfname, tr)                                          \
  do {                                                                           \
    hf_entry *e_ = pw__hf_map_add(mp, ours, nd, r, cc);                                 \
    if (!e_) return PW_ENOMEM;                                                   \
    snprintf(e_->hf[0], HF_NAME, "%s", hfname);                                  \
    e_->transpose = tr;                                                          \
  } while (0)

/* The list for model m; pre is GPT-2's tensor prefix ("transformer." or ""). */
static int map_build(const pw_model_spec *m, const char *pre, hf_map *mp) {
  memset(mp, 0, sizeof *mp);
  if (m->tmpl == PW_TEMPLATE_BERT) return pw__hf_bert_map(m, mp);
  int64_t V = m->vocab_size, T = m->seq_len, d = m->d_model, H = m->n_heads, hd = m->head_dim ? m->head_dim : d / H;
  int64_t kv = m->n_kv_heads ? m->n_kv_heads : H, ff = m->ffn_hidden;
  char o[HF_NAME], h[HF_NAME];
  mp->tie = m->tie_embeddings;
  if (m->tmpl == PW_TEMPLATE_GPT) {
    if (!ff) ff = 4 * d;
    snprintf(mp->embed_hf, HF_NAME, "%swte.weight", pre);
    ADD("embed.tok.weight", 2, V, d, mp->embed_hf, 0);
    snprintf(h, sizeof h, "%swpe.weight", pre);
    ADD("embed.pos.weight", 2, T, d, h, 0);
    mp->e[mp->n - 1].may_slice = 1;
    for (int i = 0; i < m->n_layers; i++) {
      static const struct {
        const char *ours, *hf;
        int ndim, tr;
        char r, c; /* 'd', 'h' (MLP), '3' (3d), '1' */
      } blk[] = {
          {"ln1.weight", "ln_1.weight", 1, 0, 'd', '1'},       {"ln1.bias", "ln_1.bias", 1, 0, 'd', '1'},
          {"attn.qkv.weight", "attn.c_attn.weight", 2, 1, '3', 'd'}, {"attn.qkv.bias", "attn.c_attn.bias", 1, 0, '3', '1'},
          {"attn.proj.weight", "attn.c_proj.weight", 2, 1, 'd', 'd'}, {"attn.proj.bias", "attn.c_proj.bias", 1, 0, 'd', '1'},
          {"ln2.weight", "ln_2.weight", 1, 0, 'd', '1'},       {"ln2.bias", "ln_2.bias", 1, 0, 'd', '1'},
          {"mlp.fc.weight", "mlp.c_fc.weight", 2, 1, 'h', 'd'}, {"mlp.fc.bias", "mlp.c_fc.bias", 1, 0, 'h', '1'},
          {"mlp.proj.weight", "mlp.c_proj.weight", 2, 1, 'd', 'h'}, {"mlp.proj.bias", "mlp.c_proj.bias", 1, 0, 'd', '1'},
      };
      for (size_t k = 0; k < sizeof blk / sizeof blk[0]; k++) {
#define DIM(ch) ((ch) == 'd' ? d : (ch) == 'h' ? ff : (ch) == '3' ? 3 * d : 1)
        snprintf(o, sizeof o, "blocks.%d.%s", i, blk[k].ours);
        snprintf(h, sizeof h, "%sh.%d.%s", pre, i, blk[k].hf);
        ADD(o, blk[k].ndim, DIM(blk[k].r), DIM(blk[k].c), h, blk[k].tr);
#undef DIM
      }
    }
    snprintf(h, sizeof h, "%sln_f.weight", pre);
    ADD("ln_f.weight", 1, d, 1, h, 0);
    snprintf(h, sizeof h, "%sln_f.bias", pre);
    ADD("ln_f.bias", 1, d, 1, h, 0);
  } else {
    if (!ff) ff = (8 * d / 3 + 31) / 32 * 32; /* model.c's pw_llama_ffn_default */
    snprintf(mp->embed_hf, HF_NAME, "model.embed_tokens.weight");
    ADD("embed.tok.weight", 2, V, d, mp->embed_hf, 0);
    for (int i = 0; i < m->n_layers; i++) {
      char p[64];
      snprintf(p, sizeof p, "model.layers.%d.", i);
#define ONE(ours, nd, r, cc, hfsuffix)                        \
  do {                                                        \
    snprintf(o, sizeof o, "blocks.%d.%s", i, ours);           \
    snprintf(h, sizeof h, "%s%s", p, hfsuffix);               \
    ADD(o, nd, r, cc, h, 0);                                  \
  } while (0)
      ONE("norm1.weight", 1, d, 1, "input_layernorm.weight");
      for (int b = 0; b < 1 + m->qkv_bias; b++) {
        snprintf(o, sizeof o, "blocks.%d.attn.qkv.%s", i, b ? "bias" : "weight");
        hf_entry *e = pw__hf_map_add(mp, o, b ? 1 : 2, (H + 2 * kv) * hd, b ? 1 : d);
        if (!e) return PW_ENOMEM;
        e->n_parts = 3;
        static const char qkv[3] = {'q', 'k', 'v'};
        for (int j = 0; j < 3; j++) {
          snprintf(e->hf[j], HF_NAME, "%sself_attn.%c_proj.%s", p, qkv[j], b ? "bias" : "weight");
          e->rows[j] = (j ? kv : H) * hd;
        }
      }
      if (m->qk_norm) {
        ONE("attn.q_norm.weight", 1, hd, 1, "self_attn.q_norm.weight");
        ONE("attn.k_norm.weight", 1, hd, 1, "self_attn.k_norm.weight");
      }
      ONE("attn.proj.weight", 2, d, H * hd, "self_attn.o_proj.weight");
      ONE("norm2.weight", 1, d, 1, "post_attention_layernorm.weight");
      if (m->moe_experts && i >= m->moe_first_dense && (i - m->moe_first_dense) % m->moe_every == 0) {
        /* a mixture: Mixtral's block_sparse_moe (experts' w1, w3, w2), Qwen3-MoE's mlp (gate_proj, up_proj,
         * down_proj), each expert's tensors stacked by rows */
        int64_t E = m->moe_experts, mh = m->moe_hidden;
        int qwen = m->qk_norm || m->qkv_bias; /* Qwen3-MoE's, Qwen2-MoE's names */
        static const struct {
          const char *ours, *mixtral, *qwen;
          int down;
        } ex[] = {{"gate", "w1", "gate_proj", 0}, {"up", "w3", "up_proj", 0}, {"down", "w2", "down_proj", 1}};
        ONE("moe.router.weight", 2, E, d, qwen ? "mlp.gate.weight" : "block_sparse_moe.gate.weight");
        for (int k = 0; k < 3; k++) {
          snprintf(o, sizeof o, "blocks.%d.moe.experts.%s.weight", i, ex[k].ours);
          hf_entry *e = pw__hf_map_add(mp, o, 2, E * (ex[k].down ? d : mh), ex[k].down ? mh : d);
          if (!e) return PW_ENOMEM;
          e->experts = e->n_parts = (int)E;
          e->rows[0] = ex[k].down ? d : mh;
          snprintf(e->hf[0], HF_NAME, "%s%s.experts.", p, qwen ? "mlp" : "block_sparse_moe");
          snprintf(e->hf[1], HF_NAME, ".%s.weight", qwen ? ex[k].qwen : ex[k].mixtral);
        }
        if (m->moe_shared) { /* Qwen2-MoE's shared_expert and its gate */
          int64_t sh = m->moe_shared_hidden ? m->moe_shared_hidden : m->moe_shared * mh;
          ONE("moe.shared.gate.weight", 2, sh, d, "mlp.shared_expert.gate_proj.weight");
          ONE("moe.shared.up.weight", 2, sh, d, "mlp.shared_expert.up_proj.weight");
          ONE("moe.shared.down.weight", 2, d, sh, "mlp.shared_expert.down_proj.weight");
          if (m->moe_shared_gate) ONE("moe.shared_gate.weight", 2, 1, d, "mlp.shared_expert_gate.weight");
        }
        continue;
      }
      ONE("mlp.gate.weight", 2, ff, d, "mlp.gate_proj.weight");
      ONE("mlp.up.weight", 2, ff, d, "mlp.up_proj.weight");
      ONE("mlp.down.weight", 2, d, ff, "mlp.down_proj.weight");
#undef ONE
    }
    ADD("norm_f.weight", 1, d, 1, "model.norm.weight", 0);
  }
  if (!m->tie_embeddings) ADD("lm_head.weight", 2, V, d, "lm_head.weight", 0);
  return 0;
}

/* ---- reading a directory's tensors --------------------------------------- */

static void fmt_shape(char *b, size_t cap, int nd, const int64_t *sh) {
  if (nd == 1) snprintf(b, cap, "[%lld]", (long long)sh[0]);
  else if (nd == 2) snprintf(b, cap, "[%lld, %lld]", (long long)sh[0], (long long)sh[1]);
  else snprintf(b, cap, "(%d dimensions)", nd);
}

/* HF tensor `name` of shape (nd, r, c) as float32, malloc'd; missing or of
 * another shape is an error naming it and what it is for. */
static int read_part(pw__hf_src *s, const char *name, const char *for_ours, const char *arch, int nd, int64_t r,
                     int64_t c, int may_slice, float **out, pw_err *err) {
  *out = NULL;
  const pw_st_tensor *t = pw__hf_src_find(s, name, NULL);
  if (!t)
    return pw_err_set(err, PW_EFORMAT, s->dir, "tensor '%s' is missing (%s's %s)", name, arch, for_ours);
  int64_t want[2] = {r, c};
  int ok = t->ndim == nd && (nd == 1 ? t->shape[0] == r : t->shape[1] == c && (may_slice ? t->shape[0] >= r : t->shape[0] == r));
  if (!ok) {
    char a[48], b[48];
    fmt_shape(a, sizeof a, t->ndim, t->shape);
    fmt_shape(b, sizeof b, nd, want);
    return pw_err_set(err, PW_EFORMAT, s->dir, "tensor '%s' is %s; config.json gives %s %s%s", name, a, arch, b,
                      may_slice ? " (or more rows)" : "");
  }
  int64_t n = 1;
  for (int k = 0; k < t->ndim; k++) n *= t->shape[k];
  float *buf = malloc(sizeof *buf * (size_t)(n ? n : 1));
  if (!buf) return pw_err_set(err, PW_ENOMEM, s->dir, "tensor '%s': out of memory", name);
  int rc = pw_st_to_f32(t, buf, s->dir, err);
  if (rc) {
    free(buf);
    return rc;
  }
  *out = buf;
  return 0;
}

/* Tensors the model holds but are not parameters (buffers older
 * checkpoints saved): GPT-2's causal mask, Llama's rotary inv_freq. */
static int is_buffer(const char *name) {
  size_t n = strlen(name);
#define ENDS(x) (n >= sizeof(x) - 1 && !strcmp(name + n - (sizeof(x) - 1), x))
  return ENDS(".attn.bias") || ENDS(".attn.masked_bias") || ENDS(".rotary_emb.inv_freq") ||
         ENDS("embeddings.position_ids") || ENDS("embeddings.token_type_ids"); /* BERT's, before transformers 4.31 */
#undef ENDS
}

static int cmp_tensor(const void *a, const void *b) {
  return strcmp(((const pw_st_tensor *)a)->name, ((const pw_st_tensor *)b)->name);
}

void pw_hf_import_free(pw_hf_import_result *r) {
  for (int i = 0; i < r->n_tensors; i++) {
    free((void *)r->tensors[i].name);
    free((void *)r->tensors[i].data);
  }
  free(r->tensors);
  json_decref(r->job);
  memset(r, 0, sizeof *r);
}

/* Our tensor for entry e from the source: parts joined, transposed, cut. */
static int import_entry(pw__hf_src *s, const hf_entry *e, const char *arch, pw_st_tensor *t, pw_err *err) {
  int64_t r = e->shape[0], c = e->ndim == 2 ? e->shape[1] : 1, n = r * c;
  float *dst = malloc(sizeof *dst * (size_t)(n ? n : 1));
  if (!dst) return pw_err_set(err, PW_ENOMEM, s->dir, "out of memory");
  int64_t row = 0;
  int rc = 0;
  for (int p = 0; p < e->n_parts && !rc; p++) {
    float *src;
    char nb[PW__HF_PART_NAME];
    const char *hn = pw__hf_part_name(e, p, nb);
    int64_t pr = pw__hf_part_rows(e, p);
    /* a transposed part is held [c, r]: read it so */
    if (e->transpose) rc = read_part(s, hn, e->ours, arch, 2, c, pr, 0, &src, err);
    else rc = read_part(s, hn, e->ours, arch, e->ndim, pr, c, e->may_slice, &src, err);
    if (rc) break;
    if (e->transpose) {
      for (int64_t i = 0; i < pr; i++)
        for (int64_t j = 0; j < c; j++) dst[(row + i) * c + j] = src[j * pr + i];
    } else {
      memcpy(dst + row * c, src, sizeof *dst * (size_t)(pr * c)); /* a longer wpe: its first rows */
    }
    row += pr;
    free(src);
  }
  if (rc) {
    free(dst);
    return rc;
  }
  char *name = strdup(e->ours);
  if (!name) {
    free(dst);
    return pw_err_set(err, PW_ENOMEM, s->dir, "out of memory");
  }
  *t = (pw_st_tensor){.name = name, .dtype = PW_ST_F32, .ndim = e->ndim, .data = dst};
  t->shape[0] = e->shape[0];
  t->shape[1] = e->shape[1];
  return 0;
}

/* Tied: a lm_head.weight in the file must be the embedding itself. */
static int check_tied_head(pw__hf_src *s, const hf_map *mp, const pw_st_tensor *embed, pw_err *err) {
  const pw_st_tensor *t = pw__hf_src_find(s, "lm_head.weight", NULL);
  if (!t) return 0;
  int64_t n = embed->shape[0] * embed->shape[1];
  float *h = NULL;
  int same = t->ndim == 2 && t->shape[0] == embed->shape[0] && t->shape[1] == embed->shape[1];
  if (same) {
    h = malloc(sizeof *h * (size_t)(n ? n : 1));
    if (!h) return pw_err_set(err, PW_ENOMEM, s->dir, "out of memory");
    int rc = pw_st_to_f32(t, h, s->dir, err);
    if (rc) {
      free(h);
      return rc;
    }
    same = !memcmp(h, embed->data, sizeof *h * (size_t)n);
    free(h);
  }
  if (!same)
    return pw_err_set(err, PW_ENOTSUP, s->dir,
                      "tensor 'lm_head.weight' differs from '%s' but config.json ties them (tie_word_embeddings)",
                      mp->embed_hf);
  return 0;
}

/* transformers 5 writes the rope's numbers as one object, rope_parameters
 * {rope_type, rope_theta, and the type's own fields}, where 4.x wrote
 * rope_theta and rope_scaling (null for the default rope). Rewritten into
 * those two, so that one reader checks both spellings; a config giving
 * both spellings must give the same numbers. */
static int rope_parameters_v4(json_t *cfg, const char *what, pw_err *err) {
  json_t *rp = json_object_get(cfg, "rope_parameters");
  if (json_is_null(rp)) return json_object_del(cfg, "rope_parameters"), 0;
  if (!json_is_object(rp)) return pw_err_set(err, PW_ESPEC, what, "rope_parameters: must be an object or null");
  json_t *theta = json_object_get(rp, "rope_theta"), *type = json_object_get(rp, "rope_type");
  if (!json_is_number(theta)) return pw_err_set(err, PW_ESPEC, what, "rope_parameters.rope_theta: missing or not a number");
  if (type && !json_is_string(type)) return pw_err_set(err, PW_ESPEC, what, "rope_parameters.rope_type: not a string");
  const json_t *old = json_object_get(cfg, "rope_theta");
  if (old && !(json_is_number(old) && json_number_value(old) == json_number_value(theta)))
    return pw_err_set(err, PW_ESPEC, what, "rope_theta and rope_parameters.rope_theta differ");
  json_t *rs = json_deep_copy(rp);
  if (!rs || json_object_set(cfg, "rope_theta", theta) || json_object_del(rs, "rope_theta")) {
    json_decref(rs);
    return pw_err_set(err, PW_ENOMEM, what, "out of memory");
  }
  if (!type || !strcmp(json_string_value(type), "default")) { /* the plain rope: nothing else may be there */
    json_object_del(rs, "rope_type");
    const char *key = json_object_iter_key(json_object_iter(rs));
    int rc = key ? pw_err_set(err, PW_ENOTSUP, what, "rope_parameters.%.48s: not a field of the default rope", key) : 0;
    json_decref(rs); /* after the message: key lives in rs */
    if (rc) return rc;
    rs = json_null();
  }
  const json_t *was = json_object_get(cfg, "rope_scaling");
  if (was && !json_is_null(was) && !json_equal(was, rs)) {
    json_decref(rs);
    return pw_err_set(err, PW_ESPEC, what, "rope_scaling and rope_parameters differ");
  }
  json_object_set_new(cfg, "rope_scaling", rs);
  json_object_del(cfg, "rope_parameters");
  return 0;
}

int pw_hf_config_model(const json_t *cfg, const char *what, int seq_len, json_t **model, char arch[PW_HF_ARCH_MAX],
                       char *notes, size_t notes_cap, pw_err *err) {
  *model = NULL;
  if (!json_is_object(cfg) || !json_object_get(cfg, "rope_parameters"))
    return config_model(cfg, what, seq_len, model, arch, notes, notes_cap, err);
  json_t *v4 = json_deep_copy(cfg);
  if (!v4) return pw_err_set(err, PW_ENOMEM, what, "out of memory");
  int rc = rope_parameters_v4(v4, what, err);
  if (!rc) rc = config_model(v4, what, seq_len, model, arch, notes, notes_cap, err);
  json_decref(v4);
  return rc;
}

int pw_hf_import(const char *dir, const pw_hf_import_opts *o, pw_hf_import_result *r, pw_err *err) {
  memset(r, 0, sizeof *r);
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
    return pw_err_set(err, PW_EINVAL, dir, "path too long");
  json_error_t je;
  json_t *cfg = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!cfg) {
    if (access(path, F_OK)) return pw_err_set(err, PW_ENOENT, path, "missing: not a Hugging Face model directory?");
    return pw_err_set(err, PW_EJSON, path, "line %d column %d: %s", je.line, je.column, je.text);
  }
  json_t *model;
  int rc = pw_hf_config_model(cfg, path, o->seq_len, &model, r->arch, r->notes, sizeof r->notes, err);
  json_decref(cfg);
  if (rc) return rc;

  /* the job: name, model, data */
  char name[128];
  if (o->name) {
    snprintf(name, sizeof name, "%s", o->name);
  } else {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(name, sizeof name, "%.*s", (int)(n - b), dir + b);
  }
  r->job = json_object();
  json_object_set_new(r->job, "name", json_string(name));
  json_object_set_new(r->job, "model", model);
  json_t *data = json_object();
  if (json_integer_value(json_object_get(model, "vocab_size")) == 256) {
    json_object_set_new(data, "kind", json_string("text"));
    json_object_set_new(data, "path", json_string("examples/data/corpus.txt"));
  } else {
    r->data_placeholder = 1;
    json_object_set_new(data, "kind", json_string("tokens"));
    json_object_set_new(data, "path", json_string("SET-ME.tokens"));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char real[PATH_MAX];
    if (access(path, R_OK) == 0 && realpath(path, real)) json_object_set_new(data, "tokenizer", json_string(real));
  }
  json_object_set_new(r->job, "data", data);
  if (!strcmp(json_string_value(json_object_get(model, "template")), "bert") &&
      (rc = pw__hf_bert_job(dir, o, r->job, r->notes, sizeof r->notes, &r->data_placeholder, err))) {
    pw_hf_import_free(r);
    return rc;
  }
  if (!json_string_value(json_object_get(r->job, "name"))) {
    pw_hf_import_free(r);
    return pw_err_set(err, PW_EINVAL, dir, "the job's name is not UTF-8: give --name");
  }
  pw_job job;
  if ((rc = pw_job_parse(r->job, NULL, &job, err))) {
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    char where[sizeof err->path];
    snprintf(where, sizeof where, "%s", err->path);
    pw_hf_import_free(r);
    return pw_err_set(err, rc, dir, "the job made from config.json is refused: %s: %s", where, msg);
  }

  /* the tensors */
  pw__hf_src s;
  hf_map mp = {0};
  if ((rc = pw__hf_src_open(&s, dir, err))) goto out;
  const char *pre = "";
  if (job.model.tmpl == PW_TEMPLATE_GPT && pw__hf_src_find(&s, "transformer.wte.weight", NULL)) pre = "transformer.";
  if ((rc = map_build(&job.model, pre, &mp))) {
    rc = pw_err_set(err, rc, dir, "out of memory");
    goto out;
  }
  if (job.model.tmpl == PW_TEMPLATE_BERT) pw__hf_bert_legacy_names(&s, &mp);
  r->tensors = calloc((size_t)mp.n, sizeof *r->tensors);
  if (!r->tensors) {
    rc = pw_err_set(err, PW_ENOMEM, dir, "out of memory");
    goto out;
  }
  for (int i = 0; i < mp.n && !rc; i++) {
    rc = import_entry(&s, &mp.e[i], r->arch, &r->tensors[i], err);
    if (!rc) r->n_tensors++;
  }
  if (!rc && mp.tie) rc = check_tied_head(&s, &mp, &r->tensors[0], err);
  if (!rc && job.model.tmpl == PW_TEMPLATE_BERT) rc = pw__hf_bert_rest(&s, dir, &job.model, r, err);
  for (int f = 0; f < s.n_files && !rc; f++)
    for (int i = 0; i < pw_st_count(s.files[f]) && !rc; i++) {
      const char *tn = pw_st_get(s.files[f], i)->name;
      if (!json_object_get(s.used, tn) && !is_buffer(tn))
        rc = pw_err_set(err, PW_ENOTSUP, s.dir,
                        "tensor '%s' (in %s) is not part of %s as config.json describes it; refused rather than dropped",
                        tn, s.names[f], r->arch);
    }
  if (!rc) qsort(r->tensors, (size_t)r->n_tensors, sizeof *r->tensors, cmp_tensor);
out:
  free(mp.e);
  pw__hf_src_close(&s);
  pw_job_free(&job);
  if (rc) {
    char keep[PW_HF_ARCH_MAX];
    memcpy(keep, r->arch, sizeof keep);
    pw_hf_import_free(r);
    memcpy(r->arch, keep, sizeof keep);
  }
  return rc;
}

/* ---- export -------------------------------------------------------------- */

/* The shortest decimal that reads back as the same float, as a double: a
 * float 1e-6f is written 1e-06, not 9.999999974752427e-07. */
static json_t *export_config(const pw_model_spec *m, const char **arch) {
  json_t *c = json_object();
  int d = m->d_model, H = m->n_heads;
  int ff = m->ffn_hidden ? m->ffn_hidden : m->tmpl == PW_TEMPLATE_GPT ? 4 * d : (8 * d / 3 + 31) / 32 * 32;
  if (m->tmpl == PW_TEMPLATE_GPT) {
    *arch = "GPT2LMHeadModel";
    json_object_set_new(c, "model_type", json_string("gpt2"));
    json_object_set_new(c, "n_positions", json_integer(m->seq_len));
    json_object_set_new(c, "n_embd", json_integer(d));
    json_object_set_new(c, "n_layer", json_integer(m->n_layers));
    json_object_set_new(c, "n_head", json_integer(H));
    json_object_set_new(c, "n_inner", json_integer(ff));
    json_object_set_new(c, "activation_function", json_string("gelu_new"));
    json_object_set_new(c, "layer_norm_epsilon", json_real(pw__hf_short_float(m->norm_eps)));
    json_object_set_new(c, "resid_pdrop", json_real(0));
    json_object_set_new(c, "embd_pdrop", json_real(0));
    json_object_set_new(c, "attn_pdrop", json_real(0));
    json_object_set_new(c, "scale_attn_weights", json_true());
    json_object_set_new(c, "scale_attn_by_inverse_layer_idx", json_false());
    json_object_set_new(c, "reorder_and_upcast_attn", json_false());
  } else {
    /* export_check: each architecture's options, not with the others' */
    int gemma = m->norm_offset != 0, q3moe = m->moe_experts > 0 && m->qk_norm, q2moe = m->moe_experts > 0 && m->qkv_bias;
    int qmoe = q3moe || q2moe, mixtral = m->moe_experts > 0 && !qmoe, mistral = m->sliding_window > 0 && !mixtral;
    *arch = gemma ? "GemmaForCausalLM" : q3moe ? "Qwen3MoeForCausalLM" : q2moe ? "Qwen2MoeForCausalLM"
            : m->qk_norm ? "Qwen3ForCausalLM" : m->qkv_bias ? "Qwen2ForCausalLM" : mixtral ? "MixtralForCausalLM"
            : mistral ? "MistralForCausalLM" : "LlamaForCausalLM";
    json_object_set_new(c, "model_type", json_string(gemma ? "gemma" : q3moe ? "qwen3_moe" : q2moe ? "qwen2_moe"
                                                     : m->qk_norm ? "qwen3" : m->qkv_bias ? "qwen2"
                                                     : mixtral ? "mixtral" : mistral ? "mistral" : "llama"));
    if (q2moe) /* one shared expert behind its gate (export_check) */
      json_object_set_new(c, "shared_expert_intermediate_size",
                          json_integer(m->moe_shared_hidden ? m->moe_shared_hidden : m->moe_hidden));
    if (mixtral) {
      json_object_set_new(c, "num_local_experts", json_integer(m->moe_experts));
      json_object_set_new(c, "router_jitter_noise", json_real(0));
      json_object_set_new(c, "sliding_window", m->sliding_window ? json_integer(m->sliding_window) : json_null());
      ff = m->moe_hidden;
    }
    if (qmoe) { /* num_experts: transformers 4.51's name (5 reads it as num_local_experts) */
      json_object_set_new(c, "num_experts", json_integer(m->moe_experts));
      json_object_set_new(c, "moe_intermediate_size", json_integer(m->moe_hidden));
      json_object_set_new(c, "norm_topk_prob", json_boolean(m->moe_gate == PW_MOE_GATE_SOFTMAX_TOPK));
      json_object_set_new(c, "decoder_sparse_step", json_integer(m->moe_every));
      json_t *mo = json_array();
      for (int i = 0; i < m->moe_first_dense && m->moe_every == 1; i++) json_array_append_new(mo, json_integer(i));
      json_object_set_new(c, "mlp_only_layers", mo);
    }
    if (m->moe_experts) {
      json_object_set_new(c, "num_experts_per_tok", json_integer(m->moe_top_k));
      json_object_set_new(c, "output_router_logits", json_false());
    }
    json_object_set_new(c, "hidden_size", json_integer(d));
    json_object_set_new(c, "intermediate_size", json_integer(ff));
    json_object_set_new(c, "num_hidden_layers", json_integer(m->n_layers));
    json_object_set_new(c, "num_attention_heads", json_integer(H));
    json_object_set_new(c, "num_key_value_heads", json_integer(m->n_kv_heads ? m->n_kv_heads : H));
    if (!m->qkv_bias || m->head_dim) json_object_set_new(c, "head_dim", json_integer(m->head_dim ? m->head_dim : d / H));
    json_object_set_new(c, "hidden_act", json_string(gemma ? "gelu_pytorch_tanh" : "silu"));
    if (gemma) json_object_set_new(c, "hidden_activation", json_string("gelu_pytorch_tanh"));
    json_object_set_new(c, "max_position_embeddings", json_integer(m->seq_len));
    json_object_set_new(c, "rms_norm_eps", json_real(pw__hf_short_float(m->norm_eps)));
    json_object_set_new(c, "rope_theta", json_real(pw__hf_short_float(m->rope_base)));
    json_t *rs = json_null();
    if (m->rope_scaling) {
      rs = json_object();
      json_object_set_new(rs, "rope_type", json_string("llama3"));
      json_object_set_new(rs, "factor", json_real(pw__hf_short_float(m->rope_factor)));
      json_object_set_new(rs, "low_freq_factor", json_real(pw__hf_short_float(m->rope_low_freq_factor)));
      json_object_set_new(rs, "high_freq_factor", json_real(pw__hf_short_float(m->rope_high_freq_factor)));
      json_object_set_new(rs, "original_max_position_embeddings", json_integer(m->rope_orig_max_pos));
    }
    json_object_set_new(c, "rope_scaling", rs);
    json_object_set_new(c, "attention_dropout", json_real(0));
    if (!m->qkv_bias && !mistral && !mixtral) json_object_set_new(c, "attention_bias", json_false());
    if (!m->qk_norm && !m->qkv_bias && !gemma && !mistral && !mixtral) json_object_set_new(c, "mlp_bias", json_false());
    if (mistral) json_object_set_new(c, "sliding_window", json_integer(m->sliding_window));
    if (m->qk_norm || m->qkv_bias) {
      json_object_set_new(c, "use_sliding_window", json_false());
      json_object_set_new(c, "sliding_window", json_null());
    }
  }
  json_t *a = json_array();
  json_array_append_new(a, json_string(*arch));
  json_object_set_new(c, "architectures", a);
  json_object_set_new(c, "vocab_size", json_integer(m->vocab_size));
  json_object_set_new(c, "tie_word_embeddings", json_boolean(m->tie_embeddings));
  json_object_set_new(c, "initializer_range", json_real(pw__hf_short_float(m->init_std)));
  json_object_set_new(c, "torch_dtype", json_string("float32"));
  return c;
}

/* text to path through "<path>.tmp.<pid>", fsynced and renamed. */
static int write_text(const char *path, const char *text, pw_err *err) {
  char tmp[PATH_MAX + 32];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return pw_err_set(err, PW_EIO, tmp, "cannot create: %s", strerror(errno));
  int bad = fputs(text, f) < 0 || fputc('\n', f) == EOF || fflush(f) || fsync(fileno(f));
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path)) {
    int e = errno;
    unlink(tmp);
    return pw_err_set(err, PW_EIO, path, "cannot write: %s", strerror(e));
  }
  return 0;
}

int pw_hf_export(const pw_model_spec *m, const char *ckpt, const char *dir, pw_err *err) {
  if (m->tmpl != PW_TEMPLATE_GPT && m->tmpl != PW_TEMPLATE_LLAMA && m->tmpl != PW_TEMPLATE_BERT)
    return pw_err_set(err, PW_ENOTSUP, "model.template", "only gpt, llama and bert models are exported to Hugging Face");
  if (m->lora_rank)
    return pw_err_set(err, PW_ENOTSUP, "model.lora",
                      "merge the adapters first (pipewright export --merge-lora) and export the base job");
  if (m->qk_norm && m->qkv_bias)
    return pw_err_set(err, PW_ENOTSUP, "model.qkv_bias",
                      "with qk_norm: Qwen3's attention_bias would put a bias on o_proj too, which we do not have");
  /* Gemma's three options come together (GemmaForCausalLM), alone with nothing else */
  int gemma = m->mlp_act == PW_MLP_ACT_GELU_TANH || m->embed_scale || m->norm_offset;
  if (gemma && !(m->mlp_act == PW_MLP_ACT_GELU_TANH && m->embed_scale && m->norm_offset == 1))
    return pw_err_set(err, PW_ENOTSUP,
                      m->mlp_act != PW_MLP_ACT_GELU_TANH ? "model.mlp_act" : !m->embed_scale ? "model.embed_scale"
                                                                                             : "model.norm_offset",
                      "GemmaForCausalLM has mlp_act gelu_tanh, embed_scale and norm_offset 1 together; no Hugging "
                      "Face architecture computes a part of them");
  if (gemma && (m->qk_norm || m->qkv_bias || m->rope_scaling))
    return pw_err_set(err, PW_ENOTSUP, m->qk_norm ? "model.qk_norm" : m->qkv_bias ? "model.qkv_bias" : "model.rope_scaling",
                      "not with Gemma's options: GemmaForCausalLM has none");
  if (m->sliding_window && (gemma || m->qk_norm || m->qkv_bias))
    return pw_err_set(err, PW_ENOTSUP, "model.sliding_window",
                      "with %s: MistralForCausalLM (the sliding window's architecture) has none of them",
                      gemma ? "Gemma's options" : m->qk_norm ? "qk_norm" : "qkv_bias");
  /* MixtralForCausalLM: a llama whose every block is a softmax top-k mixture, nothing else;
   * Qwen3MoeForCausalLM: a qk_norm llama whose mixtures are softmax or softmax_topk, on every
   * block from decoder_sparse_step - 1 (every) or after mlp_only_layers (first_dense);
   * Qwen2MoeForCausalLM: the same with qkv_bias, and one gated shared expert */
  int qwen_moe = m->moe_experts && (m->qk_norm || m->qkv_bias);
  int shared_ok = m->qkv_bias ? m->moe_shared == 1 && m->moe_shared_gate : !m->moe_shared;
  if (m->moe_experts &&
      (m->tmpl != PW_TEMPLATE_LLAMA || gemma || (m->qk_norm && m->qkv_bias) || !shared_ok ||
       m->moe_gate == PW_MOE_GATE_SIGMOID || (!qwen_moe && m->moe_gate != PW_MOE_GATE_SOFTMAX_TOPK) ||
       (!qwen_moe && (m->moe_every != 1 || m->moe_first_dense)) ||
       (qwen_moe && m->moe_every > 1 && m->moe_first_dense != m->moe_every - 1)))
    return pw_err_set(err, PW_ENOTSUP, "model.moe",
                      "no Hugging Face architecture computes this mixture: MixtralForCausalLM is a llama whose every "
                      "block is a softmax_topk mixture without shared experts, Qwen3MoeForCausalLM one with qk_norm "
                      "and softmax or softmax_topk mixtures after its first dense blocks, Qwen2MoeForCausalLM the "
                      "same with qkv_bias and one shared expert behind its gate");
  pw_st_file *f;
  int rc = pw_st_open(ckpt, &f, err);
  if (rc) return rc;
  hf_map mp;
  if ((rc = map_build(m, "transformer.", &mp))) {
    pw_st_close(f);
    return pw_err_set(err, rc, ckpt, "out of memory");
  }
  int cap = 0;
  for (int i = 0; i < mp.n; i++) cap += mp.e[i].n_parts;
  pw_st_tensor *out = calloc((size_t)cap, sizeof *out);
  int n = 0;
  if (!out) rc = pw_err_set(err, PW_ENOMEM, ckpt, "out of memory");
  for (int i = 0; i < mp.n && !rc; i++) {
    const hf_entry *e = &mp.e[i];
    int64_t r = e->shape[0], c = e->ndim == 2 ? e->shape[1] : 1;
    float *ours = malloc(sizeof *ours * (size_t)(r * c > 0 ? r * c : 1));
    if (!ours) {
      rc = pw_err_set(err, PW_ENOMEM, ckpt, "out of memory");
      break;
    }
    rc = pw_st_copy(f, e->ours, PW_ST_F32, e->ndim, e->shape, ours, err);
    if (rc && !pw_st_find(f, e->ours)) rc = pw_err_set(err, PW_EFORMAT, ckpt, "tensor '%s' is missing", e->ours);
    int64_t row = 0;
    for (int p = 0; p < e->n_parts && !rc; p++) {
      int64_t pr = pw__hf_part_rows(e, p);
      char nb[PW__HF_PART_NAME];
      float *part = malloc(sizeof *part * (size_t)(pr * c > 0 ? pr * c : 1));
      char *nm = strdup(pw__hf_part_name(e, p, nb));
      if (!part || !nm) {
        free(part);
        free(nm);
        rc = pw_err_set(err, PW_ENOMEM, ckpt, "out of memory");
        break;
      }
      pw_st_tensor *t = &out[n++];
      *t = (pw_st_tensor){.name = nm, .dtype = PW_ST_F32, .ndim = e->ndim, .data = part};
      if (e->transpose) { /* Conv1D: [in, out] */
        for (int64_t a = 0; a < pr; a++)
          for (int64_t b = 0; b < c; b++) part[b * pr + a] = ours[(row + a) * c + b];
        t->shape[0] = c;
        t->shape[1] = pr;
      } else {
        memcpy(part, ours + row * c, sizeof *part * (size_t)(pr * c));
        t->shape[0] = pr;
        t->shape[1] = c;
      }
      row += pr;
    }
    free(ours);
  }
  pw_st_close(f);
  const char *arch = NULL;
  json_t *cfg = rc ? NULL : m->tmpl == PW_TEMPLATE_BERT ? pw__hf_bert_config(m, &arch) : export_config(m, &arch);
  char *text = cfg ? pw_json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
  if (!rc && !text) rc = pw_err_set(err, PW_ENOMEM, dir, "out of memory");
  char path[PATH_MAX];
  if (!rc && mkdir(dir, 0777) && errno != EEXIST) rc = pw_err_set(err, PW_EIO, dir, "cannot make: %s", strerror(errno));
  if (!rc) {
    pw_st_meta meta[1] = {{"format", "pt"}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = pw_st_write(path, out, n, meta, 1, err);
  }
  if (!rc) {
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = write_text(path, text, err);
  }
  free(text);
  json_decref(cfg);
  for (int i = 0; i < n; i++) {
    free((void *)out[i].name);
    free((void *)out[i].data);
  }
  free(out);
  free(mp.e);
  return rc;
}
