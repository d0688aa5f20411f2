/* test_worker_snaprun: when a rank takes its in-memory snapshot
 * (worker/snaprun.c), and what the snapshot holds — the two ranks of a
 * pp=2 job trained for a few steps in one process: each run's compute side
 * on its own thread (pw_exec_actions, then pw_stepend_run, as exec.c's
 * loop), the links socketpairs, this thread playing both loops (writing
 * what a socket did not take at once).
 *
 * The snapshot of the state after s steps is no longer copied at step s's
 * end but in step s + 1 (in its first wait that finds nothing to read, else
 * at its end, before any exchange, and then the rank copies right after
 * each update from then on), while the parameters and moments are
 * still those of step s's update. Every rank's own entry and the one its
 * holder keeps must equal, bit for bit, its stages' parameters and moments
 * as they were right after the update of s steps — not after s + 1 (a copy
 * taken after the next update) — and the snapshot of every step but the
 * last must be taken. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test_worker_fixture.h"

static const char *SPEC =
    "{\"name\":\"snaprun\",\"model\":{\"template\":\"gpt\",\"vocab_size\":32,\"seq_len\":4,\"d_model\":8,"
    "\"n_layers\":2,\"n_heads\":2},"
    "\"mesh\":{\"pp\":2,\"dp\":1},\"schedule\":{\"name\":\"1f1b\",\"microbatches\":2},"
    "\"train\":{\"steps\":9,\"batch_size\":4,\"seed\":3,\"snapshot_every\":1,\"checkpoint_every\":0,"
    "\"optimizer\":{\"name\":\"adamw\",\"lr\":0.01}},"
    "\"data\":{\"kind\":\"copy\"}}";

#define NR 2
#define STEPS 4 /* run of a longer job: its last step would write a checkpoint */

/* A rank's stage state (parameters, m, v) after each step: [STEPS + 1]. */
typedef struct {
  pw_run *r;
  float *after[STEPS + 1];
  size_t numel;
  int rc;
  atomic_int done;
} rank_thread;

static float *state_copy(pw_prog *p) {
  size_t n = pw_prog_numel(p), tn = pw_prog_train_numel(p);
  float *s = calloc(3 * n, sizeof(float));
  memcpy(s, pw_prog_params(p), n * sizeof(float));
  memcpy(s + n, pw_prog_moment(p, 0), tn * sizeof(float));
  memcpy(s + 2 * n, pw_prog_moment(p, 1), tn * sizeof(float));
  return s;
}

static void rank_main(void *arg) {
  rank_thread *t = arg;
  pw_run *r = t->r;
  for (int s = 0; s < STEPS && !t->rc; s++) {
    t->rc = pw_exec_step(r);
    /* the update of step s is done, the next step has not begun */
    if (!t->rc) t->after[s + 1] = state_copy(r->cx.ls[0].prog);
  }
  atomic_store(&t->done, 1);
}

