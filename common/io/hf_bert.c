/* hf_bert: BertForMaskedLM and BertForSequenceClassification <-> the bert
 * template (docs/contracts.md#hugging-face-models has the tables).
 *
 * config.json: every field BertConfig writes is read, checked to hold what
 * the template computes (hidden_act "gelu" is the erf GELU; absolute
 * positions; an encoder, not a decoder; a tied decoder), or passed over
 * (dropout, noted); an absent field takes BertConfig's default, as
 * transformers does. pad_token_id (BertConfig's default 0) is the id
 * whose keys attention masks and whose embedding row never trains
 * (transformers' padding_idx; there the mask is the caller's
 * attention_mask = ids != pad); sep_token_id, or else [SEP] in the
 * directory's tokenizer.json, decides the token types (0 through the first
 * [SEP], 1 after, pads 0: as the tokenizer gives a padded pair's). Labels: id2label's
 * size, or num_labels; one label is regression, refused.
 *
 * Names: "bert." + embeddings.* and encoder.layer.i.* for the encoder,
 * query, key and value joined into our attn.qkv (q rows, then k, then v);
 * cls.predictions.{transform.*, bias} for the masked-LM head, whose
 * decoder is the token embedding (a saved cls.predictions.decoder.* must
 * equal it); bert.pooler.dense.* and classifier.* for a classifier.
 * Legacy files' LayerNorm.gamma / .beta are read as .weight / .bias. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hf_int.h"

#define NAME PW__HF_NAME

int pw__hf_bert_model(const pw__hf_cfg *c, int classify, int seq_len, json_t **model, char *notes, size_t notes_cap) {
  static const char *const gelu[] = {"gelu", NULL}, *const absolute[] = {"absolute", NULL},
                           *const single[] = {"single_label_classification", NULL};
  int V, d, L, H, ff, P, TV, pad, sep, tie, K = 0, n_labels = 0, rc;
  double eps, init;
  *model = NULL;
  /* BertConfig's defaults where a field is absent */
  if ((rc = pw__hf_get_int(c, "vocab_size", 30522, 2, 1 << 20, &V)) ||
      (rc = pw__hf_get_int(c, "hidden_size", 768, 1, 1 << 20, &d)) ||
      (rc = pw__hf_get_int(c, "num_hidden_layers", 12, 1, 4096, &L)) ||
      (rc = pw__hf_get_int(c, "num_attention_heads", 12, 1, 1 << 20, &H)) ||
      (rc = pw__hf_get_int(c, "intermediate_size", 3072, 1, 1 << 20, &ff)) ||
      (rc = pw__hf_get_int(c, "max_position_embeddings", 512, 1, INT_MAX, &P)) ||
      (rc = pw__hf_get_int(c, "type_vocab_size", 2, 1, 1 << 20, &TV)) ||
      (rc = pw__hf_get_int(c, "pad_token_id", 0, 0, V - 1, &pad)) ||
      (rc = pw__hf_get_int(c, "sep_token_id", INT_MAX, 0, V - 1, &sep)) ||
      (rc = pw__hf_want_str(c, "hidden_act", gelu)) ||
      (rc = pw__hf_want_str(c, "position_embedding_type", absolute)) ||
      (rc = pw__hf_want_str(c, "problem_type", single)) ||
      (rc = pw__hf_want_bool(c, "is_decoder", 0, 0, "BERT is read as an encoder: every query sees every key")) ||
      (rc = pw__hf_get_bool(c, "tie_word_embeddings", 1, &tie)) ||
      (rc = pw__hf_get_num(c, "layer_norm_eps", 1e-12, &eps)) ||
      (rc = pw__hf_get_num(c, "initializer_range", 0.02, &init)) ||
      (rc = pw__hf_dropout(c, "hidden_dropout_prob", notes, notes_cap)) ||
      (rc = pw__hf_dropout(c, "attention_probs_dropout_prob", notes, notes_cap)) ||
      (rc = pw__hf_dropout(c, "classifier_dropout", notes, notes_cap)))
    return rc;
  const json_t *pj = json_object_get(c->cfg, "pad_token_id"), *sj = json_object_get(c->cfg, "sep_token_id");
  if (pj && json_is_null(pj)) pad = -1; /* no padding id at all */
  if (!sj || json_is_null(sj)) sep = -1;
  if (!classify && !tie)
    return pw_err_set(c->err, PW_ENOTSUP, c->what,
                      "tie_word_embeddings: false is not supported for %s (its decoder reads the token embedding)",
                      c->arch);
  if (d % H)
    return pw_err_set(c->err, PW_ESPEC, c->what, "num_attention_heads: %d must divide hidden_size %d", H, d);
  if (!(eps > 0 && eps <= 1)) return pw_err_set(c->err, PW_ESPEC, c->what, "layer_norm_eps: %g must be > 0 and <= 1", eps);
  if (!(init > 0)) return pw_err_set(c->err, PW_ESPEC, c->what, "initializer_range: must be > 0");
  if (sep >= 0 && sep == pad)
    return pw_err_set(c->err, PW_ESPEC, c->what, "sep_token_id: %d is also pad_token_id", sep);
  if (sep >= 0 && TV < 2)
    return pw_err_set(c->err, PW_ENOTSUP, c->what,
                      "sep_token_id: set with type_vocab_size %d (the tokens after [SEP] are type 1)", TV);
  if (seq_len > P)
    return pw_err_set(c->err, PW_EINVAL, c->what, "--seq-len %d is more than max_position_embeddings %d", seq_len, P);
  if (!seq_len && P > PW__HF_MAX_POS)
    return pw_err_set(c->err, PW_EINVAL, c->what,
                      "max_position_embeddings: %d is more than model.seq_len's %d: give --seq-len N (at most %d)", P,
                      PW__HF_MAX_POS, PW__HF_MAX_POS);
  int T = seq_len ? seq_len : P;
  if (classify) {
    const json_t *id2 = json_object_get(c->cfg, "id2label");
    if (id2 && !json_is_null(id2) && !json_is_object(id2))
      return pw_err_set(c->err, PW_ESPEC, c->what, "id2label: must be an object (got %s)", pw__hf_type_name(id2));
    int n_id2 = id2 && json_is_object(id2) ? (int)json_object_size(id2) : 0;
    if ((rc = pw__hf_get_int(c, "num_labels", n_id2 ? n_id2 : 2, 1, 1 << 20, &n_labels))) return rc;
    if (n_id2 && n_id2 != n_labels)
      return pw_err_set(c->err, PW_ESPEC, c->what, "num_labels: %d, but id2label has %d", n_labels, n_id2);
    if (n_labels < 2)
      return pw_err_set(c->err, PW_ENOTSUP, c->what,
                        "num_labels: 1 makes %s a regression (mean squared error); only classification is supported",
                        c->arch);
  } else {
    if ((rc = pw__hf_get_int(c, "mlm_predictions", 0, 1, T, &K))) return rc;
  }
  json_t *m = json_object();
  if (!m) return pw_err_set(c->err, PW_ENOMEM, c->what, "out of memory");
  int bad = json_object_set_new(m, "template", json_string("bert"));
  bad |= json_object_set_new(m, "vocab_size", json_integer(V));
  bad |= json_object_set_new(m, "seq_len", json_integer(T));
  bad |= json_object_set_new(m, "d_model", json_integer(d));
  bad |= json_object_set_new(m, "n_layers", json_integer(L));
  bad |= json_object_set_new(m, "n_heads", json_integer(H));
  bad |= json_object_set_new(m, "ffn_hidden", json_integer(ff));
  bad |= json_object_set_new(m, "type_vocab_size", json_integer(TV));
  bad |= json_object_set_new(m, "bert_head", json_string(classify ? "classify" : "mlm"));
  if (classify) bad |= json_object_set_new(m, "n_labels", json_integer(n_labels));
  if (K) bad |= json_object_set_new(m, "mlm_predictions", json_integer(K));
  if (pad >= 0) bad |= json_object_set_new(m, "pad_token", json_integer(pad));
  if (sep >= 0) bad |= json_object_set_new(m, "sep_token", json_integer(sep));
  bad |= json_object_set_new(m, "norm_eps", json_real(eps));
  bad |= json_object_set_new(m, "init_std", json_real(init));
  if (bad) {
    json_decref(m);
    return pw_err_set(c->err, PW_ENOMEM, c->what, "out of memory");
  }
  *model = m;
  return 0;
}

