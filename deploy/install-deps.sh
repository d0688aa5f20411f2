#!/usr/bin/env bash
# install-deps.sh: the Debian packages pipewright needs. Safe to re-run:
# apt-get skips what is installed.
#   deploy/install-deps.sh            build, run and test (deploy/test.sh):
#                                     also the test tools' virtual environment
#                                     (.venv/, PyPI, pinned: deploy/venv.sh)
#   deploy/install-deps.sh --runtime  build and run only (deploy/quickstart.sh):
#                                     no PyTorch, browser, fuzzing or
#                                     benchmark tools
# Nothing here reaches npm.
set -euo pipefail

# To build and run: the compiler, the five libraries, oneDNN (the bf16
# matrix multiplies of train.precision "bf16"), libcurl for the CLI,
# curl and python3 for quickstart.sh's own requests.
PACKAGES=(
  build-essential cmake pkg-config curl ca-certificates python3
  libopenblas-dev libdnnl-dev libjansson-dev libuv1-dev libmicrohttpd-dev libsqlite3-dev
  libcurl4-openssl-dev
  libpcre2-dev libutf8proc-dev            # tokenizers: the pre-tokenizers' Unicode regexes, NFC
)
[ "${1:-}" = --runtime ] || PACKAGES+=(
  git sqlite3 openssl                     # tests: store checks, test certificates
  libcmocka-dev
  clang libclang-rt-14-dev                # libFuzzer harnesses (tests/fuzz/)
  python3-numpy python3-torch python3-jsonschema python3-yaml python3-requests  # PyTorch reference, schema checks, transformers (.venv-hf)
  python3-venv                            # .venv/: the PyPI test tools (deploy/venv.sh)
  chromium fonts-dejavu-core              # the dashboard's browser test (driven by Playwright from .venv/)
  iproute2 systemd                        # multi-host (netns) and unit tests
  slurmctld slurmd slurm-client munge     # test_slurm: deploy/slurm/'s batch script under a real Slurm
  file                                    # test_deb: cpack's DEB generator runs it (dpkg-shlibdeps)
  wrk                                     # control-plane benchmark
  prometheus                              # promtool and the server: deploy/prometheus/'s rules and a live
                                          # scrape (test_prometheus); the package enables its own service
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  SUDO="sudo"
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install-deps: done"
  # Debian's prometheus starts a server on :9090 where systemd runs; the tests start their own
  case " ${missing[*]} " in
    *" prometheus "*) [ ! -d /run/systemd/system ] ||
      echo "install-deps: prometheus.service is enabled by its package; 'systemctl disable --now prometheus' if this host should not run it" ;;
  esac
fi
# The PyPI tools of the tests, pinned: .venv/, and .venv-hf/ (transformers over Debian's PyTorch).
[ "${1:-}" = --runtime ] || echo "install-deps: test tools in $(bash "$(dirname "$0")/venv.sh")"
[ "${1:-}" = --runtime ] || echo "install-deps: transformers in $(bash "$(dirname "$0")/venv.sh" hf)"
