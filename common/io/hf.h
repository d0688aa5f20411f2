/* hf: Hugging Face model directories in and out — config.json plus
 * model.safetensors (or a sharded model.safetensors.index.json and its
 * shards) <-> a job spec's model and a checkpoint under our parameter names
 * (docs/contracts.md#hugging-face-models has the field and name tables).
 *
 * GPT2LMHeadModel is the gpt template; LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM (qkv_bias), Qwen3ForCausalLM
 * (qk_norm) and GemmaForCausalLM (mlp_act gelu_tanh, embed_scale,
 * norm_offset 1) the llama template with its options; BertForMaskedLM and
 * BertForSequenceClassification the bert template (hf_bert.c, names with
 * the "bert." prefix). Every config.json field
 * is mapped, checked to hold the value our arithmetic computes, or listed
 * as one that leaves the arithmetic alone (token ids, generation defaults,
 * bookkeeping); any other field is refused by name, never ignored. q, k and
 * v are joined into our fused qkv (its rows: all query heads, then key,
 * then value), GPT-2's Conv1D weights ([in, out]) transposed.
 *
 * Never writes a file on error: import only reads (the caller writes), and
 * export builds every tensor before it writes anything, each file to a
 * temporary name and renamed. */
#ifndef PW_HF_H
#define PW_HF_H

#include <jansson.h>
#include <stddef.h>

#include "errors.h"
#include "safetensors.h"
#include "spec.h"

#define PW_HF_ARCH_MAX 40
#define PW_HF_NOTES_MAX 512

/* config.json's object -> the job's "model" object (new reference in
 * *model). seq_len 0 takes the model's maximum positions, else it must not
 * exceed them (a learned position table is cut to its first seq_len rows).
 * `what` names the file in errors ("DIR/config.json: hidden_act: ...");
 * arch gets the architecture; notes (may be NULL) what is read but not
 * computed (dropout: pipewright trains without it). */
PW_MUST_CHECK int pw_hf_config_model(const json_t *cfg, const char *what, int seq_len, json_t **model,
                                     char arch[PW_HF_ARCH_MAX], char *notes, size_t notes_cap, pw_err *err);

typedef struct {
  const char *name; /* the job's name; NULL: the directory's base name */
  int seq_len;      /* 0: the model's maximum positions */
  /* BertForMaskedLM: data.mask_token when has_mask_token, else the id of
   * [MASK] in DIR/tokenizer.json (one of the two is needed) */
  int has_mask_token, mask_token;
} pw_hf_import_opts;

typedef struct {
  json_t *job;             /* the job spec: name, model, data */
  pw_st_tensor *tensors;   /* under our names, F32, sorted by name; data malloc'd */
  int n_tensors;
  char arch[PW_HF_ARCH_MAX];
  char notes[PW_HF_NOTES_MAX];
  int data_placeholder;    /* data.path is a placeholder the user must set (vocab_size != 256) */
} pw_hf_import_result;

/* Reads DIR's config.json and weights (F32, BF16 or F16: widened exactly).
 * A tensor missing or of another shape than the config gives, or one the
 * model does not use, is an error naming it. The data section: the example
 * corpus of bytes when vocab_size is 256, else a tokens file path the
 * user must set (data_placeholder), with DIR/tokenizer.json named when
 * there is one. */
PW_MUST_CHECK int pw_hf_import(const char *dir, const pw_hf_import_opts *o, pw_hf_import_result *r, pw_err *err);
void pw_hf_import_free(pw_hf_import_result *r);

/* Writes DIR/model.safetensors (one file, F32) and DIR/config.json for the
 * model m from our checkpoint file ckpt; DIR is made if missing. gpt gives
 * GPT2LMHeadModel; llama gives GemmaForCausalLM with Gemma's three
 * options, Qwen3ForCausalLM with qk_norm, Qwen2ForCausalLM with qkv_bias,
 * else LlamaForCausalLM; bert gives BertForMaskedLM or
 * BertForSequenceClassification (the tied decoder left out). Refused by name: other templates, model.lora
 * (merge it first), qk_norm with qkv_bias, a part of Gemma's options or
 * them with another. */
PW_MUST_CHECK int pw_hf_export(const pw_model_spec *m, const char *ckpt, const char *dir, pw_err *err);

#endif
