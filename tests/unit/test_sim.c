/* test_sim: the simulator proves every schedule over the sweep,
 * reproduces the memory peaks, reports deadlocks and
 * broken plans, and renders JSON, traces and grids. Every timeline is also
 * re-checked here independently of sim.c's own checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"
#include "sim.h"

#define EPS 1e-9

static pw_sched *build(const char *name, int pp, int V, int m) {
  pw_sched *s = NULL;
  pw_err e = {0};
  char b[512];
  int rc = pw_sched_build(name, pp, V, m, 0, &s, &e);
  if (rc < 0) print_error("%s pp=%d V=%d m=%d: %s\n", name, pp, V, m, pw_err_str(&e, b, sizeof b));
  assert_int_equal(rc, 0);
  return s;
}

static pw_sim_result *run(const pw_sched *s, const pw_sim_costs *c) {
  pw_sim_result *r = NULL;
  pw_err e = {0};
  char b[512];
  int rc = pw_sim_run(s, c, &r, &e);
  if (rc < 0) print_error("%s: %s\n", s->name, pw_err_str(&e, b, sizeof b));
  assert_int_equal(rc, 0);
  return r;
}

/* ---- an independent check of a replayed timeline ---------------------- */

static double dur_of(const pw_sim_costs *c, const pw_action *a) {
  const double *v[4] = {c->f, c->b, c->i, c->w};
  return v[a->kind][a->stage];
}

/* Every (mb, stage) once, deps respected (with transfer time), ranks
 * sequential and in list order, stages on their owners, sums consistent. */
static void verify(const pw_sched *s, const pw_sim_costs *c, const pw_sim_result *r) {
  int S = s->S, m = s->m;
  double *end = malloc(sizeof(double) * 4 * (size_t)S * m);
  int *cnt = calloc(4 * (size_t)S * m, sizeof(int));
  int *unit_first = malloc(sizeof(int) * (size_t)(r->n_events ? r->n_events : 1));
  assert_non_null(end);
  assert_non_null(cnt);
  assert_non_null(unit_first);
  int total = 0;
  for (int k = 0; k < s->pp; k++) total += s->n_actions[k];
  assert_int_equal(r->n_events, total);
  double busy_sum = 0, mk = 0;
  for (int k = 0; k < s->pp; k++) {
    double t = 0, busy = 0;
    assert_int_equal(r->rank_first[k + 1] - r->rank_first[k], s->n_actions[k]);
    for (int e = r->rank_first[k]; e < r->rank_first[k + 1]; e++) {
      const pw_sim_event *ev = &r->events[e];
      assert_int_equal(ev->rank, k);
      assert_int_equal(ev->index, e - r->rank_first[k]);
      const pw_action *pa = &s->actions[k][ev->index];
      assert_true(ev->act.kind == pa->kind && ev->act.flags == pa->flags &&
                  ev->act.mb == pa->mb && ev->act.stage == pa->stage);
      assert_int_equal(s->stage_to_rank[ev->act.stage], k);
      assert_true(ev->start >= t - EPS);
      assert_true(fabs((ev->end - ev->start) - dur_of(c, &ev->act)) < EPS);
      int second = e > r->rank_first[k] && (r->events[e - 1].act.flags & PW_ACTION_FUSED);
      if (second) assert_true(fabs(ev->start - r->events[e - 1].end) < EPS);
      unit_first[e] = second ? e - 1 : e;
      t = ev->end;
      busy += ev->end - ev->start;
      int j = ev->act.stage * m + ev->act.mb;
      cnt[ev->act.kind * S * m + j]++;
      /* a result is available at the end of its unit */
      int last = (ev->act.flags & PW_ACTION_FUSED) ? e + 1 : e;
      end[ev->act.kind * S * m + j] = r->events[last].end;
    }
    assert_true(fabs(busy - r->busy[k]) < 1e-6);
    assert_true(fabs(r->busy[k] + r->idle[k] - r->makespan) < 1e-6);
    busy_sum += busy;
    if (t > mk) mk = t;
  }
  assert_true(fabs(mk - r->makespan) < EPS);
  if (mk > 0) assert_true(fabs(r->bubble_ratio - (1 - busy_sum / (s->pp * mk))) < 1e-9);
  for (int st = 0; st < S; st++)
    for (int k = 0; k < m; k++) {
      int j = st * m + k;
      assert_int_equal(cnt[PW_ACT_F * S * m + j], 1);
      if (s->forward_only) {
        assert_int_equal(cnt[PW_ACT_B * S * m + j] + cnt[PW_ACT_I * S * m + j] + cnt[PW_ACT_W * S * m + j], 0);
      } else if (cnt[PW_ACT_B * S * m + j]) {
        assert_int_equal(cnt[PW_ACT_B * S * m + j], 1);
        assert_int_equal(cnt[PW_ACT_I * S * m + j] + cnt[PW_ACT_W * S * m + j], 0);
      } else {
        assert_int_equal(cnt[PW_ACT_I * S * m + j], 1);
        assert_int_equal(cnt[PW_ACT_W * S * m + j], 1);
      }
    }
  /* dependencies, on unit start times */
  for (int e = 0; e < r->n_events; e++) {
    const pw_sim_event *ev = &r->events[e];
    double start = r->events[unit_first[e]].start;
    int k = ev->act.mb, st = ev->act.stage;
    double need = 0;
    int rk = s->stage_to_rank[st];
#define XFER(from_stage, edge) \
  (s->stage_to_rank[from_stage] == rk ? 0 : c->latency + (c->act_bytes ? c->act_bytes[edge] : 0) / \
   (c->bandwidth > 0 ? c->bandwidth : INFINITY))
    if (ev->act.kind == PW_ACT_F && st > 0) need = end[PW_ACT_F * S * m + (st - 1) * m + k] + XFER(st - 1, st - 1);
    if (ev->act.kind == PW_ACT_B || ev->act.kind == PW_ACT_I) {
      need = end[PW_ACT_F * S * m + st * m + k];
      if (st < S - 1) {
        int j = (st + 1) * m + k;
        double g = cnt[PW_ACT_B * S * m + j] ? end[PW_ACT_B * S * m + j] : end[PW_ACT_I * S * m + j];
        g += XFER(st + 1, st);
        if (g > need) need = g;
      }
    }
    if (ev->act.kind == PW_ACT_W) need = end[PW_ACT_I * S * m + st * m + k];
#undef XFER
    assert_true(start >= need - EPS);
  }
  free(end);
  free(cnt);
  free(unit_first);
}

