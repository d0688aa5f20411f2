/* test_worker_stepend: the step end's exchange (worker/stepend.c) between
 * the six ranks of a pp=2, dp=3 job with tied embeddings, in one process:
 * six runs made from their real slices, each pair linked by a socketpair,
 * each run's compute side on its own thread, and this thread playing the
 * loop (writing what a socket did not take at once).
 *
 * Every rank must end with exactly (bit for bit) the straightforward
 * result: each gradient the sum of the replicas' in replica order, then
 * each tied parameter's the sum of its holders' in stage order, and the
 * global squared norm the sum of the pipeline ranks' partials in rank
 * order, with every tied parameter counted once. After the full step end,
 * every rank's parameters equal one optimizer step of a reference program
 * given those gradients, and its step report carries that norm.
 *
 * The exchange is a reduce-scatter then an all-gather (worker/dpx.c): each
 * rank sends exactly pw_coll_bytes_rs_ag of its arenas (2 (dp-1)/dp of
 * them over the group), also in chunks of a few floats (PW_COLL_CHUNK).
 * With train.zero 1 and 2 (the sums in another association) every rank's
 * parameters equal the reference update to 1e-6, every replica reports
 * the same norm, and each keeps optimizer state for its shard only, equal
 * to the reference's on that range. Under zero 2 a rank's gradient arena
 * holds what the reduce-scatter inside the actions leaves (worker/gradrs.c):
 * the replicas' sum in its shard, its own gradients in the ranges summed
 * whole, nothing elsewhere (unmapped). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdlib.h>

#include "collective.h"
#include "optim.h"
#include "test_worker_fixture.h"

static const char *SPEC =
    "{\"name\":\"stepend\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":2,\"n_heads\":2,\"tie_embeddings\":true},"
    "\"mesh\":{\"pp\":2,\"dp\":3},\"schedule\":{\"name\":\"1f1b\",\"microbatches\":2},"
    "\"train\":{\"steps\":10,\"batch_size\":12,\"seed\":11,\"grad_clip\":0.5,\"checkpoint_every\":0,"
    "\"optimizer\":{\"name\":\"adamw\",\"lr\":0.01,\"weight_decay\":0.1}},"
    "\"data\":{\"kind\":\"copy\"}}";

/* the same job with sharded optimizer state (no snapshots: refused with it) */
static const char *SPEC_ZERO =
    "{\"name\":\"stepend\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":2,\"n_heads\":2,\"tie_embeddings\":true},"
    "\"mesh\":{\"pp\":2,\"dp\":3},\"schedule\":{\"name\":\"1f1b\",\"microbatches\":2},"
    "\"train\":{\"steps\":10,\"batch_size\":12,\"seed\":11,\"grad_clip\":0.5,\"checkpoint_every\":0,"
    "\"zero\":ZZ,\"snapshot_every\":0,\"optimizer\":{\"name\":\"adamw\",\"lr\":0.01,\"weight_decay\":0.1}},"
    "\"data\":{\"kind\":\"copy\"}}";

typedef struct {
  int zero;           /* train.zero */
  const char *chunk;  /* PW_COLL_CHUNK, or NULL */
} variant;

#define PP 2
#define DP 3
#define NR (PP * DP)

typedef struct {
  wf_job *f;
  pw_run *run[NR];  /* rank = replica * PP + pipeline rank */
  pw_run *ref[PP];  /* reference programs of each pipeline rank */
  float *ref_grads[PP][8]; /* zero 2: a whole gradient arena lent to each reference program */
  int fds[2 * NR * NR];
  int n_fds;
} mesh;

/* Replica d's gradient of stage `stage`, element i. */
static float grad_of(int d, int stage, size_t i) {
  return (float)((int)((i * 37 + (size_t)stage * 11 + (size_t)d * 5) % 29) - 14) * 0.0625f * (d ? 1.3f : 1.0f);
}

