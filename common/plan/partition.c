/* partition: the three ways of cutting a layer list into stages, and the
 * per-stage accounting (partition.h). */
#include "partition.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *mode_name(pw_partition_mode m) {
  static const char *const names[] = {"even", "markers", "balanced", "explicit"};
  return m >= 0 && m <= PW_PARTITION_EXPLICIT ? names[m] : "even";
}

double pw_layer_cost(const pw_model *m, const pw_partition_spec *ps, int layer) {
  if (ps && ps->layer_times && ps->n_layer_times == m->n_layers) return ps->layer_times[layer];
  const pw_layer *l = &m->layers[layer];
  return l->flops_f + l->flops_i + l->flops_w;
}

/* Bytes crossing a cut before layer c (what layers < c hand to layers >= c). */
static size_t cut_bytes(const pw_model *m, int c) {
  size_t b = 0;
  for (int i = m->layers[c].node_lo; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    for (int k = 0; k < 2; k++) {
      int v = n->in[k];
      if (v < 0 || m->values[v].producer < 0 || m->nodes[m->values[v].producer].layer >= c) continue;
      int seen = 0; /* count a value once even if read twice */
      for (int j = m->layers[c].node_lo; j < i && !seen; j++)
        seen = m->nodes[j].in[0] == v || m->nodes[j].in[1] == v;
      if (!seen && !(k == 1 && n->in[0] == v)) b += pw_value_bytes(&m->values[v], 1);
    }
  }
  return b;
}

static double stage_cost(const pw_model *m, const pw_partition_spec *ps, const double *prefix,
                         const size_t *cutb, int lo, int hi) {
  double c = prefix[hi] - prefix[lo];
  double bc = ps ? ps->byte_cost : 0;
  if (bc > 0) c += bc * (double)((lo > 0 ? cutb[lo] : 0) + (hi < m->n_layers ? cutb[hi] : 0));
  return c;
}

static int cut_allowed(const pw_model *m, int c) { return c > 0 && c < m->n_layers && !m->layers[c].is_loss; }

