/* test_prog: how a stage program writes value gradients.
 *
 * A backward does not zero the slot's value gradients: the first writer of
 * each (in backward order) overwrites, later ones accumulate. So
 * - a backward into gradient buffers full of garbage (NaN) gives, bit for
 *   bit, the value and parameter gradients of a backward into zeroed ones:
 *   whole models, stage programs (output-port gradients filled by the
 *   caller, which every writer must add to), B and I+W alike, and values
 *   read twice by one node (add(x, x), swiglu(g, g)) or by nobody, with
 *   either attention kernel;
 * - B (which runs a layernorm's two halves as one pass) and I+W give the
 *   same gradients bit for bit;
 * - the gradient of a stage's input port (the residual stream, read by a
 *   layernorm and by a residual add) agrees with a finite difference: a
 *   second reader that overwrote instead of adding would fail.
 * And an entry point's failure says what failed through its pw_err: a slot
 * that does not exist, W before I under remat, a failed tensor-parallel
 * all-reduce or ZeRO-2 hand-off (the callback's own err, kept: no call
 * after it, every later entry point returns it). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collective.h"
#include "model.h"
#include "prog.h"
#include "rng.h"

enum { MB = 2 }; /* sequences per microbatch */

static pw_model_spec spec_of(int tmpl) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = tmpl;
  if (tmpl == PW_TEMPLATE_MLP) {
    s.in_dim = 5, s.hidden_dim = 7, s.out_dim = 3, s.n_layers = 2;
    s.activation = PW_ACT_GELU, s.loss = PW_LOSS_MSE;
    return s;
  }
  s.vocab_size = 19, s.seq_len = 5, s.d_model = 8, s.n_layers = 2, s.n_heads = 2;
  s.ffn_hidden = 12;
  s.init_std = 0.3f; /* every path carries gradient */
  return s;
}

/* Makes the first node of op `op` read its first input twice (x + x,
 * swiglu(g, g)); the value it read second is then read by nobody. */
static void read_twice(pw_model *m, int op) {
  for (int i = 0; i < m->n_nodes; i++)
    if (m->nodes[i].op == op) {
      m->nodes[i].in[1] = m->nodes[i].in[0];
      return;
    }
  fail_msg("no node of op %d", op);
}

/* Every input port of the program: tokens, features, targets, or (another
 * stage's output) activations, drawn from a stream keyed by `key`. */
static void fill_inputs(pw_prog *p, const pw_model *m, int slot, uint64_t key) {
  pw_rng r;
  pw_rng_seed(&r, key);
  int V = m->data.tokens ? m->data.vocab_size : m->data.out_dim;
  for (int i = 0; i < pw_prog_n_inputs(p); i++) {
    const pw_prog_port *pt = pw_prog_input(p, i);
    const pw_value *v = &m->values[pt->value];
    void *d = pw_prog_value(p, slot, pt->value);
    for (size_t k = 0; k < pt->bytes / 4; k++) {
      if (v->dtype == PW_DT_I32)
        ((int32_t *)d)[k] = (int32_t)pw_rng_below(&r, (uint64_t)V);
      else
        ((float *)d)[k] = (float)pw_rng_normal(&r);
    }
  }
}

static int is_output(pw_prog *p, int v) {
  for (int k = 0; k < pw_prog_n_outputs(p); k++)
    if (pw_prog_output(p, k)->value == v) return 1;
  return 0;
}

static size_t value_floats(const pw_model *m, int v) { return pw_value_bytes(&m->values[v], MB) / 4; }

/* Sets every value gradient of the slot: output ports from a fixed stream
 * (what a next stage would send), all others to `fill`. */
static void set_grads(pw_prog *p, const pw_model *m, int slot, float fill) {
  pw_rng r;
  pw_rng_seed(&r, 99);
  for (int v = 0; v < m->n_values; v++) {
    float *g = pw_prog_grad(p, slot, v);
    if (!g) continue;
    int out = is_output(p, v);
    for (size_t k = 0; k < value_floats(m, v); k++) g[k] = out ? (float)pw_rng_normal(&r) : fill;
  }
}

