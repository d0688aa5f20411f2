#!/usr/bin/env bash
# test_lora_ref: a LoRA fine-tune against a PyTorch LoRA reference.
#
#   bash tests/ref/test_lora_ref.sh BUILD_DIR SOURCE_DIR      (ctest runs it so)
#
# A base gpt (tests/ref/jobs/gpt-ref.json) trains 5 steps; its checkpoint
# is the `--init` of gpt-lora-ref.json (model.lora: rank 4, alpha 8 on
# blocks.*.attn.qkv, blocks.*.mlp.fc and lm_head; no train.trainable, so
# only the adapters train). pipewright writes the fine-tune's initial
# parameters (the base's, plus adapters drawn from the seed) and trains 20
# steps; torch_ref.py loads those, adds y += lora_B(lora_A(x)) * alpha/r on
# the same layers (PEFT's lora.Linear), trains only the adapters.
# Asserts: losses within 1e-5 relative, final tensors within 1e-3; every
# base tensor unchanged bit for bit; the initial lora_B zero and lora_A
# inside PEFT's kaiming-uniform bound 1/sqrt(in_features) (and not zero);
# the optimizer file holds only adapters. Then `pipewright export`:
# --adapters writes PEFT's adapter_model.safetensors (the adapters under
# base_model.model.<name>, bit for bit) and adapter_config.json (LORA, r 4,
# lora_alpha 8, the five adapted layers); --merge-lora writes the base
# tensors with W + (alpha/r) B A (numpy, 1e-6) and no adapters, and
# `pipewright eval` of the merged file with the base job gives the LoRA
# model's eval loss (1e-5 relative).
# Exit 0 pass, 1 mismatch or error, 77 skip (no PyTorch, or no corpus).
set -u

NAME=test_lora_ref
. "$(dirname "$0")/ref_env.sh"
[ -x "$PW" ] || { echo "FAILED: $PW is not built"; exit 1; }
job=$REF/jobs/gpt-lora-ref.json
d=$TMP

cd "$SRC" || exit 1
{ "$PW" train --job "$REF/jobs/gpt-ref.json" --steps 5 --out "$d/base.safetensors" --quiet &&
  "$PW" train --job "$job" --init "$d/base.safetensors" --steps 0 --out "$d/init.safetensors" &&
  "$PW" train --job "$job" --init "$d/base.safetensors" --out "$d/pw.safetensors" --log-json "$d/pw.jsonl"
} >"$d/log" 2>&1 || { cat "$d/log"; echo "FAILED: pipewright train"; exit 1; }
torch_compare "$job" "$d" lora || exit 1

"$PY" - "$d" "$REF" <<'PYEOF' || exit 1
import math, sys
import numpy as np
d, ref = sys.argv[1], sys.argv[2]
sys.path.insert(0, ref)
import st
base, _ = st.load(f"{d}/base.safetensors")
init, _ = st.load(f"{d}/init.safetensors")
final, _ = st.load(f"{d}/pw.safetensors")
optim, _ = st.load(f"{d}/pw.optim.safetensors")
ad = sorted(n for n in init if ".lora_" in n)
want = sorted(f"{l}.lora_{ab}.weight" for l in ["blocks.0.attn.qkv", "blocks.1.attn.qkv", "blocks.0.mlp.fc",
                                                 "blocks.1.mlp.fc", "lm_head"] for ab in "AB")
if ad != want:
    sys.exit(f"FAILED: adapters {ad}, want {want}")
changed = [n for n in base if base[n].tobytes() != final[n].tobytes() or base[n].tobytes() != init[n].tobytes()]
if changed:
    sys.exit(f"FAILED: base tensors changed: {changed}")
for n in ad:
    if n.endswith("lora_B.weight") and np.any(init[n] != 0):
        sys.exit(f"FAILED: {n} does not start at zero")
    if n.endswith("lora_A.weight"):
        bound = 1 / math.sqrt(init[n].shape[1])
        a = np.abs(init[n])
        if a.max() > bound or a.max() < 0.5 * bound:
            sys.exit(f"FAILED: {n}: max |A| {a.max()} vs bound {bound}")
    if np.array_equal(init[n], final[n]):
        sys.exit(f"FAILED: adapter {n} did not train")
if sorted(optim) != sorted([f"exp_avg.{n}" for n in ad] + [f"exp_avg_sq.{n}" for n in ad]):
    sys.exit(f"FAILED: optimizer file holds {sorted(optim)}")
print(f"{len(ad)} adapters trained, {len(base)} base tensors unchanged")
PYEOF

{ "$PW" export --job "$job" --checkpoint "$d/pw.safetensors" --adapters "$d/peft" &&
  "$PW" export --job "$job" --checkpoint "$d/pw.safetensors" --merge-lora "$d/merged.safetensors" &&
  "$PW" eval --job "$job" --checkpoint "$d/pw.safetensors" >"$d/eval-lora" &&
  "$PW" eval --job "$REF/jobs/gpt-ref.json" --checkpoint "$d/merged.safetensors" >"$d/eval-merged"
} >"$d/log" 2>&1 || { cat "$d/log"; echo "FAILED: pipewright export / eval"; exit 1; }
"$PY" - "$d" "$REF" <<'PYEOF' || exit 1
import json, sys
import numpy as np
d, ref = sys.argv[1], sys.argv[2]
sys.path.insert(0, ref)
import st
final, _ = st.load(f"{d}/pw.safetensors")
peft, _ = st.load(f"{d}/peft/adapter_model.safetensors")
cfg = json.load(open(f"{d}/peft/adapter_config.json"))
merged, _ = st.load(f"{d}/merged.safetensors")
ad = sorted(n for n in final if ".lora_" in n)
if sorted(peft) != sorted("base_model.model." + n for n in ad):
    sys.exit(f"FAILED: PEFT names {sorted(peft)}")
if any(peft["base_model.model." + n].tobytes() != final[n].tobytes() for n in ad):
    sys.exit("FAILED: PEFT tensors differ from the checkpoint's")
layers = sorted({n.rsplit(".lora_", 1)[0] for n in ad})
if cfg.get("peft_type") != "LORA" or cfg.get("r") != 4 or cfg.get("lora_alpha") != 8 or \
        sorted(cfg.get("target_modules", [])) != layers:
    sys.exit(f"FAILED: adapter_config.json {cfg}")
if sorted(merged) != sorted(n for n in final if ".lora_" not in n):
    sys.exit(f"FAILED: merged file holds {sorted(merged)}")
for n in merged:
    want = final[n]
    l = n[:-len(".weight")]
    if l in layers and n.endswith(".weight"):
        want = want + (8 / 4) * (final[l + ".lora_B.weight"] @ final[l + ".lora_A.weight"])
    err = np.abs(merged[n] - want).max() / (np.abs(want).max() + 1e-8)
    if err > 1e-6:
        sys.exit(f"FAILED: merged {n} off by {err}")
ev = [float(open(f"{d}/{k}").read().split()[2]) for k in ("eval-lora", "eval-merged")]
if abs(ev[0] - ev[1]) > 1e-5 * abs(ev[0]):
    sys.exit(f"FAILED: eval loss LoRA {ev[0]} vs merged {ev[1]}")
print(f"exported {len(ad)} adapters for PEFT; merged eval loss {ev[1]} = LoRA {ev[0]}")
PYEOF
echo "test_lora_ref: ok"
