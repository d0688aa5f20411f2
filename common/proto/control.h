/* control: the worker<->coordinator control protocol.
 *
 * Pure: no sockets, no event loop. A message on the wire is a 4-byte
 * big-endian length n (1..max) then n bytes of UTF-8 JSON: an object with a
 * string "type". The reader below never trusts the length: its buffer
 * grows with the bytes that actually arrive, never beyond max, and every
 * message it returns has passed pw_control_validate(). Any error (zero or
 * oversize length, invalid JSON, a non-object, an unknown type, a missing or
 * wrong-typed field) kills the stream: the daemon logs the reason and closes
 * the connection.
 *
 * Protocol version PW_PROTO_VERSION. The worker sends "register" first; the
 * coordinator answers "welcome" or "refused" (wrong token, wrong version:
 * those are checked by the coordinator, not by validation, so the refusal
 * can say why). Fields not listed are allowed and ignored (new optional
 * fields do not need a version bump); "?" marks optional fields. Ids and
 * counts are integers >= 0.
 *
 * Every message type is declared once, in PW_CONTROL_MSGS below: its
 * enum id, its name on the wire, who sends it, and its C struct; the
 * fields of each (name, type, required or optional, lower bound, where in
 * the struct) are one table in control.c that drives validation, encoding
 * and decoding alike. Daemons dispatch through a pw_control_handlers table
 * indexed by the enum (pw_control_dispatch), never by comparing names.
 *
 * worker -> coordinator
 *   register    version:int>=1, name:str, token:str, data_addr:str
 *               ("host:port" of the data-plane listener), cores:int>=1,
 *               threads:int>=1, software:str, job?:int (still busy with it),
 *               memory?:int (bytes of RAM; 0 or absent: unknown; cores and
 *               memory are what the process may use: its affinity mask and
 *               cgroup limits, common/base/sysres.h), cores_from?:str,
 *               memory_from?:str (where each figure came from, for display),
 *               blas_core?:str (openblas_get_corename()), blas_forced?:int>=0
 *               (1: OPENBLAS_CORETYPE chose that kernel), cpu_level?:str
 *               (what the CPU supports: "avx512", "avx2", "sse"),
 *               gemm_gflops?:number>=0 (one-thread sgemm measured at start),
 *               gemm_path?:str (what the products run on: "openblas",
 *               "onednn"; common/compute/gemm.h),
 *               host?:str (the machine's stable id: --host-id / PW_HOST_ID,
 *               else /etc/machine-id, else its hostname; at most 63 bytes;
 *               workers with the same host share its cores),
 *               hostname?:str (for display), cpus?:str (the CPUs it may use, its
 *               affinity mask as a cpulist "0-3,8"), numa?:str (the host's NUMA
 *               nodes' cpulists, ';' between; absent: one node)
 *   heartbeat   time:number>=0, state:str, job?:int, fds?:int>=0 (open
 *               descriptors of the worker process)
 *   step        job:int, run:int, rank:int, step:int, loss?:number,
 *               step_time:number>=0, tokens?:number>=0, peak_act?:int,
 *               grad_norm?:number, lr?:number,
 *               actions?:[[kind:str, mb:int, stage:int, start:number,
 *               end:number], ...], nonfinite?:int>=0 (bits: 1 the loss,
 *               2 the gradient norm was NaN or infinite; such a value is
 *               left out, never sent as a number), eval_loss?:number (the
 *               replica's share of the held-out loss, train.eval_every),
 *               dp_bytes?:int>=0, dp_seconds?:number>=0 (what the rank sent
 *               in the step's data-parallel exchange, and its time; only
 *               with dp > 1), tp_bytes?:int>=0, tp_seconds?:number>=0 (the
 *               same for its tensor-parallel all-reduces; only with tp > 1),
 *               trace?:{ready:[number, ...], routed:[number, ...],
 *               end_wait:number>=0, end_work:number, after:number>=0,
 *               t0:number>=0, sleeps:int>=0} (with actions, on traced
 *               steps, for bench/trace_step.py: per action, when its wait
 *               began and its hand-off ended, seconds from the step's
 *               start; the step end's wait and the rest of it; seconds of
 *               eval and snapshot after step_time's mark; the step's start
 *               on the host's monotonic clock; the waits that slept)
 *   checkpoint  job:int, run:int, rank:int, step:int, path:str, bytes:int,
 *               stage?:int
 *   done        job:int, run:int, rank:int
 *   error       job?:int, run?:int, rank?:int, message:str, lost_rank?:int
 *               (the run failed because the link to that peer rank broke:
 *               the coordinator takes that peer's worker for lost),
 *               restore_failed?:int (1: a snapshot the assign named is no
 *               longer here; the coordinator restarts from a checkpoint),
 *               peer_aborted?:int (the run failed because that peer rank
 *               aborted: a consequence, not a cause — the peer says why)
 *   tokens      job:int, run:int, rank:int, items:[req, token, req, token,
 *               ...] (a serve job's last stage: the tokens it sampled, each
 *               request's in order)
 *   gen_failed  job:int, run:int, rank:int, req:int, message:str (a serve
 *               job's rank 0 cannot take the request)
 *   snapshot    job:int, run:int, rank:int, stage:int, step:int>=1,
 *               held:int (0: a copy of the worker's own stage, 1: of a peer's
 *               stage it holds) — the state of `stage` after `step` steps is
 *               now in this worker's memory (it keeps the newest two steps
 *               of each stage and kind)
 *
 * coordinator -> worker
 *   welcome     version:int>=1, worker_id:int, heartbeat_interval:number>0,
 *               http_url?:str (the coordinator's REST API as this worker
 *               reaches it, "http://host:port" without a trailing slash:
 *               datasets are fetched from <http_url>/v1/datasets/<id>/content)
 *   refused     reason:str
 *   assign      job:int, run:int, rank:int, slice:str (the rank's slice
 *               of the plan: canonical JSON text, common/plan/slice.h),
 *               slice_sha256:str (SHA-256 hex of slice's bytes),
 *               peers:[{rank:int, addr:str, host:str}, ...] (host: the
 *               machine id the rank's worker registered with, or a name of
 *               its own when it sent none; ranks with one host share a
 *               machine, whatever addresses reach them),
 *               steps:int, start_step:int, checkpoint_dir?:str,
 *               resume?:str, trace_every?:int, restore_step?:int>=1,
 *               restore_from?:[int, ...] (with restore_step: for each stage,
 *               the run's global rank that holds that stage's snapshot of
 *               step restore_step in memory and sends it to every rank of
 *               the stage; the run starts at restore_step)
 *               serve_seqs?:int>=1, serve_len?:int>=1, serve_queue?:int (a job
 *               of mode serve: KV slots per stage, positions per slot, and
 *               requests rank 0 queues beyond them; docs/serving.md),
 *               upload_token?:str (to a rank that uploads checkpoints: sent
 *               with each shard, X-Pipewright-Upload-Token; the coordinator
 *               takes a shard of a stage only with its uploader's token),
 *               cpus?:str (the CPUs this rank's threads run on, a cpulist
 *               within its register.cpus: ranks sharing a host get disjoint
 *               ones; common/base/cpuset.h)
 *   generate    job:int, run:int, req:int, prompt:[int, ...] (token ids),
 *               max_tokens:int>=1, temperature:number>=0, top_k:int,
 *               top_p:number>0, seed:int — one request for a serve job's
 *               replica, to its rank 0 (the coordinator checked it)
 *   cancel      job:int, run:int (0: any run of the job), reason:str
 *   stop        job:int, run:int, steps:int>=1 — a drain (the coordinator is
 *               stopping, say on a cluster's preemption signal): the run ends
 *               after `steps` steps as if they were all it had, with that
 *               step's checkpoint. A rank takes it only while it has not
 *               begun step `steps` (whose end decides the checkpoint), so
 *               every rank that takes it stops at the same step; one that
 *               has begun it answers error, and the coordinator then ends
 *               the run at once (worker/run.c: pw_run_stop_at)
 *   shutdown    (no fields)
 *
 * Validation errors are PW_EPROTO with the JSON path of the field, e.g.
 * "assign.peers[1].addr: must be a string", "register.cores: is required",
 * "step.actions[2][0]: must be a string", "step.trace.sleeps: must be an
 * integer >= 0". */
