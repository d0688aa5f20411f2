/* test_control: control messages. Every message type's valid example
 * passes; every required field, removed or given the wrong type, fails with
 * a message naming it; nested paths (peers, actions); the
 * length-prefixed encoder and the stream reader (whole, byte by byte,
 * random chunks, partial reads, truncation, every kind of bad stream); the
 * token helpers; then fuzzing the reader with random bytes and mutated
 * valid streams (never a crash, never a buffer over max, every message
 * returned is valid). Deterministic: PW_FUZZ_SEED overrides the seed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control.h"

static uint64_t g_rng = 0xc0c0a001;

static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static void expect_err(const pw_err *err, const char *want) {
  char buf[600];
  pw_err_str(err, buf, sizeof buf);
  if (!strstr(buf, want)) fail_msg("error '%s' does not contain '%s'", buf, want);
}

static json_t *parse(const char *s) {
  json_error_t je;
  json_t *j = json_loads(s, 0, &je);
  if (!j) fail_msg("bad test JSON (%s): %s", je.text, s);
  return j;
}

/* ---- the examples ------------------------------------------------------------ */

/* Field kinds, as the test knows them (independent of control.c's table):
 * i int, n number, s string, o object, a array of ints, A actions, P peers. */
typedef struct {
  const char *type;
  int dir;
  const char *json;
  const char *required; /* "name:kind ..." */
  const char *optional;
} example;

static const example examples[] = {
    {"register", PW_CONTROL_TO_COORD,
     "{\"type\":\"register\",\"version\":2,\"name\":\"w0\",\"token\":\"t\",\"data_addr\":\"127.0.0.1:7000\","
     "\"cores\":2,\"threads\":1,\"software\":\"pipewright 0.1.0\",\"job\":4}",
     "version:i name:s token:s data_addr:s cores:i threads:i software:s", "job:i"},
    {"heartbeat", PW_CONTROL_TO_COORD, "{\"type\":\"heartbeat\",\"time\":1700000000.25,\"state\":\"idle\",\"job\":3}",
     "time:n state:s", "job:i"},
    {"step", PW_CONTROL_TO_COORD,
     "{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":2,\"step\":7,\"loss\":2.5,\"step_time\":0.125,"
     "\"tokens\":4096,\"peak_act\":1048576,\"grad_norm\":0.75,\"lr\":0.001,"
     "\"actions\":[[\"F\",0,1,0.0,0.01],[\"B\",0,1,0.02,0.05]],\"nonfinite\":2,\"eval_loss\":2.25,"
     "\"dp_bytes\":8192,\"dp_seconds\":0.003,\"tp_bytes\":4096,\"tp_seconds\":0.002,"
     "\"trace\":{\"ready\":[0.0,0.015],\"routed\":[0.011,0.051],\"end_wait\":0.001,\"end_work\":0.02,"
     "\"after\":0.0,\"t0\":1234.5,\"sleeps\":3}}",
     "job:i run:i rank:i step:i step_time:n",
     "loss:n tokens:n peak_act:i grad_norm:n lr:n actions:A nonfinite:i eval_loss:n dp_bytes:i dp_seconds:n "
     "tp_bytes:i tp_seconds:n trace:o"},
    {"checkpoint", PW_CONTROL_TO_COORD,
     "{\"type\":\"checkpoint\",\"job\":1,\"run\":0,\"rank\":0,\"step\":10,\"path\":\"/x/r0.safetensors\",\"bytes\":123,"
     "\"stage\":3}",
     "job:i run:i rank:i step:i path:s bytes:i", "stage:i"},
    {"done", PW_CONTROL_TO_COORD, "{\"type\":\"done\",\"job\":1,\"run\":0,\"rank\":1}", "job:i run:i rank:i", ""},
    {"error", PW_CONTROL_TO_COORD, "{\"type\":\"error\",\"job\":1,\"run\":0,\"rank\":1,\"message\":\"peer 2 lost\"}",
     "message:s", "job:i run:i rank:i"},
    {"welcome", PW_CONTROL_TO_WORKER,
     "{\"type\":\"welcome\",\"version\":2,\"worker_id\":4,\"heartbeat_interval\":2,\"http_url\":\"http://10.0.0.1:8080\"}",
     "version:i worker_id:i heartbeat_interval:n", "http_url:s"},
    {"refused", PW_CONTROL_TO_WORKER, "{\"type\":\"refused\",\"reason\":\"wrong token\"}", "reason:s", ""},
    {"assign", PW_CONTROL_TO_WORKER,
     "{\"type\":\"assign\",\"job\":1,\"run\":0,\"rank\":1,\"slice\":\"{\\\"version\\\":1}\","
     "\"slice_sha256\":\"9b1f\",\"peers\":[{\"rank\":0,\"addr\":\"127.0.0.1:7000\",\"host\":\"m1\"},"
     "{\"rank\":1,\"addr\":\"127.0.0.1:7001\",\"host\":\"m1\"}],"
     "\"steps\":10,\"start_step\":0,\"checkpoint_dir\":\"/ck\",\"resume\":\"/ck/5\",\"trace_every\":5}",
     "job:i run:i rank:i slice:s slice_sha256:s peers:P steps:i start_step:i",
     "checkpoint_dir:s resume:s trace_every:i"},
    {"cancel", PW_CONTROL_TO_WORKER, "{\"type\":\"cancel\",\"job\":1,\"run\":0,\"reason\":\"user\"}",
     "job:i run:i reason:s", ""},
    {"shutdown", PW_CONTROL_TO_WORKER, "{\"type\":\"shutdown\"}", "", ""},
};
#define N_EXAMPLES ((int)(sizeof examples / sizeof examples[0]))

