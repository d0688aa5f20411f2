/* tokenizer: a tokenizer.json read whole, and the pipeline tokenizers runs
 * for one text (tokenizer/mod.rs encode_single_sequence, decode):
 *   added tokens that are not normalized split out of the raw text ->
 *   each other piece normalized -> normalized added tokens split out ->
 *   pre-tokenizer steps -> the BPE model -> the post_processor's template.
 * It must never accept a file whose ids it would get wrong: every type or
 * option it does not run is refused by name. */
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tok_int.h"

#define POST_SEQ (-1) /* a template item standing for the encoded text ($A) */

typedef struct {
  int32_t items[TK_MAX_TEMPLATE];
  int n;
} tk_post;

struct pw_tokenizer {
  tk_bpe bpe;
  tk_norm norm[TK_MAX_STEPS];
  tk_pre pre[TK_MAX_STEPS];
  tk_dec dec[TK_MAX_STEPS];
  tk_post post[TK_MAX_STEPS];
  int n_norm, n_pre, n_dec, n_post, has_decoder;
  tk_added *added;
  int n_added;
  tk_matcher raw_m, norm_m;
  tk_re word_re;  /* \w, for single_word */
  int bytelevel;  /* the last pre-tokenizer step is ByteLevel: pieces reach the model as raw bytes */
  int meta_split; /* the model's words may be cut before each run of ▁ (see model_sink) */
  uint32_t vocab_size;
  /* decode: each id's string (an added token's first, then the model's) and whether it is special */
  char *dstr;
  size_t *doff, *dlen;
  uint8_t *special;
  /* scratch of encode */
  tk_buf nbuf, ntmp, pscr[TK_MAX_STEPS];
  tk_spans pspans[TK_MAX_STEPS];
  tk_segs segs, segs2;
  tk_ids cur, tmp;
  char desc[160];
};

uint32_t pw_tokenizer_vocab_size(const pw_tokenizer *tok) { return tok->vocab_size; }
const char *pw_tokenizer_describe(const pw_tokenizer *tok) { return tok->desc; }

int64_t pw_tokenizer_token_id(const pw_tokenizer *tok, const char *s) {
  size_t n = strlen(s);
  for (int i = 0; i < tok->n_added; i++)
    if (tok->added[i].content_n == n && !memcmp(tok->added[i].content, s, n)) return tok->added[i].id;
  return tk_bpe_lookup(&tok->bpe, s, n);
}

void pw_tokenizer_close(pw_tokenizer *tok) {
  if (!tok) return;
  tk_bpe_free(&tok->bpe);
  for (int i = 0; i < tok->n_norm; i++) tk_norm_free(&tok->norm[i]);
  for (int i = 0; i < tok->n_pre; i++) tk_pre_free(&tok->pre[i]);
  for (int i = 0; i < tok->n_dec; i++) tk_dec_free(&tok->dec[i]);
  for (int i = 0; i < tok->n_added; i++) free(tok->added[i].content), free(tok->added[i].match);
  free(tok->added);
  tk_matcher_free(&tok->raw_m);
  tk_matcher_free(&tok->norm_m);
  tk_re_free(&tok->word_re);
  free(tok->dstr), free(tok->doff), free(tok->dlen), free(tok->special);
  free(tok->nbuf.p), free(tok->ntmp.p), free(tok->segs.p), free(tok->segs2.p), free(tok->cur.p), free(tok->tmp.p);
  for (int i = 0; i < TK_MAX_STEPS; i++) free(tok->pscr[i].p), free(tok->pspans[i].p);
  free(tok);
}

/* ---- loading: added tokens ------------------------------------------------------------------- */

static int flag(json_t *o, const char *key, int dflt, const char *path, uint8_t *out, pw_err *err) {
  json_t *v = json_object_get(o, key);
  *out = (uint8_t)dflt;
  if (!v) return 0;
  if (!json_is_boolean(v)) return pw_err_set(err, PW_EFORMAT, path, "\"%s\" must be true or false", key);
  *out = (uint8_t)json_is_true(v);
  return 0;
}

/* added_vocabulary.rs add_tokens: an id is the model's when the content is
 * in its vocabulary, else the next one after the vocabulary's size, in
 * file order (the file's own "id" is only checked by tokenizers with a
 * warning: ours are the ones tokenizers uses). A content given twice keeps
 * its first id and takes the later flags. */
