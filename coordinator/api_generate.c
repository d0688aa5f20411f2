/* api_generate: POST /v1/jobs/{id}/generate and the requests in flight
 * (gen.h) — checked and parked on libmicrohttpd's threads, sent and
 * completed on the control loop.
 *
 * A request is one or more prompts (its sequences), each sent to a
 * replica's rank 0 under an id of its own; it is answered once every
 * sequence has its tokens (or, streaming, as they come: one server-sent
 * event per token, then "done"). Everything is bounded: the body (the
 * server's bound), prompts per request, open sequences per job
 * (serve.max_sequences * mesh.dp + serve.max_queue: beyond, 429). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "gen.h"
#include "json_short.h"
#include "log.h"
#include "tokenizer.h"

#define MAX_PROMPTS 64
#define DEFAULT_MAX_TOKENS 64

typedef struct {
  int64_t id;            /* the sequence's id in the workers' messages */
  int n_prompt;
  int32_t *prompt;
  int32_t *tok;          /* [max_tokens] */
  int n_tok, sent, streamed;
  int replica;           /* where it was sent */
  double t_first, t_last;
} gseq;

typedef struct pw_gen pw_gen;
struct pw_gen {
  pw_coord *c;
  int64_t job;
  int text;              /* a text job: tokens are bytes */
  char tok_id[65];       /* data.tokenizer: prompts may be text, answers carry text; "" none */
  int k;                 /* sequences */
  gseq *seq;
  int max_tokens, top_k;
  double temperature, top_p;
  int64_t seed;
  int stream;
  int left;              /* sequences not complete */
  int failed;            /* with error below */
  int err_code;
  char error[300];
  int final_sent;        /* stream: the last event is made */
  char *out;             /* stream: events made, not yet all read */
  size_t out_len, out_off, out_cap;
  int suspended;         /* its connection is suspended, waiting for us */
  int refs;              /* the table's and (streaming) the response's */
  pw_req *r;             /* not streaming: the parked request (valid while suspended) */
  struct MHD_Connection *conn;
  double t0;
  pw_gen *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* the table, and suspend/resume */
static pw_gen *table;
static int64_t next_id = 1;

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void gen_free(pw_gen *g) {
  for (int i = 0; i < g->k; i++) free(g->seq[i].prompt), free(g->seq[i].tok);
  free(g->seq);
  free(g->out);
  free(g);
}

/* mu held. */
static void unref(pw_gen *g) {
  if (--g->refs == 0) gen_free(g);
}

static void unlink_gen(pw_gen *g) {
  for (pw_gen **p = &table; *p; p = &(*p)->next)
    if (*p == g) {
      *p = g->next;
      unref(g);
      return;
    }
}

int pw_gen_open(pw_coord *c, int64_t job) {
  int n = 0;
  pthread_mutex_lock(&mu);
  for (pw_gen *g = table; g; g = g->next)
    if (g->c == c && g->job == job) n += g->left;
  pthread_mutex_unlock(&mu);
  return n;
}

/* ---- the answer ---------------------------------------------------------- */

/* Bytes as text: UTF-8 kept, any other byte as U+FFFD. */
static json_t *text_of(const int32_t *t, int n) {
  char *s = malloc((size_t)n * 3 + 1), *o = s;
  if (!s) return NULL;
  for (int i = 0; i < n;) {
    unsigned char b = (unsigned char)t[i];
    int len = b < 0x80                             ? 1
              : (b & 0xe0) == 0xc0 && b >= 0xc2    ? 2
              : (b & 0xf0) == 0xe0                 ? 3
              : (b & 0xf8) == 0xf0 && b <= 0xf4    ? 4
                                                   : 0;
    int ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; k++) ok = ((unsigned char)t[i + k] & 0xc0) == 0x80;
    char tmp[4];
    for (int k = 0; ok && k < len; k++) tmp[k] = (char)t[i + k];
    json_t *probe = ok ? json_stringn(tmp, (size_t)len) : NULL; /* overlong, surrogate: jansson says */
    ok = probe != NULL;
    json_decref(probe);
    if (ok) {
      memcpy(o, tmp, (size_t)len), o += len, i += len;
    } else {
      memcpy(o, "\xef\xbf\xbd", 3), o += 3, i++;
    }
  }
  json_t *j = json_stringn(s, (size_t)(o - s));
  free(s);
  return j;
}

/* The text of a job's tokenizer for ids t[0..n), special tokens left out
 * (null when it cannot be decoded: the tokens stand). */
