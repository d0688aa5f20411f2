/* tok_int: the tokenizer's parts, shared by the files of common/text/ and
 * by nothing else (tokenizer.h is the public side). Each part mirrors one
 * piece of a Hugging Face tokenizer.json: the BPE model (tok_bpe.c), the
 * added tokens (tok_added.c), normalizers and pre-tokenizers (tok_pre.c),
 * decoders (tok_decode.c); tokenizer.c reads the file into them and runs
 * the pipeline. Nothing here may read a field it does not act on: a field
 * whose value would change the ids and is not implemented is refused at
 * load. */
#ifndef PW_TOK_INT_H
#define PW_TOK_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "tokenizer.h"

/* Bounds on what a file may ask for (a file is read whole, then held). */
#define TK_MAX_TOKEN 4096        /* bytes of one token's string */
#define TK_MAX_MERGES (1u << 23) /* merge rules */
#define TK_MAX_ADDED 65536       /* added tokens */
#define TK_MAX_STEPS 16          /* steps of one Sequence */
#define TK_MAX_PATTERN 8192      /* bytes of one pattern */
#define TK_MAX_TEMPLATE 64       /* pieces of a template, ids of one special token */
#define TK_CACHE_WORD 256        /* longer words are not cached (as tokenizers does) */

/* A growable byte buffer and id list. */
typedef struct {
  char *p;
  size_t n, cap;
} tk_buf;
typedef struct {
  uint32_t *p;
  size_t n, cap;
} tk_ids;
PW_MUST_CHECK int tk_buf_reserve(tk_buf *b, size_t extra);
PW_MUST_CHECK int tk_buf_put(tk_buf *b, const void *s, size_t n);
PW_MUST_CHECK int tk_ids_reserve(tk_ids *v, size_t extra);
PW_MUST_CHECK int tk_ids_push(tk_ids *v, uint32_t id);

/* UTF-8: the length of the character starting with byte c (1 for a stray byte). */
static inline int tk_u8len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }
/* The code point at s (valid UTF-8, n > 0); *len its bytes. */
uint32_t tk_u8dec(const char *s, size_t n, int *len);
int tk_u8enc(uint32_t cp, char out[4]);
/* The "type" string of object o at path (a normalizer, pre-tokenizer,
 * post-processor or decoder): PW_EFORMAT naming path.type otherwise. */
int tk_type_of(json_t *o, const char *path, const char **type, pw_err *err);
/* Offset of the first invalid byte of s[0..n), or n when it is valid UTF-8. */
size_t tk_u8check(const char *s, size_t n);
/* Unicode White_Space (what \s is in the regex engines tokenizers uses). */
int tk_is_space(uint32_t cp);
static inline uint64_t tk_hash(const void *s, size_t n) {
  const unsigned char *p = s;
  uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a, mixed at the end */
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  h ^= h >> 29;
  return h * 0xbf58476d1ce4e5b9ULL;
}

/* ---- regex: PCRE2 with UTF and Unicode properties, JIT when there ---------------- */
typedef struct {
  pcre2_code *code;
  pcre2_match_data *md;
  pcre2_match_context *mc;
  pcre2_jit_stack *js;
} tk_re;
/* A pattern as tokenizer.json gives it ({"Regex": ...} or {"String": ...},
 * literal=1 for the latter); errors name `path`. */
PW_MUST_CHECK int tk_re_compile(tk_re *re, const char *pat, size_t n, int literal, const char *path, pw_err *err);
void tk_re_free(tk_re *re);
/* Every match of re in s[0..n), as tokenizers' find_matches gives them: the
 * whole string covered by (start, end, is_match) spans in order; an empty
 * match right after the previous match is skipped. Appended to *spans as
 * triples. */
typedef struct {
  size_t s, e;
  int match;
} tk_span;
typedef struct {
  tk_span *p;
  size_t n, cap;
} tk_spans;
PW_MUST_CHECK int tk_re_spans(tk_re *re, const char *s, size_t n, tk_spans *out, pw_err *err);

