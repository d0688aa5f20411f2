/* report: the step and checkpoint messages a run sends the coordinator
 * (loop thread), from the events its compute thread posts. */
#include <math.h>
#include <sys/stat.h>

#include "worker.h"

/* Loop thread: the step report (and where the checkpoint went). */
void pw_report_step(pw_run *r, const pw_event *ev) {
  json_t *msg = json_pack("{s:s, s:I, s:i, s:i, s:i, s:f, s:i}", "type", "step", "job", (json_int_t)r->job, "run",
                          r->run_id, "rank", r->rank, "step", ev->step, "step_time", ev->step_time, "peak_act",
                          ev->peak_act);
  if (ev->has_loss && isfinite(ev->loss)) {
    json_object_set_new(msg, "loss", json_real(ev->loss));
    json_object_set_new(msg, "tokens", json_real((double)r->spec.train.batch_size / r->dp * r->model.seq_len));
  }
  if (r->dp > 1 && r->spec.mode != PW_MODE_FORWARD) { /* what the data-parallel exchange sent, and its time */
    json_object_set_new(msg, "dp_bytes", json_integer((json_int_t)ev->dp_bytes));
    json_object_set_new(msg, "dp_seconds", json_real(ev->dp_seconds));
  }
  if (r->tp > 1) {
    json_object_set_new(msg, "tp_bytes", json_integer((json_int_t)ev->tp_bytes));
    json_object_set_new(msg, "tp_seconds", json_real(ev->tp_seconds));
  }
  if (ev->has_eval && isfinite(ev->eval_loss)) /* this replica's share, summed like the loss */
    json_object_set_new(msg, "eval_loss", json_real(ev->eval_loss));
  if (r->replica == 0 && r->prank == 0) {
    json_object_set_new(msg, "grad_norm", json_real(ev->grad_norm)); /* left out when not finite */
    json_object_set_new(msg, "lr", json_real(ev->lr));
  }
  /* A NaN or inf is said, not left out silently: the coordinator records
   * it as such and fails a diverged job (train.on_nonfinite). */
  int nonfinite = (ev->has_loss && !isfinite(ev->loss) ? 1 : 0) |
                  (r->replica == 0 && r->prank == 0 && !isfinite(ev->grad_norm) ? 2 : 0);
  if (nonfinite) json_object_set_new(msg, "nonfinite", json_integer(nonfinite));
  if (ev->timings) {
    static const char *const kinds[] = {"F", "B", "I", "W"};
    json_t *acts = json_array();
    for (int i = 0; i < r->n_acts; i++) {
      const pw_timing *t = &ev->timings[i];
      json_array_append_new(acts, json_pack("[s, i, i, f, f]", kinds[t->a.kind & 3], t->a.mb, t->a.stage, t->start,
                                            t->end));
    }
    if (ev->colls) json_array_extend(acts, ev->colls);
    json_object_set_new(msg, "actions", acts);
    /* what the timeline leaves out, for bench/trace_step.py: when each
     * action's wait began and its hand-off ended, the step end's parts,
     * the step's start on the host's monotonic clock (to line ranks up),
     * the waits that slept (each paid a wake-up) */
    json_t *ready = json_array(), *routed = json_array();
    for (int i = 0; i < r->n_acts; i++) {
      json_array_append_new(ready, json_real(ev->timings[i].ready));
      json_array_append_new(routed, json_real(ev->timings[i].routed));
    }
    json_object_set_new(msg, "trace", json_pack("{s:o, s:o, s:f, s:f, s:f, s:f, s:i}", "ready", ready, "routed",
                                                 routed, "end_wait", ev->end_wait, "end_work", ev->end_work,
                                                 "after", ev->after, "t0", ev->t0, "sleeps", ev->sleeps));
  }
  pw_ctl_send(r->w, msg);
}

/* Loop thread: where a stage's checkpoint went. */
void pw_report_ckpt(pw_run *r, const pw_event *ev) {
  char path[1024];
  struct stat sb;
  pw_stepend_ckpt_path(r, ev->step, ev->stage, path, sizeof path);
  pw_ctl_send(r->w, json_pack("{s:s, s:I, s:i, s:i, s:i, s:i, s:s, s:I}", "type", "checkpoint", "job",
                              (json_int_t)r->job, "run", r->run_id, "rank", r->rank, "stage", ev->stage, "step",
                              ev->step + 1, "path", path, "bytes", (json_int_t)(stat(path, &sb) == 0 ? sb.st_size : 0)));
}
