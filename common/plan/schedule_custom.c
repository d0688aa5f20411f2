/* schedule_custom: plans written by hand (schedule.h, "custom schedules") —
 * the spec's per-rank lists made into a proven pw_sched, and PyTorch's CSV
 * form of the same lists, both ways. */
#include "schedule.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define CUSTOM_PATH "schedule.custom.ranks"

static char *ranks_text(const pw_action *acts, int n) {
  int len = pw_actions_format(acts, n, NULL, 0);
  char *buf = malloc((size_t)len + 1);
  if (buf) pw_actions_format(acts, n, buf, (size_t)len + 1);
  return buf;
}

void pw_sched_ranks_free(char **ranks, int n) {
  if (!ranks) return;
  for (int r = 0; r < n; r++) free(ranks[r]);
  free(ranks);
}

/* ---- the spec's lists -------------------------------------------------- */

/* Stage -> rank from where the actions are: the first rank (in rank order)
 * to hold a stage owns it, and any other rank naming it is an error. *S is
 * the highest stage + 1; every stage below it needs an owner. */
static int derive_layout(pw_action *const *acts, const int *n, int pp, int m, int **st2r, int *S, pw_err *err) {
  char b1[40], b2[40];
  long total = 0;
  int hi = -1;
  for (int r = 0; r < pp; r++) {
    total += n[r];
    for (int i = 0; i < n[r]; i++) {
      if (acts[r][i].stage > hi) hi = acts[r][i].stage;
      if (acts[r][i].mb >= m) {
        pw_action_format(&acts[r][i], b1, sizeof b1);
        return pw_err_set(err, PW_ESCHEDULE, CUSTOM_PATH,
                          "rank %d #%d: %s: microbatch outside 0..%d (schedule.microbatches is %d)", r, i, b1, m - 1,
                          m);
      }
    }
  }
  if (hi < 0) return pw_err_set(err, PW_ESCHEDULE, CUSTOM_PATH, "the lists hold no actions");
  /* Every stage needs an action: with more stages named than actions,
   * stages 0 .. total already hold a gap, so look no further. */
  int cap = hi < total ? hi + 1 : (int)total + 1;
  int *map = malloc(sizeof(int) * (size_t)cap), *first = malloc(sizeof(int) * (size_t)cap);
  if (!map || !first) {
    free(map);
    free(first);
    return pw_err_set(err, PW_ENOMEM, CUSTOM_PATH, "out of memory");
  }
  for (int st = 0; st < cap; st++) map[st] = -1;
  int rc = 0;
  for (int r = 0; r < pp && !rc; r++)
    for (int i = 0; i < n[r] && !rc; i++) {
      const pw_action *a = &acts[r][i];
      if (a->stage >= cap) continue;
      if (map[a->stage] < 0) {
        map[a->stage] = r;
        first[a->stage] = i;
      } else if (map[a->stage] != r) {
        int o = map[a->stage];
        pw_action_format(a, b1, sizeof b1);
        pw_action_format(&acts[o][first[a->stage]], b2, sizeof b2);
        rc = pw_err_set(err, PW_ESCHEDULE, CUSTOM_PATH,
                        "rank %d #%d: %s is on stage %d, which belongs to rank %d (%s is there): every stage lives on "
                        "exactly one rank",
                        r, i, b1, a->stage, o, b2);
      }
    }
  for (int st = 0; st < cap && !rc; st++)
    if (map[st] < 0)
      rc = pw_err_set(err, PW_ESCHEDULE, CUSTOM_PATH,
                      "stage %d has no actions on any rank (the lists name stages 0..%d, and each needs its actions)",
                      st, hi);
  free(first);
  if (rc) {
    free(map);
    return rc;
  }
  *st2r = map;
  *S = hi + 1;
  return 0;
}