static void test_snapshot_after_the_update(void **state) {
  (void)state;
  wf_job *f = wf_job_make(SPEC);
  assert_int_equal(f->plan.pp, NR);
  pw_run *run[NR];
  pw_snapstore store[NR];
  int fds[2 * NR * NR], n_fds = 0;
  pw_err err = {0};
  for (int k = 0; k < NR; k++) {
    run[k] = wf_run(f, k, STEPS + 1);
    assert_int_equal(pw_snapstore_init(&store[k]), 0);
    run[k]->snap.store = &store[k];
    assert_int_equal(pw_run_open_files(run[k], &err), 0);
    assert_int_equal(run[k]->cx.n_ls, 1);
    pw_exec_spin_init(run[k]);
  }
  for (int a = 0; a < NR; a++)
    for (int b = 0; b < NR; b++) {
      if (a == b) continue;
      int sv[2];
      assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
      run[a]->sh.out.link[b].fd = sv[0];
      run[b]->sh.in_fd[a] = sv[1];
      fds[n_fds++] = sv[0];
      fds[n_fds++] = sv[1];
    }
  rank_thread t[NR];
  uv_thread_t th[NR];
  for (int k = 0; k < NR; k++) {
    t[k] = (rank_thread){.r = run[k], .numel = pw_prog_numel(run[k]->cx.ls[0].prog)};
    t[k].after[0] = state_copy(run[k]->cx.ls[0].prog);
    assert_int_equal(uv_thread_create(&th[k], rank_main, &t[k]), 0);
  }
  /* both loops: the rest of every frame a socket did not take; snapshot
   * reports counted */
  int snaps[NR][2] = {{0}};
  for (int left = NR; left;) {
    int busy = 0;
    left = 0;
    for (int k = 0; k < NR; k++) {
      pw_run *r = run[k];
      pw_event ev;
      while (pw_run_event_next(r, &ev)) {
        busy = 1;
        if (ev.kind == PW_EV_SNAP) snaps[k][ev.held]++;
        if (ev.kind != PW_EV_SEND) continue;
        int fd = r->sh.out.link[ev.to].fd;
        if (ev.off < PW_FRAME_HDR_SIZE) wf_write_all(fd, ev.hdr + ev.off, PW_FRAME_HDR_SIZE - ev.off);
        uint64_t poff = ev.off > PW_FRAME_HDR_SIZE ? ev.off - PW_FRAME_HDR_SIZE : 0;
        wf_write_all(fd, (const uint8_t *)ev.payload + poff, ev.len - poff);
        if (ev.pending) atomic_fetch_sub(ev.pending, 1);
        r->lp.sends_inflight++; /* pw_run_send_done counts it back */
        pw_run_send_done(r, ev.to, ev.li, ev.slot);
      }
      left += !atomic_load(&t[k].done);
    }
    if (!busy && left) usleep(100);
  }
  for (int k = 0; k < NR; k++) {
    uv_thread_join(&th[k]);
    if (t[k].rc) fail_msg("rank %d: %d (%s)", k, t[k].rc, run[k]->sh.why.error);
  }
  for (int k = 0; k < NR; k++) {
    pw_run *r = run[k];
    int stage = r->cx.ls[0].stage, holder = (k + 1) % NR;
    size_t n = t[k].numel;
    /* steps 1 .. STEPS - 1, and STEPS too on a rank that found no idle
     * wait (it then copies right after the update; the holder, done, never
     * reads that one): the newest two of each kind kept */
    int taken = r->snap.taken;
    assert_true(taken == STEPS - 1 || taken == STEPS);
    assert_int_equal(snaps[k][0], taken);
    assert_int_equal(snaps[holder][1], STEPS - 1);
    for (int kind = PW_SNAP_OWN; kind <= PW_SNAP_HELD; kind++) {
      int newest = kind == PW_SNAP_OWN ? taken : STEPS - 1;
      for (int s = newest - 1; s <= newest; s++) {
        pw_snapstore *st = &store[kind == PW_SNAP_OWN ? k : holder];
        pw_snap *e = NULL;
        uv_mutex_lock(&st->mu);
        for (pw_snap *x = st->list; x; x = x->next)
          if (x->stage == stage && x->kind == kind && x->step == s) e = x;
        uv_mutex_unlock(&st->mu);
        if (!e) fail_msg("rank %d: no %s snapshot of stage %d after step %d", k, kind ? "held" : "own", stage, s);
        assert_int_equal(e->numel, n);
        if (memcmp(e->data, t[k].after[s], 3 * n * sizeof(float)))
          fail_msg("rank %d: the %s snapshot of step %d is not the state after %d steps", k, kind ? "held" : "own", s,
                   s);
        if (s < STEPS) assert_true(memcmp(e->data, t[k].after[s + 1], n * sizeof(float)) != 0); /* a later update's */
      }
    }
  }
  for (int i = 0; i < n_fds; i++) close(fds[i]);
  for (int k = 0; k < NR; k++) {
    for (int s = 0; s <= STEPS; s++) free(t[k].after[s]);
    wf_run_free(f, run[k]);
    pw_snapstore_free(&store[k]);
  }
  wf_job_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_snapshot_after_the_update),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
