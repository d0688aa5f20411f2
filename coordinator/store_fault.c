/* store_fault: fault injection for the store's tests (store.h): writes
 * that fail as on a full disk, by count or while a file exists. Off
 * unless a test or the environment turns it on; it must never change what
 * a write does when off. */
#include "store_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Tests make writes fail as a full disk would (store.h). Counted across
 * every connection of the process; off unless a test or the environment
 * turns it on, and then one atomic add per write. */
static _Atomic int64_t fault_seen, fault_after = -1, fault_count;
static char fault_path[512];
static _Atomic int fault_path_on;

void pw_store_fault_inject(int64_t after, int64_t count) {
  atomic_store(&fault_seen, 0);
  atomic_store(&fault_count, count);
  atomic_store(&fault_after, after);
}

void pw_store_fault_file(const char *path) {
  atomic_store(&fault_path_on, 0);
  snprintf(fault_path, sizeof fault_path, "%s", path ? path : "");
  if (fault_path[0]) atomic_store(&fault_path_on, 1);
}

void pw__store_fault_from_env(void) {
  static atomic_flag once = ATOMIC_FLAG_INIT;
  if (atomic_flag_test_and_set(&once)) return;
  const char *a = getenv("PW_STORE_FAIL_AFTER"), *n = getenv("PW_STORE_FAIL_COUNT"), *f = getenv("PW_STORE_FAIL_FILE");
  if (a && *a) pw_store_fault_inject(atoll(a), n && *n ? atoll(n) : -1);
  if (f && *f) pw_store_fault_file(f);
}

/* PW_EIO as SQLITE_FULL would give, when this write is to fail. */
int pw__store_fault(pw_store *s, pw_err *err, const char *what) {
  int hit = 0;
  if (atomic_load(&fault_path_on)) hit = access(fault_path, F_OK) == 0;
  int64_t after = atomic_load(&fault_after);
  if (!hit && after >= 0) {
    int64_t k = atomic_fetch_add(&fault_seen, 1) + 1, n = atomic_load(&fault_count);
    hit = k > after && (n < 0 || k <= after + n);
  }
  if (!hit) return 0;
  return pw_err_set(err, PW_EIO, s->path, "%s: database or disk is full (sqlite %d, injected)", what, SQLITE_FULL);
}

