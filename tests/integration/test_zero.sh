#!/usr/bin/env bash
# test_zero: the data-parallel reduce-scatter + all-gather and train.zero
# across real worker processes (see test_zero.py). Under the sanitizer
# build the sweep is shortened (--quick).
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "no $BUILD/pipewright-worker"; exit 1; }
args=()
[ "${PW_SANITIZE:-OFF}" = "ON" ] && args+=(--quick)
exec /usr/bin/python3 "$(dirname "$0")/test_zero.py" "$BUILD" "$SRC" "${args[@]}"
