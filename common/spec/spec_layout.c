/* spec_layout: the parts of a job spec that say where layers and stages
 * go — partition.stages (mode explicit), mesh.placement, and the
 * stage_boundary hints copied for the partitioner (spec_field.h). Only the
 * form is judged here: layer names are resolved against the model graph and
 * placements against the schedule's layout when the plan is built
 * (common/plan/partition.c, common/plan/placement.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec_field.h"

#define MAX_PLACEMENT (1 << 24) /* pp x virtual_stages at most */
#define MAX_STAGE_NAMES 100000  /* every layer once, with room */

const char *const pw_placement_names[] = {"loop", "v", "contiguous"};
const int pw_n_placement_names = (int)(sizeof pw_placement_names / sizeof pw_placement_names[0]);

int pw__placement_parse(const json_t *mesh, pw_mesh_spec *ms, pw_err *err) {
  const json_t *v = mesh ? json_object_get(mesh, "placement") : NULL;
  ms->placement_kind = PW_PLACEMENT_NONE;
  if (!v) return 0;
  if (json_is_string(v)) {
    int k, rc = pw__enum_get(mesh, "mesh", "placement", pw_placement_names, pw_n_placement_names, -1, &k, err);
    if (rc) return rc;
    ms->placement_kind = PW_PLACEMENT_LOOP + k;
    return 0;
  }
  size_t n = json_array_size(v);
  if (!json_is_array(v) || n == 0)
    return pw_err_set(err, PW_ESPEC, "mesh.placement",
                      "must be a placement name (loop, v, contiguous) or an array of ranks, one per stage");
  if (n > MAX_PLACEMENT)
    return pw_err_set(err, PW_ESPEC, "mesh.placement", "too many entries (%zu > %d)", n, MAX_PLACEMENT);
  ms->placement = malloc(n * sizeof *ms->placement);
  if (!ms->placement) return pw_err_set(err, PW_ENOMEM, "mesh.placement", "out of memory");
  ms->n_placement = (int)n;
  ms->placement_kind = PW_PLACEMENT_ARRAY;
  for (size_t s = 0; s < n; s++) {
    const json_t *e = json_array_get(v, s);
    char path[48];
    snprintf(path, sizeof path, "mesh.placement[%zu]", s);
    if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= ms->pp)
      return pw_err_set(err, PW_ESPEC, path, "must be the rank that runs stage %zu, 0 .. %d (mesh.pp is %d)", s,
                        ms->pp - 1, ms->pp);
    ms->placement[s] = (int)json_integer_value(e);
  }
  return 0;
}

int pw__placement_emit(json_t *mesh, const pw_mesh_spec *ms) {
  if (ms->placement_kind == PW_PLACEMENT_NONE) return 0;
  if (ms->placement_kind != PW_PLACEMENT_ARRAY)
    return json_object_set_new(mesh, "placement", json_string(pw_placement_names[ms->placement_kind - PW_PLACEMENT_LOOP]));
  json_t *a = json_array();
  int bad = json_object_set_new(mesh, "placement", a);
  for (int s = 0; s < ms->n_placement && !bad; s++) bad |= json_array_append_new(a, json_integer(ms->placement[s]));
  return bad;
}

