"""hf_ref: `pipewright import-hf` / `export-hf` against Hugging Face transformers.

    .venv-hf/bin/python tests/ref/hf_ref.py PIPEWRIGHT SOURCE_DIR TMP

(test_hf_ref.sh runs it in deploy/venv.sh hf's environment: transformers
4.49.0, the newest that runs over Debian's PyTorch 1.13.) For tiny random
models made by transformers itself and saved with save_pretrained —
GPT-2, Llama (grouped query heads, Llama-3 rope_scaling, rope_theta), Qwen2 (q/k/v biases, one kv
head, tied), Mistral (a sliding window of 4, shorter than the prompts:
transformers' eager attention, checked to change its logits), Gemma (GeGLU,
embeddings times sqrt(d), RMSNorm by 1 + w, tied), a Gemma whose heads are
12 wide over hidden_size 32 / 4 heads (head_dim), Mixtral (a mixture of 4
experts, top 2, in every block: model.moe) and Qwen2-MoE (q/k/v biases, its
softmax gates, a shared expert of its own width behind a sigmoid gate, a
dense first block) — it checks that:
  - import-hf's job and checkpoint give pipewright logits (generate
    --logits) equal to transformers' to 1e-4 of the largest;
  - export-hf -> import-hf gives back the same model spec and every tensor
    bit for bit, and transformers loads the exported directory with the
    same logits as the original model;
  - a sharded save (model.safetensors.index.json) and a bfloat16 save import
    to the same tensors (bf16 widened exactly);
  - the GPT-2 job (vocab_size 256: the example corpus) trains from its
    imported checkpoint, and its fine-tune, exported, gives in transformers
    the logits pipewright gives;
  - config fields and tensors we cannot compute are refused naming them,
    and nothing is written then;
  - greedy generation: `pipewright generate --prompt-tokens IDS
    --max-tokens 12` gives, token for token, the 12 ids transformers'
    `generate(max_new_tokens=12, do_sample=False)` gives, for prompts of 1,
    4 and 11 tokens, on every family above. transformers is kept from
    stopping early by eos_token_id=None (no token ends a sequence; it is
    checked to give all 12) and from masking the prompt by an attention
    mask of ones (with a pad id it would mask the prompt's tokens equal to
    it). The models are made with initializer_range 0.3 (not 0.02) so that
    the text varies and the top two logits stand apart (a tied model at
    0.02 only repeats its last token); transformers' ids must be the argmax
    of its own raw logits (no processor ran). A step whose top two logits
    in transformers lie within 1e-5 of the largest |logit| (or of 1) is an
    ill-posed greedy choice (the logits agree to ~1e-6): the line says so,
    and the ids are compared only before it.
Qwen3 is not in transformers 4.49: its import and export are checked here on
a directory made here, for the names, shapes and the round trip only, and
against transformers 5 by hf_ref_v5.py (test_hf_ref_v5.sh).
"""
import json
import os
import shutil
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file
import transformers as tf

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_common as hc  # noqa: E402
from hf_common import check, hf_logits, pw, pw_logits, rel, same_tensors  # noqa: E402,F401

PW, SRC, TMP = sys.argv[1], sys.argv[2], sys.argv[3]
hc.setup(PW, SRC)
failures = hc.failures
torch.manual_seed(0)
TOKENS = [3, 17, 1, 42, 9, 0, 25, 61, 8, 33, 12]
PROMPTS = [TOKENS[4:5], TOKENS[:4], TOKENS]  # 1, 4 and 11 tokens
NEW = 12
INIT = 0.3  # initializer_range: well-separated logits, varied text (see above)
gen_s = 0.0  # the seconds the generation checks take


