#!/usr/bin/env bash
# run.sh: build the libFuzzer harnesses with clang and run each one.
#   tests/fuzz/run.sh [--build-only] [NAME...]   default: every tests/fuzz/fuzz_*.c
# --build-only builds the harnesses and stops (deploy/test.sh builds them
# while the sanitizer suite runs, then runs them).
# FUZZ_SECONDS (default 20) per harness, FUZZ_JOBS (default: the cores)
# harnesses at once; BUILD (default build-fuzz) the build dir. Each harness starts from its seed corpus in corpus/NAME/ (in
# the repo) and writes what it finds to BUILD/fuzz-out/NAME/ (a fresh copy
# of the corpus: the repo's seeds stay as they are). A crash, leak, UBSan
# report or timeout fails the run and leaves the reproducer in
# BUILD/fuzz-out/ (rerun it: BUILD/tests/fuzz/NAME FILE). Prints executions and
# coverage per harness.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-fuzz}
SECS=${FUZZ_SECONDS:-20}
command -v clang >/dev/null || { echo "fuzz: clang is missing (deploy/install-deps.sh installs it)" >&2; exit 1; }

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPW_SANITIZE=ON -DPW_FUZZ=ON -DPW_TESTS=OFF -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link >/dev/null
BUILD_ONLY=0
[ "${1:-}" = --build-only ] && { BUILD_ONLY=1; shift; }
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in "$HERE"/fuzz_*.c; do names+=("$(basename "$f" .c)"); done
fi
cmake --build "$BUILD" -j "$(nproc 2>/dev/null || echo 2)" --target "${names[@]}"
[ "$BUILD_ONLY" = 0 ] || exit 0

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OPENBLAS_NUM_THREADS=1
# fuzz_one NAME: one harness from its seeds for SECS; prints one line.
fuzz_one() {
  local n=$1 out=$BUILD/fuzz-out/$1
  rm -rf "$out"; mkdir -p "$out/corpus"
  [ -d "$HERE/corpus/$n" ] && cp "$HERE/corpus/$n"/* "$out/corpus/" 2>/dev/null || true
  local dict=(); [ -f "$HERE/$n.dict" ] && dict=(-dict="$HERE/$n.dict")
  if (cd "$out" && "$BUILD/tests/fuzz/$n" "${dict[@]}" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 "$out/corpus" >"$out/log" 2>&1); then
    echo "fuzz $n: ok, $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$out/log" | grep -o '[0-9]*$') runs" \
         "in ${SECS} s, $(grep -o 'cov: [0-9]*' "$out/log" | tail -1), corpus $(ls "$out/corpus" | wc -l) inputs"
  else
    echo "fuzz $n: FAILED (log: $out/log; reproducer: $(ls "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-* 2>/dev/null | head -1))"
    grep -m5 -E 'ERROR|SUMMARY|runtime error|abort|differs|refused' "$out/log" | sed 's/^/    /'
    return 1
  fi
}

# One harness per core at a time (each is one process on one core): the
# same seconds of fuzzing each, in a fraction of the wall time.
JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$BUILD/fuzz-out"
for n in "${names[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  fuzz_one "$n" >"$BUILD/fuzz-out/$n.line" 2>&1 &
done
wait
fail=0
for n in "${names[@]}"; do
  cat "$BUILD/fuzz-out/$n.line"
  grep -q "^fuzz $n: ok" "$BUILD/fuzz-out/$n.line" || fail=1
done
exit $fail