/* ---- the BPE model ------------------------------------------------------------------------ */
typedef struct {
  uint64_t key; /* a << 32 | b */
  uint32_t rank, id;
} tk_merge;
typedef struct {
  /* vocab: id -> string (in arena), string -> id (open addressing, id + 1, 0 empty) */
  char *arena;
  size_t arena_n;
  uint32_t *off, *len; /* [n_ids]; len UINT32_MAX for an id the vocab lacks */
  uint32_t n_ids;      /* largest id + 1 */
  uint32_t *slots, mask;
  tk_merge *merges; /* open addressing on key; rank UINT32_MAX empty */
  uint32_t merge_mask;
  int byte_fallback, fuse_unk, ignore_merges;
  int64_t unk; /* -1: none */
  char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix, or NULL */
  size_t prefix_n, suffix_n;
  int32_t byte_tok[256]; /* <0xNN> ids, -1 where absent */
  int32_t byte_id[256];  /* byte-level: the id of each byte's GPT-2 character, -1 where absent */
  int bytes_ok;          /* byte-level: every byte_id there, no prefix or suffix */
  /* word cache: word bytes -> ids */
  struct tk_cache *cache;
  /* scratch of merge_word */
  void *sym, *heap;
  size_t sym_cap, heap_cap;
} tk_bpe;
/* The "model" object of a tokenizer.json (type BPE). */
PW_MUST_CHECK int tk_bpe_init(tk_bpe *m, json_t *model, pw_err *err);
void tk_bpe_free(tk_bpe *m);
/* id of the string s, or -1 */
int64_t tk_bpe_lookup(const tk_bpe *m, const char *s, size_t n);
/* The ids of one pre-token (its characters, merged); through the cache. */
PW_MUST_CHECK int tk_bpe_word(tk_bpe *m, const char *w, size_t n, tk_ids *out, pw_err *err);
/* Byte-level words: w is raw bytes, each standing for its GPT-2 character. */
PW_MUST_CHECK int tk_bpe_word_bytes(tk_bpe *m, const char *w, size_t n, tk_ids *out, pw_err *err);
void tk_bpe_bytelevel_prepare(tk_bpe *m);

/* ---- normalizers, pre-tokenizers ------------------------------------------------------------ */
enum { TK_NFC, TK_NFD, TK_NFKC, TK_NFKD, TK_PREPEND, TK_REPLACE };
typedef struct {
  int kind;
  char *s; /* Prepend's text, Replace's content */
  size_t s_n;
  char *lit; /* Replace with a String pattern: the literal (memmem), else re */
  size_t lit_n;
  tk_re re;
} tk_norm;
enum { TK_SPLIT, TK_BYTELEVEL, TK_METASPACE };
enum { TK_REMOVED, TK_ISOLATED, TK_MERGED_PREV, TK_MERGED_NEXT, TK_CONTIGUOUS };
enum { TK_PREPEND_NEVER, TK_PREPEND_FIRST, TK_PREPEND_ALWAYS };
typedef struct {
  int kind;
  tk_re re; /* Split's pattern; ByteLevel's GPT-2 pattern when use_regex */
  int behavior, invert;
  int add_prefix_space, use_regex;
  char repl[4]; /* Metaspace's replacement character */
  int repl_n, prepend, split;
} tk_pre;

/* Reading a step from the file (a Sequence adds each of its steps);
 * errors name `path`. Free with the matching _free. */
PW_MUST_CHECK int tk_norm_read(json_t *o, const char *path, tk_norm *steps, int *n, int depth, pw_err *err);
PW_MUST_CHECK int tk_pre_read(json_t *o, const char *path, tk_pre *steps, int *n, int depth, pw_err *err);
void tk_norm_free(tk_norm *t);
void tk_pre_free(tk_pre *t);
/* {"String": s} (lit gets a copy when lit is not NULL, else a literal regex) or {"Regex": r}. */
PW_MUST_CHECK int tk_pattern_read(json_t *o, const char *path, tk_re *re, char **lit, size_t *lit_n, pw_err *err);

