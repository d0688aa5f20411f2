/* slice: one rank's part of a plan, encoded and decoded (see slice.h).
 * Encoding reads a built pw_plan and never rebuilds any of it; decoding
 * trusts nothing before the hash matches, and after it checks every id it
 * will index with, so a slice from a mismatched build fails here, not in
 * a kernel. */
#include "slice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CANON (JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII)

int pw_slice_plan_text(const json_t *plan_doc, char **text, char hex[PW_SHA256_HEX_LEN + 1]) {
  *text = json_dumps(plan_doc, CANON);
  if (!*text) return PW_ENOMEM;
  pw_sha256_hex(*text, strlen(*text), hex);
  return 0;
}

/* ---- encode ------------------------------------------------------------ */

static json_t *model_json(const pw_model *m) {
  json_t *values = json_array(), *nodes = json_array(), *params = json_array(), *layers = json_array();
  for (int i = 0; i < m->n_values; i++) {
    const pw_value *v = &m->values[i];
    json_array_append_new(values, json_pack("[iiiii]", v->rows, v->width, v->dtype, v->role, v->producer));
  }
  for (int i = 0; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    json_t *e = json_pack("[iiiiiiiiiiiffI]", n->op, n->layer, n->in[0], n->in[1], n->out, n->w, n->b, n->C, n->OC,
                          n->NH, n->T, (double)n->eps, (double)n->base, (json_int_t)n->aux);
    /* the attention options (grouped-query heads, Llama-3's rope scaling)
     * only where a node has them: other slices keep their text */
    int more = n->HD || n->window || n->bidir || n->pad;
    if (e && ((n->NKV && n->NKV != n->NH) || n->rope_factor || more)) {
      json_t *t = json_pack("[ifffi]", n->NKV, (double)n->rope_factor, (double)n->rope_low_freq,
                            (double)n->rope_high_freq, n->rope_orig_max_pos);
      json_array_extend(e, t);
      json_decref(t);
    }
    if (e && more) { /* head width, sliding window, bidirectional, padding token */
      json_t *t = json_pack("[iiii]", n->HD, n->window, n->bidir, n->pad);
      json_array_extend(e, t);
      json_decref(t);
    }
    json_array_append_new(nodes, e);
  }
  for (int i = 0; i < m->n_params; i++) {
    const pw_param *p = &m->params[i];
    json_array_append_new(params, json_pack("[siiiIiifi]", p->name, p->ndim, p->shape[0], p->shape[1],
                                            (json_int_t)p->numel, p->decay, p->init, (double)p->init_std, p->frozen));
  }
  for (int i = 0; i < m->n_layers; i++) {
    const pw_layer *l = &m->layers[i];
    json_array_append_new(layers, json_pack("[siiii]", l->name, l->node_lo, l->node_hi, l->is_block, l->is_loss));
  }
  const pw_data_shape *d = &m->data;
  json_t *j = json_pack("{s:i, s:o, s:o, s:o, s:o, s:i, s:i, s:i, s:i, s:[iiiiii]}", "seq_len", m->seq_len, "values",
                        values, "nodes", nodes, "params", params, "layers", layers, "input_value", m->input_value,
                        "target_value", m->target_value, "loss_value", m->loss_value, "feature_value",
                        m->feature_value, "data", d->vocab_size, d->seq_len, d->in_dim, d->out_dim, d->tokens,
                        d->feature_dim);
  /* masked LM, labeled sequences (BERT): K and the padding id, only there */
  if (j && (d->mlm_predictions > 0 || (d->tokens && d->out_dim > 0)) &&
      json_object_set_new(j, "data_bert", json_pack("[ii]", d->mlm_predictions, d->pad_token))) {
    json_decref(j);
    return NULL;
  }
  return j;
}

static int local_to(const pw_plan *p, int prank, int stage) { return p->sched->stage_to_rank[stage] == prank; }

