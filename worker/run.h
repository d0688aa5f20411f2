/* run: one assignment of a worker — a rank of a job — and who owns what.
 *
 * Two threads work on a run. The loop thread (libuv) starts and ends it,
 * keeps its outbound links and writes what a socket would not take at
 * once (run.c). The compute thread (exec.c) walks the rank's action list
 * step after step, reads its inbound links itself (recv.c, routing each
 * frame by its kind: route.c) and does the step end (stepend.c). Its
 * subsystems — the data-parallel exchange (dpx), the tensor-parallel
 * all-reduces (tpx), the pipeline's tied gradients and norm (pipex),
 * snapshots (snaprun), evaluation (evalrun), serving (serve) — each own
 * their state and see the run only through its context (rctx.h).
 * The run's own state is split by owner, so every access names whose
 * field it touches:
 *   - the top level: set while the run is made (pw_run_create), read by
 *     both threads, written by neither afterwards (the subsystems are the
 *     compute thread's once it runs);
 *   - sh (pw_run_shared): both threads, under sh.mu (sh.out.link under sh.out.mu;
 *     sh.wake_fd and sh.abort need no lock);
 *   - cp (pw_run_compute): the compute thread only;
 *   - lp (pw_run_loop): the loop thread only.
 * A run can be made and driven without a worker daemon (pw_run_create with
 * any libuv loop and no host; the tests do), and the daemon makes its runs
 * the same way and hands them a host (pw_run_host). */
#ifndef PW_RUN_H
#define PW_RUN_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "control.h"
#include "data.h"
#include "dpx.h"
#include "evalrun.h"
#include "event.h"
#include "fetch.h"
#include "pipex.h"
#include "rctx.h"
#include "snaprun.h"
#include "tpx.h"
#include "wire.h"

typedef struct pw_link pw_link;
typedef struct pw_run pw_run;
typedef struct pw_serve pw_serve;

/* What the daemon does for its run (net.c, ctl.c fill it in; a run
 * without a daemon has none: its messages are dropped, its frames have no
 * link to go to). Loop thread. */
typedef struct {
  void *arg;               /* the daemon */
  /* A message to the coordinator (steals it). */
  void (*ctl_send)(void *arg, json_t *msg);
  /* Queue one encoded frame on outbound link l (net.h's pw_net_send_encoded). */
  int (*send)(pw_link *l, pw_run *r, const uint8_t hdr[PW_FRAME_HDR_SIZE], const void *payload, uint64_t len,
              uint64_t off, int to, int li, int slot, atomic_int *pending);
  /* BYE on l (with reason when aborting), then close it once drained. */
  void (*bye)(pw_link *l, uint64_t job, const char *reason);
  /* The run's inbound links read to their end, then closed. */
  void (*drain_in)(void *arg, pw_run *r);
  /* The run is over: the daemon is free for the next assignment. */
  void (*released)(void *arg, pw_run *r);
  int threads;             /* compute threads a run of this daemon uses */
  const struct pw_backend *backend; /* where its stage programs run (backend.h); NULL: the CPU */
  int cores;               /* cores the daemon may use (sysres.h); 0: read them (a run without one) */
  pw_dscache *cache;       /* stored datasets and weights (fetch.h), or NULL */
  pw_snapstore *snaps;     /* the worker's in-memory snapshots, or NULL */
  const char *http_url;    /* the coordinator's HTTP API, or NULL */
  const char *token;       /* the cluster token */
} pw_run_host;

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

/* An inbound link as the compute thread reads it (recv.c). */
typedef struct {
  int fd;                  /* -1 until admitted, and after the peer's orderly end */
  int bye;                 /* the peer said goodbye */
  pw_frame_reader rd;
} pw_inlink;

/* A peer as the assignment names it. */
typedef struct {
  char addr[64];           /* host:port of its data plane */
  char host[64];           /* its machine (assign.peers[].host) */
} pw_peer;

