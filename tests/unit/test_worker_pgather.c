/* test_worker_pgather: ZeRO-3's per-layer gathers of parameters
 * (worker/pgather.c) driven through its narrow context alone — the
 * replicas as threads of one process on fake links
 * (test_worker_fakectx.h), each with its stage program made from its real
 * slice at train.zero 3 and the exchange pw_dpx_init makes, no run. The
 * gathers are asked for as a program asks for them (pw_prog_unit_fn).
 *
 * For dp 2 and 3 (a GPT with tied embeddings in one stage: the embedding
 * gathered by its first and last layer), a forward's sequence (each layer
 * with the next one: the prefetch), its end, a backward's, its end, and a
 * forward again: after each call every parameter of the layer points into
 * a gather buffer and holds, bit for bit, what a plain program drawn from
 * the same seed holds; every other one points into the arena; after each
 * end all of them do. Each replica drew only its shard, sent exactly its
 * shard's part of every gathered layer to each other replica (an empty
 * frame for a layer it holds nothing of), and nothing is left in flight.
 * Frames: a piece of a gather past the ones we issued or before the ones
 * we completed, one that is not exactly one of the sender's pieces (offset,
 * length), of a non-peer, ourselves, a replica past dp, a layer past the
 * stage's, another dtype, or of another layer than the one its gather's
 * other frames said, is refused by pw_pgather_dest (and through
 * pw_dpx_dest). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "collective.h"
#include "dpx.h"
#include "pgather.h"
#include "test_worker_fakectx.h"
#include "zero3.h"

static const char *SPEC =
    "{\"name\":\"pgather\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":2,\"n_heads\":2,\"tie_embeddings\":true},"
    "\"mesh\":{\"pp\":1,\"dp\":DP},\"schedule\":{\"name\":\"1f1b\",\"microbatches\":2},"
    "\"train\":{\"steps\":10,\"batch_size\":12,\"seed\":11,\"checkpoint_every\":0,\"snapshot_every\":0,\"zero\":3,"
    "\"optimizer\":{\"name\":\"adamw\",\"lr\":0.01}},"
    "\"data\":{\"kind\":\"copy\"}}";

static fk_job *job(int dp) {
  char spec[1024], *o = spec;
  for (const char *s = SPEC; *s; s++) {
    if (!strncmp(s, "DP", 2)) o += sprintf(o, "%d", dp), s++;
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

/* ---- the gathers ------------------------------------------------------------------ */

typedef struct {
  pw_dpx D;
  pw_prog *prog;
  const float *whole;      /* a plain program's parameters, drawn from the same seed */
  char why[256];           /* the first mismatch */
} pg_replica;

/* After the call for `layer` (-1: an end), every parameter where it must be
 * and, if in a buffer, the plain program's bits. */
static int check(pg_replica *a, int layer) {
  pw_pgather_stage *s = &a->D.pgather->st[0];
  const pw_prog_layout *L = pw_prog_layout_of(a->prog);
  int u = layer < 0 ? -1 : layer - s->z.layer_lo;
  for (int i = 0; i < L->n_params; i++) {
    int in = 0;
    for (int j = u < 0 ? 0 : s->z.par_lo[u]; u >= 0 && j < s->z.par_lo[u + 1]; j++) in |= s->z.par[j] == i;
    const float *d = pw_prog_param_at(a->prog, i)->data;
    size_t n = pw_prog_param_at(a->prog, i)->meta->numel;
    if (!in) {
      if (d != s->arena + L->param_off[i])
        return snprintf(a->why, sizeof a->why, "layer %d: parameter %d not in the arena", layer, i), PW_EINTERNAL;
      continue;
    }
    int inbuf = 0;
    for (int k = 0; k < PW_Z3_RING; k++) inbuf |= d >= a->D.pgather->buf[k] && d + n <= a->D.pgather->buf[k] + s->z.max_floats;
    if (!inbuf) return snprintf(a->why, sizeof a->why, "layer %d: parameter %d not in a buffer", layer, i), PW_EINTERNAL;
    if (memcmp(d, a->whole + L->param_off[i], n * sizeof(float)))
      return snprintf(a->why, sizeof a->why, "layer %d: parameter %d's values differ", layer, i), PW_EINTERNAL;
  }
  return 0;
}

