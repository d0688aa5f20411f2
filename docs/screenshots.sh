#!/usr/bin/env bash
# screenshots.sh: retake docs/screenshots/*.png (overview, job, plan) from a
# real coordinator and four workers doing real work, in headless chromium
# (tests/browser/screenshots.py). Builds build-release first if needed;
# installs chromium and Playwright (.venv/) as the browser test does.
#   docs/screenshots.sh [BUILD_DIR]     default build-release
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-release}
[ -x "$BUILD/pipewright-coordinator" ] || {
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPW_TESTS=OFF >/dev/null
  cmake --build "$BUILD" -j "$(nproc 2>/dev/null || echo 2)" --target pipewright-coordinator pipewright-worker
}
exec tests/browser/run.sh "$BUILD" . screenshots.py
