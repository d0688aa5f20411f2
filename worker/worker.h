/* worker: the pipewright-worker daemon's shared types.
 *
 * One libuv loop owns everything: the control link to the coordinator
 * (ctl.c), the data-plane listener and the links to peer workers (net.c),
 * and at most one run — an assignment of one job's rank — whose executor
 * (run.c) walks the rank's action list, handing each action's compute to
 * the thread pool (exec.c) so that receiving the next activation and
 * sending the last result overlap compute. Step ends (gradient all-reduce,
 * tied gradients, the global norm, the optimizer step, checkpoints) are in
 * stepend.c. Only the executor's work callbacks run off the loop thread,
 * and they touch only the program slots and parameters they were given. */
#ifndef PW_WORKER_H
#define PW_WORKER_H

#include <jansson.h>
#include <stdint.h>
#include <uv.h>

#include "control.h"
#include "data.h"
#include "model.h"
#include "partition.h"
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

/* One frame being written: header bytes, then the payload in place. */
typedef struct {
  uv_write_t req;
  uint8_t hdr[PW_FRAME_HDR_SIZE];
  pw_run *run;             /* NULL when the run is gone */
  int li, slot;            /* slot whose memory the payload points into, or -1 */
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
  /* data-parallel replicas' gradient arenas, [dp] (own replica NULL) */
  float **dp_buf;
  int *dp_step;            /* [dp] step of the arena received */
} pw_lstage;

typedef enum {
  PW_RUN_CONNECTING,       /* outbound links being made */
  PW_RUN_ACTIONS,          /* walking the action list */
  PW_RUN_DP,               /* waiting for replicas' gradients */
  PW_RUN_TIED,             /* waiting for tied-parameter gradients */
  PW_RUN_NORM,             /* waiting for the global gradient norm */
  PW_RUN_UPDATE,           /* optimizer / checkpoint in the pool */
  PW_RUN_FAILED,
  PW_RUN_DONE
} pw_run_phase;

/* A sampled action timing, for the step report's timeline. */
typedef struct {
  pw_action a;
  double start, end;       /* seconds from the step's start */
} pw_timing;

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
  pw_job spec;
  pw_model model;
  pw_partition part;
  pw_sched *sched;
  pw_dataset *ds;
  int m, mb_size, S;
  int *rank_of_stage;      /* [S] pipeline rank */
  int *lidx_of_stage;      /* [S] local stage index or -1 */
  pw_lstage *ls;
  int n_ls;
  const pw_action *acts;   /* this rank's list */
  int n_acts;
  /* peers: global rank -> outbound link and address */
  pw_link **out;           /* [n_ranks] */
  char (*peer_addr)[64];   /* [n_ranks] */
  int n_out_needed, n_out_connected;
  /* executor */
  pw_run_phase phase;
  int step;                /* current step */
  int pc;                  /* next action index */
  int busy;                /* a work item is in the pool */
  uv_work_t work;
  int work_pc;             /* first action of the unit in flight */
  int work_n;              /* actions in the unit (2 for a fused pair) */
  int work_rc;
  float work_loss;
  double t_step0;          /* monotonic time the step began */
  double loss_sum;         /* this replica's share of the step loss */
  int act_held, peak_act;  /* saved activations now / peak this run */
  pw_timing *timings;      /* [n_acts] */
  /* step end */
  int tied_got;            /* tied gradients received this step */
  int tied_needed;
  float **tied_buf;        /* [n_shared * n_ranks_of_holders] received copies */
  double norm_partial_sum; /* root: sum of partial squared norms so far */
  int norm_partials;
  double *norm_parts;      /* [pp] root: partial from each pipeline rank */
  int *norm_parts_step;
  double norm_total;
  int norm_total_step;
  int norm_have_total;
  float clip_coef;
  double lr;
  char error[512];
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
int pw_net_listen(pw_worker *w);
void pw_net_stop(pw_worker *w);
pw_link *pw_net_connect(pw_worker *w, const char *addr, int peer_rank);
/* Inbound links held for run r's job are admitted and read from. */
void pw_net_run_started(pw_worker *w, pw_run *r);
int pw_net_admit(pw_link *l, pw_run *r, pw_err *err);
void pw_link_close(pw_link *l);
/* Send BYE (with `reason` when aborting, NULL for an orderly end), let
 * queued frames drain, then close. */
void pw_link_bye(pw_link *l, uint64_t job, const char *reason);
/* Queue one frame on an outbound link. payload points into slot (li, slot)
 * of the run (or is owned and freed after the write when `owned`). */
int pw_net_send(pw_link *l, pw_run *run, const pw_frame_hdr *h, const void *payload, int li,
                int slot, void *owned);

/* run.c */
int pw_run_start(pw_worker *w, json_t *assign, pw_err *err);
void pw_run_cancel(pw_run *r, const char *reason);
void pw_run_fail(pw_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pw_run_on_link_up(pw_run *r, pw_link *l);
void pw_run_on_link_down(pw_run *r, pw_link *l, const char *why);
/* A frame header from peer `from` arrived: where should its payload go?
 * Returns 0 and sets *dst (NULL = reader's own buffer), or a negative code
 * with err filled (the link is then closed). */
int pw_run_frame_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
/* The frame's payload is complete (at the dest given, or in payload). */
int pw_run_frame_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);
void pw_run_send_done(pw_run *r, int li, int slot);
/* The step's update is done: report, then the next step or done. */
void pw_run_step_complete(pw_run *r);
void pw_run_free(pw_run *r);

/* exec.c: compute of one unit (an action, or a fused pair) in the pool. */
void pw_exec_work(uv_work_t *req);
double pw_now(void);

/* stepend.c */
void pw_stepend_begin(pw_run *r);
int pw_stepend_frame(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);
int pw_stepend_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err);

#endif
