#!/usr/bin/env bash
# test_torch_ref: pipewright's single-process trainer against PyTorch.
#
#   bash tests/ref/test_torch_ref.sh BUILD_DIR SOURCE_DIR      (ctest runs it so)
#
# For gpt, llama, llama's attention options and Gemma's (tests/ref/jobs/*-ref.json): pipewright writes its initial
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

# gpt and llama: 20 steps to compare.py's defaults; llama's attention
# options, each a tiny job of 3 steps, losses to 1e-5: llama-gqa
# (n_kv_heads 2 of 4, Llama-3's rope_scaling), qwen2 (qkv_bias, one kv
# head, tied), qwen3 (qk_norm, n_kv_heads 2), gemma (Gemma's options:
# mlp_act gelu_tanh, embed_scale, norm_offset 1; one kv head, tied,
# 7.6e-6 measured), weights to 1e-4 of each
# tensor's largest — but llama-gqa's to 2e-3: AdamW divides each update by
# the gradient's own size, so an element whose gradient is ~0 by
# cancellation moves by ~lr in the direction of its rounding noise (1.6e-3
# in one element of its attn.proj at seed 1). The same job under SGD
# (llama-gqa-sgd, no such division) holds its weights to 1e-5: the
# gradients themselves agree.
# The mixtures of experts (model.moe): llama-moe (4 SwiGLU experts, top 2
# by softmax) to 1e-5 / 1e-4; gpt-moe (GELU experts, DeepSeek's sigmoid
# gates with a routed scale, a shared expert, every other block) under SGD
# to 1e-5 — its AdamW run to gpt's 1e-3: the same run without the mixture
# is 1.3e-4 off at 3 steps in mlp.proj (AdamW's division again), the
# mixture's own tensors within 1e-4.
# mistral: a sliding window of 5 over 16 positions, heads 12 wide over
# d_model 32 / 4 heads (model.head_dim), grouped-query, to 1e-5 / 1e-4.
for model in gpt llama llama-gqa llama-gqa-sgd qwen2 qwen3 gemma mistral llama-moe gpt-moe gpt-moe-sgd; do
  job=$REF/jobs/$model-ref.json
  tol=()
  case $model in
    gpt|llama) ;;
    llama-gqa) tol=(--loss-rtol 1e-5 --weight-rtol 2e-3) ;;
    llama-gqa-sgd|gpt-moe-sgd) tol=(--loss-rtol 1e-5 --weight-rtol 1e-5) ;;
    gpt-moe) tol=(--loss-rtol 1e-5 --weight-rtol 1e-3) ;;
    *) tol=(--loss-rtol 1e-5 --weight-rtol 1e-4) ;;
  esac
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
  if [ "$model" = qwen2 ]; then
    # The k part of attn.qkv.bias has a gradient that is zero in exact
    # arithmetic (softmax ignores a per-row constant): AdamW turns each
    # run's rounding noise into steps of ~lr, so it is left out; the q and
    # v parts are compared as tensors of their own.
    for f in "$d/pw.safetensors" "$d/ref.safetensors"; do
      PYTHONPATH=$REF "$PY" - "$f" "$job" <<'PYEOF' || { fail=1; continue 2; }
import json, sys
import st
t, meta = st.load(sys.argv[1])
m = json.load(open(sys.argv[2]))["model"]
d, hd = m["d_model"], m["d_model"] // m["n_heads"]
kw = m.get("n_kv_heads", m["n_heads"]) * hd
for n in [n for n in t if n.endswith("attn.qkv.bias")]:
    b = t.pop(n)
    t[n + ".q"], t[n + ".v"] = b[:d].copy(), b[d + kw:].copy()
st.save(sys.argv[1], t)
PYEOF
    done
  fi
  step "$model: compare"
  "$PY" "$REF/compare.py" --label "$model" "${tol[@]}" \
      --a-losses "$d/pw.jsonl" --a-final "$d/pw.safetensors" \
      --b-losses "$d/ref.jsonl" --b-final "$d/ref.safetensors" || fail=1
done

echo
if [ $fail -ne 0 ]; then
  echo "test_torch_ref: FAIL"
  exit 1
fi
echo "test_torch_ref: ok"
