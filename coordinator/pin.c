/* pin: the CPUs of the ranks of a run that share a host (ctl_int.h's
 * pw_pin_ranks). Ranks of one host left to the scheduler trade cores and
 * meet on one; pinned to disjoint CPUs each keeps its caches and its
 * share. A rank alone on its host keeps its whole mask. All of a host's
 * ranks are pinned or none: pinning some while others float would give
 * the floating ones every CPU, the pinned ones' too. Loop thread only. */
#include <stdio.h>
#include <string.h>

#include "ctl_int.h"
#include "log.h"

static pw_ctl *ctl_of(pw_coord *c) { return c->ctl; }

/* A worker's NUMA nodes (register.numa, "0-7;8-15") into nodes; their count. */
static int parse_nodes(const char *text, pw_cpuset *nodes) {
  int n = 0;
  char buf[PW_CPUSET_TEXT];
  snprintf(buf, sizeof buf, "%s", text);
  for (char *save = NULL, *t = strtok_r(buf, ";", &save); t && n < PW_CPUSET_NODES; t = strtok_r(NULL, ";", &save))
    if (!pw_cpuset_parse(t, &nodes[n], NULL)) n++;
  return n;
}

/* The CPUs other runs' ranks hold on host. */
static void held_elsewhere(pw_coord *c, const pw_jobrt *jr, const char *host, pw_cpuset *used) {
  pw_cpuset_zero(used);
  for (pw_wconn *w = ctl_of(c)->conns; w; w = w->next) {
    pw_cpuset s;
    if (w->job && w->job != jr && w->pinned[0] && !strcmp(w->host, host) && !pw_cpuset_parse(w->pinned, &s, NULL))
      pw_cpuset_or(used, &s);
  }
}

/* Pins the ranks of jr on host (n of them, n >= 2), or none; *why says why not. */
static int pin_host(pw_coord *c, pw_jobrt *jr, const char *host, char *why, size_t cap) {
  static pw_cpuset nodes[PW_CPUSET_NODES]; /* loop thread only: off the stack */
  pw_cpuset used, allowed, got[64];
  int ranks[64], n = 0, want = 0;
  held_elsewhere(c, jr, host, &used);
  for (int r = 0; r < jr->n_ranks; r++)
    if (jr->ranks[r] && !strcmp(jr->ranks[r]->host, host)) {
      if (n == 64) return snprintf(why, cap, "more than 64 ranks on it"), -1;
      ranks[n++] = r;
    }
  for (int k = 0; k < n; k++) {
    pw_wconn *w = jr->ranks[ranks[k]];
    want += w->threads;
    if (!w->cpus[0] || pw_cpuset_parse(w->cpus, &allowed, NULL))
      return snprintf(why, cap, "worker %s did not say which CPUs it may use", w->name), -1;
    int n_nodes = parse_nodes(w->numa, nodes);
    if (pw_cpuset_pick(&allowed, &used, nodes, n_nodes, w->threads, &got[k]))
      return snprintf(why, cap, "its %d ranks want %d CPUs%s, more than are free for them", n, want,
                      k + 1 < n ? " or more" : ""), -1;
    pw_cpuset_or(&used, &got[k]);
  }
  for (int k = 0; k < n; k++) {
    pw_wconn *w = jr->ranks[ranks[k]];
    if (pw_cpuset_format(&got[k], w->pinned, sizeof w->pinned)) w->pinned[0] = 0;
  }
  return n;
}

void pw_pin_ranks(pw_coord *c, pw_jobrt *jr) {
  for (int r = 0; r < jr->n_ranks; r++)
    if (jr->ranks[r]) jr->ranks[r]->pinned[0] = 0;
  for (int r = 0; r < jr->n_ranks; r++) {
    pw_wconn *w = jr->ranks[r];
    if (!w) continue;
    int first = 1, n = 0;
    for (int q = 0; q < r && first; q++) first = !(jr->ranks[q] && !strcmp(jr->ranks[q]->host, w->host));
    for (int q = 0; q < jr->n_ranks; q++) n += jr->ranks[q] && !strcmp(jr->ranks[q]->host, w->host);
    if (!first || n < 2) continue; /* each host once; a rank alone keeps its mask */
    char why[200], list[700] = "";
    int got = pin_host(c, jr, w->host, why, sizeof why);
    if (got < 0) {
      pw_info("job %lld: the ranks on host %s are not pinned: %s (they share its CPUs)", (long long)jr->job, w->host,
              why);
      for (int q = 0; q < jr->n_ranks; q++)
        if (jr->ranks[q] && !strcmp(jr->ranks[q]->host, w->host)) jr->ranks[q]->pinned[0] = 0;
      continue;
    }
    size_t l = 0;
    for (int q = 0; q < jr->n_ranks && l < sizeof list; q++)
      if (jr->ranks[q] && !strcmp(jr->ranks[q]->host, w->host))
        l += (size_t)snprintf(list + l, sizeof list - l, "%srank %d CPUs %s", l ? ", " : "", q, jr->ranks[q]->pinned);
    pw_info("job %lld: host %s: %s", (long long)jr->job, w->host, list);
  }
}
