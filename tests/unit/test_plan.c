/* test_plan: the planner's per-rank memory estimate against what the
 * programs really lay out and allocate, and its slot counts against the
 * simulator's timelines under the worker's slot rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "spec_json.h"
#include "collective.h"
#include "zero3.h"
#include "bf16.h"
#include "plan.h"
#include "prog.h"

/* A job around `model` (a JSON object's body) with the given mesh. */
static void job_of(const char *model, const char *sched, int pp, int dp, int V, int m, int batch, pw_job *job) {
  char buf[2048];
  snprintf(buf, sizeof buf,
           "{\"name\": \"t\", \"model\": {%s}, \"mesh\": {\"pp\": %d, \"dp\": %d, \"virtual_stages\": %d},"
           " \"schedule\": {\"name\": \"%s\", \"microbatches\": %d}, \"partition\": {\"mode\": \"even\"},"
           " \"train\": {\"steps\": 1, \"batch_size\": %d, \"optimizer\": {\"name\": \"adamw\", \"lr\": 1e-3}},"
           " \"data\": {\"kind\": \"%s\"%s}}",
           model, pp, dp, V, sched, m, batch, strstr(model, "mlp") ? "regression" : "text",
           strstr(model, "mlp") ? "" : ", \"path\": \"examples/data/corpus.txt\"");
  json_error_t je;
  json_t *j = json_loads(buf, 0, &je);
  if (!j) print_error("bad test JSON: %s\n%s\n", je.text, buf);
  assert_non_null(j);
  pw_err err = {0};
  char eb[600];
  int rc = pw_job_parse(j, NULL, job, &err);
  if (rc) print_error("%s\n", pw_err_str(&err, eb, sizeof eb));
  assert_int_equal(rc, 0);
  json_decref(j);
}

static const char *GPT_TIED = "\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 16, \"d_model\": 32,"
                              " \"n_layers\": 3, \"n_heads\": 2, \"tie_embeddings\": true";
static const char *GPT = "\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 16, \"d_model\": 32,"
                         " \"n_layers\": 4, \"n_heads\": 2, \"tie_embeddings\": false";
static const char *LLAMA = "\"template\": \"llama\", \"vocab_size\": 256, \"seq_len\": 16, \"d_model\": 32,"
                           " \"n_layers\": 2, \"n_heads\": 2, \"ffn_hidden\": 48";
static const char *MLP = "\"template\": \"mlp\", \"in_dim\": 12, \"hidden_dim\": 40, \"n_layers\": 3,"
                         " \"out_dim\": 5, \"activation\": \"gelu\", \"loss\": \"mse\"";

