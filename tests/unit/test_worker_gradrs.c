/* test_worker_gradrs: ZeRO-2's reduce-scatter of weight gradients inside
 * the actions (worker/gradrs.c) driven through its narrow context alone —
 * the replicas as threads of one process on fake links
 * (test_worker_fakectx.h), each with its stage program made from its real
 * slice at train.zero 2 and the exchange pw_dpx_init makes, no run. The
 * flushes are called as a program calls them (pw_prog_wgrad_fn), with
 * spans and a scratch of the test's own.
 *
 * For dp 2 and 3, a run of flushes — a span across shard boundaries, two
 * spans, a span that meets only one shard (the others get empty frames),
 * none at all — into one scratch rewritten between flushes (the fake link
 * fails a piece rewritten before it is read; pw_gradrs_flush waits for its
 * sends): every replica's shard of the arena is, bit for bit, the sum over
 * the flushes of the replicas' pieces added in replica order
 * (acc += ((0 + s_0) + s_1) + s_2). Frames: a piece past the receive
 * buffer, of a flush two ahead or behind, of a non-peer, ourselves, a
 * replica past dp, another stage or dtype, is refused by pw_gradrs_dest
 * (and through pw_dpx_dest); a DP frame that claims to be a gradient piece
 * in a run without ZeRO-2 must be refused too, not crash the worker. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collective.h"
#include "dpx.h"
#include "gradrs.h"
#include "test_worker_fakectx.h"

static const char *SPEC =
    "{\"name\":\"gradrs\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":2,\"n_heads\":2},"
    "\"mesh\":{\"pp\":1,\"dp\":DP},\"schedule\":{\"name\":\"1f1b\",\"microbatches\":2},"
    "\"train\":{\"steps\":10,\"batch_size\":12,\"seed\":11,\"checkpoint_every\":0,\"snapshot_every\":0,\"zero\":ZZ,"
    "\"optimizer\":{\"name\":\"adamw\",\"lr\":0.01}},"
    "\"data\":{\"kind\":\"copy\"}}";

static fk_job *job(int dp, int zero) {
  char spec[1024], *o = spec;
  for (const char *s = SPEC; *s; s++) {
    if (!strncmp(s, "DP", 2)) o += sprintf(o, "%d", dp), s++;
    else if (!strncmp(s, "ZZ", 2)) o += sprintf(o, "%d", zero), s++;
    else *o++ = *s;
  }
  *o = 0;
  return fk_job_make(spec);
}

static int dpx_dest(void *sub, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  return pw_dpx_dest(sub, from, h, dst, err);
}
static int dpx_done(void *sub, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  return pw_dpx_frame(sub, from, h, payload, err);
}

static float draw(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  float u = (float)((*s >> 40) & 0xffffff) / 16777216.0f;
  static const float mag[5] = {1e-4f, 1e-1f, 1.0f, 1e3f, 1e7f};
  return ((*s >> 33) & 1 ? -1 : 1) * u * mag[(*s >> 20) % 5];
}

/* ---- the flushes ------------------------------------------------------------------ */

#define FLUSHES 6
#define MAXSPANS 2

typedef struct {
  int ns;
  size_t spans[MAXSPANS][2]; /* {offset, floats} in the trained arena */
} flush_plan;

typedef struct {
  pw_dpx D;
  const flush_plan *plan;
  float *scratch;          /* one for every flush, as the program's is */
  float *data[FLUSHES];    /* what each flush's scratch holds */
  float *shard;            /* our shard of the arena at the end */
  size_t lo, hi;
} rs_replica;

static size_t plan_floats(const flush_plan *p) {
  size_t n = 0;
  for (int k = 0; k < p->ns; k++) n += p->spans[k][1];
  return n;
}

static int flush_body(fk_rank *r, void *arg) {
  rs_replica *a = arg;
  pw_gradrs_stage *s = &a->D.gradrs->st[0];
  (void)r;
  for (int f = 0; f < FLUSHES; f++) {
    memcpy(a->scratch, a->data[f], plan_floats(&a->plan[f]) * sizeof(float));
    pw_err err = {0};
    int rc = pw_gradrs_flush(s, a->scratch, (const size_t(*)[2])a->plan[f].spans, a->plan[f].ns, &err);
    if (rc) return rc;
  }
  memcpy(a->shard, s->arena + a->lo, (a->hi - a->lo) * sizeof(float));
  return 0;
}

