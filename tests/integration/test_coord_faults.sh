#!/usr/bin/env bash
# test_coord_faults: the coordinator when its store fails, a run diverges,
# a plan takes seconds, workers vanish (see test_coord_faults.py).
set -euo pipefail
[ -x "$1/pipewright-coordinator" ] || { echo "no $1/pipewright-coordinator"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_coord_faults.py" "$1" "$2"
