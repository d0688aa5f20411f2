/* evalrun: the held-out loss of a cluster run (train.eval_every).
 *
 * After the update of every eval_every-th step (and of the last step) each
 * rank runs train.eval_batches forward-only passes: its own action list
 * with every non-F action dropped (pw_actions_keep_forwards, what
 * pw_sched_build makes of the schedule for mode "forward"), over the eval
 * batches `pipewright eval` draws (train.c: batch k = 0 .. eval_batches-1
 * of the eval split), in the slots training uses. Each pass ends with the
 * pipeline ranks of the replica waiting for each other (the norm exchange,
 * empty): a pass's microbatch then never meets the next pass's in a slot.
 *
 * The loss: the last stage of every replica sums its microbatches' shares
 * of a batch in microbatch order (double), the batches in order, divided
 * by eval_batches: for dp = 1 exactly `pipewright eval`'s arithmetic on
 * the checkpoint of that step. With dp > 1 every replica evaluates its
 * share of each batch and the coordinator sums the shares, as it sums the
 * step loss.
 *
 * Tags: every pass has its own frame tag (pw_run_compute.tag), a function
 * of the step alone, so all ranks agree without a word: step k's pass is
 * k + eval_batches * floor(k / eval_every), its eval passes the tags after
 * it. Tags are taken mod 2^31 (the frame's u32, never the -1 of "none").
 * Only the gradient arenas between replicas keep the step as their tag: a
 * replica may be a whole step ahead, past the eval passes between. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker.h"

#define TAG_MASK 0x7fffffffu

static int evaluates(const pw_run *r) { return r->spec.train.eval_every > 0 && r->spec.mode != PW_MODE_FORWARD; }

static int due(const pw_run *r, int step) {
  return evaluates(r) && ((step + 1) % r->spec.train.eval_every == 0 || step + 1 == r->steps);
}

int pw_evalrun_tag(const pw_run *r, int step) {
  uint64_t k = (uint64_t)step;
  if (evaluates(r)) k += (uint64_t)r->spec.train.eval_batches * (k / (uint64_t)r->spec.train.eval_every);
  return (int)(k & TAG_MASK);
}

int pw_evalrun_next(int tag) { return (int)(((uint32_t)tag + 1) & TAG_MASK); }

int pw_evalrun_refuse(const pw_run *r, const pw_frame_hdr *h, pw_err *err) {
  const char *k = pw_frame_kind_name(h->kind);
  if (r->cp.tag == r->sh.step)
    return pw_err_set(err, PW_EPROTO, "frame", "%s for step %u while at step %d", k, h->step, r->sh.step);
  return pw_err_set(err, PW_EPROTO, "frame", "%s for pass %u while at pass %d (step %d)", k, h->step, r->cp.tag,
                    r->sh.step);
}

int pw_evalrun_alloc(pw_run *r) {
  if (!evaluates(r)) return 0;
  if (!(r->cp.eval_acts = malloc(sizeof *r->cp.eval_acts * (size_t)(r->n_acts ? r->n_acts : 1)))) return PW_ENOMEM;
  if (r->n_acts) memcpy(r->cp.eval_acts, r->acts, sizeof *r->acts * (size_t)r->n_acts);
  r->cp.n_eval_acts = pw_actions_keep_forwards(r->cp.eval_acts, r->n_acts);
  return 0;
}

int pw_evalrun(pw_run *r, double *loss, int *done) {
  *loss = 0;
  *done = 0;
  if (!due(r, r->sh.step)) return 0;
  int n = r->spec.train.eval_batches, rc = 0;
  double sum = 0;
  r->cp.eval = 1;
  for (int b = 0; b < n && !rc; b++) {
    r->cp.tag = pw_evalrun_next(r->cp.tag);
    r->cp.eval_batch = b;
    rc = pw_exec_actions(r, r->cp.eval_acts, r->cp.n_eval_acts);
    if (!rc) sum += r->cp.loss_sum, rc = pw_stepend_barrier(r);
  }
  r->cp.eval = 0;
  *loss = sum / n;
  *done = !rc;
  return rc;
}
