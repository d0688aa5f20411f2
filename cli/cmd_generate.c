/* cmd_generate: `pipewright generate` — text from a checkpoint in this
 * process, with a KV cache: the oracle a served pipeline's greedy output
 * must equal.
 *
 * The whole model is one stage program and one decoder (common/compute/
 * decode.h): the prompt in one prefill call, then one call per token. The
 * sampler is common/compute/sample.h's (docs/contracts.md, "Generation").
 *
 * With --coordinator, a serve job answers instead (docs/serving.md): the
 * same options, sent to POST /v1/jobs/{id}/generate; --stream prints each
 * token as its server-sent event arrives. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "args.h"
#include "remote.h"
#include "ckpt.h"
#include "cli.h"
#include "decode.h"
#include "safetensors.h"
#include "sample.h"
#include "tokenizer.h"

#define MAX_THREADS 4096

static void usage(FILE *f) {
  fprintf(f,
          "usage: pipewright generate --job FILE --checkpoint CKPT (--prompt TEXT | --prompt-tokens IDS) [options]\n"
          "       pipewright generate --coordinator URL --job ID (--prompt TEXT | --prompt-tokens IDS) [--stream]\n"
          "  --coordinator URL     ask a serve job of that coordinator (--job is its id; no --checkpoint)\n"
          "  --token-file FILE     bearer token for the coordinator's API\n"
          "  --stream              print the tokens as they arrive\n"
          "  --job FILE            job spec (JSON): the model\n"
          "  --checkpoint CKPT     parameters: a model file (train --out, or a job's checkpoint download),\n"
          "                        or a step folder of stage-S.safetensors files\n"
          "  --prompt TEXT         the prompt as bytes (a text job's tokens); prints the continuation's bytes\n"
          "  --prompt-tokens IDS   the prompt as token ids, \"1,2,3\"; prints the continuation's ids\n"
          "  --tokenizer FILE      a Hugging Face tokenizer.json (default: the job's data.tokenizer, a path):\n"
          "                        --prompt TEXT is encoded with it (with its post_processor's BOS and\n"
          "                        the like) and the continuation printed as text\n"
          "  --max-tokens N        tokens to generate (default: as many as seq_len allows, prompt + N <=\n"
          "                        seq_len + 1: the last token is never read back)\n"
          "  --temperature T       0 = greedy (default); else sample from softmax(logits / T)\n"
          "  --top-k K             sample among the K most likely tokens (default 0: all)\n"
          "  --top-p P             ... and the fewest of those whose probability reaches P (default 1)\n"
          "  --seed S              sampling seed (default 1): the same seed, the same tokens\n"
          "  --threads N           OpenBLAS threads (default 1)\n"
          "  --logits FILE         also write the prompt's logits, (prompt tokens, vocab_size) float32, as the\n"
          "                        safetensors tensor \"logits\" (the references compare them: tests/ref/)\n"
          "  --help\n"
          "A line on stderr gives the counts and speed: prefill, decode, tokens/s.\n");
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "1,2,3" into a new array; NULL (after the message) when malformed. */
static int32_t *parse_tokens(const char *text, int vocab, int *n) {
  size_t cap = strlen(text) / 2 + 1;
  int32_t *t = malloc(sizeof *t * cap);
  if (!t) return NULL;
  *n = 0;
  const char *p = text;
  for (;;) {
    char item[32];
    size_t len = strcspn(p, ",");
    long long v;
    if (len == 0 || len >= sizeof item) {
      pw_cli_usage_error("--prompt-tokens: item %d is %s (want ids like 1,2,3)", *n, len ? "too long" : "empty");
      free(t);
      return NULL;
    }
    memcpy(item, p, len);
    item[len] = 0;
    char flag[48];
    snprintf(flag, sizeof flag, "--prompt-tokens item %d", *n);
    if (pw_arg_ll(flag, item, 0, vocab - 1, &v)) {
      free(t);
      return NULL;
    }
    t[(*n)++] = (int32_t)v;
    if (!p[len]) return t;
    p += len + 1;
  }
}