int pw_partition_from_cuts(const pw_model *m, const pw_partition_spec *ps, const int *cuts, int S,
                           pw_partition *out, pw_err *err) {
  memset(out, 0, sizeof *out);
  if (S < 1 || cuts[0] != 0 || cuts[S] != m->n_layers)
    return pw_err_set(err, PW_EINVAL, "partition", "cuts must start at 0 and end at %d", m->n_layers);
  for (int s = 1; s < S; s++)
    if (cuts[s] <= cuts[s - 1] || !cut_allowed(m, cuts[s]))
      return pw_err_set(err, PW_ESPEC, "partition", "stage %d would be empty or start with the loss (cut at layer %d)",
                        s, cuts[s]);
  out->mode = ps ? ps->mode : PW_PARTITION_EVEN;
  out->n_stages = S;
  out->stages = calloc((size_t)S, sizeof *out->stages);
  int *stage_of_layer = malloc(sizeof(int) * (size_t)m->n_layers);
  if (!out->stages || !stage_of_layer) goto oom;
  for (int s = 0; s < S; s++)
    for (int l = cuts[s]; l < cuts[s + 1]; l++) stage_of_layer[l] = s;
  for (int s = 0; s < S; s++) {
    pw_stage *st = &out->stages[s];
    st->layer_lo = cuts[s];
    st->layer_hi = cuts[s + 1];
    for (int l = st->layer_lo; l < st->layer_hi; l++) {
      st->flops_f += m->layers[l].flops_f;
      st->flops_i += m->layers[l].flops_i;
      st->flops_w += m->layers[l].flops_w;
      st->cost += pw_layer_cost(m, ps, l);
      st->act_bytes += m->layers[l].act_bytes;
    }
  }
  /* Edges: every value read in one stage and produced in another. */
  for (int i = 0; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    int dst = stage_of_layer[n->layer];
    for (int k = 0; k < 2; k++) {
      int v = n->in[k];
      if (v < 0 || m->values[v].producer < 0) continue;
      int src = stage_of_layer[m->nodes[m->values[v].producer].layer];
      if (src == dst) continue;
      int dup = 0;
      for (int e = 0; e < out->n_edges; e++)
        dup |= out->edges[e].value == v && out->edges[e].dst == dst;
      if (dup) continue;
      pw_stage_edge *ne = realloc(out->edges, sizeof *ne * (size_t)(out->n_edges + 1));
      if (!ne) goto oom;
      out->edges = ne;
      size_t bytes = pw_value_bytes(&m->values[v], 1);
      ne[out->n_edges++] = (pw_stage_edge){src, dst, v, bytes};
      out->stages[src].out_bytes += bytes;
      out->stages[dst].in_bytes += bytes;
    }
  }
  if (ps && ps->byte_cost > 0)
    for (int s = 0; s < S; s++)
      out->stages[s].cost += ps->byte_cost * (double)(out->stages[s].in_bytes + out->stages[s].out_bytes);
  /* Parameters: each holder counts its copy; shared ones are listed (a
   * frozen one is not: it has no gradients to sum). */
  for (int p = 0; p < m->n_params; p++) {
    int holders[64], nh = 0;
    for (int i = 0; i < m->n_nodes; i++) {
      const pw_node *n = &m->nodes[i];
      if (n->w != p && n->b != p) continue;
      int s = stage_of_layer[n->layer], seen = 0;
      for (int h = 0; h < nh; h++) seen |= holders[h] == s;
      if (!seen && nh < 64) holders[nh++] = s;
    }
    for (int h = 0; h < nh; h++) out->stages[holders[h]].params += m->params[p].numel;
    if (nh > 1 && !m->params[p].frozen) {
      pw_shared_param *ns = realloc(out->shared, sizeof *ns * (size_t)(out->n_shared + 1));
      if (!ns) goto oom;
      out->shared = ns;
      pw_shared_param *sp = &ns[out->n_shared++];
      memset(sp, 0, sizeof *sp);
      sp->param = p;
      sp->n_holders = nh < 4 ? nh : 4;
      memcpy(sp->holders, holders, sizeof(int) * (size_t)sp->n_holders);
    }
  }
  for (int s = 0; s < S; s++)
    if (out->stages[s].cost > out->max_cost) out->max_cost = out->stages[s].cost;
  free(stage_of_layer);
  return 0;
oom:
  free(stage_of_layer);
  pw_partition_free(out);
  return pw_err_set(err, PW_ENOMEM, "partition", "out of memory");
}

/* even: blocks split evenly; extra blocks go to the middle stages first
 * (the first holds the embedding, the last the head), then the first, then
 * the last. A model without blocks splits its cuttable layers by count. */
static int even_cuts(const pw_model *m, int S, int *cuts, pw_err *err) {
  int b0 = -1, b1 = -1;
  for (int l = 0; l < m->n_layers; l++)
    if (m->layers[l].is_block) {
      if (b0 < 0) b0 = l;
      b1 = l + 1;
    }
  int units_lo, n_units;
  if (b0 >= 0) {
    for (int l = b0; l < b1; l++)
      if (!m->layers[l].is_block)
        return pw_err_set(err, PW_ESPEC, "partition.mode", "even needs one contiguous blocks stack (layer %s interrupts it)",
                          m->layers[l].name);
    units_lo = b0;
    n_units = b1 - b0;
  } else {
    units_lo = 0;
    n_units = m->n_layers;
    while (n_units > 0 && m->layers[n_units - 1].is_loss && n_units > 1) n_units--; /* loss rides with the previous */
  }
  if (n_units < S)
    return pw_err_set(err, PW_ESPEC, "mesh.pp", "even partition: %d %s cannot fill %d stages", n_units,
                      b0 >= 0 ? "blocks" : "layers", S);
  int *per = calloc((size_t)S, sizeof(int));
  if (!per) return pw_err_set(err, PW_ENOMEM, "partition", "out of memory");
  for (int s = 0; s < S; s++) per[s] = n_units / S;
  int extra = n_units % S;
  for (int s = 1; s < S - 1 && extra > 0; s++, extra--) per[s]++;
  if (extra > 0) { per[0]++; extra--; }
  if (extra > 0) { per[S - 1]++; extra--; }
  cuts[0] = 0;
  int pos = units_lo;
  for (int s = 1; s < S; s++) {
    pos += per[s - 1];
    cuts[s] = pos;
  }
  cuts[S] = m->n_layers;
  free(per);
  /* Layers before the stack ride with stage 0: cut positions already
   * start after them, since pos began at units_lo. */
  return 0;
}