/* Both threads, under mu (out under out.mu; wake_fd and abort without a lock). */
typedef struct {
  uv_mutex_t mu;
  int wake_fd;             /* eventfd: the loop wakes the compute thread from poll() */
  atomic_int abort;        /* loop -> compute: stop at the next wait */
  pw_lstage_shared *ls;    /* [n_ls] slots of each local stage */
  int step;                /* current step (written by compute) */
  int stop_at;             /* loop -> compute: end after this many steps (a drain: pw_run_stop_at); 0: none */
  struct {                 /* compute -> loop events, a ring */
    pw_event *q;
    int head, len, cap;
  } ev;
  struct {                 /* why the run failed */
    char error[512];       /* said by the compute thread (or the loop's pw_run_fail) */
    int lost_rank;         /* the peer whose link broke, when that failed the run; else -1 */
    int aborted_rank;      /* the peer whose abort (BYE with a reason) failed the run; else -1 */
  } why;
  struct {                 /* traced steps' timings travel to the loop in these (event.h) */
    pw_timing *buf;        /* [PW_TRACE_BUFS * n_acts] */
    int busy[PW_TRACE_BUFS]; /* a report still reads that one */
  } trace;
  int *in_fd;              /* [n_ranks] sockets of admitted inbound links, or -1 */
  /* Outbound links as the compute thread writes them, under out.mu: it
   * writes a frame straight to the socket when the loop has nothing queued
   * on that link; what the socket does not take goes to the loop. */
  struct {
    uv_mutex_t mu;
    struct {
      int fd;              /* -1 until the link is up, and once it closes */
      int queued;          /* frames the loop is still writing */
    } *link;               /* [n_ranks] */
  } out;
} pw_run_shared;

/* The compute thread only. */
typedef struct {
  pw_lstage_compute *ls;   /* [n_ls] microbatches of each local stage */
  struct {                 /* its links (recv.c, exec.c's sends) */
    pw_inlink *in;         /* [n_ranks] inbound links it reads */
    size_t chunk_limit;    /* frames over this many payload bytes go in chunks (wire.h; PW_WIRE_CHUNK) */
    uint64_t chunked, chunks; /* tensors sent in chunks, and their chunks */
    uint64_t act_sent, act_bytes; /* activation frames sent to other ranks, their payload bytes */
    double spin;           /* seconds a wait polls its links before it sleeps */
    double waited;         /* seconds pw_exec_wait has blocked, all told */
    int sleeps, sleeps_told; /* waits that slept in poll() (each paid a wake-up), and those reported */
  } io;
  double t_step0;          /* monotonic time the step began */
  int last;                /* the run ends after this many steps: cfg.steps, or sh.stop_at as it was when
                              sh.step last changed (so every rank decides a step's checkpoint alike) */
  /* Frames of ACT, GRAD, TIED and NORM are tagged with the pass they
   * belong to, not the step: a step's pass, then the eval passes of
   * train.eval_every each have a tag of their own (evalrun.c); without
   * eval the tag is the step. The data-parallel frames keep the step. */
  int tag;
  double loss_sum;         /* this replica's share of the pass's loss */
  int act_held, peak_act;  /* saved activations now / peak this run */
  pw_timing *timings;      /* [n_acts] of the step being run */
} pw_run_compute;

/* The loop thread only. */
typedef struct {
  struct {
    pw_link **link;        /* [n_ranks] outbound link to each peer */
    int needed, connected; /* the compute thread starts once all are up */
  } out;
  uv_thread_t thread;
  uv_async_t async;        /* compute -> loop: events queued */
  int async_init;
  int started;             /* all links up, compute thread running */
  int thread_running;      /* created and not yet joined */
  int closing;             /* being torn down */
  int sends_inflight;
} pw_run_loop;

struct pw_run {
  pw_rctx cx;              /* what the subsystems see (cx.run is this run) */
  pw_runcfg cfg;           /* the slice and the assignment */
  pw_run_host host;        /* the daemon's side (all NULL: none) */
  json_t *assign;          /* the assignment message (owned; cfg's strings point into it), or NULL */
  pw_peer *peers;          /* [n_ranks] */
  struct {                 /* the dataset (opened by the compute thread: run_files.c) */
    pw_dataset *ds;
    pw_dscache *cache;     /* where a stored dataset comes from (NULL for a run without a daemon) */
    int held;              /* its cache entry is held (released when the run is freed) */
  } data;
  /* the subsystems */
  pw_dpx dpx;              /* dp > 1 and training */
  pw_tpx tpx;              /* tp > 1 */
  pw_pipex pipex;
  pw_snaprun snap;
  pw_evalrun eval;
  pw_serve *serve;         /* mode serve, else NULL */

