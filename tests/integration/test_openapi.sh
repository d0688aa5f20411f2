#!/usr/bin/env bash
# test_openapi: api/openapi.yaml against the coordinator's route table and
# its real answers (see test_openapi.py). Needs Debian's python3-jsonschema
# and python3-yaml (exit 77, skipped, without them or without the daemon).
# Arguments (from ctest): BUILD_DIR SOURCE_DIR.
set -euo pipefail
BUILD="${1:?usage: test_openapi.sh BUILD_DIR SOURCE_DIR}"
SRC="${2:?usage: test_openapi.sh BUILD_DIR SOURCE_DIR}"
PY=/usr/bin/python3
if ! "$PY" -c 'import jsonschema, yaml; jsonschema.Draft202012Validator' 2>/dev/null; then
  echo "SKIP test_openapi: python3-jsonschema or python3-yaml not installed"
  exit 77
fi
exec "$PY" "$SRC/tests/integration/test_openapi.py" "$BUILD" "$SRC"
