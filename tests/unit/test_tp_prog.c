/* test_tp_prog: a tensor-parallel stage program (prog.h pw_prog_set_tp over
 * tp.h's pw_tp_model) run by tp threads that all-reduce in rank order
 * through shared memory, against the tp = 1 program of the same model:
 *   - gpt untied, gpt tied, llama, llama with Gemma's options and llama with
 *     head_dim and a sliding window, tp 2 and 4, the whole model as one
 *     stage and cut in two stages (ports between them);
 *   - two microbatches, one through a whole B, one through I then W (the
 *     ZeroBubble split), with remat on the second run;
 *   - every rank gets the same loss, equal to tp = 1's to 1e-5 relative;
 *     the ranks' gradients, unsharded (pw_tp_unshard), equal tp = 1's to
 *     1e-4 (of the largest), and replicated ones agree bit for bit across
 *     ranks (they were summed in the same order everywhere). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "model.h"
#include "prog.h"
#include "spec.h"
#include "spec_json.h"
#include "tp.h"

enum { XB = 2, NMB = 2, TPMAX = 4, T = 8, VOCAB = 64 };

typedef struct {
  pthread_barrier_t bar;
  int tp;
  float *bufs[TPMAX];
} group;

typedef struct {
  group *g;
  int rank;
  const pw_model *canon, *shard;
  const uint8_t *kinds;
  pw_prog *ref; /* the tp = 1 program whose parameters are sharded */
  int lo, hi, remat;
  float loss[NMB];
  pw_prog *p;
  int rc;
} member;

static int allreduce(void *ctx, float *buf, size_t n, int op, pw_err *err) {
  (void)err; /* never fails */
  member *me = ctx;
  group *g = me->g;
  float *tmp = malloc(n * sizeof(float));
  g->bufs[me->rank] = buf;
  pthread_barrier_wait(&g->bar);
  if (op == PW_PROG_SUM) {
    pw_reduce_ordered(tmp, (const float *const *)g->bufs, g->tp, n);
  } else {
    memcpy(tmp, g->bufs[0], n * sizeof(float));
    for (int r = 1; r < g->tp; r++)
      for (size_t i = 0; i < n; i++) tmp[i] = fmaxf(tmp[i], g->bufs[r][i]);
  }
  pthread_barrier_wait(&g->bar);
  memcpy(buf, tmp, n * sizeof(float));
  free(tmp);
  return 0;
}

static void fill_data(pw_prog *p, const pw_model *m, int slot, int mb) {
  int32_t *tok = pw_prog_value(p, slot, m->input_value), *tg = pw_prog_value(p, slot, m->target_value);
  for (int i = 0; i < XB * T; i++) {
    if (tok) tok[i] = (i * 37 + 5 + 13 * mb) % VOCAB;
    if (tg) tg[i] = (i * 11 + 3 + 7 * mb) % VOCAB;
  }
}

/* The ports of a stage cut from the reference: its inputs from the
 * reference slot, its output gradients 1/(index+1)-ish. */
static void fill_ports(pw_prog *p, pw_prog *ref, int slot) {
  for (int k = 0; k < pw_prog_n_inputs(p); k++) {
    const pw_prog_port *pt = pw_prog_input(p, k);
    float *src = pw_prog_value(ref, slot, pt->value);
    if (src && pt->role == PW_VAL_ACT) memcpy(pw_prog_value(p, slot, pt->value), src, pt->bytes);
  }
  for (int k = 0; k < pw_prog_n_outputs(p); k++) {
    const pw_prog_port *pt = pw_prog_output(p, k);
    float *g = pw_prog_grad(p, slot, pt->value);
    for (size_t i = 0; g && i < pt->bytes / sizeof(float); i++) g[i] = (float)((i * 7919) % 101) / 1000.0f - 0.05f;
  }
}

/* Runs the two microbatches: mb 0 forward then B, mb 1 forward, I, W. */
static int run_stage(pw_prog *p, pw_prog *ref, const pw_model *m, float *loss) {
  int rc = 0;
  for (int mb = 0; mb < NMB && !rc; mb++) {
    fill_data(p, m, mb, mb);
    if (ref) fill_ports(p, ref, mb);
    rc = pw_prog_forward(p, mb, &loss[mb], NULL);
  }
  if (!rc) rc = pw_prog_backward(p, 0, NULL);
  if (!rc) rc = pw_prog_backward_input(p, 1, NULL);
  if (!rc) rc = pw_prog_backward_weight(p, 1, NULL);
  pw_prog_grads_finalize(p);
  return rc;
}

