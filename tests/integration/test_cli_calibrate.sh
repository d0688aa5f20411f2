#!/usr/bin/env bash
# test_cli_calibrate: `pipewright calibrate` on the tiny GPT writes a profile
# with every layer of the model at each asked size, and `plan --profile`
# costs the plan with it: the stage costs are the profile's layer sums, the
# predicted step is the makespan plus the step end; the measured core
# sharing slows the prediction as its speeds say; --compare-regions
# predicts a regions job's serial and concurrent steps from a profile;
# --auto ranks every configuration and picks the first row; bad profiles
# and options are refused with the field named.
set -euo pipefail
BUILD=$1; SRC=$2
PW="$BUILD/pipewright"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cd "$SRC"
fail() { echo "FAIL: $*" >&2; exit 1; }
PY=/usr/bin/python3
JOB=examples/jobs/gpt-tiny.json

OPENBLAS_NUM_THREADS=1 "$PW" calibrate --job "$JOB" --mb 1,2 --target-ms 1 --share-ms 20 --out "$T/prof.json"
"$PW" inspect --job "$JOB" > "$T/inspect.txt"
"$PW" plan --job "$JOB" --profile "$T/prof.json" --json > "$T/plan.json"
"$PW" plan --job "$JOB" --profile "$T/prof.json" > "$T/plan.txt"
grep -q 'predicted step (calibrated profile' "$T/plan.txt" || fail "no predicted step line"
$PY - "$T/prof.json" "$T/plan.json" <<'P'
import json, sys
prof = json.load(open(sys.argv[1])); plan = json.load(open(sys.argv[2]))
assert prof["version"] == 2 and prof["mb_sizes"] == [1, 2], prof["mb_sizes"]
sp = prof["sharing"]["speed"]                # n = 1 .. 2 x cores busy processes, capped at 8
assert len(sp) == min(2 * prof["cores"], 8) and sp[0] == 1 and all(0 < v <= 1 for v in sp), sp
assert prof["link"]["wake_s"] > 0 and prof["step"]["fixed_s"] >= 0
names = [l["name"] for l in prof["layers"]]
assert names[0] == "embed" and names[-1] == "head" and "blocks.0" in names, names
for l in prof["layers"]:
    assert all(len(l[k]) == 2 and all(v >= 0 for v in l[k]) for k in "fiw"), l
assert prof["layers"][1]["f"][0] > 0, "a block's forward took no time"
assert prof["step"]["per_param_s"] > 0 and prof["link"]["bandwidth_Bps"] > 0
assert 0 < prof["cpu_share"] <= 1, prof["cpu_share"]
assert plan["cost_model"] == "calibrated profile"
mb = plan["microbatch_size"]            # gpt-tiny: 16 / 4 = 4, past the profile's 2: scaled per sequence
by = {l["name"]: l for l in prof["layers"]}
for st, c in zip(plan["partition"]["stages"], plan["costs"]):
    f = sum(by[n]["f"][1] * mb / 2 for n in st["layers"])
    assert abs(c["f"] - f) <= 1e-9 + 1e-6 * f, (st["layers"], c["f"], f)
ps = plan["predicted_step"]
assert abs(ps["seconds"] - plan["analytics"]["makespan"] - ps["step_end"]) < 1e-9 or ps["cores"] > 0, ps
assert ps["step_end"] > 0
P

# a loaded host: two busy processes per CPU leave the timed layers at most a third of a core, and
# calibrate says so (the profile's cpu_share, and a warning naming it)
busy=()
trap 'kill "${busy[@]}" 2>/dev/null || true; rm -rf "$T"' EXIT
for _ in $(seq $((2 * $(nproc)))); do sh -c 'while :; do :; done' & busy+=($!); done
OPENBLAS_NUM_THREADS=1 "$PW" calibrate --job "$JOB" --mb 1 --target-ms 1 --no-share --no-link \
  --out "$T/loaded.json" 2> "$T/loaded.err"
kill "${busy[@]}"; wait "${busy[@]}" 2>/dev/null || true; busy=()
grep -q 'warning: the layers were timed with .* of a core (cpu_share)' "$T/loaded.err" || fail "loaded: $(cat "$T/loaded.err")"
$PY -c 'import json, sys; s = json.load(open(sys.argv[1]))["cpu_share"]; assert 0 < s < 0.9, s' "$T/loaded.json"

