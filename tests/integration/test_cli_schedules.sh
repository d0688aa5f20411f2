#!/usr/bin/env bash
# test_cli_schedules: `pipewright schedules` offline — the catalogue (nine
# rows), one schedule's model-free figures (the bubbles at p = 4,
# m = 8: 1f1b 3/11, zb-h1 3/27, interleaved-1f1b v = 2 3/19; total steps;
# the grid) and each refusal naming its option, with exit 2.
set -euo pipefail
BUILD=$1; SRC=$2
PW="$BUILD/pipewright"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$PW" schedules > "$T/list.txt"
for s in gpipe 1f1b eager1f1b zb-h1 interleaved-1f1b interleaved-gpipe interleaved-1f1b-plus-one kimi-k2 dualpipev; do
  grep -q "^$s  *[a-z-]*  .*virtual_stages" "$T/list.txt" || fail "the list has no row for $s"
done
"$PW" schedules --json | /usr/bin/python3 -c 'import json,sys; assert len(json.load(sys.stdin)["schedules"]) == 9'

expect() {  # expect "ARGS" "line the output must hold"
  # shellcheck disable=SC2086
  "$PW" schedules $1 > "$T/out.txt" || fail "schedules $1: exit $?"
  grep -qF -- "$2" "$T/out.txt" || { cat "$T/out.txt"; fail "schedules $1: no '$2'"; }
}
expect "1f1b --pp 4 --m 8" "bubble 0.2727 (closed form (p-1)/(m+p-1) = 0.2727), total steps 33, makespan 33"
expect "1f1b --pp 4 --m 8" "r3 | .  .  .  F0 B0 B0 F1 B1 B1"
expect "ZeroBubbleH1 --pp 4 --m 8" "bubble 0.1111 (closed form (p-1)/(3m+p-1) = 0.1111), total steps 27"
expect "interleaved-1f1b --pp 4 --m 8 --v 2" "bubble 0.1579 (closed form (p-1)/(vm+p-1) = 0.1579), total steps 57, makespan 28.5"
expect "interleaved-1f1b --pp 4 --m 8" "2 stages per rank (8 stages)"
# every action one step: SpectraX's count (docs/schedules.md's table)
expect "1f1b --pp 4 --m 8 --costs 1,1,1,1" "total steps 22"
expect "dualpipev --pp 4 --m 8 --costs 1,1,1,1" "total steps 42"

refuse() {  # refuse "ARGS" "message"
  local rc=0
  # shellcheck disable=SC2086
  "$PW" schedules $1 > /dev/null 2> "$T/err.txt" || rc=$?
  [ "$rc" -eq 2 ] || fail "schedules $1: exit $rc, wanted 2"
  grep -qF -- "$2" "$T/err.txt" || { cat "$T/err.txt"; fail "schedules $1: no '$2'"; }
}
refuse "1f1c --pp 4 --m 8" 'unknown schedule "1f1c"; did you mean 1f1b?'
refuse "1f1b --pp 65 --m 8" "--pp: '65' is too large"
refuse "1f1b --pp 4" "missing --m M"
refuse "1f1b --pp 4 --m 8 --v 2" "--v: 1f1b is a flat schedule and needs virtual_stages = 1 (got 2)"
refuse "dualpipev --pp 4 --m 5" "--m: dualpipev needs microbatches >= 2*pp (got 5 < 8)"
refuse "interleaved-1f1b --pp 4 --m 6" "--m: interleaved-1f1b needs microbatches to be a multiple of pp"
refuse "1f1b --pp 64 --m 1024" "--m: pp * v * m = 65536 is too large (limit 16384)"
refuse "1f1b --pp 4 --m 8 --costs 1,2,1" "--costs: want four numbers F,B,I,W"
refuse "1f1b --pp 4 --m 8 --costs 1,0,1,1" "--costs: B must be a number above 0"
refuse "--pp 4" "need a schedule NAME"
echo "PASS test_cli_schedules"
