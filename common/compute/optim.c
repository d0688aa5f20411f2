/* optim: the arithmetic of optim.h, written to match torch.optim.AdamW and
 * torch.optim.SGD (single-tensor path) operation for operation. The loops
 * over a parameter's elements are the program's backend's (backend.h;
 * backend.c has the CPU's), so they run where the arenas live. */
#include "optim.h"

#include <math.h>

#include "backend.h"

double pw_lr_at(const pw_optim_spec *o, int steps, int k) {
  if (k < o->warmup_steps) return o->lr * (double)(k + 1) / (double)o->warmup_steps;
  int span = steps - o->warmup_steps;
  if (span < 1) span = 1;
  double prog = (double)(k - o->warmup_steps) / (double)span;
  if (prog > 1) prog = 1; /* past the horizon (a resumed run going on): stay at min_lr */
  return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * prog));
}

/* The part [*a, *b) of parameter pp's gradient inside [lo, hi) of the
 * program's gradient arena; 0 when they do not meet. */
static int clip_range(pw_prog *p, const pw_prog_param *pp, size_t lo, size_t hi, size_t *a, size_t *b) {
  size_t off = (size_t)(pp->grad - pw_prog_grads(p)), n = pp->meta->numel;
  *a = lo > off ? lo - off : 0;
  *b = hi < off + n ? (hi > off ? hi - off : 0) : n;
  return *a < *b;
}

double pw_grad_sqnorm(pw_prog *p, const int *skip, int n_skip) {
  return pw_grad_sqnorm_range(p, skip, n_skip, 0, pw_prog_train_numel(p));
}

double pw_grad_sqnorm_range(pw_prog *p, const int *skip, int n_skip, size_t lo, size_t hi) {
  const pw_backend *be = pw_prog_backend(p);
  double s = 0;
  for (int i = 0; i < pw_prog_n_params(p); i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    int skipped = !pp->grad; /* frozen: torch's clip_grad_norm_ skips grad-less tensors */
    for (int k = 0; k < n_skip; k++) skipped |= skip[k] == pp->model_index;
    size_t a, b;
    if (skipped || !clip_range(p, pp, lo, hi, &a, &b)) continue;
    s += be->sqnorm(be, pp->grad + a, b - a);
  }
  return s;
}

float pw_clip_coef(double norm, double clip) {
  if (clip <= 0) return 1.0f;
  double c = clip / (norm + 1e-6);
  return c < 1.0 ? (float)c : 1.0f;
}

/* Elements [a, b) of parameter pp, whose moments start at m and v. */
static void adamw(const pw_backend *be, pw_prog_param *pp, const pw_optim_spec *o, int t, double lr, float gs, size_t a,
                  size_t b, float *m, float *v) {
  float decay = pp->meta->decay ? (float)(1.0 - lr * o->weight_decay) : 1.0f;
  double bc1 = 1.0 - pow(o->beta1, t), bc2 = 1.0 - pow(o->beta2, t);
  be->adamw(be, pp->data + a, pp->grad + a, m, v, b - a, gs, decay, (float)o->beta1, (float)o->beta2, (float)o->eps,
            (float)(lr / bc1), (float)sqrt(bc2));
}

static void sgd(const pw_backend *be, pw_prog_param *pp, const pw_optim_spec *o, int t, double lr, float gs,
                size_t a, size_t b, float *buf) {
  float wd = pp->meta->decay ? (float)o->weight_decay : 0.0f;
  be->sgd(be, pp->data + a, pp->grad + a, buf, b - a, gs, wd, (float)o->momentum, (float)lr, t == 1);
}

void pw_optim_step(pw_prog *p, const pw_optim_spec *o, int t, double lr, float grad_scale) {
  pw_optim_step_range(p, o, t, lr, grad_scale, 0, pw_prog_train_numel(p), pw_prog_moment(p, 0), pw_prog_moment(p, 1));
}

void pw_optim_step_range(pw_prog *p, const pw_optim_spec *o, int t, double lr, float grad_scale, size_t lo, size_t hi,
                         float *m, float *v) {
  const pw_backend *be = pw_prog_backend(p);
  for (int i = 0; i < pw_prog_n_params(p); i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    size_t a, b;
    if (!pp->grad || !clip_range(p, pp, lo, hi, &a, &b)) continue; /* frozen, or not ours */
    size_t at = (size_t)(pp->grad - pw_prog_grads(p)) + a - lo;   /* where [a, b) starts in m and v */
    if (o->kind == PW_OPT_SGD)
      sgd(be, pp, o, t, lr, grad_scale, a, b, m + at);
    else
      adamw(be, pp, o, t, lr, grad_scale, a, b, m + at, v + at);
  }
}

pw_step_sched pw_step_sched_of(const pw_train_spec *tr, int step, double sqnorm) {
  pw_step_sched s = {.step = step, .grad_norm = sqrt(sqnorm)};
  s.clip_coef = pw_clip_coef(s.grad_norm, tr->grad_clip);
  s.lr = pw_lr_at(&tr->optim, tr->steps, step);
  /* A NaN loss makes every gradient NaN, so the global norm, which every
   * rank agrees on bit for bit, decides for all of them at once. */
  s.skip = !isfinite(s.grad_norm) && tr->on_nonfinite == PW_NONFINITE_SKIP;
  return s;
}

void pw_optim_update(pw_prog *p, const pw_train_spec *tr, const pw_step_sched *s) {
  if (s->skip) return;
  pw_optim_step(p, &tr->optim, s->step + 1, s->lr, s->clip_coef);
}

void pw_optim_update_range(pw_prog *p, const pw_train_spec *tr, const pw_step_sched *s, size_t lo, size_t hi, float *m,
                           float *v) {
  if (s->skip) return;
  pw_optim_step_range(p, &tr->optim, s->step + 1, s->lr, s->clip_coef, lo, hi, m, v);
}
