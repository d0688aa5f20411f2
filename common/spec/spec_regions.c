/* spec_regions: model.regions and model.graph — named sub-models (towers),
 * each a layers list with its own mesh and schedule, joined where towers
 * meet by a fusion layer (docs/contracts.md, "Regions").
 *
 * What the spec alone can judge is judged here: names, the graph (unknown
 * or repeated regions, a region fed by both data and the graph, a cycle,
 * an order that lists a region before one feeding it, more than one region
 * feeding nothing), the layer order rules of each region, and, once the
 * mesh and schedule have parsed, each region's ranks and schedule against
 * the job's. Shapes meeting at a fusion are model.c's: it infers them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec_field.h"
#include "suggest.h"

#define MAX_REGION_LAYERS 10000
#define MAX_MESH 4096

static const char *const fusion_names[] = {"concat", "add"}; /* pw_fusion_kind */

typedef struct {
  int pp, dp, virtual_stages;
} region_mesh;

static const pw__field region_fields[] = {
    PW__STR("name", PW__REQ, PW__ALL, pw_region_spec, name),
    PW__SKIP("input", 0, PW__ALL),
    PW__SKIP("layers", PW__REQ, PW__ALL),
    PW__SKIP("mesh", 0, PW__ALL),
    PW__SKIP("schedule", 0, PW__ALL),
};

static const pw__field rmesh_fields[] = {
    PW__INT("pp", 0, PW__ALL, region_mesh, pp, 1, 1, MAX_MESH),
    PW__INT("dp", PW__NODEF, PW__ALL, region_mesh, dp, 0, 1, MAX_MESH),
    PW__INT("virtual_stages", 0, PW__ALL, region_mesh, virtual_stages, 1, 1, MAX_MESH),
};

static int is_loss(int t) { return t == PW_LAYER_CROSS_ENTROPY || t == PW_LAYER_MSE; }

static int find_region(const pw_model_spec *m, const char *name) {
  for (int r = 0; r < m->n_regions; r++)
    if (strcmp(m->regions[r].name, name) == 0) return r;
  return -1;
}

/* "no region 'x'; did you mean y?" at path. */
static int unknown_region(const pw_model_spec *m, const char *path, const char *name, pw_err *err) {
  const char *names[PW_REGIONS_MAX];
  char sug[96];
  for (int r = 0; r < m->n_regions; r++) names[r] = m->regions[r].name;
  return pw_err_set(err, PW_ESPEC, path, "no region '%s'%s", name,
                    pw_suggest_text(name, names, m->n_regions, "", sug, sizeof sug));
}

