/* test_regions: model.regions end to end in one process — the spec (its
 * canonical form and every rule, each error naming its path), the model
 * graph (layers per region, the fusion node), the concat kernel, the shift
 * data's two inputs, and the trainer learning the task.
 *
 * Specs are written with single quotes, turned into double quotes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "kernels.h"
#include "model.h"
#include "plan.h"
#include "regions.h"
#include "rng.h"
#include "spec_json.h"
#include "train.h"

static const char *TEXT = "{'name': 'text', 'input': {'kind': 'tokens'}, 'layers': [{'type': 'embedding', "
                          "'vocab_size': 16, 'out': 16}, {'stage_boundary': {}}, {'type': 'gpt_block', 'n_heads': 2}], "
                          "'mesh': {'pp': 2}, 'schedule': {'name': '1f1b'}}";
static const char *VISION = "{'name': 'vision', 'input': {'kind': 'features', 'dim': 4}, 'layers': [{'type': "
                            "'linear', 'out': 8}, {'type': 'gelu'}], 'schedule': {'name': 'ZeroBubbleH1'}}";
static const char *HEAD = "{'name': 'head', 'layers': [{'type': 'linear', 'out': 32}, {'type': 'gelu'}, {'type': "
                          "'linear', 'out': 16}, {'type': 'cross_entropy'}]}";
static const char *GRAPH = "[{'to': 'head', 'from': ['text', 'vision']}]";

/* A job of the given regions (comma-joined objects), graph and extra top-level fields. */
static json_t *job_json(const char *regions, const char *graph, const char *extra) {
  size_t cap = strlen(regions) + strlen(graph) + strlen(extra) + 512;
  char *t = malloc(cap);
  assert_non_null(t);
  snprintf(t, cap,
           "{'name': 't', 'model': {'seq_len': 6, 'regions': [%s], 'graph': %s}, 'schedule': {'microbatches': 2}, "
           "'train': {'steps': 300, 'batch_size': 8, 'optimizer': {'lr': 0.01}}, 'data': {'kind': 'shift', 'keys': 3}%s}",
           regions, graph, extra);
  for (char *p = t; *p; p++)
    if (*p == '\'') *p = '"';
  json_error_t je;
  json_t *j = json_loads(t, 0, &je);
  if (!j) fail_msg("bad test JSON: %s\n%s", je.text, t);
  free(t);
  return j;
}

static char *three(void) {
  static char buf[2048];
  snprintf(buf, sizeof buf, "%s, %s, %s", TEXT, VISION, HEAD);
  return buf;
}

static void expect_bad(json_t *j, const char *path, const char *msg) {
  pw_job job;
  pw_err err = {0};
  int rc = pw_job_parse(j, NULL, &job, &err);
  if (!rc) {
    /* shape rules are the model's */
    pw_model m;
    rc = pw_model_build(&job.model, &m, &err);
    if (!rc) pw_model_free(&m);
    pw_job_free(&job);
  }
  if (rc != PW_ESPEC || strcmp(err.path, path) || !strstr(err.msg, msg))
    fail_msg("want \"%s: ...%s...\", got %d \"%s: %s\"", path, msg, rc, err.path, err.msg);
  json_decref(j);
}

/* The canonical form: defaults written (ranks summed, each region's dp and
 * schedule, the graph's fusion), and it parses back to the same text. */