/* Every stage-S.safetensors of a step folder (optimizer files aside): each
 * parameter of p from the file that holds it. */
static int load_step_dir(pw_prog *p, const char *dir, pw_err *err) {
  DIR *dh = opendir(dir);
  if (!dh) return pw_err_set(err, PW_EIO, dir, "%s", strerror(errno));
  int n = pw_prog_n_params(p), rc = 0, files = 0;
  unsigned char *got = calloc((size_t)n + 1, 1);
  struct dirent *e;
  while (got && !rc && (e = readdir(dh))) {
    size_t len = strlen(e->d_name), sl = strlen(".safetensors");
    if (strncmp(e->d_name, "stage-", 6) || len <= sl || strcmp(e->d_name + len - sl, ".safetensors") ||
        strstr(e->d_name, ".optim."))
      continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    pw_st_file *f = NULL;
    if ((rc = pw_st_open(path, &f, err))) break;
    files++;
    for (int i = 0; i < n && !rc; i++) {
      pw_prog_param *pp = pw_prog_param_at(p, i);
      if (got[i] || !pw_st_find(f, pp->meta->name)) continue;
      int64_t shape[2] = {pp->meta->shape[0], pp->meta->shape[1]};
      rc = pw_st_copy(f, pp->meta->name, PW_ST_F32, pp->meta->ndim, shape, pp->data, err);
      for (size_t k = 0; !rc && k < pp->meta->numel; k++)
        if (!isfinite(pp->data[k]))
          rc = pw_err_set(err, PW_EFORMAT, path, "tensor '%s' holds a non-finite value", pp->meta->name);
      got[i] = 1;
    }
    pw_st_close(f);
  }
  closedir(dh);
  if (!got) return pw_err_set(err, PW_ENOMEM, dir, "out of memory");
  for (int i = 0; i < n && !rc; i++)
    if (!got[i])
      rc = pw_err_set(err, PW_EFORMAT, dir, "no stage file of the %d here holds '%s'", files,
                      pw_prog_param_at(p, i)->meta->name);
  free(got);
  return rc;
}

typedef struct {
  const char *job_path, *ckpt, *prompt, *prompt_tokens, *coordinator, *token_file, *tokenizer, *logits;
  int max_tokens, threads, stream;
  pw_sample_config sc;
} gen_args;