static pw_prog *make_prog(const pw_model *m, int lo, int hi, int remat) {
  pw_prog_config cfg = {.layer_lo = lo, .layer_hi = hi, .mb_size = XB, .batch_size = XB * NMB, .n_slots = NMB,
                        .remat = remat};
  pw_prog *p;
  pw_err err = {0};
  assert_int_equal(pw_prog_create(m, &cfg, &p, &err), 0);
  return p;
}

static void *member_main(void *arg) {
  member *me = arg;
  me->p = make_prog(me->shard, me->lo, me->hi, me->remat);
  for (int i = 0; i < pw_prog_n_params(me->p); i++) {
    pw_prog_param *pp = pw_prog_param_at(me->p, i);
    const float *whole = pw_prog_param_at(me->ref, pw_prog_layout_of(me->ref)->param_local[pp->model_index])->data;
    pw_tp_shard(pp->data, whole, &me->canon->params[pp->model_index], (pw_tp_kind)me->kinds[pp->model_index],
                me->g->tp, me->rank);
  }
  if (!(me->rc = pw_prog_set_tp(me->p, me->rank, allreduce, me)))
    me->rc = run_stage(me->p, me->lo ? me->ref : NULL, me->shard, me->loss);
  return NULL;
}

static void job_of(const char *model, pw_job *job, pw_model *m) {
  char buf[1024];
  snprintf(buf, sizeof buf,
           "{\"name\": \"t\", \"model\": {%s}, \"mesh\": {\"pp\": 1}, \"schedule\": {\"name\": \"1f1b\", "
           "\"microbatches\": 2}, \"train\": {\"steps\": 1, \"batch_size\": 4}, \"data\": {\"kind\": \"copy\"}}",
           model);
  json_t *j = json_loads(buf, 0, NULL);
  pw_err err = {0};
  assert_non_null(j);
  assert_int_equal(pw_job_parse(j, NULL, job, &err), 0);
  json_decref(j);
  assert_int_equal(pw_model_build(&job->model, m, &err), 0);
}

#define BASE "\"vocab_size\": 64, \"seq_len\": 8, \"d_model\": 16, \"n_layers\": 2, \"n_heads\": 4, "

static void check(const char *what, int tp, int cut, int remat) {
  pw_job job;
  pw_model m, mt;
  job_of(what, &job, &m);
  uint8_t kinds[256];
  assert_int_equal(pw_tp_model(&m, tp, &mt, kinds), 0);
  int lo = cut ? 1 : 0, hi = m.n_layers;
  /* the reference: the whole model (its values feed a cut stage's ports) */
  pw_prog *ref = make_prog(&m, 0, hi, 0);
  pw_prog_init_params(ref, 5);
  float want[NMB];
  assert_int_equal(run_stage(ref, NULL, &m, want), 0);
  pw_prog *ref_st = ref;
  if (cut) { /* the stage alone at tp 1, fed the same ports */
    ref_st = make_prog(&m, lo, hi, 0);
    for (int i = 0; i < pw_prog_n_params(ref_st); i++) {
      pw_prog_param *pp = pw_prog_param_at(ref_st, i);
      memcpy(pp->data, pw_prog_param_at(ref, pw_prog_layout_of(ref)->param_local[pp->model_index])->data,
             pp->meta->numel * sizeof(float));
    }
    assert_int_equal(run_stage(ref_st, ref, &m, want), 0);
  }
  group g = {.tp = tp};
  pthread_barrier_init(&g.bar, NULL, (unsigned)tp);
  member mem[TPMAX];
  pthread_t th[TPMAX];
  for (int r = 0; r < tp; r++) {
    mem[r] = (member){.g = &g, .rank = r, .canon = &m, .shard = &mt, .kinds = kinds, .ref = ref, .lo = lo, .hi = hi,
                      .remat = remat};
    pthread_create(&th[r], NULL, member_main, &mem[r]);
  }
  for (int r = 0; r < tp; r++) pthread_join(th[r], NULL);
  pthread_barrier_destroy(&g.bar);
  double worst_loss = 0, worst_grad = 0;
  for (int r = 0; r < tp; r++) {
    assert_int_equal(mem[r].rc, 0);
    for (int mb = 0; mb < NMB; mb++) {
      assert_memory_equal(&mem[r].loss[mb], &mem[0].loss[mb], sizeof(float));
      double rel = fabs((double)mem[r].loss[mb] - want[mb]) / fabs(want[mb] ? want[mb] : 1.0f);
      if (pw_prog_has_loss(ref_st) && rel > worst_loss) worst_loss = rel;
    }
  }
  for (int i = 0; i < pw_prog_n_params(ref_st); i++) {
    pw_prog_param *rp = pw_prog_param_at(ref_st, i);
    const pw_param *meta = rp->meta;
    float *back = malloc(meta->numel * sizeof(float));
    double scale = 0;
    for (size_t k = 0; k < meta->numel; k++) scale = fmax(scale, fabs(rp->grad[k]));
    for (int r = 0; r < tp; r++) {
      pw_prog_param *pp = pw_prog_param_at(mem[r].p, i);
      assert_int_equal(pp->model_index, rp->model_index);
      if (kinds[rp->model_index] == PW_TP_REPLICATED && r)
        assert_memory_equal(pp->grad, pw_prog_param_at(mem[0].p, i)->grad, meta->numel * sizeof(float));
      pw_tp_unshard(back, pp->grad, meta, (pw_tp_kind)kinds[rp->model_index], tp, r);
    }
    for (size_t k = 0; k < meta->numel; k++) {
      double d = fabs((double)back[k] - rp->grad[k]) / (scale ? scale : 1);
      if (d > worst_grad) worst_grad = d;
      if (d > 1e-4) fail_msg("%s tp %d: %s[%zu] %g, tp 1 %g", what, tp, meta->name, k, back[k], rp->grad[k]);
    }
    free(back);
  }
  printf("%.24s tp %d cut %d remat %d: loss rel %.2e, grad %.2e\n", what, tp, cut, remat, worst_loss, worst_grad);
  assert_true(worst_loss < 1e-5);
  for (int r = 0; r < tp; r++) pw_prog_free(mem[r].p);
  if (ref_st != ref) pw_prog_free(ref_st);
  pw_prog_free(ref);
  pw_model_free(&mt);
  pw_model_free(&m);
  pw_job_free(&job);
}

