/* hf_int: what hf.c shares with hf_bert.c (private to common/io): the
 * config reader's state and its field readers, the list of name entries
 * that drives import and export, and a directory's tensors. hf.c's own
 * comments say what each reader accepts; these are thin doors to them. */
#ifndef PW_HF_INT_H
#define PW_HF_INT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "hf.h"
#include "safetensors.h"
#include "spec.h"

#define PW__HF_NAME 160
#define PW__HF_MAX_POS 65536 /* model.seq_len's bound */

/* A config.json being read: errors say "what: field: ..." for arch. */
typedef struct {
  const json_t *cfg;
  const char *what;
  const char *arch;
  pw_err *err;
} pw__hf_cfg;

/* One of our tensors and where Hugging Face keeps it: one tensor, or q, k
 * and v joined by rows; GPT-2's Conv1D transposed; a position table may
 * hold more rows than our seq_len (its first rows are ours). A mixture's
 * stacked experts (experts > 0) are n_parts = experts tensors of rows[0]
 * rows each, part e named hf[0] e hf[1] ("...experts." 3 ".w1.weight"):
 * pw__hf_part_name. */
typedef struct {
  char ours[PW__HF_NAME];
  int ndim;
  int64_t shape[2];
  int n_parts;
  char hf[3][PW__HF_NAME];
  int64_t rows[3];
  int transpose, may_slice;
  int experts;
} pw__hf_entry;

/* Part p's name (into buf, PW__HF_PART_NAME bytes) and rows. */
#define PW__HF_PART_NAME (2 * PW__HF_NAME + 12)
const char *pw__hf_part_name(const pw__hf_entry *e, int p, char *buf);
int64_t pw__hf_part_rows(const pw__hf_entry *e, int p);

typedef struct {
  pw__hf_entry *e;
  int n, cap;
  int tie;             /* lm_head is embed.tok.weight: HF's lm_head.weight optional */
  char embed_hf[PW__HF_NAME];
} pw__hf_map;

/* model.safetensors, or the shards a model.safetensors.index.json names */
typedef struct pw__hf_src {
  const char *dir;
  json_t *weight_map;  /* index: tensor -> shard file name; NULL for one file */
  pw_st_file **files;
  char **names;        /* the files' names in dir */
  int n_files;
  json_t *used;        /* tensor names read */
} pw__hf_src;

/* hf_read.c: config.json's readers (absent or null: def; def < 0: required) */
const char *pw__hf_type_name(const json_t *v);
PW_MUST_CHECK int pw__hf_get_int(const pw__hf_cfg *c, const char *name, long long def, long long lo, long long hi,
                                 int *v);
PW_MUST_CHECK int pw__hf_get_num(const pw__hf_cfg *c, const char *name, double def, double *v);
PW_MUST_CHECK int pw__hf_get_bool(const pw__hf_cfg *c, const char *name, int def, int *v);
PW_MUST_CHECK int pw__hf_want_bool(const pw__hf_cfg *c, const char *name, int def, int want, const char *why);
PW_MUST_CHECK int pw__hf_want_str(const pw__hf_cfg *c, const char *name, const char *const *allowed);
PW_MUST_CHECK int pw__hf_dropout(const pw__hf_cfg *c, const char *name, char *notes, size_t cap);
/* A new entry (one part, named by the caller); NULL when out of memory. */
pw__hf_entry *pw__hf_map_add(pw__hf_map *mp, const char *ours, int ndim, int64_t r, int64_t cols);
/* dir's model.safetensors or its index's shards (dir must outlive s);
 * 0 or a negative code with err. Close it whatever open returned. */
PW_MUST_CHECK int pw__hf_src_open(pw__hf_src *s, const char *dir, pw_err *err);
void pw__hf_src_close(pw__hf_src *s);
/* The tensor of that name, marked as read, and its file (file may be
 * NULL); NULL when absent. */
const pw_st_tensor *pw__hf_src_find(pw__hf_src *s, const char *name, const pw_st_file **file);
/* The shortest decimal that reads back as f. */
double pw__hf_short_float(float f);

/* hf_bert.c: BertForMaskedLM and BertForSequenceClassification.
 * pw__hf_bert_model: config.json -> the bert template's model object
 * (every field read, checked or refused; the common ones hf.c checked).
 * pw__hf_bert_job: the job's data section (and the special tokens config.json
 * leaves out) from DIR/tokenizer.json and the options.
 * pw__hf_bert_map: our names <- theirs ("bert." prefix).
 * pw__hf_bert_legacy_names: LayerNorm's gamma / beta where a file has them.
 * pw__hf_bert_rest: the tensors the mapping leaves: a tied decoder must be
 * the token embedding, its bias cls.predictions.bias; BertForMaskedLM's
 * file may carry the pooler and the next-sentence head (not read, noted).
 * pw__hf_bert_config: the config.json of an export. */
PW_MUST_CHECK int pw__hf_bert_model(const pw__hf_cfg *c, int classify, int seq_len, json_t **model, char *notes,
                                    size_t notes_cap);
PW_MUST_CHECK int pw__hf_bert_job(const char *dir, const pw_hf_import_opts *o, json_t *job, char *notes, size_t cap,
                                  int *placeholder, pw_err *err);
PW_MUST_CHECK int pw__hf_bert_map(const pw_model_spec *m, pw__hf_map *mp);
void pw__hf_bert_legacy_names(pw__hf_src *s, pw__hf_map *mp);
PW_MUST_CHECK int pw__hf_bert_rest(pw__hf_src *s, const char *dir, const pw_model_spec *m, pw_hf_import_result *r,
                                   pw_err *err);
json_t *pw__hf_bert_config(const pw_model_spec *m, const char **arch);

#endif
