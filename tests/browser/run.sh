#!/usr/bin/env bash
# run.sh: the dashboard's real-browser test — makes sure of what it needs
# (Debian's chromium and fonts; Playwright from PyPI in the test suite's one
# virtual environment, deploy/venv.sh), then runs test_dashboard.py against
# a real coordinator and real workers. No npm: the Playwright wheel carries
# its own driver, and drives Debian's chromium (executable_path).
#
#   tests/browser/run.sh BUILD_DIR [SOURCE_DIR [SCRIPT]]
# SCRIPT defaults to test_dashboard.py; screenshots.py (docs/screenshots.sh)
# is the other. Screenshots and logs go to BUILD_DIR/test-output/dashboard/
# (override with PW_DASHBOARD_OUT).
# Exit 77 (ctest's skip) only when chromium cannot be installed here.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD_DIR=$(cd "${1:?usage: run.sh BUILD_DIR [SOURCE_DIR [SCRIPT]]}" && pwd)
SOURCE_DIR=$(cd "${2:-$HERE/../..}" && pwd)
SCRIPT=${3:-test_dashboard.py}
CHROMIUM=${PW_CHROMIUM:-/usr/bin/chromium}

log() { echo "dashboard: $*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo -n "$@"
  else return 1
  fi
}

if [ ! -x "$CHROMIUM" ]; then
  # one installer at a time (two builds' ctest may get here together)
  exec 9>"${TMPDIR:-/tmp}/pipewright-browser-apt.lock"
  flock 9
  if [ ! -x "$CHROMIUM" ] && command -v apt-get >/dev/null; then
    log "installing Debian packages: chromium fonts-dejavu-core"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq && as_root apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null || true
  fi
  flock -u 9
  if [ ! -x "$CHROMIUM" ]; then
    echo "SKIP test_dashboard: $CHROMIUM is missing and could not be installed (needs root or passwordless sudo," \
        "and apt-get with Debian's chromium package)"
    exit 77
  fi
fi
if ! "$CHROMIUM" --version >/dev/null 2>&1; then
  echo "SKIP test_dashboard: $CHROMIUM is installed but does not start: $("$CHROMIUM" --version 2>&1 | head -3)"
  exit 77
fi

# Playwright, pinned with its hash in deploy/requirements-test.txt.
PY=$(bash "$SOURCE_DIR/deploy/venv.sh") || { log "FAIL: deploy/venv.sh could not make the test environment"; exit 1; }

export PW_BUILD_DIR="$BUILD_DIR" PW_SOURCE_DIR="$SOURCE_DIR" PW_CHROMIUM="$CHROMIUM"
export PW_DASHBOARD_OUT=${PW_DASHBOARD_OUT:-$BUILD_DIR/test-output/dashboard}
mkdir -p "$PW_DASHBOARD_OUT"
log "chromium: $("$CHROMIUM" --version 2>/dev/null), playwright $("$PY" -c 'from importlib.metadata import version; print(version("playwright"))'), output in $PW_DASHBOARD_OUT"
cd "$HERE"
exec "$PY" -u "$SCRIPT"
