#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU checks of issue 40 on a machine with an NVIDIA
# GPU (the lent H100/H200: none of our packages there), from a bundle made
# here with the CUDA backend and the GPU tests in it:
#
#   cmake --build build-rel -j2 --target pipewright pipewright-worker pipewright-coordinator test_cuda_ops test_cuda_attn test_cuda_bf16
#   PW_BUNDLE_EXTRA="tests/test_cuda_ops tests/test_cuda_attn tests/test_cuda_bf16" deploy/bundle.sh build-rel .device/pw-gpu.tar.gz
#   (device tool, carry .device)   bash tests/gpu/run.sh .device/pw-gpu.tar.gz
#
# Sized to finish in a few minutes. It runs:
#   1. the kernel tests: every op's CUDA row against the CPU's (test_cuda_ops,
#      test_cuda_attn: 1e-5, each result twice the same bits; test_cuda_bf16:
#      the bf16 rows against the CPU's bf16 rows, linear 1e-5, the
#      attentions 1e-4, round_bf16 bit for bit);
#   2. the gpt and llama templates (and gpt with the tiled attention) trained
#      3 steps by `pipewright train --device cuda` against `--device cpu`:
#      losses and gradient norms to 1e-4, weights to 1e-3 of each tensor's
#      largest (tests/gpu/compare.py says why; float32, TF32 off); a pp 2 pipeline of
#      two workers on the GPU against the single-process GPU run, bit for
#      bit, 1f1b and zb-h1 (tests/gpu/pipeline_gpu.py); the example job
#      gpt-tiny as one process trained 200 steps on the GPU in float32 and
#      in bf16 (train.precision): the final losses within 1 %;
#   3. a GPT-2-small-shaped step (d768, 12 layers, T 1024, batch 8, byte
#      vocabulary) on the GPU: pipewright float32 against PyTorch (the
#      machine's) float32 and bf16 autocast, both with the fused AdamW.
# Prints a summary last; everything goes to bench/results/gpu/ (and $OUT).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
TARBALL=${1:-$SRC/.device/pw-gpu.tar.gz}
X=$(mktemp -d)
tar -C "$X" -xzf "$TARBALL"
D=$(ls -d "$X"/pipewright-*)
PW=$D/bin/pipewright
PY=$(command -v python3)
R=$SRC/bench/results/gpu
mkdir -p "$R"
export PYTHONUNBUFFERED=1
summary=()
fails=0
note() { summary+=("$1"); echo "$1"; }
check() { # check NAME CMD...: ok or FAIL by its exit status
  local name=$1
  shift
  if "$@"; then note "ok: $name"; else note "FAIL: $name (exit $?)"; fails=$((fails + 1)); fi
}

echo "== the GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
echo "== 1. kernels against the CPU's"
check "test_cuda_ops" timeout 120 "$D/bin/test_cuda_ops"
check "test_cuda_attn" timeout 120 "$D/bin/test_cuda_attn"
check "test_cuda_bf16" timeout 120 "$D/bin/test_cuda_bf16"

echo "== 2. templates: pipewright train --device cuda against --device cpu, 3 steps"
job() { # job SRC NAME [attention]: the example as one process of dp 1, absolute data path
  "$PY" - "$1" "$X/$2.json" "${3:-}" "$SRC" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
j["mesh"] = {"pp": 1, "dp": 1, "virtual_stages": 1}
j["data"]["path"] = sys.argv[4] + "/" + j["data"]["path"]
if sys.argv[3]:
    j["train"]["attention"] = sys.argv[3]
json.dump(j, open(sys.argv[2], "w"))
PYEOF
}
job "$SRC/examples/jobs/gpt-tiny.json" gpt
job "$SRC/examples/jobs/llama-tiny.json" llama
job "$SRC/examples/jobs/gpt-tiny.json" gpt-tiled tiled
for n in gpt llama gpt-tiled; do
  for dev in cpu cuda; do
    timeout 120 "$PW" train --job "$X/$n.json" --steps 3 --device $dev --quiet --out "$X/$n-$dev.safetensors" \
      --log-json "$X/$n-$dev.jsonl" 2>&1 | tail -3
  done
  check "$n: cuda = cpu" "$PY" "$SRC/tests/gpu/compare.py" "$n" "$X/$n-cpu.safetensors" "$X/$n-cuda.safetensors" \
    "$X/$n-cpu.jsonl" "$X/$n-cuda.jsonl"
done
echo "== 2b. a pp 2 pipeline of two GPU workers against the single-process GPU run"
timeout 200 "$PY" "$SRC/tests/gpu/pipeline_gpu.py" "$D/bin" >"$X/pipe.log" 2>&1
grep -v "^ok:\|^FAIL:" "$X/pipe.log" | tail -20
while read -r line; do case $line in ok:*) note "$line" ;; FAIL:*) note "$line"; fails=$((fails + 1)) ;; esac; done <"$X/pipe.log"
grep -q "^ok: pipeline zb-h1" "$X/pipe.log" || { note "FAIL: the pipeline check did not finish"; fails=$((fails + 1)); }

