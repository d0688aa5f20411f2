/* test_coord_recovery: what the coordinator restarts a job from, and on
 * which workers (coordinator/recovery.c), on worker links made by hand (no
 * sockets, no loop).
 *
 * The mirror of a worker's snapshots must keep exactly what the worker
 * keeps: it is replayed against the worker's own store (worker/snap.c) on
 * a long sequence of reports. A restart's workers: the last run's keep
 * their ranks, then holders of the job's snapshots, then the rest in the
 * order given, never one twice. Its start: the newest step strictly
 * between the checkpoint and the end at which every stage is in the
 * memory of one of its workers, sent by a rank that runs the stage when
 * one holds it; none when a worker and its holder are both gone. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "ctl_int.h"

/* The worker's store itself, compiled in: the coordinator does not link
 * the worker's modules, and the mirror must follow this very rule. */
#include "../../worker/snap.c"

#define JOB 7

typedef struct {
  pw_coord *c;
  pw_wconn *w[8];
  int n;
} fx;

static pw_wconn *conn(fx *x, const char *name) {
  pw_wconn *w = calloc(1, sizeof *w);
  assert_non_null(w);
  snprintf(w->name, sizeof w->name, "%s", name);
  w->id = x->n + 1;
  w->c = x->c;
  w->registered = 1;
  pw_ctl *ctl = x->c->ctl;
  w->next = ctl->conns; /* as ctlsrv.c links them */
  ctl->conns = w;
  x->w[x->n++] = w;
  return w;
}

static int setup(void **state) {
  fx *x = calloc(1, sizeof *x);
  x->c = calloc(1, sizeof *x->c);
  x->c->ctl = calloc(1, sizeof(pw_ctl));
  *state = x;
  return 0;
}

static int teardown(void **state) {
  fx *x = *state;
  pw_rec_free_all(x->c);
  for (int i = 0; i < x->n; i++) {
    pw_rec_conn_free(x->w[i]);
    free(x->w[i]);
  }
  free(x->c->ctl);
  free(x->c);
  free(x);
  return 0;
}

static pw_jobrt *jobrt(int64_t job, int n, pw_wconn **ranks) {
  pw_jobrt *jr = calloc(1, sizeof *jr);
  jr->job = job;
  jr->n_ranks = n;
  jr->ranks = calloc((size_t)n, sizeof *jr->ranks);
  for (int r = 0; r < n; r++) jr->ranks[r] = ranks[r];
  return jr;
}

static void jobrt_free(pw_jobrt *jr) {
  free(jr->ranks);
  free(jr);
}

static int mirror_has(const pw_wconn *w, int64_t job, int stage, int step, int held) {
  for (int i = 0; i < w->n_snaps; i++)
    if (w->snaps[i].job == job && w->snaps[i].stage == stage && w->snaps[i].step == step && w->snaps[i].held == held)
      return 1;
  return 0;
}

static int mirror_count(const pw_wconn *w, int64_t job, int stage, int held) {
  int n = 0;
  for (int i = 0; i < w->n_snaps; i++)
    n += w->snaps[i].job == job && w->snaps[i].stage == stage && w->snaps[i].held == held;
  return n;
}

/* ---- the mirror -------------------------------------------------------------- */