static json_t *wrong_value(char kind, const char **why) {
  switch (kind) {
    case 'i': *why = "must be an integer"; return json_real(1.5);
    case 'n': *why = "must be a number"; return json_true();
    case 's': *why = "must be a string"; return json_integer(5);
    case 'o': *why = "must be an object"; return json_array();
    default: *why = "must be an array"; return json_object();
  }
}

static void check_fields(const example *ex, const char *list, int required) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
    char *colon = strchr(tok, ':');
    *colon = 0;
    char kind = colon[1], path[128], want[200];
    snprintf(path, sizeof path, "%s.%s", ex->type, tok);
    pw_err err = {0};
    json_t *m = parse(ex->json);
    /* removed */
    assert_int_equal(json_object_del(m, tok), 0);
    int rc = pw_control_validate(m, &err);
    if (required) {
      assert_int_equal(rc, PW_EPROTO);
      snprintf(want, sizeof want, "%s: is required", path);
      expect_err(&err, want);
      assert_string_equal(err.path, path);
    } else {
      assert_int_equal(rc, 0);
    }
    /* wrong type */
    const char *why;
    json_object_set_new(m, tok, wrong_value(kind, &why));
    memset(&err, 0, sizeof err);
    assert_int_equal(pw_control_validate(m, &err), PW_EPROTO);
    snprintf(want, sizeof want, "%s: %s", path, why);
    expect_err(&err, want);
    /* a string where anything else is wanted, and vice versa */
    json_object_set_new(m, tok, kind == 's' ? json_null() : json_string("x"));
    assert_int_equal(pw_control_validate(m, &err), PW_EPROTO);
    assert_string_equal(err.path, path);
    json_decref(m);
  }
}

static void test_examples_valid(void **state) {
  for (int i = 0; i < N_EXAMPLES; i++) {
    pw_err err = {0};
    json_t *m = parse(examples[i].json);
    if (pw_control_validate(m, &err)) {
      char b[600];
      fail_msg("%s: %s", examples[i].type, pw_err_str(&err, b, sizeof b));
    }
    assert_string_equal(pw_control_type(m), examples[i].type);
    assert_int_equal(pw_control_msg_dir(examples[i].type), examples[i].dir);
    /* unknown extra fields are allowed */
    json_object_set_new(m, "future_field", json_string("x"));
    assert_int_equal(pw_control_validate(m, &err), 0);
    json_decref(m);
  }
  assert_int_equal(pw_control_msg_dir("bogus"), 0);
  assert_int_equal(pw_control_msg_dir(NULL), 0);
}

static void test_fields_required_and_typed(void **state) {
  for (int i = 0; i < N_EXAMPLES; i++) {
    check_fields(&examples[i], examples[i].required, 1);
    check_fields(&examples[i], examples[i].optional, 0);
  }
}