/* DIR/tokenizer.json's added token of that content, or -1. */
static int added_token(const json_t *tok, const char *content) {
  size_t i;
  json_t *t;
  json_array_foreach(json_object_get(tok, "added_tokens"), i, t) {
    const char *s = json_string_value(json_object_get(t, "content"));
    const json_t *id = json_object_get(t, "id");
    if (s && !strcmp(s, content) && json_is_integer(id) && json_integer_value(id) >= 0 &&
        json_integer_value(id) < INT_MAX)
      return (int)json_integer_value(id);
  }
  return -1;
}

static void note(char *notes, size_t cap, const char *fmt, int v) {
  size_t n = strlen(notes);
  if (n + 3 >= cap) return;
  if (n) n += (size_t)snprintf(notes + n, cap - n, "; ");
  snprintf(notes + n, cap - n, fmt, v);
}

int pw__hf_bert_job(const char *dir, const pw_hf_import_opts *o, json_t *job, char *notes, size_t cap, int *placeholder,
                    pw_err *err) {
  json_t *model = json_object_get(job, "model");
  int classify = !strcmp(json_string_value(json_object_get(model, "bert_head")), "classify");
  int V = (int)json_integer_value(json_object_get(model, "vocab_size"));
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  json_t *tok = access(path, R_OK) == 0 ? json_load_file(path, 0, NULL) : NULL;
  int sep = tok ? added_token(tok, "[SEP]") : -1, mask = tok ? added_token(tok, "[MASK]") : -1;
  json_decref(tok);
  const json_t *pad = json_object_get(model, "pad_token");
  if (!json_object_get(model, "sep_token") && sep >= 0 && sep < V &&
      json_integer_value(json_object_get(model, "type_vocab_size")) >= 2 && !(pad && json_integer_value(pad) == sep)) {
    json_object_set_new(model, "sep_token", json_integer(sep));
    note(notes, cap, "sep_token %d is tokenizer.json's [SEP]: the tokens after the first are type 1", sep);
  }
  json_t *data = json_object();
  *placeholder = 1;
  if (classify) {
    if (o->has_mask_token) {
      json_decref(data);
      return pw_err_set(err, PW_EINVAL, "--mask-token", "only for BertForMaskedLM (this is a classifier)");
    }
    json_object_set_new(data, "kind", json_string("labeled"));
    json_object_set_new(data, "path", json_string("SET-ME.jsonl"));
  } else {
    if (o->has_mask_token) mask = o->mask_token;
    if (mask < 0) {
      json_decref(data);
      return pw_err_set(err, PW_EINVAL, "--mask-token",
                        "%s has no tokenizer.json naming [MASK]: give --mask-token ID (data.mask_token, the id that "
                        "masks a position)",
                        dir);
    }
    if (mask >= V) {
      json_decref(data);
      return pw_err_set(err, PW_EINVAL, "--mask-token", "%d is not below vocab_size %d", mask, V);
    }
    json_object_set_new(data, "kind", json_string("tokens"));
    json_object_set_new(data, "path", json_string("SET-ME.tokens"));
    json_object_set_new(data, "mask_token", json_integer(mask));
  }
  json_object_set_new(job, "data", data);
  return 0;
}

