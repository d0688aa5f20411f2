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
#include "sysres.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* This thread's CPU time: against the wall clock, the share of a core the
 * timed layers got (below 1: something else ran on the host). */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
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

/* Every unit (a layer, with a loss layer after it) at mb sequences, as a
 * microbatch passes through a stage holding the whole model: each unit's F
 * in order, then its I and W in reverse, so that between two uses of a
 * layer the others' weights, gradients and activations have gone through
 * the caches as in a run (timed one layer at a time, a small model's
 * layers stayed cached and measured up to 10 % fast at one sequence).
 * Repeated until about target seconds per unit (at least 3 times, one
 * untimed pass first); the medians into c (the table's rows at size k:
 * c[lo * 3 * n_mb + d * n_mb + k], d = F, I, W). With opt: each unit's
 * step end, timed after the pass, into opt[u] and its trainable
 * parameters into params[u]. */
static int time_units(const pw_job *job, const pw_model *m, int mb, double target, double *c, int k, int n_mb,
                      double *opt, double *params, pw_err *err) {
  int L = m->n_layers, n = 0, rc = 0, reps = 0;
  int *lo = calloc((size_t)L + 1, sizeof(int));
  pw_prog **p = calloc((size_t)L, sizeof *p);
  double *tm = calloc((size_t)L * 4 * MAX_REPS, sizeof(double)); /* [u][d][rep] */
  if (!lo || !p || !tm) rc = pw_err_set(err, PW_ENOMEM, "calibrate", "out of memory");
  for (int l = 0; l < L && !rc; n++) {
    lo[n] = l;
    for (l++; l < L && m->layers[l].is_loss;) l++;
    lo[n + 1] = l;
    rc = unit_prog(job, m, lo[n], l, mb, &p[n], err);
  }
  int fwd = job->mode == PW_MODE_FORWARD;
  double t_end = now() + target * n;
  for (int pass = 0; !rc && pass <= MAX_REPS && (pass < 4 || now() < t_end); pass++) {
    double *row = pass ? tm + reps : NULL; /* pass 0: untimed */
    float loss;
    for (int u = 0; u < n && !rc; u++) {
      double t0 = now();
      rc = pw_prog_forward(p[u], 0, &loss, err);
      if (row) row[(u * 4 + 0) * MAX_REPS] = now() - t0;
    }
    for (int u = n - 1; u >= 0 && !rc && !fwd; u--) {
      double t0 = now();
      rc = pw_prog_backward_input(p[u], 0, err);
      double t1 = now();
      if (!rc) rc = pw_prog_backward_weight(p[u], 0, err);
      if (row) row[(u * 4 + 1) * MAX_REPS] = t1 - t0, row[(u * 4 + 2) * MAX_REPS] = now() - t1;
    }
    for (int u = 0; u < n && !rc && !fwd && opt; u++) {
      double t0 = now();
      pw_prog_grads_finalize(p[u]);
      pw_step_sched sc = pw_step_sched_of(&job->train, 0, pw_grad_sqnorm(p[u], NULL, 0));
      pw_optim_update(p[u], &job->train, &sc);
      pw_prog_zero_grad(p[u]);
      if (row) row[(u * 4 + 3) * MAX_REPS] = now() - t0;
    }
    if (row) reps++;
  }
  for (int u = 0; u < n && !rc; u++) {
    for (int d = 0; d < 3; d++) c[((size_t)lo[u] * 3 + (size_t)d) * (size_t)n_mb + (size_t)k] = median(tm + (u * 4 + d) * MAX_REPS, reps);
    if (opt) opt[u] = median(tm + (u * 4 + 3) * MAX_REPS, reps), params[u] = (double)pw_prog_train_numel(p[u]);
  }
  for (int u = 0; p && u < n; u++) pw_prog_free(p[u]);
  free(lo);
  free(p);
  free(tm);
  return rc ? rc : n;
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

/* One microbatch through p's F, I and W, no step end: the sharing rounds
 * time what the layer table holds (gradients just accumulate). */
static int run_fiw(const pw_job *job, pw_prog *p) {
  float loss;
  int rc = pw_prog_forward(p, 0, &loss, NULL); /* a child: its exit status says it failed */
  if (!rc && job->mode != PW_MODE_FORWARD && !(rc = pw_prog_backward_input(p, 0, NULL)))
    rc = pw_prog_backward_weight(p, 0, NULL);
  return rc;
}

/* n children, child c running p[c]'s microbatch; each one's rate
 * (microbatches per second) into rate[c], and a wake-up measured beside
 * them (measure_wake) into *wake. Each child first runs one untimed
 * microbatch (its copy-on-write faults and cold caches would otherwise
 * weigh on the one or two timed ones of a crowded round), then all start
 * together, and each keeps computing after its own window until every
 * child has measured: a child that stopped early would speed up the
 * others. */
static int busy_round(const pw_job *job, pw_prog **p, int n, double dur, double *rate, double *wake) {
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
      pw_prog *q = p[started];
      double last = 0, r[2] = {started, 0}, t0;
      int reps = 0, ok = run_fiw(job, q) == 0;
      char c = ok;
      if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1 || c != 1) _exit(1);
      t0 = now();
      while (ok) { /* at least one: a rate even when one microbatch outlasts dur */
        if (run_fiw(job, q)) ok = 0;
        else reps++, last = now();
        if (last >= t0 + dur) break;
      }
      if (reps && last > t0) r[1] = reps / (last - t0);
      if (write(res[1], r, sizeof r) != (ssize_t)sizeof r) _exit(1);
      /* go's write end closes when every rate is in: load until then */
      struct pollfd pf = {.fd = go[0], .events = POLLIN};
      while (ok && poll(&pf, 1, 0) == 0) (void)run_fiw(job, q);
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
  for (int k = 0; k < started; k++) {
    double r[2] = {-1, 0};
    if (read(res[0], r, sizeof r) != (ssize_t)sizeof r || r[0] < 0 || r[0] >= n || r[1] <= 0) ok = 0;
    else rate[(int)r[0]] = r[1];
  }
  close(go[1]);
  while (started-- > 0) {
    int st;
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) ok = 0;
  }
  close(ready[0]), close(res[0]);
  return ok ? 0 : -1;
}

