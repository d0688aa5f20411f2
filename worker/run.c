/* run: one assignment — a rank of a job — from the assign message to done.
 *
 * Everything the rank runs comes from the assignment's slice of the plan
 * (lib/plan/slice.h: the compiled graph, its stages and their slots, its
 * action list, the tied table, the training config), checked against its
 * SHA-256 first; the worker builds its stage programs from it and never
 * re-partitions, re-plans or reads the model spec. pw_run_create makes a
 * run from it without a daemon (the tests do too); pw_run_start gives it
 * to the worker. Once the links to its peers are up, the run's compute
 * thread (exec.c) opens its files and walks the list step after step; this
 * file is the loop thread's side: the lifecycle, the links, and the events
 * the compute thread queues (frames to write, step reports, done, failed);
 * and the frame checks and counters the compute thread calls as it reads
 * its inbound links (recv.c). run.h says who owns which field.
 *
 * Slots: microbatch mb of local stage li lives in slot mb_slot[mb] from the
 * moment its first input arrives (or its F starts) until its backward is
 * complete (B, or W after I) and every send reading the slot has finished.
 * Frames of the next step may arrive before this rank finishes the current
 * one (a neighbour that stepped its optimizer first); arrival counters are
 * tagged with their step for that reason. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckptxfer.h"
#include "log.h"
#include "serve.h"
#include "slice.h"
#include "worker.h"

static void finish(pw_run *r, int ok);
static void on_events(uv_async_t *h);

/* ---- helpers ------------------------------------------------------------ */

static int port_index(const pw_prog_port *(*get)(const pw_prog *, int), int n, const pw_prog *p, int value) {
  for (int i = 0; i < n; i++)
    if (get(p, i)->value == value) return i;
  return -1;
}

/* The stage that produces / consumes value v (chain models: one each). */
int pw_run_producer(const pw_run *r, int v) {
  for (int e = 0; e < r->part.n_edges; e++)
    if (r->part.edges[e].value == v) return r->part.edges[e].src;
  return -1;
}

int pw_run_consumer(const pw_run *r, int v) {
  for (int e = 0; e < r->part.n_edges; e++)
    if (r->part.edges[e].value == v) return r->part.edges[e].dst;
  return -1;
}

int pw_run_rank_of(const pw_run *r, int d, int prank) { return (d * r->pp + prank) * r->tp + r->tp_rank; }

int pw_run_global_rank(const pw_run *r, int stage) { return pw_run_rank_of(r, r->replica, r->rank_of_stage[stage]); }

int pw_run_slot_for(pw_run *r, int li, int mb, pw_err *err) {
  const pw_lstage *ls = &r->ls[li];
  pw_lstage_shared *ss = &r->sh.ls[li];
  pw_lstage_compute *lc = &r->cp.ls[li];
  if (lc->mb_slot[mb] >= 0) return lc->mb_slot[mb];
  int max = pw_prog_max_slots(ls->prog);
  for (int s = 0; s < max; s++) {
    if (ss->slot_busy[s]) continue;
    if (pw_prog_slot_ensure(ls->prog, s))
      return pw_err_set(err, PW_ENOMEM, "slots", "out of memory for an activation slot");
    ss->slot_busy[s] = 1;
    lc->mb_slot[mb] = s;
    return s;
  }
  return pw_err_set(err, PW_EINTERNAL, "slots", "stage %d: all %d slots in use", ls->stage, max);
}

void pw_run_slot_release(pw_run *r, int li, int mb) {
  pw_lstage_shared *ss = &r->sh.ls[li];
  pw_lstage_compute *lc = &r->cp.ls[li];
  int s = lc->mb_slot[mb];
  if (s < 0) return;
  lc->mb_slot[mb] = -1;
  if (ss->slot_sends[s])
    ss->slot_free_pending[s] = 1;
  else
    ss->slot_busy[s] = 0;
}

static void maybe_free(pw_run *r) {
  if (r->lp.closing && !r->lp.thread_running && r->lp.sends_inflight == 0) pw_run_free(r);
}

void pw_run_send_done(pw_run *r, int to, int li, int slot) {
  r->lp.sends_inflight--;
  if (to >= 0) {
    uv_mutex_lock(&r->sh.wmu);
    r->sh.wl[to].queued--;
    uv_mutex_unlock(&r->sh.wmu);
  }
  if (li >= 0 && slot >= 0 && li < r->n_ls) {
    pw_lstage_shared *ss = &r->sh.ls[li];
    uv_mutex_lock(&r->sh.mu);
    if (--ss->slot_sends[slot] == 0 && ss->slot_free_pending[slot]) {
      ss->slot_free_pending[slot] = 0;
      ss->slot_busy[slot] = 0;
    }
    uv_mutex_unlock(&r->sh.mu);
  }
  maybe_free(r);
}

void pw_run_link_in(pw_run *r, pw_link *l) {
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&l->tcp, &fd) || l->peer_rank < 0 || l->peer_rank >= r->n_ranks) return;
  uv_mutex_lock(&r->sh.mu);
  r->sh.in_fd[l->peer_rank] = fd;
  uv_mutex_unlock(&r->sh.mu);
  pw_exec_wake(r);
}

int pw_run_step(pw_run *r) {
  uv_mutex_lock(&r->sh.mu);
  int step = r->sh.step;
  uv_mutex_unlock(&r->sh.mu);
  return step;
}

/* ---- lifecycle ---------------------------------------------------------- */