def greedy(name, model, job, ck):
    """pipewright generate's greedy ids against transformers' generate, per prompt."""
    global gen_s
    t = time.time()
    for p in PROMPTS:
        ids = [x % model.config.vocab_size for x in p]
        x = torch.tensor([ids])
        with torch.no_grad():
            o = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, do_sample=False,
                               eos_token_id=None, output_logits=True, return_dict_in_generate=True,
                               synced_gpus=False)  # else it imports torch.distributed.fsdp: broken in Debian's 1.13
        ref = o.sequences[0, len(ids):].tolist()
        lg = torch.stack(o.logits)[:, 0].float()  # NEW x vocab, before any processor
        top = lg.topk(2, dim=-1).values
        gap = top[:, 0] - top[:, 1]
        tol = 1e-5 * lg.abs().max(dim=-1).values.clamp(min=1)
        tied = [k for k in range(len(ref)) if gap[k] < tol[k]]
        n = tied[0] if tied else NEW
        r = pw("generate", "--job", job, "--checkpoint", ck, "--prompt-tokens", ",".join(map(str, ids)),
               "--max-tokens", str(NEW))
        got = [int(v) for v in r.stdout.strip().split(",") if v]
        what = (f"{name}: greedy {NEW} after {len(ids)} token(s) equal transformers' generate "
                f"(top-2 gap >= {float(gap.min()):.1e})")
        if tied:
            rest = "the rest agree too" if got == ref else f"pipewright {got[n:]}, transformers {ref[n:]} from there"
            what += (f"; NOTE step {n}'s top two logits are {float(gap[n]):.1e} apart, {float(gap[n] / tol[n]):.2f}"
                     f" of 1e-5 of the largest (an ill-posed greedy choice): compared steps 0..{n - 1} only; {rest}")
        check(len(ref) == NEW and ref == lg.argmax(-1).tolist() and len(got) == NEW and got[:n] == ref[:n],
              what + ("" if got[:n] == ref[:n] else f"\n       pipewright:   {got}\n       transformers: {ref}"))
    gen_s += time.time() - t


def family(name, model, attn=None):
    d = os.path.join(TMP, name)
    hf = os.path.join(d, "hf")
    model.eval().save_pretrained(hf, safe_serialization=True)
    job, ck = os.path.join(d, "job.json"), os.path.join(d, "ck.safetensors")
    pw("import-hf", hf, "--job-out", job, "--out", ck, "--name", name)
    ids = [t % model.config.vocab_size for t in TOKENS]
    ref = hf_logits(model, ids)
    got = pw_logits(job, ck, ids, os.path.join(d, "lg.safetensors"))
    e = rel(got, ref)
    check(got.shape == ref.shape and e <= 1e-4, f"{name}: logits equal transformers' ({e:.2e} of the largest)")
    # export -> import: the same spec, the same tensors
    ex = os.path.join(d, "export")
    pw("export-hf", "--job", job, "--checkpoint", ck, "--out", ex)
    job2, ck2 = os.path.join(d, "job2.json"), os.path.join(d, "ck2.safetensors")
    pw("import-hf", ex, "--job-out", job2, "--out", ck2, "--name", name)
    m1, m2 = json.load(open(job))["model"], json.load(open(job2))["model"]
    check(m1 == m2, f"{name}: export -> import gives the same model spec")
    check(same_tensors(ck, ck2), f"{name}: export -> import gives every tensor bit for bit")
    # transformers loads the export: the original model's logits
    back = tf.AutoModelForCausalLM.from_pretrained(ex, **({"attn_implementation": attn} if attn else {})).eval()
    e2 = float((hf_logits(back, ids) - ref).abs().max())
    check(e2 == 0, f"{name}: transformers loads the export with the original's logits (max diff {e2:.1e})")
    greedy(name, model, job, ck)
    return d, hf, job, ck


def refuse(label, hf, needle):
    d = os.path.dirname(hf)
    job, ck = os.path.join(d, "r.json"), os.path.join(d, "r.safetensors")
    r = pw("import-hf", hf, "--job-out", job, "--out", ck, ok=False)
    msg = r.stderr.strip()
    written = [p for p in (job, ck) if os.path.exists(p)]
    check(r.returncode == 1 and needle in msg and not written,
          f"refused, {label}: {msg[:150]}" + (f" (but wrote {written})" if written else ""))