static void flush_case(int dp) {
  fk_job *f = job(dp, 2);
  fk_net net;
  fk_net_init(&net, dp);
  rs_replica a[3];
  void *args[3];
  size_t tn = 0, cap = 0;
  for (int d = 0; d < dp; d++) {
    fk_rank *r = &net.r[d];
    fk_rank_slice(r, f, d, 10);
    fk_rank_progs(r, 2);
    r->route[PW_FRAME_DP] = (fk_route){dpx_dest, dpx_done, &a[d].D};
    assert_int_equal(pw_dpx_zero(&r->cx), 2);
    assert_int_equal(pw_dpx_init(&a[d].D, &r->cx), 0);
    assert_non_null(a[d].D.gradrs);
    tn = pw_prog_train_numel(r->ls[0].prog), cap = a[d].D.gradrs->st[0].cap;
    pw_shard_range(tn, dp, d, &a[d].lo, &a[d].hi);
    args[d] = &a[d];
  }
  assert_true(cap >= 40);
  /* the shards' boundaries: [0, b1) [b1, b2) ... */
  size_t b1 = a[1].lo, b2 = dp > 2 ? a[2].lo : tn;
  size_t w = cap / 2 < 60 ? cap / 2 : 60; /* at most cap floats of a flush meet any one shard */
  flush_plan plan[FLUSHES] = {
      {1, {{b1 - w / 2, w}}},                            /* across the first boundary */
      {2, {{3, w / 4}, {b2 - w / 3, w / 2}}},            /* in shard 0; across the second (or to the end) */
      {1, {{b1 + 1, w / 2}}},                            /* in shard 1 only: the others get empty frames */
      {0, {{0, 0}}},                                     /* none: empty frames all round */
      {1, {{b1 - w / 2, w}}},                            /* the first again: its parity's buffers reused */
      {2, {{b1 - 7, 7}, {b1, w / 2}}},                   /* two spans, ending and starting at a boundary */
  };
  if (dp == 2) plan[1].spans[1][0] = tn - w / 2, plan[1].spans[1][1] = w / 2; /* the second span at the end */
  uint64_t seed = 5 + (uint64_t)dp;
  for (int d = 0; d < dp; d++) {
    a[d].plan = plan;
    a[d].scratch = malloc(2 * cap * sizeof(float) + 4);
    a[d].shard = malloc((a[d].hi - a[d].lo) * sizeof(float) + 4);
    for (int fl = 0; fl < FLUSHES; fl++) {
      size_t n = plan_floats(&plan[fl]);
      assert_true(n <= 2 * cap);
      a[d].data[fl] = malloc(n * sizeof(float) + 4);
      for (size_t i = 0; i < n; i++) a[d].data[fl][i] = draw(&seed);
    }
  }
  fk_run(&net, NULL, dp, flush_body, args);
  /* the reference: every element of the arena, flush after flush */
  float *want = calloc(tn, sizeof(float));
  int differs = 0;
  for (int fl = 0; fl < FLUSHES; fl++) {
    size_t at = 0;
    for (int k = 0; k < plan[fl].ns; k++) {
      for (size_t i = 0; i < plan[fl].spans[k][1]; i++) {
        float s = 0, back = 0;
        for (int d = 0; d < dp; d++) s += a[d].data[fl][at + i];
        for (int d = dp - 1; d >= 0; d--) back += a[d].data[fl][at + i];
        differs += fk_bits(s) != fk_bits(back);
        want[plan[fl].spans[k][0] + i] += s;
      }
      at += plan[fl].spans[k][1];
    }
  }
  if (dp > 2) assert_true(differs > 0);
  for (int d = 0; d < dp; d++) {
    for (size_t i = a[d].lo; i < a[d].hi; i++)
      if (fk_bits(a[d].shard[i - a[d].lo]) != fk_bits(want[i]))
        fail_msg("dp %d replica %d arena[%zu]: %.9g, want %.9g (replica order)", dp, d, i, a[d].shard[i - a[d].lo],
                 want[i]);
    /* frames: to each other replica a piece per span meeting its shard, else one empty */
    int frames = 0;
    uint64_t bytes = 0;
    for (int fl = 0; fl < FLUSHES; fl++)
      for (int j = 0; j < dp; j++) {
        if (j == d) continue;
        int met = 0;
        for (int k = 0; k < plan[fl].ns; k++) {
          size_t s0 = plan[fl].spans[k][0], s1 = s0 + plan[fl].spans[k][1];
          size_t ia = s0 > a[j].lo ? s0 : a[j].lo, ib = s1 < a[j].hi ? s1 : a[j].hi;
          if (ia < ib) met++, bytes += (ib - ia) * sizeof(float);
        }
        frames += met ? met : 1;
      }
    assert_int_equal(net.r[d].frames_sent, frames);
    assert_int_equal(net.r[d].bytes_sent, bytes);
    assert_int_equal(a[d].D.bytes, bytes);
    assert_int_equal(a[d].D.gradrs->call, FLUSHES);
    assert_int_equal(atomic_load(&a[d].D.gradrs->pending), 0);
    assert_int_equal(net.r[d].n_in, 0);
    assert_int_equal(net.r[d].n_fail, 0);
  }
  free(want);
  for (int d = 0; d < dp; d++) {
    pw_dpx_close(&a[d].D);
    free(a[d].scratch), free(a[d].shard);
    for (int fl = 0; fl < FLUSHES; fl++) free(a[d].data[fl]);
  }
  fk_net_free(&net);
  fk_job_free(f);
}

