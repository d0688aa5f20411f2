/* test_partition: markers, even and balanced cuts; the stage DAG; shared
 * parameters; errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "partition.h"

static pw_model_spec gpt(int V, int L, int tied) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_GPT;
  s.vocab_size = V;
  s.seq_len = 16;
  s.d_model = 32;
  s.n_layers = L;
  s.n_heads = 4;
  s.tie_embeddings = tied;
  return s;
}

static void cuts_of(const pw_partition *p, int *cuts) {
  for (int s = 0; s < p->n_stages; s++) cuts[s] = p->stages[s].layer_lo;
  cuts[p->n_stages] = p->stages[p->n_stages - 1].layer_hi;
}

static void test_even(void **st) {
  pw_model_spec s = gpt(256, 4, 0);
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  pw_partition_spec ps = {.mode = PW_PARTITION_EVEN};
  pw_partition p;
  int cuts[8];
  assert_int_equal(pw_partition_build(&m, &ps, 2, &p, &err), 0);
  cuts_of(&p, cuts);
  /* embed + blocks 0,1 | blocks 2,3 + head */
  assert_int_equal(cuts[0], 0);
  assert_int_equal(cuts[1], 3);
  assert_int_equal(cuts[2], 6);
  assert_int_equal(p.n_edges, 1);
  assert_int_equal(p.edges[0].src, 0);
  assert_int_equal(p.edges[0].dst, 1);
  assert_int_equal(p.edges[0].bytes, 16 * 32 * 4);
  assert_int_equal(p.stages[0].out_bytes, 16 * 32 * 4);
  assert_int_equal(p.stages[1].in_bytes, 16 * 32 * 4);
  assert_int_equal(p.n_shared, 0);
  pw_partition_free(&p);

  assert_int_equal(pw_partition_build(&m, &ps, 4, &p, &err), 0);
  cuts_of(&p, cuts);
  int want4[] = {0, 2, 3, 4, 6};
  assert_memory_equal(cuts, want4, sizeof want4);
  assert_int_equal(p.n_edges, 3);
  pw_partition_free(&p);

  /* 4 blocks into 3 stages: the extra block goes to the middle */
  assert_int_equal(pw_partition_build(&m, &ps, 3, &p, &err), 0);
  cuts_of(&p, cuts);
  int want3[] = {0, 2, 4, 6};
  assert_memory_equal(cuts, want3, sizeof want3);
  pw_partition_free(&p);

  assert_int_equal(pw_partition_build(&m, &ps, 8, &p, &err), PW_ESPEC);
  assert_string_equal(err.path, "mesh.pp");
  assert_non_null(strstr(err.msg, "4 blocks cannot fill 8 stages"));
  pw_model_free(&m);
}

static void test_tied_shared(void **st) {
  pw_model_spec s = gpt(256, 4, 1);
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  pw_partition_spec ps = {.mode = PW_PARTITION_EVEN};
  pw_partition p;
  assert_int_equal(pw_partition_build(&m, &ps, 4, &p, &err), 0);
  assert_int_equal(p.n_shared, 1);
  assert_string_equal(m.params[p.shared[0].param].name, "embed.tok.weight");
  assert_int_equal(p.shared[0].n_holders, 2);
  assert_int_equal(p.shared[0].holders[0], 0);
  assert_int_equal(p.shared[0].holders[1], 3);
  /* each holder counts its copy */
  size_t total = 0;
  for (int i = 0; i < 4; i++) total += p.stages[i].params;
  assert_int_equal(total, pw_model_param_count(&m) + 256 * 32);
  json_t *j = pw_partition_json(&m, &p, 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "shared_params"), 0), "name")),
                      "embed.tok.weight");
  assert_int_equal(json_array_size(json_object_get(j, "stages")), 4);
  json_decref(j);
  pw_partition_free(&p);
  pw_model_free(&m);
}

/* A large vocabulary makes the head far heavier than a block: balanced
 * gives it a stage of its own and beats even's slowest stage. */