static void test_mirror_two_generations(void **state) {
  fx *x = *state;
  pw_wconn *w = conn(x, "w0");
  pw_rec_snapshot_add(w, JOB, 0, 1, 0);
  pw_rec_snapshot_add(w, JOB, 0, 2, 0);
  pw_rec_snapshot_add(w, JOB, 0, 3, 0);
  assert_int_equal(mirror_count(w, JOB, 0, 0), 2);
  assert_false(mirror_has(w, JOB, 0, 1, 0));
  assert_true(mirror_has(w, JOB, 0, 2, 0) && mirror_has(w, JOB, 0, 3, 0));
  /* a step reported again (rewritten in place) evicts nothing */
  pw_rec_snapshot_add(w, JOB, 0, 2, 0);
  assert_true(mirror_has(w, JOB, 0, 2, 0) && mirror_has(w, JOB, 0, 3, 0));
  assert_int_equal(w->n_snaps, 2);
  /* held copies, other stages and other jobs have their own two */
  pw_rec_snapshot_add(w, JOB, 0, 9, 1);
  pw_rec_snapshot_add(w, JOB, 1, 9, 0);
  pw_rec_snapshot_add(w, JOB + 1, 0, 9, 0);
  assert_true(mirror_has(w, JOB, 0, 2, 0) && mirror_has(w, JOB, 0, 3, 0));
  assert_int_equal(w->n_snaps, 5);
  /* an older step than both takes the oldest's place, as the worker's store does */
  pw_rec_snapshot_add(w, JOB, 0, 1, 0);
  assert_true(mirror_has(w, JOB, 0, 1, 0) && mirror_has(w, JOB, 0, 3, 0));
  assert_false(mirror_has(w, JOB, 0, 2, 0));
}

typedef struct {
  int64_t job;
  int stage, step, held;
} inv;

static int inv_cmp(const void *a, const void *b) {
  const inv *p = a, *q = b;
  if (p->job != q->job) return p->job < q->job ? -1 : 1;
  if (p->stage != q->stage) return p->stage - q->stage;
  if (p->held != q->held) return p->held - q->held;
  return p->step - q->step;
}

/* Reports replayed into the mirror and into a real store as the worker
 * writes them (OWN for its own, HELD for a peer's); both must hold the
 * same (job, stage, held, step) after every report. */
static void test_mirror_follows_the_worker_store(void **state) {
  fx *x = *state;
  pw_wconn *w = conn(x, "w0");
  pw_snapstore s;
  assert_int_equal(pw_snapstore_init(&s), 0);
  uint32_t rng = 12345;
  int base = 1;
  for (int i = 0; i < 3000; i++) {
    rng = rng * 1664525u + 1013904223u;
    uint32_t v = rng >> 8;
    int64_t job = 1 + (int64_t)(v % 2);
    int stage = (int)(v / 2 % 3), held = (int)(v / 6 % 2);
    /* steps mostly move on, sometimes repeat or go back (a restart) */
    int d = (int)(v / 12 % 8);
    if (d == 0) base++;
    int step = d == 7 && base > 3 ? base - 3 : base + (d % 2);
    pw_snap *e = pw_snap_begin_write(&s, (uint64_t)job, stage, held ? PW_SNAP_HELD : PW_SNAP_OWN, step, 1);
    assert_non_null(e); /* nothing in use: there is always an entry */
    pw_snap_end_write(&s, e, step);
    pw_rec_snapshot_add(w, job, stage, step, held);
    inv a[64], b[64];
    int na = 0, nb = 0;
    for (pw_snap *p = s.list; p; p = p->next) {
      assert_true(na < 64);
      a[na++] = (inv){(int64_t)p->job, p->stage, p->step, p->kind == PW_SNAP_HELD};
    }
    for (int k = 0; k < w->n_snaps; k++) {
      assert_true(nb < 64);
      b[nb++] = (inv){w->snaps[k].job, w->snaps[k].stage, w->snaps[k].step, w->snaps[k].held};
    }
    qsort(a, (size_t)na, sizeof *a, inv_cmp);
    qsort(b, (size_t)nb, sizeof *b, inv_cmp);
    int same = na == nb;
    for (int k = 0; same && k < na; k++) same = !inv_cmp(&a[k], &b[k]);
    if (!same)
      fail_msg("report %d (job %lld stage %d step %d held %d): the worker holds %d snapshots, the mirror %d", i,
               (long long)job, stage, step, held, na, nb);
  }
  assert_true(w->n_snaps == 2 * 3 * 2 * 2); /* every key reached its two generations */
  pw_snapstore_free(&s);
}

