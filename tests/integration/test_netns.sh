#!/usr/bin/env bash
# test_netns: a multi-host run on one machine. The coordinator and three
# workers each get their own network namespace ("host"), joined by veth
# pairs to a bridge in a namespace of its own (netns/lib.sh), on addresses
# 10.200.0.0/24 that exist only inside the test's namespaces. Every byte
# between them crosses real interfaces: the control links, the data plane
# between the ranks, and the API calls (made from a worker's host).
#
# Checks: the hosts reach each other; the coordinator refuses to bind a
# non-loopback address without tokens; with tokens the API wants the bearer
# token (the health check excepted); a worker with a wrong cluster token is
# refused; the three workers register with their 10.200.0.x data addresses;
# a pp = 3 GPT job (1F1B) runs to `succeeded` with each worker's eth0
# carrying its share of activations and gradients (>= 1 MB); its per-step
# losses (GET /v1/jobs/{id}/metrics) and its final parameters (GET
# /v1/jobs/{id}/checkpoint) equal `pipewright train` on the same job
# (compare_run.py); every daemon exits 0 on SIGTERM. Every namespace is
# deleted on exit, however the test ends.
#
# Needs root and network namespaces: where `ip netns add` is not permitted
# it is skipped (exit 77) saying what failed.
set -uo pipefail
BUILD=$1; SRC=$2
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns/lib.sh
. "$HERE/netns/lib.sh"

skip() { echo "SKIP test_netns: $*"; exit 77; }
fail() { echo "FAIL test_netns: $*"; exit 1; }
for b in pipewright pipewright-worker pipewright-coordinator; do
  [ -x "$BUILD/$b" ] || fail "no $BUILD/$b"
done
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root (running as uid $(id -u))"
why=$(netns_check) || skip "$why"
command -v curl >/dev/null || fail "curl is missing"

TAG="pwt$$"
netns_scratch "$TAG" netns || fail "cannot make a scratch dir"

COORD=0                         # host 0: the coordinator
CADDR=$(netns_addr $COORD)
API="http://$CADDR:8080"
CTL="$CADDR:7070"
export OPENBLAS_NUM_THREADS=1

# ---- the network ---------------------------------------------------------------
netns_up "$TAG" 4 || fail "could not build the namespaces (see above)"
for pair in "0 1" "0 2" "0 3" "1 2" "2 3" "3 1"; do
  set -- $pair
  netns_probe "$TAG" "$1" "$2" || fail "host $2 cannot reach host $1 ($(netns_addr "$1")) across the bridge"
done
echo "network: 4 hosts on $NETNS_SUBNET.0/24 in namespaces $TAG-h0..h3, bridge in $TAG-br"

# A host's view of the API (curl from worker host 1: crosses the bridge).
api() { netns_exec "$TAG" 1 curl -sS --max-time 20 -H "Authorization: Bearer $(cat "$T/api.token")" "$@"; }

# ---- tokens: binding beyond loopback needs them ----------------------------------
out=$(netns_exec "$TAG" $COORD timeout 10 "$BUILD/pipewright-coordinator" --http "$CADDR:8080" --control "$CTL" \
      --state-dir "$T/refused" 2>&1)
rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "token" ||
  fail "a coordinator on $CADDR without tokens should refuse to start (rc $rc): $out"
umask 077
od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$T/api.token"
od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$T/cluster.token"
echo wrong-token >"$T/wrong.token"
umask 022

# ---- the daemons -------------------------------------------------------------------
# `ip netns exec` execs the daemon in place, so $! is the daemon itself.
ip netns exec "$(netns_name "$TAG" $COORD)" "$BUILD/pipewright-coordinator" --http "$CADDR:8080" --control "$CTL" \
  --state-dir "$T/coordinator" --token-file "$T/api.token" --cluster-token-file "$T/cluster.token" \
  --ready-file "$T/coordinator/ready" --heartbeat-timeout 10 --data-root "$SRC" >"$T/coordinator.log" 2>&1 &
CPID=$!
PIDS+=("$CPID")
for _ in $(seq 200); do [ -s "$T/coordinator/ready" ] && break; sleep 0.1; done
[ -s "$T/coordinator/ready" ] || { tail -20 "$T/coordinator.log"; fail "the coordinator did not start"; }

WPIDS=()
for i in 1 2 3; do
  ip netns exec "$(netns_name "$TAG" "$i")" "$BUILD/pipewright-worker" --coordinator "$CTL" --listen "$(netns_addr "$i"):0" \
    --name "host$i" --state-dir "$T/worker$i" --token-file "$T/cluster.token" >"$T/worker$i.log" 2>&1 &
  WPIDS+=($!)
  PIDS+=($!)
done
# An intruder with the wrong cluster token, from host 2.
ip netns exec "$(netns_name "$TAG" 2)" "$BUILD/pipewright-worker" --coordinator "$CTL" --listen "$(netns_addr 2):0" \
  --name intruder --state-dir "$T/intruder" --token-file "$T/wrong.token" >"$T/intruder.log" 2>&1 &
IPID=$!
PIDS+=("$IPID")

