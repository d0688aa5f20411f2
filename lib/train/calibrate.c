/* calibrate: the measurements behind a calibration profile. */
#include "calibrate.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "optim.h"
#include "prog.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define MAX_REPS 64

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static void fill(float *p, size_t n, unsigned seed) {
  for (size_t k = 0; k < n; k++) p[k] = 0.01f * (float)((int)((k * 2654435761u + seed) % 201u) - 100) / 100.0f;
}

/* Float input ports and, without the loss, the output ports' gradients:
 * small values (int32 ports, tokens and targets, stay 0: a valid id). */
static void fill_ports(pw_prog *p, const pw_model *m) {
  for (int k = 0; k < pw_prog_n_inputs(p); k++) {
    const pw_prog_port *pt = pw_prog_input(p, k);
    if (m->values[pt->value].dtype == PW_DT_F32) fill(pw_prog_value(p, 0, pt->value), pt->bytes / sizeof(float), 1);
  }
  for (int k = 0; k < pw_prog_n_outputs(p); k++) {
    const pw_prog_port *pt = pw_prog_output(p, k);
    float *g = pw_prog_grad(p, 0, pt->value);
    if (g) fill(g, pt->bytes / sizeof(float), 2);
  }
}

static int unit_prog(const pw_job *job, const pw_model *m, int lo, int hi, int mb, pw_prog **p, pw_err *err) {
  pw_prog_config cfg = {.layer_lo = lo, .layer_hi = hi, .mb_size = mb, .batch_size = job->train.batch_size,
                        .n_slots = 1, .bf16 = job->train.precision == PW_PRECISION_BF16};
  int rc = pw_prog_create(m, &cfg, p, err);
  if (rc) return rc;
  pw_prog_init_params(*p, 1);
  fill_ports(*p, m);
  return 0;
}

/* One microbatch through p: F, then (training) I, W and the step end;
 * the four durations into t. */
static int run_once(const pw_job *job, pw_prog *p, double t[4]) {
  int rc, fwd = job->mode == PW_MODE_FORWARD;
  double t0 = now();
  float loss;
  if ((rc = pw_prog_forward(p, 0, &loss))) return rc;
  double t1 = now();
  if (!fwd && (rc = pw_prog_backward_input(p, 0))) return rc;
  double t2 = now();
  if (!fwd && (rc = pw_prog_backward_weight(p, 0))) return rc;
  double t3 = now();
  if (!fwd) {
    pw_prog_grads_finalize(p);
    pw_step_sched sc = pw_step_sched_of(&job->train, 0, pw_grad_sqnorm(p, NULL, 0));
    pw_optim_update(p, &job->train, &sc);
    pw_prog_zero_grad(p);
  }
  t[0] = t1 - t0, t[1] = t2 - t1, t[2] = t3 - t2, t[3] = now() - t3;
  return 0;
}

/* Layers [lo, hi) at mb sequences: median F, I, W into f, i, w; the step
 * end's seconds and the program's trainable parameters into *opt, *params. */
static int time_unit(const pw_job *job, const pw_model *m, int lo, int hi, int mb, double target, double *f, double *i,
                     double *w, double *opt, size_t *params, pw_err *err) {
  pw_prog *p = NULL;
  int rc = unit_prog(job, m, lo, hi, mb, &p, err);
  if (rc) return rc;
  double tf[MAX_REPS], ti[MAX_REPS], tw[MAX_REPS], to[MAX_REPS], t[4];
  int n = 0;
  double t_end = now() + target;
  /* one untimed round first: page faults and caches */
  for (int warm = 1; n < MAX_REPS && (warm || n < 3 || now() < t_end); warm = 0) {
    if ((rc = run_once(job, p, t))) break;
    if (warm) continue;
    tf[n] = t[0], ti[n] = t[1], tw[n] = t[2], to[n] = t[3];
    n++;
  }
  if (!rc) {
    *f = median(tf, n);
    *i = median(ti, n);
    *w = median(tw, n);
    *opt = median(to, n);
    *params = pw_prog_train_numel(p);
  } else {
    rc = pw_err_set(err, rc, "calibrate", "layers %s..%s: a kernel failed", m->layers[lo].name, m->layers[hi - 1].name);
  }
  pw_prog_free(p);
  return rc;
}

/* ---- a thread's wake-up: a condition variable ping-pong --------------------- */

#define WAKE_ROUNDS 2000

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int turn; /* 0: the main thread's, 1: the peer's; -1 ends */
} wake_pp;

