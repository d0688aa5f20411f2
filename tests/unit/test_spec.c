/* test_spec: the job-spec parser (spec.h) against a table of broken specs,
 * each with its expected error path and message; valid specs of every
 * template and a layers list with their defaults; the canonical round trip;
 * file loading; and the JSON Schema in api/ naming every field we emit.
 *
 * Specs are written with single quotes (turned into double quotes before
 * parsing) and most broken ones as a patch over a valid base: objects merge
 * key by key, null deletes a key, anything else replaces. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spec_json.h"

#ifndef PW_SOURCE_DIR
#define PW_SOURCE_DIR "."
#endif

/* ---- helpers --------------------------------------------------------- */

static json_t *jq(const char *s) {
  char *t = strdup(s);
  for (char *p = t; *p; p++)
    if (*p == '\'') *p = '"';
  json_error_t je;
  json_t *j = json_loads(t, 0, &je);
  if (!j) fail_msg("bad test JSON at line %d col %d: %s\n%s", je.line, je.column, je.text, t);
  free(t);
  return j;
}

static void merge(json_t *dst, json_t *patch) {
  const char *k;
  json_t *v;
  json_object_foreach(patch, k, v) {
    json_t *d = json_object_get(dst, k);
    if (json_is_null(v))
      json_object_del(dst, k);
    else if (json_is_object(v) && json_is_object(d))
      merge(d, v);
    else
      json_object_set(dst, k, v);
  }
}

enum { B_RAW, B_GPT, B_LLAMA, B_MLP, B_LAYERS, B_FEAT };

static const char *const bases[] = {
    [B_RAW] = "{}",
    [B_GPT] = "{'name':'t','model':{'template':'gpt','vocab_size':256,'seq_len':16,'d_model':32,"
              "'n_layers':2,'n_heads':4},'mesh':{'pp':2,'dp':1},"
              "'schedule':{'name':'1f1b','microbatches':4},"
              "'train':{'steps':10,'batch_size':8,'optimizer':{'name':'adamw','lr':0.001}},"
              "'data':{'kind':'copy'}}",
    [B_LLAMA] = "{'model':{'template':'llama','seq_len':16,'d_model':32,'n_layers':2,'n_heads':4,"
                "'rope_base':500000},'data':{'kind':'reverse'}}",
    [B_MLP] = "{'model':{'template':'mlp','in_dim':4,'hidden_dim':16,'out_dim':2,'n_layers':2},"
              "'data':{'kind':'regression'}}",
    [B_LAYERS] = "{'model':{'input':{'kind':'tokens'},'seq_len':16,'layers':["
                 "{'type':'embedding','vocab_size':256,'out':32},{'type':'pos_embedding'},"
                 "{'type':'gpt_block','n_heads':4},{'stage_boundary':{}},"
                 "{'type':'gpt_block','n_heads':4,'hidden':64},{'type':'layernorm'},"
                 "{'type':'linear','out':256,'bias':false},{'type':'cross_entropy'}]},"
                 "'mesh':{'pp':2},'schedule':{'microbatches':2},'train':{'batch_size':4},"
                 "'data':{'kind':'text','path':'no-such-dir/corpus.txt'}}",
    [B_FEAT] = "{'model':{'input':{'kind':'features','dim':8},'layers':["
               "{'type':'linear','out':16},{'type':'relu'},{'type':'linear','in':16,'out':1},"
               "{'type':'mse'}]},'data':{'kind':'regression'}}",
};

static json_t *spec_of(int base, const char *patch) {
  if (base == B_RAW) return jq(patch);
  json_t *b = jq(bases[base]);
  if (patch) {
    json_t *p = jq(patch);
    merge(b, p);
    json_decref(p);
  }
  return b;
}

/* ---- the table of broken specs --------------------------------------- */

typedef struct {
  int base;
  const char *patch;
  const char *path; /* expected err.path, exactly */
  const char *msg;  /* a substring of err.msg */
} bad_case;

#define LAYERS(...) "{'model':{'layers':[" __VA_ARGS__ "]}}"
#define EMB "{'type':'embedding','out':32}"
#define CE "{'type':'cross_entropy'}"
#define SB "{'stage_boundary':{}}"
#define LIN(n) "{'type':'linear','out':" #n "}"

