"""hf_cluster: a Hugging Face model through the cluster and back.

    .venv-hf/bin/python tests/ref/hf_cluster.py BUILD SOURCE_DIR TMP

(test_hf_cluster.sh runs it in deploy/venv.sh hf's environment.) The path a
user takes with a real checkpoint, end to end, on a real coordinator and two
real workers on 127.0.0.1:
  - transformers makes a tiny Llama (grouped-query heads, Llama-3 rope
    scaling; vocabulary 256, so the example corpus is its data as bytes) and
    saves it; `pipewright import-hf` makes its job and checkpoint;
  - the checkpoint is uploaded (POST /v1/checkpoints) and a LoRA fine-tune of
    the imported job is submitted with "init": {"checkpoint": ID}, pipelined
    at pp 2 under zb-h1 (a schedule that splits the backward): the base
    weights without adapters are what the job starts from, the adapters take
    their initialisation (a LoRA job is not refused for tensors the base
    cannot hold);
  - the cluster's final checkpoint equals `pipewright train --init` of the
    same job bit for bit, its base tensors unchanged and its adapters moved;
  - `pipewright export --merge-lora` then `export-hf` of the imported job
    gives a directory transformers loads, whose logits equal pipewright's
    for the merged weights (1e-4 of the largest) and differ from the
    original model's.
"""
import json
import os
import subprocess
import sys

import urllib.request

import torch
from safetensors.torch import load_file
import transformers as tf

BUILD, SRC, TMP = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
import driver  # noqa: E402  (the cluster harness of the integration tests)

PW = os.path.join(BUILD, "pipewright")
check = driver.Checks()


def pw(*args):
    r = subprocess.run([PW, *args], capture_output=True, text=True, cwd=SRC,
                       env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAILED: pipewright {' '.join(args)}")
    return r


def logits_pw(job, ck, ids, out):
    pw("generate", "--job", job, "--checkpoint", ck, "--prompt-tokens", ",".join(map(str, ids)), "--max-tokens", "1",
       "--logits", out)
    return load_file(out)["logits"]


def logits_hf(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


torch.manual_seed(0)
hf = os.path.join(TMP, "hf")
tf.LlamaForCausalLM(tf.LlamaConfig(
    vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=32, rope_theta=500000.0, initializer_range=0.1,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16})).eval().save_pretrained(hf, safe_serialization=True)
base_job, base_ck = os.path.join(TMP, "llama.json"), os.path.join(TMP, "llama.safetensors")
pw("import-hf", hf, "--job-out", base_job, "--out", base_ck, "--name", "llama-hf")

spec = json.load(open(base_job))
spec["data"]["path"] = os.path.join(SRC, spec["data"]["path"]) if not os.path.isabs(spec["data"]["path"]) \
    else spec["data"]["path"]
spec["model"]["lora"] = {"rank": 4, "alpha": 8, "targets": ["blocks.*.attn.qkv", "blocks.*.mlp.down"]}
spec["mesh"] = {"pp": 2, "dp": 1}
spec["schedule"] = {"name": "zb-h1", "microbatches": 2}
spec["train"] = {"steps": 4, "batch_size": 4, "seed": 5, "checkpoint_every": 0,
                 "optimizer": {"name": "adamw", "lr": 1e-2, "warmup_steps": 0}}
lora_job = os.path.join(TMP, "lora.json")
json.dump(spec, open(lora_job, "w"), indent=1)
ref_ck = os.path.join(TMP, "ref.safetensors")
pw("train", "--job", lora_job, "--init", base_ck, "--out", ref_ck, "--quiet")

ctmp = os.path.join(TMP, "cluster")  # its logs: removed when every check passed, else kept and printed
os.makedirs(ctmp)
c = driver.Cluster(BUILD, ctmp, "hfc", data_root=SRC)
try:
    for w in ("w0", "w1"):
        c.start_worker(w)
    check("two workers register", c.wait_idle(2))
    blob = open(base_ck, "rb").read()
    req = urllib.request.Request(c.base + "/v1/checkpoints?name=llama-hf", data=blob, method="POST",
                                 headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        st, up = resp.status, json.loads(resp.read())
    check("the imported checkpoint is stored (201)", st == 201 and up.get("id"), up)
    spec["init"] = {"checkpoint": up.get("id", "")}
    st, r = driver.http(c.base, "/v1/jobs", "POST", spec)
    check("a LoRA job starting from the imported base weights is accepted", st in (200, 201), r)
    jid = r.get("id") if isinstance(r, dict) else None
    job = c.wait_job(jid, 240) if jid else {}
    check("it succeeds on two workers (pp 2, zb-h1)", job.get("state") == "succeeded", job.get("state"))
    got = c.checkpoint(jid) if jid else "no job"
    check("the cluster's checkpoint equals `pipewright train --init` bit for bit",
          driver.bit_diff(got, open(ref_ck, "rb").read()) == "", driver.bit_diff(got, open(ref_ck, "rb").read()))
finally:
    driver.close_cluster(c, ctmp, check, lambda: check.failed)

ref, base = load_file(ref_ck), load_file(base_ck)
check("its base tensors are the imported ones, bit for bit",
      all(torch.equal(ref[k], v) for k, v in base.items()))
check("its adapters moved from their initialisation (lora_B no longer zero)",
      all(float(v.abs().max()) > 0 for k, v in ref.items() if k.endswith("lora_B.weight")))

merged, out = os.path.join(TMP, "merged.safetensors"), os.path.join(TMP, "export")
pw("export", "--job", lora_job, "--checkpoint", ref_ck, "--merge-lora", merged)
pw("export-hf", "--job", base_job, "--checkpoint", merged, "--out", out)
ids = [ord(ch) for ch in "It is a truth"]
ours = logits_pw(base_job, merged, ids, os.path.join(TMP, "lg.safetensors"))
theirs = logits_hf(tf.AutoModelForCausalLM.from_pretrained(out).eval(), ids)
orig = logits_hf(tf.AutoModelForCausalLM.from_pretrained(hf).eval(), ids)
e = float((ours - theirs).abs().max() / theirs.abs().max())
moved = float((theirs - orig).abs().max())
check(f"transformers loads the merged fine-tune with pipewright's logits ({e:.1e} of the largest; "
      f"moved {moved:.1e} from the original)", e <= 1e-4 and moved > 1e-3)
print(f"hf_cluster: {check.passed} passed, {check.failed} failed")
sys.exit(1 if check.failed else 0)
