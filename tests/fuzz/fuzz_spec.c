/* fuzz_spec: the job spec parser, and its round trip.
 *
 * Any bytes: parse as JSON, then as a job spec. Nothing may crash or leak.
 * When the spec is accepted, its canonical form (pw_job_to_json) must parse
 * again and give the same canonical form: parse -> canonical -> parse is an
 * identity for every accepted spec. An accepted spec's custom schedule
 * lists go through the planner's reader and proof (pw_sched_from_ranks);
 * bytes that are not JSON are read as a PyTorch schedule CSV. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"
#include "spec_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
  pw_err err = {0};
  if (!root) {
    char *text = malloc(size + 1), **rows;
    int n;
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    if (pw_sched_csv_parse(text, &rows, &n, &err) == 0) pw_sched_ranks_free(rows, n);
    free(text);
    return 0;
  }
  pw_job job;
  if (pw_job_parse(root, NULL, &job, &err)) {
    json_decref(root);
    return 0;
  }
  pw_sched *sched;
  if (job.schedule.custom_ranks &&
      pw_sched_from_ranks((const char *const *)job.schedule.custom_ranks, job.schedule.n_custom_ranks,
                          job.schedule.microbatches, job.mode == PW_MODE_FORWARD, &sched, &err) == 0)
    pw_sched_free(sched);
  json_t *canon = pw_job_to_json(&job);
  if (!canon) abort();
  pw_job again;
  if (pw_job_parse(canon, NULL, &again, &err)) {
    char *s = json_dumps(canon, JSON_COMPACT);
    fprintf(stderr, "canonical spec refused: %s: %s\n%s\n", err.path, err.msg, s);
    abort();
  }
  json_t *canon2 = pw_job_to_json(&again);
  if (!json_equal(canon, canon2)) {
    char *a = json_dumps(canon, JSON_COMPACT | JSON_SORT_KEYS);
    char *b = json_dumps(canon2, JSON_COMPACT | JSON_SORT_KEYS);
    fprintf(stderr, "round trip differs:\n%s\n%s\n", a, b);
    abort();
  }
  json_decref(canon2);
  json_decref(canon);
  pw_job_free(&again);
  pw_job_free(&job);
  json_decref(root);
  return 0;
}
