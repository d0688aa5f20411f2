/* budget: the resource bounds of budget.h — what a spec may ask before it
 * is planned, and what its plan may weigh before a job is accepted. It
 * never plans (the caller does, between the two checks) and never looks
 * at the cluster: the caller folds the workers' memory into the limits. */
#include "budget.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slice.h"
#include "spec_json.h"

void pw_budget_init(pw_budget *b) {
  memset(b, 0, sizeof *b);
  b->max_actions = PW_BUDGET_MAX_ACTIONS;
  b->max_stages = PW_BUDGET_MAX_STAGES;
  b->max_layer_ranks = PW_BUDGET_MAX_LAYER_RANKS;
  b->max_plan_bytes = PW_BUDGET_MAX_PLAN_BYTES;
}

size_t pw_budget_slice_room(size_t message_max, int64_t n_ranks) {
  uint64_t other = 4096 + 128 * (uint64_t)(n_ranks > 0 ? n_ranks : 0);
  return message_max > other ? message_max - (size_t)other : 0;
}

/* Bytes of text once escaped in a JSON string: a backslash before each
 * quote and backslash (canonical JSON holds no raw control characters). */
static size_t escaped_len(const char *t) {
  size_t n = 0;
  for (; *t; t++) n += 1 + (*t == '"' || *t == '\\');
  return n;
}

/* "1.5 GiB": sizes in messages. */
static const char *human(double bytes, char *buf, size_t cap) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, u++;
  snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

/* The bound's factors: virtual stages and actions per (microbatch, stage). */
static void bound_of(const pw_job *job, const char *schedule, int compare, int *V, int *per) {
  *V = job->mesh.virtual_stages;
  *per = 3;
  if (compare) {
    /* pw_plan_compare_json: interleaving schedules get max(2, V), fixed ones their own */
    int n = 0;
    const pw_sched_info *infos = pw_sched_infos(&n);
    for (int i = 0; i < n; i++)
      if (infos[i].min_v > *V) *V = infos[i].min_v;
    if (*V < 2) *V = 2;
    return;
  }
  const pw_sched_info *info = pw_sched_info_find(schedule ? schedule : job->schedule.name);
  if (info && !info->split_backward) *per = 2;
  if (job->mode == PW_MODE_FORWARD) *per = 1;
}

int64_t pw_plan_actions_bound(const pw_job *job, const char *schedule, int compare) {
  int V, per;
  bound_of(job, schedule, compare, &V, &per);
  return (int64_t)job->schedule.microbatches * job->mesh.pp * V * per;
}

int pw_plan_check_budget(const pw_job *job, const char *schedule, int compare, const pw_budget *b, pw_err *err) {
  /* What the store keeps and dispatch parses again: derived fields (a
   * transformer's ffn_hidden = 4 x d_model) are written out there and
   * checked against their own bounds, so check them now. */
  json_t *canon = pw_job_to_json(job);
  if (!canon) return pw_err_set(err, PW_ENOMEM, "", "out of memory");
  pw_job back;
  int rc = pw_job_parse(canon, NULL, &back, err);
  json_decref(canon);
  if (rc) return rc;
  pw_job_free(&back);
  int V, per;
  bound_of(job, schedule, compare, &V, &per);
  int64_t n = (int64_t)job->schedule.microbatches * job->mesh.pp * V * per;
  if (b->max_stages > 0 && (int64_t)job->mesh.pp * V > b->max_stages)
    return pw_err_set(err, PW_EBUDGET, "mesh.pp", "%d ranks x %d virtual stages give %lld stages%s; the limit is %d",
                      job->mesh.pp, V, (long long)job->mesh.pp * V, compare ? " for the largest schedule compared" : "",
                      b->max_stages);
  /* the layers each rank's slice describes: blocks of a template, the
   * entries of a layers list or of every region's */
  int64_t layers = job->model.tmpl == PW_TEMPLATE_LAYERS ? job->model.n_layer_specs : job->model.n_layers;
  for (int k = 0; k < job->model.n_regions; k++) layers += job->model.regions[k].n_layer_specs;
  int64_t ranks = (int64_t)job->mesh.pp * job->mesh.dp * (job->mesh.tp > 0 ? job->mesh.tp : 1);
  if (b->max_layer_ranks > 0 && layers * ranks > b->max_layer_ranks)
    return pw_err_set(err, PW_EBUDGET, job->model.tmpl == PW_TEMPLATE_LAYERS || job->model.n_regions ? "mesh.pp" : "model.n_layers",
                      "%lld layers on %lld ranks (pp %d x dp %d x tp %d): planning describes every layer to every "
                      "rank, %lld in all; the limit is %lld: fewer layers or ranks",
                      (long long)layers, (long long)ranks, job->mesh.pp, job->mesh.dp, job->mesh.tp > 0 ? job->mesh.tp : 1,
                      (long long)(layers * ranks), (long long)b->max_layer_ranks);
  if (b->max_actions > 0 && n > b->max_actions)
    return pw_err_set(err, PW_EBUDGET, "schedule.microbatches",
                      "%d microbatches x %d stages (mesh.pp %d x %d virtual) x %d give %lld actions%s; the limit "
                      "is %lld: fewer microbatches or stages",
                      job->schedule.microbatches, job->mesh.pp * V, job->mesh.pp, V, per, (long long)n,
                      compare ? " for the largest schedule compared" : "", (long long)b->max_actions);
  return 0;
}

