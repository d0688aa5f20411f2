/* test_prog_remat: activation recomputation (partition.remat).
 *
 * - a remat stage program's losses, port gradients and parameter gradients
 *   equal the plain program's bit for bit, through B and through I then W
 *   with several I's before their W's (gpt, tied gpt, llama, mlp);
 * - a remat program keeps only the ports per slot, holds no work buffer
 *   between its actions, and makes as many work buffers as the planner
 *   counts when it runs each schedule's action list in order;
 * - the planner adds F to a remat stage's B and I and counts slots as the
 *   keep part plus the work buffers;
 * - partition.remat parses ("none", "full", a list), names the path of a
 *   bad entry and a wrong length, and survives the round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model.h"
#include "plan.h"
#include "prog.h"
#include "rng.h"
#include "spec_json.h"

static pw_model_spec gpt_spec(int tied) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_GPT;
  s.vocab_size = 23;
  s.seq_len = 6;
  s.d_model = 8;
  s.n_layers = 2;
  s.n_heads = 2;
  s.tie_embeddings = tied;
  s.init_std = 0.3f;
  return s;
}

static pw_model_spec llama_spec(void) {
  pw_model_spec s = gpt_spec(0);
  s.tmpl = PW_TEMPLATE_LLAMA;
  s.ffn_hidden = 12;
  return s;
}

static pw_model_spec mlp_spec(void) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_MLP;
  s.in_dim = 5;
  s.hidden_dim = 7;
  s.out_dim = 3;
  s.n_layers = 2;
  s.activation = PW_ACT_GELU;
  s.loss = PW_LOSS_MSE;
  return s;
}

/* Random inputs and targets of microbatch mb into the ports of `slot`
 * (those the stage has). */
static void fill_data(pw_prog *p, const pw_model *m, int slot, int b, int mb) {
  pw_rng r;
  pw_rng_seed(&r, 500 + (uint64_t)mb);
  int vals[2] = {m->input_value, m->target_value};
  for (int k = 0; k < 2; k++) {
    const pw_value *v = &m->values[vals[k]];
    void *d = pw_prog_value(p, slot, vals[k]);
    size_t n = (size_t)b * v->rows * v->width;
    int V = m->data.tokens ? m->data.vocab_size : m->data.out_dim;
    for (size_t i = 0; d && i < n; i++) {
      if (v->dtype == PW_DT_I32)
        ((int32_t *)d)[i] = (int32_t)pw_rng_below(&r, (uint64_t)V);
      else
        ((float *)d)[i] = (float)pw_rng_normal(&r);
    }
  }
}

#define NMB 4
#define MAXS 4

typedef struct {
  pw_prog *st[MAXS];
  float loss[NMB];
} pipe;

/* The model cut at cuts[], stage s recomputing when bit s of remat is set;
 * NMB microbatches forward, then backward in the order below: microbatch
 * 3 by B, 2 and 1 by I then I (two W's pending), their W's, 0 by B.
 * Activations and gradients are handed between stages by hand; `peek`
 * receives, per (stage, microbatch), the stage's input-port gradients. */
