/* spec: the job spec — JSON in, a validated C struct out.
 *
 * A job spec is {name, mode, model, mesh, schedule, partition, train, data}
 * (docs/contracts.md, "The job spec"). Parsing is strict and
 * complete: unknown fields, wrong types, out-of-range values and broken
 * cross-field rules are all errors, and every error names the JSON path and
 * the rule, e.g. "model.n_heads: must divide d_model (768 % 5 != 0)".
 * Nothing here builds the model graph (model.c does, from pw_model_spec) or
 * checks schedule constraints that depend on the plan (schedule.c does).
 * This header is plain C structs; the JSON side is spec_json.h, so the
 * compute layers that read a pw_job never see jansson. */
#ifndef PW_SPEC_H
#define PW_SPEC_H

#include "errors.h"

typedef enum {
  PW_TEMPLATE_GPT,
  PW_TEMPLATE_LLAMA,
  PW_TEMPLATE_MLP,
  PW_TEMPLATE_BERT, /* an encoder (model_bert.c); by name in specs, never by number */
  PW_TEMPLATE_LAYERS,
  PW_TEMPLATE_REGIONS
} pw_template;

/* Layer types of an explicit "layers" list. Composite blocks expand to the
 * same ops as the templates' blocks. */
typedef enum {
  PW_LAYER_EMBEDDING,      /* {"type":"embedding","vocab_size":V,"out":C}          tokens -> (T,C) */
  PW_LAYER_POS_EMBEDDING,  /* {"type":"pos_embedding"}  learned positions, size from seq_len  */
  PW_LAYER_LINEAR,         /* {"type":"linear","in":C?,"out":OC,"bias":true}                    */
  PW_LAYER_LAYERNORM,      /* {"type":"layernorm"}                                               */
  PW_LAYER_RMSNORM,        /* {"type":"rmsnorm"}                                                 */
  PW_LAYER_GELU,
  PW_LAYER_RELU,
  PW_LAYER_SILU,
  PW_LAYER_GPT_BLOCK,      /* {"type":"gpt_block","n_heads":H,"hidden":4C?}  pre-LN block      */
  PW_LAYER_LLAMA_BLOCK,    /* {"type":"llama_block","n_heads":H,"hidden":F?}                    */
  PW_LAYER_CROSS_ENTROPY,  /* {"type":"cross_entropy"}  last layer: logits -> loss             */
  PW_LAYER_MSE,            /* {"type":"mse"}            last layer: prediction -> loss         */
  PW_LAYER_STAGE_BOUNDARY  /* {"stage_boundary": {"stage": k?}}  a pipeline cut, kept for the partitioner */
} pw_layer_type;

typedef struct {
  pw_layer_type type;
  int in;        /* input width; 0 = infer from the previous layer */
  int out;       /* output width (linear, embedding) */
  int bias;      /* linear: has bias (default 1) */
  int vocab_size;/* embedding */
  int n_heads;   /* blocks */
  int hidden;    /* blocks: MLP hidden width; 0 = default (gpt 4C, llama ffn_default(C)) */
  int stage;     /* stage_boundary: the stage the layers after it begin (a hint
                    checked against the partition); 0 = none */
} pw_layer_spec;

#define PW_LORA_TARGETS_MAX 16
#define PW_LORA_TARGET_LEN 80

typedef enum { PW_INPUT_TOKENS, PW_INPUT_FEATURES } pw_input_kind;
typedef enum { PW_LOSS_CROSS_ENTROPY, PW_LOSS_MSE } pw_loss_kind;
typedef enum { PW_ACT_RELU, PW_ACT_GELU, PW_ACT_SILU } pw_act_kind;
/* llama's MLP gate activation (model.mlp_act): SwiGLU, or Gemma's GeGLU
 * with the tanh GELU */
typedef enum { PW_MLP_ACT_SILU, PW_MLP_ACT_GELU_TANH } pw_mlp_act_kind;
/* bert's head (model.bert_head): the masked-LM head over every position,
 * or a sequence classifier on the first position ([CLS]) */
typedef enum { PW_BERT_HEAD_MLM, PW_BERT_HEAD_CLASSIFY } pw_bert_head_kind;
/* model.moe.gate: ops_moe.h's pw_moe_gate, in the same order */
typedef enum { PW_MOE_GATE_SOFTMAX_TOPK, PW_MOE_GATE_SOFTMAX, PW_MOE_GATE_SIGMOID } pw_moe_gate_kind;

/* model.regions (spec_regions.c): named sub-models, each a layers list
 * with its own mesh and schedule, joined by model.graph. A source region
 * reads a data input (tokens, or float features per position); any other
 * is fed by the regions its graph entry lists, joined by a fusion layer. */
