#!/usr/bin/env bash
# test_cli_plan: `pipewright plan` on the example jobs — the table, the
# compare view, the JSON document (what POST /v1/plans will return), the
# Chrome trace, and a schedule the job cannot run; --schedule takes other
# spellings and other systems' names (as a job spec does), and an unknown
# one is answered with all nine and the nearest; a virtual schedule on a
# flat job is planned with virtual_stages 2; --export and --import-csv; a
# pp 2 x dp 2 x tp 2 mesh's per-rank dp and tp volumes, and its simulated
# step ending with each rank's data-parallel exchange (DP); the in-memory
# snapshots' rows (none under tensor parallel).
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
# in-memory snapshots (snapshot_every 1 by default): a row per rank after the predicted step
sed -n '/^in-memory snapshots (train.snapshot_every 1: /,$p' "$T/plan.txt" | grep -Eq '^1 +[0-9.]+ +[0-9.]+ +[0-9.]+$' ||
  fail "no in-memory snapshot row for rank 1"

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
assert p["snapshots"]["every"] == 1 and all(r["snapshot_bytes_per_step"] > 0 for r in a["ranks"]), p["snapshots"]
P

sed 's/"name": "1f1b", "microbatches": 4/"name": "dualpipev", "microbatches": 2/' examples/jobs/gpt-tiny.json > "$T/bad.json"
sed -i 's/"virtual_stages": 1/"virtual_stages": 2/' "$T/bad.json"
if "$PW" plan --job "$T/bad.json" 2> "$T/err"; then fail "dualpipev with 2 microbatches accepted"; fi
grep -q 'schedule.microbatches: dualpipev needs microbatches >= 2\*pp (got 2 < 4)' "$T/err" || { cat "$T/err"; fail "unclear error"; }
# --schedule: other spellings and other systems' names are the canonical schedule
for alias in 1F1B:1f1b Std1F1B:1f1b ONE_FWD_ONE_BWD:1f1b GPipe:gpipe GPIPE:gpipe ZeroBubbleH1:zb-h1 \
  Eager1F1B:eager1f1b; do
  "$PW" plan --job examples/jobs/gpt-tiny.json --schedule "${alias%%:*}" > "$T/alias.txt" 2> "$T/err" ||
    { cat "$T/err"; fail "--schedule ${alias%%:*} refused"; }
  grep -q "^job gpt-tiny: schedule ${alias#*:}, " "$T/alias.txt" || { head -2 "$T/alias.txt"; fail "--schedule ${alias%%:*} is not ${alias#*:}"; }
done
# interleaved ones need two stages per rank
sed 's/"virtual_stages": 1/"virtual_stages": 2/' examples/jobs/gpt-tiny.json > "$T/v2.json"
for alias in InterleavedH1:interleaved-1f1b Interleaved1F1B:interleaved-1f1b DualPipeV:dualpipev KimiK2:kimi-k2; do
  "$PW" plan --job "$T/v2.json" --schedule "${alias%%:*}" --json > "$T/alias.json" 2> "$T/err" ||
    { cat "$T/err"; fail "--schedule ${alias%%:*} refused"; }
  grep -q "\"schedule\": \"${alias#*:}\"" "$T/alias.json" || fail "--schedule ${alias%%:*} is not ${alias#*:}"
done
# ... and so does a job spec (stored as the canonical name)
sed 's/"name": "1f1b"/"name": "ZeroBubbleH1"/' examples/jobs/gpt-tiny.json > "$T/zb.json"
"$PW" plan --job "$T/zb.json" | grep -q '^job gpt-tiny: schedule zb-h1, ' || fail "a spec's ZeroBubbleH1 is not zb-h1"
ALL="gpipe, 1f1b, eager1f1b, zb-h1, interleaved-1f1b, interleaved-gpipe, interleaved-1f1b-plus-one, kimi-k2, dualpipev"
plan_usage() { # "message" args...
  local want=$1 rc=0; shift
  "$PW" plan "$@" > "$T/out" 2> "$T/err" || rc=$?
  [ $rc -eq 2 ] && grep -qxF "$want" "$T/err" && grep -q '^usage: ' "$T/err" && [ ! -s "$T/out" ] ||
    { cat "$T/err"; fail "plan $*: exit $rc, want 2 and '$want'"; }
}
plan_usage "pipewright plan: --schedule: unknown schedule 'gpip' (one of $ALL); did you mean gpipe?" \
  --job examples/jobs/gpt-tiny.json --schedule gpip
plan_usage "pipewright plan: --schedule: unknown schedule 'zbh2' (one of $ALL); did you mean zb-h1?" \
  --job examples/jobs/gpt-tiny.json --schedule zbh2
plan_usage "pipewright plan: --schedule: unknown schedule 'pipedream' (one of $ALL)" \
  --job examples/jobs/gpt-tiny.json --schedule pipedream
plan_usage "pipewright plan: unknown option '--compar'; did you mean --compare?" --job examples/jobs/gpt-tiny.json --compar
plan_usage "pipewright plan: missing --job FILE" --schedule gpipe
sed 's/"name": "1f1b"/"name": "1f1c"/' examples/jobs/gpt-tiny.json > "$T/typo.json"
if "$PW" plan --job "$T/typo.json" 2> "$T/err"; then fail "schedule 1f1c accepted"; fi
grep -q 'schedule.name: must be one of .* (got "1f1c"); did you mean 1f1b?$' "$T/err" || { cat "$T/err"; fail "no did-you-mean for a spec's schedule"; }
# a virtual schedule on a job with virtual_stages 1: planned with 2, and said so
"$PW" plan --job examples/jobs/gpt-tiny.json --schedule LoopedBFS > "$T/v.txt" 2> "$T/err" || { cat "$T/err"; fail "LoopedBFS on V = 1 refused"; }
grep -q '^job gpt-tiny: schedule interleaved-gpipe, pp 2 x dp 1, 4 stages (virtual_stages 2)' "$T/v.txt" || { head -1 "$T/v.txt"; fail "not planned with V = 2"; }
grep -qxF "pipewright plan: interleaved-gpipe needs virtual_stages >= 2: planning with mesh.virtual_stages = 2 (the job has 1)" "$T/err" ||
  { cat "$T/err"; fail "no line saying V was raised"; }
