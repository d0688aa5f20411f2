/* control: the control messages as one table (types and their fields),
 * which drives validation, typed build/read and dispatch; the
 * length-prefixed encoder, the stream reader and the cluster token
 * helpers. See control.h for the protocol. */
#include "control.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define GROW_FIRST ((size_t)64 * 1024)
#define KEEP_MAX ((size_t)1 << 20) /* a larger buffer is freed after its message */

/* ---- the message table ----------------------------------------------------- */

/* F_INTS: [int >= 0, ...]; F_NUMS: [number, ...]; F_OBJ: an object whose
 * own fields are a table of their own (sub), read into its own struct. */
typedef enum { F_INT, F_NUM, F_STR, F_ACTIONS, F_PEERS, F_INTS, F_NUMS, F_OBJ } ftype;

/* One field: its name is the struct member's (one spelling for both). */
typedef struct field field;
struct field {
  const char *name;
  ftype type;
  int optional;
  int min;      /* F_INT, F_NUM: smallest allowed value ... */
  int has_min;  /* ... when set */
  int excl;     /* F_NUM: min is exclusive */
  size_t off;   /* where in the message's struct */
  const field *sub; /* F_OBJ: the object's fields ... */
  size_t sub_size;  /* ... and the size of its struct */
};

#define FLD(S, m, t, opt, mn, hm, ex) {#m, t, opt, mn, hm, ex, offsetof(S, m), NULL, 0}
#define REQ(S, m, t) FLD(S, m, t, 0, 0, 0, 0)
#define OPT(S, m, t) FLD(S, m, t, 1, 0, 0, 0)
#define REQ_MIN(S, m, t, mn) FLD(S, m, t, 0, mn, 1, 0)
#define OPT_MIN(S, m, t, mn) FLD(S, m, t, 1, mn, 1, 0)
#define OPT_OBJ(S, m, T) {#m, F_OBJ, 1, 0, 0, 0, offsetof(S, m), f_##T, sizeof(T)}
#define END {NULL, F_INT, 0, 0, 0, 0, 0, NULL, 0}

#define S pw_msg_register
static const field f_pw_msg_register[] = {
    REQ_MIN(S, version, F_INT, 1), REQ(S, name, F_STR),         REQ(S, token, F_STR),
    REQ(S, data_addr, F_STR),      REQ_MIN(S, cores, F_INT, 1), REQ_MIN(S, threads, F_INT, 1),
    REQ(S, software, F_STR),       OPT_MIN(S, job, F_INT, 0),   OPT_MIN(S, memory, F_INT, 0),
    OPT(S, blas_core, F_STR),      OPT_MIN(S, blas_forced, F_INT, 0), OPT(S, cpu_level, F_STR),
    OPT_MIN(S, gemm_gflops, F_NUM, 0), OPT(S, host, F_STR), OPT(S, hostname, F_STR),
    OPT(S, gemm_path, F_STR),      OPT(S, cores_from, F_STR),   OPT(S, memory_from, F_STR),
    OPT(S, cpus, F_STR),           OPT(S, numa, F_STR),         END};
#undef S
#define S pw_msg_heartbeat
static const field f_pw_msg_heartbeat[] = {REQ_MIN(S, time, F_NUM, 0), REQ(S, state, F_STR), OPT_MIN(S, job, F_INT, 0),
                                           OPT_MIN(S, fds, F_INT, 0), END};
#undef S
#define S pw_msg_step_trace
static const field f_pw_msg_step_trace[] = {
    REQ(S, ready, F_NUMS),              REQ(S, routed, F_NUMS),     REQ_MIN(S, end_wait, F_NUM, 0),
    REQ(S, end_work, F_NUM),            REQ_MIN(S, after, F_NUM, 0), REQ_MIN(S, t0, F_NUM, 0),
    REQ_MIN(S, sleeps, F_INT, 0),       END};