static json_t *partition_json(const pw_plan *p, int prank) {
  json_t *ranges = json_array(), *edges = json_array(), *shared = json_array();
  for (int s = 0; s < p->S; s++)
    json_array_append_new(ranges, json_pack("[ii]", p->part.stages[s].layer_lo, p->part.stages[s].layer_hi));
  for (int e = 0; e < p->part.n_edges; e++) {
    const pw_stage_edge *ed = &p->part.edges[e];
    if (local_to(p, prank, ed->src) || local_to(p, prank, ed->dst))
      json_array_append_new(edges, json_pack("[iiiI]", ed->src, ed->dst, ed->value, (json_int_t)ed->bytes));
  }
  for (int k = 0; k < p->part.n_shared; k++) {
    const pw_shared_param *sp = &p->part.shared[k];
    json_t *h = json_array();
    for (int j = 0; j < sp->n_holders; j++) json_array_append_new(h, json_integer(sp->holders[j]));
    json_array_append_new(shared, json_pack("[io]", sp->param, h));
  }
  return json_pack("{s:o, s:o, s:o}", "stage_layers", ranges, "edges", edges, "shared", shared);
}

static json_t *train_json(const pw_job *job) {
  const pw_train_spec *t = &job->train;
  const pw_optim_spec *o = &t->optim;
  json_t *opt = json_pack("{s:i, s:f, s:f, s:i, s:f, s:f, s:f, s:f, s:f}", "kind", o->kind, "lr", o->lr, "min_lr",
                          o->min_lr, "warmup_steps", o->warmup_steps, "beta1", o->beta1, "beta2", o->beta2, "eps",
                          o->eps, "weight_decay", o->weight_decay, "momentum", o->momentum);
  /* The seed as text: it is unsigned 64-bit, JSON integers here are signed. */
  char seed[24];
  snprintf(seed, sizeof seed, "%llu", t->seed);
  json_t *tj = json_pack("{s:i, s:i, s:s, s:f, s:i, s:i, s:i, s:i, s:i, s:i, s:o}", "steps", t->steps, "batch_size",
                        t->batch_size, "seed", seed, "grad_clip", t->grad_clip, "checkpoint_every", t->checkpoint_every,
                        "eval_batches", t->eval_batches, "eval_every", t->eval_every, "on_nonfinite", t->on_nonfinite,
                        "snapshot_every", t->snapshot_every, "precision", t->precision, "optimizer", opt);
  if (tj && t->zero) json_object_set_new(tj, "zero", json_integer(t->zero)); /* absent: 0, as before */
  return tj;
}

