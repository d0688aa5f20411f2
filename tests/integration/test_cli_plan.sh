#!/usr/bin/env bash
# test_cli_plan: `pipewright plan` on the example jobs — the table, the
# compare view, the JSON document (what POST /v1/plans will return), the
# Chrome trace, and a schedule the job cannot run.
set -euo pipefail
BUILD=$1; SRC=$2
PW="$BUILD/pipewright"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cd "$SRC"
fail() { echo "FAIL: $*" >&2; exit 1; }
PY=/usr/bin/python3

"$PW" plan --job examples/jobs/gpt-tiny.json > "$T/plan.txt"
grep -q '^r0 | F0' "$T/plan.txt" || fail "no grid row for rank 0"
grep -q 'bubble' "$T/plan.txt" || fail "no analytics"

"$PW" plan --job examples/jobs/gpt-tiny.json --compare > "$T/cmp.txt"
for s in gpipe 1f1b eager1f1b zb-h1 interleaved-1f1b interleaved-gpipe interleaved-1f1b-plus-one kimi-k2 dualpipev; do
  grep -q "^$s " "$T/cmp.txt" || fail "compare has no row for $s"
done

"$PW" plan --job examples/jobs/gpt-tiny.json --schedule zb-h1 --json --trace "$T/trace.json" > "$T/plan.json"
$PY - "$T/plan.json" "$T/trace.json" <<'P'
import json, sys
p = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
assert p["schedule"] == "zb-h1", p["schedule"]
a = p["analytics"]
assert 0 < a["bubble_ratio"] < 0.5, a["bubble_ratio"]
assert len(p["plan"]["ranks"]) == 2
kinds = " ".join(p["plan"]["ranks"])
assert kinds.count("I") == 8 and kinds.count("W") == 8, kinds   # 4 mb x 2 stages, split backward
assert len(p["partition"]["stages"]) == 2
ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
assert len(ev) == 24, len(ev)                                    # F, I, W per (mb, stage)
P

sed 's/"name": "1f1b", "microbatches": 4/"name": "dualpipev", "microbatches": 2/' examples/jobs/gpt-tiny.json > "$T/bad.json"
sed -i 's/"virtual_stages": 1/"virtual_stages": 2/' "$T/bad.json"
if "$PW" plan --job "$T/bad.json" 2> "$T/err"; then fail "dualpipev with 2 microbatches accepted"; fi
grep -q 'schedule.microbatches: dualpipev needs microbatches >= 2\*pp (got 2 < 4)' "$T/err" || { cat "$T/err"; fail "unclear error"; }
echo "1 passed, 0 failed"
