/* test_worker_fixture: runs of the worker library (worker/run.h) made from
 * real slices — a job spec, pw_plan_build, pw_slice_build, the assign
 * message a coordinator would send — with pw_run_create, the constructor
 * the daemon uses, on a private libuv loop and without a daemon.
 * Included by tests/unit/test_worker_*.c (after cmocka.h). */
#ifndef PW_TEST_WORKER_FIXTURE_H
#define PW_TEST_WORKER_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan.h"
#include "run.h"
#include "slice.h"
#include "spec_json.h"

#define WF_JOB 77

typedef struct {
  pw_job job;
  pw_plan plan;
  char plan_sha[PW_SHA256_HEX_LEN + 1];
  uv_loop_t loop;
} wf_job;

static wf_job *wf_job_make(const char *spec) {
  wf_job *f = calloc(1, sizeof *f);
  json_t *j = json_loads(spec, 0, NULL);
  pw_err err = {0};
  char b[600];
  if (!f || !j || pw_job_parse(j, NULL, &f->job, &err)) fail_msg("spec: %s", pw_err_str(&err, b, sizeof b));
  json_decref(j);
  if (pw_plan_build(&f->job, NULL, &f->plan, &err)) fail_msg("plan: %s", pw_err_str(&err, b, sizeof b));
  json_t *doc = pw_plan_json(&f->job, &f->plan);
  char *text;
  assert_int_equal(pw_slice_plan_text(doc, &text, f->plan_sha), 0);
  free(text);
  json_decref(doc);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  return f;
}

static void wf_job_free(wf_job *f) {
  assert_int_equal(uv_loop_close(&f->loop), 0); /* every run's handle is closed */
  pw_plan_free(&f->plan);
  pw_job_free(&f->job);
  free(f);
}

/* Rank `rank`'s run, as the daemon makes it from its assign message. */
static pw_run *wf_run(wf_job *f, int rank, int steps) {
  char *text, hex[PW_SHA256_HEX_LEN + 1], b[600];
  pw_err err = {0};
  if (pw_slice_build(&f->job, &f->plan, rank, f->plan_sha, &text, hex, &err))
    fail_msg("slice of rank %d: %s", rank, pw_err_str(&err, b, sizeof b));
  json_t *peers = json_array();
  for (int k = 0; k < f->plan.pp * f->plan.dp; k++) /* one machine */
    json_array_append_new(peers, json_pack("{s:i, s:s, s:s}", "rank", k, "addr", "127.0.0.1:9", "host", "m"));
  pw_msg_assign a = {.job = WF_JOB, .run = 1, .rank = rank, .slice = text, .slice_sha256 = hex, .peers = peers,
                     .steps = steps, .start_step = 0, .trace_every = 0};
  pw_run *r = NULL;
  if (pw_run_create(&f->loop, &a, NULL, "/nonexistent", NULL, &r, &err))
    fail_msg("run of rank %d: %s", rank, pw_err_str(&err, b, sizeof b));
  json_decref(peers);
  free(text);
  assert_int_equal(pw_exec_chunk_limit(r), 0);
  return r;
}

/* Writes all n bytes to fd (blocking), as a run's loop writes what a
 * socket did not take at once. */
static inline void wf_write_all(int fd, const void *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    assert_true(w > 0);
    p = (const uint8_t *)p + w;
    n -= (size_t)w;
  }
}

/* Frees a run the way the daemon does, closing its handle on the loop (one
 * turn of it: the other runs' handles keep it alive). Its events are
 * dropped first: there is no daemon to act on them. */
static void wf_run_free(wf_job *f, pw_run *r) {
  pw_event ev;
  while (pw_run_event_next(r, &ev)) {
  }
  pw_run_free(r);
  uv_run(&f->loop, UV_RUN_NOWAIT);
}

#endif
