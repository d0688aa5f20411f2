#!/usr/bin/env bash
# test_zero: the data-parallel collectives and train.zero across real worker
# processes (test_zero.py), its sweep shortened under the sanitizer build.
set -euo pipefail
quick=(); [ "${PW_SANITIZE:-OFF}" = "ON" ] && quick=(--quick)
exec /usr/bin/python3 "$(dirname "$0")/test_zero.py" "$1" "$2" "${quick[@]}"
