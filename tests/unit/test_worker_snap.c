/* test_worker_snap: the worker's in-memory snapshot store (worker/snap.c).
 *
 * Retention: at most PW_SNAP_GENS (2) entries per (job, stage, kind); a
 * third step takes the oldest entry's place, a step already there is
 * rewritten in its own entry. Safety: an entry a reader claimed
 * (pw_snap_acquire) or a network write still reads (sending > 0) is never
 * handed to a writer nor freed by drop_others; an entry being written
 * (step 0) is never handed to a reader. Readers prefer the rank's own copy
 * (OWN) over a peer's (HELD) and a restore's (RESTORE). The store's byte
 * count is exact (3 parts of numel floats per entry) as sizes change and
 * entries go. Last, a writer thread and a reader thread race over the
 * store: the reader never sees a step's entry holding another step's
 * bytes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "snap.h"

#define ENTRY_BYTES(n) ((size_t)3 * (n) * sizeof(float))

static int setup(void **state) {
  pw_snapstore *s = calloc(1, sizeof *s);
  assert_int_equal(pw_snapstore_init(s), 0);
  *state = s;
  return 0;
}

static int teardown(void **state) {
  pw_snapstore *s = *state;
  pw_snapstore_free(s);
  free(s);
  return 0;
}

/* The value at float i of a snapshot of `step` with salt `salt`: exact in
 * a float (below 2^24), different for neighbouring steps and (up to 16384
 * floats) for every position. */
static float pat(int step, int salt, size_t i) { return (float)((step * 8 + salt) % 512 * 16384 + (int)(i % 16384)); }

static void fill(pw_snap *e, int step, int salt) {
  for (size_t i = 0; i < 3 * e->numel; i++) e->data[i] = pat(step, salt, i);
}

static int holds_pattern(const pw_snap *e, int step, int salt) {
  for (size_t i = 0; i < 3 * e->numel; i++)
    if (e->data[i] != pat(step, salt, i)) return 0;
  return 1;
}

/* Writes a whole snapshot (pattern of step, salt); returns its entry. */
static pw_snap *put(pw_snapstore *s, uint64_t job, int stage, int kind, int step, size_t numel, int salt) {
  pw_snap *e = pw_snap_begin_write(s, job, stage, kind, step, numel);
  assert_non_null(e);
  assert_int_equal(e->step, 0); /* invalid while written */
  assert_int_equal(e->numel, numel);
  fill(e, step, salt);
  pw_snap_end_write(s, e, step);
  return e;
}

static int count(pw_snapstore *s, uint64_t job, int stage, int kind) {
  int n = 0;
  for (pw_snap *e = s->list; e; e = e->next) n += e->job == job && e->stage == stage && e->kind == kind;
  return n;
}

static int has_step(pw_snapstore *s, uint64_t job, int stage, int kind, int step) {
  for (pw_snap *e = s->list; e; e = e->next)
    if (e->job == job && e->stage == stage && e->kind == kind && e->step == step) return 1;
  return 0;
}