/* ---- the sweep ------------------------------------------------- */

static int is_flat(const char *n) {
  return !strcmp(n, "gpipe") || !strcmp(n, "1f1b") || !strcmp(n, "eager1f1b") || !strcmp(n, "zb-h1");
}

/* The documented rejection for (name, pp, V, m), or NULL if it must build.
 * Written from schedule.h's rules, not from the implementation. */
static const char *expected_rejection(const char *n, int pp, int V, int m, char *buf) {
  if (is_flat(n)) {
    if (V != 1) {
      sprintf(buf, "mesh.virtual_stages: %s is a flat schedule and needs virtual_stages = 1 (got %d)", n, V);
      return buf;
    }
    return NULL;
  }
  if (!strcmp(n, "dualpipev")) {
    if (V != 2) {
      sprintf(buf, "mesh.virtual_stages: dualpipev holds two stages per rank (the V shape) and needs virtual_stages = 2 (got %d)", V);
      return buf;
    }
    if (m < 2 * pp) {
      sprintf(buf, "schedule.microbatches: dualpipev needs microbatches >= 2*pp (got %d < %d)", m, 2 * pp);
      return buf;
    }
    return NULL;
  }
  if (V < 2) {
    sprintf(buf, "mesh.virtual_stages: %s is an interleaved schedule and needs virtual_stages >= 2 (got %d); with one stage per rank use the flat schedules", n, V);
    return buf;
  }
  if ((!strcmp(n, "interleaved-1f1b") || !strcmp(n, "interleaved-1f1b-plus-one")) && m % pp) {
    sprintf(buf, "schedule.microbatches: %s needs microbatches to be a multiple of pp (got %d %% %d = %d)", n, m, pp, m % pp);
    return buf;
  }
  int rounds = m / pp > 1 ? m / pp : 1;
  if (!strcmp(n, "kimi-k2") && m % rounds) {
    sprintf(buf, "schedule.microbatches: kimi-k2 needs microbatches to be a multiple of its rounds, max(1, microbatches / pp) (got %d %% %d = %d)", m, rounds, m % rounds);
    return buf;
  }
  return NULL;
}