static int gather_body(fk_rank *r, void *arg) {
  pg_replica *a = arg;
  pw_pgather_stage *s = &a->D.pgather->st[0];
  int n = s->z.n_units, lo = s->z.layer_lo, rc;
  (void)r;
  for (int pass = 0; pass < 3; pass++) { /* forward, backward, forward */
    int back = pass == 1;
    for (int k = 0; k < n; k++) {
      int l = back ? lo + n - 1 - k : lo + k, next = k + 1 < n ? (back ? l - 1 : l + 1) : -1;
      pw_err err = {0};
      if ((rc = pw_pgather_unit(s, l, next, &err)) || (rc = check(a, l))) return rc;
    }
    pw_err err = {0};
    if ((rc = pw_pgather_unit(s, -1, -1, &err)) || (rc = check(a, -1))) return rc;
  }
  return pw_pgather_quiesce(a->D.pgather);
}

static void gather_case(int dp) {
  fk_job *f = job(dp);
  fk_net net;
  fk_net_init(&net, dp);
  pg_replica a[3];
  void *args[3];
  memset(a, 0, sizeof a);
  pw_prog *plain = NULL;
  for (int d = 0; d < dp; d++) {
    fk_rank *r = &net.r[d];
    fk_rank_slice(r, f, d, 10);
    fk_rank_progs(r, 3);
    r->route[PW_FRAME_DP] = (fk_route){dpx_dest, dpx_done, &a[d].D};
    assert_int_equal(pw_dpx_zero(&r->cx), 3);
    assert_int_equal(pw_dpx_init(&a[d].D, &r->cx), 0);
    assert_non_null(a[d].D.pgather);
    a[d].prog = r->ls[0].prog;
    pw_prog_init_params(a[d].prog, (unsigned long long)r->cfg.sl.train.seed);
    if (!plain) { /* the reference: a program of the same layers with its own arena */
      const pw_prog_config *c = pw_prog_config_of(a[d].prog);
      pw_prog_config pc = {.layer_lo = c->layer_lo, .layer_hi = c->layer_hi, .mb_size = c->mb_size,
                           .batch_size = c->batch_size, .n_slots = 1};
      pw_err err = {0};
      assert_int_equal(pw_prog_create(&r->cfg.sl.model, &pc, &plain, &err), 0);
      pw_prog_init_params(plain, (unsigned long long)r->cfg.sl.train.seed);
    }
    a[d].whole = pw_prog_params(plain);
    args[d] = &a[d];
  }
  const pw_pgather_stage *s0 = &a[0].D.pgather->st[0];
  assert_int_equal(s0->z.n_units, 4); /* the embedding, two blocks, the head */
  size_t numel = s0->numel;
  for (int d = 0; d < dp; d++) { /* each drew its shard only, the plain bits */
    const pw_pgather_stage *s = &a[d].D.pgather->st[0];
    assert_memory_equal(s->arena + s->lo, a[d].whole + s->lo, (s->hi - s->lo) * sizeof(float));
  }
  fk_run(&net, NULL, dp, gather_body, args);
  for (int d = 0; d < dp; d++) {
    if (a[d].why[0]) fail_msg("replica %d: %s", d, a[d].why);
    const pw_pgather_stage *s = &a[d].D.pgather->st[0];
    int frames = 0;
    uint64_t bytes = 0;
    pw_z3_piece pc[8];
    for (int u = 0; u < s->z.n_units; u++) {
      int np = pw_z3_pieces(&s->z, u, s->lo, s->hi, pc);
      frames += (dp - 1) * (np ? np : 1);
      bytes += (uint64_t)(dp - 1) * pw_z3_unit_part(&s->z, u, s->lo, s->hi) * sizeof(float);
    }
    assert_int_equal(net.r[d].frames_sent, 3 * frames);
    assert_int_equal(net.r[d].bytes_sent, 3 * bytes);
    assert_true(3 * bytes == 3 * pw_z3_pass_bytes(&s->z, numel, dp, d));
    assert_int_equal(a[d].D.bytes, 3 * bytes);
    assert_int_equal(a[d].D.pgather->gathers, 3 * 4);
    assert_int_equal(a[d].D.pgather->issued, a[d].D.pgather->done);
    assert_int_equal(atomic_load(&a[d].D.pgather->pending), 0);
    assert_int_equal(net.r[d].n_in, 0);
    assert_int_equal(net.r[d].n_fail, 0);
  }
  for (int d = 0; d < dp; d++) pw_dpx_close(&a[d].D);
  pw_prog_free(plain);
  fk_net_free(&net);
  fk_job_free(f);
}

