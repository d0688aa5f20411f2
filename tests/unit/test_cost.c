/* test_cost: the calibration profile (common/plan/cost.h) — its parser's named
 * errors, interpolation between microbatch sizes, a plan costed with a
 * synthetic profile (an exactly predictable step), and --auto's choice
 * (cost_auto.h) following the profile. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "cost.h"
#include "cost_auto.h"
#include "plan.h"
#include "spec_json.h"

static const char *MLP = "\"template\": \"mlp\", \"in_dim\": 12, \"hidden_dim\": 40, \"n_layers\": 4,"
                         " \"out_dim\": 5, \"activation\": \"gelu\", \"loss\": \"mse\"";

static void job_of(const char *sched, int pp, int m, int batch, pw_job *job) {
  char buf[1024];
  snprintf(buf, sizeof buf,
           "{\"name\": \"t\", \"model\": {%s}, \"mesh\": {\"pp\": %d, \"dp\": 1, \"virtual_stages\": 1},"
           " \"schedule\": {\"name\": \"%s\", \"microbatches\": %d}, \"partition\": {\"mode\": \"even\"},"
           " \"train\": {\"steps\": 1, \"batch_size\": %d, \"optimizer\": {\"name\": \"adamw\", \"lr\": 1e-3}},"
           " \"data\": {\"kind\": \"regression\"}}",
           MLP, pp, sched, m, batch);
  json_t *j = json_loads(buf, 0, NULL);
  assert_non_null(j);
  pw_err err = {0};
  assert_int_equal(pw_job_parse(j, NULL, job, &err), 0);
  json_decref(j);
}

/* A profile for job's model: every layer's F, I, W at each size = base +
 * per_seq x size (seconds). */
static json_t *profile_for(const pw_job *job, const int *mb, int n_mb, double base, double per_seq) {
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&job->model, &m, &err), 0);
  json_t *layers = json_array(), *mbs = json_array();
  for (int k = 0; k < n_mb; k++) json_array_append_new(mbs, json_integer(mb[k]));
  for (int l = 0; l < m.n_layers; l++) {
    json_t *f = json_array();
    for (int k = 0; k < n_mb; k++) json_array_append_new(f, json_real(base + per_seq * mb[k]));
    json_array_append_new(layers, json_pack("{s:s, s:O, s:O, s:o}", "name", m.layers[l].name, "f", f, "i", f, "w", f));
  }
  pw_model_free(&m);
  return json_pack("{s:i, s:s, s:i, s:o, s:o, s:{s:f, s:f}, s:{s:f, s:f}}", "version", 1, "host", "t", "cores", 64,
                   "mb_sizes", mbs, "layers", layers, "step", "per_param_s", 1e-9, "fixed_s", 2e-3, "link",
                   "latency_s", 0.0, "bandwidth_Bps", 0.0);
}

/* text parses to an error at path. */
static void bad(const char *text, const char *path, const char *words) {
  json_t *j = json_loads(text, 0, NULL);
  assert_non_null(j);
  pw_cost_profile p;
  pw_err err = {0};
  assert_int_equal(pw_cost_parse(j, &p, &err), PW_EFORMAT);
  if (strcmp(err.path, path) || !strstr(err.msg, words))
    print_error("got %s: %s (wanted %s: ...%s...)\n", err.path, err.msg, path, words);
  assert_string_equal(err.path, path);
  assert_non_null(strstr(err.msg, words));
  json_decref(j);
}

#define L1 "\"layers\": [{\"name\": \"a\", \"f\": [1], \"i\": [1], \"w\": [1]}]"

