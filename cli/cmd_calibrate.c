/* cmd_calibrate: `pipewright calibrate` — measures this host for the
 * planner's calibrated cost model (common/train/calibrate.h) and writes the
 * profile `pipewright plan --profile` reads (common/plan/cost.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "calibrate.h"
#include "cli.h"
#include "cost.h"
#include "json_short.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pipewright calibrate --job FILE [options]\n"
          "  --mb LIST         microbatch sizes to measure, ascending (default 1,2,4,8)\n"
          "  --target-ms MS    time spent per layer and size (default 20)\n"
          "  --cores N         cores the profile records for this host (default: online CPUs)\n"
          "  --threads N       threads a rank computes with (default 1: OPENBLAS_NUM_THREADS=1)\n"
          "  --no-link         keep the default link instead of measuring loopback TCP\n"
          "  --no-share        do not measure core sharing (n busy processes at once)\n"
          "  --share-ms MS     time per number of busy processes, 5 passes (default 300)\n"
          "  --out FILE        write the profile here (default: stdout)\n"
          "  --help\n");
}

/* "1,2,4" into mb (ascending, each 1..4096); count or -1 after saying why. */
static int parse_mb(const char *text, int *mb, int cap) {
  int n = 0;
  const char *s = text;
  while (*s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > 4096 || (*end && *end != ',') || n == cap || (n && v <= mb[n - 1])) {
      pw_cli_usage_error("--mb: '%s' is not an ascending list of up to %d sizes in 1..4096", text, cap);
      return -1;
    }
    mb[n++] = (int)v;
    s = *end ? end + 1 : end;
  }
  if (!n) pw_cli_usage_error("--mb: empty list");
  return n ? n : -1;
}

int pw_cmd_calibrate(int argc, char **argv) {
  static const struct option opts[] = {{"job", required_argument, 0, 'j'},     {"mb", required_argument, 0, 'm'},
                                       {"target-ms", required_argument, 0, 't'}, {"cores", required_argument, 0, 'C'},
                                       {"threads", required_argument, 0, 'T'},  {"no-link", no_argument, 0, 'L'},
                                       {"no-share", no_argument, 0, 'S'},       {"share-ms", required_argument, 0, 's'},
                                       {"out", required_argument, 0, 'o'},      {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *job_path = NULL, *out_path = NULL;
  int mb[PW_COST_MAX_MB] = {1, 2, 4, 8}, c;
  double ms = 20, share_ms = 300;
  pw_calib_opts o = {.mb = mb, .n_mb = 4, .link = 1, .share = 1};
  optind = 1;
  while ((c = pw_getopt(argc, argv, "j:m:t:C:T:LSs:o:h", opts)) != -1) {
    switch (c) {
      case 'j': job_path = optarg; break;
      case 'm':
        if ((o.n_mb = parse_mb(optarg, mb, PW_COST_MAX_MB)) < 0) return 2;
        break;
      case 't':
        if (pw_arg_num("--target-ms", optarg, 0, 60000, &ms)) return 2;
        break;
      case 'C':
        if (pw_arg_int("--cores", optarg, 1, 1 << 16, &o.cores)) return 2;
        break;
      case 'T':
        if (pw_arg_int("--threads", optarg, 1, 1 << 16, &o.threads)) return 2;
        break;
      case 'L': o.link = 0; break;
      case 'S': o.share = 0; break;
      case 's':
        if (pw_arg_num("--share-ms", optarg, 1, 60000, &share_ms)) return 2;
        break;
      case 'o': out_path = optarg; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL) || pw_args_required(job_path, "--job FILE")) {
    usage(stderr);
    return 2;
  }
  o.target_s = ms / 1e3;
  o.share_s = share_ms / 1e3;
  if (pw_cli_compute_ready(o.threads > 0 ? o.threads : 1)) return 1;
  pw_job job;
  if (pw_cli_load_job(job_path, &job)) return 1;
  json_t *prof = NULL;
  pw_err err = {0};
  int rc = pw_calibrate(&job, &o, &prof, &err);
  pw_job_free(&job);
  if (rc) {
    pw_cli_report(&err);
    return 1;
  }
  /* a loaded host times every layer slow and every sharing speed low,
   * and the plans priced with it believe so */
  double share = json_number_value(json_object_get(prof, "cpu_share"));
  if (share < 0.9)
    fprintf(stderr,
            "warning: the layers were timed with %.0f %% of a core (cpu_share): something else ran on this host, "
            "so the profile reads slower than the host is; calibrate on an idle host\n",
            100 * share);
  char *text = pw_json_dumps(prof, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
  json_decref(prof);
  FILE *f = out_path ? fopen(out_path, "w") : stdout;
  int bad = !text || !f || fprintf(f, "%s\n", text) < 0;
  if (out_path && f && fclose(f)) bad = 1;
  if (bad) fprintf(stderr, "error: %s: cannot write the profile\n", out_path ? out_path : "stdout");
  free(text);
  return bad;
}
