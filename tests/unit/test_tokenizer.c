/* test_tokenizer: tokenizers (common/text/tokenizer.h) on small
 * tokenizer.json files written here, whose ids can be worked out by hand
 * (tests/ref/test_tokenizers holds the same code against Hugging Face
 * tokenizers on trained vocabularies).
 *
 * Merges by rank, not by order of appearance, ties to the leftmost pair,
 * in both merge formats; byte fallback to <0xNN>, unk fused or not;
 * added tokens with lstrip and single_word, the template, decoding with
 * and without specials; byte-level words of any bytes; Metaspace and
 * Llama-2's Prepend + Replace with the ▁ decoder chain; NFC; and every
 * refused input named by its field. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

/* JSON written with ' for " (no token here holds a quote). */
static char *dq(const char *s) {
  char *d = strdup(s);
  for (char *p = d; *p; p++)
    if (*p == '\'') *p = '"';
  return d;
}

static int try_load(const char *sq, pw_tokenizer **tok, pw_err *err) {
  char *j = dq(sq);
  int rc = pw_tokenizer_from_json(j, strlen(j), tok, err);
  free(j);
  return rc;
}

static pw_tokenizer *load(const char *sq) {
  pw_tokenizer *tok = NULL;
  pw_err err = {0};
  int rc = try_load(sq, &tok, &err);
  if (rc) fail_msg("load: %s: %s", err.path, err.msg);
  return tok;
}

static void expect_ids(pw_tokenizer *tok, const char *text, int flags, const uint32_t *want, size_t n) {
  pw_tok_ids ids = {0};
  pw_err err = {0};
  int rc = pw_tokenizer_encode(tok, text, strlen(text), flags, &ids, &err);
  if (rc) fail_msg("encode '%s': %s: %s", text, err.path, err.msg);
  int same = ids.n == n && (!n || !memcmp(ids.v, want, n * sizeof *want));
  if (!same) {
    char got[512] = "";
    for (size_t i = 0; i < ids.n && strlen(got) < 480; i++) snprintf(got + strlen(got), sizeof got - strlen(got), " %u", ids.v[i]);
    fail_msg("encode '%s': got%s (%zu ids, want %zu)", text, got, ids.n, n);
  }
  free(ids.v);
}
#define IDS(tok, text, flags, ...)                                                  \
  do {                                                                              \
    const uint32_t want_[] = {__VA_ARGS__};                                         \
    expect_ids(tok, text, flags, want_, sizeof want_ / sizeof want_[0]);            \
  } while (0)

static void expect_text(pw_tokenizer *tok, const uint32_t *ids, size_t n, int flags, const char *want) {
  char *out = NULL;
  size_t on = 0;
  pw_err err = {0};
  int rc = pw_tokenizer_decode(tok, ids, n, flags, &out, &on, &err);
  if (rc) fail_msg("decode: %s: %s", err.path, err.msg);
  if (on != strlen(want) || memcmp(out, want, on)) fail_msg("decode: got '%s', want '%s'", out, want);
  free(out);
}
#define TEXT(tok, flags, want, ...)                                                 \
  do {                                                                              \
    const uint32_t ids_[] = {__VA_ARGS__};                                          \
    expect_text(tok, ids_, sizeof ids_ / sizeof ids_[0], flags, want);              \
  } while (0)

static void test_merges_by_rank(void **state) {
  (void)state;
  /* b c ranks before a bc: abc is a + bc, then abc */
  pw_tokenizer *t = load("{'model': {'type': 'BPE', 'vocab': {'a':0,'b':1,'c':2,'ab':3,'bc':4,'abc':5},"
                         " 'merges': ['#version: 0.2', 'b c', 'a bc']}}");
  IDS(t, "abc", 0, 5);
  IDS(t, "ab", 0, 0, 1); /* no rule for a b */
  TEXT(t, 0, "abc bc a", 5, 4, 0); /* no decoder: the tokens joined by spaces */
  assert_int_equal(pw_tokenizer_vocab_size(t), 6);
  pw_tokenizer_close(t);
  /* pairs, and a b first: ab, then ab c */
  t = load("{'model': {'type': 'BPE', 'vocab': {'a':0,'b':1,'c':2,'ab':3,'bc':4,'abc':5},"
           " 'merges': [['a','b'], ['ab','c'], ['b','c']]}}");
  IDS(t, "abc", 0, 5);
  IDS(t, "abcbc", 0, 5, 4);
  IDS(t, "cb", 0, 2, 1);
  pw_tokenizer_close(t);
  /* equal ranks: the leftmost pair first */
  t = load("{'model': {'type': 'BPE', 'vocab': {'a':0,'aa':1}, 'merges': ['a a']}}");
  IDS(t, "aaa", 0, 1, 0);
  IDS(t, "aaaa", 0, 1, 1);
  IDS(t, "aaaaa", 0, 1, 1, 0);
  pw_tokenizer_close(t);
  /* ignore_merges: a word in the vocabulary is taken whole */
  t = load("{'model': {'type': 'BPE', 'ignore_merges': true, 'vocab': {'a':0,'b':1,'c':2,'ab':3,'abc':4,'bc':5},"
           " 'merges': ['a b', 'b c']}}");
  IDS(t, "abc", 0, 4);
  IDS(t, "abcc", 0, 3, 2, 2);
  pw_tokenizer_close(t);
}

