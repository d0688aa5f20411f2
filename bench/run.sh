#!/usr/bin/env bash
# run.sh: pipewright's benchmarks (issue 8), side by side with PyTorch and
# with the machine's limits, in one run.
#
#   bench/run.sh [--quick] [harness options: --coretype NAME, --name STEM, --cases 1,2]
#
# Builds pipewright in Release in its own build directory (build-bench, or
# $PW_BENCH_BUILD), runs every case through bench/harness.py, writes
# bench/results/harness/latest.json and latest.md and prints the
# markdown. --quick (a few minutes on 2 cores) uses fewer repetitions.
# Case 7 needs wrk (Debian package wrk); without it that case reports an error.
# Single-thread cases use one core; only the two-thread rows use both.
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${PW_BENCH_BUILD:-$SRC/build-bench}
PY=/usr/bin/python3

if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "run.sh: $PY cannot import torch (install python3-torch: deploy/install-deps.sh)" >&2
  exit 1
fi
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPW_TESTS=OFF >/dev/null
if ! cmake --build "$BUILD" -j2 --target bench_kernels bench_step bench_transport pipewright pipewright-worker pipewright-coordinator >"$BUILD/bench-build.log" 2>&1; then
  cat "$BUILD/bench-build.log" >&2
  exit 1
fi
exec "$PY" "$SRC/bench/harness.py" --build "$BUILD" "$@"
