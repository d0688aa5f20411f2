/* test_worker_tpx: the tensor-parallel all-reduce (worker/tpx.c) driven
 * through its narrow context alone — the members of a stage group as
 * threads of one process on fake links (test_worker_fakectx.h), no run, no
 * programs: a model of one value bounds the calls (pw_tpx_init sizes its
 * buffers by the largest value of a microbatch).
 *
 * For tp 2 and 3, SUM and MAX, sizes not divisible by tp and smaller than
 * tp, many calls in a row into one buffer (the receive buffers alternate
 * by the call's parity; a member may be a call ahead): every member ends
 * each call with the same bits, the member-order reduction
 * (((0 + x_0) + x_1) + x_2, or the largest), and sends
 * pw_coll_bytes_rs_ag of it; the fake link checks that nothing sent is
 * rewritten before it is read. A call over more floats than planned fails
 * with PW_EINTERNAL; frames of a call two ahead, larger than a shard, a sum
 * outside a call or of another call, of a non-member or of ourselves, are
 * refused by pw_tpx_dest. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>

#include "collective.h"
#include "tpx.h"
#include "test_worker_fakectx.h"

#define WIDTH 64 /* the one value: 1 row of 64 floats a sequence, microbatches of 1 */

static int tpx_dest(void *sub, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  return pw_tpx_dest(sub, from, h, dst, err);
}
static int tpx_done(void *sub, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  (void)payload;
  return pw_tpx_frame(sub, from, h, err);
}

/* Member t of a tp group (pp = dp = 1), with a one-value model. */
static void member(fk_net *net, int tp, int t, pw_tpx *x) {
  fk_rank *r = &net->r[t];
  fk_geom(r, 1, 1, tp, 1, NULL);
  pw_model *m = &r->cfg.sl.model;
  m->values = calloc(1, sizeof *m->values);
  assert_non_null(m->values);
  m->values[0] = (pw_value){.rows = 1, .width = WIDTH, .dtype = PW_DT_F32, .role = PW_VAL_ACT, .producer = -1};
  m->n_values = 1;
  r->route[PW_FRAME_TP] = (fk_route){tpx_dest, tpx_done, x};
  memset(x, 0, sizeof *x);
  assert_int_equal(pw_tpx_init(x, &r->cx), 0);
  assert_int_equal(x->smax, pw_shard_max(WIDTH, tp));
}

static void member_free(fk_rank *r, pw_tpx *x) {
  pw_tpx_close(x);
  free(r->cfg.sl.model.values);
  r->cfg.sl.model.values = NULL;
}

/* The calls: sizes (odd ones, n < tp, the largest) and ops. */
static const size_t SIZES[] = {1, 2, 5, 64, 7, 3, 63, 1, 64, 2, 33, 10};
#define CALLS (sizeof SIZES / sizeof SIZES[0])
static int op_of(size_t c) { return c % 3 == 2 ? PW_PROG_MAX : PW_PROG_SUM; }

typedef struct {
  pw_tpx x;
  float *in[CALLS], *out[CALLS];
  float buf[WIDTH];
  uint64_t bytes;
} tp_member;

static int calls_body(fk_rank *r, void *arg) {
  tp_member *a = arg;
  (void)r;
  for (size_t c = 0; c < CALLS; c++) {
    /* one buffer for every call, as a program's value is */
    memcpy(a->buf, a->in[c], SIZES[c] * sizeof(float));
    pw_err err = {0};
    int rc = pw_tpx_allreduce(&a->x, a->buf, SIZES[c], op_of(c), &err);
    if (rc) return rc;
    memcpy(a->out[c], a->buf, SIZES[c] * sizeof(float));
  }
  return 0;
}

static float draw(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  float u = (float)((*s >> 40) & 0xffffff) / 16777216.0f;
  static const float mag[5] = {1e-4f, 1e-1f, 1.0f, 1e3f, 1e7f};
  return ((*s >> 33) & 1 ? -1 : 1) * u * mag[(*s >> 20) % 5];
}

