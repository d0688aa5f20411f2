/* cmd_plan: `pipewright plan` — the partition, the per-rank action grid and
 * the simulator's analytics of a job, or all schedules side by side; a
 * plan's action lists exported as a custom schedule (text, PyTorch's CSV,
 * JSON) and a CSV imported as one. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_short.h"
#include "budget.h"
#include "args.h"
#include "cli.h"
#include "control.h"
#include "collective.h"
#include "cost_auto.h"
#include "plan.h"
#include "slice.h"
#include "spec.h"
#include "suggest.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pipewright plan --job FILE [options]\n"
          "  --schedule NAME   plan with this schedule instead of the job's (a virtual one on\n"
          "                    a job with virtual_stages 1 is planned with 2, as --compare does)\n"
          "  --export          print the plan's action lists as a custom schedule to edit\n"
          "  --format F        with --export: text (the spec's schedule.custom object, the\n"
          "                    default), csv (PyTorch pipelining's _dump_csv form) or json\n"
          "                    (the spec's mesh and schedule objects to paste into a job)\n"
          "  --import-csv FILE plan the job with the per-rank lists of a PyTorch CSV as its\n"
          "                    schedule.custom (virtual_stages follows from the stages in it)\n"
          "  --compare         every schedule that fits the job, side by side\n"
          "  --compare-regions a regions model: its regions concurrently on their own ranks\n"
          "                    against one after another (a serial runtime), same costs;\n"
          "                    with --profile: both steps predicted on the profile's host\n"
          "  --cores N         every rank on one machine of N cores (the shared-cores model)\n"
          "                    in the predicted step; with --compare-regions: also both so\n"
          "  --profile FILE    cost the plan with a calibration profile (pipewright calibrate)\n"
          "                    instead of the FLOP model; ranks on the profile's host unless\n"
          "                    --cores says otherwise\n"
          "  --auto            rank every pp (up to --max-pp), schedule, virtual stages and\n"
          "                    microbatch count by predicted step time and pick the fastest\n"
          "                    that fits --max-rank-memory. With several --profile files, one\n"
          "                    per thread count (pipewright calibrate --threads T): the layout\n"
          "                    of one host's --cores (default the profiles'), ranks x threads\n"
          "                    and dp too, every pp x dp x T <= cores\n"
          "  --max-pp N        with --auto: largest pp tried (default 8)\n"
          "  --max-rank-memory MIB  with --auto: each rank's memory bound\n"
          "  --json            the same as JSON (what POST /v1/plans returns)\n"
          "  --trace FILE      the simulated timeline as Chrome trace-event JSON (Perfetto)\n"
          "  --slices          JSON: what each rank's assign message carries (slice, slice_sha256)\n"
          "                    and the plan's hash, as the coordinator would send them\n"
          "  --help\n");
}

static int print_json(json_t *j) {
  char *s = pw_json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  if (!s) return 1;
  puts(s);
  free(s);
  return 0;
}

static void print_compare(const json_t *cmp) {
  printf("%-26s %3s %6s %12s %8s %9s %9s %9s %8s\n", "schedule", "V", "stages", "makespan ms", "bubble", "peak act",
         "pending W", "peak MiB", "actions");
  size_t i;
  json_t *row;
  json_array_foreach(json_object_get(cmp, "rows"), i, row) {
    const char *name = json_string_value(json_object_get(row, "schedule"));
    if (!json_is_true(json_object_get(row, "ok"))) {
      printf("%-26s %3d  -- %s\n", name, (int)json_integer_value(json_object_get(row, "virtual_stages")),
             json_string_value(json_object_get(row, "error")));
      continue;
    }
    printf("%-26s %3d %6d %12.3f %8.3f %9d %9d %9.1f %8d\n", name,
           (int)json_integer_value(json_object_get(row, "virtual_stages")),
           (int)json_integer_value(json_object_get(row, "stages")),
           json_real_value(json_object_get(row, "makespan")) * 1e3,
           json_real_value(json_object_get(row, "bubble_ratio")),
           (int)json_integer_value(json_object_get(row, "peak_activations")),
           (int)json_integer_value(json_object_get(row, "peak_pending_w")),
           (double)json_integer_value(json_object_get(row, "peak_memory_bytes")) / (1 << 20),
           (int)json_integer_value(json_object_get(row, "actions")));
  }
}

/* pw_regions_compare_json as a table. */
static void print_compare_regions(const json_t *r) {
  printf("%-24s %-26s %5s %7s %16s\n", "region", "schedule", "ranks", "stages", "alone ms");
  size_t i;
  json_t *row;
  json_array_foreach(json_object_get(r, "regions"), i, row) {
    const json_t *st = json_object_get(row, "stages");
    printf("%-24s %-26s %5d %3d..%-3d %16.3f\n", json_string_value(json_object_get(row, "name")),
           json_string_value(json_object_get(row, "schedule")), (int)json_integer_value(json_object_get(row, "ranks")),
           (int)json_integer_value(json_array_get(st, 0)), (int)json_integer_value(json_array_get(st, 1)) - 1,
           json_real_value(json_object_get(row, "makespan")) * 1e3);
  }
  const json_t *se = json_object_get(r, "serial"), *co = json_object_get(r, "concurrent");
  printf("\n%-48s %5s %12s %8s\n", "execution", "ranks", "step ms", "bubble");
  printf("%-48s %5d %12.3f %8.3f\n", "serial: one region after another, same ranks",
         (int)json_integer_value(json_object_get(se, "ranks")), json_real_value(json_object_get(se, "makespan")) * 1e3,
         json_real_value(json_object_get(se, "bubble_ratio")));
  printf("%-48s %5d %12.3f %8.3f\n", "concurrent: regions on disjoint ranks",
         (int)json_integer_value(json_object_get(co, "ranks")), json_real_value(json_object_get(co, "makespan")) * 1e3,
         json_real_value(json_object_get(co, "bubble_ratio")));
  printf("serial / concurrent step time: %.2f\n", json_real_value(json_object_get(r, "speedup")));
  const json_t *co2 = json_object_get(r, "cores");
  if (co2)
    printf("on one machine of %d cores: serial %.3f ms, concurrent %.3f ms, ratio %.2f\n",
           (int)json_integer_value(json_object_get(co2, "cores")), json_real_value(json_object_get(co2, "serial")) * 1e3,
           json_real_value(json_object_get(co2, "concurrent")) * 1e3, json_real_value(json_object_get(co2, "speedup")));
  const json_t *pr = json_object_get(r, "predicted");
  if (pr)
    printf("predicted step (makespan there + step end): serial %.3f ms, concurrent %.3f ms, ratio %.2f\n",
           json_real_value(json_object_get(pr, "serial")) * 1e3, json_real_value(json_object_get(pr, "concurrent")) * 1e3,
           json_real_value(json_object_get(pr, "speedup")));
}

