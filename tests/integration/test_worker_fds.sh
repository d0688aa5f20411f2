#!/usr/bin/env bash
# test_worker_fds: the worker's data port gives every descriptor back, and a
# FIFO data path fails the job instead of wedging a worker (test_worker_fds.py).
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "no $BUILD/pipewright-worker"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_worker_fds.py" "$BUILD" "$SRC"
