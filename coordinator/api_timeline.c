/* api_timeline: what the REST API shows of a run's inside — the measured
 * per-rank action timeline of a sampled step next to the planner's
 * simulated one (or as Chrome trace-event JSON for Perfetto). The
 * checkpoints are api_ckpt.c's.
 *
 * Everything here is read-only: it reads the store (the plan each run was
 * dispatched with is there, in runs.plan: it is never rebuilt for a run). */
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "contention.h"
#include "log.h"
#include "plan.h"
#include "safetensors.h"

/* ---- timeline -------------------------------------------------------------- */

/* An action's kind as a letter; the store may keep it as "F" or as 0..3. */
static char kind_letter(const json_t *k) {
  if (json_is_string(k) && json_string_value(k)[0]) return json_string_value(k)[0];
  json_int_t v = json_integer_value(k);
  return json_is_integer(k) && v >= 0 && v < 4 ? "FBIW"[v] : '?';
}

/* A pipeline action, not a collective (T, D: the step report's, worker/stepend.c):
 * the bubble is the schedule's, as the planner's is. */
static int pipeline_action(const json_t *a) { return strchr("FBIW", kind_letter(json_object_get(a, "kind"))) != NULL; }

/* Start of the step and its span over every rank's measured pipeline actions. */
static int measured_span(const json_t *tl, double *t0, double *t1) {
  size_t i, k;
  json_t *rk, *a;
  int n = 0;
  json_array_foreach(json_object_get(tl, "ranks"), i, rk) {
    json_array_foreach(json_object_get(rk, "actions"), k, a) {
      if (!pipeline_action(a)) continue;
      double s = json_number_value(json_object_get(a, "start")), e = json_number_value(json_object_get(a, "end"));
      if (!n++ || s < *t0) *t0 = s;
      if (n == 1 || e > *t1) *t1 = e;
    }
  }
  return n;
}

/* Total idle / (ranks * makespan) over the measured actions; null when
 * nothing was measured. */
static json_t *measured_bubble(const json_t *tl) {
  double t0 = 0, t1 = 0;
  json_t *ranks = json_object_get(tl, "ranks"), *rk, *a;
  size_t nr = json_array_size(ranks), i, k;
  if (!measured_span(tl, &t0, &t1) || nr == 0 || t1 <= t0) return json_null();
  double busy = 0;
  json_array_foreach(ranks, i, rk) {
    json_array_foreach(json_object_get(rk, "actions"), k, a) {
      if (!pipeline_action(a)) continue;
      double d = json_number_value(json_object_get(a, "end")) - json_number_value(json_object_get(a, "start"));
      if (d > 0) busy += d;
    }
  }
  double span = t1 - t0, idle = (double)nr * span - busy;
  return json_real(idle > 0 ? idle / ((double)nr * span) : 0.0);
}

/* {"traceEvents": [...], "displayTimeUnit": "ms"} of the measured actions. */
static json_t *chrome_trace(const json_t *tl) {
  double t0 = 0, t1 = 0;
  measured_span(tl, &t0, &t1);
  json_t *evs = json_array(), *rk, *a;
  size_t i, k;
  json_array_foreach(json_object_get(tl, "ranks"), i, rk) {
    json_int_t rank = json_integer_value(json_object_get(rk, "rank"));
    char nm[48];
    snprintf(nm, sizeof nm, "rank %lld", (long long)rank);
    json_array_append_new(evs, json_pack("{s:s, s:s, s:i, s:I, s:{s:s}}", "name", "thread_name", "ph", "M", "pid", 0,
                                         "tid", rank, "args", "name", nm));
    json_array_foreach(json_object_get(rk, "actions"), k, a) {
      char kind = kind_letter(json_object_get(a, "kind"));
      json_int_t mb = json_integer_value(json_object_get(a, "mb")), st = json_integer_value(json_object_get(a, "stage"));
      double s = json_number_value(json_object_get(a, "start")), e = json_number_value(json_object_get(a, "end"));
      char name[64], ks[2] = {kind, 0};
      snprintf(name, sizeof name, "%c%lld@s%lld", kind, (long long)mb, (long long)st);
      json_array_append_new(evs, json_pack("{s:s, s:s, s:f, s:f, s:i, s:I, s:{s:I, s:I, s:s}}", "name", name, "ph",
                                           "X", "ts", (s - t0) * 1e6, "dur", (e > s ? e - s : 0) * 1e6, "pid", 0,
                                           "tid", rank, "args", "mb", mb, "stage", st, "kind", ks));
    }
  }
  return json_pack("{s:o, s:s}", "traceEvents", evs, "displayTimeUnit", "ms");
}

