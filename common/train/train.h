/* train: the single-process trainer — every layer in one program, the
 * microbatches of a step run one after another in one slot.
 *
 * It is the embedded default (`pipewright train`) and the oracle that every
 * pipelined run must equal: same data (data.c), same microbatch sums, same
 * clipping and optimizer (optim.c). Of the mesh and schedule it uses only
 * the microbatch count and dp, and only to sum gradients in the order a
 * pipelined run does (microbatches of batch/(microbatches*dp) sequences,
 * replica groups summed last), so the two agree bit for bit.
 * Deterministic: fixed reduction orders. */
#ifndef PW_TRAIN_H
#define PW_TRAIN_H

#include "data.h"
#include "model.h"
#include "prog.h"
#include "spec.h"

typedef struct {
  const pw_job *job;
  pw_model model;
  pw_prog *prog;
  pw_dataset *ds;
  int step;            /* next step to run (0-based) */
  int mb_size, n_mb;   /* n_mb = schedule.microbatches * mesh.dp */
  int groups;          /* mesh.dp: gradient sums grouped as the replicas' */
  float *group_grads;  /* [groups][grad_numel] when groups > 1 */
} pw_trainer;

typedef struct {
  int step;            /* the step just run */
  double loss;         /* mean loss over the batch, before the update */
  double lr;
  double grad_norm;    /* before clipping */
  double seconds;      /* wall time of the step */
  double tokens;       /* tokens (or samples) processed */
} pw_step_stats;

/* Builds the model, the program and the dataset; initialises parameters
 * from train.seed. */
PW_MUST_CHECK int pw_trainer_init(pw_trainer *t, const pw_job *job, pw_err *err);
/* The same with the program on backend `be` (backend.h; NULL: the CPU);
 * off the CPU, mesh.dp 1 only. */
struct pw_backend;
PW_MUST_CHECK int pw_trainer_init_on(pw_trainer *t, const pw_job *job, const struct pw_backend *be, pw_err *err);
/* Resume from a checkpoint written by pw_ckpt_save (parameters, optimizer
 * state and step). */
PW_MUST_CHECK int pw_trainer_resume(pw_trainer *t, const char *path, pw_err *err);
/* Loads parameters only (e.g. for eval). */
PW_MUST_CHECK int pw_trainer_load(pw_trainer *t, const char *path, pw_err *err);
/* The three passes return 0, or the code of a failed forward or backward
 * with err filled (prog.h's entry points: "stage program: ..."); the
 * results are 0 then, and a failed step is not taken (no update,
 * t->step unchanged). */
/* One optimizer step (forward+backward over every microbatch, clip, update). */
PW_MUST_CHECK int pw_trainer_step(pw_trainer *t, pw_step_stats *st, pw_err *err);
/* Mean loss over train.eval_batches batches of the eval split. */
PW_MUST_CHECK int pw_trainer_eval(pw_trainer *t, double *loss, pw_err *err);
/* Mean loss of the batch of `step` (train split), no update: forward mode. */
PW_MUST_CHECK int pw_trainer_forward(pw_trainer *t, int step, double *loss, pw_err *err);
PW_MUST_CHECK int pw_trainer_save(pw_trainer *t, const char *path, pw_err *err);
void pw_trainer_free(pw_trainer *t);

#endif
