/* sysres: the cores and memory this process may use, and the host it runs
 * on, as the cluster engine grants them — never the whole machine's counts.
 *
 * Inside a Slurm step, a pod or a systemd unit, a process sees every CPU and
 * every byte of the machine through sysconf, yet may use only what its
 * affinity mask and its cgroup allow. Sizing threads or a memory budget on
 * the machine's counts oversubscribes the cores and gets the process
 * OOM-killed. This module reads what applies and says where each figure
 * came from, for the log and for the coordinator.
 *
 *   cores  = min(CPUs in the affinity mask (sched_getaffinity),
 *                ceil(quota / period) of every cgroup from the process's
 *                own up to the root of the mount that shows it: cgroup v2
 *                cpu.max, cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us)
 *   memory = min(physical memory, every such cgroup's v2 memory.max or v1
 *                memory.limit_in_bytes)
 *
 * The cgroups are found the way the kernel publishes them: the process's
 * paths in /proc/self/cgroup ("0::/a/b" for v2, "4:cpu,cpuacct:/a/b" for a
 * v1 hierarchy) and where each hierarchy is mounted in
 * /proc/self/mountinfo (a container with its own cgroup namespace sees its
 * own cgroup as "/", mounted at /sys/fs/cgroup; a hybrid host mounts v1
 * hierarchies beside a v2 one). A limit file that is absent is no limit; one
 * that cannot be read or parsed is ignored and named in `note`. Every file
 * read is bounded (PW_SYSRES_LINE_MAX a line, PW_SYSRES_LINES_MAX lines).
 *
 * It never allocates on the heap, never logs (the caller logs `note`) and
 * never fails: at worst it reports the machine's counts and says so. */
#ifndef PW_SYSRES_H
#define PW_SYSRES_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_SYSRES_FROM 200        /* cores_from, memory_from, note: bytes with the NUL */
#define PW_SYSRES_LINE_MAX 4096   /* a longer line of /proc/self/{cgroup,mountinfo} is skipped */
#define PW_SYSRES_LINES_MAX 100000
#define PW_HOST_ID_MAX 63         /* the id sent to the coordinator (its registry keeps 63 bytes) */
#define PW_HOST_ID_GIVEN_MAX 253  /* a given id: a DNS name (a Kubernetes node's) at most */

/* Where to read. Zero-initialized: the running process on this machine.
 * Tests point root at a fake tree (ROOT/proc/self/cgroup,
 * ROOT/proc/self/mountinfo, the mount points it names under ROOT) and give
 * the counts a fake tree cannot. */
typedef struct {
  const char *root;  /* NULL or "" : "/" */
  int cpus;          /* CPUs in the affinity mask; 0: sched_getaffinity */
  int online;        /* CPUs online; 0: sysconf(_SC_NPROCESSORS_ONLN) */
  int64_t phys;      /* bytes of physical memory; 0: sysconf pages x page size */
} pw_sysres_src;

typedef struct {
  int cores;                      /* >= 1 */
  int64_t memory;                 /* bytes; 0 when even the physical size is unknown */
  int cpus, online;               /* the affinity mask's CPUs, the CPUs online */
  int64_t phys;                   /* physical memory */
  int quota_cores;                /* the smallest cgroup quota, rounded up; 0: none */
  int64_t mem_limit;              /* the smallest cgroup memory limit; 0: none */
  char cores_from[PW_SYSRES_FROM];  /* "/sys/fs/cgroup/a/cpu.max: 150000 100000 = 1.5 CPUs, rounded up" */
  char memory_from[PW_SYSRES_FROM]; /* "physical memory", or the file and its value */
  char note[PW_SYSRES_FROM];      /* what was ignored and why; "" when nothing */
} pw_sysres;

/* Fills *out (see the top). src NULL: the running process. Always 0: a
 * cgroup that cannot be read leaves the machine's figures and says so in
 * note; the int is for the callers' must-check habit. */
PW_MUST_CHECK int pw_sysres_read(const pw_sysres_src *src, pw_sysres *out);

/* The cores this process may use (pw_sysres_read's), for callers that want
 * only that figure. */
int pw_sysres_cores(void);

/* The host id a worker registers with (workers with one id share a
 * machine's cores), into id (cap > PW_HOST_ID_MAX) and where it came from
 * into from:
 *   given non-NULL (--host-id, PW_HOST_ID): 1..PW_HOST_ID_GIVEN_MAX bytes
 *     of [A-Za-z0-9._:@-]; one longer than PW_HOST_ID_MAX is sent as
 *     "sha256:" and the first 32 hex digits of its SHA-256 (two such names
 *     stay apart); anything else is PW_EINVAL naming the offending byte;
 *   else ROOT/etc/machine-id (first line, up to PW_HOST_ID_MAX bytes);
 *   else hostname (the machine's name, passed in: tests give one). */
PW_MUST_CHECK int pw_host_id(const char *root, const char *given, const char *hostname, char *id, size_t cap,
                             char *from, size_t fromcap, pw_err *err);

#endif
