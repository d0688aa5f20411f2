/* lora_export: the files of lora_export.h from a program's parameters. */
#include "lora_export.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora.h"
#include "safetensors.h"

/* The program's parameter holding model parameter id, or NULL. */
static pw_prog_param *param_of(pw_prog *p, int id) {
  for (int i = 0; i < pw_prog_n_params(p); i++)
    if (pw_prog_param_at(p, i)->model_index == id) return pw_prog_param_at(p, i);
  return NULL;
}

static pw_st_tensor tensor_of(const char *name, const pw_param *pm, const float *data) {
  pw_st_tensor t = {.name = name, .dtype = PW_ST_F32, .ndim = pm->ndim, .data = data};
  for (int d = 0; d < pm->ndim; d++) t.shape[d] = pm->shape[d];
  return t;
}

/* The adapted linear layer of lora node n: its name without ".weight". */
static void linear_name(const pw_model *m, const pw_node *n, char *buf, size_t cap) {
  const pw_node *lin = &m->nodes[m->values[n->in[1]].producer];
  const char *w = m->params[lin->w].name;
  snprintf(buf, cap, "%.*s", (int)(strlen(w) - strlen(".weight")), w);
}

static int n_adapted(const pw_model *m) {
  int k = 0;
  for (int i = 0; i < m->n_nodes; i++) k += m->nodes[i].op == PW_OP_LORA;
  return k;
}

int pw_lora_export_adapters(pw_prog *p, const char *dir, pw_err *err) {
  const pw_model *m = pw_prog_model(p);
  int na = n_adapted(m), nt = 0, rc = 0;
  if (!na) return pw_err_set(err, PW_EINVAL, "model.lora", "the model has no LoRA adapters to export");
  pw_st_tensor *ts = calloc((size_t)(2 * na), sizeof *ts);
  char (*names)[PW_PARAM_NAME_MAX + 32] = calloc((size_t)(2 * na), sizeof *names);
  json_t *cfg = json_object(), *targets = json_array();
  if (!ts || !names || !cfg || !targets) rc = pw_err_set(err, PW_ENOMEM, dir, "out of memory");
  int rank = 0;
  double alpha = 0;
  for (int i = 0; !rc && i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    if (n->op != PW_OP_LORA) continue;
    int ids[2] = {n->w, n->b};
    for (int k = 0; k < 2; k++) {
      pw_prog_param *pp = param_of(p, ids[k]);
      snprintf(names[nt], sizeof names[0], "base_model.model.%s", pp->meta->name);
      ts[nt] = tensor_of(names[nt], pp->meta, pp->data);
      nt++;
    }
    char ln[PW_PARAM_NAME_MAX];
    linear_name(m, n, ln, sizeof ln);
    json_array_append_new(targets, json_string(ln));
    rank = n->NH;
    alpha = (double)n->base * n->NH;
  }
  char path[1200];
  if (!rc) {
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    pw_st_meta meta[1] = {{"format", "pt"}};
    rc = pw_st_write(path, ts, nt, meta, 1, err);
  }
  if (!rc) {
    /* PEFT's LoraConfig fields; the rest keep PEFT's defaults */
    json_object_set_new(cfg, "peft_type", json_string("LORA"));
    json_object_set_new(cfg, "r", json_integer(rank));
    json_object_set_new(cfg, "lora_alpha", json_real(alpha));
    json_object_set_new(cfg, "lora_dropout", json_real(0.0));
    json_object_set_new(cfg, "bias", json_string("none"));
    json_object_set_new(cfg, "fan_in_fan_out", json_false());
    json_object_set_new(cfg, "target_modules", json_incref(targets));
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (json_dump_file(cfg, path, JSON_INDENT(2) | JSON_SORT_KEYS))
      rc = pw_err_set(err, PW_EIO, path, "cannot write the adapter config");
  }
  json_decref(cfg);
  json_decref(targets);
  free(ts);
  free(names);
  return rc;
}

int pw_lora_merge(pw_prog *p, const char *path, pw_err *err) {
  const pw_model *m = pw_prog_model(p);
  if (!n_adapted(m)) return pw_err_set(err, PW_EINVAL, "model.lora", "the model has no LoRA adapters to merge");
  int np = pw_prog_n_params(p), nt = 0, rc = 0;
  size_t numel = pw_prog_numel(p);
  float *merged = malloc((numel ? numel : 1) * sizeof(float));
  pw_st_tensor *ts = calloc((size_t)np + 1, sizeof *ts);
  if (!merged || !ts) {
    free(merged);
    free(ts);
    return pw_err_set(err, PW_ENOMEM, path, "out of memory");
  }
  float *base = pw_prog_params(p);
  memcpy(merged, base, numel * sizeof(float));
  for (int i = 0; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    if (n->op != PW_OP_LORA) continue;
    const pw_node *lin = &m->nodes[m->values[n->in[1]].producer];
    float *W = merged + (param_of(p, lin->w)->data - base);
    const float *A = param_of(p, n->w)->data, *B = param_of(p, n->b)->data;
    pw_lora_merge_weight(W, A, B, n->C, n->OC, n->NH, n->base);
  }
  for (int i = 0; i < np; i++) {
    pw_prog_param *pp = pw_prog_param_at(p, i);
    if (pw_param_is_adapter(pp->meta)) continue;
    ts[nt++] = tensor_of(pp->meta->name, pp->meta, merged + (pp->data - base));
  }
  pw_st_meta meta[1] = {{"format", "pt"}};
  rc = pw_st_write(path, ts, nt, meta, 1, err);
  free(merged);
  free(ts);
  return rc;
}