#define PW_REGIONS_MAX 8
#define PW_REGION_NAME_CAP 24
typedef enum { PW_FUSION_CONCAT, PW_FUSION_ADD } pw_fusion_kind;
typedef struct {
  char name[PW_REGION_NAME_CAP]; /* [a-z0-9_], unique */
  int has_input;                 /* a source region: reads input/input_dim */
  int input;                     /* pw_input_kind */
  int input_dim;                 /* features width (per position) */
  pw_layer_spec *layers;         /* stage_boundary entries included */
  int n_layer_specs;
  int pp, dp, virtual_stages;    /* its mesh: ranks of its own; dp = the job's */
  char schedule[32];             /* canonical name; default the job's schedule.name */
  int n_from;                    /* graph: the regions feeding it, in fusion order */
  int from[PW_REGIONS_MAX];
  int fusion;                    /* pw_fusion_kind */
} pw_region_spec;

typedef struct {
  pw_template tmpl;
  /* gpt, llama */
  int vocab_size;      /* default 256 */
  int seq_len;         /* T; 1 for mlp */
  int d_model;
  int n_layers;        /* blocks (gpt, llama) or hidden layers (mlp) */
  int n_heads;
  int ffn_hidden;      /* 0 = default: gpt 4*d_model; llama round_up(8*d_model/3, 32) */
  int tie_embeddings;  /* gpt, llama: lm_head shares embed.tok.weight */
  float rope_base;     /* llama, default 10000 (Hugging Face's rope_theta) */
  /* llama's attention options (docs/contracts.md#models); each absent
   * from the canonical JSON while off, so older jobs keep their hash */
  int n_kv_heads;      /* key/value heads; 0 = n_heads (no grouped-query) */
  int rope_scaling;    /* 0 none, 1 "llama3": the four below */
  float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_orig_max_pos; /* original_max_position_embeddings */
  int qkv_bias;        /* a bias on the qkv projection (Qwen2) */
  int qk_norm;         /* RMSNorm over each q and k head before rope (Qwen3) */
  /* Gemma's options (docs/contracts.md#models), each absent from the
   * canonical JSON while off, as above */
  int mlp_act;         /* pw_mlp_act_kind: the gate's activation, default silu */
  int embed_scale;     /* the embedding's output times sqrt(d_model), rounded to float */
  int norm_offset;     /* 0, or 1: every RMSNorm scales by 1 + w (weights initialised 0) */
  int head_dim;        /* 0 = d_model / n_heads; else each head's width (Qwen3, Gemma-7B): qkv
                          has (n_heads + 2 n_kv_heads) head_dim rows, attn.proj n_heads head_dim
                          columns */
  int sliding_window;  /* 0 none; else a query at p sees keys (p - w, p] only (Mistral) */
  /* model.moe (docs/contracts.md#mixture-of-experts): the MLP of some
   * blocks is E experts, K chosen per token; absent (moe_experts 0): dense */
  int moe_experts, moe_top_k;
  int moe_hidden;       /* each expert's width; default ffn_hidden */
  int moe_gate;         /* pw_moe_gate_kind */
  float moe_routed_scale; /* sigmoid gates: the weights' factor (DeepSeek's routed_scaling_factor) */
  int moe_shared;       /* shared experts: one more dense MLP of moe_shared x moe_hidden, every token */
  int moe_shared_hidden; /* that MLP's width when not moe_shared x moe_hidden (Qwen2-MoE's); 0: that */
  int moe_shared_gate;  /* the shared MLP's output times sigmoid(a linear d -> 1 of the input) (Qwen2-MoE) */
  int moe_every, moe_first_dense; /* blocks i >= first_dense with (i - first_dense) % every == 0 */
  float norm_eps;      /* default 1e-5; bert 1e-12 */
  float init_std;      /* default 0.02 */
  /* bert (docs/contracts.md#models) */
  int type_vocab_size; /* token types (segment ids), default 2 */
  int bert_head;       /* pw_bert_head_kind */
  int n_labels;        /* classify: classes (>= 2) */
  int mlm_predictions; /* mlm: masked positions per sequence, K (the loss divides by B K) */
  int pad_token;       /* -1 none; else attention masks keys holding it */
  int sep_token;       /* -1 none; else token types: 0 through the first one, 1 after */
  /* mlp */
  int in_dim, hidden_dim, out_dim;
  pw_act_kind activation; /* mlp, default relu */
  pw_loss_kind loss;      /* mlp: mse (default) or cross_entropy; others cross_entropy */
  /* layers */
  pw_input_kind input;    /* layers: "input": {"kind": "tokens"|"features", "dim": D} */
  int input_dim;          /* features width for layers with features input */
  pw_layer_spec *layers;  /* template == LAYERS; stage_boundary entries included */
  int n_layer_specs;
  /* "lora": {"rank", "alpha", "targets"}: low-rank adapters on the linear
   * layers whose names (a parameter name without ".weight": "blocks.0.attn.qkv")
   * match a target glob; rank 0 = none */
  int lora_rank;          /* default 8 (PEFT's r) */
  float lora_alpha;       /* default 8 (PEFT's lora_alpha); scale = alpha / rank */
  int n_lora_targets;
  char lora_targets[PW_LORA_TARGETS_MAX][PW_LORA_TARGET_LEN];
  /* regions: in topological order (every region after those feeding it),
   * the last the sink that ends with the loss */
  pw_region_spec *regions;
  int n_regions;
} pw_model_spec;

