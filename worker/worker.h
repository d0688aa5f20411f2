/* worker: the pipewright-worker daemon's shared types.
 *
 * Two threads. The libuv loop thread keeps the control link to the
 * coordinator (ctl.c), the data-plane listener, link setup and HELLOs
 * (net.c), and whatever a full socket would not take at once. The run's
 * compute thread (exec.c) walks the rank's action list step after step:
 * it reads its inbound links itself while it waits for an input (recv.c),
 * straight into program slots; computes each action the moment its inputs
 * are in; hands outputs on (a memcpy to a local stage, or a frame it
 * writes to the socket itself); and does the step end (stepend.c:
 * all-reduce, tied gradients, global norm, optimizer, checkpoints). So
 * consecutive actions never wait for a thread hand-off, and a frame
 * reaches the action that needs it without waking another thread. What
 * both threads touch is under pw_run.mu (slots) or wmu (outbound sockets);
 * the compute thread tells the loop what to do through an event queue and
 * a uv_async_t, the loop wakes it through an eventfd. */
#ifndef PW_WORKER_H
#define PW_WORKER_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "control.h"
#include "data.h"
#include "model.h"
#include "partition.h"
#include "plan.h"
#include "prog.h"
#include "schedule.h"
#include "spec.h"
#include "wire.h"

typedef struct pw_worker pw_worker;
typedef struct pw_run pw_run;

/* ---- data-plane links ---------------------------------------------------- */

/* A TCP link to or from another worker. Outbound links carry this rank's
 * frames to a peer; inbound links carry the peer's frames here, after a
 * HELLO naming the job, the peer's rank and the cluster token. */
typedef struct pw_link {
  uv_tcp_t tcp;
  pw_worker *w;
  int outbound;            /* 1: we connected (we send); 0: accepted (we read) */
  int peer_rank;           /* -1 until HELLO admitted (inbound) */
  uint64_t hello_job;      /* what the HELLO claimed (inbound) */
  int hello_rank;
  int paused;              /* HELLO for a run not started yet: not reading */
  int connected;
  int closing;
  char addr[64];
  pw_frame_reader reader;  /* inbound */
  uv_connect_t connect_req;
  uv_shutdown_t shutdown_req;
  struct pw_link *next;    /* worker's list of links */
} pw_link;

/* One frame being written by the loop: header bytes, then the payload in
 * place (from byte `off` of the two: the compute thread may have written
 * the start itself). */
typedef struct {
  uv_write_t req;
  uint8_t hdr[PW_FRAME_HDR_SIZE];
  pw_run *run;             /* NULL when the run is gone */
  int to;                  /* the run's rank whose link it is, or -1 (HELLO, BYE) */
  int li, slot;            /* slot whose memory the payload points into, or -1 */
  int hello;               /* the run's link is up once this is written */
  void *owned;             /* payload copy freed after the write, or NULL */
} pw_send;

/* ---- the run ------------------------------------------------------------- */

/* Per local stage: its program and the bookkeeping of its microbatches. */
typedef struct {
  int stage;               /* global stage id */
  pw_prog *prog;
  int *mb_slot;            /* [m] slot holding microbatch mb, or -1 */
  int *slot_busy;          /* [max_slots] 1 while a microbatch or a send holds it */
  int *slot_sends;         /* [max_slots] writes still reading the slot */
  int *slot_free_pending;  /* [max_slots] released by compute, waiting on sends */
  int *act_step, *act_got; /* [m] step tag and activation inputs arrived */
  int *grad_step, *grad_got; /* [m] step tag and output gradients arrived */
  int n_act_in;            /* activation input ports (from other stages) */
  int n_grad_in;           /* output ports (their gradients come back) */
  int first_input;         /* holds the model's input (draws inputs) */
  int has_target;          /* holds the targets (draws targets) */
  /* data-parallel gradient arenas, [pw_dp_arenas(dp)] indexed by
   * pw_dp_arena (plan.h) */
  float **dp_buf;
  int *dp_step;            /* step of the arena received, same index */
} pw_lstage;

/* A sampled action timing, for the step report's timeline. */
typedef struct {
  pw_action a;
  double start, end;       /* seconds from the step's start */
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
  PW_EV_FAIL,              /* failed with r->error */
  PW_EV_EXIT               /* the compute thread has returned */
} pw_event_kind;

typedef struct {
  pw_event_kind kind;
  /* SEND */
  int to;                  /* global rank */
  int li, slot;            /* slot the payload points into, or -1 */
  const void *payload;
  uint64_t len;            /* payload bytes */
  uint64_t off;            /* bytes of header + payload already written */
  uint8_t hdr[PW_FRAME_HDR_SIZE];
  /* STEP */
  int step, peak_act, has_loss, ckpt;
  double step_time, loss, grad_norm, lr;
  pw_timing *timings;      /* [n_acts] on traced steps (one of trace_buf's), else NULL */
} pw_event;

