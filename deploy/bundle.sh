#!/usr/bin/env bash
# bundle.sh: pipewright as one relocatable tarball, for hosts without its
# Debian packages (a GPU node of another distribution, a cluster's shared
# file system, a device check):
#
#   deploy/bundle.sh [BUILD] [OUT.tar.gz]
#
# BUILD (default build-release) holds the three binaries; OUT defaults to
# BUILD/pipewright-bundle-VERSION-x86_64.tar.gz. The tarball unpacks into
# one folder:
#
#   bin/pipewright, bin/pipewright-coordinator, bin/pipewright-worker
#        small sh scripts: each runs its binary through the bundle's own
#        dynamic loader with the bundle's libraries first
#   libexec/   the binaries themselves (stripped)
#   lib/       every shared library they load, the loader and glibc too
#              (ldd's list), so nothing of the host's is needed but the
#              kernel; a library the host has is still found after these
#              (the loader's own search: CUDA's come from the host)
#   share/pipewright/web/   the dashboard (--web)
#   README     what this is and how to run it
#
# Runs anywhere: unpack, then e.g. `DIR/bin/pipewright train --job J`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build-release}" && pwd)
BINS=(pipewright pipewright-coordinator pipewright-worker)
# PW_BUNDLE_EXTRA: more of BUILD's programs, by path ("bench/bench_step":
# the device checks' benchmark), bundled the same way under their base name
for x in ${PW_BUNDLE_EXTRA:-}; do BINS+=("$x"); done
for b in "${BINS[@]}"; do
  [ -x "$BUILD/$b" ] || { echo "bundle: $BUILD/$b is missing (build first: cmake --build $BUILD)" >&2; exit 1; }
done
VERSION=$("$BUILD/pipewright" --version 2>/dev/null | awk '{print $NF; exit}')
VERSION=${VERSION:-0}
OUT=${2:-$BUILD/pipewright-bundle-$VERSION-x86_64.tar.gz}
NAME=pipewright-$VERSION
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
D=$TMP/$NAME
mkdir -p "$D/bin" "$D/libexec" "$D/lib" "$D/share/pipewright"

# The libraries, as the loader resolves them here (ldd): every one, glibc
# and the loader included, but the kernel's vdso and CUDA's own (taken from
# the host that has the GPU).
loader=""
for b in "${BINS[@]}"; do
  cp "$BUILD/$b" "$D/libexec/$(basename "$b")"
  strip --strip-unneeded "$D/libexec/$(basename "$b")"
  while read -r lib path; do
    case "$lib" in
      linux-vdso*|libcuda.so*|libcudart*|libcublas*|libcudnn*|libnccl*|libnvidia*) continue ;;
    esac
    if [ -z "$path" ] && [ "${lib#/}" != "$lib" ]; then path=$lib; loader=$(basename "$lib"); fi
    [ -n "$path" ] && [ -e "$path" ] || { echo "bundle: $b needs $lib, which ldd does not find" >&2; exit 1; }
    [ -e "$D/lib/$(basename "$lib")" ] || cp -L "$path" "$D/lib/$(basename "$lib")"
  done < <(ldd "$BUILD/$b" | awk '$2 == "=>" {print $1, $3; next} {print $1, ""}')
done
[ -n "$loader" ] || { echo "bundle: ldd named no dynamic loader" >&2; exit 1; }
chmod 755 "$D/lib/$loader"
for f in "$D"/lib/*.so*; do strip --strip-unneeded "$f" 2>/dev/null || true; done

for p in "${BINS[@]}"; do
  b=$(basename "$p")
  cat >"$D/bin/$b" <<EOF
#!/bin/sh
# $b from the bundle: its own loader, its own libraries first.
here=\$(dirname "\$(readlink -f "\$0")")/..
exec "\$here/lib/$loader" --library-path "\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" "\$here/libexec/$b" "\$@"
EOF
  chmod 755 "$D/bin/$b"
done
cp -r "$ROOT/web" "$D/share/pipewright/web"
cat >"$D/README" <<EOF
pipewright $VERSION, relocatable (deploy/bundle.sh): no package to install.

  bin/pipewright train --job JOB.json --out model.safetensors
  bin/pipewright-coordinator --web share/pipewright/web ...
  bin/pipewright-worker --coordinator HOST:PORT ...

bin/ runs each binary in libexec/ through lib/$loader with lib/ first:
the libraries it was built with (Debian 12's), glibc included, whatever
this host has. docs/deploy.md in the source says more.
EOF
mkdir -p "$(dirname "$OUT")"
tar -C "$TMP" -czf "$OUT.tmp" "$NAME"
mv "$OUT.tmp" "$OUT"
echo "$OUT: $(du -m "$OUT" | cut -f1) MB, $(ls "$D/lib" | wc -l) libraries"
