#!/usr/bin/env bash
# test_pipeline_models: the model families pipelined (test_pipeline.py
# --models: Llama-3, Qwen2, Qwen3, Gemma at pp 4, a sliding window with
# wide heads, BERT's two heads, two mixtures of experts), each equal to
# `pipewright train` bit for bit. The schedules' runtime itself is
# test_pipeline's, which runs under the sanitizers; these check numerics
# and run in the plain build (deploy/test.sh).
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "no $BUILD/pipewright-worker"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_pipeline.py" "$BUILD" "$SRC" --models
