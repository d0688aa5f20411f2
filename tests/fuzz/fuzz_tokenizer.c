/* fuzz_tokenizer: tokenizers (common/text/tokenizer.h) on any input.
 *
 * First byte even: the rest is a tokenizer.json. When it loads, a fixed
 * set of texts encodes (and bytes that are not UTF-8 are refused), every
 * id is below the vocabulary size, and ids encoded without the template
 * decode. First byte odd: the rest is text for two fixed tokenizers, a
 * byte-level one (Llama-3's pattern, merges, added tokens) whose decode
 * must give the text back exactly when it is UTF-8, and a byte-fallback
 * one (Prepend + Replace, Llama-2's decoders) whose ids must decode. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *texts[] = {
    "Hello, world! It's 2024.",
    "  spaces\t\ttabs\n\nlines \r\n",
    "\xf0\x9f\x98\x80 \xe6\xbc\xa2\xe5\xad\x97 e\xcc\x81 \xe2\x96\x81x",
    "<s>a</s><|endoftext|>[MASK] <mask>",
    "",
};

/* text -> ids -> text; with exact = 1 the text must come back as it was. */
static void round_trip(pw_tokenizer *tok, const char *text, size_t n, int exact) {
  pw_tok_ids ids = {0};
  pw_err err = {0};
  int rc = pw_tokenizer_encode(tok, text, n, 0, &ids, &err);
  if (rc) {
    if (rc != PW_EFORMAT && rc != PW_ETOOBIG) abort(); /* only text that is not UTF-8, or a regex past its limits */
    free(ids.v);
    return;
  }
  for (size_t i = 0; i < ids.n; i++)
    if (ids.v[i] >= pw_tokenizer_vocab_size(tok)) abort();
  char *out = NULL;
  size_t on = 0;
  if (pw_tokenizer_decode(tok, ids.v, ids.n, 0, &out, &on, &err)) abort(); /* ids it made must decode */
  if (exact && (on != n || memcmp(out, text, n))) abort();
  free(out);
  ids.n = 0;
  if (pw_tokenizer_encode(tok, text, n, PW_TOK_ADD_SPECIAL, &ids, &err) == 0)
    for (size_t i = 0; i < ids.n; i++)
      if (ids.v[i] >= pw_tokenizer_vocab_size(tok)) abort();
  free(ids.v);
}

static pw_tokenizer *g_bytes, *g_sp;

static pw_tokenizer *make(json_t *root) {
  char *j = json_dumps(root, 0);
  json_decref(root);
  pw_tokenizer *t = NULL;
  pw_err err = {0};
  if (!j || pw_tokenizer_from_json(j, strlen(j), &t, &err)) {
    fprintf(stderr, "fuzz_tokenizer: the fixed tokenizer: %s: %s\n", err.path, err.msg);
    abort();
  }
  free(j);
  return t;
}

static void init(void) {
  /* byte-level: the 256 GPT-2 characters, a few merges, two added tokens */
  json_t *vocab = json_object();
  int extra = 256;
  for (int b = 0, k = 0; b < 256; b++) {
    int self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE, cp = self ? b : 256 + k++;
    char c[3] = {0};
    if (cp < 0x80) c[0] = (char)cp;
    else c[0] = (char)(0xC0 | cp >> 6), c[1] = (char)(0x80 | (cp & 0x3F));
    json_object_set_new(vocab, c, json_integer(b));
  }
  const char *merged[] = {"he", "ll", "hell", "hello", "\xc4\xa0t", "\xc4\xa0th", "\xc4\xa0the"};
  for (int i = 0; i < 7; i++) json_object_set_new(vocab, merged[i], json_integer(extra++));
  json_t *bytes = json_pack(
      "{s:{s:s, s:o, s:[s,s,s,s,s,s,s], s:b}, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]},"
      " s:{s:s}, s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}, {s:i, s:s, s:b, s:b, s:b, s:b, s:b}]}",
      "model", "type", "BPE", "vocab", vocab, "merges", "h e", "l l", "he ll", "hell o", "\xc4\xa0 t", "\xc4\xa0t h",
      "\xc4\xa0th e", "ignore_merges", 1, "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split",
      "pattern", "Regex",
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
      "\\s+(?!\\S)|\\s+",
      "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
      "decoder", "type", "ByteLevel", "added_tokens", "id", extra, "content", "<|endoftext|>", "special", 1, "normalized",
      0, "lstrip", 0, "rstrip", 0, "single_word", 0, "id", extra + 1, "content", "hello world", "special", 0, "normalized",
      1, "lstrip", 0, "rstrip", 0, "single_word", 0);
  g_bytes = make(bytes);
  /* byte fallback: <0x00>..<0xFF>, ▁ words, Llama-2's normalizer and decoders */
  vocab = json_pack("{s:i, s:i, s:i}", "<unk>", 0, "<s>", 1, "</s>", 2);
  for (int b = 0; b < 256; b++) {
    char c[8];
    snprintf(c, sizeof c, "<0x%02X>", b);
    json_object_set_new(vocab, c, json_integer(3 + b));
  }
  const char *sp[] = {"\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab"};
  for (int i = 0; i < 6; i++) json_object_set_new(vocab, sp[i], json_integer(259 + i));
  json_t *fallback = json_pack(
      "{s:{s:s, s:s, s:b, s:b, s:o, s:[s,s,s]}, s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]},"
      " s:{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]},"
      " s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}],"
      " s:{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[], s:{s:{s:s, s:[i], s:[s]}}}}",
      "model", "type", "BPE", "unk_token", "<unk>", "byte_fallback", 1, "fuse_unk", 1, "vocab", vocab, "merges",
      "\xe2\x96\x81 a", "a b", "\xe2\x96\x81" "a b", "normalizer", "type", "Sequence", "normalizers", "type", "Prepend",
      "prepend", "\xe2\x96\x81", "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81", "decoder", "type",
      "Sequence", "decoders", "type", "Replace", "pattern", "String", "\xe2\x96\x81", "content", " ", "type",
      "ByteFallback", "type", "Fuse", "type", "Strip", "content", " ", "start", 1, "stop", 0, "added_tokens", "id", 1,
      "content", "<s>", "special", 1, "normalized", 0, "lstrip", 0, "rstrip", 0, "single_word", 0, "post_processor",
      "type", "TemplateProcessing", "single", "SpecialToken", "id", "<s>", "type_id", 0, "Sequence", "id", "A", "type_id",
      0, "pair", "special_tokens", "<s>", "id", "<s>", "ids", 1, "tokens", "<s>");
  g_sp = make(fallback);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_bytes) init();
  if (size < 1) return 0;
  const char *rest = (const char *)data + 1;
  size_t n = size - 1;
  if (data[0] & 1) {
    round_trip(g_bytes, rest, n, 1);
    round_trip(g_sp, rest, n, 0);
    return 0;
  }
  pw_tokenizer *tok = NULL;
  pw_err err = {0};
  if (pw_tokenizer_from_json(rest, n, &tok, &err)) {
    if (tok || !err.msg[0]) abort(); /* a refusal says why and leaves nothing */
    return 0;
  }
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) round_trip(tok, texts[i], strlen(texts[i]), 0);
  round_trip(tok, "ok \xff\xfe", 5, 0); /* not UTF-8: refused */
  pw_tokenizer_close(tok);
  return 0;
}