/* Where the stages run and who said so (mesh.placement, or the schedule). */
static void print_placement(const pw_job *job, const pw_plan *p) {
  printf("placement: stage -> rank");
  for (int s = 0; s < p->S && s < 64; s++) printf(" %d", p->sched->stage_to_rank[s]);
  int kind = job->mesh.placement_kind;
  if (kind == PW_PLACEMENT_NONE && !strcmp(p->sched->name, "custom"))
    printf("%s (where the custom lists run each stage)\n", p->S > 64 ? " ..." : "");
  else if (kind == PW_PLACEMENT_NONE)
    printf("%s (the layout of %s)\n", p->S > 64 ? " ..." : "", p->sched->name);
  else if (kind == PW_PLACEMENT_ARRAY)
    printf("%s (mesh.placement)\n", p->S > 64 ? " ..." : "");
  else
    printf("%s (mesh.placement \"%s\")\n", p->S > 64 ? " ..." : "", pw_placement_names[kind - PW_PLACEMENT_LOOP]);
}

/* The data-parallel exchange per rank and step (worker/dpx.c), costed on
 * the link model (pw_plan_mem.dp_seconds). */
static void print_dp(const pw_job *job, const pw_plan *p) {
  if (p->dp < 2 || p->sched->forward_only) return;
  int zero = job->train.zero;
  printf("data-parallel exchange per step (%s, in replica order; chunks of %zu floats)%s:\n",
         zero == 3   ? "each microbatch's weight gradients reduce-scattered as W makes them, each layer's parameters "
                       "all-gathered before its F and its I or B"
         : zero == 2 ? "each microbatch's weight gradients reduce-scattered as W makes them, all-gather of parameters"
         : zero      ? "reduce-scatter of gradients, all-gather of parameters"
                     : "reduce-scatter + all-gather of gradients",
         (size_t)PW_COLL_CHUNK,
         zero == 3   ? "; parameters, optimizer state and gradients sharded (train.zero 3)"
         : zero == 2 ? "; optimizer state and gradients sharded (train.zero 2)"
         : zero      ? "; optimizer state sharded (train.zero)"
                     : "");
  printf("%-5s %12s %12s %12s %12s %10s\n", "rank", "sent MiB", "received MiB", "gradient MiB", "buffers MiB", "est ms");
  for (int k = 0; k < p->pp; k++) {
    const pw_plan_mem *m = &p->mem[k];
    double sent = (double)m->dp_sent;
    printf("%-5d %12.2f %12.2f %12.2f %12.2f %10.3f\n", k, sent / (1 << 20), sent / (1 << 20),
           (double)m->grads / (1 << 20), (double)m->dp / (1 << 20), m->dp_seconds * 1e3);
  }
  if (zero == 3)
    printf("each rank sends m x zero 1's reduce-scatter of its gradients and, per microbatch, its shard of every "
           "layer's parameters to the dp-1 others in the F and again in the I or B (a remat recompute too), and keeps "
           "a 1/dp shard of parameters, gradients and optimizer state plus three buffers of its largest layer "
           "(replica 0's figures); the gathers are in the simulated F, I and B, less what the compute hides (each is "
           "sent while the layer before it computes); replica 0 also holds its stages' whole parameters, AdamW m and v while "
           "it writes a checkpoint (in peak MiB)\n");
  else if (zero == 2)
    printf("each rank sends (m + 1)(dp-1)/dp of its gradients, m x zero 1's reduce-scatter and the parameters' "
           "all-gather, and keeps a 1/dp shard of them (replica 0's figures); est ms is the step end's all-gather: "
           "each microbatch's reduce-scatter is in the W (or B) that makes it, in the simulated step; replica 0 also "
           "holds its stages' whole AdamW m and v while it writes a checkpoint (in peak MiB)\n");
  else
    printf("each rank sends and receives 2(dp-1)/dp of its gradients (replica 0's figures; the others' differ by a "
           "shard's rounding)%s\n",
           zero ? "; replica 0 also holds its stages' whole AdamW v while it writes a checkpoint (in peak MiB)" : "");
}