  pw_run_shared sh;        /* both threads: under sh.mu / sh.out.mu */
  pw_run_compute cp;       /* compute thread only */
  pw_run_loop lp;          /* loop thread only */
};
/* tests/layers/check_layers.py counts the fields above (those of sh, cp and
 * lp too): at most PW_RUN_FIELDS_MAX. A run's state that is not the whole
 * run's belongs to a subsystem. */
#define PW_RUN_FIELDS_MAX 44

/* ---- run_setup.c, run.c, run_files.c: the run's life ---------------------- */

/* Loop thread (run_setup.c). Makes the run of assignment a (as: the
 * message itself, kept for the run's life, or NULL when a's strings
 * outlive the run) from its slice: the tables, the stage programs and
 * their slots, the subsystems; its event queue wakes `loop`. Opens no
 * file (pw_run_open_files does, on the compute thread) and connects
 * nothing (the daemon does: ctl.c). ckpt_dir: where checkpoints go when a
 * names none. host: the daemon's side, or NULL. */
PW_MUST_CHECK int pw_run_create(uv_loop_t *loop, const pw_msg_assign *a, const json_t *as, const char *ckpt_dir,
                                const pw_run_host *host, pw_run **out, pw_err *err);
/* Compute thread (run_files.c), before the first step: the dataset and
 * the parameters (from the checkpoint to resume, else from the init
 * weights fetched through the cache, else drawn from the seed). Only
 * regular files are read (a FIFO or a device is refused, never waited on). */
PW_MUST_CHECK int pw_run_open_files(pw_run *r, pw_err *err);
/* Loop thread (run.c). */
void pw_run_cancel(pw_run *r, const char *reason);
/* Loop thread: a drain — the run ends after `steps` steps, with that
 * step's checkpoint, as if they were all it had. Taken only while the
 * compute thread has not begun step `steps` (it reads sh.stop_at into
 * cp.last under sh.mu when sh.step changes, before it begins a step): 0,
 * else PW_ECONFLICT with why (that step has begun: the run cannot stop there
 * the way its peers will). steps >= cfg.steps changes nothing. */
int pw_run_stop_at(pw_run *r, int steps, char *why, size_t cap);
/* Compute thread, sh.mu held: cp.last from sh.stop_at. */
static inline void pw_run_take_stop(pw_run *r) {
  r->cp.last = r->sh.stop_at > 0 && r->sh.stop_at < r->cfg.steps ? r->sh.stop_at : r->cfg.steps;
}
void pw_run_fail(pw_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Outbound link to rank k is up (NULL: none needed); the compute thread
 * starts once all are. */
void pw_run_on_link_up(pw_run *r, int k, int fd);
void pw_run_on_link_down(pw_run *r, int k, int outbound, const char *addr, const char *why);
void pw_run_send_done(pw_run *r, int to, int li, int slot);
/* Inbound link from rank k was admitted; its socket fd is now the
 * compute thread's. */
void pw_run_link_in(pw_run *r, int k, int fd);
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

/* Loop thread: a message to the coordinator (steals it; dropped without
 * a daemon). */
static inline void pw_run_tell(pw_run *r, json_t *msg) {
  if (r->host.ctl_send) r->host.ctl_send(r->host.arg, msg);
  else json_decref(msg);
}

/* ---- slots.c: activation slots and the partition's tables --------------------- */

/* Compute thread, sh.mu held: the slot of local stage li that holds
 * microbatch mb, claimed (and made) on first use; a negative code when
 * none is free. Release returns it once the sends reading it are done. */
PW_MUST_CHECK int pw_run_slot_for(pw_run *r, int li, int mb, pw_err *err);
void pw_run_slot_release(pw_run *r, int li, int mb);
/* Loop thread: a write reading slot (li, slot) is done. */
void pw_run_slot_sent(pw_run *r, int li, int slot);
/* The stage that produces / consumes value v (chain models: one each). */
int pw_run_producer(const pw_run *r, int value);
int pw_run_consumer(const pw_run *r, int value);

/* ---- route.c: where each peer frame goes, by its kind ------------------------ */

/* Compute thread (io.c): a frame header from peer `from` arrived: where
 * should its payload go? Returns 0 and sets *dst (NULL = reader's own
 * buffer), or a negative code with err filled (the run then fails). */
PW_MUST_CHECK int pw_route_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
/* Compute thread: the frame's payload is complete (at the dest given, or
 * in payload). */
PW_MUST_CHECK int pw_route_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);