static int read_added(pw_tokenizer *tok, json_t *arr, uint32_t model_count, pw_err *err) {
  if (!arr || json_is_null(arr)) return 0;
  if (!json_is_array(arr)) return pw_err_set(err, PW_EFORMAT, "added_tokens", "must be an array");
  size_t n = json_array_size(arr);
  if (n > TK_MAX_ADDED) return pw_err_set(err, PW_ETOOBIG, "added_tokens", "%zu tokens (at most %d)", n, TK_MAX_ADDED);
  if (!(tok->added = calloc(n + 1, sizeof *tok->added))) return pw_err_set(err, PW_ENOMEM, "added_tokens", "out of memory");
  uint32_t next = model_count;
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(arr, i), *c = json_object_get(o, "content");
    char path[64];
    snprintf(path, sizeof path, "added_tokens[%zu]", i);
    if (!json_is_object(o) || !json_is_string(c)) return pw_err_set(err, PW_EFORMAT, path, "needs a string \"content\"");
    size_t cn = json_string_length(c);
    if (cn > TK_MAX_TOKEN) return pw_err_set(err, PW_ETOOBIG, path, "content longer than %d bytes", TK_MAX_TOKEN);
    if (!cn) continue;
    tk_added t = {0};
    int rc;
    if ((rc = flag(o, "special", 0, path, &t.special, err)) || (rc = flag(o, "normalized", !t.special, path, &t.normalized, err)) ||
        (rc = flag(o, "lstrip", 0, path, &t.lstrip, err)) || (rc = flag(o, "rstrip", 0, path, &t.rstrip, err)) ||
        (rc = flag(o, "single_word", 0, path, &t.single_word, err)))
      return rc;
    tk_added *same = NULL;
    for (int k = 0; k < tok->n_added; k++)
      if (tok->added[k].content_n == cn && !memcmp(tok->added[k].content, json_string_value(c), cn)) same = &tok->added[k];
    if (same) {
      t.id = same->id, t.content = same->content, t.content_n = cn;
      *same = t;
      continue;
    }
    int64_t mid = tk_bpe_lookup(&tok->bpe, json_string_value(c), cn);
    if (mid < 0 && next >= PW_TOKENIZER_MAX_VOCAB)
      return pw_err_set(err, PW_ETOOBIG, path, "ids past %d", PW_TOKENIZER_MAX_VOCAB);
    t.id = mid >= 0 ? (uint32_t)mid : next++;
    if (!(t.content = malloc(cn + 1))) return pw_err_set(err, PW_ENOMEM, path, "out of memory");
    memcpy(t.content, json_string_value(c), cn + 1);
    t.content_n = cn;
    tok->added[tok->n_added++] = t;
  }
  /* what each is matched as: a normalized token by its normalized form */
  for (int k = 0; k < tok->n_added; k++) {
    tk_added *t = &tok->added[k];
    const char *m = t->content;
    size_t mn = t->content_n;
    if (t->normalized && tok->n_norm) {
      int rc = tk_normalize(tok->norm, tok->n_norm, t->content, t->content_n, &tok->nbuf, &tok->ntmp, err);
      if (rc) return rc;
      m = tok->nbuf.p, mn = tok->nbuf.n;
    }
    if (!(t->match = malloc(mn + 1))) return pw_err_set(err, PW_ENOMEM, "added_tokens", "out of memory");
    memcpy(t->match, m ? m : "", mn);
    t->match[mn] = 0;
    t->match_n = mn;
  }
  return 0;
}

/* ---- loading: the post-processor ------------------------------------------------------------- */

static int pair_id(json_t *o, const char *key, const char *path, int32_t *id, pw_err *err) {
  json_t *p = json_object_get(o, key);
  if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_integer(json_array_get(p, 1)) ||
      json_integer_value(json_array_get(p, 1)) < 0 || json_integer_value(json_array_get(p, 1)) >= PW_TOKENIZER_MAX_VOCAB)
    return pw_err_set(err, PW_EFORMAT, path, "\"%s\" must be [token, id]", key);
  *id = (int32_t)json_integer_value(json_array_get(p, 1));
  return 0;
}

