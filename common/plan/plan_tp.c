/* plan_tp: a tensor-parallel stage in the plan (common/model/tp.h). Each of a
 * stage's mesh.tp ranks does 1/tp of its FLOPs (the matmuls and attention
 * split; the norms and elementwise ops they do whole are counted split too:
 * small), plus the group's all-reduces on the plan's link (the profile's
 * when the plan is costed with one, else the FLOP model's): a ring of tp
 * members takes 2 (tp - 1) steps of its latency each and moves 2 (tp - 1)/tp
 * of the buffer per member (pw_coll_bytes_rs_ag) at its bandwidth. F carries
 * the forward ones, I (and so B) the input gradients' ones; W none. */
#include <stdlib.h>

#include "collective.h"
#include "plan.h"
#include "tp.h"

/* One stage's all-reduces for one microbatch: bytes rank 0 of the group
 * sends and seconds, forward and backward (remat: the forward's again). */
static void stage_comm(const pw_plan *p, int s, uint64_t *bytes, double *fsec, double *bsec) {
  const pw_stage *st = &p->part.stages[s];
  pw_tp_comm c;
  pw_tp_comm_layers(&p->model, p->tp_kinds, st->layer_lo, st->layer_hi, &c);
  size_t mb = (size_t)p->mb_size;
  uint64_t fb = pw_coll_bytes_rs_ag(c.fwd * mb, p->tp, 0), bb = pw_coll_bytes_rs_ag(c.bwd * mb, p->tp, 0);
  double steps = 2.0 * (p->tp - 1) * p->latency;
  *fsec = c.n_fwd * steps + pw_plan_wire_seconds(p, (double)fb);
  *bsec = c.n_bwd * steps + pw_plan_wire_seconds(p, (double)bb);
  int train = !p->sched->forward_only;
  *bytes = fb + (train ? bb + (p->n_work[s] ? fb : 0) : 0);
  if (train && p->n_work[s]) *bsec += *fsec;
}

int pw_plan_tp(const pw_job *job, pw_plan *p, pw_err *err) {
  p->tp = job->mesh.tp;
  if (p->tp <= 1) return 0;
  int rc = pw_tp_check(job, &p->model, err);
  if (rc) return rc;
  if (!(p->tp_kinds = malloc((size_t)p->model.n_params + 1))) return pw_err_set(err, PW_ENOMEM, "plan", "out of memory");
  pw_tp_kinds(&p->model, p->tp_kinds);
  for (int s = 0; s < p->S; s++) {
    uint64_t bytes;
    double fsec, bsec;
    stage_comm(p, s, &bytes, &fsec, &bsec);
    p->cost_f[s] = p->cost_f[s] / p->tp + fsec;
    p->cost_i[s] = p->cost_i[s] / p->tp + bsec;
    p->cost_w[s] /= p->tp;
    p->cost_b[s] = p->cost_i[s] + p->cost_w[s];
  }
  return 0;
}

void pw_plan_tp_rank(const pw_plan *p, int s, pw_prog_sizes *sz, pw_plan_mem *r) {
  if (p->tp <= 1) return;
  const pw_stage *st = &p->part.stages[s];
  pw_tp_shrink_sizes(&p->model, p->tp_kinds, p->model.layers[st->layer_lo].node_lo,
                     p->model.layers[st->layer_hi - 1].node_hi, p->tp, sz);
  uint64_t bytes;
  double fsec, bsec;
  stage_comm(p, s, &bytes, &fsec, &bsec);
  int train = !p->sched->forward_only;
  r->tp_sent += bytes * (uint64_t)p->m;
  r->tp_seconds += (fsec + (train ? bsec : 0)) * p->m;
}