int pw_sched_from_ranks(const char *const *ranks, int pp, int m, int forward_only, pw_sched **out, pw_err *err) {
  *out = NULL;
  if (pp < 1) return pw_err_set(err, PW_ESPEC, "mesh.pp", "must be >= 1 (got %d)", pp);
  if (m < 1) return pw_err_set(err, PW_ESPEC, "schedule.microbatches", "must be >= 1 (got %d)", m);
  pw_action **acts = calloc((size_t)pp, sizeof *acts);
  int *n = calloc((size_t)pp, sizeof(int)), *st2r = NULL, S = 0, rc = 0;
  if (!acts || !n) rc = pw_err_set(err, PW_ENOMEM, CUSTOM_PATH, "out of memory");
  for (int r = 0; r < pp && !rc; r++)
    if ((rc = pw_actions_parse(ranks[r] ? ranks[r] : "", &acts[r], &n[r], err)) < 0 && err) {
      char tmp[sizeof err->msg];
      memcpy(tmp, err->msg, sizeof tmp);
      pw_err_set(err, rc, CUSTOM_PATH, "rank %d: %.400s", r, tmp);
    }
  if (!rc) rc = derive_layout(acts, n, pp, m, &st2r, &S, err);
  /* Every (stage, microbatch) needs its F: fewer actions than that is a
   * plan with gaps, said before the simulator sizes its tables by S x m. */
  long total = 0;
  int top = -1; /* highest microbatch named */
  for (int r = 0; r < pp && !rc; r++) {
    total += n[r];
    for (int i = 0; i < n[r]; i++) top = acts[r][i].mb > top ? acts[r][i].mb : top;
  }
  if (!rc && top + 1 < m)
    rc = pw_err_set(err, PW_ESCHEDULE, CUSTOM_PATH, "the lists name microbatches 0..%d, but schedule.microbatches is %d",
                    top, m);
  if (!rc && total < (long)S * m)
    rc = pw_err_set(err, PW_ESCHEDULE, CUSTOM_PATH,
                    "the lists hold %ld actions, fewer than the %ld forwards alone of %d stages x %d microbatches",
                    total, (long)S * m, S, m);
  if (!rc && S % pp)
    rc = pw_err_set(err, PW_ESCHEDULE, CUSTOM_PATH,
                    "the lists hold %d stages, which is not a multiple of mesh.pp = %d (S = pp x virtual_stages)", S,
                    pp);
  pw_sched *s = NULL;
  if (!rc) rc = pw_sched_new(pp, S / pp, S, m, st2r, forward_only, &s, err);
  for (int r = 0; r < pp && !rc; r++) {
    if (forward_only) n[r] = pw_actions_keep_forwards(acts[r], n[r]);
    free(s->actions[r]);
    s->actions[r] = acts[r];
    s->n_actions[r] = s->cap_[r] = n[r];
    acts[r] = NULL;
  }
  pw_sim_result *res = NULL;
  if (!rc && (rc = pw_sim_run(s, NULL, &res, err)) < 0 && err) {
    char tmp[sizeof err->msg];
    memcpy(tmp, err->msg, sizeof tmp);
    pw_err_set(err, rc, CUSTOM_PATH, "%s", tmp);
  }
  pw_sim_result_free(res);
  for (int r = 0; acts && r < pp; r++) free(acts[r]);
  free(acts);
  free(n);
  free(st2r);
  if (rc) {
    pw_sched_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

json_t *pw_sched_custom_json(const pw_sched *s) {
  json_t *ranks = json_array();
  for (int r = 0; ranks && r < s->pp; r++) {
    char *t = ranks_text(s->actions[r], s->n_actions[r]);
    if (!t || json_array_append_new(ranks, json_string(t))) {
      free(t);
      json_decref(ranks);
      return NULL;
    }
    free(t);
  }
  return ranks ? json_pack("{s:o}", "ranks", ranks) : NULL;
}

/* ---- PyTorch's CSV ----------------------------------------------------- */

static const char kind_chars[4] = {'F', 'B', 'I', 'W'};

char *pw_sched_csv_format(const pw_sched *s) {
  size_t cap = 64, len = 0;
  for (int r = 0; r < s->pp; r++) cap += (size_t)s->n_actions[r] * 48 + 2;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  for (int r = 0; r < s->pp; r++) {
    for (int i = 0; i < s->n_actions[r]; i++) {
      const pw_action *a = &s->actions[r][i];
      const char *sep = i ? "," : "";
      if ((a->flags & PW_ACTION_FUSED) && i + 1 < s->n_actions[r]) {
        const pw_action *b = a + 1;
        len += (size_t)snprintf(buf + len, cap - len, "%s(%dF%d;%d%c%d)OVERLAP_F_B", sep, (int)a->stage, (int)a->mb,
                                (int)b->stage, kind_chars[b->kind & 3], (int)b->mb);
        i++;
      } else {
        len += (size_t)snprintf(buf + len, cap - len, "%s%d%c%d", sep, (int)a->stage, kind_chars[a->kind & 3],
                                (int)a->mb);
      }
    }
    len += (size_t)snprintf(buf + len, cap - len, "\n");
  }
  return buf;
}

/* Growing array of actions for one row. */
typedef struct {
  pw_action *v;
  int n, cap;
} act_vec;

static int vec_push(act_vec *v, pw_action a) {
  if (v->n == v->cap) {
    int nc = v->cap ? 2 * v->cap : 32;
    pw_action *nv = realloc(v->v, sizeof *nv * (size_t)nc);
    if (!nv) return PW_ENOMEM;
    v->v = nv;
    v->cap = nc;
  }
  v->v[v->n++] = a;
  return 0;
}

/* One PyTorch action "<stage><KIND><microbatch>" in [p, e): 1 and *a for a
 * compute action, 0 for a communication one (skipped), -1 if malformed
 * (*why says what). */
static int csv_action(const char *p, const char *e, pw_action *a, const char **why) {
  long st = 0, mb = -1;
  const char *q = p;
  if (q == e || !isdigit((unsigned char)*q)) return *why = "expected a stage number first", -1;
  for (; q < e && isdigit((unsigned char)*q); q++)
    if ((st = st * 10 + (*q - '0')) > 1000000000L) return *why = "stage number too large", -1;
  const char *k = q;
  while (q < e && (isupper((unsigned char)*q) || *q == '_')) q++;
  size_t klen = (size_t)(q - k);
  if (klen == 0) return *why = "expected a kind (F, B, I, W) after the stage", -1;
  if (q < e) {
    if (!isdigit((unsigned char)*q)) return *why = "unexpected character after the kind", -1;
    for (mb = 0; q < e && isdigit((unsigned char)*q); q++)
      if ((mb = mb * 10 + (*q - '0')) > 1000000000L) return *why = "microbatch number too large", -1;
    if (q < e) return *why = "unexpected character after the microbatch", -1;
  }
  for (int i = 0; i < 4; i++)
    if (klen == 1 && *k == kind_chars[i]) {
      if (mb < 0) return *why = "a compute action needs a microbatch number", -1;
      *a = (pw_action){(uint8_t)i, 0, (int32_t)mb, (int32_t)st};
      return 1;
    }
  static const char *const comms[] = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"};
  for (size_t i = 0; i < sizeof comms / sizeof *comms; i++)
    if (strlen(comms[i]) == klen && memcmp(comms[i], k, klen) == 0) return 0;
  return *why = "unknown kind (F, B, I, W, or a communication action)", -1;
}

/* One cell [p, e), trimmed and unquoted: appended to v. */
static int csv_cell(const char *p, const char *e, act_vec *v, const char **why) {
  while (p < e && isspace((unsigned char)*p)) p++;
  while (e > p && isspace((unsigned char)e[-1])) e--;
  if (e - p >= 2 && *p == '"' && e[-1] == '"') p++, e--;
  if (p == e) return 0; /* an idle time step */
  pw_action a, b;
  if (*p != '(') {
    int k = csv_action(p, e, &a, why);
    return k <= 0 ? k : vec_push(v, a) ? (*why = "out of memory", -1) : 0;
  }
  /* "(0F5;7B2)OVERLAP_F_B": a fused pair */
  const char *close = memchr(p, ')', (size_t)(e - p)), *semi = memchr(p, ';', (size_t)(e - p));
  static const char ov[] = "OVERLAP_F_B";
  if (!close || !semi || semi > close || (size_t)(e - close - 1) != strlen(ov) || memcmp(close + 1, ov, strlen(ov)))
    return *why = "a parenthesised cell must be \"(<F action>;<B or I action>)OVERLAP_F_B\"", -1;
  if (csv_action(p + 1, semi, &a, why) != 1 || csv_action(semi + 1, close, &b, why) != 1) return -1;
  if (a.kind != PW_ACT_F || (b.kind != PW_ACT_B && b.kind != PW_ACT_I))
    return *why = "an OVERLAP_F_B pair must be an F then a B or I", -1;
  a.flags = PW_ACTION_FUSED;
  if (vec_push(v, a) || vec_push(v, b)) return *why = "out of memory", -1;
  return 0;
}

int pw_sched_csv_parse(const char *text, char ***ranks, int *n_ranks, pw_err *err) {
  *ranks = NULL;
  *n_ranks = 0;
  int rows = 0;
  for (const char *p = text; *p; p++) rows += *p == '\n';
  size_t tl = strlen(text);
  if (tl && text[tl - 1] != '\n') rows++; /* a last row without its newline */
  if (rows == 0) return pw_err_set(err, PW_EFORMAT, "csv", "no rows: one row of actions per pipeline rank");
  char **out = calloc((size_t)rows, sizeof(char *));
  if (!out) return pw_err_set(err, PW_ENOMEM, "csv", "out of memory");
  act_vec v = {0};
  const char *line = text;
  for (int r = 0; r < rows; r++) {
    const char *end = strchr(line, '\n');
    if (!end) end = line + strlen(line);
    const char *le = end > line && end[-1] == '\r' ? end - 1 : end;
    v.n = 0;
    int cell = 0;
    for (const char *c = line;; cell++) {
      const char *ce = memchr(c, ',', (size_t)(le - c));
      if (!ce) ce = le;
      const char *why = NULL;
      if (csv_cell(c, ce, &v, &why) < 0) {
        int w = (int)(ce - c) < 40 ? (int)(ce - c) : 40;
        int code = why && strcmp(why, "out of memory") == 0 ? PW_ENOMEM : PW_EFORMAT;
        free(v.v);
        pw_sched_ranks_free(out, rows);
        return pw_err_set(err, code, "csv", "row %d (rank %d), cell %d \"%.*s\": %s", r + 1, r, cell + 1, w, c,
                          why ? why : "bad cell");
      }
      if (ce == le) break;
      c = ce + 1;
    }
    if (!(out[r] = ranks_text(v.v, v.n))) {
      free(v.v);
      pw_sched_ranks_free(out, rows);
      return pw_err_set(err, PW_ENOMEM, "csv", "out of memory");
    }
    line = *end ? end + 1 : end;
  }
  free(v.v);
  *ranks = out;
  *n_ranks = rows;
  return 0;
}