static void test_parse_errors(void **st) {
  (void)st;
  bad("[]", "profile", "object");
  bad("{\"version\": 3}", "profile.version", "must be 1 or 2");
  bad("{\"version\": 2, \"mb_sizes\": [1]," L1 ", \"sharing\": {\"speed\": [1, 1.5]}}", "profile.sharing.speed[1]",
      "(0, 1]");
  bad("{\"version\": 2, \"mb_sizes\": [1]," L1 ", \"sharing\": {\"speed\": []}}", "profile.sharing.speed", "1..64");
  bad("{\"version\": 2, \"mb_sizes\": [1]," L1 ", \"sharing\": []}", "profile.sharing", "object");
  bad("{\"version\": 2, \"mb_sizes\": [1]," L1 ", \"sharing\": {\"speed\": [1, 1], \"wake_s\": [0]}}",
      "profile.sharing.wake_s", "2 numbers");
  bad("{\"version\": 2, \"mb_sizes\": [1]," L1 ", \"link\": {\"wake_s\": -1}}", "profile.link.wake_s", ">= 0");
  bad("{\"version\": 1, \"mb_sizes\": []," L1 "}", "profile.mb_sizes", "1..16");
  bad("{\"version\": 1, \"mb_sizes\": [2, 2]," L1 "}", "profile.mb_sizes[1]", "ascend");
  bad("{\"version\": 1, \"mb_sizes\": [0]," L1 "}", "profile.mb_sizes[0]", "integer in 1..");
  bad("{\"version\": 1, \"mb_sizes\": [1, 2]," L1 "}", "profile.layers[0].f", "2 numbers");
  bad("{\"version\": 1, \"mb_sizes\": [1], \"layers\": [{\"name\": \"a\", \"f\": [1], \"i\": [-1], \"w\": [1]}]}",
      "profile.layers[0].i[0]", ">= 0");
  bad("{\"version\": 1, \"mb_sizes\": [1], \"layers\": [{\"name\": \"a\", \"f\": [1], \"i\": [1], \"w\": [1]},"
      " {\"name\": \"a\", \"f\": [1], \"i\": [1], \"w\": [1]}]}",
      "profile.layers[1].name", "twice");
  bad("{\"version\": 1, \"mb_sizes\": [1]," L1 ", \"link\": {\"latency_s\": \"x\"}}", "profile.link.latency_s", ">= 0");
  bad("{\"version\": 1, \"mb_sizes\": [1]," L1 ", \"cores\": 0}", "profile.cores", "integer");
  bad("{\"version\": 1, \"mb_sizes\": [1], \"layers\": [{\"f\": [1]}]}", "profile.layers[0].name", "layer name");
}

static void test_interpolate_and_round_trip(void **st) {
  (void)st;
  const char *text = "{\"version\": 1, \"mb_sizes\": [1, 4], \"layers\": [{\"name\": \"a\", \"f\": [1, 7],"
                     " \"i\": [2, 2], \"w\": [0, 3]}]}";
  json_t *j = json_loads(text, 0, NULL);
  pw_cost_profile p, q;
  pw_err err = {0};
  assert_int_equal(pw_cost_parse(j, &p, &err), 0);
  double f, i, w;
  pw_cost_layer(&p, 0, 2, &f, &i, &w); /* a third of the way from 1 to 4 */
  assert_true(fabs(f - 3) < 1e-12 && fabs(i - 2) < 1e-12 && fabs(w - 1) < 1e-12);
  pw_cost_layer(&p, 0, 8, &f, &i, &w); /* past the last: per sequence of mb 4 */
  assert_true(fabs(f - 14) < 1e-12 && fabs(w - 6) < 1e-12);
  json_t *back = pw_cost_json(&p);
  assert_int_equal(pw_cost_parse(back, &q, &err), 0);
  assert_int_equal(q.n_mb, 2);
  assert_string_equal(q.names[0], "a");
  assert_true(q.f[1] == 7 && q.latency == p.latency);
  assert_int_equal(q.n_speed, 0); /* version 1: no sharing measured, no wake-up */
  assert_true(pw_cost_transfer_latency(&q, 4) == q.latency);
  pw_cost_free(&p);
  pw_cost_free(&q);
  json_decref(back);
  json_decref(j);
  /* version 2: the wake-up counts twice per transfer; sharing round-trips */
  j = json_loads("{\"version\": 2, \"mb_sizes\": [1]," L1 ", \"link\": {\"latency_s\": 1e-5, \"wake_s\": 2e-5},"
                 " \"sharing\": {\"speed\": [1, 0.9, 0.6], \"wake_s\": [2e-5, 3e-5, 4e-5]}}",
                 0, NULL);
  assert_int_equal(pw_cost_parse(j, &p, &err), 0);
  assert_true(fabs(pw_cost_transfer_latency(&p, 1) - 5e-5) < 1e-15); /* alone: the plain wake-up */
  assert_true(fabs(pw_cost_transfer_latency(&p, 2) - 7e-5) < 1e-15); /* beside 2 busy */
  assert_true(fabs(pw_cost_transfer_latency(&p, 9) - 9e-5) < 1e-15); /* past the table: its last */
  back = pw_cost_json(&p);
  assert_int_equal(json_integer_value(json_object_get(back, "version")), 2);
  assert_int_equal(pw_cost_parse(back, &q, &err), 0);
  assert_int_equal(q.n_speed, 3);
  assert_true(q.speed[1] == 0.9 && q.speed[2] == 0.6 && q.wake == 2e-5 && q.wake_busy[2] == 4e-5);
  pw_cost_free(&p);
  pw_cost_free(&q);
  json_decref(back);
  json_decref(j);
}