static int setup(void **state) {
  const variant *v = *state;
  mesh *m = calloc(1, sizeof *m);
  char spec[2048];
  snprintf(spec, sizeof spec, "%s", v && v->zero ? SPEC_ZERO : SPEC);
  char *z = strstr(spec, "ZZ");
  if (z) z[0] = (char)('0' + v->zero), memmove(z + 1, z + 2, strlen(z + 2) + 1);
  if (v && v->chunk)
    setenv("PW_COLL_CHUNK", v->chunk, 1);
  else
    unsetenv("PW_COLL_CHUNK");
  m->f = wf_job_make(spec);
  assert_int_equal(m->f->plan.pp, PP);
  assert_int_equal(m->f->plan.dp, DP);
  assert_true(m->f->plan.part.n_shared > 0);
  pw_err err = {0};
  for (int k = 0; k < NR; k++) {
    m->run[k] = wf_run(m->f, k, 10);
    assert_int_equal(pw_run_open_files(m->run[k], &err), 0);
  }
  for (int pr = 0; pr < PP; pr++) {
    m->ref[pr] = wf_run(m->f, pr, 10);
    assert_int_equal(pw_run_open_files(m->ref[pr], &err), 0);
    for (int li = 0; v && v->zero == 2 && li < m->ref[pr]->cx.n_ls; li++) { /* its own is replica 0's shard */
      pw_prog *rp = m->ref[pr]->cx.ls[li].prog;
      size_t whole[1][2] = {{0, pw_prog_grad_numel(rp)}};
      assert_true(li < 8 && (m->ref_grads[pr][li] = calloc(whole[0][1] + 1, sizeof(float))));
      assert_int_equal(pw_prog_set_wgrad(rp, m->ref_grads[pr][li], (const size_t(*)[2])whole, 1, NULL, 0, NULL, NULL,
                                         NULL), 0);
    }
  }
  /* a link a -> b: a writes wl[b], b reads in_fd[a] */
  for (int a = 0; a < NR; a++)
    for (int b = 0; b < NR; b++) {
      if (a == b) continue;
      int sv[2];
      assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
      m->run[a]->sh.out.link[b].fd = sv[0];
      m->run[b]->sh.in_fd[a] = sv[1];
      m->fds[m->n_fds++] = sv[0];
      m->fds[m->n_fds++] = sv[1];
    }
  for (int k = 0; k < NR; k++) {
    pw_run *r = m->run[k];
    for (int li = 0; li < r->cx.n_ls; li++) {
      float *g = pw_prog_grads(r->cx.ls[li].prog);
      const pw_dpx_stage *x = v && v->zero == 2 ? &r->dpx.st[li] : NULL;
      for (size_t i = 0; i < pw_prog_grad_numel(r->cx.ls[li].prog); i++) {
        int whole = !x;
        for (int f = 0; x && f < x->n_full; f++) whole |= x->full[f][0] <= i && i < x->full[f][1];
        if (whole) {
          g[i] = grad_of(r->cx.replica, r->cx.ls[li].stage, i);
        } else if (i >= x->lo && i < x->hi) { /* zero 2: what the flushes left in our shard (gradrs.c) */
          float acc = 0;
          for (int d = 0; d < DP; d++) acc += grad_of(d, r->cx.ls[li].stage, i);
          g[i] = acc;
        } /* else not ours: not even mapped */
      }
    }
  }
  *state = m;
  return 0;
}

static int teardown(void **state) {
  mesh *m = *state;
  for (int i = 0; i < m->n_fds; i++) close(m->fds[i]);
  for (int k = 0; k < NR; k++) wf_run_free(m->f, m->run[k]);
  for (int pr = 0; pr < PP; pr++) {
    wf_run_free(m->f, m->ref[pr]);
    for (int li = 0; li < 8; li++) free(m->ref_grads[pr][li]);
  }
  wf_job_free(m->f);
  free(m);
  return 0;
}

/* ---- the exchange, one thread per rank ------------------------------------ */

typedef struct {
  pw_run *r;
  int full;          /* the whole step end, else pw_stepend_reduce */
  double sqnorm;
  int rc;
  atomic_int done;
} rank_thread;

static void rank_main(void *arg) {
  rank_thread *t = arg;
  if (!t->full) {
    t->rc = pw_stepend_reduce(t->r, &t->sqnorm);
  } else { /* the step end as pw_exec_step runs it after the actions */
    double lr;
    pw_event ev = {.kind = PW_EV_STEP, .after = pw_now()};
    if (!(t->rc = pw_stepend_update(t->r, &t->sqnorm, &lr))) {
      ev.grad_norm = sqrt(t->sqnorm), ev.lr = lr;
      t->rc = pw_stepend_finish(t->r, &ev);
    }
  }
  atomic_store(&t->done, 1);
}

