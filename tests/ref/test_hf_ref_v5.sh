#!/usr/bin/env bash
# test_hf_ref_v5: import-hf / export-hf against transformers 5 (Qwen3, and
# the config files transformers 5 writes): tests/ref/hf_ref_v5.py says what
# is checked. transformers 5 needs PyTorch 2, which Debian 12 does not ship:
# it runs in bench/torch2_venv.sh's environment (PyTorch 2.15 and
# transformers 5.24.0 from PyPI, ~2 GB), or the python PW_TORCH2_PYTHON names.
# Where neither is there it skips, naming why; deploy/test.sh expects that
# skip by name on machines without the environment (CI's), as it does the
# GPU tests'.
#   bash tests/ref/test_hf_ref_v5.sh BUILD_DIR SOURCE_DIR      (ctest runs it so)
# Exit 0 pass, 1 mismatch or error, 77 skip.
set -u
NAME=test_hf_ref_v5
. "$(dirname "$0")/ref_env.sh"
[ -x "$PW" ] || { echo "FAILED: $PW is not built"; exit 1; }
T2=${PW_TORCH2_PYTHON:-$SRC/.venv-torch2/bin/python3}
if ! "$T2" -c 'import torch, transformers; assert int(transformers.__version__.split(".")[0]) >= 5' 2>/dev/null; then
  echo "SKIP $NAME: no PyTorch 2 environment with transformers 5 at $T2 (bench/torch2_venv.sh makes one)"
  exit 77
fi
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 HF_HUB_DISABLE_PROGRESS_BARS=1
"$T2" -u "$REF/hf_ref_v5.py" "$PW" "$SRC" "$TMP"
