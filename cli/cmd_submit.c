/* cmd_submit: `pipewright submit --job FILE` — POST /v1/jobs.
 *
 * The coordinator validates, plans and queues; this sends the job file as
 * written, with one change: a relative data.path is made absolute the way
 * `pipewright train` reads it (as given if it exists from the working
 * directory, else relative to the job file's folder). When the coordinator
 * refuses that path (a 422 at data.path: it has no --data-root covering
 * it, or cannot see the file), the file is stored on the coordinator as a
 * dataset — looked up by its sha256, uploaded only if absent — and the job
 * is sent again with data.dataset instead, saying so in one line. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "remote.h"

#define JOB_MAX ((size_t)64 << 20)

/* The whole job file (or stdin for "-"); NULL with errno set on failure. */
static char *read_all(const char *path, size_t *len) {
  FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (n == cap) {
      char *nb = cap < JOB_MAX ? realloc(buf, cap * 2) : NULL;
      if (!nb) {
        free(buf);
        buf = NULL;
        errno = cap < JOB_MAX ? ENOMEM : EFBIG;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    size_t k = fread(buf + n, 1, cap - n, f);
    n += k;
    if (k == 0) break;
  }
  if (buf && ferror(f)) {
    free(buf);
    buf = NULL;
    errno = EIO;
  }
  if (f != stdin) fclose(f);
  *len = n;
  return buf;
}

/* data.path made absolute (see the top): written back into the job, and
 * into local (the file to upload if the coordinator cannot use the path).
 * local stays "" when the job has no data.path. */
static int resolve_data_path(json_t *job, const char *job_path, char *local, size_t cap) {
  local[0] = 0;
  json_t *data = json_object_get(job, "data");
  const char *p = json_string_value(json_object_get(data, "path"));
  if (!p || !*p) return 0;
  char dir[PATH_MAX], cwd[PATH_MAX], tmp[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) {
    fprintf(stderr, "error: the working directory: %s\n", strerror(errno));
    return 1;
  }
  int n;
  if (p[0] == '/') {
    n = snprintf(local, cap, "%s", p);
  } else if (access(p, F_OK) == 0 || !strcmp(job_path, "-")) {
    n = snprintf(local, cap, "%s/%s", cwd, p);
  } else {
    snprintf(tmp, sizeof tmp, "%s", job_path);
    snprintf(dir, sizeof dir, "%s", dirname(tmp));
    n = dir[0] == '/' ? snprintf(local, cap, "%s/%s", dir, p) : snprintf(local, cap, "%s/%s/%s", cwd, dir, p);
  }
  if (n < 0 || (size_t)n >= cap) {
    fprintf(stderr, "error: data.path: too long once made absolute\n");
    return 1;
  }
  /* its folder without "..", "." or symlinks, to show (the file's own name kept) */
  char d2[PATH_MAX], b2[PATH_MAX], real[PATH_MAX];
  snprintf(d2, sizeof d2, "%s", local);
  snprintf(b2, sizeof b2, "%s", local);
  if (realpath(dirname(d2), real)) {
    const char *base = basename(b2);
    if ((n = snprintf(tmp, sizeof tmp, "%s/%s", strcmp(real, "/") ? real : "", base)) > 0 && (size_t)n < cap)
      memcpy(local, tmp, (size_t)n + 1);
  }
  if (strcmp(local, p) && json_object_set_new(data, "path", json_string(local))) {
    fprintf(stderr, "error: out of memory\n");
    return 1;
  }
  return 0;
}

/* data.tokenizer naming a file (not a stored dataset's id): the file is
 * stored on the coordinator as a dataset (found there by its sha256, or
 * uploaded) and the job names its id instead. Taken from here if it
 * exists, else from the job file's folder, like data.path. 0, or 1 after
 * saying what is wrong. */
static int upload_tokenizer(pw_remote *r, json_t *job, const char *job_path, int quiet) {
  json_t *data = json_object_get(job, "data");
  const char *t = json_string_value(json_object_get(data, "tokenizer"));
  if (!t || !*t) return 0;
  size_t n = strlen(t);
  int id = n == 64;
  for (size_t i = 0; id && i < n; i++) id = (t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f');
  if (id) return 0;
  char local[PATH_MAX], tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", job_path);
  if (t[0] == '/' || access(t, F_OK) == 0 || !strcmp(job_path, "-"))
    snprintf(local, sizeof local, "%s", t);
  else if (snprintf(local, sizeof local, "%s/%s", dirname(tmp), t) >= (int)sizeof local) {
    fprintf(stderr, "error: data.tokenizer: too long\n");
    return 1;
  }
  pw_cli_dataset ds;
  if (pw_cli_dataset_put(r, local, NULL, &ds)) return 1;
  if (json_object_set_new(data, "tokenizer", json_string(ds.id))) {
    json_decref(ds.ds);
    fprintf(stderr, "error: out of memory\n");
    return 1;
  }
  fprintf(quiet || r->json ? stderr : stdout, "data.tokenizer %s: %s as dataset %s\n", local,
          ds.existed ? "already stored" : "uploaded", ds.id);
  json_decref(ds.ds);
  return 0;
}

/* An API error of HTTP status `status` naming field `path`. */
static int error_at(const pw_http_resp *resp, int status, const char *field) {
  if (resp->status != status) return 0;
  json_t *j = json_loadb(resp->body, resp->len, 0, NULL);
  const char *path = json_string_value(json_object_get(json_object_get(j, "error"), "path"));
  int yes = path && !strcmp(path, field);
  json_decref(j);
  return yes;
}

/* A 422 about data.path: the coordinator cannot use the path as it is. */
static int refused_path(const pw_http_resp *resp) { return error_at(resp, 422, "data.path"); }

/* A 409 about the Idempotency-Key: with a data.path, the job this key made
 * may be this one as sent the second time, with data.dataset (see the
 * top): that is tried before the conflict is believed. */
static int key_conflict(const pw_http_resp *resp) { return error_at(resp, 409, "Idempotency-Key"); }

static void submit_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright submit --job FILE [options]\n"
          "  --job FILE          the job spec (JSON; - reads stdin): the coordinator validates and\n"
          "                      plans it. A relative data.path is taken from here if it exists,\n"
          "                      else from FILE's folder; if the coordinator cannot use that path\n"
          "                      (no --data-root covers it), the file is uploaded as a dataset (or\n"
          "                      found already stored) and the job names it as data.dataset\n"
          "  --key KEY           an idempotency key (Idempotency-Key): a second submit with the same\n"
          "                      key and job returns the first job (whatever its state) instead of\n"
          "                      queuing another; with another job it is refused. For scripts that\n"
          "                      may run again, e.g. a requeued batch job: KEY from its job id\n"
          "  --quiet             print only the new job's id\n" PW_REMOTE_USAGE);
}

