/* data: batches as a pure function of (dataset, seed, split, step, index).
 *
 * Nothing here keeps a cursor: pw_dataset_batch draws any sequence of any
 * step on demand, so the first pipeline stage and the last can each draw
 * their half of the same microbatch. All randomness comes from rng.h.
 *
 * Keys. split_tag = pw_hash_str("train") or pw_hash_str("eval"), and
 *   key(split, k, i) = hash64(hash64(hash64(seed, split_tag), k), i)
 * for sequence i (0-based within the batch) of step k (both as uint64).
 *
 * text (vocab 256): the file is read whole (at most 1 GiB). With L bytes,
 *   E = floor(L * eval_fraction) trailing bytes are the eval split and the
 *   first N = L - E the train split. Each split needs at least T + 2 bytes.
 *   For a split of length S, M = S - T - 1, a sequence starts at
 *     sequential: o = ((k * batch_size + i) * T) mod M   (exact: no overflow)
 *     random:     o = key(train, k, i) mod M
 *   inputs are bytes o .. o+T-1 of the split, targets o+1 .. o+T, as int32.
 *   Eval batches always use the sequential rule over the eval split.
 *
 * tokens: a token file (tokfile.h): the same rules over its ids instead of
 *   bytes (L = n_tokens), so a text file and its byte-level conversion give
 *   the same batches. Every id is checked at open, and the file's
 *   vocab_size must not exceed the model's.
 *
 * A stored dataset (spec->dataset set) is read from spec->path, whose
 * bytes must hash (SHA-256) to the dataset's id.
 *
 * copy / reverse: a sequence is T+1 tokens s[0..T] drawn from
 *   pw_rng seeded with key(split, k, i). With h = T / 2 (T >= 2):
 *     s[0 .. h-1]     h symbols, each 1 + pw_rng_below(vocab - 1)
 *     s[h]            0, the separator
 *     s[h+1 .. 2h]    copy:    s[h+1+j] = s[j]
 *                     reverse: s[h+1+j] = s[h-1-j]
 *     s[2h+1]         0 (only when T is odd: padding)
 *   inputs = s[0 .. T-1], targets = s[1 .. T].
 *
 * regression / classify: a teacher matrix A (out_dim, in_dim), row-major
 *   doubles, drawn once at open: pw_rng seeded with
 *   hash64(seed, pw_hash_str("teacher")), A[o][j] = normal() / sqrt(in_dim),
 *   in row order. For sequence (k, i): pw_rng seeded with key(split, k, i),
 *   x[j] = (float)normal() for j < in_dim. y = A x in double from those floats.
 *     regression target: (float)tanh(y[o]), (n, out_dim)
 *     classify target:   int32 argmax_o y[o] (first on ties), (n)
 *
 * shift (tokens, vocab V, keys K): a key table E (K, D), D =
 *   shape->feature_dim, drawn once at open: pw_rng seeded with
 *   hash64(seed, pw_hash_str("keys")), E[c][j] = normal() in row order.
 *   For sequence (k, i): pw_rng seeded with key(split, k, i) draws, for
 *   t = 0 .. T-1 in turn, s[t] = 1 + below(V - 1), then c[t] = below(K).
 *     inputs   s[t] (int32, (n, T))
 *     features E[c[t]][j] as float ((n, T, D))
 *     targets  1 + ((s[t] - 1 + c[t]) mod (V - 1)) (int32, (n, T))
 *   Tokens alone leave the key unknown (loss ln K at best), features alone
 *   the token (ln (V - 1)); both together determine the target.
 *
 * The eval stream of synthetic kinds differs from the train stream only by
 * split_tag, so the two never share a sequence key.
 *
 * masked LM (text, tokens; shape->mlm_predictions = K > 0, the model's
 *   pad_token P or none, data.mask_token M): the window of sequence (k, i)
 *   is drawn as above (inputs o .. o+T-1; the next-token targets are not
 *   used), then corrupted by pw_mlm_corrupt(key(split, k, i), ...): pw_rng
 *   seeded with hash64(key(split, k, i), hash_str("mlm")) draws
 *     the positions: with p[0..n) the positions t (ascending) whose token
 *       is not P (all T without P), for j = 0 .. K-1 in turn
 *       s = j + below(n - j), swap p[j] and p[s]; p[0..K) are chosen
 *     their fate: for j = 0 .. K-1 in turn, u = below(10): u < 8 puts M
 *       at p[j], u = 8 a token below(vocab_size) (drawn then), u = 9 keeps
 *       the token
 *   targets: the window's token at p[0..K), -100 (PW_DATA_IGNORE)
 *   elsewhere. Open checks that every window of each split (o = 0 .. S -
 *   T - 2) holds at least K tokens other than P.
 *
 * labeled: N sequences from a JSON Lines file (data_labeled.c), each cut
 *   to T ids or filled with the pad token, and a label. The last
 *   E = floor(N * eval_fraction) are the eval split, the first N - E the
 *   train split (each needs one). For a split of S sequences, sequence
 *   (k, i) is number
 *     sequential: (k * batch_size + i) mod S   (exact)
 *     random:     key(train, k, i) mod S
 *   of the split: inputs its T ids (int32), target its label (int32, one
 *   per sequence). Eval batches always use the sequential rule. */