static json_t *decoded(const pw_gen *g, const int32_t *t, int n) {
  pw_tokenizer *tok;
  pw_err err = {0};
  if (pw_api_tokenizer_lock(g->c, g->tok_id, &tok, &err)) return json_null();
  uint32_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
  char *s = NULL;
  size_t len = 0;
  int rc = ids ? 0 : PW_ENOMEM;
  for (int k = 0; k < n && !rc; k++) ids[k] = (uint32_t)t[k];
  if (!rc) rc = pw_tokenizer_decode(tok, ids, (size_t)n, PW_TOK_SKIP_SPECIAL, &s, &len, &err);
  pw_api_tokenizer_unlock();
  free(ids);
  json_t *j = rc ? json_null() : json_stringn(s, len);
  free(s);
  return j ? j : json_null();
}

static json_t *seq_json(const pw_gen *g, int i) {
  const gseq *q = &g->seq[i];
  json_t *toks = json_array();
  for (int k = 0; k < q->n_tok; k++) json_array_append_new(toks, json_integer(q->tok[k]));
  double ttft = q->t_first > 0 ? q->t_first - g->t0 : 0, dec = q->t_last - q->t_first;
  json_t *o = json_pack("{s:i, s:o, s:i, s:f, s:f, s:f}", "index", i, "tokens", toks, "prompt_tokens", q->n_prompt,
                        "time_to_first_token", ttft, "latency", q->t_last > 0 ? q->t_last - g->t0 : 0.0,
                        "tokens_per_s", q->n_tok > 1 && dec > 0 ? (q->n_tok - 1) / dec : 0.0);
  if (o && g->text) json_object_set_new(o, "text", text_of(q->tok, q->n_tok));
  if (o && g->tok_id[0]) json_object_set_new(o, "text", decoded(g, q->tok, q->n_tok));
  return o;
}

static json_t *result_json(const pw_gen *g) {
  json_t *a = json_array();
  for (int i = 0; i < g->k; i++) json_array_append_new(a, seq_json(g, i));
  return json_pack("{s:I, s:o}", "job", (json_int_t)g->job, "results", a);
}

/* mu held: the request's state changed; its connection, if waiting, goes on. */
static void wake(pw_gen *g) {
  if (!g->stream && (g->left == 0 || g->failed)) {
    if (!g->r) return;
    if (g->failed) pw_reply_error(g->r, g->err_code, "", "%s", g->error);
    else pw_reply_json(g->r, 200, result_json(g));
    g->r = NULL;
    MHD_resume_connection(g->conn);
    return;
  }
  if (g->stream && g->suspended) {
    g->suspended = 0;
    MHD_resume_connection(g->conn);
  }
}

/* mu held (and c->mu may be taken under it, never the other way round). */
static void fail(pw_gen *g, int code, const char *why) {
  if (g->failed || g->left == 0) return;
  pthread_mutex_lock(&g->c->mu);
  g->c->gen_failed += (uint64_t)g->left;
  pthread_mutex_unlock(&g->c->mu);
  g->failed = 1;
  g->err_code = code;
  snprintf(g->error, sizeof g->error, "%s", why);
  wake(g);
}

/* ---- streaming --------------------------------------------------------------- */

/* Appends one event (steals j) to g's pending output. mu held. */
static int put(pw_gen *g, json_t *j, const char *event) {
  char *s = j ? pw_json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (!s) return -1;
  size_t need = g->out_len + strlen(s) + (event ? strlen(event) : 0) + 32;
  if (need > g->out_cap) {
    size_t cap = g->out_cap ? g->out_cap : 4096;
    while (cap < need) cap *= 2;
    char *p = realloc(g->out, cap);
    if (!p) {
      free(s);
      return -1;
    }
    g->out = p, g->out_cap = cap;
  }
  g->out_len += (size_t)sprintf(g->out + g->out_len, "%s%s%sdata: %s\n\n", event ? "event: " : "", event ? event : "",
                                event ? "\n" : "", s);
  free(s);
  return 0;
}

