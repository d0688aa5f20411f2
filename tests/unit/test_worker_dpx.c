/* test_worker_dpx: the data-parallel exchange (worker/dpx.c) driven through
 * its narrow context alone — the replicas of one pipeline rank as threads
 * of one process on fake links (test_worker_fakectx.h), each with stage
 * programs made from its real slice, no run.
 *
 * Zero 0: after pw_dpx_allreduce every replica's gradient arena is, bit
 * for bit, the replicas' arenas summed in replica order
 * (((0 + g_0) + g_1) + g_2), for dp 2 and 3 and for the replicas of
 * pipeline rank 1 of a pp = 2 mesh, in chunks of 7 floats (PW_COLL_CHUNK)
 * and whole, step after step; each replica sends exactly
 * pw_coll_bytes_rs_ag of the arena.
 * Zero 1: the full ranges all-reduced whole, our shard of the rest summed in
 * replica order, the partial norms summed in replica order, and the
 * parameter all-gather giving every replica each shard's owner's values.
 * Frames: a chunk of the wrong length or index, of a sender that is not a
 * peer or claims another replica, of a step other than this one or the
 * next, of an unknown kind, is refused by pw_dpx_dest before its payload
 * lands. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "collective.h"
#include "dpx.h"
#include "test_worker_fakectx.h"

static const char *SPEC =
    "{\"name\":\"dpx\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":2,\"n_heads\":2,\"tie_embeddings\":TIE},"
    "\"mesh\":{\"pp\":PP,\"dp\":DP},\"schedule\":{\"name\":\"1f1b\",\"microbatches\":2},"
    "\"train\":{\"steps\":10,\"batch_size\":12,\"seed\":11,\"checkpoint_every\":0,\"snapshot_every\":0,\"zero\":ZZ,"
    "\"optimizer\":{\"name\":\"adamw\",\"lr\":0.01}},"
    "\"data\":{\"kind\":\"copy\"}}";

static fk_job *job(int pp, int dp, int zero, int tie) {
  char spec[1024], *o = spec;
  for (const char *s = SPEC; *s; s++) {
    if (!strncmp(s, "PP", 2)) o += sprintf(o, "%d", pp), s++;
    else if (!strncmp(s, "DP", 2)) o += sprintf(o, "%d", dp), s++;
    else if (!strncmp(s, "ZZ", 2)) o += sprintf(o, "%d", zero), s++;
    else if (!strncmp(s, "TIE", 3)) o += sprintf(o, "%s", tie ? "true" : "false"), s += 2;
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

/* A float of mixed magnitude and sign: sums of a few depend on their order. */
static float draw(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  float u = (float)((*s >> 40) & 0xffffff) / 16777216.0f;
  int e = (int)((*s >> 20) % 9) - 4;
  float m = 1;
  for (int i = 0; i < (e < 0 ? -e : e); i++) m *= 10;
  return ((*s >> 33) & 1 ? -1 : 1) * (e < 0 ? u / m : u * m);
}

/* ---- zero 0: the all-reduce ------------------------------------------------------ */

#define STEPS 2

typedef struct {
  pw_dpx D;
  float *in[STEPS], *out[STEPS];
  size_t n;
} ar_rank;

static int allreduce_body(fk_rank *r, void *arg) {
  ar_rank *a = arg;
  for (int s = 0; s < STEPS; s++) {
    r->step = s;
    memcpy(pw_prog_grads(r->ls[0].prog), a->in[s], a->n * sizeof(float));
    int rc = pw_dpx_allreduce(&a->D);
    if (rc) return rc;
    memcpy(a->out[s], pw_prog_grads(r->ls[0].prog), a->n * sizeof(float));
  }
  return 0;
}