static void test_balanced_beats_even(void **st) {
  pw_model_spec s = gpt(1024, 6, 0);
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  pw_partition_spec even = {.mode = PW_PARTITION_EVEN}, bal = {.mode = PW_PARTITION_BALANCED};
  pw_partition pe, pb;
  assert_int_equal(pw_partition_build(&m, &even, 3, &pe, &err), 0);
  assert_int_equal(pw_partition_build(&m, &bal, 3, &pb, &err), 0);
  assert_true(pb.max_cost < 0.8 * pe.max_cost);
  /* the optimum, checked by brute force over every pair of cuts */
  double best = 1e300;
  for (int a = 1; a < m.n_layers; a++)
    for (int b = a + 1; b < m.n_layers; b++) {
      if (m.layers[b].is_loss) continue;
      int cuts[4] = {0, a, b, m.n_layers};
      pw_partition px;
      assert_int_equal(pw_partition_from_cuts(&m, &bal, cuts, 3, &px, &err), 0);
      if (px.max_cost < best) best = px.max_cost;
      pw_partition_free(&px);
    }
  assert_true(pb.max_cost <= best * (1 + 1e-12));
  assert_int_equal(pb.stages[2].layer_lo, m.n_layers - 1); /* the head alone */
  pw_partition_free(&pe);
  pw_partition_free(&pb);
  pw_model_free(&m);
}

static void test_balanced_measured_times(void **st) {
  pw_model_spec s = gpt(256, 4, 0);
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  /* embed, b0..b3, head: block 0 measured slow */
  double times[6] = {1, 10, 1, 1, 1, 1};
  pw_partition_spec ps = {.mode = PW_PARTITION_BALANCED, .layer_times = times, .n_layer_times = 6};
  pw_partition p;
  assert_int_equal(pw_partition_build(&m, &ps, 2, &p, &err), 0);
  assert_int_equal(p.stages[1].layer_lo, 2);
  assert_true(p.max_cost == 11);
  pw_partition_free(&p);
  ps.n_layer_times = 5;
  assert_int_equal(pw_partition_build(&m, &ps, 2, &p, &err), PW_ESPEC);
  assert_string_equal(err.path, "partition.layer_times");
  assert_non_null(strstr(err.msg, "has 5 entries but the model has 6 layers"));
  pw_model_free(&m);
}

static void test_markers(void **st) {
  pw_layer_spec L[] = {
      {.type = PW_LAYER_LINEAR, .out = 16, .bias = 1}, {.type = PW_LAYER_RELU},
      {.type = PW_LAYER_STAGE_BOUNDARY},               {.type = PW_LAYER_LINEAR, .out = 16, .bias = 1},
      {.type = PW_LAYER_STAGE_BOUNDARY},               {.type = PW_LAYER_LINEAR, .out = 4, .bias = 1},
      {.type = PW_LAYER_MSE},
  };
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_LAYERS;
  s.input = PW_INPUT_FEATURES;
  s.input_dim = 8;
  s.layers = L;
  s.n_layer_specs = 7;
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  pw_partition_spec ps = {.mode = PW_PARTITION_MARKERS};
  pw_partition p;
  assert_int_equal(pw_partition_build(&m, &ps, 3, &p, &err), 0);
  int cuts[4];
  cuts_of(&p, cuts);
  int want[] = {0, 2, 3, 5};
  assert_memory_equal(cuts, want, sizeof want);
  pw_partition_free(&p);
  assert_int_equal(pw_partition_build(&m, &ps, 4, &p, &err), PW_ESPEC);
  assert_string_equal(err.path, "partition.mode");
  assert_non_null(strstr(err.msg, "model has 2 stage_boundary markers (3 stages) but the mesh needs 4 stages"));
  /* balanced never starts a stage with the loss */
  pw_partition_spec bal = {.mode = PW_PARTITION_BALANCED};
  assert_int_equal(pw_partition_build(&m, &bal, 4, &p, &err), 0);
  for (int i = 0; i < 4; i++) assert_false(m.layers[p.stages[i].layer_lo].is_loss);
  pw_partition_free(&p);
  int bad[] = {0, 2, 4, 5}; /* stage 2 = the loss alone */
  assert_int_equal(pw_partition_from_cuts(&m, &bal, bad, 3, &p, &err), PW_ESPEC);
  pw_model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_even),
      cmocka_unit_test(test_tied_shared),
      cmocka_unit_test(test_balanced_beats_even),
      cmocka_unit_test(test_balanced_measured_times),
      cmocka_unit_test(test_markers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
