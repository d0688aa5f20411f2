/* store_tfevents: a job's scalars as a TensorBoard event file
 * (common/io/tfevents.h), built from its metrics rows and the per-rank
 * action timings the workers sampled, in one read transaction (one
 * snapshot). What each scalar is: store.h, pw_store_tfevents. Never
 * writes; never invents a value the store does not hold (a null is left
 * out, a step without timings gets no pipeline scalars). */
#include "store_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One rank's sampled actions at one step, reduced to what is shown. */
typedef struct {
  int rank;
  double busy;   /* seconds of its pipeline actions (F, B, I, W) */
} rank_time;

/* What a step's timings give: the span of every rank's pipeline actions,
 * the busy seconds of each, and their sum in the order the timeline view
 * adds them (rank by rank, action by action), so pipeline/bubble is its
 * measured bubble to the bit. */
typedef struct {
  rank_time *r;
  int n, cap;
  int has_span;
  double t0, t1, busy_all;
} step_time;

/* An action's kind as the timeline view reads it: "F", or 0..3. */
static int pipeline_kind(const json_t *k) {
  if (json_is_string(k)) return json_string_value(k)[0] && strchr("FBIW", json_string_value(k)[0]);
  return json_is_integer(k) && json_integer_value(k) >= 0 && json_integer_value(k) < 4;
}

/* Adds one rank's actions ([[kind, mb, stage, start, end], ...]). */
static int add_rank(step_time *t, int rank, const char *text, size_t n) {
  if (t->n == t->cap) {
    int cap = t->cap ? t->cap * 2 : 8;
    rank_time *nr = realloc(t->r, sizeof *nr * (size_t)cap);
    if (!nr) return -1;
    t->r = nr;
    t->cap = cap;
  }
  rank_time *rt = &t->r[t->n++];
  *rt = (rank_time){.rank = rank};
  json_t *acts = text ? json_loadb(text, n, 0, NULL) : NULL;
  size_t i;
  json_t *a;
  json_array_foreach(acts, i, a) {
    if (!json_is_array(a) || !pipeline_kind(json_array_get(a, 0))) continue;
    double s = json_number_value(json_array_get(a, 3)), e = json_number_value(json_array_get(a, 4));
    if (!t->has_span || s < t->t0) t->t0 = s;
    if (!t->has_span || e > t->t1) t->t1 = e;
    t->has_span = 1;
    if (e - s > 0) rt->busy += e - s, t->busy_all += e - s;
  }
  json_decref(acts);
  return 0;
}

/* A real column that is not null and finite into *v. */
static int col_real(sqlite3_stmt *st, int i, float *v) {
  if (sqlite3_column_type(st, i) == SQLITE_NULL) return 0;
  double d = sqlite3_column_double(st, i);
  if (!isfinite(d)) return 0;
  *v = (float)d;
  return 1;
}

/* The scalars of one metrics row (st) and its step's timings (t, may be
 * empty) as one event appended to out. */
static int row_event(pw_tf_buf *out, sqlite3_stmt *st, const step_time *t, pw_tf_value *vals, char (*tags)[48],
                     pw_err *err) {
  static const struct {
    int col;
    const char *tag;
  } cols[] = {{3, "train/loss"},         {4, "eval/loss"},          {5, "train/lr"},
              {6, "train/grad_norm"},    {7, "train/tokens_per_s"}, {8, "train/step_time"}};
  int n = 0;
  for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
    if (col_real(st, cols[i].col, &vals[n].value)) vals[n++].tag = cols[i].tag;
  double span = t->t1 - t->t0;
  if (t->n > 0 && t->has_span && span > 0) {
    double idle = (double)t->n * span - t->busy_all;
    vals[n++] = (pw_tf_value){"pipeline/bubble", (float)(idle > 0 ? idle / ((double)t->n * span) : 0.0)};
    for (int k = 0; k < t->n; k++) {
      double ridle = span - t->r[k].busy;
      snprintf(tags[2 * k], sizeof tags[0], "pipeline/rank%d/busy_s", t->r[k].rank);
      snprintf(tags[2 * k + 1], sizeof tags[0], "pipeline/rank%d/bubble", t->r[k].rank);
      vals[n++] = (pw_tf_value){tags[2 * k], (float)t->r[k].busy};
      vals[n++] = (pw_tf_value){tags[2 * k + 1], (float)(ridle > 0 ? ridle / span : 0.0)};
    }
  }
  if (!n) return 0;
  pw_tf_event ev = {.kind = PW_TF_SCALARS, .wall_time = sqlite3_column_double(st, 2),
                    .step = sqlite3_column_int64(st, 1), .values = vals, .n_values = n};
  return pw_tf_append(out, &ev, err);
}

