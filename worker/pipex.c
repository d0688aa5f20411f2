/* pipex: tied gradients and the norm between the pipeline ranks of a
 * replica (pipex.h). */
#include <stdlib.h>
#include <string.h>

#include "pipex.h"

static int holder_index(const pw_shared_param *sp, int stage) {
  for (int j = 0; j < sp->n_holders; j++)
    if (sp->holders[j] == stage) return j;
  return -1;
}

static int local_holders(const pw_rctx *c, const pw_shared_param *sp) {
  int n = 0;
  for (int j = 0; j < sp->n_holders; j++) n += c->lidx_of_stage[sp->holders[j]] >= 0;
  return n;
}

static pw_prog_param *find_param(pw_prog *p, int model_index) {
  for (int i = 0; i < pw_prog_n_params(p); i++)
    if (pw_prog_param_at(p, i)->model_index == model_index) return pw_prog_param_at(p, i);
  return NULL;
}

/* Per shared parameter with a local holder one block (plan.h: what the
 * planner counts), wired into holder j's gradient and the sum. */
int pw_pipex_init(pw_pipex *x, const pw_rctx *cx) {
  const pw_partition *part = cx->part;
  memset(x, 0, sizeof *x);
  x->cx = cx;
  x->tied_step = -1;
  x->parts = calloc(2 * (size_t)cx->pp, sizeof *x->parts);
  x->parts_step = malloc(2 * (size_t)cx->pp * sizeof *x->parts_step);
  if (!x->parts || !x->parts_step) return PW_ENOMEM;
  for (int k = 0; k < 2 * cx->pp; k++) x->parts_step[k] = -1;
  if (part->n_shared == 0 || cx->cfg->sl.mode == PW_MODE_FORWARD) return 0;
  if (!(x->tied = calloc((size_t)part->n_shared, sizeof *x->tied))) return PW_ENOMEM;
  for (int k = 0; k < part->n_shared; k++) {
    const pw_shared_param *sp = &part->shared[k];
    if (!local_holders(cx, sp)) continue;
    float *block = calloc(pw_tied_floats(cx->model, sp), sizeof(float));
    if (!block) return PW_ENOMEM;
    pw_tied_wire(&x->tied[k], block, cx->model, sp);
    for (int j = 0; j < sp->n_holders; j++) x->tied_needed += cx->lidx_of_stage[sp->holders[j]] < 0;
  }
  return 0;
}

void pw_pipex_close(pw_pipex *x) {
  if (x->tied)
    for (int k = 0; k < x->cx->part->n_shared; k++) free(x->tied[k].block);
  free(x->tied);
  free(x->parts);
  free(x->parts_step);
  x->tied = NULL, x->parts = NULL, x->parts_step = NULL;
}

int pw_pipex_norm_skips(const pw_pipex *x, int stage, int *skip, int cap) {
  const pw_partition *part = x->cx->part;
  int ns = 0;
  for (int k = 0; k < part->n_shared && ns < cap; k++) {
    const pw_shared_param *sp = &part->shared[k];
    int lowest = sp->holders[0];
    for (int j = 1; j < sp->n_holders; j++)
      if (sp->holders[j] < lowest) lowest = sp->holders[j];
    if (holder_index(sp, stage) >= 0 && stage != lowest) skip[ns++] = sp->param;
  }
  return ns;
}

/* ---- tied parameters ------------------------------------------------------- */

static void tied_reduce(pw_pipex *x) {
  const pw_rctx *c = x->cx;
  for (int k = 0; k < c->part->n_shared; k++) {
    const pw_shared_param *sp = &c->part->shared[k];
    if (!local_holders(c, sp)) continue;
    size_t n = c->model->params[sp->param].numel;
    float *sum = x->tied[k].sum;
    memset(sum, 0, n * sizeof(float));
    /* holders in ascending stage order */
    int order[4], no = sp->n_holders;
    for (int j = 0; j < no; j++) order[j] = j;
    for (int a = 0; a < no; a++)
      for (int b = a + 1; b < no; b++)
        if (sp->holders[order[b]] < sp->holders[order[a]]) {
          int t = order[a];
          order[a] = order[b];
          order[b] = t;
        }
    for (int o = 0; o < no; o++) {
      int j = order[o], li = c->lidx_of_stage[sp->holders[j]];
      const float *g = li >= 0 ? find_param(c->ls[li].prog, sp->param)->grad : x->tied[k].holder[j];
      for (size_t i = 0; i < n; i++) sum[i] += g[i];
    }
    for (int j = 0; j < no; j++) {
      int li = c->lidx_of_stage[sp->holders[j]];
      if (li >= 0) memcpy(find_param(c->ls[li].prog, sp->param)->grad, sum, n * sizeof(float));
    }
  }
}

static int tied_ready(void *arg) {
  const pw_pipex *x = arg;
  return x->tied_step == *x->cx->tag && x->tied_got >= x->tied_needed;
}

