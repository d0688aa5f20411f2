/* model_build: the graph builder of every template (model_build.c),
 * private to common/model: a value, a parameter, a node, a layer, and the
 * layers the templates share (a linear with its LoRA adapter, a norm,
 * elementwise ops, learned positions). model.c's templates call it under
 * short names, model_bert.c as it is. */
#ifndef PW_MODEL_BUILD_H
#define PW_MODEL_BUILD_H

#include "model.h"

typedef struct pw__mbuild {
  pw_model *m;
  int cap_values, cap_nodes, cap_params, cap_layers;
  int layer;        /* current layer id */
  int oom;          /* an allocation failed: the rest are no-ops, the build fails */
  const pw_model_spec *spec;
  unsigned lora_hit;  /* bit i: model.lora.targets[i] matched a linear layer */
  int block_index;    /* the gpt/llama template's block being built, or -1 (model.moe applies there) */
} pw__mbuild;

/* A value of that shape; its id. */
int pw__mb_value(pw__mbuild *bd, int rows, int width, pw_dtype dt, pw_val_role role);
/* A parameter [d0] or [d0, d1] (d1 > 0) of the current layer; its id. */
int pw__mb_param(pw__mbuild *bd, const char *name, int d0, int d1, pw_init_kind init, float std);
/* The id of the parameter called name, or -1. */
int pw__mb_param_find(const pw_model *m, const char *name);
/* A node reading in0 (and in1) with parameters w, b (-1: none); its
 * output value (rows x width of dt; a loss op's is the scalar loss). The
 * node is the model's last (m->nodes[m->n_nodes - 1]) until the next. */
int pw__mb_node(pw__mbuild *bd, pw_op op, int in0, int in1, int w, int b, int rows, int width, pw_dtype dt);
void pw__mb_begin_layer(pw__mbuild *bd, const char *name, int spec_index, int is_block);
void pw__mb_end_layer(pw__mbuild *bd);
/* prefix.weight [oc, in] (normal, std) and prefix.bias [oc] (zeros) when
 * bias, then the LoRA adapter model.lora gives it; the output value. */
int pw__mb_linear(pw__mbuild *bd, const char *prefix, int x, int oc, int bias, float std);
/* prefix.weight (and .bias unless rms): a layernorm, or an RMSNorm. */
int pw__mb_norm(pw__mbuild *bd, const char *prefix, int x, int rms);
int pw__mb_unary(pw__mbuild *bd, pw_op op, int x);
int pw__mb_binary(pw__mbuild *bd, pw_op op, int a, int b);
/* x plus learned positions `name` [rows of x, width of x]. */
int pw__mb_pos_embed(pw__mbuild *bd, const char *name, int x, float std);

/* template bert (model_bert.c) */
void pw__build_bert(pw__mbuild *bd);

#endif
