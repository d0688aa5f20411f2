/* tokenizer: text <-> token ids with a Hugging Face tokenizer.json, giving
 * the ids the `tokenizers` library gives for the same file and text.
 *
 * What it reads (anything else that would change the ids is refused at
 * load with PW_ENOTSUP naming the field and its value, never ignored):
 *   model           BPE: vocab, merges ("a b" strings or [a, b] pairs),
 *                   unk_token, fuse_unk, byte_fallback (<0xNN> tokens),
 *                   ignore_merges, continuing_subword_prefix,
 *                   end_of_word_suffix; dropout only null or 0
 *   normalizer      NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence, null
 *   pre_tokenizer   ByteLevel, Split (a regex or string; every behavior;
 *                   invert), Metaspace, Sequence, null
 *   post_processor  TemplateProcessing (the single-sequence template),
 *                   BertProcessing, RobertaProcessing, ByteLevel, Sequence,
 *                   null
 *   decoder         ByteLevel, Metaspace, Replace, ByteFallback, Fuse,
 *                   Strip, Sequence, null
 *   added_tokens    split out before the model, as the file says: special,
 *                   normalized, lstrip, rstrip, single_word
 *   truncation      null only; padding null or BatchLongest without
 *                   pad_to_multiple_of (neither changes one text's ids)
 * That covers GPT-2, Llama-3 and Qwen2 (byte-level BPE: ByteLevel or
 * Split + ByteLevel) and Llama-2, Mistral and Gemma (BPE with byte
 * fallback, Metaspace or Prepend + Replace("▁")).
 *
 * Regexes run on PCRE2 with UTF and Unicode properties (JIT when the
 * platform has it); NFC and the other normalization forms on utf8proc.
 *
 * A tokenizer is not safe to share between threads: encode and decode use
 * its word cache and scratch buffers. One per thread, or a lock. */
#ifndef PW_TOKENIZER_H
#define PW_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_TOKENIZER_MAX_FILE (512u << 20) /* bytes of a tokenizer.json */
#define PW_TOKENIZER_MAX_VOCAB (1 << 24)   /* ids are below this */
#define PW_TOKENIZER_MAX_TEXT (1u << 30)   /* bytes of one text to encode */

typedef struct pw_tokenizer pw_tokenizer;

/* Reads the tokenizer.json at path into *out. Errors: PW_ENOENT / PW_EIO
 * (the file), PW_EJSON (not JSON), PW_EFORMAT (a field of the wrong shape
 * or value), PW_ENOTSUP (a type or option not implemented: err->path is
 * the field, "model.type", "pre_tokenizer.pretokenizers[1].type", ...),
 * PW_ETOOBIG (past a bound above). Nothing is allocated on failure. */
PW_MUST_CHECK int pw_tokenizer_open(const char *path, pw_tokenizer **out, pw_err *err);
/* The same from the JSON text json[0..n); errors name fields as above. */
PW_MUST_CHECK int pw_tokenizer_from_json(const char *json, size_t n, pw_tokenizer **out, pw_err *err);
void pw_tokenizer_close(pw_tokenizer *tok);

/* Largest id (model vocabulary or added token) + 1. */
uint32_t pw_tokenizer_vocab_size(const pw_tokenizer *tok);
/* The id of a token string (an added token's content, else the model's
 * vocabulary), or -1. */
int64_t pw_tokenizer_token_id(const pw_tokenizer *tok, const char *s);
/* One line about the file: "BPE, byte-level, 50257 ids, 1 added tokens". */
const char *pw_tokenizer_describe(const pw_tokenizer *tok);

enum {
  PW_TOK_ADD_SPECIAL = 1,  /* encode: run the post_processor (BOS etc.), as add_special_tokens=True */
  PW_TOK_SKIP_SPECIAL = 2, /* decode: leave out special tokens, as skip_special_tokens=True */
};

/* A growable list of ids: encode appends to it (v realloc'd); free(v) when done. */
typedef struct {
  uint32_t *v;
  size_t n, cap;
} pw_tok_ids;

/* Encodes text[0..n), which must be UTF-8 (else PW_EFORMAT naming the
 * byte offset), appending its ids to *ids. On failure *ids keeps what it
 * had before the call. */
PW_MUST_CHECK int pw_tokenizer_encode(pw_tokenizer *tok, const char *text, size_t n, int flags, pw_tok_ids *ids,
                                      pw_err *err);
/* Decodes ids[0..n) to text: *out malloc'd, NUL-terminated, *out_n bytes
 * without the NUL. An id with no token is PW_EFORMAT naming its index. */
PW_MUST_CHECK int pw_tokenizer_decode(pw_tokenizer *tok, const uint32_t *ids, size_t n, int flags, char **out,
                                      size_t *out_n, pw_err *err);

#endif
