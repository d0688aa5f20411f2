/* cmd_logits: `pipewright logits` — a model's logits for token sequences
 * given on the command line, one forward pass of the whole model on the
 * CPU. An encoder (BERT) has no generation to read them from: this is how
 * the references (tests/ref/hf_bert_ref.py) hold its logits against
 * transformers'. The logits are the loss node's input as the model
 * computes it, the data and the optimizer left out. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ckpt.h"
#include "cli.h"
#include "model.h"
#include "prog.h"
#include "safetensors.h"
#include "spec_json.h"

#define LOGITS_USAGE                                                                                  \
  "usage: pipewright logits --job JOB --checkpoint CKPT --tokens IDS [--tokens IDS ...] --out FILE\n" \
  "  IDS             a sequence: comma-separated token ids, at most model.seq_len of them (fewer\n"  \
  "                  are filled with model.pad_token)\n"                                              \
  "  --out FILE      safetensors with \"logits\", float32: (sequences, seq_len, vocab_size) for a\n"    \
  "                  model that predicts every position, (sequences, n_labels) for a classifier\n"

#define MAX_SEQS 256

/* "3,17,1" -> ids (each in [0, V)), *n of them, at most T. */
static int parse_ids(const char *s, int V, int T, int32_t *ids, int *n) {
  *n = 0;
  while (*s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || v < 0 || v >= V || (*end && *end != ','))
      return fprintf(stderr, "pipewright logits: --tokens: want ids below vocab_size %d, comma-separated (at \"%.20s\")\n",
                     V, s), -1;
    if (*n == T) return fprintf(stderr, "pipewright logits: --tokens: more than seq_len %d ids\n", T), -1;
    ids[(*n)++] = (int32_t)v;
    s = *end ? end + 1 : end;
  }
  if (!*n) return fprintf(stderr, "pipewright logits: --tokens: no ids\n"), -1;
  return 0;
}

int pw_cmd_logits(int argc, char **argv) {
  static const struct option opts[] = {{"job", required_argument, 0, 'j'},    {"checkpoint", required_argument, 0, 'c'},
                                       {"tokens", required_argument, 0, 'k'}, {"out", required_argument, 0, 'o'},
                                       {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
  const char *job_path = NULL, *ckpt = NULL, *out = NULL, *seqs[MAX_SEQS];
  int n_seqs = 0, c;
  optind = 1;
  while ((c = pw_getopt(argc, argv, "j:c:k:o:h", opts)) != -1) {
    if (c == 'j') job_path = optarg;
    else if (c == 'c') ckpt = optarg;
    else if (c == 'o') out = optarg;
    else if (c == 'k') {
      if (n_seqs == MAX_SEQS) return fprintf(stderr, "pipewright logits: at most %d --tokens\n", MAX_SEQS), 2;
      seqs[n_seqs++] = optarg;
    } else if (c == 'h') return fputs(LOGITS_USAGE, stdout), 0;
    else return fputs(LOGITS_USAGE, stderr), 2;
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL) || pw_args_required(job_path, "--job JOB") ||
      pw_args_required(ckpt, "--checkpoint CKPT") || pw_args_required(out, "--out FILE"))
    return fputs(LOGITS_USAGE, stderr), 2;
  if (!n_seqs) return fputs("pipewright logits: give at least one --tokens IDS\n", stderr), 2;
  if (pw_cli_compute_ready(1)) return 1;
  pw_job job;
  if (pw_cli_load_job(job_path, &job)) return 1;
  pw_err err = {0};
  pw_model m;
  int rc = pw_model_build(&job.model, &m, &err);
  if (rc) {
    pw_cli_report(&err);
    pw_job_free(&job);
    return 1;
  }
  int T = m.data.seq_len, V = m.data.vocab_size, pad = job.model.tmpl == PW_TEMPLATE_BERT ? job.model.pad_token : -1;
  int32_t *in = NULL;
  pw_prog *p = NULL;
  if (!m.data.tokens || m.input_value < 0) {
    rc = pw_err_set(&err, PW_EINVAL, "model", "logits reads token models only");
    goto done;
  }
  in = calloc((size_t)n_seqs * (size_t)T, sizeof *in);
  if (!in) {
    rc = pw_err_set(&err, PW_ENOMEM, "logits", "out of memory");
    goto done;
  }
  for (int i = 0; i < n_seqs; i++) {
    int n;
    if (parse_ids(seqs[i], V, T, in + (size_t)i * (size_t)T, &n)) {
      rc = -1;
      goto done;
    }
    if (n < T && pad < 0) {
      fprintf(stderr, "pipewright logits: --tokens: %d ids, fewer than seq_len %d, and the model has no pad_token\n", n,
              T);
      rc = -1;
      goto done;
    }
    for (int t = n; t < T; t++) in[(size_t)i * (size_t)T + (size_t)t] = pad;
  }
  pw_prog_config cfg = {.layer_lo = 0, .layer_hi = m.n_layers, .mb_size = n_seqs, .batch_size = n_seqs, .n_slots = 1};
  if ((rc = pw_prog_create(&m, &cfg, &p, &err)) || (rc = pw_ckpt_load(p, ckpt, 0, NULL, &err))) goto done;
  memcpy(pw_prog_value(p, 0, m.input_value), in, sizeof *in * (size_t)n_seqs * (size_t)T);
  const pw_value *tv = &m.values[m.target_value];
  memset(pw_prog_value(p, 0, m.target_value), 0, sizeof(int32_t) * (size_t)n_seqs * (size_t)tv->rows);
  float loss;
  if ((rc = pw_prog_forward(p, 0, &loss, &err))) goto done;
  int lv = m.nodes[m.values[m.loss_value].producer].in[0];
  const pw_value *v = &m.values[lv];
  pw_st_tensor t = {.name = "logits", .dtype = PW_ST_F32, .data = pw_prog_value(p, 0, lv)};
  t.ndim = v->rows > 1 ? 3 : 2;
  t.shape[0] = n_seqs;
  t.shape[1] = v->rows > 1 ? v->rows : v->width;
  t.shape[2] = v->width;
  rc = pw_st_write(out, &t, 1, NULL, 0, &err);
  if (!rc) printf("wrote %s: logits of %d sequence(s)\n", out, n_seqs);
done:
  if (rc > 0) pw_cli_report(&err);
  pw_prog_free(p);
  free(in);
  pw_model_free(&m);
  pw_job_free(&job);
  return rc ? 1 : 0;
}