static void test_canonical(void **st) {
  (void)st;
  pw_job a, b;
  pw_err err = {0};
  json_t *j = job_json(three(), GRAPH, "");
  if (pw_job_parse(j, NULL, &a, &err)) fail_msg("%s: %s", err.path, err.msg);
  json_decref(j);
  assert_int_equal(a.model.tmpl, PW_TEMPLATE_REGIONS);
  assert_int_equal(a.model.n_regions, 3);
  assert_int_equal(a.mesh.pp, 4); /* 2 + 1 + 1 */
  assert_string_equal(a.model.regions[0].schedule, "1f1b");
  assert_string_equal(a.model.regions[1].schedule, "zb-h1");
  assert_string_equal(a.model.regions[2].schedule, "1f1b"); /* the job's */
  assert_int_equal(a.model.regions[2].n_from, 2);
  assert_int_equal(a.model.regions[2].fusion, PW_FUSION_CONCAT);
  assert_int_equal(a.model.regions[1].dp, 1);
  assert_int_equal(a.data.keys, 3);
  json_t *c = pw_job_to_json(&a);
  char *s1 = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
  assert_int_equal(pw_job_parse(c, NULL, &b, &err), 0);
  json_t *c2 = pw_job_to_json(&b);
  char *s2 = json_dumps(c2, JSON_COMPACT | JSON_SORT_KEYS);
  assert_string_equal(s1, s2);
  assert_non_null(strstr(s1, "\"graph\":[{\"from\":[\"text\",\"vision\"],\"fusion\":\"concat\",\"to\":\"head\"}]"));
  free(s1);
  free(s2);
  json_decref(c);
  json_decref(c2);
  pw_job_free(&a);
  pw_job_free(&b);
}

/* Every rule names the region's path and the rule. */
static void test_bad(void **st) {
  (void)st;
  char r[4096];
  expect_bad(job_json(three(), "[{'to': 'head', 'from': ['text', 'visoin']}]", ""), "model.graph[0].from[1]",
             "no region 'visoin'; did you mean vision?");
  expect_bad(job_json(three(), GRAPH, ", 'mesh': {'pp': 3}"), "mesh.pp",
             "3, but the regions run on 4 ranks of their own (text 2 + vision 1 + head 1): ranks over-subscribed");
  expect_bad(job_json(three(), "[{'to': 'text', 'from': ['vision']}]", ""), "model.graph[0].to",
             "region 'text' reads a data input");
  expect_bad(job_json(three(), "[]", ""), "model.regions[2]", "region 'head' has no input and no model.graph entry");
  /* a cycle: mid1 <- mid2 <- mid1 */
  snprintf(r, sizeof r, "%s, {'name': 'mid1', 'layers': [{'type': 'gelu'}]}, {'name': 'mid2', 'layers': [{'type': "
           "'gelu'}]}, %s", TEXT, HEAD);
  expect_bad(job_json(r, "[{'to': 'mid1', 'from': ['text', 'mid2']}, {'to': 'mid2', 'from': ['mid1']}, "
                      "{'to': 'head', 'from': ['mid2']}]", ""),
             "model.graph", "a cycle: mid1 -> mid2 -> mid1");
  snprintf(r, sizeof r, "%s, %s, %s", HEAD, TEXT, VISION);
  expect_bad(job_json(r, GRAPH, ""), "model.regions[0]", "region 'head' is listed before 'text', which feeds it");
  expect_bad(job_json(three(), "[{'to': 'head', 'from': ['text']}]", ""), "model.graph",
             "2 regions feed no other region");
  expect_bad(job_json(three(), "[{'to': 'head', 'from': ['text', 'vision'], 'fusion': 'add'}]", ""), "model.graph[0]",
             "add into region 'head' needs equal widths: the first gives 16, 'vision' gives 8");
  expect_bad(job_json(three(), "[{'to': 'head', 'from': ['text', 'vision'], 'fusion': 'sum'}]", ""),
             "model.graph[0].fusion", "");
  snprintf(r, sizeof r, "%s, %s, %s", TEXT, TEXT, HEAD);
  expect_bad(job_json(r, GRAPH, ""), "model.regions[1].name", "'text' names an earlier region too");
  snprintf(r, sizeof r, "%s, %s, %s", TEXT,
           "{'name': 'vision', 'input': {'kind': 'features', 'dim': 4}, 'layers': [{'type': 'gelu'}], 'mesh': {'dp': 2}}",
           HEAD);
  expect_bad(job_json(r, GRAPH, ""), "model.regions[1].mesh.dp", "2, but mesh.dp is 1");
  snprintf(r, sizeof r, "%s, %s, %s", TEXT,
           "{'name': 'vision', 'input': {'kind': 'features', 'dim': 4}, 'layers': [{'type': 'gelu'}], "
           "'schedule': {'microbatches': 4}}", HEAD);
  expect_bad(job_json(r, GRAPH, ""), "model.regions[1].schedule.microbatches", "line up at a fusion");
  snprintf(r, sizeof r, "%s, %s, %s", TEXT,
           "{'name': 'vision', 'input': {'kind': 'features', 'dim': 4}, 'layers': [{'type': 'gelu'}, {'type': "
           "'cross_entropy'}]}", HEAD);
  expect_bad(job_json(r, GRAPH, ""), "model.regions[1].layers[1]", "only the last layer of the last region");
  snprintf(r, sizeof r, "%s, %s, %s", TEXT, VISION,
           "{'name': 'head', 'layers': [{'type': 'linear', 'out': 16}, {'type': 'gelu'}]}");
  expect_bad(job_json(r, GRAPH, ""), "model.regions[2].layers", "ends with the loss");
  snprintf(r, sizeof r, "%s, %s, %s", TEXT, VISION,
           "{'name': 'head', 'layers': [{'type': 'linear', 'out': 9}, {'type': 'cross_entropy'}]}");
  expect_bad(job_json(r, GRAPH, ""), "model.regions[2].layers[1]", "cross_entropy over 9 classes, but the vocabulary has 16");
  snprintf(r, sizeof r, "%s, %s, %s", TEXT,
           "{'name': 'vision', 'input': {'kind': 'features', 'dim': 4}, 'layers': [{'type': 'embedding', 'out': 4}]}",
           HEAD);
  expect_bad(job_json(r, GRAPH, ""), "model.regions[1].layers[0]", "embedding: only the first layer of a region reading tokens");
  expect_bad(job_json(three(), GRAPH, ", 'partition': {'mode': 'balanced'}"), "partition", "leave partition out");
  json_t *j = job_json(three(), GRAPH, "");
  json_object_set_new(json_object_get(j, "data"), "kind", json_string("copy"));
  json_object_del(json_object_get(j, "data"), "keys");
  expect_bad(j, "model.regions[1].input", "features per position come with data kind shift");
}

