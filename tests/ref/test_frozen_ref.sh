#!/usr/bin/env bash
# test_frozen_ref: train.trainable against PyTorch's requires_grad=False.
#
#   bash tests/ref/test_frozen_ref.sh BUILD_DIR SOURCE_DIR      (ctest runs it so)
#
# tests/ref/jobs/gpt-frozen-ref.json is gpt-ref with train.trainable
# ["blocks.1.*", "ln_f.*", "lm_head.weight"]: the embeddings and blocks.0
# are frozen. pipewright trains it 20 AdamW steps; torch_ref.py loads the
# same initial parameters, sets requires_grad=False on the parameters no
# pattern matches and trains the rest (clip_grad_norm_ over those).
# Asserts: per-step losses within 1e-5 relative and final tensors within
# compare.py's 1e-3; every frozen tensor of pipewright's final checkpoint
# equal to its initial value bit for bit, every trainable one changed; the
# optimizer file holds exp_avg/exp_avg_sq of exactly the trainable ones.
# Exit 0 pass, 1 mismatch or error, 77 skip (no PyTorch, or no corpus).
set -u

NAME=test_frozen_ref
. "$(dirname "$0")/ref_env.sh"
[ -x "$PW" ] || { echo "FAILED: $PW is not built"; exit 1; }
job=$REF/jobs/gpt-frozen-ref.json
d=$TMP

cd "$SRC" || exit 1
"$PW" train --job "$job" --steps 0 --out "$d/init.safetensors" >"$d/log" 2>&1 &&
  "$PW" train --job "$job" --out "$d/pw.safetensors" --log-json "$d/pw.jsonl" >>"$d/log" 2>&1 ||
  { cat "$d/log"; echo "FAILED: pipewright train"; exit 1; }
torch_compare "$job" "$d" frozen || exit 1

"$PY" - "$d" "$REF" <<'PYEOF' || exit 1
import fnmatch, sys
import numpy as np
d, ref = sys.argv[1], sys.argv[2]
sys.path.insert(0, ref)
import st
init, _ = st.load(f"{d}/init.safetensors")
final, _ = st.load(f"{d}/pw.safetensors")
optim, _ = st.load(f"{d}/pw.optim.safetensors")
pats = ["blocks.1.*", "ln_f.*", "lm_head.weight"]
train = sorted(n for n in init if any(fnmatch.fnmatchcase(n, p) for p in pats))
frozen = sorted(n for n in init if n not in train)
bad = [n for n in frozen if init[n].tobytes() != final[n].tobytes()]
stuck = [n for n in train if np.array_equal(init[n], final[n])]
want = sorted([f"exp_avg.{n}" for n in train] + [f"exp_avg_sq.{n}" for n in train])
print(f"{len(frozen)} frozen tensors, {len(train)} trainable, {len(optim)} optimizer tensors")
if not any(n.startswith("embed.") for n in frozen) or not any(n.startswith("blocks.0.") for n in frozen):
    sys.exit("FAILED: the job does not freeze embed.* and blocks.0.*")
if bad:
    sys.exit(f"FAILED: frozen tensors changed: {bad}")
if stuck:
    sys.exit(f"FAILED: trainable tensors did not change: {stuck}")
if sorted(optim) != want:
    sys.exit(f"FAILED: optimizer file holds {sorted(optim)}, want {want}")
PYEOF
echo "test_frozen_ref: ok"
