#!/usr/bin/env bash
# test.sh: the whole suite from a clean checkout — install dependencies,
# configure, build and run every test twice: a plain build, then a build
# with AddressSanitizer + UndefinedBehaviorSanitizer.
#   deploy/test.sh            both builds
#   deploy/test.sh --plain    only the plain build (quicker, while developing)
# After the sanitizer build, the libFuzzer harnesses (tests/fuzz/run.sh) run
# FUZZ_SECONDS (default 20) each.
# A test that cannot run here exits 77 (ctest's skip) and prints
# "SKIP name: why"; the run ends with the list of skips and their reasons.
# With CI=true a skip fails the run unless its name is in PW_EXPECTED_SKIPS
# (space-separated; deploy/fresh-check.sh names what a chroot cannot give).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=$(nproc 2>/dev/null || echo 2)

bash deploy/install-deps.sh

SKIPS=()          # "dir name: why" for every skipped test of every build

run_suite() {
  local dir=$1; shift
  echo "== configure $dir ($*)"
  cmake -S "$ROOT" -B "$ROOT/$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  echo "== build $dir"
  cmake --build "$ROOT/$dir" -j "$JOBS"
  echo "== test $dir"
  local rc=0
  (cd "$ROOT/$dir" && ctest --output-on-failure -j "$JOBS" --timeout 900) | tee "$ROOT/$dir/ctest.out" || rc=$?
  local name why
  for name in $(sed -n 's/.*Test *#[0-9]*: \([A-Za-z0-9_]*\) .*\*\*\*Skipped.*/\1/p' "$ROOT/$dir/ctest.out"); do
    why=$(grep -h -m1 "^SKIP $name: " "$ROOT/$dir"/Testing/Temporary/LastTest*.log 2>/dev/null | sed "s/^SKIP $name: //")
    SKIPS+=("$dir $name: ${why:-no reason printed}")
  done
  [ "$rc" -eq 0 ] || { report_skips; echo "== tests FAILED in $dir"; exit "$rc"; }
}

report_skips() {
  [ ${#SKIPS[@]} -gt 0 ] || { echo "== no test skipped"; return 0; }
  echo "== skipped tests (${#SKIPS[@]}):"
  local s
  for s in "${SKIPS[@]}"; do echo "   $s"; done
}

# CI=true: a skip is a failure unless it was expected by name.
check_skips() {
  [ "${CI:-}" = true ] || return 0
  local s name bad=0
  for s in "${SKIPS[@]}"; do
    name=${s#* }; name=${name%%:*}
    case " ${PW_EXPECTED_SKIPS:-} " in
      *" $name "*) ;;
      *) echo "== CI=true: $name was skipped unexpectedly"; bad=1 ;;
    esac
  done
  return $bad
}

export OPENBLAS_NUM_THREADS=1
# The Release flags (-O3) warn about other things than -O2:
# build them too, so quickstart and the benchmarks always compile.
echo "== build build-release (Release, no tests)"
cmake -S "$ROOT" -B "$ROOT/build-release" -DCMAKE_BUILD_TYPE=Release -DPW_TESTS=OFF >/dev/null
cmake --build "$ROOT/build-release" -j "$JOBS"
run_suite build -DPW_WERROR=ON
if [ "${1:-}" != "--plain" ]; then
  # detect_leaks: every allocation must be freed by shutdown.
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # PW_CPU=avx2 (lib/base/cpu.h): the sanitized suite runs without AVX-512,
  # the plain one with what this host has, so CI covers both code paths.
  PW_CPU=avx2 run_suite build-asan -DPW_SANITIZE=ON -DPW_WERROR=ON
  # The fuzz harnesses, FUZZ_SECONDS (default 20) each, under ASan + UBSan.
  echo "== fuzz (tests/fuzz/run.sh, ${FUZZ_SECONDS:-20} s per harness)"
  bash tests/fuzz/run.sh || { report_skips; echo "== FAILED: a fuzz harness found something"; exit 1; }
fi
report_skips
check_skips || { echo "== FAILED: unexpected skips (set PW_EXPECTED_SKIPS to allow them by name)"; exit 1; }
echo "== all tests passed"
