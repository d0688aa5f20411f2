/* test_slice: a worker's slice of a plan (common/plan/slice.h).
 *
 * Round trip: every rank's slice of a tied, interleaved, data-parallel GPT
 * plan decodes to exactly the plan's tables — the whole graph, the stage
 * ranges, the edges into and out of the rank's stages, the tied table,
 * its action list with fused flags, its peak slots, the training config
 * bit for bit — and a program built from the decoded graph initialises
 * its parameters bit for bit as one built from the planner's graph.
 * Integrity: a flipped bit anywhere in the text, a hash of something else,
 * or no hash is refused with "slice_sha256"; a body that hashes right but
 * names ids outside its tables is refused by the checks, naming the field. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "prog.h"
#include "slice.h"
#include "spec_json.h"

/* llama's attention options (grouped-query, Llama-3's rope scaling, qkv
 * bias, QK-norm) travel in the nodes (setup_llama) */
static const char *SPEC_LLAMA =
    "{\"name\":\"t\",\"model\":{\"template\":\"llama\",\"vocab_size\":64,\"seq_len\":8,\"d_model\":16,"
    "\"n_layers\":2,\"n_heads\":4,\"n_kv_heads\":2,\"qkv_bias\":true,\"qk_norm\":true,"
    "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
    "\"original_max_position_embeddings\":32}},\"mesh\":{\"pp\":2},"
    "\"train\":{\"trainable\":[\"blocks.1.*\"]},\"data\":{\"kind\":\"copy\"}}";

/* Gemma's options (the scale's sqrt(d) and the norms' offset in the
 * nodes' base, the geglu) travel too (setup_gemma) */
static const char *SPEC_GEMMA =
    "{\"name\":\"t\",\"model\":{\"template\":\"llama\",\"vocab_size\":64,\"seq_len\":8,\"d_model\":24,"
    "\"n_layers\":2,\"n_heads\":2,\"n_kv_heads\":1,\"tie_embeddings\":true,\"mlp_act\":\"gelu_tanh\","
    "\"embed_scale\":true,\"norm_offset\":1},\"mesh\":{\"pp\":2},"
    "\"train\":{\"trainable\":[\"blocks.1.*\"]},\"data\":{\"kind\":\"copy\"}}";

/* masked LM: the data's mask id and the shape's K and pad id travel */
static const char *SPEC_BERT =
    "{\"name\":\"t\",\"model\":{\"template\":\"bert\",\"vocab_size\":40,\"seq_len\":8,\"d_model\":16,"
    "\"n_layers\":2,\"n_heads\":2,\"pad_token\":0,\"sep_token\":3,\"mlm_predictions\":3},\"mesh\":{\"pp\":2},"
    "\"train\":{\"trainable\":[\"blocks.1.*\"]},\"data\":{\"kind\":\"tokens\",\"path\":\"x.tokens\",\"mask_token\":7}}";

static const char *SPEC =
    "{\"name\":\"t\",\"model\":{\"template\":\"gpt\",\"vocab_size\":64,\"seq_len\":8,\"d_model\":16,"
    "\"n_layers\":4,\"n_heads\":2,\"tie_embeddings\":true},"
    "\"mesh\":{\"pp\":2,\"dp\":2,\"virtual_stages\":2},"
    "\"schedule\":{\"name\":\"interleaved-1f1b\",\"microbatches\":4},"
    "\"partition\":{\"remat\":[true,false,false,true]},"
    "\"train\":{\"steps\":7,\"batch_size\":16,\"seed\":9007199254740993,\"grad_clip\":0.5,"
    "\"checkpoint_every\":3,\"eval_every\":2,\"eval_batches\":3,\"on_nonfinite\":\"skip\","
    "\"trainable\":[\"blocks.[13].*\",\"embed.tok.weight\"],"
    "\"optimizer\":{\"name\":\"adamw\",\"lr\":0.003,\"min_lr\":0.0003,"
    "\"warmup_steps\":2,\"betas\":[0.9,0.95],\"eps\":1e-8,\"weight_decay\":0.1}},"
    "\"data\":{\"kind\":\"copy\"}}";

typedef struct {
  pw_job job;
  pw_plan plan;
  char plan_sha[PW_SHA256_HEX_LEN + 1];
} fixture;

