/* sim: the schedule simulator (sim.h): structural checks, the timed replay,
 * deadlock reports and memory accounting. Rendering (JSON, trace, grid)
 * lives in sim_render.c. It never modifies a plan. */
#include "sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where an action sits: rank and position, or rank -1 when absent. */
typedef struct {
  int rank, idx;
} loc;

/* Lookup tables over (stage, microbatch), index st * m + k. */
typedef struct {
  int S, m;
  loc *at[4]; /* [kind][st*m+k] */
} index_t;

static void index_free(index_t *x) {
  for (int k = 0; k < 4; k++) free(x->at[k]);
}

static int index_init(index_t *x, int S, int m) {
  memset(x, 0, sizeof *x);
  x->S = S;
  x->m = m;
  for (int k = 0; k < 4; k++) {
    x->at[k] = malloc((size_t)S * m * sizeof(loc));
    if (!x->at[k]) {
      index_free(x);
      return PW_ENOMEM;
    }
    for (long i = 0; i < (long)S * m; i++) x->at[k][i] = (loc){-1, -1};
  }
  return 0;
}

static const char *fmt_act(const pw_action *a, char *buf) {
  pw_action_format(a, buf, 40);
  return buf;
}

static pw_action mk(int kind, int mb, int st) {
  pw_action a = {(uint8_t)kind, 0, mb, st};
  return a;
}