static void test_two_generations(void **state) {
  pw_snapstore *s = *state;
  pw_snap *e1 = put(s, 5, 0, PW_SNAP_OWN, 1, 10, 0);
  pw_snap *e2 = put(s, 5, 0, PW_SNAP_OWN, 2, 10, 0);
  assert_ptr_not_equal(e1, e2);
  assert_int_equal(count(s, 5, 0, PW_SNAP_OWN), 2);
  assert_int_equal(s->bytes, 2 * ENTRY_BYTES(10));
  /* the third step takes the oldest's entry: no third allocation */
  pw_snap *e3 = put(s, 5, 0, PW_SNAP_OWN, 3, 10, 0);
  assert_ptr_equal(e3, e1);
  assert_int_equal(count(s, 5, 0, PW_SNAP_OWN), 2);
  assert_false(has_step(s, 5, 0, PW_SNAP_OWN, 1));
  assert_null(pw_snap_acquire(s, 5, 0, 1));
  assert_int_equal(s->bytes, 2 * ENTRY_BYTES(10));
  /* and the fourth the oldest again (step 2, not the newest 3) */
  pw_snap *e4 = put(s, 5, 0, PW_SNAP_OWN, 4, 10, 0);
  assert_ptr_equal(e4, e2);
  assert_true(has_step(s, 5, 0, PW_SNAP_OWN, 3) && has_step(s, 5, 0, PW_SNAP_OWN, 4));
  pw_snap *r = pw_snap_acquire(s, 5, 0, 3);
  assert_non_null(r);
  assert_true(holds_pattern(r, 3, 0));
  pw_snap_release(s, r);
  /* generations are per (job, stage, kind): other keys keep their own two */
  put(s, 5, 0, PW_SNAP_HELD, 7, 10, 1);
  put(s, 5, 0, PW_SNAP_HELD, 8, 10, 1);
  put(s, 5, 1, PW_SNAP_OWN, 7, 10, 2);
  put(s, 6, 0, PW_SNAP_OWN, 7, 10, 3);
  assert_int_equal(count(s, 5, 0, PW_SNAP_OWN), 2);
  assert_int_equal(count(s, 5, 0, PW_SNAP_HELD), 2);
  assert_true(has_step(s, 5, 0, PW_SNAP_OWN, 3) && has_step(s, 5, 0, PW_SNAP_OWN, 4));
  assert_int_equal(s->bytes, 6 * ENTRY_BYTES(10));
}

static void test_same_step_rewritten_in_place(void **state) {
  pw_snapstore *s = *state;
  pw_snap *a = put(s, 5, 2, PW_SNAP_OWN, 4, 8, 0);
  pw_snap *b = put(s, 5, 2, PW_SNAP_OWN, 4, 8, 1); /* the same step again (a repeated step after a restore) */
  assert_ptr_equal(a, b);
  assert_int_equal(count(s, 5, 2, PW_SNAP_OWN), 1);
  /* with two generations, rewriting the older does not evict the newer */
  put(s, 5, 2, PW_SNAP_OWN, 5, 8, 0);
  pw_snap *c = put(s, 5, 2, PW_SNAP_OWN, 4, 8, 2);
  assert_ptr_equal(c, a);
  assert_true(has_step(s, 5, 2, PW_SNAP_OWN, 5));
  pw_snap *r = pw_snap_acquire(s, 5, 2, 4);
  assert_non_null(r);
  assert_true(holds_pattern(r, 4, 2)); /* the last write's bytes */
  pw_snap_release(s, r);
  assert_int_equal(s->bytes, 2 * ENTRY_BYTES(8));
}

static void test_claimed_entries_never_rewritten(void **state) {
  pw_snapstore *s = *state;
  pw_snap *e1 = put(s, 5, 0, PW_SNAP_OWN, 1, 16, 0);
  pw_snap *e2 = put(s, 5, 0, PW_SNAP_OWN, 2, 16, 0);
  /* a reader holds the oldest: the writer gets the other one */
  pw_snap *r1 = pw_snap_acquire(s, 5, 0, 1);
  assert_ptr_equal(r1, e1);
  pw_snap *w = pw_snap_begin_write(s, 5, 0, PW_SNAP_OWN, 3, 16);
  assert_ptr_equal(w, e2);
  fill(w, 3, 0);
  pw_snap_end_write(s, w, 3);
  assert_int_equal(r1->step, 1);
  assert_true(holds_pattern(r1, 1, 0));
  /* both claimed (a reader and a send): no entry for a writer, none made */
  pw_snap *r3 = pw_snap_acquire(s, 5, 0, 3);
  assert_ptr_equal(r3, e2);
  pw_snap_release(s, r3);
  atomic_store(&e2->sending, 1);
  assert_null(pw_snap_begin_write(s, 5, 0, PW_SNAP_OWN, 4, 16));
  /* nor the claimed entry of the very step being written again */
  assert_null(pw_snap_begin_write(s, 5, 0, PW_SNAP_OWN, 1, 16));
  assert_null(pw_snap_begin_write(s, 5, 0, PW_SNAP_OWN, 3, 16));
  assert_int_equal(count(s, 5, 0, PW_SNAP_OWN), 2);
  assert_true(holds_pattern(e1, 1, 0) && holds_pattern(e2, 3, 0));
  assert_int_equal(e1->step, 1);
  assert_int_equal(e2->step, 3);
  /* two readers on one entry: free only after both release */
  pw_snap *r1b = pw_snap_acquire(s, 5, 0, 1);
  assert_ptr_equal(r1b, e1);
  pw_snap_release(s, r1);
  assert_null(pw_snap_begin_write(s, 5, 0, PW_SNAP_OWN, 4, 16));
  pw_snap_release(s, r1b);
  w = pw_snap_begin_write(s, 5, 0, PW_SNAP_OWN, 4, 16);
  assert_ptr_equal(w, e1); /* free again; e2 is still being sent */
  pw_snap_end_write(s, w, 4);
  /* the send is written: e2 is the oldest free one */
  atomic_store(&e2->sending, 0);
  w = pw_snap_begin_write(s, 5, 0, PW_SNAP_OWN, 5, 16);
  assert_ptr_equal(w, e2);
  pw_snap_end_write(s, w, 5);
}

