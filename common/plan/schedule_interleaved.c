/* schedule_interleaved: the virtual-stage schedules (stage v*pp + r on rank
 * r): interleaved-1f1b, interleaved-gpipe, interleaved-1f1b-plus-one and
 * kimi-k2. One generator covers the 1F1B family (PyTorch's
 * _get_1f1b_rank_ops without its alignment no-ops); the members differ only
 * in the round size and the warm-up count. Emits lists, never times them. */
#include "schedule_int.h"

/* Interleaved 1F1B on every rank. The rank's m*V forwards are numbered by
 * op = 0 .. m*V-1 and visit its local stages in rounds of m_round
 * microbatches: op's local stage is (op / m_round) % V, its microbatch the
 * next unused one of that stage. Backwards are numbered the same way but walk
 * the local stages from the last: local stage V-1 - (j / m_round) % V. Rank r
 * runs w_r = min(base_r + extra, m*V) warm-up forwards with
 * base_r = (V-1)*m_round + 2(p-1-r) (Megatron, PyTorch), then pairs
 * (F(w_r + i), B(i)), then the remaining backwards. */
static int gen_interleaved_1f1b(pw_sched *s, int m_round, int extra) {
  int p = s->pp, V = s->V, m = s->m, total = m * s->V, rc = 0;
  for (int r = 0; r < p && !rc; r++) {
    int fcnt[64] = {0}, bcnt[64] = {0}; /* V <= 64 (pw_sched_check) */
    int w = (V - 1) * m_round + 2 * (p - 1 - r) + extra;
    if (w > total) w = total;
#define FWD(op)                                                        \
  do {                                                                 \
    int v_ = ((op) / m_round) % V;                                     \
    if (!rc) rc = pw__emit(s, r, PW_ACT_F, fcnt[v_]++, v_ * p + r, 0); \
  } while (0)
#define BWD(j)                                                         \
  do {                                                                 \
    int v_ = V - 1 - ((j) / m_round) % V;                              \
    if (!rc) rc = pw__emit(s, r, PW_ACT_B, bcnt[v_]++, v_ * p + r, 0); \
  } while (0)
    for (int op = 0; op < w; op++) FWD(op);
    for (int i = 0; i < total - w; i++) {
      FWD(w + i);
      BWD(i);
    }
    for (int j = total - w; j < total; j++) BWD(j);
#undef FWD
#undef BWD
  }
  return rc;
}

/* Megatron: rounds of pp microbatches (m % pp == 0 is checked). */
int pw__gen_interleaved_1f1b(pw_sched *s) { return gen_interleaved_1f1b(s, s->pp, 0); }

int pw__gen_interleaved_1f1b_plus_one(pw_sched *s) { return gen_interleaved_1f1b(s, s->pp, 1); }

/* kimi-k2: PyTorch/JaxPP rounds (max(1, m/pp) rounds of m/rounds
 * microbatches; m % rounds == 0 is checked) and one extra warm-up
 * microbatch per local stage, i.e. V extra warm-up forwards per rank. */
int pw__gen_kimi_k2(pw_sched *s) {
  int rounds = s->m / s->pp > 1 ? s->m / s->pp : 1;
  return gen_interleaved_1f1b(s, s->m / rounds, s->V);
}

/* GPipe over all stages: forwards of local stage 0, 1, .., V-1 (every
 * microbatch in order), then backwards of local stage V-1, .., 0. */
int pw__gen_interleaved_gpipe(pw_sched *s) {
  int p = s->pp, rc = 0;
  for (int r = 0; r < p; r++) {
    for (int v = 0; v < s->V; v++)
      for (int k = 0; k < s->m && !rc; k++) rc = pw__emit(s, r, PW_ACT_F, k, v * p + r, 0);
    for (int v = s->V - 1; v >= 0; v--)
      for (int k = 0; k < s->m && !rc; k++) rc = pw__emit(s, r, PW_ACT_B, k, v * p + r, 0);
  }
  return rc;
}
