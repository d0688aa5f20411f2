/* tok_pre: normalizers and pre-tokenizers of a tokenizer.json — read from
 * the file (a Sequence flattened into its steps) and run as tokenizers runs
 * them (the normalizers/ and pre_tokenizers/ folders, tokenizer/normalizer.rs
 * split). Pre-tokenizing streams: each step hands its pieces straight to
 * the next, the last step to the model, so no list of a whole text's
 * pieces is ever built. Byte-level pieces stay raw bytes: the model maps
 * them (tok_bpe.c), which is why ByteLevel must be the last step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok_int.h"

/* GPT-2's pre-tokenizer pattern (ByteLevel with use_regex). */
static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- reading ------------------------------------------------------------------------------- */

static int jstr(json_t *o, const char *key, const char *path, char **out, size_t *n, int required, pw_err *err) {
  json_t *v = json_object_get(o, key);
  *out = NULL, *n = 0;
  if (!v || json_is_null(v)) return required ? pw_err_set(err, PW_EFORMAT, path, "\"%s\" is missing", key) : 0;
  if (!json_is_string(v)) return pw_err_set(err, PW_EFORMAT, path, "\"%s\" must be a string", key);
  *n = json_string_length(v);
  if (*n > TK_MAX_PATTERN) return pw_err_set(err, PW_ETOOBIG, path, "\"%s\" longer than %d bytes", key, TK_MAX_PATTERN);
  if (!(*out = malloc(*n + 1))) return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  memcpy(*out, json_string_value(v), *n + 1);
  return 0;
}

static int jbool(json_t *o, const char *key, const char *path, int dflt, int *out, pw_err *err) {
  json_t *v = json_object_get(o, key);
  *out = dflt;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return pw_err_set(err, PW_EFORMAT, path, "\"%s\" must be true or false", key);
  *out = json_is_true(v);
  return 0;
}

/* {"String": s} (literal) or {"Regex": r}. */
int tk_pattern_read(json_t *o, const char *path, tk_re *re, char **lit, size_t *lit_n, pw_err *err) {
  json_t *p = json_object_get(o, "pattern");
  char sub[160];
  snprintf(sub, sizeof sub, "%s.pattern", path);
  json_t *s = json_is_object(p) ? json_object_get(p, "String") : NULL, *r = json_is_object(p) ? json_object_get(p, "Regex") : NULL;
  if (!json_is_object(p) || json_object_size(p) != 1 || !(json_is_string(s) || json_is_string(r)))
    return pw_err_set(err, PW_EFORMAT, sub, "must be {\"String\": ...} or {\"Regex\": ...}");
  json_t *v = s ? s : r;
  size_t n = json_string_length(v);
  if (lit && s) { /* a plain string is matched with memmem: faster than any regex */
    if (n == 0) return pw_err_set(err, PW_EFORMAT, sub, "empty pattern");
    if (n > TK_MAX_PATTERN) return pw_err_set(err, PW_ETOOBIG, sub, "pattern of %zu bytes (at most %d)", n, TK_MAX_PATTERN);
    if (!(*lit = malloc(n + 1))) return pw_err_set(err, PW_ENOMEM, sub, "out of memory");
    memcpy(*lit, json_string_value(v), n + 1);
    *lit_n = n;
    return 0;
  }
  return tk_re_compile(re, json_string_value(v), n, s != NULL, sub, err);
}

int tk_norm_read(json_t *o, const char *path, tk_norm *steps, int *n, int depth, pw_err *err) {
  const char *type = "";
  int rc = tk_type_of(o, path, &type, err);
  if (rc) return rc;
  if (!strcmp(type, "Sequence")) {
    char sub[160];
    snprintf(sub, sizeof sub, "%s.normalizers", path);
    json_t *a = json_object_get(o, "normalizers");
    if (!json_is_array(a)) return pw_err_set(err, PW_EFORMAT, sub, "must be an array");
    if (depth > 4) return pw_err_set(err, PW_ETOOBIG, path, "Sequences nested more than 4 deep");
    for (size_t i = 0; i < json_array_size(a); i++) {
      snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
      if ((rc = tk_norm_read(json_array_get(a, i), sub, steps, n, depth + 1, err))) return rc;
    }
    return 0;
  }
  if (*n >= TK_MAX_STEPS) return pw_err_set(err, PW_ETOOBIG, path, "more than %d normalizer steps", TK_MAX_STEPS);
  tk_norm *t = &steps[*n];
  memset(t, 0, sizeof *t);
  static const char *forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
  for (int k = 0; k < 4; k++)
    if (!strcmp(type, forms[k])) return t->kind = k, (*n)++, 0;
  if (!strcmp(type, "Prepend")) {
    t->kind = TK_PREPEND;
    (*n)++;
    return jstr(o, "prepend", path, &t->s, &t->s_n, 1, err);
  }
  if (!strcmp(type, "Replace")) {
    t->kind = TK_REPLACE;
    (*n)++;
    if ((rc = jstr(o, "content", path, &t->s, &t->s_n, 1, err))) return rc;
    return tk_pattern_read(o, path, &t->re, &t->lit, &t->lit_n, err);
  }
  char sub[160];
  snprintf(sub, sizeof sub, "%s.type", path);
  return pw_err_set(err, PW_ENOTSUP, sub, "%.60s is not supported (NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence are)", type);
}

