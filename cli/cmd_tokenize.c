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

#include "args.h"
#include "cli.h"
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

int pw_cmd_tokenize(int argc, char **argv) {
  static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'}, {"in", required_argument, 0, 'i'},
                                       {"out", required_argument, 0, 'o'},       {"decode", no_argument, 0, 'd'},
                                       {"no-add-special", no_argument, 0, 'n'},  {"skip-special", no_argument, 0, 's'},
                                       {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
  const char *tpath = NULL, *in = NULL, *out = NULL;
  int decode = 0, add_special = 1, skip_special = 0, o;
  optind = 1;
  while ((o = pw_getopt(argc, argv, "", opts)) != -1) {
    if (o == 't') tpath = optarg;
    else if (o == 'i') in = optarg;
    else if (o == 'o') out = optarg;
    else if (o == 'd') decode = 1;
    else if (o == 'n') add_special = 0;
    else if (o == 's') skip_special = 1;
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
  if (!rc && decode) {
    char *text = NULL;
    size_t tn = 0;
    rc = read_ids(what, buf, n, pw_tokenizer_vocab_size(tok), &ids);
    if (!rc && pw_tokenizer_decode(tok, ids.v, ids.n, skip_special ? PW_TOK_SKIP_SPECIAL : 0, &text, &tn, &err))
      rc = 1, pw_cli_report(&err);
    if (!rc) rc = out ? write_text(out, text, tn) : write_all(stdout, text, tn) || fflush(stdout) ? 1 : 0;
    free(text);
  } else if (!rc) {
    if (pw_tokenizer_encode(tok, buf, n, add_special ? PW_TOK_ADD_SPECIAL : 0, &ids, &err)) {
      if (!strcmp(err.path, "text")) snprintf(err.path, sizeof err.path, "%s", what);
      rc = 1, pw_cli_report(&err);
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
