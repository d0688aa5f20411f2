/* rctx: a run as its subsystems see it — its place in the mesh, its
 * stages, its configuration, and the four things they may ask of it.
 *
 * The data-parallel exchange (dpx.h, gradrs.h), the tensor-parallel
 * all-reduces (tpx.h), the pipeline's tied gradients and norm (pipex.h),
 * snapshots (snaprun.h), evaluation (evalrun.h) and serving (serve.h) each
 * own a struct of their own and hold a pointer to this context, never the
 * run (run.h): they send frames, wait for theirs, fail the run and post
 * events to the loop thread through the functions here, which the run
 * fills in (exec.c). So a subsystem's file reads knowing only its header
 * and this one, and its unit test drives it with a context of its own —
 * fake functions, socketpairs — without a run. Everything here is set when
 * the run is made and read-only afterwards, except the two counters the
 * compute thread advances (step, tag), which only it reads through here.
 *
 * All functions are the compute thread's. */
#ifndef PW_RCTX_H
#define PW_RCTX_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "event.h"
#include "partition.h"
#include "prog.h"
#include "schedule.h"
#include "slice.h"
#include "wire.h"

/* Per local stage, what does not change during the run: its program (whose
 * contents the compute thread alone touches) and its ports. */
typedef struct {
  int stage;               /* global stage id */
  pw_prog *prog;
  int n_act_in;            /* activation input ports (from other stages) */
  int n_grad_in;           /* output ports (their gradients come back) */
  int first_input;         /* holds the model's input (draws inputs) */
  int has_target;          /* holds the targets (draws targets) */
} pw_lstage;

/* The run's configuration: its slice of the plan, decoded (mode, train,
 * data, the compiled graph, the partition as far as this rank uses it,
 * stage -> rank and this rank's action list), and what its assignment adds.
 * The worker never sees the model spec and never re-plans. */
typedef struct {
  pw_slice sl;             /* tp > 1: sl.model is the group's graph (tpx.c), split shapes */
  int steps, start_step, trace_every;
  char ckpt_dir[512];      /* where checkpoints go (absolute) */
  const char *resume;      /* checkpoint to resume from (into the assign), or NULL */
  const char *upload_token; /* the assign's: sent with each checkpoint shard (NULL: none) */
  /* Where a stored dataset or init weights come from: the coordinator's
   * HTTP API and the cluster token ("" / NULL for a run without a daemon). */
  char http_url[512];
  const char *token;
} pw_runcfg;

typedef int (*pw_rctx_ready_fn)(void *arg);

typedef struct pw_rctx {
  uint64_t job;
  int run_id;
  int rank;                /* global rank: (replica * pp + prank) * tp + tp_rank */
  int prank, replica;      /* pipeline rank, data-parallel replica */
  int tp, tp_rank;         /* tensor-parallel ranks per stage (1: none), and ours among them */
  int pp, dp, n_ranks;
  int S, m, mb_size;       /* stages, microbatches per step, sequences per microbatch */
  const int *rank_of_stage; /* [S] pipeline rank */
  const int *lidx_of_stage; /* [S] local stage index or -1 */
  pw_lstage *ls;           /* [n_ls] */
  int n_ls;
  const pw_action *acts;   /* this rank's action list */
  int n_acts;
  const pw_runcfg *cfg;
  const pw_model *model;   /* &cfg->sl.model */
  const pw_partition *part; /* &cfg->sl.part */
  const int *step;         /* the step the compute thread is in */
  const int *tag;          /* the frame tag of the pass it is in (evalrun.h) */
  const atomic_int *abort; /* the run is being cancelled: stop at the next wait */
  const int *eval;         /* in an eval pass (no timings are taken) */
  const double *t_step0;   /* when the step began (pw_now; traced timings count from it) */
  /* What the run does for its subsystems (exec.c, recv.c). */
  void *run;
  /* Queue a frame to rank `to` (chunked when large); payload stays still
   * until written: a run-owned buffer, or a snapshot entry whose *pending
   * counts each write still reading it (NULL: none). */
  int (*send)(void *run, int to, const pw_frame_hdr *h, const void *payload, atomic_int *pending);
  /* Read the inbound links until ready(arg) holds; PW_ECANCELED when the
   * run is aborted, another negative code when a link failed (said). */
  int (*wait)(void *run, pw_rctx_ready_fn ready, void *arg);
  /* Record why the run failed (err may be NULL); returns rc (PW_EINTERNAL for 0). */
  int (*fail_run)(void *run, int rc, const pw_err *err, const char *msg);
  /* Queue an event for the loop thread. */
  int (*post)(void *run, const pw_event *ev);
  /* Wake the compute thread from any thread (serving's requests). */
  void (*wake)(void *run);
  /* Whether ranks a and b run on one machine. */
  int (*same_host)(void *run, int a, int b);
} pw_rctx;

/* The global rank of pipeline rank prank of replica d in our tp place. */
static inline int pw_rctx_rank_of(const pw_rctx *c, int d, int prank) { return (d * c->pp + prank) * c->tp + c->tp_rank; }

/* The global rank running stage s in our replica and tp place. */
static inline int pw_rctx_global_rank(const pw_rctx *c, int s) {
  return pw_rctx_rank_of(c, c->replica, c->rank_of_stage[s]);
}

static inline int pw_rctx_fail(const pw_rctx *c, int rc, const pw_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int pw_rctx_fail(const pw_rctx *c, int rc, const pw_err *err, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return c->fail_run(c->run, rc, err, msg);
}

#endif
