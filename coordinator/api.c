/* api: the REST API's route table, alone in its file, so the server
 * (http.c) depends on the handlers and the handlers (api_info.c,
 * api_jobs.c, api_timeline.c) only on what they share (api_req.c), never
 * the other way round.
 *
 * The contract for every route is api/openapi.yaml; a test holds this
 * table and that file to each other. */
#include "api.h"

/* One route per line (tests/integration/test_openapi.py reads them):
 * method, pattern, handler, flags, and a PW_ROUTE_STREAM route's sink. */
const pw_route pw_api_routes[] = {
    {"GET", "/healthz", pw_api_healthz, PW_ROUTE_OPEN, NULL},
    {"GET", "/metrics", pw_api_metrics, 0, NULL},
    {"GET", "/v1/workers", pw_api_workers, 0, NULL},
    {"GET", "/v1/schedules", pw_api_schedules, 0, NULL},
    {"GET", "/v1/schedules/{name}/analytics", pw_api_schedule_analytics, 0, NULL},
    {"POST", "/v1/plans", pw_api_plans, PW_ROUTE_BODY, NULL},
    {"POST", "/v1/jobs", pw_api_job_submit, PW_ROUTE_BODY, NULL},
    {"GET", "/v1/jobs", pw_api_job_list, 0, NULL},
    {"GET", "/v1/jobs/{id}", pw_api_job_get, 0, NULL},
    {"DELETE", "/v1/jobs/{id}", pw_api_job_cancel, 0, NULL},
    {"POST", "/v1/jobs/{id}/retry", pw_api_job_retry, 0, NULL},
    {"GET", "/v1/jobs/{id}/metrics", pw_api_job_metrics, 0, NULL},
    {"GET", "/v1/jobs/{id}/events", pw_api_job_events, 0, NULL},
    {"GET", "/v1/jobs/{id}/events.tfevents", pw_api_job_tfevents, 0, NULL},
    {"POST", "/v1/jobs/{id}/generate", pw_api_job_generate, PW_ROUTE_BODY, NULL},
    {"GET", "/v1/jobs/{id}/timeline", pw_api_job_timeline, 0, NULL},
    {"GET", "/v1/jobs/{id}/checkpoint", pw_api_job_checkpoint, 0, NULL},
    {"GET", "/v1/jobs/{id}/checkpoints", pw_api_job_checkpoints, 0, NULL},
    {"GET", "/v1/jobs/{id}/checkpoints/{step}/stages/{stage}", pw_api_ckpt_shard, PW_ROUTE_CLUSTER, NULL},
    {"GET", "/v1/jobs/{id}/checkpoints/{step}/stages/{stage}/optimizer", pw_api_ckpt_shard, PW_ROUTE_CLUSTER, NULL},
    {"PUT", "/v1/jobs/{id}/runs/{run}/checkpoints/{step}/stages/{stage}", pw_api_ckpt_upload, PW_ROUTE_STREAM | PW_ROUTE_CLUSTER, &pw_api_ckpt_sink},
    {"PUT", "/v1/jobs/{id}/runs/{run}/checkpoints/{step}/stages/{stage}/optimizer", pw_api_ckpt_upload, PW_ROUTE_STREAM | PW_ROUTE_CLUSTER, &pw_api_ckpt_sink},
    {"POST", "/v1/datasets", pw_api_dataset_upload, PW_ROUTE_STREAM, &pw_api_dataset_sink},
    {"GET", "/v1/datasets", pw_api_dataset_list, 0, NULL},
    {"GET", "/v1/datasets/{ds}", pw_api_dataset_get, 0, NULL},
    {"GET", "/v1/datasets/{ds}/content", pw_api_dataset_content, PW_ROUTE_CLUSTER, NULL},
    {"DELETE", "/v1/datasets/{ds}", pw_api_dataset_delete, 0, NULL},
    {"POST", "/v1/checkpoints", pw_api_weights_upload, PW_ROUTE_STREAM, &pw_api_weights_sink},
    {"GET", "/v1/checkpoints", pw_api_weights_list, 0, NULL},
    {"GET", "/v1/checkpoints/{ck}", pw_api_weights_get, 0, NULL},
    {"GET", "/v1/checkpoints/{ck}/content", pw_api_weights_content, PW_ROUTE_CLUSTER, NULL},
    {"DELETE", "/v1/checkpoints/{ck}", pw_api_weights_delete, 0, NULL},
};
const int pw_api_n_routes = (int)(sizeof pw_api_routes / sizeof pw_api_routes[0]);

