#!/usr/bin/env bash
# device_x86.sh: issue 36's checks on a many-core x86 server (the GPU
# machine's 16-core Sapphire Rapids), as one prepared script. That machine
# has none of pipewright's Debian packages: the binaries travel as a
# bundle (deploy/bundle.sh), made here first:
#
#   cmake --build build-release -j2 --target bench_step
#   PW_BUNDLE_EXTRA=bench/bench_step deploy/bundle.sh build-release .device/pw.tar.gz
#   echo /.device/ >> .git/info/exclude
#   run (device tool), carry .device:  bash bench/device_x86.sh .device/pw.tar.gz
#
# 1. The CPU's flags that matter (AVX-512, AMX), the products' path and
#    OpenBLAS's own kernel, as the worker reports them.
# 2. A d768 GPT step on one thread, nothing set vs OPENBLAS_CORETYPE=SkylakeX
#    (bench/gemm_path.py, interleaved): done when "nothing set" is within
#    1.25x of SkylakeX's step (>= 80 % of its rate).
# 3. (run first: 2026-11-28's run lost it to its timeout) The --auto layout of the 16 cores (bench/host_layout.py: calibrate at
#    1, 2 and 4 threads, plan --auto, then the layout against one process
#    of 16 threads, alternating): done when >= 2x, and the plan's predicted
#    step within 10 % of the measured one.
# Results go to bench/results/dispatch/ and bench/results/layout/: copy them
# back from the run's $OUT (this script copies them there when it is set).
set -eu
export PYTHONUNBUFFERED=1 # a step cut by its timeout still shows what it printed
SRC=$(cd "$(dirname "$0")/.." && pwd)
TARBALL=${1:-$SRC/.device/pw.tar.gz}
X=$(mktemp -d)
tar -C "$X" -xzf "$TARBALL"
D=$(ls -d "$X"/pipewright-*)
B=$X/build   # what the bench scripts take for a build folder
mkdir -p "$B/bench"
for f in pipewright pipewright-coordinator pipewright-worker; do ln -s "$D/bin/$f" "$B/$f"; done
ln -s "$D/bin/bench_step" "$B/bench/bench_step"
JOB=$SRC/bench/jobs/gpt-d768.json
JOB16=$X/gpt-d768-b16.json   # host_layout's batch, for PyTorch on every core
PY=$(command -v python3)
"$PY" -c "import json,sys; j=json.load(open('$JOB')); j['train']['batch_size']=16; j['data']['path']='$SRC/'+j['data']['path']; json.dump(j,open('$JOB16','w'))"

echo "== CPU"
grep -m1 "model name" /proc/cpuinfo
grep -o -w 'avx512f\|avx512bw\|avx512_bf16\|avx512_fp16\|amx_tile\|amx_bf16\|amx_int8' /proc/cpuinfo | sort | uniq -c
nproc
echo "== the products' path pipewright takes (nothing set)"
env -u OPENBLAS_CORETYPE "$B/pipewright" train --job "$SRC/examples/jobs/gpt-tiny.json" --steps 1 \
  --out /tmp/pw-device-x86.safetensors 2>&1 | grep -E "gemm|error" || true
echo "== the --auto layout of this host's cores against one process"
env -u OPENBLAS_CORETYPE timeout 420 "$PY" "$SRC/bench/host_layout.py" --bin "$B" --job "$JOB" --threads 1,2,4 \
  --batch 16 --steps 3 --warm 1 --rounds 2 || true
echo "== a d768 step, nothing set vs OPENBLAS_CORETYPE=SkylakeX (one thread, interleaved)"
timeout 120 "$PY" "$SRC/bench/gemm_path.py" --build "$B" --job "$JOB" --against skylakex --rounds 3 --steps 1 || true
echo "== bf16 (AMX through oneDNN) against float32, pipewright and PyTorch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null), one thread each"
PW_BENCH_PYTHON=$PY timeout 150 "$PY" "$SRC/bench/bf16_step.py" --build "$B" --rounds 3 --warmup 1 || true
echo "== PyTorch on every core (d768, batch 16): float32 and bf16 autocast, foreach AdamW"
for ac in "" --autocast; do
  OMP_NUM_THREADS=$(nproc) timeout 90 "$PY" "$SRC/bench/torch_step.py" --job "$JOB16" --threads "$(nproc)" \
    --steps 3 --warmup 1 --foreach $ac | tail -1 || true
done
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/results"
  cp "$SRC"/bench/results/dispatch/gemm-path-skylakex.* "$SRC"/bench/results/layout/host-layout.* "$OUT/results/" 2>/dev/null || true
fi