static int template_item(json_t *it, json_t *specials, const char *path, tk_post *t, pw_err *err) {
  json_t *sq = json_object_get(it, "Sequence"), *st = json_object_get(it, "SpecialToken");
  if (json_is_object(sq)) {
    json_t *id = json_object_get(sq, "id");
    if (!json_is_string(id) || strcmp(json_string_value(id), "A"))
      return pw_err_set(err, PW_ENOTSUP, path, "the single-sequence template may only hold sequence A");
    if (t->n >= TK_MAX_TEMPLATE) return pw_err_set(err, PW_ETOOBIG, path, "template longer than %d ids", TK_MAX_TEMPLATE);
    t->items[t->n++] = POST_SEQ;
    return 0;
  }
  json_t *name = json_is_object(st) ? json_object_get(st, "id") : NULL;
  if (!json_is_string(name)) return pw_err_set(err, PW_EFORMAT, path, "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
  json_t *sp = json_object_get(specials, json_string_value(name)), *ids = json_object_get(sp, "ids");
  if (!json_is_array(ids))
    return pw_err_set(err, PW_EFORMAT, path, "special token \"%.60s\" is not in special_tokens", json_string_value(name));
  for (size_t i = 0; i < json_array_size(ids); i++) {
    json_t *v = json_array_get(ids, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= PW_TOKENIZER_MAX_VOCAB)
      return pw_err_set(err, PW_EFORMAT, path, "special token \"%.60s\": ids must be whole numbers in the vocabulary",
                        json_string_value(name));
    if (t->n >= TK_MAX_TEMPLATE) return pw_err_set(err, PW_ETOOBIG, path, "template longer than %d ids", TK_MAX_TEMPLATE);
    t->items[t->n++] = (int32_t)json_integer_value(v);
  }
  return 0;
}

static int read_post(pw_tokenizer *tok, json_t *o, const char *path, int depth, pw_err *err) {
  char sub[160];
  const char *type = "";
  int rc = tk_type_of(o, path, &type, err);
  if (rc) return rc;
  snprintf(sub, sizeof sub, "%s.type", path); /* where an unsupported type is named */
  if (!strcmp(type, "ByteLevel")) return 0; /* it only trims offsets: the ids are the same */
  if (!strcmp(type, "Sequence")) {
    json_t *a = json_object_get(o, "processors");
    if (!json_is_array(a) || depth > 4) return pw_err_set(err, PW_EFORMAT, path, "\"processors\" must be an array, nested at most 4 deep");
    for (size_t i = 0; i < json_array_size(a); i++) {
      snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
      if ((rc = read_post(tok, json_array_get(a, i), sub, depth + 1, err))) return rc;
    }
    return 0;
  }
  if (tok->n_post >= TK_MAX_STEPS) return pw_err_set(err, PW_ETOOBIG, path, "more than %d processors", TK_MAX_STEPS);
  tk_post *t = &tok->post[tok->n_post];
  t->n = 0;
  if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
    if ((rc = pair_id(o, "cls", path, &t->items[0], err)) || (rc = pair_id(o, "sep", path, &t->items[2], err))) return rc;
    t->items[1] = POST_SEQ, t->n = 3;
    tok->n_post++;
    return 0;
  }
  if (!strcmp(type, "TemplateProcessing")) {
    json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
    snprintf(sub, sizeof sub, "%s.single", path);
    if (!json_is_array(single)) return pw_err_set(err, PW_EFORMAT, sub, "must be an array");
    for (size_t i = 0; i < json_array_size(single); i++) {
      snprintf(sub, sizeof sub, "%s.single[%zu]", path, i);
      if ((rc = template_item(json_array_get(single, i), specials, sub, t, err))) return rc;
    }
    tok->n_post++;
    return 0;
  }
  return pw_err_set(err, PW_ENOTSUP, sub,
                    "%.60s is not supported (TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence are)", type);
}

/* ---- loading: the whole file ----------------------------------------------------------------- */

/* Whether no merge can cross the start of a run of ▁: true when ▁ is a
 * token (so never unk or bytes) and no token holds ▁ after another
 * character. Then a merged token holding a boundary X|▁ would be such a
 * token, so BPE on the pieces cut there equals BPE on the whole — and the
 * pieces hit the cache. SentencePiece-style vocabularies pass; on a text
 * with no pre-tokenizer (Llama-2, Gemma) it turns one word per text into
 * one per ▁-word. */
