#!/usr/bin/env bash
# test_dashboard: the web dashboard in a real headless browser (Debian's
# chromium driven by Playwright from PyPI, tests/browser/test_dashboard.py)
# against a real coordinator and workers: the token prompt, the overview,
# the job page's charts and timeline, the plan, generate and mesh pages,
# user data as text (the full list is the script's docstring).
# Screenshots: BUILD_DIR/test-output/dashboard/.
# Usage (ctest): test_dashboard.sh BUILD_DIR SOURCE_DIR. Exit 77 = skipped
# (chromium cannot be installed on this machine; the reason is printed).
set -euo pipefail
BUILD_DIR=${1:?usage: test_dashboard.sh BUILD_DIR SOURCE_DIR}
SOURCE_DIR=${2:?usage: test_dashboard.sh BUILD_DIR SOURCE_DIR}
for b in pipewright-coordinator pipewright-worker; do
  [ -x "$BUILD_DIR/$b" ] || { echo "test_dashboard: $BUILD_DIR/$b is not built" >&2; exit 1; }
done
exec bash "$SOURCE_DIR/tests/browser/run.sh" "$BUILD_DIR" "$SOURCE_DIR"