static void fill(double *v, int n, double base, double step) {
  for (int i = 0; i < n; i++) v[i] = base + step * (i % 3);
}

static void test_sweep(void **st) {
  int n;
  const pw_sched_info *in = pw_sched_infos(&n);
  int pps[] = {1, 2, 3, 4, 8}, built = 0, rejected = 0;
  double unit1[16], unit2[16], f[16], b[16], i_[16], w[16], bytes[16];
  for (int k = 0; k < 16; k++) unit1[k] = 1, unit2[k] = 2;
  fill(f, 16, 1.0, 0.25);
  fill(i_, 16, 1.1, 0.5);
  fill(w, 16, 0.7, 0.125);
  for (int k = 0; k < 16; k++) b[k] = i_[k] + w[k];
  fill(bytes, 16, 1000, 500);
  pw_sim_costs unit = {unit1, unit2, unit1, unit1, NULL, 0, 0, 0};
  pw_sim_costs skew = {f, b, i_, w, bytes, 0.3, 4000, 0};
  for (int si = 0; si < n; si++)
    for (int pi = 0; pi < 5; pi++) {
      int pp = pps[pi], ms[4] = {1, pp, 2 * pp + 1, 4 * pp};
      for (int mi = 0; mi < 4; mi++)
        for (int V = 1; V <= 2; V++)
          for (int fwd = 0; fwd <= 1; fwd++) {
            const char *name = in[si].name;
            int m = ms[mi];
            char want[512], got[512];
            const char *rej = expected_rejection(name, pp, V, m, want);
            pw_sched *s = NULL;
            pw_err e = {0};
            int rc = pw_sched_build(name, pp, V, m, fwd, &s, &e);
            if (rej) {
              assert_int_equal(rc, PW_ESPEC);
              assert_null(s);
              assert_string_equal(pw_err_str(&e, got, sizeof got), rej);
              rejected++;
              continue;
            }
            if (rc < 0) print_error("%s pp=%d V=%d m=%d: %s\n", name, pp, V, m, pw_err_str(&e, got, sizeof got));
            assert_int_equal(rc, 0);
            assert_int_equal(s->S, pp * V);
            assert_int_equal(pw_sim_check(s, NULL), 0);
            pw_sim_result *r = run(s, &unit);
            verify(s, &unit, r);
            pw_sim_result_free(r);
            r = run(s, &skew);
            verify(s, &skew, r);
            pw_sim_result_free(r);
            pw_sched_free(s);
            built++;
          }
    }
  /* 9 schedules x 5 pp x 4 m x 2 V x 2 modes */
  assert_int_equal(built + rejected, 720);
  print_message("sweep: %d plans built and proven, %d rejected as documented\n", built, rejected);
  assert_int_equal(built, 300); /* counted by hand from the rules */
}

/* ---- memory peaks (ZeroBubble unit costs F = I = W = 1, B = 2) ---------
 * The closed-form bubbles and the reference table in cells are held by
 * test_analytics.c, through the analytics the API and the CLI show. */

static double bubble(const char *name, int pp, int V, int m, pw_sim_result **keep) {
  pw_sched *s = build(name, pp, V, m);
  pw_sim_result *r = run(s, NULL);
  double b = r->bubble_ratio;
  pw_sched_free(s);
  if (keep) *keep = r;
  else pw_sim_result_free(r);
  return b;
}

