/* test_plan_remat: partition.remat in the spec and the plan.
 *
 * - the planner adds F to a remat stage's B and I and counts its slots as
 *   the keep part (the ports) plus its work buffers, under every schedule;
 *   a remat program run through the rank's action list in order makes
 *   exactly the work buffers the planner counts;
 * - partition.remat parses ("none", "full", a list), names the path of a
 *   bad entry and a wrong length, and survives the round trip.
 * (That a remat program computes the plain one's bits: test_model.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan.h"
#include "prog.h"
#include "spec_json.h"

/* ---- spec and plan ----------------------------------------------------- */

static int parse(const char *sched, int V, const char *remat, pw_job *job, char *eb, size_t ebn) {
  char buf[1400];
  snprintf(buf, sizeof buf,
           "{\"name\": \"t\", \"model\": {\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 16,"
           " \"d_model\": 32, \"n_layers\": 4, \"n_heads\": 2}, \"mesh\": {\"pp\": 2, \"virtual_stages\": %d},"
           " \"schedule\": {\"name\": \"%s\", \"microbatches\": 4}, \"partition\": {\"mode\": \"even\"%s%s},"
           " \"train\": {\"steps\": 1, \"batch_size\": 8}, \"data\": {\"kind\": \"text\","
           " \"path\": \"examples/data/corpus.txt\"}}",
           V, sched, remat ? ", \"remat\": " : "", remat ? remat : "");
  json_t *j = json_loads(buf, 0, NULL);
  assert_non_null(j);
  pw_err err = {0};
  memset(job, 0, sizeof *job);
  int rc = pw_job_parse(j, NULL, job, &err);
  json_decref(j);
  if (rc) pw_err_str(&err, eb, ebn);
  return rc;
}

