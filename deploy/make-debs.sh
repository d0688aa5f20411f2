#!/bin/sh
# make-debs.sh [BUILD_DIR [OUT_DIR]]: the Debian packages (docs/deploy.md)
# from a portable Release build: pipewright (the CLI), pipewright-common,
# pipewright-coordinator and pipewright-worker, versioned from the project.
# BUILD_DIR defaults to build-release (what deploy/test.sh builds), OUT_DIR
# to BUILD_DIR/debs. Runs as any user: cpack sets the files' owners itself.
# Needs cmake (cpack) and dpkg-dev (dpkg-shlibdeps computes each package's
# Depends from the libraries its binaries link).
set -eu
cd "$(dirname "$0")/.."
build=${1:-build-release}
out=${2:-$build/debs}
command -v dpkg-shlibdeps >/dev/null || { echo "make-debs.sh: dpkg-shlibdeps is missing: apt-get install dpkg-dev" >&2; exit 1; }
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPW_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$build" && cpack -G DEB -B "$out") | grep 'package:' || { echo "make-debs.sh: cpack failed" >&2; exit 1; }
rm -rf "$out/_CPack_Packages"
ls -l "$out"/*.deb
