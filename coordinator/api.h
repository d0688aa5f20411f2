/* api: the interface between the HTTP server (http.c) and the REST API's
 * handlers (api.c, api_jobs.c, api_timeline.c). Private to coordinator/.
 *
 * The server owns everything HTTP: it bounds the URL and the body, checks
 * the bearer token, finds the route, reads and parses the body once, and
 * queues the reply the handler leaves in the request. A handler never
 * touches libmicrohttpd's connection itself; it reads its inputs from the
 * request (path id, parsed body, query arguments) and answers through the
 * pw_reply_* helpers, so every reply — errors above all — has one shape:
 *   {"error": {"code": "<api code>", "message": "...", "path": "..."}}
 * with the status and code from common/base/errors.h's table. */
#ifndef PW_API_H
#define PW_API_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdint.h>

#include "budget.h"
#include "coord.h"
#include "datasets.h"
#include "spec.h"

#define PW_HTTP_MAX_URL 2048               /* bytes of the request target, query included */
#define PW_HTTP_DEFAULT_MAX_BODY (1 << 20) /* when c->max_body is 0 */
/* A streamed upload (PW_ROUTE_STREAM) when c->max_upload is 0: 16 GiB. A
 * dataset is written to disk as it arrives, so the bound is about disk, not
 * memory; a full disk answers 507 whatever the bound. */
#define PW_HTTP_DEFAULT_MAX_UPLOAD ((uint64_t)16 << 30)

typedef struct pw_req pw_req;
typedef void (*pw_handler)(pw_req *r);

/* Route flags. */
enum {
  PW_ROUTE_BODY = 1,    /* takes a JSON body: parsed before the handler runs */
  PW_ROUTE_OPEN = 2,    /* answers without the API token (health checks) */
  PW_ROUTE_STREAM = 4,  /* a raw body, handed piece by piece to the route's sink, never held whole */
  PW_ROUTE_CLUSTER = 8  /* the cluster token is accepted as well as the API token (workers) */
};

/* Where a PW_ROUTE_STREAM route's body goes. begin runs on the first
 * access call once the route and the token are checked (declared: the
 * Content-Length, -1 when none); chunk gets each piece as it arrives. Both
 * run on libmicrohttpd's threads, so they only write and hash; either may
 * refuse by setting an error reply and returning nonzero, after which the
 * rest of the body is read and dropped. When the body is complete and
 * nothing was refused, the route's handler runs (on the pool when pooled)
 * and finishes the upload. done runs when the request ends, whatever
 * happened: it frees r->stream (and removes what was not finished). */
typedef struct {
  int (*begin)(pw_req *r, int64_t declared);
  int (*chunk)(pw_req *r, const char *data, size_t n);
  void (*done)(pw_req *r);
} pw_stream_sink;

/* One route: method, path pattern ("{id}" matches a positive decimal job
 * id, "{ds}" a dataset id of 64 lowercase hex digits, "{ck}" a weights id
 * alike, "{name}" a schedule's name of 1 to 64 letters, digits, '-' and
 * '_' (all three land in r->ds), "{run}", "{step}" and "{stage}" a decimal
 * number >= 0 of at most 9 digits, any other segment matches itself),
 * handler, flags, and for PW_ROUTE_STREAM its sink. */
typedef struct {
  const char *method;
  const char *pattern;
  pw_handler fn;
  int flags;
  const pw_stream_sink *sink;
} pw_route;

/* The table, in api.c (alone there). tests/integration/test_openapi.py reads it from the
 * source to check it against api/openapi.yaml: keep one route per line,
 * written as {"METHOD", "/pattern", handler, flags}. */
extern const pw_route pw_api_routes[];
extern const int pw_api_n_routes;

struct pw_req {
  pw_coord *c;
  struct MHD_Connection *conn;
  const char *method; /* "GET", "POST", ... (HEAD is routed as GET) */
  const char *path;   /* decoded, without the query */
  int64_t id;         /* the {id} of the pattern, 0 when it has none */
  char ds[65];        /* the {ds}, {ck} or {name} of the pattern, "" when it has none */
  int64_t run;        /* the {run}, {step} and {stage} of the pattern, 0 when it has none */
  int step, stage;
  void *stream;       /* PW_ROUTE_STREAM: the sink's state (begin sets it, done frees it) */
  int parked;         /* the handler suspended the connection and left no reply: whoever
                         sets it resumes the connection, whose next access call sends it */
  json_t *body;       /* PW_ROUTE_BODY routes: the parsed body (borrowed) */
  /* the reply, set by the pw_reply_* helpers */
  int status;
  struct MHD_Response *resp;
};