static void test_byte_fallback(void **state) {
  (void)state;
  const char *fmt = "{'model': {'type': 'BPE', 'unk_token': '<unk>', 'byte_fallback': true, 'fuse_unk': %s,"
                    " 'vocab': {'<unk>':0,'<0xC3>':1,'<0xA9>':2,'a':3}, 'merges': []},"
                    " 'decoder': {'type': 'Sequence', 'decoders': [{'type': 'ByteFallback'}, {'type': 'Fuse'}]}}";
  char j[600];
  snprintf(j, sizeof j, fmt, "true");
  pw_tokenizer *t = load(j);
  IDS(t, "a\xc3\xa9", 0, 3, 1, 2);     /* é as its two bytes */
  IDS(t, "a\xc3\xbc\xc3\xbc", 0, 3, 0); /* ü's 0xBC is missing: unk, two fused into one */
  TEXT(t, 0, "a\xc3\xa9", 3, 1, 2);
  TEXT(t, 0, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "a", 1, 1, 2, 3); /* C3 C3 A9 is not UTF-8: one U+FFFD a byte */
  pw_tokenizer_close(t);
  snprintf(j, sizeof j, fmt, "false");
  t = load(j);
  IDS(t, "\xc3\xbc\xc3\xbc" "a", 0, 0, 0, 3);
  pw_tokenizer_close(t);
}

static const char *specials_json =
    "{'added_tokens': ["
    "  {'id':0,'content':'<s>','special':true,'normalized':false,'lstrip':false,'rstrip':false,'single_word':false},"
    "  {'id':1,'content':'</s>','special':true,'normalized':false,'lstrip':false,'rstrip':false,'single_word':false},"
    "  {'id':5,'content':'[MASK]','special':true,'normalized':false,'lstrip':true,'rstrip':false,'single_word':false},"
    "  {'id':6,'content':'ab','special':false,'normalized':false,'lstrip':false,'rstrip':false,'single_word':true}],"
    " 'post_processor': {'type': 'TemplateProcessing',"
    "   'single': [{'SpecialToken': {'id': '<s>', 'type_id': 0}}, {'Sequence': {'id': 'A', 'type_id': 0}},"
    "              {'SpecialToken': {'id': '</s>', 'type_id': 0}}],"
    "   'pair': [], 'special_tokens': {'<s>': {'id': '<s>', 'ids': [0], 'tokens': ['<s>']},"
    "                                  '</s>': {'id': '</s>', 'ids': [1], 'tokens': ['</s>']}}},"
    " 'model': {'type': 'BPE', 'vocab': {'<s>':0,'</s>':1,'a':2,'b':3,' ':4,'[MASK]':5}, 'merges': []}}";

static void test_added_tokens(void **state) {
  (void)state;
  pw_tokenizer *t = load(specials_json);
  IDS(t, "a [MASK]b", PW_TOK_ADD_SPECIAL, 0, 2, 5, 3, 1); /* lstrip takes the space */
  IDS(t, "a [MASK]b", 0, 2, 5, 3);
  IDS(t, "a<s>b</s>", 0, 2, 0, 3, 1);
  IDS(t, "ab b", 0, 6, 4, 3); /* a single word */
  IDS(t, "aab", 0, 2, 2, 3);  /* inside a word: not the added token */
  IDS(t, "", PW_TOK_ADD_SPECIAL, 0, 1);
  TEXT(t, 0, "<s> a [MASK] b </s>", 0, 2, 5, 3, 1);
  TEXT(t, PW_TOK_SKIP_SPECIAL, "a b", 0, 2, 5, 3, 1);
  assert_int_equal(pw_tokenizer_token_id(t, "[MASK]"), 5);
  assert_int_equal(pw_tokenizer_token_id(t, "ab"), 6);
  assert_int_equal(pw_tokenizer_token_id(t, "zz"), -1);
  assert_int_equal(pw_tokenizer_vocab_size(t), 7);
  pw_tokenizer_close(t);
}