#undef S
#define S pw_msg_step
static const field f_pw_msg_step[] = {
    REQ_MIN(S, job, F_INT, 0),      REQ_MIN(S, run, F_INT, 0),      REQ_MIN(S, rank, F_INT, 0),
    REQ_MIN(S, step, F_INT, 0),     OPT(S, loss, F_NUM),            REQ_MIN(S, step_time, F_NUM, 0),
    OPT_MIN(S, tokens, F_NUM, 0),   OPT_MIN(S, peak_act, F_INT, 0), OPT(S, grad_norm, F_NUM),
    OPT(S, lr, F_NUM),              OPT(S, actions, F_ACTIONS),     OPT_MIN(S, nonfinite, F_INT, 0),
    OPT(S, eval_loss, F_NUM),       OPT_MIN(S, dp_bytes, F_INT, 0), OPT_MIN(S, dp_seconds, F_NUM, 0),
    OPT_MIN(S, tp_bytes, F_INT, 0), OPT_MIN(S, tp_seconds, F_NUM, 0), OPT_OBJ(S, trace, pw_msg_step_trace),
    END};
#undef S
#define S pw_msg_checkpoint
static const field f_pw_msg_checkpoint[] = {REQ_MIN(S, job, F_INT, 0),  REQ_MIN(S, run, F_INT, 0),
                                            REQ_MIN(S, rank, F_INT, 0), REQ_MIN(S, step, F_INT, 0),
                                            REQ(S, path, F_STR),        REQ_MIN(S, bytes, F_INT, 0),
                                            OPT_MIN(S, stage, F_INT, 0), END};
#undef S
#define S pw_msg_done
static const field f_pw_msg_done[] = {REQ_MIN(S, job, F_INT, 0), REQ_MIN(S, run, F_INT, 0), REQ_MIN(S, rank, F_INT, 0),
                                      END};
#undef S
#define S pw_msg_error
static const field f_pw_msg_error[] = {OPT_MIN(S, job, F_INT, 0),  OPT_MIN(S, run, F_INT, 0),
                                       OPT_MIN(S, rank, F_INT, 0), REQ(S, message, F_STR),
                                       OPT_MIN(S, lost_rank, F_INT, 0), OPT_MIN(S, restore_failed, F_INT, 0),
                                       OPT_MIN(S, peer_aborted, F_INT, 0), END};
#undef S
#define S pw_msg_snapshot
static const field f_pw_msg_snapshot[] = {REQ_MIN(S, job, F_INT, 0),   REQ_MIN(S, run, F_INT, 0),
                                          REQ_MIN(S, rank, F_INT, 0),  REQ_MIN(S, stage, F_INT, 0),
                                          REQ_MIN(S, step, F_INT, 1),  REQ_MIN(S, held, F_INT, 0), END};
#undef S
#define S pw_msg_welcome
static const field f_pw_msg_welcome[] = {REQ_MIN(S, version, F_INT, 1), REQ_MIN(S, worker_id, F_INT, 0),
                                         FLD(S, heartbeat_interval, F_NUM, 0, 0, 1, 1), OPT(S, http_url, F_STR), END};
#undef S
#define S pw_msg_refused
static const field f_pw_msg_refused[] = {REQ(S, reason, F_STR), END};
#undef S
#define S pw_msg_assign
static const field f_pw_msg_assign[] = {
    REQ_MIN(S, job, F_INT, 0),        REQ_MIN(S, run, F_INT, 0),         REQ_MIN(S, rank, F_INT, 0),
    REQ(S, slice, F_STR),             REQ(S, slice_sha256, F_STR),       REQ(S, peers, F_PEERS),
    REQ_MIN(S, steps, F_INT, 0),      REQ_MIN(S, start_step, F_INT, 0),  OPT(S, checkpoint_dir, F_STR),
    OPT(S, resume, F_STR),            OPT_MIN(S, trace_every, F_INT, 0), OPT_MIN(S, restore_step, F_INT, 1),
    OPT(S, restore_from, F_INTS),     OPT_MIN(S, serve_seqs, F_INT, 1), OPT_MIN(S, serve_len, F_INT, 1),
    OPT_MIN(S, serve_queue, F_INT, 0), OPT(S, upload_token, F_STR), OPT(S, cpus, F_STR), END};
