/* schedule: actions and their textual form, the plan container, its JSON,
 * and the catalogue of the nine schedules (constraints and generators).
 *
 * The generators themselves live in schedule_flat.c, schedule_interleaved.c
 * and schedule_dualpipev.c. Nothing here simulates; sim.c proves plans. */
#include "schedule.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule_int.h"

/* ---- textual form ------------------------------------------------------ */

static const char kind_chars[4] = {'F', 'B', 'I', 'W'};

int pw_action_format(const pw_action *a, char *buf, size_t cap) {
  char k = a->kind < 4 ? kind_chars[a->kind] : '?';
  return snprintf(buf, cap, "%c%d@s%d", k, (int)a->mb, (int)a->stage);
}

static int parse_int(const char *p, const char **end, int32_t *out) {
  if (!isdigit((unsigned char)*p)) return -1;
  errno = 0;
  char *e;
  long v = strtol(p, &e, 10);
  if (errno || v > INT32_MAX) return -1;
  *out = (int32_t)v;
  *end = e;
  return 0;
}

int pw_action_parse(const char *s, pw_action *a, const char **end, pw_err *err) {
  const char *p = s;
  while (isspace((unsigned char)*p)) p++;
  const char *start = p;
  int kind = -1;
  for (int k = 0; k < 4; k++)
    if (*p == kind_chars[k]) kind = k;
  if (kind < 0)
    return pw_err_set(err, PW_EFORMAT, "", "bad action \"%.16s\": must start with F, B, I or W",
                      start);
  p++;
  int32_t mb, st;
  if (parse_int(p, &p, &mb) < 0)
    return pw_err_set(err, PW_EFORMAT, "", "bad action \"%.16s\": expected a microbatch number",
                      start);
  if (p[0] != '@' || p[1] != 's')
    return pw_err_set(err, PW_EFORMAT, "", "bad action \"%.16s\": expected \"@s\" and a stage",
                      start);
  p += 2;
  if (parse_int(p, &p, &st) < 0)
    return pw_err_set(err, PW_EFORMAT, "", "bad action \"%.16s\": expected a stage number",
                      start);
  a->kind = (uint8_t)kind;
  a->flags = 0;
  a->mb = mb;
  a->stage = st;
  if (end) *end = p;
  return 0;
}

int pw_actions_format(const pw_action *acts, int n, char *buf, size_t cap) {
  size_t len = 0; /* full length */
  size_t put = 0; /* bytes written (a prefix that fits, whole entries only) */
  int full = 0;
  char tmp[56];
  for (int i = 0; i < n; i++) {
    const char *sep = i == 0 ? "" : (acts[i - 1].flags & PW_ACTION_FUSED) ? "+" : " ";
    int k = snprintf(tmp, sizeof tmp, "%s", sep);
    k += pw_action_format(&acts[i], tmp + k, sizeof tmp - (size_t)k);
    if (!full && put + (size_t)k < cap) {
      memcpy(buf + put, tmp, (size_t)k);
      put += (size_t)k;
    } else {
      full = 1;
    }
    len += (size_t)k;
  }
  if (cap > 0) buf[put] = '\0';
  return (int)len;
}

int pw_actions_parse(const char *text, pw_action **out, int *n, pw_err *err) {
  *out = NULL;
  *n = 0;
  int cap = 0, cnt = 0;
  pw_action *v = NULL;
  const char *p = text;
  int fuse_next = 0;
  for (;;) {
    while (isspace((unsigned char)*p)) p++;
    if (!*p) break;
    pw_action a;
    int rc = pw_action_parse(p, &a, &p, err);
    if (rc < 0) {
      free(v);
      if (err) {
        char tmp[sizeof err->msg];
        memcpy(tmp, err->msg, sizeof tmp);
        int k = snprintf(err->msg, sizeof err->msg, "entry %d: ", cnt);
        memcpy(err->msg + k, tmp, sizeof err->msg - (size_t)k - 1);
        err->msg[sizeof err->msg - 1] = '\0';
      }
      return rc;
    }
    if (cnt == cap) {
      cap = cap ? cap * 2 : 16;
      pw_action *nv = realloc(v, (size_t)cap * sizeof *v);
      if (!nv) {
        free(v);
        return pw_err_set(err, PW_ENOMEM, "", "out of memory parsing actions");
      }
      v = nv;
    }
    v[cnt++] = a;
    fuse_next = 0;
    if (*p == '+') {
      v[cnt - 1].flags |= PW_ACTION_FUSED;
      fuse_next = 1;
      p++;
    } else if (*p && !isspace((unsigned char)*p)) {
      free(v);
      return pw_err_set(err, PW_EFORMAT, "", "entry %d: unexpected '%c' after the action", cnt - 1,
                        *p);
    }
  }
  if (fuse_next) {
    free(v);
    return pw_err_set(err, PW_EFORMAT, "", "a '+' at the end joins nothing");
  }
  *out = v;
  *n = cnt;
  return 0;
}

