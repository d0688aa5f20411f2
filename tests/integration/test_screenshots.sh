#!/usr/bin/env bash
# test_screenshots: docs/screenshots.sh's script (tests/browser/screenshots.py)
# still works against this build: a coordinator and four workers train the
# example jobs, chromium photographs the overview, job and plan pages. The
# pictures go to a temporary folder (never into docs/), and each must be a
# PNG of the page's full height. Exit 77 only when chromium cannot be
# installed (as test_dashboard).
set -euo pipefail
BUILD_DIR=$1; SOURCE_DIR=$2
T=$(mktemp -d /tmp/pw-shots-XXXXXX)
trap 'rm -rf "$T"' EXIT
rc=0
PW_SCREENSHOTS_DIR=$T PW_DASHBOARD_OUT=$T/logs bash "$SOURCE_DIR/tests/browser/run.sh" "$BUILD_DIR" "$SOURCE_DIR" \
  screenshots.py >"$T/script.out" 2>&1 || rc=$?
cat "$T/script.out"
[ "$rc" = 77 ] && exit 77
# the daemons' logs first, the script's own error last: a CI excerpt shows the tail
[ "$rc" = 0 ] || { tail -n 20 "$T"/logs/*.log 2>/dev/null; echo "--- screenshots.py, last lines:";
                   tail -n 15 "$T/script.out"; echo "FAIL screenshots.py exited $rc"; exit 1; }
for f in overview job plan; do
  png=$T/$f.png
  [ "$(head -c 8 "$png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
    { echo "FAIL $f.png is not a PNG"; exit 1; }
  h=$(od -An -tu1 -j 20 -N 4 "$png" | awk '{print $1 * 16777216 + $2 * 65536 + $3 * 256 + $4}')
  [ "$h" -ge 900 ] || { echo "FAIL $f.png is $h px high: less than the 900 px viewport"; exit 1; }
  echo "ok   $f.png ($(stat -c %s "$png") bytes, $h px high)"
done
echo "all passed"