static void run_pipe(const pw_model *m, const int *cuts, int n, unsigned remat, pipe *P, float **peek) {
  const int b = 2;
  for (int s = 0; s < n; s++) {
    pw_prog_config c = {.layer_lo = cuts[s], .layer_hi = cuts[s + 1], .mb_size = b, .batch_size = b * NMB,
                        .n_slots = NMB, .remat = (int)(remat >> s & 1)};
    assert_int_equal(pw_prog_create(m, &c, &P->st[s], NULL), 0);
    pw_prog_init_params(P->st[s], 7);
    pw_prog_zero_grad(P->st[s]);
  }
  for (int j = 0; j < NMB; j++) {
    P->loss[j] = 0;
    for (int s = 0; s < n; s++) {
      fill_data(P->st[s], m, j, b, j);
      for (int k = 0; k < pw_prog_n_inputs(P->st[s]); k++) {
        const pw_prog_port *pt = pw_prog_input(P->st[s], k);
        if (pt->role != PW_VAL_ACT) continue;
        void *src = NULL;
        for (int q = 0; q < s && !src; q++) src = pw_prog_value(P->st[q], j, pt->value);
        assert_non_null(src);
        memcpy(pw_prog_value(P->st[s], j, pt->value), src, pt->bytes);
      }
      float l = 0;
      assert_int_equal(pw_prog_forward(P->st[s], j, &l), 0);
      P->loss[j] += l;
      if (remat >> s & 1) assert_int_equal(pw_prog_n_work(P->st[s]), 1); /* F gave its buffer back */
    }
  }
  static const int order[][2] = {{3, 'B'}, {2, 'I'}, {1, 'I'}, {2, 'W'}, {1, 'W'}, {0, 'B'}};
  for (int s = n - 1; s >= 0; s--)
    for (size_t o = 0; o < sizeof order / sizeof order[0]; o++) {
      int j = order[o][0], kind = order[o][1];
      pw_prog *p = P->st[s];
      if (kind != 'W')
        for (int k = 0; k < pw_prog_n_outputs(p); k++) { /* the later stages' input gradients, summed */
          const pw_prog_port *pt = pw_prog_output(p, k);
          float *dst = pw_prog_grad(p, j, pt->value);
          memset(dst, 0, pt->bytes);
          for (int q = s + 1; q < n; q++) {
            float *g = pw_prog_grad(P->st[q], j, pt->value);
            for (size_t e = 0; g && e < pt->bytes / 4; e++) dst[e] += g[e];
          }
        }
      int rc = kind == 'B' ? pw_prog_backward(p, j) : kind == 'I' ? pw_prog_backward_input(p, j)
                                                                  : pw_prog_backward_weight(p, j);
      assert_int_equal(rc, 0);
      if (kind == 'W') continue;
      size_t off = 0;
      for (int k = 0; k < pw_prog_n_inputs(p); k++) {
        const pw_prog_port *pt = pw_prog_input(p, k);
        if (pt->role != PW_VAL_ACT) continue;
        memcpy((char *)peek[s * NMB + j] + off, pw_prog_grad(p, j, pt->value), pt->bytes);
        off += pt->bytes;
      }
    }
}

static void free_pipe(pipe *P, int n) {
  for (int s = 0; s < n; s++) pw_prog_free(P->st[s]);
}

static void remat_equals_plain(pw_model_spec spec, const int *cuts, int n) {
  pw_model m;
  assert_int_equal(pw_model_build(&spec, &m, NULL), 0);
  float *peek[2][MAXS * NMB];
  for (int v = 0; v < 2; v++)
    for (int i = 0; i < MAXS * NMB; i++) peek[v][i] = calloc(1 << 16, 1);
  unsigned masks[] = {(1u << n) - 1, 1u, 2u};
  for (size_t mi = 0; mi < sizeof masks / sizeof masks[0]; mi++) {
    pipe A, R;
    run_pipe(&m, cuts, n, 0, &A, peek[0]);
    run_pipe(&m, cuts, n, masks[mi], &R, peek[1]);
    assert_memory_equal(A.loss, R.loss, sizeof A.loss);
    for (int s = 0; s < n; s++) {
      pw_prog *a = A.st[s], *r = R.st[s];
      assert_int_equal(pw_prog_grad_numel(a), pw_prog_grad_numel(r));
      assert_memory_equal(pw_prog_grads(a), pw_prog_grads(r), pw_prog_grad_numel(a) * sizeof(float));
      for (int j = 0; j < NMB; j++) assert_memory_equal(peek[0][s * NMB + j], peek[1][s * NMB + j], 1 << 16);
      if (!(masks[mi] >> s & 1)) continue;
      /* the slot is the ports; the rest lives in work buffers, two at most
       * (2 and 1 between their I and W) and none held now */
      pw_prog_layout L;
      assert_int_equal(pw_prog_layout_build(&m, cuts[s], cuts[s + 1], 2, &L), 0);
      assert_int_equal(pw_prog_slot_bytes(r), L.sz.keep_floats * sizeof(float));
      assert_int_equal(pw_prog_work_bytes(r), (L.sz.slot_floats - L.sz.keep_floats) * sizeof(float));
      assert_true(pw_prog_slot_bytes(r) <= pw_prog_slot_bytes(a)); /* an embedding alone: its slot is its ports */
      assert_int_equal(pw_prog_n_work(r), 2);
      int inner = -1; /* a node output that is no port */
      for (int i = L.node_lo; i < L.node_hi && inner < 0; i++)
        if (L.val_off[m.nodes[i].out] >= L.sz.keep_floats) inner = m.nodes[i].out;
      if (inner >= 0) { /* (an embedding alone has none) */
        assert_null(pw_prog_value(r, 0, inner));
        assert_non_null(pw_prog_value(a, 0, inner));
      }
      assert_int_equal(pw_prog_backward_weight(r, 0), PW_EINVAL); /* no I before it */
      pw_prog_layout_free(&L);
    }
    free_pipe(&A, n);
    free_pipe(&R, n);
  }
  for (int v = 0; v < 2; v++)
    for (int i = 0; i < MAXS * NMB; i++) free(peek[v][i]);
  pw_model_free(&m);
}

