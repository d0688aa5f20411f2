#!/usr/bin/env bash
# test_init_weights: stored weights (POST /v1/checkpoints) and jobs that
# start from them ("init"), end to end with a real coordinator and workers
# (test_init_weights.py).
set -euo pipefail
BUILD=$1; SRC=$2
exec /usr/bin/python3 "$(dirname "$0")/test_init_weights.py" "$BUILD" "$SRC"