static int setup_of(void **state, const char *spec) {
  fixture *f = calloc(1, sizeof *f);
  json_t *j = json_loads(spec, 0, NULL);
  pw_err err = {0};
  char b[600];
  if (!j || pw_job_parse(j, NULL, &f->job, &err)) fail_msg("spec: %s", pw_err_str(&err, b, sizeof b));
  json_decref(j);
  if (pw_plan_build(&f->job, NULL, &f->plan, &err)) fail_msg("plan: %s", pw_err_str(&err, b, sizeof b));
  json_t *doc = pw_plan_json(&f->job, &f->plan);
  char *text;
  assert_int_equal(pw_slice_plan_text(doc, &text, f->plan_sha), 0);
  /* the hash is of the exact text */
  char again[PW_SHA256_HEX_LEN + 1];
  pw_sha256_hex(text, strlen(text), again);
  assert_string_equal(again, f->plan_sha);
  free(text);
  json_decref(doc);
  *state = f;
  return 0;
}

static int setup(void **state) { return setup_of(state, SPEC); }
static int setup_llama(void **state) { return setup_of(state, SPEC_LLAMA); }
static int setup_gemma(void **state) { return setup_of(state, SPEC_GEMMA); }
static int setup_bert(void **state) { return setup_of(state, SPEC_BERT); }

static int teardown(void **state) {
  fixture *f = *state;
  pw_plan_free(&f->plan);
  pw_job_free(&f->job);
  free(f);
  return 0;
}

static void build(fixture *f, int rank, char **text, char hex[PW_SHA256_HEX_LEN + 1]) {
  pw_err err = {0};
  char b[600];
  if (pw_slice_build(&f->job, &f->plan, rank, f->plan_sha, text, hex, &err))
    fail_msg("slice of rank %d: %s", rank, pw_err_str(&err, b, sizeof b));
}

static void expect_models_equal(const pw_model *a, const pw_model *b) {
  int frozen = 0; /* train.trainable travels as each parameter's flag */
  for (int i = 0; i < a->n_params; i++) frozen += a->params[i].frozen;
  assert_true(frozen > 0 && frozen < a->n_params);
  assert_int_equal(a->n_values, b->n_values);
  assert_int_equal(a->n_nodes, b->n_nodes);
  assert_int_equal(a->n_params, b->n_params);
  assert_int_equal(a->n_layers, b->n_layers);
  assert_int_equal(a->seq_len, b->seq_len);
  assert_int_equal(a->input_value, b->input_value);
  assert_int_equal(a->target_value, b->target_value);
  assert_int_equal(a->loss_value, b->loss_value);
  assert_memory_equal(&a->data, &b->data, sizeof a->data);
  for (int i = 0; i < a->n_values; i++)
    if (memcmp(&a->values[i], &b->values[i], sizeof a->values[i])) fail_msg("value %d differs", i);
  for (int i = 0; i < a->n_nodes; i++)
    if (memcmp(&a->nodes[i], &b->nodes[i], sizeof a->nodes[i])) fail_msg("node %d differs", i);
  for (int i = 0; i < a->n_params; i++) {
    const pw_param *x = &a->params[i], *y = &b->params[i];
    assert_string_equal(x->name, y->name);
    if (x->ndim != y->ndim || x->shape[0] != y->shape[0] || x->shape[1] != y->shape[1] || x->numel != y->numel ||
        x->decay != y->decay || x->init != y->init || x->frozen != y->frozen || memcmp(&x->init_std, &y->init_std, sizeof(float)))
      fail_msg("param %d (%s) differs", i, x->name);
  }
  for (int i = 0; i < a->n_layers; i++) {
    const pw_layer *x = &a->layers[i], *y = &b->layers[i];
    assert_string_equal(x->name, y->name);
    if (x->node_lo != y->node_lo || x->node_hi != y->node_hi || x->is_block != y->is_block ||
        x->is_loss != y->is_loss)
      fail_msg("layer %d (%s) differs", i, x->name);
  }
}

