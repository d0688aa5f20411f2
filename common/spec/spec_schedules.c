/* spec_schedules: the nine schedule names and the other spellings they
 * are read from (spec.h: pw_schedule_resolve, pw_schedule_aliases) — for
 * schedule.name, each region's schedule and GET /v1/schedules. */
#include <ctype.h>
#include <string.h>

#include "spec.h"

const char *const pw_schedule_names[] = {"gpipe",
                                         "1f1b",
                                         "eager1f1b",
                                         "zb-h1",
                                         "interleaved-1f1b",
                                         "interleaved-gpipe",
                                         "interleaved-1f1b-plus-one",
                                         "kimi-k2",
                                         "dualpipev"};
const int pw_n_schedule_names = (int)(sizeof pw_schedule_names / sizeof pw_schedule_names[0]);

/* name folded: lowercase, without '-' and '_'; 0 if it does not fit. */
static int fold_name(const char *name, char *buf, size_t cap) {
  size_t n = 0;
  for (; *name; name++) {
    if (*name == '-' || *name == '_') continue;
    if (n + 1 >= cap) return 0;
    buf[n++] = (char)tolower((unsigned char)*name);
  }
  buf[n] = 0;
  return 1;
}

/* Other systems' names, as they write them: [0] is the canonical name.
 * Each folds (and loses a "Schedule" prefix) like any spelling does. Not
 * here, as they are not one of ours: Shardy's CIRCULAR (GPipe in rounds of
 * pp microbatches through the local stages), PyTorch's
 * ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble (split backwards
 * on an interleaved or V layout; ZB-V is not DualPipeV's order). */
static const char *const alias_table[][6] = {
    {"gpipe", "GPipe", "GPIPE", "ScheduleGPipe", NULL},
    {"1f1b", "1F1B", "Std1F1B", "ONE_FWD_ONE_BWD", "Schedule1F1B"},
    {"eager1f1b", "Eager1F1B", NULL},
    {"zb-h1", "ZeroBubbleH1", "ZERO_BUBBLE_H1", "ZB_H1", NULL},
    {"interleaved-1f1b", "Interleaved1F1B", "InterleavedH1", "ScheduleInterleaved1F1B", NULL},
    {"interleaved-gpipe", "InterleavedGPipe", "LoopedBFS", "ScheduleLoopedBFS", NULL},
    {"interleaved-1f1b-plus-one", "Interleaved1F1BPlusOne", NULL},
    {"kimi-k2", "KimiK2", NULL},
    {"dualpipev", "DualPipeV", "ScheduleDualPipeV", NULL},
};
#define N_ALIAS_ROWS ((int)(sizeof alias_table / sizeof alias_table[0]))

/* fold_name without a leading "schedule" (PyTorch's class names). */
static const char *fold_bare(const char *name, char *buf, size_t cap) {
  if (!name || !fold_name(name, buf, cap)) return NULL;
  return strncmp(buf, "schedule", 8) == 0 && buf[8] ? buf + 8 : buf;
}

const char *pw_schedule_resolve(const char *name) {
  char want[64], have[64];
  const char *w = fold_bare(name, want, sizeof want), *h;
  if (!w) return NULL;
  for (int i = 0; i < N_ALIAS_ROWS; i++)
    for (int k = 0; k < 6 && alias_table[i][k]; k++)
      if ((h = fold_bare(alias_table[i][k], have, sizeof have)) && strcmp(w, h) == 0) return alias_table[i][0];
  return NULL;
}

const char *const *pw_schedule_aliases(const char *canon) {
  static const char *const none[] = {NULL};
  for (int i = 0; i < N_ALIAS_ROWS; i++)
    if (canon && strcmp(canon, alias_table[i][0]) == 0) return &alias_table[i][1];
  return none;
}
