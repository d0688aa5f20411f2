/* slice: what one worker needs of a run's plan, made by the coordinator
 * from the plan it built once, so no worker re-partitions, re-plans or
 * parses the model spec.
 *
 * A slice holds, for one rank ((replica * pp + pipeline rank) * tp + tp
 * rank: the tp members of a stage group are neighbours):
 *   - the compiled model graph (pw_model: values, nodes, parameter table
 *     with each parameter's frozen flag from train.trainable, layers). The WHOLE graph, not only its stages' nodes: prog.c indexes
 *     values, nodes and parameters by their model-wide ids and finds a
 *     stage's output ports by scanning every other node for readers, so a
 *     renumbered sub-graph would need a second id space in prog.c. Shipping
 *     the graph is a few hundred bytes per layer; the parameter DATA is
 *     never shipped (each program draws it from (seed, name), so a rank's
 *     parameters are bit for bit those of the single-process trainer);
 *   - the partition as far as the rank uses it: every stage's layer range,
 *     the edges into and out of its stages, the whole tied-parameter table;
 *   - its stages, each with the activation slots its program grows to
 *     (pw_plan.peak_slots) and, recomputing ones, their work buffers
 *     (pw_plan.n_work), and the memory budget of its pipeline rank
 *     (pw_plan_mem.total);
 *   - its action list (only its own), stage -> rank, pp, V, S, m;
 *   - the training config (mode, train: optimizer, lr schedule, clipping,
 *     steps, checkpoint_every, eval_every and eval_batches, seed, batch
 *     size; train.trainable arrives as the parameters' frozen flags), the
 *     microbatch size, dp
 *     and its replica, the data spec, and the init weights' ids;
 *   - plan_sha256: SHA-256 of the plan's canonical text (pw_slice_plan_text:
 *     what the coordinator stores in runs.plan), naming the plan it is cut
 *     from.
 * What belongs to one dispatch rather than to the plan — the peers' data
 * addresses, steps and start step, the checkpoint to resume from, tracing
 * — travels next to the slice in the assign message (control.h), so the
 * same plan keeps the same hash whichever workers run it.
 *
 * Integrity. The body is canonical JSON text (compact, keys sorted) and
 * travels as a JSON *string* in the assign message ("slice"), next to
 * "slice_sha256", the lowercase hex SHA-256 of exactly those bytes. The
 * worker hashes the bytes it received BEFORE parsing them
 * (pw_slice_decode), so any changed byte — even one that would still parse
 * to the same numbers — is refused with PW_EPROTO naming the mismatch; the
 * body carries plan_sha256, so a slice cannot be moved to another plan
 * without changing its own hash. Enum values (ops, roles, init kinds,
 * optimizer) travel as integers: PW_PROTO_VERSION covers them. */
#ifndef PW_SLICE_H
#define PW_SLICE_H

#include <jansson.h>
#include <stddef.h>

#include "errors.h"
#include "model.h"
#include "partition.h"
#include "plan.h"
#include "schedule.h"
#include "sha256.h"
#include "spec.h"

#define PW_SLICE_VERSION 10 /* 2: data.dataset; 3: init; 4: train.snapshot_every; 5: train.eval_every; 6: local_stages' n_work; 7: the parameters' frozen flags; 8: model.feature_value, data's feature_dim and keys (regions); 9: train.precision; 10: tp, tp_rank */

typedef struct {
  char plan_sha256[PW_SHA256_HEX_LEN + 1];
  int rank, prank, replica;     /* global rank = (replica * pp + prank) * tp + tp_rank */
  int tp, tp_rank;              /* tensor-parallel ranks per stage, and this one's place among them */
  int pp, dp, V, S, m;
  int mb_size;                  /* sequences per microbatch (per replica) */
  pw_mode mode;
  pw_train_spec train;
  pw_data_spec data;
  /* "init": the stored weights the parameters start from (their sha256, ""
   * for none: drawn from the seed) and the optimizer state carried with
   * them ("" for none: fresh) */
  char init_sha256[PW_SHA256_HEX_LEN + 1];
  char init_optim_sha256[PW_SHA256_HEX_LEN + 1];
  pw_model model;               /* the whole compiled graph (see above) */
  pw_partition part;            /* n_stages = S; stages: layer ranges only
                                   (costs 0); edges touching this rank's
                                   stages; the whole shared table */
  pw_sched *sched;              /* stage_to_rank of every stage; only this
                                   pipeline rank's action list is filled */
  int n_local;                  /* stages this rank runs, ascending */
  int *local_stage;             /* [n_local] global stage ids */
  int *peak_slots;              /* [n_local] slots each stage's program grows to */
  int *n_work;                  /* [n_local] remat: work buffers (pw_plan.n_work); 0 = no remat */
  size_t mem_budget;            /* bytes the plan gives this pipeline rank */
} pw_slice;

/* The canonical text of a plan document (pw_plan_json: compact, keys
 * sorted) in *text (malloc'd; the caller frees it) and its SHA-256 hex.
 * The coordinator stores exactly this text. 0 or PW_ENOMEM. */
PW_MUST_CHECK int pw_slice_plan_text(const json_t *plan_doc, char **text, char hex[PW_SHA256_HEX_LEN + 1]);

/* The body of rank `rank`'s slice of plan p (built by pw_plan_build from
 * job) as canonical text in *text (malloc'd) and its SHA-256 hex in hex.
 * plan_sha256 is the plan's hash (pw_slice_plan_text). PW_EINVAL for a
 * rank outside the mesh, PW_ENOMEM. */
PW_MUST_CHECK int pw_slice_build(const pw_job *job, const pw_plan *p, int rank, const char *plan_sha256, char **text,
                   char hex[PW_SHA256_HEX_LEN + 1], pw_err *err);

/* Checks the SHA-256 of text[0..len) against sha256_hex, then parses and
 * checks the body (types, and every id and range against the tables it
 * indexes), filling *out (release with pw_slice_free; on error *out holds
 * nothing). PW_EPROTO: path "slice_sha256" for a hash mismatch (the
 * message names both hashes), else the field's path in the slice. */
PW_MUST_CHECK int pw_slice_decode(const char *text, size_t len, const char *sha256_hex, pw_slice *out, pw_err *err);
void pw_slice_free(pw_slice *s);

#endif
