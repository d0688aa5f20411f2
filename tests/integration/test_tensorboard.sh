#!/usr/bin/env bash
# test_tensorboard: TensorBoard event files and metrics as CSV / JSON lines
# (test_tensorboard.py), read with TensorBoard's own reader: the test
# suite's venv (deploy/venv.sh, tensorboard pinned in
# deploy/requirements-test.txt) runs it.
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "SKIP test_tensorboard: no $BUILD/pipewright-worker"; exit 77; }
PY=$(bash "$SRC/deploy/venv.sh") ||
  { echo "SKIP test_tensorboard: deploy/venv.sh could not make the test environment (PyPI unreachable?)"; exit 77; }
exec "$PY" -u "$(dirname "$0")/test_tensorboard.py" "$BUILD" "$SRC"