static const bad_case bad[] = {
    /* unknown fields and wrong types */
    {B_GPT, "{'model':{'d_modle':5}}", "model.d_modle", "unknown field; did you mean d_model?"},
    {B_GPT, "{'model':{'n_head':5}}", "model.n_head", "unknown field; did you mean n_heads?"},
    {B_GPT, "{'train':{'setps':5}}", "train.setps", "unknown field; did you mean steps?"},
    {B_GPT, "{'init':{'chekpoint':'x'}}", "init", "did you mean checkpoint?"},
    {B_GPT, "{'bogus':1}", "bogus", "unknown field"},
    {B_GPT, "{'mesh':{'workers':'any'}}", "mesh.workers", "unknown field"},
    {B_GPT, "{'train':{'optimizer':{'beta1':0.9}}}", "train.optimizer.beta1", "unknown field"},
    {B_GPT, "{'train':{'steps':1.5}}", "train.steps", "must be an integer"},
    {B_GPT, "{'train':{'trainable':'blocks.*'}}", "train.trainable", "must be an array of 1 to 32 glob patterns"},
    {B_GPT, "{'train':{'trainable':[]}}", "train.trainable", "must be an array of 1 to 32 glob patterns"},
    {B_GPT, "{'train':{'trainable':['blocks.*',3]}}", "train.trainable[1]", "must be a non-empty string"},
    {B_GPT, "{'train':{'trainable':['']}}", "train.trainable[0]", "must be a non-empty string"},
    {B_GPT, "{'train':{'steps':3.0}}", "train.steps", "must be an integer"},
    {B_GPT, "{'train':{'steps':'10'}}", "train.steps", "must be an integer"},
    {B_GPT, "{'model':{'tie_embeddings':1}}", "model.tie_embeddings", "must be a boolean"},
    {B_GPT, "{'model':{'lora':4}}", "model.lora", "must be an object"},
    {B_GPT, "{'model':{'lora':{'rank':4}}}", "model.lora.targets", "required"},
    {B_GPT, "{'model':{'lora':{'rank':0,'targets':['lm_head']}}}", "model.lora.rank", ">= 1"},
    {B_GPT, "{'model':{'lora':{'alpha':0,'targets':['lm_head']}}}", "model.lora.alpha", "> 0"},
    {B_GPT, "{'model':{'lora':{'targets':[]}}}", "model.lora.targets", "must be an array of 1 to 16"},
    {B_GPT, "{'model':{'lora':{'targets':['lm_head',7]}}}", "model.lora.targets[1]", "must be a non-empty string"},
    {B_GPT, "{'model':{'lora':{'rnak':2,'targets':['lm_head']}}}", "model.lora.rnak", "did you mean rank?"},
    {B_GPT, "{'model':'gpt'}", "model", "must be an object"},
    {B_GPT, "{'mesh':3}", "mesh", "must be an object"},
    {B_GPT, "{'train':{'optimizer':'adamw'}}", "train.optimizer", "must be an object"},
    {B_GPT, "{'schedule':{'name':5}}", "schedule.name", "must be a string"},
    {B_GPT, "{'train':{'optimizer':{'lr':'fast'}}}", "train.optimizer.lr", "must be a number"},
    {B_RAW, "[1,2]", "", "must be a JSON object"},
    /* required */
    {B_GPT, "{'model':null}", "model", "required"},
    {B_GPT, "{'data':null}", "data", "required"},
    {B_GPT, "{'model':{'seq_len':null}}", "model.seq_len", "required"},
    {B_GPT, "{'model':{'n_heads':null}}", "model.n_heads", "required"},
    {B_GPT, "{'model':{'template':null}}", "model.template", "required"},
    {B_GPT, "{'data':{'kind':null}}", "data.kind", "required"},
    {B_GPT, "{'data':{'kind':'text'}}", "data", "needs data.path (a file) or data.dataset"},
    {B_GPT, "{'data':{'kind':'tokens','path':'x.tok','dataset':'ABC'}}", "data.dataset", "64 lowercase hex"},
    {B_GPT, "{'data':{'kind':'copy','dataset':'ab'}}", "data.dataset", "not used with kind copy"},
    {B_MLP, "{'data':{'kind':'tokens','path':'x.tok'}}", "data.kind", "needs kind regression"},
    /* ranges */
    {B_GPT, "{'train':{'steps':-1}}", "train.steps", "must be >= 0 (got -1)"},
    {B_GPT, "{'mode':'serve'}", "init", "mode serve needs init"},
    {B_GPT, "{'serve':{'max_len':8}}", "serve", "only with \"mode\": \"serve\""},
    {B_GPT, "{'mode':'serve','init':{'job':1,'step':2},'serve':{'max_len':17}}", "serve.max_len",
     "must be at most model.seq_len (17 > 16)"},
    {B_GPT, "{'mode':'serve','init':{'job':1,'step':2},'serve':{'max_sequences':0}}", "serve.max_sequences", ">= 1"},
    {B_GPT, "{'mode':'serve','init':{'job':1,'step':2},'serve':{'max_sequence':4}}", "serve.max_sequence",
     "did you mean max_sequences?"},
    {B_GPT, "{'mode':'serve','init':{'job':1,'step':2},'serve':[]}", "serve", "must be an object"},
    {B_MLP, "{'mode':'serve','init':{'job':1,'step':2}}", "mode", "serve needs a token model"},
    {B_GPT, "{'train':{'steps':4294967296}}", "train.steps", "must be <= 2147483647"},
    {B_GPT, "{'model':{'d_model':0}}", "model.d_model", "must be >= 1 (got 0)"},
    {B_GPT, "{'model':{'seq_len':0}}", "model.seq_len", "must be >= 1 (got 0)"},
    {B_GPT, "{'model':{'seq_len':65537}}", "model.seq_len", "must be <= 65536 (got 65537)"},
    {B_GPT, "{'model':{'vocab_size':1}}", "model.vocab_size", "must be >= 2 (got 1)"},
    {B_GPT, "{'model':{'vocab_size':1048577}}", "model.vocab_size", "must be <= 1048576"},
    {B_GPT, "{'model':{'n_layers':0}}", "model.n_layers", "must be >= 1 (got 0)"},
    {B_GPT, "{'model':{'init_std':0}}", "model.init_std", "must be > 0 (got 0)"},
    {B_GPT, "{'model':{'norm_eps':2}}", "model.norm_eps", "must be <= 1 (got 2)"},
    {B_GPT, "{'model':{'ffn_hidden':0}}", "model.ffn_hidden", "must be >= 1"},
    {B_GPT, "{'train':{'batch_size':0}}", "train.batch_size", "must be >= 1 (got 0)"},
    {B_GPT, "{'train':{'eval_every':-1}}", "train.eval_every", "must be >= 0 (got -1)"},
    {B_GPT, "{'train':{'eval_every':2.5}}", "train.eval_every", "must be an integer"},
    {B_GPT, "{'train':{'eval_evry':5}}", "train.eval_evry", "unknown field; did you mean eval_every?"},
    {B_GPT, "{'train':{'seed':-1}}", "train.seed", "must be >= 0"},
    {B_GPT, "{'train':{'grad_clip':-1}}", "train.grad_clip", "must be >= 0 (got -1)"},
    {B_GPT, "{'train':{'eval_batches':0}}", "train.eval_batches", "must be >= 1"},
    {B_GPT, "{'train':{'checkpoint_every':-1}}", "train.checkpoint_every", "must be >= 0"},
    {B_GPT, "{'train':{'keep_checkpoints':0}}", "train.keep_checkpoints", "must be >= 1 (got 0)"},
    {B_GPT, "{'train':{'zero':4}}", "train.zero", "must be <= 3 (got 4)"},
    {B_GPT, "{'mesh':{'tp':0}}", "mesh.tp", "must be >= 1 (got 0)"},
    {B_GPT, "{'mesh':{'tp':'2'}}", "mesh.tp", "must be an integer"},
    {B_GPT, "{'train':{'zero':'1'}}", "train.zero", "must be an integer"},
    {B_GPT, "{'mesh':{'dp':2},'train':{'zero':1,'snapshot_every':1}}", "train.zero",
     "cannot be snapshotted for recovery: set "
                                                                   "train.snapshot_every to 0"},
    {B_GPT, "{'train':{'optimizer':{'lr':0}}}", "train.optimizer.lr", "must be > 0 (got 0)"},
    {B_GPT, "{'train':{'optimizer':{'min_lr':-1}}}", "train.optimizer.min_lr", "must be >= 0"},
    {B_GPT, "{'train':{'optimizer':{'warmup_steps':-5}}}", "train.optimizer.warmup_steps", ">= 0"},
    {B_GPT, "{'train':{'optimizer':{'eps':0}}}", "train.optimizer.eps", "must be > 0"},
    {B_GPT, "{'train':{'optimizer':{'weight_decay':-0.1}}}", "train.optimizer.weight_decay", ">= 0"},
    {B_GPT, "{'train':{'optimizer':{'betas':[0.9,1.0]}}}", "train.optimizer.betas[1]",
     "must be < 1 (got 1)"},
    {B_GPT, "{'train':{'optimizer':{'betas':[-0.1,0.9]}}}", "train.optimizer.betas[0]",
     "must be >= 0 (got -0.1)"},
    {B_GPT, "{'train':{'optimizer':{'betas':['a',0.9]}}}", "train.optimizer.betas[0]",
     "must be a number"},
    {B_GPT, "{'train':{'optimizer':{'betas':[0.9]}}}", "train.optimizer.betas", "array of 2 numbers"},
    {B_GPT, "{'train':{'optimizer':{'name':'sgd','momentum':1}}}", "train.optimizer.momentum",
     "must be < 1"},
    {B_GPT, "{'mesh':{'pp':0}}", "mesh.pp", "must be >= 1 (got 0)"},
    {B_GPT, "{'mesh':{'dp':0}}", "mesh.dp", "must be >= 1 (got 0)"},
    {B_GPT, "{'mesh':{'virtual_stages':0}}", "mesh.virtual_stages", "must be >= 1"},
    {B_GPT, "{'schedule':{'microbatches':0}}", "schedule.microbatches", "must be >= 1"},
    {B_GPT, "{'data':{'kind':'text','path':'x','eval_fraction':1}}", "data.eval_fraction",
     "must be < 1 (got 1)"},
    {B_GPT, "{'data':{'kind':'text','path':'x','eval_fraction':0}}", "data.eval_fraction",
     "must be > 0 (got 0)"},
    {B_GPT, "{'data':{'kind':'text','path':''}}", "data.path", "must not be empty"},
    {B_GPT, "{'partition':{'mode':'balanced','layer_times':[1,0]}}", "partition.layer_times[1]",
     "must be > 0 (got 0)"},
    {B_GPT, "{'partition':{'mode':'balanced','layer_times':[]}}", "partition.layer_times",
     "must not be empty"},
    {B_GPT, "{'partition':{'mode':'balanced','byte_cost':-1}}", "partition.byte_cost", ">= 0"},
    /* enums */
    {B_GPT, "{'model':{'template':'bart'}}", "model.template",
     "must be one of gpt, llama, mlp, bert (got \"bart\")"},
    {B_GPT, "{'model':{'template':'bert','tie_embeddings':true}}", "model.tie_embeddings",
     "not used with template bert"},
    {B_GPT, "{'schedule':{'name':'pipedream'}}", "schedule.name",
     "must be one of gpipe, 1f1b, eager1f1b, zb-h1, interleaved-1f1b, interleaved-gpipe, "
     "interleaved-1f1b-plus-one, kimi-k2, dualpipev (got \"pipedream\")"},
    {B_GPT, "{'schedule':{'name':'gpip'}}", "schedule.name", "(got \"gpip\"); did you mean gpipe?"},
    {B_GPT, "{'schedule':{'name':'Interleaved'}}", "schedule.name", "(got \"Interleaved\")"},
    /* custom schedules: the shape only (the planner proves the lists) */
    {B_GPT, "{'schedule':{'name':'gpipe','custom':{'ranks':['F0@s0','F0@s1']}}}", "schedule.name",
     "must be \"custom\" or absent with schedule.custom (got \"gpipe\")"},
    {B_GPT, "{'schedule':{'name':'custom'}}", "schedule.custom", "required when schedule.name is \"custom\""},
    {B_GPT, "{'schedule':{'name':null,'custom':{'ranks':['F0@s0']}}}", "schedule.custom.ranks",
     "needs one action list per pipeline rank: mesh.pp = 2 (got 1)"},
    {B_GPT, "{'schedule':{'name':'custom','custom':{'ranks':['F0@s0',3]}}}", "schedule.custom.ranks", "entry 1 must be a string"},
    {B_GPT, "{'schedule':{'name':null,'custom':{'ranks':'F0@s0'}}}", "schedule.custom.ranks", "must be an array"},
    {B_GPT, "{'schedule':{'name':null,'custom':{'rank':[]}}}", "schedule.custom", "unknown field \"rank\""},
    {B_GPT, "{'schedule':{'name':'custom','custom':[]}}", "schedule.custom", "must be an object"},
    {B_GPT, "{'train':{'optimizer':{'name':'adam'}}}", "train.optimizer.name", "did you mean adamw?"},
    {B_GPT, "{'mode':'decode'}", "mode", "must be one of train, forward"},
    {B_GPT, "{'train':{'optimizer':{'name':'adam'}}}", "train.optimizer.name",
     "must be one of adamw, sgd"},
    {B_GPT, "{'data':{'kind':'text','path':'x','sampler':'shuffle'}}", "data.sampler",
     "must be one of sequential, random"},
    {B_GPT, "{'partition':{'mode':'auto'}}", "partition.mode", "must be one of even, markers, balanced"},
    {B_GPT, "{'train':{'precision':'fp16'}}", "train.precision", "must be one of fp32, bf16 (got \"fp16\")"},
    {B_GPT, "{'train':{'precision':16}}", "train.precision", "must be"},
    {B_GPT, "{'train':{'attention':'flash'}}", "train.attention", "must be one of auto, tiled, plain (got \"flash\")"},
    /* name */
    {B_GPT, "{'name':''}", "name", "must not be empty"},
    {B_GPT, "{'name':'a\\nb'}", "name", "control characters (0x0a at byte 1)"},
    {B_GPT, "{'name':'a\\u007fb'}", "name", "control characters"},
    {B_GPT, "{'name':5}", "name", "must be a string"},
    /* fields of another variant */
    {B_GPT, "{'model':{'rope_base':500}}", "model.rope_base", "not used with template gpt"},
    {B_GPT, "{'model':{'template':'mlp'}}", "model.vocab_size", "not used with template mlp"},
    {B_GPT, "{'train':{'optimizer':{'momentum':0.9}}}", "train.optimizer.momentum",
     "not used with optimizer adamw"},
    {B_GPT, "{'train':{'optimizer':{'name':'sgd','betas':[0.9,0.9]}}}", "train.optimizer.betas",
     "not used with optimizer sgd"},
    {B_GPT, "{'data':{'path':'x'}}", "data.path", "not used with kind copy"},
    {B_GPT, "{'partition':{'mode':'even','layer_times':[1,2]}}", "partition.layer_times",
     "not used with mode even"},
    /* cross-field rules */
    {B_GPT, "{'model':{'n_heads':5}}", "model.n_heads", "must divide d_model (32 % 5 != 0)"},
    {B_GPT, "{'train':{'batch_size':10}}", "train.batch_size",
     "must be divisible by schedule.microbatches * mesh.dp (10 % 4 != 0)"},
    {B_GPT, "{'mesh':{'dp':2},'train':{'batch_size':12}}", "train.batch_size", "(12 % 8 != 0)"},
    {B_GPT, "{'train':{'optimizer':{'min_lr':0.01}}}", "train.optimizer.min_lr",
     "must be <= lr (0.01 > 0.001)"},
    {B_GPT, "{'data':{'kind':'regression'}}", "data.kind",
     "a token model needs kind text, tokens, copy, reverse or shift (got regression)"},
    {B_GPT, "{'model':{'vocab_size':100},'data':{'kind':'text','path':'x.txt'}}", "model.vocab_size",
     "byte-level text needs vocab_size >= 256 (got 100)"},
    {B_GPT, "{'partition':{'mode':'markers'}}", "partition.mode", "markers needs stage_boundary"},
    {B_LLAMA, "{'model':{'d_model':40,'n_heads':8}}", "model.n_heads",
     "head_dim must be even for rotary embeddings (d_model/n_heads = 5)"},
    {B_LLAMA, "{'model':{'rope_base':0}}", "model.rope_base", "must be > 0 (got 0)"},
    {B_LLAMA, "{'model':{'n_kv_heads':3}}", "model.n_kv_heads", "must divide n_heads (4 % 3 != 0)"},
    {B_LLAMA, "{'model':{'n_kv_heads':0}}", "model.n_kv_heads", "must be >= 1"},
    {B_GPT, "{'model':{'n_kv_heads':2}}", "model.n_kv_heads", "not used with template gpt"},
    {B_GPT, "{'model':{'qk_norm':true}}", "model.qk_norm", "not used with template gpt"},
    {B_LLAMA, "{'model':{'qkv_bias':1}}", "model.qkv_bias", "must be"},
    {B_LLAMA, "{'model':{'head_dim':7}}", "model.head_dim", "7: must be even for rotary embeddings"},
    {B_LLAMA, "{'model':{'d_model':30}}", "model.n_heads", "must divide d_model (30 % 4 != 0), or give model.head_dim"},
    {B_LLAMA, "{'model':{'sliding_window':-1}}", "model.sliding_window", "must be >= 0"},
    {B_GPT, "{'model':{'sliding_window':4}}", "model.sliding_window", "not used with template gpt"},
    {B_LLAMA, "{'model':{'mlp_act':'gelu'}}", "model.mlp_act", "must be one of silu, gelu_tanh"},
    {B_LLAMA, "{'model':{'norm_offset':2}}", "model.norm_offset", "must be <= 1"},
    {B_LLAMA, "{'model':{'norm_offset':1,'qk_norm':true}}", "model.norm_offset", "not with qk_norm"},
    {B_GPT, "{'model':{'embed_scale':true}}", "model.embed_scale", "not used with template gpt"},
    {B_LLAMA, "{'model':{'moe':{'experts':4,'top_k':5}}}", "model.moe.top_k", "5 is more than the 4 experts"},
    {B_LLAMA, "{'model':{'moe':{'top_k':2}}}", "model.moe.experts", "required"},
    {B_LLAMA, "{'model':{'moe':{'experts':1}}}", "model.moe.experts", "must be >= 2"},
    {B_LLAMA, "{'model':{'moe':{'experts':4,'routed_scale':2.5}}}", "model.moe.routed_scale", "only with gate"},
    {B_LLAMA, "{'model':{'moe':{'experts':4,'gate':'top1'}}}", "model.moe.gate",
     "must be one of softmax_topk, softmax, sigmoid"},
    {B_LLAMA, "{'model':{'moe':{'experts':4,'first_dense':2}}}", "model.moe.first_dense",
     "leaves none of the 2 blocks a mixture"},
    {B_LLAMA, "{'model':{'moe':{'experts':4,'capacity':1.5}}}", "model.moe.capacity", ""},
    {B_LLAMA, "{'model':{'moe':{'experts':4,'shared_gate':true}}}", "model.moe.shared_gate", "only with shared_experts"},
    {B_LLAMA, "{'model':{'moe':{'experts':4,'shared_ffn_hidden':8}}}", "model.moe.shared_ffn_hidden",
     "only with shared_experts"},
    {B_GPT, "{'model':{'mlp_act':'gelu_tanh'}}", "model.mlp_act", "not used with template gpt"},
    {B_LLAMA, "{'model':{'rope_scaling':{'rope_type':'yarn','factor':8}}}", "model.rope_scaling.rope_type",
     "must be one of llama3"},
    {B_LLAMA, "{'model':{'rope_scaling':{'rope_type':'llama3','factor':8}}}", "model.rope_scaling.low_freq_factor",
     "required"},
    {B_LLAMA, "{'model':{'rope_scaling':{'rope_type':'llama3','factor':8,'low_freq_factor':4,'high_freq_factor':1,"
     "'original_max_position_embeddings':8192}}}", "model.rope_scaling.high_freq_factor", "must be > low_freq_factor"},
    {B_LLAMA, "{'model':{'rope_scaling':{'rope_type':'llama3','factor':0,'low_freq_factor':1,'high_freq_factor':4,"
     "'original_max_position_embeddings':8192}}}", "model.rope_scaling.factor", "must be > 0"},
    {B_LLAMA, "{'model':{'rope_scaling':{'rope_type':'llama3','factor':8,'low_freq_factor':1,'high_freq_factor':4,"
     "'original_max_position_embeddings':8192,'type':'x'}}}", "model.rope_scaling.type", "unknown field"},
    {B_LLAMA, "{'model':{'rope_scaling':5}}", "model.rope_scaling", "must be an object"},
    {B_MLP, "{'data':{'kind':'classify'}}", "data.kind",
     "mlp with loss mse needs kind regression (got classify)"},
    {B_MLP, "{'model':{'loss':'cross_entropy'}}", "data.kind",
     "mlp with loss cross_entropy needs kind classify (got regression)"},
    {B_MLP, "{'data':{'kind':'text','path':'x'}}", "data.kind", "needs kind regression or classify (got text)"},
    {B_MLP, "{'model':{'activation':'tanh'}}", "model.activation", "must be one of relu, gelu, silu"},
    {B_MLP, "{'model':{'loss':'hinge'}}", "model.loss", "must be one of cross_entropy, mse"},
    {B_MLP, "{'model':{'hidden_dim':null}}", "model.hidden_dim", "required when n_layers > 0"},
    {B_MLP, "{'model':{'n_layers':-1}}", "model.n_layers", "must be >= 0 (got -1)"},
    {B_MLP, "{'model':{'seq_len':4}}", "model.seq_len", "not used with template mlp"},
    {B_MLP, "{'model':{'init_std':0.1}}", "model.init_std", "not used with template mlp"},
    {B_MLP, "{'model':{'in_dim':null}}", "model.in_dim", "required"},
    /* layers lists */
    {B_LAYERS, "{'model':{'template':'gpt'}}", "model.input", "not used with template gpt"},
    {B_LAYERS, "{'model':{'vocab_size':256}}", "model.vocab_size", "not used with a layers list"},
    {B_LAYERS, "{'model':{'seq_len':null}}", "model.seq_len", "required"},
    {B_LAYERS, "{'model':{'input':null}}", "model.input", "required"},
    {B_LAYERS, "{'model':{'input':{'kind':'pixels'}}}", "model.input.kind", "must be one of tokens, features"},
    {B_LAYERS, "{'model':{'input':{'dim':4}}}", "model.input.dim", "not used with kind tokens"},
    {B_LAYERS, "{'model':{'layers':[]}}", "model.layers", "must not be empty"},
    {B_LAYERS, "{'model':{'layers':'x'}}", "model.layers", "must be an array"},
    {B_LAYERS, LAYERS(EMB ",5," CE), "model.layers[1]", "must be an object"},
    {B_LAYERS, LAYERS(EMB "," LIN(256)), "model.layers[1]", "the last layer must be a loss"},
    {B_LAYERS, LAYERS(EMB "," CE "," LIN(256) "," CE), "model.layers[1].type", "may only be the last layer"},
    {B_LAYERS, LAYERS(EMB ",{'type':'linear','out':0}," CE), "model.layers[1].out", "must be >= 1 (got 0)"},
    {B_LAYERS, LAYERS(EMB ",{'type':'linear'}," CE), "model.layers[1].out", "required"},
    {B_LAYERS, LAYERS(EMB ",{'type':'linear','in':-1,'out':3}," CE), "model.layers[1].in", ">= 1"},
    {B_LAYERS, LAYERS(EMB ",{'type':'linear','out':8,'bias':'yes'}," CE), "model.layers[1].bias",
     "must be a boolean"},
    {B_LAYERS, LAYERS(EMB ",{'type':'relu','out':3}," CE), "model.layers[1].out", "not used with type relu"},
    {B_LAYERS, LAYERS("{'type':'embedding','out':32,'in':3}," CE), "model.layers[0].in",
     "not used with type embedding"},
    {B_LAYERS, LAYERS(EMB ",{'type':'conv'}," CE), "model.layers[1].type",
     "must be one of embedding, pos_embedding, linear"},
    {B_LAYERS, LAYERS(EMB ",{'out':3}," CE), "model.layers[1].type", "required"},
    {B_LAYERS, LAYERS(EMB ",{'type':'gpt_block'}," CE), "model.layers[1].n_heads", "required"},
    {B_LAYERS, LAYERS(EMB "," LIN(8) ",{'stage_boundary':{'x':1}}," LIN(8) "," CE),
     "model.layers[2].stage_boundary.x", "unknown field"},
    {B_LAYERS, LAYERS(EMB "," LIN(8) ",{'stage_boundary':[]}," LIN(8) "," CE),
     "model.layers[2].stage_boundary", "must be {} or {\"stage\": k}"},
    {B_LAYERS, LAYERS(EMB "," LIN(8) ",{'stage_boundary':{},'type':'relu'}," LIN(8) "," CE),
     "model.layers[2].type", "no other fields"},
    {B_LAYERS, LAYERS(SB "," EMB "," LIN(8) "," CE), "model.layers[0]", "empty stage"},
    {B_LAYERS, LAYERS(EMB "," SB "," SB "," LIN(8) "," CE), "model.layers[2]", "empty stage"},
    {B_LAYERS, LAYERS(EMB "," LIN(8) "," SB "," CE), "model.layers[2]", "cuts right before the loss"},
    {B_LAYERS, LAYERS(LIN(8) "," CE), "model.layers[0].type",
     "tokens input needs an embedding first (got linear)"},
    {B_LAYERS, LAYERS(EMB "," LIN(8) "," EMB "," CE), "model.layers[2].type",
     "embedding may only be the first layer"},
    {B_LAYERS, LAYERS(EMB "," LIN(8) ",{'type':'mse'}"), "model.layers[2].type",
     "a tokens model must end with cross_entropy (got mse)"},
    {B_LAYERS, LAYERS("{'type':'embedding','vocab_size':100,'out':8}," LIN(100) "," CE),
     "model.layers[0].vocab_size", "byte-level text needs vocab_size >= 256 (got 100)"},
    {B_LAYERS, "{'mesh':{'pp':4}}", "partition.mode",
     "the stage_boundary markers make 2 stages, but mesh.pp * mesh.virtual_stages = 4"},
    {B_FEAT, "{'data':{'kind':'copy'}}", "data.kind", "needs kind regression or classify (got copy)"},
    {B_FEAT, "{'model':{'input':{'dim':null}}}", "model.input.dim", "required"},
    {B_FEAT, "{'model':{'seq_len':4}}", "model.seq_len", "not used with features input"},
    {B_FEAT, LAYERS(EMB "," LIN(1) ",{'type':'mse'}"), "model.layers[0].type", "embedding needs tokens input"},
    {B_FEAT, LAYERS(LIN(8) ",{'type':'pos_embedding'},{'type':'mse'}"), "model.layers[1].type",
     "pos_embedding needs tokens input"},
    {B_FEAT, LAYERS(LIN(3) "," CE), "data.kind",
     "a layers list with loss cross_entropy needs kind classify (got regression)"},
};