static int meta_split_ok(const tk_bpe *m) {
  if (m->ignore_merges || m->prefix || m->suffix || tk_bpe_lookup(m, "\xE2\x96\x81", 3) < 0) return 0;
  for (uint32_t id = 0; id < m->n_ids; id++) {
    if (m->len[id] == UINT32_MAX) continue;
    const char *s = m->arena + m->off[id];
    size_t n = m->len[id];
    for (const char *p = s; (p = memmem(p, n - (size_t)(p - s), "\xE2\x96\x81", 3)); p += 3)
      if (p > s && !(p - s >= 3 && !memcmp(p - 3, "\xE2\x96\x81", 3))) return 0;
  }
  return 1;
}

static int build_decode(pw_tokenizer *tok, pw_err *err) {
  uint32_t v = tok->bpe.n_ids;
  for (int i = 0; i < tok->n_added; i++)
    if (tok->added[i].id + 1 > v) v = tok->added[i].id + 1;
  tok->vocab_size = v;
  tok->doff = calloc((size_t)v + 1, sizeof *tok->doff);
  tok->dlen = malloc(((size_t)v + 1) * sizeof *tok->dlen);
  tok->special = calloc((size_t)v + 1, 1);
  if (!tok->doff || !tok->dlen || !tok->special) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  for (uint32_t i = 0; i < v; i++) tok->dlen[i] = SIZE_MAX;
  tk_buf b = {0};
  for (uint32_t i = 0; i < tok->bpe.n_ids; i++)
    if (tok->bpe.len[i] != UINT32_MAX) tok->doff[i] = 0, tok->dlen[i] = tok->bpe.len[i];
  if (tk_buf_reserve(&b, 1) || tk_buf_put(&b, tok->bpe.arena, tok->bpe.arena_n)) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  for (uint32_t i = 0; i < tok->bpe.n_ids; i++)
    if (tok->bpe.len[i] != UINT32_MAX) tok->doff[i] = tok->bpe.off[i];
  for (int i = 0; i < tok->n_added; i++) {
    /* decoding takes a normalized token's normalized form (added_vocabulary.rs simple_id_to_token) */
    tk_added *t = &tok->added[i];
    const char *s = t->normalized ? t->match : t->content;
    size_t n = t->normalized ? t->match_n : t->content_n;
    tok->doff[t->id] = b.n, tok->dlen[t->id] = n;
    if (tk_buf_put(&b, s, n)) return free(b.p), pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  }
  tok->dstr = b.p;
  /* skip_special_tokens drops a token whose string is a special token's
   * content: the model's token of that string (where no added token has its
   * id), and any added token whose decode string is one */
  uint32_t cap = 16, *set;
  while (cap < 2u * (uint32_t)tok->n_added + 2) cap <<= 1;
  uint8_t *is_added = calloc((size_t)v + 1, 1);
  if (!is_added || !(set = calloc(cap, sizeof *set))) return free(is_added), pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  for (int k = 0; k < tok->n_added; k++) is_added[tok->added[k].id] = 1;
  for (int k = 0; k < tok->n_added; k++) {
    const tk_added *t = &tok->added[k];
    if (!t->special) continue;
    int64_t mid = tk_bpe_lookup(&tok->bpe, t->content, t->content_n);
    if (mid >= 0 && !is_added[mid]) tok->special[mid] = 1;
    uint32_t i = (uint32_t)tk_hash(t->content, t->content_n) & (cap - 1);
    while (set[i]) i = (i + 1) & (cap - 1);
    set[i] = (uint32_t)k + 1;
  }
  for (int k = 0; k < tok->n_added; k++) {
    uint32_t id = tok->added[k].id;
    const char *s = tok->dstr + tok->doff[id];
    size_t n = tok->dlen[id];
    for (uint32_t i = (uint32_t)tk_hash(s, n) & (cap - 1); set[i]; i = (i + 1) & (cap - 1)) {
      const tk_added *t = &tok->added[set[i] - 1];
      if (t->content_n == n && !memcmp(t->content, s, n)) tok->special[id] = 1;
    }
  }
  free(set);
  free(is_added);
  return 0;
}

static int refuse_if_set(json_t *root, const char *key, pw_err *err) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return 0;
  if (!strcmp(key, "padding")) { /* one text is never padded by BatchLongest */
    json_t *s = json_object_get(v, "strategy"), *m = json_object_get(v, "pad_to_multiple_of");
    if (json_is_string(s) && !strcmp(json_string_value(s), "BatchLongest") && (!m || json_is_null(m))) return 0;
  }
  return pw_err_set(err, PW_ENOTSUP, key, "%s is not supported (it would change the ids): set it to null", key);
}

