/* calibrate: measures what the planner's calibrated cost model reads
 * (common/plan/cost.h): each layer's F, I and W for one microbatch at a few
 * microbatch sizes, the step end's cost (fixed per program and per
 * trainable parameter: a least-squares line over the layers' programs), a
 * loopback TCP link between two threads and a thread's wake-up, and core
 * sharing: n = 1..2 x cores one-thread processes (fork) at once, each
 * running one of n contiguous parts of the model as n pipeline ranks would,
 * their rates against the parts' times alone — on scratch buffers, with
 * the stage programs the workers run (common/compute/prog.h), so the shapes
 * and kernels are the real ones.
 *
 * A layer that holds only the loss (pw_layer.is_loss) cannot start a
 * program: it is timed with the layer before it and its entry is zero.
 * Each figure is the median of repeated runs (at least 3, and until about
 * target_s seconds of them). Thread count: OPENBLAS_NUM_THREADS, as the
 * workers run. */
#ifndef PW_CALIBRATE_H
#define PW_CALIBRATE_H

#include <jansson.h>

#include "errors.h"
#include "spec.h"

typedef struct {
  const int *mb;     /* microbatch sizes, ascending */
  int n_mb;
  double target_s;   /* time to spend per layer and size; 0: 0.02 */
  int cores;         /* recorded in the profile (0: the cores this process may use, sysres.h) */
  int threads;       /* threads a rank computes with (recorded; 0: 1) */
  int link;          /* measure the loopback link and the wake-up (else the defaults) */
  int share;         /* measure core sharing (else the profile has none: ideal) */
  double share_s;    /* seconds per number of busy processes and pass; 0: 0.3 */
} pw_calib_opts;

#define PW_CALIB_MAX_SHARE 8 /* busy processes measured at most */

/* The profile's JSON (cost.h's form) for job's model; PW_ESPEC from the
 * model, PW_ENOMEM, PW_EIO (the link measurement's sockets). */
PW_MUST_CHECK int pw_calibrate(const pw_job *job, const pw_calib_opts *o, json_t **out, pw_err *err);

#endif