/* ---- the plan container ------------------------------------------------ */

void pw_sched_free(pw_sched *s) {
  if (!s) return;
  if (s->actions)
    for (int r = 0; r < s->pp; r++) free(s->actions[r]);
  free(s->actions);
  free(s->n_actions);
  free(s->cap_);
  free(s->stage_to_rank);
  free(s);
}

int pw_sched_new(int pp, int V, int S, int m, const int *stage_to_rank, int forward_only,
                 pw_sched **out, pw_err *err) {
  *out = NULL;
  if (pp < 1) return pw_err_set(err, PW_EINVAL, "mesh.pp", "must be >= 1 (got %d)", pp);
  if (V < 1)
    return pw_err_set(err, PW_EINVAL, "mesh.virtual_stages", "must be >= 1 (got %d)", V);
  if (S < 1) return pw_err_set(err, PW_EINVAL, "stages", "must be >= 1 (got %d)", S);
  if (m < 1)
    return pw_err_set(err, PW_EINVAL, "schedule.microbatches", "must be >= 1 (got %d)", m);
  if (stage_to_rank)
    for (int st = 0; st < S; st++)
      if (stage_to_rank[st] < 0 || stage_to_rank[st] >= pp)
        return pw_err_set(err, PW_EINVAL, "stage_to_rank", "stage %d on rank %d, outside 0..%d",
                          st, stage_to_rank[st], pp - 1);
  pw_sched *s = calloc(1, sizeof *s);
  if (!s) return pw_err_set(err, PW_ENOMEM, "", "out of memory");
  snprintf(s->name, sizeof s->name, "custom");
  s->pp = pp;
  s->V = V;
  s->S = S;
  s->m = m;
  s->forward_only = forward_only ? 1 : 0;
  s->stage_to_rank = malloc((size_t)S * sizeof(int));
  s->n_actions = calloc((size_t)pp, sizeof(int));
  s->cap_ = calloc((size_t)pp, sizeof(int));
  s->actions = calloc((size_t)pp, sizeof(pw_action *));
  if (!s->stage_to_rank || !s->n_actions || !s->cap_ || !s->actions) {
    pw_sched_free(s);
    return pw_err_set(err, PW_ENOMEM, "", "out of memory");
  }
  for (int st = 0; st < S; st++) s->stage_to_rank[st] = stage_to_rank ? stage_to_rank[st] : st % pp;
  *out = s;
  return 0;
}

int pw_sched_push(pw_sched *s, int rank, pw_action a) {
  if (rank < 0 || rank >= s->pp) return PW_EINVAL;
  if (s->n_actions[rank] == s->cap_[rank]) {
    int nc = s->cap_[rank] ? s->cap_[rank] * 2 : 16;
    pw_action *nv = realloc(s->actions[rank], (size_t)nc * sizeof(pw_action));
    if (!nv) return PW_ENOMEM;
    s->actions[rank] = nv;
    s->cap_[rank] = nc;
  }
  s->actions[rank][s->n_actions[rank]++] = a;
  return 0;
}

int pw_sched_set_rank_text(pw_sched *s, int rank, const char *text, pw_err *err) {
  if (rank < 0 || rank >= s->pp)
    return pw_err_set(err, PW_EINVAL, "", "rank %d outside 0..%d", rank, s->pp - 1);
  pw_action *v;
  int n;
  int rc = pw_actions_parse(text, &v, &n, err);
  if (rc < 0) return rc;
  free(s->actions[rank]);
  s->actions[rank] = v;
  s->n_actions[rank] = n;
  s->cap_[rank] = n;
  return 0;
}

void pw_sched_count(const pw_sched *s, int counts[4]) {
  for (int k = 0; k < 4; k++) counts[k] = 0;
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->n_actions[r]; i++)
      if (s->actions[r][i].kind < 4) counts[s->actions[r][i].kind]++;
}

/* ---- JSON -------------------------------------------------------------- */

