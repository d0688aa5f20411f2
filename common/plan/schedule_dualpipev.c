/* schedule_dualpipev: DeepSeek's DualPipeV (dualpipe/dualpipev.py, also
 * PyTorch's ScheduleDualPipeV), S = 2*pp stages in a V: rank r holds stage
 * r (phase 0, data going down the ranks) and stage 2*pp-1-r (phase 1, coming
 * back up); the loss is on rank 0's phase-1 stage. Emits lists only.
 *
 * The eight sections per rank, step for step as in dualpipev.py's step():
 *  1. 2(p-r-1) x F0
 *  2. (r+1)    x [F0, F1]
 *  3. (p-r-1)  x [I1, W, F1]           (backward with zero bubble: I then W)
 *  4. (m-2p+r+1) x [F0+B1, F1+B0]      (fused pairs; on the last rank the
 *                                       first F0, B1 pair runs unfused)
 *  5. (p-r-1)  x [B1, F1+B0]
 *  6. (r+1)    x [B1, B0], the last r+1 of these 2(r+1) backwards split
 *               into I (W deferred): dualpipev.py switches on enable_zb at
 *               index (r+1)//2, before B1 on odd ranks, before B0 on even
 *  7. (p-r-1)  x [W, I0]
 *  8. (r+1)    x W
 * "F0" is a forward on phase 0, "B1" a backward on phase 1, and so on; each
 * phase counts its forwards and backwards separately (microbatch 0, 1, ..),
 * and W's pop the oldest deferred weight gradient (dualpipev.py's
 * WeightGradStore is a FIFO). Fused pairs run the full backward (the
 * overlapped path does not defer W). */
#include <stdlib.h>

#include "schedule_int.h"

typedef struct {
  pw_sched *s;
  int r, stage[2], nf[2], nb[2];
  int *wq_mb, *wq_st, qh, qt; /* FIFO of deferred W's */
  int rc;
} dpv;

static void F(dpv *d, int ph, int flags) {
  if (!d->rc) d->rc = pw__emit(d->s, d->r, PW_ACT_F, d->nf[ph]++, d->stage[ph], flags);
}

static void Bk(dpv *d, int ph, int zb) {
  if (d->rc) return;
  int mb = d->nb[ph]++;
  d->rc = pw__emit(d->s, d->r, zb ? PW_ACT_I : PW_ACT_B, mb, d->stage[ph], 0);
  if (zb) {
    d->wq_mb[d->qt] = mb;
    d->wq_st[d->qt++] = d->stage[ph];
  }
}

static void W(dpv *d) {
  if (d->rc) return;
  if (d->qh == d->qt) {
    d->rc = PW_EINTERNAL; /* a W with nothing deferred: the sections are wrong */
    return;
  }
  d->rc = pw__emit(d->s, d->r, PW_ACT_W, d->wq_mb[d->qh], d->wq_st[d->qh], 0);
  d->qh++;
}

static void FB(dpv *d, int fph, int bph) {
  F(d, fph, PW_ACTION_FUSED);
  Bk(d, bph, 0);
}

int pw__gen_dualpipev(pw_sched *s) {
  int p = s->pp, m = s->m;
  int *q = malloc((size_t)4 * m * sizeof(int));
  if (!q) return PW_ENOMEM;
  int rc = 0;
  for (int r = 0; r < p && !rc; r++) {
    dpv d = {s, r, {r, 2 * p - 1 - r}, {0, 0}, {0, 0}, q, q + 2 * m, 0, 0, 0};
    for (int i = 0; i < 2 * (p - r - 1); i++) F(&d, 0, 0);        /* 1 */
    for (int i = 0; i < r + 1; i++) {                              /* 2 */
      F(&d, 0, 0);
      F(&d, 1, 0);
    }
    for (int i = 0; i < p - r - 1; i++) {                          /* 3 */
      Bk(&d, 1, 1);
      W(&d);
      F(&d, 1, 0);
    }
    for (int i = 0; i < m - 2 * p + r + 1; i++) {                  /* 4 */
      if (i == 0 && r == p - 1) {
        F(&d, 0, 0);
        Bk(&d, 1, 0);
      } else {
        FB(&d, 0, 1);
      }
      FB(&d, 1, 0);
    }
    for (int i = 0; i < p - r - 1; i++) {                          /* 5 */
      Bk(&d, 1, 0);
      FB(&d, 1, 0);
    }
    int zb = 0, n6 = r + 1;                                        /* 6 */
    for (int i = 0; i < n6; i++) {
      if (i == n6 / 2 && r % 2 == 1) zb = 1;
      Bk(&d, 1, zb);
      if (i == n6 / 2 && r % 2 == 0) zb = 1;
      Bk(&d, 0, zb);
    }
    for (int i = 0; i < p - r - 1; i++) {                          /* 7 */
      W(&d);
      Bk(&d, 0, 1);
    }
    for (int i = 0; i < r + 1; i++) W(&d);                         /* 8 */
    rc = d.rc;
    if (!rc && d.qh != d.qt) rc = PW_EINTERNAL; /* W's left over */
  }
  free(q);
  return rc;
}
