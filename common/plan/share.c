/* share: the plan replayed on shared cores (share.h). The plain replay
 * (sim.c) proves the plan and gives each action's work and the memory and
 * link figures, which sharing does not change; this file only re-times the
 * actions: an event loop that advances to the next moment a unit ends or
 * its inputs arrive, starting ready ranks as their hosts' cores allow. */
#include "share.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const pw_sched *s;
  const pw_sim_costs *c;
  const pw_share *sh;
  pw_sim_result *res; /* the plain replay, re-timed in place */
  double *work;       /* [n_events] seconds at the full rate */
  double *end[4];     /* [kind][st*m+k] when the result is available; < 0 not yet */
  char *has[4];       /* [kind][st*m+k] the plan has this action */
} share_rp;

/* Arrival time of a's inputs, or -1 while one is not produced (sim.h's
 * dependency rules and transfer costs). */
static double ready_at(const share_rp *x, const pw_action *a) {
  const pw_sched *s = x->s;
  int k = a->mb, st = a->stage, m = s->m, n = 0;
  int dk[PW_SCHED_MAX_LINKS + 1], ds[PW_SCHED_MAX_LINKS + 1], links[PW_SCHED_MAX_LINKS];
  if (a->kind == PW_ACT_F)
    for (int j = 0, np = pw_sched_preds(s, st, links); j < np; j++) dk[n] = PW_ACT_F, ds[n++] = links[j];
  if (a->kind == PW_ACT_W) dk[n] = PW_ACT_I, ds[n++] = st;
  if (a->kind == PW_ACT_B || a->kind == PW_ACT_I) {
    dk[n] = PW_ACT_F, ds[n++] = st;
    for (int j = 0, ns = pw_sched_succs(s, st, links); j < ns; j++)
      dk[n] = x->has[PW_ACT_B][links[j] * m + k] ? PW_ACT_B : PW_ACT_I, ds[n++] = links[j];
  }
  double t = 0;
  for (int i = 0; i < n; i++) {
    double e = x->end[dk[i]][ds[i] * m + k];
    if (e < 0) return -1;
    if (s->stage_to_rank[ds[i]] != s->stage_to_rank[st] && ds[i] != st) {
      int edge = ds[i] < st ? ds[i] : st;
      double bytes = x->c && x->c->act_bytes ? x->c->act_bytes[edge] : 0;
      if (ds[i] < st && x->c && x->c->act_scale > 0) bytes *= x->c->act_scale; /* an activation, as sim.c sends it */
      e += x->c ? x->c->latency : 0;
      if (x->c && x->c->bandwidth > 0) e += bytes / x->c->bandwidth;
    }
    if (e > t) t = e;
  }
  return t;
}

static int measured(const pw_share *sh) { return sh->speed && sh->n_speed > 0; }

static int check_share(const pw_sched *s, const pw_share *sh, pw_err *err) {
  if (!sh || sh->n_ranks < s->pp || sh->n_ranks % s->pp || sh->n_hosts < 1 || !sh->host || !sh->threads ||
      !sh->cores)
    return pw_err_set(err, PW_EINVAL, "share", "want a host and threads for each of a multiple of %d ranks", s->pp);
  for (int j = 0; j < sh->n_ranks; j++)
    if (sh->host[j] < 0 || sh->host[j] >= sh->n_hosts || sh->threads[j] < 1)
      return pw_err_set(err, PW_EINVAL, "share", "rank %d: host %d outside 0..%d or threads %d < 1", j, sh->host[j],
                        sh->n_hosts - 1, sh->threads[j]);
  for (int h = 0; h < sh->n_hosts; h++)
    if (sh->cores[h] < 1 || (sh->other && sh->other[h] < 0))
      return pw_err_set(err, PW_EINVAL, "share", "host %d: cores must be >= 1 and other threads >= 0", h);
  return 0;
}

/* Measured sharing: each of n busy threads' rate on a host, the table's
 * entry, or past its end its last one time sliced further. */
static double speed_of(const pw_share *sh, double n) {
  if (n <= 1) return 1;
  int k = (int)n;
  return k <= sh->n_speed ? sh->speed[k - 1] : sh->speed[sh->n_speed - 1] * sh->n_speed / n;
}

