#!/usr/bin/env bash
# test_remat: remat runs equal plain runs bit for bit (see test_remat.py).
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "no $BUILD/pipewright-worker"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_remat.py" "$BUILD" "$SRC"
