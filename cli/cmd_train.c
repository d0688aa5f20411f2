/* cmd_train: `pipewright train` and `pipewright eval`. */
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "pw_cuda.h"
#include "spec.h"
#include "train.h"

/* More OpenBLAS threads than this is a typo, not a machine. */
#define MAX_THREADS 4096
#define EVAL_USAGE "usage: pipewright eval --job FILE --checkpoint CKPT [--threads N]\n"

static void train_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright train --job FILE [options]\n"
          "  --job FILE        job spec (JSON)\n"
          "  --steps N         stop after N steps in all (default train.steps; 0 writes the initial\n"
          "                    parameters); the learning-rate schedule still spans train.steps\n"
          "  --out CKPT        write the final checkpoint (safetensors; optimizer state alongside)\n"
          "  --resume CKPT     continue from a checkpoint (parameters, optimizer state, step)\n"
          "  --init CKPT       start from a checkpoint's parameters (fine-tuning: step 0, fresh\n"
          "                    optimizer state); names and shapes must match the model\n"
          "  --log-json FILE   one JSON line per step: step, loss, lr, grad_norm, ms, tokens_per_s\n"
          "  --threads N       OpenBLAS threads (default 1)\n"
          "  --device D        cpu (default), cuda or cuda:N: where the program runs (float32)\n"
          "  --quiet           no per-step lines\n"
          "  --help\n");
}

static const char *resumed_note(int done, char *buf, int cap) {
  snprintf(buf, (size_t)cap, ", resumed after step %d", done);
  return buf;
}

static void progress(int done, int total, double loss) {
  int w = 30, fill = total ? done * w / total : w;
  fprintf(stderr, "\r[");
  for (int i = 0; i < w; i++) fputc(i < fill ? '#' : '.', stderr);
  fprintf(stderr, "] %d/%d loss %.4f ", done, total, loss);
  if (done == total) fputc('\n', stderr);
  fflush(stderr);
}