static void test_keep_and_forget(void **state) {
  fx *x = *state;
  pw_wconn *a = conn(x, "a"), *b = conn(x, "b");
  for (int s = 1; s <= 2; s++) {
    pw_rec_snapshot_add(a, JOB, 0, s, 0);
    pw_rec_snapshot_add(a, JOB + 1, 0, s, 1);
    pw_rec_snapshot_add(b, JOB, 1, s, 0);
    pw_rec_snapshot_add(b, JOB + 1, 1, s, 0);
  }
  /* a run of JOB assigned to a: the worker drops every other job's */
  pw_rec_snapshots_keep(a, JOB);
  assert_int_equal(a->n_snaps, 2);
  assert_true(mirror_has(a, JOB, 0, 1, 0) && mirror_has(a, JOB, 0, 2, 0));
  /* a restore from JOB's snapshots failed: nobody's count any more */
  pw_rec_snapshots_forget(x->c, JOB);
  assert_int_equal(a->n_snaps, 0);
  assert_int_equal(b->n_snaps, 2);
  assert_true(mirror_has(b, JOB + 1, 1, 1, 0) && mirror_has(b, JOB + 1, 1, 2, 0));
  /* the job is done: the worker drops all */
  pw_rec_snapshots_keep(b, 0);
  assert_int_equal(b->n_snaps, 0);
}

/* ---- placement --------------------------------------------------------------- */

static void expect_choice(fx *x, int64_t job, pw_wconn **idle, int n_idle, int need, const char *want) {
  pw_wconn *out[8];
  memset(out, 0xa5, sizeof out); /* every slot must be set */
  pw_rec_choose(x->c, job, need, idle, n_idle, out);
  char got[128] = "";
  for (int r = 0; r < need; r++) {
    assert_non_null(out[r]);
    size_t l = strlen(got);
    snprintf(got + l, sizeof got - l, "%s%s", r ? " " : "", out[r]->name);
    for (int q = 0; q < r; q++)
      if (out[q] == out[r]) fail_msg("worker %s chosen twice (%s)", out[r]->name, got);
  }
  if (strcmp(got, want)) fail_msg("chose '%s', expected '%s'", got, want);
}

static void test_choose(void **state) {
  fx *x = *state;
  pw_wconn *A = conn(x, "A"), *B = conn(x, "B"), *C = conn(x, "C"), *D = conn(x, "D"), *E = conn(x, "E"),
           *F = conn(x, "F");
  /* the last run: A, B, C on ranks 0, 1, 2 */
  pw_wconn *last[] = {A, B, C};
  pw_jobrt *jr = jobrt(JOB, 3, last);
  pw_rec_remember(x->c, jr);
  /* E holds a snapshot of the job (a held copy), D one of another job */
  pw_rec_snapshot_add(E, JOB, 1, 5, 1);
  pw_rec_snapshot_add(D, JOB + 1, 0, 5, 0);
  /* B is lost: A and C keep their ranks, the holder E takes rank 1 even
   * though D comes first */
  pw_wconn *idle[] = {D, C, E, A, F};
  expect_choice(x, JOB, idle, 5, 3, "A E C");
  /* a survivor that is also a holder is not taken twice */
  pw_rec_snapshot_add(C, JOB, 2, 5, 0);
  expect_choice(x, JOB, idle, 5, 3, "A E C");
  /* no holder left idle: the rest in the order given */
  pw_wconn *idle2[] = {F, D, C, A};
  expect_choice(x, JOB, idle2, 4, 3, "A F C");
  /* another job, with no placement: holders of its snapshots first (D), then in order */
  pw_wconn *idle3[] = {F, E, A, D};
  expect_choice(x, JOB + 1, idle3, 4, 3, "D F E");
  expect_choice(x, JOB + 1, idle3, 4, 4, "D F E A");
  /* a later run's placement replaces the earlier one */
  pw_wconn *later[] = {C, A, F};
  pw_jobrt *jr2 = jobrt(JOB, 3, later);
  pw_rec_remember(x->c, jr2);
  pw_wconn *idle4[] = {A, B, C, D, E, F};
  expect_choice(x, JOB, idle4, 6, 3, "C A F");
  /* ... and a run of another size, too (no stale names past its ranks) */
  pw_wconn *two[] = {B, D};
  pw_jobrt *jr3 = jobrt(JOB, 2, two);
  pw_rec_remember(x->c, jr3);
  expect_choice(x, JOB, idle4, 6, 3, "B D C"); /* rank 2: the holder C (of stage 2) */
  /* forgotten (the job will not run again): holders, then order */
  pw_rec_forget(x->c, JOB);
  expect_choice(x, JOB, idle4, 6, 3, "C E A");
  jobrt_free(jr);
  jobrt_free(jr2);
  jobrt_free(jr3);
}