/* Intervals [off, off + len) must tile [lo, hi) exactly: no overlap, no gap. */
typedef struct {
  size_t off, len;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

static void assert_tiles(span *sp, int n, size_t lo, size_t hi, const char *what) {
  qsort(sp, (size_t)n, sizeof *sp, span_cmp);
  size_t at = lo;
  for (int i = 0; i < n; i++) {
    if (sp[i].len == 0) continue;
    if (sp[i].off != at) print_error("%s: region at %zu, expected %zu\n", what, sp[i].off, at);
    assert_int_equal(sp[i].off, at);
    at += sp[i].len;
  }
  assert_int_equal(at, hi);
}

/* For every layer range of each model, the one layout (common/model/layout.h)
 * the planner counts and the program allocates: the slot is exactly the
 * values, their gradients and the auxiliaries, each once; the parameter
 * arena exactly the stage's parameters; the gradient arena those plus one
 * shadow per further use; and the program reports these sizes. */
static void test_layout_tiles(void **state) {
  (void)state;
  const char *models[] = {GPT_TIED, GPT, LLAMA, MLP};
  for (int mi = 0; mi < 4; mi++) {
    pw_job job;
    job_of(models[mi], "1f1b", 1, 1, 1, 1, 3, &job);
    pw_model m;
    assert_int_equal(pw_model_build(&job.model, &m, NULL), 0);
    int shadows = 0;
    for (int lo = 0; lo < m.n_layers; lo++)
      for (int hi = lo + 1; hi <= m.n_layers; hi++)
        for (int mb = 1; mb <= 3; mb += 2) {
          pw_prog_layout L;
          assert_int_equal(pw_prog_layout_build(&m, lo, hi, mb, &L), 0);
          int cap = 2 * m.n_values + m.n_nodes + 2 * L.n_params + 2;
          span *sp = calloc((size_t)cap, sizeof *sp);
          assert_non_null(sp);
          int n = 0;
          for (int v = 0; v < m.n_values; v++) {
            size_t len = pw_value_bytes(&m.values[v], mb) / 4;
            if (L.val_off[v] != PW_LAYOUT_NONE) sp[n++] = (span){L.val_off[v], len};
            if (L.grad_off[v] != PW_LAYOUT_NONE) {
              assert_int_equal(m.values[v].role, PW_VAL_ACT); /* data and the loss have no gradient */
              sp[n++] = (span){L.grad_off[v], len};
            }
          }
          for (int i = L.node_lo; i < L.node_hi; i++) {
            assert_true(L.val_off[m.nodes[i].out] != PW_LAYOUT_NONE);
            sp[n++] = (span){L.aux_off[i - L.node_lo], (size_t)mb * m.nodes[i].aux};
          }
          assert_tiles(sp, n, 0, L.sz.slot_floats, "slot");
          /* the keep part is exactly the ports' values and gradients */
          n = 0;
          for (int k = 0; k < L.n_inputs + L.n_outputs; k++) {
            const pw_prog_port *pt = k < L.n_inputs ? &L.inputs[k] : &L.outputs[k - L.n_inputs];
            sp[n++] = (span){L.val_off[pt->value], pt->bytes / 4};
            if (L.grad_off[pt->value] != PW_LAYOUT_NONE) sp[n++] = (span){L.grad_off[pt->value], pt->bytes / 4};
          }
          assert_tiles(sp, n, 0, L.sz.keep_floats, "keep part");
          n = 0;
          for (int i = 0; i < L.n_params; i++) sp[n++] = (span){L.param_off[i], m.params[L.param_model[i]].numel};
          assert_tiles(sp, n, 0, L.sz.numel, "parameter arena");
          for (int i = 0; i < L.n_shadow; i++) {
            sp[n++] = (span){L.shadow[i][1], L.shadow[i][2]};
            assert_int_equal(L.shadow[i][2], m.params[L.param_model[0]].numel); /* tied: the embedding */
          }
          assert_tiles(sp, n, 0, L.sz.grad_numel, "gradient arena");
          shadows += L.n_shadow;
          free(sp);
          pw_prog_config cfg = {.layer_lo = lo, .layer_hi = hi, .mb_size = mb, .batch_size = 3, .n_slots = 1};
          pw_prog *p = NULL;
          assert_int_equal(pw_prog_create(&m, &cfg, &p, NULL), 0);
          assert_int_equal(pw_prog_slot_bytes(p), L.sz.slot_floats * sizeof(float));
          assert_int_equal(pw_prog_numel(p), L.sz.numel);
          assert_int_equal(pw_prog_grad_numel(p), L.sz.grad_numel);
          pw_prog_free(p);
          pw_prog_layout_free(&L);
        }
    if (mi == 0) assert_true(shadows > 0); /* the tied model exercises shadow gradients */
    pw_model_free(&m);
    pw_job_free(&job);
  }
}

/* The whole MLP at mb 1, counted by hand: values 12 + 5 (input, target)
 * + 6 x 40 + 5 + 1 (loss); gradients 6 x 40 + 5; gelu' 3 x 40. Parameters
 * 12*40+40 + 2 x (40*40+40) + 40*5+5. */
static void test_layout_by_hand(void **state) {
  (void)state;
  pw_job job;
  job_of(MLP, "1f1b", 1, 1, 1, 1, 3, &job);
  pw_model m;
  assert_int_equal(pw_model_build(&job.model, &m, NULL), 0);
  pw_prog_sizes sz;
  assert_int_equal(pw_prog_sizes_of(&m, 0, m.n_layers, 1, &sz), 0);
  assert_int_equal(sz.slot_floats, (12 + 5 + 6 * 40 + 5 + 1) + (6 * 40 + 5) + 3 * 40);
  assert_int_equal(sz.numel, 12 * 40 + 40 + 2 * (40 * 40 + 40) + 40 * 5 + 5);
  assert_int_equal(sz.grad_numel, sz.numel);
  assert_int_equal(sz.scratch_floats, 1);
  assert_true(sz.draws_data);
  assert_int_equal(pw_prog_sizes_of(&m, 1, 2, 1, &sz), 0); /* a middle block: activations only */
  assert_false(sz.draws_data);
  assert_int_equal(sz.slot_floats, (40 + 2 * 40) + (40 + 2 * 40) + 40); /* in, fc, gelu; their grads; gelu' */
  assert_int_equal(sz.keep_floats, 4 * 40);                             /* in, gelu (the output); their grads */
  assert_int_equal(pw_prog_sizes_of(&m, 1, 1, 1, &sz), PW_EINVAL);
  pw_model_free(&m);
  pw_job_free(&job);
}

static void set_trainable(pw_job *job, const char *const *pats, int n) {
  job->train.n_trainable = n;
  for (int i = 0; i < n; i++) snprintf(job->train.trainable[i], PW_TRAINABLE_LEN, "%s", pats[i]);
}

/* train.trainable: with only the last block and the head training, stage 0
 * of two (embed + blocks 0, 1) is fully frozen: its W costs exactly 0, it
 * has no gradient or AdamW bytes; stage 1's W drops by the frozen
 * blocks.2's; the estimate still equals what the programs allocate. */
static void test_frozen_plan(void **state) {
  (void)state;
  static const char *const pats[] = {"blocks.3.*", "ln_f.*", "lm_head.weight"};
  pw_job job;
  pw_plan all, fr;
  job_of(GPT, "zb-h1", 2, 1, 1, 4, 8, &job);
  assert_int_equal(pw_plan_build(&job, NULL, &all, NULL), 0);
  set_trainable(&job, pats, 3);
  assert_int_equal(pw_plan_build(&job, NULL, &fr, NULL), 0);
  /* the same cut (so the stages compare), by even layer counts */
  assert_int_equal(fr.part.stages[0].layer_hi, all.part.stages[0].layer_hi);
  assert_int_equal(fr.part.stages[0].layer_hi, 3); /* embed, blocks.0, blocks.1 */
  assert_true(all.cost_w[0] > 0);
  assert_true(fr.cost_w[0] == 0.0);
  assert_true(fr.cost_w[1] > 0 && fr.cost_w[1] < all.cost_w[1]);
  assert_true(fr.cost_i[0] == all.cost_i[0] && fr.cost_f[1] == all.cost_f[1]); /* I still runs */
  assert_true(fr.sim->makespan < all.sim->makespan);
  assert_int_equal(fr.mem[0].grads, 0);
  assert_int_equal(fr.mem[0].adam, 0);
  assert_int_equal(fr.mem[0].params, all.mem[0].params);
  assert_true(fr.mem[1].grads < all.mem[1].grads && fr.mem[1].adam == 2 * fr.mem[1].grads);
  for (int s = 0; s < 2; s++) {
    const pw_stage *st = &fr.part.stages[s];
    pw_prog_config cfg = {.layer_lo = st->layer_lo, .layer_hi = st->layer_hi, .mb_size = fr.mb_size,
                          .batch_size = 8, .n_slots = 1};
    pw_prog *pg = NULL;
    assert_int_equal(pw_prog_create(&fr.model, &cfg, &pg, NULL), 0);
    assert_int_equal(fr.mem[s].grads, pw_prog_grad_numel(pg) * sizeof(float));
    assert_int_equal(fr.mem[s].adam, 2 * pw_prog_train_numel(pg) * sizeof(float));
    size_t trainable = 0;
    for (int i = 0; i < pw_prog_n_params(pg); i++) {
      pw_prog_param *pp = pw_prog_param_at(pg, i);
      int frozen = strncmp(pp->meta->name, "blocks.3.", 9) && strncmp(pp->meta->name, "ln_f.", 5) &&
                   strcmp(pp->meta->name, "lm_head.weight");
      assert_int_equal(pp->meta->frozen, frozen);
      assert_int_equal(pp->grad == NULL, frozen);
      assert_int_equal(pp->m == NULL && pp->v == NULL, frozen);
      if (!frozen) trainable += pp->meta->numel;
    }
    assert_int_equal(pw_prog_train_numel(pg), trainable);
    pw_prog_free(pg);
  }
  pw_plan_free(&all);
  pw_plan_free(&fr);
  pw_job_free(&job);
}

/* train.precision "bf16": the forward's activations cross the link in half
 * the bytes, the gradients coming back in the same; each rank holds its
 * stages' bf16 weight copies and operand scratch, and a bf16 send buffer
 * per slot of what it sends (the last stage sends nothing). */
static void test_bf16_plan(void **state) {
  (void)state;
  pw_job job;
  pw_plan f32, b16;
  job_of(GPT, "1f1b", 2, 1, 1, 4, 8, &job);
  assert_int_equal(pw_plan_build(&job, NULL, &f32, NULL), 0);
  job.train.precision = PW_PRECISION_BF16;
  assert_int_equal(pw_plan_build(&job, NULL, &b16, NULL), 0);
  double fwd = f32.sim->link_bytes[0 * 2 + 1], bwd = f32.sim->link_bytes[1 * 2 + 0];
  assert_true(fwd > 0 && bwd == fwd);
  assert_true(b16.sim->link_bytes[0 * 2 + 1] == fwd / 2);
  assert_true(b16.sim->link_bytes[1 * 2 + 0] == bwd);
  const pw_stage *s0 = &b16.part.stages[0];
  assert_int_equal(b16.mem[0].slots, f32.mem[0].slots + (size_t)b16.peak_slots[0] * s0->out_bytes * b16.mb_size / 2);
  assert_int_equal(b16.mem[1].slots, f32.mem[1].slots);
  /* stage 1 (blocks 2, 3 and the head): 4 linear weights a block, the
   * head's lm_head, and the widest node's operands (the MLP's fc, or
   * attention's) */
  const pw_model *m = &b16.model;
  size_t wb = 0, ops = 0;
  for (int i = m->layers[b16.part.stages[1].layer_lo].node_lo; i < m->n_nodes; i++)
    if (m->nodes[i].op == PW_OP_LINEAR) {
      size_t rows = (size_t)b16.mb_size * (size_t)m->values[m->nodes[i].in[0]].rows;
      wb += (size_t)m->nodes[i].C * (size_t)m->nodes[i].OC;
      if (rows * (size_t)(m->nodes[i].C + m->nodes[i].OC) > ops) ops = rows * (size_t)(m->nodes[i].C + m->nodes[i].OC);
    } else if (m->nodes[i].op == PW_OP_ATTENTION) { /* or attention's (bf16.h) */
      size_t at = pw_attention_bf16_scratch(b16.mb_size, m->nodes[i].T, m->nodes[i].C / 3);
      if (at > ops) ops = at;
    }
  assert_int_equal(b16.mem[1].scratch, f32.mem[1].scratch + 2 * (wb + ops));
  assert_true(b16.mem[0].total > f32.mem[0].total);
  pw_plan_free(&f32);
  pw_plan_free(&b16);
  pw_job_free(&job);
}

/* A pattern matching no parameter names itself and the nearest name;
 * a tied embedding freezes with its one parameter and leaves the shared
 * table (no gradients to sum). */
static void test_trainable_errors(void **state) {
  (void)state;
  static const char *const typo[] = {"blocks.*", "lm_haed.weight"};
  static const char *const head[] = {"blocks.*"};
  pw_job job;
  pw_plan p;
  pw_err err = {0};
  job_of(GPT, "1f1b", 2, 1, 1, 2, 8, &job);
  set_trainable(&job, typo, 2);
  assert_int_equal(pw_plan_build(&job, NULL, &p, &err), PW_ESPEC);
  assert_string_equal(err.path, "train.trainable[1]");
  assert_non_null(strstr(err.msg, "'lm_haed.weight' matches no parameter"));
  assert_non_null(strstr(err.msg, "did you mean lm_head.weight?"));
  pw_job_free(&job);
  job_of(GPT_TIED, "1f1b", 2, 1, 1, 2, 8, &job);
  assert_int_equal(pw_plan_build(&job, NULL, &p, NULL), 0);
  assert_int_equal(p.part.n_shared, 1);
  pw_plan_free(&p);
  set_trainable(&job, head, 1);
  assert_int_equal(pw_plan_build(&job, NULL, &p, NULL), 0);
  assert_int_equal(p.part.n_shared, 0);
  assert_int_equal(p.mem[1].tied, 0);
  pw_plan_free(&p);
  pw_job_free(&job);
}

/* A rank's estimate is exactly the arenas of its stage programs grown to
 * the planned slot counts (summed through prog.h's accessors), plus the
 * step-end buffers. */
static void check_rank_totals(const char *model, const char *sched, int pp, int dp, int V, int m, int batch) {
  pw_job job;
  job_of(model, sched, pp, dp, V, m, batch, &job);
  pw_plan p;
  pw_err err = {0};
  char eb[600];
  int rc = pw_plan_build(&job, NULL, &p, &err);
  if (rc) print_error("%s: %s\n", sched, pw_err_str(&err, eb, sizeof eb));
  assert_int_equal(rc, 0);
  for (int r = 0; r < pp; r++) {
    int stages[16];
    int n = pw_plan_rank_stages(&p, r, stages, 16);
    size_t arenas = 0, grads = 0, slots = 0, dp_bytes = 0;
    int n_slots = 0;
    for (int i = 0; i < n; i++) {
      const pw_stage *st = &p.part.stages[stages[i]];
      int k = p.peak_slots[stages[i]];
      assert_true(k >= 1 && k <= m);
      pw_prog_config cfg = {.layer_lo = st->layer_lo, .layer_hi = st->layer_hi, .mb_size = p.mb_size,
                            .batch_size = batch, .n_slots = 0, .max_slots = 2 * m + 2};
      pw_prog *pg = NULL;
      assert_int_equal(pw_prog_create(&p.model, &cfg, &pg, NULL), 0);
      for (int s = 0; s < k; s++) assert_int_equal(pw_prog_slot_ensure(pg, s), 0);
      arenas += 3 * pw_prog_numel(pg) * sizeof(float);
      grads += pw_prog_grad_numel(pg) * sizeof(float);
      slots += (size_t)k * pw_prog_slot_bytes(pg);
      n_slots += k;
      if (dp > 1) dp_bytes += (size_t)dp * pw_shard_max(pw_prog_grad_numel(pg), dp) * sizeof(float);
      pw_prog_free(pg);
    }
    const pw_plan_mem *mm = &p.mem[r];
    assert_int_equal(mm->params + mm->adam, arenas);
    assert_int_equal(mm->grads, grads);
    assert_int_equal(mm->slots, slots);
    assert_int_equal(mm->n_slots, n_slots);
    assert_int_equal(mm->dp, dp_bytes);
    /* snapshots (train.snapshot_every 1 by default): two generations of
     * this rank's state and two of the previous rank's */
    size_t prev = p.mem[(r + pp - 1) % pp].params;
    assert_int_equal(mm->snapshots, 2 * (arenas + (pp * dp > 1 ? 3 * prev : 0)));
    assert_int_equal(mm->work, 0);
    assert_int_equal(mm->total, mm->params + mm->grads + mm->adam + mm->slots + mm->scratch + mm->dp + mm->tied +
                                    mm->data + mm->snapshots);
  }
  /* the JSON says the same */
  json_t *j = pw_plan_json(&job, &p);
  json_t *ranks = json_object_get(json_object_get(j, "analytics"), "ranks");
  assert_int_equal(json_array_size(ranks), pp);
  for (int r = 0; r < pp; r++) {
    json_t *o = json_array_get(ranks, (size_t)r);
    assert_int_equal(json_integer_value(json_object_get(o, "memory_bytes")), p.mem[r].total);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "memory"), "slots")), p.mem[r].slots);
    /* dp > 1: the simulated step ends with the rank's exchange, at the memory model's link cost */
    json_t *row = json_array_get(json_object_get(json_object_get(j, "analytics"), "timeline"), (size_t)r);
    json_t *last = json_array_get(row, json_array_size(row) - 1);
    assert_int_equal(!strcmp(json_string_value(json_object_get(last, "action")), "DP"), dp > 1);
    if (dp > 1) {
      assert_true(p.mem[r].dp_seconds > 0);
      assert_true(fabs(json_real_value(json_object_get(last, "end")) - json_real_value(json_object_get(last, "start")) -
                       p.mem[r].dp_seconds) < 1e-12);
      assert_true(p.sim->step_makespan >= p.sim->dp_end[r] && p.sim->step_makespan > p.sim->makespan);
    }
  }
  json_t *st0 = json_array_get(json_object_get(json_object_get(j, "partition"), "stages"), 0);
  assert_int_equal(json_integer_value(json_object_get(st0, "slot_bytes")), p.stage_mem[0].slot_floats * sizeof(float));
  assert_int_equal(json_integer_value(json_object_get(st0, "peak_slots")), p.peak_slots[0]);
  json_decref(j);
  pw_plan_free(&p);
  pw_job_free(&job);
}

