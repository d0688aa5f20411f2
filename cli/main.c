/* main: `pipewright` — dispatches to a subcommand from a table. */
#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "gemm.h"
#include "suggest.h"
#include "errors.h"
#include "spec_json.h"

static const pw_cli_cmd commands[] = {
    {"train", "train a job in this process (the reference every pipelined run equals)", pw_cmd_train},
    {"eval", "loss of a checkpoint on the job's eval split", pw_cmd_eval},
    {"generate", "text from a checkpoint: greedy or sampled, with a KV cache", pw_cmd_generate},
    {"export", "a LoRA checkpoint as PEFT adapters (--adapters) or merged into the base (--merge-lora)",
     pw_cmd_export},
    {"inspect", "table of a job's layers: shapes, parameters, FLOPs, activations", pw_cmd_inspect},
    {"plan",
     "partition, per-rank schedule and simulated analytics; --compare for all schedules; --export and "
     "--import-csv for custom ones",
     pw_cmd_plan},
    {"calibrate", "measure this host's layer times, step end and link for `plan --profile`", pw_cmd_calibrate},
    {"schedules", "the nine schedules; with NAME --pp P --m M, one's bubble, steps and grid without a model",
     pw_cmd_schedules},
    {"submit", "send a job to the coordinator (POST /v1/jobs)", pw_cmd_submit},
    {"status", "jobs on the coordinator, or one job in detail", pw_cmd_status},
    {"watch", "follow a job to its end: progress bar and loss", pw_cmd_watch},
    {"logs", "a job's events (state changes and why); --follow until it ends", pw_cmd_logs},
    {"timeline", "a sampled step's measured per-rank timeline and bubble; -o FILE for a Chrome trace",
     pw_cmd_timeline},
    {"cancel", "stop a queued or running job", pw_cmd_cancel},
    {"retry", "queue a failed or cancelled job again, resuming from its newest state", pw_cmd_retry},
    {"workers", "the workers registered with the coordinator", pw_cmd_workers},
    {"dataset", "datasets on the coordinator (upload, list, rm); token files (convert, check)", pw_cmd_dataset},
    {"tfevents", "TensorBoard event files: every record checked, each step's scalars", pw_cmd_tfevents},
    {"tokenize", "text <-> token ids with a Hugging Face tokenizer.json; --out writes a token file",
     pw_cmd_tokenize},
    {"import-hf", "a Hugging Face model directory as a job spec and a checkpoint (GPT-2, Llama, Mistral, Qwen2/3, Gemma, BERT)",
     pw_cmd_import_hf},
    {"export-hf", "a job's checkpoint as a Hugging Face model directory that transformers loads", pw_cmd_export_hf},
    {"logits", "a model's logits for token sequences given here (an encoder's, a classifier's)", pw_cmd_logits},
};
static const int n_commands = (int)(sizeof commands / sizeof commands[0]);

static void usage(FILE *f) {
  fprintf(f, "usage: pipewright <command> [options]\n\ncommands:\n");
  for (int i = 0; i < n_commands; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n'pipewright <command> --help' shows a command's options.\n");
}

int pw_cli_compute_ready(int threads) {
  pw_err err = {0};
  openblas_set_num_threads(threads);
  int rc = pw_gemm_check(&err);
  if (rc) pw_cli_report(&err);
  return rc;
}

int pw_cli_load_job(const char *path, pw_job *job) {
  pw_err err = {0};
  int rc = pw_job_load_file(path, job, &err);
  if (rc) {
    char buf[600];
    if (strcmp(err.path, path) == 0) /* the error is about the file itself */
      fprintf(stderr, "error: %s\n", pw_err_str(&err, buf, sizeof buf));
    else
      fprintf(stderr, "error: %s: %s\n", path, pw_err_str(&err, buf, sizeof buf));
  }
  return rc;
}

void pw_cli_report(const pw_err *e) {
  char buf[600];
  fprintf(stderr, "error: %s\n", pw_err_str(e, buf, sizeof buf));
}

const char *pw_cli_si(double x, char *buf, int cap) {
  const char *u[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (x >= 1000 && i < 5) {
    x /= 1000;
    i++;
  }
  snprintf(buf, (size_t)cap, i ? "%.2f%s" : "%.0f%s", x, u[i]);
  return buf;
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("pipewright %s\n", PW_VERSION);
    return 0;
  }
  for (int i = 0; i < n_commands; i++)
    if (strcmp(argv[1], commands[i].name) == 0) {
      pw_cli_cmd_name = commands[i].name;
      return commands[i].run(argc - 1, argv + 1);
    }
  const char *names[sizeof commands / sizeof commands[0]];
  for (int i = 0; i < n_commands; i++) names[i] = commands[i].name;
  char near[160];
  fprintf(stderr, "pipewright: unknown command '%s'%s\n", argv[1],
          pw_suggest_text(argv[1], names, n_commands, "", near, sizeof near));
  usage(stderr);
  return 2;
}