int pw_tokenizer_from_json(const char *json, size_t n, pw_tokenizer **out, pw_err *err) {
  *out = NULL;
  if (n > PW_TOKENIZER_MAX_FILE) return pw_err_set(err, PW_ETOOBIG, "tokenizer", "%zu bytes (at most %u)", n, PW_TOKENIZER_MAX_FILE);
  tk_map_init();
  json_error_t je;
  json_t *root = json_loadb(json, n, JSON_REJECT_DUPLICATES, &je);
  if (!root) return pw_err_set(err, PW_EJSON, "tokenizer", "line %d column %d: %s", je.line, je.column, je.text);
  pw_tokenizer *tok = calloc(1, sizeof *tok);
  int rc = tok ? 0 : pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  json_t *v, *model = json_object_get(root, "model");
  if (!rc && !json_is_object(root)) rc = pw_err_set(err, PW_EFORMAT, "tokenizer", "not a JSON object");
  if (!rc && (v = json_object_get(root, "version")) && !(json_is_string(v) && !strcmp(json_string_value(v), "1.0")))
    rc = pw_err_set(err, PW_ENOTSUP, "version", "only version \"1.0\" is read");
  if (!rc) rc = refuse_if_set(root, "truncation", err);
  if (!rc) rc = refuse_if_set(root, "padding", err);
  if (!rc && !json_is_object(model)) rc = pw_err_set(err, PW_EFORMAT, "model", "missing, or not an object");
  if (!rc) {
    json_t *t = json_object_get(model, "type");
    if (t && !json_is_string(t)) rc = pw_err_set(err, PW_EFORMAT, "model.type", "must be a string");
    else if (t && strcmp(json_string_value(t), "BPE"))
      rc = pw_err_set(err, PW_ENOTSUP, "model.type", "%.60s is not supported (BPE is)", json_string_value(t));
    else if (!t && !json_object_get(model, "merges")) /* tokenizers tells the models apart by their fields */
      rc = pw_err_set(err, PW_ENOTSUP, "model.type", "missing and no merges: not a BPE model");
  }
  if (!rc) rc = tk_bpe_init(&tok->bpe, model, err);
  if (!rc && (v = json_object_get(root, "normalizer")) && !json_is_null(v))
    rc = tk_norm_read(v, "normalizer", tok->norm, &tok->n_norm, 0, err);
  if (!rc && (v = json_object_get(root, "pre_tokenizer")) && !json_is_null(v))
    rc = tk_pre_read(v, "pre_tokenizer", tok->pre, &tok->n_pre, 0, err);
  if (!rc && (v = json_object_get(root, "decoder")) && !json_is_null(v))
    tok->has_decoder = 1, rc = tk_dec_read(v, "decoder", tok->dec, &tok->n_dec, 0, err);
  if (!rc && (v = json_object_get(root, "post_processor")) && !json_is_null(v)) rc = read_post(tok, v, "post_processor", 0, err);
  for (int i = 0; !rc && i < tok->n_pre; i++)
    if (tok->pre[i].kind == TK_BYTELEVEL && i != tok->n_pre - 1)
      rc = pw_err_set(err, PW_ENOTSUP, "pre_tokenizer", "ByteLevel followed by other steps is not supported: it must be last");
  if (!rc) rc = read_added(tok, json_object_get(root, "added_tokens"), (uint32_t)json_object_size(json_object_get(model, "vocab")), err);
  if (!rc) rc = tk_matcher_build(&tok->raw_m, tok->added, tok->n_added, 0, err);
  if (!rc) rc = tk_matcher_build(&tok->norm_m, tok->added, tok->n_added, 1, err);
  static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";
  if (!rc) rc = tk_re_compile(&tok->word_re, word, sizeof word - 1, 0, "tokenizer", err);
  if (!rc) rc = build_decode(tok, err);
  for (int i = 0; !rc && i < tok->n_post; i++)
    for (int k = 0; k < tok->post[i].n; k++)
      if (tok->post[i].items[k] != POST_SEQ && (uint32_t)tok->post[i].items[k] >= tok->vocab_size)
        rc = pw_err_set(err, PW_EFORMAT, "post_processor", "id %d is outside the vocabulary (%u ids)", tok->post[i].items[k],
                        tok->vocab_size);
  json_decref(root);
  if (rc) {
    pw_tokenizer_close(tok);
    return rc;
  }
  tok->bytelevel = tok->n_pre && tok->pre[tok->n_pre - 1].kind == TK_BYTELEVEL;
  if (tok->bytelevel) tk_bpe_bytelevel_prepare(&tok->bpe);
  else tok->meta_split = meta_split_ok(&tok->bpe);
  int n_special = 0;
  for (int i = 0; i < tok->n_added; i++) n_special += tok->added[i].special;
  snprintf(tok->desc, sizeof tok->desc, "BPE%s, %u ids, %d added tokens (%d special)",
           tok->bytelevel ? ", byte-level" : tok->bpe.byte_fallback ? ", byte fallback" : "", tok->vocab_size, tok->n_added,
           n_special);
  *out = tok;
  return 0;
}

