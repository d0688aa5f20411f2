/* exec: the compute of one unit of a rank's action list — an action, or a
 * fused F&B pair — on a thread-pool thread. It touches only the slots and
 * parameters of the stages named by the unit, which the loop thread leaves
 * alone while the unit is in flight; the loop thread reads the results in
 * the after-work callback (run.c). */
#include <time.h>

#include "worker.h"

double pw_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Draw this replica's share of microbatch mb straight into the slot. */
static void draw_data(pw_run *r, pw_lstage *ls, int slot, int mb) {
  const pw_model *m = &r->model;
  int per_replica = r->spec.train.batch_size / r->dp;
  int first = r->replica * per_replica + mb * r->mb_size;
  void *inp = ls->first_input ? pw_prog_value(ls->prog, slot, m->input_value) : NULL;
  void *tgt = ls->has_target ? pw_prog_value(ls->prog, slot, m->target_value) : NULL;
  if (inp || tgt)
    pw_dataset_batch(r->ds, PW_SPLIT_TRAIN, r->step, first, r->mb_size, r->spec.train.batch_size, inp, tgt);
}

void pw_exec_work(uv_work_t *req) {
  pw_run *r = req->data;
  r->work_loss = 0;
  for (int k = 0; k < r->work_n; k++) {
    int pc = r->work_pc + k;
    const pw_action *a = &r->acts[pc];
    pw_lstage *ls = &r->ls[r->lidx_of_stage[a->stage]];
    int slot = ls->mb_slot[a->mb];
    double t0 = pw_now();
    switch (a->kind) {
      case PW_ACT_F: {
        float loss = 0;
        draw_data(r, ls, slot, a->mb);
        pw_prog_forward(ls->prog, slot, &loss);
        r->work_loss += loss;
        break;
      }
      case PW_ACT_B: pw_prog_backward(ls->prog, slot); break;
      case PW_ACT_I: pw_prog_backward_input(ls->prog, slot); break;
      case PW_ACT_W: pw_prog_backward_weight(ls->prog, slot); break;
    }
    r->timings[pc].a = *a;
    r->timings[pc].start = t0 - r->t_step0;
    r->timings[pc].end = pw_now() - r->t_step0;
  }
}