#include "data.h"
#include "data_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "rng.h"
#include "sha256.h"
#include "tokfile.h"

#define PW__DATA_MAX_FILE (1ull << 30)

struct pw_dataset {
  pw_data_kind kind;
  pw_sampler_kind sampler;
  pw_data_shape shape;
  uint64_t seed;
  uint64_t tag[2];     /* split tags: [PW_SPLIT_TRAIN], [PW_SPLIT_EVAL] */
  /* text, tokens */
  unsigned char *bytes; /* the whole file */
  const unsigned char *ids; /* the first id: bytes (text) or bytes + header (tokens) */
  unsigned width;      /* bytes per id: 1 (text), 2 or 4 */
  size_t len;          /* L, in ids */
  size_t train_len;    /* N; the eval split is ids N .. L-1 */
  /* regression, classify; shift: the key table (keys, feature_dim) */
  double *teacher;     /* (out_dim, in_dim) */
  int keys;            /* shift */
  int mask_token;      /* masked LM (shape.mlm_predictions > 0) */
  /* labeled: n_seq rows of T ids, their labels; the first train_seq train */
  int32_t *seq_ids, *seq_labels;
  size_t n_seq, train_seq;
};

static const char *kind_name(pw_data_kind k) {
  switch (k) {
    case PW_DATA_TEXT: return "text";
    case PW_DATA_COPY: return "copy";
    case PW_DATA_REVERSE: return "reverse";
    case PW_DATA_REGRESSION: return "regression";
    case PW_DATA_CLASSIFY: return "classify";
    case PW_DATA_TOKENS: return "tokens";
    case PW_DATA_SHIFT: return "shift";
    case PW_DATA_LABELED: return "labeled";
  }
  return "?";
}

static uint64_t seq_key(const pw_dataset *ds, pw_split split, long step, int i) {
  return pw_hash64(pw_hash64(pw_hash64(ds->seed, ds->tag[split]), (uint64_t)step), (uint64_t)i);
}

/* Reads path whole; errors name data.path. */
static int read_text(const char *path, unsigned char **out, size_t *out_len, pw_err *err) {
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return pw_err_set(err, errno == ENOENT ? PW_ENOENT : PW_EIO, "data.path", "cannot open %s: %s",
                      path, strerror(errno));
  struct stat st;
  if (fstat(fileno(fp), &st) < 0 || !S_ISREG(st.st_mode)) {
    fclose(fp);
    return pw_err_set(err, PW_EIO, "data.path", "%s is not a regular file", path);
  }
  if ((unsigned long long)st.st_size > PW__DATA_MAX_FILE) {
    fclose(fp);
    return pw_err_set(err, PW_ETOOBIG, "data.path", "%s has %lld bytes; the limit is 1 GiB", path,
                      (long long)st.st_size);
  }
  size_t len = (size_t)st.st_size;
  unsigned char *buf = malloc(len ? len : 1);
  if (!buf) {
    fclose(fp);
    return pw_err_set(err, PW_ENOMEM, "data.path", "out of memory reading %s", path);
  }
  size_t got = fread(buf, 1, len, fp);
  int bad = ferror(fp);
  fclose(fp);
  if (got != len || bad) {
    free(buf);
    return pw_err_set(err, PW_EIO, "data.path", "cannot read %s%s", path,
                      bad ? "" : ": file shrank while reading");
  }
  *out = buf;
  *out_len = len;
  return 0;
}