int pw_tokenizer_open(const char *path, pw_tokenizer **out, pw_err *err) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return pw_err_set(err, errno == ENOENT ? PW_ENOENT : PW_EIO, path, "cannot open: %s", strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
    fclose(f);
    return pw_err_set(err, PW_EIO, path, "not a regular file");
  }
  if ((unsigned long long)st.st_size > PW_TOKENIZER_MAX_FILE) {
    fclose(f);
    return pw_err_set(err, PW_ETOOBIG, path, "%lld bytes (a tokenizer.json is at most %u)", (long long)st.st_size,
                      PW_TOKENIZER_MAX_FILE);
  }
  size_t n = (size_t)st.st_size;
  char *buf = malloc(n + 1);
  if (!buf) return fclose(f), pw_err_set(err, PW_ENOMEM, path, "out of memory");
  size_t got = fread(buf, 1, n, f);
  int bad = ferror(f) || got != n;
  fclose(f);
  if (bad) return free(buf), pw_err_set(err, PW_EIO, path, "cannot read: %s", got != n ? "file shrank" : strerror(errno));
  int rc = pw_tokenizer_from_json(buf, n, out, err);
  free(buf);
  if (rc && err && err->path[0] && strcmp(err->path, path)) { /* "FILE: model.type: ..." */
    char p[2 * sizeof err->path + 4];
    snprintf(p, sizeof p, "%s: %s", path, err->path);
    p[sizeof err->path - 1] = 0; /* cut to fit */
    memcpy(err->path, p, sizeof err->path);
  }
  return rc;
}

/* ---- encoding ----------------------------------------------------------------------------------- */

static int model_sink(void *ctx, const char *s, size_t n, pw_err *err) {
  pw_tokenizer *tok = ctx;
  if (tok->bytelevel) return tk_bpe_word_bytes(&tok->bpe, s, n, &tok->cur, err);
  if (!tok->meta_split) return tk_bpe_word(&tok->bpe, s, n, &tok->cur, err);
  size_t a = 0;
  for (const char *p = s; (p = memmem(p, n - (size_t)(p - s), "\xE2\x96\x81", 3)); p += 3) {
    size_t i = (size_t)(p - s); /* cut before each ▁ that follows another character */
    if (i > a && !(i >= 3 && !memcmp(s + i - 3, "\xE2\x96\x81", 3))) {
      int rc = tk_bpe_word(&tok->bpe, s + a, i - a, &tok->cur, err);
      if (rc) return rc;
      a = i;
    }
  }
  return tk_bpe_word(&tok->bpe, s + a, n - a, &tok->cur, err);
}

/* One piece of text between added tokens: normalized, its normalized added
 * tokens split out, the rest pre-tokenized into the model. */
static int encode_text(pw_tokenizer *tok, const char *s, size_t n, int orig0, pw_err *err) {
  int rc;
  if (tok->n_norm) {
    if ((rc = tk_normalize(tok->norm, tok->n_norm, s, n, &tok->nbuf, &tok->ntmp, err))) return rc;
    s = tok->nbuf.p, n = tok->nbuf.n;
  }
  tok->segs2.n = 0;
  if ((rc = tk_matcher_split(&tok->norm_m, tok->added, &tok->word_re, s, n, &tok->segs2, err))) return rc;
  for (size_t i = 0; i < tok->segs2.n; i++) {
    tk_seg g = tok->segs2.p[i];
    if (g.id >= 0) rc = tk_ids_push(&tok->cur, (uint32_t)g.id) ? pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory") : 0;
    else
      rc = tk_pretokenize(tok->pre, tok->n_pre, 0, s + g.s, g.e - g.s, orig0 && g.s == 0, tok->pscr, tok->pspans,
                          model_sink, tok, err);
    if (rc) return rc;
  }
  return 0;
}