static int name_check(const char *name, const char *path, pw_err *err) {
  for (const char *c = name; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_'))
      return pw_err_set(err, PW_ESPEC, path, "'%s': a region name is lowercase letters, digits and '_'", name);
  return 0;
}

/* The order rules of one region's layers (sink: the region ending with the
 * loss), checked once the graph says which region is the sink. */
static int region_layers_check(const pw_region_spec *rg, int ri, int sink, pw_err *err) {
  char path[96];
  int n = rg->n_layer_specs;
  const pw_layer_spec *ls = rg->layers;
  int tokens = rg->has_input && rg->input == PW_INPUT_TOKENS;
  for (int i = 0; i < n; i++) {
    int t = ls[i].type;
    snprintf(path, sizeof path, "model.regions[%d].layers[%d]", ri, i);
    if (is_loss(t) && !(sink && i == n - 1))
      return pw_err_set(err, PW_ESPEC, path, "%s: only the last layer of the last region (the one feeding no "
                        "other) is a loss", pw__layer_type_name(t));
    if (t == PW_LAYER_EMBEDDING && !(tokens && i == 0))
      return pw_err_set(err, PW_ESPEC, path, "embedding: only the first layer of a region reading tokens");
    if (i == 0 && tokens && t != PW_LAYER_EMBEDDING)
      return pw_err_set(err, PW_ESPEC, path, "a region reading tokens begins with an embedding (got %s)",
                        pw__layer_type_name(t));
    if (t == PW_LAYER_STAGE_BOUNDARY &&
        (i == 0 || ls[i - 1].type == PW_LAYER_STAGE_BOUNDARY || i == n - 1 || (sink && i == n - 2)))
      return pw_err_set(err, PW_ESPEC, path, "stage_boundary makes an empty stage or cuts right before the loss");
    if (t == PW_LAYER_STAGE_BOUNDARY && ls[i].stage)
      return pw_err_set(err, PW_ESPEC, path, "stage_boundary: a region's markers take no stage number");
  }
  if (sink && (n == 0 || ls[n - 1].type != PW_LAYER_CROSS_ENTROPY)) {
    snprintf(path, sizeof path, "model.regions[%d].layers", ri);
    return pw_err_set(err, PW_ESPEC, path, "region '%s' feeds no other region, so it ends with the loss "
                      "(cross_entropy)", rg->name);
  }
  return 0;
}

static int region_parse(const json_t *e, int ri, pw_region_spec *rg, pw_err *err) {
  char pre[48], path[96];
  snprintf(pre, sizeof pre, "model.regions[%d]", ri);
  if (!json_is_object(e)) return pw_err_set(err, PW_ESPEC, pre, "must be an object {name, input?, layers, mesh?, schedule?}");
  int rc = pw__fields_parse(e, pre, region_fields, PW__N(region_fields), PW__ALL, "", rg, err);
  snprintf(path, sizeof path, "%s.name", pre);
  if (rc || (rc = name_check(rg->name, path, err))) return rc;
  const json_t *in = json_object_get(e, "input"), *mesh, *sched;
  if (in) {
    snprintf(path, sizeof path, "%s.input", pre);
    if (!json_is_object(in)) return pw_err_set(err, PW_ESPEC, path, "must be {\"kind\": \"tokens\"} or {\"kind\": \"features\", \"dim\": D}");
    if ((rc = pw__input_parse(in, path, &rg->input, &rg->input_dim, err))) return rc;
    rg->has_input = 1;
  }
  const json_t *arr = json_object_get(e, "layers");
  snprintf(path, sizeof path, "%s.layers", pre);
  if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > MAX_REGION_LAYERS)
    return pw_err_set(err, PW_ESPEC, path, "must be an array of 1 .. %d layers", MAX_REGION_LAYERS);
  rg->n_layer_specs = (int)json_array_size(arr);
  if (!(rg->layers = calloc((size_t)rg->n_layer_specs, sizeof *rg->layers)))
    return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  for (int i = 0; i < rg->n_layer_specs; i++) {
    snprintf(path, sizeof path, "%s.layers[%d]", pre, i);
    if ((rc = pw__layer_parse(json_array_get(arr, (size_t)i), path, &rg->layers[i], err))) return rc;
  }
  region_mesh rm = {0};
  snprintf(path, sizeof path, "%s.mesh", pre);
  if ((rc = pw__obj_get(e, pre, "mesh", &mesh, err)) ||
      (rc = pw__fields_parse(mesh, path, rmesh_fields, PW__N(rmesh_fields), PW__ALL, "", &rm, err)))
    return rc;
  rg->pp = rm.pp, rg->dp = rm.dp, rg->virtual_stages = rm.virtual_stages;
  if ((rc = pw__obj_get(e, pre, "schedule", &sched, err))) return rc;
  if (sched) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)sched, key, v) {
      snprintf(path, sizeof path, "%s.schedule.%s", pre, key);
      if (strcmp(key, "name"))
        return pw_err_set(err, PW_ESPEC, path, "%s", strcmp(key, "microbatches") ? "unknown field; a region's schedule has only a name"
                          : "the job's schedule.microbatches counts every region's microbatches (they line up at a fusion)");
      /* the name is resolved with the job's (spec.c, pw__regions_schedules) */
      if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) >= sizeof rg->schedule)
        return pw_err_set(err, PW_ESPEC, path, "must be a schedule name");
      snprintf(rg->schedule, sizeof rg->schedule, "%s", json_string_value(v));
    }
  }
  return 0;
}