static int parse(int argc, char **argv, gen_args *a) {
  static const struct option opts[] = {
      {"job", required_argument, 0, 'j'},         {"checkpoint", required_argument, 0, 'c'},
      {"prompt", required_argument, 0, 'p'},      {"prompt-tokens", required_argument, 0, 'P'},
      {"max-tokens", required_argument, 0, 'n'},  {"temperature", required_argument, 0, 'T'},
      {"top-k", required_argument, 0, 'k'},       {"top-p", required_argument, 0, 'r'},
      {"seed", required_argument, 0, 's'},        {"threads", required_argument, 0, 't'},
      {"coordinator", required_argument, 0, 'C'}, {"token-file", required_argument, 0, 'F'},
      {"stream", no_argument, 0, 'S'},            {"help", no_argument, 0, 'h'},
      {"tokenizer", required_argument, 0, 'K'},   {"logits", required_argument, 0, 'L'},
      {0, 0, 0, 0}};
  *a = (gen_args){.max_tokens = -1, .threads = 1, .sc = {.top_p = 1, .seed = 1}};
  long long seed;
  int c;
  optind = 1;
  while ((c = pw_getopt(argc, argv, "j:c:p:P:n:T:k:r:s:t:h", opts)) != -1) {
    switch (c) {
      case 'j': a->job_path = optarg; break;
      case 'c': a->ckpt = optarg; break;
      case 'p': a->prompt = optarg; break;
      case 'P': a->prompt_tokens = optarg; break;
      case 'n':
        if (pw_arg_int("--max-tokens", optarg, 1, INT_MAX, &a->max_tokens)) return -1;
        break;
      case 'T':
        if (pw_arg_num("--temperature", optarg, -INFINITY, INFINITY, &a->sc.temperature)) return -1;
        if (a->sc.temperature < 0) return pw_cli_usage_error("--temperature: '%s' is negative (0 is greedy)", optarg), -1;
        break;
      case 'k':
        if (pw_arg_int("--top-k", optarg, 0, INT_MAX, &a->sc.top_k)) return -1;
        break;
      case 'r':
        if (pw_arg_num("--top-p", optarg, 0, 1, &a->sc.top_p)) return -1;
        break;
      case 's':
        if (pw_arg_ll("--seed", optarg, 0, LLONG_MAX, &seed)) return -1;
        a->sc.seed = (uint64_t)seed;
        break;
      case 't':
        if (pw_arg_int("--threads", optarg, 1, MAX_THREADS, &a->threads)) return -1;
        break;
      case 'C': a->coordinator = optarg; break;
      case 'F': a->token_file = optarg; break;
      case 'S': a->stream = 1; break;
      case 'K': a->tokenizer = optarg; break;
      case 'L': a->logits = optarg; break;
      case 'h': return 1;
      default: return -1;
    }
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL) || pw_args_required(a->job_path, "--job FILE") ||
      (!a->coordinator && pw_args_required(a->ckpt, "--checkpoint CKPT")))
    return -1;
  if (a->coordinator && a->logits) return pw_cli_usage_error("--logits: not with --coordinator"), -1;
  if (a->coordinator && a->ckpt)
    return pw_cli_usage_error("--checkpoint: not with --coordinator (the job has its weights)"), -1;
  if (!a->coordinator && a->stream) return pw_cli_usage_error("--stream: only with --coordinator"), -1;
  if (!a->prompt == !a->prompt_tokens)
    return pw_cli_usage_error("give one of --prompt TEXT and --prompt-tokens IDS"), -1;
  if (a->prompt && !*a->prompt) return pw_cli_usage_error("--prompt: empty (give at least one byte)"), -1;
  if (a->tokenizer && !a->prompt) return pw_cli_usage_error("--tokenizer: give the prompt as --prompt TEXT"), -1;
  if (a->tokenizer && a->coordinator)
    return pw_cli_usage_error("--tokenizer: not with --coordinator (a job that names its tokenizer, "
                              "data.tokenizer, takes --prompt TEXT; else encode with pipewright tokenize and give "
                              "--prompt-tokens)"), -1;
  return 0;
}

/* Prefill, then one token at a time; out[] gets n_gen tokens. */
static int generate(pw_decode *d, const pw_model *m, const int32_t *prompt, int n, int32_t *out, int n_gen,
                    pw_sampler *s, const char *logits_path, double *t_prefill, pw_err *err) {
  int logits = m->nodes[m->values[m->loss_value].producer].in[0], V = m->data.vocab_size;
  int32_t *in = pw_decode_value(d, m->input_value);
  const float *lg = pw_decode_value(d, logits);
  double t0 = now();
  memcpy(in, prompt, sizeof *in * (size_t)n);
  int rc = pw_decode_forward(d, &(pw_decode_seq){0, 0, n}, 1, err);
  if (!rc && logits_path)
    rc = pw_st_write(logits_path, &(pw_st_tensor){"logits", PW_ST_F32, 2, {n, V}, lg}, 1, NULL, 0, err);
  if (rc) return rc;
  out[0] = pw_sampler_next(s, lg + (size_t)(n - 1) * V);
  *t_prefill = now() - t0;
  for (int i = 1; i < n_gen && !rc; i++) {
    in[0] = out[i - 1];
    rc = pw_decode_forward(d, &(pw_decode_seq){0, n + i - 1, 1}, 1, err);
    out[i] = pw_sampler_next(s, lg);
  }
  return rc;
}

/* ---- a serve job ------------------------------------------------------------ */

