/* coord: the coordinator's shared model — where the HTTP threads
 * (libmicrohttpd) and the control loop (libuv, worker links, scheduling)
 * meet.
 *
 * The store is the source of truth for jobs and everything recorded about
 * them; each thread uses its own connection (pw_coord_store). What lives
 * only in memory — the registry of connected workers, counters for
 * /metrics — sits behind one mutex, held briefly and never across I/O.
 * The HTTP side changes jobs through the store and then wakes the loop
 * (pw_coord_wake), which does everything that talks to workers. */
#ifndef PW_COORD_H
#define PW_COORD_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <uv.h>

#include "control.h"
#include "store.h"

#define PW_HIST_BUCKETS 12

typedef struct pw_coord pw_coord;

/* A connected worker, as the API shows it. */
typedef struct {
  int64_t id;
  char name[64];
  char addr[96];          /* data-plane address */
  char software[64];
  int cores, threads;
  int64_t memory;         /* bytes the worker reported at register, 0: unknown */
  char blas_core[32];     /* its OpenBLAS kernel, "" unknown (an older worker) */
  int blas_forced;        /* 1: OPENBLAS_CORETYPE chose it, 0: OpenBLAS did, -1: unknown */
  char cpu_level[8];      /* what its CPU supports (pw_cpu_name), "" unknown */
  double gemm_gflops;     /* its one-thread sgemm rate at start, 0: unknown */
  char gemm_path[16];     /* what its products run on ("openblas", "onednn"), "" unknown */
  char host[64];          /* its machine's id (contention.h); "" from an older worker: a host of its own */
  char hostname[64];      /* that machine's name, for display */
  char cores_from[200];   /* where its cores and memory figures came from (common/base/sysres.h), "" unknown */
  char memory_from[200];
  int connected;
  double last_heartbeat;  /* epoch seconds */
  int64_t job;            /* job it runs, 0 if idle */
  int rank;               /* its rank in that job */
  int pp, tp;             /* that job's mesh (its coordinate: pw_coord_coordinate_json) */
} pw_worker_info;

/* HTTP admission as it stands, kept by http.c for /metrics. */
typedef struct {
  int workers, queue, running, queued;    /* the pool for expensive requests */
  int c_workers, c_queue, c_running, c_queued; /* the cluster lane: workers' checkpoint uploads */
  uint64_t c_busy;                        /* 429s of the cluster lane */
  int max_conns, max_per_ip, open;        /* connection bounds and open connections */
  uint64_t busy;                          /* 429s: pool and queue full */
  uint64_t refused_total, refused_per_ip; /* connections refused at accept, by bound */
} pw_http_adm;

struct pw_coord {
  /* configuration (read-only after start) */
  char http_host[64];
  int http_port;          /* actual port after bind */
  char ctl_host[64];
  int ctl_port;           /* actual port after bind */
  char db_path[512];
  char web_dir[512];
  char state_dir[512];
  char api_token[PW_CONTROL_TOKEN_MAX + 1];     /* empty: no auth */
  char cluster_token[PW_CONTROL_TOKEN_MAX + 1]; /* empty: none */
  unsigned char upload_key[32]; /* random at start: the ranks' upload tokens (pw_coord_upload_token) */
  double heartbeat_interval, heartbeat_timeout;
  double worker_expiry;   /* a lost worker leaves the registry after this long (0: never) */
  size_t max_body;        /* request body bound (bytes) */
  uint64_t max_upload;    /* a streamed upload's bound (bytes); 0: PW_HTTP_DEFAULT_MAX_UPLOAD */
  char data_root[4096];   /* --data-root, its real path: where data.path may point ("": nowhere) */
  char advertise_url[256]; /* --advertise-url: the base URL workers fetch datasets from ("": derived) */
  /* admission (http.c, common/plan/budget.h); 0 takes the default */
  size_t max_rank_memory; /* bytes any pipeline rank may need (with the workers' memory) */
  int64_t max_plan_actions;
  int http_workers, http_queue;      /* the pool for expensive requests and its queue */
  int http_max_conns, http_max_conns_per_ip, http_idle_timeout; /* seconds */

  /* the control loop */
  uv_loop_t *loop;
  uv_async_t wake;

  /* guarded by mu */
  pthread_mutex_t mu;
  pw_worker_info *workers;
  int n_workers, cap_workers;
  /* counters for /metrics */
  uint64_t http_requests[6];        /* by status class: 1xx..5xx, index 0 unused */
  pw_http_adm http_adm;
  uint64_t step_hist[PW_HIST_BUCKETS + 1]; /* step times: le 0.001 * 2^i s, then +Inf */
  double step_time_sum;
  uint64_t step_count;
  uint64_t gen_sequences, gen_tokens, gen_failed; /* serving (api_generate.c): sequences answered,
                                                     tokens generated, sequences failed */
  uint64_t steps_nonfinite[2];      /* steps whose loss or gradient norm was not finite, by the
                                       job's train.on_nonfinite: [PW_NONFINITE_FAIL] (the job
                                       failed, diverged), [PW_NONFINITE_SKIP] (the step updated
                                       nothing) */

