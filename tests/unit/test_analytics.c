/* test_analytics: the model-free figures of GET /v1/schedules/{name}/analytics
 * and `pipewright schedules` — the published closed forms at unit costs, the
 * reference table in cells, agreement with a whole job's plan on uniform
 * stages, and every refusal naming its parameter. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analytics.h"
#include "plan.h"
#include "spec_json.h"

#define EPS 1e-9

static json_t *an(const char *name, int pp, int m, int v, const double *costs) {
  pw_err e = {0};
  char b[600];
  json_t *j = pw_sched_analytics_json(name, pp, m, v, costs, &e);
  if (!j) print_error("%s pp=%d m=%d v=%d: %s\n", name, pp, m, v, pw_err_str(&e, b, sizeof b));
  assert_non_null(j);
  return j;
}

static double num(const json_t *j, const char *key) {
  const json_t *x = json_object_get(j, key);
  assert_true(json_is_number(x));
  return json_number_value(x);
}

static double bubble(const char *name, int pp, int m, int v) {
  json_t *j = an(name, pp, m, v, NULL);
  double b = num(j, "bubble_ratio");
  /* where the library states a closed form, the replay meets it */
  json_t *cf = json_object_get(j, "closed_form");
  if (json_is_object(cf) && fabs(num(cf, "bubble_ratio") - b) > EPS) {
    print_error("%s p=%d m=%d v=%d: simulated %.12f, %s = %.12f\n", name, pp, m, v, b,
                json_string_value(json_object_get(cf, "formula")), num(cf, "bubble_ratio"));
    fail();
  }
  json_decref(j);
  return b;
}

/* ---- closed forms (ZeroBubble unit costs F = I = W = 1, B = 2) ----------- */

static void test_issue_figures(void **st) {
  /* the issue's three, p = 4, m = 8 */
  json_t *j = an("1f1b", 4, 8, 1, NULL);
  assert_true(fabs(num(j, "bubble_ratio") - 3.0 / 11) < EPS);
  assert_true(fabs(num(j, "total_steps") - 33) < EPS); /* (m+p-1)(F+B) */
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "closed_form"), "formula")),
                      "(p-1)/(m+p-1)");
  json_t *ranks = json_object_get(j, "ranks");
  assert_int_equal(json_array_size(ranks), 4);
  for (int k = 0; k < 4; k++) {
    json_t *r = json_array_get(ranks, (size_t)k);
    assert_int_equal(json_integer_value(json_object_get(r, "peak_activations")), 4 - k);
    assert_int_equal(json_integer_value(json_object_get(r, "peak_pending_w")), 0);
    assert_int_equal(json_integer_value(json_object_get(r, "actions")), 16);
    assert_true(fabs(num(r, "busy") - 24) < EPS);
  }
  assert_string_equal(json_string_value(json_object_get(j, "family")), "flat");
  json_decref(j);

  j = an("ZeroBubbleH1", 4, 8, 1, NULL); /* other systems' names resolve */
  assert_string_equal(json_string_value(json_object_get(j, "schedule")), "zb-h1");
  assert_true(fabs(num(j, "bubble_ratio") - 3.0 / 27) < EPS);
  assert_true(fabs(num(j, "total_steps") - 27) < EPS);
  int want_w[4] = {5, 6, 7, 8};
  for (int k = 0; k < 4; k++)
    assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(j, "ranks"), (size_t)k),
                                                        "peak_pending_w")),
                     want_w[k]);
  json_decref(j);

  j = an("interleaved-1f1b", 4, 8, 2, NULL);
  assert_true(fabs(num(j, "bubble_ratio") - 3.0 / 19) < EPS);
  /* stages cost 1/2: the makespan is (vm+p-1)(F+B)/v in a rank's units,
   * (vm+p-1)(F+B) in steps of one stage's unit action */
  assert_true(fabs(num(j, "makespan") - 19 * 3 / 2.0) < EPS);
  assert_true(fabs(num(j, "total_steps") - 19 * 3) < EPS);
  /* a rank's work per microbatch is a flat schedule's */
  assert_true(fabs(num(json_array_get(json_object_get(j, "ranks"), 0), "busy") - 24) < EPS);
  json_t *r0 = json_array_get(json_object_get(j, "ranks"), 0);
  assert_true(fabs(num(r0, "activation_units") - json_integer_value(json_object_get(r0, "peak_activations")) / 2.0) < EPS);
  json_decref(j);
}