static void test_gathers(void **state) {
  (void)state;
  gather_case(2);
  gather_case(3);
}

/* ---- frames ------------------------------------------------------------------------ */

static pw_frame_hdr piece(uint32_t k, int replica, int unit, int stage, size_t off, int dtype, size_t n) {
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_DP, FK_JOB, k, (uint32_t)replica | (uint32_t)unit << 12,
                                         (uint32_t)stage, (uint32_t)PW_PGATHER_PIECE | (uint32_t)off << 4, dtype, n),
                   0);
  return h;
}

static void refused(pw_dpx *D, int from, const pw_frame_hdr *h, const char *want) {
  pw_err err = {0};
  void *dst = (void *)1;
  int rc = pw_pgather_dest(D->pgather, from, h, &dst, &err);
  if (rc != PW_EPROTO) fail_msg("%s: accepted (%d)", want, rc);
  assert_null(dst);
  fk_err_has(&err, want);
  memset(&err, 0, sizeof err); /* the same through the data-parallel exchange's dispatch */
  dst = (void *)1;
  assert_int_equal(pw_dpx_dest(D, from, h, &dst, &err), PW_EPROTO);
  assert_null(dst);
  fk_err_has(&err, want);
  memset(&err, 0, sizeof err);
  assert_int_equal(pw_pgather_frame(D->pgather, from, h, &err), PW_EPROTO);
}