static void test_peaks(void **st) {
  int pps[] = {1, 2, 3, 4, 8};
  for (int pi = 0; pi < 5; pi++) {
    int p = pps[pi];
    int ms[] = {1, p, 2 * p + 1, 4 * p};
    for (int mi = 0; mi < 4; mi++) {
      int m = ms[mi];
      pw_sim_result *r;
      bubble("1f1b", p, 1, m, &r);
      for (int k = 0; k < p; k++) {
        int want = p - k < m ? p - k : m; /* p - r once m >= p */
        assert_int_equal(r->peak_act[k], want);
        assert_int_equal(r->peak_pending_w[k], 0);
      }
      pw_sim_result_free(r);
      bubble("gpipe", p, 1, m, &r);
      for (int k = 0; k < p; k++) assert_int_equal(r->peak_act[k], m);
      pw_sim_result_free(r);
      /* zb-h1 keeps 1f1b's activations (counted until I) ... */
      bubble("zb-h1", p, 1, m, &r);
      for (int k = 0; k < p; k++) assert_int_equal(r->peak_act[k], p - k < m ? p - k : m);
      pw_sim_result_free(r);
    }
  }
  /* ... but its pending W's hold memory: at p = 4, m = 8 the last rank
   * defers all 8 of them, rank 0 five. */
  pw_sim_result *r;
  bubble("zb-h1", 4, 1, 8, &r);
  int want_w[4] = {5, 6, 7, 8};
  for (int k = 0; k < 4; k++) {
    assert_int_equal(r->peak_pending_w[k], want_w[k]);
    assert_int_equal(r->peak_held[k], 8);
  }
  pw_sim_result_free(r);
  /* DualPipeV (stage activations, each half a rank's layers): 2p + 1. */
  bubble("dualpipev", 4, 2, 16, &r);
  for (int k = 0; k < 4; k++) assert_int_equal(r->peak_act[k], 9);
  pw_sim_result_free(r);
}

/* ---- failures ---------------------------------------------------------- */

static pw_sched *custom(int pp, int S, int m, const int *map, const char **ranks, int fwd) {
  pw_sched *s;
  assert_int_equal(pw_sched_new(pp, S / pp, S, m, map, fwd, &s, NULL), 0);
  for (int r = 0; r < pp; r++) assert_int_equal(pw_sched_set_rank_text(s, r, ranks[r], NULL), 0);
  return s;
}

static void expect_fail(pw_sched *s, int code, const char *const *parts) {
  pw_sim_result *r = (pw_sim_result *)1;
  pw_err e = {0};
  int rc = pw_sim_run(s, NULL, &r, &e);
  assert_int_equal(rc, code);
  assert_null(r);
  for (int i = 0; parts[i]; i++)
    if (!strstr(e.msg, parts[i])) {
      print_error("message \"%s\" lacks \"%s\"\n", e.msg, parts[i]);
      fail();
    }
  if (code == PW_ESCHEDULE) assert_int_equal(pw_sim_check(s, NULL), PW_ESCHEDULE);
  pw_sched_free(s);
}

