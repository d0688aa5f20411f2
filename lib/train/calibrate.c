/* calibrate: the measurements behind a calibration profile. */
#include "calibrate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

/* Layers [lo, hi) at mb sequences: median F, I, W into f, i, w; the step
 * end's seconds and the program's trainable parameters into *opt, *params. */
static int time_unit(const pw_job *job, const pw_model *m, int lo, int hi, int mb, double target, double *f, double *i,
                     double *w, double *opt, size_t *params, pw_err *err) {
  pw_prog_config cfg = {.layer_lo = lo, .layer_hi = hi, .mb_size = mb, .batch_size = job->train.batch_size,
                        .n_slots = 1, .bf16 = job->train.precision == PW_PRECISION_BF16};
  pw_prog *p = NULL;
  int rc = pw_prog_create(m, &cfg, &p, err);
  if (rc) return rc;
  pw_prog_init_params(p, 1);
  fill_ports(p, m);
  double tf[MAX_REPS], ti[MAX_REPS], tw[MAX_REPS], to[MAX_REPS];
  int n = 0, fwd = job->mode == PW_MODE_FORWARD;
  double t_end = now() + target;
  /* one untimed round first: page faults and caches */
  for (int warm = 1; n < MAX_REPS && (warm || n < 3 || now() < t_end); warm = 0) {
    double t0 = now();
    float loss;
    if ((rc = pw_prog_forward(p, 0, &loss))) break;
    double t1 = now();
    if (!fwd && (rc = pw_prog_backward_input(p, 0))) break;
    double t2 = now();
    if (!fwd && (rc = pw_prog_backward_weight(p, 0))) break;
    double t3 = now();
    if (!fwd) {
      pw_prog_grads_finalize(p);
      pw_step_sched sc = pw_step_sched_of(&job->train, 0, pw_grad_sqnorm(p, NULL, 0));
      pw_optim_update(p, &job->train, &sc);
      pw_prog_zero_grad(p);
    }
    double t4 = now();
    if (warm) continue;
    tf[n] = t1 - t0;
    ti[n] = t2 - t1;
    tw[n] = t3 - t2;
    to[n] = t4 - t3;
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

int pw_calibrate(const pw_job *job, const pw_calib_opts *o, json_t **out, pw_err *err) {
  pw_model m;
  int rc = pw_model_build(&job->model, &m, err);
  if (rc) return rc;
  if ((rc = pw_model_set_trainable(&m, &job->train, err))) {
    pw_model_free(&m);
    return rc;
  }
  int L = m.n_layers, n_mb = o->n_mb;
  double target = o->target_s > 0 ? o->target_s : 0.02, opt_s = 0, opt_params = 0;
  double *t = calloc((size_t)L * 3 * (size_t)n_mb, sizeof(double));
  json_t *layers = json_array();
  if (!t) rc = pw_err_set(err, PW_ENOMEM, "calibrate", "out of memory");
  for (int lo = 0, hi; lo < L && !rc; lo = hi) {
    for (hi = lo + 1; hi < L && m.layers[hi].is_loss;) hi++;
    for (int k = 0; k < n_mb && !rc; k++) {
      double *c = t + ((size_t)lo * 3) * (size_t)n_mb;
      double opt = 0;
      size_t params = 0;
      rc = time_unit(job, &m, lo, hi, o->mb[k], target, &c[k], &c[n_mb + k], &c[2 * n_mb + k], &opt, &params, err);
      if (k == 0) { /* the optimizer does not depend on the microbatch size */
        opt_s += opt;
        opt_params += (double)params;
      }
    }
  }
  for (int l = 0; l < L && !rc; l++) {
    double *c = t + ((size_t)l * 3) * (size_t)n_mb;
    json_array_append_new(layers, json_pack("{s:s, s:o, s:o, s:o}", "name", m.layers[l].name, "f", series(c, n_mb),
                                            "i", series(c + n_mb, n_mb), "w", series(c + 2 * n_mb, n_mb)));
  }
  double latency = 50e-6, bandwidth = 3e9;
  if (!rc && o->link) rc = measure_link(&latency, &bandwidth, err);
  if (!rc) {
    json_t *mbs = json_array();
    for (int k = 0; k < n_mb; k++) json_array_append_new(mbs, json_integer(o->mb[k]));
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    *out = json_pack("{s:i, s:s, s:i, s:i, s:o, s:O, s:{s:f, s:f}, s:{s:f, s:f}}", "version", 1, "host", host, "cores",
                     o->cores > 0 ? o->cores : (int)(cpus > 0 ? cpus : 1), "threads", o->threads > 0 ? o->threads : 1,
                     "mb_sizes", mbs, "layers", layers, "step", "per_param_s",
                     opt_params > 0 ? opt_s / opt_params : 0.0, "fixed_s", 0.0, "link", "latency_s", latency,
                     "bandwidth_Bps", bandwidth);
    if (!*out) rc = pw_err_set(err, PW_ENOMEM, "calibrate", "out of memory");
  }
  json_decref(layers);
  free(t);
  pw_model_free(&m);
  return rc;
}