static void test_piece_refusals(void **state) {
  (void)state;
  enum { DP = 3 };
  fk_job *f = job(DP);
  fk_net net;
  fk_net_init(&net, DP);
  net.solo = 1;
  fk_rank *r = &net.r[1]; /* replica 1 */
  fk_rank_slice(r, f, 1, 10);
  fk_rank_progs(r, 3);
  pw_dpx D;
  assert_int_equal(pw_dpx_init(&D, &r->cx), 0);
  pw_pgather *g = D.pgather;
  const pw_pgather_stage *s = &g->st[0];
  g->done = 4, g->issued = 5; /* gather 4 in flight (a prefetch) */
  /* replica 0's and 2's pieces of layer 1 (a block: inside replica 0's shard, or across a boundary) */
  pw_z3_piece p0[8], p2[8];
  size_t lo, hi;
  pw_shard_range(s->numel, DP, 0, &lo, &hi);
  int n0 = pw_z3_pieces(&s->z, 1, lo, hi, p0);
  pw_shard_range(s->numel, DP, 2, &lo, &hi);
  int n2 = pw_z3_pieces(&s->z, 1, lo, hi, p2);
  assert_true(n0 > 0);
  pw_frame_hdr h;
  void *dst;
  pw_err err = {0};
  /* fits: replica 0's first piece of gather 4 (ours issued) and of gather 5 (not yet: one ahead of us at most) */
  h = piece(4, 0, 1, 0, p0[0][0], PW_DTYPE_F32, p0[0][2]);
  assert_int_equal(pw_pgather_dest(g, 0, &h, &dst, &err), 0);
  assert_ptr_equal(dst, g->buf[4 % PW_Z3_RING] + p0[0][0]);
  assert_int_equal(pw_dpx_dest(&D, 0, &h, &dst, &err), 0);
  assert_ptr_equal(dst, g->buf[4 % PW_Z3_RING] + p0[0][0]);
  assert_int_equal(pw_pgather_frame(g, 0, &h, &err), 0);
  assert_int_equal(g->slot[4 % PW_Z3_RING].got, 1);
  h = piece(5, 0, 1, 0, p0[0][0], PW_DTYPE_F32, p0[0][2]);
  assert_int_equal(pw_pgather_dest(g, 0, &h, &dst, &err), 0);
  /* replica 2's: a piece, or the empty frame when it holds nothing of the layer */
  h = n2 ? piece(4, 2, 1, 0, p2[0][0], PW_DTYPE_F32, p2[0][2]) : piece(4, 2, 1, 0, 0, PW_DTYPE_F32, 0);
  assert_int_equal(pw_pgather_dest(g, 2, &h, &dst, &err), 0);
  /* gathers: past ours (two ahead), completed */
  h = piece(6, 0, 1, 0, p0[0][0], PW_DTYPE_F32, p0[0][2]);
  refused(&D, 0, &h, "(gather 6, layer 1");
  h = piece(3, 0, 1, 0, p0[0][0], PW_DTYPE_F32, p0[0][2]);
  refused(&D, 0, &h, "does not fit (at gather 4 of 5 issued)");
  /* not exactly one of the sender's pieces */
  h = piece(4, 0, 1, 0, p0[0][0] + 1, PW_DTYPE_F32, p0[0][2] - 1);
  refused(&D, 0, &h, "does not fit");
  h = piece(4, 0, 1, 0, p0[0][0], PW_DTYPE_F32, p0[0][2] + 1);
  refused(&D, 0, &h, "does not fit");
  h = piece(4, 0, 1, 0, 0, PW_DTYPE_F32, 0); /* empty, where it has pieces */
  refused(&D, 0, &h, "does not fit");
  /* another layer for gather 4, whose frames said layer 1 */
  h = piece(4, 0, 2, 0, 0, PW_DTYPE_F32, 0);
  pw_z3_piece q[8];
  pw_shard_range(s->numel, DP, 0, &lo, &hi);
  int nq = pw_z3_pieces(&s->z, 2, lo, hi, q);
  if (nq) h = piece(4, 0, 2, 0, q[0][0], PW_DTYPE_F32, q[0][2]);
  refused(&D, 0, &h, "layer 2");
  /* senders, layers, stages, dtypes */
  h = piece(4, 0, 1, 0, p0[0][0], PW_DTYPE_F32, p0[0][2]);
  refused(&D, 2, &h, "from rank 2 does not fit"); /* rank 2 claims replica 0 */
  h = piece(4, 1, 1, 0, p0[0][0], PW_DTYPE_F32, p0[0][2]);
  refused(&D, 1, &h, "does not fit"); /* ourselves */
  h = piece(4, 3, 1, 0, p0[0][0], PW_DTYPE_F32, p0[0][2]);
  refused(&D, 0, &h, "does not fit"); /* replica 3 of 3 */
  h = piece(4, 0, 4, 0, 0, PW_DTYPE_F32, 1);
  refused(&D, 0, &h, "layer 4"); /* past the stage's 4 */
  h = piece(4, 0, 1, 1, p0[0][0], PW_DTYPE_F32, p0[0][2]);
  refused(&D, 0, &h, "for stage 1");
  h = piece(4, 0, 1, 0, p0[0][0], PW_DTYPE_I32, p0[0][2]);
  refused(&D, 0, &h, "does not fit");
  /* zero 3 has no all-gather of parameters at the step end: no buffer for one */
  pw_frame_hdr ag;
  assert_int_equal(pw_frame_hdr_init_vec(&ag, PW_FRAME_DP, FK_JOB, 0, 0, 0, PW_DPX_AG, PW_DTYPE_F32, 1), 0);
  r->step = 0;
  assert_int_equal(pw_dpx_dest(&D, 0, &ag, &dst, &err), PW_EPROTO);
  pw_dpx_close(&D);
  fk_net_free(&net);
  fk_job_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gathers),
      cmocka_unit_test(test_piece_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
