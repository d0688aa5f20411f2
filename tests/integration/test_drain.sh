#!/usr/bin/env bash
# test_drain: SIGTERM with --drain-timeout stops every run at a checkpoint,
# the job resumes there bit for bit; the idempotent submit (see test_drain.py).
set -euo pipefail
[ -x "$1/pipewright-coordinator" ] || { echo "no $1/pipewright-coordinator"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_drain.py" "$1" "$2"