static void test_closed_forms(void **st) {
  int pps[] = {1, 2, 3, 4, 8};
  for (int pi = 0; pi < 5; pi++) {
    int p = pps[pi];
    int ms[] = {1, 2, p, 2 * p + 1, 4 * p, 13};
    for (int mi = 0; mi < 6; mi++) {
      int m = ms[mi];
      double flat = (double)(p - 1) / (m + p - 1);
      assert_true(fabs(bubble("gpipe", p, m, 1) - flat) < EPS);
      assert_true(fabs(bubble("1f1b", p, m, 1) - flat) < EPS);
      assert_true(fabs(bubble("eager1f1b", p, m, 1) - flat) < EPS);
      if (m >= p) /* the ZeroBubble form assumes m >= p */
        assert_true(fabs(bubble("zb-h1", p, m, 1) - (double)(p - 1) / (3 * m + p - 1)) < EPS);
    }
    for (int V = 2; V <= 3; V++)
      for (int g = 1; g <= 4; g++) {
        int m = g * p;
        assert_true(fabs(bubble("interleaved-1f1b", p, m, V) - (double)(p - 1) / (V * m + p - 1)) < EPS);
      }
    /* DualPipeV: DeepSeek's bubble (PP/2 - 1)(F&B + B - 3W) with PP = 2p
     * ranks of DualPipe = (p - 1)(3 + 2 - 3) per rank, so the makespan is
     * 2m(F + B) + 2(p - 1) in stage units (each stage half a rank). */
    int dms[] = {2 * p, 2 * p + 1, 4 * p, 20};
    for (int mi = 0; mi < 4; mi++) {
      json_t *j = an("dualpipev", p, dms[mi], 2, NULL);
      assert_true(fabs(num(j, "total_steps") - (6.0 * dms[mi] + 2 * (p - 1))) < EPS);
      json_decref(j);
      bubble("dualpipev", p, dms[mi], 2);
    }
  }
  /* other costs: no closed form is claimed */
  double c[4] = {1, 3, 1.5, 1.5};
  json_t *j = an("1f1b", 4, 8, 1, c);
  assert_true(json_is_null(json_object_get(j, "closed_form")));
  assert_true(fabs(num(j, "total_steps") - 11 * 4) < EPS); /* (m+p-1)(F+B) still */
  json_decref(j);
}

/* docs/schedules.md's reference table counts cells (every action one
 * unit: costs 1,1,1,1): p = 4, m = 8, V = 2 (V = 1 for the flat ones).
 * Where our definitions agree with SpectraX's the numbers match; where
 * they differ the reason is given. */
static void test_reference_cells(void **st) {
  static const double cells[4] = {1, 1, 1, 1};
  struct {
    const char *name;
    int V;
    double steps, bubble;
  } ref[] = {
      {"gpipe", 1, 22, .273},           {"1f1b", 1, 22, .273}, {"eager1f1b", 1, 22, .273},
      {"zb-h1", 1, 27, .111},           {"interleaved-1f1b", 2, 38, .158},
      /* 38, not SpectraX's 44: GPipe over the interleaved layout is the
       * looped breadth-first pipeline, whose fill is p-1 cells over V*m. */
      {"interleaved-gpipe", 2, 38, -1},
      /* 38, not 39: the extra warm-up forward costs memory, not time, when
       * F = B. */
      {"interleaved-1f1b-plus-one", 2, 38, -1},
      /* 38, not 44: we use the interleaved layout (SpectraX: contiguous). */
      {"kimi-k2", 2, 38, -1},
      /* 42, not 34: a fused F+B pair takes F + B here (SpectraX: one cell). */
      {"dualpipev", 2, 42, -1},
  };
  for (size_t i = 0; i < sizeof ref / sizeof *ref; i++) {
    json_t *j = an(ref[i].name, 4, 8, ref[i].V, cells);
    if (fabs(num(j, "total_steps") - ref[i].steps) > EPS)
      print_error("%s: %g steps, want %g\n", ref[i].name, num(j, "total_steps"), ref[i].steps);
    assert_true(fabs(num(j, "total_steps") - ref[i].steps) < EPS);
    if (ref[i].bubble >= 0) assert_true(fabs(num(j, "bubble_ratio") - ref[i].bubble) < 0.0005);
    json_decref(j);
  }
}

