/* test_schedule: the action text form, the catalogue, schedule constraints
 * and the exact lists some generators must emit (checked against lists
 * derived by hand from the published definitions). Replay and timing are in
 * test_sim.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"
#include "spec.h"

static char *rank_text(const pw_sched *s, int r) {
  int n = pw_actions_format(s->actions[r], s->n_actions[r], NULL, 0);
  char *b = malloc((size_t)n + 1);
  assert_non_null(b);
  assert_int_equal(pw_actions_format(s->actions[r], s->n_actions[r], b, (size_t)n + 1), n);
  return b;
}

static void assert_rank(const pw_sched *s, int r, const char *want) {
  char *got = rank_text(s, r);
  if (strcmp(got, want) != 0) {
    print_error("%s rank %d\n got: %s\nwant: %s\n", s->name, r, got, want);
    free(got);
    fail();
  }
  free(got);
}

static pw_sched *build(const char *name, int pp, int V, int m, int fwd) {
  pw_sched *s = NULL;
  pw_err e = {0};
  char b[512];
  int rc = pw_sched_build(name, pp, V, m, fwd, &s, &e);
  if (rc < 0) print_error("%s: %s\n", name, pw_err_str(&e, b, sizeof b));
  assert_int_equal(rc, 0);
  return s;
}

static void test_action_text(void **st) {
  pw_action a = {PW_ACT_I, 0, 12, 3};
  char b[64];
  assert_int_equal(pw_action_format(&a, b, sizeof b), 6);
  assert_string_equal(b, "I12@s3");
  const char *kinds = "FBIW";
  for (int k = 0; k < 4; k++) {
    pw_action x = {(uint8_t)k, 0, 7, 11}, y;
    pw_action_format(&x, b, sizeof b);
    assert_int_equal(b[0], kinds[k]);
    const char *end;
    assert_int_equal(pw_action_parse(b, &y, &end, NULL), 0);
    assert_int_equal(y.kind, k);
    assert_int_equal(y.mb, 7);
    assert_int_equal(y.stage, 11);
    assert_int_equal(*end, '\0');
  }
  const char *bad[] = {"X1@s0", "F@s0", "F1s0", "F1@s", "F1@0", "", "f1@s0", "F-1@s0"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    pw_err e = {0};
    pw_action y;
    assert_int_equal(pw_action_parse(bad[i], &y, NULL, &e), PW_EFORMAT);
    assert_int_equal(e.code, PW_EFORMAT);
    assert_non_null(strstr(e.msg, "bad action"));
  }
}

static void test_list_round_trip(void **st) {
  const char *text = "F0@s0 F1@s0+B0@s7 I3@s2 W3@s2 B10@s0";
  pw_action *v;
  int n;
  assert_int_equal(pw_actions_parse("  F0@s0\tF1@s0+B0@s7\n I3@s2 W3@s2  B10@s0 ", &v, &n, NULL), 0);
  assert_int_equal(n, 6);
  assert_int_equal(v[1].flags, PW_ACTION_FUSED);
  assert_int_equal(v[2].flags, 0);
  assert_int_equal(v[2].kind, PW_ACT_B);
  char buf[128];
  assert_int_equal(pw_actions_format(v, n, buf, sizeof buf), (int)strlen(text));
  assert_string_equal(buf, text);
  /* Truncation keeps whole entries and reports the full length. */
  char small[14];
  assert_int_equal(pw_actions_format(v, n, small, sizeof small), (int)strlen(text));
  assert_string_equal(small, "F0@s0 F1@s0");
  free(v);

  pw_err e = {0};
  assert_int_equal(pw_actions_parse("F0@s0 F1@s0+", &v, &n, &e), PW_EFORMAT);
  assert_non_null(strstr(e.msg, "'+'"));
  assert_int_equal(pw_actions_parse("F0@s0 F1@s0x", &v, &n, &e), PW_EFORMAT);
  assert_non_null(strstr(e.msg, "entry 1"));
  assert_int_equal(pw_actions_parse("F0@s0 Q1@s0", &v, &n, &e), PW_EFORMAT);
  assert_non_null(strstr(e.msg, "entry 1: bad action"));
  assert_int_equal(pw_actions_parse("   ", &v, &n, &e), 0);
  assert_int_equal(n, 0);
  assert_null(v);
}