static void test_rank_totals(void **state) {
  (void)state;
  check_rank_totals(GPT, "1f1b", 2, 1, 1, 4, 8);
  check_rank_totals(GPT, "zb-h1", 2, 1, 1, 4, 8);
  check_rank_totals(GPT, "interleaved-1f1b", 2, 1, 2, 4, 8);
  check_rank_totals(GPT, "dualpipev", 2, 1, 2, 4, 8);
  check_rank_totals(LLAMA, "gpipe", 2, 2, 1, 2, 8);
  check_rank_totals(MLP, "1f1b", 2, 1, 1, 4, 16);
}

/* Tied embeddings split over two ranks: each holder touches the sum and
 * one copy per holder of the shared matrix (worker/stepend.c). */
static void test_tied_bytes(void **state) {
  (void)state;
  pw_job job;
  job_of(GPT_TIED, "1f1b", 2, 1, 1, 2, 4, &job);
  pw_plan p;
  assert_int_equal(pw_plan_build(&job, NULL, &p, NULL), 0);
  assert_int_equal(p.part.n_shared, 1);
  size_t want = 3 * p.model.params[p.part.shared[0].param].numel * sizeof(float); /* 256 x 32, 1 + 2 holders */
  assert_int_equal(want, 3 * 256 * 32 * 4);
  assert_int_equal(p.mem[0].tied, want);
  assert_int_equal(p.mem[1].tied, want);
  pw_plan_free(&p);
  pw_job_free(&job);
}