static void test_model(void **st) {
  (void)st;
  pw_job job;
  pw_model m;
  pw_err err = {0};
  json_t *j = job_json(three(), GRAPH, "");
  assert_int_equal(pw_job_parse(j, NULL, &job, &err), 0);
  json_decref(j);
  if (pw_model_build(&job.model, &m, &err)) fail_msg("%s: %s", err.path, err.msg);
  /* text.layers.0, text.layers.2, vision.layers.0, vision.layers.1, head.fuse, head.layers.0, head.layers.1 */
  assert_int_equal(m.n_layers, 9);
  assert_string_equal(m.layers[1].name, "text.layers.2");
  assert_string_equal(m.layers[4].name, "head.fuse");
  assert_int_equal(m.layers[2].region, 1);
  assert_int_equal(m.layers[4].region, 2);
  assert_int_equal(m.n_markers, 1);
  assert_int_equal(m.markers[0], 1);
  const pw_node *f = &m.nodes[m.layers[4].node_lo];
  assert_int_equal(f->op, PW_OP_CONCAT);
  assert_int_equal(m.values[f->out].width, 24);
  assert_int_equal(f->C, 16);
  assert_int_equal(m.feature_value >= 0, 1);
  assert_int_equal(m.values[m.feature_value].rows, 6);
  assert_int_equal(m.values[m.feature_value].width, 4);
  assert_int_equal(m.data.feature_dim, 4);
  assert_int_equal(m.data.vocab_size, 16);
  assert_int_equal(strcmp(m.params[0].name, "text.layers.0.weight"), 0);
  pw_model_free(&m);
  pw_job_free(&job);
}