def variant(src, name, edit_cfg=None, edit_tensors=None):
    """A copy of directory src with its config and/or tensors edited."""
    dst = os.path.join(TMP, "bad", name)
    shutil.copytree(src, dst)
    if edit_cfg:
        p = os.path.join(dst, "config.json")
        c = json.load(open(p))
        edit_cfg(c)
        json.dump(c, open(p, "w"))
    if edit_tensors:
        p = os.path.join(dst, "model.safetensors")
        t = load_file(p)
        edit_tensors(t)
        save_file(t, p, metadata={"format": "pt"})
    return dst


t0 = time.time()
llama_cfg = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, initializer_range=INIT, max_position_embeddings=64, rms_norm_eps=1e-5,
                 rope_theta=500000.0,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 16})
gd, ghf, gjob, gck = family("gpt2", tf.GPT2LMHeadModel(tf.GPT2Config(initializer_range=INIT,
    vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=4)))
ld, lhf, _, lck = family("llama", tf.LlamaForCausalLM(tf.LlamaConfig(**llama_cfg)))
qd, qhf, _, _ = family("qwen2", tf.Qwen2ForCausalLM(tf.Qwen2Config(initializer_range=INIT,
    vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=1, max_position_embeddings=48, tie_word_embeddings=True, rope_theta=10000.0)))
# Mistral's sliding window, 4 keys, shorter than the prompts and the text: eager attention (its mask
# is transformers' reference, modeling_mistral's k <= p - sliding_window), checked to apply it
mistral = tf.MistralForCausalLM(tf.MistralConfig(initializer_range=INIT, attn_implementation="eager",
    vocab_size=72, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=32, sliding_window=4)).eval()
with_window = hf_logits(mistral, TOKENS[:8])
mistral.config.sliding_window = None
check(float((hf_logits(mistral, TOKENS[:8]) - with_window).abs().max()) > 1e-3,
      "mistral: transformers applies the sliding window of 4 (its logits change without it)")
mistral.config.sliding_window = 4
md, mhf, _, _ = family("mistral", mistral, attn="eager")
gemma = tf.GemmaForCausalLM(tf.GemmaConfig(initializer_range=INIT,
    vocab_size=88, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=1, head_dim=8, max_position_embeddings=40, hidden_act="gelu_pytorch_tanh"))
with torch.no_grad():  # its norms start at 0 (1 + w): move them off
    for n, p in gemma.named_parameters():
        if n.endswith("norm.weight"):
            p.add_(0.1 * torch.randn_like(p))
_, gehf, _, _ = family("gemma", gemma)
# heads of a width of their own: 4 x 12 over hidden_size 32 (model.head_dim)
gemma_hd = tf.GemmaForCausalLM(tf.GemmaConfig(initializer_range=INIT,
    vocab_size=88, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=12, max_position_embeddings=40, hidden_act="gelu_pytorch_tanh"))
with torch.no_grad():
    for n, p in gemma_hd.named_parameters():
        if n.endswith("norm.weight"):
            p.add_(0.1 * torch.randn_like(p))
family("gemma-head-dim", gemma_hd)
# Mixtral: every block a mixture of 4 SwiGLU experts, top 2 by softmax (model.moe)
mxd, mxhf, _, _ = family("mixtral", tf.MixtralForCausalLM(tf.MixtralConfig(initializer_range=INIT,
    vocab_size=90, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=40, num_local_experts=4, num_experts_per_tok=2,
    sliding_window=None)))
# Qwen2-MoE: q/k/v biases, 4 experts top 2 by softmax kept as they are (norm_topk_prob false), a shared
# expert of its own width behind a sigmoid gate; the first block dense (mlp_only_layers)
family("qwen2-moe", tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(initializer_range=INIT,
    vocab_size=90, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40, num_experts=4,
    num_experts_per_tok=2, mlp_only_layers=[0])))
family("gpt2-untied", tf.GPT2LMHeadModel(tf.GPT2Config(initializer_range=INIT,
    vocab_size=64, n_positions=24, n_embd=16, n_layer=1, n_head=2, n_inner=40, tie_word_embeddings=False)))

# --seq-len cuts GPT-2's position table to its first rows
r = pw("import-hf", ghf, "--job-out", f"{gd}/short.json", "--out", f"{gd}/short.safetensors", "--seq-len", "16")
short = load_file(f"{gd}/short.safetensors")["embed.pos.weight"]
check(torch.equal(short, load_file(gck)["embed.pos.weight"][:16]), "gpt2: --seq-len 16 keeps wpe's first 16 rows")