static void test_bad_specs(void **st) {
  (void)st;
  int n = (int)(sizeof bad / sizeof bad[0]);
  assert_true(n >= 40);
  for (int i = 0; i < n; i++) {
    const bad_case *c = &bad[i];
    json_t *j = spec_of(c->base, c->patch);
    pw_job job;
    pw_err err = {0};
    int rc = pw_job_parse(j, NULL, &job, &err);
    if (rc != PW_ESPEC || strcmp(err.path, c->path) != 0 || !strstr(err.msg, c->msg))
      fail_msg("case %d (%s): want PW_ESPEC \"%s: ...%s...\", got %d \"%s: %s\"", i, c->patch, c->path,
               c->msg, rc, err.path, err.msg);
    /* a failed parse leaves nothing to free and a zeroed job */
    assert_null(job.model.layers);
    assert_null(job.partition.layer_times);
    pw_job_free(&job);
    json_decref(j);
  }
}

/* Each broken case breaks a valid base: the base alone must parse. */
static void test_bases_valid(void **st) {
  (void)st;
  for (int b = B_GPT; b <= B_FEAT; b++) {
    json_t *j = spec_of(b, NULL);
    pw_job job;
    pw_err err = {0};
    int rc = pw_job_parse(j, NULL, &job, &err);
    if (rc) fail_msg("base %d: %s: %s", b, err.path, err.msg);
    pw_job_free(&job);
    json_decref(j);
  }
}

