/* optim: learning-rate schedule, gradient clipping and the optimizers,
 * with torch.optim semantics so a run reproduces in PyTorch (docs/contracts.md,
 * "Training arithmetic"). They act on a program's parameter arenas; in a
 * pipeline each rank steps its own program after the ranks agreed on the
 * global gradient norm. */
#ifndef PW_OPTIM_H
#define PW_OPTIM_H

#include "prog.h"
#include "spec.h"

/* Learning rate at step k (0-based): linear warmup, then cosine to min_lr
 * at k = steps, and min_lr after. */
double pw_lr_at(const pw_optim_spec *o, int steps, int k);

/* Sum of squares of the program's gradients (double accumulation; frozen
 * parameters have none). A
 * parameter listed in `skip` (model parameter ids, n_skip of them) is left
 * out: with tied parameters only one holder counts them. */
double pw_grad_sqnorm(pw_prog *p, const int *skip, int n_skip);
/* The same over elements [lo, hi) of the gradient arena's main part (a
 * data-parallel shard, train.zero > 0): each parameter's part inside it,
 * in parameter order. Over [0, train_numel) the same bits as above. */
double pw_grad_sqnorm_range(pw_prog *p, const int *skip, int n_skip, size_t lo, size_t hi);

/* torch.nn.utils.clip_grad_norm_: min(1, clip / (norm + 1e-6)); 1 when clip <= 0. */
float pw_clip_coef(double norm, double clip);

/* One optimizer step at 1-based step t with learning rate lr, on the
 * trainable parameters (frozen ones stay bit for bit). Gradients are
 * first multiplied by grad_scale (the clip coefficient), in float as torch
 * does. AdamW: decoupled decay (p *= 1 - lr*wd) on tensors with 2+ dims,
 * bias-corrected moments. SGD: coupled decay (g += wd*p) on the same
 * tensors, momentum buffer in m (dampening 0, as torch). */
void pw_optim_step(pw_prog *p, const pw_optim_spec *o, int t, double lr, float grad_scale);
/* The same on elements [lo, hi) of the gradient arena's main part only
 * (the same offsets in the parameters), with that range's optimizer state
 * in m and v (hi - lo floats each; m[0] is element lo's): ZeRO's sharded
 * update. Element by element the same arithmetic as pw_optim_step. */
void pw_optim_step_range(pw_prog *p, const pw_optim_spec *o, int t, double lr, float grad_scale, size_t lo, size_t hi,
                         float *m, float *v);

/* What a training step's update needs, the same on every rank once the
 * global squared gradient norm is agreed. Computed here, once, for the
 * single-process trainer and the pipeline ranks (worker/stepend.c) alike. */
typedef struct {
  int step;           /* 0-based */
  double lr;          /* pw_lr_at(optimizer, train.steps, step) */
  double grad_norm;   /* sqrt(sqnorm): the global norm before clipping */
  float clip_coef;    /* pw_clip_coef(grad_norm, train.grad_clip) */
  int skip;           /* the norm is not finite and train.on_nonfinite is
                         "skip": no update this step (weights and optimizer
                         state untouched; the next step's AdamW t is still
                         its own step + 1) */
} pw_step_sched;

pw_step_sched pw_step_sched_of(const pw_train_spec *tr, int step, double sqnorm);
/* The optimizer step of one program for it (pw_optim_step at t = step + 1,
 * gradients scaled by the clip coefficient); nothing when s->skip. */
void pw_optim_update(pw_prog *p, const pw_train_spec *tr, const pw_step_sched *s);
void pw_optim_update_range(pw_prog *p, const pw_train_spec *tr, const pw_step_sched *s, size_t lo, size_t hi, float *m,
                           float *v);

#endif
