#!/usr/bin/env bash
# test_readme_tour: the README's "A short tour", every shell block in order,
# as written, right after `deploy/quickstart.sh` (whose daemons are still
# running, as they are for a user). Runs in a copy of the checkout's
# README, deploy/, examples/, web/ and api/, with build-release standing
# for the build under test, so nothing is written into the source tree.
#
# Checks: the quickstart's job succeeds; every tour command exits 0 (the
# blocks run under `set -e`); then what the tour claims: the one-process
# runs wrote their files, jobs 1 (gpt-tiny) and 2 (its fine-tune from job
# 1's step 300) succeeded on the tour's coordinator, job 3 (gpt-pp4) was
# accepted and runs to the end, the dataset fetched back equals the one
# uploaded, the Perfetto trace and the downloaded models are there.
#
# The tour binds 127.0.0.1:8080 and :7070; if another program holds them
# the test is skipped (77), naming it.
set -uo pipefail
BUILD=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd)
say() { echo "== $*"; }
fail=0
check() { if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

for p in 8080 7070; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "SKIP test_readme_tour: port $p is taken on 127.0.0.1 (the tour's commands use 8080 and 7070)"
    exit 77
  fi
done

T=$(mktemp -d /tmp/pw-tour-XXXXXX)
cleanup() {
  [ -n "${TOUR_PID:-}" ] && kill -- -"$TOUR_PID" 2>/dev/null
  [ -f "$T/runs/quickstart/pids" ] && bash "$T/deploy/quickstart.sh" --stop >/dev/null 2>&1
  sleep 0.5
  [ -n "${TOUR_PID:-}" ] && kill -KILL -- -"$TOUR_PID" 2>/dev/null
  if [ "$fail" = 0 ]; then rm -rf "$T"; else echo "kept $T"; fi
}
trap cleanup EXIT
cp -r "$SRC/README.md" "$SRC/deploy" "$SRC/examples" "$SRC/web" "$SRC/api" "$T/"
rm -f "$T/examples/data/corpus.tok"
ln -s "$(cd "$BUILD" && pwd)" "$T/build-release"

say "deploy/quickstart.sh (dependencies skipped, the build under test)"
(cd "$T" && PW_SKIP_DEPS=1 PW_BUILD_DIR="$BUILD" bash deploy/quickstart.sh) >"$T/quickstart.log" 2>&1
rc=$?
tail -n 6 "$T/quickstart.log"
check "the quickstart trains its job and leaves the dashboard up" "$rc"
[ "$rc" = 0 ] || { tail -n 30 "$T/quickstart.log"; exit 1; }

# Every ```sh block between "## A short tour" and the next "## " heading.
awk '/^## A short tour/ { on = 1; next } on && /^## / { exit }
     on && /^```sh$/ { code = 1; print "# ---- block " ++n; next }
     code && /^```$/ { code = 0; next } code { print }' "$T/README.md" >"$T/tour-body.sh"
blocks=$(grep -c '^# ---- block' "$T/tour-body.sh")
check "the tour has its shell blocks ($blocks)" "$([ "$blocks" -ge 5 ] && echo 0 || echo 1)"
{ echo 'set -euo pipefail'; echo 'set -x'; cat "$T/tour-body.sh"; } >"$T/tour.sh"

say "the tour ($blocks blocks)"
# its own session: the coordinator and workers it starts with & are killed with it
(cd "$T" && exec setsid bash tour.sh) >"$T/tour.log" 2>&1 &
TOUR_PID=$!
wait "$TOUR_PID"
rc=$?
check "every command of the tour exits 0" "$rc"
[ "$rc" = 0 ] || tail -n 40 "$T/tour.log"

API=http://127.0.0.1:8080
state() { curl -sf "$API/v1/jobs/$1" | sed -n 's/.*"state": *"\([a-z]*\)".*/\1/p' | head -n 1; }
for f in runs/gpt.safetensors runs/gpt400.safetensors runs/ft.safetensors zb.json runs/gpt-cluster.safetensors \
         model.safetensors s300.safetensors trace.json; do
  check "the tour wrote $f" "$([ -s "$T/$f" ] && echo 0 || echo 1)"
done
check "job 1 (gpt-tiny on the cluster) succeeded" "$([ "$(state 1)" = succeeded ] && echo 0 || echo 1)"
check "job 2 (the fine-tune from job 1's step 300) succeeded" "$([ "$(state 2)" = succeeded ] && echo 0 || echo 1)"
for _ in $(seq 600); do
  s=$(state 3); case "$s" in succeeded|failed|cancelled) break ;; esac; sleep 0.2
done
check "job 3 (gpt-pp4 from the endpoint list) succeeded on the 4 workers" "$([ "$(state 3)" = succeeded ] && echo 0 || echo 1)"
check "the dataset read back equals the token file uploaded" \
  "$(cmp -s "$T/copy.tok" "$T/examples/data/corpus.tok" && echo 0 || echo 1)"
check "trace.json is a Chrome trace" "$(grep -q traceEvents "$T/trace.json" && echo 0 || echo 1)"
[ "$fail" = 0 ] || { echo "logs: $T/quickstart.log $T/tour.log"; exit 1; }
echo "all passed"
