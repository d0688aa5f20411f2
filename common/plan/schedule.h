/* schedule: the nine pipeline schedules as per-rank action lists.
 *
 * A schedule is the plan of ONE training (or inference) step: for every
 * pipeline rank, the ordered list of compute actions it runs. Sends and
 * receives are implied by stage adjacency (stage s feeds s+1 forward, s+1
 * feeds s backward), so the lists hold compute only. The definitions follow
 * docs/schedules.md (Megatron, PyTorch, DeepSeek DualPipe,
 * ZeroBubble); every deviation is stated next to the generator.
 *
 * This file never looks at the model: stage costs, shapes and the partition
 * live elsewhere (partition.c, sim.c). It must never emit a plan that the
 * simulator (sim.h) would reject: tests replay every schedule over a sweep of
 * (pp, microbatches, virtual stages).
 *
 * Terms: pp ranks, V virtual stages per rank, S stages, m microbatches. An
 * action is written `F3@s1` (forward of microbatch 3 on stage 1), `B` full
 * backward, `I` backward for inputs only, `W` backward for weights only.
 *
 * Fused pairs (DualPipeV): an action with PW_ACTION_FUSED set runs fused with
 * the NEXT action of the same rank as one unit: the unit starts when both
 * actions' inputs have arrived, runs F then B back to back (time F + B), and
 * both results are available when the unit ends (DeepSeek sends both after
 * the overlapped compute). The first of a pair is always an F, the second a
 * B (or I). Textual form joins the two with '+': `F5@s0+B2@s7`. */
#ifndef PW_SCHEDULE_H
#define PW_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "errors.h"

/* (spec.h already owns the name pw_act_kind, for activation functions.) */
typedef enum { PW_ACT_F = 0, PW_ACT_B = 1, PW_ACT_I = 2, PW_ACT_W = 3 } pw_action_kind;

#define PW_ACTION_FUSED 0x1 /* runs fused with the next action of the rank */

typedef struct {
  uint8_t kind;  /* pw_action_kind */
  uint8_t flags; /* PW_ACTION_FUSED */
  int32_t mb;    /* microbatch, 0 .. m-1 */
  int32_t stage; /* stage, 0 .. S-1 */
} pw_action;

/* ---- textual form ------------------------------------------------------ */

/* "F3@s1". Returns the length written (as snprintf: the length it would
 * have written if cap is too small). The FUSED flag is not shown here. */
int pw_action_format(const pw_action *a, char *buf, size_t cap);
/* Parse one action at s ("F3@s1", leading spaces skipped). On success sets
 * *end (if not NULL) to the first character after it and returns 0; else
 * PW_EFORMAT with the reason in err. Flags are cleared. */
PW_MUST_CHECK int pw_action_parse(const char *s, pw_action *a, const char **end, pw_err *err);
/* A rank's list: actions separated by single spaces, a fused pair joined by
 * '+' ("F0@s0 F1@s0+B0@s3 W0@s3"). Returns the length as snprintf does. */
int pw_actions_format(const pw_action *acts, int n, char *buf, size_t cap);
/* Parse such a list (any whitespace between entries). *out is malloc'ed
 * (NULL when n = 0); the caller frees it. PW_EFORMAT names the bad entry. */
PW_MUST_CHECK int pw_actions_parse(const char *text, pw_action **out, int *n, pw_err *err);
/* Keeps only the F actions of v[0..n), in order and unfused: a rank's
 * forward-only list (pw_sched_build's forward_only, and the workers'
 * eval passes of train.eval_every). Returns the new count. */
int pw_actions_keep_forwards(pw_action *v, int n);

/* ---- the plan ---------------------------------------------------------- */

