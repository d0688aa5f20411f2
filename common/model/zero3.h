/* zero3: the arithmetic of ZeRO-3 (train.zero 3) over one stage — which
 * parameters each layer's gather brings in, where they go, and which part
 * of them each data-parallel replica owns — shared by the worker that
 * moves them (worker/pgather.c) and the planner that counts them
 * (common/plan/plan.c). Pure: no frames, no threads, no arenas.
 *
 * Under zero 3 a replica keeps only its shard of the stage's parameter
 * arena (collective.h's shards of `numel` floats: with no frozen parameter
 * the parameter arena and the gradient arena's main part have the same
 * layout, so the shard is the same range the optimizer state and the
 * gradients are sharded over). Before a layer computes, its parameters are
 * all-gathered into a unit buffer:
 *  - a unit is one layer of the stage (the granularity: the model's
 *    layers, an embedding, a block, the head);
 *  - its parameters are those its nodes read (w and b), each once, sorted
 *    by arena offset and merged into runs of adjacent ones; a parameter
 *    read by two layers (tied embeddings inside one stage) is in both
 *    units, so a unit's runs need not be adjacent to each other;
 *  - the unit buffer holds its runs one after another: run r's arena
 *    range [lo, hi) at buffer offset at;
 *  - replica d's pieces of a unit are its shard's part of each run: one
 *    contiguous range in the arena and in the buffer per run it meets.
 * Every replica sends its pieces of the unit to every other one, and the
 * pieces of all replicas cover the unit buffer exactly once. */
#ifndef PW_ZERO3_H
#define PW_ZERO3_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "model.h"

typedef struct {
  size_t lo, hi; /* arena range */
  size_t at;     /* where it starts in the unit buffer */
} pw_z3_run;

/* A stage's units, one per layer of [layer_lo, layer_hi). */
typedef struct {
  int layer_lo, n_units;
  int *run_lo;       /* [n_units + 1] unit u's runs: runs[run_lo[u]], ..., runs[run_lo[u + 1] - 1] */
  pw_z3_run *runs;
  int *par_lo;       /* [n_units + 1] unit u's parameters (layout-local indices): par[par_lo[u]] ... */
  int *par;
  size_t *floats;    /* [n_units] floats of unit u's buffer */
  size_t max_floats; /* the largest unit: what a gather buffer holds */
} pw_z3_units;

/* A piece: {offset in the unit buffer, offset in the arena, floats}. */
typedef size_t pw_z3_piece[3];

/* The units of layout L (layers [layer_lo, layer_hi) of m). 0 or
 * PW_ENOMEM; pw_z3_units_free either way. */
int pw_z3_units_build(const pw_model *m, const pw_prog_layout *L, pw_z3_units *u);
void pw_z3_units_free(pw_z3_units *u);
/* The pieces of unit u in shard [lo, hi) into out (room for unit u's run
 * count), in buffer order; returns how many. */
int pw_z3_pieces(const pw_z3_units *z, int u, size_t lo, size_t hi, pw_z3_piece *out);
/* Floats of unit u that shard [lo, hi) holds. */
size_t pw_z3_unit_part(const pw_z3_units *z, int u, size_t lo, size_t hi);
/* The most runs any unit has: room for pw_z3_pieces. */
int pw_z3_max_runs(const pw_z3_units *z);

/* Gather buffers a replica keeps: the one computed on, the next one
 * (prefetched while it computes) and one a replica ahead of us may fill
 * (worker/pgather.h says why three). */
#define PW_Z3_RING 3
/* The planner's page: a shard's ends are mapped a page out each. */
#define PW_Z3_PAGE ((size_t)4096)

/* What a replica keeps of a stage's parameters under zero 3, in floats:
 * its shard of the numel-float arena (the longest, and the pages its ends
 * round out to) and the gather ring of the largest unit. */
size_t pw_z3_param_floats(size_t numel, int dp, size_t max_unit);
/* Bytes replica `me` sends to gather every unit of the stage once (one
 * pass: a forward, or a backward): each unit's part in its shard to each
 * of the dp - 1 others. */
uint64_t pw_z3_pass_bytes(const pw_z3_units *z, size_t numel, int dp, int me);
/* Units with parameters: gathers per pass. */
int pw_z3_pass_gathers(const pw_z3_units *z);

#endif