/* train.zero 1 at dp 2: AdamW state of a half shard, the exchange's
 * buffers and bytes as collective.h counts them (a tied embedding inside
 * one stage adds its shadow and main gradient, all-reduced whole), and
 * replica 0's v while it writes a checkpoint; zero 0 has none of it. */
static void test_zero_memory(void **state) {
  (void)state;
  for (int tied = 0; tied < 2; tied++) {
    pw_job job;
    job_of(tied ? GPT_TIED : GPT, "1f1b", 1, 2, 1, 2, 4, &job);
    pw_plan p0, p1;
    assert_int_equal(pw_plan_build(&job, NULL, &p0, NULL), 0);
    job.train.zero = 1;
    assert_int_equal(pw_plan_build(&job, NULL, &p1, NULL), 0);
    size_t tn = p0.stage_mem[0].train_numel, gn = p0.stage_mem[0].grad_numel, full = tied ? 2 * 256 * 32 : 0;
    assert_int_equal(gn - tn, tied ? 256 * 32 : 0); /* the head's use of the embedding: a shadow */
    assert_int_equal(p0.mem[0].adam, 2 * tn * 4);
    assert_int_equal(p1.mem[0].adam, 2 * pw_shard_max(tn, 2) * 4);
    assert_int_equal(p0.mem[0].dp, 2 * pw_shard_max(gn, 2) * 4);
    assert_int_equal(p1.mem[0].dp, pw_dp_floats(gn, tn, full, 2, 1, PW_COLL_CHUNK) * 4);
    assert_true(p0.mem[0].dp_sent == pw_coll_bytes_rs_ag(gn, 2, 0));
    assert_true(p1.mem[0].dp_sent == pw_coll_bytes_rs_ag(tn, 2, 0) + pw_coll_bytes_rs_ag(full, 2, 0));
    assert_int_equal(p0.mem[0].ckpt_gather, 0);
    assert_int_equal(p1.mem[0].ckpt_gather, tn * 4);
    assert_true(p1.mem[0].dp_seconds > 0);
    assert_int_equal(p0.mem[0].total - p1.mem[0].total,
                     p0.mem[0].adam - p1.mem[0].adam + p0.mem[0].dp - p1.mem[0].dp - p1.mem[0].ckpt_gather);
    pw_plan_free(&p0);
    pw_plan_free(&p1);
    pw_job_free(&job);
  }
}