# measured sharing: two ranks on one host, each at half speed when both compute, take longer
$PY - "$T/prof.json" "$T" <<'P'
import json, sys
p = json.load(open(sys.argv[1]))
p["cores"] = 2
p["sharing"] = {"speed": [1, 1]}; json.dump(p, open(sys.argv[2] + "/free.json", "w"))
p["sharing"] = {"speed": [1, 0.5]}; json.dump(p, open(sys.argv[2] + "/half.json", "w"))
j = json.load(open("examples/jobs/gpt-tiny.json")); j["mesh"]["pp"] = 2; j["schedule"]["name"] = "1f1b"
json.dump(j, open(sys.argv[2] + "/pp2.json", "w"))
P
"$PW" plan --job "$T/pp2.json" --profile "$T/free.json" --json > "$T/free-plan.json"
"$PW" plan --job "$T/pp2.json" --profile "$T/half.json" --json > "$T/half-plan.json"
$PY - "$T/free-plan.json" "$T/half-plan.json" <<'P'
import json, sys
free, half = (json.load(open(f)) for f in sys.argv[1:])
a, b = free["predicted_step"], half["predicted_step"]
# speed 1 for both: the plain makespan; half speed: slower, at most twice
assert abs(a["seconds"] - free["analytics"]["makespan"] - a["step_end"]) < 1e-9, a
assert a["seconds"] < b["seconds"] <= 2 * a["seconds"] + 1e-9, (a, b)
P

# a regions job: serial and concurrent steps predicted from its calibration
RJ=examples/jobs/two-tower.json
OPENBLAS_NUM_THREADS=1 "$PW" calibrate --job "$RJ" --mb 1,4 --target-ms 1 --share-ms 20 --out "$T/rprof.json"
"$PW" plan --job "$RJ" --profile "$T/rprof.json" --compare-regions --json > "$T/regions.json"
"$PW" plan --job "$RJ" --profile "$T/rprof.json" --compare-regions > "$T/regions.txt"
grep -q 'simulated with the calibrated profile' "$T/regions.txt" || fail "regions: $(head -1 "$T/regions.txt")"
grep -q '^predicted step (makespan there + step end): serial ' "$T/regions.txt" || fail "no regions prediction line"
$PY - "$T/regions.json" <<'P'
import json, sys
r = json.load(open(sys.argv[1]))
c, p = r["cores"], r["predicted"]
assert c["cores"] >= 1
for k in ("serial", "concurrent"):                # the step end on top of the shared makespan
    assert p[k] > c[k] > 0, (k, c, p)
assert abs(p["speedup"] - p["serial"] / p["concurrent"]) < 1e-9, p
P

"$PW" plan --job "$JOB" --profile "$T/prof.json" --auto --max-pp 2 --json > "$T/auto.json"
"$PW" plan --job "$JOB" --profile "$T/prof.json" --auto --max-pp 2 > "$T/auto.txt"
grep -q '^chosen: pp ' "$T/auto.txt" || fail "no choice line"
$PY - "$T/auto.json" <<'P'
import json, sys
a = json.load(open(sys.argv[1]))
rows = a["rows"]
assert a["chosen"] == rows[0], a["chosen"]
assert {r["pp"] for r in rows} == {1, 2}, {r["pp"] for r in rows}
assert {r["microbatches"] for r in rows} >= {1, 2, 4, 8, 16}
assert all(x["predicted"] <= y["predicted"] for x, y in zip(rows, rows[1:]))
P

# a bound no rank meets, a profile of another model, a broken profile
if "$PW" plan --job "$JOB" --profile "$T/prof.json" --auto --max-rank-memory 1 2> "$T/err"; then fail "1 MiB fitted"; fi
grep -q 'no configuration fits' "$T/err" || fail "memory: $(cat "$T/err")"
$PY -c "
import json; p = json.load(open('$T/prof.json')); p['layers'] = p['layers'][:2]; json.dump(p, open('$T/short.json', 'w'))"
if "$PW" plan --job "$JOB" --profile "$T/short.json" 2> "$T/err"; then fail "short profile accepted"; fi
grep -q "profile.layers: no entry for layer 'blocks.1'" "$T/err" || fail "short: $(cat "$T/err")"
echo '{"version": 1, "mb_sizes": [4, 2]}' > "$T/bad.json"
if "$PW" plan --job "$JOB" --profile "$T/bad.json" 2> "$T/err"; then fail "bad profile accepted"; fi
grep -q 'profile.mb_sizes\[1\]' "$T/err" || fail "bad: $(cat "$T/err")"
if "$PW" calibrate --job "$JOB" --mb 4,2 2> "$T/err"; then fail "--mb 4,2 accepted"; fi
grep -q 'ascending' "$T/err" || fail "--mb: $(cat "$T/err")"
echo ok
