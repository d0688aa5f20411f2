/* tok_bpe: the BPE model of a tokenizer.json — vocabulary, merge ranks,
 * and the merging of one pre-token, exactly as tokenizers' BPE does it
 * (models/bpe/model.rs merge_word, word.rs merge_all): a priority queue of
 * (rank, position) over a linked list of symbols, so a word of n
 * characters costs O(n log n), never a rescan per merge. Pre-tokens seen
 * before come from a cache of word -> ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_int.h"

#define EMPTY_RANK UINT32_MAX

/* ---- vocabulary: string -> id --------------------------------------------------------------- */

static uint32_t slot_of(uint64_t h, uint32_t mask) { return (uint32_t)(h >> 20) & mask; }

int64_t tk_bpe_lookup(const tk_bpe *m, const char *s, size_t n) {
  uint32_t i = slot_of(tk_hash(s, n), m->mask);
  for (;;) {
    uint32_t v = m->slots[i];
    if (!v) return -1;
    uint32_t id = v - 1;
    if (m->len[id] == n && !memcmp(m->arena + m->off[id], s, n)) return id;
    i = (i + 1) & m->mask;
  }
}

/* ---- merges: (a, b) -> (rank, new id) ------------------------------------------------------- */

static inline uint32_t merge_slot(uint64_t key, uint32_t mask) {
  return (uint32_t)((key * 0x9e3779b97f4a7c15ULL) >> 32) & mask;
}

static inline const tk_merge *merge_find(const tk_bpe *m, uint32_t a, uint32_t b) {
  uint64_t key = (uint64_t)a << 32 | b;
  uint32_t i = merge_slot(key, m->merge_mask);
  for (;;) {
    const tk_merge *e = &m->merges[i];
    if (e->rank == EMPTY_RANK) return NULL;
    if (e->key == key) return e;
    i = (i + 1) & m->merge_mask;
  }
}

/* A later rule for the same pair replaces the earlier one (tokenizers
 * collects them into a hash map the same way). */
static void merge_put(tk_bpe *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
  uint64_t key = (uint64_t)a << 32 | b;
  uint32_t i = merge_slot(key, m->merge_mask);
  while (m->merges[i].rank != EMPTY_RANK && m->merges[i].key != key) i = (i + 1) & m->merge_mask;
  m->merges[i] = (tk_merge){key, rank, id};
}

/* ---- the word cache --------------------------------------------------------------------------- */

typedef struct {
  uint64_t h;
  uint32_t key, key_n, ids, ids_n; /* key_n 0: empty */
} centry;
struct tk_cache {
  centry *t;
  uint32_t mask, used;
  tk_buf keys;
  tk_ids ids;
};
#define CACHE_SLOTS (1u << 17)
#define CACHE_MAX (1u << 16) /* words held; then the cache starts over */

static const centry *cache_get(const struct tk_cache *c, const char *w, size_t n, uint64_t h) {
  uint32_t i = slot_of(h, c->mask);
  for (;;) {
    const centry *e = &c->t[i];
    if (!e->key_n) return NULL;
    if (e->h == h && e->key_n == n && !memcmp(c->keys.p + e->key, w, n)) return e;
    i = (i + 1) & c->mask;
  }
}

static void cache_put(struct tk_cache *c, const char *w, size_t n, uint64_t h, const uint32_t *ids, size_t k) {
  if (c->used >= CACHE_MAX || c->ids.n + k > UINT32_MAX || c->keys.n + n > UINT32_MAX) {
    memset(c->t, 0, (size_t)(c->mask + 1) * sizeof *c->t);
    c->used = 0;
    c->keys.n = 0;
    c->ids.n = 0;
  }
  size_t ko = c->keys.n, io = c->ids.n;
  if (tk_buf_put(&c->keys, w, n) || tk_ids_reserve(&c->ids, k)) return; /* no memory: just not cached */
  if (k) memcpy(c->ids.p + io, ids, k * sizeof *ids);
  c->ids.n += k;
  uint32_t i = slot_of(h, c->mask);
  while (c->t[i].key_n) i = (i + 1) & c->mask;
  c->t[i] = (centry){h, (uint32_t)ko, (uint32_t)n, (uint32_t)io, (uint32_t)k};
  c->used++;
}

