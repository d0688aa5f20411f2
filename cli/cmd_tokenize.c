/* cmd_tokenize: `pipewright tokenize` — text to token ids and back with a
 * Hugging Face tokenizer.json (common/text/tokenizer.h): the ids the
 * `tokenizers` library gives, printed or written as a token file that a
 * job's data can name (docs/contracts.md, "Token files"). Exit codes: 0
 * done, 1 a file or tokenizer error (named on stderr; nothing is written),
 * 2 bad usage. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "args.h"
#include "cli.h"
#include "json_short.h"
#include "tokenizer.h"
#include "tokfile.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pipewright tokenize --tokenizer FILE [--in TEXT] [--out TOKENS] [options]\n"
          "       pipewright tokenize --tokenizer FILE --decode [--in TOKENS] [--out TEXT] [--skip-special]\n"
          "  --tokenizer FILE   a Hugging Face tokenizer.json (BPE: GPT-2, Llama-3, Qwen2, Llama-2,\n"
          "                     Mistral, Gemma and the like)\n"
          "  --in FILE          the input (default: standard input): UTF-8 text, or with --decode a\n"
          "                     token file or ids separated by whitespace or commas\n"
          "  --out FILE         encode: a token file (2-byte ids up to 65536 ids, else 4), written to a\n"
          "                     temporary name and renamed; without it the ids are printed on one line\n"
          "                     decode: the text (default: standard output)\n"
          "  --decode           ids -> text\n"
          "  --jsonl            one document per line: encode reads a JSON string or an object with a\n"
          "                     \"text\" string per line and prints a JSON array of ids per line (with\n"
          "                     --out, every document's ids one after another, each with its template);\n"
          "                     --decode reads an array of ids per line and prints a JSON string per line\n"
          "  --no-add-special   encode without the post_processor's tokens (BOS and the like)\n"
          "  --skip-special     decode without the special tokens\n"
          "  --help\n");
}

/* The whole of path ("-" or NULL: standard input), at most max bytes. */
static char *slurp(const char *path, size_t max, size_t *n) {
  FILE *f = path && strcmp(path, "-") ? fopen(path, "rb") : stdin;
  const char *name = path ? path : "standard input";
  if (!f) return fprintf(stderr, "error: %s: %s\n", name, strerror(errno)), NULL;
  char *buf = NULL;
  size_t cap = 0;
  *n = 0;
  for (;;) {
    if (*n == cap) {
      if (cap > max) {
        fprintf(stderr, "error: %s: larger than %zu bytes\n", name, max);
        break;
      }
      cap = cap ? cap * 2 : 1 << 16;
      char *nb = realloc(buf, cap + 1);
      if (!nb) {
        fprintf(stderr, "error: %s: out of memory\n", name);
        break;
      }
      buf = nb;
    }
    size_t k = fread(buf + *n, 1, cap - *n, f);
    *n += k;
    if (k == 0) {
      if (ferror(f)) {
        fprintf(stderr, "error: %s: %s\n", name, strerror(errno));
        break;
      }
      if (f != stdin) fclose(f);
      buf[*n] = 0;
      return buf;
    }
  }
  if (f != stdin) fclose(f);
  free(buf);
  return NULL;
}

static int write_all(FILE *f, const char *s, size_t n) { return fwrite(s, 1, n, f) == n ? 0 : -1; }

/* Text to a file by a temporary name, synced and renamed. */
static int write_text(const char *out, const char *s, size_t n) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid()) >= (int)sizeof tmp)
    return fprintf(stderr, "error: %s: path too long\n", out), 1;
  FILE *f = fopen(tmp, "wb");
  if (!f) return fprintf(stderr, "error: %s: %s\n", tmp, strerror(errno)), 1;
  int bad = write_all(f, s, n) || fflush(f) || fsync(fileno(f));
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, out)) {
    fprintf(stderr, "error: %s: %s\n", out, strerror(errno));
    unlink(tmp);
    return 1;
  }
  return 0;
}

static int print_ids(const uint32_t *ids, size_t n) {
  char buf[1 << 16];
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (k > sizeof buf - 16) {
      if (write_all(stdout, buf, k)) return 1;
      k = 0;
    }
    k += (size_t)snprintf(buf + k, sizeof buf - k, i ? " %u" : "%u", ids[i]);
  }
  buf[k++] = '\n';
  return write_all(stdout, buf, k) || fflush(stdout) ? 1 : 0;
}

