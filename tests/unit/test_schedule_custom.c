/* test_schedule_custom: custom schedules (schedule_custom.c) — every
 * built-in schedule exported as per-rank lists and as PyTorch's CSV reads
 * back as the same plan; broken lists are refused naming the rank, the
 * action and what is wrong (a stage on two ranks, a missing or doubled
 * action, a deadlock's cycle); the planner takes a spec's custom lists and
 * holds them to the mesh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan.h"
#include "schedule.h"
#include "sim.h"
#include "spec_json.h"

static void assert_same_plan(const pw_sched *a, const pw_sched *b) {
  assert_int_equal(a->pp, b->pp);
  assert_int_equal(a->V, b->V);
  assert_int_equal(a->S, b->S);
  assert_int_equal(a->m, b->m);
  assert_int_equal(a->forward_only, b->forward_only);
  assert_memory_equal(a->stage_to_rank, b->stage_to_rank, sizeof(int) * (size_t)a->S);
  for (int r = 0; r < a->pp; r++) {
    assert_int_equal(a->n_actions[r], b->n_actions[r]);
    for (int i = 0; i < a->n_actions[r]; i++) { /* field by field: pw_action has padding */
      const pw_action *x = &a->actions[r][i], *y = &b->actions[r][i];
      if (x->kind != y->kind || x->flags != y->flags || x->mb != y->mb || x->stage != y->stage)
        fail_msg("%s: rank %d #%d differs", a->name, r, i);
    }
  }
}

/* The rank strings of {"ranks": [...]} (pointers into j). */
static void ranks_of(const json_t *j, const char **out, int pp) {
  json_t *ranks = json_object_get(j, "ranks");
  assert_int_equal(json_array_size(ranks), (size_t)pp);
  for (int r = 0; r < pp; r++) out[r] = json_string_value(json_array_get(ranks, (size_t)r));
}

/* Every built-in at (pp, m) with the V it needs, training and forward:
 * exported lists and CSV read back as the very same plan. */
static void test_builtins_round_trip(void **st) {
  (void)st;
  static const int shapes[][2] = {{2, 4}, {4, 8}, {3, 6}};
  int n = 0, checked = 0;
  const pw_sched_info *infos = pw_sched_infos(&n);
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
    for (int i = 0; i < n; i++)
      for (int fwd = 0; fwd <= 1; fwd++) {
        int pp = shapes[k][0], m = shapes[k][1], V = infos[i].min_v;
        pw_sched *ref, *back, *back_csv, *back_fwd;
        pw_err err = {0};
        if (pw_sched_build(infos[i].name, pp, V, m, fwd, &ref, &err))
          fail_msg("%s pp %d m %d: %s: %s", infos[i].name, pp, m, err.path, err.msg);
        json_t *j = pw_sched_custom_json(ref);
        const char *ranks[8];
        ranks_of(j, ranks, pp);
        if (pw_sched_from_ranks(ranks, pp, m, fwd, &back, &err))
          fail_msg("%s pp %d m %d fwd %d: %s: %s", infos[i].name, pp, m, fwd, err.path, err.msg);
        assert_string_equal(back->name, "custom");
        assert_same_plan(ref, back);
        /* through PyTorch's CSV */
        char *csv = pw_sched_csv_format(ref), **rows;
        int n_rows;
        assert_int_equal(pw_sched_csv_parse(csv, &rows, &n_rows, &err), 0);
        assert_int_equal(n_rows, pp);
        for (int r = 0; r < pp; r++) assert_string_equal(rows[r], ranks[r]);
        assert_int_equal(pw_sched_from_ranks((const char *const *)rows, pp, m, fwd, &back_csv, &err), 0);
        assert_same_plan(ref, back_csv);
        /* a training plan's lists run forward-only as the built-in's forward plan */
        if (!fwd) {
          pw_sched *ref_fwd;
          assert_int_equal(pw_sched_build(infos[i].name, pp, V, m, 1, &ref_fwd, &err), 0);
          assert_int_equal(pw_sched_from_ranks(ranks, pp, m, 1, &back_fwd, &err), 0);
          assert_same_plan(ref_fwd, back_fwd);
          pw_sched_free(ref_fwd);
          pw_sched_free(back_fwd);
        }
        pw_sched_ranks_free(rows, n_rows);
        free(csv);
        json_decref(j);
        pw_sched_free(ref);
        pw_sched_free(back);
        pw_sched_free(back_csv);
        checked++;
      }
  assert_int_equal(checked, 3 * 9 * 2);
}