typedef struct pw_sched {
  char name[32];       /* schedule name, or "custom" for hand-made plans */
  int pp;              /* pipeline ranks */
  int V;               /* virtual stages per rank (S = pp * V) */
  int S;               /* stages */
  int m;               /* microbatches per step */
  int forward_only;    /* inference plan: F actions only */
  int *stage_to_rank;  /* [S] */
  int *n_actions;      /* [pp] */
  pw_action **actions; /* [pp][n_actions[r]], in execution order */
  int *cap_;           /* [pp] internal: allocated length of actions[r] */
  /* The stage graph when it is not a chain (model.regions, common/plan/
   * regions.h): stage st reads the outputs of pred[pred_first[st] ..
   * pred_first[st+1]), ascending. NULL: a chain, st reads st - 1. */
  int *pred_first;     /* [S + 1] */
  int *pred;
} pw_sched;

/* The most stages one stage reads from, or sends to, in a stage graph. */
#define PW_SCHED_MAX_LINKS 8
/* The stages stage st reads (forward inputs) or feeds (whose gradients it
 * waits for), into out[PW_SCHED_MAX_LINKS] ascending; returns the count. */
int pw_sched_preds(const pw_sched *s, int st, int *out);
int pw_sched_succs(const pw_sched *s, int st, int *out);
/* Gives dst (same S) src's stage graph, copied (none when src has none).
 * 0 or PW_ENOMEM. */
PW_MUST_CHECK int pw_sched_copy_graph(pw_sched *dst, const pw_sched *src);

/* Build the plan of schedule `name` (one of the nine names, see
 * pw_sched_infos) for pp ranks, V virtual stages per rank and m microbatches.
 * Constraints are checked first (pw_sched_check); a broken one gives PW_ESPEC
 * with err->path the job spec's JSON path ("schedule.microbatches",
 * "mesh.virtual_stages", "mesh.pp", "schedule.name") and the rule, e.g.
 * "dualpipev needs microbatches >= 2*pp (got 5 < 8)".
 *
 * forward_only: the same per-rank order with every non-F action dropped (and
 * fused pairs unfused). This is deadlock-free whenever the training plan is
 * (F's depend only on F's, and dropping actions only removes waits). For
 * zb-h1 it is simply F0 .. F(m-1) on every rank. The constraints of the
 * training plan still apply (DeepSeek's DualPipeV asserts m >= 2*pp in
 * inference too). */
PW_MUST_CHECK int pw_sched_build(const char *name, int pp, int V, int m, int forward_only, pw_sched **out,
                   pw_err *err);
/* Only the constraint checks of pw_sched_build. */
PW_MUST_CHECK int pw_sched_check(const char *name, int pp, int V, int m, int forward_only, pw_err *err);
void pw_sched_free(pw_sched *s);

/* A hand-made plan (tests, tools): empty per-rank lists, name "custom".
 * stage_to_rank may be NULL (stage s on rank s % pp). S must be >= 1 and
 * every stage_to_rank entry in 0 .. pp-1. */
PW_MUST_CHECK int pw_sched_new(int pp, int V, int S, int m, const int *stage_to_rank, int forward_only,
                 pw_sched **out, pw_err *err);
/* Append one action to a rank's list (no checking beyond rank range; the
 * simulator checks plans). PW_ENOMEM, PW_EINVAL. */
PW_MUST_CHECK int pw_sched_push(pw_sched *s, int rank, pw_action a);
/* Replace a rank's list by the parsed text ("F0@s0 F1@s0 B0@s0"). */
PW_MUST_CHECK int pw_sched_set_rank_text(pw_sched *s, int rank, const char *text, pw_err *err);

/* {"name", "pp", "virtual_stages", "stages", "microbatches", "forward_only",
 *  "stage_to_rank": [...], "ranks": ["F0@s0 F1@s0 ...", ...]} (new ref). */
json_t *pw_sched_to_json(const pw_sched *s);
/* The inverse (workers receive their plan this way). Fields are checked for
 * type and range (PW_ESPEC with a path such as "ranks[2]"), the lists are
 * parsed; the plan itself is not validated here (run pw_sim_check). */
