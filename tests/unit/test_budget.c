/* test_budget: the planner's resource bounds (common/plan/budget.h). The
 * action bound holds every schedule's real plan and refuses a huge spec
 * before it is planned; a derived field out of range is caught as the
 * store would catch it; each post-planning bound refuses one byte over and
 * accepts its exact limit, so an off-by-one or a wrong measure fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "slice.h"
#include "spec_json.h"

static const char *GPT = "\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 16, \"d_model\": %d,"
                         " \"n_layers\": 4, \"n_heads\": 2, \"tie_embeddings\": true";

/* A job of the GPT above (d_model d) with the mesh and schedule given. */
static void job_of(int d, const char *sched, int pp, int dp, int V, int m, int batch, pw_job *job) {
  char model[512], buf[2048];
  snprintf(model, sizeof model, GPT, d);
  snprintf(buf, sizeof buf,
           "{\"name\": \"t\", \"model\": {%s}, \"mesh\": {\"pp\": %d, \"dp\": %d, \"virtual_stages\": %d},"
           " \"schedule\": {\"name\": \"%s\", \"microbatches\": %d}, \"partition\": {\"mode\": \"even\"},"
           " \"train\": {\"steps\": 1, \"batch_size\": %d}, \"data\": {\"kind\": \"text\", \"path\": "
           "\"examples/data/corpus.txt\"}}",
           model, pp, dp, V, sched, m, batch);
  json_error_t je;
  json_t *j = json_loads(buf, 0, &je);
  assert_non_null(j);
  pw_err err = {0};
  char eb[600];
  int rc = pw_job_parse(j, NULL, job, &err);
  if (rc) print_error("%s\n", pw_err_str(&err, eb, sizeof eb));
  assert_int_equal(rc, 0);
  json_decref(j);
}

/* For every schedule, the bound holds the plan's real action count, and is
 * exact for a flat and a split-backward schedule. */
static void test_actions_bound_holds_every_schedule(void **state) {
  (void)state;
  int n = 0;
  const pw_sched_info *infos = pw_sched_infos(&n);
  assert_int_equal(n, 9);
  for (int i = 0; i < n; i++) {
    int V = infos[i].max_v == 1 ? 1 : 2;
    pw_job job;
    job_of(32, infos[i].name, 2, 1, V, 8, 16, &job);
    pw_plan p;
    pw_err err = {0};
    assert_int_equal(pw_plan_build(&job, NULL, &p, &err), 0);
    int counts[4] = {0};
    pw_sched_count(p.sched, counts);
    int64_t real = counts[0] + counts[1] + counts[2] + counts[3];
    int64_t bound = pw_plan_actions_bound(&job, NULL, 0);
    if (bound < real) print_error("%s: bound %lld < %lld actions\n", infos[i].name, (long long)bound, (long long)real);
    assert_true(bound >= real);
    assert_true(pw_plan_actions_bound(&job, NULL, 1) >= bound);
    if (!strcmp(infos[i].name, "1f1b") || !strcmp(infos[i].name, "zb-h1")) assert_int_equal(bound, real);
    /* the budget at exactly the bound passes, one below refuses */
    pw_budget b;
    pw_budget_init(&b);
    b.max_actions = bound;
    assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), 0);
    b.max_actions = bound - 1;
    assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), PW_EBUDGET);
    pw_plan_free(&p);
    pw_job_free(&job);
  }
}

/* 2^19 microbatches (batch 2^23) pass every field check; the budget
 * refuses them naming the field and the limit, whatever else is wrong
 * with the plan: here 1f1b on 4 ranks with virtual_stages 2, which only
 * planning would refuse (so the budget did not plan). */
