/* schedule_catalog: the nine schedules of schedule.h — each one's
 * constraints, its row in the table GET /v1/schedules shows, and building
 * a plan with its generator (schedule_int.h). */
#include "schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule_int.h"
#include "spec.h"

/* ---- the catalogue ----------------------------------------------------- */

typedef int (*pw__sched_check_fn)(const char *name, int pp, int V, int m, pw_err *err);

static int need_v1(const char *name, int pp, int V, int m, pw_err *err) {
  if (V != 1)
    return pw_err_set(err, PW_ESPEC, "mesh.virtual_stages",
                      "%s is a flat schedule and needs virtual_stages = 1 (got %d)", name, V);
  return 0;
}

static int need_v2plus(const char *name, int V, pw_err *err) {
  if (V < 2)
    return pw_err_set(err, PW_ESPEC, "mesh.virtual_stages",
                      "%s is an interleaved schedule and needs virtual_stages >= 2 (got %d); "
                      "with one stage per rank use the flat schedules",
                      name, V);
  return 0;
}

static int check_interleaved_any(const char *name, int pp, int V, int m, pw_err *err) {
  return need_v2plus(name, V, err);
}

static int check_megatron(const char *name, int pp, int V, int m, pw_err *err) {
  int rc = need_v2plus(name, V, err);
  if (rc < 0) return rc;
  if (m % pp != 0)
    return pw_err_set(err, PW_ESPEC, "schedule.microbatches",
                      "%s needs microbatches to be a multiple of pp (got %d %% %d = %d)", name, m,
                      pp, m % pp);
  return 0;
}

static int check_kimi(const char *name, int pp, int V, int m, pw_err *err) {
  int rc = need_v2plus(name, V, err);
  if (rc < 0) return rc;
  int rounds = m / pp > 1 ? m / pp : 1;
  if (m % rounds != 0)
    return pw_err_set(err, PW_ESPEC, "schedule.microbatches",
                      "%s needs microbatches to be a multiple of its rounds, max(1, "
                      "microbatches / pp) (got %d %% %d = %d)",
                      name, m, rounds, m % rounds);
  return 0;
}

static int check_dualpipev(const char *name, int pp, int V, int m, pw_err *err) {
  if (V != 2)
    return pw_err_set(err, PW_ESPEC, "mesh.virtual_stages",
                      "%s holds two stages per rank (the V shape) and needs virtual_stages = 2 "
                      "(got %d)",
                      name, V);
  if (m < 2 * pp)
    return pw_err_set(err, PW_ESPEC, "schedule.microbatches",
                      "%s needs microbatches >= 2*pp (got %d < %d)", name, m, 2 * pp);
  return 0;
}

typedef enum { LAYOUT_FLAT, LAYOUT_INTERLEAVED, LAYOUT_V } layout_kind;

typedef struct {
  pw__sched_check_fn check;
  pw__sched_gen gen;
  layout_kind layout;
} sched_impl;

#define FLAT_LAYOUT "stage s on rank s"
#define INTER_LAYOUT "stage v*pp + r on rank r (v = 0 .. V-1)"