/* concat forward and backward, overwriting and accumulating, exactly. */
static void test_concat_kernel(void **st) {
  (void)st;
  pw_node n = {.op = PW_OP_CONCAT, .C = 2, .OC = 5};
  float a[4] = {1, 2, 3, 4}, b[6] = {5, 6, 7, 8, 9, 10}, out[10], da[4] = {1, 1, 1, 1}, db[6] = {0};
  float dout[10] = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100};
  pw_kernel_io io = {.n = &n, .in0 = a, .in1 = b, .out = out, .din0 = da, .din1 = db, .dout = dout, .rows = 2,
                     .acc0 = 1, .acc1 = 0};
  pw_kernel_of(PW_OP_CONCAT)->forward(&io);
  const float want[10] = {1, 2, 5, 6, 7, 3, 4, 8, 9, 10};
  for (int k = 0; k < 10; k++) assert_true(out[k] == want[k]);
  pw_kernel_of(PW_OP_CONCAT)->backward_input(&io);
  const float wa[4] = {11, 21, 61, 71}, wb[6] = {30, 40, 50, 80, 90, 100};
  for (int k = 0; k < 4; k++) assert_true(da[k] == wa[k]);
  for (int k = 0; k < 6; k++) assert_true(db[k] == wb[k]);
}

/* shift: targets are the tokens moved by the key the features carry; a
 * sequence is the same whichever slice of the batch asks for it. */
static void test_shift_data(void **st) {
  (void)st;
  enum { T = 5, D = 3, V = 11, K = 4, B = 6 };
  pw_data_spec spec = {.kind = PW_DATA_SHIFT, .keys = K};
  pw_data_shape shape = {.vocab_size = V, .seq_len = T, .tokens = 1, .feature_dim = D};
  pw_dataset *ds;
  pw_err err = {0};
  assert_int_equal(pw_dataset_open(&spec, &shape, 7, &ds, &err), 0);
  int32_t in[B * T], tg[B * T], in2[T], tg2[T];
  float x[B * T * D], x2[T * D];
  pw_dataset_batch(ds, PW_SPLIT_TRAIN, 3, 0, B, B, in, tg);
  pw_dataset_features(ds, PW_SPLIT_TRAIN, 3, 0, B, B, x);
  pw_dataset_batch(ds, PW_SPLIT_TRAIN, 3, 4, 1, B, in2, tg2);
  pw_dataset_features(ds, PW_SPLIT_TRAIN, 3, 4, 1, B, x2);
  assert_memory_equal(in + 4 * T, in2, sizeof in2);
  assert_memory_equal(tg + 4 * T, tg2, sizeof tg2);
  assert_memory_equal(x + 4 * T * D, x2, sizeof x2);
  /* the key table, drawn as data.c says */
  double E[K][D];
  pw_rng r;
  pw_rng_seed(&r, pw_hash64(7, pw_hash_str("keys")));
  for (int c = 0; c < K; c++)
    for (int jj = 0; jj < D; jj++) E[c][jj] = pw_rng_normal(&r);
  int seen[K] = {0};
  for (int i = 0; i < B * T; i++) {
    int c = -1;
    for (int q = 0; q < K; q++)
      if (x[i * D] == (float)E[q][0] && x[i * D + 1] == (float)E[q][1] && x[i * D + 2] == (float)E[q][2]) c = q;
    assert_true(c >= 0);
    seen[c] = 1;
    assert_true(in[i] >= 1 && in[i] < V);
    assert_int_equal(tg[i], 1 + (in[i] - 1 + c) % (V - 1));
  }
  assert_int_equal(seen[0] + seen[1] + seen[2] + seen[3] >= 3, 1);
  pw_dataset_close(ds);
  spec.keys = V;
  assert_int_equal(pw_dataset_open(&spec, &shape, 7, &ds, &err), PW_ESPEC);
  assert_string_equal(err.path, "data.keys");
}

