/* tok_decode: the decoders of a tokenizer.json, read from the file and run
 * as tokenizers' decode_chain runs them (the decoders/ folder): each step turns
 * the list of token strings into a new list; the result is the last list
 * joined. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_int.h"

/* ---- reading ------------------------------------------------------------------------------- */

static int one_char(json_t *o, const char *key, const char *path, uint32_t *out, pw_err *err) {
  json_t *v = json_object_get(o, key);
  int l = 0;
  if (json_is_string(v) && json_string_length(v)) *out = tk_u8dec(json_string_value(v), json_string_length(v), &l);
  if (!json_is_string(v) || !l || (size_t)l != json_string_length(v)) {
    char sub[160];
    snprintf(sub, sizeof sub, "%s.%s", path, key);
    return pw_err_set(err, PW_EFORMAT, sub, "must be one character");
  }
  return 0;
}

static int small_int(json_t *o, const char *key, const char *path, int *out, pw_err *err) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 20) {
    char sub[160];
    snprintf(sub, sizeof sub, "%s.%s", path, key);
    return pw_err_set(err, PW_EFORMAT, sub, "must be a whole number in 0..%d", 1 << 20);
  }
  *out = (int)json_integer_value(v);
  return 0;
}

int tk_dec_read(json_t *o, const char *path, tk_dec *steps, int *n, int depth, pw_err *err) {
  char sub[160];
  const char *type = "";
  int rc = tk_type_of(o, path, &type, err);
  if (rc) return rc;
  snprintf(sub, sizeof sub, "%s.type", path); /* where an unsupported type is named */
  if (!strcmp(type, "Sequence")) {
    json_t *a = json_object_get(o, "decoders");
    snprintf(sub, sizeof sub, "%s.decoders", path);
    if (!json_is_array(a)) return pw_err_set(err, PW_EFORMAT, sub, "must be an array");
    if (depth > 4) return pw_err_set(err, PW_ETOOBIG, path, "Sequences nested more than 4 deep");
    for (size_t i = 0; i < json_array_size(a); i++) {
      snprintf(sub, sizeof sub, "%s.decoders[%zu]", path, i);
      if ((rc = tk_dec_read(json_array_get(a, i), sub, steps, n, depth + 1, err))) return rc;
    }
    return 0;
  }
  if (*n >= TK_MAX_STEPS) return pw_err_set(err, PW_ETOOBIG, path, "more than %d decoder steps", TK_MAX_STEPS);
  tk_dec *t = &steps[*n];
  memset(t, 0, sizeof *t);
  if (!strcmp(type, "ByteLevel")) return t->kind = TK_DEC_BYTELEVEL, (*n)++, 0;
  if (!strcmp(type, "ByteFallback")) return t->kind = TK_DEC_BYTEFALLBACK, (*n)++, 0;
  if (!strcmp(type, "Fuse")) return t->kind = TK_DEC_FUSE, (*n)++, 0;
  if (!strcmp(type, "Strip")) {
    t->kind = TK_DEC_STRIP;
    (*n)++;
    if ((rc = one_char(o, "content", path, &t->ch, err)) || (rc = small_int(o, "start", path, &t->start, err))) return rc;
    return small_int(o, "stop", path, &t->stop, err);
  }
  if (!strcmp(type, "Metaspace")) {
    t->kind = TK_DEC_METASPACE;
    (*n)++;
    if ((rc = one_char(o, "replacement", path, &t->ch, err))) return rc;
    json_t *ps = json_object_get(o, "prepend_scheme"), *aps = json_object_get(o, "add_prefix_space");
    t->prepend = 1;
    if (json_is_string(ps)) t->prepend = strcmp(json_string_value(ps), "never") != 0;
    if (json_is_false(aps)) t->prepend = 0;
    return 0;
  }
  if (!strcmp(type, "Replace")) {
    t->kind = TK_DEC_REPLACE;
    (*n)++;
    json_t *c = json_object_get(o, "content");
    snprintf(sub, sizeof sub, "%s.content", path);
    if (!json_is_string(c) || json_string_length(c) > TK_MAX_PATTERN) return pw_err_set(err, PW_EFORMAT, sub, "must be a string");
    t->content_n = json_string_length(c);
    if (!(t->content = malloc(t->content_n + 1))) return pw_err_set(err, PW_ENOMEM, sub, "out of memory");
    memcpy(t->content, json_string_value(c), t->content_n + 1);
    return tk_pattern_read(o, path, &t->re, &t->lit, &t->lit_n, err);
  }
  return pw_err_set(err, PW_ENOTSUP, sub,
                    "%.60s is not supported (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence are)", type);
}