/* Parameter gradients, then every value gradient of the slot, into one
 * malloc'd array (*n floats). */
static float *snapshot(pw_prog *p, const pw_model *m, int slot, size_t *n) {
  size_t total = pw_prog_grad_numel(p);
  for (int v = 0; v < m->n_values; v++)
    if (pw_prog_grad(p, slot, v)) total += value_floats(m, v);
  float *s = malloc(total * sizeof(float)), *o = s;
  assert_non_null(s);
  memcpy(o, pw_prog_grads(p), pw_prog_grad_numel(p) * sizeof(float));
  o += pw_prog_grad_numel(p);
  for (int v = 0; v < m->n_values; v++) {
    const float *g = pw_prog_grad(p, slot, v);
    if (!g) continue;
    memcpy(o, g, value_floats(m, v) * sizeof(float));
    o += value_floats(m, v);
  }
  *n = total;
  return s;
}

/* One forward and backward of layers [lo, hi) with the value gradients
 * first set to `fill`; split = I then W instead of B. */
static float *run(pw_prog *p, const pw_model *m, float fill, int split, size_t *n) {
  pw_prog_zero_grad(p);
  fill_inputs(p, m, 0, 5);
  assert_int_equal(pw_prog_forward(p, 0, NULL, NULL), 0);
  set_grads(p, m, 0, fill);
  if (split) {
    assert_int_equal(pw_prog_backward_input(p, 0, NULL), 0);
    assert_int_equal(pw_prog_backward_weight(p, 0, NULL), 0);
  } else {
    assert_int_equal(pw_prog_backward(p, 0, NULL), 0);
  }
  return snapshot(p, m, 0, n);
}

static void garbage_equals_zeroed(pw_model *m, int lo, int hi) {
  pw_err err = {0};
  pw_prog_config cfg = {lo, hi, MB, 2 * MB, 1, 0, 0, 0, 0, 0, 0, NULL, 0};
  pw_prog *p;
  assert_int_equal(pw_prog_create(m, &cfg, &p, &err), 0);
  pw_prog_init_params(p, 17);
  float *b = NULL; /* B's gradients, which I+W must equal (B fuses some nodes' halves) */
  size_t nb = 0;
  for (int split = 0; split < 2; split++) {
    size_t nz, ng;
    float *z = run(p, m, 0.0f, split, &nz);
    float *g = run(p, m, NAN, split, &ng);
    assert_int_equal(nz, ng);
    size_t nonzero = 0;
    for (size_t k = 0; k < nz; k++) {
      nonzero += z[k] != 0.0f;
      if (memcmp(&z[k], &g[k], sizeof(float)))
        fail_msg("layers [%d, %d) %s: gradient element %zu: %.9g from zeroed buffers, %.9g from garbage",
                 lo, hi, split ? "I+W" : "B", k, (double)z[k], (double)g[k]);
      if (split && memcmp(&z[k], &b[k], sizeof(float)))
        fail_msg("layers [%d, %d): gradient element %zu: %.9g from B, %.9g from I+W", lo, hi, k,
                 (double)b[k], (double)z[k]);
    }
    assert_true(nonzero > nz / 2); /* gradients really flowed */
    if (split) assert_int_equal(nz, nb);
    free(g);
    if (split)
      free(z);
    else
      b = z, nb = nz;
  }
  free(b);
  pw_prog_free(p);
}

/* Whole model, and each cut of it into two stages; attention as
 * train.attention impl picks it. */
static void check_spec(pw_model_spec s, int twice_op, int impl) {
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  pw_model_set_attention(&m, impl);
  if (twice_op >= 0) read_twice(&m, twice_op);
  garbage_equals_zeroed(&m, 0, m.n_layers);
  for (int cut = 1; cut < m.n_layers; cut++) {
    if (m.layers[cut].is_loss) continue;
    garbage_equals_zeroed(&m, 0, cut);
    garbage_equals_zeroed(&m, cut, m.n_layers);
  }
  pw_model_free(&m);
}

