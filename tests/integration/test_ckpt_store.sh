#!/usr/bin/env bash
# test_ckpt_store: checkpoints in the coordinator's store, end to end
# (test_ckpt_store.py): retention, downloads that load, 404 past
# retention, nothing left on the workers, purge, and a resume from the
# coordinator's copy on fresh workers with empty state dirs.
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "SKIP test_ckpt_store: no $BUILD/pipewright-worker"; exit 77; }
exec /usr/bin/python3 "$(dirname "$0")/test_ckpt_store.py" "$BUILD" "$SRC"