/* ---- merging one word ----------------------------------------------------------------------- */

typedef struct {
  uint32_t id;
  int32_t prev, next;
  uint32_t alive;
} sym_t;
typedef struct {
  uint32_t rank, pos, id;
} hent;

static inline int hless(const hent *a, const hent *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(hent *h, size_t *n, hent e) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!hless(&e, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = e;
}

static hent heap_pop(hent *h, size_t *n) {
  hent top = h[0], last = h[--*n];
  size_t i = 0, k = *n;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= k) break;
    if (c + 1 < k && hless(&h[c + 1], &h[c])) c++;
    if (!hless(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (k) h[i] = last;
  return top;
}

static int scratch(tk_bpe *m, size_t n) {
  if (n > m->sym_cap) {
    size_t cap = n < 64 ? 64 : n;
    void *s = realloc(m->sym, cap * sizeof(sym_t)), *h = s ? realloc(m->heap, 3 * cap * sizeof(hent)) : NULL;
    if (s) m->sym = s;
    if (!h) return PW_ENOMEM;
    m->heap = h;
    m->sym_cap = cap;
  }
  return 0;
}

/* word.rs merge_all: the lowest (rank, position) pair first; an entry whose
 * pair no longer gives its new id is stale and dropped. Symbols in
 * m->sym[0..n), ids appended to out. */
static int merge_all(tk_bpe *m, size_t n, tk_ids *out) {
  sym_t *sy = m->sym;
  hent *hp = m->heap;
  size_t hn = 0;
  for (size_t i = 0; i + 1 < n; i++) {
    const tk_merge *e = merge_find(m, sy[i].id, sy[i + 1].id);
    if (e) heap_push(hp, &hn, (hent){e->rank, (uint32_t)i, e->id});
  }
  while (hn) {
    hent top = heap_pop(hp, &hn);
    sym_t *s = &sy[top.pos];
    if (!s->alive || s->next < 0) continue;
    sym_t *r = &sy[s->next];
    const tk_merge *e = merge_find(m, s->id, r->id);
    if (!e || e->id != top.id) continue;
    s->id = top.id;
    r->alive = 0;
    s->next = r->next;
    if (s->next >= 0) sy[s->next].prev = (int32_t)top.pos;
    if (s->prev >= 0 && (e = merge_find(m, sy[s->prev].id, s->id)))
      heap_push(hp, &hn, (hent){e->rank, (uint32_t)s->prev, e->id});
    if (s->next >= 0 && (e = merge_find(m, s->id, sy[s->next].id)))
      heap_push(hp, &hn, (hent){e->rank, top.pos, e->id});
  }
  if (tk_ids_reserve(out, n)) return PW_ENOMEM;
  for (size_t i = 0; i < n; i++)
    if (sy[i].alive) out->p[out->n++] = sy[i].id;
  return 0;
}

static inline void sym_add(tk_bpe *m, size_t *k, uint32_t id) {
  sym_t *sy = m->sym;
  sy[*k] = (sym_t){id, (int32_t)*k - 1, (int32_t)*k + 1, 1};
  (*k)++;
}

/* merge_word: each character (with the subword prefix / word suffix where
 * they apply) by its id; else its bytes as <0xNN> when byte_fallback and all
 * exist; else unk, fused with a run of unks when fuse_unk. A pending unk is
 * emitted at the next known character, as tokenizers does (after any
 * byte-fallback ids in between). */
static int merge_word(tk_bpe *m, const char *w, size_t n, tk_ids *out, pw_err *err) {
  /* each character gives at most its bytes with the prefix and suffix (byte fallback) and an unk */
  if (scratch(m, n * (2 + m->prefix_n + m->suffix_n) + 1)) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  char tmp[3 * TK_MAX_TOKEN + 8];
  size_t k = 0;
  int unk_pending = 0;
  for (size_t i = 0; i < n;) {
    size_t l = (size_t)tk_u8len((unsigned char)w[i]);
    if (i + l > n) l = n - i;
    const char *s = w + i;
    size_t sn = l;
    int first = i == 0, last = i + l == n;
    if ((m->prefix && !first) || (m->suffix && last)) {
      sn = 0;
      if (m->prefix && !first) memcpy(tmp, m->prefix, m->prefix_n), sn = m->prefix_n;
      memcpy(tmp + sn, w + i, l), sn += l;
      if (m->suffix && last) memcpy(tmp + sn, m->suffix, m->suffix_n), sn += m->suffix_n;
      s = tmp;
    }
    i += l;
    int64_t id = tk_bpe_lookup(m, s, sn);
    if (id >= 0) {
      if (unk_pending) sym_add(m, &k, (uint32_t)m->unk), unk_pending = 0;
      sym_add(m, &k, (uint32_t)id);
      continue;
    }
    if (m->byte_fallback) {
      size_t j = 0;
      while (j < sn && m->byte_tok[(unsigned char)s[j]] >= 0) j++;
      if (j == sn) {
        for (j = 0; j < sn; j++) sym_add(m, &k, (uint32_t)m->byte_tok[(unsigned char)s[j]]);
        continue;
      }
    }
    if (m->unk >= 0) {
      if (unk_pending && !m->fuse_unk) sym_add(m, &k, (uint32_t)m->unk);
      unk_pending = 1;
    }
  }
  if (unk_pending) sym_add(m, &k, (uint32_t)m->unk);
  if (k) ((sym_t *)m->sym)[k - 1].next = -1;
  if (merge_all(m, k, out)) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  return 0;
}

/* A cached word's ids appended to out (none: a word of characters with no
 * id and no unk). */
static int cache_emit(tk_bpe *m, const centry *e, tk_ids *out, pw_err *err) {
  if (!e->ids_n) return 0;
  if (tk_ids_reserve(out, e->ids_n)) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  memcpy(out->p + out->n, m->cache->ids.p + e->ids, e->ids_n * sizeof(uint32_t));
  out->n += e->ids_n;
  return 0;
}
int tk_bpe_word(tk_bpe *m, const char *w, size_t n, tk_ids *out, pw_err *err) {
  if (!n) return 0;
  if (m->ignore_merges) {
    int64_t id = tk_bpe_lookup(m, w, n);
    if (id >= 0) return tk_ids_push(out, (uint32_t)id) ? pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory") : 0;
  }
  if (n >= TK_CACHE_WORD) return merge_word(m, w, n, out, err);
  uint64_t h = tk_hash(w, n);
  const centry *e = cache_get(m->cache, w, n, h);
  if (e) return cache_emit(m, e, out, err);
  size_t at = out->n;
  int rc = merge_word(m, w, n, out, err);
  if (!rc) cache_put(m->cache, w, n, h, out->n > at ? out->p + at : NULL, out->n - at);
  return rc;
}

void tk_bpe_bytelevel_prepare(tk_bpe *m) {
  m->bytes_ok = !m->prefix && !m->suffix;
  for (int b = 0; b < 256; b++) {
    char c[4];
    int l = tk_u8enc(tk_byte_cp((unsigned char)b), c);
    int64_t id = tk_bpe_lookup(m, c, (size_t)l);
    m->byte_id[b] = (int32_t)id;
    if (id < 0) m->bytes_ok = 0;
  }
}

/* A byte-level word arrives as raw bytes: its characters are the bytes'
 * GPT-2 characters, so when every byte's character is in the vocabulary
 * (and no prefix or suffix applies) the symbols come straight from a table
 * and the mapped string is made only for ignore_merges or a miss. */
int tk_bpe_word_bytes(tk_bpe *m, const char *w, size_t n, tk_ids *out, pw_err *err) {
  if (!n) return 0;
  uint64_t h = tk_hash(w, n);
  int cacheable = n < TK_CACHE_WORD;
  const centry *e = cacheable ? cache_get(m->cache, w, n, h) : NULL;
  if (e) return cache_emit(m, e, out, err);
  size_t at = out->n;
  int rc = 0;
  if (m->bytes_ok && !m->ignore_merges) {
    if (scratch(m, n)) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) sym_add(m, &k, (uint32_t)m->byte_id[(unsigned char)w[i]]);
    ((sym_t *)m->sym)[k - 1].next = -1;
    if (merge_all(m, k, out)) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
  } else {
    tk_buf mapped = {0};
    if (tk_buf_reserve(&mapped, 2 * n)) return pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory");
    for (size_t i = 0; i < n; i++) mapped.n += (size_t)tk_u8enc(tk_byte_cp((unsigned char)w[i]), mapped.p + mapped.n);
    int64_t id = m->ignore_merges ? tk_bpe_lookup(m, mapped.p, mapped.n) : -1;
    if (id >= 0) rc = tk_ids_push(out, (uint32_t)id) ? pw_err_set(err, PW_ENOMEM, "tokenizer", "out of memory") : 0;
    else rc = merge_word(m, mapped.p, mapped.n, out, err);
    free(mapped.p);
  }
  if (!rc && cacheable) cache_put(m->cache, w, n, h, out->n > at ? out->p + at : NULL, out->n - at);
  return rc;
}

/* ---- loading ------------------------------------------------------------------------------ */

static int str_field(json_t *model, const char *key, char **out, size_t *n, pw_err *err) {
  json_t *v = json_object_get(model, key);
  *out = NULL;
  *n = 0;
  if (!v || json_is_null(v)) return 0;
  char path[64];
  snprintf(path, sizeof path, "model.%s", key);
  if (!json_is_string(v)) return pw_err_set(err, PW_EFORMAT, path, "must be a string or null");
  *n = json_string_length(v);
  if (*n > TK_MAX_TOKEN) return pw_err_set(err, PW_ETOOBIG, path, "longer than %d bytes", TK_MAX_TOKEN);
  if (!(*out = malloc(*n + 1))) return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  memcpy(*out, json_string_value(v), *n + 1);
  return 0;
}

static int bool_field(json_t *model, const char *key, int *out, pw_err *err) {
  json_t *v = json_object_get(model, key);
  *out = 0;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return pw_err_set(err, PW_EFORMAT, "model", "%s must be true, false or null", key);
  *out = json_is_true(v);
  return 0;
}

/* One merge rule as its two token strings: "a b" (exactly one space) or ["a", "b"]. */
static int merge_parts(json_t *r, size_t i, const char **a, size_t *an, const char **b, size_t *bn, pw_err *err) {
  if (json_is_string(r)) {
    const char *s = json_string_value(r), *sp = memchr(s, ' ', json_string_length(r));
    size_t n = json_string_length(r);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
      return pw_err_set(err, PW_EFORMAT, "model.merges", "rule %zu (\"%.60s\") is not two tokens split by one space", i, s);
    *a = s, *an = (size_t)(sp - s), *b = sp + 1, *bn = n - *an - 1;
    return 0;
  }
  if (json_is_array(r) && json_array_size(r) == 2 && json_is_string(json_array_get(r, 0)) &&
      json_is_string(json_array_get(r, 1))) {
    *a = json_string_value(json_array_get(r, 0)), *an = json_string_length(json_array_get(r, 0));
    *b = json_string_value(json_array_get(r, 1)), *bn = json_string_length(json_array_get(r, 1));
    return 0;
  }
  return pw_err_set(err, PW_EFORMAT, "model.merges", "rule %zu must be \"a b\" or [\"a\", \"b\"]", i);
}

static uint32_t pow2_above(size_t n) {
  uint32_t c = 16;
  while (c < 2 * n) c <<= 1;
  return c;
}

int tk_bpe_init(tk_bpe *m, json_t *model, pw_err *err) {
  memset(m, 0, sizeof *m);
  m->unk = -1;
  for (int b = 0; b < 256; b++) m->byte_tok[b] = -1;
  json_t *v = json_object_get(model, "dropout");
  if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0))
    return pw_err_set(err, PW_ENOTSUP, "model.dropout", "BPE dropout (random merges) is not supported: null or 0");
  int rc;
  if ((rc = bool_field(model, "fuse_unk", &m->fuse_unk, err)) || (rc = bool_field(model, "byte_fallback", &m->byte_fallback, err)) ||
      (rc = bool_field(model, "ignore_merges", &m->ignore_merges, err)) ||
      (rc = str_field(model, "continuing_subword_prefix", &m->prefix, &m->prefix_n, err)) ||
      (rc = str_field(model, "end_of_word_suffix", &m->suffix, &m->suffix_n, err)))
    return rc;
  if (m->prefix && !m->prefix_n) free(m->prefix), m->prefix = NULL; /* an empty one changes nothing */
  if (m->suffix && !m->suffix_n) free(m->suffix), m->suffix = NULL;

  json_t *vocab = json_object_get(model, "vocab");
  if (!json_is_object(vocab)) return pw_err_set(err, PW_EFORMAT, "model.vocab", "missing, or not an object of token: id");
  size_t nv = json_object_size(vocab), bytes = 0;
  if (nv > PW_TOKENIZER_MAX_VOCAB)
    return pw_err_set(err, PW_ETOOBIG, "model.vocab", "%zu tokens (at most %d)", nv, PW_TOKENIZER_MAX_VOCAB);
  const char *key;
  json_t *val;
  uint32_t max_id = 0;
  json_object_foreach(vocab, key, val) {
    size_t kn = json_object_iter_key_len(json_object_key_to_iter(key));
    json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
    if (id < 0 || id >= PW_TOKENIZER_MAX_VOCAB)
      return pw_err_set(err, PW_EFORMAT, "model.vocab", "token \"%.60s\": id must be an integer in 0..%d", key,
                        PW_TOKENIZER_MAX_VOCAB - 1);
    if (kn == 0 || kn > TK_MAX_TOKEN)
      return pw_err_set(err, PW_EFORMAT, "model.vocab", "token %lld: %zu bytes (1..%d)", (long long)id, kn, TK_MAX_TOKEN);
    if ((uint32_t)id > max_id) max_id = (uint32_t)id;
    bytes += kn;
  }
  m->n_ids = nv ? max_id + 1 : 0;
  m->arena = malloc(bytes ? bytes : 1);
  m->off = calloc(m->n_ids + 1, sizeof *m->off);
  m->len = malloc((m->n_ids + 1) * sizeof *m->len);
  m->mask = pow2_above(nv) - 1;
  m->slots = calloc((size_t)m->mask + 1, sizeof *m->slots);
  m->cache = calloc(1, sizeof *m->cache);
  if (m->cache) m->cache->mask = CACHE_SLOTS - 1, m->cache->t = calloc(CACHE_SLOTS, sizeof(centry));
  if (!m->arena || !m->off || !m->len || !m->slots || !m->cache || !m->cache->t)
    return pw_err_set(err, PW_ENOMEM, "model.vocab", "out of memory");
  memset(m->len, 0xFF, (m->n_ids + 1) * sizeof *m->len);
  json_object_foreach(vocab, key, val) {
    size_t kn = json_object_iter_key_len(json_object_key_to_iter(key));
    uint32_t id = (uint32_t)json_integer_value(val);
    if (m->len[id] != UINT32_MAX)
      return pw_err_set(err, PW_EFORMAT, "model.vocab", "id %u is given to both \"%.*s\" and \"%.40s\"", id,
                        (int)(m->len[id] > 40 ? 40 : m->len[id]), m->arena + m->off[id], key);
    if (tk_bpe_lookup(m, key, kn) >= 0)
      return pw_err_set(err, PW_EFORMAT, "model.vocab", "token \"%.60s\" appears twice", key);
    memcpy(m->arena + m->arena_n, key, kn);
    m->off[id] = (uint32_t)m->arena_n, m->len[id] = (uint32_t)kn;
    m->arena_n += kn;
    uint32_t i = slot_of(tk_hash(key, kn), m->mask);
    while (m->slots[i]) i = (i + 1) & m->mask;
    m->slots[i] = id + 1;
  }

  json_t *merges = json_object_get(model, "merges");
  if (!json_is_array(merges)) return pw_err_set(err, PW_EFORMAT, "model.merges", "missing, or not an array");
  size_t nm = json_array_size(merges);
  if (nm > TK_MAX_MERGES) return pw_err_set(err, PW_ETOOBIG, "model.merges", "%zu rules (at most %u)", nm, TK_MAX_MERGES);
  m->merge_mask = pow2_above(nm) - 1;
  m->merges = malloc(((size_t)m->merge_mask + 1) * sizeof *m->merges);
  if (!m->merges) return pw_err_set(err, PW_ENOMEM, "model.merges", "out of memory");
  for (size_t i = 0; i <= m->merge_mask; i++) m->merges[i].rank = EMPTY_RANK;
  char buf[2 * TK_MAX_TOKEN];
  uint32_t rank = 0;
  for (size_t i = 0; i < nm; i++) {
    json_t *r = json_array_get(merges, i);
    if (json_is_string(r) && !strncmp(json_string_value(r), "#version", 8)) continue; /* merges.txt's header line */
    const char *a = NULL, *b = NULL;
    size_t an = 0, bn = 0;
    if ((rc = merge_parts(r, i, &a, &an, &b, &bn, err))) return rc;
    int64_t ia = tk_bpe_lookup(m, a, an), ib = tk_bpe_lookup(m, b, bn);
    if (ia < 0 || ib < 0)
      return pw_err_set(err, PW_EFORMAT, "model.merges", "rule %zu: \"%.*s\" is not in the vocabulary", i,
                        (int)(ia < 0 ? (an > 60 ? 60 : an) : (bn > 60 ? 60 : bn)), ia < 0 ? a : b);
    size_t cut = m->prefix_n <= bn && !memcmp(b, m->prefix ? m->prefix : "", m->prefix_n) ? m->prefix_n : 0;
    if (an + bn - cut > sizeof buf)
      return pw_err_set(err, PW_EFORMAT, "model.merges", "rule %zu: merged token too long", i);
    memcpy(buf, a, an);
    memcpy(buf + an, b + cut, bn - cut);
    int64_t id = tk_bpe_lookup(m, buf, an + bn - cut);
    if (id < 0)
      return pw_err_set(err, PW_EFORMAT, "model.merges", "rule %zu: the merged token \"%.*s\" is not in the vocabulary", i,
                        (int)(an + bn - cut > 60 ? 60 : an + bn - cut), buf);
    merge_put(m, (uint32_t)ia, (uint32_t)ib, rank++, (uint32_t)id);
  }

  char *unk;
  size_t unk_n;
  if ((rc = str_field(model, "unk_token", &unk, &unk_n, err))) return rc;
  if (unk) {
    m->unk = tk_bpe_lookup(m, unk, unk_n);
    if (m->unk < 0) rc = pw_err_set(err, PW_EFORMAT, "model.unk_token", "\"%.60s\" is not in the vocabulary", unk);
    free(unk);
    if (rc) return rc;
  }
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    m->byte_tok[b] = (int32_t)tk_bpe_lookup(m, name, 6);
  }
  return 0;
}

void tk_bpe_free(tk_bpe *m) {
  free(m->arena);
  free(m->off);
  free(m->len);
  free(m->slots);
  free(m->merges);
  free(m->prefix);
  free(m->suffix);
  if (m->cache) {
    free(m->cache->t);
    free(m->cache->keys.p);
    free(m->cache->ids.p);
    free(m->cache);
  }
  free(m->sym);
  free(m->heap);
  memset(m, 0, sizeof *m);
}
