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

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