static int behavior_of(json_t *o, const char *path, int *out, pw_err *err) {
  static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
  json_t *b = json_object_get(o, "behavior");
  for (int k = 0; k < 5; k++)
    if (json_is_string(b) && !strcmp(json_string_value(b), names[k])) return *out = k, 0;
  char sub[160];
  snprintf(sub, sizeof sub, "%s.behavior", path);
  return pw_err_set(err, json_is_string(b) ? PW_ENOTSUP : PW_EFORMAT, sub,
                    "must be Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous");
}

int tk_pre_read(json_t *o, const char *path, tk_pre *steps, int *n, int depth, pw_err *err) {
  const char *type = "";
  int rc = tk_type_of(o, path, &type, err);
  if (rc) return rc;
  char sub[160];
  if (!strcmp(type, "Sequence")) {
    snprintf(sub, sizeof sub, "%s.pretokenizers", path);
    json_t *a = json_object_get(o, "pretokenizers");
    if (!json_is_array(a)) return pw_err_set(err, PW_EFORMAT, sub, "must be an array");
    if (depth > 4) return pw_err_set(err, PW_ETOOBIG, path, "Sequences nested more than 4 deep");
    for (size_t i = 0; i < json_array_size(a); i++) {
      snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
      if ((rc = tk_pre_read(json_array_get(a, i), sub, steps, n, depth + 1, err))) return rc;
    }
    return 0;
  }
  if (*n >= TK_MAX_STEPS) return pw_err_set(err, PW_ETOOBIG, path, "more than %d pre-tokenizer steps", TK_MAX_STEPS);
  tk_pre *t = &steps[*n];
  memset(t, 0, sizeof *t);
  if (!strcmp(type, "ByteLevel")) {
    t->kind = TK_BYTELEVEL;
    (*n)++;
    if ((rc = jbool(o, "add_prefix_space", path, 1, &t->add_prefix_space, err)) ||
        (rc = jbool(o, "use_regex", path, 1, &t->use_regex, err)))
      return rc;
    return t->use_regex ? tk_re_compile(&t->re, gpt2_pattern, sizeof gpt2_pattern - 1, 0, path, err) : 0;
  }
  if (!strcmp(type, "Split")) {
    t->kind = TK_SPLIT;
    (*n)++;
    if ((rc = behavior_of(o, path, &t->behavior, err)) || (rc = jbool(o, "invert", path, 0, &t->invert, err)))
      return rc;
    return tk_pattern_read(o, path, &t->re, NULL, NULL, err);
  }
  if (!strcmp(type, "Metaspace")) {
    t->kind = TK_METASPACE;
    (*n)++;
    json_t *r = json_object_get(o, "replacement"), *ps = json_object_get(o, "prepend_scheme");
    int l = 0;
    if (json_is_string(r) && json_string_length(r)) tk_u8dec(json_string_value(r), json_string_length(r), &l);
    if (!json_is_string(r) || !l || (size_t)l != json_string_length(r)) {
      snprintf(sub, sizeof sub, "%s.replacement", path);
      return pw_err_set(err, PW_EFORMAT, sub, "must be one character");
    }
    memcpy(t->repl, json_string_value(r), (size_t)l);
    t->repl_n = l;
    t->prepend = TK_PREPEND_ALWAYS;
    if (ps && !json_is_null(ps)) {
      const char *v = json_is_string(ps) ? json_string_value(ps) : "";
      t->prepend = !strcmp(v, "first") ? TK_PREPEND_FIRST : !strcmp(v, "never") ? TK_PREPEND_NEVER : !strcmp(v, "always") ? TK_PREPEND_ALWAYS : -1;
      snprintf(sub, sizeof sub, "%s.prepend_scheme", path);
      if (t->prepend < 0) return pw_err_set(err, PW_EFORMAT, sub, "must be \"first\", \"never\" or \"always\"");
    }
    json_t *aps = json_object_get(o, "add_prefix_space"); /* the older files' form */
    if (json_is_false(aps)) {
      if (t->prepend != TK_PREPEND_NEVER && ps && !json_is_null(ps))
        return pw_err_set(err, PW_EFORMAT, path, "add_prefix_space false does not match prepend_scheme");
      t->prepend = TK_PREPEND_NEVER;
    }
    return jbool(o, "split", path, 1, &t->split, err);
  }
  snprintf(sub, sizeof sub, "%s.type", path);
  return pw_err_set(err, PW_ENOTSUP, sub, "%.60s is not supported (ByteLevel, Split, Metaspace, Sequence are)", type);
}

