/* spec_json: the job spec's JSON side — parse and validate a document into
 * a pw_job (spec.h), and write a pw_job back out with every default filled
 * in. One field table (spec_field.h) drives both directions. */
#ifndef PW_SPEC_JSON_H
#define PW_SPEC_JSON_H

#include <jansson.h>

#include "errors.h"
#include "spec.h"

/* Parse and validate a job spec. On error returns PW_ESPEC (or PW_EJSON)
 * with err->path the JSON path ("train.optimizer.betas[1]") and err->msg the
 * rule. On success the job owns its allocations: release with pw_job_free.
 * `base_dir` (may be NULL) resolves a relative data.path. */
PW_MUST_CHECK int pw_job_parse(const json_t *root, const char *base_dir, pw_job *job, pw_err *err);
/* Read a JSON file and parse it; JSON syntax errors give PW_EJSON with the
 * line and column in the message. */
PW_MUST_CHECK int pw_job_load_file(const char *path, pw_job *job, pw_err *err);
/* The job with every default filled in, as JSON (new reference). */
json_t *pw_job_to_json(const pw_job *job);

#endif