static void allreduce_case(int pp, int dp, int prank, const char *chunk) {
  if (chunk)
    setenv("PW_COLL_CHUNK", chunk, 1);
  else
    unsetenv("PW_COLL_CHUNK");
  fk_job *f = job(pp, dp, 0, 0);
  fk_net net;
  fk_net_init(&net, pp * dp);
  ar_rank a[4];
  void *args[4];
  int ranks[4];
  uint64_t seed = 1234 + (uint64_t)(pp * 10 + dp);
  for (int d = 0; d < dp; d++) {
    int k = d * pp + prank;
    fk_rank *r = &net.r[k];
    fk_rank_slice(r, f, k, 10);
    assert_int_equal(r->cx.replica, d);
    assert_int_equal(r->cx.n_ls, 1);
    fk_rank_progs(r, 0);
    r->route[PW_FRAME_DP] = (fk_route){dpx_dest, dpx_done, &a[d].D};
    assert_int_equal(pw_dpx_zero(&r->cx), 0);
    assert_int_equal(pw_dpx_init(&a[d].D, &r->cx), 0);
    assert_int_equal(a[d].D.chunk, chunk ? (size_t)atoi(chunk) : PW_COLL_CHUNK);
    a[d].n = pw_prog_grad_numel(r->ls[0].prog);
    for (int s = 0; s < STEPS; s++) {
      a[d].in[s] = malloc(a[d].n * sizeof(float));
      a[d].out[s] = malloc(a[d].n * sizeof(float));
      for (size_t i = 0; i < a[d].n; i++) a[d].in[s][i] = draw(&seed);
    }
    args[d] = &a[d], ranks[d] = k;
  }
  size_t n = a[0].n;
  assert_true(n > 100);
  if (chunk) assert_true(a[0].D.st[0].n_chunks > 10); /* many chunks */
  fk_run(&net, ranks, dp, allreduce_body, args);
  int differs = 0;
  for (int s = 0; s < STEPS; s++)
    for (size_t i = 0; i < n; i++) {
      float want = 0, back = 0;
      for (int d = 0; d < dp; d++) want += a[d].in[s][i];
      for (int d = dp - 1; d >= 0; d--) back += a[d].in[s][i];
      differs += fk_bits(want) != fk_bits(back);
      for (int d = 0; d < dp; d++)
        if (fk_bits(a[d].out[s][i]) != fk_bits(want))
          fail_msg("dp %d pp %d step %d replica %d element %zu: %.9g, want %.9g (replica order)", dp, pp, s, d, i,
                   a[d].out[s][i], want);
    }
  if (dp > 2) assert_true(differs > 0); /* the data tells the orders apart */
  for (int d = 0; d < dp; d++) {
    fk_rank *r = &net.r[ranks[d]];
    assert_int_equal(a[d].D.bytes, STEPS * pw_coll_bytes_rs_ag(n, dp, d));
    assert_int_equal(r->bytes_sent, a[d].D.bytes);
    assert_int_equal(r->n_in, 0);
    assert_int_equal(r->n_fail, 0);
    pw_dpx_close(&a[d].D);
    for (int s = 0; s < STEPS; s++) free(a[d].in[s]), free(a[d].out[s]);
  }
  fk_net_free(&net);
  fk_job_free(f);
  unsetenv("PW_COLL_CHUNK");
}

static void test_allreduce_replica_order(void **state) {
  (void)state;
  allreduce_case(1, 2, 0, "7");
  allreduce_case(1, 3, 0, "7");
  allreduce_case(1, 3, 0, NULL); /* one chunk a shard */
  allreduce_case(2, 2, 1, "7");  /* pipeline rank 1's replicas: ranks 1 and 3 */
}

/* ---- zero 1: full ranges, shards, norm, parameters ------------------------------- */

typedef struct {
  pw_dpx D;
  float *in, *out;         /* the gradient arena before and after */
  float *par_in;           /* the parameters (in arena order) before the all-gather */
  size_t n, tn;
  double part, total;
} z1_rank;

/* Sets the trained parameters at gradient-arena offsets [lo, hi) from buf
 * (indexed by offset), as the update sets our shard's. */
static void set_params(pw_prog *p, const float *buf, size_t lo, size_t hi) {
  const float *g0 = pw_prog_grads(p);
  for (int i = 0; i < pw_prog_n_params(p); i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    if (!pp->grad) continue;
    size_t off = (size_t)(pp->grad - g0);
    for (size_t k = 0; k < pp->meta->numel; k++)
      if (off + k >= lo && off + k < hi) pp->data[k] = buf[off + k];
  }
}

static int zero1_body(fk_rank *r, void *arg) {
  z1_rank *z = arg;
  pw_prog *p = r->ls[0].prog;
  const pw_dpx_stage *x = &z->D.st[0];
  r->step = 3;
  memcpy(pw_prog_grads(p), z->in, z->n * sizeof(float));
  int rc;
  if ((rc = pw_dpx_reduce_full(&z->D)) || (rc = pw_dpx_reduce_scatter(&z->D))) return rc;
  memcpy(z->out, pw_prog_grads(p), z->n * sizeof(float));
  if ((rc = pw_dpx_norm(&z->D, z->part, &z->total))) return rc;
  /* the update: our shard only (a faster replica's parameters may be in
   * the others already: its all-gather frames land while we wait) */
  set_params(p, z->par_in, x->lo, x->hi);
  if ((rc = pw_dpx_allgather_params(&z->D))) return rc;
  return 0;
}