/* The response's reader: what has come since the last call, as events (one
 * per token, then done or error); with nothing new it suspends the
 * connection until the loop resumes it. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  pw_gen *g = cls;
  pthread_mutex_lock(&mu);
  if (g->out_off == g->out_len) {
    g->out_off = g->out_len = 0;
    for (int i = 0; i < g->k; i++)
      for (gseq *q = &g->seq[i]; q->streamed < q->n_tok; q->streamed++)
        if (put(g, json_pack("{s:i, s:i, s:i}", "index", i, "n", q->streamed, "token", q->tok[q->streamed]), NULL))
          break;
    if (g->out_len == 0 && !g->final_sent && (g->failed || g->left == 0)) {
      json_t *e = g->failed ? json_pack("{s:{s:s, s:s, s:s}}", "error", "code", pw_err_api_code(g->err_code),
                                        "message", g->error, "path", "")
                            : result_json(g);
      if (!put(g, e, g->failed ? "error" : "done")) g->final_sent = 1;
    }
  }
  ssize_t n = 0;
  if (g->out_off < g->out_len) {
    n = (ssize_t)(g->out_len - g->out_off < max ? g->out_len - g->out_off : max);
    memcpy(buf, g->out + g->out_off, (size_t)n);
    g->out_off += (size_t)n;
  } else if (g->final_sent) {
    n = MHD_CONTENT_READER_END_OF_STREAM;
  } else { /* nothing new: wait for the loop's resume */
    g->suspended = 1;
    MHD_suspend_connection(g->conn);
  }
  pthread_mutex_unlock(&mu);
  return n;
}

static void sse_free(void *cls) {
  pw_gen *g = cls;
  pthread_mutex_lock(&mu);
  g->suspended = 0;
  if (!g->final_sent) g->failed = 1; /* the client left: its sequences are dropped as they finish */
  unref(g);
  pthread_mutex_unlock(&mu);
}

/* ---- the request ---------------------------------------------------------------- */

/* A text prompt encoded with the job's tokenizer (its template's BOS and
 * the like included, as the tokenizer.json says) into q. */
static int encode_prompt(pw_req *r, const pw_job *job, const json_t *p, const char *path, gseq *q) {
  pw_tokenizer *tok;
  pw_err err = {0};
  char b[400];
  pw_tok_ids ids = {0};
  if (pw_api_tokenizer_lock(r->c, job->data.tokenizer, &tok, &err))
    return pw_reply_error(r, PW_EUNAVAIL, path, "the job's tokenizer cannot be read: %s", pw_err_str(&err, b, sizeof b)),
           -1;
  int rc = pw_tokenizer_encode(tok, json_string_value(p), json_string_length(p), PW_TOK_ADD_SPECIAL, &ids, &err);
  pw_api_tokenizer_unlock();
  if (rc) {
    free(ids.v);
    return pw_reply_error(r, PW_EREQUEST, path, "%s", pw_err_str(&err, b, sizeof b)), -1;
  }
  int V = job->model.vocab_size, L = job->serve.max_len;
  const char *bad = ids.n < 1 ? "is empty: give at least one token" : ids.n > (size_t)L ? "is too long" : NULL;
  if (bad) {
    pw_reply_error(r, PW_EREQUEST, path, "%s (%zu tokens with the job's tokenizer; serve.max_len is %d)", bad, ids.n, L);
    free(ids.v);
    return -1;
  }
  if (!(q->prompt = malloc(sizeof *q->prompt * ids.n))) return free(ids.v), pw_reply_oom(r), -1;
  q->n_prompt = (int)ids.n;
  for (size_t i = 0; i < ids.n; i++) {
    if (ids.v[i] >= (uint32_t)V) { /* the submit checked the vocabulary: only a changed file could */
      free(ids.v);
      return pw_reply_error(r, PW_EREQUEST, path, "token %u is past model.vocab_size %d", ids.v[i], V), -1;
    }
    q->prompt[i] = (int32_t)ids.v[i];
  }
  free(ids.v);
  return 0;
}

/* One prompt (a string for a text job or a job with a tokenizer, or an
 * array of token ids) into q. */
