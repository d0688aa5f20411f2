/* serve: the serving loop of serve.h — rank 0's continuous batching, each
 * stage's forward over the KV cache, the last stage's sampling.
 *
 * Microbatch ids 0..pp-1 name the microbatches in flight; rank 0 reuses
 * an id once its tokens are back, so a stage never holds two microbatches
 * of one id, and every buffer below is made once, per id, at start. Never
 * allocates per token (the "tokens" message to the coordinator aside). */
#include "serve.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "decode.h"
#include "log.h"
#include "sample.h"

/* A SEQS record: one sequence of a microbatch. Doubles and 64-bit values
 * travel as two i32 halves, low first. */
enum { F_SLOT, F_POS, F_LEN, F_FLAGS, F_REQ_LO, F_REQ_HI, F_TOP_K, F_SEED_LO, F_SEED_HI, F_TEMP_LO, F_TEMP_HI,
       F_TOPP_LO, F_TOPP_HI, F_SPARE, N_F };
_Static_assert(N_F == PW_FRAME_SEQ_FIELDS, "a SEQS record is PW_FRAME_SEQ_FIELDS i32");
#define SEQ_FIRST 1 /* the sequence's first forward: the last stage (re)seeds its sampler */

typedef struct { /* a request waiting for a slot (rank 0) */
  int64_t req;
  int32_t *prompt;
  int n, max_tokens;
  pw_sample_config sc;
} sreq;

typedef struct { /* a KV slot's sequence (rank 0) */
  int active, inflight;
  int n_prompt, n_gen, max_tokens, last;
  int64_t req;
  pw_sample_config sc;
  int32_t *prompt;       /* [len] */
} sslot;

typedef struct { /* one microbatch id, at this stage */
  int busy;              /* rank 0: sent, tokens not back; others: SEQS in, not yet run */
  int got_act, got_tok;
  int n, rows;
  int32_t *seqs;         /* [seqs * N_F] the records: formed (rank 0) or received */
  float *act_in;         /* [rows * in_width] received (stages > 0) */
  int32_t *tok;          /* [seqs] the tokens back (rank 0) */
  int32_t *seqs_out;     /* [seqs * N_F] being sent on */
  float *act_out;        /* [rows * out_width] being sent on (all but the last stage) */
  atomic_int pending;    /* writes of seqs_out / act_out the loop still does */
} smb;

struct pw_serve {
  const pw_rctx *cx;
  int seqs, len, rows, queue_max;
  uv_mutex_t mu;         /* the request queue (the loop thread adds to it), the fifo */
  /* under mu: requests for rank 0, a ring */
  sreq *q;
  int q_head, q_len;
  /* compute thread */
  int stage, first, last, prev_rank, next_rank, head_rank, last_rank;
  int in_value, out_value, in_width, out_width, V;
  pw_decode *d;
  sslot *slot;           /* [seqs] rank 0 */
  smb *mb;               /* [pp] */
  int *fifo, f_head, f_len; /* [pp] ids whose ACT is in, in arrival order (stages > 0) */
  int rr;                /* rank 0: where the next microbatch starts looking */
  pw_sampler *smp;       /* [seqs] last stage: each slot's sampler */
  pw_decode_seq *call;   /* [seqs] */
};

static void put64(int32_t *lo, uint64_t v) {
  lo[0] = (int32_t)(uint32_t)v;
  lo[1] = (int32_t)(uint32_t)(v >> 32);
}
static uint64_t get64(const int32_t *lo) { return (uint64_t)(uint32_t)lo[0] | (uint64_t)(uint32_t)lo[1] << 32; }
static void putd(int32_t *lo, double d) {
  uint64_t v;
  memcpy(&v, &d, sizeof v);
  put64(lo, v);
}
static double getd(const int32_t *lo) {
  uint64_t v = get64(lo);
  double d;
  memcpy(&d, &v, sizeof d);
  return d;
}

/* ---- setup ----------------------------------------------------------------- */

