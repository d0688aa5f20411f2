/* serve: a rank of a serve job (mode "serve", docs/serving.md) — the
 * compute thread's loop that replaces the training steps.
 *
 * Each pipeline rank holds one stage and one decoder (common/compute/
 * decode.h) whose KV slab has serve_seqs slots of serve_len positions,
 * made at start: nothing grows while serving. Rank 0 of a replica owns the
 * batching: the coordinator's "generate" messages queue there (at most
 * serve_seqs + serve_queue; beyond, "gen_failed"), a queued request takes
 * a free slot at a step boundary, and the slots ready for their next
 * forward are grouped into at most pp microbatches in flight, so every
 * stage has one to work on. A microbatch travels as a SEQS frame (one
 * record per sequence: slot, position, rows, request, sampling parameters)
 * then its ACT frame, stage to stage; the last stage samples each
 * sequence's next token with the sequence's own sampler (seeded by its
 * request, so its tokens do not depend on its batch-mates), sends them
 * back to rank 0 as a TOKENS frame, and to the coordinator as a "tokens"
 * message. Rank 0 frees a slot once its request has all its tokens.
 *
 * Threads: pw_serve_submit is the loop thread's (the request queue is
 * under the serve's own mutex); the rest is the compute thread's. */
#ifndef PW_SERVE_H
#define PW_SERVE_H

#include "control.h"
#include "rctx.h"

typedef struct pw_serve pw_serve;

/* A run of mode serve: the request queue, and checks that each rank holds
 * one stage in chain order. */
PW_MUST_CHECK int pw_serve_create(pw_serve **out, const pw_rctx *cx, const pw_msg_assign *a, pw_err *err);
void pw_serve_free(pw_serve *s);
/* Loop thread: a "generate" message for this rank. Checked (prompt and
 * tokens within serve_len, tokens in the vocabulary, sampling parameters),
 * then queued for rank 0's compute thread: 0. Refused: a negative code and
 * why (the caller tells the coordinator: "gen_failed"). */
PW_MUST_CHECK int pw_serve_submit(pw_serve *s, const pw_msg_generate *g, char *why, size_t cap);
/* Compute thread, once the parameters are loaded: serves until the run is
 * cancelled (PW_ECANCELED) or fails. */
PW_MUST_CHECK int pw_serve_run(pw_serve *s);
/* Compute thread, the run's frame lock held: where a SEQS, ACT or TOKENS
 * frame goes, and its arrival. */
PW_MUST_CHECK int pw_serve_dest(pw_serve *s, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
void pw_serve_frame(pw_serve *s, const pw_frame_hdr *h);

#endif