struct pw_run {
  pw_worker *w;
  json_t *assign;          /* the assignment message (owned) */
  uint64_t job;
  int run_id;
  int rank;                /* global rank: replica * pp + pipeline rank */
  int prank, replica;      /* pipeline rank, data-parallel replica */
  int pp, dp, n_ranks;
  int steps, start_step, trace_every;
  char ckpt_dir[512];
  /* From the assignment's slice (lib/plan/slice.h), never rebuilt here:
   * spec holds only mode, train and data (the worker never sees the model
   * spec); model is the compiled graph; part the partition as far as this
   * rank uses it; sched stage -> rank and only this rank's action list. */
  pw_job spec;
  pw_model model;
  pw_partition part;
  pw_sched *sched;
  int *peak_slots;         /* [n_ls] activation slots each local stage grows to (the plan's) */
  size_t mem_budget;       /* bytes the plan gives this pipeline rank */
  char plan_sha256[65];    /* the plan the slice was cut from */
  pw_dataset *ds;
  int m, mb_size, S;
  int *rank_of_stage;      /* [S] pipeline rank */
  int *lidx_of_stage;      /* [S] local stage index or -1 */
  pw_lstage *ls;
  int n_ls;
  const pw_action *acts;   /* this rank's list */
  int n_acts;
  /* peers: global rank -> outbound link and address (loop thread) */
  pw_link **out;           /* [n_ranks] */
  char (*peer_addr)[64];   /* [n_ranks] */
  int n_out_needed, n_out_connected;
  int started;             /* all links up, compute thread running */

  /* ---- shared by both threads: under mu, but for wake_fd and abort ---- */
  uv_mutex_t mu;
  int wake_fd;             /* eventfd: the loop wakes the compute thread from poll() */
  atomic_int abort;        /* loop -> compute: stop at the next wait */
  int *in_fd;              /* [n_ranks] sockets of admitted inbound links, or -1 */
  int step;                /* current step (written by compute) */
  pw_event *evq;           /* compute -> loop events, a ring */
  int evq_head, evq_len, evq_cap;
  char error[512];         /* why the compute thread failed */
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

  /* ---- compute thread only ---- */
  uv_thread_t thread;
  size_t chunk_limit;      /* frames over this many payload bytes go in chunks (wire.h; PW_WIRE_CHUNK) */
  uint64_t chunked, chunks; /* tensors sent in chunks, and their chunks */
  pw_inlink *in;           /* [n_ranks] inbound links it reads (recv.c) */
  double t_step0;          /* monotonic time the step began */
  double loss_sum;         /* this replica's share of the step loss */
  int act_held, peak_act;  /* saved activations now / peak this run */
  pw_timing *timings;      /* [n_acts] */
  pw_tied_bufs *tied;      /* [n_shared] step-end buffers of the shared parameters held here (plan.h) */
  int tied_needed;         /* remote holders' copies to wait for per step */
  int tied_step, tied_got; /* tied gradients received for tied_step */
  double *norm_parts;      /* [2 * pp] partial of each pipeline rank, by step parity */
  int *norm_parts_step;
  double norm_out[2];      /* our partial being sent, by step parity */
  double lr;               /* of the step being ended */

  /* ---- loop thread only ---- */
  uv_async_t async;        /* compute -> loop: events queued */
  int async_init;
  int thread_running;      /* created and not yet joined */
  int closing;             /* being torn down */
  int sends_inflight;
};

/* ---- the daemon ---------------------------------------------------------- */

struct pw_worker {
  uv_loop_t *loop;
  /* options */
  char name[64];
  char coord_host[256];
  int coord_port;
  char listen_host[64];
  int listen_port;         /* actual port after bind */
  int threads;
  char state_dir[512];
  char token[PW_CONTROL_TOKEN_MAX + 1];
  /* control link */
  uv_tcp_t ctl;
  uv_connect_t ctl_connect;
  int ctl_state;           /* 0 down, 1 connecting, 2 registered */
  int ctl_closing;
  pw_control_reader ctl_reader;
  uv_timer_t heartbeat;
  uv_timer_t reconnect;
  double heartbeat_interval;
  int backoff_ms;
  int worker_id;
  /* data plane */
  uv_tcp_t listener;
  pw_link *links;
  /* the current run */
  pw_run *run;
  /* shutdown */
  uv_signal_t sigint, sigterm;
  int stopping;
};

/* ctl.c */
int pw_ctl_start(pw_worker *w);
void pw_ctl_stop(pw_worker *w);
/* Sends a message to the coordinator (dropped with a warning if the link is
 * down). Steals the reference. */