int pw_cmd_train(int argc, char **argv) {
  static const struct option opts[] = {
      {"job", required_argument, 0, 'j'},     {"steps", required_argument, 0, 's'},
      {"out", required_argument, 0, 'o'},     {"resume", required_argument, 0, 'r'},
      {"log-json", required_argument, 0, 'l'}, {"threads", required_argument, 0, 't'},
      {"quiet", no_argument, 0, 'q'},          {"help", no_argument, 0, 'h'},
      {"init", required_argument, 0, 'i'},     {"device", required_argument, 0, 'd'},
      {0, 0, 0, 0}};
  const char *job_path = NULL, *out = NULL, *resume = NULL, *init = NULL, *log_path = NULL, *device = NULL;
  int steps = -1, threads = 1, quiet = 0, c;
  optind = 1;
  while ((c = pw_getopt(argc, argv, "j:s:o:r:i:l:t:d:qh", opts)) != -1) {
    switch (c) {
      case 'j': job_path = optarg; break;
      case 'd': device = optarg; break;
      case 's':
        if (pw_arg_int("--steps", optarg, 0, INT_MAX, &steps)) return train_usage(stderr), 2;
        break;
      case 'o': out = optarg; break;
      case 'r': resume = optarg; break;
      case 'i': init = optarg; break;
      case 'l': log_path = optarg; break;
      case 't':
        if (pw_arg_int("--threads", optarg, 1, MAX_THREADS, &threads)) return train_usage(stderr), 2;
        break;
      case 'q': quiet = 1; break;
      case 'h': train_usage(stdout); return 0;
      default: train_usage(stderr); return 2;
    }
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL) || pw_args_required(job_path, "--job FILE") ||
      (resume && init && (pw_cli_usage_error("--resume and --init exclude each other"), 1))) {
    train_usage(stderr);
    return 2;
  }
  if (pw_cli_compute_ready(threads)) return 1;
  pw_job job;
  if (pw_cli_load_job(job_path, &job)) return 1;
  int stop = steps >= 0 ? steps : job.train.steps;
  /* resuming is for going on; going on and throwing the result away is a
   * forgotten --out */
  if (resume && !out && job.mode != PW_MODE_FORWARD)
    fprintf(stderr, "warning: --resume without --out: the trained parameters will not be saved\n");
  const pw_backend *be = NULL;
  int rc = pw_cli_device(device, &be);
  if (rc) {
    pw_job_free(&job);
    return rc;
  }
  pw_trainer t;
  pw_err err = {0};
  rc = pw_trainer_init_on(&t, &job, be, &err);
  if (!rc && resume) rc = pw_trainer_resume(&t, resume, &err);
  if (!rc && init) rc = pw_trainer_load(&t, init, &err);
  if (rc) {
    pw_cli_report(&err);
    pw_job_free(&job);
    pw_cuda_close(be);
    return 1;
  }
  FILE *log = NULL;
  if (log_path && !(log = fopen(log_path, "w"))) {
    perror(log_path);
    pw_trainer_free(&t);
    pw_job_free(&job);
    pw_cuda_close(be);
    return 1;
  }
  char pbuf[32], nbuf[48];
  if (!quiet)
    printf("job %s: %s parameters, %d steps of %d sequences (%d microbatches)%s%s%s\n", job.name,
           pw_cli_si((double)pw_model_param_count(&t.model), pbuf, sizeof pbuf), stop, job.train.batch_size, t.n_mb,
           t.step ? resumed_note(t.step, nbuf, sizeof nbuf) : "", be ? " on " : "", be ? be->name : "");
  int tty = isatty(2) && !quiet;
  pw_step_stats st = {0};
  int diverged = 0;
  if (job.mode == PW_MODE_FORWARD) {
    /* batches, not steps (nothing trains), counted as everything a person reads: N done of M */
    double loss;
    for (int k = t.step; k < stop && !(rc = pw_trainer_forward(&t, k, &loss, &err)); k++)
      printf("batch %d/%d  loss %.6f\n", k + 1, stop, loss);
    stop = t.step; /* nothing trained */
  }
  while (!rc && t.step < stop) {
    if ((rc = pw_trainer_step(&t, &st, &err))) break;
    if (log) {
      fprintf(log, "{\"step\": %d, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"ms\": %.3f, \"tokens_per_s\": %.1f}\n",
              st.step, st.loss, st.lr, st.grad_norm, st.seconds * 1e3, st.tokens / st.seconds);
      fflush(log);
    }
    if (!quiet) {
      if (tty) fprintf(stderr, "\r\033[K");
      /* "step N/M": N steps done, as watch, status and the dashboard count */
      printf("step %d/%d  loss %.4f  lr %.2e  norm %.3f  %7.0f tok/s  %.1f ms\n", st.step + 1, stop, st.loss,
             st.lr, st.grad_norm, st.tokens / st.seconds, st.seconds * 1e3);
      fflush(stdout);
      if (tty) progress(t.step, stop, st.loss);
    }
    /* As the cluster does: a step whose loss or gradient norm is not finite
     * fails the run (no checkpoint of what it made), unless
     * train.on_nonfinite is "skip" (the optimizer skipped that update). */
    if (!isfinite(st.loss) || !isfinite(st.grad_norm)) {
      const char *what = !isfinite(st.loss) && !isfinite(st.grad_norm) ? "the loss and the gradient norm are"
                         : !isfinite(st.loss)                           ? "the loss is"
                                                                        : "the gradient norm is";
      if (job.train.on_nonfinite != PW_NONFINITE_SKIP) {
        fprintf(stderr, "error: diverged at step %d: %s not finite; %s (train.on_nonfinite \"skip\" skips such steps)\n",
                st.step, what, out ? "the final checkpoint is not written" : "stopped");
        diverged = 1;
        break;
      }
      fprintf(stderr, "warning: step %d skipped: %s not finite (train.on_nonfinite: skip)\n", st.step, what);
    }
    if (out && job.train.checkpoint_every > 0 && t.step % job.train.checkpoint_every == 0 &&
        t.step < stop && (rc = pw_trainer_save(&t, out, &err)))
      break;
  }
  if (!rc && !diverged && out) {
    rc = pw_trainer_save(&t, out, &err);
    if (!rc && !quiet) printf("wrote %s (step %d)\n", out, t.step);
  }
  if (rc) pw_cli_report(&err);
  if (log) fclose(log);
  pw_trainer_free(&t);
  pw_job_free(&job);
  pw_cuda_close(be);
  return rc || diverged ? 1 : 0;
}

int pw_cmd_eval(int argc, char **argv) {
  static const struct option opts[] = {{"job", required_argument, 0, 'j'},
                                       {"checkpoint", required_argument, 0, 'c'},
                                       {"threads", required_argument, 0, 't'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *job_path = NULL, *ckpt = NULL;
  int threads = 1, c;
  optind = 1;
  while ((c = pw_getopt(argc, argv, "j:c:t:h", opts)) != -1) {
    switch (c) {
      case 'j': job_path = optarg; break;
      case 'c': ckpt = optarg; break;
      case 't':
        if (pw_arg_int("--threads", optarg, 1, MAX_THREADS, &threads)) return fputs(EVAL_USAGE, stderr), 2;
        break;
      case 'h': fputs(EVAL_USAGE, stdout); return 0;
      default: fputs(EVAL_USAGE, stderr); return 2;
    }
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL) || pw_args_required(job_path, "--job FILE") ||
      pw_args_required(ckpt, "--checkpoint CKPT"))
    return fputs(EVAL_USAGE, stderr), 2;
  if (pw_cli_compute_ready(threads)) return 1;
  pw_job job;
  if (pw_cli_load_job(job_path, &job)) return 1;
  pw_trainer t;
  pw_err err = {0};
  int rc = pw_trainer_init(&t, &job, &err);
  if (!rc) { /* the trainer freed on every path from here (a failed load or eval too) */
    double loss;
    if (!(rc = pw_trainer_load(&t, ckpt, &err)) && !(rc = pw_trainer_eval(&t, &loss, &err)))
      printf("eval loss %.6f (%d batches of %d)\n", loss, job.train.eval_batches, job.train.batch_size);
    pw_trainer_free(&t);
  }
  if (rc) pw_cli_report(&err);
  pw_job_free(&job);
  return rc ? 1 : 0;
}
