/* fetch: the worker's dataset cache — the coordinator's datasets, fetched
 * by content hash and kept under <state_dir>/cache/datasets/<id>.
 *
 * A second kind of object shares it: stored weights (a job's "init"),
 * fetched from /v1/checkpoints/<id>/content (pw_fetch_src.weights). An
 * entry is named by the hash of its bytes whatever it is, so both kinds
 * live in the one folder under the one bound and LRU order; only the URL
 * and the messages differ.
 *
 * A dataset's id is the SHA-256 of its bytes (64 lowercase hex), so an
 * entry is valid exactly when its bytes hash to its name. An entry is
 * fetched with libcurl (GET <base_url>/v1/datasets/<id>/content, with the
 * cluster token as a bearer token) into a temporary file of the cache
 * directory while it is hashed, bounded by the size the job states (else
 * by the cache's own bound), fsynced and renamed into place; a body that
 * does not hash to the id is refused, naming both hashes.
 *
 * The cache holds at most max_bytes (--cache-max). Making room evicts the
 * least recently used entries that nothing holds; an entry a run holds
 * (acquired, not yet released) is never evicted. Use order survives a
 * restart: an entry's mtime is its last use.
 *
 * Threads: acquire, refetch and pw_dscache_open_entry block on the network
 * and the disk and must never run on the libuv loop (the worker calls them
 * from the run's compute thread); release only takes a short lock and
 * touches no file, so the loop may call it. Fetches are one at a time. */
#ifndef PW_FETCH_H
#define PW_FETCH_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_CACHE_MAX_DEFAULT ((uint64_t)8 << 30) /* 8 GiB */

typedef struct pw_dscache pw_dscache;

/* Where and how an entry is fetched. */
typedef struct {
  const char *base_url;    /* the coordinator's HTTP API, e.g. "http://10.0.0.1:8080" */
  const char *token;       /* the cluster token, or NULL / "" for none */
  uint64_t size;           /* the dataset's size when the job states it, else 0 */
  atomic_int *abort;       /* when not NULL: a fetch stops once it is nonzero (PW_ECANCELED) */
  int weights;             /* 0: a dataset (/v1/datasets/<id>/content); 1: stored weights
                              (/v1/checkpoints/<id>/content, a job's "init") */
} pw_fetch_src;

/* Opens (making it when absent) the cache <state_dir>/cache/datasets:
 * indexes the entries there, removes temporary files an interrupted fetch
 * left, and evicts down to max_bytes (> 0). Calls curl_global_init: call
 * it before starting threads. */
PW_MUST_CHECK int pw_dscache_open(const char *state_dir, uint64_t max_bytes, pw_dscache **out, pw_err *err);
void pw_dscache_close(pw_dscache *c);

/* Not on the loop. Entry `id` held (fetched first when absent): its path
 * in path[cap]. Every success must be paired with a release. The bytes
 * are not hashed here (the reader verifies them: pw_dscache_open_entry). */
PW_MUST_CHECK int pw_dscache_acquire(pw_dscache *c, const char *id, const pw_fetch_src *src, char *path, size_t cap,
                                     pw_err *err);
/* Not on the loop. The held entry `id` is corrupted: its file is deleted
 * and fetched again (the entry stays held, also when this fails). */
PW_MUST_CHECK int pw_dscache_refetch(pw_dscache *c, const char *id, const pw_fetch_src *src, pw_err *err);
/* Any thread: lets go of an acquired entry (it may be evicted from now). */
void pw_dscache_release(pw_dscache *c, const char *id);

/* Opens the dataset at `path` for its caller; fails when the file is not
 * what it should be. */
typedef int (*pw_dscache_open_fn)(void *arg, const char *path, pw_err *err);
/* Not on the loop. Acquires `id` and calls open(arg, path). When open
 * fails and the file no longer hashes to id (corrupted on disk), the
 * entry is fetched again and opened once more. On success the entry stays
 * held (release it when done with it); on failure it is released. */
PW_MUST_CHECK int pw_dscache_open_entry(pw_dscache *c, const char *id, const pw_fetch_src *src,
                                        pw_dscache_open_fn open, void *arg, pw_err *err);

/* 0 when the file at path hashes to id; PW_EIO naming both hashes when
 * not (or it cannot be read). */
PW_MUST_CHECK int pw_dscache_verify(const char *path, const char *id, pw_err *err);
/* 1 when id is 64 lowercase hex characters. */
int pw_dscache_id_ok(const char *id);

/* For status and tests: bytes of the entries present, their count, and
 * whether `id` is present. */
uint64_t pw_dscache_bytes(pw_dscache *c);
int pw_dscache_count(pw_dscache *c);
int pw_dscache_has(pw_dscache *c, const char *id);
/* Parses a byte count: digits with an optional K, M, G or T suffix (powers
 * of 1024; "8G", "500M", "1048576"). 0, or PW_EINVAL. */
PW_MUST_CHECK int pw_parse_bytes(const char *s, uint64_t *out);

#endif