static void *wake_peer(void *arg) {
  wake_pp *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (w->turn == 0) pthread_cond_wait(&w->cv, &w->mu);
    if (w->turn < 0) break;
    w->turn = 0;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* Half the mean round trip of a turn handed to a waiting thread and back:
 * WAKE_ROUNDS back to back, or with `until` > 0, one every millisecond
 * until then (so the two threads mostly sleep, as a rank waiting for a
 * frame does, and busy processes beside them keep the cores). */
static int measure_wake(double until, double *wake, pw_err *err) {
  wake_pp w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  pthread_t th;
  if (pthread_create(&th, NULL, wake_peer, &w)) return pw_err_set(err, PW_EIO, "calibrate.link", "no thread");
  double *rt = malloc(WAKE_ROUNDS * sizeof *rt);
  pthread_mutex_lock(&w.mu);
  int n = 0;
  for (; n < WAKE_ROUNDS && (until <= 0 || n < 16 || now() < until); n++) {
    if (until > 0) {
      pthread_mutex_unlock(&w.mu);
      nanosleep(&(struct timespec){0, 1000000}, NULL);
      pthread_mutex_lock(&w.mu);
    }
    double t0 = now();
    w.turn = 1;
    pthread_cond_broadcast(&w.cv);
    while (w.turn == 1) pthread_cond_wait(&w.cv, &w.mu);
    if (rt) rt[n] = (now() - t0) / 2;
  }
  w.turn = -1;
  pthread_cond_broadcast(&w.cv);
  pthread_mutex_unlock(&w.mu);
  pthread_join(th, NULL);
  if (!rt) return pw_err_set(err, PW_ENOMEM, "calibrate.link", "out of memory");
  double sum = 0;
  for (int k = 0; k < n; k++) sum += rt[k];
  *wake = sum / n;
  free(rt);
  return 0;
}

/* ---- the link: two threads over loopback TCP ---------------------------- */

#define LINK_PINGS 200
#define LINK_BULK ((size_t)1 << 20)
#define LINK_ROUNDS 16

static int full_io(int fd, void *buf, size_t n, int out) {
  char *c = buf;
  while (n) {
    ssize_t k = out ? send(fd, c, n, MSG_NOSIGNAL) : recv(fd, c, n, 0);
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

/* The peer: echoes each ping, then acks each bulk block with one byte. */
static void *link_peer(void *arg) {
  int fd = accept(*(int *)arg, NULL, NULL);
  char *buf = malloc(LINK_BULK), b = 0;
  if (fd >= 0 && buf) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int k = 0; k < LINK_PINGS; k++)
      if (full_io(fd, &b, 1, 0) || full_io(fd, &b, 1, 1)) break;
    for (int k = 0; k < LINK_ROUNDS; k++)
      if (full_io(fd, buf, LINK_BULK, 0) || full_io(fd, &b, 1, 1)) break;
  }
  free(buf);
  if (fd >= 0) close(fd);
  return NULL;
}

static int measure_link(double *latency, double *bandwidth, pw_err *err) {
  int ls = socket(AF_INET, SOCK_STREAM, 0), fd = -1, rc = PW_EIO;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  pthread_t th;
  char *buf = calloc(LINK_BULK, 1), b = 1;
  if (ls < 0 || !buf || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&a, &al) || pthread_create(&th, NULL, link_peer, &ls)) {
    if (ls >= 0) close(ls);
    free(buf);
    return pw_err_set(err, PW_EIO, "calibrate.link", "cannot open a loopback socket");
  }
  fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  if (fd >= 0 && !connect(fd, (struct sockaddr *)&a, sizeof a)) {
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    double rt[LINK_PINGS], bw[LINK_ROUNDS];
    int ok = 1;
    for (int k = 0; k < LINK_PINGS && ok; k++) {
      double t0 = now();
      ok = !full_io(fd, &b, 1, 1) && !full_io(fd, &b, 1, 0);
      rt[k] = (now() - t0) / 2;
    }
    for (int k = 0; k < LINK_ROUNDS && ok; k++) {
      double t0 = now();
      ok = !full_io(fd, buf, LINK_BULK, 1) && !full_io(fd, &b, 1, 0);
      bw[k] = (double)LINK_BULK / (now() - t0); /* one ack latency included: small beside 1 MiB */
    }
    if (ok) {
      *latency = median(rt, LINK_PINGS);
      *bandwidth = median(bw, LINK_ROUNDS);
      rc = 0;
    }
  }
  if (fd >= 0) close(fd);
  pthread_join(th, NULL);
  close(ls);
  free(buf);
  return rc ? pw_err_set(err, PW_EIO, "calibrate.link", "the loopback transfer failed") : 0;
}

/* ---- the profile ----------------------------------------------------------- */

static json_t *series(const double *v, int n) {
  json_t *a = json_array();
  for (int k = 0; k < n; k++) json_array_append_new(a, json_real(v[k]));
  return a;
}

/* ---- core sharing: n busy processes at once --------------------------------- */

