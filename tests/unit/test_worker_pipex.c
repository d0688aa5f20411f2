/* test_worker_pipex: the pipeline ranks' step-end exchange (worker/pipex.c)
 * driven through its narrow context alone — fake ranks in one process
 * (test_worker_fakectx.h), no run.
 *
 * The norm: every pipeline rank must end with the partials summed in the
 * order of each rank's first stage — under a placement that is not the
 * identity, with values for which rank order gives other bits; the
 * partials of the next pass, arriving before this pass's, are kept apart
 * by the tag's parity; a NORM frame of the wrong size or dtype, or from a
 * rank that is not a pipeline peer of the same replica, is refused before
 * its payload lands.
 * Tied gradients: a parameter held by three stages on three ranks ends, on
 * every holder, as the holders' gradients summed in ascending stage order
 * (not rank order), pass after pass; TIED frames that do not fit the
 * shared-parameter table are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>

#include "pipex.h"
#include "test_worker_fakectx.h"

static int pipex_dest(void *sub, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  return pw_pipex_dest(sub, from, h, dst, err);
}
static int pipex_done(void *sub, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  return pw_pipex_frame(sub, from, h, payload, err);
}

static void route_pipex(fk_rank *r, pw_pipex *x) {
  r->route[PW_FRAME_NORM] = (fk_route){pipex_dest, pipex_done, x};
  r->route[PW_FRAME_TIED] = (fk_route){pipex_dest, pipex_done, x};
}

static uint64_t dbits(double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return u;
}

/* ---- the norm ----------------------------------------------------------------- */

#define PASSES 4

typedef struct {
  pw_pipex x;
  double part[PASSES];
  double total[PASSES];
} norm_rank;

static int norm_body(fk_rank *r, void *arg) {
  norm_rank *n = arg;
  for (int t = 0; t < PASSES; t++) {
    r->tag = 10 + t; /* consecutive passes: a fast rank sends the next tag's partial early */
    int rc = pw_pipex_norm(&n->x, n->part[t], &n->total[t]);
    if (rc) return rc;
  }
  return 0;
}

/* The sum in the order of each pipeline rank's first stage: what every
 * rank must get; and in rank order, what a wrong implementation gets. */
static double first_stage_sum(const double *part, const int *rank_of_stage, int S) {
  double s = 0;
  for (int st = 0; st < S; st++) {
    int first = 1;
    for (int e = 0; e < st; e++) first &= rank_of_stage[e] != rank_of_stage[st];
    if (first) s += part[rank_of_stage[st]];
  }
  return s;
}

static void norm_case(int S, const int *placement) {
  enum { PP = 3 };
  fk_net net;
  fk_net_init(&net, PP);
  norm_rank nr[PP];
  void *args[PP];
  /* per pass, partials whose sum depends on the order: 1 + 1e-20 is 1 */
  static const double vals[PASSES][3] = {{1.0, -1.0, 1e-20}, {1e-20, 1.0, -1.0}, {-1.0, 1e-20, 1.0}, {3.0, 5e-17, -3.0}};
  for (int k = 0; k < PP; k++) {
    fk_geom(&net.r[k], PP, 1, 1, S, placement);
    route_pipex(&net.r[k], &nr[k].x);
    assert_int_equal(pw_pipex_init(&nr[k].x, &net.r[k].cx), 0);
    for (int t = 0; t < PASSES; t++) nr[k].part[t] = vals[t][k];
    args[k] = &nr[k];
  }
  fk_run(&net, NULL, PP, norm_body, args);
  int differs = 0;
  for (int t = 0; t < PASSES; t++) {
    double part[PP];
    for (int k = 0; k < PP; k++) part[k] = vals[t][k];
    double want = first_stage_sum(part, placement, S), rank_order = (0 + part[0] + part[1]) + part[2];
    differs += dbits(want) != dbits(rank_order);
    for (int k = 0; k < PP; k++)
      if (dbits(nr[k].total[t]) != dbits(want))
        fail_msg("pass %d rank %d: norm %.17g, want %.17g (first-stage order; rank order gives %.17g)", t, k,
                 nr[k].total[t], want, rank_order);
  }
  assert_true(differs >= 2); /* the values tell the two orders apart */
  for (int k = 0; k < PP; k++) {
    assert_int_equal(net.r[k].n_fail, 0);
    assert_int_equal(net.r[k].frames_sent, PASSES * (PP - 1));
    assert_int_equal(net.r[k].n_in, 0);
    pw_pipex_close(&nr[k].x);
  }
  fk_net_free(&net);
}