# --export / --import-csv: a schedule's lists out as CSV and back in plan the same
"$PW" plan --job examples/jobs/gpt-tiny.json --schedule dualpipev --export --format csv > "$T/dv.csv" 2>/dev/null
grep -q 'OVERLAP_F_B' "$T/dv.csv" || fail "dualpipev's CSV has no fused pair"
"$PW" plan --job examples/jobs/gpt-tiny.json --import-csv "$T/dv.csv" > "$T/imp.txt" 2> "$T/err" || { cat "$T/err"; fail "import-csv"; }
"$PW" plan --job examples/jobs/gpt-tiny.json --schedule dualpipev > "$T/dv.txt" 2>/dev/null
# all but the title and where the placement line says the layout comes from
strip() { tail -n +2 "$1" | sed 's/^\(placement: [^(]*\) (.*)$/\1/'; }
diff <(strip "$T/dv.txt") <(strip "$T/imp.txt") > /dev/null || fail "the imported CSV plans differently"
grep -q '^job gpt-tiny: schedule custom, ' "$T/imp.txt" || fail "the imported plan is not custom"
"$PW" plan --job examples/jobs/gpt-tiny.json --export --format json > "$T/exp.json"
$PY - "$T/exp.json" <<'P'
import json, sys
e = json.load(open(sys.argv[1]))
assert e["mesh"] == {"pp": 2, "dp": 1, "virtual_stages": 1}, e["mesh"]
assert e["schedule"]["name"] == "custom" and e["schedule"]["microbatches"] == 4, e["schedule"]
assert e["schedule"]["custom"]["ranks"][0].startswith("F0@s0 F1@s0 B0@s0"), e["schedule"]
P
printf '0F0,0B0\n1F0,1X0\n' > "$T/bad.csv"
if "$PW" plan --job examples/jobs/gpt-tiny.json --import-csv "$T/bad.csv" 2> "$T/err"; then fail "bad CSV accepted"; fi
grep -qF 'csv: row 2 (rank 1), cell 2 "1X0": unknown kind' "$T/err" || { cat "$T/err"; fail "bad CSV not named"; }
plan_usage "pipewright plan: --format goes with --export" --job examples/jobs/gpt-tiny.json --format csv
plan_usage "pipewright plan: --format: 'yaml' is not one of text, csv, json" --job examples/jobs/gpt-tiny.json --export --format yaml
plan_usage "pipewright plan: --export prints the action lists only: not with --compare, --slices or --json" \
  --job examples/jobs/gpt-tiny.json --export --json
# the collectives of a pp 2 x dp 2 x tp 2 mesh: per-rank volumes in the text and the JSON, and the
# simulated step ending with each rank's data-parallel exchange (a DP action at the link model's cost)
sed 's/"dp": 1,/"dp": 2, "tp": 2,/' examples/jobs/gpt-tiny.json > "$T/mesh.json"
"$PW" plan --job "$T/mesh.json" > "$T/mesh.txt" 2> "$T/err" || { cat "$T/err"; fail "a pp 2 x dp 2 x tp 2 plan refused"; }
grep -q '^job gpt-tiny: schedule 1f1b, pp 2 x dp 2 x tp 2, ' "$T/mesh.txt" || { head -1 "$T/mesh.txt"; fail "no tp in the header"; }
grep -q '^data-parallel exchange per step' "$T/mesh.txt" && grep -q '^tensor-parallel all-reduces per step' "$T/mesh.txt" ||
  fail "no per-rank dp and tp volumes"
grep -Eq "^simulated step: [0-9.]+ ms, .*; [0-9.]+ ms with each rank's data-parallel exchange after its last action$" \
  "$T/mesh.txt" || { grep '^simulated' "$T/mesh.txt"; fail "no step with the dp exchange"; }
grep -q '^in-memory snapshots' "$T/mesh.txt" && fail "tensor parallel takes no snapshots, but the plan prices some"
"$PW" plan --job "$T/mesh.json" --json --trace "$T/mesh-trace.json" > "$T/mesh-plan.json"
$PY - "$T/mesh-plan.json" "$T/mesh-trace.json" <<'P'
import json, sys
p = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
a = p["analytics"]
ends = []
for r, (row, rk) in enumerate(zip(a["timeline"], a["ranks"])):
    assert rk["dp_bytes_per_step"] > 0 and rk["tp_bytes_per_step"] > 0, rk
    dp = row[-1]
    assert dp["action"] == "DP" and all(x["action"] != "DP" for x in row[:-1]), row[-2:]
    assert dp["start"] == max(x["end"] for x in row[:-1]), (r, dp)   # when the rank's gradients are all done
    assert abs(dp["end"] - dp["start"] - rk["dp_seconds_per_step"]) < 1e-12, (dp, rk["dp_seconds_per_step"])
    ends.append(dp["end"])
assert a["step_makespan"] == max(ends) > a["makespan"], (a["step_makespan"], a["makespan"])
assert sum(1 for e in t["traceEvents"] if e.get("name") == "DP") == 2
P
echo "1 passed, 0 failed"