json_t *pw_sched_to_json(const pw_sched *s) {
  json_t *j = json_object();
  json_object_set_new(j, "name", json_string(s->name));
  json_object_set_new(j, "pp", json_integer(s->pp));
  json_object_set_new(j, "virtual_stages", json_integer(s->V));
  json_object_set_new(j, "stages", json_integer(s->S));
  json_object_set_new(j, "microbatches", json_integer(s->m));
  json_object_set_new(j, "forward_only", json_boolean(s->forward_only));
  json_t *map = json_array();
  for (int st = 0; st < s->S; st++) json_array_append_new(map, json_integer(s->stage_to_rank[st]));
  json_object_set_new(j, "stage_to_rank", map);
  json_t *ranks = json_array();
  for (int r = 0; r < s->pp; r++) {
    int len = pw_actions_format(s->actions[r], s->n_actions[r], NULL, 0);
    char *buf = malloc((size_t)len + 1);
    if (!buf) {
      json_decref(j);
      json_decref(ranks);
      return NULL;
    }
    pw_actions_format(s->actions[r], s->n_actions[r], buf, (size_t)len + 1);
    json_array_append_new(ranks, json_string(buf));
    free(buf);
  }
  json_object_set_new(j, "ranks", ranks);
  return j;
}

static int get_int(const json_t *j, const char *key, int min, int *out, pw_err *err) {
  json_t *v = json_object_get(j, key);
  if (!json_is_integer(v)) return pw_err_set(err, PW_ESPEC, key, "must be an integer");
  json_int_t x = json_integer_value(v);
  if (x < min || x > INT_MAX)
    return pw_err_set(err, PW_ESPEC, key, "must be >= %d (got %lld)", min, (long long)x);
  *out = (int)x;
  return 0;
}

int pw_sched_from_json(const json_t *j, pw_sched **out, pw_err *err) {
  *out = NULL;
  if (!json_is_object(j)) return pw_err_set(err, PW_ESPEC, "", "a plan must be an object");
  int pp = 0, V = 0, S = 0, m = 0, rc;
  if ((rc = get_int(j, "pp", 1, &pp, err)) < 0) return rc;
  if ((rc = get_int(j, "virtual_stages", 1, &V, err)) < 0) return rc;
  if ((rc = get_int(j, "stages", 1, &S, err)) < 0) return rc;
  if ((rc = get_int(j, "microbatches", 1, &m, err)) < 0) return rc;
  json_t *fo = json_object_get(j, "forward_only");
  if (fo && !json_is_boolean(fo))
    return pw_err_set(err, PW_ESPEC, "forward_only", "must be a boolean");
  json_t *map = json_object_get(j, "stage_to_rank");
  if (!json_is_array(map) || (int)json_array_size(map) != S)
    return pw_err_set(err, PW_ESPEC, "stage_to_rank", "must be an array of %d ranks", S);
  int *st2r = malloc((size_t)S * sizeof(int));
  if (!st2r) return pw_err_set(err, PW_ENOMEM, "", "out of memory");
  for (int st = 0; st < S; st++) {
    json_t *v = json_array_get(map, (size_t)st);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= pp) {
      free(st2r);
      return pw_err_set(err, PW_ESPEC, "stage_to_rank", "entry %d must be a rank in 0..%d", st,
                        pp - 1);
    }
    st2r[st] = (int)json_integer_value(v);
  }
  pw_sched *s;
  rc = pw_sched_new(pp, V, S, m, st2r, fo && json_is_true(fo), &s, err);
  free(st2r);
  if (rc < 0) return rc;
  json_t *name = json_object_get(j, "name");
  if (json_is_string(name)) snprintf(s->name, sizeof s->name, "%s", json_string_value(name));
  json_t *ranks = json_object_get(j, "ranks");
  if (!json_is_array(ranks) || (int)json_array_size(ranks) != pp) {
    pw_sched_free(s);
    return pw_err_set(err, PW_ESPEC, "ranks", "must be an array of %d action lists", pp);
  }
  for (int r = 0; r < pp; r++) {
    json_t *t = json_array_get(ranks, (size_t)r);
    char path[32];
    snprintf(path, sizeof path, "ranks[%d]", r);
    if (!json_is_string(t)) {
      pw_sched_free(s);
      return pw_err_set(err, PW_ESPEC, path, "must be a string of actions");
    }
    rc = pw_sched_set_rank_text(s, r, json_string_value(t), err);
    if (rc < 0) {
      pw_sched_free(s);
      if (rc != PW_ENOMEM) rc = PW_ESPEC;
      if (err) {
        snprintf(err->path, sizeof err->path, "%s", path);
        err->code = rc;
      }
      return rc;
    }
  }
  *out = s;
  return 0;
}

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

/* Drop every non-F action (the forward-only plan, see schedule.h). */
static void strip_to_forward(pw_sched *s) {
  for (int r = 0; r < s->pp; r++) {
    int k = 0;
    for (int i = 0; i < s->n_actions[r]; i++)
      if (s->actions[r][i].kind == PW_ACT_F) {
        s->actions[r][k] = s->actions[r][i];
        s->actions[r][k].flags = 0;
        k++;
      }
    s->n_actions[r] = k;
  }
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
  if (forward_only) strip_to_forward(s);
  *out = s;
  return 0;
}