/* A stored dataset's local copy must still be those bytes. */
static int check_hash(const unsigned char *buf, size_t len, const pw_data_spec *spec, pw_err *err) {
  if (!spec->dataset[0]) return 0;
  char hex[PW_SHA256_HEX_LEN + 1];
  pw_sha256_hex(buf, len, hex);
  if (strcmp(hex, spec->dataset))
    return pw_err_set(err, PW_EIO, "data.dataset", "%s holds bytes whose sha256 is %s, expected %s", spec->path, hex,
                      spec->dataset);
  return 0;
}

/* Token file: header and ids checked, and the vocabulary fits the model. */
static int open_tokens(pw_dataset *ds, const pw_data_spec *spec, pw_err *err) {
  pw_tokfile_hdr h;
  int rc = pw_tokfile_header_parse(ds->bytes, ds->len, ds->len, &h, "data.path", err);
  if (!rc) rc = pw_tokfile_check_ids(ds->bytes + PW_TOKFILE_HEADER, h.n_tokens, 0, &h, "data.path", err);
  if (rc) {
    /* the file's name in the message: the path is data.path's value */
    char m[sizeof err->msg];
    snprintf(m, sizeof m, "%s", err ? err->msg : "");
    return pw_err_set(err, rc, "data.path", "%s: %s", spec->path, m);
  }
  if ((int64_t)h.vocab_size > ds->shape.vocab_size)
    return pw_err_set(err, PW_ESPEC, "model.vocab_size",
                      "the token file %s has vocab_size %u, more than the model's %d", spec->path, h.vocab_size,
                      ds->shape.vocab_size);
  ds->ids = ds->bytes + PW_TOKFILE_HEADER;
  ds->width = h.width;
  ds->len = (size_t)h.n_tokens;
  return 0;
}