static void test_gpt(void **st) {
  (void)st;
  int cuts[] = {0, 2, 3, 4}; /* embed+block0 | block1 | head */
  remat_equals_plain(gpt_spec(0), cuts, 3);
}
static void test_gpt_tied(void **st) {
  (void)st;
  int cuts[] = {0, 2, 4};
  remat_equals_plain(gpt_spec(1), cuts, 2);
}
static void test_llama(void **st) {
  (void)st;
  int cuts[] = {0, 1, 2, 3, 4};
  remat_equals_plain(llama_spec(), cuts, 4);
}
static void test_mlp(void **st) {
  (void)st;
  int cuts[] = {0, 1, 3};
  remat_equals_plain(mlp_spec(), cuts, 2);
}

/* ---- spec and plan ----------------------------------------------------- */

static int parse(const char *sched, int V, const char *remat, pw_job *job, char *eb, size_t ebn) {
  char buf[1400];
  snprintf(buf, sizeof buf,
           "{\"name\": \"t\", \"model\": {\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 16,"
           " \"d_model\": 32, \"n_layers\": 4, \"n_heads\": 2}, \"mesh\": {\"pp\": 2, \"virtual_stages\": %d},"
           " \"schedule\": {\"name\": \"%s\", \"microbatches\": 4}, \"partition\": {\"mode\": \"even\"%s%s},"
           " \"train\": {\"steps\": 1, \"batch_size\": 8}, \"data\": {\"kind\": \"text\","
           " \"path\": \"examples/data/corpus.txt\"}}",
           V, sched, remat ? ", \"remat\": " : "", remat ? remat : "");
  json_t *j = json_loads(buf, 0, NULL);
  assert_non_null(j);
  pw_err err = {0};
  memset(job, 0, sizeof *job);
  int rc = pw_job_parse(j, NULL, job, &err);
  json_decref(j);
  if (rc) pw_err_str(&err, eb, ebn);
  return rc;
}

