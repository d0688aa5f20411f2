/* main: pipewright-worker — options, the loop, signals.
 *
 * A worker connects to its coordinator, registers, sends heartbeats, and
 * runs whatever rank of whatever job it is assigned, talking to its peers
 * directly. It keeps serving after a bad message, a bad frame or a failed
 * run: only SIGINT/SIGTERM stop it. */
#include <cblas.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "addr.h"
#include "pw_cuda.h"
#include "log.h"
#include "sdnotify.h"
#include "sha256.h"
#include "sysres.h"
#include "worker.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pipewright-worker --coordinator HOST:PORT [options]\n"
          "  --coordinator HOST:PORT  control link (default 127.0.0.1:7070)\n"
          "  --listen ADDR:PORT       data plane for peer workers (default 127.0.0.1:0 = ephemeral)\n"
          "  --name NAME              worker name (default: hostname-pid; no control characters)\n"
          "  --host-id ID             the machine this worker runs on, for co-location: workers with\n"
          "                           one id share its cores (default $PW_HOST_ID, else /etc/machine-id,\n"
          "                           else the hostname; letters, digits, . _ : @ -)\n"
          "  --threads N              OpenBLAS threads for compute (default 1)\n"
          "  --device D               cpu (default), cuda or cuda:N: where its stages run (float32;\n"
          "                           several workers may share one GPU)\n"
          "  --state-dir DIR          checkpoints and scratch (default ./pipewright-worker)\n"
          "  --token-file FILE        cluster token (required when the coordinator uses one)\n"
          "  --cache-max BYTES        datasets fetched from the coordinator are kept in\n"
          "                           STATE_DIR/cache/datasets up to this size, least recently used\n"
          "                           out (suffixes K, M, G, T; default 8G)\n"
          "  --log-level LEVEL        debug | info | warn | error (default info)\n"
          "  --hello-timeout SECONDS  an inbound data link must say HELLO within this (default 5)\n"
          "  --held-timeout SECONDS   a link for a job not running here waits this long for its run;\n"
          "                           a finished run's links this long for their peer's end (default 30)\n"
          "  --help, --version\n");
}


/* systemd (Type=notify): READY=1 once the data plane listens and the
 * control link is being made — not after registering, so a worker started
 * before its coordinator still comes up and keeps retrying; then a STATUS=
 * line whenever the link or the run changes. A no-op without NOTIFY_SOCKET. */
static uv_timer_t status_timer;
static int status_on;

static void on_status_timer(uv_timer_t *t) {
  pw_worker *w = t->data;
  static char last[512];
  char now[512];
  if (w->run)
    snprintf(now, sizeof now, "STATUS=job %llu rank %d, step %d of %d", (unsigned long long)w->run->cx.job,
             w->run->cx.rank, pw_run_step(w->run), w->run->cfg.steps);
  else if (w->ctl_state == 2)
    snprintf(now, sizeof now, "STATUS=idle, registered with %.200s:%d as worker %d", w->coord_host, w->coord_port,
             w->worker_id);
  else
    snprintf(now, sizeof now, "STATUS=connecting to coordinator %.200s:%d", w->coord_host, w->coord_port);
  if (strcmp(now, last)) {
    pw_sd_notify(now);
    snprintf(last, sizeof last, "%s", now);
  }
}

static void on_signal(uv_signal_t *h, int signum) {
  pw_worker *w = h->data;
  if (w->stopping) return;
  pw_info("signal %d: shutting down", signum);
  pw_sd_notify("STOPPING=1\nSTATUS=shutting down");
  if (status_on) uv_close((uv_handle_t *)&status_timer, NULL);
  status_on = 0;
  w->stopping = 1;
  if (w->run) pw_run_cancel(w->run, "worker shutting down");
  pw_ctl_stop(w);
  pw_net_stop(w);
  uv_close((uv_handle_t *)&w->sigint, NULL);
  uv_close((uv_handle_t *)&w->sigterm, NULL);
}

/* The loop thread's stack, touched once before the loop runs: glibc prints
 * a double on the stack in proportion to its exponent, so a step report
 * printing a value smaller than any before would fault a fresh stack page
 * in the middle of a run (seen at step 4-5 of a pp 4 run). 128 KiB is far
 * more than any callback plus a printf needs. */
