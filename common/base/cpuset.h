/* cpuset: sets of CPU numbers, as Linux writes them ("0-3,8,10-11": an
 * affinity mask, a NUMA node's cpulist), and the choice of a rank's CPUs
 * on a host its workers share.
 *
 * Ranks that share a host's cores run faster pinned to disjoint cores than
 * left to the scheduler, which moves threads between cores and lets two
 * ranks' threads meet on one; on a host of several NUMA nodes a rank also
 * wants its cores on one node (its memory stays local). pw_cpuset_pick
 * chooses a rank's CPUs among those its worker may use (its affinity mask)
 * that no other rank on the host holds: all on one node when one node has
 * enough free (the node with the fewest free CPUs that still has enough,
 * so larger holes stay for larger ranks), else across nodes in order; the
 * lowest-numbered CPUs first. Pure: no system call. */
#ifndef PW_CPUSET_H
#define PW_CPUSET_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_CPUSET_MAX 1024                  /* CPUs 0..1023, as glibc's cpu_set_t */
#define PW_CPUSET_WORDS (PW_CPUSET_MAX / 64)
#define PW_CPUSET_NODES 64                  /* NUMA nodes a host may report */
#define PW_CPUSET_TEXT 512                  /* a cpulist as sent: longer ones are refused */

typedef struct {
  uint64_t w[PW_CPUSET_WORDS];
} pw_cpuset;

static inline void pw_cpuset_zero(pw_cpuset *s) {
  for (int i = 0; i < PW_CPUSET_WORDS; i++) s->w[i] = 0;
}
static inline void pw_cpuset_add(pw_cpuset *s, int cpu) {
  if (cpu >= 0 && cpu < PW_CPUSET_MAX) s->w[cpu / 64] |= (uint64_t)1 << (cpu % 64);
}
static inline int pw_cpuset_has(const pw_cpuset *s, int cpu) {
  return cpu >= 0 && cpu < PW_CPUSET_MAX && (s->w[cpu / 64] >> (cpu % 64) & 1);
}
int pw_cpuset_count(const pw_cpuset *s);
/* a |= b, a &= ~b, a &= b */
void pw_cpuset_or(pw_cpuset *a, const pw_cpuset *b);
void pw_cpuset_minus(pw_cpuset *a, const pw_cpuset *b);
void pw_cpuset_and(pw_cpuset *a, const pw_cpuset *b);

/* "0-3,8" into *s. PW_EFORMAT naming what is wrong (a CPU >= PW_CPUSET_MAX,
 * a range backwards, a stray character); "" and "\n" are the empty set. */
PW_MUST_CHECK int pw_cpuset_parse(const char *text, pw_cpuset *s, pw_err *err);
/* *s as a cpulist ("0-3,8"; "" when empty) into buf. PW_ETOOBIG when it
 * does not fit. */
PW_MUST_CHECK int pw_cpuset_format(const pw_cpuset *s, char *buf, size_t cap);

/* The `want` CPUs of a rank: from `allowed` (its worker's mask) less
 * `used` (other ranks' on the host), grouped by nodes[0..n_nodes) (none:
 * one node of every CPU), as described at the top. 0 with *out filled;
 * PW_EBUDGET when fewer than want CPUs are free (*out empty then). */
PW_MUST_CHECK int pw_cpuset_pick(const pw_cpuset *allowed, const pw_cpuset *used, const pw_cpuset *nodes,
                                 int n_nodes, int want, pw_cpuset *out);

#endif