#undef S
#define S pw_msg_generate
static const field f_pw_msg_generate[] = {
    REQ_MIN(S, job, F_INT, 0),        REQ_MIN(S, run, F_INT, 0),   REQ_MIN(S, req, F_INT, 0),
    REQ(S, prompt, F_INTS),           REQ_MIN(S, max_tokens, F_INT, 1), REQ_MIN(S, temperature, F_NUM, 0),
    REQ_MIN(S, top_k, F_INT, 0),      FLD(S, top_p, F_NUM, 0, 0, 1, 1), REQ_MIN(S, seed, F_INT, 0), END};
#undef S
#define S pw_msg_tokens
static const field f_pw_msg_tokens[] = {REQ_MIN(S, job, F_INT, 0), REQ_MIN(S, run, F_INT, 0),
                                        REQ_MIN(S, rank, F_INT, 0), REQ(S, items, F_INTS), END};
#undef S
#define S pw_msg_gen_failed
static const field f_pw_msg_gen_failed[] = {REQ_MIN(S, job, F_INT, 0), REQ_MIN(S, run, F_INT, 0),
                                            REQ_MIN(S, rank, F_INT, 0), REQ_MIN(S, req, F_INT, 0),
                                            REQ(S, message, F_STR), END};
#undef S
#define S pw_msg_cancel
static const field f_pw_msg_cancel[] = {REQ_MIN(S, job, F_INT, 0), REQ_MIN(S, run, F_INT, 0), REQ(S, reason, F_STR),
                                        END};
#undef S
#define S pw_msg_stop
static const field f_pw_msg_stop[] = {REQ_MIN(S, job, F_INT, 0), REQ_MIN(S, run, F_INT, 0), REQ_MIN(S, steps, F_INT, 1),
                                      END};
#undef S
static const field f_pw_msg_shutdown[] = {END};

static const struct {
  const char *name;
  int dir;
  size_t size;
  const field *fields;
} msg_table[PW_MSG__COUNT] = {
#define ROW(id, nm, dir, type) [PW_MSG_##id] = {nm, dir, sizeof(type), f_##type},
    PW_CONTROL_MSGS(ROW)
#undef ROW
};

pw_msg_type pw_control_msg_of(const char *name) {
  for (int i = 0; i < PW_MSG__COUNT; i++)
    if (name && strcmp(msg_table[i].name, name) == 0) return (pw_msg_type)i;
  return PW_MSG_UNKNOWN;
}

const char *pw_control_msg_name(pw_msg_type t) { return t >= 0 && t < PW_MSG__COUNT ? msg_table[t].name : NULL; }

int pw_control_msg_dir(const char *type) {
  pw_msg_type t = pw_control_msg_of(type);
  return t == PW_MSG_UNKNOWN ? 0 : msg_table[t].dir;
}

const char *pw_control_type(const json_t *msg) {
  return json_string_value(json_object_get(msg, "type"));
}

/* ---- validation -------------------------------------------------------------- */

static int bad(pw_err *err, const char *path, const char *why) {
  return pw_err_set(err, PW_EPROTO, path, "%s", why);
}

/* A wrong type's message says the bound too: "must be an integer >= 0". */
static int check_int(const json_t *v, const char *path, int has_min, int min, pw_err *err) {
  if (!json_is_integer(v))
    return has_min ? pw_err_set(err, PW_EPROTO, path, "must be an integer >= %d", min)
                   : bad(err, path, "must be an integer");
  if (has_min && json_integer_value(v) < min)
    return pw_err_set(err, PW_EPROTO, path, "must be >= %d (got %lld)", min,
                      (long long)json_integer_value(v));
  return 0;
}

