#!/usr/bin/env bash
# test_k8s_validate: every manifest of deploy/k8s against the Kubernetes API's
# own schemas (test_k8s_validate.py), with kubernetes-validate from the test
# suite's venv (deploy/venv.sh; pinned in deploy/requirements-test.txt).
set -euo pipefail
BUILD=$1; SRC=$2
PY=$(bash "$SRC/deploy/venv.sh") ||
  { echo "SKIP test_k8s_validate: deploy/venv.sh could not make the test environment (PyPI unreachable?)"; exit 77; }
exec "$PY" -u "$(dirname "$0")/test_k8s_validate.py" "$SRC"