static void test_err_str(void **st) {
  (void)st;
  json_t *j = spec_of(B_GPT, "{'model':{'d_model':768,'n_heads':5}}");
  pw_job job;
  pw_err err;
  assert_int_equal(pw_job_parse(j, NULL, &job, &err), PW_ESPEC);
  char buf[512];
  assert_string_equal(pw_err_str(&err, buf, sizeof buf), "model.n_heads: must divide d_model (768 % 5 != 0)");
  assert_int_equal(err.code, PW_ESPEC);
  json_decref(j);
}

/* ---- valid specs and their defaults ---------------------------------- */

static pw_job parse_ok(const char *text) {
  json_t *j = jq(text);
  pw_job job;
  pw_err err = {0};
  int rc = pw_job_parse(j, NULL, &job, &err);
  if (rc) fail_msg("%s: %s\n%s", err.path, err.msg, text);
  json_decref(j);
  return job;
}

static void test_gpt_defaults(void **st) {
  (void)st;
  pw_job job = parse_ok("{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},"
                        "'data':{'kind':'copy'}}");
  assert_string_equal(job.name, "job");
  assert_int_equal(job.mode, PW_MODE_TRAIN);
  const pw_model_spec *m = &job.model;
  assert_int_equal(m->tmpl, PW_TEMPLATE_GPT);
  assert_int_equal(m->vocab_size, 256);
  assert_int_equal(m->seq_len, 8);
  assert_int_equal(m->ffn_hidden, 64);
  assert_int_equal(m->tie_embeddings, 0);
  assert_true(m->norm_eps == 1e-5f && m->init_std == 0.02f && m->rope_base == 10000.0f);
  assert_int_equal(m->input, PW_INPUT_TOKENS);
  assert_int_equal(m->loss, PW_LOSS_CROSS_ENTROPY);
  assert_null(m->layers);
  assert_int_equal(job.mesh.pp, 1);
  assert_int_equal(job.mesh.dp, 1);
  assert_int_equal(job.mesh.virtual_stages, 1);
  assert_string_equal(job.schedule.name, "1f1b");
  assert_int_equal(job.schedule.microbatches, 1);
  assert_int_equal(job.partition.mode, PW_PARTITION_EVEN);
  assert_null(job.partition.layer_times);
  assert_true(job.partition.byte_cost == 0);
  const pw_train_spec *t = &job.train;
  assert_int_equal(t->steps, 100);
  assert_int_equal(t->batch_size, 8);
  assert_true(t->seed == 1);
  assert_true(t->grad_clip == 1.0);
  assert_int_equal(t->checkpoint_every, 0);
  assert_int_equal(t->eval_batches, 8);
  assert_int_equal(t->eval_every, 0);
  assert_int_equal(t->keep_checkpoints, 3);
  assert_int_equal(t->optim.kind, PW_OPT_ADAMW);
  assert_true(t->optim.lr == 3e-4);
  assert_true(t->optim.min_lr == 3e-4 / 10);
  assert_int_equal(t->optim.warmup_steps, 0);
  assert_true(t->optim.beta1 == 0.9 && t->optim.beta2 == 0.999);
  assert_true(t->optim.eps == 1e-8);
  assert_true(t->optim.weight_decay == 0.01);
  assert_int_equal(job.data.kind, PW_DATA_COPY);
  assert_string_equal(job.data.path, "");
  pw_job_free(&job);
}

/* docs/contracts.md's job example ("The job spec"), as written there. */
static const char *design_example =
    "{'name':'gpt-tiny','model':{'template':'gpt','vocab_size':256,'seq_len':64,'d_model':64,"
    "'n_layers':4,'n_heads':4,'tie_embeddings':false},'mesh':{'pp':2,'dp':1,'virtual_stages':1},"
    "'schedule':{'name':'1f1b','microbatches':4},'partition':{'mode':'even'},"
    "'train':{'steps':100,'batch_size':8,'seed':1,'grad_clip':1.0,'checkpoint_every':50,"
    "'optimizer':{'name':'adamw','lr':3e-3,'min_lr':3e-4,'warmup_steps':10,'betas':[0.9,0.95],"
    "'eps':1e-8,'weight_decay':0.1}},"
    "'data':{'kind':'text','path':'examples/data/corpus.txt','sampler':'sequential'}}";

static void test_design_example(void **st) {
  (void)st;
  pw_job job = parse_ok(design_example);
  assert_string_equal(job.name, "gpt-tiny");
  assert_int_equal(job.model.d_model, 64);
  assert_int_equal(job.model.ffn_hidden, 256);
  assert_int_equal(job.mesh.pp, 2);
  assert_int_equal(job.schedule.microbatches, 4);
  assert_int_equal(job.train.checkpoint_every, 50);
  assert_true(job.train.optim.lr == 3e-3 && job.train.optim.min_lr == 3e-4);
  assert_int_equal(job.train.optim.warmup_steps, 10);
  assert_true(job.train.optim.beta1 == 0.9 && job.train.optim.beta2 == 0.95);
  assert_true(job.train.optim.weight_decay == 0.1);
  assert_int_equal(job.data.kind, PW_DATA_TEXT);
  assert_int_equal(job.data.sampler, PW_SAMPLER_SEQUENTIAL);
  assert_true(job.data.eval_fraction == 0.1);
  pw_job_free(&job);
}

