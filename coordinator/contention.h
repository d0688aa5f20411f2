/* contention: a job's ranks that share a host's CPU cores.
 *
 * Workers report their machine (register.host, with hostname for display);
 * workers with the same host share its cores. For a job's latest run the
 * coordinator counts, per host, the cores, the threads of the job's ranks
 * there and the threads of other busy workers there (their jobs compete
 * too). A host whose threads exceed its cores is oversubscribed: each
 * thread gets about cores / threads of a core while all are busy. The job
 * JSON carries the note, the dispatch event says it once, and the timeline
 * compares with the plan replayed under that sharing (common/plan/share.h).
 *
 * Counted from the registry of this coordinator's workers as it stands: a
 * worker gone from it (expired) counts as a host of its own, an older
 * worker without a host too, and processes the coordinator does not know
 * (another coordinator's workers on the same machine) are not seen. */
#ifndef PW_CONTENTION_H
#define PW_CONTENTION_H

#include <jansson.h>
#include <stdint.h>

#include "coord.h"
#include "share.h"

typedef struct {
  char host[64], hostname[64];
  int cores;    /* as its workers report them (the largest) */
  int threads;  /* of the job's ranks here */
  int other;    /* of other busy workers here */
  int n_ranks;  /* the job's ranks here */
} pw_cont_host;

typedef struct {
  int n_ranks;          /* the job's ranks (replica * pp + pipeline rank) */
  int *host, *threads;  /* [n_ranks]: host index, threads */
  int n_hosts;
  pw_cont_host *hosts;  /* [n_hosts] */
  int *cores, *other;   /* [n_hosts]: as pw_share wants them */
} pw_contention;

/* The job's ranks' hosts from its latest run's assignments in the store.
 * PW_ENOENT when the job has no run; PW_ENOMEM. */
PW_MUST_CHECK int pw_contention_of_job(pw_coord *c, pw_store *s, int64_t job, pw_contention *out);
void pw_contention_free(pw_contention *ct);
/* {"hosts": [{"host", "hostname", "cores", "ranks": [...], "threads",
 *   "other_threads", "share"}] (the oversubscribed ones), "message"} or
 * NULL when no host has more threads than cores. */
json_t *pw_contention_json(const pw_contention *ct);
/* The sharing for pw_sim_run_shared. */
pw_share pw_contention_share(const pw_contention *ct);

/* Dispatch: a "contention" event with the message, when there is one
 * (loop thread; the run's ranks are assigned). */
struct pw_jobrt;
void pw_contention_note(pw_coord *c, const struct pw_jobrt *jr);

#endif
