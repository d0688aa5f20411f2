#!/usr/bin/env bash
# test_chaos: three jobs at once on seven workers while a loop kill -9s and
# restarts busy workers; every job ends bit for bit (see test_chaos.py).
# Shorter under the sanitizers (PW_SANITIZE=ON); PW_TEST_SEED=N repeats the choices.
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "SKIP test_chaos: no $BUILD/pipewright-worker"; exit 77; }
[ -x "$BUILD/pipewright-coordinator" ] || { echo "SKIP test_chaos: no $BUILD/pipewright-coordinator"; exit 77; }
exec /usr/bin/python3 "$(dirname "$0")/test_chaos.py" "$BUILD" "$SRC"