static void test_round_trip(void **state) {
  fixture *f = *state;
  const pw_plan *p = &f->plan;
  assert_true(p->part.n_shared > 0); /* the fixture ties embeddings */
  for (int rank = 0; rank < p->pp * p->dp; rank++) {
    char *text, hex[PW_SHA256_HEX_LEN + 1];
    build(f, rank, &text, hex);
    pw_slice s;
    pw_err err = {0};
    char b[600];
    if (pw_slice_decode(text, strlen(text), hex, &s, &err))
      fail_msg("rank %d: %s", rank, pw_err_str(&err, b, sizeof b));
    int pr = rank % p->pp;
    assert_string_equal(s.plan_sha256, f->plan_sha);
    assert_int_equal(s.rank, rank);
    assert_int_equal(s.prank, pr);
    assert_int_equal(s.replica, rank / p->pp);
    assert_int_equal(s.pp, p->pp);
    assert_int_equal(s.dp, p->dp);
    assert_int_equal(s.S, p->S);
    assert_int_equal(s.m, p->m);
    assert_int_equal(s.mb_size, p->mb_size);
    assert_true(s.mem_budget == p->mem[pr].total);
    assert_int_equal(s.mode, f->job.mode);
    pw_train_spec want = f->job.train;
    want.keep_checkpoints = 0; /* the coordinator's alone: not in a slice */
    want.max_restarts = 0;
    want.n_trainable = 0; /* travels as the parameters' frozen flags */
    memset(want.trainable, 0, sizeof want.trainable);
    assert_memory_equal(&s.train, &want, sizeof s.train); /* doubles and the 64-bit seed bit for bit */
    assert_int_equal(s.data.kind, f->job.data.kind);
    assert_string_equal(s.data.path, f->job.data.path);
    assert_int_equal(s.data.mask_token, -1); /* none: not in the slice */
    expect_models_equal(&s.model, &p->model);
    /* partition: every range, the edges touching this rank, all of the tied table */
    assert_int_equal(s.part.n_stages, p->S);
    for (int st = 0; st < p->S; st++) {
      assert_int_equal(s.part.stages[st].layer_lo, p->part.stages[st].layer_lo);
      assert_int_equal(s.part.stages[st].layer_hi, p->part.stages[st].layer_hi);
    }
    int touching = 0;
    for (int e = 0; e < p->part.n_edges; e++) {
      const pw_stage_edge *pe = &p->part.edges[e];
      if (p->sched->stage_to_rank[pe->src] != pr && p->sched->stage_to_rank[pe->dst] != pr) continue;
      const pw_stage_edge *se = &s.part.edges[touching++];
      assert_true(se->src == pe->src && se->dst == pe->dst && se->value == pe->value && se->bytes == pe->bytes);
    }
    assert_int_equal(s.part.n_edges, touching);
    assert_int_equal(s.part.n_shared, p->part.n_shared);
    assert_memory_equal(s.part.shared, p->part.shared, sizeof *s.part.shared * (size_t)p->part.n_shared);
    /* schedule: stage -> rank, this rank's list (flags too), nobody else's */
    assert_memory_equal(s.sched->stage_to_rank, p->sched->stage_to_rank, sizeof(int) * (size_t)p->S);
    assert_int_equal(s.sched->n_actions[pr], p->sched->n_actions[pr]);
    for (int i = 0; i < p->sched->n_actions[pr]; i++) {
      const pw_action *x = &s.sched->actions[pr][i], *y = &p->sched->actions[pr][i];
      if (x->kind != y->kind || x->flags != y->flags || x->mb != y->mb || x->stage != y->stage)
        fail_msg("rank %d action %d differs", rank, i);
    }
    for (int q = 0; q < p->pp; q++)
      if (q != pr) assert_int_equal(s.sched->n_actions[q], 0);
    /* its stages and their slots */
    int k = 0;
    for (int st = 0; st < p->S; st++) {
      if (p->sched->stage_to_rank[st] != pr) continue;
      assert_int_equal(s.local_stage[k], st);
      assert_int_equal(s.peak_slots[k], p->peak_slots[st]);
      assert_int_equal(s.n_work[k], p->n_work[st]);
      assert_int_equal(s.n_work[k] > 0, st == 0 || st == 3); /* partition.remat */
      k++;
    }
    assert_int_equal(s.n_local, k);
    pw_slice_free(&s);
    free(text);
  }
}

/* Parameters drawn from the decoded graph equal the planner's graph's, bit
 * for bit, stage by stage (the pipelined == single-process guarantee
 * starts here). */
static void test_round_trip_llama(void **state) {
  fixture *f = *state;
  int gqa = 0;
  for (int rank = 0; rank < f->plan.pp; rank++) {
    char *text, hex[PW_SHA256_HEX_LEN + 1];
    build(f, rank, &text, hex);
    pw_slice s;
    pw_err err = {0};
    char b[600];
    if (pw_slice_decode(text, strlen(text), hex, &s, &err))
      fail_msg("rank %d: %s", rank, pw_err_str(&err, b, sizeof b));
    expect_models_equal(&f->plan.model, &s.model);
    for (int i = 0; i < s.model.n_nodes; i++) gqa += s.model.nodes[i].NKV == 2 && s.model.nodes[i].rope_factor == 8;
    pw_slice_free(&s);
    free(text);
  }
  assert_int_equal(gqa, 2 * f->plan.pp); /* a rope node a block, the whole graph in each slice */
}

