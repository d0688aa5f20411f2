/* test_control_msgs: the typed side of the control table (control.h).
 * Names and enum ids map both ways for every type; every field of every
 * type survives read -> build (so each table row points at the right
 * struct member: a swapped offset changes a value); absent optional fields
 * stay absent; build refuses what validation would (missing, below its
 * bound, the wrong struct size); dispatch calls exactly the handler of the
 * type with the decoded struct, refuses a message travelling the wrong
 * way or one the side has no handler for, and passes a handler's error on.
 * The step report, as the worker builds it, survives build -> frame ->
 * reader -> read with every field (its trace an object of its own), and
 * build refuses its out-of-bounds fields by name. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control.h"

/* One message of each type with every field set (distinct values, so a
 * field read into another's slot shows). */
static const char *const full[] = {
    "{\"type\":\"register\",\"version\":2,\"name\":\"w0\",\"token\":\"t\",\"data_addr\":\"h:7\",\"cores\":3,"
    "\"threads\":5,\"software\":\"s\",\"job\":11,\"memory\":12,\"blas_core\":\"Haswell\",\"blas_forced\":1,"
    "\"cpu_level\":\"avx512\",\"gemm_gflops\":110.5,\"gemm_path\":\"onednn\",\"cores_from\":\"cf\","
    "\"memory_from\":\"mf\",\"cpus\":\"0-3\",\"numa\":\"0-1;2-3\"}",
    "{\"type\":\"heartbeat\",\"time\":12.5,\"state\":\"busy\",\"job\":13}",
    "{\"type\":\"step\",\"job\":1,\"run\":2,\"rank\":3,\"step\":4,\"loss\":5.5,\"step_time\":6.5,\"tokens\":7.5,"
    "\"peak_act\":8,\"grad_norm\":9.5,\"lr\":10.5,\"actions\":[[\"F\",0,1,0.0,0.01]],\"nonfinite\":2,"
    "\"eval_loss\":11.5,\"dp_bytes\":12,\"dp_seconds\":13.5,\"tp_bytes\":14,\"tp_seconds\":15.5,"
    "\"trace\":{\"ready\":[16.5],\"routed\":[17.5],\"end_wait\":18.5,\"end_work\":19.5,\"after\":20.5,"
    "\"t0\":21.5,\"sleeps\":22}}",
    "{\"type\":\"checkpoint\",\"job\":1,\"run\":2,\"rank\":3,\"step\":4,\"path\":\"/p\",\"bytes\":5,\"stage\":6}",
    "{\"type\":\"done\",\"job\":1,\"run\":2,\"rank\":3}",
    "{\"type\":\"error\",\"job\":1,\"run\":2,\"rank\":3,\"message\":\"m\",\"lost_rank\":4,\"restore_failed\":1,\"peer_aborted\":2}",
    "{\"type\":\"snapshot\",\"job\":1,\"run\":2,\"rank\":3,\"stage\":4,\"step\":5,\"held\":1}",
    "{\"type\":\"tokens\",\"job\":1,\"run\":2,\"rank\":3,\"items\":[4,5,6,7]}",
    "{\"type\":\"gen_failed\",\"job\":1,\"run\":2,\"rank\":3,\"req\":4,\"message\":\"m\"}",
    "{\"type\":\"welcome\",\"version\":2,\"worker_id\":4,\"heartbeat_interval\":0.5}",
    "{\"type\":\"refused\",\"reason\":\"r\"}",
    "{\"type\":\"assign\",\"job\":1,\"run\":2,\"rank\":3,\"slice\":\"{}\",\"slice_sha256\":\"ab\","
    "\"peers\":[{\"rank\":0,\"addr\":\"h:1\",\"host\":\"m\"}],\"steps\":4,\"start_step\":5,\"checkpoint_dir\":\"/c\","
    "\"resume\":\"/r\",\"trace_every\":6,\"restore_step\":7,\"restore_from\":[3,0,2],\"serve_seqs\":8,"
    "\"serve_len\":9,\"serve_queue\":10,\"cpus\":\"2-3\"}",
    "{\"type\":\"generate\",\"job\":1,\"run\":2,\"req\":3,\"prompt\":[4,5],\"max_tokens\":6,\"temperature\":0.5,"
    "\"top_k\":7,\"top_p\":0.25,\"seed\":8}",
    "{\"type\":\"cancel\",\"job\":1,\"run\":2,\"reason\":\"r\"}",
    "{\"type\":\"stop\",\"job\":1,\"run\":2,\"steps\":3}",
    "{\"type\":\"shutdown\"}",
};
#define N_FULL ((int)(sizeof full / sizeof full[0]))

