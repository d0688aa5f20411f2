#!/usr/bin/env bash
# test_attention: the tiled attention across real worker processes — a
# pipeline equal to pipewright train bit for bit, and peak RSS against the
# plan (test_attention.py).
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/test_attention.py" "$1" "$2"
