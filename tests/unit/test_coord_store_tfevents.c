/* test_coord_store_tfevents: a job's TensorBoard event file from its
 * store rows (pw_store_tfevents, store.h), read back with our reader.
 *
 *  - the file: file_version at the job's created time, then per run a
 *    SessionLog START at its first row's step and time, then an event per
 *    row at the row's step and time, runs oldest first; run > 0 keeps that
 *    run's rows only; a job without rows is the version record alone;
 *  - each scalar is the row's column as float32 under its tag; a NULL (a
 *    NaN written) leaves its tag out, and a row with nothing left gives no
 *    event;
 *  - pipeline figures come only from timings of the same run and step:
 *    the span over every rank's F/B/I/W actions (kinds as letters or 0..3;
 *    other actions such as "T" do not count), each rank's busy seconds and
 *    idle share, and the all-rank bubble (idle / (ranks x span));
 *  - what out held before stays in front; an unknown job is PW_ENOENT and
 *    out is left as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storetest.h"
#include "tfevents.h"

static char g_dir[64];
STORETEST_FIXTURE(g_dir, "tfevents")


static void metric(pw_store *s, int64_t job, int64_t run, int step, double loss, double eval, double lr) {
  pw_metric m = {.step = step, .loss = loss, .step_time = NAN, .tokens = NAN, .tokens_per_s = NAN,
                 .grad_norm = NAN, .lr = lr, .eval_loss = eval};
  if (step == 0) m.step_time = 0.25, m.tokens = 128, m.tokens_per_s = 512, m.grad_norm = 0.75;
  pw_err err = {0};
  if (pw_store_metric_insert(s, job, run, &m, &err)) fail_msg("metric: %s", err.msg);
}

static void timing(pw_store *s, int64_t job, int64_t run, int step, int rank, const char *actions) {
  pw_err err = {0};
  if (pw_store_timing_insert(s, job, run, step, rank, actions, &err)) fail_msg("timing: %s", err.msg);
}

/* The file's events as text lines: "V", "S step", "E step tag=value ...",
 * each event's wall time checked against want_time[k] (NULL: not). */
static void events_text(const pw_tf_buf *b, size_t from, char *out, size_t cap, double *times, int *n) {
  pw_tf_reader r;
  pw_tf_reader_init(&r, b->data + from, b->len - from, "t");
  pw_tf_event ev;
  pw_err err = {0};
  size_t l = 0;
  int rc;
  *n = 0;
  out[0] = 0;
  while ((rc = pw_tf_read(&r, &ev, &err)) == 1) {
    times[(*n)++] = ev.wall_time;
    if (ev.kind == PW_TF_VERSION) l += (size_t)snprintf(out + l, cap - l, "V %s|", ev.version);
    else if (ev.kind == PW_TF_START) l += (size_t)snprintf(out + l, cap - l, "S %lld|", (long long)ev.step);
    else {
      l += (size_t)snprintf(out + l, cap - l, "E %lld", (long long)ev.step);
      for (int i = 0; i < ev.n_values; i++)
        l += (size_t)snprintf(out + l, cap - l, " %s=%.9g", ev.values[i].tag, ev.values[i].value);
      l += (size_t)snprintf(out + l, cap - l, "|");
    }
  }
  if (rc) fail_msg("reading back: %s", err.msg);
  pw_tf_reader_free(&r);
}

/* time of (run, step)'s metrics row. */
static double row_time(const char *path, int64_t run, int step) {
  char sql[160];
  snprintf(sql, sizeof sql, "SELECT CAST(time * 1000000 AS INTEGER) FROM metrics WHERE run_id = %lld AND step = %d",
           (long long)run, step);
  return (double)raw_int(path, sql) / 1e6;
}

