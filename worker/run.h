/* run: one assignment of a worker — a rank of a job — and who owns what.
 *
 * Two threads work on a run. The loop thread (libuv: worker.h) starts and
 * ends it, keeps its outbound links and writes what a socket would not take
 * at once. The compute thread (exec.c) walks the rank's action list step
 * after step, reads its inbound links itself (recv.c) and does the step end
 * (stepend.c). The run's state is split by owner, so every access names
 * whose field it touches:
 *   - the top level of pw_run: set while the run is made (pw_run_create),
 *     read by both threads, written by neither afterwards;
 *   - sh (pw_run_shared): both threads, under sh.mu (sh.wl under sh.wmu;
 *     sh.wake_fd and sh.abort need no lock);
 *   - cp (pw_run_compute): the compute thread only (before it starts, the
 *     loop thread makes it);
 *   - lp (pw_run_loop): the loop thread only.
 * A run can be made and driven without a worker daemon (pw_run_create with
 * any libuv loop; the tests do), and the daemon makes its runs the same way. */
#ifndef PW_RUN_H
#define PW_RUN_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "control.h"
#include "data.h"
#include "dpx.h"
#include "gradrs.h"
#include "fetch.h"
#include "model.h"
#include "partition.h"
#include "plan.h"
#include "prog.h"
#include "schedule.h"
#include "spec.h"
#include "snap.h"
#include "tpx.h"
#include "wire.h"

typedef struct pw_worker pw_worker;
typedef struct pw_link pw_link;
typedef struct pw_run pw_run;

/* Per local stage, what does not change during the run: its program (whose
 * contents the compute thread alone touches), its ports, its arenas. */
typedef struct {
  int stage;               /* global stage id */
  pw_prog *prog;
  int n_act_in;            /* activation input ports (from other stages) */
  int n_grad_in;           /* output ports (their gradients come back) */
  int first_input;         /* holds the model's input (draws inputs) */
  int has_target;          /* holds the targets (draws targets) */
} pw_lstage;

/* Per local stage, its slots as both threads see them (sh.ls, under
 * sh.mu): the loop thread frees a slot once the last send reading it is
 * written. */
typedef struct {
  int *slot_busy;          /* [max_slots] 1 while a microbatch or a send holds it */
  int *slot_sends;         /* [max_slots] writes still reading the slot */
  int *slot_free_pending;  /* [max_slots] released by compute, waiting on sends */
} pw_lstage_shared;

/* Per local stage, where its microbatches are (cp.ls): the compute thread
 * alone reads and writes these (recv.c, on that thread, counts arrivals);
 * it updates them under sh.mu all the same, next to the slots. */
typedef struct {
  int *mb_slot;            /* [m] slot holding microbatch mb, or -1 */
  int *act_step, *act_got; /* [m] step tag and activation inputs arrived */
  int *grad_step, *grad_got; /* [m] step tag and output gradients arrived */
} pw_lstage_compute;

/* A sampled action timing, for the step report's timeline (seconds from
 * the step's start): waiting for its inputs from `ready` to `start`,
 * computing to `end`, handing its outputs on (sends, local copies) to
 * `routed`. */
typedef struct {
  pw_action a;
  double ready, start, end, routed;
} pw_timing;

/* An inbound link as the compute thread reads it (recv.c). */
typedef struct {
  int fd;                  /* -1 until admitted, and after the peer's orderly end */
  int bye;                 /* the peer said goodbye */
  pw_frame_reader rd;
} pw_inlink;

/* Traced steps' timings travel to the loop in a few buffers made at start
 * (a malloc per step on the compute thread, freed on the loop thread,
 * would creep its heap a page at a time); a step finding none free goes
 * untraced. */
#define PW_TRACE_BUFS 4

/* What the compute thread asks of the loop thread, in order. */
typedef enum {
  PW_EV_SEND,              /* write a frame (header encoded, CRC included) */
  PW_EV_STEP,              /* a step is complete: report it */
  PW_EV_DONE,              /* the last step is complete */
  PW_EV_FAIL,              /* failed with sh.error */
  PW_EV_SNAP,              /* a snapshot of `stage` after `step` steps is in memory (held: a peer's) */
  PW_EV_CKPT,              /* `stage`'s checkpoint after `step` steps is written (and uploaded) */
  PW_EV_CTL,               /* send msg to the coordinator (serving's tokens) */
  PW_EV_EXIT               /* the compute thread has returned */
} pw_event_kind;