/* train.zero 3 at dp 2 (tied: the embedding in two layers' gathers): the
 * rank keeps its shard of the parameters (and the two pages its ends round
 * out to) and three buffers of its largest layer, zero 2's gradients, the
 * optimizer state's shard; it sends each microbatch's gathers (F and B)
 * and zero 2's reduce-scatters, no all-gather of parameters; replica 0
 * holds whole parameters, m and v at a checkpoint; F, I and B take the
 * gathers' time their compute does not hide, W none. */
static void test_zero3_memory(void **state) {
  (void)state;
  for (int tied = 0; tied < 2; tied++) {
    pw_job job;
    job_of(tied ? GPT_TIED : GPT, "1f1b", 1, 2, 1, 2, 4, &job);
    pw_plan p2, p3;
    job.train.zero = 2;
    assert_int_equal(pw_plan_build(&job, NULL, &p2, NULL), 0);
    job.train.zero = 3;
    assert_int_equal(pw_plan_build(&job, NULL, &p3, NULL), 0);
    size_t n = p3.stage_mem[0].numel, tn = p3.stage_mem[0].train_numel;
    pw_prog_layout L;
    pw_z3_units u;
    assert_int_equal(pw_prog_layout_build(&p3.model, 0, p3.model.n_layers, p3.mb_size, &L), 0);
    assert_int_equal(pw_z3_units_build(&p3.model, &L, &u), 0);
    assert_int_equal(p3.mem[0].params, (pw_shard_max(n, 2) + 2 * 1024 + 3 * u.max_floats) * 4);
    /* (at this size three buffers of the largest layer, the embedding, outweigh the half saved) */
    assert_int_equal(p3.mem[0].grads, p2.mem[0].grads);
    assert_int_equal(p3.mem[0].adam, p2.mem[0].adam);
    assert_int_equal(p3.mem[0].ckpt_gather, p2.mem[0].ckpt_gather + n * 4);
    uint64_t pass = pw_z3_pass_bytes(&u, n, 2, 0);
    assert_true(pass == (pw_shard_max(n, 2) + (tied ? 256 * 32 : 0)) * 4 || !tied); /* the embedding twice */
    assert_true(p3.mem[0].dp_sent == p2.mem[0].dp_sent - (pw_coll_bytes_rs_ag(tn, 2, 0) - pw_coll_bytes_rs(tn, 2, 0)) +
                                         (uint64_t)p3.m * 2 * pass);
    /* the time: each pass's gathers (a latency and the bytes a replica receives, per layer) less what its
     * compute hides, in F and in I and B (W gathers nothing) */
    double g = 0;
    for (int k = 0; k < u.n_units; k++)
      if (u.floats[k]) g += p3.latency + pw_plan_wire_seconds(&p3, (double)u.floats[k] * (2 - 1) / 2 * sizeof(float));
    double ef = g > p2.cost_f[0] ? g - p2.cost_f[0] : 0, ei = g > p2.cost_i[0] ? g - p2.cost_i[0] : 0;
    assert_true(ef > 0); /* the tiny model's compute does not hide a latency per layer */
    assert_float_equal(p3.cost_f[0], p2.cost_f[0] + ef, 1e-12);
    assert_float_equal(p3.cost_i[0], p2.cost_i[0] + ei, 1e-12);
    assert_float_equal(p3.cost_b[0], p2.cost_b[0] + ei, 1e-12);
    assert_float_equal(p3.cost_w[0], p2.cost_w[0], 1e-12);
    pw_z3_units_free(&u);
    pw_prog_layout_free(&L);
    pw_plan_free(&p2);
    pw_plan_free(&p3);
    pw_job_free(&job);
  }
}