static json_t *parse(const char *s) {
  json_t *j = json_loads(s, 0, NULL);
  if (!j) fail_msg("bad test JSON: %s", s);
  return j;
}

/* Same keys; numbers equal as numbers (an integer may come back a real). */
static void expect_same(const json_t *want, const json_t *got, const char *what) {
  const char *k;
  json_t *v;
  assert_int_equal(json_object_size(want), json_object_size(got));
  json_object_foreach((json_t *)want, k, v) {
    json_t *g = json_object_get(got, k);
    if (!g) fail_msg("%s: %s lost", what, k);
    if (json_is_number(v) ? !json_is_number(g) || json_number_value(v) != json_number_value(g) : !json_equal(v, g))
      fail_msg("%s: %s differs", what, k);
  }
}

static size_t struct_size(pw_msg_type t) {
  switch (t) {
#define SZ(id, name, dir, type) \
  case PW_MSG_##id: return sizeof(type);
    PW_CONTROL_MSGS(SZ)
#undef SZ
    default: return 0;
  }
}

static void test_names(void **state) {
  assert_int_equal(N_FULL, PW_MSG__COUNT); /* one full example per type */
  for (int t = 0; t < PW_MSG__COUNT; t++) {
    const char *n = pw_control_msg_name((pw_msg_type)t);
    assert_non_null(n);
    assert_int_equal(pw_control_msg_of(n), t);
  }
  assert_int_equal(pw_control_msg_of("launch"), PW_MSG_UNKNOWN);
  assert_int_equal(pw_control_msg_of(NULL), PW_MSG_UNKNOWN);
  assert_null(pw_control_msg_name(PW_MSG__COUNT));
  assert_int_equal(pw_control_msg_dir("assign"), PW_CONTROL_TO_WORKER);
  assert_int_equal(pw_control_msg_dir("step"), PW_CONTROL_TO_COORD);
}

static void test_read_build_round_trip(void **state) {
  for (int i = 0; i < N_FULL; i++) {
    json_t *m = parse(full[i]);
    pw_msg_type t;
    pw_msg_any body;
    pw_err err = {0};
    assert_int_equal(pw_control_read(m, &t, &body, &err), 0);
    assert_string_equal(pw_control_msg_name(t), pw_control_type(m));
    json_t *again = pw_control_build(t, &body, struct_size(t), &err);
    if (!again) fail_msg("%s: %s", full[i], err.msg);
    expect_same(m, again, full[i]);
    json_decref(again);
    json_decref(m);
  }
}

