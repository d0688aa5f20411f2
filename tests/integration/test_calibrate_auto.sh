#!/usr/bin/env bash
# test_calibrate_auto: "schedule": {"name": "auto"} at POST /v1/jobs
# (test_calibrate_auto.py).
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "no $BUILD/pipewright-worker"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_calibrate_auto.py" "$BUILD" "$SRC"
