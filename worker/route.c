/* route: where each frame a peer sends goes, by its kind — one table, as
 * the control plane has one for its messages.
 *
 * The compute thread reads its inbound links (io.c); for each frame's
 * header it asks pw_route_dest where the payload goes (a slot of a stage
 * program, a subsystem's receive buffer, or NULL: the reader's own
 * buffer), every size and index checked against that place before a byte
 * lands; once the payload is in, pw_route_done counts it. Both run under
 * sh.mu, next to the slots the loop thread frees.
 *
 * Frames of the pipeline (ACT, GRAD, TIED, NORM) carry the pass's tag
 * (evalrun.h); a peer may be one pass ahead of us, never more, and a
 * gradient is never early: its forward is ours. The data-parallel and
 * tensor-parallel exchanges and snapshots count their own steps or calls
 * and check them themselves. */
#include "log.h"
#include "run.h"
#include "serve.h"

/* Which passes a kind of frame may belong to. */
enum { TAG_NONE, TAG_NOW, TAG_NOW_OR_NEXT };

typedef struct {
  int kind;
  int tag;
  int (*dest)(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err);
  int (*done)(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err);
} pw_route;

/* ---- activations and their gradients: the stage programs' slots -------------- */

static int port_index(const pw_prog_port *(*get)(const pw_prog *, int), int n, const pw_prog *p, int value) {
  for (int i = 0; i < n; i++)
    if (get(p, i)->value == value) return i;
  return -1;
}

static int tensor_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  int act = h->kind == PW_FRAME_ACT;
  if (h->stage >= (uint32_t)r->cx.S || r->cx.lidx_of_stage[h->stage] < 0)
    return pw_err_set(err, PW_EPROTO, "frame", "stage %u is not on this rank", h->stage);
  if (h->microbatch >= (uint32_t)r->cx.m)
    return pw_err_set(err, PW_EPROTO, "frame", "microbatch %u of %d", h->microbatch, r->cx.m);
  int li = r->cx.lidx_of_stage[h->stage], mb = (int)h->microbatch;
  const pw_lstage *ls = &r->cx.ls[li];
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
  if (from != pw_rctx_global_rank(&r->cx, peer_stage))
    return pw_err_set(err, PW_EPROTO, "frame", "value %d comes from rank %d, not %d", v,
                      pw_rctx_global_rank(&r->cx, peer_stage), from);
  /* a bf16 run's activations come as bf16 (exec.c), widened by tensor_done */
  int dt = act && r->cfg.sl.train.precision == PW_PRECISION_BF16 ? PW_DTYPE_BF16 : PW_DTYPE_F32;
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

static int tensor_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  (void)from, (void)payload, (void)err;
  pw_lstage_compute *lc = &r->cp.ls[r->cx.lidx_of_stage[h->stage]];
  int mb = (int)h->microbatch, step = (int)h->step;
  int *st = h->kind == PW_FRAME_ACT ? lc->act_step : lc->grad_step, *got = h->kind == PW_FRAME_ACT ? lc->act_got : lc->grad_got;
  if (st[mb] != step) st[mb] = step, got[mb] = 0;
  got[mb]++;
  return 0;
}

/* ---- the subsystems' frames -------------------------------------------------- */

static int pipex_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  return pw_pipex_dest(&r->pipex, from, h, dst, err);
}
static int pipex_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  return pw_pipex_frame(&r->pipex, from, h, payload, err);
}

static int dpx_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  return pw_dpx_dest(&r->dpx, from, h, dst, err);
}
static int dpx_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  return pw_dpx_frame(&r->dpx, from, h, payload, err);
}

static int tpx_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  if (r->cx.tp < 2) return pw_err_set(err, PW_EPROTO, "frame", "a tensor-parallel frame in a run without tp");
  return pw_tpx_dest(&r->tpx, from, h, dst, err);
}
static int tpx_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  (void)payload;
  return pw_tpx_frame(&r->tpx, from, h, err);
}

static int snap_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  return pw_snaprun_dest(&r->snap, from, h, dst, err);
}
static int snap_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  (void)payload;
  return pw_snaprun_frame(&r->snap, from, h, err);
}