static void test_llama(void **st) {
  (void)st;
  pw_job job = parse_ok("{'model':{'template':'llama','seq_len':32,'d_model':64,'n_layers':2,'n_heads':4,"
                        "'tie_embeddings':true},'data':{'kind':'reverse'},'mode':'forward'}");
  assert_int_equal(job.model.tmpl, PW_TEMPLATE_LLAMA);
  assert_int_equal(job.model.ffn_hidden, 192); /* round_up(8*64/3 = 170, 32) */
  assert_true(job.model.rope_base == 10000.0f);
  assert_int_equal(job.model.tie_embeddings, 1);
  assert_int_equal(job.mode, PW_MODE_FORWARD);
  pw_job_free(&job);
  job = parse_ok("{'model':{'template':'llama','seq_len':8,'d_model':32,'n_layers':1,'n_heads':2,"
                 "'ffn_hidden':50,'rope_base':500000},'data':{'kind':'copy'}}");
  assert_int_equal(job.model.ffn_hidden, 50);
  assert_true(job.model.rope_base == 500000.0f);
  pw_job_free(&job);
}

static void test_mlp_and_sgd(void **st) {
  (void)st;
  pw_job job = parse_ok("{'model':{'template':'mlp','in_dim':4,'hidden_dim':16,'out_dim':3,"
                        "'activation':'gelu','loss':'cross_entropy'},'data':{'kind':'classify'},"
                        "'train':{'optimizer':{'name':'sgd','lr':0.1,'momentum':0.9}}}");
  const pw_model_spec *m = &job.model;
  assert_int_equal(m->tmpl, PW_TEMPLATE_MLP);
  assert_int_equal(m->n_layers, 1);
  assert_int_equal(m->seq_len, 1);
  assert_int_equal(m->vocab_size, 0);
  assert_int_equal(m->activation, PW_ACT_GELU);
  assert_int_equal(m->loss, PW_LOSS_CROSS_ENTROPY);
  assert_int_equal(m->input, PW_INPUT_FEATURES);
  assert_int_equal(m->input_dim, 4);
  assert_int_equal(job.train.optim.kind, PW_OPT_SGD);
  assert_true(job.train.optim.weight_decay == 0);
  assert_true(job.train.optim.momentum == 0.9);
  assert_true(fabs(job.train.optim.min_lr - 0.01) < 1e-15);
  pw_job_free(&job);
  /* n_layers 0: a linear model, no hidden_dim needed; mse by default */
  job = parse_ok("{'model':{'template':'mlp','in_dim':4,'out_dim':1,'n_layers':0},"
                 "'data':{'kind':'regression'}}");
  assert_int_equal(job.model.n_layers, 0);
  assert_int_equal(job.model.loss, PW_LOSS_MSE);
  assert_int_equal(job.model.activation, PW_ACT_RELU);
  pw_job_free(&job);
}

static void test_layers_list(void **st) {
  (void)st;
  json_t *j = spec_of(B_LAYERS, NULL);
  pw_job job;
  pw_err err = {0};
  assert_int_equal(pw_job_parse(j, NULL, &job, &err), 0);
  json_decref(j);
  const pw_model_spec *m = &job.model;
  assert_int_equal(m->tmpl, PW_TEMPLATE_LAYERS);
  assert_int_equal(m->input, PW_INPUT_TOKENS);
  assert_int_equal(m->n_layer_specs, 8);
  static const pw_layer_type want[] = {PW_LAYER_EMBEDDING, PW_LAYER_POS_EMBEDDING, PW_LAYER_GPT_BLOCK,
                                       PW_LAYER_STAGE_BOUNDARY, PW_LAYER_GPT_BLOCK, PW_LAYER_LAYERNORM,
                                       PW_LAYER_LINEAR, PW_LAYER_CROSS_ENTROPY};
  for (int i = 0; i < 8; i++) assert_int_equal(m->layers[i].type, want[i]);
  assert_int_equal(m->layers[0].vocab_size, 256);
  assert_int_equal(m->layers[0].out, 32);
  assert_int_equal(m->layers[2].n_heads, 4);
  assert_int_equal(m->layers[2].hidden, 0); /* default: the builder's 4C */
  assert_int_equal(m->layers[4].hidden, 64);
  assert_int_equal(m->layers[6].in, 0); /* inferred */
  assert_int_equal(m->layers[6].out, 256);
  assert_int_equal(m->layers[6].bias, 0);
  assert_int_equal(m->vocab_size, 256);
  assert_int_equal(m->seq_len, 16);
  assert_int_equal(m->loss, PW_LOSS_CROSS_ENTROPY);
  assert_int_equal(job.partition.mode, PW_PARTITION_MARKERS); /* default with boundaries */
  assert_string_equal(job.data.path, "no-such-dir/corpus.txt"); /* kept as given */
  pw_job_free(&job);
  assert_null(job.model.layers);

  j = spec_of(B_FEAT, NULL);
  assert_int_equal(pw_job_parse(j, NULL, &job, &err), 0);
  json_decref(j);
  assert_int_equal(job.model.input, PW_INPUT_FEATURES);
  assert_int_equal(job.model.input_dim, 8);
  assert_int_equal(job.model.seq_len, 1);
  assert_int_equal(job.model.loss, PW_LOSS_MSE);
  assert_int_equal(job.model.layers[0].bias, 1);
  assert_int_equal(job.model.layers[2].in, 16);
  assert_int_equal(job.partition.mode, PW_PARTITION_EVEN);
  pw_job_free(&job);
}

static void test_schedule_names(void **st) {
  (void)st;
  static const char *const want[] = {"gpipe", "1f1b", "eager1f1b", "zb-h1", "interleaved-1f1b",
                                     "interleaved-gpipe", "interleaved-1f1b-plus-one", "kimi-k2",
                                     "dualpipev"};
  assert_int_equal(pw_n_schedule_names, 9);
  for (int i = 0; i < 9; i++) {
    assert_string_equal(pw_schedule_names[i], want[i]);
    char text[512];
    snprintf(text, sizeof text,
             "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},"
             "'schedule':{'name':'%s','microbatches':2},'data':{'kind':'copy'}}",
             want[i]);
    pw_job job = parse_ok(text);
    assert_string_equal(job.schedule.name, want[i]);
    pw_job_free(&job);
  }
  /* other spellings and other systems' names read as the canonical name,
   * and are stored so */
  static const char *const alias[][2] = {
      {"1F1B", "1f1b"},         {"Std1F1B", "1f1b"},           {"ONE_FWD_ONE_BWD", "1f1b"},
      {"GPipe", "gpipe"},       {"GPIPE", "gpipe"},            {"ScheduleGPipe", "gpipe"},
      {"ZeroBubbleH1", "zb-h1"}, {"ZB_H1", "zb-h1"},           {"InterleavedH1", "interleaved-1f1b"},
      {"Interleaved1F1B", "interleaved-1f1b"}, {"DualPipeV", "dualpipev"}, {"KimiK2", "kimi-k2"},
      {"Eager1F1B", "eager1f1b"}, {"Interleaved1F1BPlusOne", "interleaved-1f1b-plus-one"},
      {"LoopedBFS", "interleaved-gpipe"}, {"ScheduleLoopedBFS", "interleaved-gpipe"},
      {"ZERO_BUBBLE_H1", "zb-h1"}, {"ScheduleDualPipeV", "dualpipev"}, {"ScheduleInterleaved1F1B", "interleaved-1f1b"},
  };
  for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++) {
    assert_string_equal(pw_schedule_resolve(alias[i][0]), alias[i][1]);
    char text[512];
    snprintf(text, sizeof text,
             "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},"
             "'schedule':{'name':'%s','microbatches':2},'data':{'kind':'copy'}}",
             alias[i][0]);
    pw_job job = parse_ok(text);
    assert_string_equal(job.schedule.name, alias[i][1]);
    json_t *back = pw_job_to_json(&job);
    assert_string_equal(json_string_value(json_object_get(json_object_get(back, "schedule"), "name")), alias[i][1]);
    json_decref(back);
    pw_job_free(&job);
  }
  /* not ours, so not read as ours */
  assert_null(pw_schedule_resolve("CIRCULAR"));
  assert_null(pw_schedule_resolve("ScheduleInterleavedZeroBubble"));
  assert_null(pw_schedule_resolve("ScheduleZBVZeroBubble"));
  assert_null(pw_schedule_resolve("custom"));
  /* every listed alias reads as its schedule; each schedule lists its own */
  for (int i = 0; i < 9; i++) {
    const char *const *al = pw_schedule_aliases(want[i]);
    assert_non_null(al[0]);
    for (; *al; al++) assert_string_equal(pw_schedule_resolve(*al), want[i]);
  }
  assert_string_equal(pw_schedule_aliases("1f1b")[1], "Std1F1B");
  assert_string_equal(pw_schedule_aliases("interleaved-gpipe")[1], "LoopedBFS");
  assert_null(pw_schedule_aliases("nope")[0]);
  assert_null(pw_schedule_aliases(NULL)[0]);
  assert_null(pw_schedule_resolve("Interleaved"));
  assert_null(pw_schedule_resolve("Schedule"));
  assert_null(pw_schedule_resolve(NULL));
}