static int jint(const json_t *o, const char *k, int dflt) {
  json_t *v = json_object_get(o, k);
  return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

/* Every slot the plan says a stage may need (early arrivals included) is
 * made and first-touched here, so the steps never fault memory in; more
 * are made on demand, up to cap, only if a send holds a slot longer. */
static int setup_stages(pw_run *r, pw_err *err) {
  int cap = r->m * 2 + 2; /* this step's microbatches + early arrivals of the next */
  int rc = 0;
  for (int li = 0; li < r->n_ls && !rc; li++) {
    pw_lstage *ls = &r->ls[li];
    pw_lstage_shared *ss = &r->sh.ls[li];
    pw_lstage_compute *lc = &r->cp.ls[li];
    const pw_stage *st = &r->part.stages[ls->stage];
    int peak = r->peak_slots[li]; /* the slice lists our stages in the order ls holds them */
    pw_prog_config cfg = {.layer_lo = st->layer_lo, .layer_hi = st->layer_hi, .mb_size = r->mb_size,
                          .batch_size = r->spec.train.batch_size, .n_slots = peak < cap ? peak : cap,
                          .max_slots = cap, .remat = r->n_work[li] > 0, .n_work = r->n_work[li],
                          .no_moments = pw_dpx_zero(r) > 0, /* a shard of them in dpx.c */
                          .no_grads = pw_dpx_zero(r) == 2,  /* lent by gradrs.c */
                          .bf16 = r->spec.train.precision == PW_PRECISION_BF16};
    if ((rc = pw_prog_create(&r->model, &cfg, &ls->prog, err))) break;
    if (r->tp > 1 && (rc = pw_prog_set_tp(ls->prog, r->tp_rank, pw_tpx_allreduce, r))) break;
    lc->mb_slot = malloc(sizeof(int) * (size_t)r->m);
    lc->act_step = calloc((size_t)r->m, sizeof(int));
    lc->act_got = calloc((size_t)r->m, sizeof(int));
    lc->grad_step = calloc((size_t)r->m, sizeof(int));
    lc->grad_got = calloc((size_t)r->m, sizeof(int));
    ss->slot_busy = calloc((size_t)cap, sizeof(int));
    ss->slot_sends = calloc((size_t)cap, sizeof(int));
    ss->slot_free_pending = calloc((size_t)cap, sizeof(int));
    if (!lc->mb_slot || !lc->act_step || !lc->act_got || !lc->grad_step || !lc->grad_got || !ss->slot_busy ||
        !ss->slot_sends || !ss->slot_free_pending) {
      rc = pw_err_set(err, PW_ENOMEM, "run", "out of memory");
      break;
    }
    for (int k = 0; k < r->m; k++) lc->mb_slot[k] = -1, lc->act_step[k] = lc->grad_step[k] = -1;
    pw_prog *p = ls->prog;
    for (int i = 0; i < pw_prog_n_inputs(p); i++) {
      const pw_prog_port *pt = pw_prog_input(p, i);
      if (pt->role == PW_VAL_INPUT) ls->first_input = 1;
      else if (pt->role == PW_VAL_TARGET) ls->has_target = 1;
      else ls->n_act_in++;
    }
    for (int i = 0; i < pw_prog_n_outputs(p) && !rc; i++) {
      int v = pw_prog_output(p, i)->value, consumers = 0;
      for (int e = 0; e < r->part.n_edges; e++) consumers += r->part.edges[e].value == v;
      if (consumers != 1)
        rc = pw_err_set(err, PW_ENOTSUP, "partition",
                        "stage %d's output value %d feeds %d stages; only chains of stages are supported yet",
                        ls->stage, v, consumers);
      ls->n_grad_in++;
    }
    pw_prog_zero_grad(p);
    if (cfg.remat)
      pw_info("stage %d recomputes: slots of %zu bytes (its ports), %d work buffers of %zu bytes", ls->stage,
              pw_prog_slot_bytes(p), pw_prog_n_work(p), pw_prog_work_bytes(p));
  }
  return rc;
}

/* A file the run reads must be a regular file: opening a FIFO would wait
 * for a writer forever, and a device has no end. Opened without blocking,
 * then checked. */
static int regular_file(const char *path, const char *field, pw_err *err) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return pw_err_set(err, e == ENOENT ? PW_ENOENT : PW_EIO, field, "cannot open %s: %s", path, strerror(e));
  }
  struct stat sb;
  int ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
  close(fd);
  return ok ? 0 : pw_err_set(err, PW_EIO, field, "%s is not a regular file", path);
}

/* A resume that names a step ("12"): the coordinator's copy. */
static int resume_step(const char *resume) {
  if (!resume || !*resume || strlen(resume) > 9) return 0;
  for (const char *p = resume; *p; p++)
    if (*p < '0' || *p > '9') return 0;
  return atoi(resume);
}

/* Stage ls's model and optimizer shards of `step` fetched from the
 * coordinator into temporary files of the state dir, loaded, removed. */
static int load_from_coordinator(pw_run *r, pw_lstage *ls, int step, pw_err *err) {
  char path[1024], opath[1024], url[256];
  int n = snprintf(path, sizeof path, "%s/resume-job-%llu-stage-%d.safetensors", r->ckpt_dir,
                   (unsigned long long)r->job, ls->stage);
  if (n < 0 || (size_t)n >= sizeof path - 32)
    return pw_err_set(err, PW_EINVAL, "resume", "the state directory path is too long");
  pw_ckpt_optim_path(path, opath, sizeof opath);
  pw_xfer x = {.base_url = r->http_url, .token = r->token, .abort = &r->sh.abort};
  int rc = 0;
  /* A stage file is its parameters and two moments: bounded well above. */
  uint64_t max = (uint64_t)pw_prog_grad_numel(ls->prog) * 4 * 4 + ((uint64_t)1 << 24);
  for (int opt = 0; opt < 2 && !rc; opt++) {
    snprintf(url, sizeof url, "/v1/jobs/%llu/checkpoints/%d/stages/%d%s", (unsigned long long)r->job, step, ls->stage,
             opt ? "/optimizer" : "");
    rc = pw_xfer_get(&x, url, opt ? opath : path, max, err);
  }
  int got = 0;
  if (!rc) rc = pw_ckpt_load(ls->prog, path, 1, &got, err);
  if (!rc && got != step)
    rc = pw_err_set(err, PW_EFORMAT, "resume", "the coordinator's checkpoint of step %d says step %d", step, got);
  unlink(path); /* nothing kept: the coordinator has it */
  unlink(opath);
  return rc;
}