/* ---- io.c: the compute thread's links, events and failure ---------------------- */

/* Reads the inbound links until ready(arg) holds (spinning a little, then
 * sleeping in poll; a due snapshot is taken first), or the run is aborted
 * (PW_ECANCELED) or a link fails (said). */
PW_MUST_CHECK int pw_exec_wait(pw_run *r, pw_rctx_ready_fn ready, void *arg);
/* Before the first wait: cp.io.spin, 0 when the host has fewer CPUs than
 * the run's compute threads on it. */
void pw_exec_spin_init(pw_run *r);
/* Whether ranks a and b run on one machine: 1 when the coordinator named
 * one host for both (assign.peers[].host), whatever addresses reach them. */
int pw_exec_same_host(const pw_run *r, int a, int b);
/* Any thread: wake the compute thread from poll(). */
void pw_exec_wake(pw_run *r);
/* Queue a frame to rank `to` (CRC computed here); a payload over
 * cp.io.chunk_limit goes as consecutive chunk frames. payload stays valid
 * until the write is done: it points into slot (li, slot), which is kept
 * until then, or into a run-owned buffer (li -1), or a snapshot entry
 * whose *pending counts each frame the loop still writes. */
PW_MUST_CHECK int pw_exec_send(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, int li, int slot,
                               atomic_int *pending);
/* Queue an event for the loop thread. */
PW_MUST_CHECK int pw_exec_post(pw_run *r, const pw_event *ev);
/* Record why the run failed (err may be NULL) and return rc. */
PW_MUST_CHECK int pw_exec_fail(pw_run *r, int rc, const pw_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* cp.io.chunk_limit from PW_WIRE_CHUNK (or the default). */
PW_MUST_CHECK int pw_exec_chunk_limit(pw_run *r);
/* The run's context's functions (pw_run_create fills cx with them). */
void pw_exec_bind(pw_run *r);

/* ---- exec.c: the compute thread --------------------------------------------- */

void pw_exec_main(void *arg);
/* One training step of sh.step: its actions, the step end's exchange and
 * update, the eval passes when due, the report and checkpoints. */
PW_MUST_CHECK int pw_exec_step(pw_run *r);
/* One pass of an action list (the step's, or in an eval pass the
 * forward-only list), waiting for each action's inputs. */
PW_MUST_CHECK int pw_exec_actions(pw_run *r, const pw_action *acts, int n_acts);

/* ---- stepend.c, ckptrun.c: the step end --------------------------------------- */

/* The exchange of the step end — the data-parallel all-reduce, the tied
 * gradients, the global squared norm in *sqnorm — leaving the summed
 * gradients in the stage programs; then the update (the step's learning
 * rate in *lr). */
PW_MUST_CHECK int pw_stepend_update(pw_run *r, double *sqnorm, double *lr);
/* The rest of the step end, after any eval passes: the step report (ev,
 * filled in here), checkpoints, gradients zeroed, sh.step++. */
PW_MUST_CHECK int pw_stepend_finish(pw_run *r, pw_event *ev);
/* The exchange part of pw_stepend_update alone (tests). */
PW_MUST_CHECK int pw_stepend_reduce(pw_run *r, double *sqnorm);
/* Where stage's checkpoint after step + 1 steps is written. */
void pw_ckptrun_path(const pw_run *r, int step, int stage, char *buf, size_t cap);
/* The checkpoints due after sh.step's update: written, uploaded, reported. */
PW_MUST_CHECK int pw_ckptrun(pw_run *r);

/* ---- report.c: the messages a run sends the coordinator (loop thread) ----- */

void pw_report_step(pw_run *r, const pw_event *ev);  /* a step is complete */
void pw_report_ckpt(pw_run *r, const pw_event *ev);  /* where a stage's checkpoint went */

#endif