static void test_deadlock(void **st) {
  /* Rank 0 waits for rank 1's backward, rank 1 for rank 0's forward: the
   * message is the cycle, with where each awaited input sits. */
  const char *a[] = {"F0@s0 B0@s0 F1@s0 B1@s0", "F0@s1 F1@s1 B0@s1 B1@s1"};
  const char *want_a[] = {"deadlock: rank 0 waits at B0@s0 for B0@s1 (rank 1) which comes after F1@s1, rank 1 waits at "
                          "F1@s1 for F1@s0 (rank 0) which comes after B0@s0",
                          NULL};
  expect_fail(custom(2, 2, 2, NULL, a, 0), PW_EDEADLOCK, want_a);
  /* The V layout: each rank waits for the other's backward. */
  int vmap[4] = {0, 1, 1, 0};
  const char *b[] = {"F0@s0 F0@s3 B0@s0 B0@s3", "F0@s1 F0@s2 B0@s2 B0@s1"};
  const char *want_b[] = {"deadlock: rank 0 waits at B0@s0 for B0@s1 (rank 1) which comes after B0@s2, rank 1 waits at "
                          "B0@s2 for B0@s3 (rank 0) which comes after B0@s0",
                          NULL};
  expect_fail(custom(2, 4, 1, vmap, b, 0), PW_EDEADLOCK, want_b);
  /* A rank waiting on itself is the cycle; rank 0 waits behind it. */
  const char *c[] = {"F0@s0 B0@s0", "B0@s1 F0@s1"};
  const char *want_c[] = {
      "deadlock: rank 1 waits at B0@s1 for F0@s1 (rank 1) which comes after B0@s1; 1 other rank waits behind them", NULL};
  expect_fail(custom(2, 2, 1, NULL, c, 0), PW_EDEADLOCK, want_c);
  const char *d3[] = {"F0@s0 B0@s0", "F0@s1 B0@s1", "B0@s2 F0@s2"};
  const char *want_d3[] = {
      "deadlock: rank 2 waits at B0@s2 for F0@s2 (rank 2) which comes after B0@s2; 2 other ranks wait behind them", NULL};
  expect_fail(custom(3, 3, 1, NULL, d3, 0), PW_EDEADLOCK, want_d3);
  /* A fused pair whose second half waits holds back its first half's
   * result too (the unit starts only when both inputs are there). */
  const char *d[] = {"F0@s0 F1@s0+B0@s0 B1@s0", "F0@s1 F1@s1 B0@s1 B1@s1"};
  const char *want_d[] = {"deadlock: rank 0 waits at B0@s0 for B0@s1 (rank 1) which comes after F1@s1, rank 1 waits at "
                          "F1@s1 for F1@s0 (rank 0) which runs fused with B0@s0",
                          NULL};
  expect_fail(custom(2, 2, 2, NULL, d, 0), PW_EDEADLOCK, want_d);
  /* Three ranks in a cycle, found from rank 0 and printed from it. */
  const char *e[] = {"F0@s0 B0@s0", "B0@s1 F0@s1", "F0@s2 B0@s2"};
  const char *want_e[] = {"deadlock: rank 1 waits at B0@s1 for F0@s1 (rank 1) which comes after B0@s1", NULL};
  expect_fail(custom(3, 3, 1, NULL, e, 0), PW_EDEADLOCK, want_e);
}

