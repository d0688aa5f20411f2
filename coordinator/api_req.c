/* api_req: what every REST handler shares — the reply helpers (THE error
 * reply among them), query arguments, this thread's store, a stored job
 * read back, a submitted spec read and held to the budget. Nothing here routes or reads the body (http.c does) or
 * decides what a route answers (the handlers do). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json_short.h"
#include "spec_json.h"
#include "api.h"
#include "control.h"
#include "log.h"

/* ---- replies ------------------------------------------------------------ */

static void set_resp(pw_req *r, int status, struct MHD_Response *resp) {
  if (r->resp) MHD_destroy_response(r->resp);
  r->resp = resp;
  r->status = status;
}

/* Last resort when even building a reply failed. */
void pw_reply_oom(pw_req *r) {
  /* PW_ENOMEM's row of errors.h, written out: nothing can be built now */
  static const char body[] = "{\"error\":{\"code\":\"out_of_memory\",\"message\":\"out of memory\",\"path\":\"\"}}";
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
  if (resp) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  set_resp(r, pw_err_http_status(PW_ENOMEM), resp);
}

void pw_reply_text(pw_req *r, int status, const char *content_type, char *text) {
  if (!text) {
    pw_reply_oom(r);
    return;
  }
  struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(text);
    pw_reply_oom(r);
    return;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  set_resp(r, status, resp);
}

void pw_reply_bytes(pw_req *r, int status, const char *content_type, void *data, size_t n) {
  struct MHD_Response *resp = data ? MHD_create_response_from_buffer(n, data, MHD_RESPMEM_MUST_FREE) : NULL;
  if (!resp) {
    free(data);
    pw_reply_oom(r);
    return;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  set_resp(r, status, resp);
}

void pw_reply_json(pw_req *r, int status, json_t *j) {
  char *text = j ? pw_json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  pw_reply_text(r, status, "application/json", text);
}

void pw_reply_error(pw_req *r, int code, const char *path, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_t *e = json_pack("{s:{s:s, s:s, s:s}}", "error", "code", pw_err_api_code(code), "message", msg, "path",
                        path ? path : "");
  pw_reply_json(r, pw_err_http_status(code), e);
}

void pw_reply_err(pw_req *r, const pw_err *e) {
  int code = e->code ? e->code : PW_EINTERNAL;
  pw_reply_error(r, code, e->path, "%s", e->msg[0] ? e->msg : pw_strerror(code));
}

void pw_reply_fd(pw_req *r, int status, const char *content_type, int fd, uint64_t size) {
  struct MHD_Response *resp = MHD_create_response_from_fd64(size, fd);
  if (!resp) {
    close(fd);
    pw_reply_oom(r);
    return;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  set_resp(r, status, resp);
}

void pw_reply_header(pw_req *r, const char *name, const char *value) {
  if (r->resp) MHD_add_response_header(r->resp, name, value);
}

/* ---- query arguments ------------------------------------------------------ */

const char *pw_req_arg(pw_req *r, const char *name) {
  return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

int pw_req_int_arg(pw_req *r, const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out) {
  const char *v = pw_req_arg(r, name);
  if (!v) {
    *out = def;
    return 0;
  }
  int64_t x = 0;
  int ok = v[0] != 0 && strlen(v) <= 18;
  for (const char *p = v; ok && *p; p++) {
    if (*p < '0' || *p > '9') ok = 0;
    else x = x * 10 + (*p - '0');
  }
  if (!ok || x < lo || x > hi) {
    pw_reply_error(r, PW_EINVAL, name,
                   "%s must be an integer in [%lld, %lld] (got \"%.64s\")", name, (long long)lo, (long long)hi, v);
    return -1;
  }
  *out = x;
  return 0;
}

int pw_req_bool_arg(pw_req *r, const char *name, int def, int *out) {
  const char *v = pw_req_arg(r, name);
  if (!v) *out = def;
  else if (!strcmp(v, "1") || !strcmp(v, "true")) *out = 1;
  else if (!strcmp(v, "0") || !strcmp(v, "false")) *out = 0;
  else {
    pw_reply_error(r, PW_EINVAL, name,
                   "%s must be 1, true, 0 or false (got \"%.64s\")", name, v);
    return -1;
  }
  return 0;
}

/* ---- the store and stored jobs ------------------------------------------ */

pw_store *pw_api_store(pw_req *r) {
  pw_store *s = pw_coord_store(r->c);
  if (!s)
    pw_reply_error(r, PW_EIO, "", "the store is not available");
  return s;
}

int pw_api_job_load(pw_req *r, pw_store *s, pw_job *job, int *state) {
  pw_job_brief b;
  pw_err err = {0};
  int rc = pw_store_job_brief(s, r->id, &b, &err);
  if (rc == PW_ENOENT) {
    pw_reply_error(r, PW_ENOENT, "id", "no job %lld", (long long)r->id);
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
    pw_reply_error(r, PW_EINTERNAL, err.path,
                   "the stored spec no longer parses: %s", err.msg);
  }
  return rc;
}

/* ---- admission: the budget ---------------------------------------------- */

void pw_api_budget(pw_req *r, const pw_job *job, int for_run, pw_budget *b) {
  pw_coord *c = r->c;
  pw_budget_init(b);
  if (c->max_plan_actions > 0) b->max_actions = c->max_plan_actions;
  b->max_slice_bytes = pw_budget_slice_room(PW_CONTROL_MAX, (int64_t)job->mesh.pp * job->mesh.dp * job->mesh.tp);
  if (c->max_rank_memory) {
    b->max_rank_memory = c->max_rank_memory;
    snprintf(b->memory_from, sizeof b->memory_from, "--max-rank-memory");
  }
  if (!for_run) return;
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < c->n_workers; i++) {
    const pw_worker_info *w = &c->workers[i];
    if (!w->connected || w->memory <= 0) continue;
    if (b->max_rank_memory && (size_t)w->memory >= b->max_rank_memory) continue;
    b->max_rank_memory = (size_t)w->memory;
    snprintf(b->memory_from, sizeof b->memory_from, "the memory of worker %.40s, the smallest connected", w->name);
  }
  pthread_mutex_unlock(&c->mu);
}

int pw_api_job_read(pw_req *r, const char *schedule, int compare, int for_run, pw_job *job, pw_budget *b) {
  pw_err err = {0};
  int rc = pw_job_parse(r->body, NULL, job, &err);
  if (rc) {
    pw_reply_err(r, &err);
    return rc;
  }
  pw_api_budget(r, job, for_run, b);
  if ((rc = pw_plan_check_budget(job, schedule, compare, b, &err))) {
    /* A field the request did not write was derived: say from what. */
    int in_model = err.code == PW_ESPEC && !strncmp(err.path, "model.", 6);
    const char *key = in_model ? err.path + 6 : ""; /* after "model." */
    if (in_model && !strpbrk(key, ".[") && !json_object_get(json_object_get(r->body, "model"), key)) {
      size_t n = strlen(err.msg);
      snprintf(err.msg + n, sizeof err.msg - n, " (derived from the model's other fields: the spec as stored must "
                                                "pass its checks too)");
    }
    pw_reply_err(r, &err);
    pw_job_free(job);
  }
  return rc;
}
