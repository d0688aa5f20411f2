"""hf_ref_v5: `pipewright import-hf` / `export-hf` against transformers 5.

    PYTHON tests/ref/hf_ref_v5.py PIPEWRIGHT SOURCE_DIR TMP

test_hf_ref_v5.sh runs it with the torch-2 environment of
bench/torch2_venv.sh (PyTorch 2.15 and transformers 5.24.0 from PyPI: about
2 GB, so CI, whose PyTorch is Debian's 1.13, does not make it and the test
is an expected skip there; hf_ref.py covers the other families against
transformers 4.49.0 in CI). It checks what 4.49 cannot:
  - Qwen3 (qk_norm, no biases, grouped-query heads), and Qwen3-MoE (its
    mixtures of experts, model.moe, both gates, a first dense block, heads
    wider than d / heads): made and saved by
    transformers itself, its imported logits equal transformers' to 1e-4 of
    the largest, greedy generation equals transformers' generate token for
    token, export -> import gives the same spec and tensors, and
    transformers loads the export with the same logits;
  - the config files transformers 5 writes (`dtype` for torch_dtype,
    `rope_parameters` for rope_theta and rope_scaling, `layer_types`): a
    Llama with Llama-3 rope scaling and a Qwen2 saved by transformers 5
    import to the logits transformers gives, and a rope_parameters that
    contradicts rope_theta is refused by name.
"""
import json
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file
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
PROMPTS = [TOKENS[4:5], TOKENS[:4], TOKENS]
NEW = 12
INIT = 0.3  # initializer_range: well-separated logits, varied text (hf_ref.py says why)


def greedy(name, model, job, ck):
    for p in PROMPTS:
        ids = [x % model.config.vocab_size for x in p]
        x = torch.tensor([ids])
        with torch.no_grad():
            o = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, min_new_tokens=NEW,
                               do_sample=False, eos_token_id=None, output_logits=True, return_dict_in_generate=True)
        ref = o.sequences[0, len(ids):].tolist()
        lg = torch.stack(o.logits)[:, 0].float()
        top = lg.topk(2, dim=-1).values
        gap = top[:, 0] - top[:, 1]
        tol = 1e-5 * lg.abs().max(dim=-1).values.clamp(min=1)
        tied = [k for k in range(len(ref)) if gap[k] < tol[k]]
        n = tied[0] if tied else NEW
        r = pw("generate", "--job", job, "--checkpoint", ck, "--prompt-tokens", ",".join(map(str, ids)),
               "--max-tokens", str(NEW))
        got = [int(v) for v in r.stdout.strip().split(",") if v]
        what = f"{name}: greedy {NEW} after {len(ids)} token(s) equal transformers' generate"
        if tied:
            what += f"; NOTE step {n}'s top two logits are {float(gap[n]):.1e} apart: compared steps 0..{n - 1} only"
        check(len(ref) == NEW and ref == lg.argmax(-1).tolist() and got[:n] == ref[:n],
              what + ("" if got[:n] == ref[:n] else f"\n       pipewright:   {got}\n       transformers: {ref}"))


def family(name, model, gen=True):
    d = os.path.join(TMP, name)
    hf = os.path.join(d, "hf")
    model.eval().save_pretrained(hf)
    cfg = json.load(open(os.path.join(hf, "config.json")))
    job, ck = os.path.join(d, "job.json"), os.path.join(d, "ck.safetensors")
    pw("import-hf", hf, "--job-out", job, "--out", ck, "--name", name)
    ids = [t % model.config.vocab_size for t in TOKENS]
    ref = hf_logits(model, ids)
    got = pw_logits(job, ck, ids, os.path.join(d, "lg.safetensors"))
    e = rel(got, ref)
    check(got.shape == ref.shape and e <= 1e-4,
          f"{name}: logits equal transformers {tf.__version__}'s ({e:.2e} of the largest; its config has "
          f"{', '.join(k for k in ('dtype', 'rope_parameters', 'layer_types') if k in cfg)})")
    ex = os.path.join(d, "export")
    pw("export-hf", "--job", job, "--checkpoint", ck, "--out", ex)
    job2, ck2 = os.path.join(d, "job2.json"), os.path.join(d, "ck2.safetensors")
    pw("import-hf", ex, "--job-out", job2, "--out", ck2, "--name", name)
    check(json.load(open(job))["model"] == json.load(open(job2))["model"] and same_tensors(ck, ck2),
          f"{name}: export -> import gives the same model spec and every tensor bit for bit")
    back = tf.AutoModelForCausalLM.from_pretrained(ex).eval()
    e2 = float((hf_logits(back, ids) - ref).abs().max())
    check(e2 == 0, f"{name}: transformers {tf.__version__} loads the export with the original's logits "
                   f"(max diff {e2:.1e})")
    if gen:
        greedy(name, model, job, ck)
    return hf


family("qwen3", tf.Qwen3ForCausalLM(tf.Qwen3Config(
    initializer_range=INIT, vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64, rope_theta=1000000.0)))
# Qwen3-MoE (a mixture of experts: model.moe): softmax gates over all experts kept as they are
# (norm_topk_prob false, transformers' default) on every block; and renormalised top-k after a first
# dense block (mlp_only_layers [0])
family("qwen3-moe", tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
    initializer_range=INIT, vocab_size=90, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=40,
    num_experts=4, num_experts_per_tok=2)))
family("qwen3-moe-topk", tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
    initializer_range=INIT, vocab_size=90, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=40,
    num_experts=6, num_experts_per_tok=3, norm_topk_prob=True, mlp_only_layers=[0])), gen=False)
lhf = family("llama3-rope", tf.LlamaForCausalLM(tf.LlamaConfig(
    initializer_range=INIT, vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 16})), gen=False)
family("qwen2", tf.Qwen2ForCausalLM(tf.Qwen2Config(
    initializer_range=INIT, vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=48, tie_word_embeddings=True)),
    gen=False)

# a rope_parameters that contradicts rope_theta: refused by name, nothing written
bad = os.path.join(TMP, "bad")
shutil.copytree(lhf, bad)
c = json.load(open(f"{bad}/config.json"))
c["rope_theta"] = 10000.0
json.dump(c, open(f"{bad}/config.json", "w"))
r = pw("import-hf", bad, "--job-out", f"{TMP}/bad.json", "--out", f"{TMP}/bad.safetensors", ok=False)
check(r.returncode == 1 and "rope_parameters" in r.stderr and not os.path.exists(f"{TMP}/bad.json")
      and not os.path.exists(f"{TMP}/bad.safetensors"),
      f"refused, rope_theta contradicting rope_parameters: {r.stderr.strip()[:120]}")

print(f"hf_ref_v5: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