static void test_validate_details(void **state) {
  static const struct {
    const char *json, *msg;
  } bad[] = {
      {"[1,2]", "message must be a JSON object"},
      {"{\"job\":1}", "type: is required"},
      {"{\"type\":5}", "type: must be a string"},
      {"{\"type\":\"launch\"}", "type: unknown message type \"launch\""},
      {"{\"type\":\"\"}", "type: unknown message type \"\""},
      /* assign: nested */
      {"{\"type\":\"assign\",\"job\":1,\"run\":0,\"rank\":1,\"slice\":\"{}\",\"slice_sha256\":\"0\","
       "\"peers\":[{\"rank\":0,\"addr\":\"a:1\",\"host\":\"m\"},{\"rank\":1,\"addr\":7}],\"steps\":1,\"start_step\":0}",
       "assign.peers[1].addr: must be a string"},
      {"{\"type\":\"assign\",\"job\":1,\"run\":0,\"rank\":1,\"slice\":\"{}\",\"slice_sha256\":\"0\","
       "\"peers\":[{\"rank\":0,\"addr\":\"a:1\"}],\"steps\":1,\"start_step\":0}",
       "assign.peers[0].host: is required"},
      {"{\"type\":\"assign\",\"job\":1,\"run\":0,\"rank\":1,\"slice\":\"{}\",\"slice_sha256\":\"0\","
       "\"peers\":[{\"rank\":0,\"addr\":\"a:1\",\"host\":3}],\"steps\":1,\"start_step\":0}",
       "assign.peers[0].host: must be a string"},
      {"{\"type\":\"assign\",\"job\":1,\"run\":0,\"rank\":1,\"slice\":\"{}\",\"slice_sha256\":\"0\","
       "\"peers\":[{\"addr\":\"a:1\"}],\"steps\":1,\"start_step\":0}",
       "assign.peers[0].rank: is required"},
      {"{\"type\":\"assign\",\"job\":1,\"run\":0,\"rank\":1,\"slice\":\"{}\",\"slice_sha256\":\"0\","
       "\"peers\":[{\"rank\":0}],\"steps\":1,\"start_step\":0}",
       "assign.peers[0].addr: is required"},
      {"{\"type\":\"assign\",\"job\":1,\"run\":0,\"rank\":1,\"slice\":\"{}\",\"slice_sha256\":\"0\","
       "\"peers\":[{\"rank\":-1,\"addr\":\"a:1\"}],\"steps\":1,\"start_step\":0}",
       "assign.peers[0].rank: must be >= 0 (got -1)"},
      {"{\"type\":\"assign\",\"job\":1,\"run\":0,\"rank\":1,\"slice\":\"{}\",\"slice_sha256\":\"0\","
       "\"peers\":[\"a:1\"],\"steps\":1,\"start_step\":0}",
       "assign.peers[0]: must be an object"},
      {"{\"type\":\"assign\",\"job\":1,\"run\":0,\"rank\":1,\"slice\":\"{}\",\"slice_sha256\":\"0\","
       "\"peers\":[],\"steps\":1,\"start_step\":0,\"trace_every\":\"5\"}",
       "assign.trace_every: must be an integer"},
      /* step: actions */
      {"{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":0,\"step\":0,\"step_time\":1,"
       "\"actions\":[[\"F\",0,0,0,1],[\"F\",0,0,0]]}",
       "step.actions[1]: must be an array [kind, mb, stage, start, end]"},
      {"{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":0,\"step\":0,\"step_time\":1,\"actions\":[[1,0,0,0,1]]}",
       "step.actions[0][0]: must be a string"},
      {"{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":0,\"step\":0,\"step_time\":1,\"actions\":[[\"W\",0.5,0,0,1]]}",
       "step.actions[0][1]: must be an integer"},
      {"{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":0,\"step\":0,\"step_time\":1,\"actions\":[[\"W\",0,-1,0,1]]}",
       "step.actions[0][2]: must be >= 0"},
      {"{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":0,\"step\":0,\"step_time\":1,\"actions\":[[\"I\",0,0,\"0\",1]]}",
       "step.actions[0][3]: must be a number"},
      {"{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":0,\"step\":0,\"step_time\":1,\"actions\":[[\"I\",0,0,0,null]]}",
       "step.actions[0][4]: must be a number"},
      {"{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":0,\"step\":0,\"step_time\":1,\"actions\":{}}",
       "step.actions: must be an array"},
      {"{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":-3,\"step\":0,\"step_time\":1}",
       "step.rank: must be >= 0 (got -3)"},
      {"{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":0,\"step\":0,\"step_time\":-0.5}",
       "step.step_time: must be >= 0 (got -0.5)"},
      /* ranges */
      {"{\"type\":\"welcome\",\"version\":2,\"worker_id\":1,\"heartbeat_interval\":0}",
       "welcome.heartbeat_interval: must be > 0 (got 0)"},
      {"{\"type\":\"welcome\",\"version\":0,\"worker_id\":1,\"heartbeat_interval\":1}",
       "welcome.version: must be >= 1 (got 0)"},
      {"{\"type\":\"welcome\",\"version\":2,\"worker_id\":1,\"heartbeat_interval\":1,\"http_url\":8080}",
       "welcome.http_url: must be a string"},
      {"{\"type\":\"register\",\"version\":2,\"name\":\"w\",\"token\":\"\",\"data_addr\":\"h:1\",\"cores\":0,"
       "\"threads\":1,\"software\":\"x\"}",
       "register.cores: must be >= 1 (got 0)"},
      {"{\"type\":\"heartbeat\",\"time\":1,\"state\":\"idle\",\"job\":\"3\"}", "heartbeat.job: must be an integer"},
      /* step: what the data-parallel and tensor-parallel exchanges sent, and the trace */
#define STEP0 "{\"type\":\"step\",\"job\":1,\"run\":0,\"rank\":0,\"step\":0,\"step_time\":1,"
#define TRACE0 "\"trace\":{\"ready\":[0.5],\"routed\":[0.75],\"end_wait\":0,\"end_work\":0,\"after\":0,\"t0\":1,"
      {STEP0 "\"dp_bytes\":\"8\"}", "step.dp_bytes: must be an integer >= 0"},
      {STEP0 "\"dp_bytes\":1.5}", "step.dp_bytes: must be an integer >= 0"},
      {STEP0 "\"dp_bytes\":-1}", "step.dp_bytes: must be >= 0 (got -1)"},
      {STEP0 "\"dp_seconds\":-0.5}", "step.dp_seconds: must be >= 0 (got -0.5)"},
      {STEP0 "\"dp_seconds\":null}", "step.dp_seconds: must be a number >= 0"},
      {STEP0 "\"tp_bytes\":-4096}", "step.tp_bytes: must be >= 0 (got -4096)"},
      {STEP0 "\"tp_seconds\":\"0.1\"}", "step.tp_seconds: must be a number >= 0"},
      {STEP0 "\"nonfinite\":-3}", "step.nonfinite: must be >= 0 (got -3)"},
      {STEP0 "\"eval_loss\":\"2\"}", "step.eval_loss: must be a number"},
      {STEP0 "\"trace\":[0.5]}", "step.trace: must be an object"},
      {STEP0 "\"trace\":{}}", "step.trace.ready: is required"},
      {STEP0 TRACE0 "\"sleeps\":-1}}", "step.trace.sleeps: must be >= 0 (got -1)"},
      {STEP0 TRACE0 "\"sleeps\":0.5}}", "step.trace.sleeps: must be an integer >= 0"},
      {STEP0 TRACE0 "\"sleeps\":0,\"ready\":[0.5,\"x\"]}}", "step.trace.ready[1]: must be a number"},
      {STEP0 TRACE0 "\"sleeps\":0,\"routed\":{}}}", "step.trace.routed: must be an array"},
      {STEP0 "\"trace\":{\"ready\":[],\"routed\":[],\"end_wait\":-0.25,\"end_work\":0,\"after\":0,\"t0\":1,"
       "\"sleeps\":0}}", "step.trace.end_wait: must be >= 0 (got -0.25)"},
      {STEP0 "\"trace\":{\"ready\":[],\"routed\":[],\"end_wait\":0,\"end_work\":0,\"after\":0,\"t0\":true,"
       "\"sleeps\":0}}", "step.trace.t0: must be a number >= 0"},
#undef TRACE0
#undef STEP0
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    pw_err err = {0};
    json_t *m = parse(bad[i].json);
    assert_int_equal(pw_control_validate(m, &err), PW_EPROTO);
    assert_int_equal(err.code, PW_EPROTO);
    expect_err(&err, bad[i].msg);
    json_decref(m);
  }
  pw_err err = {0};
  assert_int_equal(pw_control_validate(NULL, &err), PW_EPROTO);
  /* register with a version we do not speak still validates: the
   * coordinator refuses it with a reason */
  json_t *m = parse("{\"type\":\"register\",\"version\":99,\"name\":\"w\",\"token\":\"\",\"data_addr\":\"h:1\","
                    "\"cores\":1,\"threads\":1,\"software\":\"x\"}");
  assert_int_equal(pw_control_validate(m, &err), 0);
  json_decref(m);
}