int pw_tokenizer_encode(pw_tokenizer *tok, const char *text, size_t n, int flags, pw_tok_ids *ids, pw_err *err) {
  if (n > PW_TOKENIZER_MAX_TEXT)
    return pw_err_set(err, PW_ETOOBIG, "text", "%zu bytes (at most %u at once)", n, PW_TOKENIZER_MAX_TEXT);
  size_t bad = tk_u8check(text, n);
  if (bad < n) return pw_err_set(err, PW_EFORMAT, "text", "not UTF-8: byte %zu (0x%02X)", bad, (unsigned char)text[bad]);
  tok->cur.n = 0;
  tok->segs.n = 0;
  int rc = tk_matcher_split(&tok->raw_m, tok->added, &tok->word_re, text, n, &tok->segs, err);
  for (size_t i = 0; !rc && i < tok->segs.n; i++) {
    tk_seg g = tok->segs.p[i];
    if (g.id >= 0) rc = tk_ids_push(&tok->cur, (uint32_t)g.id) ? pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory") : 0;
    else rc = encode_text(tok, text + g.s, g.e - g.s, g.s == 0, err);
  }
  for (int p = 0; !rc && (flags & PW_TOK_ADD_SPECIAL) && p < tok->n_post; p++) {
    tok->tmp.n = 0;
    for (int k = 0; !rc && k < tok->post[p].n; k++) {
      int32_t it = tok->post[p].items[k];
      if (it != POST_SEQ) rc = tk_ids_push(&tok->tmp, (uint32_t)it);
      else if (tok->cur.n && !(rc = tk_ids_reserve(&tok->tmp, tok->cur.n)))
        memcpy(tok->tmp.p + tok->tmp.n, tok->cur.p, tok->cur.n * sizeof(uint32_t)), tok->tmp.n += tok->cur.n;
    }
    if (rc) rc = pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
    tk_ids x = tok->cur;
    tok->cur = tok->tmp, tok->tmp = x;
  }
  if (rc) return rc;
  if (ids->cap - ids->n < tok->cur.n) {
    size_t cap = ids->n + tok->cur.n + (ids->n + tok->cur.n) / 2 + 16;
    uint32_t *v = realloc(ids->v, cap * sizeof *v);
    if (!v) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
    ids->v = v, ids->cap = cap;
  }
  if (tok->cur.n) memcpy(ids->v + ids->n, tok->cur.p, tok->cur.n * sizeof(uint32_t));
  ids->n += tok->cur.n;
  return 0;
}

/* ---- decoding ------------------------------------------------------------------------------------ */

int pw_tokenizer_decode(pw_tokenizer *tok, const uint32_t *ids, size_t n, int flags, char **out, size_t *out_n,
                        pw_err *err) {
  *out = NULL, *out_n = 0;
  size_t *off = malloc((n + 1) * sizeof *off), *len = malloc((n + 1) * sizeof *len), k = 0;
  if (!off || !len) return free(off), free(len), pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t id = ids[i];
    if (id >= tok->vocab_size || tok->dlen[id] == SIZE_MAX) {
      rc = pw_err_set(err, PW_EFORMAT, "ids", "id %u (at %zu) is no token of this tokenizer (%u ids)", id, i, tok->vocab_size);
      break;
    }
    if ((flags & PW_TOK_SKIP_SPECIAL) && tok->special[id]) continue;
    off[k] = tok->doff[id], len[k] = tok->dlen[id], k++;
  }
  tk_buf b = {0};
  if (!rc && tok->has_decoder) rc = tk_decode_chain(tok->dec, tok->n_dec, tok->dstr, off, len, k, &b, err);
  for (size_t i = 0; !rc && !tok->has_decoder && i < k; i++) /* no decoder: the tokens joined by spaces */
    if ((i && tk_buf_put(&b, " ", 1)) || tk_buf_put(&b, tok->dstr + off[i], len[i]))
      rc = pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  if (!rc && tk_buf_put(&b, "", 1)) rc = pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  free(off), free(len);
  if (rc) return free(b.p), rc;
  *out = b.p, *out_n = b.n - 1;
  return 0;
}