static void test_round_trip_gemma(void **state) {
  fixture *f = *state;
  int n[3] = {0};
  for (int rank = 0; rank < f->plan.pp; rank++) {
    char *text, hex[PW_SHA256_HEX_LEN + 1];
    build(f, rank, &text, hex);
    pw_slice s;
    pw_err err = {0};
    char b[600];
    if (pw_slice_decode(text, strlen(text), hex, &s, &err))
      fail_msg("rank %d: %s", rank, pw_err_str(&err, b, sizeof b));
    expect_models_equal(&f->plan.model, &s.model); /* base: sqrt(24) and 1 bit for bit */
    for (int i = 0; i < s.model.n_nodes; i++) {
      const pw_node *nd = &s.model.nodes[i];
      n[0] += nd->op == PW_OP_SCALE && nd->base == (float)sqrt(24.0);
      n[1] += nd->op == PW_OP_RMSNORM_OFFSET && nd->base == 1.0f;
      n[2] += nd->op == PW_OP_GEGLU;
    }
    pw_slice_free(&s);
    free(text);
  }
  assert_true(n[0] == f->plan.pp && n[1] == 5 * f->plan.pp && n[2] == 2 * f->plan.pp);
}

static void test_round_trip_bert(void **state) {
  fixture *f = *state;
  for (int rank = 0; rank < f->plan.pp; rank++) {
    char *text, hex[PW_SHA256_HEX_LEN + 1];
    build(f, rank, &text, hex);
    pw_slice s;
    pw_err err = {0};
    char b[600];
    if (pw_slice_decode(text, strlen(text), hex, &s, &err))
      fail_msg("rank %d: %s", rank, pw_err_str(&err, b, sizeof b));
    expect_models_equal(&f->plan.model, &s.model); /* the shape's K 3 and pad id 0 among it */
    assert_int_equal(s.model.data.mlm_predictions, 3);
    assert_int_equal(s.model.data.pad_token, 0);
    assert_int_equal(s.data.mask_token, 7);
    assert_int_equal(s.data.kind, PW_DATA_TOKENS);
    pw_slice_free(&s);
    free(text);
  }
}

static void test_same_init(void **state) {
  fixture *f = *state;
  char *text, hex[PW_SHA256_HEX_LEN + 1];
  build(f, 1, &text, hex);
  pw_slice s;
  pw_err err = {0};
  assert_int_equal(pw_slice_decode(text, strlen(text), hex, &s, &err), 0);
  for (int k = 0; k < s.n_local; k++) {
    const pw_stage *st = &s.part.stages[s.local_stage[k]];
    pw_prog_config cfg = {.layer_lo = st->layer_lo, .layer_hi = st->layer_hi, .mb_size = s.mb_size,
                          .batch_size = s.train.batch_size, .n_slots = 1};
    pw_prog *a, *b;
    assert_int_equal(pw_prog_create(&f->plan.model, &cfg, &a, &err), 0);
    assert_int_equal(pw_prog_create(&s.model, &cfg, &b, &err), 0);
    pw_prog_init_params(a, f->job.train.seed);
    pw_prog_init_params(b, s.train.seed);
    assert_true(pw_prog_numel(a) == pw_prog_numel(b) && pw_prog_numel(a) > 0);
    assert_int_equal(pw_prog_n_inputs(a), pw_prog_n_inputs(b));
    assert_int_equal(pw_prog_n_outputs(a), pw_prog_n_outputs(b));
    assert_memory_equal(pw_prog_params(a), pw_prog_params(b), pw_prog_numel(a) * sizeof(float));
    pw_prog_free(a);
    pw_prog_free(b);
  }
  pw_slice_free(&s);
  free(text);
}

static void expect_refused(const char *text, size_t len, const char *hex, const char *path, const char *what) {
  pw_slice s;
  pw_err err = {0};
  int rc = pw_slice_decode(text, len, hex, &s, &err);
  if (rc != PW_EPROTO) fail_msg("%s: decode returned %d, not PW_EPROTO", what, rc);
  if (strcmp(err.path, path)) fail_msg("%s: refused at '%s', expected '%s' (%s)", what, err.path, path, err.msg);
  assert_null(s.model.nodes); /* nothing kept */
}