/* Normalizes s[0..n) into out (replacing its contents). */
PW_MUST_CHECK int tk_normalize(const tk_norm *steps, int n_steps, const char *s, size_t n, tk_buf *out, tk_buf *tmp,
                               pw_err *err);

/* Runs pre-tokenizer steps d.. on one piece and hands each final piece to
 * sink. orig0: the piece starts at the start of the original text
 * (Metaspace's "first"). scratch and spans: one per step. */
typedef int (*tk_sink)(void *ctx, const char *s, size_t n, pw_err *err);
PW_MUST_CHECK int tk_pretokenize(tk_pre *steps, int n_steps, int d, const char *s, size_t n, int orig0, tk_buf *scratch,
                                 tk_spans *spans, tk_sink sink, void *ctx, pw_err *err);

/* ---- added tokens ---------------------------------------------------------------------------- */
typedef struct {
  uint32_t id;
  char *content; /* as the file gives it */
  size_t content_n;
  char *match; /* what is looked for: content, or its normalized form when normalized */
  size_t match_n;
  uint8_t special, normalized, lstrip, rstrip, single_word;
} tk_added;
typedef struct {
  uint32_t *order; /* indices into the added tokens, by first byte then longest first */
  uint32_t first[257];
  int n;
} tk_matcher;
/* One piece of a segmentation: an added token (id >= 0) or text. */
typedef struct {
  size_t s, e;
  int64_t id;
} tk_seg;
typedef struct {
  tk_seg *p;
  size_t n, cap;
} tk_segs;
PW_MUST_CHECK int tk_matcher_build(tk_matcher *mt, const tk_added *added, int n_added, int normalized, pw_err *err);
void tk_matcher_free(tk_matcher *mt);
/* Splits s[0..n) on the added tokens of mt (tokenizers' find_matches:
 * leftmost-longest, single_word, lstrip, rstrip). Appends to *out. */
PW_MUST_CHECK int tk_matcher_split(const tk_matcher *mt, const tk_added *added, const tk_re *word_re, const char *s,
                                   size_t n, tk_segs *out, pw_err *err);

/* ---- decoders -------------------------------------------------------------------------------- */
enum { TK_DEC_BYTELEVEL, TK_DEC_METASPACE, TK_DEC_REPLACE, TK_DEC_BYTEFALLBACK, TK_DEC_FUSE, TK_DEC_STRIP };
typedef struct {
  int kind;
  tk_re re;  /* Replace */
  char *lit; /* Replace with a String pattern */
  size_t lit_n;
  char *content; /* Replace's content */
  size_t content_n;
  uint32_t ch; /* Metaspace's replacement, Strip's content */
  int prepend; /* Metaspace: prepend scheme != never */
  int start, stop;
} tk_dec;
PW_MUST_CHECK int tk_dec_read(json_t *o, const char *path, tk_dec *steps, int *n, int depth, pw_err *err);
void tk_dec_free(tk_dec *t);
/* tokens: n strings (offsets into src); the chain's result, concatenated, into out. */
PW_MUST_CHECK int tk_decode_chain(const tk_dec *steps, int n_steps, const char *src, const size_t *off,
                                  const size_t *len, size_t n, tk_buf *out, pw_err *err);
/* bytes -> text, invalid sequences replaced by U+FFFD as Rust's from_utf8_lossy does */
PW_MUST_CHECK int tk_utf8_lossy(const char *s, size_t n, tk_buf *out);

/* The GPT-2 byte <-> character map of the byte-level parts (tk_map_init
 * first, once per process: the loader calls it). */
void tk_map_init(void);
uint32_t tk_byte_cp(unsigned char b);
/* character -> byte, -1 when the character is none of the 256 */
int tk_char_byte(uint32_t cp);

#endif
