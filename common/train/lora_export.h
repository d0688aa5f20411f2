/* lora_export: a LoRA fine-tune's checkpoint in the two forms others read.
 *
 * Adapters alone, as Hugging Face PEFT saves them (save_pretrained): a
 * directory with adapter_model.safetensors, each adapter under
 * "base_model.model.<linear>.lora_A.weight" / ".lora_B.weight" (PEFT's
 * wrapper prefix, no adapter name), and adapter_config.json (peft_type
 * LORA, r, lora_alpha, target_modules: the adapted linear layers' names).
 * Our <linear> names are the checkpoint contract's, so PEFT loads them onto
 * a PyTorch module tree named like the contract (docs/contracts.md).
 *
 * Merged: the base model with W += (alpha / r) B A in every adapted linear
 * layer and no adapter tensors, loadable by the model without model.lora.
 *
 * Both take a program over the whole model whose parameters are loaded. */
#ifndef PW_LORA_EXPORT_H
#define PW_LORA_EXPORT_H

#include "errors.h"
#include "prog.h"

/* dir must exist. PW_EINVAL when the model has no adapters. */
PW_MUST_CHECK int pw_lora_export_adapters(pw_prog *p, const char *dir, pw_err *err);
/* Writes the merged parameters to path (the program's own are left as
 * they were). PW_EINVAL when the model has no adapters. */
PW_MUST_CHECK int pw_lora_merge(pw_prog *p, const char *path, pw_err *err);

#endif
