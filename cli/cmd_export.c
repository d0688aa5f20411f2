/* cmd_export: `pipewright export` — a LoRA fine-tune's checkpoint as PEFT
 * adapters or merged into the base weights (common/compute/lora_export.h). */
#include <getopt.h>
#include <stdio.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "ckpt.h"
#include "cli.h"
#include "lora_export.h"
#include "model.h"
#include "prog.h"
#include "spec.h"

#define USAGE                                                                              \
  "usage: pipewright export --job FILE --checkpoint CKPT (--adapters DIR | --merge-lora OUT)\n" \
  "  --adapters DIR    PEFT's files: DIR/adapter_model.safetensors, DIR/adapter_config.json\n" \
  "  --merge-lora OUT  the base weights with (alpha/r) B A added, no adapters (safetensors)\n"

int pw_cmd_export(int argc, char **argv) {
  static const struct option opts[] = {{"job", required_argument, 0, 'j'},
                                       {"checkpoint", required_argument, 0, 'c'},
                                       {"adapters", required_argument, 0, 'a'},
                                       {"merge-lora", required_argument, 0, 'm'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *job_path = NULL, *ckpt = NULL, *dir = NULL, *merged = NULL;
  int c;
  optind = 1;
  while ((c = pw_getopt(argc, argv, "j:c:a:m:h", opts)) != -1) {
    if (c == 'j') job_path = optarg;
    else if (c == 'c') ckpt = optarg;
    else if (c == 'a') dir = optarg;
    else if (c == 'm') merged = optarg;
    else if (c == 'h') return fputs(USAGE, stdout), 0;
    else return fputs(USAGE, stderr), 2;
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL) || pw_args_required(job_path, "--job FILE") ||
      pw_args_required(ckpt, "--checkpoint CKPT"))
    return fputs(USAGE, stderr), 2;
  if (!dir == !merged) {
    fputs("pipewright export: give one of --adapters DIR and --merge-lora OUT\n" USAGE, stderr);
    return 2;
  }
  pw_job job;
  if (pw_cli_load_job(job_path, &job)) return 1;
  pw_model m;
  pw_prog *p = NULL;
  pw_err err = {0};
  int rc = pw_model_build(&job.model, &m, &err);
  if (!rc) {
    pw_prog_config cfg = {.layer_lo = 0, .layer_hi = m.n_layers, .mb_size = 1, .batch_size = 1, .max_slots = 1};
    rc = pw_prog_create(&m, &cfg, &p, &err);
    if (!rc) rc = pw_ckpt_load(p, ckpt, 0, NULL, &err);
    if (!rc && dir && mkdir(dir, 0777) && errno != EEXIST)
      rc = pw_err_set(&err, PW_EIO, dir, "cannot make the directory: %s", strerror(errno));
    if (!rc) rc = dir ? pw_lora_export_adapters(p, dir, &err) : pw_lora_merge(p, merged, &err);
    if (!rc) printf("wrote %s\n", dir ? dir : merged);
    pw_prog_free(p);
    pw_model_free(&m);
  }
  if (rc) pw_cli_report(&err);
  pw_job_free(&job);
  return rc ? 1 : 0;
}
