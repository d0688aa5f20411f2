/* remote: what every subcommand that speaks the coordinator's REST API
 * shares — the common options (--coordinator, --token-file, --json,
 * --timeout, --cacert, --proxy), the connection they describe, one call
 * with the API's errors printed as the coordinator phrased them, and
 * reading fields of its JSON answers. */
#ifndef PW_CLI_REMOTE_H
#define PW_CLI_REMOTE_H

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>

#include "control.h"
#include "http_client.h"

#define PW_DEFAULT_COORDINATOR "http://127.0.0.1:8080"

typedef struct {
  const char *url_text;
  pw_http_url url;
  char token[PW_CONTROL_TOKEN_MAX + 1];
  int json;                   /* --json: print the raw responses */
  double timeout;             /* per request; an upload's stall bound */
  const char *cacert, *proxy; /* see pw_http_opts */
  char net_err[600];          /* the last transport error, as printed */
  void (*on_data)(void *ud, const char *data, size_t n); /* pw_http_opts' */
  void *ud;
  const char *header;         /* pw_http_opts' (one more request header), NULL: none */
} pw_remote;

enum { PW_CALL_OK = 0, PW_CALL_API = 1, PW_CALL_NET = 2 };
enum {
  PW_CALL_QUIET_NET = 1, /* do not print a transport error */
  PW_CALL_KEEP_API = 2   /* on an HTTP error: print nothing, keep resp for the caller */
};

/* The common options, for a getopt_long table and a usage text. */
#define PW_REMOTE_LONG_OPTS                                                                          \
  {"coordinator", required_argument, 0, 'C'}, {"token-file", required_argument, 0, 'T'},             \
      {"json", no_argument, 0, 'J'}, {"timeout", required_argument, 0, 'O'},                        \
      {"cacert", required_argument, 0, 'A'}, {"proxy", required_argument, 0, 'P'}, {"help", no_argument, 0, 'h'}

#define PW_REMOTE_USAGE                                                                              \
  "  --coordinator URL   the coordinator's API (default $PIPEWRIGHT_COORDINATOR or " PW_DEFAULT_COORDINATOR ")\n" \
  "  --token-file FILE   bearer token for the API (default $PIPEWRIGHT_TOKEN_FILE)\n"                \
  "  --json              print the coordinator's JSON answer as it is\n"                             \
  "  --timeout SECS      bound on each request (default 30)\n"                                        \
  "  --cacert FILE       CA certificates (PEM) for an https coordinator (default $CURL_CA_BUNDLE,\n" \
  "                      else the system's)\n"                                                        \
  "  --proxy URL         proxy for every host, loopback included ('' for none; default\n"           \
  "                      $https_proxy / $http_proxy / $no_proxy, never for loopback)\n"              \
  "  --help\n"

typedef struct {
  const char *coordinator, *token_file, *cacert, *proxy;
  int json;
  double timeout;
} pw_remote_opts;

/* pw_getopt (args.h) that takes the common options into *o itself: the
 * next other option's val, -1 after the last, '?' after printing what was
 * wrong (a common option's bad value too). */
int pw_remote_getopt(int argc, char **argv, const char *shortopts, const struct option *opts, pw_remote_opts *o);
/* Parses a command that takes only the common options: -1 to go on, else
 * the exit code (0 after --help, 2 on bad usage). */
int pw_remote_parse_only(int argc, char **argv, void (*usage)(FILE *), pw_remote_opts *co);
/* Resolves the URL and reads the token; prints and returns nonzero on error. */
PW_MUST_CHECK int pw_remote_init(pw_remote *r, const pw_remote_opts *o);

/* One request. PW_CALL_OK with resp filled and *out its parsed JSON body
 * (out may be NULL); PW_CALL_API after printing the coordinator's error
 * (with PW_CALL_KEEP_API: not printed, resp kept); PW_CALL_NET when it
 * could not be reached (printed unless PW_CALL_QUIET_NET; the text is kept
 * in r->net_err either way). */
PW_MUST_CHECK int pw_remote_call(pw_remote *r, const char *method, const char *target, const char *body, size_t len,
                                 int flags, pw_http_resp *resp, json_t **out);
/* As pw_remote_call, the body streamed from src (pw_http_upload). */
PW_MUST_CHECK int pw_remote_upload(pw_remote *r, const char *target, const pw_http_body_src *src, int flags,
                                   pw_http_resp *resp, json_t **out);
/* Prints an HTTP error answer: the coordinator's message, with its JSON
 * path for the errors about what was sent. */
void pw_remote_print_error(const pw_remote *r, const pw_http_resp *resp);
void pw_remote_print_raw(const pw_http_resp *resp);

/* Fields of a JSON answer, def (NAN) when absent or of another type. */
const char *pw_jstr(const json_t *o, const char *key, const char *def);
long long pw_jint(const json_t *o, const char *key, long long def);
double pw_jnum(const json_t *o, const char *key);
/* "2024-05-01 12:34:56" in local time, "-" for none. */
const char *pw_cli_fmt_time(double epoch, char *buf, int cap);

/* ---- jobs (cmd_remote.c, cmd_logs.c) ---- */

/* A job ID operand: a whole number >= 1; else prints what is wrong, -1. */
int pw_cli_job_id(const char *s, long long *id);
/* The one operand, a job ID, after the options; else prints what is wrong, -1. */
int pw_cli_job_operand(int argc, char **argv, long long *id);
/* succeeded, failed or cancelled: the job will not change again. */
int pw_cli_job_ended(const char *state);
/* Sleeps s seconds, resumed after a signal. */
void pw_cli_sleep(double s);

/* ---- datasets (cmd_dataset.c) ---- */

/* A file stored on the coordinator as a dataset. */
typedef struct {
  char id[65];             /* the sha256 of its bytes, lowercase hex */
  unsigned long long size; /* bytes */
  int existed;             /* 1: it was already stored; 0: uploaded now */
  json_t *ds;              /* the coordinator's dataset object (owned; json_decref it) */
} pw_cli_dataset;

/* Makes sure the coordinator stores the file at path: hashes it, looks
 * its sha256 up (GET /v1/datasets/ID) and uploads it only when absent,
 * streamed (POST /v1/datasets?name=N; name NULL: the file's base name),
 * checking that the id the coordinator gives is the hash of the bytes
 * sent. A token file's header is checked first. Prints what is wrong
 * ("error: FILE: ..."), returns 0 or 1. */
PW_MUST_CHECK int pw_cli_dataset_put(pw_remote *r, const char *path, const char *name, pw_cli_dataset *out);
/* "1234567 bytes (1.23M), text" or "... tokens: 1000 ids of 2 bytes, vocab 256". */
const char *pw_cli_dataset_describe(const json_t *ds, char *buf, int cap);

#endif
