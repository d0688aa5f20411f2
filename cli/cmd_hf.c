/* cmd_hf: `pipewright import-hf` and `pipewright export-hf` — Hugging Face
 * model directories in and out (common/io/hf.h does the mapping). Import
 * checks every tensor against the model the job builds before it writes
 * anything; the checkpoint and the job are each written to a temporary
 * name and renamed, and the checkpoint removed again if the job cannot be
 * written. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "hf.h"
#include "json_short.h"
#include "model.h"
#include "safetensors.h"
#include "spec_json.h"

#define IMPORT_USAGE                                                                                   \
  "usage: pipewright import-hf DIR --job-out JOB.json --out CKPT.safetensors [--name NAME] [--seq-len N]\n" \
  "                            [--mask-token ID]\n"                                                   \
  "  DIR             a Hugging Face model directory: config.json and model.safetensors (or\n"          \
  "                  model.safetensors.index.json and its shards); GPT2LMHeadModel, LlamaForCausalLM,\n" \
  "                  MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, GemmaForCausalLM,\n"      \
  "                  BertForMaskedLM, BertForSequenceClassification\n"                                 \
  "  --job-out FILE  the job spec for that model (its data section: see docs/usage.md#hugging-face-models)\n"  \
  "  --out FILE      its weights under our names (train --init, generate --checkpoint)\n"              \
  "  --name NAME     the job's name (default: DIR's base name)\n"                                      \
  "  --seq-len N     model.seq_len (default: the model's maximum positions)\n"                         \
  "  --mask-token ID BertForMaskedLM: data.mask_token (default: [MASK] in DIR/tokenizer.json)\n"

#define EXPORT_USAGE                                                                  \
  "usage: pipewright export-hf --job JOB --checkpoint CKPT --out DIR\n"               \
  "  writes DIR/config.json and DIR/model.safetensors (float32) that transformers'\n" \
  "  from_pretrained loads: gpt as GPT2LMHeadModel, llama as LlamaForCausalLM\n"      \
  "  (Qwen2ForCausalLM with qkv_bias, Qwen3ForCausalLM with qk_norm, GemmaForCausalLM\n" \
  "  with Gemma's options), bert as BertForMaskedLM or BertForSequenceClassification\n"

/* Every parameter of the job's model is among the tensors with its shape,
 * and every tensor is a parameter: the mapping's names are the model's. */
static int check_against_model(const json_t *jobj, const pw_hf_import_result *r, pw_err *err) {
  pw_job job;
  int rc = pw_job_parse(jobj, NULL, &job, err);
  if (rc) return rc;
  pw_model m;
  if ((rc = pw_model_build(&job.model, &m, err))) {
    pw_job_free(&job);
    return rc;
  }
  for (int i = 0; i < m.n_params && !rc; i++) {
    const pw_param *p = &m.params[i];
    const pw_st_tensor *t = NULL;
    for (int k = 0; k < r->n_tensors && !t; k++)
      if (!strcmp(r->tensors[k].name, p->name)) t = &r->tensors[k];
    int ok = t && t->ndim == p->ndim;
    for (int d = 0; ok && d < p->ndim; d++) ok = t->shape[d] == p->shape[d];
    if (!ok) rc = pw_err_set(err, PW_EINTERNAL, p->name, "the import did not give this parameter its shape");
  }
  if (!rc && r->n_tensors != m.n_params)
    rc = pw_err_set(err, PW_EINTERNAL, "import", "%d tensors for %d parameters", r->n_tensors, m.n_params);
  pw_model_free(&m);
  pw_job_free(&job);
  return rc;
}

