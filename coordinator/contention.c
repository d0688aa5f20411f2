/* contention: which of a job's ranks share a host's cores (contention.h),
 * counted from the registry of connected workers. */
#include "contention.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_int.h"
#include "store_retry.h"

void pw_contention_free(pw_contention *ct) {
  free(ct->host);
  free(ct->threads);
  free(ct->hosts);
  free(ct->cores);
  free(ct->other);
  memset(ct, 0, sizeof *ct);
}

static int host_index(pw_contention *ct, const char *host) {
  for (int h = 0; h < ct->n_hosts; h++)
    if (!strcmp(ct->hosts[h].host, host)) return h;
  pw_cont_host *x = &ct->hosts[ct->n_hosts];
  memset(x, 0, sizeof *x);
  snprintf(x->host, sizeof x->host, "%s", host);
  return ct->n_hosts++;
}

/* Fills ct from the ranks' worker names (NULL: unknown), under c->mu. */
static int contention_of(pw_coord *c, int64_t job, const char *const *names, int n, pw_contention *ct) {
  memset(ct, 0, sizeof *ct);
  ct->n_ranks = n;
  ct->host = calloc((size_t)n + 1, sizeof(int));
  ct->threads = calloc((size_t)n + 1, sizeof(int));
  ct->hosts = calloc((size_t)n + 1, sizeof *ct->hosts);
  ct->cores = calloc((size_t)n + 1, sizeof(int));
  ct->other = calloc((size_t)n + 1, sizeof(int));
  if (!ct->host || !ct->threads || !ct->hosts || !ct->cores || !ct->other) {
    pw_contention_free(ct);
    return PW_ENOMEM;
  }
  pthread_mutex_lock(&c->mu);
  for (int r = 0; r < n; r++) {
    const pw_worker_info *w = NULL;
    for (int i = 0; names[r] && i < c->n_workers && !w; i++)
      if (!strcmp(c->workers[i].name, names[r])) w = &c->workers[i];
    char key[64];
    /* an older worker, or one the registry forgot: a host of its own */
    if (names[r]) /* w, when found, is names[r]'s */
      pw_host_key(key, sizeof key, w ? w->host : NULL, names[r]);
    else /* no worker recorded for the rank */
      snprintf(key, sizeof key, "rank:%d", r);
    int h = host_index(ct, key);
    pw_cont_host *x = &ct->hosts[h];
    ct->host[r] = h;
    ct->threads[r] = w && w->threads > 0 ? w->threads : 1;
    x->threads += ct->threads[r];
    x->n_ranks++;
    int cores = w && w->cores > 0 ? w->cores : ct->threads[r];
    if (cores > x->cores) x->cores = cores;
    if (w && !x->hostname[0]) snprintf(x->hostname, sizeof x->hostname, "%s", w->hostname[0] ? w->hostname : w->name);
  }
  for (int i = 0; i < c->n_workers; i++) { /* other jobs' workers on these hosts */
    const pw_worker_info *w = &c->workers[i];
    if (!w->connected || !w->job || w->job == job || !w->host[0]) continue;
    for (int h = 0; h < ct->n_hosts; h++)
      if (!strcmp(ct->hosts[h].host, w->host)) ct->hosts[h].other += w->threads > 0 ? w->threads : 1;
  }
  pthread_mutex_unlock(&c->mu);
  for (int h = 0; h < ct->n_hosts; h++) ct->cores[h] = ct->hosts[h].cores, ct->other[h] = ct->hosts[h].other;
  return 0;
}

int pw_contention_of_job(pw_coord *c, pw_store *s, int64_t job, pw_contention *out) {
  json_t *run = NULL, *rk;
  memset(out, 0, sizeof *out);
  int rc = pw_store_run_json(s, job, &run, NULL);
  if (rc) return rc;
  json_t *ranks = json_object_get(run, "ranks");
  size_t n = json_array_size(ranks), i;
  const char **names = calloc(n + 1, sizeof *names);
  if (!names) {
    json_decref(run);
    return PW_ENOMEM;
  }
  json_array_foreach(ranks, i, rk) {
    json_int_t r = json_integer_value(json_object_get(rk, "rank"));
    if (r >= 0 && (size_t)r < n) names[r] = json_string_value(json_object_get(rk, "worker"));
  }
  rc = contention_of(c, job, names, (int)n, out);
  free(names);
  json_decref(run);
  return rc;
}

