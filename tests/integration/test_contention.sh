#!/usr/bin/env bash
# test_contention: ranks that share a host's cores are named in the job JSON,
# an event and the timeline (test_contention.py).
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "no $BUILD/pipewright-worker"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_contention.py" "$BUILD" "$SRC"
