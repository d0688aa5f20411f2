/* schedule: actions and their textual form, the plan container and its
 * JSON. The catalogue of the nine schedules (constraints, the table,
 * building a plan) is schedule_catalog.c; the generators it calls live in
 * schedule_flat.c, schedule_interleaved.c and schedule_dualpipev.c, and
 * fill the container through pw_sched_push. Nothing here simulates; sim.c
 * proves plans. */
#include "schedule.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


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

int pw_actions_keep_forwards(pw_action *v, int n) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (v[i].kind == PW_ACT_F) {
      v[k] = v[i];
      v[k++].flags = 0;
    }
  return k;
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
  free(s->pred_first);
  free(s->pred);
  free(s);
}

int pw_sched_preds(const pw_sched *s, int st, int *out) {
  if (!s->pred_first) {
    out[0] = st - 1;
    return st > 0;
  }
  int n = 0;
  for (int j = s->pred_first[st]; j < s->pred_first[st + 1] && n < PW_SCHED_MAX_LINKS; j++) out[n++] = s->pred[j];
  return n;
}

int pw_sched_copy_graph(pw_sched *dst, const pw_sched *src) {
  if (!src->pred_first) return 0;
  int n = src->pred_first[src->S];
  dst->pred_first = malloc(sizeof(int) * (size_t)(src->S + 1));
  dst->pred = malloc(sizeof(int) * (size_t)(n ? n : 1));
  if (!dst->pred_first || !dst->pred) return PW_ENOMEM;
  memcpy(dst->pred_first, src->pred_first, sizeof(int) * (size_t)(src->S + 1));
  memcpy(dst->pred, src->pred, sizeof(int) * (size_t)n);
  return 0;
}

int pw_sched_succs(const pw_sched *s, int st, int *out) {
  if (!s->pred_first) {
    out[0] = st + 1;
    return st + 1 < s->S;
  }
  int n = 0;
  for (int d = st + 1; d < s->S && n < PW_SCHED_MAX_LINKS; d++)
    for (int j = s->pred_first[d]; j < s->pred_first[d + 1]; j++)
      if (s->pred[j] == st) out[n++] = d;
  return n;
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