/* The tensor-parallel all-reduces per rank and step (common/model/tp.h),
 * costed on the link model inside the simulated F and I. */
static void print_tp(const pw_plan *p) {
  if (p->tp < 2) return;
  printf("tensor-parallel all-reduces per step (tp %d, in tp-rank order: row linears' outputs and the embedding "
         "forward, column linears' input gradients backward, the vocab-parallel loss's row statistics):\n", p->tp);
  printf("%-5s %12s %12s %12s\n", "rank", "sent MiB", "params MiB", "est ms");
  for (int k = 0; k < p->pp; k++) {
    const pw_plan_mem *m = &p->mem[k];
    printf("%-5d %12.2f %12.2f %12.3f\n", k, (double)m->tp_sent / (1 << 20), (double)m->params / (1 << 20),
           m->tp_seconds * 1e3);
  }
  printf("each tp rank sends (and receives) 2(tp-1)/tp of every all-reduced activation; parameters, gradients and "
         "optimizer state are one rank's shard\n");
}

/* The in-memory snapshots' bytes per rank and step, on the link model,
 * against the predicted step (plan_snap.c), and the note above 5 %. */
static void print_snap(const pw_plan *p) {
  if (!p->snapshot_every || p->pp * p->dp == 1) return;
  printf("in-memory snapshots (train.snapshot_every %d: each rank's parameters, AdamW m and v to its holder, "
         "overlapped with the step, not in it):\n", p->snapshot_every);
  printf("%-5s %14s %10s %12s\n", "rank", "MiB per step", "est ms", "% of step");
  for (int k = 0; k < p->pp; k++)
    printf("%-5d %14.2f %10.3f %12.2f\n", k, (double)p->mem[k].snap_sent / p->snapshot_every / (1 << 20),
           p->mem[k].snap_seconds * 1e3, 100 * pw_plan_snap_share(p, k));
  char note[512];
  if (pw_plan_snap_note(p, note, sizeof note)) printf("note: %s\n", note);
}