typedef struct {
  pw_event_kind kind;
  /* SEND */
  int to;                  /* global rank */
  int li, slot;            /* slot the payload points into, or -1 */
  const void *payload;
  atomic_int *pending;     /* counts the write while it reads a snapshot, or NULL */
  uint64_t len;            /* payload bytes */
  uint64_t off;            /* bytes of header + payload already written */
  uint8_t hdr[PW_FRAME_HDR_SIZE];
  /* STEP (and DONE: peak_act) */
  int step, peak_act, has_loss, has_eval;
  int stage, held;         /* SNAP, CKPT (and step) */
  double step_time, loss, grad_norm, lr, eval_loss;
  uint64_t dp_bytes;       /* STEP: payload bytes this rank sent in the data-parallel exchange */
  uint64_t tp_bytes;       /* STEP: ... in the tensor-parallel all-reduces of the step's actions */
  double tp_seconds;       /* STEP: spent in them (sending, waiting, adding) */
  double dp_seconds;       /* STEP: spent in the data-parallel exchange (dpx.c) */
  json_t *colls;           /* STEP, traced: the collectives' timeline entries (the loop's reference), or NULL */
  double end_wait, end_work; /* STEP: the step end's seconds waiting for peers, and the rest of it */
  double after;            /* STEP: seconds after step_time's mark (eval, snapshot) before the report */
  double t0;               /* STEP: the step's start, CLOCK_MONOTONIC seconds (ranks on a host share it) */
  int sleeps;              /* STEP: waits that slept in poll() since the last report */
  pw_timing *timings;      /* [n_acts] on traced steps (one of trace_buf's), else NULL */
  json_t *msg;             /* CTL: the message (the loop's reference) */
} pw_event;

/* Both threads, under mu (wl under wmu; wake_fd and abort without a lock). */
typedef struct {
  uv_mutex_t mu;
  int wake_fd;             /* eventfd: the loop wakes the compute thread from poll() */
  atomic_int abort;        /* loop -> compute: stop at the next wait */
  pw_lstage_shared *ls;    /* [n_ls] slots of each local stage */
  int *in_fd;              /* [n_ranks] sockets of admitted inbound links, or -1 */
  int step;                /* current step (written by compute) */
  pw_event *evq;           /* compute -> loop events, a ring */
  int evq_head, evq_len, evq_cap;
  char error[512];         /* why the compute thread failed */
  int lost_rank;           /* the peer whose link broke, when that failed the run; else -1 */
  int restore_failed;      /* a snapshot the assign named was not here */
  int aborted_rank;        /* the peer whose abort (BYE with a reason) failed the run; else -1 */
  pw_timing *trace_buf;    /* [PW_TRACE_BUFS * n_acts] timings of traced steps being reported */
  int trace_busy[PW_TRACE_BUFS]; /* a report still reads that one */
  /* Outbound links as the compute thread writes them, under wmu: it
   * writes a frame straight to the socket when the loop has nothing queued
   * on that link; what the socket does not take goes to the loop. */
  uv_mutex_t wmu;
  struct {
    int fd;                /* -1 until the link is up, and once it closes */
    int queued;            /* frames the loop is still writing */
  } *wl;                   /* [n_ranks] */
} pw_run_shared;