/* One entry of model.graph: {"to": R, "from": [R, ...], "fusion": F}. */
static int edge_parse(const json_t *e, int gi, pw_model_spec *m, pw_err *err) {
  char pre[40], path[80];
  snprintf(pre, sizeof pre, "model.graph[%d]", gi);
  if (!json_is_object(e)) return pw_err_set(err, PW_ESPEC, pre, "must be an object {to, from, fusion?}");
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)e, key, v) if (strcmp(key, "to") && strcmp(key, "from") && strcmp(key, "fusion")) {
    snprintf(path, sizeof path, "%s.%s", pre, key);
    return pw_err_set(err, PW_ESPEC, path, "unknown field (an edge has to, from and fusion)");
  }
  const json_t *to = json_object_get(e, "to"), *from = json_object_get(e, "from");
  snprintf(path, sizeof path, "%s.to", pre);
  if (!json_is_string(to)) return pw_err_set(err, PW_ESPEC, path, "required: the name of the region fed");
  int t = find_region(m, json_string_value(to));
  if (t < 0) return unknown_region(m, path, json_string_value(to), err);
  pw_region_spec *rg = &m->regions[t];
  if (rg->has_input)
    return pw_err_set(err, PW_ESPEC, path, "region '%s' reads a data input (model.regions[%d].input): a region "
                      "is fed by data or by the graph, not both", rg->name, t);
  if (rg->n_from) return pw_err_set(err, PW_ESPEC, path, "region '%s' is fed by an earlier graph entry already", rg->name);
  int fusion;
  int rc = pw__enum_get(e, pre, "fusion", fusion_names, PW__N(fusion_names), PW_FUSION_CONCAT, &fusion, err);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s.from", pre);
  if (!json_is_array(from) || json_array_size(from) < 1 || json_array_size(from) > PW_REGIONS_MAX)
    return pw_err_set(err, PW_ESPEC, path, "must be an array of 1 .. %d region names", PW_REGIONS_MAX);
  for (size_t k = 0; k < json_array_size(from); k++) {
    const json_t *f = json_array_get(from, k);
    snprintf(path, sizeof path, "%s.from[%zu]", pre, k);
    if (!json_is_string(f)) return pw_err_set(err, PW_ESPEC, path, "must be a region name");
    int s = find_region(m, json_string_value(f));
    if (s < 0) return unknown_region(m, path, json_string_value(f), err);
    if (s == t) return pw_err_set(err, PW_ESPEC, path, "region '%s' cannot feed itself", rg->name);
    for (int j = 0; j < rg->n_from; j++)
      if (rg->from[j] == s) return pw_err_set(err, PW_ESPEC, path, "region '%s' is listed twice", m->regions[s].name);
    rg->from[rg->n_from++] = s;
  }
  rg->fusion = fusion;
  return 0;
}

/* A cycle through region r, written "a -> b -> a" into buf: 1 found. */
static int cycle_from(const pw_model_spec *m, int r, int *state, int *stack, int depth, char *buf, size_t cap) {
  state[r] = 1;
  stack[depth] = r;
  const pw_region_spec *rg = &m->regions[r];
  for (int k = 0; k < rg->n_from; k++) {
    int s = rg->from[k];
    if (state[s] == 1) {
      /* stack[j + 1] feeds stack[j], and s feeds r = stack[depth]: the
       * flow is s, stack[depth], ..., stack[i] = s */
      int i = depth;
      while (stack[i] != s) i--;
      size_t n = (size_t)snprintf(buf, cap, "%s", m->regions[s].name);
      for (int j = depth; j >= i && n < cap; j--)
        n += (size_t)snprintf(buf + n, cap - n, " -> %s", m->regions[stack[j]].name);
      return 1;
    }
    if (!state[s] && cycle_from(m, s, state, stack, depth + 1, buf, cap)) return 1;
  }
  state[r] = 2;
  return 0;
}