static void test_norm_first_stage_order(void **state) {
  (void)state;
  /* stage 0 on rank 2, stage 1 on rank 0, stage 2 on rank 1 */
  static const int relabeled[3] = {2, 0, 1};
  norm_case(3, relabeled);
  /* interleaved: two stages per rank; first stages on ranks 1, 2, 0 */
  static const int interleaved[6] = {1, 2, 0, 1, 2, 0};
  norm_case(6, interleaved);
}

/* One rank, driven by this thread: the other ranks' partials of tag 6
 * arrive before those of tag 5, and each pass sums its own. */
static void test_norm_next_tag_by_parity(void **state) {
  (void)state;
  enum { PP = 3 };
  fk_net net;
  fk_net_init(&net, PP);
  net.solo = 1;
  fk_rank *r = &net.r[0];
  for (int k = 0; k < PP; k++) fk_geom(&net.r[k], PP, 1, 1, PP, NULL);
  pw_pipex x;
  route_pipex(r, &x);
  assert_int_equal(pw_pipex_init(&x, &r->cx), 0);
  const double p5[PP] = {0.25, 1e16, -1e16}, p6[PP] = {7.0, 0.5, 0.125};
  uint32_t dims[1] = {8};
  pw_frame_hdr h;
  for (int tag = 6; tag >= 5; tag--)
    for (int k = PP - 1; k >= 1; k--) {
      assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_NORM, FK_JOB, (uint32_t)tag, (uint32_t)k, 0, 0, PW_DTYPE_U8, 1, dims), 0);
      fk_inject(r, k, &h, tag == 5 ? &p5[k] : &p6[k]);
    }
  double total;
  r->tag = 5;
  assert_int_equal(pw_pipex_norm(&x, p5[0], &total), 0);
  assert_int_equal(dbits(total), dbits((0 + p5[0] + p5[1]) + p5[2]));
  assert_int_equal(r->n_in, 0); /* all four read: the early ones kept */
  r->tag = 6;
  assert_int_equal(pw_pipex_norm(&x, p6[0], &total), 0); /* solo: a wait for a frame would fail */
  assert_int_equal(dbits(total), dbits((0 + p6[0] + p6[1]) + p6[2]));
  assert_int_equal(r->n_fail, 0);
  /* what it sent each pass: its partial, 8 bytes, to ranks 1 and 2 */
  for (int k = 1; k < PP; k++) {
    assert_int_equal(net.r[k].n_in, 2);
    for (int i = 0; i < 2; i++) {
      const fk_frame *f = fk_peek(&net.r[k], i);
      assert_int_equal(f->from, 0);
      assert_int_equal(f->h.kind, PW_FRAME_NORM);
      assert_int_equal(f->h.step, 5 + i);
      assert_int_equal(f->h.microbatch, 0);
      assert_int_equal(f->h.payload_len, 8);
      double v;
      memcpy(&v, f->src, 8);
      assert_int_equal(dbits(v), dbits(i ? p6[0] : p5[0]));
    }
  }
  pw_pipex_close(&x);
  fk_net_free(&net);
}