/* The compute thread only. */
typedef struct {
  pw_lstage_compute *ls;   /* [n_ls] microbatches of each local stage */
  size_t chunk_limit;      /* frames over this many payload bytes go in chunks (wire.h; PW_WIRE_CHUNK) */
  uint64_t chunked, chunks; /* tensors sent in chunks, and their chunks */
  uint64_t act_sent, act_bytes; /* activation frames sent to other ranks, their payload bytes */
  pw_inlink *in;           /* [n_ranks] inbound links it reads (recv.c) */
  double t_step0;          /* monotonic time the step began */
  double waited;           /* seconds pw_exec_wait has blocked, all told (the step end's share is traced) */
  int sleeps, sleeps_told; /* its waits that slept in poll() (each paid a wake-up), and those reported */
  double loss_sum;         /* this replica's share of the pass's loss */
  /* Frames of ACT, GRAD, TIED and the norm exchange are tagged with the
   * pass they belong to, not the step: a step's pass, then the eval passes
   * of train.eval_every (evalrun.c) each have a tag of their own, the same
   * on every rank (pw_evalrun_tag); without eval the tag is the step. The
   * data-parallel arenas (between replicas) keep the step. */
  int tag;
  int eval, eval_batch;    /* in an eval pass: of eval batch eval_batch */
  pw_action *eval_acts;    /* [n_eval_acts] this rank's forward-only list, or NULL */
  int n_eval_acts;
  int act_held, peak_act;  /* saved activations now / peak this run */
  pw_timing *timings;      /* [n_acts] */
  pw_tied_bufs *tied;      /* [n_shared] step-end buffers of the shared parameters held here (plan.h) */
  int tied_needed;         /* remote holders' copies to wait for per step */
  int tied_step, tied_got; /* tied gradients received for tied_step */
  double *norm_parts;      /* [2 * pp] partial of each pipeline rank, by step parity */
  int *norm_parts_step;
  double norm_out[2];      /* our partial being sent, by step parity */
  double lr;               /* of the step being ended */
  /* the data-parallel exchange (dpx.c), when dp > 1 and training */
  pw_dpx *dpx;             /* [n_ls] */
  pw_dpx *dpf;             /* [n_ls] zero > 0: the full ranges' all-reduce (buf is the packed ranges) */
  size_t dp_chunk;         /* floats per chunk */
  double *dp_norm;         /* [2 * dp] zero > 0: each replica's shard norm, by step parity */
  int *dp_norm_step;
  pw_gradrs *gradrs;       /* zero 2: the reduce-scatter inside W and B actions (gradrs.c) */
  uint64_t dp_bytes;       /* payload bytes sent in it this step */
  double dp_seconds;       /* and the time spent in it */
  double dp_t0, dp_t1;     /* its first start and last end, from the step's start (t0 < 0: none yet) */
  int ds_held;             /* the dataset's cache entry is held (released when the run is freed) */
  /* the tensor-parallel all-reduces (tpx.c), when tp > 1 */
  pw_tpx *tpx;
  uint64_t tp_bytes;       /* payload bytes sent in them since the step began */
  double tp_seconds;       /* and the time spent in them */
  /* snapshots (snaprun.c) */
  pw_snap **rx;            /* [n_ranks] entry a peer's SNAP frames are going into, or NULL */
  int *rx_next;            /* [n_ranks] part expected next from that peer */
  int *rx_step;            /* [n_ranks] the step its part 0 named */
  int restore_got;         /* stages restored from a peer */
  int report_stage, report_step; /* a held snapshot completed, to report (report_step 0: none) */
  double snap_seconds;     /* spent taking snapshots (copies and queueing their sends) */
  int snaps_taken, snaps_skipped;
  int snap_due;            /* a snapshot of the state after this many steps is to be taken (0: none) */
  int snap_late;           /* snapshots left to the step end, net of those a wait took (snaprun.c) */
  double spin;             /* seconds a wait polls its links before it sleeps (recv.c) */
} pw_run_compute;

/* The loop thread only. */
typedef struct {
  pw_link **out;           /* [n_ranks] outbound link to each peer */
  int n_out_needed, n_out_connected;
  int started;             /* all links up, compute thread running */
  uv_thread_t thread;
  uv_async_t async;        /* compute -> loop: events queued */
  int async_init;
  int thread_running;      /* created and not yet joined */
  int closing;             /* being torn down */
  int sends_inflight;
} pw_run_loop;