/* ---- the restore point ------------------------------------------------------- */

/* from as "r0 r1 ..." (or "null"). */
static void expect_from(json_t *from, const char *want) {
  char got[64] = "null";
  if (from) {
    got[0] = 0;
    for (size_t i = 0; i < json_array_size(from); i++) {
      size_t l = strlen(got);
      snprintf(got + l, sizeof got - l, "%s%lld", i ? " " : "", (long long)json_integer_value(json_array_get(from, i)));
    }
  }
  if (strcmp(got, want)) fail_msg("from is '%s', expected '%s'", got, want);
}

static int point(pw_jobrt *jr, int S, int pp, const int *stage_rank, int after, int before, const char *want_from) {
  json_t *from = (json_t *)1;
  int step = pw_rec_restore_point(jr, S, pp, stage_rank, after, before, &from);
  if (!step) assert_null(from);
  expect_from(from, want_from);
  json_decref(from);
  return step;
}

/* pp=3, one stage each, ranks one step apart: W0 and W1 have finished
 * step 6, W2 only step 5. Each keeps its own stage's two newest and holds
 * its predecessor's (W1 stage 0's, W2 stage 1's, W0 stage 2's). */
static void three_ranks(fx *x, pw_wconn **w) {
  static const char *names[] = {"W0", "W1", "W2"};
  int newest[] = {6, 6, 5};
  for (int r = 0; r < 3; r++) w[r] = conn(x, names[r]);
  for (int r = 0; r < 3; r++)
    for (int s = newest[r] - 1; s <= newest[r]; s++) {
      pw_rec_snapshot_add(w[r], JOB, r, s, 0);
      pw_rec_snapshot_add(w[(r + 1) % 3], JOB, r, s, 1);
    }
}

static void test_restore_point(void **state) {
  fx *x = *state;
  pw_wconn *w[3];
  three_ranks(x, w);
  int stage_rank[] = {0, 1, 2};
  pw_jobrt *jr = jobrt(JOB, 3, w);
  /* step 6 is missing stage 2: 5 is the newest every stage has; each
   * from its own rank, though W0 holds stage 2 too */
  assert_int_equal(point(jr, 3, 3, stage_rank, 0, 100, "0 1 2"), 5);
  /* strictly after the checkpoint, strictly before the end */
  assert_int_equal(point(jr, 3, 3, stage_rank, 4, 100, "0 1 2"), 5);
  assert_int_equal(point(jr, 3, 3, stage_rank, 5, 100, "null"), 0); /* the checkpoint of step 5 is as new */
  assert_int_equal(point(jr, 3, 3, stage_rank, 7, 100, "null"), 0);
  assert_int_equal(point(jr, 3, 3, stage_rank, 0, 5, "null"), 0); /* only 4 is before 5, and stage 2 lacks it */
  /* another job's newer snapshots count for nothing */
  for (int r = 0; r < 3; r++) pw_rec_snapshot_add(w[r], JOB + 1, r, 9, 0);
  assert_int_equal(point(jr, 3, 3, stage_rank, 0, 100, "0 1 2"), 5);
  jobrt_free(jr);
}

