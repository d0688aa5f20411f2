/* remote: the common options, the connection and one call to the
 * coordinator's REST API, shared by every remote subcommand (remote.h). */
#include "remote.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "cli.h"

/* A common option: 1 if c was one, 0 if not, -1 if its value is bad. */
static int remote_opt(pw_remote_opts *o, int c, const char *arg) {
  switch (c) {
    case 'C': o->coordinator = arg; return 1;
    case 'T': o->token_file = arg; return 1;
    case 'J': o->json = 1; return 1;
    case 'A': o->cacert = arg; return 1;
    case 'P': o->proxy = arg; return 1;
    case 'O': return pw_arg_num("--timeout", arg, 0, 86400, &o->timeout) ? -1 : 1;
    default: return 0;
  }
}

int pw_remote_getopt(int argc, char **argv, const char *shortopts, const struct option *opts, pw_remote_opts *o) {
  int c, k;
  while ((c = pw_getopt(argc, argv, shortopts, opts)) != -1 && (k = remote_opt(o, c, optarg)))
    if (k < 0) return '?';
  return c;
}

int pw_remote_parse_only(int argc, char **argv, void (*usage)(FILE *), pw_remote_opts *co) {
  static const struct option opts[] = {PW_REMOTE_LONG_OPTS, {0, 0, 0, 0}};
  optind = 1;
  int c = pw_remote_getopt(argc, argv, "h", opts, co);
  if (c == -1) return -1;
  usage(c == 'h' ? stdout : stderr);
  return c == 'h' ? 0 : 2;
}

int pw_remote_init(pw_remote *r, const pw_remote_opts *o) {
  memset(r, 0, sizeof *r);
  /* An empty --coordinator is a mistake (an unset shell variable), not a
   * wish for the default: said, not silently sent to localhost. An empty
   * PIPEWRIGHT_COORDINATOR is as good as unset, as for most tools. */
  if (o->coordinator && !*o->coordinator) {
    fprintf(stderr, "error: --coordinator is empty (give a URL such as %s, or leave the option out)\n",
            PW_DEFAULT_COORDINATOR);
    return 1;
  }
  r->url_text = o->coordinator ? o->coordinator : getenv("PIPEWRIGHT_COORDINATOR");
  if (!r->url_text || !*r->url_text) r->url_text = PW_DEFAULT_COORDINATOR;
  r->json = o->json;
  r->timeout = o->timeout > 0 ? o->timeout : PW_HTTP_DEFAULT_TIMEOUT;
  /* as the curl command does: libcurl itself does not read it */
  r->cacert = o->cacert ? o->cacert : getenv("CURL_CA_BUNDLE");
  if (r->cacert && !*r->cacert) r->cacert = NULL;
  r->proxy = o->proxy;
  pw_err err = {0};
  if (pw_http_url_parse(r->url_text, &r->url, &err)) {
    fprintf(stderr, "error: bad coordinator URL '%s': %s\n", r->url_text, err.msg);
    return 1;
  }
  const char *tf = o->token_file ? o->token_file : getenv("PIPEWRIGHT_TOKEN_FILE");
  if (tf && *tf && pw_control_read_token_file(tf, r->token, sizeof r->token, &err) < 0) {
    pw_cli_report(&err);
    return 1;
  }
  return 0;
}

/* ---- calls ------------------------------------------------------------------- */

void pw_remote_print_error(const pw_remote *r, const pw_http_resp *resp) {
  json_t *j = json_loadb(resp->body, resp->len, 0, NULL);
  json_t *e = json_object_get(j, "error");
  const char *msg = json_string_value(json_object_get(e, "message"));
  const char *path = json_string_value(json_object_get(e, "path"));
  /* the path says what to change in what was sent: shown for those errors */
  int content = resp->status == 400 || resp->status == 413 || resp->status == 422;
  if (msg && path && *path && content)
    fprintf(stderr, "error: %s: %s\n", path, msg);
  else if (msg)
    fprintf(stderr, "error: %s\n", msg);
  else {
    size_t n = strcspn(resp->body, "\r\n");
    fprintf(stderr, "error: HTTP %d from %s%s%.*s\n", resp->status, r->url_text, n ? ": " : "",
            (int)(n > 200 ? 200 : n), resp->body);
  }
  if (resp->status == 401)
    fprintf(stderr, r->token[0] ? "hint: the coordinator refused the token given\n"
                                : "hint: this coordinator needs a token: --token-file FILE or $PIPEWRIGHT_TOKEN_FILE\n");
  json_decref(j);
}