static void test_broken_plans(void **st) {
  struct {
    const char *r0, *r1;
    int fwd;
    const char *want;
  } cases[] = {
      {"F0@s0 F0@s1 B0@s1 B0@s0", "", 0, "rank 0 #1: F0@s1 is on stage 1, which belongs to rank 1"},
      {"F0@s0 F0@s0 B0@s0", "F0@s1 B0@s1", 0, "F0@s0 appears twice (rank 0 #0 and rank 0 #1)"},
      {"B0@s0", "F0@s1 B0@s1", 0, "F0@s0 is missing: stage 0 (rank 0) has no forward of microbatch 0; F0@s1 on rank 1 needs it"},
      {"F0@s0", "F0@s1 B0@s1", 0, "B0@s0 (or I0@s0 and W0@s0) is missing: stage 0 (rank 0) has no backward"},
      {"F0@s0 B0@s0 W0@s0", "F0@s1 B0@s1", 0, "has both a full backward and split ones"},
      {"F0@s0 I0@s0", "F0@s1 B0@s1", 0, "W0@s0 is missing: rank 0 has I0@s0 without it"},
      {"F0@s0 W0@s0 I0@s0", "F0@s1 B0@s1", 0, "rank 0: W0@s0 (#1) comes before I0@s0 (#2)"},
      {"F0@s0", "F0@s1 B0@s1", 1, "rank 1 #1: B0@s1 in a forward-only plan"},
      {"F0@s0 F1@s0", "F0@s1 F2@s1", 1, "rank 1 #1: F2@s1: microbatch outside 0..1"},
      {"F0@s0 F0@s2", "F0@s1", 1, "rank 0 #1: F0@s2: stage outside 0..1"},
      {"F0@s0 B0@s0+F1@s0 B1@s0", "F0@s1 B0@s1", 0, "a fused pair must be an F then a B or I (got B0@s0+F1@s0)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *ranks[2] = {cases[i].r0, cases[i].r1};
    int m = strstr(cases[i].want, "outside 0..1") || strstr(cases[i].want, "fused") ? 2 : 1;
    const char *parts[] = {cases[i].want, NULL};
    expect_fail(custom(2, 2, m, NULL, ranks, cases[i].fwd), PW_ESCHEDULE, parts);
  }
  /* a fused flag on the last action (only possible through push) */
  pw_sched *s;
  assert_int_equal(pw_sched_new(1, 1, 1, 1, NULL, 1, &s, NULL), 0);
  pw_action a = {PW_ACT_F, PW_ACTION_FUSED, 0, 0};
  assert_int_equal(pw_sched_push(s, 0, a), 0);
  const char *want[] = {"is fused with the next action, but it is the last", NULL};
  expect_fail(s, PW_ESCHEDULE, want);
}

/* ---- costs and links --------------------------------------------------- */

static void test_links(void **st) {
  /* 1f1b, p = 2, m = 2; a transfer takes 0.5 + 50 / 100 = 1. By hand:
   * r0 F0 0-1 F1 1-2; r1 F0 2-3 B0 3-5 F1 5-6 B1 6-8; r0 B0 6-8 B1 9-11. */
  pw_sched *s = build("1f1b", 2, 1, 2);
  double bytes[1] = {50};
  pw_sim_costs c = {NULL, NULL, NULL, NULL, bytes, 0.5, 100, 0};
  pw_sim_result *r = run(s, &c);
  assert_true(fabs(r->makespan - 11) < EPS);
  double want0[4][2] = {{0, 1}, {1, 2}, {6, 8}, {9, 11}};
  for (int k = 0; k < 4; k++) {
    assert_true(fabs(r->events[k].start - want0[k][0]) < EPS);
    assert_true(fabs(r->events[k].end - want0[k][1]) < EPS);
  }
  assert_true(fabs(r->link_bytes[0 * 2 + 1] - 100) < EPS);
  assert_true(fabs(r->link_bytes[1 * 2 + 0] - 100) < EPS);
  assert_int_equal(r->link_transfers[0 * 2 + 1], 2);
  assert_int_equal(r->link_transfers[1 * 2 + 0], 2);
  assert_int_equal(r->link_transfers[0], 0);
  pw_sim_result_free(r);
  pw_sched_free(s);
  /* Same-rank transfers are free: DualPipeV on one rank never pays. */
  s = build("dualpipev", 1, 2, 4);
  double b2[1] = {1e9};
  pw_sim_costs slow = {NULL, NULL, NULL, NULL, b2, 10, 1, 0};
  r = run(s, &slow);
  assert_true(fabs(r->makespan - 24) < EPS);
  assert_int_equal(r->link_transfers[0], 0);
  pw_sim_result_free(r);
  pw_sched_free(s);
}

static void test_costs(void **st) {
  pw_sched *s = build("gpipe", 1, 1, 2);
  /* b defaults to i + w; i and w to b / 2 */
  double f[1] = {3}, i_[1] = {1.5}, w[1] = {0.25}, b[1] = {5};
  pw_sim_costs c1 = {f, NULL, i_, w, NULL, 0, 0, 0};
  pw_sim_result *r = run(s, &c1);
  assert_true(fabs(r->makespan - 2 * (3 + 1.75)) < EPS);
  pw_sim_result_free(r);
  pw_sim_costs c2 = {NULL, b, NULL, NULL, NULL, 0, 0, 0};
  r = run(s, &c2);
  assert_true(fabs(r->makespan - 2 * (1 + 5)) < EPS);
  pw_sim_result_free(r);
  pw_sched_free(s);
  s = build("zb-h1", 1, 1, 1);
  r = run(s, &c2); /* I = W = 2.5 */
  assert_true(fabs(r->makespan - 6) < EPS);
  pw_sim_result_free(r);
  pw_sched_free(s);

  s = build("1f1b", 2, 1, 2);
  double neg[2] = {1, -1};
  pw_sim_costs bad = {neg, NULL, NULL, NULL, NULL, 0, 0, 0};
  pw_err e = {0};
  assert_int_equal(pw_sim_run(s, &bad, &r, &e), PW_EINVAL);
  assert_string_equal(e.path, "costs.f[1]");
  pw_sim_costs badlat = {NULL, NULL, NULL, NULL, NULL, -1, 0, 0};
  assert_int_equal(pw_sim_run(s, &badlat, &r, &e), PW_EINVAL);
  pw_sched_free(s);
}

/* ---- rendering --------------------------------------------------------- */

static void test_json_and_trace(void **st) {
  pw_sched *s = build("dualpipev", 2, 2, 4);
  double bytes[3] = {10, 20, 30};
  pw_sim_costs c = {NULL, NULL, NULL, NULL, bytes, 0, 0, 0};
  pw_sim_result *r = run(s, &c);
  json_t *j = pw_sim_result_json(r);
  assert_string_equal(json_string_value(json_object_get(j, "schedule")), "dualpipev");
  assert_true(fabs(json_real_value(json_object_get(j, "makespan")) - r->makespan) < EPS);
  json_t *ranks = json_object_get(j, "ranks");
  assert_int_equal(json_array_size(ranks), 2);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(ranks, 1), "peak_activations")),
                   r->peak_act[1]);
  json_t *tl = json_object_get(j, "timeline");
  assert_int_equal(json_array_size(json_array_get(tl, 0)), (size_t)s->n_actions[0]);
  json_t *first = json_array_get(json_array_get(tl, 0), 0);
  assert_string_equal(json_string_value(json_object_get(first, "action")), "F0@s0");
  /* links: 0 -> 1 carries s0 -> s1 activations and s3 -> s2 gradients */
  json_t *links = json_object_get(j, "links");
  assert_int_equal(json_array_size(links), 2);
  json_t *l0 = json_array_get(links, 0);
  assert_int_equal(json_integer_value(json_object_get(l0, "src")), 0);
  assert_int_equal(json_integer_value(json_object_get(l0, "transfers")), 8);
  assert_true(fabs(json_real_value(json_object_get(l0, "bytes")) - 4 * (10 + 30)) < EPS);
  int fused = 0;
  for (size_t k = 0; k < json_array_size(json_array_get(tl, 0)); k++)
    fused += json_is_true(json_object_get(json_array_get(json_array_get(tl, 0), k), "fused"));
  assert_int_equal(fused, 3);
  json_decref(j);

  json_t *t = pw_sim_trace_json(r);
  assert_string_equal(json_string_value(json_object_get(t, "displayTimeUnit")), "ms");
  json_t *ev = json_object_get(t, "traceEvents");
  assert_int_equal(json_array_size(ev), (size_t)r->n_events + 2);
  json_t *x = json_array_get(ev, 2); /* after two thread_name records */
  assert_string_equal(json_string_value(json_object_get(x, "ph")), "X");
  assert_string_equal(json_string_value(json_object_get(x, "name")), "F0@s0");
  assert_true(fabs(json_real_value(json_object_get(x, "dur")) - 1e6) < 1e-3);
  assert_int_equal(json_integer_value(json_object_get(x, "tid")), 0);
  char *dump = json_dumps(t, JSON_COMPACT);
  assert_non_null(strstr(dump, "\"thread_name\""));
  free(dump);
  json_decref(t);
  pw_sim_result_free(r);
  pw_sched_free(s);
}

