/* fuzz_profile: the calibration profile's reader (common/plan/cost.h) on any
 * text — a profile is a file a user or a worker hands the planner. What it
 * accepts must cost every layer at any microbatch size without reading
 * out of bounds, and write back the same profile. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cost.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_t *j = json_loadb((const char *)data, size, 0, NULL);
  if (!j) return 0;
  pw_cost_profile p, q;
  pw_err err = {0};
  if (pw_cost_parse(j, &p, &err) == 0) {
    for (int l = 0; l < p.n_layers; l++)
      for (int mb = 1; mb <= 2 * p.mb[p.n_mb - 1] && mb <= 64; mb++) {
        double f, i, w;
        pw_cost_layer(&p, l, mb, &f, &i, &w);
        if (!(f >= 0 && i >= 0 && w >= 0)) abort(); /* every series >= 0: so are the costs */
      }
    json_t *back = pw_cost_json(&p);
    if (!back || pw_cost_parse(back, &q, &err)) abort(); /* what it writes it reads */
    if (q.n_layers != p.n_layers || q.n_mb != p.n_mb || q.n_speed != p.n_speed) abort();
    for (int k = 0; k < p.n_speed; k++)
      if (!(p.speed[k] > 0 && p.speed[k] <= 1) || q.speed[k] != p.speed[k] || q.wake_busy[k] != p.wake_busy[k]) abort();
    if (!(pw_cost_transfer_latency(&p, 3) >= p.latency)) abort();
    pw_cost_free(&q);
    json_decref(back);
    pw_cost_free(&p);
  }
  json_decref(j);
  return 0;
}