static int in_full(const pw_dpx_stage *x, size_t i) {
  for (int f = 0; f < x->n_full; f++)
    if (i >= x->full[f][0] && i < x->full[f][1]) return 1;
  return 0;
}

static void test_zero1_exchange(void **state) {
  (void)state;
  enum { DP = 3 };
  setenv("PW_COLL_CHUNK", "5", 1);
  fk_job *f = job(1, DP, 1, 1);
  fk_net net;
  fk_net_init(&net, DP);
  z1_rank z[DP];
  void *args[DP];
  uint64_t seed = 777;
  static const double parts[DP] = {1e-30, 1.0, -1.0}; /* replica order: 0; reversed: 1e-30 */
  for (int d = 0; d < DP; d++) {
    fk_rank *r = &net.r[d];
    fk_rank_slice(r, f, d, 10);
    fk_rank_progs(r, 1);
    r->route[PW_FRAME_DP] = (fk_route){dpx_dest, dpx_done, &z[d].D};
    assert_int_equal(pw_dpx_zero(&r->cx), 1);
    assert_int_equal(pw_dpx_init(&z[d].D, &r->cx), 0);
    pw_prog *p = r->ls[0].prog;
    z[d].n = pw_prog_grad_numel(p), z[d].tn = pw_prog_train_numel(p);
    z[d].in = malloc(z[d].n * sizeof(float)), z[d].out = malloc(z[d].n * sizeof(float));
    z[d].par_in = calloc(z[d].tn, sizeof(float));
    for (size_t i = 0; i < z[d].n; i++) z[d].in[i] = draw(&seed);
    for (size_t i = 0; i < z[d].tn; i++) z[d].par_in[i] = (float)(d + 1) * 1000 + (float)i;
    float *stale = malloc(z[d].tn * sizeof(float)); /* what the parameters were before the step: not theirs */
    for (size_t i = 0; i < z[d].tn; i++) stale[i] = -1.0f - (float)d;
    set_params(p, stale, 0, z[d].tn);
    free(stale);
    z[d].part = parts[d];
    args[d] = &z[d];
  }
  const pw_dpx_stage *x0 = &z[0].D.st[0];
  assert_true(x0->n_full > 0); /* tied embeddings: ranges summed whole */
  assert_int_equal(x0->n, z[0].tn);
  fk_run(&net, NULL, DP, zero1_body, args);
  size_t n = z[0].n, tn = z[0].tn;
  for (int d = 0; d < DP; d++) {
    const pw_dpx_stage *x = &z[d].D.st[0];
    size_t checked = 0;
    for (size_t i = 0; i < n; i++) {
      float want = 0;
      for (int e = 0; e < DP; e++) want += z[e].in[i];
      int full = in_full(x, i), mine = i >= x->lo && i < x->hi;
      float expect = full || mine ? want : z[d].in[i]; /* elsewhere: stale, its own */
      if (fk_bits(z[d].out[i]) != fk_bits(expect))
        fail_msg("replica %d element %zu (%s): %.9g, want %.9g", d, i, full ? "full range" : mine ? "its shard" : "stale",
                 z[d].out[i], expect);
      checked += full || mine;
    }
    assert_true(checked > 0 && checked < n);
    /* the norm: replica order, the same on all */
    assert_true(z[d].total == (0 + parts[0] + parts[1]) + parts[2]);
    assert_true(z[d].total != (0 + parts[2] + parts[1]) + parts[0]);
    /* the parameters: each shard's owner's */
    pw_prog *p = net.r[d].ls[0].prog;
    const float *g0 = pw_prog_grads(p);
    size_t covered = 0;
    for (int j = 0; j < pw_prog_n_params(p); j++) {
      pw_prog_param *pp = pw_prog_param_at(p, j);
      if (!pp->grad) continue;
      for (size_t k = 0; k < pp->meta->numel; k++, covered++) {
        size_t i = (size_t)(pp->grad - g0) + k;
        int owner = 0;
        for (int e = 0; e < DP; e++) {
          size_t lo, hi;
          pw_shard_range(tn, DP, e, &lo, &hi);
          if (i >= lo && i < hi) owner = e;
        }
        if (fk_bits(pp->data[k]) != fk_bits(z[owner].par_in[i]))
          fail_msg("replica %d %s[%zu] (offset %zu): %.9g, want shard owner %d's %.9g", d, pp->meta->name, k, i,
                   pp->data[k], owner, z[owner].par_in[i]);
      }
    }
    assert_int_equal(covered, tn);
    assert_int_equal(net.r[d].n_fail, 0);
    assert_int_equal(net.r[d].n_in, 0);
  }
  for (int d = 0; d < DP; d++) {
    pw_dpx_close(&z[d].D);
    free(z[d].in), free(z[d].out), free(z[d].par_in);
  }
  fk_net_free(&net);
  fk_job_free(f);
  unsetenv("PW_COLL_CHUNK");
}