static int check_num(const json_t *v, const char *path, const field *f, pw_err *err) {
  if (!json_is_number(v))
    return f && f->has_min ? pw_err_set(err, PW_EPROTO, path, "must be a number %s %d", f->excl ? ">" : ">=", f->min)
                           : bad(err, path, "must be a number");
  double x = json_number_value(v);
  if (!isfinite(x)) return bad(err, path, "must be finite");
  if (f && f->has_min && (f->excl ? x <= f->min : x < f->min))
    return pw_err_set(err, PW_EPROTO, path, "must be %s %d (got %g)", f->excl ? ">" : ">=", f->min, x);
  return 0;
}

/* One [kind, mb, stage, start, end] entry of step.actions. */
static int check_action(const json_t *a, const char *path, pw_err *err) {
  char p[160];
  if (!json_is_array(a) || json_array_size(a) != 5)
    return bad(err, path, "must be an array [kind, mb, stage, start, end]");
  snprintf(p, sizeof p, "%.100s[0]", path);
  if (!json_is_string(json_array_get(a, 0))) return bad(err, p, "must be a string");
  for (int k = 1; k <= 2; k++) {
    snprintf(p, sizeof p, "%.100s[%d]", path, k);
    int rc = check_int(json_array_get(a, (size_t)k), p, 1, 0, err);
    if (rc) return rc;
  }
  for (int k = 3; k <= 4; k++) {
    snprintf(p, sizeof p, "%.100s[%d]", path, k);
    int rc = check_num(json_array_get(a, (size_t)k), p, NULL, err);
    if (rc) return rc;
  }
  return 0;
}

static int check_peer(const json_t *o, const char *path, pw_err *err) {
  char p[160];
  if (!json_is_object(o)) return bad(err, path, "must be an object {rank, addr, host}");
  snprintf(p, sizeof p, "%.100s.rank", path);
  json_t *rank = json_object_get(o, "rank");
  if (!rank) return bad(err, p, "is required");
  int rc = check_int(rank, p, 1, 0, err);
  if (rc) return rc;
  snprintf(p, sizeof p, "%.100s.addr", path);
  json_t *addr = json_object_get(o, "addr");
  if (!addr) return bad(err, p, "is required");
  if (!json_is_string(addr)) return bad(err, p, "must be a string");
  snprintf(p, sizeof p, "%.100s.host", path);
  json_t *host = json_object_get(o, "host");
  if (!host) return bad(err, p, "is required");
  if (!json_is_string(host)) return bad(err, p, "must be a string");
  return 0;
}

static int check_fields(const json_t *o, const field *fields, const char *prefix, pw_err *err);

static int check_field(const json_t *v, const field *f, const char *path, pw_err *err) {
  char p[160];
  size_t i;
  json_t *x;
  int rc;
  switch (f->type) {
    case F_INT: return check_int(v, path, f->has_min, f->min, err);
    case F_NUM: return check_num(v, path, f, err);
    case F_STR: return json_is_string(v) ? 0 : bad(err, path, "must be a string");
    case F_ACTIONS:
      if (!json_is_array(v)) return bad(err, path, "must be an array");
      json_array_foreach(v, i, x) {
        snprintf(p, sizeof p, "%.100s[%zu]", path, i);
        if ((rc = check_action(x, p, err))) return rc;
      }
      return 0;
    case F_PEERS:
      if (!json_is_array(v)) return bad(err, path, "must be an array");
      json_array_foreach(v, i, x) {
        snprintf(p, sizeof p, "%.100s[%zu]", path, i);
        if ((rc = check_peer(x, p, err))) return rc;
      }
      return 0;
    case F_INTS:
      if (!json_is_array(v)) return bad(err, path, "must be an array");
      json_array_foreach(v, i, x) {
        snprintf(p, sizeof p, "%.100s[%zu]", path, i);
        if ((rc = check_int(x, p, 1, 0, err))) return rc;
      }
      return 0;
    case F_NUMS:
      if (!json_is_array(v)) return bad(err, path, "must be an array");
      json_array_foreach(v, i, x) {
        snprintf(p, sizeof p, "%.100s[%zu]", path, i);
        if ((rc = check_num(x, p, NULL, err))) return rc;
      }
      return 0;
    case F_OBJ:
      if (!json_is_object(v)) return bad(err, path, "must be an object");
      return check_fields(v, f->sub, path, err);
  }
  return bad(err, path, "internal: bad field type");
}