static void check_model_attn(int tmpl, int twice_op, int impl) { check_spec(spec_of(tmpl), twice_op, impl); }
static void check_model(int tmpl, int twice_op) { check_model_attn(tmpl, twice_op, PW_ATTN_AUTO); }

static void test_gpt(void **st) { check_model(PW_TEMPLATE_GPT, -1); }
/* the tiled attention's backward overwrites dqkv where it is the first writer */
static void test_tiled(void **st) {
  check_model_attn(PW_TEMPLATE_GPT, -1, PW_ATTN_TILED);
  check_model_attn(PW_TEMPLATE_LLAMA, -1, PW_ATTN_TILED);
}
static void test_llama(void **st) { check_model(PW_TEMPLATE_LLAMA, -1); }
static void test_mlp(void **st) { check_model(PW_TEMPLATE_MLP, -1); }
static void test_gpt_tied(void **st) {
  pw_model_spec s = spec_of(PW_TEMPLATE_GPT);
  s.tie_embeddings = 1; /* a parameter used twice: shadow gradients */
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  garbage_equals_zeroed(&m, 0, m.n_layers);
  pw_model_free(&m);
}
static void test_add_x_x(void **st) { check_model(PW_TEMPLATE_GPT, PW_OP_ADD); }
static void test_swiglu_g_g(void **st) { check_model(PW_TEMPLATE_LLAMA, PW_OP_SWIGLU); }
/* Gemma's options (the scale, offset norms, geglu; tied), and geglu(g, g) */
static void test_gemma(void **st) {
  pw_model_spec s = spec_of(PW_TEMPLATE_LLAMA);
  s.mlp_act = PW_MLP_ACT_GELU_TANH, s.embed_scale = 1, s.norm_offset = 1, s.tie_embeddings = 1;
  check_spec(s, -1, PW_ATTN_AUTO);
  s.tie_embeddings = 0;
  check_spec(s, PW_OP_GEGLU, PW_ATTN_AUTO);
}
/* LoRA nodes: x read by the linear and its adapter, y0 by the adapter alone */
static void test_lora(void **st) {
  pw_model_spec s = spec_of(PW_TEMPLATE_LLAMA);
  s.lora_rank = 3, s.lora_alpha = 6, s.n_lora_targets = 2;
  snprintf(s.lora_targets[0], PW_LORA_TARGET_LEN, "blocks.*.mlp.*");
  snprintf(s.lora_targets[1], PW_LORA_TARGET_LEN, "lm_head");
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  garbage_equals_zeroed(&m, 0, m.n_layers);
  for (int cut = 1; cut < m.n_layers; cut++) {
    garbage_equals_zeroed(&m, 0, cut);
    garbage_equals_zeroed(&m, cut, m.n_layers);
  }
  pw_model_free(&m);
}

/* train.trainable: a program over the frozen model computes, bit for bit,
 * the all-trainable program's value gradients (B and I+W: input gradients
 * still flow through frozen layers) and its trainable parameters'
 * gradients; frozen parameters have no gradient at all. `pats` includes
 * half-frozen nodes (a layernorm's or a linear's bias training, its weight
 * not). Then the garbage-equals-zeroed check on the frozen model. */