/* mesh.placement: which rank runs each stage. NONE keeps the schedule's
 * own layout; a name or an array must be that layout up to a relabeling of
 * ranks (common/plan/placement.h). */
typedef enum { PW_PLACEMENT_NONE, PW_PLACEMENT_ARRAY, PW_PLACEMENT_LOOP, PW_PLACEMENT_V, PW_PLACEMENT_CONTIGUOUS } pw_placement_kind;
/* The names of the named kinds, "loop", "v", "contiguous" (index kind - PW_PLACEMENT_LOOP). */
extern const char *const pw_placement_names[];
extern const int pw_n_placement_names;

typedef struct {
  int pp, dp, virtual_stages; /* defaults 1, 1, 1 */
  int tp;                     /* tensor-parallel ranks per stage (common/model/tp.h); default 1 */
  int placement_kind;         /* pw_placement_kind; default none */
  int *placement;             /* ARRAY: stage s on rank placement[s], each in 0 .. pp-1 */
  int n_placement;
} pw_mesh_spec;

/* A custom schedule ("schedule": {"custom": {"ranks": [...]}}) is one
 * action list per pipeline rank in schedule.h's text form, stored as given;
 * name is then "custom". The spec only checks the shape (mesh.pp strings);
 * the planner proves the lists (pw_sched_from_ranks, common/plan). */
typedef struct {
  char name[32];       /* one of the nine schedule names, or "custom"; default "1f1b" */
  int microbatches;    /* default 1 */
  char **custom_ranks; /* [n_custom_ranks] malloc'ed; NULL when not custom */
  int n_custom_ranks;  /* mesh.pp when custom, else 0 */
  int regions_serial;  /* "regions": "serial" — a regions model's regions one after another on
                          the same ranks (to compare with the default, "concurrent") */
} pw_schedule_spec;

typedef enum { PW_PARTITION_EVEN, PW_PARTITION_MARKERS, PW_PARTITION_BALANCED, PW_PARTITION_EXPLICIT } pw_partition_mode;

#define PW_LAYER_NAME_CAP 64 /* a layer name in partition.stages, NUL included */

/* A stage_boundary entry that says which stage it begins: the marker-th
 * boundary of the layers list (model.markers[marker]), at
 * model.layers[spec_index]. */
typedef struct {
  int marker, spec_index, stage;
} pw_stage_hint;

typedef struct {
  pw_partition_mode mode;  /* default even (markers when the layers list has boundaries,
                              explicit when "stages" is given) */
  double *layer_times;     /* optional measured per-layer costs for balanced; NULL if absent */
  int n_layer_times;
  double byte_cost;        /* balanced: cost per activation byte sent across a cut; default 0 */
  /* explicit: stage s lists names[first[s] .. first[s+1]), layer names as
   * the model graph gives them ("embed", "blocks.3", "layers.5"); resolved
   * when the plan is built (partition.c), since the spec cannot build the
   * model */
  int n_stages;
  int *first;                       /* [n_stages + 1] */
  char (*names)[PW_LAYER_NAME_CAP]; /* [first[n_stages]] */
  /* the model's stage_boundary hints, copied here so the partitioner can
   * check them whatever the mode */
  pw_stage_hint *hints;
  int n_hints;
  /* recomputation (partition.remat): "none" (default), "full" (remat_all),
   * or one entry per stage (remat[n_remat], n_remat = pp x virtual_stages):
   * a remat stage keeps only its ports per microbatch and re-runs its
   * forward before its backward (common/compute/prog.h) */
  int remat_all;
  unsigned char *remat;
  int n_remat;
} pw_partition_spec;

