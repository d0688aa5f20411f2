/* cost: a calibrated cost model — what the planner predicts a step takes
 * on a host it has measured, in place of the FLOP model's assumed rate.
 *
 * A profile (`pipewright calibrate`, common/train/calibrate.h) holds, for one
 * host, the measured seconds of each layer's F, I and W for one microbatch
 * at a few microbatch sizes (GEMM shapes change with it, so the rate does),
 * the step end's cost (AdamW and gradient work: seconds per trainable
 * parameter, plus a fixed part per rank), the host's cores, a link
 * (latency, bandwidth) measured between two threads over loopback TCP plus
 * the wake-up of a waiting thread (a transfer wakes two: the receiving
 * rank's loop, then its compute thread), and how fast each of n busy
 * one-thread processes computes on the host next to one alone (core
 * sharing: caches, memory bandwidth, and above the cores, time slicing):
 *
 *   {"version": 2, "host": "h1", "cores": 2, "threads": 1,
 *    "mb_sizes": [1, 2, 4],
 *    "layers": [{"name": "embed", "f": [..], "i": [..], "w": [..]}, ...],
 *    "step": {"per_param_s": 2e-9, "fixed_s": 1e-4},
 *    "link": {"latency_s": 5e-5, "bandwidth_Bps": 3e9, "wake_s": 2e-5},
 *    "sharing": {"speed": [1, 0.97, 0.62, 0.45], "wake_s": [2e-5, ...]}}
 *
 * sharing.speed[n-1] is each process's rate with n busy at once, relative
 * to one alone (1 then; at most 1/(n/cores) times a little above the
 * cores); sharing.wake_s[n-1] (optional, as long) a thread's wake-up with
 * n processes busy beside it. Version 1 profiles (no wake_s, no sharing) still read: a zero
 * wake-up, ideal sharing.
 *
 * A layer at a microbatch size between two measured ones costs the linear
 * interpolation of the two; outside them, the nearest one's time per
 * sequence times the size. Layers are matched to a model by name: a model
 * layer the profile lacks is an error naming it.
 *
 * The prediction of one step: the simulator's makespan under these costs
 * (with ranks sharing a host's cores when more ranks than cores run there:
 * share.h), plus the step end of the slowest rank. */
#ifndef PW_COST_H
#define PW_COST_H

#include <jansson.h>

#include "errors.h"
#include "model.h"
#include "partition.h"

#define PW_COST_VERSION 2        /* what pw_cost_json writes; 1 still reads */
#define PW_COST_MAX_MB 16        /* microbatch sizes in a profile */
#define PW_COST_MAX_LAYERS 4096  /* layers in a profile */
#define PW_COST_MAX_SHARE 64     /* busy processes sharing.speed covers */

typedef struct {
  char host[64];
  int cores, threads;        /* the host's cores; threads a rank computes with */
  int n_mb;
  int mb[PW_COST_MAX_MB];    /* ascending, distinct, >= 1 */
  int n_layers;
  char (*names)[48];         /* [n_layers] */
  double *f, *i, *w;         /* [n_layers * n_mb] seconds per microbatch */
  double per_param, fixed;   /* step end: seconds per trainable parameter, and fixed */
  double latency, bandwidth; /* link: seconds per transfer, bytes per second */
  double wake;               /* seconds to wake a waiting thread */
  int n_speed;               /* 0: ideal sharing */
  double speed[PW_COST_MAX_SHARE]; /* [n-1]: each of n busy processes' rate */
  double wake_busy[PW_COST_MAX_SHARE]; /* [n-1]: the wake-up beside n busy (0: not measured) */
} pw_cost_profile;

/* Reads a profile. Errors are PW_EFORMAT naming the JSON path and the rule
 * ("profile.layers[3].f[1]: must be a number >= 0"); PW_ENOMEM. */
PW_MUST_CHECK int pw_cost_parse(const json_t *j, pw_cost_profile *out, pw_err *err);
/* pw_cost_parse of a file (at most 16 MiB); PW_EIO naming the path. */
PW_MUST_CHECK int pw_cost_load(const char *path, pw_cost_profile *out, pw_err *err);
json_t *pw_cost_json(const pw_cost_profile *p);
void pw_cost_free(pw_cost_profile *p);

/* Seconds of layer `layer` (profile index) for one microbatch of mb
 * sequences: F, I and W. */
void pw_cost_layer(const pw_cost_profile *p, int layer, int mb, double *f, double *i, double *w);

/* Per-stage costs of a partition of model m at mb sequences per
 * microbatch: f, i, w [S] (seconds per microbatch). PW_EFORMAT
 * ("profile.layers": "no entry for layer 'blocks.3'") when m has a layer
 * the profile lacks. */
PW_MUST_CHECK int pw_cost_stages(const pw_cost_profile *p, const pw_model *m, const pw_partition *part, int mb,
                                 double *f, double *i, double *w, pw_err *err);

/* Seconds of the step end on a rank holding `params` trainable parameters. */
double pw_cost_step_end(const pw_cost_profile *p, size_t params);
/* Seconds a cross-rank transfer costs before its bytes when n ranks
 * compute on the host: the link's latency and two wake-ups (the one
 * measured beside n busy processes when the profile has it, the last
 * measured past its end; n <= 1: the plain one). */
double pw_cost_transfer_latency(const pw_cost_profile *p, int n);

#endif