static void test_huge_microbatches_refused_before_planning(void **state) {
  (void)state;
  pw_job job;
  job_of(32, "1f1b", 4, 1, 2, 1 << 19, 1 << 23, &job);
  pw_budget b;
  pw_budget_init(&b);
  pw_err err = {0};
  assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), PW_EBUDGET);
  assert_string_equal(err.path, "schedule.microbatches");
  char lim[32];
  snprintf(lim, sizeof lim, "the limit is %d", PW_BUDGET_MAX_ACTIONS);
  assert_non_null(strstr(err.msg, lim));
  assert_non_null(strstr(err.msg, "8388608 actions")); /* 2^19 x 8 stages x F, B */
  assert_int_equal(pw_err_http_status(err.code), 422);
  /* compare bounds the largest schedule compared, and says so */
  assert_int_equal(pw_plan_check_budget(&job, NULL, 1, &b, &err), PW_EBUDGET);
  assert_non_null(strstr(err.msg, "largest schedule compared"));
  /* no bound: the spec-only checks pass */
  b.max_actions = 0;
  b.max_stages = 8;
  assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), 0);
  b.max_stages = 7; /* 4 x 2 stages */
  assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), PW_EBUDGET);
  assert_string_equal(err.path, "mesh.pp");
  assert_non_null(strstr(err.msg, "the limit is 7"));
  b.max_stages = 0;
  assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), 0);
  pw_job_free(&job);
}

/* 4096 blocks on 64 ranks pass every field check and the action bound,
 * but planning them describes every layer to every rank: 27 s of CPU,
 * measured. Refused before any of it is spent, naming the field; the
 * default budget leaves a real model's depth (126 blocks) on 64 ranks alone. */
static void test_layers_times_ranks(void **state) {
  (void)state;
  pw_job job;
  pw_err err = {0};
  pw_budget b;
  pw_budget_init(&b);
  assert_int_equal(b.max_layer_ranks, PW_BUDGET_MAX_LAYER_RANKS);
  const char *big = "{\"name\": \"big\", \"model\": {\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 16,"
                    " \"d_model\": 16, \"n_layers\": 4096, \"n_heads\": 2}, \"mesh\": {\"pp\": 64},"
                    " \"schedule\": {\"name\": \"1f1b\", \"microbatches\": 64}, \"train\": {\"steps\": 1, \"batch_size\": 64},"
                    " \"data\": {\"kind\": \"copy\"}}";
  json_t *j = json_loads(big, 0, NULL);
  assert_non_null(j);
  assert_int_equal(pw_job_parse(j, NULL, &job, &err), 0);
  json_decref(j);
  assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), PW_EBUDGET);
  assert_string_equal(err.path, "model.n_layers");
  assert_non_null(strstr(err.msg, "4096 layers on 64 ranks"));
  assert_non_null(strstr(err.msg, "262144 in all; the limit is 65536"));
  job.model.n_layers = 126; /* Llama-3 405B's depth, on 64 ranks */
  assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), 0);
  b.max_layer_ranks = 126 * 64 - 1; /* one over its own bound */
  assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), PW_EBUDGET);
  pw_job_free(&job);
}

/* d_model 1e6 passes the field checks, but the ffn_hidden it implies does
 * not pass them once written out (as the store keeps the spec). */
static void test_derived_field_out_of_range(void **state) {
  (void)state;
  pw_job job;
  job_of(1000000, "1f1b", 2, 1, 1, 2, 4, &job);
  pw_budget b;
  pw_budget_init(&b);
  pw_err err = {0};
  assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), PW_ESPEC);
  assert_string_equal(err.path, "model.ffn_hidden");
  assert_non_null(strstr(err.msg, "4000000"));
  pw_job_free(&job);
  job_of(262144, "1f1b", 2, 1, 1, 2, 4, &job); /* ffn_hidden 2^20: the largest allowed */
  assert_int_equal(pw_plan_check_budget(&job, NULL, 0, &b, &err), 0);
  pw_job_free(&job);
}