/* text or tokens: the file whole, then the splits (in ids). */
static int open_file(pw_dataset *ds, const pw_data_spec *spec, pw_err *err) {
  int T = ds->shape.seq_len;
  if (spec->kind == PW_DATA_TEXT && ds->shape.vocab_size < 256)
    return pw_err_set(err, PW_ESPEC, "model.vocab_size",
                      "text data uses byte tokens and needs vocab_size >= 256 (model has %d)",
                      ds->shape.vocab_size);
  if (!(spec->eval_fraction >= 0.0 && spec->eval_fraction < 1.0))
    return pw_err_set(err, PW_ESPEC, "data.eval_fraction", "must be in [0, 1) (got %g)",
                      spec->eval_fraction);
  if (!spec->path[0])
    return pw_err_set(err, PW_ESPEC, "data.path", "no local file for dataset %s", spec->dataset);
  int rc = read_text(spec->path, &ds->bytes, &ds->len, err);
  if (!rc) rc = check_hash(ds->bytes, ds->len, spec, err);
  if (rc) return rc;
  ds->ids = ds->bytes, ds->width = 1;
  if (spec->kind == PW_DATA_TOKENS && (rc = open_tokens(ds, spec, err))) return rc;
  size_t need = (size_t)T + 2;
  size_t eval_len = (size_t)floor((double)ds->len * spec->eval_fraction);
  if (eval_len > ds->len) eval_len = ds->len;
  ds->train_len = ds->len - eval_len;
  const char *unit = ds->width == 1 ? "bytes" : "tokens";
  if (ds->train_len < need)
    return pw_err_set(err, PW_ESPEC, "data.path",
                      "%s has only %zu %s (%zu in the train split); seq_len %d needs at least "
                      "%zu in each split",
                      spec->path, ds->len, unit, ds->train_len, T, need);
  if (eval_len < need)
    return pw_err_set(err, PW_ESPEC, "data.eval_fraction",
                      "the eval split of %s (%g of %zu %s) has only %zu %s; seq_len %d "
                      "needs at least %zu",
                      spec->path, spec->eval_fraction, ds->len, unit, eval_len, unit, T, need);
  int K = ds->shape.mlm_predictions, rc2 = 0;
  if (K > 0) {
    if (spec->mask_token < 0)
      return pw_err_set(err, PW_ESPEC, "data.mask_token",
                        "a masked-LM model needs the id that masks a position (BERT's [MASK])");
    if (spec->mask_token >= ds->shape.vocab_size)
      return pw_err_set(err, PW_ESPEC, "data.mask_token", "%d is not below vocab_size %d", spec->mask_token,
                        ds->shape.vocab_size);
    ds->mask_token = spec->mask_token;
    rc2 = pw__mlm_check_windows(ds->ids, ds->width, ds->train_len, T, K, ds->shape.pad_token, spec->path, "train",
                                err);
    if (!rc2)
      rc2 = pw__mlm_check_windows(ds->ids + ds->train_len * ds->width, ds->width, eval_len, T, K,
                                  ds->shape.pad_token, spec->path, "eval", err);
  }
  return rc2;
}

/* labeled: the JSON Lines whole, then the splits (in sequences). */
static int open_labeled(pw_dataset *ds, const pw_data_spec *spec, pw_err *err) {
  if (!(spec->eval_fraction >= 0.0 && spec->eval_fraction < 1.0))
    return pw_err_set(err, PW_ESPEC, "data.eval_fraction", "must be in [0, 1) (got %g)", spec->eval_fraction);
  if (!spec->path[0])
    return pw_err_set(err, PW_ESPEC, "data.path", "no local file for dataset %s", spec->dataset);
  int rc = read_text(spec->path, &ds->bytes, &ds->len, err);
  if (!rc) rc = check_hash(ds->bytes, ds->len, spec, err);
  size_t cut = 0;
  if (!rc) rc = pw__labeled_parse(ds->bytes, ds->len, spec->path, &ds->shape, &ds->seq_ids, &ds->seq_labels,
                                  &ds->n_seq, &cut, err);
  free(ds->bytes); /* the parsed rows are what is read */
  ds->bytes = NULL;
  if (rc) return rc;
  size_t eval_n = (size_t)floor((double)ds->n_seq * spec->eval_fraction);
  if (eval_n > ds->n_seq) eval_n = ds->n_seq;
  ds->train_seq = ds->n_seq - eval_n;
  if (ds->train_seq < 1 || eval_n < 1)
    return pw_err_set(err, PW_ESPEC, ds->train_seq < 1 ? "data.path" : "data.eval_fraction",
                      "%s has %zu sequences: eval_fraction %g leaves %zu for training and %zu for eval; each split "
                      "needs at least one",
                      spec->path, ds->n_seq, spec->eval_fraction, ds->train_seq, eval_n);
  if (cut)
    pw_info("data: %zu of the %zu sequences of %s are longer than seq_len %d: their first %d ids are read", cut,
            ds->n_seq, spec->path, ds->shape.seq_len, ds->shape.seq_len);
  return 0;
}

static int open_teacher(pw_dataset *ds) {
  int I = ds->shape.in_dim, O = ds->shape.out_dim;
  ds->teacher = malloc(sizeof(double) * (size_t)I * (size_t)O);
  if (!ds->teacher) return -1;
  pw_rng r;
  pw_rng_seed(&r, pw_hash64(ds->seed, pw_hash_str("teacher")));
  double scale = 1.0 / sqrt((double)I);
  for (size_t k = 0; k < (size_t)I * (size_t)O; k++) ds->teacher[k] = pw_rng_normal(&r) * scale;
  return 0;
}

