/* decode: a stage program's incremental forward with a KV cache — the
 * building block of generation, one per pipeline stage.
 *
 * A decoder runs the nodes of one stage program (pw_prog: its layers and
 * parameters) forward on the NEW positions of a batch of sequences only:
 * sequence s brings rows for positions [pos_s, pos_s + len_s), and every
 * attention layer of the stage reads the keys and values of positions
 * [0, pos_s) from the stage's KV cache and appends the new ones. A prefill
 * is one call with the prompt's rows at pos 0; each decode step one row at
 * the sequence's length. Learned positions and rotary angles use the
 * absolute position, so the rows equal those of a full forward over the
 * whole sequence (up to the order of float sums in the matmuls).
 *
 * The KV cache is one slab allocated at create: max_seqs sequence slots,
 * each one K and one V region (max_pos, C) per attention layer of the
 * stage. A sequence occupies a slot the caller picks (serving assigns
 * slots; the oracle uses slot 0); pw_decode_kv_floats tells, before
 * anything is allocated, what a slot costs, so a server can refuse what
 * does not fit instead of running out of memory. Activations of one call
 * (max_rows new rows over all its sequences) live in a second arena made
 * at create. Nothing is allocated per call.
 *
 * Ports as in prog.h: the stage's input values (tokens, int32, on the
 * first stage; another stage's output otherwise) are filled through
 * pw_decode_value before a call, rows packed sequence after sequence in
 * the call's order; its outputs read back the same way after it. The last
 * stage's output is the logits (the loss's input): (rows, vocab).
 *
 * The program (and its model) must outlive the decoder. Its parameters are
 * read at create: the linears' weights are packed then (rowmm.h), so load
 * the checkpoint first, and make a new decoder for new weights. Not
 * thread-safe: one call at a time per decoder. */
#ifndef PW_DECODE_H
#define PW_DECODE_H

#include <stddef.h>

#include "errors.h"
#include "prog.h"

typedef struct {
  int max_seqs;  /* sequence slots in the KV cache, >= 1 */
  int max_pos;   /* positions per sequence; 0 = the model's seq_len (the most
                    that learned positions allow) */
  int max_rows;  /* new rows per call over all sequences; 0 = max_pos */
} pw_decode_config;

/* One sequence of a call: its cache slot, the position of its first new
 * row and how many rows it brings. Positions [0, pos) must be in the slot
 * already (pos <= what earlier calls filled; a smaller pos overwrites from
 * there: a sequence can be rewound, or a slot reused from 0). */
typedef struct pw_decode_seq {
  int slot, pos, len;
} pw_decode_seq;

typedef struct pw_decode pw_decode;

/* PW_EINVAL for a model without token sequences (features models), a
 * stage with a learned-position table shorter than max_pos, or bad sizes;
 * PW_ENOMEM. */
PW_MUST_CHECK int pw_decode_create(pw_prog *p, const pw_decode_config *cfg, pw_decode **out, pw_err *err);
void pw_decode_free(pw_decode *d);

/* Floats of one sequence slot's KV cache for layers [lo, hi) of m at
 * max_pos positions (2 * max_pos * width per attention layer). */
size_t pw_decode_kv_floats(const pw_model *m, int layer_lo, int layer_hi, int max_pos);

const pw_decode_config *pw_decode_config_of(const pw_decode *d);
/* The kernel path of the stage's linears, for logs: "onednn:<impl>" (all
 * rows of a call at once), "sgemv (why)" (each sequence's rows alone),
 * or a mix. */
const char *pw_decode_path(const pw_decode *d);
int pw_decode_n_inputs(const pw_decode *d);
int pw_decode_input(const pw_decode *d, int i);   /* value id */
int pw_decode_n_outputs(const pw_decode *d);
int pw_decode_output(const pw_decode *d, int i);  /* value id; the logits on the last stage */
/* The buffer of value `value` for the current call: (rows, width) of its
 * dtype, rows packed in call order; NULL if the stage does not hold it. */
void *pw_decode_value(pw_decode *d, int value);
/* Positions of slot `slot` filled so far (0 for a fresh slot). */
int pw_decode_filled(const pw_decode *d, int slot);

/* Runs the stage on the new rows of n sequences (distinct slots). Input
 * ports must hold sum(len) rows. PW_EINVAL, naming the sequence and the
 * rule, for a slot out of range or repeated, len < 1, pos past what the
 * slot holds, pos + len > max_pos, sum(len) > max_rows, or a token out of
 * the vocabulary; nothing is computed then. */
PW_MUST_CHECK int pw_decode_forward(pw_decode *d, const pw_decode_seq *seqs, int n, pw_err *err);

#endif