/* GPT-2's byte -> character map, written out again from its definition. */
static void gpt2_char(int b, char out[3]) {
  int n = 0, cp = b;
  if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
    cp = 256;
    for (int k = 0; k < b; k++) cp += !((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE);
  }
  if (cp < 0x80) out[n++] = (char)cp;
  else out[n++] = (char)(0xC0 | cp >> 6), out[n++] = (char)(0x80 | (cp & 0x3F));
  out[n] = 0;
}

static void test_byte_level(void **state) {
  (void)state;
  json_t *vocab = json_object();
  char c[3];
  for (int b = 0; b < 256; b++) gpt2_char(b, c), json_object_set_new(vocab, c, json_integer(b));
  const char *extra[] = {"he", "ll", "hell", "hello", "\xc4\xa0w"}; /* Ġw: a space, then w */
  for (int i = 0; i < 5; i++) json_object_set_new(vocab, extra[i], json_integer(256 + i));
  json_t *root = json_pack("{s:{s:s, s:o, s:[s,s,s,s,s]}, s:{s:s, s:b, s:b, s:b}, s:{s:s}}", "model", "type", "BPE",
                           "vocab", vocab, "merges", "h e", "l l", "he ll", "hell o", "\xc4\xa0 w", "pre_tokenizer",
                           "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1, "decoder",
                           "type", "ByteLevel");
  char *j = json_dumps(root, 0);
  json_decref(root);
  pw_tokenizer *t = NULL;
  pw_err err = {0};
  if (pw_tokenizer_from_json(j, strlen(j), &t, &err)) fail_msg("%s: %s", err.path, err.msg);
  free(j);
  IDS(t, "hello world", 0, 259, 260, 'o', 'r', 'l', 'd'); /* "hello", " world" */
  IDS(t, "hello  hello", 0, 259, ' ', ' ', 259); /* "hello", " ", " hello": a space is its byte's id */
  TEXT(t, 0, "hello world", 259, 260, 'o', 'r', 'l', 'd');
  IDS(t, "\xf0\x9f\x98\x80", 0, 0xF0, 0x9F, 0x98, 0x80); /* an emoji: its four bytes */
  TEXT(t, 0, "\xf0\x9f\x98\x80!", 0xF0, 0x9F, 0x98, 0x80, '!');
  TEXT(t, 0, "a\xef\xbf\xbd", 'a', 0xF0); /* a cut character decodes to U+FFFD */
  pw_tokenizer_close(t);
}

static void test_metaspace(void **state) {
  (void)state;
  const char *vocab = "'model': {'type': 'BPE', 'unk_token': '<unk>', 'byte_fallback': false,"
                      " 'vocab': {'<unk>':0,'<s>':1,'\u2581':2,'a':3,'b':4,'\u2581a':5,'ab':6,'\u2581ab':7,'\u2581\u2581':8},"
                      " 'merges': ['\u2581 a', 'a b', '\u2581a b', '\u2581 \u2581']},"
                      " 'added_tokens': [{'id':1,'content':'<s>','special':true,'normalized':false,'lstrip':false,"
                      "   'rstrip':false,'single_word':false}]";
  char j[1500];
  /* Llama-2: Prepend + Replace, no pre-tokenizer, the whole text one word */
  snprintf(j, sizeof j,
           "{%s, 'normalizer': {'type': 'Sequence', 'normalizers': [{'type': 'Prepend', 'prepend': '\u2581'},"
           "   {'type': 'Replace', 'pattern': {'String': ' '}, 'content': '\u2581'}]},"
           " 'decoder': {'type': 'Sequence', 'decoders': [{'type': 'Replace', 'pattern': {'String': '\u2581'}, 'content': ' '},"
           "   {'type': 'ByteFallback'}, {'type': 'Fuse'}, {'type': 'Strip', 'content': ' ', 'start': 1, 'stop': 0}]}}",
           vocab);
  pw_tokenizer *t = load(j);
  IDS(t, "ab a  b", 0, 7, 5, 8, 4);
  IDS(t, "<s>ab", 0, 1, 7); /* each piece between added tokens gets its ▁ */
  IDS(t, "a\xc3\xa9", 0, 5, 0); /* é is unknown: unk */
  TEXT(t, 0, "ab a  b", 7, 5, 8, 4);
  pw_tokenizer_close(t);
  /* Mistral's newer files: Metaspace, prepend only at the start of the text */
  snprintf(j, sizeof j,
           "{%s, 'pre_tokenizer': {'type': 'Metaspace', 'replacement': '\u2581', 'prepend_scheme': 'first', 'split': false},"
           " 'decoder': {'type': 'Metaspace', 'replacement': '\u2581', 'prepend_scheme': 'first', 'split': false}}",
           vocab);
  t = load(j);
  IDS(t, "ab a", 0, 7, 5);
  IDS(t, "<s>ab", 0, 1, 6); /* not at the start: no ▁ */
  TEXT(t, 0, "ab a", 7, 5);
  pw_tokenizer_close(t);
}