int pw_serve_create(pw_serve **out, const pw_rctx *c, const pw_msg_assign *a, pw_err *err) {
  *out = NULL;
  if (a->serve_seqs < 1 || a->serve_len < 1 || a->serve_queue < 0)
    return pw_err_set(err, PW_EPROTO, "assign.serve_seqs",
                      "a serve job's assign needs serve_seqs, serve_len and serve_queue");
  if (c->n_ls != 1 || c->S != c->pp || c->rank_of_stage[c->ls[0].stage] != c->ls[0].stage)
    return pw_err_set(err, PW_ENOTSUP, "mesh.virtual_stages", "serving runs one stage per pipeline rank, in order");
  if (a->serve_len > c->model->seq_len)
    return pw_err_set(err, PW_EPROTO, "assign.serve_len", "%lld is over the model's seq_len %d",
                      (long long)a->serve_len, c->model->seq_len);
  pw_serve *s = calloc(1, sizeof *s);
  if (!s) return pw_err_set(err, PW_ENOMEM, "serve", "out of memory");
  if (uv_mutex_init(&s->mu)) {
    free(s);
    return pw_err_set(err, PW_ENOMEM, "serve", "cannot make a mutex");
  }
  *out = s;
  s->cx = c;
  s->seqs = (int)a->serve_seqs;
  s->len = (int)a->serve_len;
  s->rows = s->len + s->seqs; /* one prefill and a decode row of every other slot */
  s->queue_max = s->seqs + (int)a->serve_queue;
  s->q = calloc((size_t)s->queue_max, sizeof *s->q);
  s->mb = calloc((size_t)c->pp, sizeof *s->mb);
  s->fifo = calloc((size_t)c->pp, sizeof *s->fifo);
  s->slot = calloc((size_t)s->seqs, sizeof *s->slot);
  s->smp = calloc((size_t)s->seqs, sizeof *s->smp);
  s->call = calloc((size_t)s->seqs, sizeof *s->call);
  if (!s->q || !s->mb || !s->fifo || !s->slot || !s->smp || !s->call)
    return pw_err_set(err, PW_ENOMEM, "serve", "out of memory");
  return 0;
}

void pw_serve_free(pw_serve *s) {
  const pw_rctx *c = s->cx;
  if (!s) return;
  for (int i = 0; s->q && i < s->q_len; i++) free(s->q[(s->q_head + i) % s->queue_max].prompt);
  for (int j = 0; s->mb && j < c->pp; j++) {
    smb *b = &s->mb[j];
    free(b->seqs), free(b->act_in), free(b->tok), free(b->seqs_out), free(b->act_out);
  }
  for (int i = 0; s->slot && i < s->seqs; i++) free(s->slot[i].prompt);
  for (int i = 0; s->smp && i < s->seqs; i++) pw_sampler_free(&s->smp[i]);
  pw_decode_free(s->d);
  free(s->q), free(s->mb), free(s->fifo), free(s->slot), free(s->smp), free(s->call);
  uv_mutex_destroy(&s->mu);
  free(s);
}

/* The decoder, the ports and every buffer, on the compute thread (first
 * touched here), once the parameters are in. */
static int setup(pw_serve *s, pw_err *err) {
  const pw_rctx *c = s->cx;
  const pw_model *m = c->model;
  pw_prog *p = c->ls[0].prog;
  s->stage = c->ls[0].stage;
  s->first = s->stage == 0;
  s->last = s->stage == c->S - 1;
  s->prev_rank = s->first ? -1 : pw_rctx_global_rank(c, s->stage - 1);
  s->next_rank = s->last ? -1 : pw_rctx_global_rank(c, s->stage + 1);
  s->head_rank = pw_rctx_global_rank(c, 0);
  s->last_rank = pw_rctx_global_rank(c, c->S - 1);
  s->V = m->data.vocab_size;
  pw_decode_config dc = {.max_seqs = s->seqs, .max_pos = s->len, .max_rows = s->rows};
  int rc = pw_decode_create(p, &dc, &s->d, err);
  if (rc) return rc;
  s->in_value = s->out_value = -1;
  for (int i = 0; i < pw_decode_n_inputs(s->d); i++) {
    int v = pw_decode_input(s->d, i);
    if (m->values[v].role == PW_VAL_ACT || (s->first && v == m->input_value)) s->in_value = v;
  }
  s->out_value = s->last ? m->nodes[m->values[m->loss_value].producer].in[0]
                         : pw_decode_n_outputs(s->d) == 1 ? pw_decode_output(s->d, 0) : -1;
  if (s->in_value < 0 || s->out_value < 0)
    return pw_err_set(err, PW_ENOTSUP, "serve", "stage %d: serving needs one input and one output port", s->stage);
  s->in_width = m->values[s->in_value].width;
  s->out_width = m->values[s->out_value].width;
  size_t rec = (size_t)s->seqs * N_F * sizeof(int32_t);
  for (int j = 0; j < c->pp; j++) {
    smb *b = &s->mb[j];
    atomic_init(&b->pending, 0);
    b->seqs = calloc(1, rec);
    b->seqs_out = calloc(1, rec);
    b->tok = calloc((size_t)s->seqs, sizeof *b->tok);
    if (!s->first) b->act_in = calloc((size_t)s->rows * (size_t)s->in_width, sizeof(float));
    if (!s->last) b->act_out = calloc((size_t)s->rows * (size_t)s->out_width, sizeof(float));
    if (!b->seqs || !b->seqs_out || !b->tok || (!s->first && !b->act_in) || (!s->last && !b->act_out))
      return pw_err_set(err, PW_ENOMEM, "serve", "out of memory");
  }
  for (int i = 0; i < s->seqs; i++) {
    if (s->first && !(s->slot[i].prompt = malloc(sizeof(int32_t) * (size_t)s->len)))
      return pw_err_set(err, PW_ENOMEM, "serve", "out of memory");
    if (s->last && (rc = pw_sampler_init(&s->smp[i], s->V, &(pw_sample_config){.top_p = 1}, err))) return rc;
  }
  pw_info("job %llu: rank %d serves stage %d: %d sequences of %d positions, KV cache %.1f MiB, linears %s",
          (unsigned long long)c->job, c->rank, s->stage, s->seqs, s->len,
          (double)pw_decode_kv_floats(m, c->part->stages[s->stage].layer_lo, c->part->stages[s->stage].layer_hi, s->len) *
              4.0 * s->seqs / (1 << 20),
          pw_decode_path(s->d));
  return 0;
}