static void test_read_values_and_absent(void **state) {
  pw_msg_type t;
  pw_msg_any b;
  pw_err err = {0};
  json_t *m = parse(full[2]);
  assert_int_equal(pw_control_read(m, &t, &b, &err), 0);
  assert_int_equal(t, PW_MSG_STEP);
  assert_true(b.STEP.job == 1 && b.STEP.run == 2 && b.STEP.rank == 3 && b.STEP.step == 4 && b.STEP.peak_act == 8);
  assert_true(b.STEP.loss == 5.5 && b.STEP.step_time == 6.5 && b.STEP.tokens == 7.5 && b.STEP.grad_norm == 9.5 &&
              b.STEP.lr == 10.5);
  assert_ptr_equal(b.STEP.actions, json_object_get(m, "actions")); /* borrowed */
  json_decref(m);
  /* absent optional fields: -1, NAN, NULL; and build leaves them out */
  m = parse("{\"type\":\"step\",\"job\":1,\"run\":2,\"rank\":3,\"step\":4,\"step_time\":0}");
  assert_int_equal(pw_control_read(m, &t, &b, &err), 0);
  assert_true(b.STEP.peak_act == -1 && isnan(b.STEP.loss) && isnan(b.STEP.lr) && !b.STEP.actions);
  json_t *again = pw_control_build(t, &b, sizeof b.STEP, &err);
  expect_same(m, again, "sparse step");
  json_decref(again);
  json_decref(m);
  m = parse("{\"type\":\"assign\",\"job\":1,\"run\":2,\"rank\":3,\"slice\":\"{}\",\"slice_sha256\":\"ab\","
            "\"peers\":[],\"steps\":4,\"start_step\":0}");
  assert_int_equal(pw_control_read(m, &t, &b, &err), 0);
  assert_true(!b.ASSIGN.resume && !b.ASSIGN.checkpoint_dir && b.ASSIGN.trace_every == -1);
  assert_true(b.ASSIGN.restore_step == -1 && !b.ASSIGN.restore_from);
  assert_string_equal(b.ASSIGN.slice_sha256, "ab");
  json_decref(m);
  /* read validates */
  m = parse("{\"type\":\"assign\",\"job\":1,\"run\":2,\"rank\":3,\"slice\":\"{}\",\"slice_sha256\":\"ab\","
            "\"peers\":[],\"steps\":4,\"start_step\":0,\"restore_step\":2,\"restore_from\":[0,-1]}");
  assert_int_equal(pw_control_read(m, &t, &b, &err), PW_EPROTO);
  assert_string_equal(err.path, "assign.restore_from[1]");
  json_decref(m);
  m = parse("{\"type\":\"snapshot\",\"job\":1,\"run\":2,\"rank\":3,\"stage\":0,\"step\":0,\"held\":0}");
  assert_int_equal(pw_control_read(m, &t, &b, &err), PW_EPROTO);
  assert_string_equal(err.path, "snapshot.step");
  json_decref(m);
  /* register's kernel report: read as sent; an older worker's register,
   * without it, stays valid; a negative rate or a non-string core is refused */
  m = parse(full[0]);
  assert_int_equal(pw_control_read(m, &t, &b, &err), 0);
  assert_string_equal(b.REGISTER.blas_core, "Haswell");
  assert_string_equal(b.REGISTER.cpu_level, "avx512");
  assert_true(b.REGISTER.blas_forced == 1 && b.REGISTER.gemm_gflops == 110.5 && b.REGISTER.memory == 12);
  assert_string_equal(b.REGISTER.gemm_path, "onednn");
  assert_string_equal(b.REGISTER.cores_from, "cf");
  assert_string_equal(b.REGISTER.memory_from, "mf");
  json_decref(m);
  m = parse("{\"type\":\"register\",\"version\":3,\"name\":\"w0\",\"token\":\"t\",\"data_addr\":\"h:7\","
            "\"cores\":1,\"threads\":1,\"software\":\"s\"}");
  assert_int_equal(pw_control_read(m, &t, &b, &err), 0);
  assert_true(!b.REGISTER.blas_core && !b.REGISTER.cpu_level && b.REGISTER.blas_forced == -1 &&
              isnan(b.REGISTER.gemm_gflops) && !b.REGISTER.gemm_path && !b.REGISTER.cores_from &&
              !b.REGISTER.memory_from);
  json_object_set_new(m, "gemm_gflops", json_real(-1));
  assert_int_equal(pw_control_read(m, &t, &b, &err), PW_EPROTO);
  assert_string_equal(err.path, "register.gemm_gflops");
  json_object_set_new(m, "gemm_gflops", json_real(0));
  json_object_set_new(m, "blas_core", json_integer(3));
  assert_int_equal(pw_control_read(m, &t, &b, &err), PW_EPROTO);
  assert_string_equal(err.path, "register.blas_core");
  json_object_del(m, "blas_core");
  json_object_set_new(m, "gemm_path", json_true());
  assert_int_equal(pw_control_read(m, &t, &b, &err), PW_EPROTO);
  assert_string_equal(err.path, "register.gemm_path");
  json_object_del(m, "gemm_path");
  json_object_set_new(m, "memory_from", json_integer(2));
  assert_int_equal(pw_control_read(m, &t, &b, &err), PW_EPROTO);
  assert_string_equal(err.path, "register.memory_from");
  json_decref(m);
  m = parse("{\"type\":\"done\",\"job\":1,\"run\":-2,\"rank\":3}");
  assert_int_equal(pw_control_read(m, &t, &b, &err), PW_EPROTO);
  assert_string_equal(err.path, "done.run");
  json_decref(m);
}

/* A step with every field, as the worker builds it (worker/report.c):
 * built from its struct, framed, read back off the stream and decoded,
 * every value as sent; the trace decoded into the reader's own room. */
static int keep_msg(void *ctx, json_t *msg) {
  *(json_t **)ctx = json_incref(msg);
  return 0;
}

