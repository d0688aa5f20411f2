/* run_files: what a run reads on its compute thread before its first step
 * (pw_run_open_files): the dataset, through the worker's cache when it is
 * a stored one, and the parameters — from the checkpoint to resume (the
 * coordinator's copy when this worker has none), else the init weights,
 * else drawn from the seed. Only regular files are read. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckptxfer.h"
#include "log.h"
#include "run.h"

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
  int n = snprintf(path, sizeof path, "%s/resume-job-%llu-stage-%d.safetensors", r->cfg.ckpt_dir,
                   (unsigned long long)r->cx.job, ls->stage);
  if (n < 0 || (size_t)n >= sizeof path - 32)
    return pw_err_set(err, PW_EINVAL, "resume", "the state directory path is too long");
  pw_ckpt_optim_path(path, opath, sizeof opath);
  pw_xfer x = {.base_url = r->cfg.http_url, .token = r->cfg.token, .abort = &r->sh.abort};
  int rc = 0;
  /* A stage file is its parameters and two moments: bounded well above. */
  uint64_t max = (uint64_t)pw_prog_grad_numel(ls->prog) * 4 * 4 + ((uint64_t)1 << 24);
  for (int opt = 0; opt < 2 && !rc; opt++) {
    snprintf(url, sizeof url, "/v1/jobs/%llu/checkpoints/%d/stages/%d%s", (unsigned long long)r->cx.job, step, ls->stage,
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
  for (int li = 0; li < r->cx.n_ls && !rc; li++)
    rc = il->optim ? pw_ckpt_load_optim(r->cx.ls[li].prog, path, err) : pw_ckpt_load(r->cx.ls[li].prog, path, 0, NULL, err);
  return rc;
}

/* Weights `id` fetched through the cache (when absent) and loaded; the
 * entry is held only while it is read. */
static int load_cached(pw_run *r, const char *id, int optim, pw_err *err) {
  if (!r->data.cache)
    return pw_err_set(err, PW_EINVAL, "init", "weights %s: this run has no cache to fetch them into", id);
  pw_fetch_src src = {.base_url = r->cfg.http_url, .token = r->cfg.token, .size = 0, .abort = &r->sh.abort, .weights = 1};
  init_load il = {r, optim};
  int rc = pw_dscache_open_entry(r->data.cache, id, &src, load_init, &il, err);
  if (!rc) pw_dscache_release(r->data.cache, id);
  return rc;
}

static int load_or_init(void *arg, pw_err *err) {
  pw_run *r = arg;
  const char *resume = r->cfg.resume;
  if (r->snap.restore_step > 0) return pw_snaprun_restore(&r->snap, err);
  if (!resume && r->cfg.sl.init_sha256[0]) { /* fine-tuning: the init weights, the optimizer fresh unless carried */
    for (int li = 0; li < r->cx.n_ls; li++) /* as pw_trainer_init then pw_trainer_load: drawn, then overwritten */
      pw_prog_init_params(r->cx.ls[li].prog, r->cfg.sl.train.seed);
    int rc = load_cached(r, r->cfg.sl.init_sha256, 0, err);
    if (!rc && r->cfg.sl.init_optim_sha256[0]) rc = load_cached(r, r->cfg.sl.init_optim_sha256, 1, err);
    if (!rc) pw_info("job %llu rank %d: parameters from weights %.12s...%s", (unsigned long long)r->cx.job, r->cx.rank,
                     r->cfg.sl.init_sha256, r->cfg.sl.init_optim_sha256[0] ? " (optimizer state too)" : "");
    return rc;
  }
  int from = resume_step(resume);
  for (int li = 0; li < r->cx.n_ls; li++) {
    pw_lstage *ls = &r->cx.ls[li];
    if (!resume) {
      pw_prog_init_params(ls->prog, r->cfg.sl.train.seed);
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
  pw_data_spec d = r->cfg.sl.data;
  if (strlen(path) >= sizeof d.path)
    return pw_err_set(err, PW_EINVAL, "data.dataset", "the cache path %s is too long: use a shorter --state-dir", path);
  snprintf(d.path, sizeof d.path, "%s", path);
  int rc = regular_file(d.path, "data.dataset", err);
  return rc ? rc : pw_dataset_open(&d, &r->cfg.sl.model.data, r->cfg.sl.train.seed, &r->data.ds, err);
}

/* A stored dataset comes from the worker's cache, fetched from the
 * coordinator when absent (here, on the compute thread: never on the
 * loop) and fetched again once when the copy no longer hashes to its id.
 * A run made without a daemon (no cache) reads data.path, if given. */
static int open_data(pw_run *r, pw_err *err) {
  const pw_data_spec *d = &r->cfg.sl.data;
  int rc;
  if (d->dataset[0] && r->data.cache) {
    pw_fetch_src src = {.base_url = r->cfg.http_url, .token = r->cfg.token, .size = 0, .abort = &r->sh.abort};
    if ((rc = pw_dscache_open_entry(r->data.cache, d->dataset, &src, open_cached, r, err))) return rc;
    r->data.held = 1;
    return 0;
  }
  if (d->dataset[0] && !d->path[0])
    return pw_err_set(err, PW_EINVAL, "data.dataset", "dataset %s: this run has no dataset cache to fetch it into",
                      d->dataset);
  if ((d->kind == PW_DATA_TEXT || d->kind == PW_DATA_TOKENS || d->kind == PW_DATA_LABELED) &&
      (rc = regular_file(d->path, "data.path", err)))
    return rc;
  return pw_dataset_open(d, &r->cfg.sl.model.data, r->cfg.sl.train.seed, &r->data.ds, err);
}

int pw_run_open_files(pw_run *r, pw_err *err) {
  int needs_data = 0, rc;
  for (int li = 0; li < r->cx.n_ls && !r->serve; li++) needs_data |= r->cx.ls[li].first_input | r->cx.ls[li].has_target;
  if (needs_data && (rc = open_data(r, err))) return rc;
  if (r->cx.tp > 1) return pw_tpx_load(&r->tpx, load_or_init, r, err);
  if (!pw_dpx_zero(&r->cx)) return load_or_init(r, err);
  /* zero > 0: whole moments lent to the programs while a file is read
   * (the checkpoint's, the init weights'), then our shard kept */
  if (pw_dpx_load_begin(&r->dpx)) {
    pw_dpx_state_release(&r->dpx);
    return pw_err_set(err, PW_ENOMEM, "resume", "out of memory for the optimizer state being loaded");
  }
  rc = load_or_init(r, err);
  pw_dpx_load_end(&r->dpx);
  return rc;
}