static void test_spec(void **st) {
  (void)st;
  pw_job job;
  char eb[600];
  assert_int_equal(parse("1f1b", 1, NULL, &job, eb, sizeof eb), 0);
  assert_false(pw_partition_remat(&job.partition, 0) || pw_partition_remat(&job.partition, 1));
  json_t *o = pw_job_to_json(&job);
  assert_null(json_object_get(json_object_get(o, "partition"), "remat")); /* canonical text unchanged */
  json_decref(o);
  pw_job_free(&job);
  assert_int_equal(parse("1f1b", 1, "\"none\"", &job, eb, sizeof eb), 0);
  assert_false(pw_partition_remat(&job.partition, 0));
  pw_job_free(&job);
  assert_int_equal(parse("1f1b", 1, "\"full\"", &job, eb, sizeof eb), 0);
  assert_true(pw_partition_remat(&job.partition, 0) && pw_partition_remat(&job.partition, 1));
  o = pw_job_to_json(&job);
  assert_string_equal(json_string_value(json_object_get(json_object_get(o, "partition"), "remat")), "full");
  json_decref(o);
  pw_job_free(&job);
  assert_int_equal(parse("interleaved-1f1b", 2, "[true, \"none\", false, \"full\"]", &job, eb, sizeof eb), 0);
  int want[] = {1, 0, 0, 1};
  for (int s = 0; s < 4; s++) assert_int_equal(pw_partition_remat(&job.partition, s), want[s]);
  o = pw_job_to_json(&job);
  char *t = json_dumps(json_object_get(json_object_get(o, "partition"), "remat"), JSON_COMPACT);
  assert_string_equal(t, "[true,false,false,true]");
  free(t);
  json_decref(o);
  pw_job_free(&job);
  static const char *bad[][2] = {
      {"\"some\"", "partition.remat: must be \"none\", \"full\" or a list"},
      {"3", "partition.remat: must be \"none\""},
      {"[]", "partition.remat: must not be empty"},
      {"[true, 1]", "partition.remat[1]: must be true/false or \"full\"/\"none\""},
      {"[true, false, true]", "partition.remat: lists 3 stages, but the mesh runs mesh.pp * mesh.virtual_stages = 2 * 1 = 2"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    eb[0] = 0;
    assert_int_not_equal(parse("1f1b", 1, bad[i][0], &job, eb, sizeof eb), 0);
    if (!strstr(eb, bad[i][1])) fail_msg("%s: got '%s', want '%s'", bad[i][0], eb, bad[i][1]);
    pw_job_free(&job);
  }
}

/* Remat "full" against none, for every schedule: F added to B and I; the
 * rank's memory is slots of the keep part plus n_work work buffers; and a
 * remat program run through the rank's action list in order makes exactly
 * n_work work buffers. */
static void test_plan(void **st) {
  (void)st;
  for (int i = 0; i < pw_n_schedule_names; i++) {
    const char *name = pw_schedule_names[i];
    pw_job j0, j1;
    char eb[600];
    int V = 1;
    for (;; V++) { /* the V the schedule runs with at pp 2 */
      assert_int_equal(parse(name, V, NULL, &j0, eb, sizeof eb), 0);
      pw_plan probe;
      int ok = pw_plan_build(&j0, NULL, &probe, NULL) == 0;
      if (ok) pw_plan_free(&probe);
      pw_job_free(&j0);
      if (ok) break;
      assert_true(V < 4);
    }
    assert_int_equal(parse(name, V, NULL, &j0, eb, sizeof eb), 0);
    assert_int_equal(parse(name, V, "\"full\"", &j1, eb, sizeof eb), 0);
    pw_plan p0, p1;
    assert_int_equal(pw_plan_build(&j0, NULL, &p0, NULL), 0);
    assert_int_equal(pw_plan_build(&j1, NULL, &p1, NULL), 0);
    for (int s = 0; s < p1.S; s++) {
      assert_int_equal(p0.n_work[s], 0);
      assert_true(p1.n_work[s] >= 1 && p1.n_work[s] <= p1.peak_slots[s]);
      assert_true(p1.cost_i[s] == p0.cost_i[s] + p0.cost_f[s]);
      assert_true(p1.cost_b[s] == p1.cost_i[s] + p1.cost_w[s]);
      assert_true(p1.cost_f[s] == p0.cost_f[s]);
    }
    assert_true(p1.sim->makespan > p0.sim->makespan);
    size_t sum0 = 0, sum1 = 0;
    for (int r = 0; r < p1.pp; r++) {
      size_t keep = 0, work = 0;
      for (int s = 0; s < p1.S; s++) {
        if (p1.sched->stage_to_rank[s] != r) continue;
        const pw_prog_sizes *sm = &p1.stage_mem[s];
        keep += (size_t)p1.peak_slots[s] * sm->keep_floats * 4;
        work += (size_t)p1.n_work[s] * (sm->slot_floats - sm->keep_floats) * 4;
      }
      assert_int_equal(p1.mem[r].slots, keep);
      assert_int_equal(p1.mem[r].work, work);
      assert_int_equal(p0.mem[r].slots, p1.mem[r].slots + p1.mem[r].work + p1.mem[r].remat_saved);
      assert_true(p1.mem[r].total <= p0.mem[r].total); /* equal where every slot waits for a W */
      sum0 += p0.mem[r].total;
      sum1 += p1.mem[r].total;
    }
    print_message("%-26s remat: %zu of %zu bytes over the ranks\n", name, sum1, sum0);
    assert_true(sum1 < sum0);
    /* the programs' own count, action by action */
    for (int s = 0; s < p1.S; s++) {
      const pw_stage *sg = &p1.part.stages[s];
      pw_prog_config c = {.layer_lo = sg->layer_lo, .layer_hi = sg->layer_hi, .mb_size = p1.mb_size,
                          .batch_size = 8, .n_slots = p1.m, .remat = 1};
      pw_prog *pg;
      assert_int_equal(pw_prog_create(&p1.model, &c, &pg, NULL), 0);
      int r = p1.sched->stage_to_rank[s];
      for (int k = 0; k < p1.sched->n_actions[r]; k++) {
        const pw_action *a = &p1.sched->actions[r][k];
        if (a->stage != s) continue;
        int rc = a->kind == PW_ACT_F   ? pw_prog_forward(pg, a->mb, NULL, NULL)
                 : a->kind == PW_ACT_B ? pw_prog_backward(pg, a->mb, NULL)
                 : a->kind == PW_ACT_I ? pw_prog_backward_input(pg, a->mb, NULL)
                                       : pw_prog_backward_weight(pg, a->mb, NULL);
        assert_int_equal(rc, 0);
      }
      if (pw_prog_n_work(pg) != p1.n_work[s])
        fail_msg("%s stage %d: program made %d work buffers, plan says %d", name, s, pw_prog_n_work(pg), p1.n_work[s]);
      pw_prog_free(pg);
    }
    pw_plan_free(&p0);
    pw_plan_free(&p1);
    pw_job_free(&j0);
    pw_job_free(&j1);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spec),
      cmocka_unit_test(test_plan),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