static void test_writer_claims_too(void **state) {
  pw_snapstore *s = *state;
  pw_snap *e1 = put(s, 5, 0, PW_SNAP_HELD, 1, 4, 0);
  pw_snap *w2 = pw_snap_begin_write(s, 5, 0, PW_SNAP_HELD, 2, 4); /* a second entry, being written */
  assert_non_null(w2);
  assert_ptr_not_equal(w2, e1);
  /* another writer (another peer's frames) never gets the one being written */
  pw_snap *w3 = pw_snap_begin_write(s, 5, 0, PW_SNAP_HELD, 3, 4);
  assert_ptr_equal(w3, e1);
  assert_null(pw_snap_begin_write(s, 5, 0, PW_SNAP_HELD, 4, 4));
  pw_snap_end_write(s, w3, 3);
  pw_snap_end_write(s, w2, 2);
}

static void test_being_written_is_not_read(void **state) {
  pw_snapstore *s = *state;
  pw_snap *w = pw_snap_begin_write(s, 5, 1, PW_SNAP_OWN, 6, 4);
  assert_null(pw_snap_acquire(s, 5, 1, 6));
  assert_null(pw_snap_acquire(s, 5, 1, 0)); /* step 0 marks "being written", never a snapshot */
  fill(w, 6, 0);
  pw_snap_end_write(s, w, 6);
  pw_snap *r = pw_snap_acquire(s, 5, 1, 6);
  assert_ptr_equal(r, w);
  pw_snap_release(s, r);
  /* rewriting the same step hides it until the write ends */
  w = pw_snap_begin_write(s, 5, 1, PW_SNAP_OWN, 6, 4);
  assert_null(pw_snap_acquire(s, 5, 1, 6));
  /* abandoned (a peer's half-received snapshot): stays invalid */
  pw_snap_end_write(s, w, 0);
  assert_null(pw_snap_acquire(s, 5, 1, 6));
  assert_null(pw_snap_acquire(s, 5, 1, 0));
  /* an abandoned entry is the oldest: the next write takes it, not a valid one */
  pw_snap *v = put(s, 5, 1, PW_SNAP_OWN, 7, 4, 0);
  assert_ptr_not_equal(v, w);
  pw_snap *x = put(s, 5, 1, PW_SNAP_OWN, 8, 4, 0);
  assert_ptr_equal(x, w);
  assert_true(has_step(s, 5, 1, PW_SNAP_OWN, 7));
}

static void test_acquire_prefers_own(void **state) {
  pw_snapstore *s = *state;
  /* newest entries come first in the list: OWN written first is found last */
  put(s, 5, 3, PW_SNAP_OWN, 9, 4, 0);
  put(s, 5, 3, PW_SNAP_HELD, 9, 4, 1);
  put(s, 5, 3, PW_SNAP_RESTORE, 9, 4, 2);
  pw_snap *r = pw_snap_acquire(s, 5, 3, 9);
  assert_non_null(r);
  assert_int_equal(r->kind, PW_SNAP_OWN);
  assert_true(holds_pattern(r, 9, 0));
  pw_snap_release(s, r);
  /* without an OWN, the held copy before a restore's */
  put(s, 5, 4, PW_SNAP_HELD, 9, 4, 1);
  put(s, 5, 4, PW_SNAP_RESTORE, 9, 4, 2);
  r = pw_snap_acquire(s, 5, 4, 9);
  assert_int_equal(r->kind, PW_SNAP_HELD);
  assert_true(holds_pattern(r, 9, 1));
  pw_snap_release(s, r);
  /* another job, stage or step has none */
  assert_null(pw_snap_acquire(s, 6, 3, 9));
  assert_null(pw_snap_acquire(s, 5, 5, 9));
  assert_null(pw_snap_acquire(s, 5, 3, 8));
}