/* ---- the canonical round trip ---------------------------------------- */

static void assert_jobs_equal(const pw_job *a, const pw_job *b) {
  pw_job x = *a, y = *b;
  x.model.layers = y.model.layers = NULL;
  x.model.regions = y.model.regions = NULL;
  for (int r = 0; r < a->model.n_regions; r++) {
    pw_region_spec ra = a->model.regions[r], rb = b->model.regions[r];
    ra.layers = rb.layers = NULL;
    assert_memory_equal(&ra, &rb, sizeof ra);
    assert_memory_equal(a->model.regions[r].layers, b->model.regions[r].layers,
                        sizeof(pw_layer_spec) * (size_t)ra.n_layer_specs);
  }
  x.partition.layer_times = y.partition.layer_times = NULL;
  x.mesh.placement = y.mesh.placement = NULL;
  x.partition.first = y.partition.first = NULL;
  x.partition.names = y.partition.names = NULL;
  x.partition.hints = y.partition.hints = NULL;
  x.schedule.custom_ranks = y.schedule.custom_ranks = NULL;
  for (int r = 0; r < a->schedule.n_custom_ranks; r++)
    assert_string_equal(a->schedule.custom_ranks[r], b->schedule.custom_ranks[r]);
  assert_memory_equal(&x, &y, sizeof x); /* the parser zeroes the struct first */
  if (a->mesh.n_placement)
    assert_memory_equal(a->mesh.placement, b->mesh.placement, sizeof(int) * (size_t)a->mesh.n_placement);
  if (a->partition.n_stages) {
    assert_memory_equal(a->partition.first, b->partition.first, sizeof(int) * (size_t)(a->partition.n_stages + 1));
    assert_memory_equal(a->partition.names, b->partition.names,
                        sizeof *a->partition.names * (size_t)a->partition.first[a->partition.n_stages]);
  }
  if (a->partition.n_hints)
    assert_memory_equal(a->partition.hints, b->partition.hints, sizeof *a->partition.hints * (size_t)a->partition.n_hints);
  assert_int_equal(a->model.n_layer_specs, b->model.n_layer_specs);
  if (a->model.n_layer_specs)
    assert_memory_equal(a->model.layers, b->model.layers, sizeof(pw_layer_spec) * (size_t)a->model.n_layer_specs);
  assert_int_equal(a->partition.n_layer_times, b->partition.n_layer_times);
  for (int i = 0; i < a->partition.n_layer_times; i++)
    assert_true(a->partition.layer_times[i] == b->partition.layer_times[i]);
}

static void round_trip(const char *text) {
  pw_job a = parse_ok(text), b;
  json_t *ja = pw_job_to_json(&a);
  assert_non_null(ja);
  /* through text, as a user would store it */
  char *s = json_dumps(ja, JSON_COMPACT);
  json_error_t je;
  json_t *jt = json_loads(s, 0, &je);
  assert_non_null(jt);
  pw_err err = {0};
  int rc = pw_job_parse(jt, NULL, &b, &err);
  if (rc) fail_msg("canonical JSON does not parse: %s: %s\n%s", err.path, err.msg, s);
  assert_jobs_equal(&a, &b);
  json_t *jb = pw_job_to_json(&b);
  assert_true(json_equal(ja, jb));
  /* canonical means every default present */
  assert_non_null(json_object_get(ja, "mesh"));
  assert_non_null(json_object_get(json_object_get(ja, "train"), "optimizer"));
  free(s);
  json_decref(ja);
  json_decref(jb);
  json_decref(jt);
  pw_job_free(&a);
  pw_job_free(&b);
}

static const char *const round_trip_specs[] = {
    "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},'data':{'kind':'copy'},"
    "'train':{'eval_every':5,'eval_batches':2}}",
    "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},'data':{'kind':'copy'}}",
    "{'model':{'template':'llama','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2,'norm_eps':1e-6,"
    "'init_std':0.05,'rope_base':12345.5},'data':{'kind':'text','path':'x.txt','eval_fraction':0.3}}",
    "{'model':{'template':'mlp','in_dim':4,'hidden_dim':16,'out_dim':3,'n_layers':3,'activation':'silu',"
    "'loss':'cross_entropy'},'data':{'kind':'classify'},"
    "'train':{'seed':123456789012,'optimizer':{'name':'sgd','lr':0.1,'momentum':0.5,'weight_decay':0.001}}}",
    "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},'data':{'kind':'copy'},"
    "'train':{'trainable':['blocks.*','lm_head.weight']}}",
    "{'model':{'template':'llama','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2,"
    "'lora':{'rank':4,'alpha':16,'targets':['blocks.*.attn.qkv','lm_head']}},'data':{'kind':'copy'}}",
    "{'mode':'serve','model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},"
    "'data':{'kind':'copy'},'init':{'job':3,'step':4},'serve':{'max_sequences':5,'max_queue':0}}",
    "{'model':{'template':'mlp','in_dim':4,'out_dim':3,'n_layers':0},'data':{'kind':'regression'},"
    "'partition':{'mode':'balanced','layer_times':[0.1,0.2,3],'byte_cost':1e-9}}",
    "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':2,'n_heads':2},'data':{'kind':'copy'},"
    "'mesh':{'pp':2,'placement':[1,0]},'partition':{'stages':[['embed'],['blocks.0','blocks.1','head']]}}",
    "{'model':{'input':{'kind':'features','dim':3},'layers':[{'type':'linear','out':4},"
    "{'stage_boundary':{'stage':1}},{'type':'relu'},{'type':'linear','out':2},{'type':'mse'}]},"
    "'mesh':{'pp':2,'placement':'v'},'data':{'kind':'regression'}}",
    "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':2,'n_heads':2},'mesh':{'pp':2},"
    "'schedule':{'microbatches':2,'custom':{'ranks':['F0@s0 F1@s0 B0@s0 B1@s0','F0@s1  B0@s1 F1@s1+B1@s1']}},"
    "'train':{'batch_size':4},'data':{'kind':'copy'}}",
    "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':2,'n_heads':2},'mesh':{'pp':2,'tp':2},"
    "'data':{'kind':'copy'}}",
    "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},'data':{'kind':'copy'},"
    "'train':{'attention':'tiled'}}",
    "{'model':{'template':'llama','seq_len':8,'d_model':16,'n_layers':1,'n_heads':4,'n_kv_heads':1,'qkv_bias':true,"
    "'qk_norm':true,'rope_scaling':{'rope_type':'llama3','factor':8,'low_freq_factor':1,'high_freq_factor':4,"
    "'original_max_position_embeddings':8192}},'data':{'kind':'copy'}}",
    "{'model':{'template':'llama','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2,'n_kv_heads':1,"
    "'tie_embeddings':true,'mlp_act':'gelu_tanh','embed_scale':true,'norm_offset':1,'head_dim':8},"
    "'data':{'kind':'copy'}}",
    "{'model':{'template':'llama','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2,'head_dim':6,"
    "'sliding_window':3},'data':{'kind':'copy'}}",
    "{'model':{'template':'bert','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2,'bert_head':'classify',"
    "'n_labels':3,'type_vocab_size':3,'pad_token':0,'sep_token':102},'data':{'kind':'labeled','path':'x.jsonl'}}",
    "{'model':{'template':'bert','vocab_size':300,'seq_len':8,'d_model':16,'n_layers':1,'n_heads':2,"
    "'pad_token':0,'sep_token':102,'mlm_predictions':2},'data':{'kind':'text','path':'x.txt','mask_token':103}}",
};

/* llama's attention options: in the canonical spec when set, left out
 * when off (n_kv_heads equal to n_heads is off), so the specs and plan
 * hashes of jobs without them stay what they were. */
static void test_llama_options(void **st) {
  (void)st;
  static const char *const texts[] = {
      "", ",'n_kv_heads':4,'qkv_bias':false,'qk_norm':false",
      ",'n_kv_heads':2,'qkv_bias':true,'qk_norm':true,'rope_scaling':{'rope_type':'llama3','factor':8,"
      "'low_freq_factor':1,'high_freq_factor':4,'original_max_position_embeddings':8192}"};
  static const char *const keys[] = {"n_kv_heads", "qkv_bias", "qk_norm", "rope_scaling"};
  char *canon[3], buf[512];
  for (int i = 0; i < 3; i++) {
    snprintf(buf, sizeof buf,
             "{'model':{'template':'llama','seq_len':8,'d_model':16,'n_layers':1,'n_heads':4%s},'data':{'kind':'copy'}}",
             texts[i]);
    pw_job job = parse_ok(buf);
    json_t *j = pw_job_to_json(&job), *m = json_object_get(j, "model");
    for (int k = 0; k < 4; k++)
      if (i < 2) assert_null(json_object_get(m, keys[k]));
      else assert_non_null(json_object_get(m, keys[k]));
    if (i == 2) {
      assert_int_equal(job.model.n_kv_heads, 2);
      assert_true(job.model.rope_scaling == 1 && job.model.rope_factor == 8 && job.model.rope_orig_max_pos == 8192);
      assert_true(job.model.qkv_bias && job.model.qk_norm);
    }
    canon[i] = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    pw_job_free(&job);
  }
  assert_string_equal(canon[0], canon[1]);
  assert_string_not_equal(canon[0], canon[2]);
  for (int i = 0; i < 3; i++) free(canon[i]);
}

