#!/usr/bin/env bash
# test_eval_loss: held-out loss during cluster runs (train.eval_every,
# test_eval_loss.py): each recorded eval_loss is `pipewright eval` on that
# step's checkpoint, other rows null, and evaluating changes no weight.
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "SKIP test_eval_loss: no $BUILD/pipewright-worker"; exit 77; }
exec /usr/bin/python3 "$(dirname "$0")/test_eval_loss.py" "$BUILD" "$SRC"
