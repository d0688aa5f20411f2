/* control: control-message validation (a table of message types and their
 * fields), the length-prefixed encoder, the stream reader and the cluster
 * token helpers. See control.h for the protocol. */
#include "control.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define GROW_FIRST ((size_t)64 * 1024)
#define KEEP_MAX ((size_t)1 << 20) /* a larger buffer is freed after its message */

/* ---- the message table ----------------------------------------------------- */

typedef enum { F_INT, F_NUM, F_STR, F_OBJ, F_INTS, F_ACTIONS, F_PEERS } ftype;

typedef struct {
  const char *name;
  ftype type;
  int optional;
  int min;      /* F_INT, F_INTS, F_NUM: smallest allowed value ... */
  int has_min;  /* ... when set */
  int excl;     /* F_NUM: min is exclusive */
} field;

#define REQ(n, t) {n, t, 0, 0, 0, 0}
#define OPT(n, t) {n, t, 1, 0, 0, 0}
#define REQ_MIN(n, t, m) {n, t, 0, m, 1, 0}
#define OPT_MIN(n, t, m) {n, t, 1, m, 1, 0}
#define END {NULL, F_INT, 0, 0, 0, 0}

static const field f_register[] = {
    REQ_MIN("version", F_INT, 1), REQ("name", F_STR),         REQ("token", F_STR),
    REQ("data_addr", F_STR),      REQ_MIN("cores", F_INT, 1), REQ_MIN("threads", F_INT, 1),
    REQ("software", F_STR),       END};
static const field f_heartbeat[] = {REQ_MIN("time", F_NUM, 0), REQ("state", F_STR),
                                    OPT_MIN("job", F_INT, 0), END};
static const field f_step[] = {
    REQ_MIN("job", F_INT, 0),       REQ_MIN("run", F_INT, 0),    REQ_MIN("rank", F_INT, 0),
    REQ_MIN("step", F_INT, 0),      OPT("loss", F_NUM),          REQ_MIN("step_time", F_NUM, 0),
    OPT_MIN("tokens", F_NUM, 0),    OPT_MIN("peak_act", F_INT, 0), OPT("actions", F_ACTIONS),
    END};
static const field f_checkpoint[] = {REQ_MIN("job", F_INT, 0),  REQ_MIN("run", F_INT, 0),
                                     REQ_MIN("rank", F_INT, 0), REQ_MIN("step", F_INT, 0),
                                     REQ("path", F_STR),        REQ_MIN("bytes", F_INT, 0),
                                     END};
static const field f_done[] = {REQ_MIN("job", F_INT, 0), REQ_MIN("run", F_INT, 0),
                               REQ_MIN("rank", F_INT, 0), END};
static const field f_error[] = {OPT_MIN("job", F_INT, 0), OPT_MIN("run", F_INT, 0),
                                OPT_MIN("rank", F_INT, 0), REQ("message", F_STR), END};
static const field f_welcome[] = {REQ_MIN("version", F_INT, 1), REQ_MIN("worker_id", F_INT, 0),
                                  {"heartbeat_interval", F_NUM, 0, 0, 1, 1}, END};
static const field f_refused[] = {REQ("reason", F_STR), END};
static const field f_assign[] = {
    REQ_MIN("job", F_INT, 0),        REQ_MIN("run", F_INT, 0),         REQ_MIN("rank", F_INT, 0),
    REQ("slice", F_STR),             REQ("slice_sha256", F_STR),
    REQ("peers", F_PEERS),           REQ_MIN("steps", F_INT, 0),       REQ_MIN("start_step", F_INT, 0),
    OPT("checkpoint_dir", F_STR),    OPT("resume", F_STR),             OPT_MIN("trace_every", F_INT, 0),
    END};
static const field f_cancel[] = {REQ_MIN("job", F_INT, 0), REQ_MIN("run", F_INT, 0),
                                 REQ("reason", F_STR), END};
static const field f_shutdown[] = {END};