/* The structural checks of sim.h; fills x (the caller inits it). */
static int validate(const pw_sched *s, index_t *x, pw_err *err) {
  char b1[40], b2[40];
  if (s->pp < 1 || s->S < 1 || s->m < 1)
    return pw_err_set(err, PW_ESCHEDULE, "", "plan has pp = %d, stages = %d, microbatches = %d",
                      s->pp, s->S, s->m);
  for (int st = 0; st < s->S; st++)
    if (s->stage_to_rank[st] < 0 || s->stage_to_rank[st] >= s->pp)
      return pw_err_set(err, PW_ESCHEDULE, "", "stage %d is mapped to rank %d, outside 0..%d",
                        st, s->stage_to_rank[st], s->pp - 1);
  for (int r = 0; r < s->pp; r++) {
    int n = s->n_actions[r];
    for (int i = 0; i < n; i++) {
      const pw_action *a = &s->actions[r][i];
      if (a->kind > PW_ACT_W)
        return pw_err_set(err, PW_ESCHEDULE, "", "rank %d #%d: unknown action kind %d", r, i,
                          a->kind);
      if (a->mb < 0 || a->mb >= s->m)
        return pw_err_set(err, PW_ESCHEDULE, "", "rank %d #%d: %s: microbatch outside 0..%d", r,
                          i, fmt_act(a, b1), s->m - 1);
      if (a->stage < 0 || a->stage >= s->S)
        return pw_err_set(err, PW_ESCHEDULE, "", "rank %d #%d: %s: stage outside 0..%d", r, i,
                          fmt_act(a, b1), s->S - 1);
      if (s->stage_to_rank[a->stage] != r)
        return pw_err_set(err, PW_ESCHEDULE, "",
                          "rank %d #%d: %s is on stage %d, which belongs to rank %d", r, i,
                          fmt_act(a, b1), a->stage, s->stage_to_rank[a->stage]);
      if (s->forward_only && a->kind != PW_ACT_F)
        return pw_err_set(err, PW_ESCHEDULE, "", "rank %d #%d: %s in a forward-only plan", r, i,
                          fmt_act(a, b1));
      if (a->flags & PW_ACTION_FUSED) {
        if (i + 1 >= n)
          return pw_err_set(err, PW_ESCHEDULE, "",
                            "rank %d #%d: %s is fused with the next action, but it is the last",
                            r, i, fmt_act(a, b1));
        const pw_action *nx = &s->actions[r][i + 1];
        if (a->kind != PW_ACT_F || (nx->kind != PW_ACT_B && nx->kind != PW_ACT_I) ||
            (nx->flags & PW_ACTION_FUSED))
          return pw_err_set(err, PW_ESCHEDULE, "",
                            "rank %d #%d: a fused pair must be an F then a B or I (got %s+%s)", r,
                            i, fmt_act(a, b1), fmt_act(nx, b2));
      }
      loc *l = &x->at[a->kind][a->stage * s->m + a->mb];
      if (l->rank >= 0)
        return pw_err_set(err, PW_ESCHEDULE, "", "%s appears twice (rank %d #%d and rank %d #%d)",
                          fmt_act(a, b1), l->rank, l->idx, r, i);
      *l = (loc){r, i};
    }
  }
  for (int st = 0; st < s->S; st++)
    for (int k = 0; k < s->m; k++) {
      int j = st * s->m + k;
      int hasB = x->at[PW_ACT_B][j].rank >= 0, hasI = x->at[PW_ACT_I][j].rank >= 0,
          hasW = x->at[PW_ACT_W][j].rank >= 0;
      pw_action f = mk(PW_ACT_F, k, st);
      int own = s->stage_to_rank[st];
      char needs[80] = ""; /* the action that waits for the missing one */
      if (x->at[PW_ACT_F][j].rank < 0) {
        pw_action need = mk(PW_ACT_F, k, st + 1);
        if (st + 1 < s->S)
          snprintf(needs, sizeof needs, "; %s on rank %d needs it", fmt_act(&need, b2), s->stage_to_rank[st + 1]);
        return pw_err_set(err, PW_ESCHEDULE, "", "%s is missing: stage %d (rank %d) has no forward of microbatch %d%s",
                          fmt_act(&f, b1), st, own, k, needs);
      }
      if (s->forward_only) continue;
      if (hasB && (hasI || hasW))
        return pw_err_set(err, PW_ESCHEDULE, "",
                          "stage %d microbatch %d has both a full backward and split ones (B%d@s%d "
                          "with %s)",
                          st, k, k, st, hasI ? "I" : "W");
      if (!hasB && !hasI && !hasW) {
        /* the stage before waits for its gradient */
        int prev = st > 0 ? (st - 1) * s->m + k : -1;
        if (prev >= 0 && (x->at[PW_ACT_B][prev].rank >= 0 || x->at[PW_ACT_I][prev].rank >= 0)) {
          pw_action need = mk(x->at[PW_ACT_B][prev].rank >= 0 ? PW_ACT_B : PW_ACT_I, k, st - 1);
          snprintf(needs, sizeof needs, "; %s on rank %d needs it", fmt_act(&need, b1), s->stage_to_rank[st - 1]);
        }
        return pw_err_set(err, PW_ESCHEDULE, "",
                          "B%d@s%d (or I%d@s%d and W%d@s%d) is missing: stage %d (rank %d) has no backward of "
                          "microbatch %d%s",
                          k, st, k, st, k, st, st, own, k, needs);
      }
      if (!hasB && hasI != hasW)
        return pw_err_set(err, PW_ESCHEDULE, "", "%c%d@s%d is missing: rank %d has %c%d@s%d without it",
                          hasI ? 'W' : 'I', k, st, own, hasI ? 'I' : 'W', k, st);
      if (hasI && x->at[PW_ACT_W][j].idx < x->at[PW_ACT_I][j].idx)
        return pw_err_set(err, PW_ESCHEDULE, "", "rank %d: W%d@s%d (#%d) comes before I%d@s%d (#%d)",
                          x->at[PW_ACT_W][j].rank, k, st, x->at[PW_ACT_W][j].idx, k, st,
                          x->at[PW_ACT_I][j].idx);
    }
  return 0;
}

int pw_sim_check(const pw_sched *s, pw_err *err) {
  index_t x;
  if (index_init(&x, s->S > 0 ? s->S : 1, s->m > 0 ? s->m : 1) < 0)
    return pw_err_set(err, PW_ENOMEM, "", "out of memory");
  int rc = validate(s, &x, err);
  index_free(&x);
  return rc;
}

void pw_sim_result_free(pw_sim_result *r) {
  if (!r) return;
  free(r->busy);
  free(r->idle);
  free(r->peak_act);
  free(r->peak_pending_w);
  free(r->peak_held);
  free(r->link_bytes);
  free(r->link_transfers);
  free(r->events);
  free(r->rank_first);
  free(r->dp_start);
  free(r->dp_end);
  free(r);
}

