#!/usr/bin/env bash
# test_coordinator: the whole system on loopback (see test_coordinator.py).
set -euo pipefail
[ -x "$1/pipewright-coordinator" ] || { echo "no $1/pipewright-coordinator"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_coordinator.py" "$1" "$2"
