/* ckptxfer: checkpoint shards between a worker and the coordinator.
 *
 * A worker keeps nothing it cannot lose: at each checkpoint step it PUTs
 * its stages' model and optimizer files to the coordinator
 * (/v1/jobs/{id}/runs/{run}/checkpoints/{step}/stages/{stage}[/optimizer],
 * with X-Pipewright-Crc32c, the file's CRC32C) and deletes them once the
 * coordinator confirms; a resumed run GETs its stages' shards
 * (/v1/jobs/{id}/checkpoints/{step}/stages/{stage}[/optimizer]) into
 * temporary files, written as temp + fsync + rename, and loads them.
 * Authenticated with the cluster token as a bearer token.
 *
 * Threads: both block on the network and the disk and must never run on
 * the libuv loop (the worker calls them from the run's compute thread). */
#ifndef PW_CKPTXFER_H
#define PW_CKPTXFER_H

#include <stdatomic.h>
#include <stdint.h>

#include "errors.h"

typedef struct {
  const char *base_url; /* the coordinator's HTTP API, e.g. "http://10.0.0.1:8080" */
  const char *token;    /* the cluster token, or NULL / "" */
  atomic_int *abort;    /* when not NULL: a transfer stops once it is nonzero (PW_ECANCELED) */
  const char *upload_token; /* PUT: the assign's upload token (X-Pipewright-Upload-Token), or NULL */
} pw_xfer;

/* The file's CRC32C as 8 lowercase hex digits into hex[9]. */
PW_MUST_CHECK int pw_xfer_file_crc(const char *path, char hex[9], pw_err *err);

/* PUT the file at path to base_url + url_path with its CRC32C. 0 once the
 * coordinator answered 2xx; else an error naming the URL and the answer
 * (a 4xx: what the coordinator refused). *status gets the HTTP status (0
 * when none came back). */
PW_MUST_CHECK int pw_xfer_put(const pw_xfer *x, const char *url_path, const char *path, long *status, pw_err *err);
/* Whether a failed PUT may succeed later: no answer at all, the
 * coordinator busy (429, 503) or its disk full (507), or another 5xx but
 * 501 and 505 (a server that takes no uploads). A refusal (4xx) or a
 * cancel is final. */
int pw_xfer_retryable(int rc, long status);

/* GET base_url + url_path into the file at path (a temporary file beside
 * it, fsynced and renamed), at most max bytes. A 404 is PW_ENOENT. */
PW_MUST_CHECK int pw_xfer_get(const pw_xfer *x, const char *url_path, const char *path, uint64_t max, pw_err *err);

#endif