int pw_slice_build(const pw_job *job, const pw_plan *p, int rank, const char *plan_sha256, char **text,
                   char hex[PW_SHA256_HEX_LEN + 1], pw_err *err) {
  *text = NULL;
  int tp = p->tp > 1 ? p->tp : 1;
  if (rank < 0 || rank >= p->pp * p->dp * tp)
    return pw_err_set(err, PW_EINVAL, "rank", "%d is not a rank of a %d x %d x %d mesh", rank, p->pp, p->dp, tp);
  int prank = rank / tp % p->pp;
  json_t *local = json_array(), *s2r = json_array(), *acts = json_array();
  for (int s = 0; s < p->S; s++) {
    json_array_append_new(s2r, json_integer(p->sched->stage_to_rank[s]));
    if (local_to(p, prank, s))
      json_array_append_new(local, json_pack("{s:i, s:i, s:i}", "stage", s, "peak_slots", p->peak_slots[s],
                                                    "n_work", p->n_work[s]));
  }
  for (int i = 0; i < p->sched->n_actions[prank]; i++) {
    const pw_action *a = &p->sched->actions[prank][i];
    json_array_append_new(acts, json_pack("[iiii]", a->kind, a->flags, a->mb, a->stage));
  }
  json_t *sched = json_pack("{s:s, s:i, s:o, s:o}", "name", p->sched->name, "forward_only", p->sched->forward_only,
                            "stage_to_rank", s2r, "actions", acts);
  const pw_data_spec *d = &job->data;
  json_t *body = json_pack(
      "{s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:{s:i, s:s, s:s, s:i, s:f, s:i}, "
      "s:o, s:o, s:o, s:o, s:I}",
      "version", PW_SLICE_VERSION, "plan_sha256", plan_sha256, "rank", rank, "pipeline_rank", prank, "replica",
      rank / tp / p->pp, "tp", tp, "tp_rank", rank % tp, "pp", p->pp, "dp", p->dp, "virtual_stages", p->V, "stages", p->S, "microbatches", p->m,
      "microbatch_size", p->mb_size, "mode", job->mode, "train", train_json(job), "data", "kind", d->kind, "path",
      d->path, "dataset", d->dataset, "sampler", d->sampler, "eval_fraction", d->eval_fraction, "keys", d->keys,
      "model", model_json(&p->model),
      "partition", partition_json(p, prank), "schedule", sched, "local_stages", local, "memory_budget",
      (json_int_t)p->mem[prank].total);
  if (!body) return pw_err_set(err, PW_ENOMEM, "slice", "out of memory (or a value JSON cannot hold)");
  if (d->mask_token >= 0 && json_object_set_new(json_object_get(body, "data"), "mask_token", json_integer(d->mask_token))) {
    json_decref(body);
    return pw_err_set(err, PW_ENOMEM, "slice", "out of memory");
  }
  if (job->init.checkpoint[0] &&
      json_object_set_new(body, "init", json_pack("{s:s, s:s}", "checkpoint", job->init.checkpoint, "optimizer",
                                                  job->init.optimizer_checkpoint))) {
    json_decref(body);
    return pw_err_set(err, PW_ENOMEM, "slice", "out of memory");
  }
  *text = json_dumps(body, CANON);
  json_decref(body);
  if (!*text) return pw_err_set(err, PW_ENOMEM, "slice", "out of memory");
  pw_sha256_hex(*text, strlen(*text), hex);
  return 0;
}

/* ---- decode ------------------------------------------------------------ */

/* json_unpack_ex with the failure named by path. */
static int unpack(pw_err *err, const char *path, json_t *j, const char *fmt, ...) {
  json_error_t je;
  va_list ap;
  va_start(ap, fmt);
  int rc = json_vunpack_ex(j, &je, JSON_STRICT, fmt, ap);
  va_end(ap);
  return rc ? pw_err_set(err, PW_EPROTO, path, "%s", je.text) : 0;
}

static int bad(pw_err *err, const char *path, int i, const char *why) {
  return pw_err_set(err, PW_EPROTO, path, "entry %d: %s", i, why);
}

/* a in [lo, hi) */
static int in(long long a, long long lo, long long hi) { return a >= lo && a < hi; }

static int array_of(pw_err *err, const char *path, json_t *a, size_t elem, void **out, int *n) {
  if (!json_is_array(a)) return pw_err_set(err, PW_EPROTO, path, "must be an array");
  *n = (int)json_array_size(a);
  *out = calloc(*n ? (size_t)*n : 1, elem);
  return *out ? 0 : pw_err_set(err, PW_ENOMEM, path, "out of memory");
}