static void test_nfc(void **state) {
  (void)state;
  pw_tokenizer *t = load("{'normalizer': {'type': 'NFC'}, 'model': {'type': 'BPE', 'vocab': {'e':0,'\u00e9':1,'\u0301':2},"
                         " 'merges': []}}");
  IDS(t, "e\xcc\x81" "e", 0, 1, 0); /* e + combining acute is é */
  pw_tokenizer_close(t);
}

static void expect_refused(const char *sq, int code, const char *path, const char *words) {
  pw_tokenizer *t = NULL;
  pw_err err = {0};
  int rc = try_load(sq, &t, &err);
  if (rc != code || strcmp(err.path, path) || !strstr(err.msg, words))
    fail_msg("want %s at '%s' saying '%s'; got %s at '%s': %s (%s)", pw_err_name(code), path, words, pw_err_name(rc),
             err.path, err.msg, sq);
  assert_null(t);
}

#define BPE "'model': {'type': 'BPE', 'vocab': {'a':0,'b':1,'ab':2}, 'merges': ['a b']}"

static void test_refused(void **state) {
  (void)state;
  expect_refused("{'model': {'type': 'WordPiece', 'vocab': {'a': 0}}}", PW_ENOTSUP, "model.type", "WordPiece is not supported");
  expect_refused("{'model': {'type': 'Unigram', 'vocab': [['a', 0.0]]}}", PW_ENOTSUP, "model.type", "Unigram");
  expect_refused("{'model': {'type': 'WordLevel', 'vocab': {'a': 0}}}", PW_ENOTSUP, "model.type", "WordLevel");
  expect_refused("{" BPE ", 'normalizer': {'type': 'Lowercase'}}", PW_ENOTSUP, "normalizer.type", "Lowercase");
  expect_refused("{" BPE ", 'pre_tokenizer': {'type': 'Sequence', 'pretokenizers': [{'type': 'ByteLevel'},"
                 " {'type': 'Digits', 'individual_digits': true}]}}",
                 PW_ENOTSUP, "pre_tokenizer.pretokenizers[1].type", "Digits");
  expect_refused("{" BPE ", 'decoder': {'type': 'WordPiece', 'prefix': '##'}}", PW_ENOTSUP, "decoder.type", "WordPiece");
  expect_refused("{" BPE ", 'post_processor': {'type': 'Foo'}}", PW_ENOTSUP, "post_processor.type", "Foo");
  expect_refused("{" BPE ", 'truncation': {'max_length': 8}}", PW_ENOTSUP, "truncation", "set it to null");
  expect_refused("{" BPE ", 'padding': {'strategy': {'Fixed': 8}}}", PW_ENOTSUP, "padding", "set it to null");
  expect_refused("{'model': {'type': 'BPE', 'dropout': 0.1, 'vocab': {'a':0}, 'merges': []}}", PW_ENOTSUP, "model.dropout",
                 "dropout");
  expect_refused("{'model': {'type': 'BPE', 'vocab': {'a':0,'b':1}, 'merges': ['a c']}}", PW_EFORMAT, "model.merges",
                 "\"c\" is not in the vocabulary");
  expect_refused("{'model': {'type': 'BPE', 'vocab': {'a':0,'b':1}, 'merges': ['a b']}}", PW_EFORMAT, "model.merges",
                 "merged token \"ab\"");
  expect_refused("{'model': {'type': 'BPE', 'vocab': {'a':0,'b':1}, 'merges': ['a b c']}}", PW_EFORMAT, "model.merges",
                 "one space");
  expect_refused("{'model': {'type': 'BPE', 'vocab': {'a':0,'b':0}, 'merges': []}}", PW_EFORMAT, "model.vocab",
                 "given to both");
  expect_refused("{'model': {'type': 'BPE', 'vocab': {'a':-1}, 'merges': []}}", PW_EFORMAT, "model.vocab", "id must be");
  expect_refused("{'model': {'type': 'BPE', 'unk_token': '<unk>', 'vocab': {'a':0}, 'merges': []}}", PW_EFORMAT,
                 "model.unk_token", "not in the vocabulary");
  expect_refused("{" BPE ", 'pre_tokenizer': {'type': 'Split', 'pattern': {'Regex': '(a'}, 'behavior': 'Isolated',"
                 " 'invert': false}}",
                 PW_EFORMAT, "pre_tokenizer.pattern", "bad regex");
  expect_refused("{" BPE ", 'pre_tokenizer': {'type': 'Split', 'pattern': {'Regex': 'a'}, 'behavior': 'Sideways',"
                 " 'invert': false}}",
                 PW_ENOTSUP, "pre_tokenizer.behavior", "Isolated");
  expect_refused("{" BPE ", 'pre_tokenizer': {'type': 'Sequence', 'pretokenizers': [{'type': 'ByteLevel'},"
                 " {'type': 'Metaspace', 'replacement': '_'}]}}",
                 PW_ENOTSUP, "pre_tokenizer", "ByteLevel followed by other steps");
  expect_refused("{" BPE ", 'post_processor': {'type': 'TemplateProcessing', 'single': [{'Sequence': {'id': 'B',"
                 " 'type_id': 0}}], 'special_tokens': {}}}",
                 PW_ENOTSUP, "post_processor.single[0]", "sequence A");
  expect_refused("{" BPE ", 'post_processor': {'type': 'TemplateProcessing', 'single': [{'SpecialToken': {'id': '<x>',"
                 " 'type_id': 0}}], 'special_tokens': {}}}",
                 PW_EFORMAT, "post_processor.single[0]", "not in special_tokens");
  expect_refused("{'model': {'type': 'BPE'", PW_EJSON, "tokenizer", "line 1");
  expect_refused("{'version': '2.0', " BPE "}", PW_ENOTSUP, "version", "1.0");
  expect_refused("{'model': {'type': 'BPE', 'vocab': {'a':0}}}", PW_EFORMAT, "model.merges", "missing");
}