/* pp 1, 1f1b, m microbatches: the step is m x the layers' F + I + W (no
 * bubble with one rank) plus the step end for every trainable parameter. */
static void test_plan_exact(void **st) {
  (void)st;
  pw_job job;
  job_of("1f1b", 1, 4, 16, &job);
  int mb[] = {2, 4, 8};
  json_t *j = profile_for(&job, mb, 3, 1e-3, 1e-4); /* mb 4: 1.4 ms a layer and direction */
  pw_cost_profile prof;
  pw_err err = {0};
  assert_int_equal(pw_cost_parse(j, &prof, &err), 0);
  pw_cost_model cm = {.profile = &prof};
  pw_plan p;
  assert_int_equal(pw_plan_build_costed(&job, NULL, &cm, &p, &err), 0);
  assert_true(p.calibrated);
  int L = p.model.n_layers;
  double want = 4 * L * 3 * 1.4e-3;
  assert_true(fabs(p.sim->makespan - want) < 1e-9);
  double end = 2e-3 + 1e-9 * (double)(p.mem[0].grads / sizeof(float));
  assert_true(fabs(p.step_end - end) < 1e-12);
  assert_true(fabs(p.predicted - want - end) < 1e-9);
  pw_plan_free(&p);
  /* a layer the profile lacks is named */
  pw_cost_profile bad;
  json_t *one = json_loads("{\"version\": 1, \"mb_sizes\": [1], " L1 "}", 0, NULL);
  assert_int_equal(pw_cost_parse(one, &bad, &err), 0);
  cm.profile = &bad;
  assert_int_equal(pw_plan_build_costed(&job, NULL, &cm, &p, &err), PW_EFORMAT);
  assert_string_equal(err.path, "profile.layers");
  assert_non_null(strstr(err.msg, "no entry for layer"));
  pw_cost_free(&bad);
  json_decref(one);
  pw_cost_free(&prof);
  json_decref(j);
  pw_job_free(&job);
}

/* The data-parallel exchange and tensor parallel's all-reduces cost what
 * the profile's link says: the same job under two profiles that differ
 * only in bandwidth moves the same bytes, in bytes / bandwidth seconds;
 * without a profile the FLOP model's link stays. */
static void job_from(const char *spec, pw_job *job) {
  json_t *sj = json_loads(spec, 0, NULL);
  assert_non_null(sj);
  pw_err err = {0};
  int rc = pw_job_parse(sj, NULL, job, &err);
  if (rc) print_error("%s: %s\n", err.path, err.msg);
  assert_int_equal(rc, 0);
  json_decref(sj);
}

/* job planned under a profile whose link has bandwidth bw and no latency
 * (bw <= 0: the FLOP model) */
static void plan_job_bw(const pw_job *job, double bw, pw_plan *p) {
  pw_err err = {0};
  if (bw <= 0) {
    assert_int_equal(pw_plan_build(job, NULL, p, &err), 0);
    return;
  }
  int mb[] = {1, 4};
  json_t *j = profile_for(job, mb, 2, 1e-3, 1e-4);
  json_object_set_new(j, "link", json_pack("{s:f, s:f}", "latency_s", 0.0, "bandwidth_Bps", bw));
  pw_cost_profile prof;
  assert_int_equal(pw_cost_parse(j, &prof, &err), 0);
  pw_cost_model cm = {.profile = &prof};
  int rc = pw_plan_build_costed(job, NULL, &cm, p, &err);
  if (rc) print_error("%s: %s\n", err.path, err.msg);
  assert_int_equal(rc, 0);
  pw_cost_free(&prof);
  json_decref(j);
}

