#!/usr/bin/env bash
# test_serve_text: a job naming its tokenizer takes and returns text (see test_serve_text.py).
set -euo pipefail
[ -x "$1/pipewright-coordinator" ] || { echo "no $1/pipewright-coordinator"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_serve_text.py" "$1" "$2"