/* The two-tower model learns what neither tower alone can: its eval loss
 * falls well below ln(keys), the best a model blind to the features does. */
static void test_train(void **st) {
  (void)st;
  pw_job job;
  pw_err err = {0};
  json_t *j = job_json(three(), GRAPH, "");
  assert_int_equal(pw_job_parse(j, NULL, &job, &err), 0);
  json_decref(j);
  pw_trainer t;
  if (pw_trainer_init(&t, &job, &err)) fail_msg("%s: %s", err.path, err.msg);
  double before, after;
  assert_int_equal(pw_trainer_eval(&t, &before, &err), 0);
  pw_step_stats s;
  for (int k = 0; k < 300; k++) assert_int_equal(pw_trainer_step(&t, &s, &err), 0);
  assert_int_equal(pw_trainer_eval(&t, &after, &err), 0);
  assert_true(fabs(before - log(15.0)) < 0.5);
  if (!(after < 0.5 * log(3.0))) fail_msg("eval loss %.4f after 300 steps (before %.4f)", after, before);
  pw_trainer_free(&t);
  pw_job_free(&job);
}

/* A job of three regions with the given text and vision schedules and
 * text's virtual stages (its layers cut into pp x V stages). */
static json_t *sched_job(const char *ts, int tv, const char *vs, const char *extra) {
  char r[4096], tl[512] = "";
  size_t n = 0;
  for (int k = 0; k < 2 * tv; k++)
    n += (size_t)snprintf(tl + n, sizeof tl - n, "%s{'type': 'gpt_block', 'n_heads': 2}", k ? ", {'stage_boundary': {}}, " : "");
  snprintf(r, sizeof r,
           "{'name': 'text', 'input': {'kind': 'tokens'}, 'layers': [{'type': 'embedding', 'vocab_size': 16, 'out': 16}, "
           "%s], 'mesh': {'pp': 2, 'virtual_stages': %d}, 'schedule': {'name': '%s'}}, "
           "{'name': 'vision', 'input': {'kind': 'features', 'dim': 4}, 'layers': [{'type': 'linear', 'out': 8}, "
           "{'stage_boundary': {}}, {'type': 'gelu'}], 'mesh': {'pp': 2}, 'schedule': {'name': '%s'}}, %s",
           tl, tv, ts, vs, HEAD);
  return job_json(r, GRAPH, extra);
}

/* The joint plan: regions on disjoint ranks, the fusion stage reading the
 * last stage of each tower; every combination of schedules is proven by the
 * simulator, and so is the serial plan of the same stages. */
