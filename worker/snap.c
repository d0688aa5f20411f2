/* snap: the worker's in-memory snapshots (snap.h). */
#include "snap.h"

#include <stdlib.h>

int pw_snapstore_init(pw_snapstore *s) {
  s->list = NULL;
  s->bytes = 0;
  return uv_mutex_init(&s->mu);
}

static int in_use(pw_snap *e) { return e->users > 0 || atomic_load(&e->sending) > 0; }

static void entry_free(pw_snapstore *s, pw_snap *e) {
  s->bytes -= 3 * e->numel * sizeof(float);
  free(e->data);
  free(e);
}

void pw_snapstore_free(pw_snapstore *s) {
  while (s->list) {
    pw_snap *e = s->list;
    s->list = e->next;
    entry_free(s, e);
  }
  uv_mutex_destroy(&s->mu);
}

size_t pw_snapstore_drop_others(pw_snapstore *s, uint64_t keep) {
  uv_mutex_lock(&s->mu);
  for (pw_snap **p = &s->list; *p;) {
    pw_snap *e = *p;
    if ((keep == 0 || e->job != keep) && !in_use(e)) {
      *p = e->next;
      entry_free(s, e);
    } else {
      p = &e->next;
    }
  }
  size_t left = s->bytes;
  uv_mutex_unlock(&s->mu);
  return left;
}

/* A free entry of `numel` floats per part (its data made on demand). */
static int fit(pw_snapstore *s, pw_snap *e, size_t numel) {
  if (e->data && e->numel == numel) return 0;
  float *d = malloc(3 * (numel ? numel : 1) * sizeof(float));
  if (!d) return -1;
  s->bytes -= 3 * e->numel * sizeof(float);
  free(e->data);
  e->data = d;
  e->numel = numel;
  s->bytes += 3 * numel * sizeof(float);
  return 0;
}

pw_snap *pw_snap_begin_write(pw_snapstore *s, uint64_t job, int stage, int kind, int step, size_t numel) {
  uv_mutex_lock(&s->mu);
  pw_snap *same = NULL, *oldest = NULL;
  int n = 0;
  for (pw_snap *e = s->list; e; e = e->next) {
    if (e->job != job || e->stage != stage || e->kind != kind) continue;
    n++;
    if (e->step == step) same = e;
    if (!in_use(e) && (!oldest || e->step < oldest->step)) oldest = e;
  }
  pw_snap *e = same && !in_use(same) ? same : NULL;
  if (!e && !same && n < PW_SNAP_GENS) {
    e = calloc(1, sizeof *e);
    if (e) {
      e->job = job, e->stage = stage, e->kind = kind;
      atomic_init(&e->sending, 0);
      e->next = s->list;
      s->list = e;
    }
  } else if (!e && !same) {
    e = oldest;
  }
  if (e && fit(s, e, numel)) e = NULL;
  if (e) {
    e->step = 0;
    e->users = 1;
  }
  uv_mutex_unlock(&s->mu);
  return e;
}

void pw_snap_end_write(pw_snapstore *s, pw_snap *e, int step) {
  uv_mutex_lock(&s->mu);
  e->step = step;
  e->users = 0;
  uv_mutex_unlock(&s->mu);
}

pw_snap *pw_snap_acquire(pw_snapstore *s, uint64_t job, int stage, int step) {
  uv_mutex_lock(&s->mu);
  pw_snap *best = NULL;
  for (pw_snap *e = s->list; e; e = e->next)
    if (e->job == job && e->stage == stage && e->step == step && step > 0 && (!best || e->kind < best->kind))
      best = e;
  if (best) best->users++;
  uv_mutex_unlock(&s->mu);
  return best;
}

void pw_snap_release(pw_snapstore *s, pw_snap *e) {
  uv_mutex_lock(&s->mu);
  e->users--;
  uv_mutex_unlock(&s->mu);
}