/* o's fields as the table says, each named prefix.name in an error. */
static int check_fields(const json_t *o, const field *fields, const char *prefix, pw_err *err) {
  for (const field *f = fields; f->name; f++) {
    char path[128];
    snprintf(path, sizeof path, "%.80s.%.40s", prefix, f->name);
    json_t *v = json_object_get(o, f->name);
    if (!v) {
      if (f->optional) continue;
      return bad(err, path, "is required");
    }
    int rc = check_field(v, f, path, err);
    if (rc) return rc;
  }
  return 0;
}

int pw_control_validate(const json_t *msg, pw_err *err) {
  if (!json_is_object(msg)) return bad(err, "", "message must be a JSON object");
  json_t *t = json_object_get(msg, "type");
  if (!t) return bad(err, "type", "is required");
  if (!json_is_string(t)) return bad(err, "type", "must be a string");
  pw_msg_type m = pw_control_msg_of(json_string_value(t));
  if (m == PW_MSG_UNKNOWN)
    return pw_err_set(err, PW_EPROTO, "type", "unknown message type \"%.64s\"", json_string_value(t));
  return check_fields(msg, msg_table[m].fields, msg_table[m].name, err);
}

/* ---- typed messages --------------------------------------------------------- */

/* Adds to o the fields of the struct at b, as the table says; an absent
 * optional one is left out. 0, or PW_ENOMEM. (What it adds is validated
 * after, as a whole.) */
static int build_fields(json_t *o, const field *fields, const char *b) {
  for (const field *f = fields; f->name; f++) {
    const void *p = b + f->off;
    json_t *v = NULL;
    switch (f->type) {
      case F_INT: {
        int64_t x = *(const int64_t *)p;
        if (!(f->optional && x == -1)) v = json_integer((json_int_t)x);
        break;
      }
      case F_NUM: {
        double x = *(const double *)p;
        if (!(f->optional && isnan(x))) v = json_real(x);
        break;
      }
      case F_STR: {
        const char *x = *(const char *const *)p;
        if (x) v = json_string(x);
        break;
      }
      case F_ACTIONS:
      case F_PEERS:
      case F_INTS:
      case F_NUMS: v = json_incref(*(json_t *const *)p); break;
      case F_OBJ: {
        const char *x = *(const void *const *)p;
        if (!x) break;
        if (!(v = json_object()) || build_fields(v, f->sub, x)) {
          json_decref(v);
          return PW_ENOMEM;
        }
        break;
      }
    }
    if (v && json_object_set_new(o, f->name, v)) return PW_ENOMEM;
  }
  return 0;
}

