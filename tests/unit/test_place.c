/* test_place: explicit partitions (partition.stages), mesh.placement
 * and stage_boundary hints — the spec's form, the errors naming the JSON
 * path and the layer or stage, the relabeling of a schedule's ranks and its
 * refusal, the named placements, and whole plans built with them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "partition.h"
#include "placement.h"
#include "plan.h"
#include "sim.h"
#include "spec_json.h"

/* ---- helpers --------------------------------------------------------- */

/* A gpt (embed, blocks.0 .. blocks.{L-1}, head) job, with `extra` members
 * merged over the top level (single quotes stand for double). */
static json_t *gpt_job(int L, int pp, int V, const char *sched, const char *extra) {
  char buf[2048];
  snprintf(buf, sizeof buf,
           "{'name':'t','model':{'template':'gpt','vocab_size':256,'seq_len':8,'d_model':16,'n_layers':%d,'n_heads':2},"
           "'mesh':{'pp':%d,'virtual_stages':%d},'schedule':{'name':'%s','microbatches':8},"
           "'train':{'steps':2,'batch_size':8},'data':{'kind':'copy'}%s%s}",
           L, pp, V, sched, extra[0] ? "," : "", extra);
  for (char *p = buf; *p; p++)
    if (*p == '\'') *p = '"';
  json_error_t je;
  json_t *j = json_loads(buf, 0, &je);
  if (!j) fail_msg("bad test JSON: %s\n%s", je.text, buf);
  return j;
}

/* Parse; on success the job is the caller's. */
static int parse(json_t *j, pw_job *job, pw_err *err) {
  memset(err, 0, sizeof *err);
  int rc = pw_job_parse(j, NULL, job, err);
  json_decref(j);
  return rc;
}

/* Parse (must pass) and plan; the plan's rc, err filled. */
static int plan_of(json_t *j, pw_plan *p, pw_err *err) {
  pw_job job;
  int rc = parse(j, &job, err);
  if (rc) fail_msg("spec refused: %s: %s", err->path, err->msg);
  rc = pw_plan_build(&job, NULL, p, err);
  pw_job_free(&job);
  return rc;
}

static void assert_err(const pw_err *err, const char *path, const char *needle) {
  if (strcmp(err->path, path) != 0 || !strstr(err->msg, needle))
    fail_msg("want %s: ...%s..., got %s: %s", path, needle, err->path, err->msg);
}

/* ---- the spec -------------------------------------------------------- */

static void test_spec_round_trip(void **st) {
  (void)st;
  pw_job job;
  pw_err err;
  /* mode defaults to explicit when stages are listed; the canonical form
   * says so and round-trips; the placement is kept as written */
  json_t *in = gpt_job(2, 2, 1, "1f1b", "'partition':{'stages':[['embed'],['blocks.0','blocks.1','head']]}");
  json_object_set_new(json_object_get(in, "mesh"), "placement", json_pack("[i,i]", 1, 0));
  assert_int_equal(parse(in, &job, &err), 0);
  assert_int_equal(job.partition.mode, PW_PARTITION_EXPLICIT);
  assert_int_equal(job.partition.n_stages, 2);
  assert_string_equal(job.partition.names[job.partition.first[1]], "blocks.0");
  assert_int_equal(job.mesh.placement_kind, PW_PLACEMENT_ARRAY);
  json_t *canon = pw_job_to_json(&job);
  char *text = json_dumps(canon, JSON_COMPACT | JSON_SORT_KEYS);
  assert_non_null(strstr(text, "\"mode\":\"explicit\",\"stages\":[[\"embed\"],[\"blocks.0\",\"blocks.1\",\"head\"]]"));
  assert_non_null(strstr(text, "\"placement\":[1,0]"));
  pw_job again;
  assert_int_equal(pw_job_parse(canon, NULL, &again, &err), 0);
  json_t *canon2 = pw_job_to_json(&again);
  assert_true(json_equal(canon, canon2));
  free(text);
  json_decref(canon);
  json_decref(canon2);
  pw_job_free(&again);
  pw_job_free(&job);

  /* a named placement; no placement leaves the canonical mesh as it was */
  in = gpt_job(2, 2, 2, "interleaved-1f1b", "");
  json_object_set_new(json_object_get(in, "mesh"), "placement", json_string("loop"));
  assert_int_equal(parse(in, &job, &err), 0);
  assert_int_equal(job.mesh.placement_kind, PW_PLACEMENT_LOOP);
  canon = pw_job_to_json(&job);
  assert_string_equal(json_string_value(json_object_get(json_object_get(canon, "mesh"), "placement")), "loop");
  json_decref(canon);
  pw_job_free(&job);
  assert_int_equal(parse(gpt_job(2, 2, 1, "1f1b", ""), &job, &err), 0);
  canon = pw_job_to_json(&job);
  assert_null(json_object_get(json_object_get(canon, "mesh"), "placement"));
  assert_null(json_object_get(json_object_get(canon, "partition"), "stages"));
  json_decref(canon);
  pw_job_free(&job);
}