/* Stage s of the job recomputes its activations (partition.remat). */
int pw_partition_remat(const pw_partition_spec *p, int s);

#define PW_TRAINABLE_MAX 32 /* train.trainable patterns */
#define PW_TRAINABLE_LEN 96 /* bytes of one, NUL included (PW_PARAM_NAME_MAX) */

typedef enum { PW_OPT_ADAMW, PW_OPT_SGD } pw_opt_kind;
/* What a step whose loss or gradient norm is not finite (NaN, inf) does:
 * fail the job ("diverged at step N") or skip that step's update. */
typedef enum { PW_NONFINITE_FAIL, PW_NONFINITE_SKIP } pw_nonfinite;
/* The linear layers' matrix multiplies: float32, or bf16 operands with
 * float32 accumulation (docs/contracts.md says what is rounded where). */
typedef enum { PW_PRECISION_FP32, PW_PRECISION_BF16 } pw_precision;
/* Which attention kernel (docs/contracts.md#attention): "auto" picks by the
 * sequence length (pw_attention_op, model.h), "tiled" and "plain" force one. */
typedef enum { PW_ATTN_AUTO, PW_ATTN_TILED, PW_ATTN_PLAIN } pw_attn_impl;
typedef struct {
  pw_opt_kind kind;      /* default adamw */
  double lr;             /* default 3e-4 */
  double min_lr;         /* default lr/10 */
  int warmup_steps;      /* default 0 */
  double beta1, beta2;   /* default 0.9, 0.999 ("betas": [b1, b2]) */
  double eps;            /* default 1e-8 */
  double weight_decay;   /* default 0.01 (adamw), 0 (sgd) */
  double momentum;       /* sgd, default 0 */
} pw_optim_spec;

typedef struct {
  int steps;             /* default 100; 0 allowed (write initial params) */
  int batch_size;        /* sequences per step; default 8; divisible by microbatches*dp */
  unsigned long long seed; /* default 1 */
  double grad_clip;      /* 0 = off; default 1.0 */
  int checkpoint_every;  /* 0 = only at the end; default 0 */
  int eval_batches;      /* batches for `pipewright eval` and eval_every; default 8 */
  int eval_every;        /* cluster runs: eval loss after every K-th step and the last; 0 = off */
  int keep_checkpoints;  /* complete checkpoint steps the coordinator keeps; >= 1, default 3 */
  int on_nonfinite;      /* pw_nonfinite: "fail" (default) | "skip" */
  int max_restarts;      /* runs that lose a worker and go back to the queue; 0..1000, default 3 */
  int snapshot_every;    /* in-memory stage snapshots on a peer every K steps; 0 = off, default 1 */
  int zero;              /* ZeRO stage 0 | 1 | 2: optimizer state (1, 2) sharded over mesh.dp
                            replicas; a no-op at dp 1; needs snapshot_every 0 */
  int precision;         /* pw_precision: "fp32" (default) | "bf16" */
  int attention;         /* pw_attn_impl: "auto" (default) | "tiled" | "plain" */
  /* "trainable": glob patterns (fnmatch) over parameter names; a parameter
   * matching none is frozen (no gradient, no optimizer state). 0 patterns =
   * all train (the default, ["*"]). Checked against the model's names by
   * pw_model_set_trainable. */
  int n_trainable;
  char trainable[PW_TRAINABLE_MAX][PW_TRAINABLE_LEN];
  pw_optim_spec optim;
} pw_train_spec;

/* The numbers travel in plan slices: append, never reorder. */
typedef enum { PW_DATA_TEXT, PW_DATA_COPY, PW_DATA_REVERSE, PW_DATA_REGRESSION, PW_DATA_CLASSIFY, PW_DATA_TOKENS,
               PW_DATA_SHIFT, PW_DATA_LABELED } pw_data_kind;
typedef enum { PW_SAMPLER_SEQUENTIAL, PW_SAMPLER_RANDOM } pw_sampler_kind;
typedef struct {
  pw_data_kind kind;
  /* text and tokens take a file: path, or a stored dataset (its sha256,
   * lowercase hex). With both set (a worker's cache), path is read and
   * must hash to dataset. */
  char path[512];        /* resolved against the job file's folder if relative and not found */
  char dataset[65];
  /* tokens: the tokenizer.json the ids come from, so that generate and the
   * serving API take and return text — a path (a local run; pipewright
   * submit uploads it) or, on the coordinator, a stored dataset's id */
  char tokenizer[512];
  pw_sampler_kind sampler; /* text: default random */
  double eval_fraction;  /* text: trailing fraction held out for eval; default 0.1 */
  int keys;              /* shift: distinct keys the features carry; default 4 */
  /* text, tokens for a masked-LM model: the id that replaces a chosen
   * position (BERT's [MASK]); -1 when none. Read only when the model
   * predicts masked positions (pw_data_shape.mlm_predictions > 0). */
  int mask_token;
} pw_data_spec;