/* This thread as every run's loop: the rest of each frame a socket did not
 * take, in order; the step reports kept in steps[]. */
static void exchange(mesh *m, int full, rank_thread t[NR], pw_event steps[NR]) {
  uv_thread_t th[NR];
  for (int k = 0; k < NR; k++) {
    t[k] = (rank_thread){.r = m->run[k], .full = full};
    assert_int_equal(uv_thread_create(&th[k], rank_main, &t[k]), 0);
  }
  for (int left = NR; left;) {
    int busy = 0;
    left = 0;
    for (int k = 0; k < NR; k++) {
      pw_run *r = m->run[k];
      pw_event ev;
      while (pw_run_event_next(r, &ev)) {
        busy = 1;
        if (ev.kind == PW_EV_STEP) {
          steps[k] = ev;
          continue;
        }
        assert_int_equal(ev.kind, PW_EV_SEND);
        assert_int_equal(ev.li, -1);
        int fd = r->sh.out.link[ev.to].fd;
        if (ev.off < PW_FRAME_HDR_SIZE) wf_write_all(fd, ev.hdr + ev.off, PW_FRAME_HDR_SIZE - ev.off);
        uint64_t poff = ev.off > PW_FRAME_HDR_SIZE ? ev.off - PW_FRAME_HDR_SIZE : 0;
        wf_write_all(fd, (const uint8_t *)ev.payload + poff, ev.len - poff);
        uv_mutex_lock(&r->sh.out.mu);
        r->sh.out.link[ev.to].queued--;
        uv_mutex_unlock(&r->sh.out.mu);
      }
      left += !atomic_load(&t[k].done);
    }
    if (!busy && left) usleep(200);
  }
  for (int k = 0; k < NR; k++) {
    uv_thread_join(&th[k]);
    if (t[k].rc) fail_msg("rank %d: %d (%s)", k, t[k].rc, m->run[k]->sh.why.error);
  }
}

/* ---- the straightforward result ------------------------------------------- */

static pw_prog_param *param_of(pw_prog *p, int model_index) {
  for (int i = 0; i < pw_prog_n_params(p); i++)
    if (pw_prog_param_at(p, i)->model_index == model_index) return pw_prog_param_at(p, i);
  return NULL;
}

/* The reference programs get the summed gradients; returns the global
 * squared norm. */
static double expected(mesh *m) {
  for (int pr = 0; pr < PP; pr++) {
    pw_run *ref = m->ref[pr];
    for (int li = 0; li < ref->cx.n_ls; li++) {
      float *g = pw_prog_grads(ref->cx.ls[li].prog);
      for (size_t i = 0; i < pw_prog_grad_numel(ref->cx.ls[li].prog); i++) {
        float acc = 0;
        for (int d = 0; d < DP; d++) acc += grad_of(d, ref->cx.ls[li].stage, i);
        g[i] = acc;
      }
      pw_prog_grads_finalize(ref->cx.ls[li].prog);
    }
  }
  const pw_partition *part = &m->f->plan.part;
  const int *s2r = m->f->plan.sched->stage_to_rank;
  for (int k = 0; k < part->n_shared; k++) {
    const pw_shared_param *sp = &part->shared[k];
    size_t n = m->f->plan.model.params[sp->param].numel;
    float *sum = calloc(n, sizeof(float));
    for (int stage = 0; stage < m->f->plan.S; stage++) /* holders in stage order */
      for (int j = 0; j < sp->n_holders; j++) {
        if (sp->holders[j] != stage) continue;
        pw_run *ref = m->ref[s2r[stage]];
        const float *g = param_of(ref->cx.ls[ref->cx.lidx_of_stage[stage]].prog, sp->param)->grad;
        for (size_t i = 0; i < n; i++) sum[i] += g[i];
      }
    for (int j = 0; j < sp->n_holders; j++) {
      pw_run *ref = m->ref[s2r[sp->holders[j]]];
      memcpy(param_of(ref->cx.ls[ref->cx.lidx_of_stage[sp->holders[j]]].prog, sp->param)->grad, sum, n * sizeof(float));
    }
    free(sum);
  }
  double total = 0;
  for (int pr = 0; pr < PP; pr++) {
    pw_run *ref = m->ref[pr];
    double part_sq = 0;
    for (int li = 0; li < ref->cx.n_ls; li++) {
      int skip[16], ns = 0, stage = ref->cx.ls[li].stage;
      for (int k = 0; k < part->n_shared; k++) {
        const pw_shared_param *sp = &part->shared[k];
        int lowest = sp->holders[0], holds = 0;
        for (int j = 0; j < sp->n_holders; j++) {
          if (sp->holders[j] < lowest) lowest = sp->holders[j];
          holds |= sp->holders[j] == stage;
        }
        if (holds && stage != lowest) skip[ns++] = sp->param;
      }
      part_sq += pw_grad_sqnorm(ref->cx.ls[li].prog, skip, ns);
    }
    total += part_sq;
  }
  return total;
}