static int graph_check(pw_model_spec *m, pw_err *err) {
  int state[PW_REGIONS_MAX] = {0}, stack[PW_REGIONS_MAX];
  char buf[256];
  for (int r = 0; r < m->n_regions; r++)
    if (!state[r] && cycle_from(m, r, state, stack, 0, buf, sizeof buf))
      return pw_err_set(err, PW_ESPEC, "model.graph", "a cycle: %s (regions feed forward only)", buf);
  int sink = -1, n_sinks = 0;
  for (int r = 0; r < m->n_regions; r++) {
    const pw_region_spec *rg = &m->regions[r];
    char path[48];
    snprintf(path, sizeof path, "model.regions[%d]", r);
    if (!rg->has_input && !rg->n_from)
      return pw_err_set(err, PW_ESPEC, path, "region '%s' has no input and no model.graph entry feeding it", rg->name);
    for (int k = 0; k < rg->n_from; k++)
      if (rg->from[k] > r)
        return pw_err_set(err, PW_ESPEC, path, "region '%s' is listed before '%s', which feeds it: list every "
                          "region after those feeding it", rg->name, m->regions[rg->from[k]].name);
    int feeds = 0;
    for (int q = 0; q < m->n_regions; q++)
      for (int k = 0; k < m->regions[q].n_from; k++) feeds |= m->regions[q].from[k] == r;
    if (!feeds) sink = r, n_sinks++;
  }
  if (n_sinks != 1 || sink != m->n_regions - 1)
    return pw_err_set(err, PW_ESPEC, "model.graph", "%d regions feed no other region; exactly one, the last "
                      "listed (it ends with the loss), may", n_sinks);
  for (int r = 0; r < m->n_regions; r++) {
    int rc = region_layers_check(&m->regions[r], r, r == sink, err);
    if (rc) return rc;
  }
  return 0;
}

int pw__regions_parse(const json_t *o, pw_model_spec *m, pw_err *err) {
  const json_t *arr = json_object_get(o, "regions"), *graph = json_object_get(o, "graph");
  if (!json_is_array(arr) || json_array_size(arr) < 1 || json_array_size(arr) > PW_REGIONS_MAX)
    return pw_err_set(err, PW_ESPEC, "model.regions", "must be an array of 1 .. %d regions", PW_REGIONS_MAX);
  if (!(m->regions = calloc(json_array_size(arr), sizeof *m->regions)))
    return pw_err_set(err, PW_ENOMEM, "model.regions", "out of memory");
  int rc;
  for (size_t i = 0; i < json_array_size(arr); i++) {
    pw_region_spec *rg = &m->regions[m->n_regions++];
    if ((rc = region_parse(json_array_get(arr, i), (int)i, rg, err))) return rc;
    if (find_region(m, rg->name) != (int)i) {
      char path[48];
      snprintf(path, sizeof path, "model.regions[%zu].name", i);
      return pw_err_set(err, PW_ESPEC, path, "'%s' names an earlier region too", rg->name);
    }
  }
  if (graph && !json_is_array(graph)) return pw_err_set(err, PW_ESPEC, "model.graph", "must be an array of {to, from, fusion}");
  for (size_t g = 0; graph && g < json_array_size(graph); g++)
    if ((rc = edge_parse(json_array_get(graph, g), (int)g, m, err))) return rc;
  if ((rc = graph_check(m, err))) return rc;
  /* what the data checks read: token targets; the token region's vocabulary */
  m->input = PW_INPUT_TOKENS;
  m->loss = PW_LOSS_CROSS_ENTROPY;
  for (int r = m->n_regions - 1; r >= 0; r--)
    if (m->regions[r].has_input && m->regions[r].input == PW_INPUT_TOKENS) m->vocab_size = m->regions[r].layers[0].vocab_size;
  return 0;
}

