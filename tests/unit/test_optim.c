/* test_optim: the one optimizer step the trainer and the pipeline ranks
 * share (optim.h: pw_step_sched_of + pw_optim_update).
 * - the step's schedule: warmup and cosine learning rates worked out by
 *   hand, the norm and the clip coefficient from the squared norm;
 * - a first AdamW step worked out by hand (bias-corrected moments make it
 *   about lr * sign(g) after decoupled decay on matrices only; a large eps
 *   makes it depend on the size of g), clipped and not:
 *   an update that skipped the clip, the decay or the bias correction, or
 *   stepped at t = step instead of step + 1, fails. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model.h"
#include "optim.h"
#include "prog.h"
#include "ckpt.h"
#include "safetensors.h"

static pw_train_spec train_spec(void) {
  pw_train_spec t;
  memset(&t, 0, sizeof t);
  t.steps = 10;
  t.grad_clip = 1.0;
  t.optim.kind = PW_OPT_ADAMW;
  t.optim.lr = 1e-2;
  t.optim.min_lr = 1e-3;
  t.optim.warmup_steps = 2;
  t.optim.beta1 = 0.9;
  t.optim.beta2 = 0.95;
  t.optim.eps = 1e-8;
  t.optim.weight_decay = 0.1;
  return t;
}

static void test_sched(void **state) {
  (void)state;
  pw_train_spec t = train_spec();
  pw_step_sched s = pw_step_sched_of(&t, 0, 16.0);
  assert_int_equal(s.step, 0);
  assert_true(fabs(s.lr - 0.5e-2) < 1e-15);          /* warmup: lr * 1/2 */
  assert_true(s.grad_norm == 4.0);
  assert_true(fabsf(s.clip_coef - (float)(1.0 / (4.0 + 1e-6))) == 0.0f);
  s = pw_step_sched_of(&t, 1, 0.25);
  assert_true(fabs(s.lr - 1e-2) < 1e-15);            /* warmup done */
  assert_true(s.clip_coef == 1.0f);                  /* norm 0.5 < clip */
  s = pw_step_sched_of(&t, 6, 0.25);                 /* halfway down the cosine */
  assert_true(fabs(s.lr - (1e-3 + 0.5 * 9e-3)) < 1e-12);
  s = pw_step_sched_of(&t, 50, 0.25);                /* past the horizon */
  assert_true(fabs(s.lr - 1e-3) < 1e-15);
  t.grad_clip = 0;                                   /* no clipping */
  assert_true(pw_step_sched_of(&t, 3, 1e6).clip_coef == 1.0f);
}

/* A one-layer MLP program: a 3x2 weight (decayed) and a bias (not). */
static pw_prog *tiny_prog(pw_model *m) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_MLP;
  s.in_dim = 2, s.hidden_dim = 3, s.out_dim = 1, s.n_layers = 1;
  s.activation = PW_ACT_RELU, s.loss = PW_LOSS_MSE;
  assert_int_equal(pw_model_build(&s, m, NULL), 0);
  pw_prog_config cfg = {.layer_lo = 0, .layer_hi = 1, .mb_size = 1, .batch_size = 1, .n_slots = 1};
  pw_prog *p = NULL;
  assert_int_equal(pw_prog_create(m, &cfg, &p, NULL), 0);
  return p;
}

static void check_first_step(double sqnorm, float want_coef) {
  pw_model m;
  pw_prog *p = tiny_prog(&m);
  pw_train_spec t = train_spec();
  t.optim.eps = 0.1;
  float *w = pw_prog_params(p), *g = pw_prog_grads(p);
  size_t n = pw_prog_numel(p);
  float w0[16];
  assert_true(n <= 16);
  for (size_t i = 0; i < n; i++) {
    w[i] = w0[i] = 0.5f + 0.1f * (float)i;
    g[i] = (i % 2 ? -1.0f : 1.0f) * (0.25f + 0.05f * (float)i);
  }
  pw_step_sched s = pw_step_sched_of(&t, 1, sqnorm); /* step 1: t = 2 for the bias correction */
  assert_true(s.clip_coef == want_coef);
  pw_optim_update(p, &t, &s);
  /* Fresh moments at t = 2: m = (1-b1) g, v = (1-b2) g^2, corrected by
   * 1-b1^2 and 1-b2^2. eps is large so the size of g (the clip) shows. */
  for (int k = 0; k < pw_prog_n_params(p); k++) {
    pw_prog_param *pp = pw_prog_param_at(p, k);
    for (size_t i = 0; i < pp->meta->numel; i++) {
      size_t at = (size_t)(pp->data - w) + i;
      double gi = (double)g[at] * want_coef;
      double mh = 0.1 * gi / (1 - 0.81), vh = 0.05 * gi * gi / (1 - 0.9025);
      double decay = pp->meta->decay ? 1 - s.lr * 0.1 : 1;
      double want = w0[at] * decay - s.lr * mh / (sqrt(vh) + 0.1);
      if (fabs(pp->data[i] - want) > 1e-6)
        fail_msg("%s[%zu]: %.9g, want %.9g", pp->meta->name, i, (double)pp->data[i], want);
    }
  }
  pw_prog_free(p);
  pw_model_free(&m);
}

static void test_adamw_by_hand(void **state) {
  (void)state;
  check_first_step(0.25, 1.0f);                        /* norm 0.5: no clip */
  check_first_step(100.0, (float)(1.0 / (10.0 + 1e-6))); /* norm 10: clipped to 1 */
}

/* A frozen parameter (the weight; the bias trains): no gradient or AdamW
 * state, left out of the norm, untouched by a step (also with weight
 * decay), and out of the optimizer checkpoint, which loads back. */
