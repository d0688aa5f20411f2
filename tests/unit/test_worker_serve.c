/* test_worker_serve: a serve rank's request queue (worker/serve.c) through
 * its narrow context alone (test_worker_fakectx.h: geometry and a model's
 * sizes, no run, no programs — pw_serve_create and pw_serve_submit need
 * nothing else).
 *
 * pw_serve_submit takes a request only on pipeline rank 0, only when its
 * prompt (1 .. serve_len tokens, each in the vocabulary) and its new tokens
 * fit serve_len, top_p is at most 1 (NaN is not) and top_k fits an i32,
 * and only while the queue (serve_seqs + serve_queue) has room; each
 * refusal says why and wakes nobody, each acceptance wakes the compute
 * thread once. pw_serve_create refuses an assignment without the serving
 * sizes, a serve_len past the model's seq_len, and a placement other than
 * one stage per pipeline rank in order. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>

#include "serve.h"
#include "test_worker_fakectx.h"

enum { PP = 2, V = 50, SEQ = 16 };

/* pp = 2, stage s on rank s; the model's sizes only. */
static void ctx(fk_net *net, const int *placement, int S) {
  fk_net_init(net, PP);
  for (int k = 0; k < PP; k++) {
    fk_geom(&net->r[k], PP, 1, 1, S, placement);
    net->r[k].cfg.sl.model.seq_len = SEQ;
    net->r[k].cfg.sl.model.data.vocab_size = V;
  }
}

static const pw_msg_assign ASSIGN = {.serve_seqs = 2, .serve_len = 8, .serve_queue = 1};

typedef struct {
  pw_msg_generate g;
  json_t *prompt;
} req;

static req make(int n, int first, int64_t max_tokens) {
  req q = {.prompt = json_array()};
  for (int i = 0; i < n; i++) json_array_append_new(q.prompt, json_integer(first + i));
  q.g = (pw_msg_generate){.job = FK_JOB, .run = 1, .req = 100 + n, .prompt = q.prompt, .max_tokens = max_tokens,
                          .temperature = 0.7, .top_k = 5, .top_p = 0.9, .seed = 3};
  return q;
}

static void refused(pw_serve *s, fk_rank *r, req q, const char *want) {
  char why[256] = "";
  int wakes = atomic_load(&r->wakes);
  int rc = pw_serve_submit(s, &q.g, why, sizeof why);
  json_decref(q.prompt);
  if (rc >= 0) fail_msg("%s: accepted", want);
  if (!strstr(why, want)) fail_msg("refused with \"%s\", expected \"%s\"", why, want);
  assert_int_equal(atomic_load(&r->wakes), wakes);
}

static void accepted(pw_serve *s, fk_rank *r, req q) {
  char why[256] = "";
  int wakes = atomic_load(&r->wakes);
  int rc = pw_serve_submit(s, &q.g, why, sizeof why);
  json_decref(q.prompt);
  if (rc) fail_msg("refused: %s", why);
  assert_int_equal(atomic_load(&r->wakes), wakes + 1);
}

static void test_submit(void **state) {
  (void)state;
  fk_net net;
  ctx(&net, NULL, PP);
  fk_rank *r = &net.r[0];
  pw_serve *s;
  pw_err err = {0};
  assert_int_equal(pw_serve_create(&s, &r->cx, &ASSIGN, &err), 0);
  /* sizes: serve_len 8 holds the prompt and all but the last new token */
  refused(s, r, make(9, 0, 1), "9 prompt tokens and 1 new ones do not fit serve.max_len 8");
  refused(s, r, make(0, 0, 1), "0 prompt tokens");
  refused(s, r, make(4, 0, 6), "4 prompt tokens and 6 new ones do not fit");
  /* the vocabulary */
  refused(s, r, make(3, V - 2, 1), "prompt[2]: token 50 is not in 0..49");
  refused(s, r, make(3, -1, 1), "prompt[0]: token -1 is not in 0..49");
  /* sampling */
  req q = make(2, 0, 1);
  q.g.top_p = 1.5;
  refused(s, r, q, "top_p 1.5 over 1");
  q = make(2, 0, 1);
  q.g.top_p = NAN;
  refused(s, r, q, "top_p nan over 1");
  q = make(2, 0, 1);
  q.g.top_k = (int64_t)INT32_MAX + 1;
  refused(s, r, q, "top_k 2147483648 over 2147483647");
  /* taken: the longest that fits, top_p exactly 1, a top_k past V */
  accepted(s, r, make(4, 0, 5));
  q = make(8, V - 8, 1);
  q.g.top_p = 1;
  q.g.top_k = 1000;
  accepted(s, r, q);
  accepted(s, r, make(1, 0, 8));
  /* the queue holds serve_seqs + serve_queue = 3 until the compute thread takes them */
  refused(s, r, make(1, 0, 1), "the queue of 3 requests is full");
  assert_int_equal(atomic_load(&r->wakes), 3);
  pw_serve_free(s); /* frees the queued prompts (ASan) */
  /* other pipeline ranks take no requests */
  fk_rank *r1 = &net.r[1];
  assert_int_equal(pw_serve_create(&s, &r1->cx, &ASSIGN, &err), 0);
  refused(s, r1, make(2, 0, 1), "rank 1 of job 77 does not take requests");
  pw_serve_free(s);
  fk_net_free(&net);
}

static void test_create_refusals(void **state) {
  (void)state;
  fk_net net;
  ctx(&net, NULL, PP);
  fk_rank *r = &net.r[0];
  pw_serve *s = (pw_serve *)1;
  pw_err err = {0};
  pw_msg_assign a = ASSIGN;
  a.serve_seqs = 0;
  assert_int_equal(pw_serve_create(&s, &r->cx, &a, &err), PW_EPROTO);
  assert_null(s);
  fk_err_has(&err, "serve_seqs, serve_len and serve_queue");
  a = ASSIGN, a.serve_len = 0;
  assert_int_equal(pw_serve_create(&s, &r->cx, &a, &err), PW_EPROTO);
  a = ASSIGN, a.serve_queue = -1;
  assert_int_equal(pw_serve_create(&s, &r->cx, &a, &err), PW_EPROTO);
  a = ASSIGN, a.serve_len = SEQ + 1;
  memset(&err, 0, sizeof err);
  assert_int_equal(pw_serve_create(&s, &r->cx, &a, &err), PW_EPROTO);
  fk_err_has(&err, "17 is over the model's seq_len 16");
  a.serve_len = SEQ;
  assert_int_equal(pw_serve_create(&s, &r->cx, &a, &err), 0);
  pw_serve_free(s);
  fk_net_free(&net);
  /* two stages a rank; stages out of order */
  static const int interleaved[4] = {0, 1, 0, 1}, swapped[2] = {1, 0};
  ctx(&net, interleaved, 4);
  memset(&err, 0, sizeof err);
  assert_int_equal(pw_serve_create(&s, &net.r[0].cx, &ASSIGN, &err), PW_ENOTSUP);
  fk_err_has(&err, "serving runs one stage per pipeline rank, in order");
  fk_net_free(&net);
  ctx(&net, swapped, 2);
  assert_int_equal(pw_serve_create(&s, &net.r[0].cx, &ASSIGN, &err), PW_ENOTSUP);
  fk_net_free(&net);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_submit),
      cmocka_unit_test(test_create_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