static int serve_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  if (!r->serve) return pw_err_set(err, PW_EPROTO, "frame", "unexpected %s frame", pw_frame_kind_name(h->kind));
  return pw_serve_dest(r->serve, from, h, dst, err);
}
static int serve_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  (void)from, (void)payload, (void)err;
  pw_serve_frame(r->serve, h);
  return 0;
}

/* ---- the table, indexed by kind ------------------------------------------------ */

static const pw_route routes[] = {
    [PW_FRAME_ACT] = {PW_FRAME_ACT, TAG_NOW_OR_NEXT, tensor_dest, tensor_done},
    [PW_FRAME_GRAD] = {PW_FRAME_GRAD, TAG_NOW, tensor_dest, tensor_done},
    [PW_FRAME_TIED] = {PW_FRAME_TIED, TAG_NOW_OR_NEXT, pipex_dest, pipex_done},
    [PW_FRAME_NORM] = {PW_FRAME_NORM, TAG_NOW_OR_NEXT, pipex_dest, pipex_done},
    [PW_FRAME_DP] = {PW_FRAME_DP, TAG_NONE, dpx_dest, dpx_done},
    [PW_FRAME_TP] = {PW_FRAME_TP, TAG_NONE, tpx_dest, tpx_done},
    [PW_FRAME_SNAP] = {PW_FRAME_SNAP, TAG_NONE, snap_dest, snap_done},
    [PW_FRAME_SEQS] = {PW_FRAME_SEQS, TAG_NONE, serve_dest, serve_done},
    [PW_FRAME_TOKENS] = {PW_FRAME_TOKENS, TAG_NONE, serve_dest, serve_done},
};

/* A serving run's activations travel with its SEQS frames, untagged. */
static const pw_route serve_act = {PW_FRAME_ACT, TAG_NONE, serve_dest, serve_done};

/* HELLO and BYE have no entry: the reader (io.c) takes them itself. */
static const pw_route *route_of(const pw_run *r, uint32_t kind) {
  if (r->serve && kind == PW_FRAME_ACT) return &serve_act;
  return kind < sizeof routes / sizeof routes[0] && routes[kind].dest ? &routes[kind] : NULL;
}

int pw_route_dest(pw_run *r, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  *dst = NULL;
  if (atomic_load(&r->sh.abort)) return pw_err_set(err, PW_EPROTO, "frame", "run is over");
  if (h->job != r->cx.job) return pw_err_set(err, PW_EPROTO, "frame", "job %llu is not ours", (unsigned long long)h->job);
  const pw_route *rt = route_of(r, h->kind);
  if (!rt) return pw_err_set(err, PW_EPROTO, "frame", "unexpected %s frame", pw_frame_kind_name(h->kind));
  int tag = (int)h->step;
  if (rt->tag != TAG_NONE && tag != r->cp.tag && !(rt->tag == TAG_NOW_OR_NEXT && tag == pw_evalrun_next(r->cp.tag)))
    return pw_evalrun_refuse(&r->eval, h, err);
  uv_mutex_lock(&r->sh.mu);
  int rc = rt->dest(r, from, h, dst, err);
  uv_mutex_unlock(&r->sh.mu);
  return rc;
}

int pw_route_done(pw_run *r, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  const pw_route *rt = route_of(r, h->kind); /* (pw_route_dest found it) */
  if (h->kind == PW_FRAME_ACT && h->dtype == PW_DTYPE_BF16) /* in place, before anyone may read it */
    pw_bf16_widen_inplace((void *)payload, h->payload_len / 2);
  uv_mutex_lock(&r->sh.mu);
  int rc = rt->done(r, from, h, payload, err);
  uv_mutex_unlock(&r->sh.mu);
  if (r->snap.report_step > 0) { /* a peer's snapshot is complete here: the coordinator counts on it */
    pw_event ev = {.kind = PW_EV_SNAP, .stage = r->snap.report_stage, .step = r->snap.report_step, .held = 1};
    r->snap.report_step = 0;
    if (r->cx.post(r->cx.run, &ev)) pw_warn("job %llu: out of memory reporting a held snapshot", (unsigned long long)r->cx.job);
  }
  return rc;
}