struct pw_run {
  /* ---- set by pw_run_create, then read-only for both threads ---- */
  pw_worker *w;            /* NULL for a run made without a daemon */
  json_t *assign;          /* the assignment message (owned; a's strings point into it), or NULL */
  uint64_t job;
  int run_id;
  int rank;                /* global rank: (replica * pp + pipeline rank) * tp + tp rank */
  int prank, replica;      /* pipeline rank, data-parallel replica */
  int tp, tp_rank;         /* tensor-parallel ranks per stage (1: none), and ours among them */
  int pp, dp, n_ranks;
  int steps, start_step, trace_every;
  char ckpt_dir[512];
  const char *resume;      /* checkpoint to resume from (into assign), or NULL */
  int restore_step;        /* > 0: start from the snapshots of this step (restore_from) */
  int *restore_from;       /* [S] global rank sending each stage's snapshot, or NULL */
  pw_snapstore *snaps;     /* the worker's snapshots, or NULL (none taken) */
  int snap_holder;         /* global rank this rank's snapshots go to, or -1 */
  /* From the assignment's slice (common/plan/slice.h), never rebuilt here:
   * spec holds only mode, train and data (the worker never sees the model
   * spec); model is the compiled graph; part the partition as far as this
   * rank uses it; sched stage -> rank and only this rank's action list. */
  pw_job spec;
  pw_model model;          /* tp > 1: the group's graph, split shapes (pw_tp_model) */
  pw_model canon;          /* tp > 1: the slice's graph, tp = 1 shapes (checkpoints); else empty */
  uint8_t *tp_kinds;       /* tp > 1: [model.n_params] pw_tp_kind of each */
  pw_partition part;
  pw_sched *sched;
  int *peak_slots;         /* [n_ls] activation slots each local stage grows to (the plan's) */
  int *n_work;             /* [n_ls] remat stages: their work buffers (the plan's); 0 = no remat */
  size_t mem_budget;       /* bytes the plan gives this pipeline rank */
  char plan_sha256[65];    /* the plan the slice was cut from */
  char init_sha256[65];    /* stored weights the parameters start from ("" = the seed's) */
  char init_optim_sha256[65]; /* their optimizer state ("" = fresh) */
  pw_dataset *ds;          /* opened by the compute thread (pw_run_open_files) */
  /* Where a stored dataset (spec.data.dataset) comes from: the worker's
   * cache, the coordinator's HTTP API and the cluster token (pw_run_start
   * sets them; NULL / "" for a run made without a daemon). */
  pw_dscache *cache;
  char http_url[512];
  const char *token;
  const char *upload_token; /* the assign's: sent with each checkpoint shard (NULL: none) */
  int m, mb_size, S;
  const int *rank_of_stage; /* [S] pipeline rank */
  const int *lidx_of_stage; /* [S] local stage index or -1 */
  pw_lstage *ls;           /* [n_ls] */
  int n_ls;
  const pw_action *acts;   /* this rank's list */
  int n_acts;
  char (*peer_addr)[64];   /* [n_ranks] */
  char (*peer_host)[64];   /* [n_ranks]: its machine (assign.peers[].host) */
  struct pw_serve *serve;  /* mode serve: the serving loop's state (serve.h), else NULL */

  pw_run_shared sh;        /* both threads: under sh.mu / sh.wmu */
  pw_run_compute cp;       /* compute thread only */
  pw_run_loop lp;          /* loop thread only */
};

/* ---- run.c, run_setup.c, run_files.c ----------------------------------------- */

/* Loop thread (run_setup.c). Makes the run of assignment a (as: the
 * message itself, kept for the run's life, or NULL when a's strings
 * outlive the run) from its slice: the tables, the stage programs and
 * their slots, the step-end buffers; its event queue wakes `loop`. Opens no file (pw_run_open_files
 * does, on the compute thread) and connects nothing (pw_run_start does).
 * ckpt_dir: where checkpoints go when a names none. */
PW_MUST_CHECK int pw_run_create(uv_loop_t *loop, const pw_msg_assign *a, const json_t *as, const char *ckpt_dir,
                                pw_run **out, pw_err *err);
/* Loop thread: pw_run_create, then the run becomes w's and connects to its
 * peers; its compute thread starts once every link is up. */
PW_MUST_CHECK int pw_run_start(pw_worker *w, const pw_msg_assign *a, const json_t *as, pw_err *err);
/* Compute thread (run_files.c), before the first step: the dataset and
 * the parameters (from the checkpoint to resume, else from the init
 * weights fetched through the cache, else drawn from the seed). Only
 * regular files are read (a FIFO or a device is refused, never waited on). */