/* ---- requests (loop thread) ---------------------------------------------------- */

static int refuse(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, cap, fmt, ap);
  va_end(ap);
  return PW_EINVAL;
}

int pw_serve_submit(pw_serve *s, const pw_msg_generate *g, char *why, size_t cap) {
  const pw_rctx *c = s->cx;
  size_t n = json_array_size(g->prompt);
  int V = c->model->data.vocab_size;
  pw_sample_config sc = {.temperature = g->temperature, .top_k = (int)g->top_k, .top_p = g->top_p,
                         .seed = (uint64_t)g->seed};
  if (c->prank != 0)
    return refuse(why, cap, "rank %d of job %llu does not take requests", c->rank, (unsigned long long)c->job);
  if (n < 1 || n > (size_t)s->len || g->max_tokens > s->len - (int64_t)n + 1)
    return refuse(why, cap, "%zu prompt tokens and %lld new ones do not fit serve.max_len %d", n,
                  (long long)g->max_tokens, s->len);
  if (!(g->top_p <= 1) || g->top_k > INT32_MAX) /* a top_k past V takes them all */
    return refuse(why, cap, "top_p %g over 1, or top_k %lld over %d", g->top_p, (long long)g->top_k, INT32_MAX);
  int32_t *p = malloc(sizeof *p * n);
  if (!p) return refuse(why, cap, "out of memory");
  for (size_t i = 0; i < n; i++) {
    json_int_t t = json_integer_value(json_array_get(g->prompt, i));
    if (t < 0 || t >= V) {
      free(p);
      return refuse(why, cap, "prompt[%zu]: token %lld is not in 0..%d", i, (long long)t, V - 1);
    }
    p[i] = (int32_t)t;
  }
  uv_mutex_lock(&s->mu);
  int full = s->q_len == s->queue_max;
  if (!full) s->q[(s->q_head + s->q_len++) % s->queue_max] =
      (sreq){.req = g->req, .prompt = p, .n = (int)n, .max_tokens = (int)g->max_tokens, .sc = sc};
  uv_mutex_unlock(&s->mu);
  if (full) {
    free(p);
    return refuse(why, cap, "the queue of %d requests is full", s->queue_max);
  }
  c->wake(c->run);
  return 0;
}

/* ---- frames (compute thread, the run's frame lock held) --------------------------------------- */

