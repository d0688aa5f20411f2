/* ckptrun: a run's checkpoints — after the update of a checkpoint step
 * (train.checkpoint_every, and the last), replica 0 of each stage writes
 * its stage's safetensors files (the optimizer's beside them), uploads
 * them to the coordinator and reports where they went; with tp > 1 the
 * group first gathers canonical programs (docs/contracts.md: checkpoints
 * have the tp = 1 names and shapes), with train.zero > 0 replica 0 first
 * gathers the optimizer state's shards. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckptxfer.h"
#include "log.h"
#include "run.h"

static int ckpt_step(const pw_run *r, int step) {
  int k = step + 1, every = r->cfg.sl.train.checkpoint_every;
  return r->cfg.sl.mode != PW_MODE_FORWARD && (k == r->cp.last || (every > 0 && k % every == 0));
}

static int ckpt_due(const pw_run *r, int step) { return r->cx.replica == 0 && ckpt_step(r, step); }

void pw_ckptrun_path(const pw_run *r, int step, int stage, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/job-%llu/step-%d/stage-%d.safetensors", r->cfg.ckpt_dir, (unsigned long long)r->cx.job, step + 1,
           stage);
}

static int mkdirs(const char *path) {
  char tmp[1024];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
      *p = '/';
    }
  return 0;
}

/* A saved stage checkpoint (model file + optimizer file) to the
 * coordinator, then deleted here: the worker keeps nothing it cannot
 * lose. On the compute thread (never the loop): the next step starts once
 * the coordinator confirmed, so a run's last checkpoint is stored before
 * its rank says done. Without an http_url (no coordinator HTTP API: a run
 * made by a test harness) the files stay where they were written.
 *
 * A coordinator that cannot take it now (busy: 429, 503; its disk full:
 * 507; unreachable) is tried again, waiting 0.2 s, 0.4 s, ... up to 10 s
 * between tries: the run's last checkpoint for as long as the run lives
 * (its rank says done only once it is stored, so a job never ends
 * succeeded without its model), an earlier one for UPLOAD_PATIENCE
 * seconds, then the run goes on and the files stay here (the next
 * checkpoint supersedes it). A refusal (4xx) is final at once. */
#define UPLOAD_PATIENCE 60.0

/* Sleeps s seconds unless the run is aborted meanwhile (1 then). */
static int nap(pw_run *r, double s) {
  for (double t = 0; t < s; t += 0.05) {
    if (atomic_load(&r->sh.abort)) return 1;
    usleep(50000);
  }
  return atomic_load(&r->sh.abort) != 0;
}

static int upload_stage(pw_run *r, int step, int stage, const char *path) {
  if (!r->cfg.http_url[0]) return 0;
  char opath[1024], url[256];
  pw_ckpt_optim_path(path, opath, sizeof opath);
  pw_xfer x = {.base_url = r->cfg.http_url, .token = r->cfg.token, .abort = &r->sh.abort, .upload_token = r->cfg.upload_token};
  double t0 = pw_now();
  int last = step == r->cp.last;
  struct stat sm, so;
  for (int opt = 1; opt >= 0; opt--) { /* the optimizer first, as ckpt.c writes them */
    pw_err err = {0};
    snprintf(url, sizeof url, "/v1/jobs/%llu/runs/%d/checkpoints/%d/stages/%d%s", (unsigned long long)r->cx.job,
             r->cx.run_id, step, stage, opt ? "/optimizer" : "");
    int rc = 0, tries = 0;
    long status = 0;
    double wait = 0.2, began = pw_now();
    for (;;) {
      tries++;
      if (!(rc = pw_xfer_put(&x, url, opt ? opath : path, &status, &err)) || !pw_xfer_retryable(rc, status)) break;
      if (!last && pw_now() - began + wait > UPLOAD_PATIENCE) break;
      if (tries == 1 || (tries & (tries - 1)) == 0) { /* the first, then the 2nd, 4th, 8th... try: said, not flooded */
        char b[700];
        pw_warn("job %llu: checkpoint of step %d, stage %d: try %d not stored, again in %.1f s%s: %s",
                (unsigned long long)r->cx.job, step, stage, tries, wait, last ? " (the run's last: until stored)" : "",
                pw_err_str(&err, b, sizeof b));
      }
      if (nap(r, wait)) {
        rc = pw_err_set(&err, PW_ECANCELED, "checkpoint", "cancelled while the upload waited to be tried again");
        break;
      }
      wait = wait * 2 > 10 ? 10 : wait * 2;
    }
    if (rc == PW_ECANCELED) return pw_exec_fail(r, rc, &err, "checkpoint of step %d, stage %d", step, stage);
    /* refused (a 4xx): the job must not end as if its model were stored.
     * A server that takes no uploads at all (501, 405: a test harness's
     * stub, never a coordinator) keeps them here, as without an http_url. */
    if (rc && last && status != 501 && status != 405)
      return pw_exec_fail(r, rc, &err, "the run's last checkpoint (step %d, stage %d, kept at %s) was refused", step,
                          stage, path);
    if (rc) {
      /* The coordinator did not store it: the run goes on and the files
       * stay here, named in the log and in the checkpoint report; the step
       * is not complete on the coordinator, so a resume takes an earlier
       * one. */
      char b[700];
      pw_warn("job %llu: checkpoint of step %d, stage %d kept at %s: the coordinator did not store it after %d tries "
              "in %.0f s: %s",
              (unsigned long long)r->cx.job, step, stage, path, tries, pw_now() - began, pw_err_str(&err, b, sizeof b));
      return 0;
    }
    if (tries > 1)
      pw_info("job %llu: checkpoint of step %d, stage %d stored at try %d, after %.1f s", (unsigned long long)r->cx.job,
              step, stage, tries, pw_now() - began);
  }
  int sized = stat(path, &sm) == 0 && stat(opath, &so) == 0;
  pw_info("job %llu: checkpoint of step %d, stage %d uploaded (%lld bytes, %.1f ms)", (unsigned long long)r->cx.job, step,
          stage, sized ? (long long)(sm.st_size + so.st_size) : -1LL, (pw_now() - t0) * 1e3);
  for (int opt = 0; opt < 2; opt++) {
    const char *f = opt ? opath : path;
    if (unlink(f) && errno != ENOENT)
      pw_warn("job %llu: cannot remove the uploaded checkpoint %s: %s", (unsigned long long)r->cx.job, f, strerror(errno));
  }
  /* the step's folder, then the job's, once empty (another stage of this
   * rank may still be in the first) */
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", path);
  for (int up = 0; up < 2; up++) {
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) break;
    *slash = 0;
    if (rmdir(dir) && errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT)
      pw_warn("job %llu: cannot remove %s: %s", (unsigned long long)r->cx.job, dir, strerror(errno));
  }
  return 0;
}

