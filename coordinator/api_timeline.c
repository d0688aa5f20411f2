/* api_timeline: what the REST API shows of a run's inside — the measured
 * per-rank action timeline of a sampled step next to the planner's
 * simulated one (or as Chrome trace-event JSON for Perfetto), and the
 * whole model gathered from the ranks' checkpoints as ONE safetensors file.
 *
 * Everything here is read-only: it reads the store (the plan each run was
 * dispatched with is there, in runs.plan: it is never rebuilt for a run)
 * and the checkpoint files the workers wrote. */
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
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

/* Start of the step and its span over every rank's measured actions. */
static int measured_span(const json_t *tl, double *t0, double *t1) {
  size_t i, k;
  json_t *rk, *a;
  int n = 0;
  json_array_foreach(json_object_get(tl, "ranks"), i, rk) {
    json_array_foreach(json_object_get(rk, "actions"), k, a) {
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
  json_t *doc = NULL, *sim = NULL;
  pw_err err = {0};
  if (pw_store_run_plan_json(s, r->id, &doc, &err) == 0) {
    sim = json_incref(json_object_get(doc, "analytics"));
    json_decref(doc);
  } else {
    pw_plan p;
    if (pw_plan_build(job, NULL, &p, &err)) {
      char b[600];
      pw_warn("job %lld: no plan to show: %s", (long long)r->id, pw_err_str(&err, b, sizeof b));
      return NULL;
    }
    sim = pw_sim_result_json(p.sim);
    pw_plan_free(&p);
  }
  if (!sim) return NULL;
  json_t *out = json_pack("{s:O*, s:O*, s:O*, s:O*}", "schedule", json_object_get(sim, "schedule"), "makespan",
                          json_object_get(sim, "makespan"), "bubble_ratio", json_object_get(sim, "bubble_ratio"),
                          "timeline", json_object_get(sim, "timeline"));
  json_decref(sim);
  return out;
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
    if (step >= 0)
      pw_reply_error(r, PW_ENOENT, "step",
                     "job %lld has no sampled timings for step %lld", (long long)r->id, (long long)step);
    else
      pw_reply_error(r, PW_ENOENT, "step",
                     "job %lld has no sampled timings yet", (long long)r->id);
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
  pw_job_free(&job);
  json_t *pb = planned ? json_object_get(planned, "bubble_ratio") : NULL;
  json_object_set_new(tl, "bubble",
                      json_pack("{s:o, s:O}", "measured", measured_bubble(tl), "planned", pb ? pb : json_null()));
  json_object_set_new(tl, "planned", planned ? planned : json_null());
  pw_reply_json(r, MHD_HTTP_OK, tl);
}

/* ---- checkpoint ---------------------------------------------------------- */

static int by_stage(const void *a, const void *b) {
  json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "stage"));
  json_int_t y = json_integer_value(json_object_get(*(json_t *const *)b, "stage"));
  return (x > y) - (x < y);
}

/* "<path minus .safetensors>.optim.safetensors" (lib/compute/ckpt.h's
 * naming of a stage's optimizer file). */
static void optim_path(const char *path, char *buf, size_t cap) {
  size_t n = strlen(path), k = strlen(".safetensors");
  if (n >= k && !strcmp(path + n - k, ".safetensors")) n -= k;
  snprintf(buf, cap, "%.*s.optim.safetensors", (int)n, path);
}

/* Merge the stage files (their optimizer files with optim) into one file
 * at out: a tensor present in several (tied embeddings) is taken once,
 * from the lowest stage. */
