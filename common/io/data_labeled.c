/* data_labeled: token sequences with one label each, from JSON Lines
 * (docs/datasets.md#labeled-sequences). One object per line:
 *   {"tokens": [101, 2023, ..., 102], "label": 1}
 * "tokens" are ids below the model's vocab_size, already holding what the
 * tokenizer adds ([CLS], [SEP]: a pair is "a [SEP] b [SEP]"); "label" is a
 * class in [0, n_labels); a "text" field may ride along and is not read.
 * Any other field is refused (a "token_type_ids" or "attention_mask" here
 * would mean something pipewright computes from the ids: the model's
 * sep_token and pad_token). Blank lines are skipped. A sequence longer
 * than seq_len keeps its first seq_len ids; a shorter one is filled with
 * the model's pad_token (a model without one needs every line full). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "data_int.h"

typedef struct {
  int32_t *ids, *labels;
  size_t n, cap;
} lab_buf;

static int grow(lab_buf *b, int T) {
  if (b->n < b->cap) return 0;
  size_t cap = b->cap ? 2 * b->cap : 256;
  int32_t *ids = realloc(b->ids, sizeof *ids * cap * (size_t)T);
  if (!ids) return -1;
  b->ids = ids;
  int32_t *lab = realloc(b->labels, sizeof *lab * cap);
  if (!lab) return -1;
  b->labels = lab;
  b->cap = cap;
  return 0;
}

/* One line's object into row (T ids) and *label. */
static int parse_line(const json_t *o, const char *path, size_t line, const pw_data_shape *sh, int32_t *row,
                      int32_t *label, int *was_cut, pw_err *err) {
  int T = sh->seq_len;
  if (!json_is_object(o))
    return pw_err_set(err, PW_ESPEC, "data.path", "%s line %zu: must be a JSON object {\"tokens\": [...], \"label\": N}",
                      path, line);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)o, key, v) if (strcmp(key, "tokens") && strcmp(key, "label") && strcmp(key, "text"))
    return pw_err_set(err, PW_ESPEC, "data.path",
                      "%s line %zu: unknown field \"%.48s\" (tokens, label; text is passed over). Token types and the "
                      "attention mask come from the ids (model.sep_token, model.pad_token)",
                      path, line, key);
  const json_t *toks = json_object_get(o, "tokens"), *lab = json_object_get(o, "label");
  if (!toks || !json_is_array(toks) || json_array_size(toks) == 0)
    return pw_err_set(err, PW_ESPEC, "data.path", "%s line %zu: \"tokens\" must be a non-empty list of token ids",
                      path, line);
  if (!lab || !json_is_integer(lab))
    return pw_err_set(err, PW_ESPEC, "data.path", "%s line %zu: \"label\" must be an integer class", path, line);
  json_int_t c = json_integer_value(lab);
  if (c < 0 || c >= sh->out_dim)
    return pw_err_set(err, PW_ESPEC, "data.path", "%s line %zu: label %lld is out of range: the model has %d labels "
                      "(0 ... %d)", path, line, (long long)c, sh->out_dim, sh->out_dim - 1);
  size_t n = json_array_size(toks);
  for (size_t t = 0; t < n; t++) {
    const json_t *x = json_array_get(toks, t);
    json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
    if (!json_is_integer(x) || id < 0 || id >= sh->vocab_size)
      return pw_err_set(err, PW_ESPEC, "data.path", "%s line %zu: tokens[%zu] must be a token id in 0 ... %d", path,
                        line, t, sh->vocab_size - 1);
    if (t < (size_t)T) row[t] = (int32_t)id;
  }
  if (n < (size_t)T && sh->pad_token < 0)
    return pw_err_set(err, PW_ESPEC, "data.path",
                      "%s line %zu: %zu tokens, fewer than seq_len %d, and the model has no pad_token to fill the rest",
                      path, line, n, T);
  for (size_t t = n; t < (size_t)T; t++) row[t] = sh->pad_token;
  *label = (int32_t)c;
  *was_cut = n > (size_t)T;
  return 0;
}

int pw__labeled_parse(const unsigned char *buf, size_t len, const char *path, const pw_data_shape *sh, int32_t **ids,
                      int32_t **labels, size_t *n_out, size_t *cut, pw_err *err) {
  *ids = *labels = NULL;
  *n_out = *cut = 0;
  int T = sh->seq_len;
  if (sh->out_dim < 2 || !sh->tokens)
    return pw_err_set(err, PW_ESPEC, "data.kind",
                      "'labeled' sequences need a token model with one label per sequence (template bert, bert_head "
                      "classify)");
  lab_buf b = {0};
  int rc = 0;
  size_t line = 0;
  for (size_t at = 0; at < len && !rc;) {
    const unsigned char *end = memchr(buf + at, '\n', len - at);
    size_t n = end ? (size_t)(end - (buf + at)) : len - at;
    const char *s = (const char *)buf + at;
    at += n + 1;
    line++;
    size_t k = 0;
    while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
    if (k == n) continue;
    json_error_t je;
    json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
      rc = pw_err_set(err, PW_ESPEC, "data.path", "%s line %zu column %d: %s", path, line, je.column, je.text);
      break;
    }
    if (grow(&b, T)) {
      json_decref(o);
      rc = pw_err_set(err, PW_ENOMEM, "data.path", "%s: out of memory at line %zu", path, line);
      break;
    }
    int was_cut = 0;
    rc = parse_line(o, path, line, sh, b.ids + b.n * (size_t)T, b.labels + b.n, &was_cut, err);
    json_decref(o);
    b.n += !rc;
    *cut += (size_t)was_cut;
  }
  if (!rc && !b.n) rc = pw_err_set(err, PW_ESPEC, "data.path", "%s holds no sequences (one JSON object a line)", path);
  if (rc) {
    free(b.ids);
    free(b.labels);
    *cut = 0;
    return rc;
  }
  *ids = b.ids;
  *labels = b.labels;
  *n_out = b.n;
  return 0;
}