static void calls_case(int tp) {
  fk_net net;
  fk_net_init(&net, tp);
  tp_member a[3];
  void *args[3];
  uint64_t seed = 42 + (uint64_t)tp;
  for (int t = 0; t < tp; t++) {
    member(&net, tp, t, &a[t].x);
    for (size_t c = 0; c < CALLS; c++) {
      a[t].in[c] = malloc(SIZES[c] * sizeof(float));
      a[t].out[c] = malloc(SIZES[c] * sizeof(float));
      for (size_t i = 0; i < SIZES[c]; i++) a[t].in[c][i] = draw(&seed);
    }
    args[t] = &a[t];
  }
  fk_run(&net, NULL, tp, calls_body, args);
  int differs = 0;
  for (size_t c = 0; c < CALLS; c++) {
    size_t n = SIZES[c];
    for (size_t i = 0; i < n; i++) {
      float want = op_of(c) == PW_PROG_MAX ? a[0].in[c][i] : 0 + a[0].in[c][i], back = 0;
      for (int t = 1; t < tp; t++) want = op_of(c) == PW_PROG_MAX ? fmaxf(want, a[t].in[c][i]) : want + a[t].in[c][i];
      for (int t = tp - 1; t >= 0; t--) back += a[t].in[c][i];
      differs += op_of(c) == PW_PROG_SUM && fk_bits(want) != fk_bits(back);
      for (int t = 0; t < tp; t++)
        if (fk_bits(a[t].out[c][i]) != fk_bits(want))
          fail_msg("tp %d call %zu (%s of %zu) member %d element %zu: %.9g, want %.9g", tp, c,
                   op_of(c) == PW_PROG_MAX ? "max" : "sum", n, t, i, a[t].out[c][i], want);
    }
  }
  if (tp > 2) assert_true(differs > 0); /* the data tells member order from its reverse */
  for (int t = 0; t < tp; t++) {
    uint64_t bytes = 0;
    for (size_t c = 0; c < CALLS; c++) bytes += pw_coll_bytes_rs_ag(SIZES[c], tp, t);
    assert_int_equal(a[t].x.bytes, bytes);
    assert_int_equal(net.r[t].bytes_sent, bytes);
    assert_int_equal(a[t].x.call, CALLS);
    assert_int_equal(net.r[t].n_in, 0);
    assert_int_equal(net.r[t].n_fail, 0);
    for (size_t c = 0; c < CALLS; c++) free(a[t].in[c]), free(a[t].out[c]);
    member_free(&net.r[t], &a[t].x);
  }
  fk_net_free(&net);
}

static void test_allreduce_member_order(void **state) {
  (void)state;
  calls_case(2);
  calls_case(3);
}

/* One member driven by this thread: the other members' frames of calls 0
 * and 1, interleaved, call 1's reduce-scatter shard first (a member a call
 * ahead). */
static void test_early_call_by_parity(void **state) {
  (void)state;
  enum { TP = 2 };
  fk_net net;
  fk_net_init(&net, TP);
  net.solo = 1;
  pw_tpx x;
  member(&net, TP, 0, &x);
  fk_rank *r = &net.r[0];
  /* n = 4 per call: member 0 owns [0, 2), member 1 [2, 4) */
  const float mine[2][4] = {{1, 2, 3, 4}, {10, 20, 30, 40}};
  const float theirs[2][4] = {{0.5f, 0.25f, 100, 200}, {-1, -2, 300, 400}};
  pw_frame_hdr h;
  /* call 1's shard first (its sender finished call 0 already, it says), then call 0's */
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TP, FK_JOB, 1, 1, 0, PW_TPX_RS, PW_DTYPE_F32, 2), 0);
  fk_inject(r, 1, &h, theirs[1]);
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TP, FK_JOB, 0, 1, 0, PW_TPX_RS, PW_DTYPE_F32, 2), 0);
  fk_inject(r, 1, &h, theirs[0]);
  float sum0_hi[2] = {theirs[0][2] + mine[0][2], theirs[0][3] + mine[0][3]}; /* member 1's sums of call 0 */
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TP, FK_JOB, 0, 1, 0, PW_TPX_AG, PW_DTYPE_F32, 2), 0);
  fk_inject(r, 1, &h, sum0_hi);
  float buf[4];
  memcpy(buf, mine[0], sizeof buf);
  pw_err err = {0};
  assert_int_equal(pw_tpx_allreduce(&x, buf, 4, PW_PROG_SUM, &err), 0);
  for (int i = 0; i < 2; i++) assert_true(buf[i] == mine[0][i] + theirs[0][i]);
  for (int i = 2; i < 4; i++) assert_true(buf[i] == sum0_hi[i - 2]);
  /* what it sent: its copy of member 1's shard, then its sum */
  fk_rank *r1 = &net.r[1];
  assert_int_equal(r1->n_in, 2);
  assert_int_equal(fk_peek(r1, 0)->h.value, PW_TPX_RS);
  assert_int_equal(fk_peek(r1, 0)->h.payload_len, 8);
  assert_int_equal(fk_peek(r1, 1)->h.value, PW_TPX_AG);
  assert_int_equal(fk_peek(r1, 1)->h.step, 0);
  fk_drop_inbox(r1);
  /* call 1: its reduce-scatter shard is in already */
  float sum1_hi[2] = {theirs[1][2] + mine[1][2], theirs[1][3] + mine[1][3]};
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TP, FK_JOB, 1, 1, 0, PW_TPX_AG, PW_DTYPE_F32, 2), 0);
  fk_inject(r, 1, &h, sum1_hi);
  memcpy(buf, mine[1], sizeof buf);
  assert_int_equal(pw_tpx_allreduce(&x, buf, 4, PW_PROG_SUM, &err), 0);
  for (int i = 0; i < 2; i++) assert_true(buf[i] == mine[1][i] + theirs[1][i]);
  for (int i = 2; i < 4; i++) assert_true(buf[i] == sum1_hi[i - 2]);
  assert_int_equal(x.call, 2);
  assert_int_equal(r->n_fail, 0);
  member_free(r, &x);
  fk_net_free(&net);
}