static void test_catalogue(void **st) {
  static const char *names[] = {"gpipe",           "1f1b",
                                "eager1f1b",       "zb-h1",
                                "interleaved-1f1b", "interleaved-gpipe",
                                "interleaved-1f1b-plus-one", "kimi-k2",
                                "dualpipev"};
  int n;
  const pw_sched_info *in = pw_sched_infos(&n);
  assert_int_equal(n, 9);
  for (int i = 0; i < n; i++) {
    assert_string_equal(in[i].name, names[i]);
    assert_ptr_equal(pw_sched_info_find(names[i]), &in[i]);
    assert_true(strlen(in[i].description) > 40);
    json_t *j = pw_sched_info_json(&in[i]);
    assert_string_equal(json_string_value(json_object_get(j, "name")), names[i]);
    assert_true(json_is_string(json_object_get(j, "constraints")));
    assert_true(json_is_object(json_object_get(j, "virtual_stages")));
    json_decref(j);
  }
  /* the same names, in the same order, as spec.c's canonical list */
  assert_int_equal(pw_n_schedule_names, n);
  for (int i = 0; i < n; i++) assert_string_equal(pw_schedule_names[i], in[i].name);
  assert_null(pw_sched_info_find("2f2b"));
  assert_int_equal(pw_sched_info_find("zb-h1")->split_backward, 1);
  assert_int_equal(pw_sched_info_find("dualpipev")->max_v, 2);
  pw_err e = {0};
  pw_sched *s = (pw_sched *)1;
  assert_int_equal(pw_sched_build("2f2b", 2, 1, 2, 0, &s, &e), PW_ESPEC);
  assert_null(s);
  assert_string_equal(e.path, "schedule.name");
}