int pw_serve_dest(pw_serve *s, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  const pw_rctx *c = s->cx;
  uint32_t j = h->microbatch;
  if (j >= (uint32_t)c->pp) return pw_err_set(err, PW_EPROTO, "frame", "microbatch %u of %d", j, c->pp);
  smb *b = &s->mb[j];
  if (h->kind == PW_FRAME_TOKENS) {
    if (!s->first || from != s->last_rank || !b->busy || b->got_tok || h->dims[0] != (uint32_t)b->n)
      return pw_err_set(err, PW_EPROTO, "frame", "TOKENS for microbatch %u from rank %d not expected here", j, from);
    *dst = b->tok;
    return 0;
  }
  if (s->first || from != s->prev_rank || h->stage != (uint32_t)s->stage)
    return pw_err_set(err, PW_EPROTO, "frame", "%s for stage %u from rank %d not expected here",
                      pw_frame_kind_name(h->kind), h->stage, from);
  if (h->kind == PW_FRAME_SEQS) {
    if (b->busy || h->dims[0] > (uint32_t)s->seqs)
      return pw_err_set(err, PW_EPROTO, "frame", "SEQS for microbatch %u: %u sequences (at most %d), or twice", j,
                        h->dims[0], s->seqs);
    b->n = (int)h->dims[0];
    *dst = b->seqs;
    return 0;
  }
  if (h->kind != PW_FRAME_ACT || !b->busy || b->got_act || (int)h->value != s->in_value || h->dtype != PW_DTYPE_F32)
    return pw_err_set(err, PW_EPROTO, "frame", "%s value %u for microbatch %u not expected here",
                      pw_frame_kind_name(h->kind), h->value, j);
  if (h->payload_len != (uint64_t)b->rows * (uint64_t)s->in_width * sizeof(float))
    return pw_err_set(err, PW_EPROTO, "frame", "ACT for microbatch %u: %llu bytes, its %d rows are %zu", j,
                      (unsigned long long)h->payload_len, b->rows,
                      (size_t)b->rows * (size_t)s->in_width * sizeof(float));
  *dst = b->act_in;
  return 0;
}

/* The records' rows, or -1 when a length is out of range. */
static int rows_of(const pw_serve *s, const int32_t *rec, int n) {
  int rows = 0;
  for (int i = 0; i < n; i++) {
    int len = rec[i * N_F + F_LEN];
    if (len < 1 || len > s->rows - rows) return -1;
    rows += len;
  }
  return rows;
}

void pw_serve_frame(pw_serve *s, const pw_frame_hdr *h) {
  const pw_rctx *c = s->cx;
  smb *b = &s->mb[h->microbatch];
  if (h->kind == PW_FRAME_TOKENS) {
    b->got_tok = 1;
  } else if (h->kind == PW_FRAME_SEQS) {
    b->busy = 1;
    b->rows = rows_of(s, b->seqs, b->n); /* -1: its ACT is refused (no payload is -4 bytes) */
  } else {
    b->got_act = 1;
    s->fifo[(s->f_head + s->f_len++) % c->pp] = (int)h->microbatch;
  }
}

/* ---- the forward of one microbatch --------------------------------------------- */

static int pending_zero(void *arg) {
  return atomic_load(&((smb *)arg)->pending) == 0;
}

static int send_on(pw_serve *s, int j, int kind, const void *payload, uint32_t d0, uint32_t d1) {
  const pw_rctx *c = s->cx;
  pw_frame_hdr h;
  int dtype = kind == PW_FRAME_ACT ? PW_DTYPE_F32 : PW_DTYPE_I32;
  int to = kind == PW_FRAME_TOKENS ? s->head_rank : s->next_rank;
  uint32_t dims[2] = {d0, d1};
  int rc = pw_frame_hdr_init(&h, kind, c->job, 0, (uint32_t)j, kind == PW_FRAME_TOKENS ? 0u : (uint32_t)s->stage + 1,
                             kind == PW_FRAME_ACT ? (uint32_t)s->out_value : 0u, dtype, kind == PW_FRAME_TOKENS ? 1 : 2,
                             dims);
  if (rc) return pw_rctx_fail(c, rc, NULL, "serve: a %s header", pw_frame_kind_name(kind));
  return c->send(c->run, to, &h, payload, &s->mb[j].pending);
}

/* The last stage: each sequence's next token from the last row of its
 * logits, by its own sampler; to rank 0 and to the coordinator. */
