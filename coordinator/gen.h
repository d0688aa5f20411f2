/* gen: the coordinator's side of serving (docs/serving.md) — the generate
 * requests in flight between the HTTP threads and the control loop.
 *
 * POST /v1/jobs/{id}/generate (api_generate.c, on libmicrohttpd's
 * threads) checks the request, registers it here and parks its
 * connection: suspended until the answer is complete, or, streaming, a
 * response whose reader suspends the connection whenever it has written
 * every token that has come. The loop sends each sequence to rank 0 of a
 * replica of the job ("generate"), and the workers' "tokens" and
 * "gen_failed" messages complete them, resuming their connections. A run
 * that ends (cancelled, failed, the coordinator stopping) fails the
 * requests still open on it. The table is under its own mutex, which is
 * also held around each suspend and resume of a parked connection, so a
 * resume can never come before its suspend. */
#ifndef PW_GEN_H
#define PW_GEN_H

#include "api.h"
#include "ctl_int.h"

/* Loop thread: unsent sequences to their workers (called on every
 * scheduling pass); those of a job that is not serving fail. */
void pw_gen_pump(pw_coord *c);
/* Loop thread: the control messages of serve runs. */
int pw_gen_on_tokens(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err);
int pw_gen_on_failed(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err);
/* Loop thread: the requests open on job (0: every job) fail with why. */
void pw_gen_job_ended(pw_coord *c, int64_t job, const char *why);
/* Open sequences of job (for its status line). */
int pw_gen_open(pw_coord *c, int64_t job);

#endif