static void print_plan(const pw_job *job, const pw_plan *p) {
  char a[32], b[32], c[32], d[32], e[32];
  char tp[24] = "";
  if (p->tp > 1) snprintf(tp, sizeof tp, " x tp %d", p->tp);
  printf("job %s: schedule %s, pp %d x dp %d%s, %d stage%s (virtual_stages %d), %d microbatches of %d sequences\n\n",
         job->name, p->sched->name, p->pp, p->dp, tp, p->S, p->S == 1 ? "" : "s", p->V, p->m, p->mb_size);
  printf("%-5s %-4s %-28s %9s %9s %9s %9s %9s %5s\n", "stage", "rank", "layers", "params", "F FLOPs", "B FLOPs",
         "act bytes", "sends", "remat");
  for (int s = 0; s < p->S; s++) {
    const pw_stage *st = &p->part.stages[s];
    char layers[112];
    const pw_model *m = &p->model;
    if (st->layer_hi - st->layer_lo == 1)
      snprintf(layers, sizeof layers, "%s", m->layers[st->layer_lo].name);
    else
      snprintf(layers, sizeof layers, "%s .. %s", m->layers[st->layer_lo].name, m->layers[st->layer_hi - 1].name);
    printf("%-5d %-4d %-28s %9s %9s %9s %9s %9s %5s\n", s, p->sched->stage_to_rank[s], layers,
           pw_cli_si((double)st->params, a, 32), pw_cli_si(st->flops_f * p->mb_size, b, 32),
           pw_cli_si((st->flops_i + st->flops_w) * p->mb_size, c, 32),
           pw_cli_si((double)st->act_bytes * p->mb_size, d, 32), pw_cli_si((double)st->out_bytes * p->mb_size, e, 32),
           p->n_work[s] ? "yes" : "no");
  }
  print_placement(job, p);
  for (int i = 0; i < p->part.n_shared; i++) {
    const pw_shared_param *sp = &p->part.shared[i];
    printf("shared: %s on stages", p->model.params[sp->param].name);
    for (int h = 0; h < sp->n_holders; h++)
      printf(" %d (rank %d)", sp->holders[h], p->sched->stage_to_rank[sp->holders[h]]);
    printf(": gradients summed before the step\n");
  }
  int len = pw_sched_grid(p->sched, p->sim, NULL, 0);
  if (len > 0) {
    char *g = malloc((size_t)len + 1);
    if (g) {
      pw_sched_grid(p->sched, p->sim, g, (size_t)len + 1);
      printf("\nper-rank actions (time flows right):\n%s", g);
      if (len && g[len - 1] != '\n') putchar('\n');
      free(g);
    }
  }
  const pw_sim_result *r = p->sim;
  printf("\nsimulated step: %.3f ms, bubble %.3f (idle time / rank time)", r->makespan * 1e3, r->bubble_ratio);
  if (r->dp_start) printf("; %.3f ms with each rank's data-parallel exchange after its last action", r->step_makespan * 1e3);
  printf("\n");
  printf("%-5s %10s %10s %9s %9s %9s %6s %9s\n", "rank", "busy ms", "idle ms", "peak act", "pending W", "peak held",
         "slots", "peak MiB");
  for (int k = 0; k < r->pp; k++)
    printf("%-5d %10.3f %10.3f %9d %9d %9d %6d %9.1f\n", k, r->busy[k] * 1e3, r->idle[k] * 1e3, r->peak_act[k],
           r->peak_pending_w[k], r->peak_held[k], p->mem[k].n_slots, (double)p->mem[k].total / (1 << 20));
  printf("peak MiB: what a worker allocates for the rank (parameters, gradients, AdamW m and v, activation "
         "slots, data set%s%s); process baseline excluded\n",
         p->dp > 1 ? ", data-parallel exchange buffers" : "", p->part.n_shared ? ", tied-parameter copies" : "");
  print_dp(job, p);
  print_tp(p);
  for (int k = 0; k < r->pp; k++)
    if (p->mem[k].work)
      printf("remat on rank %d: slots keep the stage ports (%.1f MiB), %.1f MiB of work buffers; %.1f MiB saved; "
             "each B or I runs its F again\n",
             k, (double)p->mem[k].slots / (1 << 20), (double)p->mem[k].work / (1 << 20),
             (double)p->mem[k].remat_saved / (1 << 20));
  for (int s = 0; s < r->pp; s++)
    for (int t = 0; t < r->pp; t++)
      if (r->link_transfers[s * r->pp + t])
        printf("link %d -> %d: %s bytes in %d transfers\n", s, t, pw_cli_si(r->link_bytes[s * r->pp + t], a, 32),
               r->link_transfers[s * r->pp + t]);
}

/* {"plan_sha256", "slices": [{"rank", "slice", "slice_sha256"}]}: for a
 * driver playing the coordinator (tests/integration/driver.py). */
static int print_slices(const pw_job *job, const pw_plan *p) {
  json_t *pj = pw_plan_json(job, p), *arr = json_array();
  char *text = NULL, plan_sha[PW_SHA256_HEX_LEN + 1], sha[PW_SHA256_HEX_LEN + 1];
  pw_err err = {0};
  int rc = pw_slice_plan_text(pj, &text, plan_sha);
  json_decref(pj);
  free(text);
  for (int r = 0; !rc && r < p->pp * p->dp * p->tp; r++) {
    if ((rc = pw_slice_build(job, p, r, plan_sha, &text, sha, &err))) break;
    json_array_append_new(arr, json_pack("{s:i, s:s, s:s}", "rank", r, "slice", text, "slice_sha256", sha));
    free(text);
  }
  json_t *out = json_pack("{s:s, s:o}", "plan_sha256", plan_sha, "slices", arr);
  if (!rc) rc = print_json(out);
  else pw_cli_report(&err);
  json_decref(out);
  return rc ? 1 : 0;
}

static const char *cost_model_name(const pw_cost_model *cm) {
  return cm->profile ? "calibrated profile" : "FLOP model";
}

#define MAX_PROFILES 7 /* beyond the first --profile */

