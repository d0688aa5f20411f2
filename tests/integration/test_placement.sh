#!/usr/bin/env bash
# test_placement: explicit partitions and mesh.placement across real worker
# processes (see test_placement.py).
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "no $BUILD/pipewright-worker"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_placement.py" "$BUILD" "$SRC"