static int read_prompt(pw_req *r, const pw_job *job, const json_t *p, const char *path, gseq *q) {
  int V = job->model.vocab_size, L = job->serve.max_len;
  size_t n = json_is_string(p) ? json_string_length(p) : json_array_size(p);
  if (!json_is_string(p) && !json_is_array(p))
    return pw_reply_error(r, PW_EREQUEST, path, "must be a string (text) or an array of token ids"), -1;
  if (json_is_string(p) && job->data.tokenizer[0]) return encode_prompt(r, job, p, path, q);
  if (json_is_string(p) && job->data.kind != PW_DATA_TEXT)
    return pw_reply_error(r, PW_EREQUEST, path,
                          "the job's data is not text (bytes as tokens) and names no data.tokenizer: give token ids"),
           -1;
  if (n < 1) return pw_reply_error(r, PW_EREQUEST, path, "is empty: give at least one token"), -1;
  if (n > (size_t)L)
    return pw_reply_error(r, PW_EREQUEST, path, "is %zu tokens; serve.max_len is %d", n, L), -1;
  if (!(q->prompt = malloc(sizeof *q->prompt * n))) return pw_reply_oom(r), -1;
  q->n_prompt = (int)n;
  for (size_t i = 0; i < n; i++) {
    if (json_is_string(p)) {
      q->prompt[i] = (unsigned char)json_string_value(p)[i];
      continue;
    }
    json_t *t = json_array_get(p, i);
    if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= V)
      return pw_reply_error(r, PW_EREQUEST, path, "item %zu must be a token id in 0..%d", i, V - 1), -1;
    q->prompt[i] = (int32_t)json_integer_value(t);
  }
  return 0;
}

static int num_arg(pw_req *r, const char *key, double def, double lo, double hi, int lo_open, double *out) {
  json_t *v = json_object_get(r->body, key);
  *out = def;
  if (!v) return 0;
  if (!json_is_number(v) || !(json_number_value(v) > lo || (!lo_open && json_number_value(v) == lo)) ||
      !(json_number_value(v) <= hi))
    return pw_reply_error(r, PW_EREQUEST, key, "must be a number in %s%g, %g]", lo_open ? "(" : "[", lo, hi), -1;
  *out = json_number_value(v);
  return 0;
}

static int int_arg(pw_req *r, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out) {
  json_t *v = json_object_get(r->body, key);
  *out = def;
  if (!v) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return pw_reply_error(r, PW_EREQUEST, key, "must be an integer in %lld..%lld", (long long)lo, (long long)hi), -1;
  *out = json_integer_value(v);
  return 0;
}

static const char *const known[] = {"prompt", "max_tokens", "temperature", "top_k", "top_p", "seed", "stream"};

/* The body into g (its sequences' prompts and the sampling parameters);
 * replies and returns nonzero on a bad one. */
static int read_body(pw_req *r, const pw_job *job, pw_gen *g) {
  const char *key;
  json_t *v;
  json_object_foreach(r->body, key, v) {
    size_t i = 0;
    while (i < sizeof known / sizeof known[0] && strcmp(key, known[i])) i++;
    if (i == sizeof known / sizeof known[0])
      return pw_reply_error(r, PW_EREQUEST, key,
                            "unknown field (prompt, max_tokens, temperature, top_k, top_p, seed, stream)"), -1;
  }
  json_t *p = json_object_get(r->body, "prompt");
  int list = json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0));
  if (!p) return pw_reply_error(r, PW_EREQUEST, "prompt", "is required"), -1;
  size_t k = list ? json_array_size(p) : 1;
  if (k > MAX_PROMPTS)
    return pw_reply_error(r, PW_EREQUEST, "prompt", "lists %zu prompts; at most %d", k, MAX_PROMPTS), -1;
  /* g->k counts the sequences gen_free frees: set only once they exist */
  if (!(g->seq = calloc(k, sizeof *g->seq))) return pw_reply_oom(r), -1;
  g->k = (int)k;
  int shortest = INT32_MAX;
  for (int i = 0; i < g->k; i++) {
    char path[32];
    snprintf(path, sizeof path, list ? "prompt[%d]" : "prompt", i);
    if (read_prompt(r, job, list ? json_array_get(p, (size_t)i) : p, path, &g->seq[i])) return -1;
    if (g->seq[i].n_prompt < shortest) shortest = g->seq[i].n_prompt;
  }
  int L = job->serve.max_len, longest = 0;
  for (int i = 0; i < g->k; i++) longest = g->seq[i].n_prompt > longest ? g->seq[i].n_prompt : longest;
  int64_t mt, tk, seed;
  int fit = L - longest + 1, st = 0;
  if (int_arg(r, "max_tokens", fit < DEFAULT_MAX_TOKENS ? fit : DEFAULT_MAX_TOKENS, 1, INT32_MAX, &mt) ||
      int_arg(r, "top_k", 0, 0, INT32_MAX, &tk) || int_arg(r, "seed", 1, 0, INT64_MAX, &seed) ||
      num_arg(r, "temperature", 0, 0, 1e6, 0, &g->temperature) || num_arg(r, "top_p", 1, 0, 1, 1, &g->top_p))
    return -1;
  if (mt > fit)
    return pw_reply_error(r, PW_EREQUEST, "max_tokens",
                          "%lld new tokens after a prompt of %d need %lld positions; serve.max_len is %d (at most %d)",
                          (long long)mt, longest, (long long)(longest + mt - 1), L, fit), -1;
  json_t *sv = json_object_get(r->body, "stream");
  if (sv && !json_is_boolean(sv)) return pw_reply_error(r, PW_EREQUEST, "stream", "must be true or false"), -1;
  st = json_is_true(sv);
  g->max_tokens = (int)mt;
  g->top_k = (int)tk;
  g->seed = seed;
  g->stream = st;
  g->left = g->k;
  for (int i = 0; i < g->k; i++)
    if (!(g->seq[i].tok = malloc(sizeof(int32_t) * (size_t)mt))) return pw_reply_oom(r), -1;
  return 0;
}