static void __attribute__((noinline)) touch_stack(void) {
  volatile char pad[128 * 1024];
  for (size_t i = 0; i < sizeof pad; i += 4096) pad[i] = 0;
}

/* --device: the GPU opened now (a worker that cannot have it must not
 * register), and said in the log. */
static int open_device(pw_worker *w, const char *spec) {
  if (!spec || strcmp(spec, "cpu") == 0) return 0;
  int dev = 0;
  char *end = NULL;
  if (strcmp(spec, "cuda") != 0) {
    long n = strncmp(spec, "cuda:", 5) == 0 ? strtol(spec + 5, &end, 10) : -1;
    if (n < 0 || n > 1024 || !end || end == spec + 5 || *end) {
      fprintf(stderr, "pipewright-worker: --device %s: expected cpu, cuda or cuda:N\n", spec);
      return 1;
    }
    dev = (int)n;
  }
  pw_err err = {0};
  pw_cuda_info gi;
  if (pw_cuda_open(dev, &w->backend, &err) || pw_cuda_info_of(dev, &gi, &err)) {
    fprintf(stderr, "pipewright-worker: --device %s: %s\n", spec, err.msg);
    return 1;
  }
  pw_info("device %s: %s, %.1f GiB (%.1f free), compute capability %d.%d, %d SMs, driver %d, runtime %d",
          w->backend->name, gi.name, (double)gi.mem_total / (1 << 30), (double)gi.mem_free / (1 << 30), gi.cc_major,
          gi.cc_minor, gi.sms, gi.driver_version, gi.runtime_version);
  /* A stage's arenas and slots live on the GPU: its free memory is the
   * budget the coordinator plans against (register.memory), and the GPU is
   * named where /v1/workers and `pipewright workers` say where it came from.
   * Workers that share a GPU each report all of it. */
  w->res.memory = (int64_t)gi.mem_free;
  snprintf(w->res.memory_from, sizeof w->res.memory_from, "%s: %s, %.1f GiB free of %.1f, driver %d.%d", w->backend->name,
           gi.name, (double)gi.mem_free / (1 << 30), (double)gi.mem_total / (1 << 30), gi.driver_version / 1000,
           gi.driver_version % 1000 / 10);
  return 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"coordinator", required_argument, 0, 'c'},
                                       {"listen", required_argument, 0, 'l'},
                                       {"name", required_argument, 0, 'n'},
                                       {"threads", required_argument, 0, 't'},
                                       {"state-dir", required_argument, 0, 's'},
                                       {"token-file", required_argument, 0, 'k'},
                                       {"log-level", required_argument, 0, 'L'},
                                       {"hello-timeout", required_argument, 0, 'H'},
                                       {"held-timeout", required_argument, 0, 'D'},
                                       {"cache-max", required_argument, 0, 'C'},
                                       {"host-id", required_argument, 0, 'I'},
                                       {"device", required_argument, 0, 'G'},
                                       {"help", no_argument, 0, 'h'},
                                       {"version", no_argument, 0, 'V'},
                                       {0, 0, 0, 0}};
  static pw_worker w;
  const char *coord = "127.0.0.1:7070", *listen = "127.0.0.1:0", *token_file = NULL, *host_id = getenv("PW_HOST_ID");
  const char *device = NULL;
  uint64_t cache_max = PW_CACHE_MAX_DEFAULT;
  w.threads = 1;
  w.hello_timeout = 5;
  w.held_timeout = 30;
  snprintf(w.state_dir, sizeof w.state_dir, "pipewright-worker");
  int c;
  while ((c = getopt_long(argc, argv, "c:l:n:t:s:k:L:H:D:C:I:G:hV", opts, NULL)) != -1) {
    switch (c) {
      case 'G': device = optarg; break;
      case 'c': coord = optarg; break;
      case 'l': listen = optarg; break;
      case 'n': snprintf(w.name, sizeof w.name, "%s", optarg); break;
      case 't': w.threads = atoi(optarg); break;
      case 's': snprintf(w.state_dir, sizeof w.state_dir, "%s", optarg); break;
      case 'k': token_file = optarg; break;
      case 'I': host_id = optarg; break;
      case 'L':
        if (pw_log_parse_level(optarg) < 0) {
          fprintf(stderr, "pipewright-worker: unknown log level '%s'\n", optarg);
          return 2;
        }
        pw_log_set_level((pw_log_level)pw_log_parse_level(optarg));
        break;
      case 'H':
      case 'D': {
        char *end;
        double v = strtod(optarg, &end);
        if (*end || !(v > 0 && v <= 86400)) {
          fprintf(stderr, "pipewright-worker: --%s must be seconds in (0, 86400], got '%s'\n",
                  c == 'H' ? "hello-timeout" : "held-timeout", optarg);
          return 2;
        }
        *(c == 'H' ? &w.hello_timeout : &w.held_timeout) = v;
        break;
      }
      case 'C':
        if (pw_parse_bytes(optarg, &cache_max) || cache_max == 0) {
          fprintf(stderr, "pipewright-worker: --cache-max must be a byte count > 0 (e.g. 8G, 500M), got '%s'\n",
                  optarg);
          return 2;
        }
        break;
      case 'h': usage(stdout); return 0;
      case 'V': printf("pipewright-worker %s\n", PW_VERSION); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind < argc || w.threads < 1 || w.threads > 256) {
    usage(stderr);
    return 2;
  }
  for (const char *p = w.name; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) { /* the coordinator refuses it too: said here first */
      fprintf(stderr, "pipewright-worker: --name must not hold control characters (newlines, tabs, escapes)\n");
      return 2;
    }
  if (pw_addr_split(coord, w.coord_host, sizeof w.coord_host, &w.coord_port) || w.coord_port == 0) {
    fprintf(stderr, "pipewright-worker: --coordinator must be HOST:PORT, got '%s'\n", coord);
    return 2;
  }
  if (pw_addr_split(listen, w.listen_host, sizeof w.listen_host, &w.listen_port)) {
    fprintf(stderr, "pipewright-worker: --listen must be ADDR:PORT, got '%s'\n", listen);
    return 2;
  }
  if (!pw_addr_is_loopback(w.listen_host) && !token_file) {
    fprintf(stderr, "pipewright-worker: --listen %s is beyond loopback: give --token-file (the cluster token)\n",
            listen);
    return 2;
  }
  char hostname[64] = "";
  if (gethostname(hostname, sizeof hostname - 1)) snprintf(hostname, sizeof hostname, "unknown");
  if (!w.name[0]) snprintf(w.name, sizeof w.name, "%.40s-%d", hostname, (int)getpid());
  snprintf(w.hostname, sizeof w.hostname, "%s", hostname);
  {
    pw_err err = {0};
    if (pw_host_id(NULL, host_id && host_id[0] ? host_id : NULL, hostname, w.host_id, sizeof w.host_id, w.host_from,
                   sizeof w.host_from, &err)) {
      fprintf(stderr, "pipewright-worker: --host-id (or PW_HOST_ID) '%.80s': %s\n", host_id, err.msg);
      return 2;
    }
  }
  if (token_file) {
    pw_err err = {0};
    if (pw_control_read_token_file(token_file, w.token, sizeof w.token, &err) < 0) {
      char buf[512];
      fprintf(stderr, "pipewright-worker: %s\n", pw_err_str(&err, buf, sizeof buf));
      return 1;
    }
  }
  /* a cached dataset's path must fit a data spec's path */
  if (strlen(w.state_dir) + sizeof "/cache/datasets/" + PW_SHA256_HEX_LEN > sizeof ((pw_data_spec *)0)->path) {
    fprintf(stderr, "pipewright-worker: --state-dir '%s' is too long (at most %zu characters)\n", w.state_dir,
            sizeof ((pw_data_spec *)0)->path - sizeof "/cache/datasets/" - PW_SHA256_HEX_LEN);
    return 2;
  }
  pw_log_set_tag(w.name);
  {
    pw_err err = {0};
    if (pw_dscache_open(w.state_dir, cache_max, &w.cache, &err) < 0) {
      char buf[512];
      fprintf(stderr, "pipewright-worker: dataset cache: %s\n", pw_err_str(&err, buf, sizeof buf));
      return 1;
    }
  }
  {
    pw_err err = {0};
    char why[512];
    if (pw_gemm_check(&err)) { /* a worker that cannot multiply right must not train */
      fprintf(stderr, "pipewright-worker: %s\n", pw_err_str(&err, why, sizeof why));
      return 1;
    }
    pw_blasinfo_probe(&w.blas);
    pw_info("products on %s (%s); OpenBLAS kernel %s%s, CPU %s, sgemm %.0f GFLOP/s on one core (%d calls, probe "
            "%.0f ms)",
            pw_gemm_path_name(w.blas.gemm->path), w.blas.gemm->why, w.blas.core[0] ? w.blas.core : "?",
            w.blas.forced ? " (forced by OPENBLAS_CORETYPE)" : "", pw_cpu_name(w.blas.cpu), w.blas.gflops,
            w.blas.calls, w.blas.probe_s * 1e3);
    if (w.blas.gemm->path == PW_GEMM_OPENBLAS &&
        pw_cpu_blas_warning(w.blas.core, w.blas.forced, pw_cpu_name(w.blas.cpu), why, sizeof why))
      pw_warn("%s", why);
  }
  /* What the cluster engine grants this process, not the machine's counts:
   * sent with every register, the coordinator's memory budget and the
   * contention note count on it. */
  if (pw_sysres_read(NULL, &w.res)) return 1;
  pw_info("resources: %d core%s (%s), %.1f GiB of memory (%s); host id %s (%s)", w.res.cores,
          w.res.cores == 1 ? "" : "s", w.res.cores_from, (double)w.res.memory / (1 << 30), w.res.memory_from,
          w.host_id, w.host_from);
  if (w.res.note[0]) pw_warn("resources: ignored %s", w.res.note);
  pw_pin_init(&w.pin); /* the CPUs it may use and the NUMA nodes, for the coordinator's pinning */
  if (w.threads > w.res.cores)
    pw_warn("--threads %d is more than the %d core%s this process may use (%s): its threads take turns", w.threads,
            w.res.cores, w.res.cores == 1 ? "" : "s", w.res.cores_from);
  openblas_set_num_threads(w.threads);
  if (open_device(&w, device)) return 1;
  signal(SIGPIPE, SIG_IGN);

  w.loop = uv_default_loop();
  if (pw_snapstore_init(&w.snaps)) return 1;
  if (pw_net_listen(&w)) return 1;
  if (pw_ctl_start(&w)) return 1;
  uv_signal_init(w.loop, &w.sigint);
  uv_signal_init(w.loop, &w.sigterm);
  w.sigint.data = w.sigterm.data = &w;
  uv_signal_start(&w.sigint, on_signal, SIGINT);
  uv_signal_start(&w.sigterm, on_signal, SIGTERM);
  pw_info("worker %s: data plane on %s:%d, coordinator %s:%d, %d thread%s", w.name, w.listen_host, w.listen_port,
          w.coord_host, w.coord_port, w.threads, w.threads == 1 ? "" : "s");
  pw_sd_notifyf("READY=1\nSTATUS=data plane on %s:%d, connecting to coordinator %s:%d", w.listen_host,
                w.listen_port, w.coord_host, w.coord_port);
  const char *ns = getenv("NOTIFY_SOCKET");
  if (ns && ns[0]) {
    uv_timer_init(w.loop, &status_timer);
    status_timer.data = &w;
    uv_timer_start(&status_timer, on_status_timer, 1000, 1000);
    status_on = 1;
  }
  touch_stack();
  uv_run(w.loop, UV_RUN_DEFAULT);
  if (w.run) pw_run_free(w.run);
  pw_control_reader_free(&w.ctl_reader);
  pw_dscache_close(w.cache);
  pw_snapstore_free(&w.snaps);
  int rc = uv_loop_close(w.loop);
  if (rc) pw_warn("loop close: %s", uv_strerror(rc));
  pw_info("stopped");
  return 0;
}
