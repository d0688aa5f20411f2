/* exec: the run's compute thread. It walks the rank's action list step
 * after step — wait for an action's inputs, compute it, hand its outputs
 * on — then does the step end (stepend.c). The loop thread only receives
 * HELLOs, the control link and whatever a socket would not take at once;
 * so an action whose inputs are here starts the moment the previous one
 * ends, with no hand-off between threads, and a frame's CRC is computed
 * here, while the data is hot in this core's cache.
 * It also reads its inbound links itself while it waits (recv.c). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "log.h"
#include "serve.h"
#include "worker.h"

double pw_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- talking to the loop thread ------------------------------------------ */

/* The ring grows during the first steps only; it always keeps room for the
 * last two events (DONE or FAIL, then EXIT), so those cannot fail. */
int pw_exec_post(pw_run *r, const pw_event *ev) {
  uv_mutex_lock(&r->sh.mu);
  int last = ev->kind == PW_EV_DONE || ev->kind == PW_EV_FAIL || ev->kind == PW_EV_EXIT;
  if (r->sh.evq_len + (last ? 1 : 3) > r->sh.evq_cap) {
    int cap = r->sh.evq_cap ? 2 * r->sh.evq_cap : 64;
    pw_event *q = malloc(sizeof *q * (size_t)cap);
    if (!q) {
      uv_mutex_unlock(&r->sh.mu);
      return PW_ENOMEM;
    }
    for (int i = 0; i < r->sh.evq_len; i++) q[i] = r->sh.evq[(r->sh.evq_head + i) % r->sh.evq_cap];
    free(r->sh.evq);
    r->sh.evq = q;
    r->sh.evq_head = 0;
    r->sh.evq_cap = cap;
  }
  r->sh.evq[(r->sh.evq_head + r->sh.evq_len++) % r->sh.evq_cap] = *ev;
  uv_mutex_unlock(&r->sh.mu);
  uv_async_send(&r->lp.async); /* the one call another thread may make on the loop's handle */
  return 0;
}

int pw_exec_fail(pw_run *r, int rc, const pw_err *err, const char *fmt, ...) {
  char msg[256] = "", eb[512] = ""; /* eb: a fetch error names a URL and two hashes */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (err) pw_err_str(err, eb, sizeof eb);
  uv_mutex_lock(&r->sh.mu);
  if (!r->sh.error[0]) snprintf(r->sh.error, sizeof r->sh.error, "%s%s%s", msg, msg[0] && eb[0] ? ": " : "", eb);
  uv_mutex_unlock(&r->sh.mu);
  return rc ? rc : PW_EINTERNAL;
}

/* One frame: straight to the socket when the loop has nothing queued on
 * the link (so frames stay in order), without blocking; the rest, if the
 * socket does not take it all, goes to the loop, and then the slot is held
 * until that write is done. */
static int send_frame(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, int li, int slot,
                      atomic_int *pending) {
  pw_event ev = {.kind = PW_EV_SEND, .to = to, .li = li, .slot = slot, .payload = payload, .len = h->payload_len,
                 .pending = pending};
  pw_frame_hdr_encode(h, payload, ev.hdr);
  uint64_t total = PW_FRAME_HDR_SIZE + h->payload_len;
  uv_mutex_lock(&r->sh.wmu);
  int fd = r->sh.wl[to].fd;
  if (fd < 0) { /* the run is ending: its links are the loop's again */
    uv_mutex_unlock(&r->sh.wmu);
    return PW_ECANCELED;
  }
  if (r->sh.wl[to].queued == 0) {
    struct iovec iov[2] = {{ev.hdr, PW_FRAME_HDR_SIZE}, {(void *)payload, h->payload_len}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = h->payload_len ? 2 : 1};
    ssize_t n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      int e = errno;
      uv_mutex_unlock(&r->sh.wmu);
      return pw_exec_fail(r, PW_EPEER, NULL, "send to rank %d: %s", to, strerror(e));
    }
    ev.off = n > 0 ? (uint64_t)n : 0;
  }
  if (ev.off == total) {
    uv_mutex_unlock(&r->sh.wmu);
    return 0;
  }
  r->sh.wl[to].queued++;
  uv_mutex_unlock(&r->sh.wmu);
  if (li >= 0) {
    uv_mutex_lock(&r->sh.mu);
    r->sh.ls[li].slot_sends[slot]++;
    uv_mutex_unlock(&r->sh.mu);
  }
  if (pending) atomic_fetch_add(pending, 1); /* the loop's write (or its drop) gives it back */
  int rc = pw_exec_post(r, &ev);
  if (rc && pending) atomic_fetch_sub(pending, 1);
  return rc ? pw_exec_fail(r, rc, NULL, "out of memory queueing a frame") : 0;
}

