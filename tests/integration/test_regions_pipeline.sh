#!/usr/bin/env bash
# test_regions_pipeline: a two-tower job across real worker processes (see test_regions_pipeline.py).
# Under the sanitizer build the schedule sweep is shortened (--quick).
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "no $BUILD/pipewright-worker"; exit 1; }
args=()
[ "${PW_SANITIZE:-OFF}" = "ON" ] && args+=(--quick)
exec /usr/bin/python3 "$(dirname "$0")/test_regions_pipeline.py" "$BUILD" "$SRC" "${args[@]}"