/* The planner's simulated step for the job: {"schedule", "makespan",
 * "bubble_ratio", "timeline"}, from the plan its latest run was dispatched
 * with (runs.plan). A job never dispatched has no plan yet: it gets a
 * preview, planned from its spec as POST /v1/plans would. NULL when
 * neither is to be had. */
static json_t *planned_json(pw_req *r, pw_store *s, const pw_job *job) {
  json_t *doc = NULL, *sim = NULL, *regions = NULL;
  pw_err err = {0};
  if (pw_store_run_plan_json(s, r->id, &doc, &err) == 0) {
    sim = json_incref(json_object_get(doc, "analytics"));
    regions = pw_regions_lanes_json(doc);
    json_decref(doc);
  } else {
    pw_plan p;
    if (pw_plan_build(job, NULL, &p, &err)) {
      char b[600];
      pw_warn("job %lld: no plan to show: %s", (long long)r->id, pw_err_str(&err, b, sizeof b));
      return NULL;
    }
    sim = pw_sim_result_json(p.sim);
    if (p.regions && (doc = pw_plan_json(job, &p))) regions = pw_regions_lanes_json(doc);
    json_decref(doc);
    pw_plan_free(&p);
  }
  if (!sim) {
    json_decref(regions);
    return NULL;
  }
  json_t *out = json_pack("{s:O*, s:O*, s:O*, s:O*}", "schedule", json_object_get(sim, "schedule"), "makespan",
                          json_object_get(sim, "makespan"), "bubble_ratio", json_object_get(sim, "bubble_ratio"),
                          "timeline", json_object_get(sim, "timeline"));
  json_decref(sim);
  if (out && regions) json_object_set_new(out, "regions", regions); /* a regions model: lanes by region */
  else json_decref(regions);
  return out;
}

/* The bubble the plan expects when its ranks share cores as ct says: the
 * plan replayed with each host's cores as slots (common/plan/share.h). null
 * when it cannot be had (logged). */
static json_t *shared_bubble(const pw_job *job, const pw_contention *ct) {
  pw_plan p;
  pw_err err = {0};
  char b[600];
  pw_sim_result *res = NULL;
  if (pw_plan_build(job, NULL, &p, &err)) {
    pw_warn("no shared-cores replay: %s", pw_err_str(&err, b, sizeof b));
    return json_null();
  }
  pw_sim_costs c = {.f = p.cost_f, .b = p.cost_b, .i = p.cost_i, .w = p.cost_w, .act_bytes = p.act_bytes,
                    .latency = PW_PLAN_LINK_LATENCY, .bandwidth = PW_PLAN_LINK_BW};
  pw_share sh = pw_contention_share(ct);
  json_t *out = json_null();
  if (pw_sim_run_shared(p.sched, &c, &sh, &res, &err))
    pw_warn("no shared-cores replay: %s", pw_err_str(&err, b, sizeof b));
  else
    out = json_real(res->bubble_ratio);
  pw_sim_result_free(res);
  pw_plan_free(&p);
  return out;
}

/* The sampled steps, compactly: every one up to 20, else a listed head
 * and the regular tail ("0, 1, 2, 100, 200, then every 100 steps to
 * 4900"), else the first 20 and the newest ("..., 4870 (412 sampled)"). */
static void steps_text(const json_t *steps, char *buf, size_t cap) {
  enum { MAX_LISTED = 20 };
  size_t n = json_array_size(steps), k, shown, off = 0;
#define STEP(i) ((long long)json_integer_value(json_array_get(steps, (i))))
  buf[0] = 0;
  if (n == 0) return;
  /* k: where the tail of equal gaps starts */
  long long d = n > 1 ? STEP(n - 1) - STEP(n - 2) : 0;
  for (k = n - 1; k > 0 && STEP(k) - STEP(k - 1) == d; k--) {
  }
  int tail = n > MAX_LISTED && k < MAX_LISTED && n - k > 2;
  shown = tail ? k + 1 : n > MAX_LISTED ? MAX_LISTED : n;
  for (size_t i = 0; i < shown && off < cap; i++)
    off += (size_t)snprintf(buf + off, cap - off, "%s%lld", i ? ", " : "", STEP(i));
  if (off >= cap) return;
  if (tail && d == 1)
    snprintf(buf + off, cap - off, ", then every step to %lld", STEP(n - 1));
  else if (tail)
    snprintf(buf + off, cap - off, ", then every %lld steps to %lld", d, STEP(n - 1));
  else if (shown < n)
    snprintf(buf + off, cap - off, ", ..., %lld (%zu sampled)", STEP(n - 1), n);
#undef STEP
}