static int sample(pw_serve *s, int j, const int32_t *rec, int n) {
  const pw_rctx *c = s->cx;
  smb *b = &s->mb[j];
  const float *lg = pw_decode_value(s->d, s->out_value);
  json_t *items = json_array();
  int row = 0, rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    const int32_t *q = rec + i * N_F;
    pw_sampler *sm = &s->smp[q[F_SLOT]];
    row += q[F_LEN];
    if (q[F_FLAGS] & SEQ_FIRST) {
      pw_sample_config sc = {.temperature = getd(q + F_TEMP_LO), .top_k = q[F_TOP_K], .top_p = getd(q + F_TOPP_LO),
                             .seed = get64(q + F_SEED_LO)};
      pw_err err = {0};
      if ((rc = pw_sampler_reset(sm, &sc, &err))) return pw_rctx_fail(c, rc, &err, "serve");
    }
    b->tok[i] = pw_sampler_next(sm, lg + (size_t)(row - 1) * (size_t)s->V);
    if (items && (json_array_append_new(items, json_integer((json_int_t)get64(q + F_REQ_LO))) ||
                  json_array_append_new(items, json_integer(b->tok[i]))))
      json_decref(items), items = NULL;
  }
  json_t *msg = items ? PW_CONTROL_BUILD(PW_MSG_TOKENS, pw_msg_tokens, NULL, .job = (int64_t)c->job,
                                         .run = c->run_id, .rank = c->rank, .items = items)
                      : NULL;
  json_decref(items);
  if (!msg) return pw_rctx_fail(c, PW_ENOMEM, NULL, "serve: out of memory for a tokens message");
  pw_event ev = {.kind = PW_EV_CTL, .msg = msg};
  if ((rc = c->post(c->run, &ev))) {
    json_decref(msg);
    return pw_rctx_fail(c, rc, NULL, "serve: out of memory queueing tokens");
  }
  if (s->first) { /* pp 1: rank 0 takes them as if they had come back */
    b->got_tok = 1;
    return 0;
  }
  return send_on(s, j, PW_FRAME_TOKENS, b->tok, (uint32_t)n, 0);
}

/* Microbatch j, its input in the decoder: forward, then on. */
static int forward(pw_serve *s, int j, const int32_t *rec, int n, int rows) {
  const pw_rctx *c = s->cx;
  for (int i = 0; i < n; i++)
    s->call[i] = (pw_decode_seq){rec[i * N_F + F_SLOT], rec[i * N_F + F_POS], rec[i * N_F + F_LEN]};
  pw_err err = {0};
  int rc = pw_decode_forward(s->d, s->call, n, &err);
  if (rc) return pw_rctx_fail(c, rc, &err, "serve: microbatch %d", j);
  if (s->last) return sample(s, j, rec, n);
  smb *b = &s->mb[j];
  if ((rc = c->wait(c->run, pending_zero, b))) return rc; /* its last sends are written */
  memcpy(b->seqs_out, rec, sizeof(int32_t) * N_F * (size_t)n);
  memcpy(b->act_out, pw_decode_value(s->d, s->out_value), sizeof(float) * (size_t)rows * (size_t)s->out_width);
  if ((rc = send_on(s, j, PW_FRAME_SEQS, b->seqs_out, (uint32_t)n, N_F))) return rc;
  return send_on(s, j, PW_FRAME_ACT, b->act_out, (uint32_t)rows, (uint32_t)s->out_width);
}

/* ---- rank 0: batching ---------------------------------------------------------- */

static int queued(pw_serve *s) {
  uv_mutex_lock(&s->mu);
  int n = s->q_len;
  uv_mutex_unlock(&s->mu);
  return n;
}

static int free_mb(const pw_serve *s) {
  const pw_rctx *c = s->cx;
  for (int j = 0; j < c->pp; j++)
    if (!s->mb[j].busy) return j;
  return -1;
}

static int head_ready(void *arg) {
  pw_serve *s = arg;
  const pw_rctx *c = s->cx;
  for (int j = 0; j < c->pp; j++)
    if (s->mb[j].got_tok) return 1;
  if (free_mb(s) < 0) return 0;
  int free_slot = 0;
  for (int i = 0; i < s->seqs; i++) {
    if (s->slot[i].active && !s->slot[i].inflight) return 1;
    free_slot |= !s->slot[i].active;
  }
  return free_slot && queued(s) > 0;
}

/* Tokens of microbatch j are back: each sequence one token on; a request
 * with all its tokens frees its slot. */
static void take_tokens(pw_serve *s, smb *b) {
  for (int i = 0; i < b->n; i++) {
    sslot *q = &s->slot[b->seqs[i * N_F + F_SLOT]];
    q->last = b->tok[i];
    q->inflight = 0;
    if (++q->n_gen == q->max_tokens) q->active = 0;
  }
  b->busy = b->got_tok = 0;
}

/* Queued requests into free slots (a step boundary: no slot is in flight
 * twice, a freed one is reused from position 0). */