/* The stages' form, in two passes: check and count, then copy. */
int pw__stages_parse(const json_t *a, pw_partition_spec *p, pw_err *err) {
  const char *path0 = "partition.stages";
  char path[64];
  if (!a) return pw_err_set(err, PW_ESPEC, path0, "required with mode explicit: an array of stages, each an array of layer names");
  if (!json_is_array(a) || json_array_size(a) == 0)
    return pw_err_set(err, PW_ESPEC, path0, "must be an array of stages, each an array of layer names");
  size_t S = json_array_size(a), total = 0;
  for (size_t s = 0; s < S; s++) {
    const json_t *st = json_array_get(a, s);
    snprintf(path, sizeof path, "%s[%zu]", path0, s);
    if (!json_is_array(st)) return pw_err_set(err, PW_ESPEC, path, "must be an array of layer names (e.g. [\"embed\", \"blocks.0\"])");
    if (json_array_size(st) == 0) return pw_err_set(err, PW_ESPEC, path, "must list at least one layer (a stage cannot be empty)");
    for (size_t i = 0; i < json_array_size(st); i++) {
      const json_t *v = json_array_get(st, i);
      snprintf(path, sizeof path, "%s[%zu][%zu]", path0, s, i);
      if (!json_is_string(v)) return pw_err_set(err, PW_ESPEC, path, "must be a layer name (a string, as `pipewright plan` lists them)");
      size_t len = strlen(json_string_value(v));
      if (len == 0 || len >= PW_LAYER_NAME_CAP)
        return pw_err_set(err, PW_ESPEC, path, "is not a layer name (empty, or longer than %d characters)", PW_LAYER_NAME_CAP - 1);
      if (++total > MAX_STAGE_NAMES)
        return pw_err_set(err, PW_ESPEC, path0, "too many layer names (more than %d)", MAX_STAGE_NAMES);
    }
  }
  p->first = malloc((S + 1) * sizeof *p->first);
  p->names = calloc(total, sizeof *p->names);
  if (!p->first || !p->names) return pw_err_set(err, PW_ENOMEM, path0, "out of memory");
  p->n_stages = (int)S;
  int k = 0;
  for (size_t s = 0; s < S; s++) {
    const json_t *st = json_array_get(a, s);
    p->first[s] = k;
    for (size_t i = 0; i < json_array_size(st); i++)
      snprintf(p->names[k++], PW_LAYER_NAME_CAP, "%s", json_string_value(json_array_get(st, i)));
  }
  p->first[S] = k;
  return 0;
}

int pw__stages_emit(json_t *part, const pw_partition_spec *p) {
  if (p->mode != PW_PARTITION_EXPLICIT) return 0;
  json_t *a = json_array();
  int bad = json_object_set_new(part, "stages", a);
  for (int s = 0; s < p->n_stages && !bad; s++) {
    json_t *st = json_array();
    bad |= json_array_append_new(a, st);
    for (int k = p->first[s]; k < p->first[s + 1] && !bad; k++) bad |= json_array_append_new(st, json_string(p->names[k]));
  }
  return bad;
}

int pw__hints_collect(const pw_model_spec *m, pw_partition_spec *p, pw_err *err) {
  int marker = 0;
  for (int i = 0; i < m->n_layer_specs; i++) {
    const pw_layer_spec *ls = &m->layers[i];
    if (ls->type != PW_LAYER_STAGE_BOUNDARY) continue;
    if (ls->stage > 0) {
      if (p->mode == PW_PARTITION_MARKERS && ls->stage != marker + 1) {
        char path[64];
        snprintf(path, sizeof path, "model.layers[%d].stage_boundary.stage", i);
        return pw_err_set(err, PW_ESPEC, path,
                          "says stage %d, but with partition.mode markers stage_boundary %d begins stage %d "
                          "(the markers number the stages in order)",
                          ls->stage, marker, marker + 1);
      }
      pw_stage_hint *h = realloc(p->hints, sizeof *h * (size_t)(p->n_hints + 1));
      if (!h) return pw_err_set(err, PW_ENOMEM, "model.layers", "out of memory");
      p->hints = h;
      h[p->n_hints++] = (pw_stage_hint){marker, i, ls->stage};
    }
    marker++;
  }
  return 0;
}

void pw__layout_free(pw_job *job) {
  free(job->mesh.placement);
  free(job->partition.first);
  free(job->partition.names);
  free(job->partition.hints);
  job->mesh.placement = NULL;
  job->mesh.n_placement = 0;
  job->partition.first = NULL;
  job->partition.names = NULL;
  job->partition.n_stages = 0;
  job->partition.hints = NULL;
  job->partition.n_hints = 0;
}