/* n children run p's microbatch; each one's rate (microbatches per
 * second) summed into *sum, and a wake-up measured beside them
 * (measure_wake) into *wake. Each child first runs one untimed microbatch
 * (its copy-on-write faults and cold caches would otherwise weigh on the
 * one or two timed ones of a crowded round), then all start together, and
 * each keeps computing after its own window until every child has
 * measured: a child that stopped early would speed up the others. */
static int busy_round(const pw_job *job, pw_prog *p, int n, double dur, double *sum, double *wake) {
  int ready[2], go[2], res[2];
  if (pipe(ready)) return -1;
  if (pipe(go)) {
    close(ready[0]), close(ready[1]);
    return -1;
  }
  if (pipe(res)) {
    close(ready[0]), close(ready[1]), close(go[0]), close(go[1]);
    return -1;
  }
  int started = 0;
  for (; started < n; started++) {
    pid_t pid = fork();
    if (pid < 0) break;
    if (pid == 0) {
      close(ready[0]), close(go[1]), close(res[0]);
      double t[4], last = 0, rate = 0, t0;
      int reps = 0, ok = run_once(job, p, t) == 0;
      char c = ok;
      if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1 || c != 1) _exit(1);
      t0 = now();
      while (ok) { /* at least one: a rate even when one microbatch outlasts dur */
        if (run_once(job, p, t)) ok = 0;
        else reps++, last = now();
        if (last >= t0 + dur) break;
      }
      if (reps && last > t0) rate = reps / (last - t0);
      if (write(res[1], &rate, sizeof rate) != (ssize_t)sizeof rate) _exit(1);
      /* go's write end closes when every rate is in: load until then */
      struct pollfd pf = {.fd = go[0], .events = POLLIN};
      while (ok && poll(&pf, 1, 0) == 0) (void)run_once(job, p, t);
      _exit(ok ? 0 : 1);
    }
  }
  close(ready[1]), close(go[0]), close(res[1]);
  int ok = started == n;
  char c = 1;
  for (int k = 0; k < started; k++) {
    char r = 0;
    if (read(ready[0], &r, 1) != 1 || r != 1) ok = 0;
  }
  if (!ok) c = 0;
  for (int k = 0; k < started; k++)
    if (write(go[1], &c, 1) != 1) ok = 0;
  pw_err werr = {0};
  if (ok && measure_wake(now() + dur, wake, &werr)) ok = 0;
  *sum = 0;
  for (int k = 0; k < started; k++) {
    double rate = 0;
    if (read(res[0], &rate, sizeof rate) != (ssize_t)sizeof rate || rate <= 0) ok = 0;
    *sum += rate;
  }
  close(go[1]);
  while (started-- > 0) {
    int st;
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) ok = 0;
  }
  close(ready[0]), close(res[0]);
  return ok ? 0 : -1;
}

#define SHARE_REPS 3

/* speed[n-1] for n = 1..n_max: each of n busy one-thread processes' rate
 * on the largest unit (layers [lo, hi)) at mb, relative to one alone in
 * the same pass; wake[n-1] a thread's wake-up beside them. The median of
 * SHARE_REPS passes over n = 1..n_max: other work that comes and goes on
 * the host moves one pass, not the figure. */
static int measure_sharing(const pw_job *job, const pw_model *m, int lo, int hi, int mb, int n_max, double dur,
                           double *speed, double *wake, pw_err *err) {
  pw_prog *p = NULL;
  int rc = unit_prog(job, m, lo, hi, mb, &p, err);
  if (rc) return rc;
  double t[4], sp[PW_CALIB_MAX_SHARE][SHARE_REPS], wk[PW_CALIB_MAX_SHARE][SHARE_REPS];
  if ((rc = run_once(job, p, t))) rc = pw_err_set(err, rc, "calibrate.sharing", "a kernel failed");
  for (int rep = 0; rep < SHARE_REPS && !rc; rep++) {
    double alone = 0, sum = 0;
    for (int n = 1; n <= n_max && !rc; n++) {
      if (busy_round(job, p, n, dur, &sum, &wk[n - 1][rep]))
        rc = pw_err_set(err, PW_EIO, "calibrate.sharing", "%d busy processes failed", n);
      else if (n == 1)
        alone = sum;
      if (!rc) sp[n - 1][rep] = fmin(1.0, sum / n / alone);
    }
  }
  for (int n = 1; n <= n_max && !rc; n++) {
    speed[n - 1] = median(sp[n - 1], SHARE_REPS);
    wake[n - 1] = median(wk[n - 1], SHARE_REPS);
  }
  pw_prog_free(p);
  return rc;
}

/* The step end per program: fixed + per_param x params, least squares
 * over the units (x params, y seconds); a negative intercept is 0. */