static void test_step_every_field(void **state) {
  json_t *acts = parse("[[\"F\",0,1,0.25,0.5],[\"D\",0,1,0.5,0.75]]");
  json_t *ready = parse("[0.125, 0.375]"), *routed = parse("[0.3, 0.6]");
  pw_msg_step_trace tr = {.ready = ready, .routed = routed, .end_wait = 0.0625, .end_work = 0.03125,
                          .after = 0.015625, .t0 = 86400.5, .sleeps = 7};
  pw_msg_step in = {.job = 3, .run = 4, .rank = 5, .step = 6, .loss = 2.5, .step_time = 0.75, .tokens = 4096,
                    .peak_act = 1 << 20, .grad_norm = 1.25, .lr = 3e-4, .actions = acts, .nonfinite = 2,
                    .eval_loss = 2.75, .dp_bytes = (int64_t)1 << 33, .dp_seconds = 0.0078125,
                    .tp_bytes = 65536, .tp_seconds = 0.00390625, .trace = &tr};
  pw_err err = {0};
  json_t *m = pw_control_build(PW_MSG_STEP, &in, sizeof in, &err);
  if (!m) fail_msg("build: %s", err.msg);
  /* on the wire as the coordinator, the timeline and trace_step.py read it */
  assert_int_equal(json_integer_value(json_object_get(m, "dp_bytes")), (json_int_t)1 << 33);
  assert_true(json_is_integer(json_object_get(m, "tp_bytes")));
  assert_true(json_equal(json_object_get(m, "actions"), acts));
  json_t *wt = json_object_get(m, "trace");
  assert_true(json_is_object(wt) && json_equal(json_object_get(wt, "ready"), ready));
  assert_int_equal(json_integer_value(json_object_get(wt, "sleeps")), 7);
  assert_true(json_real_value(json_object_get(wt, "t0")) == 86400.5);
  uint8_t *frame;
  size_t len;
  assert_int_equal(pw_control_encode(m, &frame, &len), 0);
  json_decref(m);
  json_decref(acts);
  json_decref(ready);
  json_decref(routed);
  pw_control_reader rd;
  pw_control_reader_init(&rd, 0);
  json_t *got = NULL;
  assert_int_equal(pw_control_reader_feed(&rd, frame, len, keep_msg, &got, &err), 1);
  pw_control_reader_free(&rd);
  free(frame);
  pw_msg_type t;
  pw_msg_any b;
  assert_int_equal(pw_control_read(got, &t, &b, &err), 0);
  assert_int_equal(t, PW_MSG_STEP);
  const pw_msg_step *o = &b.STEP;
  assert_true(o->job == 3 && o->run == 4 && o->rank == 5 && o->step == 6 && o->peak_act == 1 << 20);
  assert_true(o->loss == 2.5 && o->step_time == 0.75 && o->tokens == 4096 && o->grad_norm == 1.25 && o->lr == 3e-4);
  assert_true(o->nonfinite == 2 && o->eval_loss == 2.75);
  assert_true(o->dp_bytes == (int64_t)1 << 33 && o->dp_seconds == 0.0078125);
  assert_true(o->tp_bytes == 65536 && o->tp_seconds == 0.00390625);
  assert_int_equal(json_array_size(o->actions), 2);
  assert_string_equal(json_string_value(json_array_get(json_array_get(o->actions, 1), 0)), "D");
  assert_non_null(o->trace);
  assert_ptr_equal(o->trace, &b.nested[0].step_trace); /* the reader's room, not the sender's struct */
  assert_true(o->trace->end_wait == 0.0625 && o->trace->end_work == 0.03125 && o->trace->after == 0.015625 &&
              o->trace->t0 == 86400.5 && o->trace->sleeps == 7);
  assert_int_equal(json_array_size(o->trace->ready), 2);
  assert_true(json_real_value(json_array_get(o->trace->ready, 1)) == 0.375);
  assert_true(json_real_value(json_array_get(o->trace->routed, 0)) == 0.3);
  /* and built again from what was read, the same message */
  json_t *again = pw_control_build(t, &b.STEP, sizeof b.STEP, &err);
  if (!again) fail_msg("rebuild: %s", err.msg);
  assert_true(json_equal(again, got));
  json_decref(again);
  json_decref(got);
  /* an untraced, single-replica step: none of them on the wire, all absent when read */
  pw_msg_step sparse = {.job = 3, .run = 4, .rank = 5, .step = 6, .loss = NAN, .step_time = 0.5, .tokens = NAN,
                        .peak_act = -1, .grad_norm = NAN, .lr = NAN, .nonfinite = -1, .eval_loss = NAN,
                        .dp_bytes = -1, .dp_seconds = NAN, .tp_bytes = -1, .tp_seconds = NAN};
  m = pw_control_build(PW_MSG_STEP, &sparse, sizeof sparse, &err);
  assert_non_null(m);
  assert_int_equal(json_object_size(m), 6); /* type, job, run, rank, step, step_time */
  assert_int_equal(pw_control_read(m, &t, &b, &err), 0);
  assert_true(!b.STEP.trace && !b.STEP.actions && b.STEP.dp_bytes == -1 && b.STEP.tp_bytes == -1 &&
              isnan(b.STEP.dp_seconds) && isnan(b.STEP.tp_seconds) && b.STEP.nonfinite == -1);
  json_decref(m);
}

