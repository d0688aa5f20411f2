/* partition_explicit: mode explicit — the spec's stages of layer names
 * resolved against the model graph into cuts (partition.h). The names are
 * the graph's ("embed", "blocks.3", "head", "layers.5"), so they are
 * resolved here, where the model exists; every error still names the
 * entry's JSON path. */
#include "partition.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suggest.h"

typedef struct {
  const char *name;
  int layer;
} named;

static int by_name(const void *a, const void *b) { return strcmp(((const named *)a)->name, ((const named *)b)->name); }

/* "partition.stages[s][i]" of entry k. */
static void entry_path(const pw_partition_spec *ps, int k, char *buf, size_t cap) {
  int s = 0;
  while (s + 1 < ps->n_stages && ps->first[s + 1] <= k) s++;
  snprintf(buf, cap, "partition.stages[%d][%d]", s, k - ps->first[s]);
}

/* An entry naming no layer: the nearest name, if any is near. */
static int unknown(const pw_model *m, const pw_partition_spec *ps, int k, pw_err *err) {
  char path[64], near[96];
  const char **names = malloc(sizeof *names * (size_t)m->n_layers);
  if (!names) return pw_err_set(err, PW_ENOMEM, "partition.stages", "out of memory");
  for (int l = 0; l < m->n_layers; l++) names[l] = m->layers[l].name;
  entry_path(ps, k, path, sizeof path);
  int rc = pw_err_set(err, PW_ESPEC, path, "no layer \"%s\" in the model (its layers are %s .. %s)%s", ps->names[k],
                      names[0], names[m->n_layers - 1],
                      pw_suggest_text(ps->names[k], names, m->n_layers, "", near, sizeof near));
  free(names);
  return rc;
}

/* Layers lo .. hi-1 are listed nowhere. */
static int missing(const pw_model *m, int lo, int hi, const char *path, pw_err *err) {
  const char *a = m->layers[lo].name, *b = m->layers[hi - 1].name;
  if (hi - lo == 1) return pw_err_set(err, PW_ESPEC, path, "layer \"%s\" is in no stage", a);
  return pw_err_set(err, PW_ESPEC, path, "layers \"%s\"..\"%s\" are in no stage", a, b);
}

/* at[k]: the layer of entry k; pos[l]: the entry listing layer l, or -1. */
static int resolve(const pw_model *m, const pw_partition_spec *ps, int *at, int *pos, pw_err *err) {
  int L = m->n_layers, N = ps->first[ps->n_stages];
  named *idx = malloc(sizeof *idx * (size_t)L);
  if (!idx) return pw_err_set(err, PW_ENOMEM, "partition.stages", "out of memory");
  for (int l = 0; l < L; l++) idx[l] = (named){m->layers[l].name, l};
  qsort(idx, (size_t)L, sizeof *idx, by_name);
  for (int l = 0; l < L; l++) pos[l] = -1;
  int rc = 0;
  for (int k = 0; k < N && !rc; k++) {
    if (k < L && strcmp(ps->names[k], m->layers[k].name) == 0) { /* the usual case: in place */
      at[k] = k;
    } else {
      named key = {ps->names[k], -1};
      const named *hit = bsearch(&key, idx, (size_t)L, sizeof *idx, by_name);
      if (!hit) {
        rc = unknown(m, ps, k, err);
        break;
      }
      at[k] = hit->layer;
    }
    if (pos[at[k]] >= 0) {
      char path[64], prev[64];
      entry_path(ps, k, path, sizeof path);
      entry_path(ps, pos[at[k]], prev, sizeof prev);
      rc = pw_err_set(err, PW_ESPEC, path, "\"%s\" is listed twice (also at %s); every layer is in one stage",
                      ps->names[k], prev);
    }
    pos[at[k]] = k;
  }
  free(idx);
  return rc;
}

int pw_partition_explicit_cuts(const pw_model *m, const pw_partition_spec *ps, int S, int *cuts, pw_err *err) {
  if (!ps || ps->n_stages < 1 || !ps->first || !ps->names)
    return pw_err_set(err, PW_ESPEC, "partition.stages", "required with mode explicit");
  if (ps->n_stages != S)
    return pw_err_set(err, PW_ESPEC, "partition.stages", "lists %d stage%s, but the plan has %d", ps->n_stages,
                      ps->n_stages == 1 ? "" : "s", S);
  int L = m->n_layers, N = ps->first[S];
  int *at = malloc(sizeof(int) * (size_t)(N > 0 ? N : 1)), *pos = malloc(sizeof(int) * (size_t)L);
  int rc = at && pos ? resolve(m, ps, at, pos, err) : pw_err_set(err, PW_ENOMEM, "partition.stages", "out of memory");
  char path[64];
  /* In model order, each layer once: the k-th entry must be the next layer. */
  int next = 0;
  for (int k = 0; k < N && !rc; k++, next++) {
    if (at[k] == next) continue;
    entry_path(ps, k, path, sizeof path);
    if (pos[next] > k) {
      char later[64];
      entry_path(ps, pos[next], later, sizeof later);
      rc = pw_err_set(err, PW_ESPEC, path,
                      "\"%s\" comes before \"%s\" (at %s): the stages list the layers in model order", ps->names[k],
                      m->layers[next].name, later);
    } else {
      int j = next;
      while (j < at[k] && pos[j] < 0) j++;
      rc = missing(m, next, j, path, err);
    }
  }
  if (!rc && next < L) rc = missing(m, next, L, "partition.stages", err);
  for (int s = 0; s < S && !rc; s++) {
    cuts[s] = at[ps->first[s]];
    if (s > 0 && m->layers[cuts[s]].is_loss) {
      snprintf(path, sizeof path, "partition.stages[%d][0]", s);
      rc = pw_err_set(err, PW_ESPEC, path, "\"%s\" holds only the loss: a stage cannot start with it (end stage %d with it)",
                      m->layers[cuts[s]].name, s - 1);
    }
  }
  cuts[S] = L;
  free(at);
  free(pos);
  return rc;
}