static void test_flipped_bytes_refused(void **state) {
  fixture *f = *state;
  char *text, hex[PW_SHA256_HEX_LEN + 1];
  build(f, 2, &text, hex);
  size_t n = strlen(text);
  /* Every byte of the first and last 300, and every 13th between: a flip
   * in a digit that would parse to the same number is refused too. */
  for (size_t i = 0; i < n; i += (i < 300 || i + 300 > n) ? 1 : 13) {
    for (int bit = 0; bit < 8; bit += 7) {
      text[i] ^= (char)(1 << bit);
      char what[64];
      snprintf(what, sizeof what, "bit %d of byte %zu", bit, i);
      expect_refused(text, n, hex, "slice_sha256", what);
      text[i] ^= (char)(1 << bit);
    }
  }
  /* Truncated, another hash, no hash. */
  expect_refused(text, n - 1, hex, "slice_sha256", "truncated");
  expect_refused(text, n, f->plan_sha, "slice_sha256", "the plan's hash");
  expect_refused(text, n, NULL, "slice_sha256", "no hash");
  pw_slice s;
  pw_err err = {0};
  assert_int_equal(pw_slice_decode(text, n, hex, &s, &err), 0); /* and the original still passes */
  pw_slice_free(&s);
  /* The message names the mismatch. */
  text[n / 2] ^= 1;
  assert_int_equal(pw_slice_decode(text, n, hex, &s, &err), PW_EPROTO);
  assert_non_null(strstr(err.msg, "hash mismatch"));
  assert_non_null(strstr(err.msg, hex));
  free(text);
}

/* A body hashed correctly but wrong inside (another build's, a bug):
 * refused by the checks, which name the field. */
static void reseal_refused(const char *text, void (*edit)(json_t *), const char *path) {
  json_t *b = json_loads(text, 0, NULL);
  edit(b);
  char *t = json_dumps(b, JSON_COMPACT | JSON_SORT_KEYS), hex[PW_SHA256_HEX_LEN + 1];
  pw_sha256_hex(t, strlen(t), hex);
  expect_refused(t, strlen(t), hex, path, path);
  free(t);
  json_decref(b);
}

static void edit_node_out(json_t *b) {
  json_array_set_new(json_array_get(json_object_get(json_object_get(b, "model"), "nodes"), 0), 4,
                     json_integer(100000));
}
static void edit_action_stage(json_t *b) {
  json_t *a = json_array_get(json_object_get(json_object_get(b, "schedule"), "actions"), 0);
  json_array_set_new(a, 3, json_integer(99));
}
static void edit_holder(json_t *b) {
  json_t *sh = json_array_get(json_object_get(json_object_get(b, "partition"), "shared"), 0);
  json_array_set_new(json_array_get(sh, 1), 0, json_integer(-1));
}
static void edit_version(json_t *b) { json_object_set_new(b, "version", json_integer(PW_SLICE_VERSION + 1)); }
static void edit_extra(json_t *b) { json_object_set_new(b, "surprise", json_true()); }
static void edit_batch(json_t *b) {
  json_object_set_new(json_object_get(b, "train"), "batch_size", json_integer(15));
}

static void test_bad_bodies_refused(void **state) {
  fixture *f = *state;
  char *text, hex[PW_SHA256_HEX_LEN + 1];
  build(f, 0, &text, hex);
  reseal_refused(text, edit_node_out, "slice.model.nodes");
  reseal_refused(text, edit_action_stage, "slice.schedule.actions");
  reseal_refused(text, edit_holder, "slice.partition.shared");
  reseal_refused(text, edit_version, "slice.version");
  reseal_refused(text, edit_extra, "slice");
  reseal_refused(text, edit_batch, "slice.train");
  free(text);
  pw_err err = {0};
  assert_int_equal(pw_slice_build(&f->job, &f->plan, 4, f->plan_sha, &text, hex, &err), PW_EINVAL);
  assert_null(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test_setup_teardown(test_round_trip_llama, setup_llama, teardown),
      cmocka_unit_test_setup_teardown(test_round_trip_gemma, setup_gemma, teardown),
      cmocka_unit_test_setup_teardown(test_round_trip_bert, setup_bert, teardown),
      cmocka_unit_test(test_same_init),
      cmocka_unit_test(test_flipped_bytes_refused),
      cmocka_unit_test(test_bad_bodies_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
