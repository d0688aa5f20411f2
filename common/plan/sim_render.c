/* sim_render: a simulated step as JSON analytics, as a Chrome trace
 * (Perfetto) and as a text grid (sim.h). Presentation only: every number
 * shown here was computed by sim.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static const char *kind_name(int k) {
  static const char *n[4] = {"F", "B", "I", "W"};
  return k >= 0 && k < 4 ? n[k] : "?";
}

json_t *pw_sim_result_json(const pw_sim_result *r) {
  json_t *j = json_object();
  json_object_set_new(j, "schedule", json_string(r->name));
  json_object_set_new(j, "pp", json_integer(r->pp));
  json_object_set_new(j, "virtual_stages", json_integer(r->V));
  json_object_set_new(j, "stages", json_integer(r->S));
  json_object_set_new(j, "microbatches", json_integer(r->m));
  json_object_set_new(j, "forward_only", json_boolean(r->forward_only));
  json_object_set_new(j, "makespan", json_real(r->makespan));
  json_object_set_new(j, "bubble_ratio", json_real(r->bubble_ratio));
  if (r->dp_start) json_object_set_new(j, "step_makespan", json_real(r->step_makespan));
  json_t *ranks = json_array(), *links = json_array(), *tl = json_array();
  for (int k = 0; k < r->pp; k++) {
    json_t *o = json_object();
    json_object_set_new(o, "rank", json_integer(k));
    json_object_set_new(o, "busy", json_real(r->busy[k]));
    json_object_set_new(o, "idle", json_real(r->idle[k]));
    json_object_set_new(o, "peak_activations", json_integer(r->peak_act[k]));
    json_object_set_new(o, "peak_pending_w", json_integer(r->peak_pending_w[k]));
    json_object_set_new(o, "peak_held", json_integer(r->peak_held[k]));
    json_object_set_new(o, "actions", json_integer(r->rank_first[k + 1] - r->rank_first[k]));
    json_array_append_new(ranks, o);
    json_t *row = json_array();
    for (int e = r->rank_first[k]; e < r->rank_first[k + 1]; e++) {
      const pw_sim_event *ev = &r->events[e];
      char b[40];
      pw_action_format(&ev->act, b, sizeof b);
      json_t *x = json_object();
      json_object_set_new(x, "action", json_string(b));
      json_object_set_new(x, "start", json_real(ev->start));
      json_object_set_new(x, "end", json_real(ev->end));
      if (ev->act.flags & PW_ACTION_FUSED) json_object_set_new(x, "fused", json_true());
      json_array_append_new(row, x);
    }
    if (r->dp_start) /* the exchange at the step's end */
      json_array_append_new(row, json_pack("{s:s, s:f, s:f}", "action", "DP", "start", r->dp_start[k], "end",
                                           r->dp_end[k]));
    json_array_append_new(tl, row);
  }
  for (int a = 0; a < r->pp; a++)
    for (int b = 0; b < r->pp; b++) {
      if (!r->link_transfers[a * r->pp + b]) continue;
      json_t *o = json_object();
      json_object_set_new(o, "src", json_integer(a));
      json_object_set_new(o, "dst", json_integer(b));
      json_object_set_new(o, "bytes", json_real(r->link_bytes[a * r->pp + b]));
      json_object_set_new(o, "transfers", json_integer(r->link_transfers[a * r->pp + b]));
      json_array_append_new(links, o);
    }
  json_object_set_new(j, "ranks", ranks);
  json_object_set_new(j, "links", links);
  json_object_set_new(j, "timeline", tl);
  return j;
}