/* A token file's ids, or decimal ids separated by whitespace or commas. */
static int read_ids(const char *what, const char *buf, size_t n, uint32_t vocab, pw_tok_ids *ids) {
  if (pw_tokfile_is_tokens((const uint8_t *)buf, n)) {
    pw_tokfile_hdr h;
    pw_err err = {0};
    if (pw_tokfile_header_parse((const uint8_t *)buf, n, n, &h, what, &err) ||
        pw_tokfile_check_ids((const uint8_t *)buf + PW_TOKFILE_HEADER, h.n_tokens, 0, &h, what, &err))
      return pw_cli_report(&err), 1;
    if (h.vocab_size != vocab)
      return fprintf(stderr, "error: %s: a token file of %u ids; the tokenizer has %u: made with another tokenizer?\n",
                     what, h.vocab_size, vocab), 1;
    if (!(ids->v = malloc((h.n_tokens + 1) * sizeof *ids->v))) return fprintf(stderr, "error: out of memory\n"), 1;
    for (uint64_t i = 0; i < h.n_tokens; i++) ids->v[i] = pw_tokfile_id((const uint8_t *)buf + PW_TOKFILE_HEADER, h.width, i);
    ids->n = ids->cap = h.n_tokens;
    return 0;
  }
  for (size_t i = 0; i < n;) {
    while (i < n && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\t' || buf[i] == '\r' || buf[i] == ',')) i++;
    if (i == n) break;
    unsigned long long v = 0;
    size_t j = i;
    while (j < n && buf[j] >= '0' && buf[j] <= '9' && v < PW_TOKENIZER_MAX_VOCAB) v = v * 10 + (unsigned)(buf[j++] - '0');
    if (j == i || (j < n && !strchr(" \n\t\r,", buf[j])) || v >= PW_TOKENIZER_MAX_VOCAB)
      return fprintf(stderr, "error: %s: id %zu ('%.20s') is not a whole number below %d\n", what, ids->n, buf + i,
                     PW_TOKENIZER_MAX_VOCAB), 1;
    if (ids->n == ids->cap) {
      size_t cap = ids->cap ? 2 * ids->cap : 1024;
      uint32_t *p = realloc(ids->v, cap * sizeof *p);
      if (!p) return fprintf(stderr, "error: out of memory\n"), 1;
      ids->v = p, ids->cap = cap;
    }
    ids->v[ids->n++] = (uint32_t)v;
    i = j;
  }
  return 0;
}

/* --jsonl: each line a document (a JSON string, or {"text": ...}) encoded on
 * its own; a JSON array of ids per line, or all of them into *all (--out). */
static int jsonl_encode(pw_tokenizer *tok, const char *what, const char *buf, size_t n, int flags, pw_tok_ids *all) {
  pw_tok_ids ids = {0};
  int rc = 0;
  size_t line = 0;
  for (size_t i = 0; !rc && i < n; line++) {
    const char *e = memchr(buf + i, '\n', n - i);
    size_t j = e ? (size_t)(e - buf) : n, k;
    json_error_t je;
    json_t *doc = j > i ? json_loadb(buf + i, j - i, JSON_DECODE_ANY, &je) : NULL, *t = json_is_object(doc) ? json_object_get(doc, "text") : doc;
    pw_err err = {0};
    if (j == i || (j == i + 1 && buf[i] == '\r')) {
      /* a blank line is no document */
    } else if (!json_is_string(t)) {
      rc = 1, fprintf(stderr, "error: %s: line %zu: not a JSON string or an object with a \"text\" string\n", what, line + 1);
    } else if (pw_tokenizer_encode(tok, json_string_value(t), json_string_length(t), flags, all ? all : &ids, &err)) {
      rc = 1, fprintf(stderr, "error: %s: line %zu: %s: %s\n", what, line + 1, err.path, err.msg);
    } else if (!all) {
      json_t *a = json_array();
      for (k = 0; a && k < ids.n; k++) json_array_append_new(a, json_integer(ids.v[k]));
      char *out = a ? pw_json_dumps(a, JSON_COMPACT) : NULL;
      if (!out || puts(out) < 0) rc = 1, fprintf(stderr, "error: cannot print the ids\n");
      free(out);
      json_decref(a);
      ids.n = 0;
    }
    json_decref(doc);
    i = j + 1;
  }
  free(ids.v);
  return rc || fflush(stdout) ? 1 : 0;
}

/* --decode --jsonl: an array of ids per line -> a JSON string per line. */
static int jsonl_decode(pw_tokenizer *tok, const char *what, const char *buf, size_t n, int flags) {
  int rc = 0;
  size_t line = 0;
  for (size_t i = 0; !rc && i < n; line++) {
    const char *e = memchr(buf + i, '\n', n - i);
    size_t j = e ? (size_t)(e - buf) : n;
    json_error_t je;
    json_t *a = j > i ? json_loadb(buf + i, j - i, 0, &je) : NULL;
    size_t m = json_array_size(a), k;
    uint32_t *ids = malloc((m + 1) * sizeof *ids);
    for (k = 0; ids && k < m; k++) {
      json_t *v = json_array_get(a, k);
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX) break;
      ids[k] = (uint32_t)json_integer_value(v);
    }
    char *text = NULL, *out = NULL;
    size_t tn;
    pw_err err = {0};
    if (j == i || (j == i + 1 && buf[i] == '\r')) {
      /* blank */
    } else if (!json_is_array(a) || !ids || k < m) {
      rc = 1, fprintf(stderr, "error: %s: line %zu: not a JSON array of ids\n", what, line + 1);
    } else if (pw_tokenizer_decode(tok, ids, m, flags, &text, &tn, &err)) {
      rc = 1, fprintf(stderr, "error: %s: line %zu: %s: %s\n", what, line + 1, err.path, err.msg);
    } else {
      json_t *s = json_stringn_nocheck(text, tn);
      out = s ? pw_json_dumps(s, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
      if (!out || puts(out) < 0) rc = 1, fprintf(stderr, "error: cannot print the text\n");
      json_decref(s);
    }
    free(out), free(text), free(ids);
    json_decref(a);
    i = j + 1;
  }
  return rc || fflush(stdout) ? 1 : 0;
}

int pw_cmd_tokenize(int argc, char **argv) {
  static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'}, {"in", required_argument, 0, 'i'},
                                       {"out", required_argument, 0, 'o'},       {"decode", no_argument, 0, 'd'},
                                       {"no-add-special", no_argument, 0, 'n'},  {"skip-special", no_argument, 0, 's'},
                                       {"jsonl", no_argument, 0, 'j'},           {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *tpath = NULL, *in = NULL, *out = NULL;
  int decode = 0, add_special = 1, skip_special = 0, jsonl = 0, o;
  optind = 1;
  while ((o = pw_getopt(argc, argv, "", opts)) != -1) {
    if (o == 't') tpath = optarg;
    else if (o == 'i') in = optarg;
    else if (o == 'o') out = optarg;
    else if (o == 'd') decode = 1;
    else if (o == 'n') add_special = 0;
    else if (o == 's') skip_special = 1;
    else if (o == 'j') jsonl = 1;
    else if (o == 'h') return usage(stdout), 0;
    else return usage(stderr), 2;
  }
  if (pw_args_operands(argc, argv, 0, 0, "") < 0 || pw_args_required(tpath, "--tokenizer FILE") < 0)
    return usage(stderr), 2;
  if (decode && !add_special) return pw_cli_usage_error("--no-add-special is for encoding"), usage(stderr), 2;
  if (!decode && skip_special) return pw_cli_usage_error("--skip-special is for --decode"), usage(stderr), 2;

  pw_tokenizer *tok;
  pw_err err = {0};
  if (pw_tokenizer_open(tpath, &tok, &err)) return pw_cli_report(&err), 1;
  size_t n;
  char *buf = slurp(in, decode ? (size_t)PW_TOKFILE_HEADER + 4ull * PW_TOKENIZER_MAX_TEXT : PW_TOKENIZER_MAX_TEXT, &n);
  int rc = buf ? 0 : 1;
  const char *what = in ? in : "standard input";
  pw_tok_ids ids = {0};
  if (!rc && jsonl && decode) {
    rc = jsonl_decode(tok, what, buf, n, skip_special ? PW_TOK_SKIP_SPECIAL : 0);
  } else if (!rc && jsonl && !out) {
    rc = jsonl_encode(tok, what, buf, n, add_special ? PW_TOK_ADD_SPECIAL : 0, NULL);
  } else if (!rc && decode) {
    char *text = NULL;
    size_t tn = 0;
    rc = read_ids(what, buf, n, pw_tokenizer_vocab_size(tok), &ids);
    if (!rc && pw_tokenizer_decode(tok, ids.v, ids.n, skip_special ? PW_TOK_SKIP_SPECIAL : 0, &text, &tn, &err))
      rc = 1, pw_cli_report(&err);
    if (!rc) rc = out ? write_text(out, text, tn) : write_all(stdout, text, tn) || fflush(stdout) ? 1 : 0;
    free(text);
  } else if (!rc) {
    int flags = add_special ? PW_TOK_ADD_SPECIAL : 0;
    if (jsonl) {
      rc = jsonl_encode(tok, what, buf, n, flags, &ids);
    } else if (pw_tokenizer_encode(tok, buf, n, flags, &ids, &err)) {
      if (!strcmp(err.path, "text")) snprintf(err.path, sizeof err.path, "%s", what);
      rc = 1, pw_cli_report(&err);
    }
    if (rc) {
    } else if (out) {
      pw_tokfile_hdr h;
      if (pw_tokfile_write(out, ids.v, ids.n, pw_tokenizer_vocab_size(tok), &h, &err)) rc = 1, pw_cli_report(&err);
      else
        printf("%s: %llu tokens, vocab %u, %u-byte ids (%s: %s)\n", out, (unsigned long long)h.n_tokens, h.vocab_size,
               h.width, tpath, pw_tokenizer_describe(tok));
    } else {
      rc = print_ids(ids.v, ids.n);
    }
  }
  free(ids.v);
  free(buf);
  pw_tokenizer_close(tok);
  return rc;
}