static void plan_with_bw(const char *spec, double bw, pw_plan *p) {
  pw_job job;
  job_from(spec, &job);
  plan_job_bw(&job, bw, p);
  pw_job_free(&job);
}

static void test_collectives_on_profile_link(void **st) {
  (void)st;
  char dp[1024], tp[1024];
  snprintf(dp, sizeof dp,
           "{\"name\": \"t\", \"model\": {%s}, \"mesh\": {\"pp\": 1, \"dp\": 2, \"virtual_stages\": 1},"
           " \"schedule\": {\"name\": \"1f1b\", \"microbatches\": 2}, \"partition\": {\"mode\": \"even\"},"
           " \"train\": {\"steps\": 1, \"batch_size\": 16, \"optimizer\": {\"name\": \"adamw\", \"lr\": 1e-3}},"
           " \"data\": {\"kind\": \"regression\"}}",
           MLP);
  snprintf(tp, sizeof tp, "%s",
           "{\"name\": \"t\", \"model\": {\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 16, \"d_model\": 32,"
           " \"n_layers\": 2, \"n_heads\": 4}, \"mesh\": {\"pp\": 1, \"dp\": 1, \"tp\": 2, \"virtual_stages\": 1},"
           " \"schedule\": {\"name\": \"1f1b\", \"microbatches\": 2}, \"partition\": {\"mode\": \"even\"},"
           " \"train\": {\"steps\": 1, \"batch_size\": 4, \"optimizer\": {\"name\": \"adamw\", \"lr\": 1e-3}},"
           " \"data\": {\"kind\": \"text\", \"path\": \"x.txt\"}}");
  pw_plan a, b, f;
  plan_with_bw(dp, 1e9, &a);
  plan_with_bw(dp, 1e8, &b);
  plan_with_bw(dp, 0, &f);
  double sent = (double)a.mem[0].dp_sent;
  assert_true(sent > 0 && a.mem[0].dp_sent == b.mem[0].dp_sent && f.mem[0].dp_sent == a.mem[0].dp_sent);
  assert_true(fabs(a.mem[0].dp_seconds - sent / 1e9) < 1e-12);
  assert_true(fabs(b.mem[0].dp_seconds - sent / 1e8) < 1e-12);
  assert_true(f.mem[0].dp_seconds > sent / PW_PLAN_LINK_BW); /* the FLOP model's link: its latency too */
  assert_true(fabs(f.mem[0].dp_seconds - sent / PW_PLAN_LINK_BW) < 1e-3);
  /* the slower link's exchange lengthens the predicted step by exactly the difference */
  assert_true(fabs((b.predicted - a.predicted) - (sent / 1e8 - sent / 1e9)) < 1e-9);
  pw_plan_free(&a);
  pw_plan_free(&b);
  pw_plan_free(&f);
  plan_with_bw(tp, 1e9, &a);
  plan_with_bw(tp, 1e8, &b);
  double tsent = (double)a.mem[0].tp_sent;
  assert_true(tsent > 0 && a.mem[0].tp_sent == b.mem[0].tp_sent);
  assert_true(fabs(a.mem[0].tp_seconds - tsent / 1e9) < 1e-12);
  assert_true(fabs(b.mem[0].tp_seconds - tsent / 1e8) < 1e-12);
  pw_plan_free(&a);
  pw_plan_free(&b);
}

/* ZeRO-2 reduce-scatters each microbatch's weight gradients inside the W
 * (or B) that makes them (worker/gradrs.c): a zero 2 stage's W and B cost
 * its flushes' latency and the bytes pw_dp_wgrad_bytes counts over the
 * link more than zero 1's, F and I the same; the step end keeps only the
 * all-gather (and the full ranges), so it is the all-at-the-end figure
 * less m x those; the bytes (dp_bytes_per_step) do not change. Zero 0 and
 * 1 price nothing inside W. */
