/* tok_util: what the tokenizer's parts share — growable buffers, UTF-8,
 * Unicode White_Space, GPT-2's byte <-> character map, and regexes on
 * PCRE2 (UTF, Unicode properties, JIT when the platform has it) walked the
 * way tokenizers walks its Oniguruma matches. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tok_int.h"

int tk_buf_reserve(tk_buf *b, size_t extra) {
  if (b->cap - b->n >= extra) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap - b->n < extra) {
    if (cap > SIZE_MAX / 2) return PW_ENOMEM;
    cap *= 2;
  }
  char *p = realloc(b->p, cap);
  if (!p) return PW_ENOMEM;
  b->p = p;
  b->cap = cap;
  return 0;
}

int tk_buf_put(tk_buf *b, const void *s, size_t n) {
  if (tk_buf_reserve(b, n)) return PW_ENOMEM;
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  return 0;
}

int tk_ids_reserve(tk_ids *v, size_t extra) {
  if (v->cap - v->n >= extra) return 0;
  size_t cap = v->cap ? v->cap : 64;
  while (cap - v->n < extra) {
    if (cap > SIZE_MAX / 8) return PW_ENOMEM;
    cap *= 2;
  }
  uint32_t *p = realloc(v->p, cap * sizeof *p);
  if (!p) return PW_ENOMEM;
  v->p = p;
  v->cap = cap;
  return 0;
}

int tk_ids_push(tk_ids *v, uint32_t id) {
  if (v->n == v->cap && tk_ids_reserve(v, 1)) return PW_ENOMEM;
  v->p[v->n++] = id;
  return 0;
}

uint32_t tk_u8dec(const char *s, size_t n, int *len) {
  const unsigned char *p = (const unsigned char *)s;
  int l = tk_u8len(p[0]);
  if ((size_t)l > n) l = 1;
  *len = l;
  switch (l) {
  case 1: return p[0];
  case 2: return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
  case 3: return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
  default: return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
  }
}

int tk_type_of(json_t *o, const char *path, const char **type, pw_err *err) {
  char sub[160];
  snprintf(sub, sizeof sub, "%s.type", path);
  json_t *t = json_object_get(o, "type");
  if (!json_is_object(o) || !json_is_string(t)) return pw_err_set(err, PW_EFORMAT, sub, "missing, or not a string");
  *type = json_string_value(t);
  return 0;
}

int tk_u8enc(uint32_t cp, char out[4]) {
  if (cp < 0x80) return out[0] = (char)cp, 1;
  if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 0x3F)), out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  out[2] = (char)(0x80 | (cp >> 6 & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* The length of the valid sequence at p (at most n bytes), 0 when invalid:
 * the well-formed table of Unicode 3.9 (no overlongs, surrogates or > U+10FFFF). */
static size_t u8valid_one(const unsigned char *p, size_t n) {
  unsigned c = p[0];
  if (c < 0x80) return 1;
  if (c < 0xC2 || c > 0xF4) return 0;
  size_t l = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (n < 2) return 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c == 0xE0) lo = 0xA0;
  else if (c == 0xED) hi = 0x9F;
  else if (c == 0xF0) lo = 0x90;
  else if (c == 0xF4) hi = 0x8F;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < l; i++)
    if (i >= n || (p[i] & 0xC0) != 0x80) return 0;
  return l;
}

size_t tk_u8check(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) { /* ASCII runs, 8 at a time */
      while (i + 8 <= n) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w & 0x8080808080808080ULL) break;
        i += 8;
      }
      while (i < n && p[i] < 0x80) i++;
      continue;
    }
    size_t l = u8valid_one(p + i, n - i);
    if (!l) return i;
    i += l;
  }
  return n;
}

int tk_utf8_lossy(const char *s, size_t n, tk_buf *out) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    size_t l = u8valid_one(p + i, n - i);
    if (l) {
      if (tk_buf_put(out, p + i, l)) return PW_ENOMEM;
      i += l;
      continue;
    }
    /* the maximal prefix of a valid sequence is one replacement (as Rust's from_utf8_lossy) */
    size_t k = 1;
    unsigned c = p[i];
    if (c >= 0xC2 && c <= 0xF4) {
      size_t want = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      unsigned lo = 0x80, hi = 0xBF;
      if (c == 0xE0) lo = 0xA0;
      else if (c == 0xED) hi = 0x9F;
      else if (c == 0xF0) lo = 0x90;
      else if (c == 0xF4) hi = 0x8F;
      if (i + 1 < n && p[i + 1] >= lo && p[i + 1] <= hi) {
        k = 2;
        while (k < want && i + k < n && (p[i + k] & 0xC0) == 0x80) k++;
      }
    }
    if (tk_buf_put(out, "\xEF\xBF\xBD", 3)) return PW_ENOMEM;
    i += k;
  }
  return 0;
}