/* --auto with a profile per thread count: the layout of one host's cores. */
static int run_auto_host(const pw_job *job, const pw_cost_profile *first, const char *const *more, int n_more,
                         int cores, const pw_budget *b, int max_pp, int as_json) {
  pw_cost_profile profs[MAX_PROFILES + 1];
  pw_err err = {0};
  int n_profs = 1, rc = 1, n = 0;
  profs[0] = *first; /* borrowed: the caller frees it */
  for (int k = 0; k < n_more; k++, n_profs++)
    if (pw_cost_load(more[k], &profs[n_profs], &err)) {
      pw_cli_report(&err);
      goto out;
    }
  if (!cores) cores = profs[0].cores;
  for (int k = 1; k < n_profs; k++)
    if (strcmp(profs[k].host, profs[0].host))
      fprintf(stderr, "warning: the profiles come from hosts %s and %s: one host's layout is chosen from them\n",
              profs[0].host, profs[k].host);
  pw_auto_row *rows = NULL;
  if (pw_plan_auto_host(job, profs, n_profs, cores, b, max_pp, &rows, &n, &err)) {
    pw_cli_report(&err);
    goto out;
  }
  if (as_json) {
    json_t *j = pw_auto_json(rows, n, "calibrated profiles");
    rc = print_json(j);
    json_decref(j);
    free(rows);
    goto out;
  }
  printf("job %s: %d layouts of one host of %d cores planned (ranks x threads from %d profile%s), costed with "
         "the calibrated profiles\n\n", job->name, n, cores, n_profs, n_profs == 1 ? "" : "s");
  printf("%-4s %-3s %-3s %-3s %-26s %3s %4s %4s %12s %10s %8s %9s\n", "rank", "pp", "dp", "thr", "schedule", "V", "m",
         "mb", "predicted ms", "step end", "bubble", "peak MiB");
  for (int k = 0; k < n && k < 20; k++) {
    const pw_auto_row *r = &rows[k];
    printf("%-4d %-3d %-3d %-3d %-26s %3d %4d %4d %12.3f %10.3f %8.3f %9.1f%s\n", k + 1, r->pp, r->dp, r->threads,
           r->schedule, r->V, r->m, r->mb_size, r->predicted * 1e3, r->step_end * 1e3, r->bubble,
           (double)r->peak_memory / (1 << 20), r->fits ? "" : "  over memory");
  }
  const pw_auto_row *c = &rows[0];
  printf("\nchosen: %d ranks x %d threads (pp %d, dp %d), %s, virtual_stages %d, %d microbatches: predicted %.3f ms "
         "a step\n", c->pp * c->dp, c->threads, c->pp, c->dp, c->schedule, c->V, c->m, c->predicted * 1e3);
  printf("set: \"mesh\": {\"pp\": %d, \"dp\": %d, \"virtual_stages\": %d}, \"schedule\": {\"name\": \"%s\", "
         "\"microbatches\": %d}; start %d workers with --threads %d\n", c->pp, c->dp, c->V, c->schedule, c->m,
         c->pp * c->dp, c->threads);
  free(rows);
  rc = 0;
out:
  for (int k = 1; k < n_profs; k++) pw_cost_free(&profs[k]);
  return rc;
}

/* --auto: the ranking and the choice, with why. */
static int run_auto(const pw_job *job, const pw_cost_model *cm, const pw_budget *b, int max_pp, int as_json) {
  pw_auto_row *rows = NULL;
  int n = 0;
  pw_err err = {0};
  if (pw_plan_auto(job, cm, b, max_pp, &rows, &n, &err)) {
    pw_cli_report(&err);
    return 1;
  }
  if (as_json) {
    json_t *j = pw_auto_json(rows, n, cost_model_name(cm));
    int rc = print_json(j);
    json_decref(j);
    free(rows);
    return rc;
  }
  printf("job %s: %d configurations planned (pp 1..%d, dp %d, batch %d), costed with the %s%s\n\n", job->name, n,
         max_pp, job->mesh.dp, job->train.batch_size, cost_model_name(cm),
         cm->cores ? " on one host's cores" : "");
  printf("%-4s %-3s %-26s %3s %4s %4s %12s %12s %10s %8s %9s\n", "rank", "pp", "schedule", "V", "m", "mb",
         "predicted ms", "makespan ms", "step end", "bubble", "peak MiB");
  for (int k = 0; k < n && k < 20; k++) {
    const pw_auto_row *r = &rows[k];
    printf("%-4d %-3d %-26s %3d %4d %4d %12.3f %12.3f %10.3f %8.3f %9.1f%s\n", k + 1, r->pp, r->schedule, r->V, r->m,
           r->mb_size, r->predicted * 1e3, (r->predicted - r->step_end) * 1e3, r->step_end * 1e3, r->bubble,
           (double)r->peak_memory / (1 << 20), r->fits ? "" : "  over memory");
  }
  const pw_auto_row *c = &rows[0];
  printf("\nchosen: pp %d, %s, virtual_stages %d, %d microbatches of %d: predicted %.3f ms a step (bubble %.3f, "
         "peak %.1f MiB a rank)",
         c->pp, c->schedule, c->V, c->m, c->mb_size, c->predicted * 1e3, c->bubble, (double)c->peak_memory / (1 << 20));
  if (n > 1 && rows[1].fits)
    printf("; the next, pp %d %s V %d m %d, is %.1f %% slower", rows[1].pp, rows[1].schedule, rows[1].V, rows[1].m,
           100 * (rows[1].predicted / c->predicted - 1));
  printf("\nset: \"mesh\": {\"pp\": %d, \"virtual_stages\": %d}, \"schedule\": {\"name\": \"%s\", "
         "\"microbatches\": %d}\n", c->pp, c->V, c->schedule, c->m);
  free(rows);
  return 0;
}