void tk_norm_free(tk_norm *t) {
  free(t->s);
  free(t->lit);
  tk_re_free(&t->re);
}

void tk_pre_free(tk_pre *t) { tk_re_free(&t->re); }

/* ---- normalizing ------------------------------------------------------------------------------ */

static int oom(pw_err *err) { return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory"); }

/* Below U+0300 every character is already NFC and none combines: the
 * common case skips utf8proc. NFD and the compatibility forms only for ASCII. */
static int form_is_identity(int kind, const char *s, size_t n) {
  unsigned char lim = kind == TK_NFC ? 0xCC : 0x80;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] >= lim) return 0;
  return 1;
}

static int replace_all(const tk_norm *t, const char *s, size_t n, tk_buf *out, pw_err *err) {
  if (t->lit) {
    size_t i = 0;
    for (;;) {
      const char *hit = n - i >= t->lit_n ? memmem(s + i, n - i, t->lit, t->lit_n) : NULL;
      size_t j = hit ? (size_t)(hit - s) : n;
      if (tk_buf_put(out, s + i, j - i)) return oom(err);
      if (!hit) return 0;
      if (tk_buf_put(out, t->s, t->s_n)) return oom(err);
      i = j + t->lit_n;
    }
  }
  tk_spans sp = {0};
  int rc = tk_re_spans((tk_re *)&t->re, s, n, &sp, err);
  for (size_t k = 0; !rc && k < sp.n; k++)
    if (tk_buf_put(out, sp.p[k].match ? t->s : s + sp.p[k].s, sp.p[k].match ? t->s_n : sp.p[k].e - sp.p[k].s)) rc = oom(err);
  free(sp.p);
  return rc;
}

int tk_normalize(const tk_norm *steps, int n_steps, const char *s, size_t n, tk_buf *out, tk_buf *tmp, pw_err *err) {
  out->n = 0;
  if (tk_buf_put(out, s, n)) return oom(err);
  for (int k = 0; k < n_steps; k++) {
    const tk_norm *t = &steps[k];
    tmp->n = 0;
    if (t->kind <= TK_NFKD) {
      if (form_is_identity(t->kind, out->p, out->n)) continue;
      static const int opts[] = {UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE, UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                                 UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
      utf8proc_uint8_t *dst = NULL;
      utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)out->p, (utf8proc_ssize_t)out->n, &dst,
                                        (utf8proc_option_t)(UTF8PROC_STABLE | opts[t->kind]));
      if (r < 0) return free(dst), pw_err_set(err, r == UTF8PROC_ERROR_NOMEM ? PW_ENOMEM : PW_EFORMAT, "text", "normalization failed: %s", utf8proc_errmsg(r));
      int bad = tk_buf_put(tmp, dst, (size_t)r);
      free(dst);
      if (bad) return oom(err);
    } else if (t->kind == TK_PREPEND) {
      if (!out->n) continue;
      if (tk_buf_put(tmp, t->s, t->s_n) || tk_buf_put(tmp, out->p, out->n)) return oom(err);
    } else {
      int rc = replace_all(t, out->p, out->n, tmp, err);
      if (rc) return rc;
    }
    tk_buf x = *out;
    *out = *tmp;
    *tmp = x;
  }
  return 0;
}

/* ---- pre-tokenizing --------------------------------------------------------------------------- */

/* tokenizer/normalizer.rs split: the spans of one piece made into pieces by
 * the behavior (in place); Removed drops the matches. */
static size_t apply_behavior(tk_span *p, size_t n, int behavior) {
  size_t k = 0;
  int prev = 0;
  switch (behavior) {
  case TK_ISOLATED:
    return n;
  case TK_REMOVED:
    for (size_t i = 0; i < n; i++)
      if (!p[i].match) p[k++] = p[i];
    return k;
  case TK_CONTIGUOUS:
  case TK_MERGED_PREV:
    for (size_t i = 0; i < n; i++) {
      int m = p[i].match;
      int join = behavior == TK_CONTIGUOUS ? m == prev : m && !prev;
      if (join && k) p[k - 1].e = p[i].e;
      else p[k++] = p[i];
      prev = m;
    }
    return k;
  default: /* MergedWithNext: the same fold from the right */
    for (size_t i = n; i-- > 0;) {
      int m = p[i].match;
      if (m && !prev && k) p[n - k].s = p[i].s;
      else p[n - 1 - k++] = p[i];
      prev = m;
    }
    memmove(p, p + n - k, k * sizeof *p);
    return k;
  }
}