static void admit(pw_serve *s) {
  uv_mutex_lock(&s->mu);
  for (int i = 0; i < s->seqs && s->q_len; i++) {
    sslot *q = &s->slot[i];
    if (q->active) continue;
    sreq *e = &s->q[s->q_head];
    s->q_head = (s->q_head + 1) % s->queue_max;
    s->q_len--;
    memcpy(q->prompt, e->prompt, sizeof(int32_t) * (size_t)e->n);
    free(e->prompt);
    *q = (sslot){.active = 1, .n_prompt = e->n, .max_tokens = e->max_tokens, .req = e->req, .sc = e->sc,
                 .prompt = q->prompt};
  }
  uv_mutex_unlock(&s->mu);
}

/* Microbatch j from the slots ready for a forward: at most a pp-th of the
 * active ones (so pp microbatches share them and every stage is busy),
 * decode rows first, then prefills while the rows fit. Returns its size. */
static int form(pw_serve *s, int j) {
  const pw_rctx *c = s->cx;
  smb *b = &s->mb[j];
  int active = 0, n = 0, rows = 0;
  for (int i = 0; i < s->seqs; i++) active += s->slot[i].active;
  int cap = (active + c->pp - 1) / c->pp;
  int32_t *in = pw_decode_value(s->d, s->in_value);
  for (int pass = 0; pass < 2; pass++)
    for (int k = 0; k < s->seqs && n < cap; k++) {
      int i = (s->rr + k) % s->seqs;
      sslot *q = &s->slot[i];
      if (!q->active || q->inflight || (q->n_gen == 0) != pass) continue;
      int len = q->n_gen ? 1 : q->n_prompt;
      if (len > s->rows - rows) continue;
      int32_t *e = b->seqs + n * N_F;
      memset(e, 0, sizeof(int32_t) * N_F);
      e[F_SLOT] = i;
      e[F_POS] = q->n_gen ? q->n_prompt + q->n_gen - 1 : 0;
      e[F_LEN] = len;
      e[F_FLAGS] = q->n_gen ? 0 : SEQ_FIRST;
      put64(e + F_REQ_LO, (uint64_t)q->req);
      e[F_TOP_K] = q->sc.top_k;
      put64(e + F_SEED_LO, q->sc.seed);
      putd(e + F_TEMP_LO, q->sc.temperature);
      putd(e + F_TOPP_LO, q->sc.top_p);
      if (q->n_gen) in[rows] = q->last;
      else memcpy(in + rows, q->prompt, sizeof(int32_t) * (size_t)len);
      rows += len;
      q->inflight = 1;
      n++;
    }
  s->rr = (s->rr + 1) % s->seqs;
  b->n = n;
  b->rows = rows;
  return n;
}

static int serve_head(pw_serve *s) {
  const pw_rctx *c = s->cx;
  for (;;) {
    int rc = c->wait(c->run, head_ready, s);
    if (rc) return rc;
    for (int j = 0; j < c->pp; j++)
      if (s->mb[j].got_tok) take_tokens(s, &s->mb[j]);
    admit(s);
    int j = free_mb(s);
    if (j < 0 || form(s, j) == 0) continue;
    s->mb[j].busy = 1;
    if ((rc = forward(s, j, s->mb[j].seqs, s->mb[j].n, s->mb[j].rows))) return rc;
  }
}

/* ---- the other stages ---------------------------------------------------------- */

static int arrived(void *arg) {
  return ((const pw_serve *)arg)->f_len > 0;
}

static int serve_stage(pw_serve *s) {
  const pw_rctx *c = s->cx;
  for (;;) {
    int rc = c->wait(c->run, arrived, s);
    if (rc) return rc;
    uv_mutex_lock(&s->mu);
    int j = s->fifo[s->f_head];
    s->f_head = (s->f_head + 1) % c->pp;
    s->f_len--;
    uv_mutex_unlock(&s->mu);
    smb *b = &s->mb[j];
    memcpy(pw_decode_value(s->d, s->in_value), b->act_in, sizeof(float) * (size_t)b->rows * (size_t)s->in_width);
    rc = forward(s, j, b->seqs, b->n, b->rows);
    uv_mutex_lock(&s->mu);
    b->busy = b->got_act = 0;
    uv_mutex_unlock(&s->mu);
    if (rc) return rc;
  }
}

int pw_serve_run(pw_serve *s) {
  const pw_rctx *c = s->cx;
  pw_err err = {0};
  int rc = setup(s, &err);
  if (rc) return pw_rctx_fail(c, rc, &err, "serve");
  return s->first ? serve_head(s) : serve_stage(s);
}