/* --schedule: the canonical name of one of the nine (other spellings and
 * other systems' names as a job spec takes them), or NULL after naming
 * them all and the nearest. */
static const char *schedule_name(const char *given) {
  const char *canon = pw_schedule_resolve(given);
  if (canon) return canon;
  char list[320] = "", near[96];
  for (int i = 0, n = 0; i < pw_n_schedule_names; i++)
    n += snprintf(list + n, sizeof list - (size_t)n, "%s%s", i ? ", " : "", pw_schedule_names[i]);
  pw_cli_usage_error("--schedule: unknown schedule '%s' (one of %s)%s", given, list,
                     pw_suggest_text(given, pw_schedule_names, pw_n_schedule_names, "", near, sizeof near));
  return NULL;
}

/* --export: the plan's lists in the form `format` names, on stdout. */
static int export_plan(const pw_plan *p, const char *format) {
  if (strcmp(format, "csv") == 0) {
    char *csv = pw_sched_csv_format(p->sched);
    if (!csv) return 1;
    fputs(csv, stdout);
    free(csv);
    return 0;
  }
  json_t *custom = pw_sched_custom_json(p->sched), *out = custom;
  if (custom && strcmp(format, "json") == 0)
    out = json_pack("{s:{s:i, s:i, s:i}, s:{s:s, s:i, s:o}}", "mesh", "pp", p->pp, "dp", p->dp, "virtual_stages",
                    p->V, "schedule", "name", "custom", "microbatches", p->m, "custom", custom);
  int rc = out ? print_json(out) : 1;
  json_decref(out);
  return rc;
}

#define CSV_MAX ((long)64 << 20)

/* --import-csv: the file's rows become job->schedule.custom (replacing the
 * job's schedule) and mesh.virtual_stages the number its stages need. */
static int import_csv(const char *path, pw_job *job) {
  FILE *f = fopen(path, "rb");
  long size = -1;
  char *text = NULL;
  if (f && fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && size <= CSV_MAX && fseek(f, 0, SEEK_SET) == 0 &&
      (text = malloc((size_t)size + 1)) && fread(text, 1, (size_t)size, f) == (size_t)size)
    text[size] = '\0';
  else {
    fprintf(stderr, "error: %s: %s\n", path,
            !f ? strerror(errno) : size > CSV_MAX ? "larger than 64 MiB" : "read failed");
    free(text);
    text = NULL;
  }
  if (f) fclose(f);
  if (!text) return 1;
  pw_err err = {0};
  char **ranks = NULL;
  int n = 0, rc = pw_sched_csv_parse(text, &ranks, &n, &err);
  free(text);
  if (!rc && n != job->mesh.pp)
    rc = pw_err_set(&err, PW_ESPEC, "csv", "%d rows (one per pipeline rank), but the job's mesh.pp is %d", n,
                    job->mesh.pp);
  pw_sched *s = NULL;
  if (!rc) rc = pw_sched_from_ranks((const char *const *)ranks, n, job->schedule.microbatches,
                                    job->mode == PW_MODE_FORWARD, &s, &err);
  if (rc) {
    char buf[600];
    fprintf(stderr, "error: %s: %s\n", path, pw_err_str(&err, buf, sizeof buf));
    pw_sched_ranks_free(ranks, n);
    return 1;
  }
  if (s->V != job->mesh.virtual_stages)
    fprintf(stderr,
            "pipewright plan: %s holds %d stages over %d ranks: planning with mesh.virtual_stages = %d "
            "(the job has %d)\n",
            path, s->S, s->pp, s->V, job->mesh.virtual_stages);
  job->mesh.virtual_stages = s->V;
  pw_sched_free(s);
  for (int r = 0; r < job->schedule.n_custom_ranks; r++) free(job->schedule.custom_ranks[r]);
  free(job->schedule.custom_ranks);
  job->schedule.custom_ranks = ranks;
  job->schedule.n_custom_ranks = n;
  snprintf(job->schedule.name, sizeof job->schedule.name, "custom");
  return 0;
}