/* The documented rejections, message for message. */
static void test_constraints(void **st) {
  struct {
    const char *name;
    int pp, V, m;
    const char *want;
  } cases[] = {
      {"dualpipev", 4, 2, 5, "schedule.microbatches: dualpipev needs microbatches >= 2*pp (got 5 < 8)"},
      {"dualpipev", 4, 1, 8,
       "mesh.virtual_stages: dualpipev holds two stages per rank (the V shape) and needs "
       "virtual_stages = 2 (got 1)"},
      {"1f1b", 4, 2, 8,
       "mesh.virtual_stages: 1f1b is a flat schedule and needs virtual_stages = 1 (got 2)"},
      {"zb-h1", 2, 3, 8,
       "mesh.virtual_stages: zb-h1 is a flat schedule and needs virtual_stages = 1 (got 3)"},
      {"interleaved-1f1b", 4, 2, 9,
       "schedule.microbatches: interleaved-1f1b needs microbatches to be a multiple of pp (got 9 "
       "% 4 = 1)"},
      {"interleaved-gpipe", 4, 1, 8,
       "mesh.virtual_stages: interleaved-gpipe is an interleaved schedule and needs "
       "virtual_stages >= 2 (got 1); with one stage per rank use the flat schedules"},
      {"kimi-k2", 4, 2, 9,
       "schedule.microbatches: kimi-k2 needs microbatches to be a multiple of its rounds, max(1, "
       "microbatches / pp) (got 9 % 2 = 1)"},
      {"gpipe", 0, 1, 8, "mesh.pp: must be in 1..4096 (got 0)"},
      {"gpipe", 2, 1, 0, "schedule.microbatches: must be >= 1 (got 0)"},
      {"gpipe", 2, 0, 4, "mesh.virtual_stages: must be in 1..64 (got 0)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    pw_err e = {0};
    char b[512];
    pw_sched *s = NULL;
    assert_int_equal(pw_sched_build(cases[i].name, cases[i].pp, cases[i].V, cases[i].m, 0, &s, &e),
                     PW_ESPEC);
    assert_null(s);
    assert_string_equal(pw_err_str(&e, b, sizeof b), cases[i].want);
    assert_int_equal(pw_sched_check(cases[i].name, cases[i].pp, cases[i].V, cases[i].m, 1, NULL),
                     PW_ESPEC);
  }
  /* kimi-k2 takes m = 3 with pp = 4 (one round of 3) and m = 10 (2 rounds of 5). */
  assert_int_equal(pw_sched_check("kimi-k2", 4, 2, 3, 0, NULL), 0);
  assert_int_equal(pw_sched_check("kimi-k2", 4, 2, 10, 0, NULL), 0);
}

static void test_layouts(void **st) {
  pw_sched *s = build("1f1b", 3, 1, 4, 0);
  assert_int_equal(s->S, 3);
  for (int i = 0; i < 3; i++) assert_int_equal(s->stage_to_rank[i], i);
  pw_sched_free(s);
  s = build("interleaved-1f1b", 3, 3, 6, 0);
  assert_int_equal(s->S, 9);
  for (int i = 0; i < 9; i++) assert_int_equal(s->stage_to_rank[i], i % 3);
  pw_sched_free(s);
  s = build("kimi-k2", 2, 2, 4, 0);
  for (int i = 0; i < 4; i++) assert_int_equal(s->stage_to_rank[i], i % 2);
  pw_sched_free(s);
  s = build("dualpipev", 4, 2, 8, 0);
  assert_int_equal(s->S, 8);
  int want[8] = {0, 1, 2, 3, 3, 2, 1, 0};
  for (int i = 0; i < 8; i++) assert_int_equal(s->stage_to_rank[i], want[i]);
  pw_sched_free(s);
}

static void test_flat_lists(void **st) {
  pw_sched *s = build("gpipe", 2, 1, 3, 0);
  assert_rank(s, 0, "F0@s0 F1@s0 F2@s0 B0@s0 B1@s0 B2@s0");
  assert_rank(s, 1, "F0@s1 F1@s1 F2@s1 B0@s1 B1@s1 B2@s1");
  pw_sched_free(s);
  s = build("1f1b", 3, 1, 4, 0); /* warm-up p-r-1 = 2, 1, 0 */
  assert_rank(s, 0, "F0@s0 F1@s0 F2@s0 B0@s0 F3@s0 B1@s0 B2@s0 B3@s0");
  assert_rank(s, 1, "F0@s1 F1@s1 B0@s1 F2@s1 B1@s1 F3@s1 B2@s1 B3@s1");
  assert_rank(s, 2, "F0@s2 B0@s2 F1@s2 B1@s2 F2@s2 B2@s2 F3@s2 B3@s2");
  pw_sched_free(s);
  s = build("1f1b", 4, 1, 2, 0); /* warm-up capped at m */
  assert_rank(s, 0, "F0@s0 F1@s0 B0@s0 B1@s0");
  assert_rank(s, 2, "F0@s2 F1@s2 B0@s2 B1@s2");
  assert_rank(s, 3, "F0@s3 B0@s3 F1@s3 B1@s3");
  pw_sched_free(s);
  s = build("eager1f1b", 3, 1, 6, 0); /* warm-up 2(p-r)-1 = 5, 3, 1 */
  assert_rank(s, 0, "F0@s0 F1@s0 F2@s0 F3@s0 F4@s0 F5@s0 B0@s0 B1@s0 B2@s0 B3@s0 B4@s0 B5@s0");
  assert_rank(s, 1, "F0@s1 F1@s1 F2@s1 F3@s1 B0@s1 F4@s1 B1@s1 F5@s1 B2@s1 B3@s1 B4@s1 B5@s1");
  assert_rank(s, 2, "F0@s2 F1@s2 B0@s2 F2@s2 B1@s2 F3@s2 B2@s2 F4@s2 B3@s2 F5@s2 B4@s2 B5@s2");
  pw_sched_free(s);
}

/* zb-h1 at p = 4, m = 8: W's fill the first idle slot after their I (a
 * unit-cost replay places them), the rest drain at the end. */
static void test_zbh1_lists(void **st) {
  pw_sched *s = build("zb-h1", 4, 1, 8, 0);
  assert_rank(s, 0,
              "F0@s0 F1@s0 F2@s0 F3@s0 I0@s0 F4@s0 I1@s0 F5@s0 I2@s0 F6@s0 I3@s0 F7@s0 I4@s0 "
              "W0@s0 I5@s0 W1@s0 I6@s0 W2@s0 I7@s0 W3@s0 W4@s0 W5@s0 W6@s0 W7@s0");
  assert_rank(s, 3,
              "F0@s3 I0@s3 F1@s3 I1@s3 F2@s3 I2@s3 F3@s3 I3@s3 F4@s3 I4@s3 F5@s3 I5@s3 F6@s3 "
              "I6@s3 F7@s3 I7@s3 W0@s3 W1@s3 W2@s3 W3@s3 W4@s3 W5@s3 W6@s3 W7@s3");
  int c[4];
  pw_sched_count(s, c);
  assert_int_equal(c[PW_ACT_F], 32);
  assert_int_equal(c[PW_ACT_B], 0);
  assert_int_equal(c[PW_ACT_I], 32);
  assert_int_equal(c[PW_ACT_W], 32);
  pw_sched_free(s);
}

/* Megatron interleaved, p = 2, V = 2, m = 4: rank 0 warms up with
 * 2(p-1) + (V-1)p = 4 forwards, rank 1 with 2; groups of p microbatches
 * per stage; backwards start from the last local stage. */
static void test_interleaved_lists(void **st) {
  pw_sched *s = build("interleaved-1f1b", 2, 2, 4, 0);
  assert_rank(s, 0,
              "F0@s0 F1@s0 F0@s2 F1@s2 F2@s0 B0@s2 F3@s0 B1@s2 F2@s2 B0@s0 F3@s2 B1@s0 B2@s2 "
              "B3@s2 B2@s0 B3@s0");
  assert_rank(s, 1,
              "F0@s1 F1@s1 F0@s3 B0@s3 F1@s3 B1@s3 F2@s1 B0@s1 F3@s1 B1@s1 F2@s3 B2@s3 F3@s3 "
              "B3@s3 B2@s1 B3@s1");
  pw_sched_free(s);
  s = build("interleaved-1f1b-plus-one", 2, 2, 4, 0); /* one more warm-up forward */
  assert_rank(s, 1,
              "F0@s1 F1@s1 F0@s3 F1@s3 B0@s3 F2@s1 B1@s3 F3@s1 B0@s1 F2@s3 B1@s1 F3@s3 B2@s3 "
              "B3@s3 B2@s1 B3@s1");
  pw_sched_free(s);
  s = build("kimi-k2", 2, 2, 4, 0); /* V = 2 more warm-up forwards than Megatron */
  assert_rank(s, 1,
              "F0@s1 F1@s1 F0@s3 F1@s3 F2@s1 B0@s3 F3@s1 B1@s3 F2@s3 B0@s1 F3@s3 B1@s1 B2@s3 "
              "B3@s3 B2@s1 B3@s1");
  pw_sched_free(s);
  s = build("interleaved-gpipe", 2, 2, 2, 0);
  assert_rank(s, 0, "F0@s0 F1@s0 F0@s2 F1@s2 B0@s2 B1@s2 B0@s0 B1@s0");
  assert_rank(s, 1, "F0@s1 F1@s1 F0@s3 F1@s3 B0@s3 B1@s3 B0@s1 B1@s1");
  pw_sched_free(s);
}

/* DualPipeV p = 2, m = 4, derived by hand from dualpipev.py's eight steps
 * (see schedule_dualpipev.c). Rank 0 holds s0, s3; rank 1 holds s1, s2.
 * Rank 1 is the last rank: its first step-4 pair runs unfused. */
static void test_dualpipev_lists(void **st) {
  pw_sched *s = build("dualpipev", 2, 2, 4, 0);
  assert_rank(s, 0,
              "F0@s0 F1@s0 F2@s0 F0@s3 I0@s3 W0@s3 F1@s3 F3@s0+B1@s3 F2@s3+B0@s0 B2@s3 "
              "F3@s3+B1@s0 B3@s3 I2@s0 W2@s0 I3@s0 W3@s0");
  assert_rank(s, 1,
              "F0@s1 F0@s2 F1@s1 F1@s2 F2@s1 B0@s2 F2@s2+B0@s1 F3@s1+B1@s2 F3@s2+B1@s1 B2@s2 "
              "B2@s1 I3@s2 I3@s1 W3@s2 W3@s1");
  pw_sched_free(s);
  /* Per rank: m F and m backward (B or I) on each of its two stages, one W
   * per I; fused pairs are always F then B. */
  s = build("dualpipev", 4, 2, 11, 0);
  for (int r = 0; r < 4; r++) {
    int f = 0, bi = 0, i = 0, w = 0;
    for (int k = 0; k < s->n_actions[r]; k++) {
      pw_action a = s->actions[r][k];
      f += a.kind == PW_ACT_F;
      bi += a.kind == PW_ACT_B || a.kind == PW_ACT_I;
      i += a.kind == PW_ACT_I;
      w += a.kind == PW_ACT_W;
      if (a.flags & PW_ACTION_FUSED) {
        assert_int_equal(a.kind, PW_ACT_F);
        assert_int_equal(s->actions[r][k + 1].kind, PW_ACT_B);
      }
    }
    assert_int_equal(f, 22);
    assert_int_equal(bi, 22);
    assert_int_equal(i, w);
    /* sections 3, 6 and 7 split: (p-r-1) + (r+1) + (p-r-1) I's */
    assert_int_equal(i, 2 * (4 - r - 1) + r + 1);
  }
  pw_sched_free(s);
}

static void test_forward_only(void **st) {
  int n;
  const pw_sched_info *in = pw_sched_infos(&n);
  for (int i = 0; i < n; i++) {
    int V = in[i].min_v, pp = 3, m = 6;
    pw_sched *s = build(in[i].name, pp, V, m, 1);
    assert_int_equal(s->forward_only, 1);
    int c[4];
    pw_sched_count(s, c);
    assert_int_equal(c[PW_ACT_F], m * s->S);
    assert_int_equal(c[PW_ACT_B] + c[PW_ACT_I] + c[PW_ACT_W], 0);
    for (int r = 0; r < pp; r++)
      for (int k = 0; k < s->n_actions[r]; k++) assert_int_equal(s->actions[r][k].flags, 0);
    pw_sched_free(s);
  }
  pw_sched *s = build("1f1b", 2, 1, 3, 1);
  assert_rank(s, 1, "F0@s1 F1@s1 F2@s1");
  pw_sched_free(s);
}

static void test_json_round_trip(void **st) {
  pw_sched *s = build("dualpipev", 3, 2, 7, 0);
  json_t *j = pw_sched_to_json(s);
  assert_string_equal(json_string_value(json_object_get(j, "name")), "dualpipev");
  assert_int_equal(json_integer_value(json_object_get(j, "stages")), 6);
  pw_sched *t = NULL;
  pw_err e = {0};
  assert_int_equal(pw_sched_from_json(j, &t, &e), 0);
  assert_string_equal(t->name, "dualpipev");
  assert_int_equal(t->pp, 3);
  assert_int_equal(t->S, 6);
  assert_int_equal(t->m, 7);
  for (int i = 0; i < 6; i++) assert_int_equal(t->stage_to_rank[i], s->stage_to_rank[i]);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(t->n_actions[r], s->n_actions[r]);
    for (int k = 0; k < s->n_actions[r]; k++) {
      pw_action a = t->actions[r][k], b = s->actions[r][k];
      assert_true(a.kind == b.kind && a.flags == b.flags && a.mb == b.mb && a.stage == b.stage);
    }
  }
  pw_sched_free(t);
  /* A broken list names its rank. */
  json_array_set_new(json_object_get(j, "ranks"), 1, json_string("F0@s1 Z"));
  assert_int_equal(pw_sched_from_json(j, &t, &e), PW_ESPEC);
  assert_string_equal(e.path, "ranks[1]");
  json_object_set_new(j, "stage_to_rank", json_pack("[i,i,i,i,i,i]", 0, 1, 2, 2, 1, 7));
  assert_int_equal(pw_sched_from_json(j, &t, &e), PW_ESPEC);
  assert_string_equal(e.path, "stage_to_rank");
  json_decref(j);
  pw_sched_free(s);
}