/* Server-sent events as they arrive: each token printed at once. */
typedef struct {
  char line[1 << 16];
  size_t n;
  int bytes, failed;
  char event[32];
  json_t *done;
} sse;

static void sse_line(sse *e) {
  if (!strncmp(e->line, "event: ", 7)) {
    snprintf(e->event, sizeof e->event, "%s", e->line + 7);
    return;
  }
  if (strncmp(e->line, "data: ", 6)) return;
  json_t *j = json_loads(e->line + 6, 0, NULL);
  if (!e->event[0] && j) {
    int t = (int)json_integer_value(json_object_get(j, "token"));
    if (e->bytes) putchar(t & 0xff);
    else printf("%s%d", json_integer_value(json_object_get(j, "n")) ? "," : "", t);
    fflush(stdout);
  } else if (!strcmp(e->event, "error")) {
    json_t *er = json_object_get(j, "error");
    fprintf(stderr, "error: %s\n", json_string_value(json_object_get(er, "message")));
    e->failed = 1;
  } else if (!strcmp(e->event, "done") && !e->done) {
    e->done = json_incref(j);
  }
  json_decref(j);
  e->event[0] = 0;
}

static void sse_data(void *ud, const char *p, size_t n) {
  sse *e = ud;
  for (size_t i = 0; i < n; i++) {
    if (p[i] != '\n') {
      if (e->n < sizeof e->line - 1) e->line[e->n++] = p[i];
      continue;
    }
    e->line[e->n] = 0;
    if (e->n) sse_line(e);
    e->n = 0;
  }
}

/* The tokens (unless streamed: printed already), a newline, the figures. */
static void print_result(const json_t *res, int bytes, int streamed) {
  json_t *toks = json_object_get(res, "tokens"), *t;
  size_t i;
  json_array_foreach(toks, i, t) {
    if (streamed) break;
    if (bytes) putchar((int)json_integer_value(t) & 0xff);
    else printf(i ? ",%d" : "%d", (int)json_integer_value(t));
  }
  putchar('\n');
  fprintf(stderr, "generated %zu tokens after a prompt of %d: time to first token %.2f ms, %.1f tokens/s after it\n",
          json_array_size(toks), (int)json_integer_value(json_object_get(res, "prompt_tokens")),
          1e3 * json_real_value(json_object_get(res, "time_to_first_token")),
          json_real_value(json_object_get(res, "tokens_per_s")));
}

static int remote_generate(const gen_args *a) {
  long long id;
  if (pw_arg_ll("--job", a->job_path, 1, LLONG_MAX, &id)) return 2;
  pw_remote_opts o = {.coordinator = a->coordinator, .token_file = a->token_file, .timeout = 3600};
  pw_remote r;
  if (pw_remote_init(&r, &o)) return 1;
  json_t *body = json_pack("{s:f, s:i, s:f, s:I, s:b}", "temperature", a->sc.temperature, "top_k", a->sc.top_k,
                           "top_p", a->sc.top_p, "seed", (json_int_t)a->sc.seed, "stream", a->stream);
  if (a->max_tokens > 0) json_object_set_new(body, "max_tokens", json_integer(a->max_tokens));
  if (a->prompt) {
    json_object_set_new(body, "prompt", json_string(a->prompt));
  } else {
    json_t *ids = json_array();
    const char *p = a->prompt_tokens;
    for (char *end; *p; p = *end ? end + 1 : end) {
      long long v = strtoll(p, &end, 10);
      if (end == p || (*end && *end != ',')) {
        json_decref(body), json_decref(ids);
        return pw_cli_usage_error("--prompt-tokens: want ids like 1,2,3"), 2;
      }
      json_array_append_new(ids, json_integer(v));
    }
    json_object_set_new(body, "prompt", ids);
  }
  if (!json_object_get(body, "prompt")) { /* --prompt not UTF-8: jansson refused the string */
    json_decref(body);
    return pw_cli_usage_error("--prompt: not UTF-8 text; give --prompt-tokens"), 2;
  }
  char *text = json_dumps(body, JSON_COMPACT), target[64];
  json_decref(body);
  snprintf(target, sizeof target, "/v1/jobs/%lld/generate", id);
  static sse e;
  memset(&e, 0, sizeof e);
  e.bytes = a->prompt != NULL;
  if (a->stream) r.on_data = sse_data, r.ud = &e;
  pw_http_resp resp = {0};
  json_t *out = NULL;
  int rc = text ? pw_remote_call(&r, "POST", target, text, strlen(text), 0, &resp, a->stream ? NULL : &out)
                : PW_CALL_NET;
  free(text);
  if (rc == PW_CALL_OK && a->stream) {
    if (e.done) print_result(json_array_get(json_object_get(e.done, "results"), 0), e.bytes, 1);
    else if (!e.failed) fprintf(stderr, "error: the stream ended before its last event\n");
    rc = e.done ? 0 : 1;
  } else if (rc == PW_CALL_OK) {
    print_result(json_array_get(json_object_get(out, "results"), 0), e.bytes, 0);
  }
  json_decref(out);
  json_decref(e.done);
  pw_http_resp_free(&resp);
  return rc ? 1 : 0;
}

