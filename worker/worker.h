/* worker: the pipewright-worker daemon — its control link, its data
 * plane, and the run it is assigned (run.h).
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
 * reaches the action that needs it without waking another thread. run.h
 * says which of the run's state each thread owns; everything declared here
 * (pw_worker, pw_link, ctl.c and net.c) is the loop thread's alone. */
#ifndef PW_WORKER_H
#define PW_WORKER_H

#include "blasinfo.h"
#include "fetch.h"
#include "run.h"
#include "pin.h"
#include "sysres.h"

typedef struct pw_worker pw_worker;

/* ---- data-plane links ---------------------------------------------------- */

/* A TCP link to or from another worker. Outbound links carry this rank's
 * frames to a peer; inbound links carry the peer's frames here, after a
 * HELLO naming the job, the peer's rank and the cluster token. */
struct pw_link {
  uv_tcp_t tcp;
  pw_worker *w;
  int outbound;            /* 1: we connected (we send); 0: accepted (we read) */
  int peer_rank;           /* -1 until HELLO admitted (inbound) */
  uint64_t hello_job;      /* what the HELLO claimed (inbound): job, run (the epoch), rank */
  int hello_run;
  int hello_rank;
  int paused;              /* HELLO for a run not started yet: not reading */
  int draining;            /* its run is over: read to the peer's end */
  int connected;
  int closing;
  int handles;             /* libuv handles still to close before it is freed */
  /* Inbound links only: until admitted (and while draining), a link lives
   * until a deadline — HELLO within w->hello_timeout, the run of the job
   * it named within w->held_timeout, the peer's end within held_timeout —
   * and a held link whose peer hangs up is closed at once. */
  uv_timer_t timer;
  int timer_init;
  uint64_t deadline;       /* monotonic ms (uv_hrtime) */
  char addr[64];
  pw_frame_reader reader;  /* inbound */
  uv_connect_t connect_req;
  uv_shutdown_t shutdown_req;
  struct pw_link *next;    /* worker's list of links */
};

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
  atomic_int *pending;     /* a snapshot entry's count of writes reading it, or NULL */
} pw_send;

/* ---- the daemon ---------------------------------------------------------- */

struct pw_worker {
  uv_loop_t *loop;
  /* options */
  char name[64];
  char coord_host[256];
  int coord_port;
  char listen_host[64];
  int listen_port;         /* actual port after bind */
  double hello_timeout;    /* s an inbound link may take to say HELLO */
  double held_timeout;     /* s a link may wait for the run of the job its HELLO named, or to end */
  int threads;
  const struct pw_backend *backend; /* --device: where runs compute (cuda.h); NULL: the CPU */
  char state_dir[512];
  char token[PW_CONTROL_TOKEN_MAX + 1];
  pw_dscache *cache;       /* datasets fetched from the coordinator (fetch.h), or NULL */
  pw_blasinfo blas;        /* measured once at start, sent with every register */
  pw_sysres res;           /* the cores and memory this process may use (sysres.h), read at start */
  pw_pin pin;              /* its CPUs, and its threads on a run's (pin.h) */
  char host_id[PW_HOST_ID_MAX + 1]; /* its machine, for co-location (register.host) */
  char host_from[96];      /* where host_id came from, for the log */
  char hostname[64];       /* the machine's name, for display (register.hostname) */
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
  char http_url[512];      /* the coordinator's HTTP API (welcome's http_url), or "" */
  /* data plane */
  uv_tcp_t listener;
  pw_link *links;
  /* the current run, and the snapshots runs of its job left (snap.h) */
  pw_run *run;
  pw_snapstore snaps;
  /* shutdown */
  uv_signal_t sigint, sigterm;
  int stopping;
};

/* ctl.c */
PW_MUST_CHECK int pw_ctl_start(pw_worker *w);
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
 * rank `to` it is (-1: none), or into a snapshot entry whose *pending
 * counts the write until it is done, or is owned and freed after the
 * write. */
PW_MUST_CHECK int pw_net_send_encoded(pw_link *l, pw_run *run, const uint8_t hdr[PW_FRAME_HDR_SIZE],
                                      const void *payload, uint64_t len, uint64_t off, int to, int li, int slot,
                                      atomic_int *pending, void *owned);

#endif