static int open_keys(pw_dataset *ds, int keys) {
  size_t n = (size_t)keys * (size_t)ds->shape.feature_dim;
  ds->keys = keys;
  if (!(ds->teacher = malloc(sizeof(double) * (n ? n : 1)))) return -1;
  pw_rng r;
  pw_rng_seed(&r, pw_hash64(ds->seed, pw_hash_str("keys")));
  for (size_t k = 0; k < n; k++) ds->teacher[k] = pw_rng_normal(&r);
  return 0;
}

int pw_dataset_open(const pw_data_spec *spec, const pw_data_shape *shape, unsigned long long seed,
                    pw_dataset **out, pw_err *err) {
  *out = NULL;
  int token_kind = spec->kind == PW_DATA_TEXT || spec->kind == PW_DATA_TOKENS || spec->kind == PW_DATA_COPY ||
                   spec->kind == PW_DATA_REVERSE || spec->kind == PW_DATA_SHIFT || spec->kind == PW_DATA_LABELED;
  if (shape->mlm_predictions > 0 && spec->kind != PW_DATA_TEXT && spec->kind != PW_DATA_TOKENS)
    return pw_err_set(err, PW_ESPEC, "data.kind", "a masked-LM model masks the windows of kind text or tokens (got '%s')",
                      kind_name(spec->kind));
  if (shape->tokens && shape->out_dim > 0 && spec->kind != PW_DATA_LABELED)
    return pw_err_set(err, PW_ESPEC, "data.kind", "a model with one label per sequence reads kind labeled (got '%s')",
                      kind_name(spec->kind));
  if (spec->kind == PW_DATA_SHIFT && (shape->vocab_size < 2 || spec->keys > shape->vocab_size - 1))
    return pw_err_set(err, PW_ESPEC, "data.keys", "'shift' data shifts symbols 1 .. vocab_size-1 by a key below "
                      "keys: needs 1 <= keys <= vocab_size - 1 (keys %d, vocab_size %d)", spec->keys,
                      shape->vocab_size);
  if (spec->kind != PW_DATA_SHIFT && shape->feature_dim > 0)
    return pw_err_set(err, PW_ESPEC, "data.kind", "the model reads features per position, which only kind shift "
                      "gives (got '%s')", kind_name(spec->kind));
  if (token_kind && !shape->tokens)
    return pw_err_set(err, PW_ESPEC, "data.kind",
                      "'%s' gives token sequences but the model takes float features",
                      kind_name(spec->kind));
  if (!token_kind && shape->tokens)
    return pw_err_set(err, PW_ESPEC, "data.kind",
                      "'%s' gives float features but the model takes tokens", kind_name(spec->kind));
  if (token_kind && shape->seq_len < 1)
    return pw_err_set(err, PW_ESPEC, "model.seq_len", "must be >= 1 for '%s' data (got %d)",
                      kind_name(spec->kind), shape->seq_len);
  if ((spec->kind == PW_DATA_COPY || spec->kind == PW_DATA_REVERSE) && shape->seq_len < 2)
    return pw_err_set(err, PW_ESPEC, "model.seq_len", "'%s' data needs seq_len >= 2 (got %d)",
                      kind_name(spec->kind), shape->seq_len);
  if ((spec->kind == PW_DATA_COPY || spec->kind == PW_DATA_REVERSE) && shape->vocab_size < 2)
    return pw_err_set(err, PW_ESPEC, "model.vocab_size",
                      "'%s' data needs vocab_size >= 2 (0 separates, 1.. are symbols; got %d)",
                      kind_name(spec->kind), shape->vocab_size);
  if (!token_kind && (shape->in_dim < 1 || shape->out_dim < 1))
    return pw_err_set(err, PW_ESPEC, "model", "'%s' data needs in_dim and out_dim >= 1 (got %d, %d)",
                      kind_name(spec->kind), shape->in_dim, shape->out_dim);
  if (spec->kind == PW_DATA_CLASSIFY && shape->out_dim < 2)
    return pw_err_set(err, PW_ESPEC, "model.out_dim",
                      "'classify' data needs at least 2 classes (out_dim %d)", shape->out_dim);

  pw_dataset *ds = calloc(1, sizeof *ds);
  if (!ds) return pw_err_set(err, PW_ENOMEM, "data", "out of memory");
  ds->kind = spec->kind;
  ds->sampler = spec->sampler;
  ds->shape = *shape;
  ds->seed = seed;
  ds->tag[PW_SPLIT_TRAIN] = pw_hash_str("train");
  ds->tag[PW_SPLIT_EVAL] = pw_hash_str("eval");
  int rc = 0;
  if (spec->kind == PW_DATA_TEXT || spec->kind == PW_DATA_TOKENS)
    rc = open_file(ds, spec, err);
  else if (spec->kind == PW_DATA_LABELED)
    rc = open_labeled(ds, spec, err);
  else if ((spec->kind == PW_DATA_REGRESSION || spec->kind == PW_DATA_CLASSIFY) && open_teacher(ds))
    rc = pw_err_set(err, PW_ENOMEM, "data", "out of memory for the teacher matrix");
  else if (spec->kind == PW_DATA_SHIFT && open_keys(ds, spec->keys))
    rc = pw_err_set(err, PW_ENOMEM, "data", "out of memory for the key table");
  if (rc) {
    pw_dataset_close(ds);
    return rc;
  }
  *out = ds;
  return 0;
}