static void check_frozen(pw_model_spec *s, const char *const *pats, int n_pats) {
  pw_model ma, mf;
  pw_err err = {0};
  assert_int_equal(pw_model_build(s, &ma, &err), 0);
  assert_int_equal(pw_model_build(s, &mf, &err), 0);
  pw_train_spec tr = {.n_trainable = n_pats};
  for (int i = 0; i < n_pats; i++) snprintf(tr.trainable[i], PW_TRAINABLE_LEN, "%s", pats[i]);
  assert_int_equal(pw_model_set_trainable(&mf, &tr, &err), 0);
  pw_prog_config cfg = {.layer_hi = ma.n_layers, .mb_size = MB, .batch_size = 2 * MB, .n_slots = 1};
  pw_prog *pa, *pf;
  assert_int_equal(pw_prog_create(&ma, &cfg, &pa, &err), 0);
  assert_int_equal(pw_prog_create(&mf, &cfg, &pf, &err), 0);
  pw_prog_init_params(pa, 17);
  pw_prog_init_params(pf, 17);
  assert_true(pw_prog_grad_numel(pf) < pw_prog_grad_numel(pa));
  int n_frozen = 0;
  for (int split = 0; split < 2; split++) {
    size_t na, nf;
    free(run(pa, &ma, 0.0f, split, &na));
    free(run(pf, &mf, 0.0f, split, &nf));
    pw_prog_grads_finalize(pa);
    pw_prog_grads_finalize(pf);
    for (int v = 0; v < ma.n_values; v++) {
      const float *ga = pw_prog_grad(pa, 0, v), *gf = pw_prog_grad(pf, 0, v);
      if (ga) assert_memory_equal(ga, gf, value_floats(&ma, v) * sizeof(float));
    }
    n_frozen = 0;
    for (int i = 0; i < pw_prog_n_params(pf); i++) {
      pw_prog_param *a = pw_prog_param_at(pa, i), *f = pw_prog_param_at(pf, i);
      if (mf.params[f->model_index].frozen) {
        assert_null(f->grad);
        n_frozen++;
        continue;
      }
      assert_non_null(f->grad);
      assert_memory_equal(a->grad, f->grad, a->meta->numel * sizeof(float));
    }
  }
  assert_true(n_frozen > 0);
  garbage_equals_zeroed(&mf, 0, mf.n_layers);
  pw_prog_free(pa);
  pw_prog_free(pf);
  pw_model_free(&ma);
  pw_model_free(&mf);
}

static void test_frozen(void **st) {
  static const char *const gpt[] = {"blocks.1.ln1.bias", "blocks.1.attn.qkv.bias", "blocks.1.attn.proj.*",
                                    "blocks.1.ln2.*", "blocks.1.mlp.*", "ln_f.*", "lm_head.weight"};
  static const char *const llama[] = {"blocks.1.*", "lm_head.weight"};
  pw_model_spec s = spec_of(PW_TEMPLATE_GPT);
  check_frozen(&s, gpt, 7);
  s = spec_of(PW_TEMPLATE_LLAMA);
  check_frozen(&s, llama, 2);
}

static void test_frozen_tied(void **st) {
  static const char *const blocks[] = {"blocks.*"}; /* the tied embedding frozen */
  static const char *const tok[] = {"embed.tok.weight"}; /* only it trains, both uses */
  pw_model_spec s = spec_of(PW_TEMPLATE_GPT);
  s.tie_embeddings = 1;
  check_frozen(&s, blocks, 1);
  check_frozen(&s, tok, 1);
}

/* The last stage of a GPT starts at a block: its input port (the residual
 * stream) is read by the block's first layernorm and by its residual add.
 * Its gradient against a central difference of the loss along a random
 * direction, with the gradient buffers full of garbage before backward. */