static const struct {
  const char *type;
  int dir;
  const field *fields;
} msg_table[] = {
    {"register", PW_CONTROL_TO_COORD, f_register},
    {"heartbeat", PW_CONTROL_TO_COORD, f_heartbeat},
    {"step", PW_CONTROL_TO_COORD, f_step},
    {"checkpoint", PW_CONTROL_TO_COORD, f_checkpoint},
    {"done", PW_CONTROL_TO_COORD, f_done},
    {"error", PW_CONTROL_TO_COORD, f_error},
    {"welcome", PW_CONTROL_TO_WORKER, f_welcome},
    {"refused", PW_CONTROL_TO_WORKER, f_refused},
    {"assign", PW_CONTROL_TO_WORKER, f_assign},
    {"cancel", PW_CONTROL_TO_WORKER, f_cancel},
    {"shutdown", PW_CONTROL_TO_WORKER, f_shutdown},
};
#define N_MSGS (sizeof msg_table / sizeof msg_table[0])

static int find_msg(const char *type) {
  for (size_t i = 0; i < N_MSGS; i++)
    if (type && strcmp(msg_table[i].type, type) == 0) return (int)i;
  return -1;
}

int pw_control_msg_dir(const char *type) {
  int i = find_msg(type);
  return i < 0 ? 0 : msg_table[i].dir;
}

const char *pw_control_type(const json_t *msg) {
  return json_string_value(json_object_get(msg, "type"));
}

/* ---- validation -------------------------------------------------------------- */

static int bad(pw_err *err, const char *path, const char *why) {
  return pw_err_set(err, PW_EPROTO, path, "%s", why);
}

static int check_int(const json_t *v, const char *path, int has_min, int min, pw_err *err) {
  if (!json_is_integer(v)) return bad(err, path, "must be an integer");
  if (has_min && json_integer_value(v) < min)
    return pw_err_set(err, PW_EPROTO, path, "must be >= %d (got %lld)", min,
                      (long long)json_integer_value(v));
  return 0;
}

static int check_num(const json_t *v, const char *path, const field *f, pw_err *err) {
  if (!json_is_number(v)) return bad(err, path, "must be a number");
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
  if (!json_is_object(o)) return bad(err, path, "must be an object {rank, addr}");
  snprintf(p, sizeof p, "%.100s.rank", path);
  json_t *rank = json_object_get(o, "rank");
  if (!rank) return bad(err, p, "is required");
  int rc = check_int(rank, p, 1, 0, err);
  if (rc) return rc;
  snprintf(p, sizeof p, "%.100s.addr", path);
  json_t *addr = json_object_get(o, "addr");
  if (!addr) return bad(err, p, "is required");
  if (!json_is_string(addr)) return bad(err, p, "must be a string");
  return 0;
}

static int check_field(const json_t *v, const field *f, const char *path, pw_err *err) {
  char p[160];
  size_t i;
  json_t *x;
  int rc;
  switch (f->type) {
    case F_INT: return check_int(v, path, f->has_min, f->min, err);
    case F_NUM: return check_num(v, path, f, err);
    case F_STR: return json_is_string(v) ? 0 : bad(err, path, "must be a string");
    case F_OBJ: return json_is_object(v) ? 0 : bad(err, path, "must be an object");
    case F_INTS:
      if (!json_is_array(v)) return bad(err, path, "must be an array of integers");
      json_array_foreach(v, i, x) {
        snprintf(p, sizeof p, "%.100s[%zu]", path, i);
        if ((rc = check_int(x, p, f->has_min, f->min, err))) return rc;
      }
      return 0;
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
  }
  return bad(err, path, "internal: bad field type");
}

int pw_control_validate(const json_t *msg, pw_err *err) {
  if (!json_is_object(msg)) return bad(err, "", "message must be a JSON object");
  json_t *t = json_object_get(msg, "type");
  if (!t) return bad(err, "type", "is required");
  if (!json_is_string(t)) return bad(err, "type", "must be a string");
  int m = find_msg(json_string_value(t));
  if (m < 0)
    return pw_err_set(err, PW_EPROTO, "type", "unknown message type \"%.64s\"", json_string_value(t));
  for (const field *f = msg_table[m].fields; f->name; f++) {
    char path[96];
    snprintf(path, sizeof path, "%.40s.%.40s", msg_table[m].type, f->name);
    json_t *v = json_object_get(msg, f->name);
    if (!v) {
      if (f->optional) continue;
      return bad(err, path, "is required");
    }
    int rc = check_field(v, f, path, err);
    if (rc) return rc;
  }
  return 0;
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
  if (st.st_mode & 077)
    pw_warn("token file %s is readable by group or others (mode %03o)", path,
            (unsigned)(st.st_mode & 0777));
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