echo "== 2c. bf16 on the GPU: gpt-tiny, 200 steps, float32 and bf16"
"$PY" - "$X/gpt.json" "$X/gpt-bf16.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
j["train"]["precision"] = "bf16"
json.dump(j, open(sys.argv[2], "w"))
PYEOF
for n in gpt gpt-bf16; do
  timeout 120 "$PW" train --job "$X/$n.json" --steps 200 --device cuda --quiet --log-json "$X/$n-200.jsonl" 2>&1 | tail -3
done
if line=$("$PY" - "$X/gpt-200.jsonl" "$X/gpt-bf16-200.jsonl" 2>&1 <<'PYEOF'
import json, sys
f, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
rel = abs(b[-1] - f[-1]) / abs(f[-1])
print("final loss float32 %.5f, bf16 %.5f: %.3f %% (<= 1 %%; last 10 steps' mean %.5f, %.5f; %d and %d steps)"
      % (f[-1], b[-1], 100 * rel, sum(f[-10:]) / 10, sum(b[-10:]) / 10, len(f), len(b)))
sys.exit(0 if len(f) == len(b) == 200 and rel <= 0.01 else 1)
PYEOF
); then
  note "ok: bf16 (cuda), gpt-tiny 200 steps: $line"
else
  note "FAIL: bf16 (cuda), gpt-tiny 200 steps: $(printf '%s' "$line" | tail -c 400)"
  fails=$((fails + 1))
fi

echo "== 3. a GPT-2-small step (d768, 12 layers, T 1024, batch 8) on the GPU"
"$PY" - "$SRC/bench/jobs/gpt-d768.json" "$X/gpt2s.json" "$SRC" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
j["model"]["seq_len"] = 1024
j["train"]["batch_size"] = 8
j["data"]["path"] = sys.argv[3] + "/" + j["data"]["path"]
json.dump(j, open(sys.argv[2], "w"))
PYEOF
if timeout 150 "$PW" train --job "$X/gpt2s.json" --steps 6 --device cuda --quiet --log-json "$X/gpt2s.jsonl" 2>&1 | tail -3; then
  pw_ms=$("$PY" -c "import json,statistics,sys; r=[json.loads(l)['ms'] for l in open(sys.argv[1])][2:]; print('%.1f' % statistics.median(r))" "$X/gpt2s.jsonl")
  note "pipewright float32 (cuda): ${pw_ms} ms/step (median of steps 3-6)"
else
  note "FAIL: pipewright on the GPT-2-small step"
  fails=$((fails + 1))
  pw_ms=""
fi
"$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); j['train']['precision']='bf16'; json.dump(j,open(sys.argv[2],'w'))" \
  "$X/gpt2s.json" "$X/gpt2s-bf16.json"
if timeout 120 "$PW" train --job "$X/gpt2s-bf16.json" --steps 6 --device cuda --quiet --log-json "$X/gpt2s-bf16.jsonl" 2>&1 | tail -3; then
  bf_ms=$("$PY" -c "import json,statistics,sys; r=[json.loads(l)['ms'] for l in open(sys.argv[1])][2:]; print('%.1f' % statistics.median(r))" "$X/gpt2s-bf16.jsonl")
  note "pipewright bf16 (cuda): ${bf_ms} ms/step (median of steps 3-6)"
else
  note "FAIL: pipewright bf16 on the GPT-2-small step"
  fails=$((fails + 1))
fi
# where the step goes: each kernel waited for (PW_PROFILE_OPS), two steps
PW_PROFILE_OPS=1 timeout 60 "$PW" train --job "$X/gpt2s.json" --steps 2 --device cuda --quiet 2>&1 |
  sed -n '/^PW_PROFILE_OPS/,$p' | tee "$R/gpt2s-profile.txt" | tail -25
for ac in "" --autocast; do
  out=$(timeout 90 "$PY" "$SRC/bench/torch_step.py" --job "$X/gpt2s.json" --device cuda --steps 4 --warmup 2 $ac 2>&1)
  t_ms=$(printf '%s\n' "$out" | grep '^{' | tail -1 |
         "$PY" -c "import json,statistics,sys; print('%.1f' % statistics.median(json.load(sys.stdin)['ms']))" 2>/dev/null)
  if [ -n "$t_ms" ]; then
    r=""
    [ -n "$pw_ms" ] && r=$("$PY" -c "import sys; print('; pipewright at %.3fx its speed' % (float(sys.argv[1]) / float(sys.argv[2])))" "$t_ms" "$pw_ms")
    note "PyTorch $("$PY" -c 'import torch; print(torch.__version__)') ${ac:-float32} (cuda, fused AdamW): ${t_ms} ms/step${r}"
  else
    note "PyTorch ${ac:-float32}: did not run: $(printf '%s' "$out" | tail -c 400)"
  fi
done

{
  echo "# tests/gpu/run.sh, $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  printf '%s\n' "${summary[@]}"
} > "$R/latest.md"
[ -n "${OUT:-}" ] && cp "$R/latest.md" "$OUT/gpu-latest.md"
echo "== summary ($fails failed)"
printf '%s\n' "${summary[@]}"
exit $((fails > 0))