/* ---- frames --------------------------------------------------------------------- */

static void refused(pw_dpx *D, int from, const pw_frame_hdr *h, const char *want) {
  pw_err err = {0};
  void *dst = (void *)1;
  int rc = pw_dpx_dest(D, from, h, &dst, &err);
  if (rc != PW_EPROTO) fail_msg("%s: accepted (%d)", want, rc);
  assert_null(dst);
  fk_err_has(&err, want);
}

static pw_frame_hdr dp_hdr(int step, int replica, int stage, int what, int ci, int dtype, size_t n) {
  pw_frame_hdr h;
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_DP, FK_JOB, (uint32_t)step, (uint32_t)replica, (uint32_t)stage,
                                         (uint32_t)what | (uint32_t)ci << 4, dtype, n),
                   0);
  return h;
}

static void test_frame_refusals(void **state) {
  (void)state;
  enum { DP = 3, CH = 7 };
  setenv("PW_COLL_CHUNK", "7", 1);
  fk_job *f = job(1, DP, 0, 0);
  fk_net net;
  fk_net_init(&net, DP);
  net.solo = 1;
  fk_rank *r = &net.r[1]; /* replica 1 */
  fk_rank_slice(r, f, 1, 10);
  fk_rank_progs(r, 0);
  pw_dpx D;
  assert_int_equal(pw_dpx_init(&D, &r->cx), 0);
  r->step = 4;
  const pw_dpx_stage *x = &D.st[0];
  size_t n = x->n, slen = x->hi - x->lo, last = slen - (size_t)(x->n_chunks - 1) * CH;
  assert_true(slen % CH != 0 && last < CH); /* a short last chunk */
  pw_err err = {0};
  void *dst;
  pw_frame_hdr h;
  /* fits: our shard's chunks from replicas 0 and 2, this step and the next */
  h = dp_hdr(4, 0, 0, PW_DPX_RS, 0, PW_DTYPE_F32, CH);
  assert_int_equal(pw_dpx_dest(&D, 0, &h, &dst, &err), 0);
  assert_ptr_equal(dst, x->rx);
  h = dp_hdr(5, 2, 0, PW_DPX_RS, 1, PW_DTYPE_F32, CH);
  assert_int_equal(pw_dpx_dest(&D, 2, &h, &dst, &err), 0);
  assert_ptr_equal(dst, x->rx + x->smax + CH);
  h = dp_hdr(4, 2, 0, PW_DPX_RS, x->n_chunks - 1, PW_DTYPE_F32, last);
  assert_int_equal(pw_dpx_dest(&D, 2, &h, &dst, &err), 0);
  /* an all-gather chunk lands in the sender's shard of the arena */
  size_t lo0, hi0;
  pw_shard_range(n, DP, 0, &lo0, &hi0);
  h = dp_hdr(4, 0, 0, PW_DPX_AG, 1, PW_DTYPE_F32, CH);
  assert_int_equal(pw_dpx_dest(&D, 0, &h, &dst, &err), 0);
  assert_ptr_equal(dst, pw_prog_grads(r->ls[0].prog) + lo0 + CH);
  /* a shard norm: the reader's buffer */
  uint32_t d8[1] = {8}, d16[1] = {16};
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_DP, FK_JOB, 4, 2, 0, PW_DPX_NORM, PW_DTYPE_U8, 1, d8), 0);
  dst = (void *)1;
  assert_int_equal(pw_dpx_dest(&D, 2, &h, &dst, &err), 0);
  assert_null(dst);

  /* lengths and indices */
  h = dp_hdr(4, 0, 0, PW_DPX_RS, 0, PW_DTYPE_F32, CH - 1);
  refused(&D, 0, &h, "data-parallel chunk 0");
  h = dp_hdr(4, 0, 0, PW_DPX_RS, 0, PW_DTYPE_F32, CH + 1);
  refused(&D, 0, &h, "data-parallel chunk 0");
  h = dp_hdr(4, 0, 0, PW_DPX_RS, x->n_chunks - 1, PW_DTYPE_F32, CH); /* the last chunk is short */
  refused(&D, 0, &h, "does not fit");
  h = dp_hdr(4, 0, 0, PW_DPX_RS, x->n_chunks, PW_DTYPE_F32, 1); /* past the shard */
  refused(&D, 0, &h, "does not fit");
  h = dp_hdr(4, 0, 0, PW_DPX_AG, 0, PW_DTYPE_F32, hi0 - lo0 < CH ? hi0 - lo0 + 1 : CH + 1);
  refused(&D, 0, &h, "does not fit");
  /* senders */
  h = dp_hdr(4, 0, 0, PW_DPX_RS, 0, PW_DTYPE_F32, CH);
  refused(&D, 2, &h, "from rank 2 does not fit"); /* rank 2 claims replica 0 */
  h = dp_hdr(4, 1, 0, PW_DPX_RS, 0, PW_DTYPE_F32, CH);
  refused(&D, 1, &h, "does not fit"); /* ourselves */
  h = dp_hdr(4, 3, 0, PW_DPX_RS, 0, PW_DTYPE_F32, CH);
  refused(&D, 0, &h, "does not fit"); /* replica 3 of 3 */
  /* steps: this one or the next */
  h = dp_hdr(6, 0, 0, PW_DPX_RS, 0, PW_DTYPE_F32, CH);
  refused(&D, 0, &h, "data-parallel frame for step 6 while at step 4");
  h = dp_hdr(3, 0, 0, PW_DPX_RS, 0, PW_DTYPE_F32, CH);
  refused(&D, 0, &h, "for step 3 while at step 4");
  /* kinds, stages, dtypes */
  h = dp_hdr(4, 0, 0, PW_DPX_RS, 0, PW_DTYPE_I32, CH);
  refused(&D, 0, &h, "does not fit");
  h = dp_hdr(4, 0, 1, PW_DPX_RS, 0, PW_DTYPE_F32, CH);
  refused(&D, 0, &h, "for stage 1 from rank 0 does not fit");
  for (int what = 0; what < 16; what++) {
    if (what == PW_DPX_RS || what == PW_DPX_AG || what == PW_DPX_NORM || what == 11 /* gradrs: test_worker_gradrs */)
      continue;
    if (what == PW_PGATHER_PIECE) { /* not a ZeRO-3 run: no gather is ever due */
      h = dp_hdr(4, 0, 0, what, 0, PW_DTYPE_F32, CH);
      refused(&D, 0, &h, "not a ZeRO-3 run");
      continue;
    }
    h = dp_hdr(4, 0, 0, what, 0, PW_DTYPE_F32, CH);
    refused(&D, 0, &h, "does not fit"); /* FRS/FAG/GM/GV: not at zero 0 */
  }
  /* shard norms */
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_DP, FK_JOB, 4, 2, 0, PW_DPX_NORM, PW_DTYPE_U8, 1, d16), 0);
  refused(&D, 2, &h, "shard norm from rank 2 does not fit");
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_DP, FK_JOB, 4, 2, 0, PW_DPX_NORM, PW_DTYPE_U8, 1, d8), 0);
  refused(&D, 0, &h, "shard norm from rank 0 does not fit");
  assert_int_equal(pw_frame_hdr_init(&h, PW_FRAME_DP, FK_JOB, 4, 1, 0, PW_DPX_NORM, PW_DTYPE_U8, 1, d8), 0);
  refused(&D, 1, &h, "shard norm from rank 1 does not fit");

  /* through the wait: a refused chunk fails it, saying why */
  h = dp_hdr(4, 0, 0, PW_DPX_RS, 0, PW_DTYPE_F32, CH - 1);
  float junk[CH] = {0};
  fk_inject(r, 0, &h, junk);
  r->route[PW_FRAME_DP] = (fk_route){dpx_dest, dpx_done, &D};
  memset(pw_prog_grads(r->ls[0].prog), 0, n * sizeof(float));
  assert_int_equal(pw_dpx_allreduce(&D), PW_EPEER);
  assert_non_null(strstr(r->failed, "lost peer rank 0"));
  assert_non_null(strstr(r->failed, "data-parallel chunk 0"));
  pw_dpx_close(&D);
  fk_net_free(&net);
  fk_job_free(f);
  unsetenv("PW_COLL_CHUNK");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_allreduce_replica_order),
      cmocka_unit_test(test_zero1_exchange),
      cmocka_unit_test(test_frame_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