static void test_drop_others(void **state) {
  pw_snapstore *s = *state;
  put(s, 1, 0, PW_SNAP_OWN, 1, 10, 0);
  put(s, 1, 1, PW_SNAP_HELD, 1, 20, 0);
  put(s, 2, 0, PW_SNAP_OWN, 1, 30, 0);
  put(s, 2, 0, PW_SNAP_OWN, 2, 30, 0);
  pw_snap *read3 = put(s, 3, 0, PW_SNAP_OWN, 1, 40, 0);
  pw_snap *sent4 = put(s, 4, 0, PW_SNAP_HELD, 1, 50, 0);
  pw_snap *writing5 = pw_snap_begin_write(s, 5, 0, PW_SNAP_OWN, 1, 60);
  assert_int_equal(s->bytes, ENTRY_BYTES(10 + 20 + 30 + 30 + 40 + 50 + 60));
  pw_snap *r = pw_snap_acquire(s, 3, 0, 1);
  assert_ptr_equal(r, read3);
  atomic_store(&sent4->sending, 2);
  /* job 1's and every entry in use stay: a reader, a send, a writer */
  size_t left = pw_snapstore_drop_others(s, 1);
  assert_int_equal(left, ENTRY_BYTES(10 + 20 + 40 + 50 + 60));
  assert_int_equal(s->bytes, left);
  assert_int_equal(count(s, 2, 0, PW_SNAP_OWN), 0);
  assert_int_equal(count(s, 1, 0, PW_SNAP_OWN) + count(s, 1, 1, PW_SNAP_HELD), 2);
  assert_true(holds_pattern(read3, 1, 0)); /* still readable */
  /* once free, they go too */
  pw_snap_release(s, r);
  atomic_store(&sent4->sending, 1);
  fill(writing5, 1, 0);
  pw_snap_end_write(s, writing5, 1);
  assert_int_equal(pw_snapstore_drop_others(s, 1), ENTRY_BYTES(10 + 20 + 50));
  atomic_store(&sent4->sending, 0);
  assert_int_equal(pw_snapstore_drop_others(s, 1), ENTRY_BYTES(10 + 20));
  assert_non_null(r = pw_snap_acquire(s, 1, 1, 1));
  pw_snap_release(s, r);
  /* keep 0: no job's stay */
  assert_int_equal(pw_snapstore_drop_others(s, 0), 0);
  assert_null(s->list);
  assert_null(pw_snap_acquire(s, 1, 1, 1));
}

static void test_sizes_follow_numel(void **state) {
  pw_snapstore *s = *state;
  put(s, 5, 0, PW_SNAP_OWN, 1, 10, 0);
  put(s, 5, 0, PW_SNAP_OWN, 2, 10, 0);
  assert_int_equal(s->bytes, 2 * ENTRY_BYTES(10));
  /* the stage grew (another partition in a later run of the job) */
  pw_snap *e = put(s, 5, 0, PW_SNAP_OWN, 3, 25, 0);
  assert_int_equal(e->numel, 25);
  assert_int_equal(s->bytes, ENTRY_BYTES(10) + ENTRY_BYTES(25));
  pw_snap *r = pw_snap_acquire(s, 5, 0, 3);
  assert_true(holds_pattern(r, 3, 0)); /* all 75 floats written and kept */
  pw_snap_release(s, r);
  /* and shrank: the same step rewritten smaller */
  e = put(s, 5, 0, PW_SNAP_OWN, 3, 5, 1);
  assert_int_equal(e->numel, 5);
  assert_int_equal(s->bytes, ENTRY_BYTES(10) + ENTRY_BYTES(5));
  /* an empty stage (no parameters) costs nothing but is a snapshot */
  e = put(s, 5, 7, PW_SNAP_OWN, 3, 0, 0);
  assert_int_equal(s->bytes, ENTRY_BYTES(10) + ENTRY_BYTES(5));
  assert_non_null(r = pw_snap_acquire(s, 5, 7, 3));
  pw_snap_release(s, r);
  assert_int_equal(pw_snapstore_drop_others(s, 9), 0);
}

