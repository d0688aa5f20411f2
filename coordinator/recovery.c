/* recovery: what a job restarted after a lost worker starts from, and on
 * which workers.
 *
 * Each worker tells the coordinator every snapshot it now holds in memory
 * (a "snapshot" message: its own stage's state after a step, or a peer's it
 * keeps); the coordinator mirrors each worker's store with the worker's own
 * retention rule, per link (a worker registering anew holds none). When a
 * run loses a worker, the job is queued again; its next run is placed so
 * that the survivors keep their ranks (they restore their own stages from
 * their own memory, no bytes moved) and a spare or the restarted worker
 * takes the lost rank, whose stage the holder sends it. The run starts at
 * the newest step every stage is held at by one of its workers, or at the
 * newest complete checkpoint when that is newer (or no snapshot covers
 * every stage: a worker and its holder lost together). Loop thread only. */
#include <stdlib.h>
#include <string.h>

#include "ctl_int.h"
#include "log.h"

static pw_ctl *ctl_of(pw_coord *c) { return c->ctl; }

/* ---- the mirror of each worker's snapshots ------------------------------- */

void pw_rec_snapshot_add(pw_wconn *w, int64_t job, int stage, int step, int held) {
  int same = 0, oldest = -1;
  for (int i = 0; i < w->n_snaps; i++) {
    pw_snapinv *e = &w->snaps[i];
    if (e->job != job || e->stage != stage || e->held != held) continue;
    if (e->step == step) return; /* rewritten in place */
    same++;
    if (oldest < 0 || e->step < w->snaps[oldest].step) oldest = i;
  }
  if (same >= PW_REC_GENS) { /* the worker overwrote its oldest */
    w->snaps[oldest].step = step;
    return;
  }
  if (w->n_snaps == w->cap_snaps) {
    int cap = w->cap_snaps ? 2 * w->cap_snaps : 8;
    pw_snapinv *n = realloc(w->snaps, sizeof *n * (size_t)cap);
    if (!n) { /* not knowing a snapshot only costs a restart from further back */
      pw_warn("worker %s: out of memory recording a snapshot", w->name);
      return;
    }
    w->snaps = n;
    w->cap_snaps = cap;
  }
  w->snaps[w->n_snaps++] = (pw_snapinv){job, stage, step, held};
}

void pw_rec_snapshots_keep(pw_wconn *w, int64_t job) {
  int k = 0;
  for (int i = 0; i < w->n_snaps; i++)
    if (job && w->snaps[i].job == job) w->snaps[k++] = w->snaps[i];
  w->n_snaps = k;
}

void pw_rec_snapshots_forget(pw_coord *c, int64_t job) {
  for (pw_wconn *w = ctl_of(c)->conns; w; w = w->next) {
    int k = 0;
    for (int i = 0; i < w->n_snaps; i++)
      if (w->snaps[i].job != job) w->snaps[k++] = w->snaps[i];
    w->n_snaps = k;
  }
}

void pw_rec_conn_free(pw_wconn *w) {
  free(w->snaps);
  w->snaps = NULL;
  w->n_snaps = w->cap_snaps = 0;
}

static int holds(const pw_wconn *w, int64_t job, int stage, int step) {
  for (int i = 0; w && i < w->n_snaps; i++)
    if (w->snaps[i].job == job && w->snaps[i].stage == stage && w->snaps[i].step == step) return 1;
  return 0;
}

static int holds_any(const pw_wconn *w, int64_t job) {
  for (int i = 0; i < w->n_snaps; i++)
    if (w->snaps[i].job == job) return 1;
  return 0;
}

/* ---- placements ------------------------------------------------------------ */

static pw_jobmem *mem_find(pw_coord *c, int64_t job) {
  for (pw_jobmem *m = ctl_of(c)->mem; m; m = m->next)
    if (m->job == job) return m;
  return NULL;
}

void pw_rec_forget(pw_coord *c, int64_t job) {
  for (pw_jobmem **p = &ctl_of(c)->mem; *p; p = &(*p)->next)
    if ((*p)->job == job) {
      pw_jobmem *m = *p;
      *p = m->next;
      free(m->names);
      free(m);
      return;
    }
}

void pw_rec_free_all(pw_coord *c) {
  while (ctl_of(c)->mem) pw_rec_forget(c, ctl_of(c)->mem->job);
}

void pw_rec_remember(pw_coord *c, const pw_jobrt *jr) {
  pw_jobmem *m = mem_find(c, jr->job);
  if (!m) {
    if (!(m = calloc(1, sizeof *m))) return; /* a placement is a preference: losing it costs bytes moved */
    m->job = jr->job;
    m->next = ctl_of(c)->mem;
    ctl_of(c)->mem = m;
  }
  if (m->n != jr->n_ranks) {
    free(m->names);
    m->n = 0;
    if (!(m->names = calloc((size_t)jr->n_ranks, sizeof *m->names))) return;
    m->n = jr->n_ranks;
  }
  for (int r = 0; r < jr->n_ranks; r++)
    if (jr->ranks[r]) snprintf(m->names[r], sizeof m->names[r], "%s", jr->ranks[r]->name);
}

void pw_rec_choose(pw_coord *c, int64_t job, int need, pw_wconn **idle, int n_idle, pw_wconn **out) {
  char taken[1024] = {0}; /* idle[i] chosen (n_idle <= 1024: the caller's bound) */
  const pw_jobmem *m = mem_find(c, job);
  for (int r = 0; r < need; r++) {
    out[r] = NULL;
    for (int i = 0; m && r < m->n && i < n_idle && !out[r]; i++)
      if (!taken[i] && !strcmp(idle[i]->name, m->names[r])) out[r] = idle[i], taken[i] = 1;
  }
  for (int pass = 0; pass < 2; pass++) /* first the holders of its snapshots, then the rest (by id) */
    for (int r = 0; r < need; r++)
      for (int i = 0; i < n_idle && !out[r]; i++)
        if (!taken[i] && (pass || holds_any(idle[i], job))) out[r] = idle[i], taken[i] = 1;
}

/* ---- where to start --------------------------------------------------------- */

/* The global rank that sends stage st's snapshot of step, or -1: one that
 * runs the stage when it holds it (nothing moves), else any holder. */
static int source_of(const pw_jobrt *jr, int st, int prank, int pp, int step) {
  int any = -1;
  for (int r = 0; r < jr->n_ranks; r++) {
    if (!holds(jr->ranks[r], jr->job, st, step)) continue;
    if (r % pp == prank) return r;
    if (any < 0) any = r;
  }
  return any;
}

int pw_rec_restore_point(const pw_jobrt *jr, int S, int pp, const int *stage_rank, int after, int before,
                         json_t **from) {
  *from = NULL;
  int best = 0;
  for (int r = 0; r < jr->n_ranks; r++) { /* every step some rank holds is a candidate */
    const pw_wconn *w = jr->ranks[r];
    for (int i = 0; w && i < w->n_snaps; i++) {
      int step = w->snaps[i].step;
      if (w->snaps[i].job != jr->job || step <= after || step >= before || step <= best) continue;
      int all = 1;
      for (int st = 0; st < S && all; st++) all = source_of(jr, st, stage_rank[st], pp, step) >= 0;
      if (all) best = step;
    }
  }
  if (!best) return 0;
  json_t *a = json_array();
  for (int st = 0; a && st < S; st++) json_array_append_new(a, json_integer(source_of(jr, st, stage_rank[st], pp, best)));
  if (!a) return 0;
  *from = a;
  return best;
}