static void test_flush_replica_order(void **state) {
  (void)state;
  flush_case(2);
  flush_case(3);
}

/* ---- frames ------------------------------------------------------------------------ */

static pw_frame_hdr piece(uint32_t flush, int replica, int stage, size_t off, int dtype, size_t n) {
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_DP, FK_JOB, flush, (uint32_t)replica, (uint32_t)stage,
                                         (uint32_t)PW_GRADRS_PIECE | (uint32_t)off << 4, dtype, n),
                   0);
  return h;
}

static void refused(pw_dpx *D, int from, const pw_frame_hdr *h, const char *want) {
  pw_err err = {0};
  void *dst = (void *)1;
  int rc = pw_gradrs_dest(D->gradrs, from, h, &dst, &err);
  if (rc != PW_EPROTO) fail_msg("%s: accepted (%d)", want, rc);
  assert_null(dst);
  fk_err_has(&err, want);
  /* the same through the data-parallel exchange's dispatch */
  memset(&err, 0, sizeof err);
  dst = (void *)1;
  assert_int_equal(pw_dpx_dest(D, from, h, &dst, &err), PW_EPROTO);
  assert_null(dst);
  fk_err_has(&err, want);
  memset(&err, 0, sizeof err);
  assert_int_equal(pw_gradrs_frame(D->gradrs, from, h, &err), PW_EPROTO);
}