/* A tensor over the chunk limit goes as consecutive chunk frames, each
 * sent as a frame is: once one is left to the loop, the later ones queue
 * behind it, so they reach the link in order with nothing between them
 * (only this thread sends on a run's link). */
static int send_chunked(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, int li, int slot,
                        atomic_int *pending) {
  if (h->payload_len <= r->cp.chunk_limit) return send_frame(r, to, h, payload, li, slot, pending);
  pw_frame_hdr c;
  for (uint64_t off = 0; off < h->payload_len; off += c.payload_len) {
    int rc = pw_frame_chunk(h, r->cp.chunk_limit, off, &c);
    if (rc) {
      char hs[200];
      return pw_exec_fail(r, rc, NULL, "cannot send %s to rank %d in chunks of %zu bytes: %s",
                          pw_frame_hdr_str(h, hs, sizeof hs), to, r->cp.chunk_limit, pw_strerror(rc));
    }
    if ((rc = send_frame(r, to, &c, (const uint8_t *)payload + off, li, slot, pending))) return rc;
    r->cp.chunks++;
  }
  r->cp.chunked++;
  return 0;
}

int pw_exec_send(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, int li, int slot) {
  return send_chunked(r, to, h, payload, li, slot, NULL);
}

int pw_exec_send_pending(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, atomic_int *pending) {
  return send_chunked(r, to, h, payload, -1, -1, pending);
}

/* ---- one action ----------------------------------------------------------- */

static int act_ready(pw_run *r, const pw_action *a) {
  const pw_lstage *ls = &r->ls[r->lidx_of_stage[a->stage]];
  const pw_lstage_compute *lc = &r->cp.ls[r->lidx_of_stage[a->stage]];
  switch (a->kind) {
    case PW_ACT_F:
      return ls->n_act_in == 0 || (lc->act_step[a->mb] == r->cp.tag && lc->act_got[a->mb] == ls->n_act_in);
    case PW_ACT_B:
    case PW_ACT_I:
      return ls->n_grad_in == 0 || (lc->grad_step[a->mb] == r->cp.tag && lc->grad_got[a->mb] == ls->n_grad_in);
    default: return 1;
  }
}

/* A unit is an action or a fused F&B pair: ready when all of it is. */
typedef struct {
  const pw_action *a;
  int n;
} unit;

static int unit_ready(pw_run *r, const void *arg) {
  const unit *u = arg;
  for (int k = 0; k < u->n; k++)
    if (!act_ready(r, &u->a[k])) return 0;
  return 1;
}

/* Draw this replica's share of microbatch mb straight into the slot: of
 * the step's batch, or in an eval pass of eval batch cp.eval_batch (the
 * batches `pipewright eval` draws, train.c). */
static void draw_data(pw_run *r, const pw_lstage *ls, int slot, int mb) {
  const pw_model *m = &r->model;
  int per_replica = r->spec.train.batch_size / r->dp;
  int first = r->replica * per_replica + mb * r->mb_size;
  /* a regions model's stage may read its tokens or its features (or neither) */
  void *inp = ls->first_input && m->input_value >= 0 ? pw_prog_value(ls->prog, slot, m->input_value) : NULL;
  float *feat = ls->first_input && m->feature_value >= 0 ? pw_prog_value(ls->prog, slot, m->feature_value) : NULL;
  void *tgt = ls->has_target ? pw_prog_value(ls->prog, slot, m->target_value) : NULL;
  pw_split split = r->cp.eval ? PW_SPLIT_EVAL : PW_SPLIT_TRAIN;
  long step = r->cp.eval ? r->cp.eval_batch : r->sh.step;
  if (inp || tgt) pw_dataset_batch(r->ds, split, step, first, r->mb_size, r->spec.train.batch_size, inp, tgt);
  if (feat) pw_dataset_features(r->ds, split, step, first, r->mb_size, r->spec.train.batch_size, feat);
}

