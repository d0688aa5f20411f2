/* pipex: what the pipeline ranks of one replica exchange at a step's end
 * — the gradients of shared parameters (tied embeddings) between their
 * holders, and each rank's partial squared gradient norm.
 *
 * Tied: each local holder's gradient goes once to every rank holding a
 * remote copy (TIED frames: step = the pass's tag, microbatch = the
 * sending holder's stage, stage = the receiving one, value = the model's
 * parameter id); every holder sums the copies in ascending stage order,
 * so all get the same bits, those of the single-process trainer.
 * Norm: every pipeline rank sends its partial (8 bytes, NORM frames:
 * microbatch = the sender's pipeline rank) to the others, and each sums
 * them in the order of each rank's first stage: one hop, the same bits
 * everywhere, and the step's barrier. Partials alternate by the tag's
 * parity: a rank past the barrier may send the next pass's before we
 * have read this one's. */
#ifndef PW_PIPEX_H
#define PW_PIPEX_H

#include "plan.h"
#include "rctx.h"

typedef struct {
  const pw_rctx *cx;
  pw_tied_bufs *tied;      /* [n_shared] buffers of the shared parameters held here, or NULL */
  int tied_needed;         /* remote holders' copies to wait for per pass */
  int tied_step, tied_got; /* copies received for tag tied_step */
  double *parts;           /* [2 * pp] partial of each pipeline rank, by tag parity */
  int *parts_step;         /* [2 * pp] the tag each is of */
  double out[2];           /* our partial being sent, by tag parity */
} pw_pipex;

/* The buffers (tied ones only when training). */
PW_MUST_CHECK int pw_pipex_init(pw_pipex *x, const pw_rctx *cx);
void pw_pipex_close(pw_pipex *x);
/* Whether stage holds a copy of a shared parameter other than the one
 * counted in the norm (its lowest-stage holder's); skip[] gets the
 * parameter ids of those, up to cap; returns how many. */
int pw_pipex_norm_skips(const pw_pipex *x, int stage, int *skip, int cap);
/* Compute thread: the tied gradients exchanged and summed into every
 * local holder's gradient. */
PW_MUST_CHECK int pw_pipex_tied(pw_pipex *x);
/* Compute thread: our partial sent, the others' waited for, the sum in
 * *total (the same bits on every pipeline rank of the replica). */
PW_MUST_CHECK int pw_pipex_norm(pw_pipex *x, double part, double *total);

/* Compute thread, the run's frame lock held: a TIED or NORM frame of the
 * current pass or the next (route.c checks the tag) — where it goes, and
 * its end. */
PW_MUST_CHECK int pw_pipex_dest(pw_pipex *x, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
PW_MUST_CHECK int pw_pipex_frame(pw_pipex *x, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);

#endif
