/* ckpt: a program's parameters and optimizer state as safetensors files.
 *
 * `path` holds the parameters under their contract names (PyTorch can load
 * it as a state dict); the optimizer state goes alongside in
 * "<path without .safetensors>.optim.safetensors" as exp_avg.<name> and
 * exp_avg_sq.<name> (SGD keeps its momentum in exp_avg), for the parameters
 * that train only (frozen ones have no state). Both carry the
 * step in their metadata. Each file is written to a temporary name and
 * renamed, the optimizer file first: a model file present means its
 * optimizer file is complete too. */
#ifndef PW_CKPT_H
#define PW_CKPT_H

#include "errors.h"
#include "prog.h"

/* "<path minus .safetensors>.optim.safetensors" into buf. */
void pw_ckpt_optim_path(const char *path, char *buf, size_t cap);

/* step = optimizer steps taken; job_json (may be NULL) is stored as metadata. */
PW_MUST_CHECK int pw_ckpt_save(pw_prog *p, const char *path, int step, const char *job_json, pw_err *err);

/* Loads every parameter of the program from path (extra tensors in the
 * file are ignored: a stage loads its part of a whole-model file; LoRA
 * adapters missing from it keep their values: a base model's file starts a
 * LoRA fine-tune). With
 * with_optim, also the optimizer state; *step (may be NULL) gets the step. */
PW_MUST_CHECK int pw_ckpt_load(pw_prog *p, const char *path, int with_optim, int *step, pw_err *err);
/* Only the optimizer state, from an optimizer file at opath (exp_avg.*,
 * exp_avg_sq.*; extra tensors ignored). */
PW_MUST_CHECK int pw_ckpt_load_optim(pw_prog *p, const char *opath, pw_err *err);

#endif