static int decode_model(json_t *j, pw_model *m, pw_err *err) {
  json_t *values, *nodes, *params, *layers;
  pw_data_shape *d = &m->data;
  int rc = unpack(err, "slice.model", j, "{s:i, s:o, s:o, s:o, s:o, s:i, s:i, s:i, s:i, s:[iiiiii], s?[ii]}",
                  "seq_len", &m->seq_len, "values", &values, "nodes", &nodes, "params", &params, "layers", &layers,
                  "input_value", &m->input_value, "target_value", &m->target_value, "loss_value", &m->loss_value,
                  "feature_value", &m->feature_value, "data", &d->vocab_size, &d->seq_len, &d->in_dim, &d->out_dim,
                  &d->tokens, &d->feature_dim, "data_bert", &d->mlm_predictions, &d->pad_token);
  if (!rc && json_object_get(j, "data_bert") &&
      (d->mlm_predictions < 0 || d->mlm_predictions > d->seq_len || d->pad_token < -1 || d->pad_token >= d->vocab_size))
    return pw_err_set(err, PW_EPROTO, "slice.model.data_bert", "masked positions or padding id out of range");
  if (rc || (rc = array_of(err, "slice.model.values", values, sizeof *m->values, (void **)&m->values, &m->n_values)) ||
      (rc = array_of(err, "slice.model.nodes", nodes, sizeof *m->nodes, (void **)&m->nodes, &m->n_nodes)) ||
      (rc = array_of(err, "slice.model.params", params, sizeof *m->params, (void **)&m->params, &m->n_params)) ||
      (rc = array_of(err, "slice.model.layers", layers, sizeof *m->layers, (void **)&m->layers, &m->n_layers)))
    return rc;
  int nv = m->n_values, nn = m->n_nodes, np = m->n_params, nl = m->n_layers;
  for (int i = 0; i < nv; i++) {
    pw_value *v = &m->values[i];
    int dt, role;
    if ((rc = unpack(err, "slice.model.values", json_array_get(values, (size_t)i), "[iiiii]", &v->rows, &v->width,
                     &dt, &role, &v->producer)))
      return rc;
    if (!in(dt, 0, 2) || !in(role, 0, 4) || !in(v->producer, -1, nn) || v->rows < 0 || v->width < 0)
      return bad(err, "slice.model.values", i, "dtype, role, producer or shape out of range");
    v->dtype = (uint8_t)dt, v->role = (uint8_t)role;
  }
  for (int i = 0; i < nn; i++) {
    pw_node *n = &m->nodes[i];
    int op;
    double eps, base;
    json_int_t aux;
    json_t *e = json_array_get(nodes, (size_t)i);
    double rf = 0, rl = 0, rh = 0;
    if ((rc = json_array_size(e) == 23
                  ? unpack(err, "slice.model.nodes", e, "[iiiiiiiiiiiFFIiFFFiiiii]", &op, &n->layer, &n->in[0],
                           &n->in[1], &n->out, &n->w, &n->b, &n->C, &n->OC, &n->NH, &n->T, &eps, &base, &aux,
                           &n->NKV, &rf, &rl, &rh, &n->rope_orig_max_pos, &n->HD, &n->window, &n->bidir, &n->pad)
              : json_array_size(e) == 19
                  ? unpack(err, "slice.model.nodes", e, "[iiiiiiiiiiiFFIiFFFi]", &op, &n->layer, &n->in[0], &n->in[1],
                           &n->out, &n->w, &n->b, &n->C, &n->OC, &n->NH, &n->T, &eps, &base, &aux, &n->NKV, &rf, &rl,
                           &rh, &n->rope_orig_max_pos)
                  : unpack(err, "slice.model.nodes", e, "[iiiiiiiiiiiFFI]", &op, &n->layer, &n->in[0], &n->in[1],
                           &n->out, &n->w, &n->b, &n->C, &n->OC, &n->NH, &n->T, &eps, &base, &aux)))
      return rc;
    n->rope_factor = (float)rf, n->rope_low_freq = (float)rl, n->rope_high_freq = (float)rh;
    if (!in(op, 0, PW_OP__COUNT) || !in(n->layer, 0, nl) || !in(n->in[0], -1, nv) || !in(n->in[1], -1, nv) ||
        !in(n->out, 0, nv) || !in(n->w, -1, np) || !in(n->b, -1, np) || aux < 0 || n->HD < 0 || n->window < 0 ||
        !in(n->bidir, 0, 2))
      return bad(err, "slice.model.nodes", i, "op, layer, value or parameter id out of range");
    n->op = (uint8_t)op, n->eps = (float)eps, n->base = (float)base, n->aux = (size_t)aux;
  }
  for (int i = 0; i < np; i++) {
    pw_param *p = &m->params[i];
    const char *name;
    json_int_t numel;
    int init, frozen;
    double std;
    if ((rc = unpack(err, "slice.model.params", json_array_get(params, (size_t)i), "[siiiIiiFi]", &name, &p->ndim,
                     &p->shape[0], &p->shape[1], &numel, &p->decay, &init, &std, &frozen)))
      return rc;
    if (strlen(name) >= sizeof p->name || !in(p->ndim, 1, 3) || numel < 0 || !in(init, 0, 4) || !in(frozen, 0, 2))
      return bad(err, "slice.model.params", i, "name, ndim, size or init kind out of range");
    snprintf(p->name, sizeof p->name, "%s", name);
    p->numel = (size_t)numel, p->init = (uint8_t)init, p->init_std = (float)std, p->frozen = (uint8_t)frozen;
  }
  for (int i = 0; i < nl; i++) {
    pw_layer *l = &m->layers[i];
    const char *name;
    if ((rc = unpack(err, "slice.model.layers", json_array_get(layers, (size_t)i), "[siiii]", &name, &l->node_lo,
                     &l->node_hi, &l->is_block, &l->is_loss)))
      return rc;
    if (strlen(name) >= sizeof l->name || !in(l->node_lo, 0, nn + 1) || !in(l->node_hi, l->node_lo, nn + 1))
      return bad(err, "slice.model.layers", i, "name or node range out of range");
    snprintf(l->name, sizeof l->name, "%s", name);
    l->spec_index = -1;
  }
  if (!in(m->input_value, -1, nv) || !in(m->target_value, -1, nv) || !in(m->loss_value, -1, nv) ||
      !in(m->feature_value, -1, nv) || d->feature_dim < 0)
    return pw_err_set(err, PW_EPROTO, "slice.model", "input, target, loss or feature value out of range");
  return 0;
}