#ifndef PW_CONTROL_H
#define PW_CONTROL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_PROTO_VERSION 7 /* 2: assign carries the plan slice, not the spec; 3: runs are
                              epochs (HELLO names its run), snapshots, restores; 4: assign's
                              peers name each rank's host; 5: assign's upload_token, which
                              checkpoint uploads must carry; 6: data-plane frame kinds DP,
                              TP and NORM (REDUCE split by exchange); 7: stop (a drain) */
#define PW_CONTROL_MAX ((size_t)16 << 20) /* default bound on one message */
#define PW_CONTROL_TOKEN_MAX 256

/* Who sends a message type. */
enum { PW_CONTROL_TO_COORD = 1, PW_CONTROL_TO_WORKER = 2 };

/* ---- the messages ---------------------------------------------------------
 *
 * Each type's C struct. Integers are int64_t, numbers double, strings
 * const char * (on decode, borrowed from the message: valid while it is),
 * arrays json_t * (borrowed likewise; on encode, the caller's reference is
 * not taken), objects a const pointer to their own struct (on decode, into
 * the pw_msg_any read filled). An absent optional field is -1 (integers:
 * every id and count is >= 0), NAN (numbers), NULL (strings, arrays,
 * objects). */
typedef struct { int64_t version; const char *name, *token, *data_addr; int64_t cores, threads;
                 const char *software; int64_t job, memory; const char *blas_core; int64_t blas_forced;
                 const char *cpu_level; double gemm_gflops; const char *host, *hostname, *gemm_path;
                 const char *cores_from, *memory_from, *cpus, *numa; } pw_msg_register;
