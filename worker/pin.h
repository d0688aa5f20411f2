/* pin: a worker's threads on the CPUs its rank was given. A worker reads
 * at start the CPUs it may use (its affinity mask) and the host's NUMA
 * nodes, and sends both at register; the coordinator gives each rank of a
 * host it shares with other ranks disjoint CPUs (assign.cpus; common/base/
 * cpuset.h says how they are chosen). For its run every thread of the
 * process — the loop, the OpenBLAS pool made at start, and the compute
 * thread made later, which inherits — runs on those CPUs; when the run is
 * released, on the whole mask again. */
#ifndef PW_PIN_H
#define PW_PIN_H

#include "cpuset.h"

typedef struct {
  pw_cpuset mask;                 /* what the process may use, read at start */
  char mask_text[PW_CPUSET_TEXT]; /* as sent (register.cpus); "" when too long to send */
  char numa_text[PW_CPUSET_TEXT]; /* the nodes' cpulists, ';' between (register.numa); "" : unknown or one node */
  int pinned;                     /* the threads are on a run's CPUs now */
} pw_pin;

/* At start, before any run. Never fails: without an affinity mask or
 * node files it knows less and sends less (and is then never pinned). */
void pw_pin_init(pw_pin *p);
/* The run's CPUs (assign.cpus) for every thread of the process: 0, or a
 * negative code with why (a list outside the mask, a system call refused)
 * — the run goes on unpinned then. */
int pw_pin_apply(pw_pin *p, const char *cpus, char *why, size_t cap);
/* Back to the whole mask, once the run is released (a no-op unless pinned). */
void pw_pin_release(pw_pin *p);

#endif