int pw_cmd_generate(int argc, char **argv) {
  gen_args a;
  int prc = parse(argc, argv, &a);
  if (prc) return usage(prc > 0 ? stdout : stderr), prc > 0 ? 0 : 2;
  if (a.coordinator) return remote_generate(&a);
  if (pw_cli_compute_ready(a.threads)) return 1;
  pw_job job;
  if (pw_cli_load_job(a.job_path, &job)) return 1;
  pw_err err = {0};
  pw_model m;
  pw_prog *p = NULL;
  pw_decode *d = NULL;
  pw_sampler s = {0};
  int32_t *prompt = NULL, *out = NULL;
  pw_tokenizer *tok = NULL;
  int n = 0, rc = pw_model_build(&job.model, &m, &err);
  if (rc) {
    pw_cli_report(&err);
    pw_job_free(&job);
    return 1;
  }
  int T = m.seq_len, V = m.data.vocab_size;
  /* the job's own tokenizer (data.tokenizer, a path: from here, else from
   * the job file's folder) when none is given */
  char tk_path[PATH_MAX];
  if (!a.tokenizer && a.prompt && job.data.tokenizer[0]) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", a.job_path);
    if (job.data.tokenizer[0] == '/' || access(job.data.tokenizer, F_OK) == 0)
      snprintf(tk_path, sizeof tk_path, "%s", job.data.tokenizer);
    else if (snprintf(tk_path, sizeof tk_path, "%s/%s", dirname(dir), job.data.tokenizer) >= (int)sizeof tk_path)
      tk_path[0] = 0;
    if (tk_path[0]) a.tokenizer = tk_path;
  }
  if (!m.data.tokens) {
    fprintf(stderr, "error: %s: generate needs a token model (gpt, llama, or a layers list on tokens)\n", a.job_path);
    rc = 1;
  } else if (a.tokenizer) { /* the prompt through the tokenizer, with its template */
    pw_tok_ids ids = {0};
    if (pw_tokenizer_open(a.tokenizer, &tok, &err) ||
        pw_tokenizer_encode(tok, a.prompt, strlen(a.prompt), PW_TOK_ADD_SPECIAL, &ids, &err)) {
      pw_cli_report(&err);
      rc = 1;
    } else if (pw_tokenizer_vocab_size(tok) > (uint32_t)V) {
      fprintf(stderr, "error: --tokenizer: %u ids; the model's vocab_size is %d\n", pw_tokenizer_vocab_size(tok), V);
      rc = 1;
    } else if (!ids.n || ids.n > (size_t)T || !(prompt = malloc(sizeof *prompt * ids.n))) {
      fprintf(stderr, "error: --prompt: %zu tokens (1 to seq_len = %d)\n", ids.n, T);
      rc = 1;
    } else {
      n = (int)ids.n;
      for (int i = 0; i < n; i++) prompt[i] = (int32_t)ids.v[i];
    }
    free(ids.v);
  } else if (a.prompt && job.data.kind != PW_DATA_TEXT) {
    fprintf(stderr, "error: --prompt: the job's data is not text (bytes as tokens); give --prompt-tokens\n");
    rc = 1;
  } else if (a.prompt) {
    n = (int)strlen(a.prompt);
    if (!(prompt = malloc(sizeof *prompt * (size_t)n))) {
      fprintf(stderr, "error: out of memory\n");
      rc = 1;
    }
    for (int i = 0; !rc && i < n; i++) prompt[i] = (unsigned char)a.prompt[i];
  } else if (!(prompt = parse_tokens(a.prompt_tokens, V, &n))) {
    rc = 2;
  }
  if (!rc && n > T) {
    fprintf(stderr, "error: the prompt is %d tokens; the model reads at most seq_len = %d\n", n, T);
    rc = 1;
  }
  int n_gen = a.max_tokens > 0 ? a.max_tokens : T - n + 1;
  if (!rc && n_gen > T - n + 1) {
    fprintf(stderr, "error: --max-tokens: %d tokens after a prompt of %d need %d positions; seq_len is %d "
            "(at most %d)\n", n_gen, n, n + n_gen - 1, T, T - n + 1);
    rc = 1;
  }
  if (!rc) {
    struct stat stt;
    pw_prog_config pc = {.layer_lo = 0, .layer_hi = m.n_layers, .mb_size = 1, .batch_size = 1, .max_slots = 1};
    pw_decode_config dc = {.max_seqs = 1, .max_pos = T, .max_rows = n};
    rc = pw_prog_create(&m, &pc, &p, &err);
    if (!rc) rc = stat(a.ckpt, &stt) == 0 && S_ISDIR(stt.st_mode) ? load_step_dir(p, a.ckpt, &err)
                                                                 : pw_ckpt_load(p, a.ckpt, 0, NULL, &err);
    if (!rc) rc = pw_decode_create(p, &dc, &d, &err);
    if (!rc) rc = pw_sampler_init(&s, V, &a.sc, &err);
    if (!rc && !(out = malloc(sizeof *out * (size_t)n_gen))) rc = pw_err_set(&err, PW_ENOMEM, "generate", "out of memory");
    double t_prefill = 0, t0 = now();
    if (!rc) rc = generate(d, &m, prompt, n, out, n_gen, &s, a.logits, &t_prefill, &err);
    double t = now() - t0;
    if (rc) {
      pw_cli_report(&err);
      rc = 1;
    } else {
      if (tok) {
        uint32_t *ids = malloc(sizeof *ids * (size_t)n_gen);
        char *text = NULL;
        size_t tn = 0;
        for (int i = 0; ids && i < n_gen; i++) ids[i] = (uint32_t)out[i];
        if (!ids || pw_tokenizer_decode(tok, ids, (size_t)n_gen, 0, &text, &tn, &err)) pw_cli_report(&err), rc = 1;
        else fwrite(text, 1, tn, stdout);
        free(ids), free(text);
      } else if (a.prompt) {
        for (int i = 0; i < n_gen; i++) putchar(out[i] & 0xff);
      } else {
        for (int i = 0; i < n_gen; i++) printf(i ? ",%d" : "%d", (int)out[i]);
      }
      putchar('\n');
      fflush(stdout);
      fprintf(stderr, "generated %d tokens after a prompt of %d: prefill %.2f ms, %d decode steps %.2f ms, %.1f tokens/s"
              " (linears: %s)\n", n_gen, n, t_prefill * 1e3, n_gen - 1, (t - t_prefill) * 1e3, n_gen / t,
              pw_decode_path(d));
    }
  }
  free(out);
  free(prompt);
  pw_tokenizer_close(tok);
  pw_sampler_free(&s);
  pw_decode_free(d);
  pw_prog_free(p);
  pw_model_free(&m);
  pw_job_free(&job);
  return rc;
}