#define GPT_DP2 \
  "{\"name\": \"t\", \"model\": {\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 16, \"d_model\": 32," \
  " \"n_layers\": 2, \"n_heads\": 4, \"tie_embeddings\": false}, \"mesh\": {\"pp\": 2, \"dp\": 2, \"virtual_stages\": 1}," \
  " \"schedule\": {\"name\": \"zb-h1\", \"microbatches\": 2}, \"partition\": {\"mode\": \"even\"}," \
  " \"train\": {\"steps\": 1, \"batch_size\": 8, \"zero\": %d, \"optimizer\": {\"name\": \"adamw\", \"lr\": 1e-3}}," \
  " \"data\": {\"kind\": \"text\", \"path\": \"x.txt\"}}"

static void plan_zero(int zero, double bw, pw_plan *p) {
  char spec[1024];
  snprintf(spec, sizeof spec, GPT_DP2, zero);
  plan_with_bw(spec, bw, p);
}

/* Stage s's bytes per microbatch in ZeRO-2's reduce-scatter (replica 0),
 * and its flushes (nodes with a redirected part); untied: no full ranges. */
static uint64_t wgrad_of(const pw_plan *p, int s, int *flushes) {
  const pw_stage *st = &p->part.stages[s];
  pw_prog_layout L;
  assert_int_equal(pw_prog_layout_build(&p->model, st->layer_lo, st->layer_hi, p->mb_size, &L), 0);
  assert_int_equal(L.n_shadow, 0);
  uint64_t b = pw_dp_wgrad_bytes(&p->model, &L, NULL, 0, p->dp, 0);
  *flushes = 0;
  for (int i = 0; i < L.node_hi - L.node_lo; i++) *flushes += pw_dp_wgrad_parts(&p->model, &L, i, NULL, 0) != 0;
  pw_prog_layout_free(&L);
  return b;
}

static void test_zero2_in_w(void **st) {
  (void)st;
  const double bw = 1e8;
  pw_plan z0, z1, z2;
  plan_zero(0, bw, &z0);
  plan_zero(1, bw, &z1);
  plan_zero(2, bw, &z2);
  assert_int_equal(z2.S, 2);
  for (int s = 0; s < 2; s++) {
    int flushes;
    uint64_t wb = wgrad_of(&z2, s, &flushes);
    assert_true(wb > 0 && flushes > 0);
    assert_true(z0.cost_w[s] == z1.cost_w[s] && z0.cost_b[s] == z1.cost_b[s]); /* zero 1: nothing inside W */
    assert_true(z2.cost_f[s] == z1.cost_f[s] && z2.cost_i[s] == z1.cost_i[s]);
    assert_true(fabs(z2.cost_w[s] - z1.cost_w[s] - (double)wb / bw) < 1e-12);
    assert_true(fabs(z2.cost_b[s] - z1.cost_b[s] - (double)wb / bw) < 1e-12);
    /* rank s runs stage s: its step end keeps the all-gather only */
    const pw_prog_sizes *sm = &z2.stage_mem[s];
    uint64_t end = pw_dp_step_bytes(sm->grad_numel, sm->train_numel, 0, 2, 2, 0);
    assert_true(z2.mem[s].dp_sent == end + (uint64_t)z2.m * wb); /* what the worker sends: unchanged */
    assert_true(fabs(z2.mem[s].dp_seconds - (double)end / bw) < 1e-12);
    /* the step end shrank by exactly what the W actions grew by */
    assert_true(fabs(z2.mem[s].dp_seconds + z2.m * (z2.cost_w[s] - z1.cost_w[s]) - (double)z2.mem[s].dp_sent / bw) <
                1e-12);
    assert_true(fabs(z1.mem[s].dp_seconds - (double)z1.mem[s].dp_sent / bw) < 1e-12);
    /* the replay shows it where it happens: every W of stage s lasts its cost */
    int ws = 0;
    for (int e = 0; e < z2.sim->n_events; e++) {
      const pw_sim_event *ev = &z2.sim->events[e];
      if (ev->act.kind != PW_ACT_W || ev->act.stage != s) continue;
      assert_true(fabs(ev->end - ev->start - z2.cost_w[s]) < 1e-12);
      ws++;
    }
    assert_int_equal(ws, z2.m);
  }
  pw_plan_free(&z0);
  pw_plan_free(&z1);
  pw_plan_free(&z2);
  /* the FLOP model's link: a latency per flush too */
  plan_zero(1, 0, &z1);
  plan_zero(2, 0, &z2);
  for (int s = 0; s < 2; s++) {
    int flushes;
    uint64_t wb = wgrad_of(&z2, s, &flushes);
    double want = flushes * PW_PLAN_LINK_LATENCY + (double)wb / PW_PLAN_LINK_BW;
    assert_true(fabs(z2.cost_w[s] - z1.cost_w[s] - want) < 1e-12);
  }
  pw_plan_free(&z1);
  pw_plan_free(&z2);
}