/* Gemma's options: in the canonical spec when set, left out when off
 * (mlp_act silu, norm_offset 0, head_dim d_model / n_heads), so the specs
 * and plan hashes of jobs without them stay what they were. */
static void test_gemma_options(void **st) {
  (void)st;
  static const char *const texts[] = {
      "", ",'mlp_act':'silu','embed_scale':false,'norm_offset':0,'head_dim':8",
      ",'mlp_act':'gelu_tanh','embed_scale':true,'norm_offset':1,'head_dim':8"};
  static const char *const keys[] = {"mlp_act", "embed_scale", "norm_offset"};
  char *canon[3], buf[512];
  for (int i = 0; i < 3; i++) {
    snprintf(buf, sizeof buf,
             "{'model':{'template':'llama','seq_len':8,'d_model':32,'n_layers':1,'n_heads':4%s},'data':{'kind':'copy'}}",
             texts[i]);
    pw_job job = parse_ok(buf);
    json_t *j = pw_job_to_json(&job), *m = json_object_get(j, "model");
    assert_null(json_object_get(m, "head_dim"));
    for (int k = 0; k < 3; k++)
      if (i < 2) assert_null(json_object_get(m, keys[k]));
      else assert_non_null(json_object_get(m, keys[k]));
    if (i == 2) {
      assert_true(job.model.mlp_act == PW_MLP_ACT_GELU_TANH && job.model.embed_scale && job.model.norm_offset == 1);
      assert_string_equal(json_string_value(json_object_get(m, "mlp_act")), "gelu_tanh");
      assert_int_equal(json_integer_value(json_object_get(m, "norm_offset")), 1);
    }
    canon[i] = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    pw_job_free(&job);
  }
  assert_string_equal(canon[0], canon[1]);
  assert_string_not_equal(canon[0], canon[2]);
  for (int i = 0; i < 3; i++) free(canon[i]);
}

/* train.eval_every: in the canonical spec when set, left out when 0 (so
 * the specs and plan hashes of jobs without it stay what they were). */
static void test_eval_every(void **st) {
  (void)st;
  static const char *const texts[] = {
      "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},'data':{'kind':'copy'}}",
      "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},'data':{'kind':'copy'},"
      "'train':{'eval_every':0}}",
      "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},'data':{'kind':'copy'},"
      "'train':{'eval_every':7}}"};
  char *canon[3];
  for (int i = 0; i < 3; i++) {
    pw_job job = parse_ok(texts[i]);
    assert_int_equal(job.train.eval_every, i == 2 ? 7 : 0);
    json_t *j = pw_job_to_json(&job);
    json_t *ev = json_object_get(json_object_get(j, "train"), "eval_every");
    if (i < 2) assert_null(ev);
    else assert_int_equal(json_integer_value(ev), 7);
    canon[i] = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    pw_job_free(&job);
  }
  assert_string_equal(canon[0], canon[1]);
  assert_string_not_equal(canon[0], canon[2]);
  for (int i = 0; i < 3; i++) free(canon[i]);
}

/* train.attention: in the canonical spec when "tiled" or "plain", left out
 * when "auto" (the specs and plan hashes of jobs without it stay). */
static void test_attention(void **st) {
  (void)st;
  static const char *const texts[] = {"", ",'train':{'attention':'auto'}", ",'train':{'attention':'tiled'}",
                                      ",'train':{'attention':'plain'}"};
  static const int want[] = {PW_ATTN_AUTO, PW_ATTN_AUTO, PW_ATTN_TILED, PW_ATTN_PLAIN};
  char *canon[4], buf[256];
  for (int i = 0; i < 4; i++) {
    snprintf(buf, sizeof buf,
             "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},'data':{'kind':'copy'}%s}",
             texts[i]);
    pw_job job = parse_ok(buf);
    assert_int_equal(job.train.attention, want[i]);
    json_t *j = pw_job_to_json(&job);
    json_t *a = json_object_get(json_object_get(j, "train"), "attention");
    if (i < 2) assert_null(a);
    else assert_string_equal(json_string_value(a), i == 2 ? "tiled" : "plain");
    canon[i] = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    pw_job_free(&job);
  }
  assert_string_equal(canon[0], canon[1]);
  assert_string_not_equal(canon[0], canon[2]);
  for (int i = 0; i < 4; i++) free(canon[i]);
}

/* train.zero over dp > 1 turns the snapshots' default off (a replica holds
 * a shard of the optimizer state); every other spec keeps the default 1,
 * and the canonical spec says 0, so it parses back the same. */
static void test_zero_snapshots(void **st) {
  (void)st;
  static const struct {
    const char *text;
    int every;
  } cases[] = {
      {"{'mesh':{'dp':2},'train':{'zero':1}}", 0},
      {"{'mesh':{'dp':2},'train':{'zero':2,'batch_size':8}}", 0},
      {"{'mesh':{'dp':2},'train':{'zero':1,'snapshot_every':0}}", 0},
      {"{'mesh':{'dp':1},'train':{'zero':1}}", 1},
      {"{'mesh':{'dp':2}}", 1},
  };
  static const char *const base = "{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},"
                                  "'data':{'kind':'copy'},";
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[512];
    snprintf(text, sizeof text, "%s%s", base, cases[i].text + 1);
    pw_job job = parse_ok(text);
    assert_int_equal(job.train.snapshot_every, cases[i].every);
    json_t *j = pw_job_to_json(&job);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "train"), "snapshot_every")),
                     cases[i].every);
    pw_job again;
    pw_err err = {0};
    assert_int_equal(pw_job_parse(j, NULL, &again, &err), 0);
    assert_int_equal(again.train.snapshot_every, cases[i].every);
    json_decref(j);
    pw_job_free(&again);
    pw_job_free(&job);
  }
}

/* mode serve: defaults (max_len the model's seq_len), and the serve object
 * emitted only for it. */
static void test_serve(void **st) {
  (void)st;
  pw_job job = parse_ok("{'mode':'serve','model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,"
                        "'n_heads':2},'data':{'kind':'copy'},'init':{'job':3,'step':4}}");
  assert_int_equal(job.mode, PW_MODE_SERVE);
  assert_int_equal(job.serve.max_sequences, 8);
  assert_int_equal(job.serve.max_len, 8);
  assert_int_equal(job.serve.max_queue, 64);
  json_t *j = pw_job_to_json(&job);
  assert_string_equal(json_string_value(json_object_get(j, "mode")), "serve");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "serve"), "max_len")), 8);
  json_decref(j);
  pw_job_free(&job);
  job = parse_ok("{'model':{'template':'gpt','seq_len':8,'d_model':16,'n_layers':1,'n_heads':2},"
                 "'data':{'kind':'copy'}}");
  j = pw_job_to_json(&job);
  assert_null(json_object_get(j, "serve")); /* a training spec's canonical text is unchanged */
  json_decref(j);
  pw_job_free(&job);
}

static void test_round_trip(void **st) {
  (void)st;
  round_trip(design_example);
  for (size_t i = 0; i < sizeof round_trip_specs / sizeof round_trip_specs[0]; i++)
    round_trip(round_trip_specs[i]);
  for (int b = B_GPT; b <= B_FEAT; b++) {
    json_t *j = spec_of(b, NULL);
    char *s = json_dumps(j, JSON_COMPACT);
    round_trip(s);
    free(s);
    json_decref(j);
  }
}

/* ---- files ----------------------------------------------------------- */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_load_file(void **st) {
  (void)st;
  char dir[] = "/tmp/pw_test_spec_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char jobf[128], corpus[128], bad_json[128], dup[128], text[1024];
  snprintf(jobf, sizeof jobf, "%s/job.json", dir);
  snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
  snprintf(bad_json, sizeof bad_json, "%s/bad.json", dir);
  snprintf(dup, sizeof dup, "%s/dup.json", dir);
  write_file(corpus, "hello world\n");

  /* a relative data.path found next to the job file */
  snprintf(text, sizeof text, "%s",
           "{\"model\": {\"template\": \"gpt\", \"seq_len\": 8, \"d_model\": 16, \"n_layers\": 1,"
           " \"n_heads\": 2}, \"data\": {\"kind\": \"text\", \"path\": \"corpus.txt\"}}");
  write_file(jobf, text);
  pw_job job;
  pw_err err = {0};
  assert_int_equal(pw_job_load_file(jobf, &job, &err), 0);
  assert_string_equal(job.data.path, corpus);
  pw_job_free(&job);

  /* a path that exists from the current directory is kept as given */
  char cwd_rel[64];
  snprintf(cwd_rel, sizeof cwd_rel, "pw_test_spec_%d.txt", (int)getpid());
  write_file(cwd_rel, "x");
  snprintf(text, sizeof text,
           "{\"model\": {\"template\": \"gpt\", \"seq_len\": 8, \"d_model\": 16, \"n_layers\": 1,"
           " \"n_heads\": 2}, \"data\": {\"kind\": \"text\", \"path\": \"%s\"}}",
           cwd_rel);
  write_file(jobf, text);
  assert_int_equal(pw_job_load_file(jobf, &job, &err), 0);
  assert_string_equal(job.data.path, cwd_rel);
  pw_job_free(&job);
  unlink(cwd_rel);

  /* JSON syntax errors carry the file, line and column */
  write_file(bad_json, "{\n  \"model\": {,\n}");
  assert_int_equal(pw_job_load_file(bad_json, &job, &err), PW_EJSON);
  assert_string_equal(err.path, bad_json);
  assert_non_null(strstr(err.msg, "line 2 column"));

  /* duplicate keys are rejected, not silently merged */
  write_file(dup, "{\"name\": \"a\", \"name\": \"b\"}");
  assert_int_equal(pw_job_load_file(dup, &job, &err), PW_EJSON);

  /* spec errors keep their JSON path */
  write_file(jobf, "{\"model\": {\"template\": \"gpt\"}, \"data\": {\"kind\": \"copy\"}}");
  assert_int_equal(pw_job_load_file(jobf, &job, &err), PW_ESPEC);
  assert_string_equal(err.path, "model.seq_len");

  char missing[160];
  snprintf(missing, sizeof missing, "%s/none.json", dir);
  assert_int_equal(pw_job_load_file(missing, &job, &err), PW_ENOENT);
  assert_string_equal(err.path, missing);

  unlink(jobf);
  unlink(corpus);
  unlink(bad_json);
  unlink(dup);
  rmdir(dir);
}