static void test_grid(void **st) {
  static const double cells[4] = {1, 1, 1, 1};
  json_t *j = an("1f1b", 2, 2, 1, NULL);
  assert_string_equal(json_string_value(json_object_get(j, "grid")), "r0 | F0 F1 .  .  B0 B0 .  B1 B1\n"
                                                                     "r1 | .  F0 B0 B0 F1 B1 B1 .  .\n");
  json_decref(j);
  j = an("interleaved-1f1b", 2, 2, 2, cells);
  assert_true(strncmp(json_string_value(json_object_get(j, "grid")), "r0 | F0@s0 F1@s0 F0@s2 F1@s2 ", 29) == 0);
  json_decref(j);
}

/* ---- the job-level simulator on uniform stages ------------------------- */

/* pp·v linear layers of equal width, one per stage, each given the same
 * measured time, then the loss (next to nothing, and wide layers make its
 * FLOPs next to nothing too): every stage's F, I and W are then equal (a
 * linear layer's three products have the same FLOPs), as the model-free
 * costs assume. */
static void uniform_job(const char *sched, int pp, int v, int m, pw_job *job) {
  json_t *layers = json_array(), *times = json_array();
  for (int i = 0; i < pp * v; i++) {
    json_array_append_new(layers, json_pack("{s:s, s:i}", "type", "linear", "out", 4096));
    json_array_append_new(times, json_real(100));
  }
  json_array_append_new(layers, json_pack("{s:s}", "type", "mse"));
  json_array_append_new(times, json_real(1e-9));
  json_t *j = json_pack("{s:s, s:{s:{s:s, s:i}, s:o}, s:{s:i, s:i}, s:{s:s, s:i}, s:{s:s, s:o}, s:{s:i, s:i}, s:{s:s}}",
                        "name", "u", "model", "input", "kind", "features", "dim", 4096, "layers", layers, "mesh", "pp",
                        pp, "virtual_stages", v, "schedule", "name", sched, "microbatches", m, "partition", "mode",
                        "balanced", "layer_times", times, "train", "steps", 1, "batch_size", m, "data", "kind",
                        "regression");
  assert_non_null(j);
  pw_err err = {0};
  char eb[600];
  if (pw_job_parse(j, NULL, job, &err)) {
    print_error("%s\n", pw_err_str(&err, eb, sizeof eb));
    fail();
  }
  json_decref(j);
}