/* The header of a tensor of `bytes` of f32 (in bf16 with `bf16`) sent to
 * stage `stage`; fails the run when it cannot have one. */
static int frame_hdr_for(pw_run *r, pw_frame_hdr *h, int kind, int mb, int stage, int value, size_t bytes, int bf16) {
  int rc = pw_frame_hdr_init_vec(h, kind, r->job, (uint32_t)r->cp.tag, (uint32_t)mb, (uint32_t)stage,
                                 (uint32_t)value, bf16 ? PW_DTYPE_BF16 : PW_DTYPE_F32, bytes / 4);
  if (rc)
    return pw_exec_fail(r, rc, NULL, "no %s frame header for value %d of %zu bytes to stage %d (job %llu): %s",
                        pw_frame_kind_name(kind), value, bytes, stage, (unsigned long long)r->job, pw_strerror(rc));
  return 0;
}

/* Copy a tensor to local stage dli's microbatch mb and count it in. The
 * copy runs unlocked: the slot is claimed, and nothing reads it until the
 * count says it is complete. */
static int route_local(pw_run *r, int dli, int mb, int value, const void *src, size_t bytes, int grad) {
  const pw_lstage *d = &r->ls[dli];
  pw_lstage_compute *dc = &r->cp.ls[dli];
  pw_err err = {0};
  uv_mutex_lock(&r->sh.mu);
  int ds = grad ? dc->mb_slot[mb] : pw_run_slot_for(r, dli, mb, &err);
  uv_mutex_unlock(&r->sh.mu);
  if (ds < 0)
    return pw_exec_fail(r, grad ? PW_EINTERNAL : ds, grad ? NULL : &err, "stage %d, microbatch %d", d->stage, mb);
  memcpy(grad ? (void *)pw_prog_grad(d->prog, ds, value) : pw_prog_value(d->prog, ds, value), src, bytes);
  uv_mutex_lock(&r->sh.mu);
  int *step = grad ? dc->grad_step : dc->act_step, *got = grad ? dc->grad_got : dc->act_got;
  if (step[mb] != r->cp.tag) step[mb] = r->cp.tag, got[mb] = 0;
  got[mb]++;
  uv_mutex_unlock(&r->sh.mu);
  return 0;
}

/* Hand an F's outputs to the stages that read them. */
static int route_outputs(pw_run *r, const pw_action *a) {
  int li = r->lidx_of_stage[a->stage];
  const pw_lstage *ls = &r->ls[li];
  int slot = r->cp.ls[li].mb_slot[a->mb];
  for (int i = 0; i < pw_prog_n_outputs(ls->prog); i++) {
    const pw_prog_port *pt = pw_prog_output(ls->prog, i);
    int dst = pw_run_consumer(r, pt->value), rc;
    const void *src = pw_prog_value(ls->prog, slot, pt->value);
    if (r->lidx_of_stage[dst] >= 0) {
      rc = route_local(r, r->lidx_of_stage[dst], a->mb, pt->value, src, pt->bytes, 0);
    } else {
      /* bf16: the send buffer lives with the slot, held until the write is done */
      const void *wire = pw_prog_wire_fill(ls->prog, slot, pt->value);
      pw_frame_hdr h;
      rc = frame_hdr_for(r, &h, PW_FRAME_ACT, a->mb, dst, pt->value, pt->bytes, wire != NULL);
      if (!rc) rc = pw_exec_send(r, pw_run_global_rank(r, dst), &h, wire ? wire : src, li, slot);
      r->cp.act_sent++, r->cp.act_bytes += h.payload_len;
    }
    if (rc) return rc;
  }
  return 0;
}