void pw_api_job_generate(pw_req *r) {
  pw_store *s = pw_api_store(r);
  pw_job job;
  int state;
  if (!s || pw_api_job_load(r, s, &job, &state)) return;
  pw_gen *g = NULL;
  if (job.mode != PW_MODE_SERVE) {
    pw_reply_error(r, PW_ECONFLICT, "id", "job %lld is not a serve job (its mode is not \"serve\")", (long long)r->id);
    goto out;
  }
  if (state != PW_JOB_RUNNING) {
    pw_reply_error(r, PW_ECONFLICT, "id", "job %lld is not serving (it is %s)", (long long)r->id,
                   pw_job_state_name(state));
    goto out;
  }
  if (!(g = calloc(1, sizeof *g))) {
    pw_reply_oom(r);
    goto out;
  }
  g->c = r->c;
  g->job = r->id;
  g->text = job.data.kind == PW_DATA_TEXT;
  if (strlen(job.data.tokenizer) < sizeof g->tok_id) /* the stored spec's is an id (the submit checked it) */
    memcpy(g->tok_id, job.data.tokenizer, strlen(job.data.tokenizer) + 1);
  g->conn = r->conn;
  g->t0 = mono();
  if (read_body(r, &job, g)) goto out;
  int cap = job.serve.max_sequences * job.mesh.dp + job.serve.max_queue, open = pw_gen_open(r->c, r->id);
  if (open + g->k > cap) {
    pw_reply_error(r, PW_EBUSY, "serve.max_queue",
                   "job %lld has %d sequences open; it takes %d (serve.max_sequences * mesh.dp + serve.max_queue)",
                   (long long)r->id, open, cap);
    pw_reply_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    goto out;
  }
  if (g->stream) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, g, sse_free);
    if (!resp) {
      pw_reply_oom(r);
      goto out;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    r->resp = resp;
    r->status = 200;
  }
  pthread_mutex_lock(&mu);
  for (int i = 0; i < g->k; i++) g->seq[i].id = next_id++;
  g->refs = g->stream ? 2 : 1;
  g->next = table;
  table = g;
  if (!g->stream) { /* parked: the loop's answer resumes it (http.c sends it) */
    g->r = r;
    r->parked = 1;
    MHD_suspend_connection(r->conn);
  }
  pthread_mutex_unlock(&mu);
  g = NULL;
  pw_coord_wake(r->c);
out:
  if (g) gen_free(g);
  pw_job_free(&job);
}

/* ---- the loop ------------------------------------------------------------------- */

/* mu held: the replica of job with the fewest sequences sent and not
 * complete (each replica's rank 0 queues what it cannot start). */
static int least_loaded(pw_coord *c, int64_t job, int dp) {
  int best = 0, *load = calloc((size_t)dp, sizeof *load);
  if (!load) return 0;
  for (pw_gen *g = table; g; g = g->next)
    if (g->c == c && g->job == job && !g->failed)
      for (int i = 0; i < g->k; i++)
        if (g->seq[i].sent && g->seq[i].n_tok < g->max_tokens && g->seq[i].replica < dp) load[g->seq[i].replica]++;
  for (int r = 1; r < dp; r++)
    if (load[r] < load[best]) best = r;
  free(load);
  return best;
}

static pw_jobrt *serving_run(pw_coord *c, int64_t job) {
  for (pw_jobrt *jr = ((pw_ctl *)c->ctl)->jobs; jr; jr = jr->next)
    if (jr->job == job && jr->run > 0 && !jr->planning && jr->n_stages > 0) return jr;
  return NULL;
}