/* one entry: ours <- pre + theirs */
static int add(pw__hf_map *mp, const char *ours, int nd, int64_t r, int64_t c, const char *pre, const char *theirs) {
  pw__hf_entry *e = pw__hf_map_add(mp, ours, nd, r, c);
  if (!e) return PW_ENOMEM;
  snprintf(e->hf[0], NAME, "%s%s", pre, theirs);
  return 0;
}

int pw__hf_bert_map(const pw_model_spec *m, pw__hf_map *mp) {
  int64_t V = m->vocab_size, T = m->seq_len, d = m->d_model, ff = m->ffn_hidden ? m->ffn_hidden : 4 * d;
  int64_t TV = m->type_vocab_size > 0 ? m->type_vocab_size : 2;
  const char *B = "bert.";
  char o[NAME], h[NAME];
  int rc = 0;
  mp->tie = 0; /* the decoder is checked by pw__hf_bert_rest */
  snprintf(mp->embed_hf, NAME, "%sembeddings.word_embeddings.weight", B);
  rc |= add(mp, "embed.tok.weight", 2, V, d, B, "embeddings.word_embeddings.weight");
  rc |= add(mp, "embed.pos.weight", 2, T, d, B, "embeddings.position_embeddings.weight");
  if (!rc) mp->e[mp->n - 1].may_slice = 1;
  rc |= add(mp, "embed.type.weight", 2, TV, d, B, "embeddings.token_type_embeddings.weight");
  rc |= add(mp, "embed.ln.weight", 1, d, 1, B, "embeddings.LayerNorm.weight");
  rc |= add(mp, "embed.ln.bias", 1, d, 1, B, "embeddings.LayerNorm.bias");
  static const struct {
    const char *ours, *theirs;
    char r, c; /* 'd', 'f' (ffn), '1' */
  } blk[] = {
      {"attn.proj.weight", "attention.output.dense.weight", 'd', 'd'},
      {"attn.proj.bias", "attention.output.dense.bias", 'd', '1'},
      {"ln1.weight", "attention.output.LayerNorm.weight", 'd', '1'},
      {"ln1.bias", "attention.output.LayerNorm.bias", 'd', '1'},
      {"mlp.fc.weight", "intermediate.dense.weight", 'f', 'd'},
      {"mlp.fc.bias", "intermediate.dense.bias", 'f', '1'},
      {"mlp.proj.weight", "output.dense.weight", 'd', 'f'},
      {"mlp.proj.bias", "output.dense.bias", 'd', '1'},
      {"ln2.weight", "output.LayerNorm.weight", 'd', '1'},
      {"ln2.bias", "output.LayerNorm.bias", 'd', '1'},
  };
  for (int i = 0; i < m->n_layers && !rc; i++) {
    char p[64];
    snprintf(p, sizeof p, "%sencoder.layer.%d.", B, i);
    for (int b = 0; b < 2 && !rc; b++) { /* query, key, value joined by rows */
      snprintf(o, sizeof o, "blocks.%d.attn.qkv.%s", i, b ? "bias" : "weight");
      pw__hf_entry *e = pw__hf_map_add(mp, o, b ? 1 : 2, 3 * d, b ? 1 : d);
      if (!e) return PW_ENOMEM;
      e->n_parts = 3;
      static const char *const qkv[3] = {"query", "key", "value"};
      for (int j = 0; j < 3; j++) {
        snprintf(e->hf[j], NAME, "%sattention.self.%s.%s", p, qkv[j], b ? "bias" : "weight");
        e->rows[j] = d;
      }
    }
    for (size_t k = 0; k < sizeof blk / sizeof blk[0] && !rc; k++) {
#define DIM(ch) ((ch) == 'd' ? d : (ch) == 'f' ? ff : 1)
      snprintf(o, sizeof o, "blocks.%d.%s", i, blk[k].ours);
      snprintf(h, sizeof h, "%s%s", p, blk[k].theirs);
      rc |= add(mp, o, blk[k].c == '1' ? 1 : 2, DIM(blk[k].r), DIM(blk[k].c), "", h);
#undef DIM
    }
  }
  if (m->bert_head == PW_BERT_HEAD_CLASSIFY) {
    rc |= add(mp, "head.pooler.weight", 2, d, d, B, "pooler.dense.weight");
    rc |= add(mp, "head.pooler.bias", 1, d, 1, B, "pooler.dense.bias");
    rc |= add(mp, "head.classifier.weight", 2, m->n_labels, d, "", "classifier.weight");
    rc |= add(mp, "head.classifier.bias", 1, m->n_labels, 1, "", "classifier.bias");
  } else {
    rc |= add(mp, "head.transform.weight", 2, d, d, "", "cls.predictions.transform.dense.weight");
    rc |= add(mp, "head.transform.bias", 1, d, 1, "", "cls.predictions.transform.dense.bias");
    rc |= add(mp, "head.ln.weight", 1, d, 1, "", "cls.predictions.transform.LayerNorm.weight");
    rc |= add(mp, "head.ln.bias", 1, d, 1, "", "cls.predictions.transform.LayerNorm.bias");
    rc |= add(mp, "head.decoder.bias", 1, V, 1, "", "cls.predictions.bias");
  }
  return rc ? PW_ENOMEM : 0;
}