static void test_spec_errors(void **st) {
  (void)st;
  pw_job job;
  pw_err err;
  static const struct {
    const char *extra, *path, *needle;
  } cases[] = {
      {"'partition':{'mode':'explicit'}", "partition.stages", "required with mode explicit"},
      {"'partition':{'stages':[]}", "partition.stages", "must be an array of stages"},
      {"'partition':{'stages':[['embed'],'head']}", "partition.stages[1]", "must be an array of layer names"},
      {"'partition':{'stages':[['embed'],[]]}", "partition.stages[1]", "cannot be empty"},
      {"'partition':{'stages':[['embed'],['blocks.0',3]]}", "partition.stages[1][1]", "must be a layer name"},
      {"'partition':{'stages':[['embed'],['']]}", "partition.stages[1][0]", "is not a layer name"},
      {"'partition':{'mode':'even','stages':[['embed']]}", "partition.stages", "not used with mode even"},
      /* the stage count against the mesh, both numbers said */
      {"'partition':{'stages':[['embed','blocks.0','blocks.1','head']]}", "partition.stages",
       "lists 1 stages, but the mesh runs mesh.pp * mesh.virtual_stages = 2 * 1 = 2"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(parse(gpt_job(2, 2, 1, "1f1b", cases[i].extra), &job, &err), PW_ESPEC);
    assert_err(&err, cases[i].path, cases[i].needle);
  }
  static const struct {
    const char *placement, *path, *needle;
  } pcases[] = {
      {"[0,2]", "mesh.placement[1]", "must be the rank that runs stage 1, 0 .. 1 (mesh.pp is 2)"},
      {"[0,-1]", "mesh.placement[1]", "0 .. 1"},
      {"[0,'1']", "mesh.placement[1]", "0 .. 1"},
      {"[]", "mesh.placement", "a placement name (loop, v, contiguous) or an array of ranks"},
      {"{}", "mesh.placement", "a placement name"},
      {"'lop'", "mesh.placement", "did you mean loop"},
  };
  for (size_t i = 0; i < sizeof pcases / sizeof pcases[0]; i++) {
    json_t *j = gpt_job(2, 2, 1, "1f1b", "");
    char text[64];
    snprintf(text, sizeof text, "%s", pcases[i].placement);
    for (char *p = text; *p; p++)
      if (*p == '\'') *p = '"';
    json_object_set_new(json_object_get(j, "mesh"), "placement", json_loads(text, JSON_DECODE_ANY, NULL));
    assert_int_equal(parse(j, &job, &err), PW_ESPEC);
    assert_err(&err, pcases[i].path, pcases[i].needle);
  }
}

/* ---- explicit partitions --------------------------------------------- */

/* The stages of a 4-block gpt at pp 2 as written, through the plan. */
static int explicit4(const char *stages, pw_plan *p, pw_err *err) {
  char extra[512];
  snprintf(extra, sizeof extra, "'partition':{'stages':%s}", stages);
  return plan_of(gpt_job(4, 2, 1, "1f1b", extra), p, err);
}

static void test_explicit_equals_even(void **st) {
  (void)st;
  pw_plan a, b;
  pw_err err;
  assert_int_equal(plan_of(gpt_job(4, 2, 1, "1f1b", ""), &a, &err), 0);
  assert_int_equal(explicit4("[['embed','blocks.0','blocks.1'],['blocks.2','blocks.3','head']]", &b, &err), 0);
  for (int s = 0; s < 2; s++) {
    assert_int_equal(a.part.stages[s].layer_lo, b.part.stages[s].layer_lo);
    assert_int_equal(a.part.stages[s].layer_hi, b.part.stages[s].layer_hi);
  }
  assert_int_equal(b.part.mode, PW_PARTITION_EXPLICIT);
  assert_true(a.sim->makespan == b.sim->makespan);
  pw_plan_free(&a);
  pw_plan_free(&b);
  /* what even cannot say: the embedding alone */
  assert_int_equal(explicit4("[['embed'],['blocks.0','blocks.1','blocks.2','blocks.3','head']]", &b, &err), 0);
  assert_int_equal(b.part.stages[0].layer_hi, 1);
  assert_int_equal(b.part.stages[1].layer_lo, 1);
  assert_int_equal(b.part.n_edges, 1);
  pw_plan_free(&b);
}

static void test_explicit_errors(void **st) {
  (void)st;
  pw_plan p;
  pw_err err;
  static const struct {
    const char *stages, *path, *needle;
  } cases[] = {
      {"[['embed','blocks.0','blocks.1','blocks.3'],['blocks.2','head']]", "partition.stages[0][3]",
       "\"blocks.3\" comes before \"blocks.2\" (at partition.stages[1][0])"},
      {"[['embed','blocks.0'],['blocks.3','head']]", "partition.stages[1][0]",
       "layers \"blocks.1\"..\"blocks.2\" are in no stage"},
      {"[['embed','blocks.0','blocks.1'],['blocks.2','blocks.3']]", "partition.stages", "layer \"head\" is in no stage"},
      {"[['embed','blokcs.0','blocks.1'],['blocks.2','blocks.3','head']]", "partition.stages[0][1]",
       "no layer \"blokcs.0\" in the model (its layers are embed .. head); did you mean blocks.0"},
      {"[['embed','blocks.0','blocks.1'],['blocks.1','blocks.2','blocks.3','head']]", "partition.stages[1][0]",
       "\"blocks.1\" is listed twice (also at partition.stages[0][2])"},
      {"[['blocks.0','embed','blocks.1'],['blocks.2','blocks.3','head']]", "partition.stages[0][0]",
       "\"blocks.0\" comes before \"embed\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(explicit4(cases[i].stages, &p, &err), PW_ESPEC);
    assert_err(&err, cases[i].path, cases[i].needle);
  }
  /* a layers list: a stage cannot start with the loss */
  pw_model m;
  pw_model_spec ms = {0};
  pw_layer_spec L[] = {{.type = PW_LAYER_LINEAR, .out = 4, .bias = 1},
                       {.type = PW_LAYER_RELU},
                       {.type = PW_LAYER_MSE}};
  ms.tmpl = PW_TEMPLATE_LAYERS;
  ms.input = PW_INPUT_FEATURES;
  ms.input_dim = 3;
  ms.seq_len = 1;
  ms.layers = L;
  ms.n_layer_specs = 3;
  ms.init_std = 0.02f;
  assert_int_equal(pw_model_build(&ms, &m, &err), 0);
  int first[] = {0, 2, 3};
  char names[3][PW_LAYER_NAME_CAP] = {"layers.0", "layers.1", "layers.2"};
  pw_partition_spec ps = {.mode = PW_PARTITION_EXPLICIT, .n_stages = 2, .first = first, .names = names};
  pw_partition part;
  assert_int_equal(pw_partition_build(&m, &ps, 2, &part, &err), PW_ESPEC);
  assert_err(&err, "partition.stages[1][0]", "\"layers.2\" holds only the loss");
  /* a count other than the plan's */
  assert_int_equal(pw_partition_build(&m, &ps, 3, &part, &err), PW_ESPEC);
  assert_err(&err, "partition.stages", "lists 2 stages, but the plan has 3");
  first[1] = 1;
  assert_int_equal(pw_partition_build(&m, &ps, 2, &part, &err), 0);
  assert_int_equal(part.stages[1].layer_lo, 1);
  pw_partition_free(&part);
  pw_model_free(&m);
}

/* ---- placement --------------------------------------------------------- */

static pw_sched *build(const char *name, int pp, int V) {
  pw_sched *s;
  pw_err err = {0};
  if (pw_sched_build(name, pp, V, 8, 0, &s, &err)) fail_msg("%s: %s", err.path, err.msg);
  return s;
}

static char *rank_text(const pw_sched *s, int r) {
  int n = pw_actions_format(s->actions[r], s->n_actions[r], NULL, 0);
  char *b = malloc((size_t)n + 1);
  pw_actions_format(s->actions[r], s->n_actions[r], b, (size_t)n + 1);
  return b;
}

static void test_relabel(void **st) {
  (void)st;
  pw_err err = {0};
  /* 1f1b at pp 4, ranks reversed: rank 3 - r runs old rank r's list */
  pw_sched *a = build("1f1b", 4, 1), *b = build("1f1b", 4, 1);
  int rev[] = {3, 2, 1, 0};
  assert_int_equal(pw_sched_place(b, rev, &err), 0);
  assert_memory_equal(b->stage_to_rank, rev, sizeof rev);
  for (int r = 0; r < 4; r++) {
    char *x = rank_text(a, r), *y = rank_text(b, 3 - r);
    assert_string_equal(x, y);
    free(x);
    free(y);
  }
  assert_int_equal(pw_sim_check(b, &err), 0);
  pw_sched_free(b);
  /* interleaved-1f1b at pp 2 V 2 on loop relabeled: [1,0,1,0] */
  pw_sched *c = build("interleaved-1f1b", 2, 2), *d = build("interleaved-1f1b", 2, 2);
  int swap[] = {1, 0, 1, 0};
  assert_int_equal(pw_sched_place(d, swap, &err), 0);
  char *x = rank_text(c, 0), *y = rank_text(d, 1);
  assert_string_equal(x, y);
  free(x);
  free(y);
  assert_int_equal(pw_sim_check(d, &err), 0);
  /* refusals name the stage and why; the plan is left as it was */
  int split[] = {1, 0, 0, 1};
  assert_int_equal(pw_sched_place(c, split, &err), PW_ESPEC);
  assert_err(&err, "mesh.placement[2]",
             "interleaved-1f1b runs stages 0 and 2 on one rank; this placement puts them on ranks 1 and 0 — use a "
             "placement of the loop layout or a custom schedule");
  int loop[] = {0, 1, 0, 1};
  assert_memory_equal(c->stage_to_rank, loop, sizeof loop);
  int merge[] = {0, 0, 1, 1};
  assert_int_equal(pw_sched_place(c, merge, &err), PW_ESPEC);
  assert_err(&err, "mesh.placement[1]", "runs stages 0 and 1 on two ranks (0 and 1); this placement puts both on rank 0");
  pw_sched_free(c);
  pw_sched_free(d);
  /* DualPipeV's V shape named in the refusal */
  pw_sched *v = build("dualpipev", 2, 2);
  assert_int_equal(pw_sched_place(v, loop, &err), PW_ESPEC);
  assert_err(&err, "mesh.placement[2]", "placement of the v layout");
  pw_sched_free(v);
  pw_sched_free(a);
}

static void test_named(void **st) {
  (void)st;
  int out[8];
  pw_placement_named(PW_PLACEMENT_LOOP, 4, 8, out);
  int loop[] = {0, 1, 2, 3, 0, 1, 2, 3};
  assert_memory_equal(out, loop, sizeof loop);
  pw_placement_named(PW_PLACEMENT_V, 4, 8, out);
  int v[] = {0, 1, 2, 3, 3, 2, 1, 0};
  assert_memory_equal(out, v, sizeof v);
  pw_placement_named(PW_PLACEMENT_CONTIGUOUS, 4, 8, out);
  int cont[] = {0, 0, 1, 1, 2, 2, 3, 3};
  assert_memory_equal(out, cont, sizeof cont);
  pw_placement_named(PW_PLACEMENT_V, 2, 6, out); /* a zigzag beyond V = 2 */
  int zig[] = {0, 1, 1, 0, 0, 1};
  assert_memory_equal(out, zig, sizeof zig);

  /* through the spec and the plan: the layouts' own names change nothing;
   * another layout's is refused, naming the placement */
  static const struct {
    const char *sched, *placement;
    int V, ok;
  } cases[] = {
      {"interleaved-1f1b", "loop", 2, 1}, {"dualpipev", "v", 2, 1},       {"1f1b", "loop", 1, 1},
      {"1f1b", "v", 1, 1},                {"1f1b", "contiguous", 1, 1},   {"interleaved-1f1b", "v", 2, 0},
      {"dualpipev", "loop", 2, 0},        {"interleaved-1f1b", "contiguous", 2, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pw_plan a, b;
    pw_err err;
    json_t *j = gpt_job(4, 2, cases[i].V, cases[i].sched, "");
    assert_int_equal(plan_of(json_deep_copy(j), &a, &err), 0);
    json_object_set_new(json_object_get(j, "mesh"), "placement", json_string(cases[i].placement));
    int rc = plan_of(j, &b, &err);
    if (!cases[i].ok) {
      assert_int_equal(rc, PW_ESPEC);
      char want[64];
      snprintf(want, sizeof want, "\"%s\" puts stage ", cases[i].placement);
      assert_err(&err, "mesh.placement", want);
      pw_plan_free(&a);
      continue;
    }
    assert_int_equal(rc, 0);
    assert_memory_equal(a.sched->stage_to_rank, b.sched->stage_to_rank, sizeof(int) * (size_t)a.S);
    for (int r = 0; r < a.pp; r++) {
      char *x = rank_text(a.sched, r), *y = rank_text(b.sched, r);
      assert_string_equal(x, y);
      free(x);
      free(y);
    }
    pw_plan_free(&a);
    pw_plan_free(&b);
  }
}

static void test_plan_placement(void **st) {
  (void)st;
  pw_plan a, b;
  pw_err err;
  json_t *j = gpt_job(4, 4, 1, "1f1b", "");
  assert_int_equal(plan_of(json_deep_copy(j), &a, &err), 0);
  json_object_set_new(json_object_get(j, "mesh"), "placement", json_pack("[i,i,i,i]", 3, 2, 1, 0));
  assert_int_equal(plan_of(json_deep_copy(j), &b, &err), 0);
  /* the same plan on renamed ranks: same step time, rank 3 - r as busy as r
   * and as large */
  assert_true(a.sim->makespan == b.sim->makespan);
  for (int r = 0; r < 4; r++) {
    assert_true(a.sim->busy[r] == b.sim->busy[3 - r]);
    /* (snapshots excepted: each rank holds the rank before it's, a ring of ranks) */
    assert_int_equal(a.mem[r].total - a.mem[r].snapshots, b.mem[3 - r].total - b.mem[3 - r].snapshots);
    assert_int_equal(b.sched->stage_to_rank[r], 3 - r);
  }
  pw_plan_free(&a);
  pw_plan_free(&b);
  /* an array of another length than the plan's stages */
  json_object_set_new(json_object_get(j, "mesh"), "placement", json_pack("[i,i]", 1, 0));
  assert_int_equal(plan_of(j, &b, &err), PW_ESPEC);
  assert_err(&err, "mesh.placement", "lists 2 stages, but the plan has 4");
}

/* ---- stage_boundary hints --------------------------------------------- */

/* A layers list: linear, relu, [boundary], linear, relu, [boundary],
 * linear, mse; hints as given (0 = none). */
static json_t *layers_job(int h1, int h2, const char *partition, int pp) {
  char b1[40] = "{}", b2[40] = "{}", extra[256] = "";
  if (h1) snprintf(b1, sizeof b1, "{'stage':%d}", h1);
  if (h2) snprintf(b2, sizeof b2, "{'stage':%d}", h2);
  if (partition) snprintf(extra, sizeof extra, ",'partition':%s", partition);
  char buf[1024];
  snprintf(buf, sizeof buf,
           "{'name':'t','model':{'input':{'kind':'features','dim':3},'layers':[{'type':'linear','out':8},"
           "{'type':'relu'},{'stage_boundary':%s},{'type':'linear','out':8},{'type':'relu'},{'stage_boundary':%s},"
           "{'type':'linear','out':2},{'type':'mse'}]},'mesh':{'pp':%d},'schedule':{'name':'gpipe','microbatches':2},"
           "'train':{'steps':1,'batch_size':2},'data':{'kind':'regression'}%s}",
           b1, b2, pp, extra);
  for (char *p = buf; *p; p++)
    if (*p == '\'') *p = '"';
  json_t *j = json_loads(buf, 0, NULL);
  if (!j) fail_msg("bad test JSON %s", buf);
  return j;
}

static void test_hints(void **st) {
  (void)st;
  pw_job job;
  pw_plan p;
  pw_err err;
  /* markers: the i-th marker must say i + 1, checked by the spec */
  assert_int_equal(parse(layers_job(1, 2, NULL, 3), &job, &err), 0);
  json_t *canon = pw_job_to_json(&job);
  json_t *l2 = json_array_get(json_object_get(json_object_get(canon, "model"), "layers"), 2);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(l2, "stage_boundary"), "stage")), 1);
  json_decref(canon);
  assert_int_equal(pw_plan_build(&job, NULL, &p, &err), 0);
  pw_plan_free(&p);
  pw_job_free(&job);
  assert_int_equal(parse(layers_job(1, 3, NULL, 3), &job, &err), PW_ESPEC);
  assert_err(&err, "model.layers[5].stage_boundary.stage",
             "says stage 3, but with partition.mode markers stage_boundary 1 begins stage 2");
  /* the form */
  json_t *j = layers_job(0, 0, NULL, 3);
  json_t *sb = json_object_get(json_array_get(json_object_get(json_object_get(j, "model"), "layers"), 2),
                               "stage_boundary");
  json_object_set_new(sb, "stgae", json_integer(1));
  assert_int_equal(parse(j, &job, &err), PW_ESPEC);
  assert_err(&err, "model.layers[2].stage_boundary.stgae", "unknown field; did you mean stage?");
  j = layers_job(0, 0, NULL, 3);
  sb = json_object_get(json_array_get(json_object_get(json_object_get(j, "model"), "layers"), 5), "stage_boundary");
  json_object_set_new(sb, "stage", json_integer(0));
  assert_int_equal(parse(j, &job, &err), PW_ESPEC);
  assert_err(&err, "model.layers[5].stage_boundary.stage", ">= 1");

  /* even at pp 2 splits the 5 layers before the loss 3 + 2 (no blocks:
   * by count): stage 1 begins at layers.4, after neither marker */
  const char *even = "{'mode':'even'}";
  assert_int_equal(plan_of(layers_job(0, 0, even, 2), &p, &err), 0);
  assert_string_equal(p.model.layers[p.part.stages[1].layer_lo].name, "layers.4");
  pw_plan_free(&p);
  assert_int_equal(plan_of(layers_job(1, 0, even, 2), &p, &err), PW_ESPEC);
  assert_err(&err, "model.layers[2].stage_boundary.stage",
             "says stage 1 begins at layers.3, but the partition (mode even) begins stage 1 at layers.4 and puts "
             "layers.3 on stage 0");
  /* explicit: a hint that agrees passes; a stage the partition lacks is named */
  const char *expl = "{'stages':[['layers.0','layers.1'],['layers.3','layers.4','layers.6','layers.7']]}";
  assert_int_equal(plan_of(layers_job(1, 0, expl, 2), &p, &err), 0);
  pw_plan_free(&p);
  assert_int_equal(plan_of(layers_job(1, 2, expl, 2), &p, &err), PW_ESPEC);
  assert_err(&err, "model.layers[5].stage_boundary.stage",
             "says stage 2 begins at layers.6, but the partition (mode explicit) has 2 stages (0 .. 1)");
  assert_int_equal(plan_of(layers_job(0, 1, expl, 2), &p, &err), PW_ESPEC);
  assert_err(&err, "model.layers[5].stage_boundary.stage",
             "says stage 1 begins at layers.6, but the partition (mode explicit) begins stage 1 at layers.3 and puts "
             "layers.6 on stage 1");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spec_round_trip), cmocka_unit_test(test_spec_errors),
      cmocka_unit_test(test_explicit_equals_even), cmocka_unit_test(test_explicit_errors),
      cmocka_unit_test(test_relabel),         cmocka_unit_test(test_named),
      cmocka_unit_test(test_plan_placement),  cmocka_unit_test(test_hints),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
