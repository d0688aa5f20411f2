#!/usr/bin/env bash
# test_tp_matrix: issue 17's tensor-parallel matrix (meshes x schedules x
# models) on real worker processes against the tp = 1 trainer.
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/test_tp_matrix.py" "$1" "$2"
