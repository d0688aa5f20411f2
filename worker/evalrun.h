/* evalrun: the held-out loss of a cluster run (train.eval_every) — when
 * the eval passes run, their action list, and the frame tag of every pass
 * (evalrun.c says how; exec.c runs the passes). */
#ifndef PW_EVALRUN_H
#define PW_EVALRUN_H

#include "rctx.h"

typedef struct {
  const pw_rctx *cx;
  pw_action *acts;         /* [n_acts] this rank's forward-only list, or NULL (the run does not evaluate) */
  int n_acts;
  int active, batch;       /* in an eval pass: of eval batch `batch` */
} pw_evalrun;

/* The forward-only list when the run evaluates. */
PW_MUST_CHECK int pw_evalrun_init(pw_evalrun *e, const pw_rctx *cx);
void pw_evalrun_close(pw_evalrun *e);
/* Whether the eval passes follow the update of `step`. */
int pw_evalrun_due(const pw_evalrun *e, int step);
/* The frame tag of step's pass. */
int pw_evalrun_tag(const pw_evalrun *e, int step);
/* The tag of the pass after the one tagged `tag`. */
int pw_evalrun_next(int tag);
/* PW_EPROTO: frame h is of a pass this rank cannot take now (named as a
 * step while passes are steps). */
PW_MUST_CHECK int pw_evalrun_refuse(const pw_evalrun *e, const pw_frame_hdr *h, pw_err *err);

#endif
