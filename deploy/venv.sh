#!/usr/bin/env bash
# venv.sh: the one virtual environment of the test suite's PyPI tools,
# made from Debian's python3 and filled from deploy/requirements-test.txt
# (exact versions and hashes, nothing else: pip install --require-hashes
# --no-deps). Lives in .venv/
# at the repository's root (PW_VENV to put it elsewhere). A stamp holds the
# requirements' hash: the environment is made again when they change, and
# left alone otherwise. deploy/install-deps.sh runs it; so does a test that
# finds the environment missing (tests/browser/run.sh). Safe to run twice at
# once (flock).
#   deploy/venv.sh           make or refresh it; prints its python
#   deploy/venv.sh hf        the same for .venv-hf/ from deploy/requirements-hf.txt:
#                            Hugging Face transformers over Debian's PyTorch and
#                            numpy (--system-site-packages: they stay Debian's), a
#                            second environment because its tokenizers pin (0.21.x)
#                            is not the one .venv/ holds (PW_VENV_HF to put it elsewhere)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${PW_VENV:-$ROOT/.venv}
REQ=$ROOT/deploy/requirements-test.txt
SYSTEM=()
if [ "${1:-}" = hf ]; then
  VENV=${PW_VENV_HF:-$ROOT/.venv-hf}
  REQ=$ROOT/deploy/requirements-hf.txt
  SYSTEM=(--system-site-packages)
fi
PY=/usr/bin/python3   # Debian's: the same interpreter on every Debian 12 machine

[ -x "$PY" ] || { echo "venv: $PY is missing (apt-get install python3 python3-venv)" >&2; exit 1; }
mkdir -p "$(dirname "$VENV")"
exec 8>"$VENV.lock"
flock 8

want=$(cat "$REQ" | sha256sum | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.requirements-sha" 2>/dev/null)" = "$want" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
echo "venv: making $VENV from $REQ" >&2
rm -rf "$VENV"
"$PY" -m venv "${SYSTEM[@]}" "$VENV" >&2 || { echo "venv: '$PY -m venv' failed (apt-get install python3-venv)" >&2; exit 1; }
# Only what the file names, at its hashes (--no-deps: a package's other
# requirements are not pulled in; the file lists what is needed); no
# look-up of newer pip.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  --require-hashes --no-deps --only-binary=:all: -r "$REQ" >&2 ||
  { rm -rf "$VENV"; echo "venv: pip install -r $REQ failed" >&2; exit 1; }
echo "$want" >"$VENV/.requirements-sha"
echo "$VENV/bin/python"