/* The step-end buffers as plan.h describes them for the worker: the DP
 * exchange keeps dp shards of the arena (zero 0), or dp shards of the
 * main part and a chunk per other replica (zero > 0), nothing at dp 1; a
 * tied block is the holders' buffers then the sum, disjoint, filling it. */
static void test_stepend_bufs(void **state) {
  (void)state;
  assert_int_equal(pw_dp_floats(1000, 900, 0, 1, 0, 16), 0);
  assert_int_equal(pw_dp_floats(1000, 900, 0, 3, 0, 16), 3 * 334);
  assert_int_equal(pw_dp_floats(1000, 900, 0, 3, 1, 16), 3 * 300 + 2 * 16);
  assert_int_equal(pw_dp_floats(1000, 900, 50, 3, 1, 16), 3 * 300 + 2 * 16 + 50 + 3 * 17);
  assert_int_equal(pw_dp_state_floats(900, 1, 1), 1800); /* zero at dp 1: a no-op */
  assert_int_equal(pw_dp_state_floats(900, 4, 0), 1800);
  assert_int_equal(pw_dp_state_floats(901, 4, 2), 2 * 226);
  pw_job job;
  job_of(GPT_TIED, "1f1b", 2, 1, 1, 2, 4, &job);
  pw_plan p;
  assert_int_equal(pw_plan_build(&job, NULL, &p, NULL), 0);
  const pw_shared_param *sp = &p.part.shared[0];
  size_t n = p.model.params[sp->param].numel, total = pw_tied_floats(&p.model, sp);
  assert_int_equal(total, (size_t)(1 + sp->n_holders) * n);
  float *block = calloc(total, sizeof(float));
  assert_non_null(block);
  pw_tied_bufs t;
  pw_tied_wire(&t, block, &p.model, sp);
  assert_ptr_equal(t.block, block);
  for (int j = 0; j < sp->n_holders; j++) assert_ptr_equal(t.holder[j], block + (size_t)j * n);
  assert_ptr_equal(t.sum, block + total - n);
  free(block);
  pw_plan_free(&p);
  pw_job_free(&job);
}