/* pw_sched_from_ranks must fail with code and path schedule.custom.ranks,
 * its message holding want. */
static void expect_refused(int pp, int m, const char *const *ranks, int code, const char *want) {
  pw_sched *s = (pw_sched *)1;
  pw_err err = {0};
  int rc = pw_sched_from_ranks(ranks, pp, m, 0, &s, &err);
  if (rc != code || strcmp(err.path, "schedule.custom.ranks") != 0 || !strstr(err.msg, want))
    fail_msg("want %d \"schedule.custom.ranks: ...%s...\", got %d \"%s: %s\"", code, want, rc, err.path, err.msg);
  assert_null(s);
}

static void test_refused(void **st) {
  (void)st;
  /* a list that does not parse: the rank and the entry */
  const char *bad_text[] = {"F0@s0 B0@s0", "F0@s1 X0@s1"};
  expect_refused(2, 1, bad_text, PW_EFORMAT, "rank 1: entry 1: bad action \"X0@s1\"");
  /* an action on a stage another rank holds */
  const char *other[] = {"F0@s0 B0@s0", "F0@s1 B0@s1 B0@s0"};
  expect_refused(2, 1, other, PW_ESCHEDULE,
                 "rank 1 #2: B0@s0 is on stage 0, which belongs to rank 0 (F0@s0 is there)");
  /* a stage nobody holds, and stages that are not a multiple of pp */
  const char *gap[] = {"F0@s0 B0@s0", "F0@s2 B0@s2"};
  expect_refused(2, 1, gap, PW_ESCHEDULE, "stage 1 has no actions on any rank");
  const char *far[] = {"F0@s0 B0@s0", "F0@s1000000 B0@s1"};
  expect_refused(2, 1, far, PW_ESCHEDULE, "stage 2 has no actions on any rank");
  const char *three[] = {"F0@s0 F0@s2 B0@s2 B0@s0", "F0@s1 B0@s1"};
  expect_refused(2, 1, three, PW_ESCHEDULE, "the lists hold 3 stages, which is not a multiple of mesh.pp = 2");
  /* microbatches beyond schedule.microbatches */
  const char *mb[] = {"F0@s0 F1@s0 B0@s0 B1@s0", "F0@s1 F1@s1 B0@s1 B1@s1"};
  expect_refused(2, 1, mb, PW_ESCHEDULE, "rank 0 #1: F1@s0: microbatch outside 0..0 (schedule.microbatches is 1)");
  /* a missing action is named, with its rank */
  const char *missing[] = {"F0@s0 F1@s0 B0@s0 B1@s0", "F0@s1 F1@s1 B0@s1"};
  expect_refused(2, 2, missing, PW_ESCHEDULE,
                 "B1@s1 (or I1@s1 and W1@s1) is missing: stage 1 (rank 1) has no backward of microbatch 1; "
                 "B1@s0 on rank 0 needs it");
  const char *no_w[] = {"F0@s0 I0@s0", "F0@s1 B0@s1"};
  expect_refused(2, 1, no_w, PW_ESCHEDULE, "W0@s0 is missing: rank 0 has I0@s0 without it");
  /* twice */
  const char *twice[] = {"F0@s0 B0@s0 B0@s0", "F0@s1 B0@s1"};
  expect_refused(2, 1, twice, PW_ESCHEDULE, "B0@s0 appears twice (rank 0 #1 and rank 0 #2)");
  /* a deadlock names the ranks that wait on each other */
  const char *dead[] = {"F0@s0 B0@s0 F1@s0 B1@s0", "F0@s1 F1@s1 B0@s1 B1@s1"};
  expect_refused(2, 2, dead, PW_EDEADLOCK,
                 "deadlock: rank 0 waits at B0@s0 for B0@s1 (rank 1) which comes after F1@s1, rank 1 waits at F1@s1 "
                 "for F1@s0 (rank 0) which comes after B0@s0");
  /* far fewer actions than stages x microbatches: said before any table is sized */
  const char *sparse[] = {"F0@s0 B0@s0 F1048575@s0 B1048575@s0 F0@s2 B0@s2", "F0@s1 B0@s1 F0@s3 B0@s3"};
  expect_refused(2, 1 << 20, sparse, PW_ESCHEDULE,
                 "the lists hold 10 actions, fewer than the 4194304 forwards alone of 4 stages x 1048576 microbatches");
  /* fewer microbatches than schedule.microbatches */
  const char *few[] = {"F0@s0 B0@s0", "F0@s1 B0@s1"};
  expect_refused(2, 4, few, PW_ESCHEDULE, "the lists name microbatches 0..0, but schedule.microbatches is 4");
  /* nothing at all */
  const char *empty[] = {"", " "};
  expect_refused(2, 1, empty, PW_ESCHEDULE, "the lists hold no actions");
}

