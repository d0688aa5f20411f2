#!/usr/bin/env bash
# test_generate_ref: `pipewright generate` against a PyTorch KV-cache decode.
#
#   bash tests/ref/test_generate_ref.sh BUILD_DIR SOURCE_DIR      (ctest runs it so)
#
# For gpt (untied) and llama (tied) (tests/ref/jobs/*-ref.json, trained
# 300 steps by `pipewright train` so that the text is not one repeated
# byte): tests/ref/generate_ref.py, a KV-cache implementation of the
# contract in PyTorch over the same checkpoint, must give the same greedy
# tokens, and, with its own implementation of the contract's sampler and
# RNG, the same seeded sample (temperature, top-k and top-p together).
# Before that it checks itself (its cache against full recompute, its
# greedy against a naive decode). Also: --prompt TEXT prints the bytes of
# the ids --prompt-tokens prints; a step folder of stage files (the model
# file split in two) generates what the file does; a prompt longer than
# seq_len and a --max-tokens past it are refused with exit 1 and a message.
# Exit 0 pass, 1 mismatch or error, 77 skip (no PyTorch, or no corpus).
set -u

NAME=test_generate_ref
. "$(dirname "$0")/ref_env.sh"
if [ ! -x "$PW" ]; then
  echo "FAILED: $PW is not built"
  exit 1
fi
fail=0
PROMPT="The ship "
IDS=$("$PY" -c 'import sys; print(",".join(str(b) for b in sys.argv[1].encode()))' "$PROMPT")
SAMPLE=(--temperature 0.8 --top-k 40 --top-p 0.9 --seed 7)

step() { echo; echo "### $*"; }
same() {  # same LABEL A B
  if [ "$2" != "$3" ]; then
    echo "FAILED $1:"
    echo "  pipewright: $2"
    echo "  reference:  $3"
    fail=1
  else
    echo "ok $1: $2"
  fi
}

step "generate_ref.py --self-check (gpt, llama)"
"$PY" "$REF/generate_ref.py" --self-check --job "$REF/jobs/gpt-ref.json" --job "$REF/jobs/llama-ref.json" || exit 1

for name in gpt-tie-false llama-tie-true; do  # test_decode covers the other two at the unit level
  model=${name%%-*} tie=${name##*-}
  job=$TMP/$name.json
  ckpt=$TMP/$name.safetensors
  "$PY" - "$REF/jobs/$model-ref.json" "$job" "$tie" "$SRC" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
j["model"]["tie_embeddings"] = sys.argv[3] == "true"
j["train"]["steps"] = 300
j["train"]["optimizer"].update(lr=3e-3, warmup_steps=10)
j["data"]["path"] = sys.argv[4] + "/" + j["data"]["path"]
json.dump(j, open(sys.argv[2], "w"))
EOF
  step "$name: pipewright train"
  "$PW" train --job "$job" --out "$ckpt" --quiet || { echo "FAILED: pipewright train"; exit 1; }
  greedy=$("$PW" generate --job "$job" --checkpoint "$ckpt" --prompt-tokens "$IDS" 2>/dev/null)
  ref=$("$PY" "$REF/generate_ref.py" --job "$job" --checkpoint "$ckpt" --prompt-tokens "$IDS")
  same "$name greedy" "$greedy" "$ref"
  text=$("$PW" generate --job "$job" --checkpoint "$ckpt" --prompt "$PROMPT" 2>/dev/null | "$PY" -c \
    'import sys; print(",".join(str(b) for b in sys.stdin.buffer.read()[:-1]))')
  same "$name --prompt text = --prompt-tokens ids" "$text" "$greedy"
  sampled=$("$PW" generate --job "$job" --checkpoint "$ckpt" --prompt-tokens "$IDS" "${SAMPLE[@]}" 2>/dev/null)
  ref=$("$PY" "$REF/generate_ref.py" --job "$job" --checkpoint "$ckpt" --prompt-tokens "$IDS" "${SAMPLE[@]}")
  same "$name sampled (${SAMPLE[*]})" "$sampled" "$ref"
done

step "a step folder of stage files generates what the whole file does"
job=$TMP/llama-tie-true.json
mkdir -p "$TMP/step-300"
REF=$REF "$PY" - "$TMP/llama-tie-true.safetensors" "$TMP/step-300" <<'EOF'
import os, sys
sys.path.insert(0, os.environ["REF"])
import st
t, _ = st.load(sys.argv[1])
first = {n: a for n, a in t.items() if n.startswith(("embed.", "blocks.0."))}
rest = {n: a for n, a in t.items() if n not in first or n == "embed.tok.weight"}  # tied: both stages hold it
st.save(sys.argv[2] + "/stage-0.safetensors", first, {"step": "300"})
st.save(sys.argv[2] + "/stage-1.safetensors", rest, {"step": "300"})
st.save(sys.argv[2] + "/stage-0.optim.safetensors", {}, {"step": "300"})
EOF
a=$("$PW" generate --job "$job" --checkpoint "$TMP/step-300" --prompt-tokens "$IDS" 2>&1) || fail=1
b=$("$PW" generate --job "$job" --checkpoint "$TMP/llama-tie-true.safetensors" --prompt-tokens "$IDS" 2>&1)
same "step folder" "$(echo "$a" | head -1)" "$(echo "$b" | head -1)"
rm "$TMP/step-300/stage-1.safetensors"
out=$("$PW" generate --job "$job" --checkpoint "$TMP/step-300" --prompt-tokens "$IDS" 2>&1)
rc=$?
same "a folder missing a stage: exit 1 naming a tensor" "$rc $(echo "$out" | grep -c "no stage file of the 1 here holds 'blocks.1")" "1 1"

step "limits: seq_len is 32"
long=$("$PY" -c 'print(",".join(["65"] * 33))')
out=$("$PW" generate --job "$job" --checkpoint "$TMP/llama-tie-true.safetensors" --prompt-tokens "$long" 2>&1)
same "a prompt of 33" "$? $out" "1 error: the prompt is 33 tokens; the model reads at most seq_len = 32"
out=$("$PW" generate --job "$job" --checkpoint "$TMP/llama-tie-true.safetensors" --prompt-tokens "$IDS" --max-tokens 25 2>&1)
same "--max-tokens 25 after 9" "$? $(echo "$out" | head -1)" \
  "1 error: --max-tokens: 25 tokens after a prompt of 9 need 33 positions; seq_len is 32 (at most 24)"
n=$("$PW" generate --job "$job" --checkpoint "$TMP/llama-tie-true.safetensors" --prompt-tokens "$IDS" --max-tokens 24 \
  2>/dev/null | tr ',' '\n' | wc -l)
same "--max-tokens 24 after 9 (the last token is not read back)" "$n" "24"

echo
if [ $fail -ne 0 ]; then
  echo "test_generate_ref: FAIL"
  exit 1
fi
echo "test_generate_ref: ok"