void tk_dec_free(tk_dec *t) {
  free(t->lit);
  free(t->content);
  tk_re_free(&t->re);
}

/* ---- running ------------------------------------------------------------------------------ */

typedef struct {
  tk_buf b;
  size_t *off, *len, n, cap;
} toks;

static int toks_add(toks *t, const char *s, size_t n) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    size_t *o = realloc(t->off, cap * sizeof *o), *l = o ? realloc(t->len, cap * sizeof *l) : NULL;
    if (o) t->off = o;
    if (!l) return PW_ENOMEM;
    t->len = l, t->cap = cap;
  }
  t->off[t->n] = t->b.n, t->len[t->n] = n;
  t->n++;
  return tk_buf_put(&t->b, s, n);
}

/* Token i's bytes ("" when every token so far is empty: no buffer yet). */
static const char *tok_at(const toks *t, size_t i) { return t->b.p ? t->b.p + t->off[i] : ""; }

/* Appends to the last token (made by toks_add(t, "", 0) first). */
static int toks_cat(toks *t, const char *s, size_t n) {
  t->len[t->n - 1] += n;
  return tk_buf_put(&t->b, s, n);
}

/* ByteFallback: "<0xNN>" (tokenizers reads the two characters with
 * u8::from_str_radix(.., 16), which also takes a leading '+') */
static int fallback_byte(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0 && !(i == 3 && c == '+')) return -1;
    if (d >= 0) v = v * 16 + d;
  }
  return v;
}

static int flush_bytes(toks *o, tk_buf *bytes) {
  if (!bytes->n) return 0;
  int rc = 0;
  if (tk_u8check(bytes->p, bytes->n) == bytes->n) rc = toks_add(o, bytes->p, bytes->n);
  else
    for (size_t i = 0; !rc && i < bytes->n; i++) rc = toks_add(o, "\xEF\xBF\xBD", 3);
  bytes->n = 0;
  return rc;
}

static int replace_into(const tk_dec *t, const char *s, size_t n, toks *o, pw_err *err) {
  if (toks_add(o, "", 0)) return PW_ENOMEM;
  if (t->lit) {
    size_t i = 0;
    for (;;) {
      const char *hit = n - i >= t->lit_n ? memmem(s + i, n - i, t->lit, t->lit_n) : NULL;
      size_t j = hit ? (size_t)(hit - s) : n;
      if (toks_cat(o, s + i, j - i)) return PW_ENOMEM;
      if (!hit) return 0;
      if (toks_cat(o, t->content, t->content_n)) return PW_ENOMEM;
      i = j + t->lit_n;
    }
  }
  tk_spans sp = {0};
  int rc = tk_re_spans((tk_re *)&t->re, s, n, &sp, err);
  for (size_t k = 0; !rc && k < sp.n; k++)
    rc = sp.p[k].match ? toks_cat(o, t->content, t->content_n) : toks_cat(o, s + sp.p[k].s, sp.p[k].e - sp.p[k].s);
  free(sp.p);
  return rc;
}