pw_share pw_contention_share(const pw_contention *ct) {
  return (pw_share){.n_ranks = ct->n_ranks, .host = ct->host, .threads = ct->threads, .n_hosts = ct->n_hosts,
                    .cores = ct->cores, .other = ct->other};
}

/* "half a core", "0.67 of a core", "1.5 cores". */
static void cores_text(double x, char *b, size_t cap) {
  if (x > 0.49 && x < 0.51)
    snprintf(b, cap, "half a core");
  else if (x < 1)
    snprintf(b, cap, "%.2g of a core", x);
  else
    snprintf(b, cap, "%.3g cores", x);
}

/* One host's sentence: "4 ranks with 1 thread each share 2 cores on host
 * h1: each rank gets about half a core". */
static void host_message(const pw_contention *ct, int h, char *b, size_t cap) {
  const pw_cont_host *x = &ct->hosts[h];
  int t = -1; /* the ranks' thread count when all have the same */
  for (int r = 0; r < ct->n_ranks; r++)
    if (ct->host[r] == h) t = t < 0 || t == ct->threads[r] ? ct->threads[r] : 0;
  double per = (double)x->cores / (x->threads + x->other); /* of a core, per thread */
  char who[96], other[80] = "", got[48];
  if (x->n_ranks == 1)
    snprintf(who, sizeof who, "1 rank with %d thread%s shares", x->threads, x->threads == 1 ? "" : "s");
  else if (t > 0)
    snprintf(who, sizeof who, "%d ranks with %d thread%s each share", x->n_ranks, t, t == 1 ? "" : "s");
  else
    snprintf(who, sizeof who, "%d ranks with %d threads in all share", x->n_ranks, x->threads);
  if (x->other)
    snprintf(other, sizeof other, " with %d thread%s of other jobs", x->other, x->other == 1 ? "" : "s");
  cores_text(t > 0 ? per * t : per, got, sizeof got);
  snprintf(b, cap, "%s %d core%s%s on host %s: each %s gets about %s", who, x->cores, x->cores == 1 ? "" : "s", other,
           x->hostname[0] ? x->hostname : x->host, t > 0 ? "rank" : "thread", got);
}

json_t *pw_contention_json(const pw_contention *ct) {
  json_t *hosts = json_array();
  char msg[1024] = "", one[320];
  size_t len = 0;
  for (int h = 0; h < ct->n_hosts; h++) {
    const pw_cont_host *x = &ct->hosts[h];
    if (x->threads + x->other <= x->cores) continue;
    json_t *ranks = json_array();
    for (int r = 0; r < ct->n_ranks; r++)
      if (ct->host[r] == h) json_array_append_new(ranks, json_integer(r));
    json_t *o = json_pack("{s:s, s:i, s:o, s:i, s:i, s:f}", "host", x->host, "cores", x->cores, "ranks", ranks,
                          "threads", x->threads, "other_threads", x->other, "share",
                          (double)(x->threads + x->other) / x->cores);
    json_t *hn = x->hostname[0] ? json_string(x->hostname) : NULL; /* NULL: cut inside UTF-8 */
    json_object_set_new(o, "hostname", hn ? hn : json_null());
    json_array_append_new(hosts, o);
    host_message(ct, h, one, sizeof one);
    if (len < sizeof msg) len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%s", len ? "; " : "", one);
  }
  if (!json_array_size(hosts)) {
    json_decref(hosts);
    return NULL;
  }
  json_t *m = json_string(msg);
  return json_pack("{s:o, s:o}", "hosts", hosts, "message", m ? m : json_string("ranks share CPU cores"));
}

void pw_contention_note(pw_coord *c, const pw_jobrt *jr) {
  const char **names = calloc((size_t)jr->n_ranks + 1, sizeof *names);
  pw_contention ct;
  if (!names) return;
  for (int r = 0; r < jr->n_ranks; r++) names[r] = jr->ranks[r] ? jr->ranks[r]->name : NULL;
  int rc = contention_of(c, jr->job, names, jr->n_ranks, &ct);
  free(names);
  if (rc) return;
  json_t *j = pw_contention_json(&ct);
  if (j) {
    pw_write ev = {.kind = PW_W_EVENT, .job = jr->job, .text = "contention",
                   .text2 = json_string_value(json_object_get(j, "message"))};
    pw_write_do(c, &ev, NULL); /* kept when the store fails; logged there */
  }
  json_decref(j);
  pw_contention_free(&ct);
}
