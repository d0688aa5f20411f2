/* tok_added: finding added tokens (BOS, EOS, [MASK], chat markers...) in a
 * text before the model sees it, as tokenizers' AddedVocabulary does
 * (added_vocabulary.rs find_matches): leftmost-longest matches, scanned
 * left to right without overlap; a single_word token only between
 * non-word characters; lstrip / rstrip take the whitespace beside it. */
#include <stdlib.h>
#include <string.h>

#include "tok_int.h"

static int by_first_then_longest(const void *a, const void *b, void *ctx) {
  const tk_added *added = ctx;
  const tk_added *x = &added[*(const uint32_t *)a], *y = &added[*(const uint32_t *)b];
  unsigned char fx = (unsigned char)x->match[0], fy = (unsigned char)y->match[0];
  if (fx != fy) return fx < fy ? -1 : 1;
  if (x->match_n != y->match_n) return x->match_n > y->match_n ? -1 : 1;
  return 0;
}

int tk_matcher_build(tk_matcher *mt, const tk_added *added, int n_added, int normalized, pw_err *err) {
  memset(mt, 0, sizeof *mt);
  mt->order = malloc(((size_t)n_added + 1) * sizeof *mt->order);
  if (!mt->order) return pw_err_set(err, PW_ENOMEM, "added_tokens", "out of memory");
  for (int i = 0; i < n_added; i++)
    if (added[i].normalized == normalized && added[i].match_n) mt->order[mt->n++] = (uint32_t)i;
  qsort_r(mt->order, (size_t)mt->n, sizeof *mt->order, by_first_then_longest, (void *)added);
  for (int i = 1; i < mt->n; i++) {
    const tk_added *a = &added[mt->order[i - 1]], *b = &added[mt->order[i]];
    if (a->match_n == b->match_n && !memcmp(a->match, b->match, a->match_n))
      return pw_err_set(err, PW_EFORMAT, "added_tokens", "ids %u and %u are both matched by \"%.60s\"", a->id, b->id,
                        a->content);
  }
  int k = 0;
  for (int c = 0; c < 256; c++) {
    mt->first[c] = (uint32_t)k;
    while (k < mt->n && (unsigned char)added[mt->order[k]].match[0] == c) k++;
  }
  mt->first[256] = (uint32_t)k;
  return 0;
}

void tk_matcher_free(tk_matcher *mt) {
  free(mt->order);
  memset(mt, 0, sizeof *mt);
}

static int segs_push(tk_segs *o, size_t s, size_t e, int64_t id) {
  if (o->n == o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 16;
    tk_seg *p = realloc(o->p, cap * sizeof *p);
    if (!p) return PW_ENOMEM;
    o->p = p;
    o->cap = cap;
  }
  o->p[o->n++] = (tk_seg){s, e, id};
  return 0;
}

/* Is the character that ends s[0..at) (before = 1) or starts s[at..n) a
 * word character (\w of Rust's regex: Alphabetic, marks, Nd, Pc, joiners)? */
static int word_char(const tk_re *word_re, const char *s, size_t n, size_t at, int before) {
  size_t a = at, b = at;
  if (before) {
    if (at == 0) return 0;
    a = at - 1;
    while (a > 0 && ((unsigned char)s[a] & 0xC0) == 0x80) a--;
  } else {
    if (at >= n) return 0;
    b = at + (size_t)tk_u8len((unsigned char)s[at]);
    if (b > n) b = n;
  }
  int rc = pcre2_match(word_re->code, (PCRE2_SPTR)(s + a), b - a, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, word_re->md,
                       word_re->mc);
  return rc >= 0;
}

int tk_matcher_split(const tk_matcher *mt, const tk_added *added, const tk_re *word_re, const char *s, size_t n,
                     tk_segs *out, pw_err *err) {
  size_t start_offset = 0, i = 0;
  if (mt->n)
    while (i < n) {
      unsigned char c = (unsigned char)s[i];
      uint32_t lo = mt->first[c], hi = mt->first[c + 1];
      if (lo == hi) { /* no token starts with this byte: skip to the next byte that may start one */
        i++;
        continue;
      }
      const tk_added *t = NULL;
      for (uint32_t k = lo; k < hi; k++) {
        const tk_added *a = &added[mt->order[k]];
        if (a->match_n <= n - i && !memcmp(s + i, a->match, a->match_n)) {
          t = a; /* longest first */
          break;
        }
      }
      if (!t) {
        i++;
        continue;
      }
      size_t start = i, stop = i + t->match_n;
      i = stop; /* the scan goes on after the match, whatever is done with it */
      if (t->single_word && (word_char(word_re, s, n, start, 1) || word_char(word_re, s, n, stop, 0))) continue;
      if (t->lstrip) {
        size_t ns = start;
        while (ns > 0) {
          size_t a = ns - 1;
          while (a > 0 && ((unsigned char)s[a] & 0xC0) == 0x80) a--;
          int l;
          if (!tk_is_space(tk_u8dec(s + a, n - a, &l))) break;
          ns = a;
        }
        start = ns > start_offset ? ns : start_offset;
      }
      if (t->rstrip)
        while (stop < n) {
          int l;
          if (!tk_is_space(tk_u8dec(s + stop, n - stop, &l))) break;
          stop += (size_t)l;
        }
      if ((start_offset < start && segs_push(out, start_offset, start, -1)) || segs_push(out, start, stop, t->id))
        return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
      start_offset = stop;
    }
  if (start_offset < n && segs_push(out, start_offset, n, -1))
    return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  return 0;
}
