/* run_setup: a run made from its assignment (pw_run_create: the slice
 * decoded and checked, the tables, the peers and their hosts, the stage
 * programs and their slots, the subsystems). Loop thread; the daemon then
 * connects it to its peers (ctl.c); run.c has the rest of the run's life
 * on this thread, run_files.c what the compute thread reads before its
 * first step. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"
#include "serve.h"
#include "slice.h"
#include "run.h"

static int jint(const json_t *o, const char *k, int dflt) {
  json_t *v = json_object_get(o, k);
  return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

/* Every slot the plan says a stage may need (early arrivals included) is
 * made and first-touched here, so the steps never fault memory in; more
 * are made on demand, up to cap, only if a send holds a slot longer. */
static int setup_stages(pw_run *r, pw_err *err) {
  int cap = r->cx.m * 2 + 2; /* this step's microbatches + early arrivals of the next */
  int rc = 0;
  const pw_backend *be = r->host.backend;
  /* off the CPU a stage's gradients live on the device: the data-parallel
   * and tensor-parallel sums (dpx.c, tpx.c) read them on the host */
  if (be && !be->host && (r->cx.dp > 1 || r->cx.tp > 1))
    return pw_err_set(err, PW_ENOTSUP, r->cx.dp > 1 ? "mesh.dp" : "mesh.tp",
                      "a worker on %s runs pipeline stages only yet (dp %d, tp %d)", be->name, r->cx.dp, r->cx.tp);
  for (int li = 0; li < r->cx.n_ls && !rc; li++) {
    pw_lstage *ls = &r->cx.ls[li];
    pw_lstage_shared *ss = &r->sh.ls[li];
    pw_lstage_compute *lc = &r->cp.ls[li];
    const pw_stage *st = &r->cfg.sl.part.stages[ls->stage];
    int peak = r->cfg.sl.peak_slots[li]; /* the slice lists our stages in the order ls holds them */
    pw_prog_config cfg = {.layer_lo = st->layer_lo, .layer_hi = st->layer_hi, .mb_size = r->cx.mb_size,
                          .batch_size = r->cfg.sl.train.batch_size, .n_slots = peak < cap ? peak : cap,
                          .max_slots = cap, .remat = r->cfg.sl.n_work[li] > 0, .n_work = r->cfg.sl.n_work[li],
                          .no_moments = pw_dpx_zero(&r->cx) > 0, /* a shard of them in dpx.c */
                          .no_grads = pw_dpx_zero(&r->cx) >= 2,  /* lent by gradrs.c */
                          .no_params = pw_dpx_zero(&r->cx) == 3, /* lent by pgather.c */
                          .bf16 = r->cfg.sl.train.precision == PW_PRECISION_BF16, .backend = be};
    if ((rc = pw_prog_create(&r->cfg.sl.model, &cfg, &ls->prog, err))) break;
    if (r->cx.tp > 1 && (rc = pw_prog_set_tp(ls->prog, r->cx.tp_rank, pw_tpx_allreduce, &r->tpx))) break;
    lc->mb_slot = malloc(sizeof(int) * (size_t)r->cx.m);
    lc->act_step = calloc((size_t)r->cx.m, sizeof(int));
    lc->act_got = calloc((size_t)r->cx.m, sizeof(int));
    lc->grad_step = calloc((size_t)r->cx.m, sizeof(int));
    lc->grad_got = calloc((size_t)r->cx.m, sizeof(int));
    ss->slot_busy = calloc((size_t)cap, sizeof(int));
    ss->slot_sends = calloc((size_t)cap, sizeof(int));
    ss->slot_free_pending = calloc((size_t)cap, sizeof(int));
    if (!lc->mb_slot || !lc->act_step || !lc->act_got || !lc->grad_step || !lc->grad_got || !ss->slot_busy ||
        !ss->slot_sends || !ss->slot_free_pending) {
      rc = pw_err_set(err, PW_ENOMEM, "run", "out of memory");
      break;
    }
    for (int k = 0; k < r->cx.m; k++) lc->mb_slot[k] = -1, lc->act_step[k] = lc->grad_step[k] = -1;
    pw_prog *p = ls->prog;
    for (int i = 0; i < pw_prog_n_inputs(p); i++) {
      const pw_prog_port *pt = pw_prog_input(p, i);
      if (pt->role == PW_VAL_INPUT) ls->first_input = 1;
      else if (pt->role == PW_VAL_TARGET) ls->has_target = 1;
      else ls->n_act_in++;
    }
    for (int i = 0; i < pw_prog_n_outputs(p) && !rc; i++) {
      int v = pw_prog_output(p, i)->value, consumers = 0;
      for (int e = 0; e < r->cfg.sl.part.n_edges; e++) consumers += r->cfg.sl.part.edges[e].value == v;
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
/* The context the subsystems see (rctx.h): the run's geometry, its stages,
 * its configuration, and its functions (io.c). */
static void bind_context(pw_run *r) {
  r->cx.cfg = &r->cfg;
  r->cx.model = &r->cfg.sl.model;
  r->cx.part = &r->cfg.sl.part;
  r->cx.step = &r->sh.step;
  r->cx.tag = &r->cp.tag;
  r->cx.eval = &r->eval.active;
  r->cx.abort = &r->sh.abort;
  r->cx.t_step0 = &r->cp.t_step0;
  pw_exec_bind(r);
}

/* assign.peers: every rank's address (but our own) and host. */
static int read_peers(pw_run *r, const pw_msg_assign *a, pw_err *err) {
  json_t *pe;
  size_t i;
  json_array_foreach(a->peers, i, pe) {
    int pr = jint(pe, "rank", -1);
    if (pr < 0 || pr >= r->cx.n_ranks)
      return pw_err_set(err, PW_EPROTO, "assign.peers", "peer rank %d outside the mesh", pr);
    pw_peer *p = &r->peers[pr];
    snprintf(p->addr, sizeof p->addr, "%s", json_string_value(json_object_get(pe, "addr")));
    const char *host = json_string_value(json_object_get(pe, "host"));
    if (!host[0] || strlen(host) >= sizeof p->host)
      return pw_err_set(err, PW_EPROTO, "assign.peers", "rank %d's host must be 1..%zu bytes", pr, sizeof p->host - 1);
    memcpy(p->host, host, strlen(host) + 1);
  }
  for (int k = 0; k < r->cx.n_ranks; k++)
    if ((k != r->cx.rank && !r->peers[k].addr[0]) || !r->peers[k].host[0]) /* its own address it need not know */
      return pw_err_set(err, PW_EPROTO, "assign.peers", "no %s for rank %d", r->peers[k].host[0] ? "address" : "host", k);
  return 0;
}

/* The tables: stage -> pipeline rank and local index, the links. */
static int make_tables(pw_run *r, pw_err *err) {
  int S = r->cx.S, n = r->cx.n_ranks;
  int *rank_of_stage = malloc(sizeof(int) * (size_t)S), *lidx_of_stage = malloc(sizeof(int) * (size_t)S);
  r->cx.rank_of_stage = rank_of_stage; /* const from here: filled below, then only read */
  r->cx.lidx_of_stage = lidx_of_stage;
  r->cx.ls = calloc((size_t)S, sizeof *r->cx.ls);
  r->sh.ls = calloc((size_t)S, sizeof *r->sh.ls);
  r->cp.ls = calloc((size_t)S, sizeof *r->cp.ls);
  r->lp.out.link = calloc((size_t)n, sizeof *r->lp.out.link);
  r->peers = calloc((size_t)n, sizeof *r->peers);
  r->sh.out.link = calloc((size_t)n, sizeof *r->sh.out.link);
  r->sh.in_fd = malloc(sizeof(int) * (size_t)n);
  r->cp.io.in = calloc((size_t)n, sizeof *r->cp.io.in);
  if (!rank_of_stage || !lidx_of_stage || !r->cx.ls || !r->sh.ls || !r->cp.ls || !r->lp.out.link || !r->peers || !r->sh.out.link ||
      !r->sh.in_fd || !r->cp.io.in)
    return pw_err_set(err, PW_ENOMEM, "assign", "out of memory");
  for (int k = 0; k < n; k++) {
    r->sh.out.link[k].fd = r->sh.in_fd[k] = r->cp.io.in[k].fd = -1;
    pw_frame_reader_init(&r->cp.io.in[k].rd, 0);
  }
  for (int s = 0; s < S; s++) {
    rank_of_stage[s] = r->cfg.sl.sched->stage_to_rank[s];
    lidx_of_stage[s] = -1;
    if (rank_of_stage[s] == r->cx.prank) {
      lidx_of_stage[s] = r->cx.n_ls;
      r->cx.ls[r->cx.n_ls++].stage = s;
    }
  }
  r->cx.acts = r->cfg.sl.sched->actions[r->cx.prank];
  r->cx.n_acts = r->cfg.sl.sched->n_actions[r->cx.prank];
  int na = r->cx.n_acts ? r->cx.n_acts : 1;
  r->cp.timings = calloc((size_t)na, sizeof *r->cp.timings);
  r->sh.trace.buf = calloc((size_t)PW_TRACE_BUFS * (size_t)na, sizeof *r->sh.trace.buf);
  r->sh.ev.cap = 64;
  r->sh.ev.q = malloc(sizeof *r->sh.ev.q * (size_t)r->sh.ev.cap);
  if (!r->cp.timings || !r->sh.trace.buf || !r->sh.ev.q) return pw_err_set(err, PW_ENOMEM, "assign", "out of memory");
  return 0;
}

/* The subsystems, once the stages' programs exist. */
static int make_subsystems(pw_run *r, const pw_msg_assign *a, const pw_run_host *host, pw_err *err) {
  int rc;
  if ((rc = pw_snaprun_init(&r->snap, &r->cx, host ? host->snaps : NULL)) || (rc = pw_pipex_init(&r->pipex, &r->cx)) ||
      (rc = pw_evalrun_init(&r->eval, &r->cx)) || (rc = pw_tpx_init(&r->tpx, &r->cx)))
    return pw_err_set(err, rc, "assign", "out of memory");
  if ((rc = pw_snaprun_assign(&r->snap, a, err))) return rc;
  r->snap.holder = pw_snaprun_holder(&r->cx, r->cx.rank);
  if ((rc = pw_dpx_init(&r->dpx, &r->cx)))
    return pw_err_set(err, rc, "assign", rc == PW_ENOTSUP ? "a ZeRO-2 gradient piece over 2^28 floats" : "out of memory");
  if (r->cfg.sl.mode == PW_MODE_SERVE && (rc = pw_serve_create(&r->serve, &r->cx, a, err))) return rc;
  return 0;
}

int pw_run_create(uv_loop_t *loop, const pw_msg_assign *a, const json_t *as, const char *ckpt_dir,
                  const pw_run_host *host, pw_run **out, pw_err *err) {
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
  if (r->sh.wake_fd < 0 || uv_mutex_init(&r->sh.mu) || uv_mutex_init(&r->sh.out.mu)) { /* (only on exhausted resources) */
    if (r->sh.wake_fd >= 0) close(r->sh.wake_fd);
    free(r);
    return pw_err_set(err, PW_ENOMEM, "assign", "cannot create an eventfd or a mutex");
  }
  if (host) {
    r->host = *host;
    r->data.cache = host->cache;
    snprintf(r->cfg.http_url, sizeof r->cfg.http_url, "%s", host->http_url ? host->http_url : "");
    r->cfg.token = host->token;
  }
  r->sh.why.lost_rank = r->sh.why.aborted_rank = -1;
  bind_context(r);
  r->assign = as ? json_incref((json_t *)as) : NULL; /* keeps a's strings alive */
  r->cx.job = (uint64_t)a->job;
  r->cx.run_id = (int)a->run;
  r->cx.rank = (int)a->rank;
  r->cfg.steps = (int)a->steps;
  r->cfg.start_step = (int)a->start_step;
  r->cfg.trace_every = a->trace_every > 0 ? (int)a->trace_every : 0;
  snprintf(r->cfg.ckpt_dir, sizeof r->cfg.ckpt_dir, "%s", absdir);
  r->cfg.resume = a->resume;
  r->cfg.upload_token = a->upload_token;
  /* The decoded slice is the run's configuration, kept whole. */
  pw_slice *sl = &r->cfg.sl;
  int rc = pw_slice_decode(a->slice, strlen(a->slice), a->slice_sha256, sl, err);
  if (rc) goto fail;
  r->cx.pp = sl->pp, r->cx.dp = sl->dp, r->cx.tp = sl->tp, r->cx.tp_rank = sl->tp_rank;
  r->cx.n_ranks = sl->pp * sl->dp * sl->tp;
  r->cx.m = sl->m, r->cx.S = sl->S, r->cx.mb_size = sl->mb_size;
  if (r->cx.rank != sl->rank) {
    rc = pw_err_set(err, PW_EPROTO, "assign.rank", "%d, but the slice is rank %d's", r->cx.rank, sl->rank);
    goto fail;
  }
  if (r->cfg.start_step < 0 || r->cfg.steps < r->cfg.start_step) {
    rc = pw_err_set(err, PW_EPROTO, "assign.steps", "steps %d before start_step %d", r->cfg.steps, r->cfg.start_step);
    goto fail;
  }
  r->cx.prank = r->cx.rank / r->cx.tp % r->cx.pp;
  r->cx.replica = r->cx.rank / r->cx.tp / r->cx.pp;
  if (r->cx.tp > 1 && (rc = pw_tpx_setup(&r->tpx, &r->cfg, err))) goto fail;
  if ((rc = make_tables(r, err)) || (rc = read_peers(r, a, err)) || (rc = setup_stages(r, err)) ||
      (rc = make_subsystems(r, a, host, err)))
    goto fail;
  r->sh.step = r->cfg.start_step; /* peers' frames may come before our links are up */
  r->cp.tag = pw_evalrun_tag(&r->eval, r->cfg.start_step);
  if ((rc = uv_async_init(loop, &r->lp.async, pw_run_on_events))) {
    rc = pw_err_set(err, PW_EINTERNAL, "assign", "uv_async_init: %s", uv_strerror(rc));
    goto fail;
  }
  r->lp.async.data = r;
  r->lp.async_init = 1;
  *out = r;
  return 0;
fail:
  r->host.released = NULL; /* never the daemon's */
  pw_run_free(r);
  return rc;
}