typedef enum { PW_MODE_TRAIN, PW_MODE_FORWARD, PW_MODE_SERVE } pw_mode;

/* mode "serve" (docs/serving.md): the workers keep the init weights loaded
 * and generate text for POST /v1/jobs/{id}/generate. Each stage's KV cache
 * is one slab of max_sequences slots of max_len positions, made at start;
 * a request beyond them waits in a queue of max_queue, then is refused. */
typedef struct {
  int max_sequences; /* sequences in flight per replica; default 8 */
  int max_len;       /* positions per sequence (prompt + new tokens - 1); default model seq_len */
  int max_queue;     /* requests waiting for a slot, per job; default 64 */
} pw_serve_spec;

/* Where the parameters start from instead of the seed ("init"): a stored
 * weights object (its sha256), or a job's retained checkpoint step, which
 * the coordinator gathers into a stored weights object at submit and then
 * names by checkpoint (keeping job and step as the record of where it came
 * from). optimizer (only with job + step) carries that step's optimizer
 * state too, stored as optimizer_checkpoint; else the optimizer starts
 * fresh. Training starts at step 0 either way (fine-tuning). All zero /
 * empty: no init. */
typedef struct {
  char checkpoint[65];           /* weights sha256, "" when none yet */
  long long job;                 /* 0: none */
  int step;                      /* with job */
  int optimizer;                 /* with job + step: carry the optimizer state */
  char optimizer_checkpoint[65]; /* set by the coordinator when optimizer */
} pw_init_spec;

typedef struct {
  char name[128];
  pw_mode mode;
  pw_model_spec model;
  pw_mesh_spec mesh;
  pw_schedule_spec schedule;
  pw_partition_spec partition;
  pw_train_spec train;
  pw_data_spec data;
  pw_init_spec init;
  pw_serve_spec serve; /* mode serve only */
} pw_job;

/* Releases what pw_job_parse (spec_json.h) allocated. */
void pw_job_free(pw_job *job);

/* Sequences per microbatch of one replica: train.batch_size /
 * (schedule.microbatches * mesh.dp), or PW_ESPEC naming train.batch_size
 * when that does not divide evenly. The one statement of the rule:
 * pw_job_parse applies it, and the planner, the trainer and the workers
 * take their microbatch size from it. */
PW_MUST_CHECK int pw_job_mb_size(const pw_job *job, pw_err *err);
/* 1 when s is a dataset id: 64 lowercase hex digits (a sha256). */
int pw_data_id_valid(const char *s);

/* What the model expects of the data. */
typedef struct {
  int vocab_size;  /* token models */
  int seq_len;     /* T (1 for feature models) */
  int in_dim;      /* feature models: input width */
  int out_dim;     /* feature models: regression width or number of classes; a token
                   * model with one label per sequence (BERT's classify head): its classes */
  int tokens;      /* 1: inputs are int32 tokens (B,T); 0: float features (B,in_dim) */
  int feature_dim; /* a regions model's second input: float features (B,T,feature_dim); 0 = none */
  /* masked-LM models (BERT): K masked positions per sequence, whose
   * targets are tokens, -100 elsewhere (data.h); 0 = not masked-LM */
  int mlm_predictions;
  /* the padding id (BERT's pad_token), -1 = none: masked-LM never chooses
   * a pad position, kind labeled fills short sequences with it. Read only
   * for those two (a zeroed shape's 0 means nothing elsewhere). */
  int pad_token;
} pw_data_shape;

/* The nine schedule names, in the order docs/schedules.md gives them
 * (spec_schedules.c; sized here, so the field table of spec.c can count them). */
extern const char *const pw_schedule_names[9];
extern const int pw_n_schedule_names;
/* The canonical name of a schedule written another way, or NULL: case,
 * '-' and '_' do not count ("GPipe", "ZB_H1", "KimiK2", "Interleaved1F1B"),
 * a PyTorch class's "Schedule" prefix is dropped ("ScheduleGPipe"), and
 * the names other systems use where unambiguous are known (pw_schedule_aliases).
 * docs/contracts.md lists them. */
const char *pw_schedule_resolve(const char *name);
/* The other systems' names of schedule `canon` (NULL-terminated, static;
 * empty for a name without any): what GET /v1/schedules lists. */
const char *const *pw_schedule_aliases(const char *canon);

#endif