int pw_cmd_import_hf(int argc, char **argv) {
  static const struct option opts[] = {{"job-out", required_argument, 0, 'j'}, {"out", required_argument, 0, 'o'},
                                       {"name", required_argument, 0, 'n'},    {"seq-len", required_argument, 0, 's'},
                                       {"mask-token", required_argument, 0, 'm'}, {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *job_out = NULL, *out = NULL, *name = NULL, *dir;
  pw_hf_import_opts io = {0};
  long seq_len = 0;
  int c;
  optind = 1;
  while ((c = pw_getopt(argc, argv, "j:o:n:s:m:h", opts)) != -1) {
    if (c == 'j') job_out = optarg;
    else if (c == 'o') out = optarg;
    else if (c == 'n') name = optarg;
    else if (c == 's') {
      char *end;
      errno = 0;
      seq_len = strtol(optarg, &end, 10);
      if (errno || *end || seq_len < 1 || seq_len > 65536)
        return fprintf(stderr, "pipewright import-hf: --seq-len: want 1 ... 65536 (got %s)\n", optarg), 2;
    } else if (c == 'm') {
      char *end;
      errno = 0;
      long id = strtol(optarg, &end, 10);
      if (errno || *end || end == optarg || id < 0 || id >= (1 << 24))
        return fprintf(stderr, "pipewright import-hf: --mask-token: want a token id (got %s)\n", optarg), 2;
      io.has_mask_token = 1, io.mask_token = (int)id;
    } else if (c == 'h') return fputs(IMPORT_USAGE, stdout), 0;
    else return fputs(IMPORT_USAGE, stderr), 2;
  }
  if (pw_args_operands(argc, argv, 1, 1, "DIR") || pw_args_required(job_out, "--job-out JOB.json") ||
      pw_args_required(out, "--out CKPT.safetensors"))
    return fputs(IMPORT_USAGE, stderr), 2;
  dir = argv[optind];
  pw_hf_import_result r;
  pw_err err = {0};
  io.name = name, io.seq_len = (int)seq_len;
  int rc = pw_hf_import(dir, &io, &r, &err);
  if (!rc) rc = check_against_model(r.job, &r, &err);
  char *text = NULL, *canon = NULL;
  if (!rc) {
    text = pw_json_dumps(r.job, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    pw_job job;
    if (!(rc = pw_job_parse(r.job, NULL, &job, &err))) {
      json_t *cj = pw_job_to_json(&job);
      canon = cj ? pw_json_dumps(cj, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
      json_decref(cj);
      pw_job_free(&job);
    }
    if (!rc && (!text || !canon)) rc = pw_err_set(&err, PW_ENOMEM, job_out, "out of memory");
  }
  if (!rc) {
    pw_st_meta meta[3] = {{"format", "pt"}, {"step", "0"}, {"job", canon}};
    rc = pw_st_write(out, r.tensors, r.n_tensors, meta, 3, &err);
  }
  if (!rc) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", job_out, (long)getpid());
    FILE *f = fopen(tmp, "w");
    int bad = !f || fputs(text, f) < 0 || fputc('\n', f) == EOF || fflush(f) || fsync(fileno(f));
    if (f) bad |= fclose(f) != 0;
    if (bad || rename(tmp, job_out)) {
      rc = pw_err_set(&err, PW_EIO, job_out, "cannot write: %s", strerror(errno));
      unlink(tmp);
      unlink(out);
    }
  }
  if (rc) {
    pw_cli_report(&err);
  } else {
    size_t params = 0;
    for (int i = 0; i < r.n_tensors; i++)
      params += (size_t)r.tensors[i].shape[0] * (size_t)(r.tensors[i].ndim == 2 ? r.tensors[i].shape[1] : 1);
    char si[32];
    printf("imported %s: %d tensors, %s parameters -> %s; job -> %s\n", r.arch, r.n_tensors,
           pw_cli_si((double)params, si, sizeof si), out, job_out);
    if (r.notes[0]) printf("note: %s\n", r.notes);
    const char *kind = json_string_value(json_object_get(json_object_get(r.job, "data"), "kind"));
    if (r.data_placeholder && kind && !strcmp(kind, "labeled"))
      printf("note: data.path is a placeholder (SET-ME.jsonl): set it to labeled sequences, one JSON object a line "
             "{\"tokens\": [ids], \"label\": N} (docs/datasets.md#labeled-sequences)\n");
    else if (r.data_placeholder)
      printf("note: data.path is a placeholder (SET-ME.tokens): set it to a token file of this model's vocabulary "
             "(pipewright tokenize --out; docs/usage.md#hugging-face-models)\n");
  }
  free(text);
  free(canon);
  pw_hf_import_free(&r);
  return rc ? 1 : 0;
}

int pw_cmd_export_hf(int argc, char **argv) {
  static const struct option opts[] = {{"job", required_argument, 0, 'j'},
                                       {"checkpoint", required_argument, 0, 'c'},
                                       {"out", required_argument, 0, 'o'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *job_path = NULL, *ckpt = NULL, *dir = NULL;
  int c;
  optind = 1;
  while ((c = pw_getopt(argc, argv, "j:c:o:h", opts)) != -1) {
    if (c == 'j') job_path = optarg;
    else if (c == 'c') ckpt = optarg;
    else if (c == 'o') dir = optarg;
    else if (c == 'h') return fputs(EXPORT_USAGE, stdout), 0;
    else return fputs(EXPORT_USAGE, stderr), 2;
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL) || pw_args_required(job_path, "--job JOB") ||
      pw_args_required(ckpt, "--checkpoint CKPT") || pw_args_required(dir, "--out DIR"))
    return fputs(EXPORT_USAGE, stderr), 2;
  pw_job job;
  if (pw_cli_load_job(job_path, &job)) return 1;
  pw_err err = {0};
  int rc = pw_hf_export(&job.model, ckpt, dir, &err);
  if (rc) pw_cli_report(&err);
  else printf("wrote %s/config.json and %s/model.safetensors\n", dir, dir);
  pw_job_free(&job);
  return rc ? 1 : 0;
}