/* The end of a call (see pw_remote_call): rc and resp from the client. */
static int finish(pw_remote *r, int rc, const pw_err *err, const char *method, const char *target, int flags,
                  pw_http_resp *resp, json_t **out) {
  if (out) *out = NULL;
  if (rc) {
    if (rc == PW_EPEER)
      snprintf(r->net_err, sizeof r->net_err, "cannot reach the coordinator at %s: %s", r->url_text, err->msg);
    else
      snprintf(r->net_err, sizeof r->net_err, "coordinator at %s: %s", r->url_text, err->msg);
    if (!(flags & PW_CALL_QUIET_NET)) {
      fprintf(stderr, "error: %s\n", r->net_err);
      if (rc == PW_EPEER && !strcmp(err->msg, "connection refused"))
        fprintf(stderr, "hint: is pipewright-coordinator running there?\n");
      else if (rc == PW_EAUTH)
        fprintf(stderr, "hint: for a private CA, --cacert FILE or $CURL_CA_BUNDLE\n");
    }
    return PW_CALL_NET;
  }
  if (resp->status < 200 || resp->status > 299) {
    if (flags & PW_CALL_KEEP_API) return PW_CALL_API;
    pw_remote_print_error(r, resp);
    pw_http_resp_free(resp);
    return PW_CALL_API;
  }
  if (out) {
    json_error_t je;
    *out = json_loadb(resp->body, resp->len, 0, &je);
    if (!*out) {
      fprintf(stderr, "error: %s answered %s %s with something that is not JSON: %s\n", r->url_text, method, target,
              je.text);
      pw_http_resp_free(resp);
      return PW_CALL_API;
    }
  }
  return PW_CALL_OK;
}

int pw_remote_call(pw_remote *r, const char *method, const char *target, const char *body, size_t len, int flags,
                   pw_http_resp *resp, json_t **out) {
  pw_http_opts ho = {.token = r->token, .timeout = r->timeout, .cacert = r->cacert, .proxy = r->proxy,
                     .on_data = r->on_data, .ud = r->ud, .header = r->header};
  pw_err err = {0};
  int rc = pw_http_request(&r->url, method, target, body, len, &ho, resp, &err);
  return finish(r, rc, &err, method, target, flags, resp, out);
}

int pw_remote_upload(pw_remote *r, const char *target, const pw_http_body_src *src, int flags, pw_http_resp *resp,
                     json_t **out) {
  pw_http_opts ho = {.token = r->token, .timeout = r->timeout, .cacert = r->cacert, .proxy = r->proxy};
  pw_err err = {0};
  int rc = pw_http_upload(&r->url, "POST", target, src, &ho, resp, &err);
  return finish(r, rc, &err, "POST", target, flags, resp, out);
}

void pw_remote_print_raw(const pw_http_resp *resp) {
  fwrite(resp->body, 1, resp->len, stdout);
  if (!resp->len || resp->body[resp->len - 1] != '\n') putchar('\n');
}

/* ---- formatting ---------------------------------------------------------------- */

const char *pw_jstr(const json_t *o, const char *key, const char *def) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : def;
}

long long pw_jint(const json_t *o, const char *key, long long def) {
  json_t *v = json_object_get(o, key);
  return json_is_integer(v) ? (long long)json_integer_value(v) : json_is_real(v) ? (long long)json_real_value(v) : def;
}

double pw_jnum(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

const char *pw_cli_fmt_time(double epoch, char *buf, int cap) {
  if (isnan(epoch) || epoch <= 0) return snprintf(buf, (size_t)cap, "-"), buf;
  time_t t = (time_t)epoch;
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(buf, (size_t)cap, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

/* ---- jobs ------------------------------------------------------------------------ */

int pw_cli_job_id(const char *s, long long *id) { return pw_arg_ll("job ID", s, 1, LLONG_MAX, id); }

int pw_cli_job_operand(int argc, char **argv, long long *id) {
  return pw_args_operands(argc, argv, 1, 1, "the job ID") || pw_cli_job_id(argv[optind], id) ? -1 : 0;
}

int pw_cli_job_ended(const char *state) {
  return !strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled");
}

void pw_cli_sleep(double s) {
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}
