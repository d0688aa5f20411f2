#!/usr/bin/env bash
# test_pinning: ranks sharing a host run on disjoint CPUs (see test_pinning.py).
set -euo pipefail
[ -x "$1/pipewright-coordinator" ] || { echo "no $1/pipewright-coordinator"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_pinning.py" "$1" "$2"
