/* weights: the coordinator's stored weights — safetensors files a job's
 * parameters can start from ("init"), content-addressed like datasets:
 * <state_dir>/weights/<sha256>. They arrive by upload (POST
 * /v1/checkpoints, streamed through a datasets.h writer into that folder)
 * or are gathered at submit from a job's retained checkpoint step.
 *
 * Nothing is stored unchecked: the file must be a valid safetensors file
 * (common/io/safetensors.h: header, offsets, and the per-tensor CRC32C
 * metadata when present) whose every tensor is F32 and finite. The rows
 * are the store's (store.h), the routes api_weights.c's. */
#ifndef PW_WEIGHTS_H
#define PW_WEIGHTS_H

#include <stdint.h>

#include "datasets.h"
#include "errors.h"
#include "spec.h"
#include "store.h"

#define PW_WEIGHTS_DIR "weights"

typedef struct {
  char id[65];
  int64_t size;
  int64_t n_tensors, params;
} pw_w_info;

/* <state_dir>/weights/<id> into out. */
PW_MUST_CHECK int pw_w_path(const char *state_dir, const char *id, char *out, size_t cap, pw_err *err);
/* Checks the safetensors file at path (what names it in errors: PW_EFORMAT
 * naming the tensor for a bad dtype or a non-finite value); counts its
 * tensors and elements. */
PW_MUST_CHECK int pw_w_check(const char *path, const char *what, int64_t *n_tensors, int64_t *params, pw_err *err);
/* Checks the writer's file, then commits it into the weights folder. */
PW_MUST_CHECK int pw_w_commit(pw_ds_writer *w, const char *what, pw_w_info *info, pw_err *err);
/* Copies the file at src into the weights folder (checked) and records it
 * (kind "model" | "optimizer", source: where it came from). */
PW_MUST_CHECK int pw_w_import(pw_store *s, const char *state_dir, const char *src, const char *kind, const char *source,
                              pw_w_info *info, pw_err *err);
/* Removes <id>'s file (missing is fine). */
PW_MUST_CHECK int pw_w_unlink(const char *state_dir, const char *id, pw_err *err);

/* Submit: job->init resolved and held to the model. init.job + init.step
 * is gathered into stored weights (and the optimizer state with
 * init.optimizer) and named by checkpoint; init.checkpoint must be stored.
 * Then every parameter of model (param names and shapes) must be in the
 * file with its shape. Errors are PW_ESPEC at "init..." naming the tensor
 * and both shapes, the job or the step; the store's own failures pass
 * through. */
typedef struct {
  const char *name;
  int ndim;
  int shape[2];
} pw_w_param;
PW_MUST_CHECK int pw_w_init_resolve(pw_store *s, const char *state_dir, pw_init_spec *init, const pw_w_param *params,
                                    int n_params, pw_err *err);

#endif