static void step_fit(const double *x, const double *y, int n, double *fixed, double *per_param) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int k = 0; k < n; k++) sx += x[k], sy += y[k], sxx += x[k] * x[k], sxy += x[k] * y[k];
  double d = n * sxx - sx * sx;
  *per_param = d > 0 ? (n * sxy - sx * sy) / d : 0;
  *fixed = d > 0 ? (sy - *per_param * sx) / n : 0;
  if (*fixed < 0 || *per_param < 0) *fixed = 0, *per_param = sx > 0 ? sy / sx : 0;
}

int pw_calibrate(const pw_job *job, const pw_calib_opts *o, json_t **out, pw_err *err) {
  pw_model m;
  int rc = pw_model_build(&job->model, &m, err);
  if (rc) return rc;
  if ((rc = pw_model_set_trainable(&m, &job->train, err))) {
    pw_model_free(&m);
    return rc;
  }
  int L = m.n_layers, n_mb = o->n_mb, n_units = 0, big = 0;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = o->cores > 0 ? o->cores : (int)(cpus > 0 ? cpus : 1);
  double target = o->target_s > 0 ? o->target_s : 0.02;
  double *t = calloc((size_t)L * 3 * (size_t)n_mb, sizeof(double));
  double *ux = calloc((size_t)L, sizeof(double)), *uy = calloc((size_t)L, sizeof(double));
  json_t *layers = json_array();
  if (!t || !ux || !uy) rc = pw_err_set(err, PW_ENOMEM, "calibrate", "out of memory");
  for (int lo = 0, hi; lo < L && !rc; lo = hi) {
    for (hi = lo + 1; hi < L && m.layers[hi].is_loss;) hi++;
    double *c = t + ((size_t)lo * 3) * (size_t)n_mb;
    for (int k = 0; k < n_mb && !rc; k++) {
      double opt = 0;
      size_t params = 0;
      rc = time_unit(job, &m, lo, hi, o->mb[k], target, &c[k], &c[n_mb + k], &c[2 * n_mb + k], &opt, &params, err);
      if (k == 0) { /* the optimizer does not depend on the microbatch size */
        ux[n_units] = (double)params;
        uy[n_units] = opt;
      }
    }
    if (!rc && c[n_mb / 2] > t[(size_t)big * 3 * (size_t)n_mb + (size_t)n_mb / 2]) big = lo;
    n_units++;
  }
  for (int l = 0; l < L && !rc; l++) {
    double *c = t + ((size_t)l * 3) * (size_t)n_mb;
    json_array_append_new(layers, json_pack("{s:s, s:o, s:o, s:o}", "name", m.layers[l].name, "f", series(c, n_mb),
                                            "i", series(c + n_mb, n_mb), "w", series(c + 2 * n_mb, n_mb)));
  }
  double latency = 50e-6, bandwidth = 3e9, wake = 0, fixed = 0, per_param = 0, speed[PW_CALIB_MAX_SHARE],
         wake_busy[PW_CALIB_MAX_SHARE];
  int n_speed = o->share ? (2 * cores < PW_CALIB_MAX_SHARE ? 2 * cores : PW_CALIB_MAX_SHARE) : 0;
  if (!rc && o->link) rc = measure_link(&latency, &bandwidth, err);
  if (!rc && o->link) rc = measure_wake(0, &wake, err);
  if (!rc && n_speed) {
    int hi = big + 1;
    while (hi < L && m.layers[hi].is_loss) hi++;
    rc = measure_sharing(job, &m, big, hi, o->mb[n_mb / 2], n_speed, o->share_s > 0 ? o->share_s : 0.5, speed, wake_busy,
                         err);
  }
  step_fit(ux, uy, n_units, &fixed, &per_param);
  if (!rc) {
    json_t *mbs = json_array();
    for (int k = 0; k < n_mb; k++) json_array_append_new(mbs, json_integer(o->mb[k]));
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    *out = json_pack("{s:i, s:s, s:i, s:i, s:o, s:O, s:{s:f, s:f}, s:{s:f, s:f, s:f}}", "version", 2, "host", host,
                     "cores", cores, "threads", o->threads > 0 ? o->threads : 1, "mb_sizes", mbs, "layers", layers,
                     "step", "per_param_s", per_param, "fixed_s", fixed, "link", "latency_s", latency, "bandwidth_Bps",
                     bandwidth, "wake_s", wake);
    if (*out && n_speed)
      json_object_set_new(*out, "sharing", json_pack("{s:o, s:o}", "speed", series(speed, n_speed), "wake_s",
                                                     series(wake_busy, n_speed)));
    if (!*out) rc = pw_err_set(err, PW_ENOMEM, "calibrate", "out of memory");
  }
  json_decref(layers);
  free(t);
  free(ux);
  free(uy);
  pw_model_free(&m);
  return rc;
}