static void test_spec(void **st) {
  (void)st;
  pw_job job;
  char eb[600];
  assert_int_equal(parse("1f1b", 1, NULL, &job, eb, sizeof eb), 0);
  assert_false(pw_partition_remat(&job.partition, 0) || pw_partition_remat(&job.partition, 1));
  json_t *o = pw_job_to_json(&job);
  assert_null(json_object_get(json_object_get(o, "partition"), "remat")); /* canonical text unchanged */
  json_decref(o);
  pw_job_free(&job);
  assert_int_equal(parse("1f1b", 1, "\"none\"", &job, eb, sizeof eb), 0);
  assert_false(pw_partition_remat(&job.partition, 0));
  pw_job_free(&job);
  assert_int_equal(parse("1f1b", 1, "\"full\"", &job, eb, sizeof eb), 0);
  assert_true(pw_partition_remat(&job.partition, 0) && pw_partition_remat(&job.partition, 1));
  o = pw_job_to_json(&job);
  assert_string_equal(json_string_value(json_object_get(json_object_get(o, "partition"), "remat")), "full");
  json_decref(o);
  pw_job_free(&job);
  assert_int_equal(parse("interleaved-1f1b", 2, "[true, \"none\", false, \"full\"]", &job, eb, sizeof eb), 0);
  int want[] = {1, 0, 0, 1};
  for (int s = 0; s < 4; s++) assert_int_equal(pw_partition_remat(&job.partition, s), want[s]);
  o = pw_job_to_json(&job);
  char *t = json_dumps(json_object_get(json_object_get(o, "partition"), "remat"), JSON_COMPACT);
  assert_string_equal(t, "[true,false,false,true]");
  free(t);
  json_decref(o);
  pw_job_free(&job);
  static const char *bad[][2] = {
      {"\"some\"", "partition.remat: must be \"none\", \"full\" or a list"},
      {"3", "partition.remat: must be \"none\""},
      {"[]", "partition.remat: must not be empty"},
      {"[true, 1]", "partition.remat[1]: must be true/false or \"full\"/\"none\""},
      {"[true, false, true]", "partition.remat: lists 3 stages, but the mesh runs mesh.pp * mesh.virtual_stages = 2 * 1 = 2"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    eb[0] = 0;
    assert_int_not_equal(parse("1f1b", 1, bad[i][0], &job, eb, sizeof eb), 0);
    if (!strstr(eb, bad[i][1])) fail_msg("%s: got '%s', want '%s'", bad[i][0], eb, bad[i][1]);
    pw_job_free(&job);
  }
}

/* Remat "full" against none, for every schedule: F added to B and I; the
 * rank's memory is slots of the keep part plus n_work work buffers; and a
 * remat program run through the rank's action list in order makes exactly
 * n_work work buffers. */
static void test_plan(void **st) {
  (void)st;
  for (int i = 0; i < pw_n_schedule_names; i++) {
    const char *name = pw_schedule_names[i];
    pw_job j0, j1;
    char eb[600];
    int V = 1;
    for (;; V++) { /* the V the schedule runs with at pp 2 */
      assert_int_equal(parse(name, V, NULL, &j0, eb, sizeof eb), 0);
      pw_plan probe;
      int ok = pw_plan_build(&j0, NULL, &probe, NULL) == 0;
      if (ok) pw_plan_free(&probe);
      pw_job_free(&j0);
      if (ok) break;
      assert_true(V < 4);
    }
    assert_int_equal(parse(name, V, NULL, &j0, eb, sizeof eb), 0);
    assert_int_equal(parse(name, V, "\"full\"", &j1, eb, sizeof eb), 0);
    pw_plan p0, p1;
    assert_int_equal(pw_plan_build(&j0, NULL, &p0, NULL), 0);
    assert_int_equal(pw_plan_build(&j1, NULL, &p1, NULL), 0);
    for (int s = 0; s < p1.S; s++) {
      assert_int_equal(p0.n_work[s], 0);
      assert_true(p1.n_work[s] >= 1 && p1.n_work[s] <= p1.peak_slots[s]);
      assert_true(p1.cost_i[s] == p0.cost_i[s] + p0.cost_f[s]);
      assert_true(p1.cost_b[s] == p1.cost_i[s] + p1.cost_w[s]);
      assert_true(p1.cost_f[s] == p0.cost_f[s]);
    }
    assert_true(p1.sim->makespan > p0.sim->makespan);
    size_t sum0 = 0, sum1 = 0;
    for (int r = 0; r < p1.pp; r++) {
      size_t keep = 0, work = 0;
      for (int s = 0; s < p1.S; s++) {
        if (p1.sched->stage_to_rank[s] != r) continue;
        const pw_prog_sizes *sm = &p1.stage_mem[s];
        keep += (size_t)p1.peak_slots[s] * sm->keep_floats * 4;
        work += (size_t)p1.n_work[s] * (sm->slot_floats - sm->keep_floats) * 4;
      }
      assert_int_equal(p1.mem[r].slots, keep);
      assert_int_equal(p1.mem[r].work, work);
      assert_int_equal(p0.mem[r].slots, p1.mem[r].slots + p1.mem[r].work + p1.mem[r].remat_saved);
      assert_true(p1.mem[r].total <= p0.mem[r].total); /* equal where every slot waits for a W */
      sum0 += p0.mem[r].total;
      sum1 += p1.mem[r].total;
    }
    print_message("%-26s remat: %zu of %zu bytes over the ranks\n", name, sum1, sum0);
    assert_true(sum1 < sum0);
    /* the programs' own count, action by action */
    for (int s = 0; s < p1.S; s++) {
      const pw_stage *sg = &p1.part.stages[s];
      pw_prog_config c = {.layer_lo = sg->layer_lo, .layer_hi = sg->layer_hi, .mb_size = p1.mb_size,
                          .batch_size = 8, .n_slots = p1.m, .remat = 1};
      pw_prog *pg;
      assert_int_equal(pw_prog_create(&p1.model, &c, &pg, NULL), 0);
      int r = p1.sched->stage_to_rank[s];
      for (int k = 0; k < p1.sched->n_actions[r]; k++) {
        const pw_action *a = &p1.sched->actions[r][k];
        if (a->stage != s) continue;
        int rc = a->kind == PW_ACT_F   ? pw_prog_forward(pg, a->mb, NULL)
                 : a->kind == PW_ACT_B ? pw_prog_backward(pg, a->mb)
                 : a->kind == PW_ACT_I ? pw_prog_backward_input(pg, a->mb)
                                       : pw_prog_backward_weight(pg, a->mb);
        assert_int_equal(rc, 0);
      }
      if (pw_prog_n_work(pg) != p1.n_work[s])
        fail_msg("%s stage %d: program made %d work buffers, plan says %d", name, s, pw_prog_n_work(pg), p1.n_work[s]);
      pw_prog_free(pg);
    }
    pw_plan_free(&p0);
    pw_plan_free(&p1);
    pw_job_free(&j0);
    pw_job_free(&j1);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpt),  cmocka_unit_test(test_gpt_tied), cmocka_unit_test(test_llama),
      cmocka_unit_test(test_mlp),  cmocka_unit_test(test_spec),     cmocka_unit_test(test_plan),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