static void test_norm_frame_refusals(void **state) {
  (void)state;
  enum { PP = 3, DP = 2 };
  fk_net net;
  fk_net_init(&net, PP * DP);
  net.solo = 1;
  fk_rank *r = &net.r[1]; /* replica 0, pipeline rank 1; its peers are ranks 0 and 2 */
  fk_geom(r, PP, DP, 1, PP, NULL);
  pw_pipex x;
  assert_int_equal(pw_pipex_init(&x, &r->cx), 0);
  pw_frame_hdr h;
  pw_err err = {0};
  void *dst = (void *)1;
  uint32_t d8[1] = {8}, d16[1] = {16}, d2[1] = {2};
  /* fits: from rank 0 (microbatch 0), into the reader's buffer */
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_NORM, FK_JOB, 3, 0, 0, 0, PW_DTYPE_U8, 1, d8), 0);
  assert_int_equal(pw_pipex_dest(&x, 0, &h, &dst, &err), 0);
  assert_null(dst);
  assert_int_equal(pw_pipex_dest(&x, 2, &(pw_frame_hdr){.kind = PW_FRAME_NORM, .job = FK_JOB, .step = 3, .microbatch = 2,
                                                          .dtype = PW_DTYPE_U8, .payload_len = 8}, &dst, &err), 0);
  /* the wrong size, the wrong dtype */
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_NORM, FK_JOB, 3, 0, 0, 0, PW_DTYPE_U8, 1, d16), 0);
  assert_int_equal(pw_pipex_dest(&x, 0, &h, &dst, &err), PW_EPROTO);
  fk_err_has(&err, "NORM frame of 16 bytes of u8, expected 8 of u8");
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_NORM, FK_JOB, 3, 0, 0, 0, PW_DTYPE_F32, 1, d2), 0);
  assert_int_equal(h.payload_len, 8);
  assert_int_equal(pw_pipex_dest(&x, 0, &h, &dst, &err), PW_EPROTO);
  fk_err_has(&err, "NORM frame of 8 bytes of f32");
  /* senders that are not a pipeline peer of replica 0 */
  struct {
    int from, mb;
  } bad[] = {
      {3, 0},  /* replica 1's pipeline rank 0 */
      {4, 1},  /* replica 1's rank 1: not even a peer of ours in its own replica */
      {1, 1},  /* ourselves */
      {0, 2},  /* rank 0 claiming to be pipeline rank 2 */
      {0, 3},  /* a pipeline rank past pp */
      {0, -1}, /* 2^32 - 1 */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memset(&err, 0, sizeof err);
    assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_NORM, FK_JOB, 3, (uint32_t)bad[i].mb, 0, 0, PW_DTYPE_U8, 1, d8), 0);
    assert_int_equal(pw_pipex_dest(&x, bad[i].from, &h, &dst, &err), PW_EPROTO);
    char want[64];
    snprintf(want, sizeof want, "norm partial from rank %d does not fit", bad[i].from);
    fk_err_has(&err, want);
  }
  /* replica 1's ranks are peers of their own replica's norm */
  fk_rank *r4 = &net.r[4];
  fk_geom(r4, PP, DP, 1, PP, NULL);
  pw_pipex x4;
  assert_int_equal(pw_pipex_init(&x4, &r4->cx), 0);
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_NORM, FK_JOB, 3, 0, 0, 0, PW_DTYPE_U8, 1, d8), 0);
  assert_int_equal(pw_pipex_dest(&x4, 3, &h, &dst, &err), 0);
  assert_int_equal(pw_pipex_dest(&x4, 0, &h, &dst, &err), PW_EPROTO);
  /* no shared parameters: any TIED frame is unexpected */
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TIED, FK_JOB, 3, 0, 1, 0, PW_DTYPE_F32, 4), 0);
  assert_int_equal(pw_pipex_dest(&x, 0, &h, &dst, &err), PW_EPROTO);
  fk_err_has(&err, "unexpected TIED for value 0");
  pw_pipex_close(&x4);
  pw_pipex_close(&x);
  fk_net_free(&net);
}

/* ---- tied gradients ------------------------------------------------------------ */

static const char *SPEC1 =
    "{\"name\":\"pipex\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":1,\"n_heads\":2},"
    "\"mesh\":{\"pp\":1,\"dp\":1},\"schedule\":{\"name\":\"gpipe\",\"microbatches\":1},"
    "\"train\":{\"steps\":4,\"batch_size\":1,\"seed\":5,\"checkpoint_every\":0,\"snapshot_every\":0,"
    "\"optimizer\":{\"name\":\"adamw\",\"lr\":0.01}},"
    "\"data\":{\"kind\":\"copy\"}}";

