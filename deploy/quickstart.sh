#!/usr/bin/env bash
# quickstart.sh: the main job from a clean checkout — install dependencies,
# build, and train the example GPT on the bundled corpus, then report its
# eval loss. (Until the coordinator lands this trains in one process; it
# will start the full coordinator + workers system.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target pipewright
mkdir -p runs
JOB=${1:-examples/jobs/gpt-tiny.json}
./build/pipewright inspect --job "$JOB"
./build/pipewright train --job "$JOB" --out runs/quickstart.safetensors
./build/pipewright eval --job "$JOB" --checkpoint runs/quickstart.safetensors
echo "checkpoint: runs/quickstart.safetensors (optimizer state in runs/quickstart.optim.safetensors)"