static int balanced_cuts(const pw_model *m, const pw_partition_spec *ps, int S, int *cuts, pw_err *err) {
  int L = m->n_layers;
  double *prefix = malloc(sizeof(double) * (size_t)(L + 1));
  size_t *cutb = calloc((size_t)L + 1, sizeof(size_t));
  double *best = malloc(sizeof(double) * (size_t)(S + 1) * (size_t)(L + 1));
  int *arg = malloc(sizeof(int) * (size_t)(S + 1) * (size_t)(L + 1));
  int rc = 0;
  if (!prefix || !cutb || !best || !arg) {
    rc = pw_err_set(err, PW_ENOMEM, "partition", "out of memory");
    goto done;
  }
  prefix[0] = 0;
  for (int l = 0; l < L; l++) prefix[l + 1] = prefix[l] + pw_layer_cost(m, ps, l);
  if (ps && ps->byte_cost > 0)
    for (int c = 1; c < L; c++) cutb[c] = cut_bytes(m, c);
#define BEST(s, j) best[(size_t)(s) * (size_t)(L + 1) + (size_t)(j)]
#define ARG(s, j) arg[(size_t)(s) * (size_t)(L + 1) + (size_t)(j)]
  for (int s = 0; s <= S; s++)
    for (int j = 0; j <= L; j++) BEST(s, j) = DBL_MAX;
  BEST(0, 0) = 0;
  for (int s = 1; s <= S; s++)
    for (int j = s; j <= L; j++) {
      if (j < L && !cut_allowed(m, j)) continue;
      for (int i = s - 1; i < j; i++) {
        if (BEST(s - 1, i) == DBL_MAX || (i > 0 && !cut_allowed(m, i))) continue;
        double c = stage_cost(m, ps, prefix, cutb, i, j);
        double v = BEST(s - 1, i) > c ? BEST(s - 1, i) : c;
        if (v < BEST(s, j)) {
          BEST(s, j) = v;
          ARG(s, j) = i;
        }
      }
    }
  if (BEST(S, L) == DBL_MAX) {
    rc = pw_err_set(err, PW_ESPEC, "mesh.pp", "balanced partition: %d layers cannot fill %d stages", L, S);
    goto done;
  }
  cuts[S] = L;
  for (int s = S; s > 0; s--) cuts[s - 1] = ARG(s, cuts[s]);
#undef BEST
#undef ARG
done:
  free(prefix);
  free(cutb);
  free(best);
  free(arg);
  return rc;
}

/* Each stage_boundary hint against the cuts: the layer after the marker
 * must be the first of the stage it names. */
static int check_hints(const pw_model *m, const pw_partition_spec *ps, const int *cuts, int S, pw_err *err) {
  for (int i = 0; ps && i < ps->n_hints; i++) {
    const pw_stage_hint *h = &ps->hints[i];
    if (h->marker >= m->n_markers) continue; /* not this model's marker (the spec parser pairs them) */
    int at = m->markers[h->marker], k = h->stage, st = 0;
    if (k < S && cuts[k] == at) continue;
    while (st + 1 < S && cuts[st + 1] <= at) st++;
    char path[80];
    snprintf(path, sizeof path, "model.layers[%d].stage_boundary.stage", h->spec_index);
    if (k >= S)
      return pw_err_set(err, PW_ESPEC, path, "says stage %d begins at %s, but the partition (mode %s) has %d stage%s (0 .. %d)",
                        k, m->layers[at].name, mode_name(ps->mode), S, S == 1 ? "" : "s", S - 1);
    return pw_err_set(err, PW_ESPEC, path,
                      "says stage %d begins at %s, but the partition (mode %s) begins stage %d at %s and puts %s on "
                      "stage %d",
                      k, m->layers[at].name, mode_name(ps->mode), k, m->layers[cuts[k]].name, m->layers[at].name, st);
  }
  return 0;
}

