#!/usr/bin/env bash
# test_datasets: dataset uploads, the --data-root checks at submit, and a
# 1 GiB upload within 64 MiB of RSS (see test_datasets.py).
set -euo pipefail
[ -x "$1/pipewright-coordinator" ] || { echo "no $1/pipewright-coordinator"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_datasets.py" "$1" "$2"