void pw_dataset_close(pw_dataset *ds) {
  if (!ds) return;
  free(ds->bytes);
  free(ds->teacher);
  free(ds->seq_ids);
  free(ds->seq_labels);
  free(ds);
}

size_t pw_dataset_train_len(const pw_dataset *ds) {
  return ds->kind == PW_DATA_TEXT || ds->kind == PW_DATA_TOKENS ? ds->train_len : 0;
}

/* ((k*B + i) * T) mod M without overflow: every factor is reduced mod M
 * first, and M < 2^30 (files are at most 1 GiB), so products fit in 64 bits. */
static uint64_t sequential_offset(uint64_t k, uint64_t B, uint64_t i, uint64_t T, uint64_t M) {
  uint64_t s = ((k % M) * (B % M) % M + i % M) % M;
  return s * (T % M) % M;
}

static void text_sequence(const pw_dataset *ds, pw_split split, long step, int i, int batch_size,
                          int32_t *in, int32_t *tg) {
  int T = ds->shape.seq_len;
  size_t base = split == PW_SPLIT_EVAL ? ds->train_len : 0;
  size_t S = split == PW_SPLIT_EVAL ? ds->len - ds->train_len : ds->train_len;
  uint64_t M = (uint64_t)S - (uint64_t)T - 1;
  uint64_t o;
  if (split == PW_SPLIT_TRAIN && ds->sampler == PW_SAMPLER_RANDOM)
    o = seq_key(ds, split, step, i) % M;
  else
    o = sequential_offset((uint64_t)step, (uint64_t)batch_size, (uint64_t)i, (uint64_t)T, M);
  if (ds->shape.mlm_predictions > 0) { /* the window, then corrupted: in and tg both come from it */
    int32_t stack[1024];
    int32_t *x = in ? in : T <= 1024 ? stack : malloc(sizeof(int32_t) * (size_t)T);
    PW_ASSERT(x);
    for (int t = 0; t < T; t++)
      x[t] = (int32_t)(ds->width == 1 ? ds->ids[base + o + (uint64_t)t]
                                      : pw_tokfile_id(ds->ids, ds->width, base + o + (uint64_t)t));
    pw_mlm_corrupt(seq_key(ds, split, step, i), T, ds->shape.mlm_predictions, ds->shape.vocab_size, ds->mask_token,
                   ds->shape.pad_token, x, tg);
    if (x != in && x != stack) free(x);
    return;
  }
  if (ds->width == 1) {
    const unsigned char *b = ds->ids + base;
    for (int t = 0; t < T; t++) {
      if (in) in[t] = b[o + (uint64_t)t];
      if (tg) tg[t] = b[o + (uint64_t)t + 1];
    }
    return;
  }
  for (int t = 0; t < T; t++) {
    if (in) in[t] = (int32_t)pw_tokfile_id(ds->ids, ds->width, base + o + (uint64_t)t);
    if (tg) tg[t] = (int32_t)pw_tokfile_id(ds->ids, ds->width, base + o + (uint64_t)t + 1);
  }
}

