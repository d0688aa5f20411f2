#!/usr/bin/env bash
# device_x86.sh: issue 36's check on a many-core x86 server (the GPU
# machine's 16-core Sapphire Rapids), as one prepared script:
#
#   bench/device_x86.sh [BUILD]     (BUILD: a Release build carried there, default build-release)
#
# Prints the CPU's flags that matter (AVX-512, AMX), OpenBLAS's own kernel,
# then a d768 GPT step (12 layers, T 256, batch 16: bench/jobs/gpt-d768.json
# if present, else d256) on one thread three ways, interleaved
# (bench/gemm_path.py): nothing set, OPENBLAS_CORETYPE=SkylakeX (the kernel
# the CPU deserves), and OpenBLAS's fallback forced onto OpenBLAS. Done
# when "nothing set" is within 1.25x of SkylakeX's step (>= 80 % of its
# rate). Results go to bench/results/dispatch/ (copy them back).
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build-release}
JOB=$SRC/bench/jobs/gpt-d768.json
[ -f "$JOB" ] || JOB=$SRC/bench/jobs/gpt-d256.json
echo "== CPU"
grep -m1 "model name" /proc/cpuinfo
grep -o -w 'avx512f\|avx512bw\|avx512_bf16\|avx512_fp16\|amx_tile\|amx_bf16\|amx_int8' /proc/cpuinfo | sort | uniq -c
nproc
echo "== OpenBLAS's own kernel, and the products' path pipewright takes"
env -u OPENBLAS_CORETYPE "$BUILD/pipewright" train --job "$SRC/examples/jobs/gpt-tiny.json" --steps 1 \
  --out /tmp/pw-device-x86.safetensors 2>&1 | grep -E "gemm|error" || true
echo "== a step, nothing set vs OPENBLAS_CORETYPE=SkylakeX (one thread, interleaved)"
env -u OPENBLAS_CORETYPE /usr/bin/python3 "$SRC/bench/gemm_path.py" --build "$BUILD" --job "$JOB" --rounds 3 --steps 2
OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 "$SRC/bench/gemm_path.py" --build "$BUILD" --job "$JOB" --rounds 3 --steps 2
