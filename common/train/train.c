/* train: the single-process training loop of train.h. */
#include "train.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "ckpt.h"
#include "optim.h"
#include "spec_json.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int pw_trainer_init(pw_trainer *t, const pw_job *job, pw_err *err) { return pw_trainer_init_on(t, job, NULL, err); }

int pw_trainer_init_on(pw_trainer *t, const pw_job *job, const pw_backend *be, pw_err *err) {
  memset(t, 0, sizeof *t);
  t->job = job;
  if (be && !be->host && job->mesh.dp > 1)
    return pw_err_set(err, PW_ENOTSUP, "mesh.dp", "the single-process trainer on %s runs dp 1 (this job has %d)",
                      be->name, job->mesh.dp);
  /* The microbatches of every data-parallel replica, one after another:
   * the same microbatch size, and (below) the same order of gradient sums
   * as the pipelined run, so the two agree to the last bit. */
  int rc = t->mb_size = pw_job_mb_size(job, err);
  if (rc < 0) return rc;
  t->groups = job->mesh.dp;
  t->n_mb = job->schedule.microbatches * t->groups;
  if ((rc = pw_model_build(&job->model, &t->model, err))) return rc;
  pw_model_set_attention(&t->model, job->train.attention);
  pw_prog_config cfg = {.layer_lo = 0, .layer_hi = t->model.n_layers, .mb_size = t->mb_size,
                        .batch_size = job->train.batch_size, .n_slots = 1,
                        .bf16 = job->train.precision == PW_PRECISION_BF16, .backend = be};
  rc = pw_model_set_trainable(&t->model, &job->train, err);
  if (!rc) rc = pw_prog_create(&t->model, &cfg, &t->prog, err);
  if (!rc) rc = pw_dataset_open(&job->data, &t->model.data, job->train.seed, &t->ds, err);
  if (!rc && t->groups > 1 &&
      !(t->group_grads = calloc((size_t)t->groups * pw_prog_grad_numel(t->prog), sizeof(float))))
    rc = pw_err_set(err, PW_ENOMEM, "train", "out of memory");
  if (rc) {
    pw_trainer_free(t);
    return rc;
  }
  pw_prog_init_params(t->prog, job->train.seed);
  return 0;
}

int pw_trainer_resume(pw_trainer *t, const char *path, pw_err *err) {
  int step = 0;
  int rc = pw_ckpt_load(t->prog, path, 1, &step, err);
  if (!rc) t->step = step;
  return rc;
}

int pw_trainer_load(pw_trainer *t, const char *path, pw_err *err) {
  return pw_ckpt_load(t->prog, path, 0, NULL, err);
}

/* Forward (and backward) over the microbatches of one batch; the batch-
 * mean loss, the microbatch shares summed in double, into *loss. With
 * data-parallel groups, each group's gradients are kept apart and summed in
 * group order at the end, as the replicas' all-reduce does. */
static int run_batch(pw_trainer *t, pw_split split, long step, int backward, double *loss, pw_err *err) {
  const pw_model *m = &t->model;
  void *inp = m->input_value >= 0 ? pw_prog_value(t->prog, 0, m->input_value) : NULL;
  void *tgt = pw_prog_value(t->prog, 0, m->target_value);
  float *feat = m->feature_value >= 0 ? pw_prog_value(t->prog, 0, m->feature_value) : NULL;
  size_t gn = pw_prog_grad_numel(t->prog);
  float *g = pw_prog_grads(t->prog);
  int per_group = t->n_mb / t->groups, rc = 0;
  double sum = 0;
  *loss = 0;
  for (int j = 0; j < t->n_mb; j++) {
    float l = 0;
    pw_dataset_batch(t->ds, split, step, j * t->mb_size, t->mb_size, t->job->train.batch_size, inp, tgt);
    if (feat) pw_dataset_features(t->ds, split, step, j * t->mb_size, t->mb_size, t->job->train.batch_size, feat);
    if ((rc = pw_prog_forward(t->prog, 0, &l, err)) || (backward && (rc = pw_prog_backward(t->prog, 0, err))))
      return rc;
    sum += l;
    if (backward && t->groups > 1 && (j + 1) % per_group == 0) {
      memcpy(t->group_grads + (size_t)(j / per_group) * gn, g, gn * sizeof(float));
      memset(g, 0, gn * sizeof(float));
    }
  }
  if (backward && t->groups > 1)
    for (size_t i = 0; i < gn; i++) {
      float acc = 0;
      for (int d = 0; d < t->groups; d++) acc += t->group_grads[(size_t)d * gn + i];
      g[i] = acc;
    }
  if (backward) pw_prog_grads_finalize(t->prog);
  *loss = sum;
  return 0;
}

int pw_trainer_step(pw_trainer *t, pw_step_stats *st, pw_err *err) {
  const pw_train_spec *tr = &t->job->train;
  double t0 = now(), loss;
  memset(st, 0, sizeof *st);
  pw_prog_zero_grad(t->prog);
  int rc = run_batch(t, PW_SPLIT_TRAIN, t->step, 1, &loss, err);
  if (rc) return rc; /* the step not taken: t->step stays */
  pw_step_sched sc = pw_step_sched_of(tr, t->step, pw_grad_sqnorm(t->prog, NULL, 0));
  pw_optim_update(t->prog, tr, &sc);
  st->step = t->step;
  st->loss = loss;
  st->lr = sc.lr;
  st->grad_norm = sc.grad_norm;
  st->seconds = now() - t0;
  st->tokens = (double)tr->batch_size * t->model.seq_len;
  t->step++;
  return 0;
}

int pw_trainer_eval(pw_trainer *t, double *loss, pw_err *err) {
  int n = t->job->train.eval_batches > 0 ? t->job->train.eval_batches : 1, rc = 0;
  double s = 0, l;
  *loss = 0;
  for (int k = 0; k < n; k++) {
    if ((rc = run_batch(t, PW_SPLIT_EVAL, k, 0, &l, err))) return rc;
    s += l;
  }
  *loss = s / n;
  return 0;
}

int pw_trainer_forward(pw_trainer *t, int step, double *loss, pw_err *err) {
  return run_batch(t, PW_SPLIT_TRAIN, step, 0, loss, err);
}

int pw_trainer_save(pw_trainer *t, const char *path, pw_err *err) {
  json_t *j = pw_job_to_json(t->job);
  char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
  int rc = pw_ckpt_save(t->prog, path, t->step, s, err);
  free(s);
  json_decref(j);
  return rc;
}

void pw_trainer_free(pw_trainer *t) {
  free(t->group_grads);
  pw_dataset_close(t->ds);
  pw_prog_free(t->prog);
  pw_model_free(&t->model);
  memset(t, 0, sizeof *t);
}