/* Hand a B/I's input gradients back to the stages that produced them. */
static int route_grads(pw_run *r, const pw_action *a) {
  int li = r->lidx_of_stage[a->stage];
  const pw_lstage *ls = &r->ls[li];
  int slot = r->cp.ls[li].mb_slot[a->mb];
  for (int i = 0; i < pw_prog_n_inputs(ls->prog); i++) {
    const pw_prog_port *pt = pw_prog_input(ls->prog, i);
    if (pt->role != PW_VAL_ACT) continue;
    int src = pw_run_producer(r, pt->value), rc;
    const float *g = pw_prog_grad(ls->prog, slot, pt->value);
    if (r->lidx_of_stage[src] >= 0) {
      rc = route_local(r, r->lidx_of_stage[src], a->mb, pt->value, g, pt->bytes, 1);
    } else {
      pw_frame_hdr h;
      rc = frame_hdr_for(r, &h, PW_FRAME_GRAD, a->mb, src, pt->value, pt->bytes, 0);
      if (!rc) rc = pw_exec_send(r, pw_run_global_rank(r, src), &h, g, li, slot);
    }
    if (rc) return rc;
  }
  return 0;
}

static void release(pw_run *r, int li, int mb) {
  uv_mutex_lock(&r->sh.mu);
  pw_run_slot_release(r, li, mb);
  uv_mutex_unlock(&r->sh.mu);
}

/* Action acts[pc], its inputs there since `ready` (or 0: since it starts);
 * timed only in a training pass (the step report's). */
static int compute(pw_run *r, const pw_action *acts, int pc, double ready) {
  const pw_action *a = &acts[pc];
  int li = r->lidx_of_stage[a->stage];
  const pw_lstage *ls = &r->ls[li];
  int slot = r->cp.ls[li].mb_slot[a->mb];
  double t0 = pw_now();
  pw_err err = {0};
  int rc = 0;
  switch (a->kind) {
    case PW_ACT_F: {
      float loss = 0;
      draw_data(r, ls, slot, a->mb);
      rc = pw_prog_forward(ls->prog, slot, &loss, &err);
      r->cp.loss_sum += loss;
      break;
    }
    case PW_ACT_B: rc = pw_prog_backward(ls->prog, slot, &err); break;
    case PW_ACT_I: rc = pw_prog_backward_input(ls->prog, slot, &err); break;
    case PW_ACT_W: rc = pw_prog_backward_weight(ls->prog, slot, &err); break;
  }
  /* err says what failed (a recompute buffer, W before I, a tensor-parallel
   * all-reduce, a ZeRO-2 hand-off); the first failure recorded wins (a lost
   * peer's, said where it was found) */
  if (rc) return pw_exec_fail(r, rc, &err, "stage %d, microbatch %d", a->stage, a->mb);
  pw_timing *tm = r->cp.eval ? NULL : &r->cp.timings[pc];
  if (tm) {
    tm->a = *a;
    tm->ready = (ready > 0 ? ready : t0) - r->cp.t_step0;
    tm->start = t0 - r->cp.t_step0;
    tm->end = pw_now() - r->cp.t_step0;
  }
  switch (a->kind) {
    case PW_ACT_F:
      if (++r->cp.act_held > r->cp.peak_act) r->cp.peak_act = r->cp.act_held;
      rc = route_outputs(r, a);
      if (r->sched->forward_only || r->cp.eval) { /* nothing will come back for it */
        r->cp.act_held--;
        release(r, li, a->mb);
      }
      break;
    case PW_ACT_B:
      r->cp.act_held--;
      rc = route_grads(r, a);
      release(r, li, a->mb);
      break;
    case PW_ACT_I:
      r->cp.act_held--;
      rc = route_grads(r, a);
      break;
    case PW_ACT_W: release(r, li, a->mb); break;
  }
  if (tm) tm->routed = pw_now() - r->cp.t_step0;
  return rc;
}

/* ---- the step loop -------------------------------------------------------- */