PW_MUST_CHECK int pw_sched_from_json(const json_t *j, pw_sched **out, pw_err *err);

/* ---- the catalogue ----------------------------------------------------- */

typedef struct {
  const char *name;        /* "interleaved-1f1b" */
  const char *family;      /* "flat", "interleaved" or "v-shape" */
  const char *layout;      /* where stage s lives */
  int min_v, max_v;        /* accepted virtual_stages (max 0 = no limit) */
  int split_backward;      /* emits I/W instead of (only) B */
  const char *parameters;  /* the spec fields it reads */
  const char *constraints; /* the rules pw_sched_check applies, in words */
  const char *description; /* one paragraph */
} pw_sched_info;

/* The table of the nine schedules, in docs/schedules.md's order (the canonical
 * name list, pw_schedule_names, lives in spec.c). */
const pw_sched_info *pw_sched_infos(int *n);
const pw_sched_info *pw_sched_info_find(const char *name); /* NULL if unknown */
/* One entry as JSON for /v1/schedules, with its "aliases" (other systems'
 * names, pw_schedule_aliases) after its name (new reference). */
json_t *pw_sched_info_json(const pw_sched_info *info);

/* Counts (for tests and the API): actions of each kind over all ranks. */
void pw_sched_count(const pw_sched *s, int counts[4]);

/* ---- custom schedules (schedule_custom.c) ------------------------------
 * A job spec's "schedule": {"custom": {"ranks": [...]}} holds one action
 * list per pipeline rank, in the text form above. Stage -> rank follows
 * from the lists (a stage lives on the rank whose list holds its actions),
 * S is the highest stage + 1 and V = S / pp. */

/* Parse, derive stage_to_rank and V, and prove the plan (structure and a
 * unit-cost replay, sim.h). forward_only keeps only the F actions (fused
 * pairs unfused), so the plan exported from a training schedule runs in
 * forward mode too. Errors carry the path "schedule.custom.ranks" and say
 * what is wrong: a bad entry ("rank 1: entry 4: ..."), an action on a
 * stage another rank holds ("rank 1 #3: B0@s0 is on stage 0, which
 * belongs to rank 0"), a stage without actions, microbatches other than
 * 0 .. m-1, a missing or doubled action (PW_ESCHEDULE), a deadlock
 * naming the cycle of waiting ranks (PW_EDEADLOCK). The caller checks V
 * against mesh.virtual_stages. */
PW_MUST_CHECK int pw_sched_from_ranks(const char *const *ranks, int pp, int m, int forward_only, pw_sched **out,
                                      pw_err *err);
/* {"ranks": ["F0@s0 ...", ...]}: the spec's schedule.custom of plan s (new
 * reference, NULL when out of memory). */
json_t *pw_sched_custom_json(const pw_sched *s);

/* PyTorch's CSV (torch.distributed.pipelining, _dump_csv of the
 * compute_only order): one row per rank, one cell per action written
 * stage, kind, microbatch ("0F0", "3B1", "1I2", "1W2"); empty cells are
 * idle time steps. A fused pair is written as PyTorch's overlap action,
 * "(0F5;7B2)OVERLAP_F_B". pw_sched_csv_format returns the malloc'ed text
 * (NULL when out of memory). */
char *pw_sched_csv_format(const pw_sched *s);
/* The inverse: *ranks (n_ranks strings in the text form, each malloc'ed;
 * free with pw_sched_ranks_free). Communication cells (SEND_F, RECV_B,
 * UNSHARD, RESHARD, REDUCE_GRAD ...) are skipped: pipewright implies them.
 * PW_EFORMAT names the row, the cell and what is wrong. */
PW_MUST_CHECK int pw_sched_csv_parse(const char *text, char ***ranks, int *n_ranks, pw_err *err);
void pw_sched_ranks_free(char **ranks, int n);

#endif