static int decode_partition(json_t *j, int S, pw_partition *pt, int n_layers, int n_values, int n_params,
                            pw_err *err) {
  json_t *ranges, *edges, *shared;
  int rc = unpack(err, "slice.partition", j, "{s:o, s:o, s:o}", "stage_layers", &ranges, "edges", &edges, "shared",
                  &shared);
  if (rc || (rc = array_of(err, "slice.partition.stage_layers", ranges, sizeof *pt->stages, (void **)&pt->stages,
                           &pt->n_stages)) ||
      (rc = array_of(err, "slice.partition.edges", edges, sizeof *pt->edges, (void **)&pt->edges, &pt->n_edges)) ||
      (rc = array_of(err, "slice.partition.shared", shared, sizeof *pt->shared, (void **)&pt->shared,
                     &pt->n_shared)))
    return rc;
  if (pt->n_stages != S)
    return pw_err_set(err, PW_EPROTO, "slice.partition.stage_layers", "%d ranges for %d stages", pt->n_stages, S);
  for (int s = 0; s < S; s++) {
    pw_stage *st = &pt->stages[s];
    if ((rc = unpack(err, "slice.partition.stage_layers", json_array_get(ranges, (size_t)s), "[ii]", &st->layer_lo,
                     &st->layer_hi)))
      return rc;
    if (!in(st->layer_lo, 0, n_layers) || !in(st->layer_hi, st->layer_lo + 1, n_layers + 1))
      return bad(err, "slice.partition.stage_layers", s, "layer range out of range");
  }
  for (int e = 0; e < pt->n_edges; e++) {
    pw_stage_edge *ed = &pt->edges[e];
    json_int_t bytes;
    if ((rc = unpack(err, "slice.partition.edges", json_array_get(edges, (size_t)e), "[iiiI]", &ed->src, &ed->dst,
                     &ed->value, &bytes)))
      return rc;
    if (!in(ed->src, 0, S) || !in(ed->dst, 0, S) || !in(ed->value, 0, n_values) || bytes < 0)
      return bad(err, "slice.partition.edges", e, "stage or value out of range");
    ed->bytes = (size_t)bytes;
  }
  for (int k = 0; k < pt->n_shared; k++) {
    pw_shared_param *sp = &pt->shared[k];
    json_t *h;
    if ((rc = unpack(err, "slice.partition.shared", json_array_get(shared, (size_t)k), "[io]", &sp->param, &h)))
      return rc;
    sp->n_holders = (int)json_array_size(h);
    if (!in(sp->param, 0, n_params) || !json_is_array(h) || !in(sp->n_holders, 1, 5))
      return bad(err, "slice.partition.shared", k, "parameter or holder count out of range");
    for (int i = 0; i < sp->n_holders; i++) {
      json_t *x = json_array_get(h, (size_t)i);
      sp->holders[i] = (int)json_integer_value(x);
      if (!json_is_integer(x) || !in(sp->holders[i], 0, S))
        return bad(err, "slice.partition.shared", k, "holder stage out of range");
    }
  }
  pt->mode = PW_PARTITION_EVEN; /* the worker does not look at how the cuts were chosen */
  return 0;
}