static void test_custom(void **st) {
  pw_sched *s;
  pw_err e = {0};
  int map[3] = {0, 1, 5};
  assert_int_equal(pw_sched_new(2, 1, 3, 2, map, 0, &s, &e), PW_EINVAL);
  assert_int_equal(pw_sched_new(2, 1, 2, 2, NULL, 0, &s, &e), 0);
  assert_string_equal(s->name, "custom");
  assert_int_equal(pw_sched_set_rank_text(s, 1, "F0@s1 B0@s1", &e), 0);
  assert_int_equal(s->n_actions[1], 2);
  assert_int_equal(pw_sched_set_rank_text(s, 2, "F0@s1", &e), PW_EINVAL);
  pw_action a = {PW_ACT_F, 0, 0, 0};
  assert_int_equal(pw_sched_push(s, 0, a), 0);
  assert_int_equal(pw_sched_push(s, 7, a), PW_EINVAL);
  assert_int_equal(s->n_actions[0], 1);
  pw_sched_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_action_text),     cmocka_unit_test(test_list_round_trip),
      cmocka_unit_test(test_catalogue),       cmocka_unit_test(test_constraints),
      cmocka_unit_test(test_layouts),         cmocka_unit_test(test_flat_lists),
      cmocka_unit_test(test_zbh1_lists),      cmocka_unit_test(test_interleaved_lists),
      cmocka_unit_test(test_dualpipev_lists), cmocka_unit_test(test_forward_only),
      cmocka_unit_test(test_json_round_trip), cmocka_unit_test(test_custom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