static void test_restore_point_lost_worker(void **state) {
  fx *x = *state;
  pw_wconn *w[3];
  three_ranks(x, w);
  pw_wconn *spare = conn(x, "spare"), *other = conn(x, "other");
  int stage_rank[] = {0, 1, 2};
  /* W1 lost, the spare takes rank 1: its stage comes from its holder W2 */
  pw_wconn *r1[] = {w[0], spare, w[2]};
  pw_jobrt *jr = jobrt(JOB, 3, r1);
  assert_int_equal(point(jr, 3, 3, stage_rank, 0, 100, "0 2 2"), 5);
  jobrt_free(jr);
  /* W2 lost: stage 2 from its holder W0; step 6 is still short of stage
   * 2 (W0 holds it at 4 and 5 only) */
  pw_wconn *r2[] = {w[0], w[1], spare};
  jr = jobrt(JOB, 3, r2);
  assert_int_equal(point(jr, 3, 3, stage_rank, 0, 100, "0 1 0"), 5);
  jobrt_free(jr);
  /* W1 and its holder W2 lost together: nobody has stage 1 */
  pw_wconn *r3[] = {w[0], spare, other};
  jr = jobrt(JOB, 3, r3);
  assert_int_equal(point(jr, 3, 3, stage_rank, 0, 100, "null"), 0);
  jobrt_free(jr);
  /* the survivors shuffled onto other ranks still count as holders */
  pw_wconn *r4[] = {w[2], w[0], w[1]};
  jr = jobrt(JOB, 3, r4);
  assert_int_equal(point(jr, 3, 3, stage_rank, 0, 100, "1 0 0"), 5); /* nobody runs what it holds */
  jobrt_free(jr);
}

/* pp=2, dp=2 (global rank = replica * pp + pipeline rank), interleaved:
 * stages 0 and 2 on pipeline rank 0, 1 and 3 on pipeline rank 1. */
static void test_restore_point_replicas(void **state) {
  fx *x = *state;
  pw_wconn *g[4];
  static const char *names[] = {"g0", "g1", "g2", "g3"};
  for (int r = 0; r < 4; r++) g[r] = conn(x, names[r]);
  int stage_rank[] = {0, 1, 0, 1};
  /* g0 (pipeline rank 0) holds its own stages; stage 1 and 3 are held
   * only by g2 (pipeline rank 0, a held copy) and g3 (pipeline rank 1, its
   * own): g3 must send them, nothing moving that needs not */
  pw_rec_snapshot_add(g[0], JOB, 0, 8, 0);
  pw_rec_snapshot_add(g[0], JOB, 2, 8, 0);
  pw_rec_snapshot_add(g[2], JOB, 1, 8, 1);
  pw_rec_snapshot_add(g[2], JOB, 3, 8, 1);
  pw_rec_snapshot_add(g[3], JOB, 1, 8, 0);
  pw_rec_snapshot_add(g[3], JOB, 3, 8, 0);
  pw_jobrt *jr = jobrt(JOB, 4, g);
  assert_int_equal(point(jr, 4, 2, stage_rank, 0, 100, "0 3 0 3"), 8);
  jobrt_free(jr);
  /* g3 gone: g2's held copies do */
  pw_wconn *spare = conn(x, "spare");
  pw_wconn *r2[] = {g[0], g[1], g[2], spare};
  jr = jobrt(JOB, 4, r2);
  assert_int_equal(point(jr, 4, 2, stage_rank, 0, 100, "0 2 0 2"), 8);
  jobrt_free(jr);
  /* a rank not yet assigned (NULL) holds nothing */
  pw_wconn *r3[] = {g[0], NULL, NULL, NULL};
  jr = jobrt(JOB, 4, r3);
  assert_int_equal(point(jr, 4, 2, stage_rank, 0, 100, "null"), 0);
  jobrt_free(jr);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_mirror_two_generations, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mirror_follows_the_worker_store, setup, teardown),
      cmocka_unit_test_setup_teardown(test_keep_and_forget, setup, teardown),
      cmocka_unit_test_setup_teardown(test_choose, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restore_point, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restore_point_lost_worker, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restore_point_replicas, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