static const pw_sched_info infos[] = {
    {"gpipe", "flat", FLAT_LAYOUT, 1, 1, 0, "pp, microbatches", "virtual_stages = 1",
     "GPipe: every rank runs all forwards F0..F(m-1), then all backwards B0..B(m-1). Bubble "
     "(p-1)/(m+p-1); holds m activations on every rank."},
    {"1f1b", "flat", FLAT_LAYOUT, 1, 1, 0, "pp, microbatches", "virtual_stages = 1",
     "1F1B (Megatron/PyTorch): rank r runs min(p-r-1, m) warm-up forwards, then alternates one "
     "forward and one backward, then the remaining backwards. Bubble as GPipe; p-r activations "
     "on rank r."},
    {"eager1f1b", "flat", FLAT_LAYOUT, 1, 1, 0, "pp, microbatches", "virtual_stages = 1",
     "Eager 1F1B: as 1F1B with min(2(p-r)-1, m) warm-up forwards, so the backward pipe starts "
     "sooner (hides transfer latency) at the cost of more saved activations."},
    {"zb-h1", "flat", FLAT_LAYOUT, 1, 1, 1, "pp, microbatches", "virtual_stages = 1",
     "ZeroBubble H1: the 1F1B order with every backward split into I (input gradient) and W "
     "(weight gradient); each W fills, first in first out, the earliest idle slot of its rank "
     "after its I (placed by a unit-cost replay with F = I = W = 1). Bubble (p-1)/(3m+p-1) at "
     "unit costs; pending W's hold memory (reported by the simulator)."},
    {"interleaved-1f1b", "interleaved", INTER_LAYOUT, 2, 0, 0,
     "pp, virtual_stages, microbatches", "virtual_stages >= 2; microbatches % pp == 0",
     "Megatron interleaved 1F1B: microbatches go in groups of pp through each of the rank's V "
     "stages in turn; rank r warms up with 2(p-r-1) + (V-1)p forwards, then runs 1F1B over "
     "(microbatch, stage) pairs. Bubble (p-1)/(V*m+p-1)."},
    {"interleaved-gpipe", "interleaved", INTER_LAYOUT, 2, 0, 0,
     "pp, virtual_stages, microbatches", "virtual_stages >= 2",
     "GPipe over all S = p*V stages: each rank runs every forward of its stages (stage order), "
     "then every backward (reverse stage order). Gains nothing over flat GPipe; for comparison."},
    {"interleaved-1f1b-plus-one", "interleaved", INTER_LAYOUT, 2, 0, 0,
     "pp, virtual_stages, microbatches", "virtual_stages >= 2; microbatches % pp == 0",
     "Interleaved 1F1B with one extra warm-up forward on every rank: one more saved "
     "activation, fewer stalls when forward and backward costs differ or links are slow."},
    {"kimi-k2", "interleaved", INTER_LAYOUT, 2, 0, 0, "pp, virtual_stages, microbatches",
     "virtual_stages >= 2; microbatches % max(1, microbatches / pp) == 0",
     "Kimi K2's interleaved 1F1B: PyTorch-style rounds of max(1, m/p) microbatches and one "
     "extra warm-up microbatch per stage, i.e. (V-1)*m_round + 2(p-1-r) + V warm-up forwards "
     "(capped at m*V), so each F has a B of another microbatch to overlap its communication "
     "with. Interleaved layout (not SpectraX's contiguous r*V+v)."},
    {"dualpipev", "v-shape", "rank r holds stages r and 2*pp-1-r (S = 2*pp)", 2, 2, 1,
     "pp, microbatches (virtual_stages = 2)", "virtual_stages = 2; microbatches >= 2*pp",
     "DeepSeek DualPipeV: data goes down the ranks and back up (the V); the eight sections of "
     "dualpipev.py with fused forward+backward pairs of the two legs and split backwards at "
     "the edges. About p+1 activations per rank."},
};

static const sched_impl impls[] = {
    {need_v1, pw__gen_gpipe, LAYOUT_FLAT},
    {need_v1, pw__gen_1f1b, LAYOUT_FLAT},
    {need_v1, pw__gen_eager1f1b, LAYOUT_FLAT},
    {need_v1, pw__gen_zbh1, LAYOUT_FLAT},
    {check_megatron, pw__gen_interleaved_1f1b, LAYOUT_INTERLEAVED},
    {check_interleaved_any, pw__gen_interleaved_gpipe, LAYOUT_INTERLEAVED},
    {check_megatron, pw__gen_interleaved_1f1b_plus_one, LAYOUT_INTERLEAVED},
    {check_kimi, pw__gen_kimi_k2, LAYOUT_INTERLEAVED},
    {check_dualpipev, pw__gen_dualpipev, LAYOUT_V},
};

#define N_SCHEDS ((int)(sizeof infos / sizeof infos[0]))
_Static_assert(sizeof infos / sizeof infos[0] == sizeof impls / sizeof impls[0],
               "one implementation per schedule");

const pw_sched_info *pw_sched_infos(int *n) {
  if (n) *n = N_SCHEDS;
  return infos;
}

static int find_idx(const char *name) {
  for (int i = 0; i < N_SCHEDS; i++)
    if (name && strcmp(infos[i].name, name) == 0) return i;
  return -1;
}

