#!/usr/bin/env bash
# test_bf16_pipeline: train.precision "bf16" pipelines equal the single-process run (see test_bf16_pipeline.py).
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "no $BUILD/pipewright-worker"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_bf16_pipeline.py" "$BUILD" "$SRC"
