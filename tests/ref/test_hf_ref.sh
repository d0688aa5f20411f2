#!/usr/bin/env bash
# test_hf_ref: `pipewright import-hf` and `export-hf` against Hugging Face
# transformers (tests/ref/hf_ref.py says what is checked): tiny random
# GPT-2, Llama, Qwen2, Mistral (a sliding window shorter than the prompts)
# and Gemma (also with heads of a width of their own) models made by transformers, their
# logits, `pipewright generate`'s greedy ids against transformers'
# generate's (a near-tied step is named, not failed on), the export's round
# trip and that transformers loads it, refusals by name.
# transformers comes from deploy/venv.sh hf (.venv-hf/, pinned in
# deploy/requirements-hf.txt) over Debian's PyTorch.
#   bash tests/ref/test_hf_ref.sh BUILD_DIR SOURCE_DIR      (ctest runs it so)
# Exit 0 pass, 1 mismatch or error, 77 skip (no PyTorch, or no environment).
set -u
NAME=test_hf_ref
. "$(dirname "$0")/ref_env.sh"
[ -x "$PW" ] || { echo "FAILED: $PW is not built"; exit 1; }
HPY=$(bash "$SRC/deploy/venv.sh" hf) ||
  { echo "SKIP $NAME: deploy/venv.sh hf could not make the environment (PyPI unreachable?)"; exit 77; }
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
rc=0
"$HPY" -u "$REF/hf_ref.py" "$PW" "$SRC" "$TMP" || rc=1
"$HPY" -u "$REF/hf_bert_ref.py" "$PW" "$SRC" "$TMP" || rc=1  # BERT: tests/ref/hf_bert_ref.py says what
exit $rc