#define SHARE_REPS 5

/* The parts of the model n processes would run (as n pipeline ranks on
 * this host: contiguous, together the whole model): part c ends where the
 * running time passes (c + 1) / n of the total; alone[c], its time alone
 * (fiw[l]: layer l's F + I + W from the table). More parts than layers:
 * the last ones stay empty (NULL). */
static int build_parts(const pw_job *job, const pw_model *m, const double *fiw, int mb, int n, pw_prog **p,
                       double *alone, pw_err *err) {
  int L = m->n_layers, rc = 0;
  double total = 0, done = 0; /* done: the time of parts 0 .. c-1 */
  for (int l = 0; l < L; l++) total += fiw[l];
  for (int c = 0, lo = 0, hi = 0; c < n && !rc; c++, lo = hi) {
    double t = 0;
    while (hi < L && (hi == lo || c == n - 1 || done + t + fiw[hi] / 2 <= total * (c + 1) / n)) {
      t += fiw[hi++];
      while (hi < L && m->layers[hi].is_loss) hi++;
    }
    alone[c] = t;
    done += t;
    p[c] = NULL;
    if (hi > lo) rc = unit_prog(job, m, lo, hi, mb, &p[c], err);
  }
  return rc;
}

/* One round of n processes on parts p: the mean over the n of a process's
 * rate times its part's time alone (an empty part counts as an idle
 * process); the wake-up beside them into *wake. */
static int share_round(const pw_job *job, pw_prog **p, const double *alone, int n, double dur, double *s,
                       double *wake, pw_err *err) {
  double rate[PW_CALIB_MAX_SHARE];
  int k = 0;
  while (k < n && p[k]) k++; /* the parts that have layers */
  if (busy_round(job, p, k, dur, rate, wake))
    return pw_err_set(err, PW_EIO, "calibrate.sharing", "%d busy processes failed", k);
  *s = 0;
  for (int c = 0; c < k; c++) *s += rate[c] * alone[c];
  *s /= n;
  return 0;
}