static void test_frozen(void **state) {
  (void)state;
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_MLP;
  s.in_dim = 2, s.hidden_dim = 3, s.out_dim = 1, s.n_layers = 1;
  s.activation = PW_ACT_RELU, s.loss = PW_LOSS_MSE;
  pw_model m;
  assert_int_equal(pw_model_build(&s, &m, NULL), 0);
  pw_train_spec t = train_spec();
  t.n_trainable = 1;
  snprintf(t.trainable[0], PW_TRAINABLE_LEN, "*.bias");
  assert_int_equal(pw_model_set_trainable(&m, &t, NULL), 0);
  pw_prog_config cfg = {.layer_lo = 0, .layer_hi = 1, .mb_size = 1, .batch_size = 1, .n_slots = 1};
  pw_prog *p = NULL;
  assert_int_equal(pw_prog_create(&m, &cfg, &p, NULL), 0);
  assert_int_equal(pw_prog_n_params(p), 2);
  pw_prog_param *w = pw_prog_param_at(p, 0), *b = pw_prog_param_at(p, 1);
  assert_true(w->meta->decay && w->meta->frozen && !b->meta->frozen);
  assert_true(!w->grad && !w->m && !w->v && b->grad && b->m && b->v);
  assert_int_equal(pw_prog_train_numel(p), b->meta->numel);
  assert_int_equal(pw_prog_grad_numel(p), b->meta->numel);
  for (size_t i = 0; i < w->meta->numel; i++) w->data[i] = 0.5f + 0.1f * (float)i;
  for (size_t i = 0; i < b->meta->numel; i++) b->grad[i] = 2.0f, b->data[i] = 0.0f;
  float w0[16];
  memcpy(w0, w->data, w->meta->numel * sizeof(float));
  assert_true(pw_grad_sqnorm(p, NULL, 0) == 4.0 * (double)b->meta->numel);
  pw_step_sched sc = pw_step_sched_of(&t, 0, pw_grad_sqnorm(p, NULL, 0));
  pw_optim_update(p, &t, &sc);
  assert_memory_equal(w->data, w0, w->meta->numel * sizeof(float));
  assert_true(b->data[0] != 0.0f && b->m[0] != 0.0f);
  char path[] = "/tmp/pw_test_frozen_XXXXXX", opath[64], file[64];
  assert_non_null(mkdtemp(path));
  snprintf(file, sizeof file, "%s/c.safetensors", path);
  assert_int_equal(pw_ckpt_save(p, file, 1, NULL, NULL), 0);
  pw_ckpt_optim_path(file, opath, sizeof opath);
  pw_st_file *f = NULL;
  assert_int_equal(pw_st_open(opath, &f, NULL), 0);
  char name[128];
  snprintf(name, sizeof name, "exp_avg.%s", b->meta->name);
  assert_int_equal(pw_st_copy(f, name, PW_ST_F32, 1, (int64_t[2]){(int64_t)b->meta->numel, 0}, w0, NULL), 0);
  snprintf(name, sizeof name, "exp_avg.%s", w->meta->name);
  assert_int_not_equal(pw_st_copy(f, name, PW_ST_F32, 2, (int64_t[2]){w->meta->shape[0], w->meta->shape[1]}, w0,
                                  NULL), 0);
  assert_int_equal(pw_st_count(f), 2); /* exp_avg, exp_avg_sq of the bias */
  pw_st_close(f);
  float m0 = b->m[0];
  b->m[0] = 0;
  assert_int_equal(pw_ckpt_load(p, file, 1, NULL, NULL), 0);
  assert_true(b->m[0] == m0);
  unlink(file);
  unlink(opath);
  rmdir(path);
  pw_prog_free(p);
  pw_model_free(&m);
}

/* train.on_nonfinite: "skip" leaves weights and AdamW state as they were
 * when the global norm is not finite; "fail" (the default) updates (the
 * coordinator fails the job), and a finite norm always updates. */
static void test_nonfinite(void **state) {
  (void)state;
  pw_train_spec t = train_spec();
  assert_int_equal(pw_step_sched_of(&t, 1, NAN).skip, 0);
  t.on_nonfinite = PW_NONFINITE_SKIP;
  assert_int_equal(pw_step_sched_of(&t, 1, NAN).skip, 1);
  assert_int_equal(pw_step_sched_of(&t, 1, INFINITY).skip, 1);
  assert_int_equal(pw_step_sched_of(&t, 1, 4.0).skip, 0);
  pw_model m;
  pw_prog *p = tiny_prog(&m);
  float *w = pw_prog_params(p), *g = pw_prog_grads(p);
  size_t n = pw_prog_numel(p);
  float w0[16];
  for (size_t i = 0; i < n; i++) w[i] = w0[i] = 0.5f + 0.1f * (float)i, g[i] = NAN;
  pw_step_sched s = pw_step_sched_of(&t, 1, NAN);
  pw_optim_update(p, &t, &s);
  assert_memory_equal(w, w0, n * sizeof *w);
  pw_prog_param *pp = pw_prog_param_at(p, 0);
  for (size_t i = 0; i < pp->meta->numel; i++) assert_true(pp->m[i] == 0.0f && pp->v[i] == 0.0f);
  t.on_nonfinite = PW_NONFINITE_FAIL;
  s = pw_step_sched_of(&t, 1, NAN);
  pw_optim_update(p, &t, &s);
  assert_true(isnan(w[0]));
  pw_prog_free(p);
  pw_model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nonfinite),
      cmocka_unit_test(test_sched),
      cmocka_unit_test(test_adamw_by_hand),
      cmocka_unit_test(test_frozen),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
