/* plan_snap: the in-memory snapshots (train.snapshot_every, worker/snap.h)
 * in the plan — the memory they keep and the bytes they put on the link.
 *
 * Every k-th step each rank copies its stages' parameters and AdamW m and
 * v (numel floats each: the moments of frozen parameters go too) and sends
 * them to its holder, in three frames (worker/snaprun.c). The copy runs in
 * an idle wait and the send on the loop thread while compute goes on, so
 * the prediction leaves them out (docs/architecture.md, "The cost model");
 * but the frames share the link, in order, with the activations to that
 * peer, which the simulator does not contend. So the plan says what share
 * of the predicted step they take there, and above PW_PLAN_SNAP_SHARE
 * which k would bring it down. */
#include <math.h>
#include <stdio.h>

#include "plan.h"

#define PW_PLAN_SNAP_GENS 2 /* worker/snap.h's PW_SNAP_GENS */
#define PW_PLAN_SNAP_FRAMES 3 /* parameters, m, v */

void pw_plan_snap(const pw_job *job, pw_plan *p) {
  /* tensor parallel takes none (worker/tpx.c) */
  int k = p->sched->forward_only || p->tp > 1 ? 0 : job->train.snapshot_every, alone = p->pp * p->dp == 1;
  p->snapshot_every = k > 0 ? k : 0;
  if (k <= 0) return;
  /* Each rank keeps its stages' snapshots and holds those of the rank
   * before it (global rank g - 1, whose pipeline rank is r - 1 mod pp);
   * one rank alone has no holder: it copies, and sends nothing. */
  for (int r = 0; r < p->pp; r++) {
    pw_plan_mem *m = &p->mem[r];
    size_t own = PW_PLAN_SNAP_FRAMES * m->params, prev = PW_PLAN_SNAP_FRAMES * p->mem[(r + p->pp - 1) % p->pp].params;
    m->snapshots = PW_PLAN_SNAP_GENS * (own + (alone ? 0 : prev));
    m->snap_sent = alone ? 0 : own;
    m->snap_seconds = alone ? 0 : (PW_PLAN_SNAP_FRAMES * p->latency + pw_plan_wire_seconds(p, (double)own)) / k;
  }
}

double pw_plan_snap_share(const pw_plan *p, int r) {
  return p->predicted > 0 ? p->mem[r].snap_seconds / p->predicted : 0;
}

int pw_plan_snap_worst(const pw_plan *p) {
  int w = 0;
  for (int r = 1; r < p->pp; r++)
    if (p->mem[r].snap_seconds > p->mem[w].snap_seconds) w = r;
  return w;
}

int pw_plan_snap_every(const pw_plan *p) {
  if (!p->snapshot_every) return 0;
  /* one snapshot's seconds, spread over k steps, at most the share */
  double one = p->mem[pw_plan_snap_worst(p)].snap_seconds * p->snapshot_every, cap = PW_PLAN_SNAP_SHARE * p->predicted;
  if (one <= cap || cap <= 0) return 1;
  double k = ceil(one / cap);
  if (k > 1e9) return 1000000000;
  int ki = (int)k;
  while (ki > 1 && one / (ki - 1) <= cap) ki--; /* ceil's rounding, either way */
  while (one / ki > cap) ki++;
  return ki;
}

int pw_plan_snap_note(const pw_plan *p, char *buf, size_t cap) {
  if (!p->snapshot_every) return 0;
  int w = pw_plan_snap_worst(p), k = pw_plan_snap_every(p);
  double share = pw_plan_snap_share(p, w);
  if (share <= PW_PLAN_SNAP_SHARE) return 0;
  const pw_plan_mem *m = &p->mem[w];
  char every[32] = "every step";
  if (p->snapshot_every > 1) snprintf(every, sizeof every, "every %d steps", p->snapshot_every);
  snprintf(buf, cap,
           "in-memory snapshots take %.1f %% of the predicted step on the link (rank %d sends %.1f MiB of parameters "
           "and AdamW m and v %s: %.3f s each time); \"train\": {\"snapshot_every\": %d} brings that to %.1f %%, "
           "at most %g %% (a lost worker then resumes up to %d steps back)",
           100 * share, w, (double)m->snap_sent / (1 << 20), every, m->snap_seconds * p->snapshot_every, k,
           100 * share * p->snapshot_every / k, 100 * PW_PLAN_SNAP_SHARE, k);
  return 1;
}

json_t *pw_plan_snap_json(const pw_plan *p) {
  char note[512];
  int w = pw_plan_snap_worst(p);
  return json_pack("{s:i, s:f, s:i, s:i, s:o}", "every", p->snapshot_every, "share", pw_plan_snap_share(p, w), "rank",
                   w, "suggested_every", pw_plan_snap_every(p), "note",
                   pw_plan_snap_note(p, note, sizeof note) ? json_string(note) : json_null());
}
