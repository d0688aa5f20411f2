/* checkpoints: the coordinator's copy of every job's checkpoint shards.
 *
 * Each rank of replica 0 uploads, at each checkpoint step, its stages'
 * model file and optimizer file (common/compute/ckpt.h's two safetensors
 * files). They live at
 *   <state_dir>/checkpoints/job-<J>/step-<S>/stage-<K>.safetensors
 *   <state_dir>/checkpoints/job-<J>/step-<S>/stage-<K>.optim.safetensors
 * A shard arrives through a writer: appended to a temporary file of its
 * step folder while its CRC32C (or SHA-256) is computed, never held whole
 * in memory; commit checks the checksum the uploader stated, fsyncs,
 * checks the safetensors header and every tensor's stored checksum,
 * renames it into place and fsyncs the folder. A writer freed without
 * commit removes its file. The store records the shards (store.h); this
 * module knows files only. Thread-safe: writers share nothing. */
#ifndef PW_CHECKPOINTS_H
#define PW_CHECKPOINTS_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

typedef struct pw_ck_writer pw_ck_writer;

/* <state_dir>/checkpoints/job-<J>[/step-<S>] (step < 0: the job's folder). */
PW_MUST_CHECK int pw_ck_dir(const char *state_dir, int64_t job, int step, char *out, size_t cap, pw_err *err);
/* The shard's file (optimizer: the .optim.safetensors one). */
PW_MUST_CHECK int pw_ck_shard_path(const char *state_dir, int64_t job, int step, int stage, int optimizer, char *out,
                                   size_t cap, pw_err *err);

/* The checksum an uploader states: kind 'c' (crc32c, 8 hex digits) or 's'
 * (sha256, 64 hex digits), the value in lowercase hex. */
typedef struct {
  char kind;
  char hex[65];
} pw_ck_sum;
/* Parses the header value of X-Pipewright-Crc32c (kind 'c') or
 * X-Pipewright-Sha256 (kind 's'); PW_EINVAL naming the header. */
PW_MUST_CHECK int pw_ck_sum_parse(char kind, const char *value, pw_ck_sum *out, pw_err *err);

/* A new temporary file in the step's folder (made when missing). */
PW_MUST_CHECK int pw_ck_writer_open(const char *state_dir, int64_t job, int step, int stage, int optimizer,
                                    const pw_ck_sum *sum, pw_ck_writer **out, pw_err *err);
/* Appends n bytes. A full disk is PW_ENOSPC, any other failure PW_EIO. */
PW_MUST_CHECK int pw_ck_writer_write(pw_ck_writer *w, const void *data, size_t n, pw_err *err);
uint64_t pw_ck_writer_size(const pw_ck_writer *w);
/* Checksum (PW_EINVAL naming both values when it differs), fsync, the
 * safetensors checks (PW_EFORMAT), rename, fsync of the folder. */
PW_MUST_CHECK int pw_ck_writer_commit(pw_ck_writer *w, pw_err *err);
/* Closes; removes the temporary file unless committed. NULL is fine. */
void pw_ck_writer_free(pw_ck_writer *w);

/* Whether step `step` of job `job` reads back intact: every stage's model
 * and optimizer file opens as safetensors and matches the checksums it
 * carries. 0, or the first failure naming the file (PW_ENOENT when one is
 * gone). Reads every byte: off the control loop. */
PW_MUST_CHECK int pw_ck_step_check(const char *state_dir, int64_t job, int step, int n_stages, pw_err *err);

/* Gathers step `step` of job `job` (stages 0..n_stages-1) into ONE
 * safetensors file at out: the whole model, or with optimizer its
 * optimizer state (exp_avg.*, exp_avg_sq.*). A tensor held by several
 * stages (tied embeddings) is taken once, from the lowest stage. The
 * metadata says format "pt", the step and (job_json, may be NULL) the job.
 * PW_ENOENT naming the file when a shard is missing. For GET
 * /v1/jobs/{id}/checkpoint and for starting a job from another's step. */
PW_MUST_CHECK int pw_ckpt_gather(const char *state_dir, int64_t job, int step, int n_stages, int optimizer,
                                 const char *job_json, const char *out, pw_err *err);

/* Removes a step's folder and every file in it (missing is fine); step <
 * 0: the job's whole folder. */
PW_MUST_CHECK int pw_ck_remove(const char *state_dir, int64_t job, int step, pw_err *err);

#endif