/* speed[n-1] for n = 1..n_max: n one-thread processes at once, each
 * running one of n parts of the model at mb (build_parts), so caches and
 * memory are shared as in a pipeline run, against n = 1 in the round just
 * before (other work that comes and goes on the host moves a pair, not
 * the figure); the median of SHARE_REPS pairs. wake[n-1]: a thread's
 * wake-up beside them. Only n = 1's program and the current n's parts are
 * built at a time: two copies of the model, whatever n_max. */
static int measure_sharing(const pw_job *job, const pw_model *m, const double *fiw, int mb, int n_max, double dur,
                           double *speed, double *wake, pw_err *err) {
  double sp[SHARE_REPS], wk[SHARE_REPS], wk1[PW_CALIB_MAX_SHARE * SHARE_REPS], one_alone, alone[PW_CALIB_MAX_SHARE];
  pw_prog *one = NULL, *p[PW_CALIB_MAX_SHARE] = {0};
  int rc = build_parts(job, m, fiw, mb, 1, &one, &one_alone, err), n1 = 0;
  for (int n = 2; n <= n_max && !rc; n++) {
    rc = build_parts(job, m, fiw, mb, n, p, alone, err);
    for (int rep = 0; rep < SHARE_REPS && !rc; rep++) {
      double s1 = 1, s = 0;
      if (!(rc = share_round(job, &one, &one_alone, 1, dur, &s1, &wk1[n1++], err)))
        rc = share_round(job, p, alone, n, dur, &s, &wk[rep], err);
      if (!rc) sp[rep] = fmin(1.0, s / s1);
    }
    if (!rc) speed[n - 1] = median(sp, SHARE_REPS), wake[n - 1] = median(wk, SHARE_REPS);
    for (int c = 0; c < n; c++) pw_prog_free(p[c]), p[c] = NULL;
  }
  for (int rep = 0; n_max == 1 && rep < SHARE_REPS && !rc; rep++) { /* n = 1 alone still has a wake-up */
    double s1 = 0;
    rc = share_round(job, &one, &one_alone, 1, dur, &s1, &wk1[n1++], err);
  }
  if (!rc) speed[0] = 1, wake[0] = median(wk1, n1);
  pw_prog_free(one);
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
  pw_model_set_attention(&m, job->train.attention);
  if ((rc = pw_model_set_trainable(&m, &job->train, err))) {
    pw_model_free(&m);
    return rc;
  }
  int L = m.n_layers, n_mb = o->n_mb, n_units = 0;
  /* the cores this process may use (its cgroup, its affinity mask), as a
   * worker reports them: the profile's ranks run where workers run */
  int cores = o->cores > 0 ? o->cores : pw_sysres_cores();
  double target = o->target_s > 0 ? o->target_s : 0.02;
  double *t = calloc((size_t)L * 3 * (size_t)n_mb, sizeof(double));
  double *ux = calloc((size_t)L, sizeof(double)), *uy = calloc((size_t)L, sizeof(double));
  json_t *layers = json_array();
  if (!t || !ux || !uy) rc = pw_err_set(err, PW_ENOMEM, "calibrate", "out of memory");
  double wall0 = now(), cpu0 = cpu_now();
  for (int k = 0; k < n_mb && !rc; k++) { /* the step end does not depend on the microbatch size */
    rc = time_units(job, &m, o->mb[k], target, t, k, n_mb, k ? NULL : uy, k ? NULL : ux, err);
    if (rc > 0) n_units = rc, rc = 0;
  }
  double cpu_share = (cpu_now() - cpu0) / (now() - wall0 + 1e-12);
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
    double *fiw = calloc((size_t)L, sizeof(double));
    for (int l = 0; fiw && l < L; l++)
      for (int d = 0; d < 3; d++) fiw[l] += t[((size_t)l * 3 + (size_t)d) * (size_t)n_mb + (size_t)n_mb / 2];
    rc = fiw ? measure_sharing(job, &m, fiw, o->mb[n_mb / 2], n_speed, o->share_s > 0 ? o->share_s : 0.3, speed,
                               wake_busy, err)
             : pw_err_set(err, PW_ENOMEM, "calibrate", "out of memory");
    free(fiw);
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
    if (*out) json_object_set_new(*out, "cpu_share", json_real(round(fmin(cpu_share, 1) * 1000) / 1000));
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
