#!/usr/bin/env bash
# test_tokenizers: `pipewright tokenize` gives the ids of Hugging Face
# `tokenizers` for tokenizers of each family trained here on the example
# corpus, and decodes as it does (test_tokenizers.py says what is checked).
# tokenizers comes from the test suite's venv (deploy/venv.sh,
# deploy/requirements-test.txt). Args: BUILD_DIR SOURCE_DIR.
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright" ] || { echo "test_tokenizers: no $BUILD/pipewright (build it first)"; exit 1; }
PY=$(bash "$SRC/deploy/venv.sh") ||
  { echo "SKIP test_tokenizers: deploy/venv.sh could not make the test environment (PyPI unreachable?)"; exit 77; }
export RAYON_NUM_THREADS=2 TOKENIZERS_PARALLELISM=true PYTHONDONTWRITEBYTECODE=1
exec "$PY" -u "$(dirname "$0")/test_tokenizers.py" "$BUILD" "$SRC"