int tk_is_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* GPT-2's map: the printable bytes stand for themselves, the others for
 * 256 + n in byte order (bytes_to_unicode). */
static uint16_t byte_char[256];
static int16_t char_byte[256 + 68];
static pthread_once_t map_once = PTHREAD_ONCE_INIT;

static void map_init(void) {
  int n = 0;
  for (int b = 0; b < 256; b++) {
    int self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    byte_char[b] = (uint16_t)(self ? b : 256 + n++);
  }
  for (int c = 0; c < 256 + 68; c++) char_byte[c] = -1;
  for (int b = 0; b < 256; b++) char_byte[byte_char[b]] = (int16_t)b;
}

void tk_map_init(void) { pthread_once(&map_once, map_init); }

uint32_t tk_byte_cp(unsigned char b) { return byte_char[b]; }

int tk_char_byte(uint32_t cp) {
  return cp < 256 + 68 ? char_byte[cp] : -1;
}

/* ---- regex ---------------------------------------------------------------------------------- */

int tk_re_compile(tk_re *re, const char *pat, size_t n, int literal, const char *path, pw_err *err) {
  memset(re, 0, sizeof *re);
  if (n == 0) return pw_err_set(err, PW_EFORMAT, path, "empty pattern");
  if (n > TK_MAX_PATTERN) return pw_err_set(err, PW_ETOOBIG, path, "pattern of %zu bytes (at most %d)", n, TK_MAX_PATTERN);
  int code;
  PCRE2_SIZE off;
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  re->code = pcre2_compile((PCRE2_SPTR)pat, n, opts, &code, &off, NULL);
  if (!re->code) {
    PCRE2_UCHAR msg[200];
    pcre2_get_error_message(code, msg, sizeof msg);
    return pw_err_set(err, PW_EFORMAT, path, "bad regex at offset %zu: %s", (size_t)off, (const char *)msg);
  }
  re->md = pcre2_match_data_create_from_pattern(re->code, NULL);
  re->mc = pcre2_match_context_create(NULL);
  if (!re->md || !re->mc) return tk_re_free(re), pw_err_set(err, PW_ENOMEM, path, "out of memory");
  /* bounded work per match: a pathological pattern fails instead of hanging */
  pcre2_set_match_limit(re->mc, 50 * 1000 * 1000);
  pcre2_set_depth_limit(re->mc, 100 * 1000);
  if (pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0) {
    re->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (re->js) pcre2_jit_stack_assign(re->mc, NULL, re->js);
  }
  return 0;
}

void tk_re_free(tk_re *re) {
  if (re->md) pcre2_match_data_free(re->md);
  if (re->mc) pcre2_match_context_free(re->mc);
  if (re->js) pcre2_jit_stack_free(re->js);
  if (re->code) pcre2_code_free(re->code);
  memset(re, 0, sizeof *re);
}

static int spans_push(tk_spans *o, size_t s, size_t e, int match) {
  if (o->n == o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 64;
    tk_span *p = realloc(o->p, cap * sizeof *p);
    if (!p) return PW_ENOMEM;
    o->p = p;
    o->cap = cap;
  }
  o->p[o->n++] = (tk_span){s, e, match};
  return 0;
}

int tk_re_spans(tk_re *re, const char *s, size_t n, tk_spans *out, pw_err *err) {
  if (n == 0) return spans_push(out, 0, 0, 0) ? pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory") : 0;
  size_t pos = 0, prev = 0, last_end = (size_t)-1;
  while (pos <= n) {
    int rc = re->js ? pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, pos, 0, re->md, re->mc)
                    : pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, re->md, re->mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[200];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return pw_err_set(err, PW_EFORMAT, "tokenizer", "regex match failed: %s", (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(re->md);
    size_t ms = ov[0], me = ov[1];
    if (ms > me || me > n || ms < pos) return pw_err_set(err, PW_EFORMAT, "tokenizer", "regex reported a match out of order");
    if (ms == me && last_end == me) { /* no empty match right after a match: step one character */
      pos = me < n ? me + (size_t)tk_u8len((unsigned char)s[me]) : n + 1;
      continue;
    }
    if ((prev != ms && spans_push(out, prev, ms, 0)) || spans_push(out, ms, me, 1))
      return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
    prev = pos = last_end = me;
  }
  if (prev != n && spans_push(out, prev, n, 0)) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  return 0;
}