/* The init weights at `path` (a cache entry) into every local stage: a
 * stage loads its part of the whole-model file. */
typedef struct {
  pw_run *r;
  int optim;
} init_load;

static int load_init(void *arg, const char *path, pw_err *err) {
  init_load *il = arg;
  pw_run *r = il->r;
  int rc = regular_file(path, "init", err);
  for (int li = 0; li < r->n_ls && !rc; li++)
    rc = il->optim ? pw_ckpt_load_optim(r->ls[li].prog, path, err) : pw_ckpt_load(r->ls[li].prog, path, 0, NULL, err);
  return rc;
}

/* Weights `id` fetched through the cache (when absent) and loaded; the
 * entry is held only while it is read. */
static int load_cached(pw_run *r, const char *id, int optim, pw_err *err) {
  if (!r->cache)
    return pw_err_set(err, PW_EINVAL, "init", "weights %s: this run has no cache to fetch them into", id);
  pw_fetch_src src = {.base_url = r->http_url, .token = r->token, .size = 0, .abort = &r->sh.abort, .weights = 1};
  init_load il = {r, optim};
  int rc = pw_dscache_open_entry(r->cache, id, &src, load_init, &il, err);
  if (!rc) pw_dscache_release(r->cache, id);
  return rc;
}

static int load_or_init(pw_run *r, const char *resume, pw_err *err) {
  if (r->restore_step > 0) return pw_snaprun_restore(r, err);
  if (!resume && r->init_sha256[0]) { /* fine-tuning: the init weights, the optimizer fresh unless carried */
    for (int li = 0; li < r->n_ls; li++) /* as pw_trainer_init then pw_trainer_load: drawn, then overwritten */
      pw_prog_init_params(r->ls[li].prog, r->spec.train.seed);
    int rc = load_cached(r, r->init_sha256, 0, err);
    if (!rc && r->init_optim_sha256[0]) rc = load_cached(r, r->init_optim_sha256, 1, err);
    if (!rc) pw_info("job %llu rank %d: parameters from weights %.12s...%s", (unsigned long long)r->job, r->rank,
                     r->init_sha256, r->init_optim_sha256[0] ? " (optimizer state too)" : "");
    return rc;
  }
  int from = resume_step(resume);
  for (int li = 0; li < r->n_ls; li++) {
    pw_lstage *ls = &r->ls[li];
    if (!resume) {
      pw_prog_init_params(ls->prog, r->spec.train.seed);
      continue;
    }
    if (from > 0) {
      int rc = load_from_coordinator(r, ls, from, err);
      if (rc) return rc;
      continue;
    }
    char path[1024];
    struct stat sb;
    if (stat(resume, &sb) == 0 && S_ISDIR(sb.st_mode))
      snprintf(path, sizeof path, "%s/stage-%d.safetensors", resume, ls->stage);
    else
      snprintf(path, sizeof path, "%s", resume);
    int step = 0, rc = regular_file(path, "resume", err);
    if (!rc) rc = pw_ckpt_load(ls->prog, path, 1, &step, err);
    if (rc) return rc;
  }
  return 0;
}

/* The dataset from `path`, a copy of the stored dataset data.dataset in
 * the worker's cache: pw_dataset_open reads it and checks that its bytes
 * hash to the id. */
static int open_cached(void *arg, const char *path, pw_err *err) {
  pw_run *r = arg;
  pw_data_spec d = r->spec.data;
  if (strlen(path) >= sizeof d.path)
    return pw_err_set(err, PW_EINVAL, "data.dataset", "the cache path %s is too long: use a shorter --state-dir", path);
  snprintf(d.path, sizeof d.path, "%s", path);
  int rc = regular_file(d.path, "data.dataset", err);
  return rc ? rc : pw_dataset_open(&d, &r->model.data, r->spec.train.seed, &r->ds, err);
}

/* A stored dataset comes from the worker's cache, fetched from the
 * coordinator when absent (here, on the compute thread: never on the
 * loop) and fetched again once when the copy no longer hashes to its id.
 * A run made without a daemon (no cache) reads data.path, if given. */
static int open_data(pw_run *r, pw_err *err) {
  const pw_data_spec *d = &r->spec.data;
  int rc;
  if (d->dataset[0] && r->cache) {
    pw_fetch_src src = {.base_url = r->http_url, .token = r->token, .size = 0, .abort = &r->sh.abort};
    if ((rc = pw_dscache_open_entry(r->cache, d->dataset, &src, open_cached, r, err))) return rc;
    r->cp.ds_held = 1;
    return 0;
  }
  if (d->dataset[0] && !d->path[0])
    return pw_err_set(err, PW_EINVAL, "data.dataset", "dataset %s: this run has no dataset cache to fetch it into",
                      d->dataset);
  if ((d->kind == PW_DATA_TEXT || d->kind == PW_DATA_TOKENS) && (rc = regular_file(d->path, "data.path", err)))
    return rc;
  return pw_dataset_open(d, &r->model.data, r->spec.train.seed, &r->ds, err);
}

int pw_run_open_files(pw_run *r, pw_err *err) {
  int needs_data = 0, rc;
  for (int li = 0; li < r->n_ls && !r->serve; li++) needs_data |= r->ls[li].first_input | r->ls[li].has_target;
  if (needs_data && (rc = open_data(r, err))) return rc;
  if (r->tp > 1) return pw_tpx_load(r, load_or_init, err);
  if (!pw_dpx_zero(r)) return load_or_init(r, r->resume, err);
  /* zero > 0: whole moments lent to the programs while a file is read
   * (the checkpoint's, the init weights'), then our shard kept */
  if (pw_dpx_load_begin(r)) {
    pw_dpx_state_release(r);
    return pw_err_set(err, PW_ENOMEM, "resume", "out of memory for the optimizer state being loaded");
  }
  rc = load_or_init(r, r->resume, err);
  pw_dpx_load_end(r);
  return rc;
}