/* The data-parallel exchange: each rank's starts when its own last action
 * ends (not at the makespan), takes its cost, and the step's end is the
 * latest; the schedule's makespan and bubble stay what they were. */
static void test_dp_action(void **st) {
  (void)st;
  pw_sched *s = build("1f1b", 2, 1, 4);
  pw_sim_result *r = run(s, NULL);
  double makespan = r->makespan, bubble = r->bubble_ratio, last[2] = {0, 0}, sec[2] = {0.5, 3};
  json_t *j = pw_sim_result_json(r);
  assert_null(json_object_get(j, "step_makespan"));
  json_decref(j);
  for (int k = 0; k < 2; k++)
    for (int e = r->rank_first[k]; e < r->rank_first[k + 1]; e++) last[k] = fmax(last[k], r->events[e].end);
  assert_true(last[1] < last[0]); /* 1f1b: the last stage is done first */
  pw_err err = {0};
  double bad[2] = {0.5, -1};
  assert_int_equal(pw_sim_add_dp(r, bad, &err), PW_EINVAL);
  assert_string_equal(err.path, "dp_seconds");
  assert_null(r->dp_start);
  assert_int_equal(pw_sim_add_dp(r, sec, &err), 0);
  for (int k = 0; k < 2; k++) {
    assert_true(fabs(r->dp_start[k] - last[k]) < EPS);
    assert_true(fabs(r->dp_end[k] - last[k] - sec[k]) < EPS);
  }
  assert_true(fabs(r->step_makespan - fmax(last[0] + sec[0], last[1] + sec[1])) < EPS);
  assert_true(r->step_makespan > makespan);
  assert_true(fabs(r->makespan - makespan) < EPS && fabs(r->bubble_ratio - bubble) < EPS);

  j = pw_sim_result_json(r);
  assert_true(fabs(json_real_value(json_object_get(j, "step_makespan")) - r->step_makespan) < EPS);
  for (int k = 0; k < 2; k++) {
    json_t *row = json_array_get(json_object_get(j, "timeline"), (size_t)k);
    assert_int_equal(json_array_size(row), (size_t)s->n_actions[k] + 1);
    json_t *dp = json_array_get(row, json_array_size(row) - 1);
    assert_string_equal(json_string_value(json_object_get(dp, "action")), "DP");
    assert_true(fabs(json_real_value(json_object_get(dp, "start")) - last[k]) < EPS);
    assert_true(fabs(json_real_value(json_object_get(dp, "end")) - last[k] - sec[k]) < EPS);
  }
  json_decref(j);
  json_t *t = pw_sim_trace_json(r), *ev = json_object_get(t, "traceEvents");
  assert_int_equal(json_array_size(ev), (size_t)r->n_events + 2 + 2);
  json_t *x = json_array_get(ev, json_array_size(ev) - 1);
  assert_string_equal(json_string_value(json_object_get(x, "name")), "DP");
  assert_int_equal(json_integer_value(json_object_get(x, "tid")), 1);
  assert_true(fabs(json_real_value(json_object_get(x, "dur")) - 3e6) < 1e-3);
  json_decref(t);
  pw_sim_result_free(r);
  pw_sched_free(s);
}