static void test_input_port_gradient(void **st) {
  pw_model_spec s = spec_of(PW_TEMPLATE_GPT);
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  pw_prog_config cfg = {1, m.n_layers, MB, MB, 1, 0, 0, 0, 0, 0, 0, NULL, 0}; /* blocks and head */
  pw_prog *p;
  assert_int_equal(pw_prog_create(&m, &cfg, &p, &err), 0);
  pw_prog_init_params(p, 23);
  int x = -1;
  for (int i = 0; i < pw_prog_n_inputs(p); i++)
    if (pw_prog_input(p, i)->role == PW_VAL_ACT) x = pw_prog_input(p, i)->value;
  assert_true(x >= 0);
  fill_inputs(p, &m, 0, 8);
  assert_int_equal(pw_prog_forward(p, 0, NULL, &err), 0);
  set_grads(p, &m, 0, NAN);
  assert_int_equal(pw_prog_backward(p, 0, &err), 0);
  size_t n = value_floats(&m, x);
  float *xv = pw_prog_value(p, 0, x), *gx = pw_prog_grad(p, 0, x);
  float *saved = malloc(n * sizeof(float)), *dir = malloc(n * sizeof(float));
  assert_non_null(saved);
  assert_non_null(dir);
  memcpy(saved, xv, n * sizeof(float));
  pw_rng r;
  pw_rng_seed(&r, 4);
  double gd = 0, dn = 0;
  for (size_t k = 0; k < n; k++) {
    dir[k] = (float)pw_rng_normal(&r);
    gd += (double)dir[k] * gx[k];
    dn += (double)dir[k] * dir[k];
  }
  double eps = 1e-2 / sqrt(dn), l[2];
  for (int side = 0; side < 2; side++) {
    float loss;
    for (size_t k = 0; k < n; k++) xv[k] = saved[k] + (float)((side ? -eps : eps) * dir[k]);
    assert_int_equal(pw_prog_forward(p, 0, &loss, &err), 0);
    l[side] = loss;
  }
  double fd = (l[0] - l[1]) / (2 * eps), tol = 2e-2 * fabs(fd) + 2e-3;
  if (fabs(fd - gd) > tol) fail_msg("d loss / d input port: %.6g (finite difference) vs %.6g (backward)", fd, gd);
  assert_true(fabs(fd) > 0.1); /* big enough that a lost term would show */
  free(saved);
  free(dir);
  pw_prog_free(p);
  pw_model_free(&m);
}

/* ---- errors -------------------------------------------------------------------- */

typedef struct {
  int calls, fail_at; /* the call (0-based) that fails */
  int fill;           /* fill err (else leave it empty) */
} fake;

static int fake_result(fake *f, pw_err *err, const char *what) {
  if (f->calls++ != f->fail_at) return 0;
  return f->fill ? pw_err_set(err, PW_EPEER, "fake", "%s: link to rank 1 down", what) : PW_EPEER;
}

static int failing_allreduce(void *ctx, float *buf, size_t n, int op, pw_err *err) {
  (void)buf, (void)n, (void)op;
  return fake_result(ctx, err, "all-reduce");
}

static int failing_wgrad(void *ctx, const float *scratch, const size_t (*spans)[2], int n, pw_err *err) {
  (void)scratch, (void)spans, (void)n;
  return fake_result(ctx, err, "hand-off");
}

static void expect_err(int rc, const pw_err *err, int code, const char *needle) {
  char buf[600];
  pw_err_str(err, buf, sizeof buf);
  if (rc != code || err->code != code || !strstr(buf, needle))
    fail_msg("returned %d (%s), err %d \"%s\"; expected %d and \"%s\"", rc, pw_err_name(rc), err->code, buf, code,
             needle);
}

static pw_prog *gpt_prog(pw_model *m, int remat, int no_grads) {
  pw_model_spec s = spec_of(PW_TEMPLATE_GPT);
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, m, &err), 0);
  pw_prog_config cfg = {.layer_lo = 0, .layer_hi = m->n_layers, .mb_size = MB, .batch_size = MB, .n_slots = 1,
                        .max_slots = 2, .remat = remat, .no_grads = no_grads};
  pw_prog *p;
  assert_int_equal(pw_prog_create(m, &cfg, &p, &err), 0);
  pw_prog_init_params(p, 3);
  fill_inputs(p, m, 0, 1);
  return p;
}