void pw__hf_bert_legacy_names(pw__hf_src *s, pw__hf_map *mp) {
  for (int i = 0; i < mp->n; i++) {
    char *nm = mp->e[i].hf[0];
    size_t n = strlen(nm);
    int w = n > 17 && !strcmp(nm + n - 17, ".LayerNorm.weight"), b = n > 15 && !strcmp(nm + n - 15, ".LayerNorm.bias");
    if (!(w || b) || pw__hf_src_find(s, nm, NULL)) continue;
    char old[NAME];
    snprintf(old, sizeof old, "%.*s%s", (int)(n - (w ? 6 : 4)), nm, w ? "gamma" : "beta");
    if (pw__hf_src_find(s, old, NULL)) memcpy(nm, old, strlen(old) + 1);
  }
}

static const pw_st_tensor *ours(const pw_hf_import_result *r, const char *name) {
  for (int i = 0; i < r->n_tensors; i++)
    if (!strcmp(r->tensors[i].name, name)) return &r->tensors[i];
  return NULL;
}

/* A saved copy of a tied tensor must hold its bits. */
static int same_as(pw__hf_src *s, const char *dir, const char *theirs, const pw_st_tensor *t, const char *why,
                   pw_err *err) {
  const pw_st_tensor *h = pw__hf_src_find(s, theirs, NULL);
  if (!h) return 0;
  int64_t n = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
  int same = h->ndim == t->ndim && h->shape[0] == t->shape[0] && (t->ndim == 1 || h->shape[1] == t->shape[1]);
  if (same) {
    float *b = malloc(sizeof *b * (size_t)(n ? n : 1));
    if (!b) return pw_err_set(err, PW_ENOMEM, dir, "out of memory");
    int rc = pw_st_to_f32(h, b, dir, err);
    same = !rc && !memcmp(b, t->data, sizeof *b * (size_t)n);
    free(b);
    if (rc) return rc;
  }
  if (!same)
    return pw_err_set(err, PW_ENOTSUP, dir, "tensor '%s' differs from '%s', which the decoder is tied to", theirs, why);
  return 0;
}