/* step.trace's own fields, as the examples' are: each removed is named as
 * required, each given the wrong type is named with what it must be. */
static void test_step_trace_fields(void **state) {
  static const struct {
    const char *name, *why;
    json_t *(*wrong)(void);
  } fields[] = {
      {"ready", "must be an array", json_object},   {"routed", "must be an array", json_object},
      {"end_wait", "must be a number >= 0", json_null}, {"end_work", "must be a number", json_null},
      {"after", "must be a number >= 0", json_null}, {"t0", "must be a number >= 0", json_null},
      {"sleeps", "must be an integer >= 0", json_true},
  };
  assert_string_equal(examples[2].type, "step");
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
    char want[200];
    pw_err err = {0};
    json_t *m = parse(examples[2].json);
    json_t *tr = json_object_get(m, "trace");
    assert_non_null(tr);
    assert_int_equal(json_object_del(tr, fields[i].name), 0);
    assert_int_equal(pw_control_validate(m, &err), PW_EPROTO);
    snprintf(want, sizeof want, "step.trace.%s: is required", fields[i].name);
    expect_err(&err, want);
    json_object_set_new(tr, fields[i].name, fields[i].wrong());
    assert_int_equal(pw_control_validate(m, &err), PW_EPROTO);
    snprintf(want, sizeof want, "step.trace.%s: %s", fields[i].name, fields[i].why);
    expect_err(&err, want);
    snprintf(want, sizeof want, "step.trace.%s", fields[i].name);
    assert_string_equal(err.path, want);
    json_decref(m);
  }
}

/* ---- encoding and the reader ----------------------------------------------------- */

typedef struct {
  json_t *msgs[256];
  int n;
} sink;

static int on_msg(void *ctx, json_t *msg) {
  sink *s = ctx;
  pw_err err = {0};
  assert_int_equal(pw_control_validate(msg, &err), 0); /* only valid messages come out */
  assert_true(s->n < 256);
  s->msgs[s->n++] = json_incref(msg);
  return 0;
}

static void sink_free(sink *s) {
  for (int i = 0; i < s->n; i++) json_decref(s->msgs[i]);
  s->n = 0;
}