int pw_sim_add_dp(pw_sim_result *r, const double *seconds, pw_err *err) {
  for (int k = 0; k < r->pp; k++)
    if (!(seconds[k] >= 0) || !isfinite(seconds[k]))
      return pw_err_set(err, PW_EINVAL, "dp_seconds", "rank %d: the exchange's cost must be a finite number >= 0 "
                        "(got %g)", k, seconds[k]);
  if (!r->dp_start && (!(r->dp_start = calloc((size_t)r->pp, sizeof(double))) ||
                       !(r->dp_end = calloc((size_t)r->pp, sizeof(double))))) {
    free(r->dp_start);
    r->dp_start = NULL;
    return pw_err_set(err, PW_ENOMEM, "dp_seconds", "out of memory");
  }
  r->step_makespan = r->makespan;
  for (int k = 0; k < r->pp; k++) {
    double last = 0;
    for (int e = r->rank_first[k]; e < r->rank_first[k + 1]; e++)
      if (r->events[e].end > last) last = r->events[e].end;
    r->dp_start[k] = last;
    r->dp_end[k] = last + seconds[k];
    if (r->dp_end[k] > r->step_makespan) r->step_makespan = r->dp_end[k];
  }
  return 0;
}

/* Resolved per-stage costs. */
typedef struct {
  double *f, *b, *i, *w, *bytes; /* [S], [S], [S], [S], [S-1 or 1] */
} costs_t;

static int resolve_costs(const pw_sched *s, const pw_sim_costs *c, costs_t *o, pw_err *err) {
  int S = s->S;
  double *all = calloc((size_t)5 * S, sizeof(double));
  if (!all) return pw_err_set(err, PW_ENOMEM, "", "out of memory");
  o->f = all;
  o->b = all + S;
  o->i = all + 2 * S;
  o->w = all + 3 * S;
  o->bytes = all + 4 * S;
  static const pw_sim_costs zero;
  if (!c) c = &zero;
  const double *in[5] = {c->f, c->b, c->i, c->w, c->act_bytes};
  static const char *names[5] = {"f", "b", "i", "w", "act_bytes"};
  for (int a = 0; a < 5; a++) {
    if (!in[a]) continue;
    int n = a == 4 ? S - 1 : S;
    for (int st = 0; st < n; st++)
      if (!(in[a][st] >= 0) || !isfinite(in[a][st])) {
        char path[48];
        snprintf(path, sizeof path, "costs.%s[%d]", names[a], st);
        free(all);
        return pw_err_set(err, PW_EINVAL, path, "must be a finite number >= 0 (got %g)",
                          in[a][st]);
      }
  }
  for (int st = 0; st < S; st++) {
    o->f[st] = c->f ? c->f[st] : 1.0;
    double half = c->b ? c->b[st] / 2 : 1.0;
    o->i[st] = c->i ? c->i[st] : half;
    o->w[st] = c->w ? c->w[st] : half;
    o->b[st] = c->b ? c->b[st] : o->i[st] + o->w[st];
    if (st < S - 1) o->bytes[st] = c->act_bytes ? c->act_bytes[st] : 0.0;
  }
  if (!(c->latency >= 0) || !isfinite(c->latency) || !(c->bandwidth >= 0)) {
    free(all);
    return pw_err_set(err, PW_EINVAL, "costs", "latency and bandwidth must be finite and >= 0");
  }
  return 0;
}

static double duration(const costs_t *c, const pw_action *a) {
  switch (a->kind) {
  case PW_ACT_F: return c->f[a->stage];
  case PW_ACT_B: return c->b[a->stage];
  case PW_ACT_I: return c->i[a->stage];
  default: return c->w[a->stage];
  }
}

/* Replay state. */
typedef struct {
  const pw_sched *s;
  const pw_sim_costs *c;
  costs_t cost;
  index_t x;
  double *end[4]; /* [kind][st*m+k] time the result is available; < 0 = not yet */
  pw_sim_result *res;
} replay;

/* The input `dep` of action a: sets *dep and returns 1, or 0 when there is
 * no (further) input. which = 0 or 1 selects among B/I's two inputs. */
