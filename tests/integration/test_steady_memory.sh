#!/usr/bin/env bash
# test_steady_memory: no page faults and no RSS growth per step on any rank
# once a pipeline runs (test_steady_memory.py).
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/test_steady_memory.py" "$1" "$2"
