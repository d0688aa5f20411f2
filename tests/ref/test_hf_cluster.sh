#!/usr/bin/env bash
# test_hf_cluster: a Hugging Face model imported, LoRA-fine-tuned on a real
# coordinator and two workers from its uploaded checkpoint (pp 2, zb-h1),
# merged and exported back to transformers (tests/ref/hf_cluster.py says what
# is asserted). transformers comes from deploy/venv.sh hf (.venv-hf/).
#   bash tests/ref/test_hf_cluster.sh BUILD_DIR SOURCE_DIR      (ctest runs it so)
# Exit 0 pass, 1 mismatch or error, 77 skip (no PyTorch, or no environment).
set -u
NAME=test_hf_cluster
. "$(dirname "$0")/ref_env.sh"
[ -x "$PW" ] || { echo "FAILED: $PW is not built"; exit 1; }
HPY=$(bash "$SRC/deploy/venv.sh" hf) ||
  { echo "SKIP $NAME: deploy/venv.sh hf could not make the environment (PyPI unreachable?)"; exit 77; }
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
"$HPY" -u "$REF/hf_cluster.py" "$BUILD" "$SRC" "$TMP"