/* A stream of n encoded examples (picked at random); wants[i] the messages. */
static uint8_t *make_stream(int n, size_t *len, json_t **wants) {
  uint8_t *buf = NULL;
  *len = 0;
  for (int i = 0; i < n; i++) {
    json_t *m = parse(examples[below(N_EXAMPLES)].json);
    json_object_set_new(m, "seq", json_integer(i)); /* makes every message distinct */
    uint8_t *f;
    size_t fl;
    assert_int_equal(pw_control_encode(m, &f, &fl), 0);
    buf = realloc(buf, *len + fl + 64);
    memcpy(buf + *len, f, fl);
    *len += fl;
    free(f);
    if (wants) wants[i] = m;
    else json_decref(m);
  }
  return buf;
}

static int feed_partial(pw_control_reader *r, const uint8_t *data, size_t n, sink *s, pw_err *err) {
  size_t off = 0;
  int count = 0;
  while (off < n) {
    void *dst;
    size_t room;
    pw_control_reader_next_buf(r, &dst, &room);
    json_t *msg;
    if (!room) return pw_control_reader_advance(r, 0, &msg, err);
    size_t k = 1 + below(room < n - off ? room : n - off);
    memcpy(dst, data + off, k);
    off += k;
    int rc = pw_control_reader_advance(r, k, &msg, err);
    if (rc < 0) return rc;
    if (rc == 1) {
      count++;
      on_msg(s, msg);
      json_decref(msg);
    }
  }
  return count;
}

static void test_encode(void **state) {
  json_t *m = parse("{\"type\":\"done\",\"job\":1,\"run\":0,\"rank\":1,\"name\":\"\xc3\xa9\"}");
  uint8_t *f;
  size_t len;
  assert_int_equal(pw_control_encode(m, &f, &len), 0);
  const char *body = "{\"type\":\"done\",\"job\":1,\"run\":0,\"rank\":1,\"name\":\"\xc3\xa9\"}";
  size_t bl = strlen(body);
  assert_int_equal(len, 4 + bl);
  assert_int_equal(f[0], 0);
  assert_int_equal(f[1], 0);
  assert_int_equal(f[2], bl >> 8);
  assert_int_equal(f[3], bl & 0xff);
  assert_memory_equal(f + 4, body, bl); /* compact, UTF-8 kept */
  free(f);
  json_decref(m);
  json_t *arr = json_array();
  assert_int_equal(pw_control_encode(arr, &f, &len), PW_EINVAL);
  assert_null(f);
  json_decref(arr);
  /* over PW_CONTROL_MAX */
  char *big = malloc(PW_CONTROL_MAX + 1);
  memset(big, 'a', PW_CONTROL_MAX);
  big[PW_CONTROL_MAX] = 0;
  m = json_pack("{s:s,s:s}", "type", "error", "message", big);
  free(big);
  assert_int_equal(pw_control_encode(m, &f, &len), PW_ETOOBIG);
  json_decref(m);
}

static void test_reader_chunkings(void **state) {
  json_t *wants[100];
  size_t len;
  uint8_t *buf = make_stream(100, &len, wants);
  pw_err err = {0};
  for (int mode = 0; mode < 4; mode++) {
    pw_control_reader r;
    pw_control_reader_init(&r, 0);
    assert_int_equal(r.max, PW_CONTROL_MAX);
    sink s = {0};
    int total = 0;
    if (mode == 0) {
      total = pw_control_reader_feed(&r, buf, len, on_msg, &s, &err);
    } else if (mode == 1) {
      for (size_t i = 0; i < len; i++) {
        int rc = pw_control_reader_feed(&r, buf + i, 1, on_msg, &s, &err);
        assert_true(rc >= 0);
        total += rc;
      }
    } else if (mode == 2) {
      for (size_t i = 0; i < len;) {
        size_t k = 1 + below(300);
        if (k > len - i) k = len - i;
        int rc = pw_control_reader_feed(&r, buf + i, k, on_msg, &s, &err);
        assert_true(rc >= 0);
        total += rc;
        i += k;
      }
    } else {
      total = feed_partial(&r, buf, len, &s, &err);
    }
    assert_int_equal(total, 100);
    assert_int_equal(s.n, 100);
    for (int i = 0; i < 100; i++) assert_true(json_equal(s.msgs[i], wants[i]));
    assert_true(r.messages == 100);
    assert_int_equal(r.state, PW_CR_LEN);
    sink_free(&s);
    pw_control_reader_free(&r);
  }
  for (int i = 0; i < 100; i++) json_decref(wants[i]);
  free(buf);
}

static void test_reader_truncated(void **state) {
  size_t len;
  json_t *wants[6];
  uint8_t *buf = make_stream(6, &len, wants);
  size_t ends[6], off = 0;
  for (int i = 0; i < 6; i++) {
    off += 4 + ((size_t)buf[off] << 24 | (size_t)buf[off + 1] << 16 | (size_t)buf[off + 2] << 8 | buf[off + 3]);
    ends[i] = off;
  }
  assert_int_equal(off, len);
  for (size_t cut = 0; cut <= len; cut++) {
    pw_control_reader r;
    pw_control_reader_init(&r, 4096);
    pw_err err = {0};
    int complete = 0;
    while (complete < 6 && ends[complete] <= cut) complete++;
    assert_int_equal(pw_control_reader_feed(&r, buf, cut, NULL, NULL, &err), complete);
    assert_int_equal(pw_control_reader_idle(&r), cut == 0 || (complete && ends[complete - 1] == cut));
    assert_int_equal(pw_control_reader_feed(&r, buf + cut, len - cut, NULL, NULL, &err), 6 - complete);
    pw_control_reader_free(&r);
  }
  for (int i = 0; i < 6; i++) json_decref(wants[i]);
  free(buf);
}

