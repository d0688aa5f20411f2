#!/usr/bin/env bash
# test_tensor_parallel: tp checkpoints resumed at another tp, every
# schedule's plan at tp 2, tp on a real coordinator (test_tensor_parallel.py;
# the mesh x schedule x model matrix is test_tp_matrix).
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/test_tensor_parallel.py" "$1" "$2"