int pw_pipex_tied(pw_pipex *x) {
  const pw_rctx *c = x->cx;
  if (!x->tied) return 0;
  for (int k = 0; k < c->part->n_shared; k++) {
    const pw_shared_param *sp = &c->part->shared[k];
    if (!local_holders(c, sp)) continue;
    size_t n = c->model->params[sp->param].numel;
    /* each local holder's gradient, once to every rank holding a remote copy */
    for (int j = 0; j < sp->n_holders; j++) {
      int li = c->lidx_of_stage[sp->holders[j]];
      if (li < 0) continue;
      float *copy = x->tied[k].holder[j];
      memcpy(copy, find_param(c->ls[li].prog, sp->param)->grad, n * sizeof(float));
      int sent_to[4], ns = 0;
      for (int j2 = 0; j2 < sp->n_holders; j2++) {
        int hs = sp->holders[j2], dst = pw_rctx_global_rank(c, hs), dup = 0;
        if (c->lidx_of_stage[hs] >= 0) continue;
        for (int q = 0; q < ns; q++) dup |= sent_to[q] == dst;
        if (dup) continue;
        sent_to[ns++] = dst;
        pw_frame_hdr h;
        int rc = pw_frame_hdr_init_vec(&h, PW_FRAME_TIED, c->job, (uint32_t)*c->tag, (uint32_t)sp->holders[j],
                                       (uint32_t)hs, (uint32_t)sp->param, PW_DTYPE_F32, n);
        if (rc)
          return pw_rctx_fail(c, rc, NULL, "no frame header for tied parameter %d (%zu floats): %s", sp->param, n,
                              pw_strerror(rc));
        if ((rc = c->send(c->run, dst, &h, copy, NULL))) return rc;
      }
    }
  }
  int rc = x->tied_needed ? c->wait(c->run, tied_ready, x) : 0;
  if (!rc) tied_reduce(x);
  return rc;
}

/* ---- the norm ------------------------------------------------------------- */

static int parts_ready(void *arg) {
  const pw_pipex *x = arg;
  int tag = *x->cx->tag;
  const int *st = x->parts_step + (tag & 1) * x->cx->pp;
  for (int k = 0; k < x->cx->pp; k++)
    if (st[k] != tag) return 0;
  return 1;
}

int pw_pipex_norm(pw_pipex *x, double part, double *total) {
  const pw_rctx *c = x->cx;
  int tag = *c->tag, par = tag & 1, rc;
  x->parts[par * c->pp + c->prank] = part;
  x->parts_step[par * c->pp + c->prank] = tag;
  x->out[par] = part;
  for (int k = 0; k < c->pp; k++) {
    if (k == c->prank) continue;
    pw_frame_hdr h;
    uint32_t dims[1] = {8};
    if ((rc = pw_frame_hdr_init(&h, PW_FRAME_NORM, c->job, (uint32_t)tag, (uint32_t)c->prank, 0, 0, PW_DTYPE_U8, 1,
                                dims)))
      return pw_rctx_fail(c, rc, NULL, "no frame header for the norm partial: %s", pw_strerror(rc));
    if ((rc = c->send(c->run, pw_rctx_rank_of(c, c->replica, k), &h, &x->out[par], NULL))) return rc;
  }
  if ((rc = c->wait(c->run, parts_ready, x))) return rc;
  /* Summed in the order of each rank's first stage, not of rank numbers:
   * under a relabeled placement (mesh.placement) the same partials then add
   * in the same order, to the same bits. (A rank without a stage adds 0.) */
  double sum = 0;
  for (int st = 0; st < c->S; st++) {
    int k = c->rank_of_stage[st], first = 1;
    for (int e = 0; e < st && first; e++) first = c->rank_of_stage[e] != k;
    if (first) sum += x->parts[par * c->pp + k];
  }
  *total = sum;
  return 0;
}

/* ---- frames ------------------------------------------------------------------ */

int pw_pipex_dest(pw_pipex *x, int from, const pw_frame_hdr *h, void **dst, pw_err *err) {
  const pw_rctx *c = x->cx;
  *dst = NULL;
  if (h->kind == PW_FRAME_NORM) {
    if (h->payload_len != 8 || h->dtype != PW_DTYPE_U8)
      return pw_err_set(err, PW_EPROTO, "frame", "NORM frame of %llu bytes of %s, expected 8 of u8",
                        (unsigned long long)h->payload_len, pw_frame_dtype_name(h->dtype));
    if (h->microbatch >= (uint32_t)c->pp || (int)h->microbatch == c->prank ||
        from != pw_rctx_rank_of(c, c->replica, (int)h->microbatch))
      return pw_err_set(err, PW_EPROTO, "frame", "norm partial from rank %d does not fit", from);
    return 0; /* the reader's buffer */
  }
  int k = -1;
  for (int i = 0; i < c->part->n_shared; i++)
    if (c->part->shared[i].param == (int)h->value) k = i;
  if (k < 0 || !x->tied || !local_holders(c, &c->part->shared[k]))
    return pw_err_set(err, PW_EPROTO, "frame", "unexpected TIED for value %u", h->value);
  const pw_shared_param *sp = &c->part->shared[k];
  int j = holder_index(sp, (int)h->microbatch);
  size_t n = c->model->params[sp->param].numel;
  if (j < 0 || from != pw_rctx_global_rank(c, sp->holders[j]) || h->payload_len != n * 4 || h->dtype != PW_DTYPE_F32)
    return pw_err_set(err, PW_EPROTO, "frame", "TIED for parameter %u from rank %d does not fit", h->value, from);
  *dst = x->tied[k].holder[j];
  return 0;
}

int pw_pipex_frame(pw_pipex *x, int from, const pw_frame_hdr *h, const void *payload, pw_err *err) {
  (void)from, (void)err;
  if (h->kind == PW_FRAME_TIED) {
    if (x->tied_step != (int)h->step) x->tied_step = (int)h->step, x->tied_got = 0;
    x->tied_got++;
    return 0;
  }
  double v;
  memcpy(&v, payload, 8);
  x->parts[(h->step & 1) * x->cx->pp + h->microbatch] = v;
  x->parts_step[(h->step & 1) * x->cx->pp + h->microbatch] = (int)h->step;
  return 0;
}
