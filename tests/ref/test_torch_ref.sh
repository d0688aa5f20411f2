#!/usr/bin/env bash
# test_torch_ref: pipewright's single-process trainer against PyTorch.
#
#   bash tests/ref/test_torch_ref.sh BUILD_DIR SOURCE_DIR      (ctest runs it so)
#
# For gpt and llama (tests/ref/jobs/*-ref.json): pipewright writes its initial
# parameters (train --steps 0) and trains 20 AdamW steps with warmup, cosine
# decay and clipping (--log-json); tests/ref/torch_ref.py, an independent
# PyTorch implementation of docs/contracts.md's contracts, loads the same initial
# safetensors and trains on the same sequential batches; compare.py requires
# per-step losses within 1e-4 relative and every final tensor within 1e-3
# (max|a-b| / max|b| per tensor). Before that the reference checks itself
# (st.py round trip; torch_ref.py --self-check: ln V at step 0, falling loss,
# microbatch invariance, the gpt block against nn.TransformerEncoderLayer,
# RoPE against complex rotation, and the comparison rejecting a run with a
# wrong beta2), so a broken reference cannot pass vacuously.
# Exit 0 pass, 1 mismatch or error, 77 skip (no PyTorch, or no corpus).
set -u

NAME=test_torch_ref
. "$(dirname "$0")/ref_env.sh"
fail=0

step() { echo; echo "### $*"; }
run() {  # run CMD..., show its output only on failure
  local log=$TMP/cmd.log
  if ! "$@" >"$log" 2>&1; then
    cat "$log"
    echo "FAILED: $*"
    return 1
  fi
}

step "st.py: safetensors round trip"
"$PY" "$REF/st.py" --self-test || exit 1

step "torch_ref.py --self-check (gpt, llama)"
"$PY" "$REF/torch_ref.py" --self-check --job "$REF/jobs/gpt-ref.json" --job "$REF/jobs/llama-ref.json" \
    --data-root "$SRC" || exit 1

if [ ! -x "$PW" ]; then
  echo "FAILED: $PW is not built"
  exit 1
fi

for model in gpt llama; do
  job=$REF/jobs/$model-ref.json
  d=$TMP/$model
  mkdir -p "$d"
  step "$model: pipewright initial parameters"
  (cd "$SRC" && run "$PW" train --job "$job" --steps 0 --out "$d/init.safetensors") || { fail=1; continue; }
  echo "$("$PY" "$REF/st.py" "$d/init.safetensors" | grep -vc "^metadata:") tensors"
  step "$model: pipewright train"
  (cd "$SRC" && run "$PW" train --job "$job" --out "$d/pw.safetensors" --log-json "$d/pw.jsonl") \
    || { fail=1; continue; }
  step "$model: torch reference"
  run "$PY" "$REF/torch_ref.py" --job "$job" --init "$d/init.safetensors" --data-root "$SRC" \
      --losses "$d/ref.jsonl" --out "$d/ref.safetensors" || { fail=1; continue; }
  step "$model: compare"
  "$PY" "$REF/compare.py" --label "$model" \
      --a-losses "$d/pw.jsonl" --a-final "$d/pw.safetensors" \
      --b-losses "$d/ref.jsonl" --b-final "$d/ref.safetensors" || fail=1
done

echo
if [ $fail -ne 0 ]; then
  echo "test_torch_ref: FAIL"
  exit 1
fi
echo "test_torch_ref: ok"