/* (run, step) of a row: which comes first. */
static int before(int64_t run_a, int64_t step_a, int64_t run_b, int64_t step_b) {
  return run_a < run_b || (run_a == run_b && step_a < step_b);
}

int pw_store_tfevents(pw_store *s, int64_t job_id, int64_t run, pw_tf_buf *out, double *created, pw_err *err) {
  int rc = pw__store_begin(s, 0, err);
  if (rc) return rc;
  size_t len0 = out->len; /* on failure out is left as it was */
  step_time t = {0};
  pw_tf_value *vals = NULL;
  char(*tags)[48] = NULL;
  int cap = 0;
  sqlite3_stmt *jm, *tm = NULL, *mt = NULL;
  if (!(jm = pw__store_stmt(s, PW_ST_JOB_CREATED, err))) goto fail_stmt;
  sqlite3_bind_int64(jm, 1, job_id);
  rc = sqlite3_step(jm);
  double born = rc == SQLITE_ROW ? sqlite3_column_double(jm, 0) : 0;
  sqlite3_reset(jm);
  if (rc == SQLITE_DONE) {
    rc = pw_err_set(err, PW_ENOENT, "job", "job %lld not found", (long long)job_id);
    goto fail;
  }
  if (rc != SQLITE_ROW) goto fail_sql;
  if (created) *created = born;
  pw_tf_event version = {.kind = PW_TF_VERSION, .wall_time = born};
  if ((rc = pw_tf_append(out, &version, err))) goto fail;
  if (!(mt = pw__store_stmt(s, PW_ST_TF_METRICS, err)) || !(tm = pw__store_stmt(s, PW_ST_TF_TIMINGS, err)))
    goto fail_stmt;
  sqlite3_bind_int64(mt, 1, job_id);
  sqlite3_bind_int64(mt, 2, run);
  sqlite3_bind_int64(tm, 1, job_id);
  sqlite3_bind_int64(tm, 2, run);
  int trc = sqlite3_step(tm); /* the timings cursor walks beside the rows, both by run and step */
  int64_t last_run = -1;
  while ((rc = sqlite3_step(mt)) == SQLITE_ROW) {
    int64_t r_run = sqlite3_column_int64(mt, 0), r_step = sqlite3_column_int64(mt, 1);
    while (trc == SQLITE_ROW && before(sqlite3_column_int64(tm, 0), sqlite3_column_int64(tm, 1), r_run, r_step))
      trc = sqlite3_step(tm);
    t.n = 0, t.has_span = 0, t.busy_all = 0;
    while (trc == SQLITE_ROW && sqlite3_column_int64(tm, 0) == r_run && sqlite3_column_int64(tm, 1) == r_step) {
      if (add_rank(&t, sqlite3_column_int(tm, 2), (const char *)sqlite3_column_text(tm, 3),
                   (size_t)sqlite3_column_bytes(tm, 3))) {
        rc = pw_err_set(err, PW_ENOMEM, "tfevents", "out of memory");
        goto fail;
      }
      trc = sqlite3_step(tm);
    }
    if (trc != SQLITE_ROW && trc != SQLITE_DONE) {
      rc = trc;
      goto fail_sql;
    }
    if (6 + 1 + 2 * t.n > cap) {
      cap = 7 + 2 * t.n;
      pw_tf_value *nv = realloc(vals, sizeof *nv * (size_t)cap);
      if (nv) vals = nv;
      char(*nt)[48] = nv ? realloc(tags, sizeof *nt * (size_t)cap) : NULL;
      if (!nt) {
        rc = pw_err_set(err, PW_ENOMEM, "tfevents", "out of memory");
        goto fail;
      }
      tags = nt;
    }
    if (r_run != last_run) { /* a run starts: TensorBoard drops an earlier run's steps from here on */
      pw_tf_event start = {.kind = PW_TF_START, .wall_time = sqlite3_column_double(mt, 2), .step = r_step};
      if ((rc = pw_tf_append(out, &start, err))) goto fail;
      last_run = r_run;
    }
    if ((rc = row_event(out, mt, &t, vals, tags, err))) goto fail;
  }
  if (rc != SQLITE_DONE) goto fail_sql;
  sqlite3_reset(mt);
  sqlite3_reset(tm);
  pw__store_rollback(s);
  free(t.r);
  free(vals);
  free(tags);
  return 0;
fail_sql:
  rc = pw__store_fail(s, rc, err, "tfevents");
  goto fail;
fail_stmt:
  rc = err ? err->code : PW_EIO;
fail:
  out->len = len0;
  if (mt) sqlite3_reset(mt);
  if (tm) sqlite3_reset(tm);
  pw__store_rollback(s);
  free(t.r);
  free(vals);
  free(tags);
  return rc;
}