/* The 404 for a step not sampled (step < 0: for none sampled yet), with
 * the steps that were, in the message and as "sampled": a client can pick
 * one without a second request. pw_reply_error's shape, status and code
 * (errors.h's table) plus that one field. */
static void reply_not_sampled(pw_req *r, pw_store *s, int64_t step) {
  json_t *latest = NULL, *steps;
  pw_err err = {0};
  /* the latest step's view lists every sampled one; the store has no
   * lighter query for them, and this is only the error path */
  int rc = pw_store_timeline_json(s, r->id, -1, &latest, &err);
  if (rc && rc != PW_ENOENT) {
    pw_reply_err(r, &err);
    return;
  }
  steps = rc ? json_array() : json_incref(json_object_get(latest, "steps"));
  json_decref(latest);
  char list[400], msg[600];
  steps_text(steps, list, sizeof list);
  if (step < 0)
    snprintf(msg, sizeof msg, "job %lld has no sampled steps yet", (long long)r->id);
  else if (!json_array_size(steps))
    snprintf(msg, sizeof msg, "step %lld of job %lld was not sampled; no step has been sampled yet", (long long)step,
             (long long)r->id);
  else
    snprintf(msg, sizeof msg, "step %lld of job %lld was not sampled; sampled steps: %s", (long long)step,
             (long long)r->id, list);
  pw_reply_json(r, pw_err_http_status(PW_ENOENT),
                json_pack("{s:{s:s, s:s, s:s, s:o}}", "error", "code", pw_err_api_code(PW_ENOENT), "message", msg,
                          "path", "step", "sampled", steps));
}

/* GET /v1/jobs/{id}/timeline[?step=K][&format=chrome] */
void pw_api_job_timeline(pw_req *r) {
  int64_t step;
  if (pw_req_int_arg(r, "step", -1, 0, INT_MAX, &step)) return;
  const char *fmt = pw_req_arg(r, "format");
  int chrome = fmt && !strcmp(fmt, "chrome");
  if (fmt && !chrome && strcmp(fmt, "json")) {
    pw_reply_error(r, PW_EINVAL, "format",
                   "format must be json or chrome (got \"%.32s\")", fmt);
    return;
  }
  pw_store *s = pw_api_store(r);
  pw_job job;
  if (!s || pw_api_job_load(r, s, &job, NULL)) return;
  json_t *tl = NULL;
  pw_err err = {0};
  int rc = pw_store_timeline_json(s, r->id, (int)step, &tl, &err);
  if (rc == PW_ENOENT && (step >= 0 || chrome)) {
    reply_not_sampled(r, s, step);
    pw_job_free(&job);
    return;
  }
  if (rc == PW_ENOENT) { /* nothing measured yet: the plan alone */
    tl = json_pack("{s:n, s:[], s:[]}", "step", "steps", "ranks");
  } else if (rc) {
    pw_reply_err(r, &err);
    pw_job_free(&job);
    return;
  }
  if (chrome) {
    char cd[128];
    snprintf(cd, sizeof cd, "attachment; filename=\"job-%lld-step-%lld-trace.json\"", (long long)r->id,
             (long long)json_integer_value(json_object_get(tl, "step")));
    pw_reply_json(r, MHD_HTTP_OK, chrome_trace(tl));
    pw_reply_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, cd);
    json_decref(tl);
    pw_job_free(&job);
    return;
  }
  json_t *planned = planned_json(r, s, &job);
  pw_contention ct;
  json_t *cont = NULL, *shared = json_null();
  if (!pw_contention_of_job(r->c, s, r->id, &ct)) {
    if ((cont = pw_contention_json(&ct))) {
      json_decref(shared);
      shared = shared_bubble(&job, &ct);
    }
    pw_contention_free(&ct);
  }
  pw_job_free(&job);
  json_t *pb = planned ? json_object_get(planned, "bubble_ratio") : NULL;
  json_object_set_new(tl, "bubble", json_pack("{s:o, s:O, s:o}", "measured", measured_bubble(tl), "planned",
                                              pb ? pb : json_null(), "planned_shared", shared));
  json_object_set_new(tl, "contention", cont ? cont : json_null());
  json_object_set_new(tl, "planned", planned ? planned : json_null());
  pw_reply_json(r, MHD_HTTP_OK, tl);
}