int pw_cmd_submit(int argc, char **argv) {
  static const struct option opts[] = {
      {"job", required_argument, 0, 'j'}, {"quiet", no_argument, 0, 'q'}, {"key", required_argument, 0, 'K'},
      PW_REMOTE_LONG_OPTS, {0, 0, 0, 0}};
  pw_remote_opts co = {0};
  const char *job_path = NULL, *key = NULL;
  int quiet = 0, c;
  optind = 1;
  while ((c = pw_remote_getopt(argc, argv, "j:qh", opts, &co)) != -1) {
    switch (c) {
      case 'j': job_path = optarg; break;
      case 'q': quiet = 1; break;
      case 'K': key = optarg; break;
      case 'h': submit_usage(stdout); return 0;
      default: submit_usage(stderr); return 2;
    }
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL) || pw_args_required(job_path, "--job FILE")) {
    submit_usage(stderr);
    return 2;
  }
  char key_hdr[256];
  if (key && (strlen(key) < 1 || strlen(key) > 200 || strpbrk(key, " \t\r\n"))) {
    fprintf(stderr, "error: --key: 1 to 200 printable characters without spaces\n");
    return 2;
  }
  if (key) snprintf(key_hdr, sizeof key_hdr, "Idempotency-Key: %s", key);
  pw_remote r;
  if (pw_remote_init(&r, &co)) return 1;
  r.header = key ? key_hdr : NULL;
  size_t len;
  char *text = read_all(job_path, &len);
  if (!text) {
    fprintf(stderr, "error: cannot read %s: %s\n", strcmp(job_path, "-") ? job_path : "stdin", strerror(errno));
    return 1;
  }
  /* not JSON: sent as it is, for the coordinator to say what is wrong */
  json_t *job = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
  char local[PATH_MAX];
  local[0] = 0;
  if (job && resolve_data_path(job, job_path, local, sizeof local)) {
    free(text);
    json_decref(job);
    return 1;
  }
  const char *tk = job ? json_string_value(json_object_get(json_object_get(job, "data"), "tokenizer")) : NULL;
  char tk_before[PATH_MAX];
  snprintf(tk_before, sizeof tk_before, "%s", tk ? tk : "");
  if (job && upload_tokenizer(&r, job, job_path, quiet)) {
    free(text);
    json_decref(job);
    return 1;
  }
  tk = job ? json_string_value(json_object_get(json_object_get(job, "data"), "tokenizer")) : NULL;
  int changed = local[0] || (tk && strcmp(tk, tk_before));
  char *body = job && changed ? json_dumps(job, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;
  if (job && changed && !body) {
    fprintf(stderr, "error: out of memory\n");
    free(text);
    json_decref(job);
    return 1;
  }
  pw_http_resp resp;
  json_t *j = NULL;
  int rc = pw_remote_call(&r, "POST", "/v1/jobs", body ? body : text, body ? strlen(body) : len,
                          local[0] ? PW_CALL_KEEP_API : 0, &resp, &j);
  free(body);
  free(text);
  body = NULL;
  if (rc == PW_CALL_API && local[0]) {
    struct stat st;
    if (!(refused_path(&resp) || (key && key_conflict(&resp))) || stat(local, &st) != 0 || !S_ISREG(st.st_mode)) {
      pw_remote_print_error(&r, &resp);
      if (refused_path(&resp)) {
        char why[128];
        snprintf(why, sizeof why, "%s", stat(local, &st) ? strerror(errno) : "not a regular file");
        why[0] = (char)tolower((unsigned char)why[0]);
        fprintf(stderr, "error: %s: %s here either, so it cannot be uploaded instead\n", local, why);
      }
      pw_http_resp_free(&resp);
      json_decref(job);
      return 1;
    }
    pw_http_resp_free(&resp);
    pw_cli_dataset ds;
    if (pw_cli_dataset_put(&r, local, NULL, &ds)) {
      json_decref(job);
      return 1;
    }
    json_t *data = json_object_get(job, "data");
    if (json_object_del(data, "path") || json_object_set_new(data, "dataset", json_string(ds.id)) ||
        !(body = json_dumps(job, JSON_PRESERVE_ORDER | JSON_COMPACT))) {
      fprintf(stderr, "error: out of memory\n");
      json_decref(ds.ds);
      json_decref(job);
      return 1;
    }
    char d[160];
    /* stdout holds only the id with --quiet, only JSON with --json */
    fprintf(quiet || r.json ? stderr : stdout, "data.path %s: %s as dataset %s: %s\n", local,
            ds.existed ? "already stored" : "uploaded", ds.id, pw_cli_dataset_describe(ds.ds, d, sizeof d));
    json_decref(ds.ds);
    rc = pw_remote_call(&r, "POST", "/v1/jobs", body, strlen(body), 0, &resp, &j);
    free(body);
  }
  json_decref(job);
  if (rc) return 1;
  long long id = pw_jint(j, "id", 0);
  if (r.json)
    pw_remote_print_raw(&resp);
  else if (quiet)
    printf("%lld\n", id);
  else
    printf("job %lld %s%s\n", id, pw_jstr(j, "state", "queued"),
           json_is_true(json_object_get(j, "existing")) ? " (submitted before with this key)" : "");
  json_decref(j);
  pw_http_resp_free(&resp);
  return 0;
}
