#!/usr/bin/env bash
# test_dataset_fetch: workers fetch a job's stored dataset over HTTP into
# their cache, verify it, fetch a corrupted copy again, and fail clearly on
# 404, 401 or no http_url (test_dataset_fetch.py); end to end through the
# coordinator when it stores datasets.
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "no $BUILD/pipewright-worker"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_dataset_fetch.py" "$BUILD" "$SRC"
