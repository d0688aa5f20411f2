/* bench_step: pipewright's side of case 2 (training step vs PyTorch), as a
 * server that trains one step per command, so that the harness can
 * alternate single steps with PyTorch's (bench/torch_step.py --serve):
 * A B B A ..., each process idle (blocked on its stdin) while the other
 * computes, and load from other processes hits both sides alike.
 *
 *   bench_step --job FILE [--threads N] [--sgemm-only]
 *
 * Prints "ready" once the trainer is built; then each input line
 *   step   runs pw_trainer_step (the code path of `pipewright train`: data,
 *          zero grad, forward, backward, norm, clip, AdamW) and prints
 *          {"ms": step time, "loss": loss};
 *   sgemm  runs the bare cblas_sgemm calls of every linear layer of one step
 *          (forward, backward-input, backward-weight, each microbatch, on
 *          buffers of its own) and prints {"ms": time, "gflop": their FLOPs}:
 *          the sgemm rate on the model's shapes, measured between steps so
 *          that the step's fraction of it is not skewed by changing load;
 *   quit   (or EOF) ends.
 * --sgemm-only builds the model's shapes but no trainer and answers only
 * "sgemm": a second process whose OpenBLAS picked other kernels (the CPU's
 * own, with OPENBLAS_CORETYPE unset) probes the native peak beside the
 * kernels in use. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "spec_json.h"
#include "train.h"

/* The bare sgemms of every linear node of one step, on scratch buffers
 * sized for the largest shape. Returns seconds; *gflop gets their FLOPs. */
static double sgemm_probe(const pw_model *m, int mb, int n_mb, double *gflop) {
  static float *a, *w, *o;
  size_t na = 1, nw = 1, no = 1;
  for (int i = 0; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    if (n->op != PW_OP_LINEAR) continue;
    size_t N = (size_t)mb * m->values[n->in[0]].rows;
    na = N * n->C > na ? N * n->C : na;
    nw = (size_t)n->OC * n->C > nw ? (size_t)n->OC * n->C : nw;
    no = N * n->OC > no ? N * n->OC : no;
  }
  if (!a) {
    a = malloc(na * sizeof(float)), w = malloc(nw * sizeof(float)), o = malloc(no * sizeof(float));
    if (!a || !w || !o) exit(1);
    bench_fill(a, na, 1, 1.0f), bench_fill(w, nw, 2, 0.02f), bench_fill(o, no, 3, 1e-3f);
  }
  double f = 0, t0 = bench_now();
  for (int k = 0; k < n_mb; k++)
    for (int i = 0; i < m->n_nodes; i++) {
      const pw_node *n = &m->nodes[i];
      if (n->op != PW_OP_LINEAR) continue;
      int N = mb * m->values[n->in[0]].rows, C = n->C, OC = n->OC;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, a, C, w, C, 0.0f, o, OC);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, o, OC, w, C, 1.0f, a, C);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, o, OC, a, C, 1.0f, w, C);
      f += 6.0 * N * C * OC;
    }
  *gflop = f * 1e-9;
  return bench_now() - t0;
}

static int serve_sgemm_only(const char *job_path, int threads) {
  pw_job job;
  pw_model m;
  pw_err err = {0};
  char buf[600], line[64];
  openblas_set_num_threads(threads);
  int mb;
  if (pw_job_load_file(job_path, &job, &err) || pw_model_build(&job.model, &m, &err) ||
      (mb = pw_job_mb_size(&job, &err)) < 0) {
    fprintf(stderr, "bench_step: %s: %s\n", job_path, pw_err_str(&err, buf, sizeof buf));
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  while (fgets(line, sizeof line, stdin) && strncmp(line, "sgemm", 5) == 0) {
    double gf, sec = sgemm_probe(&m, mb, job.train.batch_size / mb, &gf);
    printf("{\"ms\": %.3f, \"gflop\": %.6f}\n", sec * 1e3, gf);
    fflush(stdout);
  }
  pw_model_free(&m);
  pw_job_free(&job);
  return 0;
}

int main(int argc, char **argv) {
  const char *job_path = NULL;
  int threads = 1, sgemm_only = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--job") == 0 && i + 1 < argc) job_path = argv[++i];
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--sgemm-only") == 0) sgemm_only = 1;
    else {
      fprintf(stderr, "usage: bench_step --job FILE [--threads N]\n");
      return 2;
    }
  }
  if (!job_path || threads < 1) {
    fprintf(stderr, "usage: bench_step --job FILE [--threads N]\n");
    return 2;
  }
  openblas_set_num_threads(threads);
  pw_job job;
  pw_trainer t;
  pw_err err = {0};
  char buf[600];
  if (sgemm_only) return serve_sgemm_only(job_path, threads);
  if (pw_job_load_file(job_path, &job, &err) || pw_trainer_init(&t, &job, &err)) {
    fprintf(stderr, "bench_step: %s: %s\n", job_path, pw_err_str(&err, buf, sizeof buf));
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  char line[64];
  int rc = 0;
  while (fgets(line, sizeof line, stdin)) {
    if (strncmp(line, "step", 4) == 0) {
      pw_step_stats st;
      if (pw_trainer_step(&t, &st, &err)) { /* the driver reads end of file and stops */
        fprintf(stderr, "bench_step: %s\n", pw_err_str(&err, buf, sizeof buf));
        rc = 1;
        break;
      }
      printf("{\"ms\": %.3f, \"loss\": %.6f}\n", st.seconds * 1e3, st.loss);
    } else if (strncmp(line, "sgemm", 5) == 0) {
      double gf, sec = sgemm_probe(&t.model, t.mb_size, t.n_mb, &gf);
      printf("{\"ms\": %.3f, \"gflop\": %.6f}\n", sec * 1e3, gf);
    } else {
      break;
    }
    fflush(stdout);
  }
  pw_trainer_free(&t);
  pw_job_free(&job);
  return rc;
}