/* ---- replies (api_req.c); a later reply replaces an earlier one --------- */

/* JSON reply; steals j (NULL gives a 500). */
void pw_reply_json(pw_req *r, int status, json_t *j);
/* THE error reply: every error the API gives is built here, its HTTP
 * status and API code taken from errors.h's table for code (a PW_E*), so
 * a handler never writes a status of its own. path may be NULL (then ""). */
void pw_reply_error(pw_req *r, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* An error from a pw_err: status and code from errors.h's table. */
void pw_reply_err(pw_req *r, const pw_err *e);
/* A malloc'd text body (stolen; NULL gives a 500) with its content type. */
void pw_reply_text(pw_req *r, int status, const char *content_type, char *text);
/* A malloc'd binary body of n bytes (stolen; NULL gives a 500). */
void pw_reply_bytes(pw_req *r, int status, const char *content_type, void *data, size_t n);
/* A file body from an open fd (the response closes it), size bytes. */
void pw_reply_fd(pw_req *r, int status, const char *content_type, int fd, uint64_t size);
/* The fixed out-of-memory error, for when even building a reply failed. */
void pw_reply_oom(pw_req *r);
/* Adds a header to the reply set last (no-op without one). */
void pw_reply_header(pw_req *r, const char *name, const char *value);

/* ---- query arguments (api_req.c) ----------------------------------------- */

/* The query argument's value, NULL when absent. */
const char *pw_req_arg(pw_req *r, const char *name);
/* An integer query argument in [lo, hi]; def when absent. On a bad value
 * replies 400 (invalid_argument, path = the argument's name) and returns -1. */
PW_MUST_CHECK int pw_req_int_arg(pw_req *r, const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out);
/* A boolean query argument ("1"/"true"/"0"/"false"); def when absent; -1
 * after replying 400 on anything else. */
PW_MUST_CHECK int pw_req_bool_arg(pw_req *r, const char *name, int def, int *out);

/* ---- the server (http.c) -------------------------------------------------- */

/* Called on a pool worker with the request's path before each pooled
 * (expensive) handler runs. For tests: a hook that blocks holds the worker,
 * so a test can fill the pool and its queue deterministically. NULL: none. */
typedef void (*pw_http_pool_hook)(const char *path);
void pw_http_set_pool_hook(pw_http_pool_hook fn);

/* ---- handlers --------------------------------------------------------------- */

/* api_info.c */
void pw_api_healthz(pw_req *r);
void pw_api_metrics(pw_req *r);
void pw_api_workers(pw_req *r);
void pw_api_schedules(pw_req *r);
void pw_api_schedule_analytics(pw_req *r);
void pw_api_plans(pw_req *r);
/* api_jobs.c */
void pw_api_job_submit(pw_req *r);
void pw_api_job_list(pw_req *r);
void pw_api_job_get(pw_req *r);
void pw_api_job_cancel(pw_req *r);
void pw_api_job_retry(pw_req *r);
void pw_api_job_metrics(pw_req *r);
void pw_api_job_events(pw_req *r);
void pw_api_job_tfevents(pw_req *r);
/* api_generate.c (gen.h): text from a serve job */
void pw_api_job_generate(pw_req *r);
/* api_datasets.c */
void pw_api_dataset_upload(pw_req *r);
void pw_api_dataset_list(pw_req *r);
void pw_api_dataset_get(pw_req *r);
void pw_api_dataset_content(pw_req *r);
void pw_api_dataset_delete(pw_req *r);
extern const pw_stream_sink pw_api_dataset_sink;
/* api_data.c, for submit. pw_api_data_check, before planning: data.path
 * checked against --data-root (422 at data.path naming the path and the
 * root) and opened once beneath it, data.dataset checked against the store
 * (422 when unknown), not both; *fd gets the open file (-1 when the job
 * names no path; the caller closes it). pw_api_data_resolve, after: the
 * file (fd) imported into the dataset store and the job switched to
 * data.dataset, then the dataset held to the job (kind tokens needs a token
 * file within model_vocab). Both reply and return nonzero on failure. */
PW_MUST_CHECK int pw_api_data_check(pw_req *r, pw_store *s, const pw_job *job, int *fd);
PW_MUST_CHECK int pw_api_data_resolve(pw_req *r, pw_store *s, pw_job *job, int fd, int model_vocab);

/* api_tokenizer.c: data.tokenizer — a stored dataset holding a
 * tokenizer.json whose ids fit the model (else a 422 at data.tokenizer
 * saying why; -1 after the reply). pw_api_tokenizer_lock gives the
 * tokenizer of a dataset id (opened once, kept among the last few) with
 * the lock held: use it, then pw_api_tokenizer_unlock (not called when it
 * fails). pw_api_tokenizers_close at shutdown. */
struct pw_tokenizer;
PW_MUST_CHECK int pw_api_tokenizer_check(pw_req *r, const pw_job *job);
PW_MUST_CHECK int pw_api_tokenizer_lock(pw_coord *c, const char *id, struct pw_tokenizer **tok, pw_err *err);
void pw_api_tokenizer_unlock(void);
/* api_timeline.c */
void pw_api_job_timeline(pw_req *r);
/* api_ckpt.c: checkpoints in the coordinator's store (checkpoints.h) */
void pw_api_job_checkpoint(pw_req *r);
void pw_api_job_checkpoints(pw_req *r);
void pw_api_ckpt_upload(pw_req *r);
void pw_api_ckpt_shard(pw_req *r);
extern const pw_stream_sink pw_api_ckpt_sink;
/* DELETE /v1/jobs/{id}?purge=1 (api_jobs.c's cancel hands it over). */
void pw_api_job_purge(pw_req *r);
/* api_weights.c: stored weights ("{ck}" is r->ds) */
void pw_api_weights_upload(pw_req *r);
void pw_api_weights_list(pw_req *r);
void pw_api_weights_get(pw_req *r);
void pw_api_weights_content(pw_req *r);
void pw_api_weights_delete(pw_req *r);
extern const pw_stream_sink pw_api_weights_sink;

/* api_req.c: the budget this coordinator holds a spec to (common/plan/budget.h):
 * its options (--max-plan-actions, --max-rank-memory), the assign message's
 * bound for the job's ranks, and — for a job to run (for_run), not a dry-run
 * plan — the smallest memory a connected worker reported. */
void pw_api_budget(pw_req *r, const pw_job *job, int for_run, pw_budget *b);
/* Parse the body as a job spec and run the budget's spec-only checks for
 * the schedule (NULL: the job's) or all of them (compare): replies (422
 * naming the field) and returns nonzero on failure; else *job is the
 * caller's to free. */
PW_MUST_CHECK int pw_api_job_read(pw_req *r, const char *schedule, int compare, int for_run, pw_job *job, pw_budget *b);

/* api_auto.c: "schedule": {"name": "auto"} at POST /v1/jobs. _take: 1
 * when the body asks for it (schedule.name set to a placeholder, its
 * schedule.profile moved into *prof, *has_prof), 0 when not, -1 replied.
 * _choose: applies the least predicted configuration to job (read with the
 * placeholder) and writes why into msg; nonzero replied. */
PW_MUST_CHECK int pw_api_auto_take(pw_req *r, pw_cost_profile *prof, int *has_prof);
PW_MUST_CHECK int pw_api_auto_choose(pw_req *r, pw_job *job, const pw_budget *b, const pw_cost_profile *prof,
                                     char *msg, size_t cap);

/* api_req.c, shared by the job handlers: the store of this thread, or a 500 reply and
 * NULL. */
pw_store *pw_api_store(pw_req *r);
/* api_objects.c, for the upload sinks' begin: a declared body larger than
 * the state directory's free space is a 507 ("the <what> is N bytes;
 * ...") and -1. */
PW_MUST_CHECK int pw_api_body_fits(pw_req *r, int64_t declared, const char *what);
/* The job's stored spec parsed back (its plan can be rebuilt); replies and
 * returns nonzero on failure. 404 when the job does not exist. *state gets
 * the job's state when not NULL. */
PW_MUST_CHECK int pw_api_job_load(pw_req *r, pw_store *s, pw_job *job, int *state);

#endif