/* One bad body behind a 4-byte length. */
static int feed_body(pw_control_reader *r, const char *body, size_t n, pw_err *err) {
  uint8_t *b = malloc(n + 4);
  b[0] = (uint8_t)(n >> 24);
  b[1] = (uint8_t)(n >> 16);
  b[2] = (uint8_t)(n >> 8);
  b[3] = (uint8_t)n;
  memcpy(b + 4, body, n);
  int rc = pw_control_reader_feed(r, b, n + 4, NULL, NULL, err);
  free(b);
  return rc;
}

static int on_stop(void *ctx, json_t *msg) { return PW_ECANCELED; }

static void test_reader_errors(void **state) {
  static const struct {
    const char *body;
    size_t n; /* 0: strlen */
    int code;
    const char *msg;
  } bad[] = {
      {"{\"type\":\"done\",\"job\":1", 0, PW_EJSON, "invalid JSON"},
      {"{\"type\":\"shutdown\"}x", 0, PW_EJSON, "invalid JSON"},
      {"[\"shutdown\"]", 0, PW_EPROTO, "message must be a JSON object"},
      {"\"shutdown\"", 0, PW_EJSON, "invalid JSON"}, /* jansson wants an array or object */
      {"{\"type\":\"shutdown\",\"type\":\"shutdown\"}", 0, PW_EJSON, "duplicate"},
      {"{\"type\":\"sh\xff\"}", 0, PW_EJSON, "invalid JSON"},      /* not UTF-8 */
      {"{\"type\":\"shutdown\"}\0", 20, PW_EJSON, "invalid JSON"}, /* NUL in the body */
      {"{\"type\":\"sh\\u0000\"}", 0, PW_EJSON, "invalid JSON"},
      {"{}", 0, PW_EPROTO, "type: is required"},
      {"{\"type\":\"nope\"}", 0, PW_EPROTO, "unknown message type"},
      {"{\"type\":\"done\",\"job\":1,\"run\":0}", 0, PW_EPROTO, "done.rank: is required"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    pw_control_reader r;
    pw_control_reader_init(&r, 4096);
    pw_err err = {0};
    size_t n = bad[i].n ? bad[i].n : strlen(bad[i].body);
    int rc = feed_body(&r, bad[i].body, n, &err);
    if (rc != bad[i].code) fail_msg("case %zu: got %s, want %s", i, pw_err_name(rc), pw_err_name(bad[i].code));
    expect_err(&err, bad[i].msg);
    /* dead: no memory held, every later call says the same */
    assert_int_equal(r.state, PW_CR_DEAD);
    assert_null(r.buf);
    void *p;
    size_t room;
    pw_control_reader_next_buf(&r, &p, &room);
    assert_int_equal(room, 0);
    assert_int_equal(feed_body(&r, "{\"type\":\"shutdown\"}", 19, &err), bad[i].code);
    assert_int_equal(pw_control_reader_feed(&r, NULL, 0, NULL, NULL, &err), bad[i].code);
    pw_control_reader_free(&r);
  }

  pw_control_reader r;
  pw_err err = {0};
  /* zero length */
  pw_control_reader_init(&r, 4096);
  assert_int_equal(pw_control_reader_feed(&r, "\0\0\0\0", 4, NULL, NULL, &err), PW_EPROTO);
  expect_err(&err, "message length is 0");
  pw_control_reader_free(&r);
  /* oversize, refused before any allocation */
  pw_control_reader_init(&r, 4096);
  assert_int_equal(pw_control_reader_feed(&r, "\0\0\x10\x01", 4, NULL, NULL, &err), PW_ETOOBIG);
  expect_err(&err, "message length 4097 is over the limit 4096");
  assert_int_equal(r.cap, 0);
  pw_control_reader_free(&r);
  /* exactly max is fine */
  const char *body = "{\"type\":\"shutdown\",\"pad\":\"x\"}";
  size_t bl = strlen(body);
  pw_control_reader_init(&r, bl);
  assert_int_equal(feed_body(&r, body, bl, &err), 1);
  assert_int_equal(r.cap, bl);
  pw_control_reader_free(&r);
  /* a length lie: 16 MiB promised, 100 bytes sent: memory follows the
   * bytes, not the promise */
  pw_control_reader_init(&r, 0);
  uint8_t lie[104] = {0x01, 0x00, 0x00, 0x00, '{'};
  assert_int_equal(pw_control_reader_feed(&r, lie, sizeof lie, NULL, NULL, &err), 0);
  assert_true(r.cap <= 64 * 1024);
  pw_control_reader_free(&r);
  /* a big message grows the buffer, which is released afterwards */
  pw_control_reader_init(&r, 0);
  size_t n = 3 << 20;
  char *big = malloc(n + 1);
  memset(big, 'a', n);
  big[n] = 0;
  json_t *m = json_pack("{s:s,s:s}", "type", "error", "message", big);
  free(big);
  uint8_t *f;
  size_t fl;
  assert_int_equal(pw_control_encode(m, &f, &fl), 0);
  sink s = {0};
  assert_int_equal(feed_partial(&r, f, fl, &s, &err), 1);
  assert_true(json_equal(s.msgs[0], m));
  assert_int_equal(r.cap, 0);
  sink_free(&s);
  free(f);
  json_decref(m);
  /* misuse */
  json_t *msg;
  assert_int_equal(pw_control_reader_advance(&r, 5, &msg, &err), PW_EINVAL);
  assert_null(msg);
  pw_control_reader_free(&r);
  /* a callback's error stops feed */
  size_t len;
  uint8_t *buf = make_stream(3, &len, NULL);
  pw_control_reader_init(&r, 0);
  assert_int_equal(pw_control_reader_feed(&r, buf, len, on_stop, NULL, &err), PW_ECANCELED);
  pw_control_reader_free(&r);
  free(buf);
}

/* ---- tokens -------------------------------------------------------------------- */

static void test_token_equal(void **state) {
  assert_true(pw_control_token_equal("secret", "secret"));
  assert_true(pw_control_token_equal("", ""));
  assert_false(pw_control_token_equal("secret", "secreT"));
  assert_false(pw_control_token_equal("secre", "secret"));
  assert_false(pw_control_token_equal("secrets", "secret"));
  assert_false(pw_control_token_equal("", "secret"));
  assert_false(pw_control_token_equal("secret", ""));
  assert_false(pw_control_token_equal("Xecret", "secret"));
  assert_false(pw_control_token_equal(NULL, "secret"));
  assert_false(pw_control_token_equal("secret", NULL));
  assert_false(pw_control_token_equal(NULL, NULL));
}

static const char *write_file(const char *content, size_t n, int mode) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/pw_token_test_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, content, n), (ssize_t)n);
  fchmod(fd, (mode_t)mode);
  close(fd);
  return path;
}