/* In-memory snapshots: each rank sends its stages' parameters, m and v
 * (3 x 4 bytes a parameter) every snapshot_every steps; their seconds on
 * the link and the share of the predicted step are reported, not added to
 * it; above 5 % a note names train.snapshot_every and the smallest k that
 * brings the share to 5 % or less. */
static void plan_snap(pw_job *job, int every, double bw, pw_plan *p) {
  job->train.snapshot_every = every;
  plan_job_bw(job, bw, p);
}

static void test_snapshot_link(void **st) {
  (void)st;
  pw_job job;
  job_of("1f1b", 2, 2, 16, &job);
  const double bw = 1e6;
  pw_plan p1, p3, p0;
  plan_snap(&job, 1, bw, &p1);
  plan_snap(&job, 3, bw, &p3);
  plan_snap(&job, 0, bw, &p0);
  for (int r = 0; r < 2; r++) {
    uint64_t params = 0;
    for (int s = 0; s < p1.S; s++)
      if (p1.sched->stage_to_rank[s] == r) params += p1.part.stages[s].params;
    assert_true(params > 0);
    assert_true(p1.mem[r].snap_sent == 3 * 4 * params && p3.mem[r].snap_sent == p1.mem[r].snap_sent);
    assert_true(fabs(p1.mem[r].snap_seconds - (double)p1.mem[r].snap_sent / bw) < 1e-12);
    assert_true(fabs(p3.mem[r].snap_seconds - (double)p1.mem[r].snap_sent / bw / 3) < 1e-12);
    assert_true(fabs(pw_plan_snap_share(&p1, r) - p1.mem[r].snap_seconds / p1.predicted) < 1e-12);
    assert_true(p0.mem[r].snap_sent == 0 && p0.mem[r].snap_seconds == 0 && pw_plan_snap_share(&p0, r) == 0);
  }
  /* overlapped with the step: the prediction does not move */
  assert_true(p1.predicted == p0.predicted && p3.predicted == p0.predicted);
  /* the smallest k whose share is at most 5 %, by brute force */
  int w = pw_plan_snap_worst(&p1), k = 1;
  double one = p1.mem[w].snap_seconds;
  assert_true(one / p1.predicted > 0.05);
  while (one / k > 0.05 * p1.predicted) k++;
  assert_true(k > 3);
  assert_int_equal(pw_plan_snap_every(&p1), k);
  assert_int_equal(pw_plan_snap_every(&p3), k);
  assert_int_equal(pw_plan_snap_every(&p0), 0);
  char note[512], want[64];
  snprintf(want, sizeof want, "\"train\": {\"snapshot_every\": %d}", k);
  assert_int_equal(pw_plan_snap_note(&p1, note, sizeof note), 1);
  assert_non_null(strstr(note, want));
  assert_int_equal(pw_plan_snap_note(&p0, note, sizeof note), 0);
  /* the JSON says the same */
  json_t *j = pw_plan_json(&job, &p3);
  json_t *r0 = json_array_get(json_object_get(json_object_get(j, "analytics"), "ranks"), 0);
  assert_true(fabs(json_real_value(json_object_get(r0, "snapshot_bytes_per_step")) - (double)p3.mem[0].snap_sent / 3) <
              1e-6);
  assert_true(json_real_value(json_object_get(r0, "snapshot_seconds_per_step")) == p3.mem[0].snap_seconds);
  json_t *sn = json_object_get(j, "snapshots");
  assert_int_equal(json_integer_value(json_object_get(sn, "every")), 3);
  assert_int_equal(json_integer_value(json_object_get(sn, "suggested_every")), k);
  assert_non_null(strstr(json_string_value(json_object_get(sn, "note")), want));
  json_decref(j);
  pw_plan_free(&p1);
  pw_plan_free(&p3);
  pw_plan_free(&p0);
  /* at k the share is at most 5 %: no note; at k - 1 there is one */
  plan_snap(&job, k, bw, &p1);
  assert_true(pw_plan_snap_share(&p1, w) <= 0.05);
  assert_int_equal(pw_plan_snap_note(&p1, note, sizeof note), 0);
  assert_int_equal(pw_plan_snap_every(&p1), k);
  j = pw_plan_json(&job, &p1);
  assert_true(json_is_null(json_object_get(json_object_get(j, "snapshots"), "note")));
  json_decref(j);
  pw_plan_free(&p1);
  plan_snap(&job, k - 1, bw, &p1);
  assert_int_equal(pw_plan_snap_note(&p1, note, sizeof note), 1);
  pw_plan_free(&p1);
  /* one rank alone has no holder: it sends nothing */
  pw_job_free(&job);
  job_of("1f1b", 1, 2, 16, &job);
  plan_snap(&job, 1, bw, &p1);
  assert_true(p1.mem[0].snap_sent == 0 && p1.mem[0].snap_seconds == 0 && p1.mem[0].snapshots > 0);
  assert_int_equal(pw_plan_snap_note(&p1, note, sizeof note), 0);
  pw_plan_free(&p1);
  pw_job_free(&job);
}