/* Each pipeline rank's rate now: min(1, cores / threads computing) of
 * its host — below 1 only for a rank with more threads than cores, or
 * with other work there — or with measured sharing the table's speed
 * for the threads computing there; the slowest of its replicas' hosts. */
static void rates(const share_rp *x, const int *cur, double *load, double *rate) {
  const pw_share *sh = x->sh;
  int pp = x->s->pp;
  for (int h = 0; h < sh->n_hosts; h++) load[h] = sh->other ? sh->other[h] : 0;
  for (int j = 0; j < sh->n_ranks; j++)
    if (cur[j % pp] >= 0) load[sh->host[j]] += sh->threads[j];
  for (int r = 0; r < pp; r++) rate[r] = 1;
  for (int j = 0; j < sh->n_ranks; j++) {
    double h = measured(sh) ? speed_of(sh, load[sh->host[j]]) : sh->cores[sh->host[j]] / load[sh->host[j]];
    if (h < rate[j % pp]) rate[j % pp] = h;
  }
}

/* Whether rank r's threads fit on all its hosts now: the threads computing
 * there and r's within the cores, or nothing of the job computing there;
 * with measured sharing always (the host time-slices them). */
static int fits(const share_rp *x, const int *cur, int r) {
  const pw_share *sh = x->sh;
  if (measured(sh)) return 1;
  int pp = x->s->pp;
  for (int j = r; j < sh->n_ranks; j += pp) {
    int h = sh->host[j], busy = 0;
    for (int i = 0; i < sh->n_ranks; i++)
      if (sh->host[i] == h && cur[i % pp] >= 0) busy += sh->threads[i];
    if (busy && busy + sh->threads[j] > sh->cores[h]) return 0;
  }
  return 1;
}

/* Starts the ready ranks (ready[r] >= 0: since when) that fit: a rank that
 * just ended a unit first (it holds its cores), then in the order they
 * became ready, then by rank. A rank that does not fit waits, idle. */
static void admit(const share_rp *x, const int *pos, int *cur, double *rem, double *ready, const int *held,
                  double t) {
  int pp = x->s->pp;
  for (;;) {
    int b = -1;
    for (int r = 0; r < pp; r++)
      if (ready[r] >= 0 && (b < 0 || held[r] > held[b] || (held[r] == held[b] && ready[r] < ready[b]))) b = r;
    if (b < 0) return;
    ready[b] = -1;
    if (!fits(x, cur, b)) continue;
    cur[b] = pos[b];
    rem[b] = x->work[cur[b]];
    x->res->events[cur[b]].start = t;
  }
}

/* The event loop. pos[r]: rank r's next event (absolute index); cur[r]:
 * the event it computes, -1 when not computing; rem[r]: work left in it;
 * free_at[r]: when its last unit ended; held[r]: it ended one just now. */