static int input_of(const pw_sched *s, const index_t *x, const pw_action *a, int which,
                    pw_action *dep) {
  int k = a->mb, st = a->stage, links[PW_SCHED_MAX_LINKS];
  if (a->kind == PW_ACT_F) {
    if (which >= pw_sched_preds(s, st, links)) return 0;
    *dep = mk(PW_ACT_F, k, links[which]);
    return 1;
  }
  if (a->kind == PW_ACT_W) {
    if (which > 0) return 0;
    *dep = mk(PW_ACT_I, k, st);
    return 1;
  }
  if (which == 0) {
    *dep = mk(PW_ACT_F, k, st);
    return 1;
  }
  /* the gradient from each stage it feeds; none on the stage with the loss */
  if (which - 1 >= pw_sched_succs(s, st, links)) return 0;
  int j = links[which - 1] * s->m + k;
  *dep = mk(x->at[PW_ACT_B][j].rank >= 0 ? PW_ACT_B : PW_ACT_I, k, links[which - 1]);
  return 1;
}

/* Bytes and time of moving the result of dep to the stage of a. */
static double transfer(replay *rp, const pw_action *dep, const pw_action *a, double *bytes) {
  const pw_sched *s = rp->s;
  int src = s->stage_to_rank[dep->stage], dst = s->stage_to_rank[a->stage];
  *bytes = 0;
  if (src == dst || dep->stage == a->stage) return 0;
  int edge = dep->stage < a->stage ? dep->stage : a->stage;
  *bytes = rp->cost.bytes[edge];
  if (dep->stage < a->stage && rp->c && rp->c->act_scale > 0) *bytes *= rp->c->act_scale; /* an activation */
  double t = rp->c ? rp->c->latency : 0;
  if (rp->c && rp->c->bandwidth > 0) t += *bytes / rp->c->bandwidth;
  return t;
}

/* Time the inputs of a have all arrived, or -1 (and *missing set) if one is
 * not produced yet. */
static double ready_time(replay *rp, const pw_action *a, pw_action *missing) {
  double t = 0, bytes;
  pw_action dep;
  for (int w = 0; input_of(rp->s, &rp->x, a, w, &dep); w++) {
    double e = rp->end[dep.kind][dep.stage * rp->s->m + dep.mb];
    if (e < 0) {
      if (missing) *missing = dep;
      return -1;
    }
    e += transfer(rp, &dep, a, &bytes);
    if (e > t) t = e;
  }
  return t;
}

static void count_links(replay *rp, const pw_action *a) {
  pw_action dep;
  double bytes;
  const pw_sched *s = rp->s;
  for (int w = 0; input_of(s, &rp->x, a, w, &dep); w++) {
    int src = s->stage_to_rank[dep.stage], dst = s->stage_to_rank[a->stage];
    if (src == dst) continue;
    transfer(rp, &dep, a, &bytes);
    rp->res->link_bytes[src * s->pp + dst] += bytes;
    rp->res->link_transfers[src * s->pp + dst]++;
  }
}

/* Where blocked rank r waits: the action of its unit that lacks an input
 * (*a), that input (*miss) and the rank that makes it (returned). */
static int waits_for(replay *rp, const int *pos, int r, const pw_action **a, pw_action *miss) {
  const pw_sched *s = rp->s;
  *a = &s->actions[r][pos[r]];
  *miss = **a;
  if (ready_time(rp, *a, miss) >= 0) { /* then the fused partner waits */
    (*a)++;
    ready_time(rp, *a, miss);
  }
  return rp->x.at[miss->kind][miss->stage * s->m + miss->mb].rank;
}

/* Every blocked rank waits for an input its maker has not reached (the
 * input is still ahead of that rank's position), so following "waits for"
 * from any blocked rank ends in a cycle: the message names the cycle,
 * each rank with the action it waits at, the input it needs, and where
 * that input sits in its rank's list. */