static void test_reduce(void **state) {
  mesh *m = *state;
  rank_thread t[NR];
  pw_event steps[NR];
  exchange(m, 0, t, steps);
  double sq = expected(m);
  assert_true(sq > 0);
  for (int k = 0; k < NR; k++) {
    pw_run *r = m->run[k], *ref = m->ref[r->cx.prank];
    if (memcmp(&t[k].sqnorm, &sq, sizeof sq)) fail_msg("rank %d: norm %.17g, expected %.17g", k, t[k].sqnorm, sq);
    assert_int_equal(r->cx.n_ls, ref->cx.n_ls);
    for (int li = 0; li < r->cx.n_ls; li++) {
      const float *g = pw_prog_grads(r->cx.ls[li].prog), *e = pw_prog_grads(ref->cx.ls[li].prog);
      for (size_t i = 0; i < pw_prog_grad_numel(r->cx.ls[li].prog); i++)
        if (memcmp(&g[i], &e[i], sizeof(float)))
          fail_msg("rank %d stage %d gradient %zu: %.9g, expected %.9g", k, r->cx.ls[li].stage, i, g[i], e[i]);
    }
    assert_int_equal(r->sh.step, 0); /* the reduction alone does not end the step */
  }
  /* bytes sent: each rank its formula; the group 2 (dp-1) x the arena */
  for (int pr = 0; pr < PP; pr++) {
    uint64_t group = 0, arena = 0;
    for (int d = 0; d < DP; d++) {
      pw_run *r = m->run[d * PP + pr];
      uint64_t want = 0;
      for (int li = 0; li < r->cx.n_ls; li++) {
        want += pw_coll_bytes_rs_ag(pw_prog_grad_numel(r->cx.ls[li].prog), DP, d);
        if (!d) arena += pw_prog_grad_numel(r->cx.ls[li].prog) * sizeof(float);
      }
      if (r->dpx.bytes != want)
        fail_msg("rank %d sent %llu bytes, expected %llu", r->cx.rank, (unsigned long long)r->dpx.bytes,
                 (unsigned long long)want);
      group += r->dpx.bytes;
    }
    assert_true(group == 2 * (DP - 1) * arena);
  }
}

/* The full step end on every rank, and the reference programs' update
 * with the expected norm (*sq); lend: the references are programs of a
 * zero run (no moments of their own), lent whole ones. */
static pw_step_sched step_end(mesh *m, rank_thread t[NR], pw_event steps[NR], double *sq, int lend) {
  memset(steps, 0, sizeof *steps * NR);
  exchange(m, 1, t, steps);
  *sq = expected(m);
  pw_step_sched sc = pw_step_sched_of(&m->f->job.train, 0, *sq);
  assert_true(sc.clip_coef < 1.0f); /* the clip is in play */
  for (int pr = 0; pr < PP; pr++)
    for (int li = 0; li < m->ref[pr]->cx.n_ls; li++) {
      pw_prog *rp = m->ref[pr]->cx.ls[li].prog;
      if (lend)
        pw_prog_wire_moments(rp, calloc(pw_prog_train_numel(rp) + 1, sizeof(float)),
                             calloc(pw_prog_train_numel(rp) + 1, sizeof(float)));
      pw_optim_update(rp, &m->f->job.train, &sc);
    }
  return sc;
}

