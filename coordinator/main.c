/* main: pipewright-coordinator — options, the store, the control loop
 * (libuv) on this thread, the REST API (libmicrohttpd) on its own threads,
 * signals. SIGTERM/SIGINT stop it cleanly: running jobs go back to the
 * queue with an event saying why, workers are told to stop, nothing the
 * API accepted is lost (and a kill -9 loses nothing committed either: at
 * start, jobs caught mid-flight are queued again). With --drain-timeout,
 * SIGTERM first drains (drain.c): the training runs stop at a step with
 * its checkpoint, then the coordinator stops; a second signal, or the
 * timeout, stops it at once. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coord.h"
#include "addr.h"
#include "datasets.h"
#include "log.h"
#include "sdnotify.h"
#include "store_retry.h"
#include "tbdir.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pipewright-coordinator [options]\n"
          "  --http ADDR:PORT          REST API and dashboard (default 127.0.0.1:8080)\n"
          "  --control ADDR:PORT       worker control links (default 127.0.0.1:7070)\n"
          "  --state-dir DIR           database and scratch (default ./pipewright-coordinator)\n"
          "  --db FILE                 SQLite database (default STATE_DIR/pipewright.db)\n"
          "  --web DIR                 dashboard files to serve at /\n"
          "  --token-file FILE         bearer token required by the API\n"
          "  --cluster-token-file FILE token workers must present\n"
          "  --heartbeat-timeout SECS  a worker silent this long is lost (default 10)\n"
          "  --worker-expiry SECS      a lost worker leaves /v1/workers after this long\n"
          "                            (default 600; 0 keeps it forever)\n"
          "  --ready-file FILE         write {\"http\": PORT, \"control\": PORT} once serving\n"
          "  --log-level LEVEL         debug | info | warn | error (default info)\n"
          "  --max-rank-memory BYTES   refuse a job a pipeline rank of which needs more (default: only\n"
          "                            the smallest connected worker's memory bounds it)\n"
          "  --max-plan-actions N      refuse a spec whose plan holds more actions (default 32768)\n"
          "  --http-workers N          threads for expensive requests: plans, submissions (default 2)\n"
          "  --http-queue N            expensive requests waiting beyond those; more get 429 (default 8)\n"
          "  --http-max-connections N  open HTTP connections (default 2048, under the file limit)\n"
          "  --http-max-per-address N  open HTTP connections per client address (default 256)\n"
          "  --http-idle-timeout SECS  close an idle HTTP connection (default 30)\n"
          "  --max-upload BYTES        largest dataset upload, streamed to disk (default 16 GiB)\n"
          "  --data-root DIR           a job's data.path may name files under DIR (default: none,\n"
          "                            every data.path is refused: upload datasets instead)\n"
          "  --advertise-url URL       the API's base URL as workers reach it, for fetching datasets\n"
          "                            (default: the --http address, or when that is 0.0.0.0 / ::,\n"
          "                            the address each worker's control link reached)\n"
          "  --tensorboard-dir DIR     keep each job's runs as TensorBoard event files in\n"
          "                            DIR/job-<id>/ (written as steps arrive; default: none)\n"
          "  --drain-timeout SECS      on SIGTERM, first have every training run stop at a step\n"
          "                            with its checkpoint, waiting at most this long (a preemption\n"
          "                            signal's lead time; default 0: stop at once, the jobs resume\n"
          "                            from their last checkpoint)\n"
          "  --help, --version\n"
          "Binding beyond loopback needs --token-file (API) and --cluster-token-file (control).\n");
}



static int read_token(const char *path, char *buf, size_t cap) {
  pw_err err = {0};
  if (pw_control_read_token_file(path, buf, cap, &err) < 0) {
    char b[512];
    fprintf(stderr, "pipewright-coordinator: %s\n", pw_err_str(&err, b, sizeof b));
    return -1;
  }
  return 0;
}

/* One coordinator per state directory: a second one would queue the
 * first's running jobs again and both would write the store. A write lock
 * on DIR/lock (held until exit: the descriptor is never closed) refuses the
 * second, naming the holder's pid as the kernel reports it. */