int pw_run_create(uv_loop_t *loop, const pw_msg_assign *a, const json_t *as, const char *ckpt_dir, pw_run **out,
                  pw_err *err) {
  *out = NULL;
  /* absolute: the paths a worker reports mean the same from anywhere */
  const char *cd = a->checkpoint_dir ? a->checkpoint_dir : ckpt_dir;
  char cwd[512] = "", absdir[512];
  if (cd[0] != '/' && !getcwd(cwd, sizeof cwd))
    return pw_err_set(err, PW_EIO, "assign", "cannot resolve the checkpoint directory %s: %s", cd, strerror(errno));
  int cn = snprintf(absdir, sizeof absdir, "%s%s%s", cwd, cwd[0] ? "/" : "", cd);
  if (cn < 0 || (size_t)cn >= sizeof absdir)
    return pw_err_set(err, PW_EINVAL, "assign", "the checkpoint directory %s is too long", cd);
  pw_run *r = calloc(1, sizeof *r);
  if (!r) return pw_err_set(err, PW_ENOMEM, "assign", "out of memory");
  r->sh.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (r->sh.wake_fd < 0 || uv_mutex_init(&r->sh.mu) || uv_mutex_init(&r->sh.wmu)) { /* (only on exhausted resources) */
    if (r->sh.wake_fd >= 0) close(r->sh.wake_fd);
    free(r);
    return pw_err_set(err, PW_ENOMEM, "assign", "cannot create an eventfd or a mutex");
  }
  r->assign = as ? json_incref((json_t *)as) : NULL; /* keeps a's strings alive */
  r->job = (uint64_t)a->job;
  r->run_id = (int)a->run;
  r->rank = (int)a->rank;
  r->steps = (int)a->steps;
  r->start_step = (int)a->start_step;
  r->trace_every = a->trace_every > 0 ? (int)a->trace_every : 0;
  snprintf(r->ckpt_dir, sizeof r->ckpt_dir, "%s", absdir);
  r->resume = a->resume;
  pw_slice sl;
  int rc = pw_slice_decode(a->slice, strlen(a->slice), a->slice_sha256, &sl, err);
  if (rc) goto fail;
  /* The slice's tables become the run's; what stays in sl is freed below. */
  r->model = sl.model;
  r->part = sl.part;
  r->sched = sl.sched;
  r->peak_slots = sl.peak_slots;
  r->n_work = sl.n_work;
  r->spec.mode = sl.mode;
  r->spec.train = sl.train;
  r->spec.data = sl.data;
  r->mem_budget = sl.mem_budget;
  snprintf(r->plan_sha256, sizeof r->plan_sha256, "%s", sl.plan_sha256);
  snprintf(r->init_sha256, sizeof r->init_sha256, "%s", sl.init_sha256);
  snprintf(r->init_optim_sha256, sizeof r->init_optim_sha256, "%s", sl.init_optim_sha256);
  r->pp = sl.pp;
  r->dp = sl.dp;
  r->tp = sl.tp;
  r->tp_rank = sl.tp_rank;
  r->n_ranks = r->pp * r->dp * r->tp;
  r->m = sl.m;
  r->S = sl.S;
  r->mb_size = sl.mb_size;
  int slice_rank = sl.rank;
  free(sl.local_stage);
  if (r->rank != slice_rank) {
    rc = pw_err_set(err, PW_EPROTO, "assign.rank", "%d, but the slice is rank %d's", r->rank, slice_rank);
    goto fail;
  }
  if (r->start_step < 0 || r->steps < r->start_step) {
    rc = pw_err_set(err, PW_EPROTO, "assign.steps", "steps %d before start_step %d", r->steps, r->start_step);
    goto fail;
  }
  r->prank = r->rank / r->tp % r->pp;
  r->replica = r->rank / r->tp / r->pp;
  if (r->tp > 1 && (rc = pw_tpx_setup(r, err))) goto fail;
  int *rank_of_stage = malloc(sizeof(int) * (size_t)r->S), *lidx_of_stage = malloc(sizeof(int) * (size_t)r->S);
  r->rank_of_stage = rank_of_stage; /* const from here: filled below, then only read */
  r->lidx_of_stage = lidx_of_stage;
  r->ls = calloc((size_t)r->S, sizeof *r->ls);
  r->sh.ls = calloc((size_t)r->S, sizeof *r->sh.ls);
  r->cp.ls = calloc((size_t)r->S, sizeof *r->cp.ls);
  r->lp.out = calloc((size_t)r->n_ranks, sizeof *r->lp.out);
  r->peer_addr = calloc((size_t)r->n_ranks, sizeof *r->peer_addr);
  r->peer_host = calloc((size_t)r->n_ranks, sizeof *r->peer_host);
  r->sh.wl = calloc((size_t)r->n_ranks, sizeof *r->sh.wl);
  r->sh.in_fd = malloc(sizeof(int) * (size_t)r->n_ranks);
  r->cp.in = calloc((size_t)r->n_ranks, sizeof *r->cp.in);
  if (!r->rank_of_stage || !r->lidx_of_stage || !r->ls || !r->sh.ls || !r->cp.ls || !r->lp.out || !r->peer_addr ||
      !r->peer_host || !r->sh.wl || !r->sh.in_fd || !r->cp.in) {
    rc = pw_err_set(err, PW_ENOMEM, "assign", "out of memory");
    goto fail;
  }
  for (int k = 0; k < r->n_ranks; k++) {
    r->sh.wl[k].fd = r->sh.in_fd[k] = r->cp.in[k].fd = -1;
    pw_frame_reader_init(&r->cp.in[k].rd, 0);
  }
  for (int s = 0; s < r->S; s++) {
    rank_of_stage[s] = r->sched->stage_to_rank[s];
    lidx_of_stage[s] = -1;
    if (rank_of_stage[s] == r->prank) {
      lidx_of_stage[s] = r->n_ls;
      r->ls[r->n_ls++].stage = s;
    }
  }
  json_t *pe;
  size_t i;
  json_array_foreach(a->peers, i, pe) {
    int pr = jint(pe, "rank", -1);
    if (pr < 0 || pr >= r->n_ranks) {
      rc = pw_err_set(err, PW_EPROTO, "assign.peers", "peer rank %d outside the mesh", pr);
      goto fail;
    }
    snprintf(r->peer_addr[pr], sizeof r->peer_addr[pr], "%s", json_string_value(json_object_get(pe, "addr")));
    const char *host = json_string_value(json_object_get(pe, "host"));
    if (!host[0] || strlen(host) >= sizeof r->peer_host[pr]) {
      rc = pw_err_set(err, PW_EPROTO, "assign.peers", "rank %d's host must be 1..%zu bytes", pr,
                      sizeof r->peer_host[pr] - 1);
      goto fail;
    }
    memcpy(r->peer_host[pr], host, strlen(host) + 1);
  }
  for (int k = 0; k < r->n_ranks; k++)
    if ((k != r->rank && !r->peer_addr[k][0]) || !r->peer_host[k][0]) { /* its own address it need not know */
      rc = pw_err_set(err, PW_EPROTO, "assign.peers", "no %s for rank %d", r->peer_host[k][0] ? "address" : "host", k);
      goto fail;
    }
  if ((rc = pw_snaprun_assign(r, a, err))) goto fail;
  r->snap_holder = pw_snaprun_holder(r, r->rank);
  if ((rc = setup_stages(r, err))) goto fail;
  if (r->spec.mode == PW_MODE_SERVE && (rc = pw_serve_alloc(r, a, err))) goto fail;
  r->acts = r->sched->actions[r->prank];
  r->n_acts = r->sched->n_actions[r->prank];
  r->cp.timings = calloc((size_t)(r->n_acts ? r->n_acts : 1), sizeof *r->cp.timings);
  r->sh.trace_buf = calloc((size_t)PW_TRACE_BUFS * (size_t)(r->n_acts ? r->n_acts : 1), sizeof *r->sh.trace_buf);
  r->cp.norm_parts = calloc((size_t)(2 * r->pp), sizeof(double));
  r->cp.norm_parts_step = malloc(sizeof(int) * (size_t)(2 * r->pp));
  r->sh.evq_cap = 64;
  r->sh.evq = malloc(sizeof *r->sh.evq * (size_t)r->sh.evq_cap);
  if (!r->cp.timings || !r->sh.trace_buf || !r->cp.norm_parts || !r->cp.norm_parts_step || !r->sh.evq ||
      pw_stepend_alloc(r) || pw_snaprun_alloc(r) || pw_evalrun_alloc(r) || pw_tpx_alloc(r)) {
    rc = pw_err_set(err, PW_ENOMEM, "assign", "out of memory");
    goto fail;
  }
  for (int k = 0; k < 2 * r->pp; k++) r->cp.norm_parts_step[k] = -1;
  r->cp.tied_step = -1;
  r->sh.step = r->start_step; /* peers' frames may come before our links are up */
  r->cp.tag = pw_evalrun_tag(r, r->start_step);
  r->sh.lost_rank = r->sh.aborted_rank = -1;
  if ((rc = uv_async_init(loop, &r->lp.async, on_events))) {
    rc = pw_err_set(err, PW_EINTERNAL, "assign", "uv_async_init: %s", uv_strerror(rc));
    goto fail;
  }
  r->lp.async.data = r;
  r->lp.async_init = 1;
  *out = r;
  return 0;
fail:
  pw_run_free(r);
  return rc;
}