/* After the step's report is posted: a checkpoint is never on the
 * coordinator before the report of the step it follows, so a resume from
 * it finds every earlier step recorded. */
static int checkpoint_stage(pw_run *r, int li) {
  char path[1024];
  pw_err err = {0};
  pw_ckptrun_path(r, r->sh.step, r->cx.ls[li].stage, path, sizeof path);
  if (mkdirs(path)) {
    int e = errno;
    return pw_exec_fail(r, PW_EIO, NULL, "checkpoint: cannot make the directories of %s: %s (errno %d)", path,
                        strerror(e), e);
  }
  int rc = pw_ckpt_save(r->cx.ls[li].prog, path, r->sh.step + 1, NULL, &err);
  if (rc) return pw_exec_fail(r, rc, &err, "checkpoint");
  if ((rc = upload_stage(r, r->sh.step + 1, r->cx.ls[li].stage, path))) return rc;
  pw_event ev = {.kind = PW_EV_CKPT, .step = r->sh.step, .stage = r->cx.ls[li].stage};
  if ((rc = pw_exec_post(r, &ev))) return pw_exec_fail(r, rc, NULL, "out of memory for a checkpoint report");
  return 0;
}

/* tp > 1: the group gathers canonical programs, its first member writes
 * them (docs/contracts.md: checkpoints have the tp = 1 names and shapes). */
static int checkpoint_tp(pw_run *r) {
  pw_err err = {0};
  int rc = pw_tpx_canon(&r->tpx, &err);
  if (rc) return pw_exec_fail(r, rc, &err, "checkpoint");
  if (!(rc = pw_tpx_gather(&r->tpx)) && r->cx.tp_rank == 0) {
    pw_prog **own = malloc(sizeof *own * (size_t)r->cx.n_ls);
    if (!own) rc = pw_exec_fail(r, PW_ENOMEM, NULL, "out of memory for a checkpoint");
    for (int li = 0; own && li < r->cx.n_ls; li++) own[li] = r->cx.ls[li].prog, r->cx.ls[li].prog = r->tpx.canon[li];
    for (int li = 0; own && li < r->cx.n_ls && !rc; li++) rc = checkpoint_stage(r, li);
    for (int li = 0; own && li < r->cx.n_ls; li++) r->cx.ls[li].prog = own[li];
    free(own);
  }
  pw_tpx_canon_free(&r->tpx);
  return rc;
}

int pw_ckptrun(pw_run *r) {
  int rc = 0, zero = pw_dpx_zero(&r->cx);
  if (zero && ckpt_step(r, r->sh.step) && (rc = pw_dpx_state_gather(&r->dpx))) return rc;
  if (!ckpt_due(r, r->sh.step)) return 0;
  if (r->cx.tp > 1) return checkpoint_tp(r);
  for (int li = 0; li < r->cx.n_ls && !rc; li++) rc = checkpoint_stage(r, li);
  if (zero) pw_dpx_state_release(&r->dpx);
  return rc;
}

