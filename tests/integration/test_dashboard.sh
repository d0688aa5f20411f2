#!/usr/bin/env bash
# test_dashboard: the web dashboard in a real headless browser (Debian
# chromium + playwright-core) against a real coordinator and two workers:
# the job appears and succeeds, its loss chart has a point per step, the
# pipeline timeline has a lane per rank and an F block per (microbatch,
# stage), a <script> job name renders as text, and the API token prompt
# works. Screenshots: BUILD_DIR/test-output/dashboard/.
# Usage (ctest): test_dashboard.sh BUILD_DIR SOURCE_DIR. Exit 77 = skipped
# (chromium cannot be installed on this machine; the reason is printed).
set -euo pipefail
BUILD_DIR=${1:?usage: test_dashboard.sh BUILD_DIR SOURCE_DIR}
SOURCE_DIR=${2:?usage: test_dashboard.sh BUILD_DIR SOURCE_DIR}
for b in pipewright-coordinator pipewright-worker; do
  [ -x "$BUILD_DIR/$b" ] || { echo "test_dashboard: $BUILD_DIR/$b is not built" >&2; exit 1; }
done
exec bash "$SOURCE_DIR/tests/browser/run.sh" "$BUILD_DIR" "$SOURCE_DIR"