int pw_run_start(pw_worker *w, const pw_msg_assign *a, const json_t *as, pw_err *err) {
  pw_run *r;
  int rc = pw_run_create(w->loop, a, as, w->state_dir, &r, err);
  if (rc) return rc;
  r->w = w;
  r->cache = w->cache;
  r->snaps = &w->snaps;
  size_t kept = pw_snapstore_drop_others(&w->snaps, r->job); /* only this job's can be used now */
  if (kept) pw_info("job %llu: %.1f MiB of its snapshots in memory", (unsigned long long)r->job, (double)kept / (1 << 20));
  snprintf(r->http_url, sizeof r->http_url, "%s", w->http_url);
  r->token = w->token;
  w->run = r;
  pw_net_run_started(w, r);
  pw_info("job %llu run %d: rank %d (pipeline rank %d, replica %d) of %d, stages %d..%d, %d actions per step, "
          "budget %.1f MiB, plan %.12s",
          (unsigned long long)r->job, r->run_id, r->rank, r->prank, r->replica, r->n_ranks, r->ls[0].stage,
          r->ls[r->n_ls - 1].stage, r->n_acts, (double)r->mem_budget / (1 << 20), r->plan_sha256);
  for (int k = 0; k < r->n_ranks; k++) {
    if (k == r->rank) continue;
    r->lp.n_out_needed++;
    r->lp.out[k] = pw_net_connect(w, r->peer_addr[k], k);
    if (!r->lp.out[k]) {
      pw_run_fail(r, "bad address '%s' for rank %d", r->peer_addr[k], k);
      return 0;
    }
  }
  if (r->lp.n_out_needed == 0) pw_run_on_link_up(r, NULL);
  return 0;
}

