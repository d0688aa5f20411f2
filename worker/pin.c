/* pin: see pin.h. */
#include "pin.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static void to_cpu_set(const pw_cpuset *s, cpu_set_t *out) {
  CPU_ZERO(out);
  for (int c = 0; c < PW_CPUSET_MAX && c < CPU_SETSIZE; c++)
    if (pw_cpuset_has(s, c)) CPU_SET(c, out);
}

/* sched_setaffinity on every thread of the process (/proc/self/task):
 * a thread's mask is its own, and the OpenBLAS pool exists already. */
static int set_all(const pw_cpuset *s, char *why, size_t cap) {
  cpu_set_t cs;
  to_cpu_set(s, &cs);
  DIR *d = opendir("/proc/self/task");
  if (!d) {
    snprintf(why, cap, "/proc/self/task: %s", strerror(errno));
    return PW_EIO;
  }
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char *end;
    long tid = strtol(e->d_name, &end, 10);
    if (e->d_name[0] == '.' || *end || tid <= 0) continue;
    if (sched_setaffinity((pid_t)tid, sizeof cs, &cs) && errno != ESRCH) { /* a thread that just ended: fine */
      snprintf(why, cap, "sched_setaffinity(thread %ld): %s", tid, strerror(errno));
      rc = PW_EIO;
    }
  }
  closedir(d);
  return rc;
}

/* The host's NUMA nodes' cpulists, "0-7;8-15", into out ("" with one node
 * or none: nothing to choose between). */
static void read_nodes(char *out, size_t cap) {
  out[0] = 0;
  size_t l = 0;
  int n = 0;
  for (int k = 0; k < PW_CPUSET_NODES; k++) {
    char path[96], line[PW_CPUSET_TEXT];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", k);
    FILE *f = fopen(path, "r");
    if (!f) continue; /* node numbers may have holes */
    int got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!got) continue;
    line[strcspn(line, "\n")] = 0;
    pw_cpuset s;
    if (pw_cpuset_parse(line, &s, NULL) || !pw_cpuset_count(&s)) continue;
    size_t need = strlen(line) + (l ? 1 : 0);
    if (l + need >= cap) { /* too many to send: none (one node is what is assumed then) */
      out[0] = 0;
      return;
    }
    l += (size_t)snprintf(out + l, cap - l, "%s%s", l ? ";" : "", line);
    n++;
  }
  if (n < 2) out[0] = 0;
}

void pw_pin_init(pw_pin *p) {
  memset(p, 0, sizeof *p);
  cpu_set_t cs;
  if (sched_getaffinity(0, sizeof cs, &cs)) {
    pw_warn("sched_getaffinity: %s: this worker will not be pinned", strerror(errno));
    return;
  }
  for (int c = 0; c < CPU_SETSIZE && c < PW_CPUSET_MAX; c++)
    if (CPU_ISSET(c, &cs)) pw_cpuset_add(&p->mask, c);
  if (pw_cpuset_format(&p->mask, p->mask_text, sizeof p->mask_text)) p->mask_text[0] = 0;
  read_nodes(p->numa_text, sizeof p->numa_text);
}

int pw_pin_apply(pw_pin *p, const char *cpus, char *why, size_t cap) {
  pw_cpuset s, outside;
  pw_err err = {0};
  if (pw_cpuset_parse(cpus, &s, &err)) {
    snprintf(why, cap, "assign.cpus %s", err.msg);
    return PW_EPROTO;
  }
  outside = s;
  pw_cpuset_minus(&outside, &p->mask);
  if (!pw_cpuset_count(&s) || pw_cpuset_count(&outside)) {
    snprintf(why, cap, "assign.cpus '%.60s' is empty or outside this worker's CPUs (%.60s)", cpus, p->mask_text);
    return PW_EPROTO;
  }
  int rc = set_all(&s, why, cap);
  p->pinned = 1; /* even a partial pin is undone at release */
  return rc;
}

void pw_pin_release(pw_pin *p) {
  if (!p->pinned) return;
  char why[200];
  if (set_all(&p->mask, why, sizeof why)) pw_warn("unpinning: %s", why);
  p->pinned = 0;
}