/* (parenthesized: each element one concatenation, for clang's -Wstring-concatenation) */
static const char *const models[] = {
    ("\"template\": \"gpt\", " BASE "\"tie_embeddings\": false"),
    ("\"template\": \"gpt\", " BASE "\"tie_embeddings\": true"),
    ("\"template\": \"llama\", " BASE "\"ffn_hidden\": 64"),
    /* Gemma's options: the scale and offset norms whole on every rank, the geglu over split hidden units */
    ("\"template\": \"llama\", " BASE "\"ffn_hidden\": 64, \"tie_embeddings\": true, \"mlp_act\": \"gelu_tanh\", "
     "\"embed_scale\": true, \"norm_offset\": 1"),
    /* heads of a width of their own and a sliding window: each rank's heads whole */
    ("\"template\": \"llama\", " BASE "\"ffn_hidden\": 64, \"head_dim\": 6, \"sliding_window\": 3"),
};
#define N_MODELS ((int)(sizeof models / sizeof *models))

static void test_whole(void **state) {
  (void)state;
  for (int v = 0; v < N_MODELS; v++)
    for (int tp = 2; tp <= TPMAX; tp *= 2) check(models[v], tp, 0, 0);
}

static void test_cut_remat(void **state) {
  (void)state;
  for (int v = 0; v < N_MODELS; v++) {
    check(models[v], 2, 1, 0);
    check(models[v], 2, 0, 1);
  }
}

/* The shard graph: split shapes divided, the rest as the model's. */
static void test_shard_model(void **state) {
  (void)state;
  pw_job job;
  pw_model m, mt;
  job_of(models[2], &job, &m);
  uint8_t kinds[256];
  assert_int_equal(pw_tp_model(&m, 4, &mt, kinds), 0);
  for (int i = 0; i < m.n_params; i++) {
    size_t want = pw_tp_numel(&m.params[i], (pw_tp_kind)kinds[i], 4);
    assert_int_equal(mt.params[i].numel, want);
    assert_int_equal((size_t)mt.params[i].shape[0] * (size_t)(mt.params[i].ndim > 1 ? mt.params[i].shape[1] : 1), want);
  }
  for (int i = 0; i < m.n_nodes; i++)
    if (m.nodes[i].op == PW_OP_ATTENTION) {
      assert_int_equal(mt.nodes[i].NH, 1);
      assert_int_equal(mt.values[mt.nodes[i].out].width, 4);
    }
  assert_int_equal(mt.values[m.nodes[m.n_nodes - 1].in[0]].width, VOCAB / 4); /* the logits */
  pw_model_free(&mt);
  pw_model_free(&m);
  pw_job_free(&job);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shard_model),
      cmocka_unit_test(test_whole),
      cmocka_unit_test(test_cut_remat),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