/* The data set is counted on the ranks that draw from it: the first
 * (inputs) and the last (targets), never a middle one. */
static void test_data_bytes(void **state) {
  (void)state;
  pw_job job;
  job_of(MLP, "1f1b", 2, 1, 1, 4, 16, &job);
  pw_plan p;
  assert_int_equal(pw_plan_build(&job, NULL, &p, NULL), 0);
  assert_int_equal(p.mem[0].data, 12 * 5 * sizeof(double)); /* the teacher matrix, in_dim x out_dim */
  assert_int_equal(p.mem[1].data, 12 * 5 * sizeof(double));
  pw_plan_free(&p);
  pw_job_free(&job);
  job_of(GPT, "1f1b", 4, 1, 1, 4, 8, &job);
  assert_int_equal(pw_plan_build(&job, NULL, &p, NULL), 0);
  assert_true(p.stage_mem[0].draws_data && p.stage_mem[3].draws_data);
  assert_false(p.stage_mem[1].draws_data || p.stage_mem[2].draws_data);
  assert_int_equal(p.mem[1].data, 0);
  assert_int_equal(p.mem[2].data, 0);
  pw_plan_free(&p);
  pw_job_free(&job);
}

/* Slot counts worked out by hand from the worker's rule. 1f1b, pp 4, m 8:
 * rank 0 runs F0..F3 before B0; rank 1 receives F0..F3 of rank 0 before
 * its own B0 frees anything (one more than its 3 in-flight
 * activations); the last rank holds the microbatch in its backward plus
 * the next one arrived. gpipe keeps all m. */