/* pw_plan_auto on the MLP job (batch 16) under a profile base + per_seq x
 * size, pp up to max_pp, each rank under mem bytes (0: no bound). */
static int auto_rows(double base, double per_seq, int max_pp, size_t mem, pw_auto_row **rows, int *n) {
  pw_job job;
  job_of("1f1b", 1, 1, 16, &job);
  int mb[] = {1, 16};
  json_t *j = profile_for(&job, mb, 2, base, per_seq);
  pw_cost_profile prof;
  pw_err err = {0};
  assert_int_equal(pw_cost_parse(j, &prof, &err), 0);
  pw_cost_model cm = {.profile = &prof};
  pw_budget b;
  pw_budget_init(&b);
  b.max_rank_memory = mem;
  int rc = pw_plan_auto(&job, &cm, &b, max_pp, rows, n, &err);
  pw_cost_free(&prof);
  json_decref(j);
  pw_job_free(&job);
  return rc;
}

/* The microbatch count of the best 1f1b row (*pp: the best row's pp over
 * all schedules). */
static int auto_m(double base, double per_seq, int max_pp, int *pp) {
  pw_auto_row *rows = NULL;
  int n = 0;
  assert_int_equal(auto_rows(base, per_seq, max_pp, 0, &rows, &n), 0);
  assert_true(n > 1);
  for (int k = 1; k < n; k++) assert_true(rows[k].predicted >= rows[0].predicted);
  int m = 0;
  for (int k = n - 1; k >= 0; k--)
    if (!strcmp(rows[k].schedule, "1f1b")) m = rows[k].m;
  *pp = rows[0].pp;
  free(rows);
  return m;
}

static void test_auto_follows_profile(void **st) {
  (void)st;
  int pp;
  /* a microbatch costs mostly a fixed overhead: one microbatch of 16 wins */
  assert_int_equal(auto_m(10e-3, 1e-6, 1, &pp), 1);
  /* time proportional to the sequences: on two ranks, more microbatches
   * shrink the bubble, so the most (16) wins, on two ranks */
  assert_int_equal(auto_m(0, 1e-3, 2, &pp), 16);
  assert_int_equal(pp, 2);
}

/* Under a memory bound the choice is the fastest row that fits, rows over
 * it rank after every fitting one; a bound nothing meets is PW_EBUDGET. */