/* Which field to change for a rank over its memory: the model when its
 * state (parameters, gradients, AdamW) dominates, else the batch. */
static const char *memory_field(const pw_plan_mem *m) {
  return m->params + m->grads + m->adam + m->dp + m->tied >= m->slots + m->scratch + m->data ? "model"
                                                                                             : "train.batch_size";
}

int pw_plan_check_fit(const pw_job *job, const pw_plan *p, const pw_budget *b, pw_err *err) {
  char h1[32], h2[32];
  if (b->max_rank_memory) {
    for (int r = 0; r < p->pp; r++) {
      const pw_plan_mem *m = &p->mem[r];
      if (m->total <= b->max_rank_memory) continue;
      return pw_err_set(err, PW_EBUDGET, memory_field(m),
                        "pipeline rank %d needs %s (parameters, gradients and AdamW %s, activations %s); the limit "
                        "is %s (%s): a smaller model or batch, or more pipeline stages (mesh.pp)",
                        r, human((double)m->total, h1, sizeof h1),
                        human((double)(m->params + m->grads + m->adam), h2, sizeof h2),
                        human((double)m->slots, (char[32]){0}, 32), human((double)b->max_rank_memory, (char[32]){0}, 32),
                        b->memory_from[0] ? b->memory_from : "the memory limit");
    }
  }
  if (!b->max_plan_bytes && !b->max_slice_bytes) return 0;
  json_t *pj = pw_plan_json(job, p);
  char *text = NULL, sha[PW_SHA256_HEX_LEN + 1];
  int rc = pj ? pw_slice_plan_text(pj, &text, sha) : PW_ENOMEM;
  json_decref(pj);
  if (rc) return pw_err_set(err, PW_ENOMEM, "", "out of memory");
  size_t plan_len = strlen(text);
  free(text);
  if (b->max_plan_bytes && plan_len > b->max_plan_bytes)
    return pw_err_set(err, PW_EBUDGET, "schedule.microbatches",
                      "the plan is %s; the limit is %s: fewer microbatches, stages or layers",
                      human((double)plan_len, h1, sizeof h1), human((double)b->max_plan_bytes, h2, sizeof h2));
  if (!b->max_slice_bytes) return 0;
  /* A replica's slice is its pipeline rank's with other numbers in it
   * (rank, replica): the last replica's, with the largest numbers, are the
   * longest, one per pipeline rank. */
  for (int k = 0; k < p->pp; k++) {
    char hex[PW_SHA256_HEX_LEN + 1];
    int rank = (p->dp - 1) * p->pp + k;
    if ((rc = pw_slice_build(job, p, rank, sha, &text, hex, err))) return rc;
    size_t len = escaped_len(text);
    free(text);
    if (len > b->max_slice_bytes)
      return pw_err_set(err, PW_EBUDGET, len > plan_len / 2 ? "model" : "schedule.microbatches",
                        "rank %d's slice of the plan is %s; one assign message holds at most %s: fewer "
                        "microbatches or a smaller model graph",
                        rank, human((double)len, h1, sizeof h1), human((double)b->max_slice_bytes, h2, sizeof h2));
  }
  return 0;
}
