/* fuzz_cpuset: cpulists (common/base/cpuset.h) as they come over the
 * control link (register.cpus, register.numa's parts, assign.cpus), and the
 * choice of a rank's CPUs from them.
 *
 * Properties: a list that parses writes back as a list that parses to the
 * same set (and is at most as long as the canonical form needs); a choice
 * is within the allowed set, disjoint from the used one, of exactly the
 * CPUs wanted, or refused only when too few are free. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpuset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same(const pw_cpuset *a, const pw_cpuset *b) { return !memcmp(a, b, sizeof *a); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096) return 0;
  char text[4097];
  memcpy(text, data, size);
  text[size] = 0;
  /* up to three lists: allowed | used | a NUMA node, and the count wanted */
  char *parts[3] = {text, "", ""};
  char *bar = strchr(text, '|');
  if (bar) *bar = 0, parts[1] = bar + 1, bar = strchr(parts[1], '|');
  if (bar) *bar = 0, parts[2] = bar + 1;
  pw_cpuset s[3], back;
  for (int k = 0; k < 3; k++) {
    pw_err err = {0};
    if (pw_cpuset_parse(parts[k], &s[k], &err)) {
      if (!err.msg[0]) abort(); /* a refusal says why */
      return 0;
    }
    char buf[PW_CPUSET_TEXT];
    if (pw_cpuset_format(&s[k], buf, sizeof buf)) continue; /* too long to send: fine */
    if (pw_cpuset_parse(buf, &back, &err) || !same(&back, &s[k])) abort();
  }
  int want = size ? data[0] % 16 : 1, free_n;
  pw_cpuset out, f = s[0];
  pw_cpuset_minus(&f, &s[1]);
  free_n = pw_cpuset_count(&f);
  int rc = pw_cpuset_pick(&s[0], &s[1], &s[2], 1, want, &out);
  if (rc) {
    if (want >= 1 && free_n >= want) abort();
    if (pw_cpuset_count(&out)) abort();
    return 0;
  }
  if (pw_cpuset_count(&out) != want) abort();
  pw_cpuset x = out;
  pw_cpuset_minus(&x, &f);
  if (pw_cpuset_count(&x)) abort(); /* outside the allowed, or in use */
  return 0;
}
