/* zero3: ZeRO-3's units, runs and pieces (zero3.h). */
#include "zero3.h"

#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "errors.h"

/* Insertion sort of n local parameter ids by arena offset (a layer has a
 * handful). */
static void sort_params(int *p, int n, const pw_prog_layout *L) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && L->param_off[p[j - 1]] > L->param_off[p[j]]; j--) {
      int t = p[j];
      p[j] = p[j - 1], p[j - 1] = t;
    }
}

int pw_z3_units_build(const pw_model *m, const pw_prog_layout *L, pw_z3_units *z) {
  memset(z, 0, sizeof *z);
  if (L->node_hi <= L->node_lo) return 0;
  z->layer_lo = m->nodes[L->node_lo].layer;
  z->n_units = m->nodes[L->node_hi - 1].layer + 1 - z->layer_lo;
  size_t nu = (size_t)z->n_units;
  size_t cap = 2 * (size_t)(L->node_hi - L->node_lo) + 1; /* a w and a b per node at most */
  z->run_lo = calloc(nu + 1, sizeof(int));
  z->par_lo = calloc(nu + 1, sizeof(int));
  z->floats = calloc(nu, sizeof(size_t));
  z->runs = malloc(cap * sizeof *z->runs);
  z->par = malloc(cap * sizeof(int));
  if (!z->run_lo || !z->par_lo || !z->floats || !z->runs || !z->par) return PW_ENOMEM;
  int np = 0, nr = 0;
  for (int u = 0; u < z->n_units; u++) {
    z->par_lo[u] = np, z->run_lo[u] = nr;
    int first = np;
    for (int i = L->node_lo; i < L->node_hi; i++) {
      const pw_node *n = &m->nodes[i];
      if (n->layer != z->layer_lo + u) continue;
      int ids[2] = {n->w, n->b};
      for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        int lp = L->param_local[ids[k]], seen = 0;
        for (int j = first; j < np && !seen; j++) seen = z->par[j] == lp;
        if (!seen) z->par[np++] = lp;
      }
    }
    sort_params(z->par + first, np - first, L);
    size_t at = 0;
    for (int j = first; j < np; j++) {
      size_t lo = L->param_off[z->par[j]], hi = lo + m->params[L->param_model[z->par[j]]].numel;
      if (nr > z->run_lo[u] && z->runs[nr - 1].hi == lo) {
        z->runs[nr - 1].hi = hi;
      } else {
        z->runs[nr] = (pw_z3_run){.lo = lo, .hi = hi, .at = at};
        nr++;
      }
      at += hi - lo;
    }
    z->floats[u] = at;
    if (at > z->max_floats) z->max_floats = at;
  }
  z->par_lo[z->n_units] = np, z->run_lo[z->n_units] = nr;
  return 0;
}

void pw_z3_units_free(pw_z3_units *z) {
  free(z->run_lo), free(z->par_lo), free(z->floats), free(z->runs), free(z->par);
  memset(z, 0, sizeof *z);
}

int pw_z3_pieces(const pw_z3_units *z, int u, size_t lo, size_t hi, pw_z3_piece *out) {
  int n = 0;
  for (int r = z->run_lo[u]; r < z->run_lo[u + 1]; r++) {
    const pw_z3_run *x = &z->runs[r];
    size_t a = x->lo > lo ? x->lo : lo, b = x->hi < hi ? x->hi : hi;
    if (a >= b) continue;
    out[n][0] = x->at + (a - x->lo), out[n][1] = a, out[n][2] = b - a;
    n++;
  }
  return n;
}

size_t pw_z3_unit_part(const pw_z3_units *z, int u, size_t lo, size_t hi) {
  size_t t = 0;
  for (int r = z->run_lo[u]; r < z->run_lo[u + 1]; r++) {
    const pw_z3_run *x = &z->runs[r];
    size_t a = x->lo > lo ? x->lo : lo, b = x->hi < hi ? x->hi : hi;
    if (a < b) t += b - a;
  }
  return t;
}

int pw_z3_max_runs(const pw_z3_units *z) {
  int m = 1;
  for (int u = 0; u < z->n_units; u++)
    if (z->run_lo[u + 1] - z->run_lo[u] > m) m = z->run_lo[u + 1] - z->run_lo[u];
  return m;
}

size_t pw_z3_param_floats(size_t numel, int dp, size_t max_unit) {
  return pw_shard_max(numel, dp) + 2 * PW_Z3_PAGE / sizeof(float) + PW_Z3_RING * max_unit;
}

uint64_t pw_z3_pass_bytes(const pw_z3_units *z, size_t numel, int dp, int me) {
  size_t lo, hi;
  uint64_t t = 0;
  pw_shard_range(numel, dp, me, &lo, &hi);
  for (int u = 0; u < z->n_units; u++) t += (uint64_t)pw_z3_unit_part(z, u, lo, hi);
  return t * (uint64_t)(dp - 1) * sizeof(float);
}

int pw_z3_pass_gathers(const pw_z3_units *z) {
  int n = 0;
  for (int u = 0; u < z->n_units; u++) n += z->floats[u] > 0;
  return n;
}
