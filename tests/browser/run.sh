#!/usr/bin/env bash
# run.sh: the dashboard's real-browser test — installs what it needs the
# first time (Debian's chromium and fonts, Node.js + npm, playwright-core
# from npm into tests/browser/node_modules), then runs dashboard.test.mjs
# with node's test runner against a real coordinator and two real workers.
#
#   tests/browser/run.sh BUILD_DIR [SOURCE_DIR [SCRIPT]]
# SCRIPT defaults to dashboard.test.mjs (run by node's test runner); any
# other (screenshots.mjs: docs/screenshots.sh) is run by node as it is.
# Screenshots and logs go to BUILD_DIR/test-output/dashboard/ (override
# with PW_DASHBOARD_OUT).
# Exit 77 (ctest's skip) only when chromium cannot be installed here.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD_DIR=$(cd "${1:?usage: run.sh BUILD_DIR [SOURCE_DIR]}" && pwd)
SOURCE_DIR=$(cd "${2:-$HERE/../..}" && pwd)
CHROMIUM=${PW_CHROMIUM:-/usr/bin/chromium}

log() { echo "dashboard: $*"; }

# One installer at a time (two builds' ctest may run this concurrently).
exec 9>"$HERE/.install.lock"
flock 9

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo -n "$@"
  else return 1
  fi
}

apt_install() {
  command -v apt-get >/dev/null || return 1
  log "installing Debian packages: $*"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq || return 1
  as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null || return 1
}

if [ ! -x "$CHROMIUM" ]; then
  if ! apt_install chromium fonts-dejavu-core || [ ! -x "$CHROMIUM" ]; then
    echo "SKIP test_dashboard: $CHROMIUM is missing and could not be installed (needs root or passwordless sudo," \
        "and apt-get with Debian's chromium package)"
    exit 77
  fi
fi
if ! "$CHROMIUM" --version >/dev/null 2>&1; then
  echo "SKIP test_dashboard: $CHROMIUM is installed but does not start: $("$CHROMIUM" --version 2>&1 | head -3)"
  exit 77
fi

node_ok() {
  command -v node >/dev/null && command -v npm >/dev/null &&
    [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 18 ]
}
if ! node_ok; then
  apt_install nodejs npm || true
  node_ok || { log "FAIL: Node.js >= 18 and npm are needed (apt-get install nodejs npm)"; exit 1; }
fi

# playwright-core, pinned by package.json + package-lock.json; reinstalled
# when the lock file changes.
stamp="$HERE/node_modules/.pw-lock-sha"
want=$(sha256sum "$HERE/package-lock.json" | cut -d' ' -f1)
if [ ! -f "$HERE/node_modules/playwright-core/package.json" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "npm ci (playwright-core)"
  (cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error) || { log "FAIL: npm ci failed"; exit 1; }
  echo "$want" >"$stamp"
fi
flock -u 9

export PW_BUILD_DIR="$BUILD_DIR" PW_SOURCE_DIR="$SOURCE_DIR" PW_CHROMIUM="$CHROMIUM"
export PW_DASHBOARD_OUT=${PW_DASHBOARD_OUT:-$BUILD_DIR/test-output/dashboard}
mkdir -p "$PW_DASHBOARD_OUT"
log "chromium: $("$CHROMIUM" --version 2>/dev/null), node $(node --version), output in $PW_DASHBOARD_OUT"
cd "$HERE"
SCRIPT=${3:-dashboard.test.mjs}
case "$SCRIPT" in
  *.test.mjs) exec node --test --test-reporter=spec "$SCRIPT" ;;
  *) exec node "$SCRIPT" ;;
esac
