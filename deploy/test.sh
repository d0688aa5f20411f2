#!/usr/bin/env bash
# test.sh: the whole suite from a clean checkout — install dependencies,
# configure, build and run every test twice: a plain build, then a build
# with AddressSanitizer + UndefinedBehaviorSanitizer.
#   deploy/test.sh            both builds
#   deploy/test.sh --plain    only the plain build (quicker, while developing)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=$(nproc 2>/dev/null || echo 2)

bash deploy/install-deps.sh

run_suite() {
  local dir=$1; shift
  echo "== configure $dir ($*)"
  cmake -S "$ROOT" -B "$ROOT/$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  echo "== build $dir"
  cmake --build "$ROOT/$dir" -j "$JOBS"
  echo "== test $dir"
  (cd "$ROOT/$dir" && ctest --output-on-failure -j "$JOBS" --timeout 900)
}

export OPENBLAS_NUM_THREADS=1
# The Release flags (-O3 -march=native) warn about other things than -O2:
# build them too, so quickstart and the benchmarks always compile.
echo "== build build-release (Release, no tests)"
cmake -S "$ROOT" -B "$ROOT/build-release" -DCMAKE_BUILD_TYPE=Release -DPW_TESTS=OFF >/dev/null
cmake --build "$ROOT/build-release" -j "$JOBS"
run_suite build
if [ "${1:-}" != "--plain" ]; then
  # detect_leaks: every allocation must be freed by shutdown.
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  run_suite build-asan -DPW_SANITIZE=ON
fi
echo "== all tests passed"