/* labeled: sequence (k, i)'s ids and label. */
static void labeled_sequence(const pw_dataset *ds, pw_split split, long step, int i, int batch_size, int32_t *in,
                             int32_t *tg) {
  size_t base = split == PW_SPLIT_EVAL ? ds->train_seq : 0;
  uint64_t S = split == PW_SPLIT_EVAL ? ds->n_seq - ds->train_seq : ds->train_seq;
  uint64_t j = split == PW_SPLIT_TRAIN && ds->sampler == PW_SAMPLER_RANDOM
                   ? seq_key(ds, split, step, i) % S
                   : sequential_offset((uint64_t)step, (uint64_t)batch_size, (uint64_t)i, 1, S);
  size_t T = (size_t)ds->shape.seq_len;
  if (in) memcpy(in, ds->seq_ids + (base + j) * T, sizeof(int32_t) * T);
  if (tg) *tg = ds->seq_labels[base + j];
}

static void copy_sequence(const pw_dataset *ds, pw_split split, long step, int i, int32_t *in,
                          int32_t *tg) {
  int T = ds->shape.seq_len, h = T / 2;
  int32_t stack[1024];
  int32_t *s = T + 1 <= 1024 ? stack : malloc(sizeof(int32_t) * ((size_t)T + 1));
  PW_ASSERT(s);
  pw_rng r;
  pw_rng_seed(&r, seq_key(ds, split, step, i));
  for (int j = 0; j < h; j++) s[j] = 1 + (int32_t)pw_rng_below(&r, (uint64_t)ds->shape.vocab_size - 1);
  s[h] = 0;
  for (int j = 0; j < h; j++) s[h + 1 + j] = ds->kind == PW_DATA_COPY ? s[j] : s[h - 1 - j];
  if (2 * h + 1 <= T) s[2 * h + 1] = 0;
  if (in) memcpy(in, s, sizeof(int32_t) * (size_t)T);
  if (tg) memcpy(tg, s + 1, sizeof(int32_t) * (size_t)T);
  if (s != stack) free(s);
}

/* shift: tokens, features (T x D) and targets of sequence (k, i); any may be NULL. */
static void shift_sequence(const pw_dataset *ds, pw_split split, long step, int i, int32_t *in, float *x,
                           int32_t *tg) {
  int T = ds->shape.seq_len, D = ds->shape.feature_dim;
  uint64_t V1 = (uint64_t)ds->shape.vocab_size - 1;
  pw_rng r;
  pw_rng_seed(&r, seq_key(ds, split, step, i));
  for (int t = 0; t < T; t++) {
    int32_t s = 1 + (int32_t)pw_rng_below(&r, V1);
    int32_t c = (int32_t)pw_rng_below(&r, (uint64_t)ds->keys);
    if (in) in[t] = s;
    if (tg) tg[t] = 1 + (int32_t)(((uint64_t)(s - 1) + (uint64_t)c) % V1);
    for (int j = 0; x && j < D; j++) x[(size_t)t * (size_t)D + (size_t)j] = (float)ds->teacher[(size_t)c * (size_t)D + (size_t)j];
  }
}

void pw_dataset_features(const pw_dataset *ds, pw_split split, long step, int first, int n, int batch_size,
                         float *features) {
  PW_ASSERT(step >= 0 && first >= 0 && n >= 0 && first + n <= batch_size && ds->kind == PW_DATA_SHIFT);
  size_t per = (size_t)ds->shape.seq_len * (size_t)ds->shape.feature_dim;
  for (int j = 0; j < n; j++) shift_sequence(ds, split, step, first + j, NULL, features + (size_t)j * per, NULL);
}