static void test_errors_slots(void **st) {
  (void)st;
  pw_model m;
  pw_prog *p = gpt_prog(&m, 1, 0);
  pw_err err = {0};
  expect_err(pw_prog_forward(p, 1, NULL, &err), &err, PW_EINVAL, "forward of slot 1: no such slot");
  expect_err(pw_prog_backward(p, -1, &err), &err, PW_EINVAL, "backward of slot -1: no such slot");
  expect_err(pw_prog_backward_weight(p, 0, &err), &err, PW_EINVAL,
             "stage program: backward_weight of slot 0 before its backward_input");
  assert_int_equal(pw_prog_backward_weight(p, 0, NULL), PW_EINVAL); /* err may be NULL */
  assert_int_equal(pw_prog_forward(p, 0, NULL, &err), 0); /* nothing kept from those */
  set_grads(p, &m, 0, 0);
  assert_int_equal(pw_prog_backward_input(p, 0, &err), 0);
  assert_int_equal(pw_prog_backward_weight(p, 0, &err), 0);
  pw_prog_free(p);
  pw_model_free(&m);
}

static void test_errors_allreduce(void **st) {
  (void)st;
  for (int fill = 0; fill < 2; fill++) {
    pw_model m;
    pw_prog *p = gpt_prog(&m, 0, 0);
    fake f = {.fail_at = 1, .fill = fill};
    assert_int_equal(pw_prog_set_tp(p, 0, failing_allreduce, &f), 0);
    pw_err err = {0};
    expect_err(pw_prog_forward(p, 0, NULL, &err), &err, PW_EPEER,
               fill ? "fake: all-reduce: link to rank 1 down" : "stage program: a tensor-parallel all-reduce of");
    assert_int_equal(f.calls, 2); /* none after the failure */
    pw_err later = {0};
    expect_err(pw_prog_backward(p, 0, &later), &later, PW_EPEER, fill ? "link to rank 1 down" : "peer lost");
    assert_int_equal(f.calls, 2);
    pw_prog_free(p);
    pw_model_free(&m);
  }
}

static void test_errors_wgrad(void **st) {
  (void)st;
  pw_model m;
  pw_prog *p = gpt_prog(&m, 0, 1);
  const pw_prog_layout *L = pw_prog_layout_of(p);
  size_t gn = pw_prog_grad_numel(p), whole[1][2] = {{0, gn}};
  float *g = calloc(gn, sizeof(float)), *scratch = calloc(pw_dp_wgrad_floats(&m, L, NULL, 0) + 1, sizeof(float));
  assert_non_null(g);
  assert_non_null(scratch);
  fake f = {.fail_at = 0, .fill = 1};
  assert_int_equal(pw_prog_set_wgrad(p, g, (const size_t(*)[2])whole, 1, NULL, 0, scratch, failing_wgrad, &f), 0);
  pw_err err = {0};
  assert_int_equal(pw_prog_forward(p, 0, NULL, &err), 0);
  set_grads(p, &m, 0, 0);
  assert_int_equal(pw_prog_backward_input(p, 0, &err), 0);
  expect_err(pw_prog_backward_weight(p, 0, &err), &err, PW_EPEER, "fake: hand-off: link to rank 1 down");
  assert_int_equal(f.calls, 1);
  expect_err(pw_prog_forward(p, 0, NULL, &err), &err, PW_EPEER, "hand-off"); /* kept */
  pw_prog_free(p);
  free(g), free(scratch);
  pw_model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpt), cmocka_unit_test(test_tiled),
      cmocka_unit_test(test_llama),
      cmocka_unit_test(test_mlp),
      cmocka_unit_test(test_gpt_tied),
      cmocka_unit_test(test_add_x_x),
      cmocka_unit_test(test_swiglu_g_g),
      cmocka_unit_test(test_gemma),
      cmocka_unit_test(test_lora),
      cmocka_unit_test(test_input_port_gradient),
      cmocka_unit_test(test_frozen),
      cmocka_unit_test(test_frozen_tied),
      cmocka_unit_test(test_errors_slots),
      cmocka_unit_test(test_errors_allreduce),
      cmocka_unit_test(test_errors_wgrad),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