/* ---- a writer and a reader on two threads --------------------------------- */

#define RACE_STEPS 200000
#define RACE_READS 3000
#define RACE_NUMEL 4096

typedef struct {
  pw_snapstore *s;
  atomic_int newest; /* the newest step written completely, 0: none yet */
  atomic_int done;   /* the reader has read enough */
  int write_failures;
  int reads, misses, torn;
} race;

/* Writes steps 1, 2, ... until the reader is done (at most RACE_STEPS). */
static void race_writer(void *arg) {
  race *x = arg;
  for (int step = 1; step <= RACE_STEPS && !atomic_load(&x->done); step++) {
    pw_snap *e = pw_snap_begin_write(x->s, 9, 0, PW_SNAP_OWN, step, RACE_NUMEL);
    if (!e) { /* a single reader claims at most one of the two entries */
      x->write_failures++;
      continue;
    }
    /* in three passes, as the parts are: a reader of a half-written entry sees a mix */
    for (int part = 0; part < 3; part++)
      for (size_t i = 0; i < RACE_NUMEL; i++) e->data[part * RACE_NUMEL + i] = pat(step, 0, part * RACE_NUMEL + i);
    pw_snap_end_write(x->s, e, step);
    atomic_store(&x->newest, step);
  }
}

static void race_read(race *x) {
  int step = atomic_load(&x->newest);
  if (!step) return;
  pw_snap *e = pw_snap_acquire(x->s, 9, 0, step);
  if (!e) { /* overwritten since: two newer steps were written */
    x->misses++;
    return;
  }
  x->reads++;
  /* read it twice: the writer runs on meanwhile and must not touch it */
  if (e->step != step || !holds_pattern(e, step, 0) || !holds_pattern(e, step, 0)) x->torn++;
  pw_snap_release(x->s, e);
}

static void test_writer_and_reader_threads(void **state) {
  pw_snapstore *s = *state;
  race x = {.s = s};
  atomic_init(&x.newest, 0);
  atomic_init(&x.done, 0);
  uv_thread_t t;
  assert_int_equal(uv_thread_create(&t, race_writer, &x), 0);
  for (int i = 0; i < RACE_READS; i++) race_read(&x);
  atomic_store(&x.done, 1);
  assert_int_equal(uv_thread_join(&t), 0);
  int before = x.reads;
  race_read(&x); /* the newest step is there for sure once the writer stopped */
  assert_int_equal(x.reads, before + 1);
  assert_int_equal(x.torn, 0);
  assert_int_equal(x.write_failures, 0);
  assert_int_equal(count(s, 9, 0, PW_SNAP_OWN), 2);
  assert_int_equal(s->bytes, 2 * ENTRY_BYTES(RACE_NUMEL));
  print_message("race: %d reads, %d misses\n", x.reads, x.misses);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_two_generations, setup, teardown),
      cmocka_unit_test_setup_teardown(test_same_step_rewritten_in_place, setup, teardown),
      cmocka_unit_test_setup_teardown(test_claimed_entries_never_rewritten, setup, teardown),
      cmocka_unit_test_setup_teardown(test_writer_claims_too, setup, teardown),
      cmocka_unit_test_setup_teardown(test_being_written_is_not_read, setup, teardown),
      cmocka_unit_test_setup_teardown(test_acquire_prefers_own, setup, teardown),
      cmocka_unit_test_setup_teardown(test_drop_others, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sizes_follow_numel, setup, teardown),
      cmocka_unit_test_setup_teardown(test_writer_and_reader_threads, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
