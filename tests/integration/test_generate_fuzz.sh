#!/usr/bin/env bash
# test_generate_fuzz: the generate endpoint fuzzed over a live serve job
# (test_generate_fuzz.py): every answer 200 or a 4xx with the error shape,
# nothing crashes, the job serves the same tokens afterwards.
set -euo pipefail
BUILD=$1; SRC=$2
exec /usr/bin/python3 "$(dirname "$0")/test_generate_fuzz.py" "$BUILD" "$SRC"