static void test_job_agreement(void **st) {
  struct {
    const char *name;
    int pp, v, m;
  } cases[] = {{"gpipe", 4, 1, 8},          {"1f1b", 4, 1, 8},         {"eager1f1b", 3, 1, 5},
               {"zb-h1", 4, 1, 8},          {"interleaved-1f1b", 2, 2, 4}, {"interleaved-gpipe", 2, 2, 3},
               {"kimi-k2", 2, 2, 4},        {"dualpipev", 2, 2, 4}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    pw_job job;
    uniform_job(cases[i].name, cases[i].pp, cases[i].v, cases[i].m, &job);
    pw_plan p;
    pw_err err = {0};
    char eb[600];
    if (pw_plan_build(&job, NULL, &p, &err)) {
      print_error("%s: %s\n", cases[i].name, pw_err_str(&err, eb, sizeof eb));
      fail();
    }
    /* one rank's layers' forward: the model-free unit */
    double unit = p.cost_f[0] * cases[i].v;
    assert_true(fabs(p.cost_i[0] - p.cost_f[0]) < 1e-9 * unit && fabs(p.cost_w[0] - p.cost_f[0]) < 1e-9 * unit);
    json_t *j = an(cases[i].name, cases[i].pp, cases[i].m, cases[i].v, NULL);
    /* The job's own simulation, equal up to what the job adds: 50 us per
     * transfer and the loss layer (1e-9 s, but its FLOPs shift the last
     * stage's F:I:W split by ~0.04 %) over stages of 100 s. */
    const pw_sim_result *r = p.sim;
    double db = fabs(r->bubble_ratio - num(j, "bubble_ratio")),
           dm = fabs(r->makespan / unit - num(j, "makespan")) / num(j, "makespan");
    print_message("%-18s job bubble %.6f, %.4f units; model-free %.6f, %.4f\n", cases[i].name, r->bubble_ratio,
                  r->makespan / unit, num(j, "bubble_ratio"), num(j, "makespan"));
    assert_true(db < 5e-4 && dm < 5e-4);
    /* Exactly: the job's plan (schedule, stage placement) replayed at the
     * model-free costs is the analytics, grid and all. */
    int S = p.S;
    double *c = malloc(sizeof(double) * 4 * (size_t)S);
    assert_non_null(c);
    for (int k = 0; k < 4; k++)
      for (int s = 0; s < S; s++) c[k * S + s] = pw_analytics_unit_costs[k] / cases[i].v;
    pw_sim_costs sc = {c, c + S, c + 2 * S, c + 3 * S, NULL, 0, 0, 0};
    pw_sim_result *u = NULL;
    assert_int_equal(pw_sim_run(p.sched, &sc, &u, NULL), 0);
    assert_true(fabs(u->bubble_ratio - num(j, "bubble_ratio")) < EPS);
    assert_true(fabs(u->makespan - num(j, "makespan")) < EPS);
    char grid[8192];
    assert_true(pw_sched_grid(p.sched, u, grid, sizeof grid) < (int)sizeof grid);
    assert_string_equal(grid, json_string_value(json_object_get(j, "grid")));
    json_t *ranks = json_object_get(j, "ranks");
    for (int k = 0; k < r->pp; k++) {
      json_t *rk = json_array_get(ranks, (size_t)k);
      assert_int_equal(json_integer_value(json_object_get(rk, "peak_activations")), r->peak_act[k]);
      assert_int_equal(json_integer_value(json_object_get(rk, "peak_activations")), u->peak_act[k]);
      assert_int_equal(json_integer_value(json_object_get(rk, "peak_pending_w")), u->peak_pending_w[k]);
      assert_int_equal(json_integer_value(json_object_get(rk, "actions")), r->rank_first[k + 1] - r->rank_first[k]);
    }
    pw_sim_result_free(u);
    free(c);
    json_decref(j);
    pw_plan_free(&p);
    pw_job_free(&job);
  }
}

/* ---- refusals ---------------------------------------------------------- */

static void expect_err(const char *name, int pp, int m, int v, const double *costs, int code, const char *path,
                       const char *msg) {
  pw_err e = {0};
  json_t *j = pw_sched_analytics_json(name, pp, m, v, costs, &e);
  assert_null(j);
  assert_int_equal(e.code, code);
  assert_string_equal(e.path, path);
  if (!strstr(e.msg, msg)) {
    print_error("message \"%s\" lacks \"%s\"\n", e.msg, msg);
    fail();
  }
}

