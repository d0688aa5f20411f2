/* optim: the arithmetic of optim.h, written to match torch.optim.AdamW and
 * torch.optim.SGD (single-tensor path) operation for operation. */
#include "optim.h"

#include <math.h>

#include "cpu.h"

/* The two loops over whole arenas, compiled per vector level (cpu.h): the
 * same operations in the same order at every level, so the same bits. */
static PW_CPU_DISPATCH(sqnorm16, (const float *g, size_t n, double *out), (g, n, out)) {
  /* 16 partial sums: the loop vectorises, and the order is fixed. */
  size_t j = 0;
  double l[16] = {0}, t = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; k++) l[k] += (double)g[j + k] * g[j + k];
  for (; j < n; j++) t += (double)g[j] * g[j];
  for (int k = 0; k < 16; k++) t += l[k];
  *out = t;
}

static PW_CPU_DISPATCH(adamw_loop,
                       (float *w, const float *g, float *m, float *v, size_t n, float gs, float decay, float b1,
                        float b2, float eps, float step, float bc2s),
                       (w, g, m, v, n, gs, decay, b1, b2, eps, step, bc2s)) {
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * gs;
    w[i] *= decay;
    m[i] = m[i] * b1 + gi * (1.0f - b1);
    v[i] = v[i] * b2 + (1.0f - b2) * gi * gi;
    float denom = sqrtf(v[i]) / bc2s + eps;
    w[i] -= step * (m[i] / denom);
  }
}

double pw_lr_at(const pw_optim_spec *o, int steps, int k) {
  if (k < o->warmup_steps) return o->lr * (double)(k + 1) / (double)o->warmup_steps;
  int span = steps - o->warmup_steps;
  if (span < 1) span = 1;
  double prog = (double)(k - o->warmup_steps) / (double)span;
  if (prog > 1) prog = 1; /* past the horizon (a resumed run going on): stay at min_lr */
  return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * prog));
}

double pw_grad_sqnorm(pw_prog *p, const int *skip, int n_skip) {
  double s = 0;
  for (int i = 0; i < pw_prog_n_params(p); i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    int skipped = !pp->grad; /* frozen: torch's clip_grad_norm_ skips grad-less tensors */
    for (int k = 0; k < n_skip; k++) skipped |= skip[k] == pp->model_index;
    if (skipped) continue;
    double t;
    sqnorm16(pp->grad, pp->meta->numel, &t);
    s += t;
  }
  return s;
}

float pw_clip_coef(double norm, double clip) {
  if (clip <= 0) return 1.0f;
  double c = clip / (norm + 1e-6);
  return c < 1.0 ? (float)c : 1.0f;
}

static void adamw(pw_prog_param *pp, const pw_optim_spec *o, int t, double lr, float gs) {
  float decay = pp->meta->decay ? (float)(1.0 - lr * o->weight_decay) : 1.0f;
  double bc1 = 1.0 - pow(o->beta1, t), bc2 = 1.0 - pow(o->beta2, t);
  adamw_loop(pp->data, pp->grad, pp->m, pp->v, pp->meta->numel, gs, decay, (float)o->beta1, (float)o->beta2,
             (float)o->eps, (float)(lr / bc1), (float)sqrt(bc2));
}

static void sgd(pw_prog_param *pp, const pw_optim_spec *o, int t, double lr, float gs) {
  float *w = pp->data, *g = pp->grad, *buf = pp->m;
  size_t n = pp->meta->numel;
  float wd = pp->meta->decay ? (float)o->weight_decay : 0.0f, mom = (float)o->momentum;
  float flr = (float)lr;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * gs + wd * w[i];
    if (mom != 0.0f) {
      buf[i] = t == 1 ? gi : buf[i] * mom + gi;
      gi = buf[i];
    }
    w[i] -= flr * gi;
  }
}

void pw_optim_step(pw_prog *p, const pw_optim_spec *o, int t, double lr, float grad_scale) {
  for (int i = 0; i < pw_prog_n_params(p); i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    if (!pp->grad) continue; /* frozen */
    if (o->kind == PW_OPT_SGD)
      sgd(pp, o, t, lr, grad_scale);
    else
      adamw(pp, o, t, lr, grad_scale);
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