PW_MUST_CHECK int pw_run_open_files(pw_run *r, pw_err *err);
/* Loop thread. */
void pw_run_cancel(pw_run *r, const char *reason);
void pw_run_fail(pw_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pw_run_on_link_up(pw_run *r, pw_link *l);
void pw_run_on_link_down(pw_run *r, pw_link *l, const char *why);
void pw_run_send_done(pw_run *r, int to, int li, int slot);
/* Inbound link l's HELLO was admitted; its socket is now the compute
 * thread's. */
void pw_run_link_in(pw_run *r, pw_link *l);
/* Loop thread: takes the oldest event the compute thread queued into *ev;
 * 0 when there is none. */
int pw_run_event_next(pw_run *r, pw_event *ev);
/* Loop thread, once the compute thread has been joined (or never started):
 * frees the run (its async handle closes on its loop first). */
void pw_run_free(pw_run *r);
/* Loop thread: the compute thread's events queued (the run's async
 * handle's callback, which pw_run_create installs). */
void pw_run_on_events(uv_async_t *h);
/* Any thread: the step the run is at (for status lines). */
int pw_run_step(pw_run *r);
/* Compute thread (recv.c): a frame header from peer `from` arrived: where
 * should its payload go? Returns 0 and sets *dst (NULL = reader's own
 * buffer), or a negative code with err filled (the run then fails). */
PW_MUST_CHECK int pw_run_frame_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
/* Compute thread: the frame's payload is complete (at the dest given, or
 * in payload). */
PW_MUST_CHECK int pw_run_frame_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);
/* Compute thread, sh.mu held: the slot of local stage li that holds
 * microbatch mb, claimed (and made) on first use; a negative code when
 * none is free. Release returns it once the sends reading it are done. */
PW_MUST_CHECK int pw_run_slot_for(pw_run *r, int li, int mb, pw_err *err);
void pw_run_slot_release(pw_run *r, int li, int mb);
/* Tables of the partition (immutable during the run; any thread). */
int pw_run_producer(const pw_run *r, int value);
int pw_run_consumer(const pw_run *r, int value);
int pw_run_global_rank(const pw_run *r, int stage);
/* The global rank of pipeline rank prank of replica d in our tp place. */
int pw_run_rank_of(const pw_run *r, int d, int prank);

/* ---- exec.c: the compute thread ------------------------------------------ */

void pw_exec_main(void *arg);
/* recv.c, compute thread: reads the inbound links until ready(r, arg)
 * holds (spinning a little, then sleeping in poll; a due snapshot is taken
 * first), or the run is aborted
 * (PW_ECANCELED) or a link fails (sh.error set). */
PW_MUST_CHECK int pw_exec_wait(pw_run *r, int (*ready)(pw_run *, const void *), const void *arg);
/* Compute thread, before the first wait: cp.spin, 0 when the host has
 * fewer CPUs than the run's compute threads on it. */
void pw_exec_spin_init(pw_run *r);
/* Whether ranks a and b run on one machine: 1 when the coordinator named
 * one host for both (assign.peers[].host), whatever addresses reach them;
 * else 0. */
int pw_exec_same_host(const pw_run *r, int a, int b);
/* Any thread: wake the compute thread from poll(). */
void pw_exec_wake(pw_run *r);
/* Compute thread: queue a frame to rank `to` (CRC computed here); a
 * payload over cp.chunk_limit goes as consecutive chunk frames. payload
 * stays valid until the write is done: it points into slot (li, slot),
 * which is kept until then, or into a run-owned buffer (li -1). */
PW_MUST_CHECK int pw_exec_send(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, int li, int slot);
/* The same for a payload in a snapshot entry: *pending counts each frame
 * the loop still writes (the entry is not reused meanwhile). */
PW_MUST_CHECK int pw_exec_send_pending(pw_run *r, int to, const pw_frame_hdr *h, const void *payload,
                                       atomic_int *pending);
/* Compute thread: one pass of an action list (the step's, or in an eval
 * pass the forward-only list), waiting for each action's inputs. */