static int retime(share_rp *x, pw_err *err) {
  const pw_sched *s = x->s;
  pw_sim_result *res = x->res;
  int pp = s->pp, left = res->n_events, rc = 0;
  int *pos = calloc((size_t)pp, sizeof(int)), *cur = calloc((size_t)pp, sizeof(int));
  int *held = calloc((size_t)pp, sizeof(int));
  double *rem = calloc((size_t)pp, sizeof(double)), *rate = calloc((size_t)pp, sizeof(double));
  double *ready = calloc((size_t)pp, sizeof(double)), *free_at = calloc((size_t)pp, sizeof(double));
  double *load = calloc((size_t)x->sh->n_hosts, sizeof(double));
  if (!pos || !cur || !held || !rem || !rate || !ready || !free_at || !load) {
    rc = pw_err_set(err, PW_ENOMEM, "", "out of memory");
    goto out;
  }
  for (int r = 0; r < pp; r++) pos[r] = res->rank_first[r], cur[r] = -1;
  double t = 0;
  while (left > 0) {
    /* the ranks whose next unit has its inputs by now; next: the
     * earliest arrival still to come */
    double next = INFINITY;
    for (int r = 0; r < pp; r++) {
      ready[r] = -1;
      if (cur[r] >= 0 || pos[r] >= res->rank_first[r + 1]) continue;
      const pw_sim_event *ev = &res->events[pos[r]];
      int fused = (ev->act.flags & PW_ACTION_FUSED) != 0;
      double a = ready_at(x, &ev->act), b = fused ? ready_at(x, &ev[1].act) : 0;
      if (a < 0 || b < 0) continue;
      double at = a > b ? a : b;
      if (at > t && at < next) next = at;
      if (at <= t) ready[r] = at > free_at[r] ? at : free_at[r];
    }
    admit(x, pos, cur, rem, ready, held, t);
    int any = 0;
    for (int r = 0; r < pp; r++) any |= cur[r] >= 0;
    if (!any && !isfinite(next)) { /* the plain replay proved the plan: not reached */
      rc = pw_err_set(err, PW_EDEADLOCK, "", "shared replay stalled at t = %g", t);
      goto out;
    }
    rates(x, cur, load, rate);
    for (int r = 0; r < pp; r++) {
      held[r] = 0;
      if (cur[r] >= 0 && t + rem[r] / rate[r] < next) next = t + rem[r] / rate[r];
    }
    /* advance to next; the units (or halves of a fused one) due end */
    for (int r = 0; r < pp; r++) {
      if (cur[r] < 0) continue;
      double due = t + rem[r] / rate[r];
      rem[r] -= (next - t) * rate[r];
      if (due > next) continue; /* next is the least due, so at least one ends */
      pw_sim_event *ev = &res->events[cur[r]];
      ev->end = next;
      if ((ev->act.flags & PW_ACTION_FUSED) && cur[r] == pos[r]) { /* its partner follows at once */
        cur[r]++;
        rem[r] = x->work[cur[r]];
        ev[1].start = next;
        continue;
      }
      for (int e = pos[r]; e <= cur[r]; e++) /* a fused unit's results both at its end */
        x->end[res->events[e].act.kind][res->events[e].act.stage * s->m + res->events[e].act.mb] = next;
      left -= cur[r] - pos[r] + 1;
      pos[r] = cur[r] + 1;
      cur[r] = -1;
      held[r] = 1;
      free_at[r] = next;
    }
    t = next;
  }
out:
  free(pos);
  free(cur);
  free(held);
  free(rem);
  free(rate);
  free(ready);
  free(free_at);
  free(load);
  return rc;
}

int pw_sim_run_shared(const pw_sched *s, const pw_sim_costs *c, const pw_share *sh, pw_sim_result **out, pw_err *err) {
  *out = NULL;
  int rc = pw_sim_run(s, c, out, err);
  if (rc) return rc;
  pw_sim_result *res = *out;
  if ((rc = check_share(s, sh, err))) {
    pw_sim_result_free(res);
    *out = NULL;
    return rc;
  }
  size_t cells = (size_t)s->S * s->m;
  share_rp x = {.s = s, .c = c, .sh = sh, .res = res};
  double *ends = malloc(4 * cells * sizeof(double));
  char *has = calloc(4 * cells, 1);
  x.work = malloc((size_t)(res->n_events ? res->n_events : 1) * sizeof(double));
  if (!ends || !has || !x.work) {
    rc = pw_err_set(err, PW_ENOMEM, "", "out of memory");
  } else {
    for (size_t i = 0; i < 4 * cells; i++) ends[i] = -1;
    for (int k = 0; k < 4; k++) x.end[k] = ends + k * cells, x.has[k] = has + k * cells;
    for (int e = 0; e < res->n_events; e++) {
      const pw_sim_event *ev = &res->events[e];
      x.work[e] = ev->end - ev->start;
      x.has[ev->act.kind][ev->act.stage * s->m + ev->act.mb] = 1;
    }
    rc = retime(&x, err);
  }
  if (!rc) { /* busy, idle and the bubble in wall time, as pw_sim_run counts them */
    double mk = 0, idle = 0;
    for (int r = 0; r < s->pp; r++) {
      res->busy[r] = 0;
      for (int e = res->rank_first[r]; e < res->rank_first[r + 1]; e++) {
        res->busy[r] += res->events[e].end - res->events[e].start;
        if (res->events[e].end > mk) mk = res->events[e].end;
      }
    }
    for (int r = 0; r < s->pp; r++) idle += res->idle[r] = mk - res->busy[r];
    res->makespan = mk;
    res->bubble_ratio = mk > 0 ? idle / (s->pp * mk) : 0;
  }
  free(ends);
  free(has);
  free(x.work);
  if (rc) {
    pw_sim_result_free(res);
    *out = NULL;
  }
  return rc;
}