/* A char pattern's spans (Metaspace's split on its replacement). */
static int char_spans(const char *s, size_t n, const char *c, size_t cn, tk_spans *o) {
  size_t prev = 0, i = 0;
  while (i < n) {
    const char *hit = n - i >= cn ? memmem(s + i, n - i, c, cn) : NULL;
    if (!hit) break;
    size_t j = (size_t)(hit - s);
    if (o->n + 2 > o->cap) {
      size_t cap = o->cap ? o->cap * 2 : 64;
      while (cap < o->n + 2) cap *= 2;
      tk_span *p = realloc(o->p, cap * sizeof *p);
      if (!p) return PW_ENOMEM;
      o->p = p, o->cap = cap;
    }
    if (prev < j) o->p[o->n++] = (tk_span){prev, j, 0};
    o->p[o->n++] = (tk_span){j, j + cn, 1};
    prev = i = j + cn;
  }
  if (prev < n) {
    if (o->n == o->cap) {
      size_t cap = o->cap ? o->cap * 2 : 64;
      tk_span *p = realloc(o->p, cap * sizeof *p);
      if (!p) return PW_ENOMEM;
      o->p = p, o->cap = cap;
    }
    o->p[o->n++] = (tk_span){prev, n, 0};
  }
  return 0;
}

int tk_pretokenize(tk_pre *steps, int n_steps, int d, const char *s, size_t n, int orig0, tk_buf *scratch,
                   tk_spans *spans, tk_sink sink, void *ctx, pw_err *err) {
  if (!n) return 0; /* empty pieces are dropped */
  if (d == n_steps) return sink(ctx, s, n, err);
  tk_pre *t = &steps[d];
  tk_spans *sp = &spans[d];
  tk_buf *b = &scratch[d];
  int rc = 0;
  sp->n = 0;
  if (t->kind == TK_METASPACE) {
    b->n = 0;
    int pre = t->prepend == TK_PREPEND_ALWAYS || (t->prepend == TK_PREPEND_FIRST && orig0);
    if (pre && (n < (size_t)t->repl_n || memcmp(s, t->repl, (size_t)t->repl_n)) && !(s[0] == ' ')) {
      if (tk_buf_put(b, t->repl, (size_t)t->repl_n)) return oom(err);
    }
    for (size_t i = 0; i < n; i++) {
      size_t j = i;
      while (j < n && s[j] != ' ') j++;
      if (tk_buf_put(b, s + i, j - i) || (j < n && tk_buf_put(b, t->repl, (size_t)t->repl_n))) return oom(err);
      i = j;
    }
    s = b->p, n = b->n;
    if (!t->split) return tk_pretokenize(steps, n_steps, d + 1, s, n, orig0, scratch, spans, sink, ctx, err);
    if (char_spans(s, n, t->repl, (size_t)t->repl_n, sp)) return oom(err);
    sp->n = apply_behavior(sp->p, sp->n, TK_MERGED_NEXT);
  } else {
    if (t->kind == TK_BYTELEVEL && t->add_prefix_space && s[0] != ' ') {
      b->n = 0;
      if (tk_buf_put(b, " ", 1) || tk_buf_put(b, s, n)) return oom(err);
      s = b->p, n = b->n;
    }
    if (t->kind == TK_BYTELEVEL && !t->use_regex)
      return tk_pretokenize(steps, n_steps, d + 1, s, n, orig0, scratch, spans, sink, ctx, err);
    if ((rc = tk_re_spans(&t->re, s, n, sp, err))) return rc;
    if (t->invert)
      for (size_t i = 0; i < sp->n; i++) sp->p[i].match = !sp->p[i].match;
    sp->n = apply_behavior(sp->p, sp->n, t->kind == TK_BYTELEVEL ? TK_ISOLATED : t->behavior);
  }
  /* spans[d] stays ours while the deeper steps run: each depth has its own */
  for (size_t i = 0; !rc && i < sp->n; i++) {
    tk_span x = sp->p[i];
    rc = tk_pretokenize(steps, n_steps, d + 1, s + x.s, x.e - x.s, orig0 && x.s == 0, scratch, spans, sink, ctx, err);
  }
  return rc;
}
