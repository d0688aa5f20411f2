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
 * Tags: every pass has its own frame tag (the run's cp.tag), a function
 * of the step alone, so all ranks agree without a word: step k's pass is
 * k + eval_batches * floor(k / eval_every), its eval passes the tags after
 * it. Tags are taken mod 2^31 (the frame's u32, never the -1 of "none").
 * Only the gradient arenas between replicas keep the step as their tag: a
 * replica may be a whole step ahead, past the eval passes between. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "evalrun.h"

#define TAG_MASK 0x7fffffffu

static int evaluates(const pw_rctx *c) {
  return c->cfg->sl.train.eval_every > 0 && c->cfg->sl.mode != PW_MODE_FORWARD;
}

int pw_evalrun_due(const pw_evalrun *e, int step) {
  const pw_rctx *c = e->cx;
  return evaluates(c) && ((step + 1) % c->cfg->sl.train.eval_every == 0 || step + 1 == c->cfg->steps);
}

int pw_evalrun_tag(const pw_evalrun *e, int step) {
  const pw_rctx *c = e->cx;
  uint64_t k = (uint64_t)step;
  if (evaluates(c)) k += (uint64_t)c->cfg->sl.train.eval_batches * (k / (uint64_t)c->cfg->sl.train.eval_every);
  return (int)(k & TAG_MASK);
}

int pw_evalrun_next(int tag) { return (int)(((uint32_t)tag + 1) & TAG_MASK); }

int pw_evalrun_refuse(const pw_evalrun *e, const pw_frame_hdr *h, pw_err *err) {
  const pw_rctx *c = e->cx;
  const char *k = pw_frame_kind_name(h->kind);
  if (*c->tag == *c->step)
    return pw_err_set(err, PW_EPROTO, "frame", "%s for step %u while at step %d", k, h->step, *c->step);
  return pw_err_set(err, PW_EPROTO, "frame", "%s for pass %u while at pass %d (step %d)", k, h->step, *c->tag,
                    *c->step);
}

int pw_evalrun_init(pw_evalrun *e, const pw_rctx *cx) {
  memset(e, 0, sizeof *e);
  e->cx = cx;
  if (!evaluates(cx)) return 0;
  if (!(e->acts = malloc(sizeof *e->acts * (size_t)(cx->n_acts ? cx->n_acts : 1)))) return PW_ENOMEM;
  if (cx->n_acts) memcpy(e->acts, cx->acts, sizeof *cx->acts * (size_t)cx->n_acts);
  e->n_acts = pw_actions_keep_forwards(e->acts, cx->n_acts);
  return 0;
}

void pw_evalrun_close(pw_evalrun *e) {
  free(e->acts);
  e->acts = NULL;
}