# sharded and bfloat16 saves
model = tf.LlamaForCausalLM.from_pretrained(lhf)
model.save_pretrained(f"{ld}/sharded", max_shard_size="20KB", safe_serialization=True)
has_index = os.path.exists(f"{ld}/sharded/model.safetensors.index.json")
pw("import-hf", f"{ld}/sharded", "--job-out", f"{ld}/sh.json", "--out", f"{ld}/sh.safetensors", "--name", "llama")
check(has_index and same_tensors(lck, f"{ld}/sh.safetensors"), "llama: a sharded save imports to the same tensors")
model.to(torch.bfloat16).save_pretrained(f"{ld}/bf16", safe_serialization=True)
pw("import-hf", f"{ld}/bf16", "--job-out", f"{ld}/bf.json", "--out", f"{ld}/bf.safetensors")
ours, full = load_file(f"{ld}/bf.safetensors"), load_file(lck)
check(all(torch.equal(ours[k], full[k].bfloat16().float()) for k in full),
      "llama: a bfloat16 save imports widened exactly")

# the imported GPT-2 job (vocab_size 256: the example corpus) trains
r = pw("train", "--job", gjob, "--init", gck, "--steps", "2", "--out", f"{gd}/trained.safetensors", "--quiet")
check(os.path.exists(f"{gd}/trained.safetensors"), "gpt2: the imported job trains 2 steps from its checkpoint")
# ... and its fine-tune, exported, loads in transformers with pipewright's logits
pw("export-hf", "--job", gjob, "--checkpoint", f"{gd}/trained.safetensors", "--out", f"{gd}/ft")
ids = [ord(c) for c in "It is a truth"]
got = pw_logits(gjob, f"{gd}/trained.safetensors", ids, f"{gd}/ft-lg.safetensors")
ft = hf_logits(tf.AutoModelForCausalLM.from_pretrained(f"{gd}/ft").eval(), ids)
moved = float((ft - hf_logits(tf.GPT2LMHeadModel.from_pretrained(ghf).eval(), ids)).abs().max())
check(rel(got, ft) <= 1e-4 and moved > 0,
      f"gpt2: the exported fine-tune's logits in transformers equal pipewright's ({rel(got, ft):.2e}; moved {moved:.2e})")

# Qwen3 (not in transformers 4.49): a directory made here from the Qwen2
# model's tensors without biases, with q_norm / k_norm
q3 = os.path.join(TMP, "qwen3", "hf")
os.makedirs(q3)
cfg = json.load(open(f"{qhf}/config.json"))
cfg.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=8, attention_bias=False)
json.dump(cfg, open(f"{q3}/config.json", "w"))
t = {k: v for k, v in load_file(f"{qhf}/model.safetensors").items() if not k.endswith("_proj.bias")}
for i in range(2):
    t[f"model.layers.{i}.self_attn.q_norm.weight"] = torch.randn(8)
    t[f"model.layers.{i}.self_attn.k_norm.weight"] = torch.randn(8)
save_file(t, f"{q3}/model.safetensors", metadata={"format": "pt"})
pw("import-hf", q3, "--job-out", f"{q3}/../job.json", "--out", f"{q3}/../ck.safetensors", "--name", "q3")
spec = json.load(open(f"{q3}/../job.json"))["model"]
ck = load_file(f"{q3}/../ck.safetensors")
check(spec.get("qk_norm") is True and torch.equal(ck["blocks.1.attn.k_norm.weight"],
                                                  t["model.layers.1.self_attn.k_norm.weight"]),
      "qwen3: qk_norm and its norms imported")
pw("export-hf", "--job", f"{q3}/../job.json", "--checkpoint", f"{q3}/../ck.safetensors", "--out", f"{q3}/../ex")
pw("import-hf", f"{q3}/../ex", "--job-out", f"{q3}/../job2.json", "--out", f"{q3}/../ck2.safetensors", "--name", "q3")
check(json.load(open(f"{q3}/../job2.json"))["model"] == spec and
      same_tensors(f"{q3}/../ck.safetensors", f"{q3}/../ck2.safetensors") and
      json.load(open(f"{q3}/../ex/config.json"))["architectures"] == ["Qwen3ForCausalLM"],
      "qwen3: export -> import gives the same spec and tensors")

