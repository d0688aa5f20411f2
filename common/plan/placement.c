/* placement: relabel a schedule's ranks onto mesh.placement (placement.h). */
#include "placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pw_placement_named(int kind, int pp, int S, int *out) {
  int V = S / pp > 0 ? S / pp : 1;
  for (int s = 0; s < S; s++) {
    int c = s / pp, i = s % pp;
    switch (kind) {
      case PW_PLACEMENT_V: out[s] = c % 2 ? pp - 1 - i : i; break;
      case PW_PLACEMENT_CONTIGUOUS: out[s] = s / V < pp ? s / V : pp - 1; break;
      default: out[s] = i; break;
    }
  }
}

/* "the loop layout", or the layout's stage -> rank list when no name fits. */
static void layout_words(const pw_sched *s, int *tmp, char *buf, size_t cap) {
  for (int k = PW_PLACEMENT_LOOP; k <= PW_PLACEMENT_CONTIGUOUS; k++) {
    pw_placement_named(k, s->pp, s->S, tmp);
    if (memcmp(tmp, s->stage_to_rank, sizeof(int) * (size_t)s->S) == 0) {
      snprintf(buf, cap, "the %s layout", pw_placement_names[k - PW_PLACEMENT_LOOP]);
      return;
    }
  }
  size_t n = (size_t)snprintf(buf, cap, "its layout [");
  for (int st = 0; st < s->S && n + 16 < cap; st++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%d", st ? ", " : "", s->stage_to_rank[st]);
  snprintf(buf + n, n < cap ? cap - n : 0, "%s]", n + 16 < cap ? "" : " ...");
}

/* The error at stage st (why: the reason): path mesh.placement[st] for an
 * array, else mesh.placement naming the placement and where it put st. */
static int refuse(const char *name, int st, int q, const char *why, pw_err *err) {
  if (!name) {
    char path[48];
    snprintf(path, sizeof path, "mesh.placement[%d]", st);
    return pw_err_set(err, PW_ESPEC, path, "%s", why);
  }
  return pw_err_set(err, PW_ESPEC, "mesh.placement", "\"%s\" puts stage %d on rank %d: %s", name, st, q, why);
}

static int place(pw_sched *s, const int *placement, const char *name, pw_err *err) {
  int pp = s->pp, S = s->S;
  /* sigma: old rank -> new; inv: new -> old; the stage that fixed each;
   * then the moved lists' lengths and capacities; a layout's copy */
  int *buf = malloc(sizeof(int) * (size_t)(6 * pp + S));
  pw_action **acts = malloc(sizeof *acts * (size_t)pp);
  if (!buf || !acts) {
    free(buf);
    free(acts);
    return pw_err_set(err, PW_ENOMEM, "mesh.placement", "out of memory");
  }
  int *sigma = buf, *inv = buf + pp, *by_old = buf + 2 * pp, *by_new = buf + 3 * pp, *n = buf + 4 * pp,
      *cap = buf + 5 * pp, *tmp = buf + 6 * pp, rc = 0;
  char why[400], lay[160];
  for (int r = 0; r < pp; r++) sigma[r] = inv[r] = -1;
  for (int st = 0; st < S && !rc; st++) {
    int r = s->stage_to_rank[st], q = placement[st];
    if (q < 0 || q >= pp) {
      snprintf(why, sizeof why, "rank %d is outside 0 .. %d", q, pp - 1);
      rc = refuse(name, st, q, why, err);
    } else if (sigma[r] >= 0 && sigma[r] != q) {
      layout_words(s, tmp, lay, sizeof lay);
      snprintf(why, sizeof why,
               "%s runs stages %d and %d on one rank; this placement puts them on ranks %d and %d — use a placement "
               "of %s or a custom schedule",
               s->name, by_old[r], st, sigma[r], q, lay);
      rc = refuse(name, st, q, why, err);
    } else if (sigma[r] < 0 && inv[q] >= 0) {
      layout_words(s, tmp, lay, sizeof lay);
      snprintf(why, sizeof why,
               "%s runs stages %d and %d on two ranks (%d and %d); this placement puts both on rank %d — use a "
               "placement of %s or a custom schedule",
               s->name, by_new[q], st, inv[q], r, q, lay);
      rc = refuse(name, st, q, why, err);
    } else if (sigma[r] < 0) {
      sigma[r] = q;
      inv[q] = r;
      by_old[r] = by_new[q] = st;
    }
  }
  if (!rc) {
    /* ranks the layout leaves without a stage take the new ranks left over */
    for (int r = 0, q = 0; r < pp; r++) {
      if (sigma[r] >= 0) continue;
      while (inv[q] >= 0) q++;
      sigma[r] = q;
      inv[q] = r;
    }
    for (int r = 0; r < pp; r++) {
      acts[sigma[r]] = s->actions[r];
      n[sigma[r]] = s->n_actions[r];
      cap[sigma[r]] = s->cap_[r];
    }
    memcpy(s->actions, acts, sizeof *acts * (size_t)pp);
    memcpy(s->n_actions, n, sizeof(int) * (size_t)pp);
    memcpy(s->cap_, cap, sizeof(int) * (size_t)pp);
    memcpy(s->stage_to_rank, placement, sizeof(int) * (size_t)S);
  }
  free(acts);
  free(buf);
  return rc;
}

int pw_sched_place(pw_sched *s, const int *placement, pw_err *err) { return place(s, placement, NULL, err); }

int pw_sched_place_mesh(pw_sched *s, const pw_mesh_spec *mesh, pw_err *err) {
  if (mesh->placement_kind == PW_PLACEMENT_NONE) return 0;
  if (mesh->placement_kind == PW_PLACEMENT_ARRAY) {
    if (mesh->n_placement != s->S)
      return pw_err_set(err, PW_ESPEC, "mesh.placement", "lists %d stage%s, but the plan has %d (mesh.pp %d x %d per rank)",
                        mesh->n_placement, mesh->n_placement == 1 ? "" : "s", s->S, s->pp, s->V);
    return place(s, mesh->placement, NULL, err);
  }
  int *named = malloc(sizeof(int) * (size_t)s->S);
  if (!named) return pw_err_set(err, PW_ENOMEM, "mesh.placement", "out of memory");
  pw_placement_named(mesh->placement_kind, s->pp, s->S, named);
  int rc = place(s, named, pw_placement_names[mesh->placement_kind - PW_PLACEMENT_LOOP], err);
  free(named);
  return rc;
}