static void test_errors(void **st) {
  expect_err("1f1c", 4, 8, 1, NULL, PW_ENOENT, "name", "unknown schedule \"1f1c\"; did you mean 1f1b?");
  expect_err("nothing-like-it", 4, 8, 1, NULL, PW_ENOENT, "name", "unknown schedule \"nothing-like-it\"");
  expect_err(NULL, 4, 8, 1, NULL, PW_ENOENT, "name", "unknown schedule");
  expect_err("1f1b", 0, 8, 1, NULL, PW_ESPEC, "pp", "must be in 1..64 (got 0)");
  expect_err("1f1b", 65, 8, 1, NULL, PW_ESPEC, "pp", "must be in 1..64 (got 65)");
  expect_err("1f1b", 4, 0, 1, NULL, PW_ESPEC, "m", "must be in 1..1024 (got 0)");
  expect_err("1f1b", 4, 1025, 1, NULL, PW_ESPEC, "m", "must be in 1..1024 (got 1025)");
  expect_err("interleaved-1f1b", 4, 8, 9, NULL, PW_ESPEC, "v", "must be in 1..8 (got 9)");
  expect_err("interleaved-1f1b", 64, 1024, 8, NULL, PW_ESPEC, "m", "pp * v * m = 524288 is too large (limit 16384)");
  /* the schedule's own constraints, by parameter */
  expect_err("1f1b", 4, 8, 2, NULL, PW_ESPEC, "v", "1f1b is a flat schedule and needs virtual_stages = 1 (got 2)");
  expect_err("dualpipev", 4, 5, 2, NULL, PW_ESPEC, "m", "dualpipev needs microbatches >= 2*pp (got 5 < 8)");
  expect_err("interleaved-1f1b", 4, 6, 2, NULL, PW_ESPEC, "m", "needs microbatches to be a multiple of pp");
  expect_err("kimi-k2", 4, 8, 1, NULL, PW_ESPEC, "v", "needs virtual_stages >= 2");
  double zero[4] = {1, 0, 1, 1}, nan4[4] = {1, NAN, 1, 1};
  expect_err("1f1b", 4, 8, 1, zero, PW_EINVAL, "costs", "must be above 0");
  expect_err("1f1b", 4, 8, 1, nan4, PW_EINVAL, "costs", "must be above 0");

  double c[4];
  pw_err e = {0};
  assert_int_equal(pw_analytics_costs_parse("1,2,1,1", c, &e), 0);
  assert_true(c[0] == 1 && c[1] == 2 && c[2] == 1 && c[3] == 1);
  assert_int_equal(pw_analytics_costs_parse("0.5,1e0,.5,.25", c, &e), 0);
  assert_true(c[0] == 0.5 && c[1] == 1 && c[2] == 0.5 && c[3] == 0.25);
  struct {
    const char *text, *msg;
  } bad[] = {
      {"1,2,1", "want four numbers F,B,I,W such as 1,2,1,1 (got 3)"},
      {"1,2,1,1,1", "(more given)"},
      {"1,2,x,1", "(I is \"x\")"},
      {"1,,1,1", "(B is \"\")"},
      {"", "(F is \"\")"},
      {"0,2,1,1", "F must be a number above 0 and at most 1e+06 (got \"0\")"},
      {"1,-2,1,1", "B must be a number above 0"},
      {"1,2,1,1e9", "W must be a number above 0 and at most 1e+06"},
      {"1,2,1.2.3,1", "I must be a number"},
      {"inf,2,1,1", "(F is \"inf\")"},
      {"1 2 1 1", "(F is \"1 2 1 1\")"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(pw_analytics_costs_parse(bad[i].text, c, &e), PW_EINVAL);
    assert_string_equal(e.path, "costs");
    if (!strstr(e.msg, bad[i].msg)) {
      print_error("\"%s\": message \"%s\" lacks \"%s\"\n", bad[i].text, e.msg, bad[i].msg);
      fail();
    }
  }
  assert_int_equal(pw_analytics_costs_parse(NULL, c, &e), PW_EINVAL);
  assert_int_equal(pw_analytics_default_v("gpipe"), 1);
  assert_int_equal(pw_analytics_default_v("Interleaved1F1B"), 2);
  assert_int_equal(pw_analytics_default_v("dualpipev"), 2);
  assert_int_equal(pw_analytics_default_v("nope"), 1);
}

/* The bounds' largest request is built, replayed and rendered. */
static void test_largest(void **st) {
  json_t *j = an("1f1b", PW_ANALYTICS_MAX_PP, PW_ANALYTICS_MAX_PVM / PW_ANALYTICS_MAX_PP, 1, NULL);
  assert_true(fabs(num(j, "bubble_ratio") - 63.0 / (256 + 63)) < EPS);
  json_decref(j);
  j = an("interleaved-gpipe", PW_ANALYTICS_MAX_PP, PW_ANALYTICS_MAX_PVM / (PW_ANALYTICS_MAX_PP * 8), 8, NULL);
  const char *grid = json_string_value(json_object_get(j, "grid"));
  assert_non_null(grid);
  assert_true(strlen(grid) < (8u << 20)); /* at most 4096 cells a row (sim.h) */
  json_decref(j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_issue_figures),   cmocka_unit_test(test_closed_forms),
      cmocka_unit_test(test_reference_cells), cmocka_unit_test(test_grid),
      cmocka_unit_test(test_job_agreement),   cmocka_unit_test(test_errors),
      cmocka_unit_test(test_largest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