/* zero > 0: parameters to 1e-6 of the reference step, the same norm on
 * every replica, and each replica's optimizer state that of its shard. */
static void test_zero_step_end(void **state) {
  mesh *m = *state;
  rank_thread t[NR];
  pw_event steps[NR];
  double sq;
  step_end(m, t, steps, &sq, 1);
  for (int k = 0; k < NR; k++) {
    pw_run *r = m->run[k], *ref = m->ref[r->cx.prank];
    assert_int_equal(r->sh.step, 1);
    if (fabs(steps[k].grad_norm - sqrt(sq)) > 1e-6 * sqrt(sq))
      fail_msg("rank %d: norm %.17g, expected %.17g", k, steps[k].grad_norm, sqrt(sq));
    if (memcmp(&steps[k].grad_norm, &steps[r->cx.prank].grad_norm, sizeof(double)))
      fail_msg("rank %d: norm %.17g differs from replica 0's", k, steps[k].grad_norm);
    for (int li = 0; li < r->cx.n_ls; li++) {
      const float *p = pw_prog_params(r->cx.ls[li].prog), *e = pw_prog_params(ref->cx.ls[li].prog);
      for (size_t i = 0; i < pw_prog_numel(r->cx.ls[li].prog); i++)
        if (fabsf(p[i] - e[i]) > 1e-6f)
          fail_msg("rank %d stage %d parameter %zu: %.9g, expected %.9g", k, r->cx.ls[li].stage, i, p[i], e[i]);
      const pw_dpx_stage *x = &r->dpx.st[li];
      const float *em = pw_prog_moment(ref->cx.ls[li].prog, 0), *ev = pw_prog_moment(ref->cx.ls[li].prog, 1);
      size_t lo, hi;
      pw_shard_range(pw_prog_train_numel(r->cx.ls[li].prog), DP, r->cx.replica, &lo, &hi);
      assert_true(x->lo == lo && x->hi == hi);
      assert_null(pw_prog_moment(r->cx.ls[li].prog, 0)); /* no whole state here */
      for (size_t i = lo; i < hi; i++)
        if (fabsf(x->m[i - lo] - em[i]) > 1e-7f || fabsf(x->v[i - lo] - ev[i]) > 1e-9f)
          fail_msg("rank %d stage %d moment %zu: %.9g %.9g, expected %.9g %.9g", k, r->cx.ls[li].stage, i, x->m[i - lo],
                   x->v[i - lo], em[i], ev[i]);
    }
  }
  for (int pr = 0; pr < PP; pr++)
    for (int li = 0; li < m->ref[pr]->cx.n_ls; li++) {
      pw_prog *rp = m->ref[pr]->cx.ls[li].prog;
      free(pw_prog_moment(rp, 0)), free(pw_prog_moment(rp, 1));
      pw_prog_wire_moments(rp, NULL, NULL);
    }
}

static void test_full_step_end(void **state) {
  mesh *m = *state;
  rank_thread t[NR];
  pw_event steps[NR];
  double sq;
  pw_step_sched sc = step_end(m, t, steps, &sq, 0);
  double norm = sqrt(sq);
  for (int k = 0; k < NR; k++) {
    pw_run *r = m->run[k], *ref = m->ref[r->cx.prank];
    assert_int_equal(r->sh.step, 1);
    assert_int_equal(steps[k].kind, PW_EV_STEP);
    assert_int_equal(steps[k].step, 0);
    if (memcmp(&steps[k].grad_norm, &norm, sizeof norm))
      fail_msg("rank %d: reported norm %.17g, expected %.17g", k, steps[k].grad_norm, norm);
    assert_true(steps[k].lr == sc.lr);
    for (int li = 0; li < r->cx.n_ls; li++) {
      const float *p = pw_prog_params(r->cx.ls[li].prog), *e = pw_prog_params(ref->cx.ls[li].prog);
      for (size_t i = 0; i < pw_prog_numel(r->cx.ls[li].prog); i++)
        if (memcmp(&p[i], &e[i], sizeof(float)))
          fail_msg("rank %d stage %d parameter %zu: %.9g, expected %.9g", k, r->cx.ls[li].stage, i, p[i], e[i]);
      /* and the gradients are zero for the next step */
      const float *g = pw_prog_grads(r->cx.ls[li].prog);
      for (size_t i = 0; i < pw_prog_grad_numel(r->cx.ls[li].prog); i++) assert_true(g[i] == 0.0f);
    }
  }
}