static void test_bad_text_and_ids(void **state) {
  (void)state;
  pw_tokenizer *t = load("{" BPE "}");
  pw_tok_ids ids = {0};
  pw_err err = {0};
  assert_int_equal(pw_tokenizer_encode(t, "ab\xff", 3, 0, &ids, &err), PW_EFORMAT);
  assert_string_equal(err.path, "text");
  assert_non_null(strstr(err.msg, "byte 2"));
  assert_int_equal(ids.n, 0);
  assert_int_equal(pw_tokenizer_encode(t, "a\xed\xa0\x80", 4, 0, &ids, &err), PW_EFORMAT); /* a surrogate */
  uint32_t bad[] = {0, 7};
  char *out = NULL;
  size_t on;
  assert_int_equal(pw_tokenizer_decode(t, bad, 2, 0, &out, &on, &err), PW_EFORMAT);
  assert_string_equal(err.path, "ids");
  assert_non_null(strstr(err.msg, "id 7 (at 1)"));
  assert_null(out);
  /* encode appends */
  assert_int_equal(pw_tokenizer_encode(t, "ab", 2, 0, &ids, &err), 0);
  assert_int_equal(pw_tokenizer_encode(t, "ba", 2, 0, &ids, &err), 0);
  assert_int_equal(ids.n, 3);
  assert_int_equal(ids.v[0], 2);
  assert_int_equal(ids.v[2], 0);
  free(ids.v);
  pw_tokenizer_close(t);
  assert_int_equal(pw_tokenizer_open("/nonexistent/tokenizer.json", &t, &err), PW_ENOENT);
  assert_null(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_merges_by_rank), cmocka_unit_test(test_byte_fallback), cmocka_unit_test(test_added_tokens),
      cmocka_unit_test(test_byte_level),     cmocka_unit_test(test_metaspace),     cmocka_unit_test(test_nfc),
      cmocka_unit_test(test_refused),        cmocka_unit_test(test_bad_text_and_ids),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