typedef struct { double time; const char *state; int64_t job, fds; } pw_msg_heartbeat;
typedef struct { json_t *ready, *routed; double end_wait, end_work, after, t0; int64_t sleeps; } pw_msg_step_trace;
typedef struct { int64_t job, run, rank, step; double loss, step_time, tokens; int64_t peak_act;
                 double grad_norm, lr; json_t *actions; int64_t nonfinite; double eval_loss;
                 int64_t dp_bytes; double dp_seconds; int64_t tp_bytes; double tp_seconds;
                 const pw_msg_step_trace *trace; } pw_msg_step;
typedef struct { int64_t job, run, rank, step; const char *path; int64_t bytes, stage; } pw_msg_checkpoint;
typedef struct { int64_t job, run, rank; } pw_msg_done;
typedef struct { int64_t job, run, rank; const char *message; int64_t lost_rank, restore_failed, peer_aborted; } pw_msg_error;
typedef struct { int64_t job, run, rank, stage, step, held; } pw_msg_snapshot;
typedef struct { int64_t version, worker_id; double heartbeat_interval; const char *http_url; } pw_msg_welcome;
typedef struct { const char *reason; } pw_msg_refused;
typedef struct { int64_t job, run, rank; const char *slice, *slice_sha256; json_t *peers; int64_t steps, start_step;
                 const char *checkpoint_dir, *resume; int64_t trace_every, restore_step; json_t *restore_from;
                 int64_t serve_seqs, serve_len, serve_queue; const char *upload_token, *cpus; } pw_msg_assign;
typedef struct { int64_t job, run, req; json_t *prompt; int64_t max_tokens; double temperature; int64_t top_k;
                 double top_p; int64_t seed; } pw_msg_generate;
typedef struct { int64_t job, run, rank; json_t *items; } pw_msg_tokens;
typedef struct { int64_t job, run, rank, req; const char *message; } pw_msg_gen_failed;
typedef struct { int64_t job, run; const char *reason; } pw_msg_cancel;
typedef struct { int64_t job, run, steps; } pw_msg_stop;
typedef struct { char unused; } pw_msg_shutdown;

