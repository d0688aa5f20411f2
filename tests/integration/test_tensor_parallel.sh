#!/usr/bin/env bash
# test_tensor_parallel: tp groups of real worker processes against the
# tp = 1 single-process trainer (test_tensor_parallel.py), the 8-worker
# meshes left out under the sanitizer build.
set -euo pipefail
quick=(); [ "${PW_SANITIZE:-OFF}" = "ON" ] && quick=(--quick)
exec /usr/bin/python3 "$(dirname "$0")/test_tensor_parallel.py" "$1" "$2" "${quick[@]}"