/* --export, --format and --import-csv against the other options: 1 after
 * saying what is wrong; *format defaults to text. */
static int export_opts_bad(int export, const char **format, const char *csv, const char *sched, int other_output) {
  if (*format && !export) pw_cli_usage_error("--format goes with --export");
  else if (*format && strcmp(*format, "text") && strcmp(*format, "csv") && strcmp(*format, "json"))
    pw_cli_usage_error("--format: '%s' is not one of text, csv, json", *format);
  else if (export && other_output)
    pw_cli_usage_error("--export prints the action lists only: not with --compare, --slices or --json");
  else if (csv && sched) pw_cli_usage_error("--import-csv gives the schedule: not with --schedule");
  else {
    if (!*format) *format = "text";
    return 0;
  }
  return 1;
}

int pw_cmd_plan(int argc, char **argv) {
  static const struct option opts[] = {{"job", required_argument, 0, 'j'},   {"schedule", required_argument, 0, 's'},
                                       {"compare", no_argument, 0, 'c'},     {"json", no_argument, 0, 'J'},
                                       {"trace", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
                                       {"slices", no_argument, 0, 'S'},      {"export", no_argument, 0, 'E'},
                                       {"format", required_argument, 0, 'F'}, {"import-csv", required_argument, 0, 'I'},
                                       {"compare-regions", no_argument, 0, 'R'}, {"cores", required_argument, 0, 'C'},
                                       {"profile", required_argument, 0, 'P'}, {"auto", no_argument, 0, 'A'},
                                       {"max-pp", required_argument, 0, 'M'}, {"max-rank-memory", required_argument, 0, 'm'},
                                       {0, 0, 0, 0}};
  const char *job_path = NULL, *sched = NULL, *trace = NULL, *format = NULL, *csv = NULL, *profile = NULL;
  int compare = 0, as_json = 0, slices = 0, export = 0, regions = 0, cores = 0, c, autop = 0, max_pp = 8, mem_mib = 0;
  const char *more_profiles[MAX_PROFILES];
  int n_more = 0;
  optind = 1;
  while ((c = pw_getopt(argc, argv, "j:s:cJt:hSEF:I:RC:P:AM:m:", opts)) != -1) {
    switch (c) {
      case 'j': job_path = optarg; break;
      case 's': sched = optarg; break;
      case 'c': compare = 1; break;
      case 'J': as_json = 1; break;
      case 't': trace = optarg; break;
      case 'S': slices = 1; break;
      case 'E': export = 1; break;
      case 'F': format = optarg; break;
      case 'I': csv = optarg; break;
      case 'R': regions = 1; break;
      case 'C':
        if (pw_arg_int("--cores", optarg, 1, 1 << 20, &cores)) return 2;
        break;
      case 'P':
        if (profile && n_more == MAX_PROFILES) {
          fprintf(stderr, "error: --profile: at most %d\n", MAX_PROFILES + 1);
          return 2;
        }
        if (profile) more_profiles[n_more++] = optarg;
        else profile = optarg;
        break;
      case 'A': autop = 1; break;
      case 'M':
        if (pw_arg_int("--max-pp", optarg, 1, 64, &max_pp)) return 2;
        break;
      case 'm':
        if (pw_arg_int("--max-rank-memory", optarg, 1, 1 << 30, &mem_mib)) return 2;
        break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL) || pw_args_required(job_path, "--job FILE") ||
      (sched && !(sched = schedule_name(sched)))) {
    usage(stderr);
    return 2;
  }
  if (export_opts_bad(export, &format, csv, sched, compare || slices || as_json)) {
    usage(stderr);
    return 2;
  }
  pw_job job;
  if (pw_cli_load_job(job_path, &job)) return 1;
  if (csv && import_csv(csv, &job)) {
    pw_job_free(&job);
    return 1;
  }
  /* a virtual schedule on a flat job: the virtual_stages --compare uses */
  const pw_sched_info *info = sched ? pw_sched_info_find(sched) : NULL;
  if (info && info->min_v > job.mesh.virtual_stages) {
    int V = pw_plan_virtual_stages(&job, sched);
    fprintf(stderr,
            "pipewright plan: %s needs virtual_stages >= %d: planning with mesh.virtual_stages = %d (the job has %d)\n",
            sched, info->min_v, V, job.mesh.virtual_stages);
    job.mesh.virtual_stages = V;
  }
  int rc = 0;
  /* The coordinator's bounds, cheap ones before planning: a spec it would
   * refuse is refused here too, in milliseconds. */
  pw_budget budget;
  pw_budget_init(&budget);
  budget.max_slice_bytes = pw_budget_slice_room(PW_CONTROL_MAX, (int64_t)job.mesh.pp * job.mesh.dp * job.mesh.tp);
  pw_err err = {0};
  if (pw_plan_check_budget(&job, sched, compare, &budget, &err)) {
    pw_cli_report(&err);
    pw_job_free(&job);
    return 1;
  }
  if (compare) {
    json_t *cmp = pw_plan_compare_json(&job);
    if (as_json)
      rc = print_json(cmp);
    else {
      printf("job %s: pp %d x dp %d, %d microbatches; simulated with the FLOP cost model\n\n", job.name, job.mesh.pp,
             job.mesh.dp, job.schedule.microbatches);
      print_compare(cmp);
    }
    json_decref(cmp);
    pw_job_free(&job);
    return rc;
  }
  pw_cost_profile prof = {0};
  if (profile && pw_cost_load(profile, &prof, &err)) {
    pw_cli_report(&err);
    pw_job_free(&job);
    return 1;
  }
  pw_cost_model cm = {.profile = profile ? &prof : NULL, .cores = cores ? cores : profile ? prof.cores : 0};
  if (n_more && !autop) {
    fprintf(stderr, "error: --profile: several only with --auto (one per thread count)\n");
    pw_cost_free(&prof);
    pw_job_free(&job);
    return 2;
  }
  if (autop && n_more) {
    budget.max_rank_memory = (size_t)mem_mib << 20;
    snprintf(budget.memory_from, sizeof budget.memory_from, "--max-rank-memory");
    rc = run_auto_host(&job, &prof, more_profiles, n_more, cores, &budget, max_pp, as_json);
    pw_cost_free(&prof);
    pw_job_free(&job);
    return rc;
  }
  if (autop) {
    budget.max_rank_memory = (size_t)mem_mib << 20;
    snprintf(budget.memory_from, sizeof budget.memory_from, "--max-rank-memory");
    rc = run_auto(&job, &cm, &budget, max_pp, as_json);
    pw_cost_free(&prof);
    pw_job_free(&job);
    return rc;
  }
  pw_plan p;
  if (pw_plan_build_costed(&job, sched, &cm, &p, &err) || pw_plan_check_fit(&job, &p, &budget, &err)) {
    pw_cli_report(&err);
    if (p.sched) pw_plan_free(&p);
    pw_cost_free(&prof);
    pw_job_free(&job);
    return 1;
  }
  if (regions) {
    json_t *r = NULL;
    pw_sim_costs costs = pw_plan_costs(&p);
    if (!p.regions) {
      fprintf(stderr, "error: --compare-regions: %s is not a regions model (no model.regions)\n", job_path);
      rc = 1;
    } else if (!(r = pw_regions_compare_json(&job, p.joint, p.regions, &costs, cm.cores, cm.profile, &p.part, &err))) {
      pw_cli_report(&err);
      rc = 1;
    } else if (as_json) {
      rc = print_json(r);
    } else {
      printf("job %s: %d microbatches; simulated with the %s\n\n", job.name, job.schedule.microbatches,
             cost_model_name(&cm));
      print_compare_regions(r);
    }
    json_decref(r);
  } else if (export) {
    rc = export_plan(&p, format);
  } else if (slices) {
    rc = print_slices(&job, &p);
  } else if (as_json) {
    json_t *j = pw_plan_json(&job, &p);
    json_object_set_new(j, "cost_model", json_string(cost_model_name(&cm)));
    json_object_set_new(j, "predicted_step", json_pack("{s:f, s:f, s:i}", "seconds", p.predicted, "step_end",
                                                       p.step_end, "cores", cm.cores));
    rc = print_json(j);
    json_decref(j);
  } else {
    print_plan(&job, &p);
    char where[64] = "";
    if (cm.cores) snprintf(where, sizeof where, ", every rank on one host of %d cores", cm.cores);
    printf("predicted step (%s%s): %.3f ms = makespan %.3f ms + step end %.3f ms\n", cost_model_name(&cm), where,
           p.predicted * 1e3, (p.predicted - p.step_end) * 1e3, p.step_end * 1e3);
    print_snap(&p);
  }
  if (trace) {
    json_t *t = pw_sim_trace_json(p.sim);
    if (json_dump_file(t, trace, JSON_COMPACT)) {
      fprintf(stderr, "error: cannot write %s\n", trace);
      rc = 1;
    }
    json_decref(t);
  }
  pw_plan_free(&p);
  pw_cost_free(&prof);
  pw_job_free(&job);
  return rc;
}