/*  ENUM        wire name     sender                struct */
#define PW_CONTROL_MSGS(X)                                                   \
  X(REGISTER,   "register",   PW_CONTROL_TO_COORD,  pw_msg_register)         \
  X(HEARTBEAT,  "heartbeat",  PW_CONTROL_TO_COORD,  pw_msg_heartbeat)        \
  X(STEP,       "step",       PW_CONTROL_TO_COORD,  pw_msg_step)             \
  X(CHECKPOINT, "checkpoint", PW_CONTROL_TO_COORD,  pw_msg_checkpoint)       \
  X(DONE,       "done",       PW_CONTROL_TO_COORD,  pw_msg_done)             \
  X(ERROR,      "error",      PW_CONTROL_TO_COORD,  pw_msg_error)            \
  X(SNAPSHOT,   "snapshot",   PW_CONTROL_TO_COORD,  pw_msg_snapshot)         \
  X(TOKENS,     "tokens",     PW_CONTROL_TO_COORD,  pw_msg_tokens)           \
  X(GEN_FAILED, "gen_failed", PW_CONTROL_TO_COORD,  pw_msg_gen_failed)       \
  X(WELCOME,    "welcome",    PW_CONTROL_TO_WORKER, pw_msg_welcome)          \
  X(REFUSED,    "refused",    PW_CONTROL_TO_WORKER, pw_msg_refused)          \
  X(ASSIGN,     "assign",     PW_CONTROL_TO_WORKER, pw_msg_assign)           \
  X(GENERATE,   "generate",   PW_CONTROL_TO_WORKER, pw_msg_generate)         \
  X(CANCEL,     "cancel",     PW_CONTROL_TO_WORKER, pw_msg_cancel)           \
  X(STOP,       "stop",       PW_CONTROL_TO_WORKER, pw_msg_stop)             \
  X(SHUTDOWN,   "shutdown",   PW_CONTROL_TO_WORKER, pw_msg_shutdown)

typedef enum {
  PW_MSG_UNKNOWN = -1,
#define PW__MSG_ENUM(id, name, dir, type) PW_MSG_##id,
  PW_CONTROL_MSGS(PW__MSG_ENUM)
#undef PW__MSG_ENUM
  PW_MSG__COUNT
} pw_msg_type;

/* Every struct a message's object field points to, and how many one
 * message may hold (read refuses more, PW_EINTERNAL). */
typedef union {
  pw_msg_step_trace step_trace;
} pw_msg_nested;
#define PW_CONTROL_NESTED_MAX 1

/* Any message's struct, for handlers (m->STEP), with the room its object
 * fields point into: a decoded message lives as long as this does. */
typedef struct {
  union {
#define PW__MSG_UNION(id, name, dir, type) type id;
    PW_CONTROL_MSGS(PW__MSG_UNION)
#undef PW__MSG_UNION
  };
  pw_msg_nested nested[PW_CONTROL_NESTED_MAX];
} pw_msg_any;

/* The type named `name`, or PW_MSG_UNKNOWN. */
pw_msg_type pw_control_msg_of(const char *name);
/* The wire name of t ("step"), or NULL. */
const char *pw_control_msg_name(pw_msg_type t);

/* A new message of type t from its struct (sizeof the struct as `size`, a
 * check that the right one is passed), validated as the reader would: NULL
 * with err filled (PW_EPROTO naming the field, PW_EINVAL for a wrong
 * type or size, PW_ENOMEM) when it would not pass. */
json_t *pw_control_build(pw_msg_type t, const void *body, size_t size, pw_err *err);
/* pw_control_build with the struct written in place:
 *   PW_CONTROL_BUILD(PW_MSG_DONE, pw_msg_done, &err, .job = 1, .run = 2, .rank = 0)
 * Optional fields left out of the list are 0, NOT absent: set -1 / NAN /
 * NULL for an absent one (an object's pointer left out is NULL: absent). */
#define PW_CONTROL_BUILD(t, type, err, ...) pw_control_build((t), &(type){__VA_ARGS__}, sizeof(type), (err))
/* msg validated and read into the struct of its type; *t gets the type.
 * Its object fields point into out->nested. 0, or PW_EPROTO naming the
 * field. */
PW_MUST_CHECK int pw_control_read(const json_t *msg, pw_msg_type *t, pw_msg_any *out, pw_err *err);

/* A side's handlers, indexed by message type (NULL: not accepted here). A
 * handler gets the daemon's ctx and the link's conn as given to dispatch,
 * the decoded message and the message itself; it returns 0, or negative
 * to have the link closed (with err filled). */
