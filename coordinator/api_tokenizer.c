/* api_tokenizer: a job's tokenizer (data.tokenizer: a stored dataset
 * holding a tokenizer.json) on the coordinator — checked at submit, and
 * used by POST /v1/jobs/{id}/generate to take prompts as text and answer
 * with text.
 *
 * Parsing a tokenizer.json takes a while (a Llama-3 one is 9 MB), so the
 * last few are kept open, keyed by their dataset id (content-addressed:
 * an id always means the same file). A tokenizer is not thread-safe and
 * requests run on several threads: each use holds the cache's lock, for
 * as long as one prompt's encoding or one answer's decoding takes. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "datasets.h"
#include "log.h"
#include "tokenizer.h"

#define CACHED 4

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  char id[65];
  pw_tokenizer *tok;
  uint64_t used;
} cache[CACHED];
static uint64_t clock_;

/* mu held: the tokenizer of dataset id, opened (and kept) when not yet. */
static int get(pw_coord *c, const char *id, pw_tokenizer **out, pw_err *err) {
  int lru = 0;
  for (int i = 0; i < CACHED; i++) {
    if (cache[i].tok && !strcmp(cache[i].id, id)) {
      cache[i].used = ++clock_;
      *out = cache[i].tok;
      return 0;
    }
    if (!cache[i].tok || cache[i].used < cache[lru].used) lru = i;
    if (!cache[i].tok) break;
  }
  char path[1024];
  int rc = pw_ds_path(c->state_dir, id, path, sizeof path, err);
  if (!rc) rc = pw_tokenizer_open(path, out, err);
  if (rc) return rc;
  if (cache[lru].tok) pw_tokenizer_close(cache[lru].tok);
  snprintf(cache[lru].id, sizeof cache[lru].id, "%s", id);
  cache[lru].tok = *out;
  cache[lru].used = ++clock_;
  return 0;
}

int pw_api_tokenizer_lock(pw_coord *c, const char *id, pw_tokenizer **tok, pw_err *err) {
  pthread_mutex_lock(&mu);
  int rc = get(c, id, tok, err);
  if (rc) pthread_mutex_unlock(&mu);
  return rc;
}

void pw_api_tokenizer_unlock(void) { pthread_mutex_unlock(&mu); }

void pw_api_tokenizers_close(void) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < CACHED; i++) {
    if (cache[i].tok) pw_tokenizer_close(cache[i].tok);
    cache[i].tok = NULL;
  }
  pthread_mutex_unlock(&mu);
}

int pw_api_tokenizer_check(pw_req *r, const pw_job *job) {
  const char *id = job->data.tokenizer;
  if (!pw_ds_id_valid(id)) {
    pw_reply_error(r, PW_ESPEC, "data.tokenizer",
                   "must be a stored dataset's id (64 lowercase hex digits) holding a tokenizer.json: upload the "
                   "file (POST /v1/datasets; pipewright submit uploads a file data.tokenizer names)");
    return -1;
  }
  pw_tokenizer *tok;
  pw_err err = {0};
  char b[600];
  int rc = pw_api_tokenizer_lock(r->c, id, &tok, &err);
  if (rc == PW_ENOENT) {
    pw_reply_error(r, PW_ESPEC, "data.tokenizer", "no dataset %.64s is stored (upload it: POST /v1/datasets)", id);
    return -1;
  }
  if (rc) {
    pw_reply_error(r, PW_ESPEC, "data.tokenizer", "dataset %.12s... is not a tokenizer this coordinator reads: %s", id,
                   pw_err_str(&err, b, sizeof b));
    return -1;
  }
  uint32_t v = pw_tokenizer_vocab_size(tok);
  char what[160];
  snprintf(what, sizeof what, "%s", pw_tokenizer_describe(tok));
  pw_api_tokenizer_unlock();
  if (v > (uint32_t)job->model.vocab_size) {
    pw_reply_error(r, PW_ESPEC, "data.tokenizer", "the tokenizer has %u ids (%s); model.vocab_size is %d", v, what,
                   job->model.vocab_size);
    return -1;
  }
  return 0;
}
