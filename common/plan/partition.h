/* partition: cut a model's layer list into S = pp x V stages.
 *
 * Modes (pw_partition_spec): `explicit` takes the stages' layer names
 * from the spec; `markers` cuts at the spec's stage_boundary
 * entries; `even` splits the homogeneous `blocks` stack evenly, the layers
 * before it on the first stage and those after it (head, loss) on the
 * last; `balanced` minimises the slowest stage's cost under a cost model —
 * forward + backward FLOPs of its layers (or measured per-layer times),
 * plus a per-byte cost for the activation it sends and receives across its
 * cuts — exactly, by dynamic programming over cut positions. Whatever the
 * mode, a stage_boundary entry that names its stage ({"stage": k}) must
 * begin stage k of the result.
 *
 * Stages are heterogeneous: each has its own layers, parameters and
 * input/output shapes. The stage graph is a DAG (edges from the stage that
 * produces a value to every stage that reads it), not assumed a chain. A
 * parameter read by several stages (tied embeddings) is listed with its
 * holders: each holds a copy and their gradients are summed before the
 * optimizer step. Which rank runs which stage is the schedule's business. */
#ifndef PW_PARTITION_H
#define PW_PARTITION_H

#include <jansson.h>

#include "errors.h"
#include "model.h"
#include "spec.h"

typedef struct {
  int layer_lo, layer_hi;  /* layers [lo, hi) */
  size_t params;           /* parameters held (tied copies included) */
  double flops_f, flops_i, flops_w; /* per sequence */
  double cost;             /* the cost model's value (per sequence) */
  size_t act_bytes;        /* per sequence: saved for backward */
  size_t in_bytes;         /* per sequence: activations received */
  size_t out_bytes;        /* per sequence: activations sent */
} pw_stage;

typedef struct {
  int src, dst;            /* stages */
  int value;               /* model value crossing */
  size_t bytes;            /* per sequence */
} pw_stage_edge;

typedef struct {
  int param;               /* model parameter id */
  int n_holders;
  int holders[4];          /* stages holding a copy */
} pw_shared_param;

typedef struct {
  pw_partition_mode mode;
  int n_stages;
  pw_stage *stages;
  int n_edges;
  pw_stage_edge *edges;
  int n_shared;
  pw_shared_param *shared;
  double max_cost;         /* slowest stage under the cost model */
} pw_partition;

/* Cost of a layer under the spec's model: flops_f + flops_i + flops_w, or
 * the measured time layer_times[i] when given. */
double pw_layer_cost(const pw_model *m, const pw_partition_spec *ps, int layer);

/* Errors: PW_ESPEC naming "partition.mode", "mesh.pp", ... e.g.
 * "model has 1 stage_boundary marker (2 stages) but the mesh needs 4 stages
 *  (pp 2 x virtual_stages 2)". */
PW_MUST_CHECK int pw_partition_build(const pw_model *m, const pw_partition_spec *ps, int n_stages, pw_partition *out,
                       pw_err *err);
/* Mode explicit: ps->names resolved against m's layer names into
 * cuts[0 .. S] (partition_explicit.c). PW_ESPEC naming the entry
 * ("partition.stages[1][0]: \"blocks.3\" comes before \"blocks.2\" ...")
 * for an unknown name (with the nearest), a layer listed twice or out of
 * model order, layers in no stage, a stage that would start with the loss,
 * or a count of stages other than S. */
PW_MUST_CHECK int pw_partition_explicit_cuts(const pw_model *m, const pw_partition_spec *ps, int S, int *cuts,
                                             pw_err *err);
/* Cuts given explicitly: stage s holds layers [cuts[s], cuts[s+1]). */
PW_MUST_CHECK int pw_partition_from_cuts(const pw_model *m, const pw_partition_spec *ps, const int *cuts, int n_stages,
                           pw_partition *out, pw_err *err);
void pw_partition_free(pw_partition *p);

/* {"mode", "stages": [{"stage", "layers": ["embed", ...], "layer_range": [lo, hi],
 *  "params", "flops_fwd", "flops_bwd_input", "flops_bwd_weight", "cost",
 *  "activation_bytes", "input_bytes", "output_bytes"}], "edges": [...],
 *  "shared_params": [{"name", "stages": [...]}], "max_cost"}; per-sequence
 * figures multiplied by seqs (sequences per microbatch). New reference. */
json_t *pw_partition_json(const pw_model *m, const pw_partition *p, int seqs);

#endif