static int decode_sched(json_t *j, pw_slice *s, pw_err *err) {
  const char *name;
  int fwd;
  json_t *s2r_j, *acts;
  int rc = unpack(err, "slice.schedule", j, "{s:s, s:i, s:o, s:o}", "name", &name, "forward_only", &fwd,
                  "stage_to_rank", &s2r_j, "actions", &acts);
  if (rc) return rc;
  if (!json_is_array(s2r_j) || (int)json_array_size(s2r_j) != s->S || !json_is_array(acts))
    return pw_err_set(err, PW_EPROTO, "slice.schedule", "stage_to_rank must list %d stages; actions an array", s->S);
  int *s2r = malloc(sizeof(int) * (size_t)s->S);
  if (!s2r) return pw_err_set(err, PW_ENOMEM, "slice.schedule", "out of memory");
  for (int st = 0; st < s->S; st++) s2r[st] = (int)json_integer_value(json_array_get(s2r_j, (size_t)st));
  rc = pw_sched_new(s->pp, s->V, s->S, s->m, s2r, fwd, &s->sched, err);
  free(s2r);
  if (rc) {
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err ? err->msg : "bad shape");
    return pw_err_set(err, PW_EPROTO, "slice.schedule", "%s", why);
  }
  snprintf(s->sched->name, sizeof s->sched->name, "%s", name);
  for (size_t i = 0; i < json_array_size(acts); i++) {
    int kind, flags, mb, stage;
    if ((rc = unpack(err, "slice.schedule.actions", json_array_get(acts, i), "[iiii]", &kind, &flags, &mb, &stage)))
      return rc;
    if (!in(kind, 0, 4) || !in(flags, 0, 2) || !in(mb, 0, s->m) || !in(stage, 0, s->S) ||
        s->sched->stage_to_rank[stage] != s->prank)
      return bad(err, "slice.schedule.actions", (int)i, "kind, microbatch or stage out of range, or not this rank's");
    pw_action a = {.kind = (uint8_t)kind, .flags = (uint8_t)flags, .mb = mb, .stage = stage};
    if ((rc = pw_sched_push(s->sched, s->prank, a))) return pw_err_set(err, rc, "slice.schedule", "out of memory");
  }
  return 0;
}