static void refused(pw_tpx *x, int from, const pw_frame_hdr *h, const char *want) {
  pw_err err = {0};
  void *dst = (void *)1;
  int rc = pw_tpx_dest(x, from, h, &dst, &err);
  if (rc != PW_EPROTO) fail_msg("%s: accepted (%d)", want, rc);
  assert_null(dst);
  fk_err_has(&err, want);
}

static pw_frame_hdr tp_hdr(uint32_t call, int t, int what, int dtype, size_t n) {
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TP, FK_JOB, call, (uint32_t)t, 0, (uint32_t)what, dtype, n), 0);
  return h;
}

static void test_frame_refusals(void **state) {
  (void)state;
  enum { TP = 3 };
  fk_net net;
  fk_net_init(&net, TP);
  net.solo = 1;
  pw_tpx x;
  member(&net, TP, 1, &x); /* member 1 of 3: smax 22 */
  size_t smax = x.smax;
  x.call = 6;
  pw_frame_hdr h;
  void *dst;
  pw_err err = {0};
  /* fits: this call's and the next's reduce-scatter shards, by parity */
  h = tp_hdr(6, 0, PW_TPX_RS, PW_DTYPE_F32, smax);
  assert_int_equal(pw_tpx_dest(&x, 0, &h, &dst, &err), 0);
  assert_ptr_equal(dst, x.rx[0]);
  h = tp_hdr(7, 2, PW_TPX_RS, PW_DTYPE_F32, 3);
  assert_int_equal(pw_tpx_dest(&x, 2, &h, &dst, &err), 0);
  assert_ptr_equal(dst, x.rx[1] + smax); /* member 2 is our second other member */
  /* calls other than this one and the next */
  h = tp_hdr(8, 0, PW_TPX_RS, PW_DTYPE_F32, 3);
  refused(&x, 0, &h, "tensor-parallel call 8 from rank 0 while at call 6");
  h = tp_hdr(5, 0, PW_TPX_RS, PW_DTYPE_F32, 3);
  refused(&x, 0, &h, "call 5");
  /* a shard larger than any call's */
  h = tp_hdr(6, 0, PW_TPX_RS, PW_DTYPE_F32, smax + 1);
  refused(&x, 0, &h, "more than");
  /* senders: not a member, ourselves, another member's place, a place past tp */
  h = tp_hdr(6, 0, PW_TPX_RS, PW_DTYPE_F32, 3);
  refused(&x, 2, &h, "from rank 2 does not fit");
  h = tp_hdr(6, 1, PW_TPX_RS, PW_DTYPE_F32, 3);
  refused(&x, 1, &h, "does not fit");
  h = tp_hdr(6, 3, PW_TPX_RS, PW_DTYPE_F32, 3);
  refused(&x, 0, &h, "does not fit");
  h = tp_hdr(6, 0, PW_TPX_RS, PW_DTYPE_I32, 3);
  refused(&x, 0, &h, "does not fit");
  /* a sum outside a call */
  h = tp_hdr(6, 0, PW_TPX_AG, PW_DTYPE_F32, 3);
  refused(&x, 0, &h, "tensor-parallel sum of call 6 from rank 0 while at call 6");
  /* inside one: of this call, the sender's shard exactly */
  float buf[WIDTH];
  x.buf = buf, x.n = 10; /* shards [0, 4) [4, 7) [7, 10) */
  h = tp_hdr(6, 2, PW_TPX_AG, PW_DTYPE_F32, 3);
  assert_int_equal(pw_tpx_dest(&x, 2, &h, &dst, &err), 0);
  assert_ptr_equal(dst, buf + 7);
  h = tp_hdr(6, 0, PW_TPX_AG, PW_DTYPE_F32, 4);
  assert_int_equal(pw_tpx_dest(&x, 0, &h, &dst, &err), 0);
  assert_ptr_equal(dst, buf);
  h = tp_hdr(6, 0, PW_TPX_AG, PW_DTYPE_F32, 3);
  refused(&x, 0, &h, "tensor-parallel sum of 12 bytes from rank 0, expected 16");
  h = tp_hdr(7, 0, PW_TPX_AG, PW_DTYPE_F32, 4);
  refused(&x, 0, &h, "sum of call 7");
  x.buf = NULL, x.n = 0;
  member_free(&net.r[1], &x);
  fk_net_free(&net);
}

static void test_more_than_planned(void **state) {
  (void)state;
  enum { TP = 2 };
  fk_net net;
  fk_net_init(&net, TP);
  net.solo = 1;
  pw_tpx x;
  member(&net, TP, 0, &x);
  float buf[WIDTH + 2] = {0};
  pw_err err = {0};
  assert_int_equal(pw_tpx_allreduce(&x, buf, WIDTH + 2, PW_PROG_SUM, &err), PW_EINTERNAL);
  fk_err_has(&err, "an all-reduce of 66 floats: more than planned");
  assert_int_equal(net.r[1].n_in, 0); /* nothing sent */
  assert_int_equal(x.call, 0);
  member_free(&net.r[0], &x);
  fk_net_free(&net);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_allreduce_member_order),
      cmocka_unit_test(test_early_call_by_parity),
      cmocka_unit_test(test_frame_refusals),
      cmocka_unit_test(test_more_than_planned),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