void pw_gen_pump(pw_coord *c) {
  if (!c->ctl) return;
  pthread_mutex_lock(&mu);
  for (pw_gen *g = table, *next; g; g = next) {
    next = g->next;
    if (g->c != c) continue;
    if (g->failed || g->left == 0) {
      if (!g->stream || g->final_sent || g->refs == 1) unlink_gen(g); /* answered, or its client left */
      continue;
    }
    pw_jobrt *jr = serving_run(c, g->job);
    for (int i = 0; i < g->k && !g->failed; i++) {
      gseq *q = &g->seq[i];
      if (q->sent) continue;
      if (!jr) {
        fail(g, PW_ECONFLICT, "the job is not serving (cancelled, failed, or not started yet)");
        break;
      }
      int pp = jr->n_stages, dp = jr->n_ranks / pp;
      q->replica = least_loaded(c, g->job, dp);
      pw_wconn *w = jr->ranks[q->replica * pp];
      json_t *prompt = json_array();
      for (int k = 0; k < q->n_prompt; k++) json_array_append_new(prompt, json_integer(q->prompt[k]));
      json_t *msg = PW_CONTROL_BUILD(PW_MSG_GENERATE, pw_msg_generate, NULL, .job = g->job, .run = jr->run,
                                     .req = q->id, .prompt = prompt, .max_tokens = g->max_tokens,
                                     .temperature = g->temperature, .top_k = g->top_k, .top_p = g->top_p,
                                     .seed = g->seed);
      json_decref(prompt);
      if (!w || !msg) {
        json_decref(msg);
        fail(g, PW_EUNAVAIL, "the job's rank 0 cannot be reached");
        break;
      }
      pw_ctl_send_msg(w, msg);
      q->sent = 1;
    }
  }
  pthread_mutex_unlock(&mu);
}

/* mu held: the request and sequence of id. */
static pw_gen *find(pw_coord *c, int64_t job, int64_t id, int *idx) {
  for (pw_gen *g = table; g; g = g->next)
    if (g->c == c && g->job == job)
      for (int i = 0; i < g->k; i++)
        if (g->seq[i].id == id) return *idx = i, g;
  return NULL;
}

int pw_gen_on_tokens(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  (void)raw, (void)err;
  pw_coord *c = ctx;
  const pw_msg_tokens *t = &m->TOKENS;
  const pw_wconn *w = conn;
  if (!w->job || w->job->job != t->job || w->job->run != t->run) return 0; /* not (or no longer) its run */
  size_t n = json_array_size(t->items);
  double now = mono();
  uint64_t tokens = 0, done = 0;
  pthread_mutex_lock(&mu);
  for (size_t k = 0; k + 1 < n; k += 2) {
    int i;
    pw_gen *g = find(c, t->job, json_integer_value(json_array_get(t->items, k)), &i);
    if (!g) continue; /* its request was answered (failed) meanwhile */
    gseq *q = &g->seq[i];
    if (q->n_tok == g->max_tokens) continue;
    q->tok[q->n_tok++] = (int32_t)json_integer_value(json_array_get(t->items, k + 1));
    if (q->n_tok == 1) q->t_first = now;
    q->t_last = now;
    tokens++;
    if (q->n_tok == g->max_tokens) g->left--, done += !g->failed;
    if (!g->failed) wake(g);
    if (g->left == 0 && !g->stream) unlink_gen(g);
  }
  pthread_mutex_unlock(&mu);
  pthread_mutex_lock(&c->mu);
  c->gen_tokens += tokens;
  c->gen_sequences += done;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

int pw_gen_on_failed(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  (void)conn, (void)raw, (void)err;
  pw_coord *c = ctx;
  const pw_msg_gen_failed *f = &m->GEN_FAILED;
  int i;
  pthread_mutex_lock(&mu);
  pw_gen *g = find(c, f->job, f->req, &i);
  if (g) fail(g, strstr(f->message, "queue") ? PW_EBUSY : PW_EUNAVAIL, f->message);
  pthread_mutex_unlock(&mu);
  return 0;
}

void pw_gen_job_ended(pw_coord *c, int64_t job, const char *why) {
  pthread_mutex_lock(&mu);
  for (pw_gen *g = table, *next; g; g = next) {
    next = g->next;
    if (g->c != c || (job && g->job != job)) continue;
    fail(g, PW_ECONFLICT, why);
    if (!g->stream) unlink_gen(g);
  }
  pthread_mutex_unlock(&mu);
}