static int decode_body(json_t *b, pw_slice *s, pw_err *err) {
  int version, mode, dkind, sampler;
  const char *plan_sha, *seed, *path, *dataset;
  json_t *train, *opt, *model, *part, *sched, *local, *init = NULL;
  json_int_t budget;
  pw_train_spec *t = &s->train;
  pw_optim_spec *o = &t->optim;
  s->data.mask_token = -1; /* absent: none */
  int rc = unpack(err, "slice", b,
                  "{s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:{s:i, s:s, s:s, s:i, s:F, s:i, "
                  "s?i}, s:o, s:o, s:o, s:o, s:I, s?o}",
                  "version", &version, "plan_sha256", &plan_sha, "rank", &s->rank, "pipeline_rank", &s->prank,
                  "replica", &s->replica, "tp", &s->tp, "tp_rank", &s->tp_rank, "pp", &s->pp, "dp", &s->dp, "virtual_stages", &s->V, "stages", &s->S,
                  "microbatches", &s->m, "microbatch_size", &s->mb_size, "mode", &mode, "train", &train, "data",
                  "kind", &dkind, "path", &path, "dataset", &dataset, "sampler", &sampler, "eval_fraction", &s->data.eval_fraction,
                  "keys", &s->data.keys, "mask_token", &s->data.mask_token, "model", &model, "partition", &part, "schedule", &sched, "local_stages", &local, "memory_budget",
                  &budget, "init", &init);
  if (rc) return rc;
  if (version != PW_SLICE_VERSION)
    return pw_err_set(err, PW_EPROTO, "slice.version", "%d, this worker reads version %d", version, PW_SLICE_VERSION);
  if (s->pp < 1 || s->dp < 1 || s->V < 1 || s->S < 1 || s->m < 1 || s->mb_size < 1 || !in(s->prank, 0, s->pp) ||
      !in(s->replica, 0, s->dp) || !in(s->tp, 1, 4097) || !in(s->tp_rank, 0, s->tp) ||
      s->rank != (s->replica * s->pp + s->prank) * s->tp + s->tp_rank || budget < 0 || !in(mode, 0, PW_MODE_SERVE + 1) ||
      !in(dkind, 0, PW_DATA_LABELED + 1) || s->data.mask_token < -1 || !in(sampler, 0, 2) || s->data.keys < 0 || strlen(plan_sha) != PW_SHA256_HEX_LEN ||
      strlen(path) >= sizeof s->data.path || (dataset[0] && !pw_data_id_valid(dataset)))
    return pw_err_set(err, PW_EPROTO, "slice", "mesh, rank, mode, data or plan hash out of range");
  snprintf(s->plan_sha256, sizeof s->plan_sha256, "%s", plan_sha);
  snprintf(s->data.path, sizeof s->data.path, "%s", path);
  snprintf(s->data.dataset, sizeof s->data.dataset, "%s", dataset);
  if (init) {
    const char *ck, *optck;
    if ((rc = unpack(err, "slice.init", init, "{s:s, s:s}", "checkpoint", &ck, "optimizer", &optck))) return rc;
    if (!pw_data_id_valid(ck) || (optck[0] && !pw_data_id_valid(optck)))
      return pw_err_set(err, PW_EPROTO, "slice.init", "the weights ids must be 64 lowercase hex digits");
    snprintf(s->init_sha256, sizeof s->init_sha256, "%s", ck);
    snprintf(s->init_optim_sha256, sizeof s->init_optim_sha256, "%s", optck);
  }
  s->data.kind = (pw_data_kind)dkind, s->data.sampler = (pw_sampler_kind)sampler;
  s->mode = (pw_mode)mode;
  s->mem_budget = (size_t)budget;
  int okind;
  if ((rc = unpack(err, "slice.train", train, "{s:i, s:i, s:s, s:F, s:i, s:i, s:i, s:i, s:i, s?i, s:i, s:o}", "steps",
                   &t->steps, "batch_size", &t->batch_size, "seed", &seed, "grad_clip", &t->grad_clip,
                   "checkpoint_every", &t->checkpoint_every, "eval_batches", &t->eval_batches, "eval_every",
                   &t->eval_every, "on_nonfinite", &t->on_nonfinite, "snapshot_every", &t->snapshot_every, "zero",
                   &t->zero, "precision", &t->precision, "optimizer", &opt)) ||
      (rc = unpack(err, "slice.train.optimizer", opt, "{s:i, s:F, s:F, s:i, s:F, s:F, s:F, s:F, s:F}", "kind", &okind,
                   "lr", &o->lr, "min_lr", &o->min_lr, "warmup_steps", &o->warmup_steps, "beta1", &o->beta1, "beta2",
                   &o->beta2, "eps", &o->eps, "weight_decay", &o->weight_decay, "momentum", &o->momentum)))
    return rc;
  char *end;
  t->seed = strtoull(seed, &end, 10);
  if (!*seed || *end || !in(okind, 0, 2) || !in(t->on_nonfinite, 0, 2) || !in(t->zero, 0, 4) || !in(t->precision, 0, 2) || t->snapshot_every < 0 || t->eval_every < 0 ||
      t->eval_batches < 1 || t->batch_size != s->mb_size * s->m * s->dp)
    return pw_err_set(err, PW_EPROTO, "slice.train", "seed, optimizer, eval counts or batch size (%d != %d x %d x %d) bad",
                      t->batch_size, s->mb_size, s->m, s->dp);
  o->kind = (pw_opt_kind)okind;
  if ((rc = decode_model(model, &s->model, err)) ||
      (rc = decode_partition(part, s->S, &s->part, s->model.n_layers, s->model.n_values, s->model.n_params, err)) ||
      (rc = decode_sched(sched, s, err)) ||
      (rc = array_of(err, "slice.local_stages", local, sizeof(int), (void **)&s->local_stage, &s->n_local)))
    return rc;
  if (!(s->peak_slots = calloc(s->n_local ? (size_t)s->n_local : 1, sizeof(int))) ||
      !(s->n_work = calloc(s->n_local ? (size_t)s->n_local : 1, sizeof(int))))
    return pw_err_set(err, PW_ENOMEM, "slice", "out of memory");
  int want = 0;
  for (int st = 0; st < s->S; st++) want += s->sched->stage_to_rank[st] == s->prank;
  if (s->n_local != want || s->n_local < 1)
    return pw_err_set(err, PW_EPROTO, "slice.local_stages", "%d stages; the schedule puts %d on pipeline rank %d",
                      s->n_local, want, s->prank);
  for (int i = 0; i < s->n_local; i++) {
    int *st = &s->local_stage[i];
    if ((rc = unpack(err, "slice.local_stages", json_array_get(local, (size_t)i), "{s:i, s:i, s:i}", "stage", st,
                     "peak_slots", &s->peak_slots[i], "n_work", &s->n_work[i])))
      return rc;
    if (!in(*st, 0, s->S) || s->sched->stage_to_rank[*st] != s->prank || (i && *st <= st[-1]) ||
        s->peak_slots[i] < 1 || !in(s->n_work[i], 0, s->m + 1))
      return bad(err, "slice.local_stages", i, "not this rank's stage, out of order, no slots or bad n_work");
  }
  return 0;
}

int pw_slice_decode(const char *text, size_t len, const char *sha256_hex, pw_slice *out, pw_err *err) {
  memset(out, 0, sizeof *out);
  if (!text) return pw_err_set(err, PW_EPROTO, "slice", "is required");
  char got[PW_SHA256_HEX_LEN + 1];
  pw_sha256_hex(text, len, got);
  if (!sha256_hex || strcmp(got, sha256_hex))
    return pw_err_set(err, PW_EPROTO, "slice_sha256",
                      "hash mismatch: the slice received hashes to %s, the coordinator sent %.64s; refusing it", got,
                      sha256_hex ? sha256_hex : "none");
  json_error_t je;
  json_t *b = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!b) return pw_err_set(err, PW_EPROTO, "slice", "invalid JSON at byte %d: %s", je.position, je.text);
  int rc = decode_body(b, out, err);
  json_decref(b);
  if (rc) pw_slice_free(out);
  return rc;
}

void pw_slice_free(pw_slice *s) {
  pw_model_free(&s->model);
  pw_partition_free(&s->part);
  pw_sched_free(s->sched);
  free(s->local_stage);
  free(s->peak_slots);
  free(s->n_work);
  memset(s, 0, sizeof *s);
}