int pw__regions_emit(json_t *o, const pw_model_spec *m) {
  json_t *arr = json_array(), *graph = json_array();
  int bad = json_object_set_new(o, "regions", arr) | json_object_set_new(o, "graph", graph);
  for (int r = 0; !bad && r < m->n_regions; r++) {
    const pw_region_spec *rg = &m->regions[r];
    json_t *e = json_object(), *layers = json_array(), *from;
    bad |= json_array_append_new(arr, e) | json_object_set_new(e, "name", json_string(rg->name)) |
           json_object_set_new(e, "layers", layers);
    if (rg->has_input) bad |= json_object_set_new(e, "input", pw__input_emit(rg->input, rg->input_dim));
    for (int i = 0; !bad && i < rg->n_layer_specs; i++) bad |= json_array_append_new(layers, pw__layer_emit(&rg->layers[i]));
    bad |= json_object_set_new(e, "mesh", json_pack("{s:i, s:i, s:i}", "pp", rg->pp, "dp", rg->dp,
                                                    "virtual_stages", rg->virtual_stages));
    bad |= json_object_set_new(e, "schedule", json_pack("{s:s}", "name", rg->schedule));
    if (!rg->n_from) continue;
    json_t *ge = json_pack("{s:s, s:s, s:[]}", "to", rg->name, "fusion", fusion_names[rg->fusion], "from");
    bad |= json_array_append_new(graph, ge);
    from = ge ? json_object_get(ge, "from") : NULL;
    for (int k = 0; !bad && k < rg->n_from; k++) bad |= json_array_append_new(from, json_string(m->regions[rg->from[k]].name));
  }
  return bad ? -1 : 0;
}

int pw__regions_settle(pw_job *job, const json_t *mesh, pw_err *err) {
  pw_model_spec *m = &job->model;
  if (m->tmpl != PW_TEMPLATE_REGIONS)
    return job->schedule.regions_serial ? pw_err_set(err, PW_ESPEC, "schedule.regions", "only for a regions model "
                                                     "(model.regions)") : 0;
  int ranks = 0, widest = 0;
  char path[64], sum[160] = "";
  size_t n = 0;
  for (int r = 0; r < m->n_regions; r++) {
    pw_region_spec *rg = &m->regions[r];
    snprintf(path, sizeof path, "model.regions[%d].mesh.dp", r);
    if (rg->dp && rg->dp != job->mesh.dp)
      return pw_err_set(err, PW_ESPEC, path, "%d, but mesh.dp is %d: every region has the job's replicas (a "
                        "fusion meets the same microbatches)", rg->dp, job->mesh.dp);
    rg->dp = job->mesh.dp;
    if (!rg->schedule[0]) snprintf(rg->schedule, sizeof rg->schedule, "%s", job->schedule.name);
    ranks += rg->pp;
    if (rg->pp > widest) widest = rg->pp;
    if (n < sizeof sum) n += (size_t)snprintf(sum + n, sizeof sum - n, "%s%s %d", r ? " + " : "", rg->name, rg->pp);
  }
  if (job->schedule.regions_serial) { /* one region after another, on the widest region's ranks */
    if (mesh && json_object_get(mesh, "pp") && job->mesh.pp != widest)
      return pw_err_set(err, PW_ESPEC, "mesh.pp", "%d, but serial regions share the widest region's %d ranks",
                        job->mesh.pp, widest);
    ranks = widest;
  }
  if (mesh && json_object_get(mesh, "pp") && job->mesh.pp != ranks)
    return pw_err_set(err, PW_ESPEC, "mesh.pp", "%d, but the regions run on %d ranks of their own (%s)%s", job->mesh.pp,
                      ranks, sum, job->mesh.pp < ranks ? ": ranks over-subscribed" : "");
  job->mesh.pp = ranks;
  if (job->mesh.virtual_stages != 1 || job->mesh.placement_kind != PW_PLACEMENT_NONE)
    return pw_err_set(err, PW_ESPEC, "mesh", "a regions model sets virtual_stages in each region's mesh and takes "
                      "no placement");
  if (job->schedule.custom_ranks)
    return pw_err_set(err, PW_ESPEC, "schedule.custom", "a regions model runs each region's own schedule");
  if (job->partition.mode != PW_PARTITION_EVEN || job->partition.n_remat || job->partition.remat_all)
    return pw_err_set(err, PW_ESPEC, "partition", "a regions model is cut by each region's stage_boundary markers "
                      "(or evenly within a region): leave partition out");
  return 0;
}