json_t *pw_sim_trace_json(const pw_sim_result *r) {
  json_t *evs = json_array();
  for (int k = 0; k < r->pp; k++) {
    char nm[32];
    snprintf(nm, sizeof nm, "rank %d", k);
    json_t *args = json_object();
    json_object_set_new(args, "name", json_string(nm));
    json_array_append_new(evs, json_pack("{s:s, s:s, s:i, s:i, s:o}", "name", "thread_name", "ph",
                                         "M", "pid", 0, "tid", k, "args", args));
  }
  for (int e = 0; e < r->n_events; e++) {
    const pw_sim_event *ev = &r->events[e];
    char b[40];
    pw_action_format(&ev->act, b, sizeof b);
    json_t *args = json_pack("{s:i, s:i, s:s, s:b}", "mb", (int)ev->act.mb, "stage",
                             (int)ev->act.stage, "kind", kind_name(ev->act.kind), "fused",
                             (ev->act.flags & PW_ACTION_FUSED) != 0 ||
                                 (ev->index > 0 && e > 0 && r->events[e - 1].rank == ev->rank &&
                                  (r->events[e - 1].act.flags & PW_ACTION_FUSED)));
    json_array_append_new(evs, json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:o}", "name", b,
                                         "cat", kind_name(ev->act.kind), "ph", "X", "ts",
                                         ev->start * 1e6, "dur", (ev->end - ev->start) * 1e6,
                                         "pid", 0, "tid", ev->rank, "args", args));
  }
  for (int k = 0; r->dp_start && k < r->pp; k++)
    json_array_append_new(evs, json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i}", "name", "DP", "cat", "DP", "ph", "X",
                                         "ts", r->dp_start[k] * 1e6, "dur", (r->dp_end[k] - r->dp_start[k]) * 1e6,
                                         "pid", 0, "tid", k));
  return json_pack("{s:o, s:s}", "traceEvents", evs, "displayTimeUnit", "ms");
}

/* A growing text buffer. */
typedef struct {
  char *p;
  size_t len, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap * 2 : 256;
    while (nc < b->len + n + 1) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

#define PW_GRID_MAX_COLS 4096

int pw_sched_grid(const pw_sched *s, const pw_sim_result *r, char *buf, size_t cap) {
  pw_sim_result *own = NULL;
  if (!r) {
    int rc = pw_sim_run(s, NULL, &own, NULL);
    if (rc < 0) return rc;
    r = own;
  }
  /* The cell: the smallest positive action duration (coarser when the row
   * would be longer than PW_GRID_MAX_COLS cells). */
  double unit = 0;
  for (int e = 0; e < r->n_events; e++) {
    double d = r->events[e].end - r->events[e].start;
    if (d > 0 && (unit == 0 || d < unit)) unit = d;
  }
  if (unit == 0) unit = 1;
  if (r->makespan / unit > PW_GRID_MAX_COLS) unit = r->makespan / PW_GRID_MAX_COLS;
  int ncols = (int)ceil(r->makespan / unit - 1e-9);
  if (ncols < 0) ncols = 0;
  int width = 1;
  char lab[48];
  for (int e = 0; e < r->n_events; e++) {
    pw_action_format(&r->events[e].act, lab, sizeof lab);
    if (r->V <= 1) *strchr(lab, '@') = '\0';
    int l = (int)strlen(lab);
    if (l > width) width = l;
  }
  int cw = width + 1;
  char *row = malloc((size_t)ncols * cw + 1);
  sbuf out = {0};
  if (!row) {
    pw_sim_result_free(own);
    return PW_ENOMEM;
  }
  char pre[32];
  int rw = snprintf(pre, sizeof pre, "%d", r->pp - 1);
  for (int k = 0; k < r->pp; k++) {
    memset(row, ' ', (size_t)ncols * cw);
    for (int c = 0; c < ncols; c++) row[c * cw] = '.';
    for (int e = r->rank_first[k]; e < r->rank_first[k + 1]; e++) {
      const pw_sim_event *ev = &r->events[e];
      pw_action_format(&ev->act, lab, sizeof lab);
      if (r->V <= 1) *strchr(lab, '@') = '\0';
      int c0 = (int)lround(ev->start / unit), c1 = (int)lround(ev->end / unit);
      if (c1 == c0 && ev->end > ev->start) c1 = c0 + 1;
      for (int c = c0; c < c1 && c < ncols; c++) {
        memset(row + (size_t)c * cw, ' ', (size_t)cw);
        memcpy(row + (size_t)c * cw, lab, strlen(lab));
      }
    }
    int n = snprintf(pre, sizeof pre, "r%-*d | ", rw, k);
    sb_put(&out, pre, (size_t)n);
    size_t len = (size_t)ncols * cw;
    while (len > 0 && row[len - 1] == ' ') len--;
    sb_put(&out, row, len);
    sb_put(&out, "\n", 1);
  }
  free(row);
  pw_sim_result_free(own);
  if (out.oom) {
    free(out.p);
    return PW_ENOMEM;
  }
  if (cap > 0) {
    size_t n = out.len < cap - 1 ? out.len : cap - 1;
    if (n) memcpy(buf, out.p, n);
    buf[n] = '\0';
  }
  free(out.p);
  return (int)out.len;
}