static int merge_stages(json_t *stages, const char *out, int step, const char *spec, int optim, pw_err *err) {
  size_t n = json_array_size(stages);
  json_t **order = calloc(n ? n : 1, sizeof *order);
  pw_st_file **files = calloc(n ? n : 1, sizeof *files);
  pw_st_tensor *ts = NULL;
  int nt = 0, cap = 0, rc = 0;
  if (!order || !files) {
    rc = pw_err_set(err, PW_ENOMEM, "", "out of memory");
    goto done;
  }
  for (size_t i = 0; i < n; i++) order[i] = json_array_get(stages, i);
  qsort(order, n, sizeof *order, by_stage);
  for (size_t i = 0; i < n && !rc; i++) {
    const char *path = json_string_value(json_object_get(order[i], "path"));
    long long st = (long long)json_integer_value(json_object_get(order[i], "stage"));
    if (!path) {
      rc = pw_err_set(err, PW_EINTERNAL, "", "stage %lld has no checkpoint path", st);
      break;
    }
    char opath[PATH_MAX];
    if (optim) {
      optim_path(path, opath, sizeof opath);
      path = opath;
    }
    pw_err e2 = {0};
    if ((rc = pw_st_open(path, &files[i], &e2))) {
      char b[600];
      pw_err_set(err, rc, "", "stage %lld's checkpoint: %s", st, pw_err_str(&e2, b, sizeof b));
      break;
    }
    for (int k = 0; k < pw_st_count(files[i]); k++) {
      const pw_st_tensor *t = pw_st_get(files[i], k);
      int dup = 0;
      for (int j = 0; j < nt && !dup; j++) dup = !strcmp(ts[j].name, t->name);
      if (dup) continue;
      if (nt == cap) {
        cap = cap ? cap * 2 : 64;
        pw_st_tensor *nts = realloc(ts, sizeof *ts * (size_t)cap);
        if (!nts) {
          rc = pw_err_set(err, PW_ENOMEM, "", "out of memory");
          break;
        }
        ts = nts;
      }
      ts[nt++] = *t;
    }
  }
  if (!rc) {
    char sb[24];
    snprintf(sb, sizeof sb, "%d", step);
    pw_st_meta meta[3] = {{"format", "pt"}, {"step", sb}, {"job", spec ? spec : "{}"}};
    rc = pw_st_write(out, ts, nt, meta, 3, err);
  }
done:
  for (size_t i = 0; files && i < n; i++)
    if (files[i]) pw_st_close(files[i]);
  free(files);
  free(order);
  free(ts);
  return rc;
}

/* The job's checkpoint at step `at` (the latest complete one when at < 0)
 * gathered into one whole-model file at out (optim: its optimizer state
 * instead); *step gets the step. PW_ENOENT naming the job or the step when
 * there is none. */
int pw_api_ckpt_gather(pw_store *s, int64_t job_id, int at, int optim, const char *out, int *step, pw_err *err) {
  pw_job_brief b;
  int rc = pw_store_job_brief(s, job_id, &b, err);
  if (rc) return rc;
  json_t *run = NULL, *ck = NULL;
  size_t n_stages = 0;
  if (!pw_store_run_json(s, job_id, &run, NULL)) n_stages = json_array_size(json_object_get(run, "stages"));
  json_decref(run);
  if (!n_stages) {
    free(b.spec);
    return at >= 0 ? pw_err_set(err, PW_ENOENT, "step", "job %lld has no checkpoint at step %d", (long long)job_id, at)
                   : pw_err_set(err, PW_ENOENT, "", "job %lld has no complete checkpoint yet", (long long)job_id);
  }
  if ((rc = pw_store_checkpoint_step_json(s, job_id, (int)n_stages, at, &ck, err))) {
    free(b.spec);
    return rc;
  }
  *step = (int)json_integer_value(json_object_get(ck, "step"));
  rc = merge_stages(json_object_get(ck, "stages"), out, *step, b.spec, optim, err);
  free(b.spec);
  json_decref(ck);
  return rc;
}

/* GET /v1/jobs/{id}/checkpoint: the latest step every stage has saved. */
void pw_api_job_checkpoint(pw_req *r) {
  static atomic_uint seq;
  pw_store *s = pw_api_store(r);
  if (!s) return;
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s/.checkpoint-%lld-%d-%u.safetensors", r->c->state_dir[0] ? r->c->state_dir : "/tmp",
           (long long)r->id, (int)getpid(), atomic_fetch_add(&seq, 1));
  pw_err err = {0};
  int step = 0, rc = pw_api_ckpt_gather(s, r->id, -1, 0, tmp, &step, &err);
  if (rc) {
    char eb[600];
    if (rc == PW_ENOENT && !strcmp(err.path, "job"))
      pw_reply_error(r, PW_ENOENT, "id", "no job %lld", (long long)r->id);
    else if (rc == PW_ENOENT)
      pw_reply_error(r, PW_ENOENT, "", "%s", err.msg);
    else {
      pw_warn("job %lld: cannot gather the checkpoint: %s", (long long)r->id, pw_err_str(&err, eb, sizeof eb));
      pw_reply_error(r, PW_EIO, "", "%s", err.msg);
    }
    return;
  }
  /* Unlinked at once: the open fd keeps the data until the reply is sent. */
  int fd = open(tmp, O_RDONLY | O_CLOEXEC);
  unlink(tmp);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    if (fd >= 0) close(fd);
    pw_reply_error(r, PW_EIO, "", "cannot read the merged checkpoint");
    return;
  }
  char cd[128];
  snprintf(cd, sizeof cd, "attachment; filename=\"job-%lld-step-%d.safetensors\"", (long long)r->id, step);
  pw_reply_fd(r, MHD_HTTP_OK, "application/octet-stream", fd, (uint64_t)st.st_size);
  pw_reply_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, cd);
}
