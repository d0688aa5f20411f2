#!/usr/bin/env bash
# test_serve: serve jobs end to end — a real coordinator and 4 workers on
# loopback, generate over real HTTP against the single-process oracle
# (test_serve.py).
set -euo pipefail
BUILD=$1; SRC=$2
exec /usr/bin/python3 "$(dirname "$0")/test_serve.py" "$BUILD" "$SRC"