static void test_plan(void **st) {
  (void)st;
  static const char *combos[][2] = {{"1f1b", "zb-h1"}, {"gpipe", "1f1b"}, {"interleaved-1f1b", "gpipe"},
                                    {"zb-h1", "interleaved-1f1b"}, {"1f1b", "1f1b"}};
  for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
    int tv = strncmp(combos[c][0], "interleaved", 11) ? 1 : 2;
    for (int serial = 0; serial < 2; serial++) {
      json_t *j = sched_job(combos[c][0], tv, strncmp(combos[c][1], "interleaved", 11) ? combos[c][1] : "1f1b",
                            serial ? ", 'schedule': {'microbatches': 4, 'regions': 'serial'}"
                                   : ", 'schedule': {'microbatches': 4}");
      pw_job job;
      pw_plan p;
      pw_err err = {0};
      if (pw_job_parse(j, NULL, &job, &err)) fail_msg("%s: %s", err.path, err.msg);
      json_decref(j);
      if (pw_plan_build(&job, NULL, &p, &err)) fail_msg("%s/%s: %s: %s", combos[c][0], combos[c][1], err.path, err.msg);
      int S = 2 * tv + 2 + 1;
      assert_int_equal(p.S, S);
      assert_int_equal(p.pp, serial ? 2 : 5);
      assert_string_equal(p.sched->name, serial ? "regions-serial" : "regions");
      /* the fusion stage reads the last stage of each tower */
      int preds[PW_SCHED_MAX_LINKS];
      assert_int_equal(pw_sched_preds(p.sched, S - 1, preds), 2);
      assert_int_equal(preds[0], 2 * tv - 1);
      assert_int_equal(preds[1], 2 * tv + 1);
      assert_int_equal(pw_sched_preds(p.sched, 2 * tv, preds), 0); /* vision's first reads data */
      assert_int_equal(pw_sched_succs(p.sched, 2 * tv - 1, preds), 1);
      assert_int_equal(preds[0], S - 1);
      if (!serial) /* disjoint ranks: text 0-1, vision 2-3, head 4 */
        for (int s = 0; s < S; s++)
          assert_int_equal(p.sched->stage_to_rank[s], s < 2 * tv ? s % 2 : s < S - 1 ? 2 + s - 2 * tv : 4);
      int counts[4];
      pw_sched_count(p.sched, counts);
      assert_int_equal(counts[PW_ACT_F], 4 * S);
      json_t *doc = pw_plan_json(&job, &p);
      json_t *cmp = json_object_get(doc, "regions");
      assert_non_null(json_object_get(cmp, "speedup"));
      assert_true(json_real_value(json_object_get(json_object_get(cmp, "serial"), "makespan")) > 0);
      json_decref(doc);
      pw_plan_free(&p);
      pw_job_free(&job);
    }
  }
}

static void expect_plan_bad(json_t *j, const char *path, const char *msg) {
  pw_job job;
  pw_plan p;
  pw_err err = {0};
  if (pw_job_parse(j, NULL, &job, &err)) fail_msg("%s: %s", err.path, err.msg);
  json_decref(j);
  int rc = pw_plan_build(&job, NULL, &p, &err);
  if (!rc) pw_plan_free(&p);
  pw_job_free(&job);
  if (rc != PW_ESPEC || strcmp(err.path, path) || !strstr(err.msg, msg))
    fail_msg("want \"%s: ...%s...\", got %d \"%s: %s\"", path, msg, rc, err.path, err.msg);
}

static void test_plan_bad(void **st) {
  (void)st;
  char r[4096];
  snprintf(r, sizeof r, "%s, %s, %s", TEXT,
           "{'name': 'vision', 'input': {'kind': 'features', 'dim': 4}, 'layers': [{'type': 'gelu'}], 'mesh': {'pp': 2}}",
           HEAD);
  expect_plan_bad(job_json(r, GRAPH, ""), "model.regions[1]",
                  "0 stage_boundary markers make 1 stage, but its mesh runs pp * virtual_stages = 2 * 1 = 2");
  snprintf(r, sizeof r, "%s, %s, %s", TEXT,
           "{'name': 'vision', 'input': {'kind': 'features', 'dim': 4}, 'layers': [{'type': 'gelu'}, "
           "{'stage_boundary': {}}, {'type': 'gelu'}], 'mesh': {'pp': 2}, 'schedule': {'name': 'dualpipev'}}", HEAD);
  expect_plan_bad(job_json(r, GRAPH, ""), "model.regions[1].mesh.virtual_stages", "");
  snprintf(r, sizeof r, "%s, {'name': 'mid', 'layers': [{'type': 'gelu'}]}, %s", TEXT,
           "{'name': 'head', 'layers': [{'type': 'linear', 'out': 16}, {'type': 'cross_entropy'}]}");
  expect_plan_bad(job_json(r, "[{'to': 'mid', 'from': ['text']}, {'to': 'head', 'from': ['text', 'mid']}]", ""),
                  "model.graph", "region 'text' feeds 2 regions");
}