typedef int (*pw_control_handler)(void *ctx, void *conn, const pw_msg_any *m, const json_t *raw, pw_err *err);
typedef struct {
  pw_control_handler on[PW_MSG__COUNT];
} pw_control_handlers;

/* Reads msg (pw_control_read) and calls its handler. PW_EPROTO when it
 * travels the wrong way for a side receiving `dir`, or the side has no
 * handler for it; otherwise the handler's result. */
PW_MUST_CHECK int pw_control_dispatch(const pw_control_handlers *h, int dir, void *ctx, void *conn, const json_t *msg,
                        pw_err *err);

/* The direction of a known message type, or 0 when unknown. */
int pw_control_msg_dir(const char *type);
/* msg's "type" when it is a string, else NULL. */
const char *pw_control_type(const json_t *msg);

/* 0, or PW_EPROTO naming the field (see the table above). */
PW_MUST_CHECK int pw_control_validate(const json_t *msg, pw_err *err);

/* A malloc'd wire frame (4-byte big-endian length + compact JSON) for any
 * JSON object; the caller frees *out. Does not validate (so tests can send
 * bad messages); PW_EINVAL for a non-object or unencodable value,
 * PW_ETOOBIG over PW_CONTROL_MAX, PW_ENOMEM. */
PW_MUST_CHECK int pw_control_encode(const json_t *msg, uint8_t **out, size_t *len);

/* ---- the stream reader --------------------------------------------------
 *
 *   LEN  --4 bytes: 1..max-->  BODY  --n bytes: JSON object, valid-->  LEN
 *    \--0 or > max--> DEAD       \--invalid JSON / validation--> DEAD
 *
 * Use from libuv exactly like pw_frame_reader: next_buf in alloc_cb,
 * advance in read_cb. advance returns 1 with *msg set (a new reference the
 * caller must json_decref), 0 for "need more", or negative (PW_EPROTO,
 * PW_EJSON, PW_ETOOBIG, PW_ENOMEM; PW_EINVAL for misuse); once negative,
 * always the same code. next_buf gives len 0 only on a dead stream. */

enum { PW_CR_LEN, PW_CR_BODY, PW_CR_DEAD };

typedef struct {
  size_t max;        /* bound on one message's length */
  int state;
  int dead_code;
  uint8_t len_buf[4];
  size_t len_got;
  size_t len;        /* body length of the message being read */
  uint8_t *buf;      /* body buffer; cap <= max, always */
  size_t cap;
  size_t got;
  uint64_t messages; /* complete messages so far */
} pw_control_reader;

/* max 0 means PW_CONTROL_MAX; at most UINT32_MAX. */
void pw_control_reader_init(pw_control_reader *r, size_t max);
void pw_control_reader_free(pw_control_reader *r);
void pw_control_reader_next_buf(pw_control_reader *r, void **buf, size_t *len);
PW_MUST_CHECK int pw_control_reader_advance(pw_control_reader *r, size_t n, json_t **msg, pw_err *err);
/* 1 at a message boundary (an EOF there is an orderly close). */
int pw_control_reader_idle(const pw_control_reader *r);

/* Copies data through next_buf/advance, calling cb for each message (cb
 * borrows it: json_incref to keep it). cb returns 0 to go on or negative to
 * stop. Returns the number of messages, or a negative code. */
typedef int (*pw_control_cb)(void *ctx, json_t *msg);
PW_MUST_CHECK int pw_control_reader_feed(pw_control_reader *r, const void *data, size_t n, pw_control_cb cb,
                           void *ctx, pw_err *err);

/* ---- cluster token -------------------------------------------------------- */

/* 1 when the NUL-terminated strings are equal, else 0, in time that depends
 * only on the lengths (pass the secret as b). NULL is never equal. */
int pw_control_token_equal(const char *a, const char *b);

/* Reads a token file into buf (NUL-terminated), stripping trailing
 * whitespace. Returns the token's length, or PW_ENOENT / PW_EIO (cannot
 * read), PW_EAUTH (empty, over PW_CONTROL_TOKEN_MAX bytes, or holding
 * control characters), PW_EINVAL (cap too small for the token). Logs a
 * warning when the file is readable by group or others. */
PW_MUST_CHECK int pw_control_read_token_file(const char *path, char *buf, size_t cap, pw_err *err);

#endif