const pw_sched_info *pw_sched_info_find(const char *name) {
  int i = find_idx(name);
  return i < 0 ? NULL : &infos[i];
}

json_t *pw_sched_info_json(const pw_sched_info *in) {
  json_t *j = json_object();
  json_object_set_new(j, "name", json_string(in->name));
  json_t *al = json_array(); /* other systems' names of it (spec.c's table) */
  for (const char *const *a = pw_schedule_aliases(in->name); *a; a++) json_array_append_new(al, json_string(*a));
  json_object_set_new(j, "aliases", al);
  json_object_set_new(j, "family", json_string(in->family));
  json_object_set_new(j, "layout", json_string(in->layout));
  json_t *vs = json_object();
  json_object_set_new(vs, "min", json_integer(in->min_v));
  json_object_set_new(vs, "max", in->max_v ? json_integer(in->max_v) : json_null());
  json_object_set_new(j, "virtual_stages", vs);
  json_object_set_new(j, "split_backward", json_boolean(in->split_backward));
  json_object_set_new(j, "parameters", json_string(in->parameters));
  json_object_set_new(j, "constraints", json_string(in->constraints));
  json_object_set_new(j, "description", json_string(in->description));
  return j;
}

/* Bounds that keep a plan's size sane (a step of 2^24 actions is a typo). */
#define PW_SCHED_MAX_PP 4096
#define PW_SCHED_MAX_V 64
#define PW_SCHED_MAX_ACTIONS (1L << 24)

int pw_sched_check(const char *name, int pp, int V, int m, int forward_only, pw_err *err) {
  int idx = find_idx(name);
  if (idx < 0)
    return pw_err_set(err, PW_ESPEC, "schedule.name", "unknown schedule \"%s\"",
                      name ? name : "(null)");
  if (pp < 1 || pp > PW_SCHED_MAX_PP)
    return pw_err_set(err, PW_ESPEC, "mesh.pp", "must be in 1..%d (got %d)", PW_SCHED_MAX_PP, pp);
  if (V < 1 || V > PW_SCHED_MAX_V)
    return pw_err_set(err, PW_ESPEC, "mesh.virtual_stages", "must be in 1..%d (got %d)",
                      PW_SCHED_MAX_V, V);
  if (m < 1) return pw_err_set(err, PW_ESPEC, "schedule.microbatches", "must be >= 1 (got %d)", m);
  if ((long)pp * V * m * 3 > PW_SCHED_MAX_ACTIONS)
    return pw_err_set(err, PW_ESPEC, "schedule.microbatches",
                      "pp * virtual_stages * microbatches = %ld is too large (limit %ld)",
                      (long)pp * V * m, PW_SCHED_MAX_ACTIONS / 3);
  return impls[idx].check(name, pp, V, m, err);
}

int pw_sched_build(const char *name, int pp, int V, int m, int forward_only, pw_sched **out,
                   pw_err *err) {
  *out = NULL;
  int rc = pw_sched_check(name, pp, V, m, forward_only, err);
  if (rc < 0) return rc;
  int idx = find_idx(name);
  int S = pp * V;
  int *st2r = malloc((size_t)S * sizeof(int));
  if (!st2r) return pw_err_set(err, PW_ENOMEM, "", "out of memory");
  for (int st = 0; st < S; st++)
    st2r[st] = impls[idx].layout == LAYOUT_V ? (st < pp ? st : 2 * pp - 1 - st) : st % pp;
  pw_sched *s;
  rc = pw_sched_new(pp, V, S, m, st2r, forward_only, &s, err);
  free(st2r);
  if (rc < 0) return rc;
  snprintf(s->name, sizeof s->name, "%s", name);
  rc = impls[idx].gen(s);
  if (rc < 0) {
    pw_sched_free(s);
    return pw_err_set(err, rc, "", "building %s: %s", name, pw_strerror(rc));
  }
  for (int r = 0; r < s->pp && forward_only; r++)
    s->n_actions[r] = pw_actions_keep_forwards(s->actions[r], s->n_actions[r]);
  *out = s;
  return 0;
}