static int lock_state_dir(const char *dir) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/lock", dir) >= (int)sizeof path) {
    fprintf(stderr, "pipewright-coordinator: --state-dir is too long\n");
    return -1;
  }
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    fprintf(stderr, "pipewright-coordinator: cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  if (fcntl(fd, F_SETLK, &fl)) {
    int e = errno;
    struct flock who = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if ((e == EACCES || e == EAGAIN) && !fcntl(fd, F_GETLK, &who) && who.l_type != F_UNLCK)
      fprintf(stderr, "pipewright-coordinator: state directory %s is in use by another coordinator (pid %ld holds %s)\n",
              dir, (long)who.l_pid, path);
    else
      fprintf(stderr, "pipewright-coordinator: cannot lock %s: %s\n", path, strerror(e));
    close(fd);
    return -1;
  }
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)n, 0) != n) /* for people; the lock is what counts */
    pw_warn("cannot write the pid into %s: %s", path, strerror(errno));
  return 0;
}

static pw_coord coord;
static uv_signal_t sigint_h, sigterm_h;

/* systemd (Type=notify): READY=1 once the API and the control plane
 * listen, STATUS= when the worker counts change, STOPPING=1 at shutdown.
 * No-ops without NOTIFY_SOCKET (the timer then never starts). */
static uv_timer_t status_timer;
static int status_on;

static void on_status_timer(uv_timer_t *t) {
  pw_coord *c = t->data;
  static char last[256];
  char now[256];
  int idle = 0, busy = 0, lost = 0;
  pw_coord_worker_counts(c, &idle, &busy, &lost);
  snprintf(now, sizeof now, "STATUS=serving on port %d (control %d); workers: %d idle, %d busy, %d lost",
           c->http_port, c->ctl_port, idle, busy, lost);
  if (strcmp(now, last)) {
    pw_sd_notify(now);
    snprintf(last, sizeof last, "%s", now);
  }
}

static double drain_timeout; /* --drain-timeout */
static double drain_t0;
static uv_timer_t drain_timer;

static void shut_down(pw_coord *c) {
  if (c->stopping) return;
  pw_sd_notify("STOPPING=1\nSTATUS=shutting down: running jobs go back to the queue");
  if (status_on) uv_close((uv_handle_t *)&status_timer, NULL);
  status_on = 0;
  pw_ctl_server_stop(c); /* running jobs back to the queue, workers told */
  c->stopping = 1;
  pw_http_stop(c);
  uv_close((uv_handle_t *)&sigint_h, NULL);
  uv_close((uv_handle_t *)&sigterm_h, NULL);
  if (c->draining) uv_close((uv_handle_t *)&drain_timer, NULL);
}

/* Every 100 ms while draining: stop once no training run is left, or the
 * time is up (the runs still going then resume from their last checkpoint). */
static void on_drain_timer(uv_timer_t *t) {
  pw_coord *c = t->data;
  int left = pw_drain_left(c);
  if (left && (uv_hrtime() / 1e9) - drain_t0 < drain_timeout) return;
  if (left) pw_warn("drain: %d run%s still going after %.0f s: stopping now", left, left == 1 ? "" : "s", drain_timeout);
  else pw_info("drain: every run stopped at its checkpoint");
  shut_down(c);
}