static void test_token_file(void **state) {
  char tok[PW_CONTROL_TOKEN_MAX + 1];
  pw_err err = {0};
  const char *p = write_file("s3cret \t\r\n\n", 11, 0600);
  assert_int_equal(pw_control_read_token_file(p, tok, sizeof tok, &err), 6);
  assert_string_equal(tok, "s3cret");
  assert_int_equal(pw_control_read_token_file(p, tok, 6, &err), PW_EINVAL); /* no room for NUL */
  unlink(p);

  p = write_file(" \n\t\n", 4, 0600);
  assert_int_equal(pw_control_read_token_file(p, tok, sizeof tok, &err), PW_EAUTH);
  expect_err(&err, "token file is empty");
  unlink(p);
  p = write_file("", 0, 0600);
  assert_int_equal(pw_control_read_token_file(p, tok, sizeof tok, &err), PW_EAUTH);
  unlink(p);

  char big[400];
  memset(big, 'k', sizeof big);
  p = write_file(big, PW_CONTROL_TOKEN_MAX, 0644); /* exactly the limit; 0644 only warns */
  assert_int_equal(pw_control_read_token_file(p, tok, sizeof tok, &err), PW_CONTROL_TOKEN_MAX);
  assert_int_equal(strlen(tok), PW_CONTROL_TOKEN_MAX);
  unlink(p);
  p = write_file(big, PW_CONTROL_TOKEN_MAX + 1, 0600);
  assert_int_equal(pw_control_read_token_file(p, tok, sizeof tok, &err), PW_EAUTH);
  expect_err(&err, "longer than 256");
  unlink(p);
  p = write_file(big, sizeof big, 0600);
  assert_int_equal(pw_control_read_token_file(p, tok, sizeof tok, &err), PW_EAUTH);
  unlink(p);
  p = write_file("ab\x01" "cd\n", 6, 0600);
  assert_int_equal(pw_control_read_token_file(p, tok, sizeof tok, &err), PW_EAUTH);
  expect_err(&err, "control character at byte 2");
  unlink(p);
  p = write_file("ab cd\n", 6, 0600); /* inner spaces are kept */
  assert_int_equal(pw_control_read_token_file(p, tok, sizeof tok, &err), 5);
  assert_string_equal(tok, "ab cd");
  unlink(p);

  assert_int_equal(pw_control_read_token_file("/nonexistent/pw/token", tok, sizeof tok, &err), PW_ENOENT);
  expect_err(&err, "/nonexistent/pw/token: cannot open token file");
  assert_int_equal(pw_control_read_token_file("/tmp", tok, sizeof tok, &err), PW_EIO);
  expect_err(&err, "not a regular file");
}

