/* api_auto: "schedule": {"name": "auto"} at POST /v1/jobs — the coordinator
 * picks pp, schedule, virtual stages and microbatches as `pipewright plan
 * --auto` does (common/plan/cost_auto.h), before the job is validated, planned
 * and stored: what is stored and run is the chosen configuration, and the
 * choice with why is the job's "auto" event.
 *
 * The cost model: the request's schedule.profile (a calibration profile as
 * `pipewright calibrate` writes it, every rank then on that host's cores,
 * as with `plan --auto --profile`), else the FLOP model. pp goes up to the
 * connected workers / (mesh.dp x mesh.tp) (at least 1), each rank under the memory
 * bound the job would be held to (--max-rank-memory, the smallest
 * connected worker). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "cost_auto.h"

/* 1 when the body asks for "auto": schedule.name becomes a placeholder the
 * spec reader accepts (the choice replaces it) and schedule.profile, read
 * into *prof (*has_prof), leaves the body. -1 replied (a bad profile). */
int pw_api_auto_take(pw_req *r, pw_cost_profile *prof, int *has_prof) {
  *has_prof = 0;
  json_t *sched = json_object_get(r->body, "schedule");
  const json_t *name = json_object_get(sched, "name");
  if (!json_is_string(name) || strcmp(json_string_value(name), "auto")) return 0;
  json_object_set_new(sched, "name", json_string("1f1b"));
  json_t *pj = json_object_get(sched, "profile");
  if (!pj) return 1;
  pw_err err = {0};
  int rc = pw_cost_parse(pj, prof, &err);
  json_object_del(sched, "profile");
  if (rc) {
    pw_reply_error(r, PW_ESPEC, "schedule.profile", "%s: %s", err.path, err.msg);
    return -1;
  }
  *has_prof = 1;
  return 1;
}

/* Runs the choice on job (parsed with the placeholder) and applies it;
 * the event's message into msg. Replies and returns nonzero on failure. */
int pw_api_auto_choose(pw_req *r, pw_job *job, const pw_budget *b, const pw_cost_profile *prof, char *msg,
                       size_t cap) {
  int idle = 0, busy = 0, lost = 0;
  pw_coord_worker_counts(r->c, &idle, &busy, &lost);
  int workers = idle + busy, dp = job->mesh.dp > 0 ? job->mesh.dp : 1, tp = job->mesh.tp > 0 ? job->mesh.tp : 1;
  int max_pp = workers / (dp * tp); /* a stage needs a tp group per replica */
  if (max_pp < 1) max_pp = 1;
  pw_cost_model cm = {.profile = prof, .cores = prof ? prof->cores : 0};
  pw_auto_row *rows = NULL;
  int n = 0;
  pw_err err = {0};
  if (pw_plan_auto(job, &cm, b, max_pp, &rows, &n, &err)) {
    pw_reply_err(r, &err);
    return -1;
  }
  const pw_auto_row *c = &rows[0];
  job->mesh.pp = c->pp;
  job->mesh.virtual_stages = c->V;
  job->mesh.placement_kind = PW_PLACEMENT_NONE;
  job->schedule.microbatches = c->m;
  snprintf(job->schedule.name, sizeof job->schedule.name, "%s", c->schedule);
  int fit = 0;
  for (int k = 0; k < n; k++) fit += rows[k].fits;
  int len = snprintf(msg, cap,
                     "schedule auto (%s; pp up to %d: %d connected worker%s, dp %d): pp %d, %s, virtual stages %d, "
                     "%d microbatches of %d: predicted %.3f ms/step (bubble %.3f, largest rank %.1f MiB); "
                     "%d of %d configurations fit",
                     prof ? "calibrated profile" : "FLOP model", max_pp, workers, workers == 1 ? "" : "s",
                     job->mesh.dp, c->pp, c->schedule, c->V, c->m, c->mb_size, c->predicted * 1e3, c->bubble,
                     (double)c->peak_memory / (1 << 20), fit, n);
  if (n > 1 && rows[1].fits && len > 0 && (size_t)len < cap)
    snprintf(msg + len, cap - (size_t)len, "; next: pp %d, %s, V %d, m %d at %.3f ms (+%.1f %%)", rows[1].pp,
             rows[1].schedule, rows[1].V, rows[1].m, rows[1].predicted * 1e3,
             c->predicted > 0 ? 100 * (rows[1].predicted / c->predicted - 1) : 0.0);
  free(rows);
  return 0;
}