static void run_destroy(pw_run *r) {
  pw_serve_free(r);
  pw_stepend_free(r);
  pw_snaprun_free(r);
  free(r->restore_from);
  for (int li = 0; li < r->n_ls; li++) {
    pw_prog_free(r->ls[li].prog);
    if (!r->sh.ls || !r->cp.ls) continue;
    pw_lstage_shared *ss = &r->sh.ls[li];
    pw_lstage_compute *lc = &r->cp.ls[li];
    free(lc->mb_slot);
    free(lc->act_step);
    free(lc->act_got);
    free(lc->grad_step);
    free(lc->grad_got);
    free(ss->slot_busy);
    free(ss->slot_sends);
    free(ss->slot_free_pending);
  }
  free(r->ls);
  free(r->sh.ls);
  free(r->cp.ls);
  free((int *)r->rank_of_stage);
  free((int *)r->lidx_of_stage);
  free(r->lp.out);
  free(r->peer_addr);
  free(r->peer_host);
  free(r->cp.timings);
  free(r->sh.trace_buf);
  free(r->cp.norm_parts);
  free(r->cp.norm_parts_step);
  free(r->cp.eval_acts);
  pw_dataset_close(r->ds);
  if (r->cp.ds_held) pw_dscache_release(r->cache, r->spec.data.dataset); /* (the compute thread is joined) */
  pw_sched_free(r->sched);
  pw_partition_free(&r->part);
  pw_tpx_free(r);
  pw_model_free(&r->model);
  pw_model_free(&r->canon);
  free(r->tp_kinds);
  free(r->peak_slots);
  free(r->n_work);
  json_decref(r->assign);
  free(r->sh.evq);
  free(r->sh.wl);
  for (int k = 0; r->cp.in && k < r->n_ranks; k++) pw_frame_reader_free(&r->cp.in[k].rd);
  free(r->cp.in);
  free(r->sh.in_fd);
  close(r->sh.wake_fd);
  uv_mutex_destroy(&r->sh.wmu);
  uv_mutex_destroy(&r->sh.mu);
  free(r);
}

static void on_async_closed(uv_handle_t *h) { run_destroy(h->data); }

/* Only once the compute thread has been joined (or never started). */
void pw_run_free(pw_run *r) {
  if (!r) return;
  if (r->w && r->w->run == r) r->w->run = NULL;
  if (r->lp.async_init) {
    r->lp.async_init = 0;
    uv_close((uv_handle_t *)&r->lp.async, on_async_closed);
  } else {
    run_destroy(r);
  }
}

/* Inbound links are the compute thread's until it has returned; then the
 * loop reads them to their end (the peer's BYE and close), not closing
 * them first: a peer still finishing its last step, or reading our BYE's
 * reason, must not see its link drop before. */
static void close_links_in(pw_run *r) {
  for (pw_link *l = r->w->links; l; l = l->next)
    if (!l->outbound && l->hello_job == r->job && l->hello_run == r->run_id && l->peer_rank >= 0) pw_link_drain(l);
}

/* Ends the run: links to peers closed (with BYE when it succeeded, so they
 * do not take it for a failure), the worker free for the next assignment,
 * the memory released once the last write callback has run. */
static void finish(pw_run *r, int ok) {
  if (r->lp.closing) return;
  r->lp.closing = 1;
  if (r->w->run == r) r->w->run = NULL;
  /* The links are the loop's alone from here (waits for a direct write
   * in progress), so BYE cannot interleave with a frame. */
  uv_mutex_lock(&r->sh.wmu);
  for (int k = 0; k < r->n_ranks && r->sh.wl; k++) r->sh.wl[k].fd = -1;
  uv_mutex_unlock(&r->sh.wmu);
  for (int k = 0; k < r->n_ranks; k++) {
    pw_link *l = r->lp.out ? r->lp.out[k] : NULL;
    if (!l) continue;
    l->peer_rank = -1; /* its close is ours, not a failure to report */
    pw_link_bye(l, r->job, ok ? NULL : r->sh.error[0] ? r->sh.error : "cancelled");
    r->lp.out[k] = NULL;
  }
  atomic_store(&r->sh.abort, 1);
  pw_exec_wake(r);
  if (!r->lp.thread_running) close_links_in(r);
  maybe_free(r);
}

void pw_run_fail(pw_run *r, const char *fmt, ...) {
  if (r->lp.closing) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->sh.error, sizeof r->sh.error, fmt, ap);
  va_end(ap);
  pw_error("job %llu run %d rank %d failed at step %d: %s", (unsigned long long)r->job, r->run_id, r->rank, r->sh.step,
           r->sh.error);
  uv_mutex_lock(&r->sh.mu);
  int lost = r->sh.lost_rank, restore = r->sh.restore_failed, aborted = r->sh.aborted_rank;
  uv_mutex_unlock(&r->sh.mu);
  pw_ctl_send(r->w, PW_CONTROL_BUILD(PW_MSG_ERROR, pw_msg_error, NULL, .job = (int64_t)r->job, .run = r->run_id,
                                     .rank = r->rank, .message = r->sh.error, .lost_rank = lost,
                                     .restore_failed = restore ? 1 : -1, .peer_aborted = aborted));
  finish(r, 0);
}

void pw_run_cancel(pw_run *r, const char *reason) {
  if (r->lp.closing) return;
  pw_info("job %llu run %d cancelled: %s", (unsigned long long)r->job, r->run_id, reason ? reason : "");
  snprintf(r->sh.error, sizeof r->sh.error, "cancelled: %s", reason ? reason : "");
  finish(r, 0);
}

/* ---- links ---------------------------------------------------------------- */