#define TP_PASSES 2

typedef struct {
  pw_pipex x;
  float *g[TP_PASSES];     /* the holder's gradient for each pass */
  float *out[TP_PASSES];   /* and what it ended with */
  pw_prog_param *pp;
  size_t n;
} tied_rank;

static int tied_body(fk_rank *r, void *arg) {
  tied_rank *t = arg;
  for (int p = 0; p < TP_PASSES; p++) {
    r->tag = 20 + p;
    memcpy(t->pp->grad, t->g[p], t->n * sizeof(float));
    int rc = pw_pipex_tied(&t->x);
    if (rc) return rc;
    memcpy(t->out[p], t->pp->grad, t->n * sizeof(float));
    /* the step end's barrier (stepend.c): the copy a holder sent stays
     * still until every rank has read it, which only the norm exchange
     * after the tied one proves (without it, the fake link sees a copy of
     * the next pass rewritten before a peer read this one's) */
    double total;
    if ((rc = pw_pipex_norm(&t->x, 0, &total))) return rc;
  }
  return 0;
}

static pw_prog_param *param_of(pw_prog *p, int id) {
  for (int i = 0; i < pw_prog_n_params(p); i++)
    if (pw_prog_param_at(p, i)->model_index == id) return pw_prog_param_at(p, i);
  return NULL;
}

/* Three stages on three ranks (stage s on rank (s + 1) % 3), each program
 * the whole model, one parameter shared by all three: a table a planner
 * would not make (it ties two), which is what makes the order visible. */