int pw__hf_bert_rest(pw__hf_src *s, const char *dir, const pw_model_spec *m, pw_hf_import_result *r, pw_err *err) {
  if (m->bert_head == PW_BERT_HEAD_CLASSIFY) return 0;
  int rc = same_as(s, dir, "cls.predictions.decoder.weight", ours(r, "embed.tok.weight"),
                   "bert.embeddings.word_embeddings.weight", err);
  if (!rc)
    rc = same_as(s, dir, "cls.predictions.decoder.bias", ours(r, "head.decoder.bias"), "cls.predictions.bias", err);
  if (rc) return rc;
  /* a pretraining checkpoint's pooler and next-sentence head: BertForMaskedLM has neither */
  static const char *const unused[] = {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
                                       "cls.seq_relationship.bias"};
  int n = 0;
  for (int i = 0; i < 4; i++) n += pw__hf_src_find(s, unused[i], NULL) != NULL;
  if (n) note(r->notes, sizeof r->notes, "%d tensors of bert.pooler / cls.seq_relationship are not read (BertForMaskedLM "
              "has no pooler or next-sentence head; transformers drops them too)", n);
  return 0;
}

json_t *pw__hf_bert_config(const pw_model_spec *m, const char **arch) {
  int cls = m->bert_head == PW_BERT_HEAD_CLASSIFY;
  json_t *c = json_object();
  *arch = cls ? "BertForSequenceClassification" : "BertForMaskedLM";
  json_t *a = json_array();
  json_array_append_new(a, json_string(*arch));
  json_object_set_new(c, "architectures", a);
  json_object_set_new(c, "model_type", json_string("bert"));
  json_object_set_new(c, "vocab_size", json_integer(m->vocab_size));
  json_object_set_new(c, "hidden_size", json_integer(m->d_model));
  json_object_set_new(c, "num_hidden_layers", json_integer(m->n_layers));
  json_object_set_new(c, "num_attention_heads", json_integer(m->n_heads));
  json_object_set_new(c, "intermediate_size", json_integer(m->ffn_hidden ? m->ffn_hidden : 4 * m->d_model));
  json_object_set_new(c, "hidden_act", json_string("gelu"));
  json_object_set_new(c, "max_position_embeddings", json_integer(m->seq_len));
  json_object_set_new(c, "type_vocab_size", json_integer(m->type_vocab_size > 0 ? m->type_vocab_size : 2));
  json_object_set_new(c, "layer_norm_eps", json_real(pw__hf_short_float(m->norm_eps)));
  json_object_set_new(c, "initializer_range", json_real(pw__hf_short_float(m->init_std)));
  json_object_set_new(c, "position_embedding_type", json_string("absolute"));
  json_object_set_new(c, "hidden_dropout_prob", json_real(0));
  json_object_set_new(c, "attention_probs_dropout_prob", json_real(0));
  json_object_set_new(c, "classifier_dropout", json_null());
  json_object_set_new(c, "pad_token_id", m->pad_token >= 0 ? json_integer(m->pad_token) : json_null());
  if (m->sep_token >= 0) json_object_set_new(c, "sep_token_id", json_integer(m->sep_token));
  json_object_set_new(c, "is_decoder", json_false());
  json_object_set_new(c, "tie_word_embeddings", json_true());
  if (cls) {
    json_t *id2 = json_object(), *l2id = json_object();
    for (int i = 0; i < m->n_labels; i++) {
      char k[16], v[24];
      snprintf(k, sizeof k, "%d", i);
      snprintf(v, sizeof v, "LABEL_%d", i);
      json_object_set_new(id2, k, json_string(v));
      json_object_set_new(l2id, v, json_integer(i));
    }
    json_object_set_new(c, "id2label", id2);
    json_object_set_new(c, "label2id", l2id);
    json_object_set_new(c, "problem_type", json_string("single_label_classification"));
  } else {
    /* ours, only when not the default (spec_model.c's round(0.15 seq_len), at least 1); transformers keeps it */
    int def = (15 * m->seq_len + 50) / 100;
    if (m->mlm_predictions != (def < 1 ? 1 : def))
      json_object_set_new(c, "mlm_predictions", json_integer(m->mlm_predictions));
  }
  json_object_set_new(c, "torch_dtype", json_string("float32"));
  return c;
}