void pw_run_on_link_up(pw_run *r, pw_link *l) {
  /* A HELLO whose write completes after the run ended (finish() gave its
   * links back: peer_rank -1) is no link of the run's any more. */
  if (r->lp.closing || (l && (l->peer_rank < 0 || l->peer_rank >= r->n_ranks))) return;
  if (l) {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&l->tcp, &fd)) {
      pw_run_fail(r, "link to rank %d has no socket", l->peer_rank);
      return;
    }
    uv_mutex_lock(&r->sh.wmu);
    r->sh.wl[l->peer_rank].fd = fd;
    uv_mutex_unlock(&r->sh.wmu);
    r->lp.n_out_connected++;
  }
  if (r->lp.started || r->lp.closing || r->lp.n_out_connected < r->lp.n_out_needed) return;
  r->lp.started = 1;
  int rc = uv_thread_create(&r->lp.thread, pw_exec_main, r);
  if (rc) {
    pw_run_fail(r, "cannot start the compute thread: %s", uv_strerror(rc));
    return;
  }
  r->lp.thread_running = 1;
}

void pw_run_on_link_down(pw_run *r, pw_link *l, const char *why) {
  if (r->lp.closing || l->peer_rank < 0) return;
  int k = l->peer_rank;
  if (l->outbound && r->lp.out[k] == l) r->lp.out[k] = NULL;
  uv_mutex_lock(&r->sh.mu);
  if (r->sh.lost_rank < 0) r->sh.lost_rank = k;
  uv_mutex_unlock(&r->sh.mu);
  pw_run_fail(r, "lost peer rank %d (%s): %s", k, r->peer_addr[k][0] ? r->peer_addr[k] : l->addr, why);
}

/* ---- events from the compute thread ------------------------------------- */

static void on_event(pw_run *r, pw_event *ev) {
  switch (ev->kind) {
    case PW_EV_SEND: {
      pw_link *l = r->lp.closing ? NULL : r->lp.out[ev->to];
      int rc = l ? pw_net_send_encoded(l, r, ev->hdr, ev->payload, ev->len, ev->off, ev->to, ev->li, ev->slot,
                                       ev->pending, NULL)
                 : PW_EPEER;
      if (rc && ev->pending) atomic_fetch_sub(ev->pending, 1); /* never written: the entry is free again */
      if (rc && !r->lp.closing) pw_run_fail(r, "cannot send to rank %d: %s", ev->to, l ? uv_strerror(rc) : "no link");
      return;
    }
    case PW_EV_SNAP: /* said even once the run is over: it is what the worker's memory holds */
      pw_ctl_send(r->w, PW_CONTROL_BUILD(PW_MSG_SNAPSHOT, pw_msg_snapshot, NULL, .job = (int64_t)r->job,
                                         .run = r->run_id, .rank = r->rank, .stage = ev->stage, .step = ev->step,
                                         .held = ev->held));
      return;
    case PW_EV_CKPT:
      if (!r->lp.closing) pw_stepend_report_ckpt(r, ev);
      return;
    case PW_EV_STEP:
      if (!r->lp.closing) pw_stepend_report(r, ev);
      json_decref(ev->colls);
      if (ev->timings) {
        uv_mutex_lock(&r->sh.mu);
        r->sh.trace_busy[(ev->timings - r->sh.trace_buf) / r->n_acts] = 0;
        uv_mutex_unlock(&r->sh.mu);
      }
      return;
    case PW_EV_DONE:
      if (r->lp.closing) return;
      pw_info("job %llu run %d: rank %d done (%d steps, peak %d saved activations)", (unsigned long long)r->job,
              r->run_id, r->rank, r->steps, ev->peak_act);
      if (r->snaps) pw_snapstore_drop_others(r->snaps, 0); /* the job is over: no restore will ask */
      pw_ctl_send(r->w, PW_CONTROL_BUILD(PW_MSG_DONE, pw_msg_done, NULL, .job = (int64_t)r->job, .run = r->run_id,
                                         .rank = r->rank));
      finish(r, 1);
      return;
    case PW_EV_FAIL: {
      char why[sizeof r->sh.error];
      uv_mutex_lock(&r->sh.mu);
      snprintf(why, sizeof why, "%s", r->sh.error[0] ? r->sh.error : "compute failed");
      uv_mutex_unlock(&r->sh.mu);
      pw_run_fail(r, "%s", why);
      return;
    }
    case PW_EV_CTL:
      if (r->w && !r->lp.closing) pw_ctl_send(r->w, ev->msg);
      else json_decref(ev->msg);
      return;
    case PW_EV_EXIT:
      uv_thread_join(&r->lp.thread);
      r->lp.thread_running = 0;
      if (r->lp.closing) close_links_in(r);
      if (!r->lp.closing) pw_run_fail(r, "the compute thread stopped");
      maybe_free(r);
      return;
  }
}

int pw_run_event_next(pw_run *r, pw_event *ev) {
  uv_mutex_lock(&r->sh.mu);
  int got = r->sh.evq_len > 0;
  if (got) {
    *ev = r->sh.evq[r->sh.evq_head];
    r->sh.evq_head = (r->sh.evq_head + 1) % r->sh.evq_cap;
    r->sh.evq_len--;
  }
  uv_mutex_unlock(&r->sh.mu);
  return got;
}

static void on_events(uv_async_t *h) {
  pw_run *r = h->data;
  pw_event ev;
  for (int exited = 0; !exited && pw_run_event_next(r, &ev);) {
    exited = ev.kind == PW_EV_EXIT;
    on_event(r, &ev);
  }
}

/* ---- frames from peers -------------------------------------------------- */

static int tp_frame(const pw_frame_hdr *h) {
  return h->kind == PW_FRAME_REDUCE && (h->value == PW_TPX_RS || h->value == PW_TPX_AG);
}