# refused by name, nothing written
def setk(k, v):
    return lambda c: c.__setitem__(k, v)


refuse("llama hidden_act gelu", variant(lhf, "act", setk("hidden_act", "gelu")), "hidden_act")
refuse("llama attention_bias", variant(lhf, "ab", setk("attention_bias", True)), "attention_bias")
refuse("llama mlp_bias", variant(lhf, "mb", setk("mlp_bias", True)), "mlp_bias")
refuse("rope_scaling linear", variant(lhf, "rs", setk("rope_scaling", {"rope_type": "linear", "factor": 2.0})),
       "rope_scaling.rope_type")
refuse("an unknown field", variant(lhf, "unk", setk("altup_coef", 3)), "altup_coef")
refuse("head_dim odd", variant(lhf, "hd", setk("head_dim", 7)), "head_dim")
refuse("head_dim 16: q_proj is 32 rows, not 4 x 16", variant(lhf, "hd16", setk("head_dim", 16)),
       "model.layers.0.self_attn.q_proj.weight")
refuse("gpt2 activation gelu", variant(ghf, "gelu", setk("activation_function", "gelu")), "activation_function")
refuse("gpt2 scale_attn_by_inverse_layer_idx", variant(ghf, "inv", setk("scale_attn_by_inverse_layer_idx", True)),
       "scale_attn_by_inverse_layer_idx")
refuse("mistral sliding_window 0", variant(mhf, "sw", setk("sliding_window", 0)), "sliding_window")
refuse("qwen2 use_sliding_window", variant(qhf, "usw", setk("use_sliding_window", True)), "use_sliding_window")
refuse("gemma hidden_act gelu (erf)", variant(gehf, "gact", setk("hidden_act", "gelu")), "hidden_act")
refuse("gemma head_dim absent (GemmaConfig's 256: q_proj 1024 rows)", variant(gehf, "ghd", lambda c: c.pop("head_dim")),
       "model.layers.0.self_attn.q_proj.weight")
refuse("mixtral router_jitter_noise", variant(mxhf, "jit", setk("router_jitter_noise", 0.1)), "router_jitter_noise")
refuse("mixtral output_router_logits", variant(mxhf, "orl", setk("output_router_logits", True)), "output_router_logits")
refuse("mixtral top-k above the experts", variant(mxhf, "topk", setk("num_experts_per_tok", 5)), "num_experts_per_tok")
refuse("mixtral: an expert's tensor missing", variant(mxhf, "mxmiss", edit_tensors=lambda t: t.pop(
    "model.layers.1.block_sparse_moe.experts.3.w2.weight")), "model.layers.1.block_sparse_moe.experts.3.w2.weight")
refuse("an unknown architecture", variant(lhf, "arch", setk("architectures", ["Gemma2ForCausalLM"])), "Gemma2ForCausalLM")
refuse("a missing tensor", variant(lhf, "miss", edit_tensors=lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
       "model.layers.1.mlp.up_proj.weight")
refuse("a wrong shape", variant(lhf, "shape", edit_tensors=lambda t: t.__setitem__(
    "model.layers.0.self_attn.k_proj.weight", torch.zeros(32, 32))), "model.layers.0.self_attn.k_proj.weight")
refuse("an extra tensor", variant(lhf, "extra", edit_tensors=lambda t: t.__setitem__(
    "model.layers.0.mlp.up_proj.bias", torch.zeros(48))), "model.layers.0.mlp.up_proj.bias")
refuse("a tied lm_head that differs", variant(qhf, "tie", edit_tensors=lambda t: t.__setitem__(
    "lm_head.weight", torch.zeros(80, 32))), "lm_head.weight")

print(f"hf_ref: {len(failures)} failure(s), {time.time() - t0:.1f} s ({gen_s:.1f} s of them the greedy generation)")
sys.exit(1 if failures else 0)