code=$(netns_exec "$TAG" 1 curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$API/healthz")
[ "$code" = 200 ] || fail "GET /healthz from host 1: HTTP $code"
code=$(netns_exec "$TAG" 1 curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$API/v1/workers")
[ "$code" = 401 ] || fail "GET /v1/workers without the token: HTTP $code, wanted 401"

workers=""
for _ in $(seq 200); do
  workers=$(api "$API/v1/workers" 2>/dev/null)
  n=$(printf '%s' "$workers" | "$NETNS_PY" -c 'import json,sys; print(sum(w["state"]=="idle" for w in json.load(sys.stdin)["workers"]))' 2>/dev/null || echo 0)
  [ "$n" -ge 3 ] && break
  sleep 0.1
done
printf '%s' "$workers" | "$NETNS_PY" -c '
import json, sys
ws = {w["name"]: w for w in json.load(sys.stdin)["workers"]}
want = {"host%d" % i: "10.200.0.%d" % (10 + i) for i in (1, 2, 3)}
for name, ip in want.items():
    w = ws.get(name)
    if not w or w["state"] != "idle" or not w["addr"].startswith(ip + ":"):
        sys.exit("worker %s: %s (wanted idle with data address %s:PORT)" % (name, w, ip))
if "intruder" in ws:
    sys.exit("the worker with a wrong cluster token was registered")
print("workers:", ", ".join("%s %s" % (n, ws[n]["addr"]) for n in sorted(want)))' || fail "registration"
for _ in $(seq 50); do grep -q "refused" "$T/intruder.log" && break; sleep 0.1; done
grep -q "refused" "$T/intruder.log" || fail "the intruder's log does not say it was refused: $(cat "$T/intruder.log")"
kill "$IPID"; wait "$IPID" 2>/dev/null

# ---- the job: pp = 3, 1F1B -----------------------------------------------------------
"$NETNS_PY" - "$SRC" "$T/job.json" <<'EOF'
import json, os, sys
src, out = sys.argv[1], sys.argv[2]
j = json.load(open(os.path.join(src, "examples/jobs/gpt-tiny.json")))
j["name"] = "netns-pp3"
j["mesh"] = {"pp": 3, "dp": 1, "virtual_stages": 1}
j["schedule"] = {"name": "1f1b", "microbatches": 4}
j["train"]["steps"] = 20
j["train"]["checkpoint_every"] = 20
j["data"]["path"] = os.path.join(src, j["data"]["path"])
json.dump(j, open(out, "w"), indent=1)
EOF
declare -A before
for i in 1 2 3; do before[$i]=$(netns_eth0_bytes "$TAG" "$i"); done
reply=$(api -X POST -H 'Content-Type: application/json' --data-binary "@$T/job.json" "$API/v1/jobs")
id=$(printf '%s' "$reply" | "$NETNS_PY" -c 'import json,sys; print(json.load(sys.stdin)["id"])' 2>/dev/null) ||
  fail "submit: $reply"
echo "job $id submitted from host 1"
state=""
for _ in $(seq 1800); do # up to 3 minutes (sanitizer builds are slow)
  job=$(api "$API/v1/jobs/$id" 2>/dev/null)
  state=$(printf '%s' "$job" | "$NETNS_PY" -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null)
  case $state in succeeded|failed|cancelled) break ;; esac
  sleep 0.1
done
if [ "$state" != succeeded ]; then
  tail -5 "$T"/*.log
  fail "job $id ended '$state': $job"
fi
printf '%s' "$job" | "$NETNS_PY" -c '
import json, sys
j = json.load(sys.stdin)
ranks = {r["rank"]: r["worker"] for r in j["ranks"]}
print("job %d succeeded: %s, ranks %s" % (j["id"], j["progress"], ranks))
assert sorted(ranks.values()) == ["host1", "host2", "host3"], ranks'  || fail "ranks"

for i in 1 2 3; do
  read -r rx0 tx0 <<<"${before[$i]}"
  read -r rx1 tx1 <<<"$(netns_eth0_bytes "$TAG" "$i")"
  echo "host$i eth0: received $((rx1 - rx0)) bytes, sent $((tx1 - tx0)) bytes during the job"
  [ $((rx1 - rx0 + tx1 - tx0)) -ge 1000000 ] || fail "host$i's eth0 carried under 1 MB: the data plane did not cross it"
done

# ---- equal to the single-process run ----------------------------------------------
api -o "$T/metrics.json" "$API/v1/jobs/$id/metrics" || fail "GET metrics"
api -f -o "$T/merged.safetensors" "$API/v1/jobs/$id/checkpoint" || fail "GET checkpoint"
"$NETNS_PY" - "$T/metrics.json" "$T/merged.safetensors" "$T/result.json" <<'EOF' || fail "metrics"
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
losses = {str(r["step"]): r["loss"] for r in m if r.get("loss") is not None}
json.dump({"losses": losses, "merged": sys.argv[2]}, open(sys.argv[3], "w"))
assert len(losses) == 20, "metrics for %d steps, wanted 20" % len(losses)
EOF
"$BUILD/pipewright" train --job "$T/job.json" --log-json "$T/ref.jsonl" --out "$T/ref.safetensors" >"$T/ref.log" 2>&1 ||
  fail "pipewright train: $(tail -3 "$T/ref.log")"
/usr/bin/python3 "$HERE/compare_run.py" "$T/result.json" "$T/ref.jsonl" "$T/ref.safetensors" 1e-5 ||
  fail "the 3-host run differs from the single-process run"

# ---- clean shutdown ---------------------------------------------------------------------
for p in "${WPIDS[@]}" "$CPID"; do
  kill -TERM "$p"
  wait "$p"
  rc=$?
  [ $rc -eq 0 ] || fail "pid $p exited $rc after SIGTERM (logs in $T, rerun with KEEP=1)"
done
PIDS=()
echo "PASS test_netns: pp = 3 across 3 namespaced hosts equals the single-process run"