static int step(const tk_dec *t, const toks *in, toks *o, pw_err *err) {
  int rc = 0;
  if (t->kind == TK_DEC_FUSE || t->kind == TK_DEC_BYTELEVEL) {
    tk_buf raw = {0};
    for (size_t i = 0; !rc && i < in->n; i++) {
      const char *s = tok_at(in, i);
      size_t n = in->len[i], at = raw.n;
      if (t->kind == TK_DEC_FUSE) {
        rc = tk_buf_put(&raw, s, n);
        continue;
      }
      /* each character back to its byte; a token with any other character stays as it is */
      for (size_t j = 0; !rc && j < n;) {
        int l, b = tk_char_byte(tk_u8dec(s + j, n - j, &l));
        if (b < 0) {
          raw.n = at;
          rc = tk_buf_put(&raw, s, n);
          break;
        }
        char ch = (char)b;
        rc = tk_buf_put(&raw, &ch, 1);
        j += (size_t)l;
      }
    }
    if (!rc) {
      rc = toks_add(o, "", 0);
      if (!rc && t->kind == TK_DEC_FUSE) rc = toks_cat(o, raw.p ? raw.p : "", raw.n);
      else if (!rc) {
        size_t before = o->b.n;
        rc = tk_utf8_lossy(raw.p ? raw.p : "", raw.n, &o->b);
        o->len[o->n - 1] = o->b.n - before;
      }
    }
    free(raw.p);
    return rc;
  }
  if (t->kind == TK_DEC_BYTEFALLBACK) {
    tk_buf bytes = {0};
    for (size_t i = 0; !rc && i < in->n; i++) {
      int b = fallback_byte(tok_at(in, i), in->len[i]);
      char ch = (char)b;
      if (b >= 0) rc = tk_buf_put(&bytes, &ch, 1);
      else if (!(rc = flush_bytes(o, &bytes))) rc = toks_add(o, tok_at(in, i), in->len[i]);
    }
    if (!rc) rc = flush_bytes(o, &bytes);
    free(bytes.p);
    return rc;
  }
  for (size_t i = 0; !rc && i < in->n; i++) {
    const char *s = tok_at(in, i);
    size_t n = in->len[i];
    if (t->kind == TK_DEC_REPLACE) {
      rc = replace_into(t, s, n, o, err);
    } else if (t->kind == TK_DEC_METASPACE) {
      rc = toks_add(o, "", 0);
      for (size_t j = 0; !rc && j < n;) {
        int l;
        uint32_t cp = tk_u8dec(s + j, n - j, &l);
        if (cp != t->ch) rc = toks_cat(o, s + j, (size_t)l);
        else if (!(i == 0 && t->prepend)) rc = toks_cat(o, " ", 1);
        j += (size_t)l;
      }
    } else { /* Strip: up to start leading and stop trailing copies of the character */
      size_t a = 0, e = n;
      for (int k = 0; k < t->start && a < n; k++) {
        int l;
        if (tk_u8dec(s + a, n - a, &l) != t->ch) break;
        a += (size_t)l;
      }
      for (int k = 0; k < t->stop && e > a; k++) {
        size_t p = e - 1;
        while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
        int l;
        if (tk_u8dec(s + p, e - p, &l) != t->ch) break;
        e = p;
      }
      rc = toks_add(o, s + a, e - a);
    }
  }
  return rc;
}

int tk_decode_chain(const tk_dec *steps, int n_steps, const char *src, const size_t *off, const size_t *len, size_t n,
                    tk_buf *out, pw_err *err) {
  toks a = {0}, b = {0};
  int rc = 0;
  for (size_t i = 0; !rc && i < n; i++) rc = toks_add(&a, src + off[i], len[i]);
  for (int k = 0; !rc && k < n_steps; k++) {
    b.n = 0, b.b.n = 0;
    rc = step(&steps[k], &a, &b, err);
    toks x = a;
    a = b, b = x;
  }
  for (size_t i = 0; !rc && i < a.n; i++) rc = tk_buf_put(out, tok_at(&a, i), a.len[i]);
  free(a.b.p), free(a.off), free(a.len), free(b.b.p), free(b.off), free(b.len);
  if (rc && err && !err->code) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  return rc;
}