static void test_piece_refusals(void **state) {
  (void)state;
  enum { DP = 3 };
  fk_job *f = job(DP, 2);
  fk_net net;
  fk_net_init(&net, DP);
  net.solo = 1;
  fk_rank *r = &net.r[1]; /* replica 1 */
  fk_rank_slice(r, f, 1, 10);
  fk_rank_progs(r, 2);
  pw_dpx D;
  assert_int_equal(pw_dpx_init(&D, &r->cx), 0);
  pw_gradrs *g = D.gradrs;
  pw_gradrs_stage *s = &g->st[0];
  size_t cap = s->cap;
  g->call = 5;
  pw_frame_hdr h;
  void *dst;
  pw_err err = {0};
  /* fits: a whole buffer's piece of this flush from replica 0, of the next from replica 2, an empty one */
  h = piece(5, 0, 0, 0, PW_DTYPE_F32, cap);
  assert_int_equal(pw_gradrs_dest(g, 0, &h, &dst, &err), 0);
  assert_ptr_equal(dst, s->rx[1]);
  h = piece(6, 2, 0, 10, PW_DTYPE_F32, cap - 10);
  assert_int_equal(pw_gradrs_dest(g, 2, &h, &dst, &err), 0);
  assert_ptr_equal(dst, s->rx[0] + cap + 10);
  assert_int_equal(pw_dpx_dest(&D, 2, &h, &dst, &err), 0); /* the exchange passes it on */
  assert_ptr_equal(dst, s->rx[0] + cap + 10);
  h = piece(5, 2, 0, 0, PW_DTYPE_F32, 0);
  assert_int_equal(pw_gradrs_dest(g, 2, &h, &dst, &err), 0);
  /* past the buffer */
  h = piece(5, 0, 0, cap - 3, PW_DTYPE_F32, 4);
  refused(&D, 0, &h, "does not fit");
  h = piece(5, 0, 0, 0, PW_DTYPE_F32, cap + 1);
  refused(&D, 0, &h, "does not fit");
  h = piece(5, 0, 0, cap, PW_DTYPE_F32, 1);
  refused(&D, 0, &h, "offset");
  /* flushes two ahead, behind */
  h = piece(7, 0, 0, 0, PW_DTYPE_F32, 4);
  refused(&D, 0, &h, "gradient piece (flush 7, offset 0, 4 floats) for stage 0 from rank 0 does not fit (at flush 5)");
  h = piece(4, 0, 0, 0, PW_DTYPE_F32, 4);
  refused(&D, 0, &h, "(flush 4,");
  /* senders, stages, dtypes */
  h = piece(5, 0, 0, 0, PW_DTYPE_F32, 4);
  refused(&D, 2, &h, "from rank 2 does not fit"); /* rank 2 claims replica 0 */
  h = piece(5, 1, 0, 0, PW_DTYPE_F32, 4);
  refused(&D, 1, &h, "does not fit"); /* ourselves */
  h = piece(5, 3, 0, 0, PW_DTYPE_F32, 4);
  refused(&D, 0, &h, "does not fit"); /* replica 3 of 3 */
  h = piece(5, 0, 1, 0, PW_DTYPE_F32, 4);
  refused(&D, 0, &h, "for stage 1");
  h = piece(5, 0, 0, 0, PW_DTYPE_I32, 4);
  refused(&D, 0, &h, "does not fit");
  /* zero 2 has no step-end reduce-scatter of the main gradients: no buffer for one */
  pw_frame_hdr rs;
  assert_int_equal(pw_frame_hdr_init_vec(&rs, PW_FRAME_DP, FK_JOB, 0, 0, 0, PW_DPX_RS, PW_DTYPE_F32, 1), 0);
  r->step = 0;
  assert_int_equal(pw_dpx_dest(&D, 0, &rs, &dst, &err), PW_EPROTO);
  pw_dpx_close(&D);
  fk_net_free(&net);
  fk_job_free(f);
}

/* A DP frame whose value says "gradient piece" reaching a run at zero 0 or
 * 1 (no ZeRO-2 exchange: dpx's gradrs is NULL) must be refused like any
 * frame that does not fit. In a child: a crash must not take the other
 * tests with it. */
static void test_piece_without_zero2(void **state) {
  (void)state;
  for (int zero = 0; zero <= 1; zero++) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      signal(SIGSEGV, SIG_DFL), signal(SIGBUS, SIG_DFL), signal(SIGABRT, SIG_DFL); /* not cmocka's: die */
      fk_job *f = job(2, zero);
      fk_net net;
      fk_net_init(&net, 2);
      fk_rank *r = &net.r[0];
      fk_rank_slice(r, f, 0, 10);
      fk_rank_progs(r, zero);
      pw_dpx D;
      if (pw_dpx_init(&D, &r->cx)) _exit(3);
      pw_frame_hdr h = piece(0, 1, 0, 0, PW_DTYPE_F32, 4);
      pw_err err = {0};
      void *dst = (void *)1;
      int rc = pw_dpx_dest(&D, 1, &h, &dst, &err);
      _exit(rc == PW_EPROTO && dst == NULL ? 0 : 2);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 2) fail_msg("zero %d: a gradient-piece DP frame was not refused", zero);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 3) fail_msg("zero %d: pw_dpx_init failed", zero);
    if (!WIFEXITED(st) || WEXITSTATUS(st))
      fail_msg("zero %d: a gradient-piece DP frame killed the worker (%s %d): pw_dpx_dest passes it to "
               "pw_gradrs_dest with gradrs NULL", zero, WIFSIGNALED(st) ? "signal" : "sanitizer exit",
               WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flush_replica_order),
      cmocka_unit_test(test_piece_refusals),
      cmocka_unit_test(test_piece_without_zero2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