static void deadlock_report(replay *rp, const int *pos, pw_err *err) {
  const pw_sched *s = rp->s;
  char msg[sizeof err->msg], b1[40], b2[40], b3[40];
  int *step = malloc(sizeof(int) * (size_t)s->pp), start = -1, blocked = 0;
  if (!step) {
    pw_err_set(err, PW_EDEADLOCK, "", "deadlock (out of memory describing it)");
    return;
  }
  for (int r = 0; r < s->pp; r++) {
    step[r] = -1;
    if (pos[r] < s->n_actions[r]) {
      blocked++;
      if (start < 0) start = r;
    }
  }
  /* walk until a rank repeats; step[] numbers the visits */
  const pw_action *a;
  pw_action miss;
  int r = start, n = 0;
  while (step[r] < 0) {
    step[r] = n++;
    r = waits_for(rp, pos, r, &a, &miss);
  }
  /* r starts the cycle; print it from its lowest rank */
  int lo = r, len_c = 0;
  for (int q = r;;) {
    len_c++;
    if (q < lo) lo = q;
    q = waits_for(rp, pos, q, &a, &miss);
    if (q == r) break;
  }
  size_t len = (size_t)snprintf(msg, sizeof msg, "deadlock:");
  int q = lo;
  for (int i = 0; i < len_c && len < sizeof msg; i++) {
    int next = waits_for(rp, pos, q, &a, &miss);
    len += (size_t)snprintf(msg + len, sizeof msg - len, "%s rank %d waits at %s for %s (rank %d)", i ? "," : "", q,
                            fmt_act(a, b1), fmt_act(&miss, b2), next);
    /* where the input sits against what its rank waits at */
    pw_action miss2;
    const pw_action *there;
    waits_for(rp, pos, next, &there, &miss2);
    int at = rp->x.at[miss.kind][miss.stage * s->m + miss.mb].idx, at2 = (int)(there - s->actions[next]);
    if (len < sizeof msg && at != at2)
      len += (size_t)snprintf(msg + len, sizeof msg - len, " which %s %s", at > at2 ? "comes after" : "runs fused with",
                              fmt_act(there, b3));
    q = next;
  }
  if (len < sizeof msg && blocked > len_c)
    len += (size_t)snprintf(msg + len, sizeof msg - len, "; %d other rank%s wait%s behind them", blocked - len_c,
                            blocked - len_c == 1 ? "" : "s", blocked - len_c == 1 ? "s" : "");
  if (len >= sizeof msg) memcpy(msg + sizeof msg - 4, "...", 4);
  free(step);
  pw_err_set(err, PW_EDEADLOCK, "", "%s", msg);
}

/* Peak memory per rank, walking its events in order (see sim.h). */
static void memory(pw_sim_result *res) {
  for (int r = 0; r < res->pp; r++) {
    int act = 0, pend = 0, pa = 0, pw = 0, ph = 0;
    for (int e = res->rank_first[r]; e < res->rank_first[r + 1]; e++) {
      switch (res->events[e].act.kind) {
      case PW_ACT_F: act++; break;
      case PW_ACT_B: act--; break;
      case PW_ACT_I: act--; pend++; break;
      case PW_ACT_W: pend--; break;
      }
      if (act > pa) pa = act;
      if (pend > pw) pw = pend;
      if (act + pend > ph) ph = act + pend;
    }
    res->peak_act[r] = pa;
    res->peak_pending_w[r] = pw;
    res->peak_held[r] = ph;
  }
}

static pw_sim_result *result_alloc(const pw_sched *s) {
  pw_sim_result *res = calloc(1, sizeof *res);
  if (!res) return NULL;
  int p = s->pp, n = 0;
  for (int r = 0; r < p; r++) n += s->n_actions[r];
  res->busy = calloc((size_t)p, sizeof(double));
  res->idle = calloc((size_t)p, sizeof(double));
  res->peak_act = calloc((size_t)p, sizeof(int));
  res->peak_pending_w = calloc((size_t)p, sizeof(int));
  res->peak_held = calloc((size_t)p, sizeof(int));
  res->link_bytes = calloc((size_t)p * p, sizeof(double));
  res->link_transfers = calloc((size_t)p * p, sizeof(int));
  res->events = calloc((size_t)(n ? n : 1), sizeof(pw_sim_event));
  res->rank_first = calloc((size_t)p + 1, sizeof(int));
  if (!res->busy || !res->idle || !res->peak_act || !res->peak_pending_w || !res->peak_held ||
      !res->link_bytes || !res->link_transfers || !res->events || !res->rank_first) {
    pw_sim_result_free(res);
    return NULL;
  }
  snprintf(res->name, sizeof res->name, "%s", s->name);
  res->pp = p;
  res->V = s->V;
  res->S = s->S;
  res->m = s->m;
  res->forward_only = s->forward_only;
  res->n_events = n;
  for (int r = 0; r < p; r++) res->rank_first[r + 1] = res->rank_first[r] + s->n_actions[r];
  return res;
}

