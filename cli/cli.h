/* cli: the `pipewright` command's subcommands, one file each. */
#ifndef PW_CLI_H
#define PW_CLI_H

#include <stdio.h>

#include "errors.h"
#include "spec.h"

typedef struct {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
} pw_cli_cmd;

int pw_cmd_train(int argc, char **argv);
int pw_cmd_eval(int argc, char **argv);
int pw_cmd_generate(int argc, char **argv); /* cmd_generate.c */
int pw_cmd_inspect(int argc, char **argv);
int pw_cmd_export(int argc, char **argv); /* cmd_export.c: LoRA adapters / merge */
int pw_cmd_plan(int argc, char **argv);
/* cmd_calibrate.c: measure this host for the calibrated cost model */
int pw_cmd_calibrate(int argc, char **argv);
/* cmd_schedules.c: the catalogue, and a schedule's figures without a model */
int pw_cmd_schedules(int argc, char **argv);
/* cmd_remote.c: the coordinator's REST API */
int pw_cmd_status(int argc, char **argv);
int pw_cmd_watch(int argc, char **argv);
int pw_cmd_cancel(int argc, char **argv);
int pw_cmd_retry(int argc, char **argv);
int pw_cmd_workers(int argc, char **argv);
/* cmd_logs.c */
int pw_cmd_logs(int argc, char **argv);
/* cmd_timeline.c */
int pw_cmd_timeline(int argc, char **argv);
/* cmd_submit.c */
int pw_cmd_submit(int argc, char **argv);
/* cmd_dataset.c: datasets on the coordinator, token files here */
int pw_cmd_dataset(int argc, char **argv);
/* cmd_tfevents.c: TensorBoard event files read and checked */
int pw_cmd_tfevents(int argc, char **argv);
/* cmd_tokenize.c: text <-> ids with a tokenizer.json (common/text/) */
int pw_cmd_tokenize(int argc, char **argv);
/* cmd_hf.c: Hugging Face model directories in and out (common/io/hf.h) */
int pw_cmd_import_hf(int argc, char **argv);
int pw_cmd_logits(int argc, char **argv); /* cmd_logits.c: a forward pass's logits */
int pw_cmd_export_hf(int argc, char **argv);

/* Loads a job file; on error prints "error: job.json: model.n_heads: ..." and returns it. */
PW_MUST_CHECK int pw_cli_load_job(const char *path, pw_job *job);
/* Before a command computes: OpenBLAS (and oneDNN) at `threads`, and the
 * products' path checked (gemm.h); on error prints it and returns it. */
PW_MUST_CHECK int pw_cli_compute_ready(int threads);
/* Prints "error: <path>: <message>" to stderr. */
void pw_cli_report(const pw_err *err);
/* --device SPEC (cpu, cuda, cuda:N; NULL: cpu): *be NULL for the CPU, else
 * the opened backend (pw_cuda_close it). 0, 2 for a malformed SPEC, 1 when
 * the device cannot be had (said on stderr). */
struct pw_backend;
int pw_cli_device(const char *spec, const struct pw_backend **be);
/* Human-readable 12.3K / 4.5M / 6.7G. */
const char *pw_cli_si(double x, char *buf, int cap);

#endif
