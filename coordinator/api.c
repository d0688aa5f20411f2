/* api: the REST API's route table and its small handlers — health, the
 * Prometheus exposition, workers, the schedule catalogue and dry-run plans.
 * The job handlers live in api_jobs.c and api_timeline.c.
 *
 * Handlers answer only through the pw_reply_* helpers (api.h) and never
 * talk to workers: the control loop does, after pw_coord_wake. The
 * contract for every route is api/openapi.yaml; a test holds this table
 * and that file to each other. */
#include <stdlib.h>
#include <string.h>

#include "spec_json.h"
#include "api.h"
#include "log.h"
#include "plan.h"
#include "schedule.h"

#ifndef PW_VERSION
#define PW_VERSION "0.0.0"
#endif

/* One route per line (tests/integration/test_openapi.py reads them). */
const pw_route pw_api_routes[] = {
    {"GET", "/healthz", pw_api_healthz, PW_ROUTE_OPEN},
    {"GET", "/metrics", pw_api_metrics, 0},
    {"GET", "/v1/workers", pw_api_workers, 0},
    {"GET", "/v1/schedules", pw_api_schedules, 0},
    {"POST", "/v1/plans", pw_api_plans, PW_ROUTE_BODY},
    {"POST", "/v1/jobs", pw_api_job_submit, PW_ROUTE_BODY},
    {"GET", "/v1/jobs", pw_api_job_list, 0},
    {"GET", "/v1/jobs/{id}", pw_api_job_get, 0},
    {"DELETE", "/v1/jobs/{id}", pw_api_job_cancel, 0},
    {"GET", "/v1/jobs/{id}/metrics", pw_api_job_metrics, 0},
    {"GET", "/v1/jobs/{id}/events", pw_api_job_events, 0},
    {"GET", "/v1/jobs/{id}/timeline", pw_api_job_timeline, 0},
    {"GET", "/v1/jobs/{id}/checkpoint", pw_api_job_checkpoint, 0},
};
const int pw_api_n_routes = (int)(sizeof pw_api_routes / sizeof pw_api_routes[0]);

pw_store *pw_api_store(pw_req *r) {
  pw_store *s = pw_coord_store(r->c);
  if (!s)
    pw_reply_error(r, MHD_HTTP_INTERNAL_SERVER_ERROR, pw_err_api_code(PW_EIO), "", "the store is not available");
  return s;
}

int pw_api_job_load(pw_req *r, pw_store *s, pw_job *job, int *state) {
  pw_job_brief b;
  pw_err err = {0};
  int rc = pw_store_job_brief(s, r->id, &b, &err);
  if (rc == PW_ENOENT) {
    pw_reply_error(r, MHD_HTTP_NOT_FOUND, pw_err_api_code(PW_ENOENT), "id", "no job %lld", (long long)r->id);
    return rc;
  }
  if (rc) {
    pw_reply_err(r, &err);
    return rc;
  }
  if (state) *state = b.state;
  json_error_t jerr;
  json_t *spec = b.spec ? json_loads(b.spec, 0, &jerr) : NULL;
  free(b.spec);
  rc = spec ? pw_job_parse(spec, NULL, job, &err) : pw_err_set(&err, PW_EINTERNAL, "spec", "stored spec is unreadable");
  json_decref(spec);
  if (rc) {
    /* It was valid when accepted: only a change of the rules can get here. */
    char b2[600];
    pw_error("job %lld: stored spec no longer parses: %s", (long long)r->id, pw_err_str(&err, b2, sizeof b2));
    pw_reply_error(r, MHD_HTTP_INTERNAL_SERVER_ERROR, pw_err_api_code(PW_EINTERNAL), err.path,
                   "the stored spec no longer parses: %s", err.msg);
  }
  return rc;
}

void pw_api_healthz(pw_req *r) {
  pw_reply_json(r, MHD_HTTP_OK, json_pack("{s:s, s:s}", "status", "ok", "version", PW_VERSION));
}

void pw_api_metrics(pw_req *r) {
  pw_reply_text(r, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", pw_coord_metrics_text(r->c));
}

void pw_api_workers(pw_req *r) { pw_reply_json(r, MHD_HTTP_OK, pw_coord_workers_json(r->c)); }

void pw_api_schedules(pw_req *r) {
  int n = 0;
  const pw_sched_info *infos = pw_sched_infos(&n);
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(arr, pw_sched_info_json(&infos[i]));
  pw_reply_json(r, MHD_HTTP_OK, json_pack("{s:o}", "schedules", arr));
}

/* POST /v1/plans[?compare=1][&schedule=NAME]: what `pipewright plan --json`
 * (or --compare --json) prints for the same spec. */
void pw_api_plans(pw_req *r) {
  int compare;
  if (pw_req_bool_arg(r, "compare", 0, &compare)) return;
  const char *sched = pw_req_arg(r, "schedule");
  if (sched && !pw_sched_info_find(sched)) {
    pw_reply_error(r, MHD_HTTP_BAD_REQUEST, pw_err_api_code(PW_EINVAL), "schedule", "unknown schedule \"%.64s\"",
                   sched);
    return;
  }
  pw_job job;
  pw_err err = {0};
  if (pw_job_parse(r->body, NULL, &job, &err)) {
    pw_reply_err(r, &err);
    return;
  }
  if (compare) {
    pw_reply_json(r, MHD_HTTP_OK, pw_plan_compare_json(&job));
    pw_job_free(&job);
    return;
  }
  pw_plan p;
  if (pw_plan_build(&job, sched, &p, &err)) {
    pw_reply_err(r, &err);
  } else {
    pw_reply_json(r, MHD_HTTP_OK, pw_plan_json(&job, &p));
    pw_plan_free(&p);
  }
  pw_job_free(&job);
}