/* The shipped examples load, and their canonical form loads back the same. */
static void test_examples(void **st) {
  (void)st;
  const char *src = getenv("PW_SOURCE_DIR");
  char pat[1024];
  snprintf(pat, sizeof pat, "%s/examples/jobs/*.json", src ? src : PW_SOURCE_DIR);
  glob_t g;
  if (glob(pat, 0, NULL, &g) != 0) return; /* none yet */
  for (size_t i = 0; i < g.gl_pathc; i++) {
    pw_job a, b;
    pw_err err = {0};
    if (pw_job_load_file(g.gl_pathv[i], &a, &err))
      fail_msg("%s: %s: %s", g.gl_pathv[i], err.path, err.msg);
    json_t *j = pw_job_to_json(&a);
    assert_int_equal(pw_job_parse(j, NULL, &b, &err), 0);
    assert_jobs_equal(&a, &b);
    json_decref(j);
    pw_job_free(&a);
    pw_job_free(&b);
  }
  globfree(&g);
}

static void expect_bad(json_t *j, const char *path, const char *msg) {
  pw_job job;
  pw_err err = {0};
  int rc = pw_job_parse(j, NULL, &job, &err);
  if (rc != PW_ESPEC || strcmp(err.path, path) || !strstr(err.msg, msg))
    fail_msg("want \"%s: ...%s...\", got %d \"%s: %s\"", path, msg, rc, err.path, err.msg);
  json_decref(j);
}

/* Lengths and bytes the table cannot write as literals. */
static void test_string_limits(void **st) {
  (void)st;
  char big[700];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  json_t *j = spec_of(B_GPT, NULL);
  big[127] = 0; /* 127 bytes: fits */
  json_object_set_new(j, "name", json_string(big));
  pw_job job;
  pw_err err;
  assert_int_equal(pw_job_parse(j, NULL, &job, &err), 0);
  assert_int_equal(strlen(job.name), 127);
  pw_job_free(&job);
  big[127] = 'a';
  big[128] = 0;
  json_object_set_new(j, "name", json_string(big));
  expect_bad(j, "name", "too long (128 bytes, at most 127)");

  big[128] = 'a';
  j = spec_of(B_GPT, "{'data':{'kind':'text','path':'x'}}");
  json_object_set_new(json_object_get(j, "data"), "path", json_string(big));
  expect_bad(j, "data.path", "too long (699 bytes, at most 511)");

  j = spec_of(B_GPT, "{'data':{'kind':'text','path':'x'}}");
  json_object_set_new(json_object_get(j, "data"), "path", json_stringn("a\0b", 3));
  expect_bad(j, "data.path", "NUL");
  j = spec_of(B_GPT, NULL);
  json_object_set_new(j, "name", json_stringn("a\0b", 3));
  expect_bad(j, "name", "control characters (0x00 at byte 1)");
  /* multi-byte UTF-8 is printable */
  j = spec_of(B_GPT, NULL);
  json_object_set_new(j, "name", json_string("d\xc3\xa9j\xc3\xa0-vu"));
  assert_int_equal(pw_job_parse(j, NULL, &job, &err), 0);
  assert_string_equal(job.name, "d\xc3\xa9j\xc3\xa0-vu");
  pw_job_free(&job);
  json_decref(j);
}

static void test_null_args(void **st) {
  (void)st;
  pw_job job;
  pw_err err;
  assert_int_equal(pw_job_parse(NULL, NULL, &job, &err), PW_ESPEC);
  assert_int_equal(pw_job_load_file(NULL, &job, &err), PW_EINVAL);
  pw_job_free(NULL);
}

/* ---- the JSON Schema ------------------------------------------------- */

static json_t *schema_resolve(json_t *root, json_t *s) {
  for (int guard = 0; guard < 8 && s; guard++) {
    json_t *ref = json_object_get(s, "$ref");
    if (!json_is_string(ref)) return s;
    const char *r = json_string_value(ref);
    assert_true(strncmp(r, "#/$defs/", 8) == 0);
    s = json_object_get(json_object_get(root, "$defs"), r + 8);
    if (!s) fail_msg("schema: dangling $ref %s", r);
  }
  return s;
}

/* Every key of the canonical JSON must be named by the schema's
 * "properties" at the same place, recursively (arrays via "items"). */
static void schema_names_all(json_t *root, json_t *schema, json_t *v, const char *where) {
  schema = schema_resolve(root, schema);
  assert_non_null(schema);
  if (json_is_object(v)) {
    json_t *props = json_object_get(schema, "properties");
    if (!props) fail_msg("schema: no properties at %s", where);
    assert_true(json_is_false(json_object_get(schema, "additionalProperties")));
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
      json_t *ps = json_object_get(props, k);
      if (!ps) fail_msg("schema: %s.%s is not named", where, k);
      char sub[256];
      snprintf(sub, sizeof sub, "%s.%s", where, k);
      schema_names_all(root, ps, x, sub);
    }
  } else if (json_is_array(v)) {
    json_t *items = json_object_get(schema, "items");
    json_t *prefix = json_object_get(schema, "prefixItems");
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      char sub[256];
      snprintf(sub, sizeof sub, "%s[%zu]", where, i);
      if (items && json_is_object(items))
        schema_names_all(root, items, x, sub);
      else if (!json_is_array(prefix))
        fail_msg("schema: no items at %s", where);
    }
  }
}

static void test_schema(void **st) {
  (void)st;
  const char *src = getenv("PW_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/api/job.schema.json", src ? src : PW_SOURCE_DIR);
  json_error_t je;
  json_t *schema = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!schema) fail_msg("%s: line %d: %s", path, je.line, je.text);
  assert_string_equal(json_string_value(json_object_get(schema, "$schema")),
                      "https://json-schema.org/draft/2020-12/schema");
  static const char *const top[] = {"name", "mode",  "model", "mesh", "schedule",
                                    "partition", "train", "data", "init", "serve"};
  json_t *props = json_object_get(schema, "properties");
  for (int i = 0; i < 10; i++)
    if (!json_object_get(props, top[i])) fail_msg("schema: top-level field %s missing", top[i]);
  assert_int_equal(json_object_size(props), 10);
  /* the schema's schedule names are ours, in order */
  json_t *sched = schema_resolve(schema, json_object_get(props, "schedule"));
  json_t *names = json_object_get(json_object_get(json_object_get(sched, "properties"), "name"), "enum");
  assert_int_equal(json_array_size(names), (size_t)pw_n_schedule_names + 2); /* + custom, auto (POST /v1/jobs) */
  for (int i = 0; i < pw_n_schedule_names; i++)
    assert_string_equal(json_string_value(json_array_get(names, (size_t)i)), pw_schedule_names[i]);
  assert_string_equal(json_string_value(json_array_get(names, (size_t)pw_n_schedule_names)), "custom");
  assert_string_equal(json_string_value(json_array_get(names, (size_t)pw_n_schedule_names + 1)), "auto");
  /* and it names every field of every canonical spec we emit */
  json_t *specs[32];
  int n = 0;
  _Static_assert(sizeof round_trip_specs / sizeof round_trip_specs[0] + 1 + B_FEAT <= 32, "specs[] holds them all");
  specs[n++] = jq(design_example);
  for (size_t i = 0; i < sizeof round_trip_specs / sizeof round_trip_specs[0]; i++)
    specs[n++] = jq(round_trip_specs[i]);
  for (int b = B_GPT; b <= B_FEAT; b++) specs[n++] = spec_of(b, NULL);
  assert_true(n <= (int)(sizeof specs / sizeof specs[0]));
  for (int i = 0; i < n; i++) {
    pw_job job;
    pw_err err;
    assert_int_equal(pw_job_parse(specs[i], NULL, &job, &err), 0);
    json_t *canon = pw_job_to_json(&job);
    schema_names_all(schema, schema, canon, "$");
    json_decref(canon);
    pw_job_free(&job);
    json_decref(specs[i]);
  }
  json_decref(schema);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_specs),      cmocka_unit_test(test_bases_valid),
      cmocka_unit_test(test_err_str),        cmocka_unit_test(test_gpt_defaults),
      cmocka_unit_test(test_design_example), cmocka_unit_test(test_llama),
      cmocka_unit_test(test_mlp_and_sgd),    cmocka_unit_test(test_layers_list),
      cmocka_unit_test(test_schedule_names), cmocka_unit_test(test_eval_every),
      cmocka_unit_test(test_llama_options),
      cmocka_unit_test(test_gemma_options),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_zero_snapshots),
      cmocka_unit_test(test_serve),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_load_file),      cmocka_unit_test(test_examples),
      cmocka_unit_test(test_string_limits), cmocka_unit_test(test_null_args),
      cmocka_unit_test(test_schema),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