static void test_grid(void **st) {
  pw_sched *s = build("1f1b", 2, 1, 2);
  char buf[512];
  const char *want = "r0 | F0 F1 .  .  B0 B0 .  B1 B1\n"
                     "r1 | .  F0 B0 B0 F1 B1 B1 .  .\n";
  int n = pw_sched_grid(s, NULL, buf, sizeof buf);
  assert_int_equal(n, (int)strlen(want));
  assert_string_equal(buf, want);
  char small[8];
  assert_int_equal(pw_sched_grid(s, NULL, small, sizeof small), n);
  assert_string_equal(small, "r0 | F0");
  assert_int_equal(pw_sched_grid(s, NULL, NULL, 0), n);
  pw_sched_free(s);
  /* V > 1 shows stages; the cell is the smallest duration (0.5 here). */
  s = build("interleaved-1f1b", 2, 2, 2);
  double half[4] = {0.5, 0.5, 0.5, 0.5};
  pw_sim_costs c = {half, NULL, NULL, NULL, NULL, 0, 0, 0};
  pw_sim_result *r = run(s, &c);
  n = pw_sched_grid(s, r, buf, sizeof buf);
  assert_true(n > 0 && n < (int)sizeof buf);
  assert_true(strncmp(buf, "r0 | F0@s0 F1@s0 F0@s2 F1@s2 ", 29) == 0);
  assert_non_null(strstr(buf, "B0@s3 B0@s3 B0@s3 B0@s3")); /* B = 2 = four cells */
  pw_sim_result_free(r);
  pw_sched_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sweep),          cmocka_unit_test(test_peaks),
      cmocka_unit_test(test_deadlock),       cmocka_unit_test(test_broken_plans),
      cmocka_unit_test(test_links),          cmocka_unit_test(test_costs),
      cmocka_unit_test(test_json_and_trace), cmocka_unit_test(test_grid),
      cmocka_unit_test(test_dp_action),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