static void feature_target(const pw_dataset *ds, const float *xbuf, void *target);

static void feature_sequence(const pw_dataset *ds, pw_split split, long step, int i, float *x,
                             void *target) {
  int I = ds->shape.in_dim;
  float stack[1024];
  float *xbuf = x ? x : I <= 1024 ? stack : malloc(sizeof(float) * (size_t)I);
  PW_ASSERT(xbuf);
  pw_rng r;
  pw_rng_seed(&r, seq_key(ds, split, step, i));
  for (int j = 0; j < I; j++) xbuf[j] = (float)pw_rng_normal(&r);
  if (target) feature_target(ds, xbuf, target);
  if (xbuf != x && xbuf != stack) free(xbuf);
}

/* The teacher's answer for features x. */
static void feature_target(const pw_dataset *ds, const float *xbuf, void *target) {
  int I = ds->shape.in_dim, O = ds->shape.out_dim;
  int best = 0;
  double best_y = -INFINITY;
  for (int o = 0; o < O; o++) {
    const double *a = ds->teacher + (size_t)o * (size_t)I;
    double y = 0.0;
    for (int j = 0; j < I; j++) y += a[j] * (double)xbuf[j];
    if (ds->kind == PW_DATA_REGRESSION) {
      ((float *)target)[o] = (float)tanh(y);
    } else if (y > best_y) {
      best_y = y;
      best = o;
    }
  }
  if (ds->kind == PW_DATA_CLASSIFY) *(int32_t *)target = best;
}

void pw_dataset_batch(const pw_dataset *ds, pw_split split, long step, int first, int n,
                      int batch_size, void *inputs, void *targets) {
  PW_ASSERT(step >= 0 && first >= 0 && n >= 0 && first + n <= batch_size);
  PW_ASSERT(split == PW_SPLIT_TRAIN || split == PW_SPLIT_EVAL);
  int T = ds->shape.seq_len, I = ds->shape.in_dim, O = ds->shape.out_dim;
  for (int j = 0; j < n; j++) {
    int i = first + j;
    switch (ds->kind) {
      case PW_DATA_TEXT:
      case PW_DATA_TOKENS:
        text_sequence(ds, split, step, i, batch_size,
                      inputs ? (int32_t *)inputs + (size_t)j * (size_t)T : NULL,
                      targets ? (int32_t *)targets + (size_t)j * (size_t)T : NULL);
        break;
      case PW_DATA_COPY:
      case PW_DATA_REVERSE:
        copy_sequence(ds, split, step, i,
                      inputs ? (int32_t *)inputs + (size_t)j * (size_t)T : NULL,
                      targets ? (int32_t *)targets + (size_t)j * (size_t)T : NULL);
        break;
      case PW_DATA_LABELED:
        labeled_sequence(ds, split, step, i, batch_size, inputs ? (int32_t *)inputs + (size_t)j * (size_t)T : NULL,
                         targets ? (int32_t *)targets + j : NULL);
        break;
      case PW_DATA_SHIFT:
        shift_sequence(ds, split, step, i, inputs ? (int32_t *)inputs + (size_t)j * (size_t)T : NULL, NULL,
                       targets ? (int32_t *)targets + (size_t)j * (size_t)T : NULL);
        break;
      case PW_DATA_REGRESSION:
        feature_sequence(ds, split, step, i, inputs ? (float *)inputs + (size_t)j * (size_t)I : NULL,
                         targets ? (void *)((float *)targets + (size_t)j * (size_t)O) : NULL);
        break;
      case PW_DATA_CLASSIFY:
        feature_sequence(ds, split, step, i, inputs ? (float *)inputs + (size_t)j * (size_t)I : NULL,
                         targets ? (void *)((int32_t *)targets + j) : NULL);
        break;
    }
  }
}
