#!/usr/bin/env bash
# test_bundle: deploy/bundle.sh's tarball runs on its own (issue 40's
# relocatable bundle; how device checks and GPU nodes get pipewright).
# From the build under test: the tarball is at most 40 MB; unpacked in a
# fresh folder, its three binaries start through its own loader; a
# training run from it loads every library from the bundle's lib/ (the
# loader's own trace, LD_DEBUG=libs, names no other folder: nothing of the
# host's is needed) and writes the same model, bit for bit, as the build's
# own binary.
set -uo pipefail
BUILD=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd)
T=$(mktemp -d /tmp/pw-bundle-XXXXXX)
fail=0
check() { if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
trap '[ "$fail" = 0 ] && rm -rf "$T" || echo "kept $T"' EXIT
bash "$SRC/deploy/bundle.sh" "$BUILD" "$T/pw.tar.gz" >"$T/bundle.log" 2>&1
check "deploy/bundle.sh makes the tarball" $?
size=$(stat -c %s "$T/pw.tar.gz" 2>/dev/null || echo 0)
check "it is at most 40 MB ($((size / 1048576)) MB)" "$([ "$size" -gt 0 ] && [ "$size" -le $((40 * 1048576)) ] && echo 0 || echo 1)"
mkdir -p "$T/x" && tar -C "$T/x" -xzf "$T/pw.tar.gz"
D=$(ls -d "$T"/x/pipewright-*)
for b in pipewright pipewright-coordinator pipewright-worker; do
  env -i PATH=/usr/bin:/bin "$D/bin/$b" --version >/dev/null 2>&1
  check "bin/$b starts from the unpacked folder" $?
done
JOB=$SRC/examples/jobs/mlp.json
env -i PATH=/usr/bin:/bin OPENBLAS_NUM_THREADS=1 LD_DEBUG=libs LD_DEBUG_OUTPUT="$T/ld" \
  "$D/bin/pipewright" train --job "$JOB" --steps 5 --out "$T/bundle.st" --quiet >"$T/train.log" 2>&1
check "a training run from the bundle succeeds" $?
# the loader's trace of the process: the wrapper (the host's sh) execs the
# bundle's loader in the same process, so what counts is what comes after
# the first line naming the bundle — every library from its lib/
ours=$(grep -l "calling init: $D" "$T"/ld.* 2>/dev/null | head -n 1)
inits=$(awk -v d="$D" 'index($0, d) { on = 1 } on && /calling init:/ { print $NF }' $ours 2>/dev/null)
outside=$(echo "$inits" | grep -v "^$D/bin/../lib/" | grep -v '^$' | sort -u)
loaded=$(echo "$inits" | grep -c "^$D/bin/../lib/")
check "every library it loads ($loaded) comes from the bundle's lib/${outside:+, not: $outside}" \
  "$([ -n "$ours" ] && [ "$loaded" -ge 10 ] && [ -z "$outside" ] && echo 0 || echo 1)"
OPENBLAS_NUM_THREADS=1 "$BUILD/pipewright" train --job "$JOB" --steps 5 --out "$T/build.st" --quiet >/dev/null 2>&1
cmp -s "$T/bundle.st" "$T/build.st"
check "its model equals the build's own binary's, bit for bit" $?
exit $fail