/* The largest slice of plan p as it travels (escaped in a JSON string). */
static size_t largest_slice(const pw_job *job, const pw_plan *p) {
  json_t *pj = pw_plan_json(job, p);
  char *text, sha[PW_SHA256_HEX_LEN + 1], hex[PW_SHA256_HEX_LEN + 1];
  assert_int_equal(pw_slice_plan_text(pj, &text, sha), 0);
  json_decref(pj);
  free(text);
  size_t most = 0;
  for (int r = 0; r < p->pp * p->dp; r++) {
    assert_int_equal(pw_slice_build(job, p, r, sha, &text, hex, NULL), 0);
    size_t n = 0;
    for (const char *t = text; *t; t++) n += 1 + (*t == '"' || *t == '\\');
    if (n > most) most = n;
    free(text);
  }
  return most;
}

/* Each bound of the built plan: its exact value passes, one less refuses
 * with the field and the limit. */
static void test_fit_bounds_exact(void **state) {
  (void)state;
  const char *scheds[] = {"1f1b", "interleaved-1f1b", "dualpipev"};
  for (int k = 0; k < 3; k++) {
    pw_job job;
    job_of(32, scheds[k], 2, 2, k ? 2 : 1, 6, 24, &job);
    pw_plan p;
    pw_err err = {0};
    assert_int_equal(pw_plan_build(&job, NULL, &p, &err), 0);
    size_t mem = 0;
    for (int r = 0; r < p.pp; r++)
      if (p.mem[r].total > mem) mem = p.mem[r].total;
    json_t *pj = pw_plan_json(&job, &p);
    char *text, sha[PW_SHA256_HEX_LEN + 1];
    assert_int_equal(pw_slice_plan_text(pj, &text, sha), 0);
    size_t plan_len = strlen(text);
    free(text);
    json_decref(pj);
    size_t slice = largest_slice(&job, &p);

    pw_budget b;
    pw_budget_init(&b);
    b.max_rank_memory = mem;
    b.max_plan_bytes = plan_len;
    b.max_slice_bytes = slice;
    assert_int_equal(pw_plan_check_fit(&job, &p, &b, &err), 0);

    b.max_rank_memory = mem - 1;
    snprintf(b.memory_from, sizeof b.memory_from, "--max-rank-memory");
    assert_int_equal(pw_plan_check_fit(&job, &p, &b, &err), PW_EBUDGET);
    assert_non_null(strstr(err.msg, "--max-rank-memory"));
    assert_true(!strcmp(err.path, "model") || !strcmp(err.path, "train.batch_size"));
    b.max_rank_memory = 0;

    b.max_plan_bytes = plan_len - 1;
    assert_int_equal(pw_plan_check_fit(&job, &p, &b, &err), PW_EBUDGET);
    assert_non_null(strstr(err.msg, "the plan is"));
    b.max_plan_bytes = 0;

    b.max_slice_bytes = slice - 1;
    assert_int_equal(pw_plan_check_fit(&job, &p, &b, &err), PW_EBUDGET);
    assert_non_null(strstr(err.msg, "assign message"));
    pw_plan_free(&p);
    pw_job_free(&job);
  }
}

/* The room for a slice: the message bound less 4 KiB and 128 B a rank. */
static void test_slice_room(void **state) {
  (void)state;
  assert_int_equal(pw_budget_slice_room(1 << 20, 4), (1 << 20) - 4096 - 512);
  assert_int_equal(pw_budget_slice_room(4096, 0), 0);
  assert_int_equal(pw_budget_slice_room(4096 + 128, 1), 0);
  assert_int_equal(pw_budget_slice_room(4096 + 129, 1), 1);
}

int main(void) {
  const char *src = getenv("PW_SOURCE_DIR");
  if (src && chdir(src)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layers_times_ranks),
      cmocka_unit_test(test_actions_bound_holds_every_schedule),
      cmocka_unit_test(test_huge_microbatches_refused_before_planning),
      cmocka_unit_test(test_derived_field_out_of_range),
      cmocka_unit_test(test_fit_bounds_exact),
      cmocka_unit_test(test_slice_room),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
