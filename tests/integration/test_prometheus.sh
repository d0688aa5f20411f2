#!/usr/bin/env bash
# test_prometheus: deploy/prometheus/ and deploy/grafana/ against promtool
# and a live coordinator (see test_prometheus.py). Needs promtool and
# prometheus (Debian's prometheus package, deploy/install-deps.sh) and
# python3-yaml: exit 77, skipped, without them.
# Arguments (from ctest): BUILD_DIR SOURCE_DIR.
set -euo pipefail
BUILD="${1:?usage: test_prometheus.sh BUILD_DIR SOURCE_DIR}"
SRC="${2:?usage: test_prometheus.sh BUILD_DIR SOURCE_DIR}"
for tool in promtool prometheus; do
  command -v "$tool" >/dev/null || {
    echo "SKIP test_prometheus: no $tool (Debian's prometheus package: deploy/install-deps.sh installs it)"
    exit 77
  }
done
/usr/bin/python3 -c 'import yaml' 2>/dev/null || { echo "SKIP test_prometheus: python3-yaml not installed"; exit 77; }
[ -x "$BUILD/pipewright-worker" ] || { echo "SKIP test_prometheus: no $BUILD/pipewright-worker"; exit 77; }
exec /usr/bin/python3 "$SRC/tests/integration/test_prometheus.py" "$BUILD" "$SRC"
