/* api_info: the REST API's small handlers — health, the Prometheus
 * exposition, workers, the schedule catalogue and dry-run plans. The job
 * handlers live in api_jobs.c and api_timeline.c.
 *
 * Handlers answer only through the pw_reply_* helpers (api.h) and never
 * talk to workers: the control loop does, after pw_coord_wake. */
#include <stdlib.h>
#include <string.h>

#include "spec_json.h"
#include "analytics.h"
#include "api.h"
#include "plan.h"
#include "schedule.h"

#ifndef PW_VERSION
#define PW_VERSION "0.0.0"
#endif

/* 200 {"status": "ok"} while the control loop's store writes work; 503
 * (unavailable, path "store") with the store's last error while they fail
 * or some are kept for a retry: a load balancer or a probe sees at once
 * that what workers report is not being recorded. */
void pw_api_healthz(pw_req *r) {
  char err[256];
  int pending = 0;
  if (pw_coord_store_health(r->c, err, sizeof err, &pending))
    pw_reply_error(r, PW_EUNAVAIL, "store", "degraded: store writes are failing (%d pending): %s", pending,
                   err[0] ? err : "writes pending");
  else
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

/* GET /v1/schedules/{name}/analytics?pp=&m=[&v=][&costs=F,B,I,W]: what
 * `pipewright schedules NAME --json` prints (common/plan/analytics.h). pp and
 * m are required; v defaults to the schedule's least. A malformed number
 * is a 400 here; one out of bounds or against the schedule's constraints
 * a 422 naming the parameter, an unknown name a 404 with "did you mean". */
void pw_api_schedule_analytics(pw_req *r) {
  static const char *const need[] = {"pp", "m"};
  int64_t pp, m, v;
  for (int i = 0; i < 2; i++)
    if (!pw_req_arg(r, need[i])) {
      pw_reply_error(r, PW_EINVAL, need[i], "%s is required (e.g. ?pp=4&m=8)", need[i]);
      return;
    }
  if (pw_req_int_arg(r, "pp", 0, 0, 1000000000, &pp) || pw_req_int_arg(r, "m", 0, 0, 1000000000, &m) ||
      pw_req_int_arg(r, "v", pw_analytics_default_v(r->ds), 0, 1000000000, &v))
    return;
  double costs[4];
  pw_err err = {0};
  const char *ct = pw_req_arg(r, "costs");
  if (ct && pw_analytics_costs_parse(ct, costs, &err)) {
    pw_reply_err(r, &err);
    return;
  }
  json_t *j = pw_sched_analytics_json(r->ds, (int)pp, (int)m, (int)v, ct ? costs : NULL, &err);
  if (!j) pw_reply_err(r, &err);
  else pw_reply_json(r, MHD_HTTP_OK, j);
}

/* POST /v1/plans[?compare=1][&schedule=NAME]: what `pipewright plan --json`
 * (or --compare --json) prints for the same spec. */
void pw_api_plans(pw_req *r) {
  int compare;
  if (pw_req_bool_arg(r, "compare", 0, &compare)) return;
  const char *sched = pw_req_arg(r, "schedule");
  if (sched && pw_schedule_resolve(sched)) sched = pw_schedule_resolve(sched); /* "1F1B", "ZeroBubbleH1" ... */
  if (sched && !pw_sched_info_find(sched)) {
    pw_reply_error(r, PW_EINVAL, "schedule", "unknown schedule \"%.64s\"",
                   sched);
    return;
  }
  /* The budget's cheap bounds first: planning is what they bound. A dry
   * run is not held to the workers' memory (it may plan for others). */
  pw_job job;
  pw_budget budget;
  if (pw_api_job_read(r, sched, compare, 0, &job, &budget)) return;
  if (compare) {
    pw_reply_json(r, MHD_HTTP_OK, pw_plan_compare_json(&job));
    pw_job_free(&job);
    return;
  }
  pw_plan p;
  pw_err err = {0};
  if (pw_plan_build(&job, sched, &p, &err)) {
    pw_reply_err(r, &err);
  } else {
    if (pw_plan_check_fit(&job, &p, &budget, &err)) pw_reply_err(r, &err);
    else pw_reply_json(r, MHD_HTTP_OK, pw_plan_json(&job, &p));
    pw_plan_free(&p);
  }
  pw_job_free(&job);
}