PW_MUST_CHECK int pw_exec_actions(pw_run *r, const pw_action *acts, int n_acts);
/* Compute thread: queue an event for the loop thread. */
PW_MUST_CHECK int pw_exec_post(pw_run *r, const pw_event *ev);
/* Compute thread: record why the run failed (err may be NULL) and return rc. */
PW_MUST_CHECK int pw_exec_fail(pw_run *r, int rc, const pw_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Compute thread: cp.chunk_limit from PW_WIRE_CHUNK (or the default). */
PW_MUST_CHECK int pw_exec_chunk_limit(pw_run *r);
double pw_now(void);

/* ---- snaprun.c: snapshots of a run's stages --------------------------------- */

/* The rank that keeps rank g's snapshots: the next rank (cyclically) on
 * another host, else the next rank; -1 for a one-rank run. */
int pw_snaprun_holder(const pw_run *r, int g);
/* Compute thread, after a step's update: when the step is due, its
 * snapshot is marked for the next step (cp.snap_due). */
void pw_snaprun_due(pw_run *r);
/* Compute thread: the due snapshot, if any — a copy of each local stage
 * into the store and to the holder — in a wait that would idle (idle), or
 * at the step end when no wait took it (overdue). Never fails the run: a
 * snapshot that cannot be taken is logged and skipped. */
void pw_snaprun_idle(pw_run *r);
void pw_snaprun_overdue(pw_run *r);
/* Compute thread, before the first step of a run with restore_step: each
 * local stage's state from memory (its own or sent by restore_from), and
 * what this rank holds sent to the ranks that need it. */
PW_MUST_CHECK int pw_snaprun_restore(pw_run *r, pw_err *err);
/* Compute thread, sh.mu held: a SNAP frame's destination, and its end. */
PW_MUST_CHECK int pw_snaprun_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
PW_MUST_CHECK int pw_snaprun_frame(pw_run *r, int from, const pw_frame_hdr *h, pw_err *err);
/* pw_run_create: assign.restore_step / restore_from, checked against the
 * mesh before anything waits on them. */
PW_MUST_CHECK int pw_snaprun_assign(pw_run *r, const pw_msg_assign *a, pw_err *err);
/* pw_run_create / run_destroy: the receive tables; claimed entries given back. */
PW_MUST_CHECK int pw_snaprun_alloc(pw_run *r);
void pw_snaprun_free(pw_run *r);

/* ---- evalrun.c: held-out loss during training (train.eval_every) ---------- */

/* The frame tag of step's pass (see pw_run_compute.tag). */
int pw_evalrun_tag(const pw_run *r, int step);
/* The tag of the pass after the one tagged `tag`. */
int pw_evalrun_next(int tag);
/* PW_EPROTO: frame h is of a pass this rank cannot take now (named as a
 * step while passes are steps). */
PW_MUST_CHECK int pw_evalrun_refuse(const pw_run *r, const pw_frame_hdr *h, pw_err *err);
/* pw_run_create: the forward-only list when the run evaluates. */
PW_MUST_CHECK int pw_evalrun_alloc(pw_run *r);
/* Compute thread, after the update of step sh.step: when it is due, the
 * eval passes; *loss gets this replica's share of the eval loss, *done 1.
 * Touches no gradient and no optimizer state. */
PW_MUST_CHECK int pw_evalrun(pw_run *r, double *loss, int *done);

/* ---- stepend.c ------------------------------------------------------------ */

PW_MUST_CHECK int pw_stepend_alloc(pw_run *r);     /* pw_run_create: DP and tied buffers */
void pw_stepend_free(pw_run *r);     /* what pw_stepend_alloc made (the stages still exist) */
/* Compute thread: the step end — phases 1-3 (pw_stepend_reduce) and the
 * update, checkpoints and the step report; ends with sh.step++. */
PW_MUST_CHECK int pw_stepend_run(pw_run *r);
/* Compute thread: the exchange of the step end — the data-parallel
 * all-reduce, the tied gradients, the global squared norm in *sqnorm —
 * leaving the summed gradients in the stage programs. */
PW_MUST_CHECK int pw_stepend_reduce(pw_run *r, double *sqnorm);
/* Compute thread: the pipeline ranks of the replica wait for each other
 * (the norm exchange with nothing to sum), at the end of an eval pass. */
PW_MUST_CHECK int pw_stepend_barrier(pw_run *r);
/* Where stage's checkpoint after step + 1 steps is written. */
void pw_stepend_ckpt_path(const pw_run *r, int step, int stage, char *buf, size_t cap);

/* ---- report.c: the messages a run sends the coordinator (loop thread) ----- */

void pw_report_step(pw_run *r, const pw_event *ev);  /* a step is complete */
void pw_report_ckpt(pw_run *r, const pw_event *ev);  /* where a stage's checkpoint went */
/* Compute thread, sh.mu held: REDUCE and TIED frames (run.c routes them). */
PW_MUST_CHECK int pw_stepend_frame(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);
PW_MUST_CHECK int pw_stepend_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err);

#endif
