/* slots: microbatch mb of local stage li lives in slot mb_slot[mb] from the
 * moment its first input arrives (or its F starts) until its backward is
 * complete (B, or W after I) and every send reading the slot has finished
 * (the loop thread's writes: pw_run_slot_sent). Frames of the next step may
 * arrive before this rank finishes the current one (a neighbour that
 * stepped its optimizer first); the arrival counters are tagged with their
 * pass for that reason (route.c). */
#include "run.h"

int pw_run_producer(const pw_run *r, int v) {
  for (int e = 0; e < r->cfg.sl.part.n_edges; e++)
    if (r->cfg.sl.part.edges[e].value == v) return r->cfg.sl.part.edges[e].src;
  return -1;
}

int pw_run_consumer(const pw_run *r, int v) {
  for (int e = 0; e < r->cfg.sl.part.n_edges; e++)
    if (r->cfg.sl.part.edges[e].value == v) return r->cfg.sl.part.edges[e].dst;
  return -1;
}

int pw_run_slot_for(pw_run *r, int li, int mb, pw_err *err) {
  const pw_lstage *ls = &r->cx.ls[li];
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

void pw_run_slot_sent(pw_run *r, int li, int slot) {
  if (li < 0 || slot < 0 || li >= r->cx.n_ls) return;
  pw_lstage_shared *ss = &r->sh.ls[li];
  uv_mutex_lock(&r->sh.mu);
  if (--ss->slot_sends[slot] == 0 && ss->slot_free_pending[slot]) {
    ss->slot_free_pending[slot] = 0;
    ss->slot_busy[slot] = 0;
  }
  uv_mutex_unlock(&r->sh.mu);
}
