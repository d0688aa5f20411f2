/* placement: which rank runs each stage (mesh.placement), applied to a
 * schedule's plan.
 *
 * A schedule's generator writes its action lists for its own layout
 * (sched->stage_to_rank: flat s, loop s % pp, V-shape). A placement is
 * accepted when it is that layout up to a relabeling of ranks: a
 * permutation sigma with placement[s] = sigma(layout[s]) for every stage s.
 * The lists then move to their new ranks (rank sigma(r) runs old rank r's
 * list) and stage_to_rank becomes the placement, so the plan is the same
 * plan on renamed ranks — the same arithmetic in the same order, the same
 * results bit for bit. Any other placement would need other action lists:
 * it is refused, naming the stage (a custom schedule writes its own lists).
 *
 * Named placements (docs/schedules.md, "Placements"), for S stages on pp
 * ranks with V = S / pp:
 *   loop        stage s on rank s % pp (the interleaved layout; flat for V = 1)
 *   v           chunk c = s / pp, i = s % pp: rank i for even c, pp-1-i for
 *               odd c (DualPipeV's V for V = 2, a zigzag beyond)
 *   contiguous  stage s on rank s / V (each rank runs V consecutive stages) */
#ifndef PW_PLACEMENT_H
#define PW_PLACEMENT_H

#include "errors.h"
#include "schedule.h"
#include "spec.h"

/* The stage -> rank array of a named placement (kind LOOP, V or
 * CONTIGUOUS) for S stages on pp ranks, into out[S]. */
void pw_placement_named(int kind, int pp, int S, int *out);

/* Move s's action lists onto placement[0 .. s->S) (see above). PW_ESPEC
 * with path "mesh.placement[k]" naming the stage k that breaks the
 * relabeling and why, e.g. "interleaved-1f1b runs stages 1 and 3 on one
 * rank; this placement puts them on ranks 1 and 0 — use a placement of the
 * loop layout or a custom schedule". On error s is unchanged. */
PW_MUST_CHECK int pw_sched_place(pw_sched *s, const int *placement, pw_err *err);

/* mesh.placement (none, a name or an array) applied to s: nothing for
 * none; PW_ESPEC "mesh.placement" when an array's length is not s->S. */
PW_MUST_CHECK int pw_sched_place_mesh(pw_sched *s, const pw_mesh_spec *mesh, pw_err *err);

#endif