/* ---- fuzz ------------------------------------------------------------------------ */

#define FUZZ_MAX 1024

static int fuzz_one(const uint8_t *data, size_t n, int partial) {
  pw_control_reader r;
  pw_control_reader_init(&r, FUZZ_MAX);
  sink s = {0};
  pw_err err = {0};
  int rc = 0;
  if (partial) {
    rc = feed_partial(&r, data, n, &s, &err);
  } else {
    for (size_t i = 0; i < n;) {
      size_t k = 1 + below(61);
      if (k > n - i) k = n - i;
      int x = pw_control_reader_feed(&r, data + i, k, on_msg, &s, &err);
      assert_true(r.cap <= FUZZ_MAX);
      if (x < 0) {
        rc = x;
        break;
      }
      rc += x;
      i += k;
    }
  }
  assert_true(r.cap <= FUZZ_MAX);
  if (rc < 0) {
    if (rc != PW_EPROTO && rc != PW_EJSON && rc != PW_ETOOBIG)
      fail_msg("unexpected error %s", pw_err_name(rc));
    assert_true(err.msg[0] != 0);
    assert_int_equal(r.state, PW_CR_DEAD);
  } else {
    assert_int_equal(rc, s.n);
  }
  sink_free(&s);
  pw_control_reader_free(&r);
  return rc;
}

static void test_fuzz_random(void **state) {
  uint8_t b[300];
  static const char alphabet[] = "{}[]\":,0123456789-.eEtrufalsn \\u\"type\"";
  int errors = 0;
  for (int it = 0; it < 20000; it++) {
    size_t n = below(sizeof b);
    int style = it % 3;
    for (size_t i = 0; i < n; i++)
      b[i] = style == 0 ? (uint8_t)rnd() : (uint8_t)alphabet[below(sizeof alphabet - 1)];
    if (style && n >= 4) { /* a plausible length, JSON-ish body */
      size_t body = below(n - 3) + (below(4) == 0 ? below(2000) : 0);
      b[0] = (uint8_t)(body >> 24);
      b[1] = (uint8_t)(body >> 16);
      b[2] = (uint8_t)(body >> 8);
      b[3] = (uint8_t)body;
      if (n > 5) b[4] = '{';
    }
    errors += fuzz_one(b, n, it & 1) < 0;
  }
  assert_true(errors > 5000);
}

static void test_fuzz_mutations(void **state) {
  int ok = 0, bad = 0;
  for (int it = 0; it < 12000; it++) {
    size_t len;
    int nm = 1 + (int)below(3);
    uint8_t *buf = make_stream(nm, &len, NULL);
    buf = realloc(buf, len + 64);
    int mut = (int)below(7);
    switch (mut) {
      case 0:
        for (int k = 1 + (int)below(4); k > 0; k--) buf[below(len)] ^= (uint8_t)(1u << below(8));
        break;
      case 1:
        len = below(len);
        break;
      case 2: { /* length lie on the first message */
        uint32_t v = below(2) ? (uint32_t)rnd() : (uint32_t)(buf[3] + below(9) - 4);
        buf[0] = (uint8_t)(v >> 24);
        buf[1] = (uint8_t)(v >> 16);
        buf[2] = (uint8_t)(v >> 8);
        buf[3] = (uint8_t)v;
        break;
      }
      case 3: /* huge length */
        buf[0] = 0xff;
        break;
      case 4: { /* delete a byte */
        size_t at = below(len);
        memmove(buf + at, buf + at + 1, len - at - 1);
        len--;
        break;
      }
      case 5: { /* insert garbage */
        size_t at = below(len + 1), k = 1 + below(32);
        memmove(buf + at + k, buf + at, len - at);
        for (size_t i = 0; i < k; i++) buf[at + i] = (uint8_t)rnd();
        len += k;
        break;
      }
      default: /* replace a body byte with a JSON-significant one */
        buf[4 + below(len - 4)] = (uint8_t)"{}[]\",:0a\\"[below(10)];
        break;
    }
    int rc = fuzz_one(buf, len, it & 1);
    if (mut == 3) assert_int_equal(rc, PW_ETOOBIG);
    if (rc < 0) bad++; else ok++;
    free(buf);
  }
  assert_true(ok > 100 && bad > 1000);
}

int main(void) {
  const char *seed = getenv("PW_FUZZ_SEED");
  if (seed) g_rng = strtoull(seed, NULL, 0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_examples_valid),
      cmocka_unit_test(test_fields_required_and_typed),
      cmocka_unit_test(test_validate_details),
      cmocka_unit_test(test_step_trace_fields),
      cmocka_unit_test(test_encode),
      cmocka_unit_test(test_reader_chunkings),
      cmocka_unit_test(test_reader_truncated),
      cmocka_unit_test(test_reader_errors),
      cmocka_unit_test(test_token_equal),
      cmocka_unit_test(test_token_file),
      cmocka_unit_test(test_fuzz_random),
      cmocka_unit_test(test_fuzz_mutations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
