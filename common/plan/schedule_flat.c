/* schedule_flat: the flat schedules (V = 1, stage s on rank s): gpipe, 1f1b,
 * eager1f1b and zb-h1. Definitions in docs/schedules.md; this file only emits
 * per-rank action lists (schedule.h), it never times them except for the
 * unit-cost placement of zb-h1's W's, which is part of that schedule's
 * definition. */
#include <stdlib.h>

#include "schedule_int.h"

int pw__gen_gpipe(pw_sched *s) {
  int rc = 0;
  for (int r = 0; r < s->pp; r++) {
    for (int k = 0; k < s->m && !rc; k++) rc = pw__emit(s, r, PW_ACT_F, k, r, 0);
    for (int k = 0; k < s->m && !rc; k++) rc = pw__emit(s, r, PW_ACT_B, k, r, 0);
  }
  return rc;
}

/* 1F1B with w warm-up forwards on rank r: F0..F(w-1), then (F(w+i), B(i))
 * while forwards remain, then the remaining backwards. `bk` is the backward
 * kind (B, or I for zb-h1's base order). */
static int emit_1f1b(pw_sched *s, int r, int w, int bk) {
  int m = s->m, rc = 0;
  if (w > m) w = m;
  for (int k = 0; k < w && !rc; k++) rc = pw__emit(s, r, PW_ACT_F, k, r, 0);
  for (int i = 0; i < m - w && !rc; i++) {
    rc = pw__emit(s, r, PW_ACT_F, w + i, r, 0);
    if (!rc) rc = pw__emit(s, r, bk, i, r, 0);
  }
  for (int i = m - w; i < m && !rc; i++) rc = pw__emit(s, r, bk, i, r, 0);
  return rc;
}

int pw__gen_1f1b(pw_sched *s) {
  int rc = 0;
  for (int r = 0; r < s->pp && !rc; r++) rc = emit_1f1b(s, r, s->pp - r - 1, PW_ACT_B);
  return rc;
}

int pw__gen_eager1f1b(pw_sched *s) {
  int rc = 0;
  for (int r = 0; r < s->pp && !rc; r++) rc = emit_1f1b(s, r, 2 * (s->pp - r) - 1, PW_ACT_B);
  return rc;
}

/* zb-h1: the 1f1b order with B replaced by I is the "base" order; each W
 * goes, first in first out, into the earliest idle slot of its rank after its
 * I. Idle slots depend on timing, so (as ZeroBubble's own generator does) the
 * placement is made by replaying the base order with unit costs F = I = W = 1:
 * at every integer time a free rank runs its next base action if its inputs
 * are there, else its oldest pending W, else idles; once its base order is
 * done it drains the pending W's. The resulting list is fixed; the simulator
 * replays it with the real costs. With unit costs the makespan is
 * 3m + p - 1, i.e. bubble (p-1)/(3m+p-1) (tested). */
int pw__gen_zbh1(pw_sched *s) {
  int p = s->pp, m = s->m, rc = PW_ENOMEM;
  pw_sched *base = NULL;
  pw_err e;
  if (pw_sched_new(p, 1, p, m, NULL, 0, &base, &e) < 0) return PW_ENOMEM;
  int *fend = malloc((size_t)p * m * sizeof(int)); /* end time of F k@s, -1 = not yet */
  int *iend = malloc((size_t)p * m * sizeof(int));
  int *wq = malloc((size_t)p * m * sizeof(int));   /* per rank FIFO of microbatches */
  int *qh = calloc((size_t)p, sizeof(int)), *qt = calloc((size_t)p, sizeof(int));
  int *idx = calloc((size_t)p, sizeof(int)), *busy = calloc((size_t)p, sizeof(int));
  if (!fend || !iend || !wq || !qh || !qt || !idx || !busy) goto out;
  for (int r = 0; r < p; r++)
    if (emit_1f1b(base, r, p - r - 1, PW_ACT_I) < 0) goto out;
  for (int i = 0; i < p * m; i++) fend[i] = iend[i] = -1;

  int remaining = 3 * p * m;
  long limit = 8L * (3L * m + p) + 64; /* far beyond any valid makespan */
  for (int t = 0; remaining > 0; t++) {
    if (t > limit) {
      rc = PW_EINTERNAL; /* cannot happen for a valid base order */
      goto out;
    }
    for (int r = 0; r < p; r++) {
      if (busy[r] > t) continue;
      int ran = 0;
      if (idx[r] < base->n_actions[r]) {
        pw_action a = base->actions[r][idx[r]];
        int k = a.mb, ready;
        if (a.kind == PW_ACT_F)
          ready = r == 0 || (fend[(r - 1) * m + k] >= 0 && fend[(r - 1) * m + k] <= t);
        else
          ready = fend[r * m + k] >= 0 && fend[r * m + k] <= t &&
                  (r == p - 1 || (iend[(r + 1) * m + k] >= 0 && iend[(r + 1) * m + k] <= t));
        if (ready) {
          if ((rc = pw_sched_push(s, r, a)) < 0) goto out;
          if (a.kind == PW_ACT_F) {
            fend[r * m + k] = t + 1;
          } else {
            iend[r * m + k] = t + 1;
            wq[r * m + qt[r]++] = k;
          }
          idx[r]++;
          ran = 1;
        }
      }
      if (!ran && qh[r] < qt[r]) {
        if ((rc = pw__emit(s, r, PW_ACT_W, wq[r * m + qh[r]++], r, 0)) < 0) goto out;
        ran = 1;
      }
      if (ran) {
        busy[r] = t + 1;
        remaining--;
      }
    }
  }
  rc = 0;
out:
  free(fend);
  free(iend);
  free(wq);
  free(qh);
  free(qt);
  free(idx);
  free(busy);
  pw_sched_free(base);
  return rc;
}