int pw_sim_run(const pw_sched *s, const pw_sim_costs *c, pw_sim_result **out, pw_err *err) {
  *out = NULL;
  replay rp;
  memset(&rp, 0, sizeof rp);
  rp.s = s;
  rp.c = c;
  if (index_init(&rp.x, s->S > 0 ? s->S : 1, s->m > 0 ? s->m : 1) < 0)
    return pw_err_set(err, PW_ENOMEM, "", "out of memory");
  int rc = validate(s, &rp.x, err);
  if (rc < 0) {
    index_free(&rp.x);
    return rc;
  }
  rc = resolve_costs(s, c, &rp.cost, err);
  if (rc < 0) {
    index_free(&rp.x);
    return rc;
  }
  int p = s->pp;
  size_t cells = (size_t)s->S * s->m;
  double *ends = malloc(4 * cells * sizeof(double));
  double *free_at = calloc((size_t)p, sizeof(double));
  int *pos = calloc((size_t)p, sizeof(int));
  rp.res = result_alloc(s);
  if (!ends || !free_at || !pos || !rp.res) {
    rc = pw_err_set(err, PW_ENOMEM, "", "out of memory");
    goto out;
  }
  for (size_t i = 0; i < 4 * cells; i++) ends[i] = -1;
  for (int k = 0; k < 4; k++) rp.end[k] = ends + k * cells;

  /* Each rank's start times depend only on its previous unit and on
   * inputs already timed, so ranks can be advanced in any order: advance
   * every rank as far as its inputs allow until nothing moves. */
  int progress = 1, left = rp.res->n_events;
  while (progress && left > 0) {
    progress = 0;
    for (int r = 0; r < p; r++) {
      while (pos[r] < s->n_actions[r]) {
        const pw_action *a = &s->actions[r][pos[r]];
        int fused = (a->flags & PW_ACTION_FUSED) != 0;
        double t0 = ready_time(&rp, a, NULL), t1 = fused ? ready_time(&rp, a + 1, NULL) : 0;
        if (t0 < 0 || t1 < 0) break;
        double start = free_at[r];
        if (t0 > start) start = t0;
        if (t1 > start) start = t1;
        double t = start;
        for (int u = 0; u <= fused; u++) {
          pw_sim_event *ev = &rp.res->events[rp.res->rank_first[r] + pos[r] + u];
          ev->act = a[u];
          ev->rank = r;
          ev->index = pos[r] + u;
          ev->start = t;
          t += duration(&rp.cost, &a[u]);
          ev->end = t;
          rp.res->busy[r] += ev->end - ev->start;
          count_links(&rp, &a[u]);
        }
        /* A fused unit's results are both available at its end. */
        for (int u = 0; u <= fused; u++) rp.end[a[u].kind][a[u].stage * s->m + a[u].mb] = t;
        free_at[r] = t;
        pos[r] += 1 + fused;
        left -= 1 + fused;
        progress = 1;
      }
    }
  }
  if (left > 0) {
    deadlock_report(&rp, pos, err);
    rc = PW_EDEADLOCK;
    goto out;
  }
  double mk_ = 0, idle = 0;
  for (int r = 0; r < p; r++)
    if (free_at[r] > mk_) mk_ = free_at[r];
  for (int r = 0; r < p; r++) {
    rp.res->idle[r] = mk_ - rp.res->busy[r];
    idle += rp.res->idle[r];
  }
  rp.res->makespan = mk_;
  rp.res->bubble_ratio = mk_ > 0 ? idle / (p * mk_) : 0;
  memory(rp.res);
  *out = rp.res;
  rp.res = NULL;
out:
  pw_sim_result_free(rp.res);
  free(ends);
  free(free_at);
  free(pos);
  free(rp.cost.f);
  index_free(&rp.x);
  return rc;
}