/* The compare's shared-cores replay on a profile whose wake-up beside 5
 * busy processes is 5 ms (nothing below): every transfer of the concurrent
 * plan (5 ranks) pays two, the serial plan (2 ranks) none, whichever of the
 * two the job's mesh runs. */
static double compare_on_cores(const char *sched_extra, double wake5, const char *key) {
  json_t *j = sched_job("1f1b", 1, "zb-h1", sched_extra);
  pw_job job;
  pw_plan p;
  pw_err err = {0};
  if (pw_job_parse(j, NULL, &job, &err)) fail_msg("%s: %s", err.path, err.msg);
  json_decref(j);
  pw_model m;
  assert_int_equal(pw_model_build(&job.model, &m, &err), 0);
  json_t *layers = json_array();
  for (int l = 0; l < m.n_layers; l++)
    json_array_append_new(layers, json_pack("{s:s, s:[f], s:[f], s:[f]}", "name", m.layers[l].name, "f", 1e-3, "i",
                                            1e-3, "w", 1e-3));
  pw_model_free(&m);
  json_t *pj = json_pack("{s:i, s:i, s:[i], s:o, s:{s:f, s:f}, s:{s:f, s:f, s:f}, s:{s:[f,f,f,f,f], s:[f,f,f,f,f]}}",
                         "version", 2, "cores", 2, "mb_sizes", 4, "layers", layers, "step", "per_param_s", 0.0,
                         "fixed_s", 0.0, "link", "latency_s", 0.0, "bandwidth_Bps", 0.0, "wake_s", 0.0, "sharing",
                         "speed", 1.0, 1.0, 0.5, 0.5, 0.4, "wake_s", 0.0, 0.0, 0.0, 0.0, wake5);
  pw_cost_profile prof;
  assert_int_equal(pw_cost_parse(pj, &prof, &err), 0);
  json_decref(pj);
  pw_cost_model cm = {.profile = &prof, .cores = 2};
  if (pw_plan_build_costed(&job, NULL, &cm, &p, &err)) fail_msg("%s: %s", err.path, err.msg);
  pw_sim_costs c = pw_plan_costs(&p);
  json_t *cmp = pw_regions_compare_json(&job, p.joint, p.regions, &c, 2, &prof, &p.part, &err);
  if (!cmp) fail_msg("%s: %s", err.path, err.msg);
  double v = json_real_value(json_object_get(json_object_get(cmp, "cores"), key));
  json_decref(cmp);
  pw_plan_free(&p);
  pw_cost_free(&prof);
  pw_job_free(&job);
  return v;
}

static void test_compare_wake(void **st) {
  (void)st;
  const char *conc = ", 'schedule': {'microbatches': 4}", *ser = ", 'schedule': {'microbatches': 4, 'regions': 'serial'}";
  double s0 = compare_on_cores(conc, 0, "serial");
  assert_true(s0 > 0);
  /* serial: no transfer wakes beside 5, from either mesh */
  assert_true(compare_on_cores(conc, 5e-3, "serial") == s0);
  assert_true(compare_on_cores(ser, 5e-3, "serial") == s0);
  /* concurrent: at least text's hop, the fusion and head's gradient back, each 10 ms, on its critical path */
  double c0 = compare_on_cores(conc, 0, "concurrent");
  assert_true(compare_on_cores(conc, 5e-3, "concurrent") > c0 + 30e-3);
  assert_true(compare_on_cores(ser, 5e-3, "concurrent") > c0 + 30e-3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_canonical), cmocka_unit_test(test_bad),        cmocka_unit_test(test_model),
      cmocka_unit_test(test_concat_kernel), cmocka_unit_test(test_shift_data), cmocka_unit_test(test_train),
      cmocka_unit_test(test_plan), cmocka_unit_test(test_plan_bad), cmocka_unit_test(test_compare_wake),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
