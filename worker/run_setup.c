/* run_setup: a run made from its assignment (pw_run_create: the slice
 * decoded and checked, the tables, the peers and their hosts, the stage
 * programs and their slots, the step-end buffers) and given to the worker
 * (pw_run_start: it connects to its peers). Loop thread; run.c has the
 * rest of the run's life on this thread, run_files.c what the compute
 * thread reads before its first step. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "serve.h"
#include "slice.h"
#include "worker.h"

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
  r->upload_token = a->upload_token;
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
  if ((rc = uv_async_init(loop, &r->lp.async, pw_run_on_events))) {
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
