# ref_env.sh: what the tests/ref/test_*.sh scripts share, sourced after
# setting NAME (the test's name): the arguments BUILD_DIR SOURCE_DIR made
# absolute, PY (the python3 with torch and numpy), REF, PW and CORPUS; a
# skip (exit 77, with a SKIP line naming why) without PyTorch or the
# corpus; TMP, removed on exit; one thread for OpenBLAS and torch.
BUILD=${1:?usage: $NAME.sh BUILD_DIR SOURCE_DIR}
SRC=${2:?usage: $NAME.sh BUILD_DIR SOURCE_DIR}
BUILD=$(cd "$BUILD" && pwd)
SRC=$(cd "$SRC" && pwd)
PY=/usr/bin/python3
REF=$SRC/tests/ref
PW=$BUILD/pipewright
CORPUS=$SRC/examples/data/corpus.txt

if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
  echo "SKIP $NAME: $PY cannot import torch and numpy (install python3-torch: deploy/install-deps.sh)"
  exit 77
fi
if [ ! -f "$CORPUS" ]; then
  echo "SKIP $NAME: $CORPUS is missing"
  exit 77
fi

# torch_compare JOB DIR LABEL: torch_ref.py trains JOB from DIR/init.safetensors;
# compare.py holds it against pipewright's DIR/pw.jsonl and DIR/pw.safetensors
# with losses to 1e-5 relative.
torch_compare() {
  "$PY" "$REF/torch_ref.py" --job "$1" --init "$2/init.safetensors" --data-root "$SRC" \
      --losses "$2/ref.jsonl" --out "$2/ref.safetensors" || { echo "FAILED: torch_ref.py"; return 1; }
  "$PY" "$REF/compare.py" --label "$3" --loss-rtol 1e-5 \
      --a-losses "$2/pw.jsonl" --a-final "$2/pw.safetensors" \
      --b-losses "$2/ref.jsonl" --b-final "$2/ref.safetensors"
}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