static int frame_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  if (h->job != r->job) return pw_err_set(err, PW_EPROTO, "frame", "job %llu is not ours", (unsigned long long)h->job);
  if (tp_frame(h)) return pw_tpx_dest(r, from, h, dst, err);
  if (h->kind == PW_FRAME_REDUCE || h->kind == PW_FRAME_TIED) return pw_stepend_dest(r, from, h, dst, err);
  if (h->kind == PW_FRAME_SNAP) return pw_snaprun_dest(r, from, h, dst, err);
  if (r->serve) return pw_serve_dest(r, from, h, dst, err);
  if (h->kind != PW_FRAME_ACT && h->kind != PW_FRAME_GRAD)
    return pw_err_set(err, PW_EPROTO, "frame", "unexpected %s frame", pw_frame_kind_name(h->kind));
  int act = h->kind == PW_FRAME_ACT;
  if ((int)h->step != r->cp.tag && !(act && (int)h->step == pw_evalrun_next(r->cp.tag)))
    return pw_evalrun_refuse(r, h, err);
  if (h->stage >= (uint32_t)r->S || r->lidx_of_stage[h->stage] < 0)
    return pw_err_set(err, PW_EPROTO, "frame", "stage %u is not on this rank", h->stage);
  if (h->microbatch >= (uint32_t)r->m)
    return pw_err_set(err, PW_EPROTO, "frame", "microbatch %u of %d", h->microbatch, r->m);
  int li = r->lidx_of_stage[h->stage], mb = (int)h->microbatch;
  const pw_lstage *ls = &r->ls[li];
  const pw_lstage_compute *lc = &r->cp.ls[li];
  pw_prog *p = ls->prog;
  int v = (int)h->value;
  int idx = act ? port_index(pw_prog_input, pw_prog_n_inputs(p), p, v)
                : port_index(pw_prog_output, pw_prog_n_outputs(p), p, v);
  if (idx < 0 || (act && pw_prog_input(p, idx)->role != PW_VAL_ACT))
    return pw_err_set(err, PW_EPROTO, "frame", "value %d is not a %s port of stage %u", v, act ? "input" : "output",
                      h->stage);
  const pw_prog_port *pt = act ? pw_prog_input(p, idx) : pw_prog_output(p, idx);
  int peer_stage = act ? pw_run_producer(r, v) : pw_run_consumer(r, v);
  if (from != pw_run_global_rank(r, peer_stage))
    return pw_err_set(err, PW_EPROTO, "frame", "value %d comes from rank %d, not %d", v, pw_run_global_rank(r, peer_stage),
                      from);
  /* a bf16 run's activations come as bf16 (exec.c), widened by pw_run_frame_done */
  int dt = act && r->spec.train.precision == PW_PRECISION_BF16 ? PW_DTYPE_BF16 : PW_DTYPE_F32;
  if (h->dtype != dt || h->payload_len != pt->bytes / 4 * pw_frame_dtype_size(dt))
    return pw_err_set(err, PW_EPROTO, "frame", "value %d: %llu bytes of %s, expected %zu bytes of %s", v,
                      (unsigned long long)h->payload_len, pw_frame_dtype_name(h->dtype),
                      pt->bytes / 4 * pw_frame_dtype_size(dt), pw_frame_dtype_name(dt));
  if (act) {
    if ((lc->act_step[mb] == (int)h->step && lc->act_got[mb] >= ls->n_act_in))
      return pw_err_set(err, PW_EPROTO, "frame", "activation for microbatch %d of stage %u sent twice", mb, h->stage);
    int slot = pw_run_slot_for(r, li, mb, err);
    if (slot < 0) return slot;
    *dst = pw_prog_value(p, slot, v);
  } else {
    int slot = lc->mb_slot[mb];
    if (slot < 0) return pw_err_set(err, PW_EPROTO, "frame", "gradient for microbatch %d before its forward", mb);
    if (lc->grad_step[mb] == r->cp.tag && lc->grad_got[mb] >= ls->n_grad_in)
      return pw_err_set(err, PW_EPROTO, "frame", "gradient for microbatch %d of stage %u sent twice", mb, h->stage);
    *dst = pw_prog_grad(p, slot, v);
  }
  return 0;
}

int pw_run_frame_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  *dst = NULL;
  if (atomic_load(&r->sh.abort)) return pw_err_set(err, PW_EPROTO, "frame", "run is over");
  uv_mutex_lock(&r->sh.mu);
  int rc = frame_dest(r, from, h, dst, err);
  uv_mutex_unlock(&r->sh.mu);
  return rc;
}

static void frame_done(pw_run *r, const pw_frame_hdr *h) {
  pw_lstage_compute *lc = &r->cp.ls[r->lidx_of_stage[h->stage]];
  int mb = (int)h->microbatch, step = (int)h->step;
  if (h->kind == PW_FRAME_ACT) {
    if (lc->act_step[mb] != step) lc->act_step[mb] = step, lc->act_got[mb] = 0;
    lc->act_got[mb]++;
  } else {
    if (lc->grad_step[mb] != step) lc->grad_step[mb] = step, lc->grad_got[mb] = 0;
    lc->grad_got[mb]++;
  }
}

int pw_run_frame_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  int rc = 0;
  if (h->kind == PW_FRAME_ACT && h->dtype == PW_DTYPE_BF16) /* in place, before anyone may read it */
    pw_bf16_widen_inplace((void *)payload, h->payload_len / 2);
  uv_mutex_lock(&r->sh.mu);
  if (tp_frame(h))
    rc = pw_tpx_frame(r, from, h, err);
  else if (h->kind == PW_FRAME_REDUCE || h->kind == PW_FRAME_TIED)
    rc = pw_stepend_frame(r, from, h, payload, err);
  else if (h->kind == PW_FRAME_SNAP)
    rc = pw_snaprun_frame(r, from, h, err);
  else if (r->serve)
    pw_serve_frame(r, h);
  else
    frame_done(r, h);
  uv_mutex_unlock(&r->sh.mu);
  if (r->cp.report_step > 0) { /* a peer's snapshot is complete here: the coordinator counts on it */
    pw_event ev = {.kind = PW_EV_SNAP, .stage = r->cp.report_stage, .step = r->cp.report_step, .held = 1};
    r->cp.report_step = 0;
    if (pw_exec_post(r, &ev)) pw_warn("job %llu: out of memory reporting a held snapshot", (unsigned long long)r->job);
  }
  return rc;
}