void pw_ctl_send(pw_worker *w, json_t *msg);

/* net.c */
PW_MUST_CHECK int pw_net_listen(pw_worker *w);
void pw_net_stop(pw_worker *w);
pw_link *pw_net_connect(pw_worker *w, const char *addr, int peer_rank);
/* Inbound links held for run r's job are admitted and read from. */
void pw_net_run_started(pw_worker *w, pw_run *r);
PW_MUST_CHECK int pw_net_admit(pw_link *l, pw_run *r, pw_err *err);
void pw_link_close(pw_link *l);
/* Read inbound link l to its end, discarding, then close it. */
void pw_link_drain(pw_link *l);
/* Send BYE (with `reason` when aborting, NULL for an orderly end), let
 * queued frames drain, then close. */
void pw_link_bye(pw_link *l, uint64_t job, const char *reason);
/* Queue one frame (its 64 header bytes encoded) on an outbound link, from
 * byte `off` of header + payload (the compute thread may have written the
 * start). payload points into slot (li, slot) of the run, whose link to
 * rank `to` it is (-1: none), or is owned and freed after the write. */
PW_MUST_CHECK int pw_net_send_encoded(pw_link *l, pw_run *run, const uint8_t hdr[PW_FRAME_HDR_SIZE],
                                      const void *payload, uint64_t len, uint64_t off, int to, int li, int slot,
                                      void *owned);

/* run.c (loop thread unless said otherwise) */
/* a: the assign message read (control.h), as: the message itself (kept for
 * the run's life: a's strings point into it). */
int pw_run_start(pw_worker *w, const pw_msg_assign *a, const json_t *as, pw_err *err);
void pw_run_cancel(pw_run *r, const char *reason);
void pw_run_fail(pw_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pw_run_on_link_up(pw_run *r, pw_link *l);
void pw_run_on_link_down(pw_run *r, pw_link *l, const char *why);
/* Compute thread (recv.c): a frame header from peer `from` arrived: where
 * should its payload go? Returns 0 and sets *dst (NULL = reader's own
 * buffer), or a negative code with err filled (the run then fails). */
int pw_run_frame_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
/* The frame's payload is complete (at the dest given, or in payload). */
int pw_run_frame_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);
void pw_run_send_done(pw_run *r, int to, int li, int slot);
/* Inbound link l's HELLO was admitted; its socket is now the compute
 * thread's. */
void pw_run_link_in(pw_run *r, pw_link *l);
/* The step the run is at (for status lines). */
int pw_run_step(pw_run *r);
void pw_run_free(pw_run *r);
/* Either thread, r->mu held: the slot of local stage li that holds
 * microbatch mb, claimed (and made) on first use; a negative code when
 * none is free. Release returns it once the sends reading it are done. */
int pw_run_slot_for(pw_run *r, int li, int mb, pw_err *err);
void pw_run_slot_release(pw_run *r, int li, int mb);
/* Tables of the partition (immutable during the run). */
int pw_run_producer(const pw_run *r, int value);
int pw_run_consumer(const pw_run *r, int value);
int pw_run_global_rank(const pw_run *r, int stage);

/* exec.c: the compute thread. */
void pw_exec_main(void *arg);
/* recv.c, compute thread: reads the inbound links until ready(r, arg)
 * holds (spinning a little, then sleeping in poll), or the run is aborted
 * (PW_ECANCELED) or a link fails (r->error set). */
PW_MUST_CHECK int pw_exec_wait(pw_run *r, int (*ready)(pw_run *, const void *), const void *arg);
/* Any thread: wake the compute thread from poll(). */
void pw_exec_wake(pw_run *r);
/* Queue a frame to rank `to` (CRC computed here, on the compute thread);
 * a payload over r->chunk_limit goes as consecutive chunk frames. payload
 * stays valid until the write is done: it points into slot (li, slot),
 * which is kept until then, or into a run-owned buffer (li -1). */
PW_MUST_CHECK int pw_exec_send(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, int li, int slot);
/* Queue an event for the loop thread. */
PW_MUST_CHECK int pw_exec_post(pw_run *r, const pw_event *ev);
/* Record why the run failed (err may be NULL) and return rc. */
PW_MUST_CHECK int pw_exec_fail(pw_run *r, int rc, const pw_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
double pw_now(void);

/* stepend.c */
int pw_stepend_alloc(pw_run *r);     /* at run start: DP and tied buffers */
void pw_stepend_free(pw_run *r);     /* what pw_stepend_alloc made (the stages still exist) */
int pw_stepend_run(pw_run *r);       /* compute thread: the step end, ends with step++ */
void pw_stepend_report(pw_run *r, const pw_event *ev); /* loop thread */
int pw_stepend_frame(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);
int pw_stepend_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err);

#endif