/* What the table bounds, build refuses from the struct as the reader
 * would, naming the field (the worker logs it instead of sending). */
static void test_step_build_refuses(void **state) {
  pw_err err = {0};
  json_t *arr = json_array();
  pw_msg_step base = {.job = 1, .run = 1, .rank = 0, .step = 0, .loss = NAN, .step_time = 0.5, .tokens = NAN,
                      .peak_act = -1, .grad_norm = NAN, .lr = NAN, .nonfinite = -1, .eval_loss = NAN,
                      .dp_bytes = -1, .dp_seconds = NAN, .tp_bytes = -1, .tp_seconds = NAN};
  pw_msg_step m = base;
  m.dp_bytes = -5; /* -1 is absent; any other negative is a value, and out of bounds */
  assert_null(pw_control_build(PW_MSG_STEP, &m, sizeof m, &err));
  assert_int_equal(err.code, PW_EPROTO);
  assert_string_equal(err.path, "step.dp_bytes");
  assert_string_equal(err.msg, "must be >= 0 (got -5)");
  m = base;
  m.tp_seconds = -0.25;
  assert_null(pw_control_build(PW_MSG_STEP, &m, sizeof m, &err));
  assert_string_equal(err.path, "step.tp_seconds");
  /* inside the trace: its fields are all required, -1 and NULL included */
  pw_msg_step_trace tr = {.ready = arr, .routed = arr, .end_wait = 0, .end_work = 0, .after = 0, .t0 = 1,
                          .sleeps = -1};
  m = base;
  m.trace = &tr;
  assert_null(pw_control_build(PW_MSG_STEP, &m, sizeof m, &err));
  assert_string_equal(err.path, "step.trace.sleeps");
  tr.sleeps = 0;
  tr.routed = NULL;
  assert_null(pw_control_build(PW_MSG_STEP, &m, sizeof m, &err));
  assert_string_equal(err.path, "step.trace.routed");
  assert_string_equal(err.msg, "is required");
  tr.routed = arr;
  tr.after = -1e-3;
  assert_null(pw_control_build(PW_MSG_STEP, &m, sizeof m, &err));
  assert_string_equal(err.path, "step.trace.after");
  tr.after = 0;
  json_t *ok = pw_control_build(PW_MSG_STEP, &m, sizeof m, &err);
  assert_non_null(ok);
  json_decref(ok);
  /* a checkpoint at its bounds and past them */
  assert_null(PW_CONTROL_BUILD(PW_MSG_CHECKPOINT, pw_msg_checkpoint, &err, .job = 1, .run = 1, .rank = 0, .step = 2,
                               .path = "/p", .bytes = -3, .stage = 0));
  assert_string_equal(err.path, "checkpoint.bytes");
  assert_null(PW_CONTROL_BUILD(PW_MSG_CHECKPOINT, pw_msg_checkpoint, &err, .job = 1, .run = 1, .rank = 0, .step = 2,
                               .path = NULL, .bytes = 3, .stage = 0));
  assert_string_equal(err.path, "checkpoint.path");
  json_decref(arr);
}