  /* the store as the loop's writes find it (store_retry.h) */
  uint64_t store_failures;          /* writes that failed */
  uint64_t store_dropped;           /* writes given up (the queue was full) */
  int store_pending;                /* writes kept for a retry */
  char store_error[256];            /* the last failure; "" once writes work */

  /* --tensorboard-dir (tbdir.h): its state (loop thread; NULL without
   * the option), and its files written and writes failed (guarded by mu) */
  void *tbdir;
  uint64_t tb_writes, tb_failures;

  /* per-thread store connections, closed at shutdown (guarded by mu) */
  pw_store **stores;
  int n_stores;

  void *ctl;              /* ctlsrv.c's state (loop thread only) */
  void *writeq;           /* store_retry.c's pending writes (loop thread only) */
  void *http;             /* http.c's state: the libmicrohttpd daemon and the pool */
  int stopping;
  int draining;           /* SIGTERM with --drain-timeout: runs stop at a checkpoint, nothing new starts */
};

/* Loop thread (drain.c): SIGTERM with --drain-timeout. pw_drain_start
 * tells every training run to stop at a step it can still stop at with a
 * checkpoint and returns the runs to wait for; pw_drain_left counts those
 * still running. */
int pw_drain_start(pw_coord *c);
int pw_drain_left(pw_coord *c);
/* api_tokenizer.c: the tokenizers kept open, closed at shutdown. */
void pw_api_tokenizers_close(void);

/* The calling thread's store connection (opened on first use); NULL if the
 * database cannot be opened (logged). */
pw_store *pw_coord_store(pw_coord *c);
/* Tell the loop to look at the jobs again (thread-safe). */
void pw_coord_wake(pw_coord *c);
/* The token rank `rank` of run `run` of job `job` sends with its
 * checkpoint shards: HMAC-SHA256 under c->upload_key, in hex. Only that
 * rank is told it (in its assign), so holding the cluster token is not
 * enough to store a checkpoint of a job. */
void pw_coord_upload_token(const pw_coord *c, int64_t job, int64_t run, int rank, char out[65]);
/* {"pipeline_rank", "replica", "tp_rank"} of rank `rank` of a pp x dp x tp mesh. */
json_t *pw_coord_coordinate_json(int rank, int pp, int tp);
/* {"workers": [{"id","name","addr","state": "idle"|"busy"|"lost",
 *   "heartbeat_age","job","rank","coordinate","cores","threads","software","host",
 *   "hostname","cores_from","memory_from",...}]} (new ref). */
json_t *pw_coord_workers_json(pw_coord *c);
/* The store's health for /healthz: 0 when the loop's writes work (and
 * none is pending), else 1 with the last error and the pending count. */
int pw_coord_store_health(pw_coord *c, char *error, size_t cap, int *pending);
/* Drops lost workers whose last heartbeat is older than worker_expiry
 * (loop; a no-op when worker_expiry is 0). Returns how many. */
int pw_coord_workers_expire(pw_coord *c, double now);
/* Counts of connected workers: idle and busy. */
void pw_coord_worker_counts(pw_coord *c, int *idle, int *busy, int *lost);
/* Record one HTTP answer's status for /metrics. */
void pw_coord_count_http(pw_coord *c, int status);
/* Record one step's time for the histogram. */
void pw_coord_count_step(pw_coord *c, double seconds);
/* Record one step whose loss or gradient norm was not finite, under the
 * job's train.on_nonfinite (a pw_nonfinite). */
void pw_coord_count_nonfinite(pw_coord *c, int on_nonfinite);
/* Prometheus text exposition of everything above plus the store's totals
 * (malloc'd string). */
char *pw_coord_metrics_text(pw_coord *c);

/* Cancel a job: queued -> cancelled at once; a running one is marked
 * cancelled and the loop stops its workers. PW_ENOENT, PW_ECONFLICT when
 * already finished. */
PW_MUST_CHECK int pw_coord_cancel(pw_coord *c, int64_t job, pw_err *err);

/* http.c: the REST API server (libmicrohttpd, its own threads). */
PW_MUST_CHECK int pw_http_start(pw_coord *c, pw_err *err);
void pw_http_stop(pw_coord *c);

/* ctlsrv.c: the control plane on the loop (worker links); the job side
 * (sched.c) plugs in through hooks (ctl_int.h). */
typedef struct pw_ctl_hooks pw_ctl_hooks;
PW_MUST_CHECK int pw_ctl_server_start(pw_coord *c, const pw_ctl_hooks *hooks, pw_err *err);
/* sched.c: dispatch, following runs, cancel. */
const pw_ctl_hooks *pw_sched_hooks(void);
void pw_ctl_server_stop(pw_coord *c);

#endif
