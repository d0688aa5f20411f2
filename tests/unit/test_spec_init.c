/* test_spec_init: the job spec's "init" section and its trip through the
 * slice.
 *
 *  - {"checkpoint": ID} and {"job", "step"[, "optimizer"]} parse; the
 *    canonical JSON writes them back (and nothing when there is no init,
 *    so older specs keep their text), and that JSON parses to the same;
 *  - each wrong form is refused naming its field (a bad id, job without
 *    step, optimizer without job + step, an unknown key, neither form);
 *  - a slice of a job with init carries the weights ids to the worker, and
 *    a slice of a job without carries none. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "slice.h"
#include "spec_json.h"

#define ID_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define ID_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

static int parse(const char *init, pw_job *job, pw_err *err) {
  char text[2048];
  snprintf(text, sizeof text,
           "{\"model\": {\"template\": \"gpt\", \"vocab_size\": 64, \"seq_len\": 8, \"d_model\": 16, \"n_layers\": 2,"
           " \"n_heads\": 2}, \"mesh\": {\"pp\": 2}, \"schedule\": {\"microbatches\": 2},"
           " \"train\": {\"batch_size\": 4}, \"data\": {\"kind\": \"copy\"}%s%s}",
           init ? ", \"init\": " : "", init ? init : "");
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  if (!j) fail_msg("%s: %s", text, je.text);
  int rc = pw_job_parse(j, NULL, job, err);
  json_decref(j);
  return rc;
}

/* The canonical JSON's "init", parsed back into another job. */
static void round_trip(const pw_job *job) {
  json_t *canon = pw_job_to_json(job);
  assert_non_null(canon);
  pw_job back;
  pw_err err = {0};
  if (pw_job_parse(canon, NULL, &back, &err)) fail_msg("%s: %s", err.path, err.msg);
  assert_memory_equal(&back.init, &job->init, sizeof job->init);
  pw_job_free(&back);
  json_decref(canon);
}

static void test_forms(void **state) {
  (void)state;
  pw_job job;
  pw_err err = {0};
  assert_int_equal(parse(NULL, &job, &err), 0);
  json_t *canon = pw_job_to_json(&job);
  assert_null(json_object_get(canon, "init"));
  json_decref(canon);
  pw_job_free(&job);

  assert_int_equal(parse("{\"checkpoint\": \"" ID_A "\"}", &job, &err), 0);
  assert_string_equal(job.init.checkpoint, ID_A);
  assert_int_equal(job.init.job, 0);
  round_trip(&job);
  pw_job_free(&job);

  assert_int_equal(parse("{\"job\": 7, \"step\": 20, \"optimizer\": true}", &job, &err), 0);
  assert_int_equal(job.init.job, 7);
  assert_int_equal(job.init.step, 20);
  assert_int_equal(job.init.optimizer, 1);
  assert_string_equal(job.init.checkpoint, "");
  round_trip(&job);
  /* as the coordinator stores it once resolved */
  memcpy(job.init.checkpoint, ID_A, 65);
  memcpy(job.init.optimizer_checkpoint, ID_B, 65);
  round_trip(&job);
  pw_job_free(&job);
}

static void test_refused(void **state) {
  (void)state;
  static const struct {
    const char *init, *path;
  } bad[] = {
      {"{\"checkpoint\": \"ABC\"}", "init.checkpoint"},
      {"{\"checkpoint\": 5}", "init.checkpoint"},
      {"{\"job\": 3}", "init.step"},
      {"{\"step\": 3}", "init.job"},
      {"{\"job\": 0, \"step\": 1}", "init.job"},
      {"{\"job\": 2, \"step\": -1}", "init.step"},
      {"{\"checkpoint\": \"" ID_A "\", \"optimizer\": true}", "init.optimizer"},
      {"{\"job\": 2, \"step\": 1, \"optimizer\": 1}", "init.optimizer"},
      {"{\"checkpoint\": \"" ID_A "\", \"optimizer_checkpoint\": \"" ID_B "\"}", "init.optimizer_checkpoint"},
      {"{\"checkpoint\": \"" ID_A "\", \"path\": \"x\"}", "init"},
      {"{}", "init"},
      {"[]", "init"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    pw_job job;
    pw_err err = {0};
    if (parse(bad[i].init, &job, &err) != PW_ESPEC) fail_msg("%s: accepted", bad[i].init);
    if (strcmp(err.path, bad[i].path)) fail_msg("%s: refused at %s (%s), not %s", bad[i].init, err.path, err.msg, bad[i].path);
  }
}

/* rank 0's slice of the job, decoded. */
static void slice_of(pw_job *job, pw_slice *out) {
  pw_plan p;
  pw_err err = {0};
  if (pw_plan_build(job, NULL, &p, &err)) fail_msg("plan: %s", err.msg);
  json_t *doc = pw_plan_json(job, &p);
  char *ptext = NULL, phex[PW_SHA256_HEX_LEN + 1], hex[PW_SHA256_HEX_LEN + 1];
  assert_int_equal(pw_slice_plan_text(doc, &ptext, phex), 0);
  char *text = NULL;
  if (pw_slice_build(job, &p, 0, phex, &text, hex, &err)) fail_msg("slice: %s", err.msg);
  if (pw_slice_decode(text, strlen(text), hex, out, &err)) fail_msg("decode: %s: %s", err.path, err.msg);
  free(text);
  free(ptext);
  json_decref(doc);
  pw_plan_free(&p);
}

static void test_slice(void **state) {
  (void)state;
  pw_job job;
  pw_err err = {0};
  pw_slice s;
  assert_int_equal(parse("{\"job\": 7, \"step\": 20, \"optimizer\": true}", &job, &err), 0);
  memcpy(job.init.checkpoint, ID_A, 65);
  memcpy(job.init.optimizer_checkpoint, ID_B, 65);
  slice_of(&job, &s);
  assert_string_equal(s.init_sha256, ID_A);
  assert_string_equal(s.init_optim_sha256, ID_B);
  pw_slice_free(&s);
  pw_job_free(&job);
  assert_int_equal(parse(NULL, &job, &err), 0);
  slice_of(&job, &s);
  assert_string_equal(s.init_sha256, "");
  assert_string_equal(s.init_optim_sha256, "");
  pw_slice_free(&s);
  pw_job_free(&job);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forms),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_slice),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
