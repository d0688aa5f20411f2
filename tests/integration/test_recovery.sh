#!/usr/bin/env bash
# test_recovery: a job survives losing workers — kill -9, SIGSTOP, a rank
# and its snapshot holder, the coordinator killed mid-recovery, duplicate
# names, max_restarts (see test_recovery.py). Shorter jobs under the
# sanitizers (PW_SANITIZE=ON). PW_TEST_SEED=N repeats a run's choices.
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "SKIP test_recovery: no $BUILD/pipewright-worker"; exit 77; }
[ -x "$BUILD/pipewright-coordinator" ] || { echo "SKIP test_recovery: no $BUILD/pipewright-coordinator"; exit 77; }
exec /usr/bin/python3 "$(dirname "$0")/test_recovery.py" "$BUILD" "$SRC"