static void test_tied_stage_order(void **state) {
  (void)state;
  enum { PP = 3 };
  static const int placement[PP] = {1, 2, 0};
  fk_job *f = fk_job_make(SPEC1);
  fk_net net;
  fk_net_init(&net, PP);
  pw_partition part[PP];
  tied_rank tr[PP];
  void *args[PP];
  int P = -1;
  for (int k = 0; k < PP; k++) {
    fk_rank *r = &net.r[k];
    fk_rank_slice(r, f, 0, 4);
    r->cx.rank = k;
    fk_geom(r, PP, 1, 1, PP, placement);
    const pw_model *m = &r->cfg.sl.model;
    if (P < 0)
      for (int i = 0; i < m->n_params && P < 0; i++)
        if (!m->params[i].frozen && m->params[i].numel >= 64) P = i;
    assert_true(P >= 0);
    part[k] = r->cfg.sl.part;
    part[k].n_stages = PP;
    part[k].stages = calloc(PP, sizeof *part[k].stages);
    for (int s = 0; s < PP; s++) part[k].stages[s] = r->cfg.sl.part.stages[0]; /* the whole model */
    part[k].n_shared = 1;
    part[k].shared = malloc(sizeof *part[k].shared);
    *part[k].shared = (pw_shared_param){.param = P, .n_holders = 3, .holders = {2, 0, 1}};
    r->cx.part = &part[k];
    fk_rank_progs(r, 0);
    route_pipex(r, &tr[k].x);
    assert_int_equal(pw_pipex_init(&tr[k].x, &r->cx), 0);
    assert_int_equal(tr[k].x.tied_needed, 2);
    /* the norm counts the parameter once, at its lowest holder (stage 0) */
    int skip[4], st = r->cx.ls[0].stage;
    assert_int_equal(pw_pipex_norm_skips(&tr[k].x, st, skip, 4), st != 0);
    if (st) assert_int_equal(skip[0], P);
    tr[k].pp = param_of(r->ls[0].prog, P);
    assert_non_null(tr[k].pp);
    tr[k].n = m->params[P].numel;
    args[k] = &tr[k];
  }
  size_t n = tr[0].n;
  /* per element, gradients whose sum depends on the order; stage s's
   * holder is rank placement[s] */
  uint64_t seed = 99;
  for (int p = 0; p < TP_PASSES; p++)
    for (int k = 0; k < PP; k++) {
      tr[k].g[p] = malloc(n * sizeof(float));
      tr[k].out[p] = malloc(n * sizeof(float));
    }
  for (int p = 0; p < TP_PASSES; p++)
    for (size_t i = 0; i < n; i++) {
      float g[PP]; /* by stage */
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      float u = (float)((seed >> 40) & 0xffff) / 65536.0f;
      g[0] = 1.0f + u, g[1] = 3e-8f * (1 + (float)p), g[2] = -(1.0f + u);
      if (i % 3 == 1) g[1] = 1e4f * u, g[2] = 1e-4f; /* and plainer ones */
      for (int s = 0; s < PP; s++) tr[placement[s]].g[p][i] = g[s];
    }
  fk_run(&net, NULL, PP, tied_body, args);
  int differs = 0;
  for (int p = 0; p < TP_PASSES; p++)
    for (size_t i = 0; i < n; i++) {
      float by_stage = 0, by_rank = 0;
      for (int s = 0; s < PP; s++) by_stage += tr[placement[s]].g[p][i];
      for (int k = 0; k < PP; k++) by_rank += tr[k].g[p][i];
      differs += fk_bits(by_stage) != fk_bits(by_rank);
      for (int k = 0; k < PP; k++)
        if (fk_bits(tr[k].out[p][i]) != fk_bits(by_stage))
          fail_msg("pass %d rank %d element %zu: %.9g, want %.9g (stage order; rank order gives %.9g)", p, k, i,
                   tr[k].out[p][i], by_stage, by_rank);
    }
  assert_true(differs > 0);
  for (int k = 0; k < PP; k++) {
    assert_int_equal(net.r[k].frames_sent, TP_PASSES * 4); /* to each remote holder and each pipeline peer, a pass */
    assert_int_equal(net.r[k].n_fail, 0);
  }

  /* TIED frames that do not fit, at rank 0 (stage 2's holder) */
  pw_frame_hdr h;
  pw_err err = {0};
  void *dst;
  pw_pipex *x = &tr[0].x;
  /* fits: stage 0's copy from rank 1, into holder 1's buffer */
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TIED, FK_JOB, 22, 0, 2, (uint32_t)P, PW_DTYPE_F32, n), 0);
  assert_int_equal(pw_pipex_dest(x, 1, &h, &dst, &err), 0);
  assert_ptr_equal(dst, x->tied[0].holder[1]);
  assert_int_equal(pw_pipex_dest(x, 2, &h, &dst, &err), PW_EPROTO); /* stage 0 is rank 1's */
  fk_err_has(&err, "does not fit");
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TIED, FK_JOB, 22, 3, 2, (uint32_t)P, PW_DTYPE_F32, n), 0);
  assert_int_equal(pw_pipex_dest(x, 1, &h, &dst, &err), PW_EPROTO); /* stage 3 holds nothing */
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TIED, FK_JOB, 22, 0, 2, (uint32_t)P, PW_DTYPE_F32, n - 1), 0);
  assert_int_equal(pw_pipex_dest(x, 1, &h, &dst, &err), PW_EPROTO); /* one float short */
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TIED, FK_JOB, 22, 0, 2, (uint32_t)P, PW_DTYPE_I32, n), 0);
  assert_int_equal(pw_pipex_dest(x, 1, &h, &dst, &err), PW_EPROTO);
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_TIED, FK_JOB, 22, 0, 2, (uint32_t)(P + 1), PW_DTYPE_F32, n), 0);
  assert_int_equal(pw_pipex_dest(x, 1, &h, &dst, &err), PW_EPROTO); /* not a shared parameter */
  fk_err_has(&err, "unexpected TIED");

  for (int k = 0; k < PP; k++) {
    pw_pipex_close(&tr[k].x);
    for (int p = 0; p < TP_PASSES; p++) free(tr[k].g[p]), free(tr[k].out[p]);
    free(part[k].stages), free(part[k].shared);
  }
  fk_net_free(&net);
  fk_job_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_norm_first_stage_order),
      cmocka_unit_test(test_norm_next_tag_by_parity),
      cmocka_unit_test(test_norm_frame_refusals),
      cmocka_unit_test(test_tied_stage_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