/* PyTorch's CSV: idle cells and communication actions are skipped, the
 * overlap action is a fused pair, CRLF and quotes are fine; bad cells are
 * named by row and cell. */
static void test_csv(void **st) {
  (void)st;
  char **rows;
  int n;
  pw_err err = {0};
  const char *text = "0F0,,0F1,0SEND_F0,\"0B0\",(0F2;3B1)OVERLAP_F_B, 0W1 \r\n1RECV_F0,1F0,1I0\r\n\n";
  assert_int_equal(pw_sched_csv_parse(text, &rows, &n, &err), 0);
  assert_int_equal(n, 3);
  assert_string_equal(rows[0], "F0@s0 F1@s0 B0@s0 F2@s0+B1@s3 W1@s0");
  assert_string_equal(rows[1], "F0@s1 I0@s1");
  assert_string_equal(rows[2], ""); /* a rank with no actions */
  pw_sched_ranks_free(rows, n);
  /* a last row without its newline */
  assert_int_equal(pw_sched_csv_parse("0F0,0B0\n1F0,1B0", &rows, &n, &err), 0);
  assert_int_equal(n, 2);
  assert_string_equal(rows[1], "F0@s1 B0@s1");
  pw_sched_ranks_free(rows, n);
  static const struct {
    const char *text, *want;
  } bad[] = {
      {"0F0,F0\n", "row 1 (rank 0), cell 2 \"F0\": expected a stage number first"},
      {"0F0\n1X0\n", "row 2 (rank 1), cell 1 \"1X0\": unknown kind"},
      {"0F\n", "a compute action needs a microbatch number"},
      {"0F0x\n", "unexpected character after the microbatch"},
      {"(0F0;1B0)OVERLAP\n", "a parenthesised cell must be"},
      {"(0B0;1F0)OVERLAP_F_B\n", "an OVERLAP_F_B pair must be an F then a B or I"},
      {"", "no rows"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rows = (char **)1;
    int rc = pw_sched_csv_parse(bad[i].text, &rows, &n, &err);
    if (rc != PW_EFORMAT || strcmp(err.path, "csv") || !strstr(err.msg, bad[i].want))
      fail_msg("\"%s\": want \"%s\", got %d \"%s: %s\"", bad[i].text, bad[i].want, rc, err.path, err.msg);
    assert_null(rows);
  }
  /* a fused pair goes out as the overlap action */
  pw_sched *s;
  assert_int_equal(pw_sched_build("dualpipev", 2, 2, 4, 0, &s, &err), 0);
  char *csv = pw_sched_csv_format(s);
  assert_non_null(strstr(csv, ")OVERLAP_F_B"));
  assert_non_null(strstr(csv, "0F0,"));
  free(csv);
  pw_sched_free(s);
}

/* The planner builds a job's custom lists and holds them to the mesh; the
 * canonical spec keeps them. */
static void test_plan_custom(void **st) {
  (void)st;
  const char *spec =
      "{\"model\":{\"template\":\"gpt\",\"seq_len\":8,\"d_model\":16,\"n_layers\":4,\"n_heads\":2},"
      "\"mesh\":{\"pp\":2,\"virtual_stages\":%d},\"schedule\":{\"microbatches\":2,\"custom\":{\"ranks\":["
      "\"F0@s0 F1@s0 F0@s2 F1@s2 B0@s2 B1@s2 B0@s0 B1@s0\",\"F0@s1 F1@s1 F0@s3 B0@s3 F1@s3 B1@s3 B0@s1 B1@s1\"]}},"
      "\"train\":{\"batch_size\":4},\"data\":{\"kind\":\"copy\"}}";
  char text[1024];
  for (int V = 1; V <= 2; V++) {
    snprintf(text, sizeof text, spec, V);
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    assert_non_null(j);
    pw_job job;
    pw_err err = {0};
    assert_int_equal(pw_job_parse(j, NULL, &job, &err), 0);
    assert_string_equal(job.schedule.name, "custom");
    assert_int_equal(job.schedule.n_custom_ranks, 2);
    pw_plan p;
    int rc = pw_plan_build(&job, NULL, &p, &err);
    if (V == 1) {
      assert_int_equal(rc, PW_ESPEC);
      assert_string_equal(err.path, "mesh.virtual_stages");
      assert_non_null(
          strstr(err.msg, "the custom lists hold 4 stages over 2 ranks, so virtual_stages must be 2 (got 1)"));
    } else {
      if (rc) fail_msg("%s: %s", err.path, err.msg);
      assert_string_equal(p.sched->name, "custom");
      assert_int_equal(p.S, 4);
      int want_map[4] = {0, 1, 0, 1};
      assert_memory_equal(p.sched->stage_to_rank, want_map, sizeof want_map);
      /* the plan's lists are the spec's */
      json_t *pj = pw_plan_json(&job, &p);
      json_t *ranks = json_object_get(json_object_get(pj, "plan"), "ranks");
      assert_string_equal(json_string_value(json_array_get(ranks, 1)), job.schedule.custom_ranks[1]);
      json_decref(pj);
      /* --compare adds the custom row */
      json_t *cmp = pw_plan_compare_json(&job);
      json_t *rows = json_object_get(cmp, "rows");
      json_t *last = json_array_get(rows, json_array_size(rows) - 1);
      assert_string_equal(json_string_value(json_object_get(last, "schedule")), "custom");
      assert_true(json_is_true(json_object_get(last, "ok")));
      json_decref(cmp);
      /* and the canonical spec keeps the lists */
      json_t *canon = pw_job_to_json(&job);
      json_t *sc = json_object_get(canon, "schedule");
      assert_string_equal(json_string_value(json_object_get(sc, "name")), "custom");
      assert_true(json_equal(json_object_get(sc, "custom"),
                             json_object_get(json_object_get(j, "schedule"), "custom")));
      json_decref(canon);
      pw_plan_free(&p);
    }
    pw_job_free(&job);
    json_decref(j);
  }
  /* a deadlocking custom schedule is refused by the planner with the cycle */
  const char *dead =
      "{\"model\":{\"template\":\"gpt\",\"seq_len\":8,\"d_model\":16,\"n_layers\":2,\"n_heads\":2},"
      "\"mesh\":{\"pp\":2},\"schedule\":{\"microbatches\":2,\"custom\":{\"ranks\":["
      "\"F0@s0 B0@s0 F1@s0 B1@s0\",\"F0@s1 F1@s1 B0@s1 B1@s1\"]}},"
      "\"train\":{\"batch_size\":4},\"data\":{\"kind\":\"copy\"}}";
  json_error_t je;
  json_t *j = json_loads(dead, 0, &je);
  pw_job job;
  pw_err err = {0};
  assert_int_equal(pw_job_parse(j, NULL, &job, &err), 0);
  pw_plan p;
  assert_int_equal(pw_plan_build(&job, NULL, &p, &err), PW_EDEADLOCK);
  assert_string_equal(err.path, "schedule.custom.ranks");
  assert_non_null(strstr(err.msg, "rank 0 waits at B0@s0 for B0@s1 (rank 1)"));
  /* --schedule still overrides the custom lists */
  assert_int_equal(pw_plan_build(&job, "1f1b", &p, &err), 0);
  assert_string_equal(p.sched->name, "1f1b");
  pw_plan_free(&p);
  pw_job_free(&job);
  json_decref(j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_builtins_round_trip),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_csv),
      cmocka_unit_test(test_plan_custom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