int pw_partition_build(const pw_model *m, const pw_partition_spec *ps, int S, pw_partition *out,
                       pw_err *err) {
  memset(out, 0, sizeof *out);
  if (S < 1) return pw_err_set(err, PW_ESPEC, "mesh.pp", "needs at least one stage");
  pw_partition_mode mode = ps ? ps->mode : PW_PARTITION_EVEN;
  if (ps && ps->layer_times && ps->n_layer_times != m->n_layers)
    return pw_err_set(err, PW_ESPEC, "partition.layer_times", "has %d entries but the model has %d layers",
                      ps->n_layer_times, m->n_layers);
  int *cuts = malloc(sizeof(int) * (size_t)(S + 1));
  if (!cuts) return pw_err_set(err, PW_ENOMEM, "partition", "out of memory");
  int rc = 0;
  if (mode == PW_PARTITION_EXPLICIT) {
    rc = pw_partition_explicit_cuts(m, ps, S, cuts, err);
  } else if (S == 1) {
    cuts[0] = 0;
    cuts[1] = m->n_layers;
  } else if (mode == PW_PARTITION_MARKERS) {
    if (m->n_markers + 1 != S)
      rc = pw_err_set(err, PW_ESPEC, "partition.mode",
                      "model has %d stage_boundary marker%s (%d stages) but the mesh needs %d stages",
                      m->n_markers, m->n_markers == 1 ? "" : "s", m->n_markers + 1, S);
    else {
      cuts[0] = 0;
      for (int k = 0; k < m->n_markers; k++) cuts[k + 1] = m->markers[k];
      cuts[S] = m->n_layers;
    }
  } else if (mode == PW_PARTITION_BALANCED) {
    rc = balanced_cuts(m, ps, S, cuts, err);
  } else {
    rc = even_cuts(m, S, cuts, err);
  }
  if (!rc) rc = check_hints(m, ps, cuts, S, err);
  if (!rc) rc = pw_partition_from_cuts(m, ps, cuts, S, out, err);
  if (!rc) out->mode = mode;
  free(cuts);
  return rc;
}

void pw_partition_free(pw_partition *p) {
  free(p->stages);
  free(p->edges);
  free(p->shared);
  memset(p, 0, sizeof *p);
}

json_t *pw_partition_json(const pw_model *m, const pw_partition *p, int seqs) {
  json_t *stages = json_array(), *edges = json_array(), *shared = json_array();
  double k = seqs > 0 ? seqs : 1;
  for (int s = 0; s < p->n_stages; s++) {
    const pw_stage *st = &p->stages[s];
    json_t *names = json_array();
    for (int l = st->layer_lo; l < st->layer_hi; l++) json_array_append_new(names, json_string(m->layers[l].name));
    json_array_append_new(
        stages, json_pack("{s:i, s:o, s:[i,i], s:I, s:f, s:f, s:f, s:f, s:I, s:I, s:I}", "stage", s, "layers", names,
                          "layer_range", st->layer_lo, st->layer_hi, "params", (json_int_t)st->params, "flops_fwd",
                          st->flops_f * k, "flops_bwd_input", st->flops_i * k, "flops_bwd_weight", st->flops_w * k,
                          "cost", st->cost * k, "activation_bytes", (json_int_t)(st->act_bytes * (size_t)k),
                          "input_bytes", (json_int_t)(st->in_bytes * (size_t)k), "output_bytes",
                          (json_int_t)(st->out_bytes * (size_t)k)));
  }
  for (int e = 0; e < p->n_edges; e++)
    json_array_append_new(edges, json_pack("{s:i, s:i, s:I}", "src", p->edges[e].src, "dst", p->edges[e].dst,
                                           "bytes", (json_int_t)(p->edges[e].bytes * (size_t)k)));
  for (int i = 0; i < p->n_shared; i++) {
    json_t *h = json_array();
    for (int j = 0; j < p->shared[i].n_holders; j++) json_array_append_new(h, json_integer(p->shared[i].holders[j]));
    json_array_append_new(shared, json_pack("{s:s, s:o}", "name", m->params[p->shared[i].param].name, "stages", h));
  }
  return json_pack("{s:s, s:i, s:o, s:o, s:o, s:f}", "mode", mode_name(p->mode), "n_stages", p->n_stages, "stages",
                   stages, "edges", edges, "shared_params", shared, "max_cost", p->max_cost * k);
}