int pw_exec_actions(pw_run *r, const pw_action *acts, int n_acts) {
  if (!r->cp.eval) r->cp.t_step0 = pw_now(), r->cp.tp_bytes = 0, r->cp.tp_seconds = 0;
  r->cp.loss_sum = 0;
  for (int pc = 0; pc < n_acts;) {
    unit u = {acts + pc, (acts[pc].flags & PW_ACTION_FUSED) && pc + 1 < n_acts ? 2 : 1};
    pw_err err = {0};
    double ready = r->cp.eval ? 0 : pw_now();
    int rc = pw_exec_wait(r, unit_ready, &u);
    if (rc) return rc;
    uv_mutex_lock(&r->sh.mu);
    for (int k = 0; k < u.n && !rc; k++) {
      const pw_action *a = &acts[pc + k];
      int slot = a->kind == PW_ACT_F ? pw_run_slot_for(r, r->lidx_of_stage[a->stage], a->mb, &err) : 0;
      if (slot < 0) rc = slot;
    }
    uv_mutex_unlock(&r->sh.mu);
    if (rc == PW_ECANCELED) return rc;
    if (rc) return pw_exec_fail(r, rc, &err, "%s", "");
    for (int k = 0; k < u.n && !rc; k++) rc = compute(r, acts, pc + k, k ? 0 : ready);
    if (rc) return rc;
    pc += u.n;
  }
  return 0;
}

/* The chunk limit: PW_FRAME_CHUNK_DEFAULT, or PW_WIRE_CHUNK bytes. That
 * variable is for tests: a small limit sends every larger tensor through
 * the chunked path, so a run can prove it equal to an unchunked one. */
int pw_exec_chunk_limit(pw_run *r) {
  const char *s = getenv("PW_WIRE_CHUNK");
  r->cp.chunk_limit = PW_FRAME_CHUNK_DEFAULT;
  if (!s || !*s) return 0;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v == 0 || v > PW_FRAME_MAX_PAYLOAD || s[0] == '-')
    return pw_exec_fail(r, PW_EINVAL, NULL, "PW_WIRE_CHUNK '%s' is not a byte count in 1..%u", s,
                        PW_FRAME_MAX_PAYLOAD);
  r->cp.chunk_limit = (size_t)v;
  return 0;
}

void pw_exec_main(void *arg) {
  pw_run *r = arg;
  pw_err err = {0};
  /* Files are opened here, never on the loop thread: a slow disk or a
   * path naming something other than a file must not stall the worker. */
  int rc = pw_exec_chunk_limit(r);
  pw_exec_spin_init(r);
  if (!rc && (rc = pw_run_open_files(r, &err))) rc = pw_exec_fail(r, rc, &err, "%s", "");
  if (!rc && r->serve) rc = pw_serve_run(r);
  while (!rc && !r->serve && r->sh.step < r->steps) {
    r->cp.tag = pw_evalrun_tag(r, r->sh.step);
    rc = pw_exec_actions(r, r->acts, r->n_acts);
    if (!rc) rc = pw_stepend_run(r);
  }
  if (r->cp.chunked)
    pw_info("job %llu run %d: rank %d sent %llu tensors over %zu bytes as %llu chunks", (unsigned long long)r->job,
            r->run_id, r->rank, (unsigned long long)r->cp.chunked, r->cp.chunk_limit, (unsigned long long)r->cp.chunks);
  if (r->cp.act_sent) /* test_bf16_pipeline reads it: bf16 halves the bytes */
    pw_info("job %llu run %d: rank %d sent %llu activation frames, %llu payload bytes", (unsigned long long)r->job,
            r->run_id, r->rank, (unsigned long long)r->cp.act_sent, (unsigned long long)r->cp.act_bytes);
  if (r->cp.snaps_taken)
    pw_info("job %llu run %d: rank %d took %d snapshots, %.2f ms each (copy and queued sends)%s",
            (unsigned long long)r->job, r->run_id, r->rank, r->cp.snaps_taken,
            1e3 * r->cp.snap_seconds / r->cp.snaps_taken, r->cp.snaps_skipped ? ", some skipped" : "");
  /* The ring always has room for these two (pw_exec_post), so they cannot fail. */
  pw_event ev = {.kind = rc == 0 ? PW_EV_DONE : PW_EV_FAIL, .peak_act = r->cp.peak_act};
  if ((rc != PW_ECANCELED || !atomic_load(&r->sh.abort)) && pw_exec_post(r, &ev)) pw_error("cannot report the run's end");
  ev.kind = PW_EV_EXIT;
  if (pw_exec_post(r, &ev)) pw_error("cannot report the compute thread's exit");
}