static void test_peak_slots_by_hand(void **state) {
  (void)state;
  struct {
    const char *name;
    int pp, V, m;
    int want[8];
  } cases[] = {
      {"1f1b", 4, 1, 8, {4, 4, 3, 2}},
      {"1f1b", 2, 1, 8, {2, 2}},
      {"gpipe", 2, 1, 4, {4, 4}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    pw_sched *s = NULL;
    assert_int_equal(pw_sched_build(cases[c].name, cases[c].pp, cases[c].V, cases[c].m, 0, &s, NULL), 0);
    int peak[8];
    assert_int_equal(pw_plan_peak_slots(s, peak), 0);
    for (int st = 0; st < s->S; st++) assert_int_equal(peak[st], cases[c].want[st]);
    pw_sched_free(s);
  }
}

/* train.eval_every: the eval passes run the forward-only lists in the
 * training slots, so each stage's planned slots are the larger of the two
 * plans' peaks, and the rank's memory counts the difference. */
static void test_eval_slots(void **state) {
  (void)state;
  const char *names[] = {"1f1b", "interleaved-1f1b", "zb-h1"};
  for (int c = 0; c < 3; c++) {
    int V = c == 1 ? 2 : 1, pp = 4 / V, grew = 0;
    pw_job job;
    job_of(GPT, names[c], pp, 1, V, 8, 8, &job);
    pw_plan off, on;
    assert_int_equal(pw_plan_build(&job, NULL, &off, NULL), 0);
    job.train.eval_every = 3;
    assert_int_equal(pw_plan_build(&job, NULL, &on, NULL), 0);
    pw_sched *f = NULL;
    assert_int_equal(pw_sched_build(names[c], pp, V, 8, 1, &f, NULL), 0);
    int fpeak[8];
    assert_int_equal(pw_plan_peak_slots(f, fpeak), 0);
    size_t extra[4] = {0};
    for (int st = 0; st < on.S; st++) {
      int want = off.peak_slots[st] > fpeak[st] ? off.peak_slots[st] : fpeak[st];
      assert_int_equal(on.peak_slots[st], want);
      grew |= want > off.peak_slots[st];
      extra[on.sched->stage_to_rank[st]] +=
          (size_t)(want - off.peak_slots[st]) * on.stage_mem[st].slot_floats * sizeof(float);
    }
    for (int r = 0; r < pp; r++) assert_int_equal(on.mem[r].total, off.mem[r].total + extra[r]);
    if (c == 0) assert_true(grew); /* 1f1b's later stages hold more microbatches forward only */
    pw_sched_free(f);
    pw_plan_free(&off);
    pw_plan_free(&on);
    pw_job_free(&job);
  }
}

/* Slots of stage st held at once in a simulated timeline under the worker's
 * rule: microbatch k from min(its F's start, its input's arrival) until its
 * B (or W, or F when forward only) ends; a release at t comes before an
 * acquisition at t. */
static int timeline_slots(const pw_sched *s, const pw_sim_result *r, int st) {
  int m = s->m, best = 0;
  double *acq = malloc(sizeof(double) * (size_t)m), *rel = malloc(sizeof(double) * (size_t)m);
  assert_non_null(acq);
  assert_non_null(rel);
  for (int k = 0; k < m; k++) acq[k] = rel[k] = -1;
  for (int e = 0; e < r->n_events; e++) {
    const pw_sim_event *ev = &r->events[e];
    const pw_action *a = &ev->act;
    if (a->stage == st && a->kind == PW_ACT_F && (acq[a->mb] < 0 || ev->start < acq[a->mb])) acq[a->mb] = ev->start;
    if (a->stage == st - 1 && a->kind == PW_ACT_F && (acq[a->mb] < 0 || ev->end < acq[a->mb])) acq[a->mb] = ev->end;
    if (a->stage == st && (a->kind == PW_ACT_B || a->kind == PW_ACT_W || (s->forward_only && a->kind == PW_ACT_F)))
      rel[a->mb] = ev->end;
  }
  for (int k = 0; k < m; k++) {
    int n = 0;
    for (int j = 0; j < m; j++) n += acq[j] <= acq[k] && acq[k] < rel[j];
    if (n > best) best = n;
  }
  free(acq);
  free(rel);
  return best;
}

/* Over every schedule: no timing holds more slots than planned (random
 * costs), and the planned count is reached when the rank is slow next to
 * the others (the worst case the planner assumes). */
static void test_peak_slots_vs_timelines(void **state) {
  (void)state;
  int n_infos = 0;
  const pw_sched_info *infos = pw_sched_infos(&n_infos);
  unsigned seed = 12345;
  int checked = 0;
  for (int i = 0; i < n_infos; i++)
    for (int pp = 2; pp <= 4; pp++)
      for (int V = infos[i].min_v; (infos[i].max_v == 0 || V <= infos[i].max_v) && V <= 2; V++)
        for (int m = 2; m <= 8; m += 2) {
          pw_sched *s = NULL;
          if (pw_sched_build(infos[i].name, pp, V, m, 0, &s, NULL)) continue; /* shape not allowed */
          int *peak = malloc(sizeof(int) * (size_t)s->S);
          double *f = malloc(sizeof(double) * (size_t)s->S), *b = malloc(sizeof(double) * (size_t)s->S);
          assert_non_null(peak);
          assert_non_null(f);
          assert_non_null(b);
          assert_int_equal(pw_plan_peak_slots(s, peak), 0);
          for (int trial = 0; trial < 3; trial++) {
            for (int st = 0; st < s->S; st++) {
              seed = seed * 1103515245u + 12345u;
              f[st] = 0.5 + (seed >> 16) % 100 / 50.0;
              b[st] = 2 * f[st];
            }
            pw_sim_costs c = {.f = f, .b = b};
            pw_sim_result *res = NULL;
            assert_int_equal(pw_sim_run(s, &c, &res, NULL), 0);
            for (int st = 0; st < s->S; st++) assert_true(timeline_slots(s, res, st) <= peak[st]);
            pw_sim_result_free(res);
          }
          for (int r = 0; r < pp; r++) {
            for (int st = 0; st < s->S; st++) {
              f[st] = s->stage_to_rank[st] == r ? 1e4 : 1;
              b[st] = 2 * f[st];
            }
            pw_sim_costs c = {.f = f, .b = b};
            pw_sim_result *res = NULL;
            assert_int_equal(pw_sim_run(s, &c, &res, NULL), 0);
            for (int st = 0; st < s->S; st++) {
              if (s->stage_to_rank[st] != r) continue;
              int got = timeline_slots(s, res, st);
              if (got != peak[st])
                print_error("%s pp %d V %d m %d stage %d: slow rank holds %d, planned %d\n", s->name, pp, V, m, st,
                            got, peak[st]);
              assert_int_equal(got, peak[st]);
            }
            pw_sim_result_free(res);
          }
          checked++;
          free(peak);
          free(f);
          free(b);
          pw_sched_free(s);
        }
  assert_true(checked > 30);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout_tiles),
      cmocka_unit_test(test_frozen_plan),
      cmocka_unit_test(test_bf16_plan),
      cmocka_unit_test(test_trainable_errors),
      cmocka_unit_test(test_layout_by_hand),
      cmocka_unit_test(test_rank_totals),
      cmocka_unit_test(test_tied_bytes),
      cmocka_unit_test(test_stepend_bufs),
      cmocka_unit_test(test_zero_memory),
      cmocka_unit_test(test_zero3_memory),
      cmocka_unit_test(test_data_bytes),
      cmocka_unit_test(test_eval_slots),
      cmocka_unit_test(test_peak_slots_by_hand),
      cmocka_unit_test(test_peak_slots_vs_timelines),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