static void on_signal(uv_signal_t *h, int signum) {
  pw_coord *c = h->data;
  if (c->stopping) return;
  if (signum == SIGTERM && drain_timeout > 0 && !c->draining) {
    c->draining = 1;
    int n = pw_drain_start(c);
    if (n > 0) {
      pw_info("signal %d: draining %d run%s (at most %.0f s), then shutting down", signum, n, n == 1 ? "" : "s",
              drain_timeout);
      pw_sd_notify("STATUS=draining: training runs stop at a checkpoint");
      drain_t0 = (uv_hrtime() / 1e9);
      uv_timer_init(c->loop, &drain_timer);
      drain_timer.data = c;
      uv_timer_start(&drain_timer, on_drain_timer, 100, 100);
      return;
    }
    c->draining = 0;
  }
  pw_info("signal %d: shutting down", signum);
  shut_down(c);
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"http", required_argument, 0, 'H'},
                                       {"control", required_argument, 0, 'C'},
                                       {"state-dir", required_argument, 0, 's'},
                                       {"db", required_argument, 0, 'd'},
                                       {"web", required_argument, 0, 'w'},
                                       {"token-file", required_argument, 0, 't'},
                                       {"cluster-token-file", required_argument, 0, 'k'},
                                       {"heartbeat-timeout", required_argument, 0, 'T'},
                                       {"worker-expiry", required_argument, 0, 'E'},
                                       {"ready-file", required_argument, 0, 'r'},
                                       {"log-level", required_argument, 0, 'L'},
                                       {"max-rank-memory", required_argument, 0, 1000},
                                       {"max-plan-actions", required_argument, 0, 1001},
                                       {"http-workers", required_argument, 0, 1002},
                                       {"http-queue", required_argument, 0, 1003},
                                       {"http-max-connections", required_argument, 0, 1004},
                                       {"http-max-per-address", required_argument, 0, 1005},
                                       {"http-idle-timeout", required_argument, 0, 1006},
                                       {"max-upload", required_argument, 0, 1007},
                                       {"data-root", required_argument, 0, 1008},
                                       {"advertise-url", required_argument, 0, 1009},
                                       {"tensorboard-dir", required_argument, 0, 1010},
                                       {"drain-timeout", required_argument, 0, 1011},
                                       {"help", no_argument, 0, 'h'},
                                       {"version", no_argument, 0, 'V'},
                                       {0, 0, 0, 0}};
  pw_coord *c = &coord;
  const char *http = "127.0.0.1:8080", *ctl = "127.0.0.1:7070", *db = NULL, *ready = NULL;
  const char *token_file = NULL, *cluster_file = NULL, *tb_dir = NULL;
  snprintf(c->state_dir, sizeof c->state_dir, "pipewright-coordinator");
  c->heartbeat_timeout = 10;
  c->worker_expiry = 600;
  c->heartbeat_interval = 1;
  c->max_body = (size_t)8 << 20;
  int o;
  while ((o = getopt_long(argc, argv, "H:C:s:d:w:t:k:T:E:r:L:hV", opts, NULL)) != -1) {
    switch (o) {
      case 'H': http = optarg; break;
      case 'C': ctl = optarg; break;
      case 's': snprintf(c->state_dir, sizeof c->state_dir, "%s", optarg); break;
      case 'd': db = optarg; break;
      case 'w': snprintf(c->web_dir, sizeof c->web_dir, "%s", optarg); break;
      case 't': token_file = optarg; break;
      case 'k': cluster_file = optarg; break;
      case 'T': c->heartbeat_timeout = atof(optarg); break;
      case 'E': {
        char *end;
        c->worker_expiry = strtod(optarg, &end);
        if (end == optarg || *end || !(c->worker_expiry >= 0)) {
          fprintf(stderr, "pipewright-coordinator: --worker-expiry must be seconds >= 0, got '%s'\n", optarg);
          return 2;
        }
        break;
      }
      case 'r': ready = optarg; break;
      case 1011: {
        char *end;
        drain_timeout = strtod(optarg, &end);
        if (end == optarg || *end || !(drain_timeout >= 0) || drain_timeout > 86400) {
          fprintf(stderr, "pipewright-coordinator: --drain-timeout must be seconds from 0 to 86400, got '%s'\n", optarg);
          return 2;
        }
        break;
      }
      case 'L':
        if (pw_log_parse_level(optarg) < 0) {
          fprintf(stderr, "pipewright-coordinator: unknown log level '%s'\n", optarg);
          return 2;
        }
        pw_log_set_level((pw_log_level)pw_log_parse_level(optarg));
        break;
      case 1000: case 1001: case 1002: case 1003: case 1004: case 1005: case 1006: {
        char *end;
        errno = 0;
        long long v = strtoll(optarg, &end, 10);
        if (errno || end == optarg || *end || v < 1 || (o != 1000 && o != 1001 && v > 1000000)) {
          const char *name = "";
          for (const struct option *op = opts; op->name; op++)
            if (op->val == o) name = op->name;
          fprintf(stderr, "pipewright-coordinator: --%s must be a positive integer, got '%s'\n", name, optarg);
          return 2;
        }
        if (o == 1000) c->max_rank_memory = (size_t)v;
        else if (o == 1001) c->max_plan_actions = v;
        else if (o == 1002) c->http_workers = (int)v;
        else if (o == 1003) c->http_queue = (int)v;
        else if (o == 1004) c->http_max_conns = (int)v;
        else if (o == 1005) c->http_max_conns_per_ip = (int)v;
        else c->http_idle_timeout = (int)v;
        break;
      }
      case 1007: {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(optarg, &end, 10);
        if (errno || end == optarg || *end || v < 1 || optarg[0] == '-') {
          fprintf(stderr, "pipewright-coordinator: --max-upload must be a positive number of bytes, got '%s'\n",
                  optarg);
          return 2;
        }
        c->max_upload = v;
        break;
      }
      case 1008: {
        struct stat st;
        if (!realpath(optarg, c->data_root) || stat(c->data_root, &st) || !S_ISDIR(st.st_mode)) {
          fprintf(stderr, "pipewright-coordinator: --data-root %s is not a directory\n", optarg);
          return 2;
        }
        break;
      }
      case 1009: {
        size_t n = strlen(optarg);
        if ((strncmp(optarg, "http://", 7) && strncmp(optarg, "https://", 8)) || n >= sizeof c->advertise_url) {
          fprintf(stderr, "pipewright-coordinator: --advertise-url must be http://HOST:PORT or https://... (at most %zu bytes), got '%s'\n",
                  sizeof c->advertise_url - 1, optarg);
          return 2;
        }
        memcpy(c->advertise_url, optarg, n + 1);
        while (n > 0 && c->advertise_url[n - 1] == '/') c->advertise_url[--n] = 0; /* a base: no trailing slash */
        break;
      }
      case 1010: tb_dir = optarg; break;
      case 'h': usage(stdout); return 0;
      case 'V': printf("pipewright-coordinator %s\n", PW_VERSION); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind < argc || c->heartbeat_timeout <= 0) {
    usage(stderr);
    return 2;
  }
  if (pw_addr_split(http, c->http_host, sizeof c->http_host, &c->http_port)) {
    fprintf(stderr, "pipewright-coordinator: --http must be ADDR:PORT, got '%s'\n", http);
    return 2;
  }
  if (pw_addr_split(ctl, c->ctl_host, sizeof c->ctl_host, &c->ctl_port)) {
    fprintf(stderr, "pipewright-coordinator: --control must be ADDR:PORT, got '%s'\n", ctl);
    return 2;
  }
  if (token_file && read_token(token_file, c->api_token, sizeof c->api_token)) return 1;
  if (cluster_file && read_token(cluster_file, c->cluster_token, sizeof c->cluster_token)) return 1;
  if (!pw_addr_is_loopback(c->http_host) && !c->api_token[0]) {
    fprintf(stderr, "pipewright-coordinator: --http %s is beyond loopback: give --token-file\n", http);
    return 2;
  }
  if (!pw_addr_is_loopback(c->ctl_host) && !c->cluster_token[0]) {
    fprintf(stderr, "pipewright-coordinator: --control %s is beyond loopback: give --cluster-token-file\n", ctl);
    return 2;
  }
  c->heartbeat_interval = c->heartbeat_timeout / 5 < 1 ? c->heartbeat_timeout / 5 : 1;
  if (mkdir(c->state_dir, 0700) && errno != EEXIST) {
    fprintf(stderr, "pipewright-coordinator: cannot create %s: %s\n", c->state_dir, strerror(errno));
    return 1;
  }
  if (lock_state_dir(c->state_dir)) return 1;
  if (getrandom(c->upload_key, sizeof c->upload_key, 0) != (ssize_t)sizeof c->upload_key) {
    fprintf(stderr, "pipewright-coordinator: cannot get random bytes for the upload key: %s\n", strerror(errno));
    return 1;
  }
  if (db)
    snprintf(c->db_path, sizeof c->db_path, "%s", db);
  else
    snprintf(c->db_path, sizeof c->db_path, "%.480s/pipewright.db", c->state_dir);
  pthread_mutex_init(&c->mu, NULL);
  signal(SIGPIPE, SIG_IGN);

  pw_store *s = pw_coord_store(c);
  if (!s) return 1;
  int swept = pw_ds_sweep(c->state_dir); /* uploads a crash cut short */
  if (swept > 0) pw_info("datasets: removed %d unfinished upload%s", swept, swept == 1 ? "" : "s");
  swept = pw_ds_sweep_in(c->state_dir, "weights");
  if (swept > 0) pw_info("weights: removed %d unfinished upload%s", swept, swept == 1 ? "" : "s");
  pw_err err = {0};
  char b[600];
  int n = pw_store_recover(s, "coordinator restarted while the job was in flight", &err);
  if (n < 0) {
    fprintf(stderr, "pipewright-coordinator: %s\n", pw_err_str(&err, b, sizeof b));
    return 1;
  }
  if (n > 0) pw_info("%d job%s caught mid-flight queued again", n, n == 1 ? "" : "s");

  if (tb_dir && pw_tbdir_open(c, tb_dir, &err)) {
    fprintf(stderr, "pipewright-coordinator: %s\n", pw_err_str(&err, b, sizeof b));
    return 1;
  }
  c->loop = uv_default_loop();
  struct rlimit rl; /* the soft file limit up to the hard one: room for the HTTP connection bound */
  if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl)) pw_warn("cannot raise the open-file limit: %s", strerror(errno));
  }
  if (pw_ctl_server_start(c, pw_sched_hooks(), &err) || pw_http_start(c, &err)) {
    fprintf(stderr, "pipewright-coordinator: %s\n", pw_err_str(&err, b, sizeof b));
    return 1;
  }
  uv_signal_init(c->loop, &sigint_h);
  uv_signal_init(c->loop, &sigterm_h);
  sigint_h.data = sigterm_h.data = c;
  uv_signal_start(&sigint_h, on_signal, SIGINT);
  uv_signal_start(&sigterm_h, on_signal, SIGTERM);
  pw_info("coordinator: API on http://%s:%d/, control on %s:%d, store %s", c->http_host, c->http_port, c->ctl_host,
          c->ctl_port, c->db_path);
  if (ready) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", ready);
    FILE *f = fopen(tmp, "w");
    if (f) {
      fprintf(f, "{\"http\": %d, \"control\": %d}\n", c->http_port, c->ctl_port);
      fclose(f);
      rename(tmp, ready);
    }
  }
  pw_sd_notifyf("READY=1\nSTATUS=serving API on %s:%d, control on %s:%d", c->http_host, c->http_port, c->ctl_host,
                c->ctl_port);
  const char *ns = getenv("NOTIFY_SOCKET");
  if (ns && ns[0]) {
    uv_timer_init(c->loop, &status_timer);
    status_timer.data = c;
    uv_timer_start(&status_timer, on_status_timer, 1000, 1000);
    status_on = 1;
  }
  pw_coord_wake(c); /* first scheduling pass */
  uv_run(c->loop, UV_RUN_DEFAULT);
  pw_write_shutdown(c); /* a last try; what is still pending is logged */
  pw_tbdir_close(c);    /* the loop ran every write it started */
  free(c->ctl);
  for (int i = 0; i < c->n_stores; i++) pw_store_close(c->stores[i]);
  free(c->stores);
  free(c->workers);
  pw_api_tokenizers_close();
  uv_loop_close(c->loop);
  pthread_mutex_destroy(&c->mu);
  pw_info("stopped");
  return 0;
}