json_t *pw_control_build(pw_msg_type t, const void *body, size_t size, pw_err *err) {
  if (t < 0 || t >= PW_MSG__COUNT || size != msg_table[t].size) {
    pw_err_set(err, PW_EINVAL, "type", "message type %d with a %zu-byte struct", (int)t, size);
    return NULL;
  }
  json_t *o = json_pack("{s:s}", "type", msg_table[t].name);
  if (!o || build_fields(o, msg_table[t].fields, body)) {
    json_decref(o);
    pw_err_set(err, PW_ENOMEM, "", "out of memory");
    return NULL;
  }
  if (pw_control_validate(o, err)) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* o's fields (validated) into the struct at b; an object's struct is the
 * next of out->nested, *used of them taken. */
static int read_fields(const json_t *o, const field *fields, char *b, pw_msg_any *out, int *used, pw_err *err) {
  for (const field *f = fields; f->name; f++) {
    void *p = b + f->off;
    json_t *v = json_object_get(o, f->name);
    switch (f->type) {
      case F_INT: *(int64_t *)p = v ? (int64_t)json_integer_value(v) : -1; break;
      case F_NUM: *(double *)p = v ? json_number_value(v) : NAN; break;
      case F_STR: *(const char **)p = json_string_value(v); break;
      case F_ACTIONS:
      case F_PEERS:
      case F_INTS:
      case F_NUMS: *(json_t **)p = v; break;
      case F_OBJ: {
        *(const void **)p = NULL;
        if (!v) break;
        /* a table that outgrew pw_msg_nested: control.h's to fix, not the sender's */
        if (*used >= PW_CONTROL_NESTED_MAX || f->sub_size > sizeof out->nested[0])
          return pw_err_set(err, PW_EINTERNAL, f->name, "no room for the object in pw_msg_any.nested");
        char *x = (char *)&out->nested[(*used)++];
        int rc = read_fields(v, f->sub, x, out, used, err);
        if (rc) return rc;
        *(const void **)p = x;
        break;
      }
    }
  }
  return 0;
}

int pw_control_read(const json_t *msg, pw_msg_type *t, pw_msg_any *out, pw_err *err) {
  memset(out, 0, sizeof *out);
  *t = PW_MSG_UNKNOWN;
  int rc = pw_control_validate(msg, err);
  if (rc) return rc;
  pw_msg_type m = pw_control_msg_of(pw_control_type(msg));
  int used = 0;
  if ((rc = read_fields(msg, msg_table[m].fields, (char *)out, out, &used, err))) return rc;
  *t = m;
  return 0;
}

int pw_control_dispatch(const pw_control_handlers *h, int dir, void *ctx, void *conn, const json_t *msg,
                        pw_err *err) {
  pw_msg_type t;
  pw_msg_any m;
  int rc = pw_control_read(msg, &t, &m, err);
  if (rc) return rc;
  if (msg_table[t].dir != dir)
    return pw_err_set(err, PW_EPROTO, "type", "\"%s\" is a %s message; this side receives %s messages",
                      msg_table[t].name, msg_table[t].dir == PW_CONTROL_TO_COORD ? "worker-to-coordinator"
                                                                                : "coordinator-to-worker",
                      dir == PW_CONTROL_TO_COORD ? "worker-to-coordinator" : "coordinator-to-worker");
  if (!h->on[t]) return pw_err_set(err, PW_EPROTO, "type", "\"%s\" is not expected here", msg_table[t].name);
  return h->on[t](ctx, conn, &m, msg, err);
}

/* ---- encoding ---------------------------------------------------------------- */

int pw_control_encode(const json_t *msg, uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  if (!json_is_object(msg)) return PW_EINVAL;
  size_t n = json_dumpb(msg, NULL, 0, JSON_COMPACT);
  if (n == 0) return PW_EINVAL;
  if (n > PW_CONTROL_MAX) return PW_ETOOBIG;
  uint8_t *b = malloc(4 + n);
  if (!b) return PW_ENOMEM;
  if (json_dumpb(msg, (char *)b + 4, n, JSON_COMPACT) != n) {
    free(b);
    return PW_EINVAL;
  }
  b[0] = (uint8_t)(n >> 24);
  b[1] = (uint8_t)(n >> 16);
  b[2] = (uint8_t)(n >> 8);
  b[3] = (uint8_t)n;
  *out = b;
  *len = 4 + n;
  return 0;
}

/* ---- reader ------------------------------------------------------------------ */

void pw_control_reader_init(pw_control_reader *r, size_t max) {
  memset(r, 0, sizeof *r);
  if (max == 0) max = PW_CONTROL_MAX;
  r->max = max > UINT32_MAX ? UINT32_MAX : max;
  r->state = PW_CR_LEN;
}

void pw_control_reader_free(pw_control_reader *r) {
  free(r->buf);
  r->buf = NULL;
  r->cap = 0;
  r->state = PW_CR_DEAD;
  r->dead_code = PW_EINVAL;
}

static int die(pw_control_reader *r, int code) {
  r->state = PW_CR_DEAD;
  r->dead_code = code;
  free(r->buf); /* a dead stream holds no memory */
  r->buf = NULL;
  r->cap = 0;
  return code;
}

/* Grows the body buffer so that got < cap (geometrically, at most len). */
static int grow(pw_control_reader *r) {
  if (r->cap > r->got) return 0;
  size_t cap = r->cap ? r->cap * 2 : GROW_FIRST;
  if (cap > r->len) cap = r->len;
  uint8_t *p = realloc(r->buf, cap);
  if (!p) return PW_ENOMEM;
  r->buf = p;
  r->cap = cap;
  return 0;
}

void pw_control_reader_next_buf(pw_control_reader *r, void **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  if (r->state == PW_CR_LEN) {
    *buf = r->len_buf + r->len_got;
    *len = 4 - r->len_got;
  } else if (r->state == PW_CR_BODY) {
    size_t end = r->cap < r->len ? r->cap : r->len;
    *buf = r->buf + r->got;
    *len = end - r->got;
  }
}

/* The body is complete: parse, validate, reset for the next message. */
static int finish(pw_control_reader *r, json_t **msg, pw_err *err) {
  json_error_t je;
  json_t *m = json_loadb((const char *)r->buf, r->len, JSON_REJECT_DUPLICATES, &je);
  if (!m) {
    pw_err_set(err, PW_EJSON, "", "invalid JSON at byte %d: %s", je.position, je.text);
    return die(r, PW_EJSON);
  }
  int rc = pw_control_validate(m, err);
  if (rc < 0) {
    json_decref(m);
    return die(r, rc);
  }
  if (r->cap > KEEP_MAX) {
    free(r->buf);
    r->buf = NULL;
    r->cap = 0;
  }
  r->state = PW_CR_LEN;
  r->len_got = 0;
  r->got = 0;
  r->messages++;
  *msg = m;
  return 1;
}

int pw_control_reader_advance(pw_control_reader *r, size_t n, json_t **msg, pw_err *err) {
  *msg = NULL;
  if (r->state == PW_CR_DEAD) {
    pw_err_set(err, r->dead_code, "", "control stream is dead after an earlier error");
    return r->dead_code;
  }
  void *where;
  size_t room;
  pw_control_reader_next_buf(r, &where, &room);
  if (n > room) return pw_err_set(err, PW_EINVAL, "", "advance(%zu) past the %zu bytes given", n, room);
  if (r->state == PW_CR_LEN) {
    r->len_got += n;
    if (r->len_got < 4) return 0;
    const uint8_t *b = r->len_buf;
    r->len = (size_t)b[0] << 24 | (size_t)b[1] << 16 | (size_t)b[2] << 8 | b[3];
    if (r->len == 0) {
      pw_err_set(err, PW_EPROTO, "", "message length is 0");
      return die(r, PW_EPROTO);
    }
    if (r->len > r->max) {
      pw_err_set(err, PW_ETOOBIG, "", "message length %zu is over the limit %zu", r->len, r->max);
      return die(r, PW_ETOOBIG);
    }
    r->state = PW_CR_BODY;
    r->got = 0;
  } else {
    r->got += n;
    if (r->got == r->len) return finish(r, msg, err);
  }
  if (grow(r) < 0) {
    pw_err_set(err, PW_ENOMEM, "", "out of memory for a %zu-byte message", r->len);
    return die(r, PW_ENOMEM);
  }
  return 0;
}

int pw_control_reader_idle(const pw_control_reader *r) {
  return r->state == PW_CR_LEN && r->len_got == 0;
}

int pw_control_reader_feed(pw_control_reader *r, const void *data, size_t n, pw_control_cb cb,
                           void *ctx, pw_err *err) {
  const uint8_t *p = data;
  int count = 0;
  json_t *msg;
  while (n || r->state == PW_CR_DEAD) {
    void *dst;
    size_t room;
    pw_control_reader_next_buf(r, &dst, &room);
    if (!room) return pw_control_reader_advance(r, 0, &msg, err); /* dead: report */
    size_t k = n < room ? n : room;
    memcpy(dst, p, k);
    p += k;
    n -= k;
    int rc = pw_control_reader_advance(r, k, &msg, err);
    if (rc < 0) return rc;
    if (rc == 1) {
      count++;
      int crc = cb ? cb(ctx, msg) : 0;
      json_decref(msg);
      if (crc < 0) return crc;
    }
  }
  return count;
}

/* ---- token ------------------------------------------------------------------- */

int pw_control_token_equal(const char *a, const char *b) {
  if (!a || !b) return 0;
  size_t la = strlen(a), lb = strlen(b);
  volatile unsigned char diff = la != lb;
  for (size_t i = 0; i < lb; i++) diff |= (unsigned char)b[i] ^ (unsigned char)(i < la ? a[i] : 0);
  return diff == 0;
}

int pw_control_read_token_file(const char *path, char *buf, size_t cap, pw_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return pw_err_set(err, errno == ENOENT ? PW_ENOENT : PW_EIO, path, "cannot open token file: %s",
                      strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return pw_err_set(err, PW_EIO, path, "token file is not a regular file");
  }
  /* Group read is how the installed tokens reach the pipewright group's
   * operators (0640 root:pipewright); anything beyond is loose. */
  if (st.st_mode & 027)
    pw_warn("token file %s can be %s (mode %03o): chmod 640 or 600", path,
            st.st_mode & 007 ? "read or written by others" : "written by its group", (unsigned)(st.st_mode & 0777));
  char tmp[PW_CONTROL_TOKEN_MAX + 64];
  size_t got = 0;
  for (;;) {
    ssize_t k = read(fd, tmp + got, sizeof tmp - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int e = errno;
      close(fd);
      return pw_err_set(err, PW_EIO, path, "cannot read token file: %s", strerror(e));
    }
    if (k == 0) break;
    got += (size_t)k;
    if (got == sizeof tmp) break;
  }
  close(fd);
  if (got == sizeof tmp)
    return pw_err_set(err, PW_EAUTH, path, "token file is too large (token at most %d bytes)",
                      PW_CONTROL_TOKEN_MAX);
  while (got && (tmp[got - 1] == ' ' || tmp[got - 1] == '\t' || tmp[got - 1] == '\n' ||
                 tmp[got - 1] == '\r' || tmp[got - 1] == '\v' || tmp[got - 1] == '\f'))
    got--;
  if (got == 0) return pw_err_set(err, PW_EAUTH, path, "token file is empty");
  if (got > PW_CONTROL_TOKEN_MAX)
    return pw_err_set(err, PW_EAUTH, path, "token is longer than %d bytes", PW_CONTROL_TOKEN_MAX);
  for (size_t i = 0; i < got; i++)
    if ((unsigned char)tmp[i] < 0x20 || tmp[i] == 0x7f)
      return pw_err_set(err, PW_EAUTH, path, "token holds a control character at byte %zu", i);
  if (cap < got + 1) return pw_err_set(err, PW_EINVAL, path, "token buffer too small (%zu bytes)", cap);
  memcpy(buf, tmp, got);
  buf[got] = 0;
  return (int)got;
}
