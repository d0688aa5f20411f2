#!/usr/bin/env bash
# test.sh: the whole suite from a clean checkout — install dependencies,
# configure, build and run the tests in two builds: a plain build (the
# Release flags users run, -O3, with debug information), then a build with
# AddressSanitizer + UndefinedBehaviorSanitizer.
#   deploy/test.sh            both builds
#   deploy/test.sh --plain    only the plain build (quicker, while developing)
# After the sanitizer build, the libFuzzer harnesses (tests/fuzz/run.sh) run
# FUZZ_SECONDS each, one per core at a time: 7 here (13 harnesses: the
# suite's 15 minutes on 2 cores), 20 when run.sh runs alone.
# Each test runs in the build where it finds what it checks (PLAIN_ONLY,
# SANITIZED_ONLY below; --plain runs every test in the plain build).
# The builds that come next (build-asan, build-fuzz) compile
# at nice 19 while a suite runs: on 2 cores they take only the time the
# tests leave idle, and the tests keep the cores when they want them.
# A test that cannot run here exits 77 (ctest's skip) and prints
# "SKIP name: why"; the run ends with the list of skips and their reasons.
# With CI=true a skip fails the run unless its name is in PW_EXPECTED_SKIPS
# (space-separated; deploy/fresh-check.sh names what a chroot cannot give).
# Each stage's seconds are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=$(nproc 2>/dev/null || echo 2)

bash deploy/install-deps.sh

SKIPS=()          # "dir name: why" for every skipped test of every build

STAGES=()        # "seconds stage" for the summary
stage_start() { STAGE_T0=$(date +%s); }
stage_end() { STAGES+=("$(printf '%5d s  %s' $(($(date +%s) - STAGE_T0)) "$1")"); }

# configure DIR ARGS...: a build directory (quick; the builds come later).
configure() {
  local dir=$1; shift
  echo "== configure $dir ($*)"
  cmake -S "$ROOT" -B "$ROOT/$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
}

# build_bg LOG CMD...: a build (a command or a function) in the background
# at nice 19; bg_wait waits and says how it went.
BG_PID=""
trap '[ -z "$BG_PID" ] || { pkill -TERM -P "$BG_PID"; kill "$BG_PID"; } 2>/dev/null || true' EXIT
build_bg() {
  local log=$1; shift
  BG_LOG=$log
  (renice -n 19 -p "$BASHPID" >/dev/null && "$@") >"$log" 2>&1 &
  BG_PID=$!
}
bg_wait() {
  [ -n "$BG_PID" ] || return 0
  local rc=0
  wait "$BG_PID" || rc=$?
  BG_PID=""
  if [ "$rc" -ne 0 ]; then tail -n 40 "$BG_LOG"; echo "== build FAILED (log: $BG_LOG)"; exit "$rc"; fi
}

# Tests run once, in the build where they find what they check (both
# builds register every test; a developer's ctest runs them all):
# - plain only: test_readme_tour and test_screenshots check the docs (the
#   README's commands, the pictures), test_deb packages and installs the
#   binaries (a sanitized package is no package), test_steady_memory counts
#   page faults (under ASan it only prints), test_prometheus checks
#   deploy/'s Prometheus and Grafana files against promtool and a live
#   /metrics; test_layers, test_docs and test_k8s_validate read the source,
#   objects and manifests, not run them; test_bundle packs the binaries;
#   test_tokenizers holds the whole corpus's ids to Hugging Face's (the
#   tokenizer's memory safety is test_tokenizer's, sanitized, and
#   fuzz_tokenizer's); test_attention's memory check holds only there (the
#   tiled kernel runs sanitized in test_ops_flash); test_hf_ref and
#   test_hf_ref_v5 hold import/export to transformers (hf.c's memory safety
#   is test_hf's, test_hf_bert's and fuzz_hf_config's, sanitized); the code
#   they run is run under the sanitizers by the CLI,
#   coordinator, dashboard, test_openapi (/metrics, its planned step) and
#   test_coord_faults (the divergence counter) tests;
# - sanitized only: the orchestration and daemon tests (kills, lost links,
#   full disks, fetches, descriptors, the coordinator's API, the dashboard,
#   hosts in namespaces, systemd), where memory errors hide on failure
#   paths and whose assertions do not depend on the CPU's kernels; and the
#   GPU kernels' emulations (test_cu_*_emul) and the attention masks'
#   kernels (test_ops_attn_mask), whose indexing is what they check;
# - the numerics tests (NUMERICS: pipelines, tp, ZeRO, the PyTorch
#   references) check what the CPU's kernels compute: the plain build runs
#   this host's widest kernels, the sanitized one PW_CPU=avx2 (below). On a
#   host with AVX-512 the two builds run different kernels and the numerics
#   run in both; on one without, the kernels are the same and each runs
#   once: test_pipeline (every schedule's runtime; its model families,
#   test_pipeline_models, plain) and test_generate_ref
#   (the decode paths) under the sanitizers, the rest in the plain build.
PLAIN_ONLY="test_readme_tour|test_screenshots|test_deb|test_steady_memory|test_prometheus|test_layers|test_layers_plant|test_docs"
PLAIN_ONLY+="|test_k8s_validate|test_bundle|test_tokenizers|test_attention|test_hf_ref_v5|test_hf_ref"
SANITIZED_ONLY="test_chaos|test_recovery|test_coord_faults|test_dataset_fetch|test_datasets|test_cli_dataset|test_worker_fds|test_tensorboard"
SANITIZED_ONLY+="|test_coordinator|test_dashboard|test_cli_remote|test_netns|test_ckpt_store|test_placement|test_systemd|test_multihost|test_serve"
SANITIZED_ONLY+="|test_drain|test_slurm|test_cgroup_resources|test_k8s_netns|test_pinning|test_serve_text|test_hf_cluster"
SANITIZED_ONLY+="|test_cu_emul|test_cu_attn_emul|test_cu_attn_bf16_emul|test_cu_fa_emul|test_ops_attn_mask"
NUMERICS_SAN="test_pipeline|test_generate_ref"
NUMERICS_PLAIN="test_tp_matrix|test_zero|test_torch_ref|test_remat|test_regions_pipeline|test_bf16_pipeline|test_pipeline_models"
NUMERICS_PLAIN+="|test_tensor_parallel|test_lora_ref|test_frozen_ref|test_custom_schedule|test_eval_loss|test_cli_calibrate"
NUMERICS_PLAIN+="|test_calibrate_auto"
PLAIN_SKIP=$SANITIZED_ONLY
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "== this CPU has AVX-512: the numerics tests run in both builds"
else
  echo "== this CPU has no AVX-512: both builds run the AVX2 kernels, each numerics test runs once"
  PLAIN_SKIP+="|$NUMERICS_SAN"
  PLAIN_ONLY+="|$NUMERICS_PLAIN"