/* zero 2: where a peer's gradient piece goes (gradrs.c), and what is
 * refused, naming why: a piece past the receive buffer, a flush two
 * ahead, the wrong sender, another stage, an empty piece of a flush two
 * ahead (it reaches only pw_run_frame_done), and a step-end
 * reduce-scatter chunk of the main gradients, which zero 2 has no buffer
 * for. */
static void test_zero2_frames(void **state) {
  mesh *m = *state;
  pw_run *r = m->run[0]; /* replica 0, pipeline rank 0 */
  pw_gradrs *g = r->dpx.gradrs;
  assert_non_null(g);
  int stage = r->cx.ls[0].stage, from = 1 * PP + 0; /* replica 1's rank of pipeline rank 0 */
  size_t cap = g->st[0].cap;
  assert_true(cap > 4);
  struct {
    int from, stage;
    uint32_t call, off;
    size_t n;
    const char *why;
  } cases[] = {{from, stage, 0, 2, 3, NULL},   {from, stage, 1, 0, cap, NULL},
               {from, stage, 0, (uint32_t)cap - 1, 2, "does not fit"}, {from, stage, 2, 0, 1, "does not fit"},
               {1, stage, 0, 0, 1, "does not fit"}, {from, 99, 0, 0, 1, "does not fit"}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    pw_frame_hdr h;
    pw_err err = {0};
    void *dst = NULL;
    assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_DP, r->cx.job, cases[c].call, 1, (uint32_t)cases[c].stage,
                                           PW_GRADRS_PIECE | cases[c].off << 4, PW_DTYPE_F32, cases[c].n), 0);
    int rc = pw_route_dest(r, cases[c].from, &h, &dst, &err);
    if (!cases[c].why) {
      if (rc) fail_msg("case %zu refused: %s", c, err.msg);
      assert_ptr_equal(dst, g->st[0].rx[cases[c].call & 1] + cases[c].off); /* replica 1: slot 0 */
    } else if (!rc || !strstr(err.msg, cases[c].why)) {
      fail_msg("case %zu: rc %d, '%s' (expected a refusal saying '%s')", c, rc, err.msg, cases[c].why);
    }
  }
  pw_frame_hdr h;
  pw_err err = {0};
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_DP, r->cx.job, 2, 1, (uint32_t)stage, PW_GRADRS_PIECE,
                                         PW_DTYPE_F32, 0), 0);
  assert_int_not_equal(pw_route_done(r, from, &h, NULL, &err), 0);
  void *dst = NULL;
  assert_int_equal(pw_frame_hdr_init_vec(&h, PW_FRAME_DP, r->cx.job, 0, 1, (uint32_t)stage, PW_DPX_RS,
                                         PW_DTYPE_F32, 1), 0);
  assert_int_not_equal(pw_route_dest(r, from, &h, &dst, &err), 0);
  assert_null(dst);
}

int main(void) {
  static const variant chunked = {0, "5"}, zero1 = {1, NULL}, zero2 = {2, "7"};
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_reduce, setup, teardown),
      cmocka_unit_test_prestate_setup_teardown(test_reduce, setup, teardown, (void *)&chunked),
      cmocka_unit_test_setup_teardown(test_full_step_end, setup, teardown),
      cmocka_unit_test_prestate_setup_teardown(test_full_step_end, setup, teardown, (void *)&chunked),
      cmocka_unit_test_prestate_setup_teardown(test_zero_step_end, setup, teardown, (void *)&zero1),
      cmocka_unit_test_prestate_setup_teardown(test_zero_step_end, setup, teardown, (void *)&zero2),
      cmocka_unit_test_prestate_setup_teardown(test_zero2_frames, setup, teardown, (void *)&zero2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
