/* schedule_int: what schedule.c shares with the per-family generators
 * (schedule_flat.c, schedule_interleaved.c, schedule_dualpipev.c). Not part
 * of the public API: nothing outside the schedule_*.c files includes it. */
#ifndef PW_SCHEDULE_INT_H
#define PW_SCHEDULE_INT_H

#include "schedule.h"

/* A generator fills every rank's list of the training plan of s, which
 * arrives allocated with pp, V, S, m and stage_to_rank set and empty lists.
 * Returns 0 or PW_ENOMEM (constraints were checked before). */
typedef int (*pw__sched_gen)(pw_sched *s);

PW_MUST_CHECK int pw__gen_gpipe(pw_sched *s);
PW_MUST_CHECK int pw__gen_1f1b(pw_sched *s);
PW_MUST_CHECK int pw__gen_eager1f1b(pw_sched *s);
PW_MUST_CHECK int pw__gen_zbh1(pw_sched *s);
PW_MUST_CHECK int pw__gen_interleaved_1f1b(pw_sched *s);
PW_MUST_CHECK int pw__gen_interleaved_gpipe(pw_sched *s);
PW_MUST_CHECK int pw__gen_interleaved_1f1b_plus_one(pw_sched *s);
PW_MUST_CHECK int pw__gen_kimi_k2(pw_sched *s);
PW_MUST_CHECK int pw__gen_dualpipev(pw_sched *s);

/* Append shorthand for generators. */
static inline int pw__emit(pw_sched *s, int rank, int kind, int mb, int stage, int flags) {
  pw_action a = {(uint8_t)kind, (uint8_t)flags, mb, stage};
  return pw_sched_push(s, rank, a);
}

#endif