static void test_auto_memory(void **st) {
  (void)st;
  pw_auto_row *rows = NULL;
  int n = 0;
  assert_int_equal(auto_rows(0, 1e-3, 2, 0, &rows, &n), 0);
  size_t lo = rows[0].peak_memory, hi = rows[0].peak_memory;
  for (int k = 0; k < n; k++) {
    if (rows[k].peak_memory < lo) lo = rows[k].peak_memory;
    if (rows[k].peak_memory > hi) hi = rows[k].peak_memory;
  }
  free(rows);
  assert_true(lo < hi);
  size_t bound = lo + (hi - lo) / 2;
  assert_int_equal(auto_rows(0, 1e-3, 2, bound, &rows, &n), 0);
  assert_true(rows[0].fits && rows[0].peak_memory <= bound);
  int seen_over = 0;
  for (int k = 0; k < n; k++) {
    assert_int_equal(rows[k].fits, rows[k].peak_memory <= bound);
    if (!rows[k].fits) seen_over = 1;
    else assert_false(seen_over); /* no fitting row after one over */
  }
  assert_true(seen_over);
  free(rows);
  rows = NULL;
  assert_int_equal(auto_rows(0, 1e-3, 2, 1, &rows, &n), PW_EBUDGET);
  assert_null(rows);
}

/* pw_plan_auto_host: the MLP job on one host of 8 cores, a profile of 1
 * thread (1 ms a sequence) and one of 2 threads (t2 ms a sequence). Every
 * layout keeps pp x dp x threads within the cores, both thread counts are
 * tried, the ranking is by predicted step, and the threads follow the
 * profiles: 2-thread ranks win when two threads are more than twice as
 * fast as one, lose when they are barely faster. */
static int auto_host_threads(double t2, int *layouts) {
  pw_job job;
  job_of("1f1b", 1, 1, 16, &job);
  int mb[] = {1, 16};
  json_t *j1 = profile_for(&job, mb, 2, 0, 1e-3), *j2 = profile_for(&job, mb, 2, 0, t2);
  json_object_set_new(j2, "threads", json_integer(2));
  pw_cost_profile profs[2];
  pw_err err = {0};
  assert_int_equal(pw_cost_parse(j1, &profs[0], &err), 0);
  assert_int_equal(pw_cost_parse(j2, &profs[1], &err), 0);
  pw_budget b;
  pw_budget_init(&b);
  pw_auto_row *rows = NULL;
  int n = 0, seen[3] = {0};
  assert_int_equal(pw_plan_auto_host(&job, profs, 2, 8, &b, 8, &rows, &n, &err), 0);
  for (int k = 0; k < n; k++) {
    assert_true(rows[k].pp * rows[k].dp * rows[k].threads <= 8);
    assert_true(rows[k].threads == 1 || rows[k].threads == 2);
    seen[rows[k].threads] = 1;
    if (k) assert_true(rows[k].predicted >= rows[k - 1].predicted);
  }
  assert_true(seen[1] && seen[2]);
  *layouts = n;
  int threads = rows[0].threads;
  json_t *js = pw_auto_json(rows, n, "t");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(js, "chosen"), "threads")), threads);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(js, "chosen"), "dp")), rows[0].dp);
  json_decref(js);
  free(rows);
  /* two profiles of one thread count: refused */
  assert_int_equal(pw_plan_auto_host(&job, profs, 1, 0, &b, 8, &rows, &n, &err), PW_EINVAL);
  pw_cost_profile dup[2] = {profs[0], profs[0]};
  assert_int_equal(pw_plan_auto_host(&job, dup, 2, 8, &b, 8, &rows, &n, &err), PW_EINVAL);
  assert_non_null(strstr(err.msg, "two profiles of 1 thread"));
  pw_cost_free(&profs[0]);
  pw_cost_free(&profs[1]);
  json_decref(j1);
  json_decref(j2);
  pw_job_free(&job);
  return threads;
}

static void test_auto_host(void **st) {
  (void)st;
  int n1 = 0, n2 = 0;
  assert_int_equal(auto_host_threads(0.3e-3, &n1), 2); /* 2 threads 3.3x one: 2-thread ranks */
  assert_int_equal(auto_host_threads(0.95e-3, &n2), 1); /* barely faster: twice the ranks of one thread */
  assert_int_equal(n1, n2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_auto_host),
      cmocka_unit_test(test_parse_errors),          cmocka_unit_test(test_interpolate_and_round_trip),
      cmocka_unit_test(test_plan_exact),            cmocka_unit_test(test_auto_follows_profile),
      cmocka_unit_test(test_auto_memory),           cmocka_unit_test(test_collectives_on_profile_link),
      cmocka_unit_test(test_zero2_in_w),            cmocka_unit_test(test_snapshot_link),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