static void test_build_refuses(void **state) {
  pw_err err = {0};
  json_t *m = PW_CONTROL_BUILD(PW_MSG_DONE, pw_msg_done, &err, .job = 7, .run = 0, .rank = 1);
  assert_non_null(m);
  assert_string_equal(pw_control_type(m), "done");
  assert_int_equal(json_integer_value(json_object_get(m, "job")), 7);
  json_decref(m);
  assert_null(PW_CONTROL_BUILD(PW_MSG_ERROR, pw_msg_error, &err, .job = -1, .run = -1, .rank = -1, .message = NULL));
  assert_int_equal(err.code, PW_EPROTO);
  assert_string_equal(err.path, "error.message");
  assert_null(PW_CONTROL_BUILD(PW_MSG_DONE, pw_msg_done, &err, .job = -5, .run = 0, .rank = 1));
  assert_string_equal(err.path, "done.job");
  assert_null(PW_CONTROL_BUILD(PW_MSG_WELCOME, pw_msg_welcome, &err, .version = 2, .worker_id = 1,
                               .heartbeat_interval = 0));
  assert_string_equal(err.path, "welcome.heartbeat_interval");
  pw_msg_done d = {1, 2, 3};
  assert_null(pw_control_build(PW_MSG_STEP, &d, sizeof d, &err)); /* the wrong struct */
  assert_int_equal(err.code, PW_EINVAL);
  assert_null(pw_control_build(PW_MSG__COUNT, &d, sizeof d, &err));
  assert_int_equal(err.code, PW_EINVAL);
}

typedef struct {
  int calls[PW_MSG__COUNT];
  int64_t job;
  void *conn;
  int fail;
} rec;

static int h_any(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err) {
  rec *r = ctx;
  pw_msg_type t = pw_control_msg_of(pw_control_type(raw));
  r->calls[t]++;
  r->conn = conn;
  if (t == PW_MSG_DONE) r->job = m->DONE.job;
  if (t == PW_MSG_CHECKPOINT) r->job = m->CHECKPOINT.stage;
  return r->fail ? pw_err_set(err, PW_EINVAL, "handler", "said no") : 0;
}

static void test_dispatch(void **state) {
  pw_control_handlers h = {.on = {[PW_MSG_DONE] = h_any, [PW_MSG_CHECKPOINT] = h_any}};
  rec r = {0};
  pw_err err = {0};
  int conn;
  json_t *m = parse(full[4]); /* done, job 1 */
  assert_int_equal(pw_control_dispatch(&h, PW_CONTROL_TO_COORD, &r, &conn, m, &err), 0);
  assert_int_equal(r.calls[PW_MSG_DONE], 1);
  assert_int_equal(r.job, 1);
  assert_ptr_equal(r.conn, &conn);
  /* a coordinator's message arriving at the coordinator */
  json_decref(m);
  m = parse(full[8]);
  assert_int_equal(pw_control_dispatch(&h, PW_CONTROL_TO_COORD, &r, &conn, m, &err), PW_EPROTO);
  assert_string_equal(err.path, "type");
  json_decref(m);
  /* no handler for it on this side */
  m = parse(full[5]);
  assert_int_equal(pw_control_dispatch(&h, PW_CONTROL_TO_COORD, &r, &conn, m, &err), PW_EPROTO);
  assert_non_null(strstr(err.msg, "not expected"));
  json_decref(m);
  /* invalid: never reaches the handler */
  m = parse("{\"type\":\"done\",\"job\":1}");
  assert_int_equal(pw_control_dispatch(&h, PW_CONTROL_TO_COORD, &r, &conn, m, &err), PW_EPROTO);
  assert_string_equal(err.path, "done.run");
  json_decref(m);
  /* the handler's error comes back */
  r.fail = 1;
  m = parse(full[3]);
  assert_int_equal(pw_control_dispatch(&h, PW_CONTROL_TO_COORD, &r, &conn, m, &err), PW_EINVAL);
  assert_int_equal(r.job, 6); /* checkpoint's stage */
  json_decref(m);
  for (int t = 0; t < PW_MSG__COUNT; t++)
    if (t != PW_MSG_DONE && t != PW_MSG_CHECKPOINT) assert_int_equal(r.calls[t], 0);
  assert_int_equal(r.calls[PW_MSG_DONE], 1);
  assert_int_equal(r.calls[PW_MSG_CHECKPOINT], 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_read_build_round_trip),
      cmocka_unit_test(test_read_values_and_absent),
      cmocka_unit_test(test_build_refuses),
      cmocka_unit_test(test_step_every_field),
      cmocka_unit_test(test_step_build_refuses),
      cmocka_unit_test(test_dispatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