fi

# run_suite DIR [CTEST ARGS...]: ctest in a built directory.
run_suite() {
  local dir=$1; shift
  echo "== test $dir $*"
  local rc=0
  (cd "$ROOT/$dir" && ctest --output-on-failure -j "$JOBS" --timeout 900 "$@") | tee "$ROOT/$dir/ctest.out" || rc=$?
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

# The GPU tests (tests/gpu/, built where nvcc is) skip where no NVIDIA GPU
# is visible: CI's machines have the toolkit and no GPU. tests/gpu/run.sh
# runs them, and the rest of the GPU checks, on a machine with one.
GPU_TESTS="test_cuda_ops test_cuda_attn test_cuda_bf16"
nvidia-smi -L >/dev/null 2>&1 || PW_EXPECTED_SKIPS="${PW_EXPECTED_SKIPS:-} $GPU_TESTS"
# test_hf_ref_v5 (transformers 5, Qwen3) runs over PyTorch 2 from PyPI, ~2 GB
# that CI does not download: it skips where bench/torch2_venv.sh's
# environment (or PW_TORCH2_PYTHON) is not there.
[ -x "${PW_TORCH2_PYTHON:-$ROOT/.venv-torch2/bin/python3}" ] || PW_EXPECTED_SKIPS="${PW_EXPECTED_SKIPS:-} test_hf_ref_v5"

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
T_ALL=$(date +%s)
PLAIN=0; [ "${1:-}" = "--plain" ] && PLAIN=1
ASAN_ENV=(ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PW_CPU=avx2)
# The plain build has the Release flags (-O3: what quickstart and the
# packages build, and -O3 warns about other things than -O2) plus -g for
# the stack traces of a failure.
configure build -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS=-g -DPW_WERROR=ON
# detect_leaks: every allocation must be freed by shutdown. PW_CPU=avx2
# (common/base/cpu.h): the sanitized suite runs without AVX-512, the plain one
# with what this host has, so CI covers both code paths.
[ "$PLAIN" = 1 ] || configure build-asan -DPW_SANITIZE=ON -DPW_WERROR=ON

stage_start
echo "== build build"
cmake --build "$ROOT/build" -j "$JOBS"
stage_end "build build (plain)"

# While the plain suite runs: build-asan, at nice 19.
[ "$PLAIN" = 1 ] || build_bg "$ROOT/build/bg-build.log" cmake --build "$ROOT/build-asan" -j "$JOBS"
stage_start
if [ "$PLAIN" = 1 ]; then run_suite build; else run_suite build -E "^($PLAIN_SKIP)\$"; fi
stage_end "test build (plain suite; build-asan compiled beside it)"
stage_start
bg_wait
stage_end "rest of build-asan"

if [ "$PLAIN" = 0 ]; then
  # While the sanitizer suite runs: the fuzz harnesses, at nice 19.
  mkdir -p "$ROOT/build-fuzz"
  build_bg "$ROOT/build-fuzz/bg-build.log" bash tests/fuzz/run.sh --build-only
  stage_start
  export "${ASAN_ENV[@]}"
  run_suite build-asan -E "^($PLAIN_ONLY)\$"
  stage_end "test build-asan (sanitizer suite; build-fuzz compiled beside it)"
  stage_start
  bg_wait
  stage_end "rest of build-fuzz"
  stage_start
  export FUZZ_SECONDS=${FUZZ_SECONDS:-7}
  echo "== fuzz (tests/fuzz/run.sh, $FUZZ_SECONDS s per harness)"
  bash tests/fuzz/run.sh || { report_skips; echo "== FAILED: a fuzz harness found something"; exit 1; }
  stage_end "fuzz"
fi
report_skips
check_skips || { echo "== FAILED: unexpected skips (set PW_EXPECTED_SKIPS to allow them by name)"; exit 1; }
echo "== stages:"
printf '   %s\n' "${STAGES[@]}"
echo "== all tests passed in $(($(date +%s) - T_ALL)) s (after installing)"