static void test_file(void **state) {
  (void)state;
  char path[256], text[4096];
  pw_store *s = store_open_at(g_dir, "tf.db", path, sizeof path);
  int64_t job = store_new_job(s, 4), empty = store_new_job(s, 4), r1 = store_new_run(s, job), r2 = store_new_run(s, job);
  metric(s, job, r1, 0, 2.5, NAN, 1e-3);
  metric(s, job, r1, 1, NAN, 3.0, 2e-3);  /* a diverged loss is NULL; an eval */
  metric(s, job, r1, 2, NAN, NAN, NAN);   /* nothing to show: no event */
  metric(s, job, r2, 1, 2.25, NAN, 2e-3); /* the second run starts over at step 1 */
  metric(s, job, r2, 2, 2.0, NAN, 3e-3);
  /* run 1 step 1: rank 0 F 0..1, B 2..3 and a collective T 3..9 (not counted);
   * rank 1 kinds as numbers: F 1..2, B 3..4.5. Span 0..4.5, busy 2 and 2.5. */
  timing(s, job, r1, 1, 0, "[[\"F\",0,0,0.0,1.0],[\"B\",0,0,2.0,3.0],[\"T\",0,0,3.0,9.0]]");
  timing(s, job, r1, 1, 1, "[[0,0,1,1.0,2.0],[1,0,1,3.0,4.5]]");
  /* run 2 step 2: one rank, busy all along: bubble 0 */
  timing(s, job, r2, 2, 0, "[[\"F\",0,0,10.0,11.0],[\"W\",0,0,11.0,12.0]]");
  /* a timing of a step no row of its run has: shown nowhere */
  timing(s, job, r2, 5, 0, "[[\"F\",0,0,0.0,1.0]]");

  pw_tf_buf b = {0};
  pw_err err = {0};
  double created = 0, times[32];
  int n;
  assert_int_equal(pw_store_tfevents(s, job, 0, &b, &created, &err), 0);
  assert_true(created > 1e9);
  events_text(&b, 0, text, sizeof text, times, &n);
  const char *want =
      "V brain.Event:2|"
      "S 0|E 0 train/loss=2.5 train/lr=0.00100000005 train/grad_norm=0.75 train/tokens_per_s=512 train/step_time=0.25|"
      "E 1 eval/loss=3 train/lr=0.00200000009 pipeline/bubble=0.5 pipeline/rank0/busy_s=2 "
      "pipeline/rank0/bubble=0.555555582 pipeline/rank1/busy_s=2.5 pipeline/rank1/bubble=0.444444448|"
      "S 1|E 1 train/loss=2.25 train/lr=0.00200000009|"
      "E 2 train/loss=2 train/lr=0.00300000003 pipeline/bubble=0 pipeline/rank0/busy_s=2 pipeline/rank0/bubble=0|";
  if (strcmp(text, want)) fail_msg("the file reads\n%s\nnot\n%s", text, want);
  /* wall times: created, then each START at its run's first row, each row at its own */
  double rows[] = {row_time(path, r1, 0), row_time(path, r1, 0), row_time(path, r1, 1), row_time(path, r2, 1),
                   row_time(path, r2, 1), row_time(path, r2, 2)};
  assert_true(fabs(times[0] - created) < 1e-9);
  for (int k = 0; k < 6; k++)
    if (fabs(times[k + 1] - rows[k]) > 2e-6) fail_msg("event %d at %.6f, its row at %.6f", k + 1, times[k + 1], rows[k]);

  /* one run: its rows only, after what out already held */
  size_t before = b.len;
  assert_int_equal(pw_store_tfevents(s, job, r2, &b, NULL, &err), 0);
  events_text(&b, before, text, sizeof text, times, &n);
  want = "V brain.Event:2|S 1|E 1 train/loss=2.25 train/lr=0.00200000009|"
         "E 2 train/loss=2 train/lr=0.00300000003 pipeline/bubble=0 pipeline/rank0/busy_s=2 pipeline/rank0/bubble=0|";
  if (strcmp(text, want)) fail_msg("run %lld's file reads\n%s\nnot\n%s", (long long)r2, text, want);
  events_text(&b, 0, text, sizeof text, times, &n);
  assert_int_equal(n, 7 + 4); /* the first file stayed whole in front */

  /* a job without rows: the version record alone; an unknown job: ENOENT, out untouched */
  pw_tf_buf e = {0};
  assert_int_equal(pw_store_tfevents(s, empty, 0, &e, NULL, &err), 0);
  events_text(&e, 0, text, sizeof text, times, &n);
  assert_string_equal(text, "V brain.Event:2|");
  size_t len = e.len;
  assert_int_equal(pw_store_tfevents(s, 987654, 0, &e, NULL, &err), PW_ENOENT);
  assert_string_equal(err.path, "job");
  assert_int_equal(e.len, len);
  pw_tf_buf_free(&e);
  pw_tf_buf_free(&b);
  pw_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_file)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
