/* report: the step and checkpoint messages a run sends the coordinator
 * (loop thread), from the events its compute thread posts. Both are built
 * through the control table (pw_control_build): what they carry is
 * declared there, in control.h. */
#include <math.h>
#include <sys/stat.h>

#include "log.h"
#include "run.h"

static double finite_or_absent(double x) { return isfinite(x) ? x : NAN; }

/* msg, or why it could not be built (a value outside its declared bounds:
 * the coordinator would drop the link for it) said in the log. */
static void send_built(pw_run *r, json_t *msg, const char *what, int step, const pw_err *err) {
  char b[512];
  if (!msg) {
    pw_error("job %lld rank %d: step %d's %s report is not sent: %s", (long long)r->cx.job, r->cx.rank, step, what,
             pw_err_str(err, b, sizeof b));
    return;
  }
  pw_run_tell(r, msg);
}

/* Loop thread: the step report (and where the checkpoint went). */
void pw_report_step(pw_run *r, const pw_event *ev) {
  int loss = ev->has_loss && isfinite(ev->loss), lead = r->cx.replica == 0 && r->cx.prank == 0;
  int dp = r->cx.dp > 1 && r->cfg.sl.mode != PW_MODE_FORWARD; /* what the data-parallel exchange sent, and its time */
  pw_msg_step m = {
      .job = (int64_t)r->cx.job, .run = r->cx.run_id, .rank = r->cx.rank, .step = ev->step, .step_time = ev->step_time,
      .peak_act = ev->peak_act, .loss = loss ? ev->loss : NAN,
      .tokens = loss ? (double)r->cfg.sl.train.batch_size / r->cx.dp * r->cfg.sl.model.seq_len : NAN,
      /* this replica's share, summed like the loss */
      .eval_loss = ev->has_eval ? finite_or_absent(ev->eval_loss) : NAN,
      .grad_norm = lead ? finite_or_absent(ev->grad_norm) : NAN, .lr = lead ? finite_or_absent(ev->lr) : NAN,
      /* A NaN or inf is said, not left out silently: the coordinator
       * records it as such and fails a diverged job (train.on_nonfinite). */
      .nonfinite = (ev->has_loss && !isfinite(ev->loss) ? 1 : 0) | (lead && !isfinite(ev->grad_norm) ? 2 : 0),
      .dp_bytes = dp ? (int64_t)ev->dp_bytes : -1, .dp_seconds = dp ? ev->dp_seconds : NAN,
      .tp_bytes = r->cx.tp > 1 ? (int64_t)ev->tp_bytes : -1, .tp_seconds = r->cx.tp > 1 ? ev->tp_seconds : NAN};
  if (!m.nonfinite) m.nonfinite = -1;
  pw_msg_step_trace tr;
  if (ev->timings) {
    static const char *const kinds[] = {"F", "B", "I", "W"};
    m.actions = json_array();
    for (int i = 0; i < r->cx.n_acts; i++) {
      const pw_timing *t = &ev->timings[i];
      json_array_append_new(m.actions, json_pack("[s, i, i, f, f]", kinds[t->a.kind & 3], t->a.mb, t->a.stage,
                                                 t->start, t->end));
    }
    if (ev->colls) json_array_extend(m.actions, ev->colls);
    /* what the timeline leaves out, for bench/trace_step.py (control.h) */
    tr = (pw_msg_step_trace){.ready = json_array(), .routed = json_array(), .end_wait = ev->end_wait,
                             .end_work = ev->end_work, .after = ev->after, .t0 = ev->t0, .sleeps = ev->sleeps};
    for (int i = 0; i < r->cx.n_acts; i++) {
      json_array_append_new(tr.ready, json_real(ev->timings[i].ready));
      json_array_append_new(tr.routed, json_real(ev->timings[i].routed));
    }
    m.trace = &tr;
  }
  pw_err err = {0};
  send_built(r, pw_control_build(PW_MSG_STEP, &m, sizeof m, &err), "step", ev->step, &err);
  json_decref(m.actions);
  if (m.trace) {
    json_decref(tr.ready);
    json_decref(tr.routed);
  }
}

/* Loop thread: where a stage's checkpoint went. */
void pw_report_ckpt(pw_run *r, const pw_event *ev) {
  char path[1024];
  struct stat sb;
  pw_ckptrun_path(r, ev->step, ev->stage, path, sizeof path);
  pw_err err = {0};
  json_t *msg = PW_CONTROL_BUILD(PW_MSG_CHECKPOINT, pw_msg_checkpoint, &err, .job = (int64_t)r->cx.job, .run = r->cx.run_id,
                                 .rank = r->cx.rank, .stage = ev->stage, .step = ev->step + 1, .path = path,
                                 .bytes = stat(path, &sb) == 0 ? (int64_t)sb.st_size : 0);
  send_built(r, msg, "checkpoint", ev->step + 1, &err);
}
