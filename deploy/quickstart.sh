#!/usr/bin/env bash
# quickstart.sh: the main job from a clean checkout — install the Debian
# packages it needs to build and run (not the test tools), build, start a
# coordinator and as many workers as the job has ranks (mesh.pp x mesh.dp)
# on loopback, train the job on them (pipeline-parallel, one rank per
# worker), follow it with a progress bar, print the final loss and the
# dashboard's URL. The daemons keep running afterwards so the dashboard
# stays up.
#
#   deploy/quickstart.sh [JOB]     default examples/jobs/gpt-tiny.json
#   deploy/quickstart.sh --stop    stop the daemons a previous run started
#   deploy/quickstart.sh --status  are they running, and where
#
# Everything lives in runs/quickstart/: the coordinator's database, each
# worker's checkpoints, logs, pids, the trained model. Re-running is safe:
# it stops the previous daemons first and starts fresh ones (the job
# history in the database is kept). Ports: 8080 (API + dashboard) and 7070
# (control) when free, else free ones the kernel picks; PW_HTTP_PORT and
# PW_CONTROL_PORT choose others; PW_SKIP_DEPS=1 skips the apt-get step. No
# root needed except for apt-get, and no systemd: for services, see
# deploy/pipewright-*.service.in and the README. A job of more than
# PW_QUICKSTART_MAX_WORKERS ranks (default 16) is refused: that is a
# cluster's job, not one machine's.
#
# On a host of 8 cores or more (or with PW_QUICKSTART_LAYOUT=auto) the job's
# mesh and schedule are chosen for this host: `pipewright calibrate` at 1,
# 2 and 4 threads a rank (kept in runs/quickstart/profiles/ for the next
# run of the same job), `pipewright plan --auto` over ranks x threads, and
# that many workers of that many threads (pinned to disjoint cores by the
# coordinator). PW_QUICKSTART_LAYOUT=job keeps the job's own mesh and one
# thread a worker.
set -euo pipefail
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUN=$ROOT/runs/quickstart
BUILD=${PW_BUILD_DIR:-$ROOT/build-release}  # the Release build deploy/test.sh also makes
PIDS=$RUN/pids

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'quickstart: %s\n' "$*" >&2; exit 1; }

# A pid from our pid file that is still one of our daemons (not a reused pid,
# not a zombie).
ours() {
  local pid=$1 state
  [ -r "/proc/$pid/cmdline" ] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$state" != Z ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'pipewright-\(coordinator\|worker\) ' &&
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$RUN/"
}

stop_all() {
  [ -f "$PIDS" ] || return 0
  local pid left=()
  while read -r pid _; do
    if ours "$pid"; then kill -TERM "$pid" 2>/dev/null || true; left+=("$pid"); fi
  done <"$PIDS"
  for _ in $(seq 50); do # up to 10 s for a clean shutdown
    local alive=()
    for pid in "${left[@]}"; do ours "$pid" && alive+=("$pid"); done
    left=("${alive[@]}")
    [ ${#left[@]} -eq 0 ] && break
    sleep 0.2
  done
  for pid in "${left[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  [ ${#left[@]} -eq 0 ] || echo "quickstart: killed ${left[*]} (did not stop in 10 s)" >&2
  rm -f "$PIDS" "$RUN/ready"
}

status() {
  local any=0 pid what
  if [ -f "$PIDS" ]; then
    while read -r pid what; do
      if ours "$pid"; then echo "running: $what (pid $pid)"; any=1; fi
    done <"$PIDS"
  fi
  if [ $any = 1 ] && [ -f "$RUN/ready" ]; then
    echo "dashboard: http://127.0.0.1:$(json_field "$RUN/ready" http)/"
  elif [ $any = 0 ]; then
    echo "not running"
  fi
}

json_field() { sed -n "s/.*\"$2\": *\([0-9][0-9]*\).*/\1/p" "$1"; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

case "${1:-}" in
  --stop) stop_all; echo "quickstart: stopped"; exit 0 ;;
  --status) status; exit 0 ;;
  -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$SELF"; exit 0 ;;
esac
JOB=${1:-examples/jobs/gpt-tiny.json}
[ -f "$JOB" ] || die "no job file $JOB"

if [ "${PW_SKIP_DEPS:-0}" != 1 ]; then
  say "dependencies"
  bash deploy/install-deps.sh --runtime
fi

# mesh.pp x mesh.dp ranks, one worker each (the spec's defaults are 1).
workers=$(python3 -c '
import json, sys
try:
    m = json.load(open(sys.argv[1])).get("mesh") or {}
    print(int(m.get("pp", 1)) * int(m.get("dp", 1)) * int(m.get("tp", 1)))
except (ValueError, TypeError, AttributeError) as e:
    sys.exit(f"quickstart: {sys.argv[1]} is not a job spec: {e}")' "$JOB") || exit 1
max=${PW_QUICKSTART_MAX_WORKERS:-16}
[ "$workers" -ge 1 ] || die "$JOB: mesh.pp x mesh.dp is $workers"
[ "$workers" -le "$max" ] ||
  die "$JOB needs $workers workers (mesh.pp x mesh.dp); the quickstart starts at most $max on one machine (PW_QUICKSTART_MAX_WORKERS)"

say "build (Release)"
# configured once: a build dir made elsewhere (PW_BUILD_DIR) is only built
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPW_TESTS=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc 2>/dev/null || echo 2)" --target pipewright pipewright-worker pipewright-coordinator

# The layout of this host's cores (see the top).
cores=$(nproc 2>/dev/null || echo 1)
threads=1
layout=${PW_QUICKSTART_LAYOUT:-$([ "$cores" -ge 8 ] && echo auto || echo job)}
if [ "$layout" = auto ]; then
  say "choose the layout of $cores cores (calibrate, then plan --auto over ranks x threads)"
  mkdir -p "$RUN/profiles"
  key=$(cat "$JOB" "$BUILD/pipewright" | sha256sum | cut -c1-16)
  mbs=$(python3 -c 'import json, sys; b = json.load(open(sys.argv[1]))["train"]["batch_size"]
print(",".join(str(1 << k) for k in range(12) if (1 << k) <= b))' "$JOB") || die "$JOB: no train.batch_size"
  profiles=()
  for t in 1 2 4; do
    [ "$t" -le "$cores" ] || continue
    prof=$RUN/profiles/$key-$t.json
    if [ ! -s "$prof" ]; then
      echo "calibrating $t thread(s) a rank"
      OPENBLAS_NUM_THREADS=$t "$BUILD/pipewright" calibrate --job "$JOB" --threads "$t" --cores "$cores" --mb "$mbs"         --out "$prof.tmp" 2>"$RUN/calibrate-$t.log" && mv "$prof.tmp" "$prof" ||
        die "calibrate --threads $t failed (log: $RUN/calibrate-$t.log)"
    fi
    profiles+=(--profile "$prof")
  done
  "$BUILD/pipewright" plan --job "$JOB" --auto "${profiles[@]}" --cores "$cores" --max-pp 16 --json >"$RUN/layout.json" ||
    die "plan --auto found no layout for $JOB on $cores cores"
  read -r workers threads < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["chosen"]
job = json.load(open(sys.argv[2]))
job["mesh"] = {"pp": c["pp"], "dp": c["dp"], "virtual_stages": c["virtual_stages"]}
job["schedule"] = {"name": c["schedule"], "microbatches": c["microbatches"]}
json.dump(job, open(sys.argv[3], "w"), indent=1)
print(c["pp"] * c["dp"], c["threads"])
print("layout: %d ranks x %d threads (pp %d, dp %d), %s, %d microbatches: predicted %.1f ms a step" % (
    c["pp"] * c["dp"], c["threads"], c["pp"], c["dp"], c["schedule"], c["microbatches"], c["predicted"] * 1e3),
    file=sys.stderr)' "$RUN/layout.json" "$JOB" "$RUN/job-layout.json") || die "cannot read the layout"
  JOB=$RUN/job-layout.json
fi

say "start a coordinator and $workers workers on loopback"
stop_all
mkdir -p "$RUN"
http=${PW_HTTP_PORT:-8080}
ctl=${PW_CONTROL_PORT:-7070}
port_free "$http" || { echo "port $http is taken: the kernel picks one"; http=0; }
port_free "$ctl" || { echo "port $ctl is taken: the kernel picks one"; ctl=0; }
: >"$PIDS"
# setsid + nohup: the daemons outlive this script and its terminal.
# --data-root: the job's data.path (examples/data/corpus.txt) resolves
# under the checkout; the coordinator imports the file as a dataset at
# submit and the workers fetch it from there (docs/datasets.md).
setsid nohup "$BUILD/pipewright-coordinator" --http "127.0.0.1:$http" --control "127.0.0.1:$ctl" \
  --state-dir "$RUN/coordinator" --web "$ROOT/web" --ready-file "$RUN/ready" --data-root "$ROOT" \
  >"$RUN/coordinator.log" 2>&1 </dev/null &
echo "$! coordinator" >>"$PIDS"
for _ in $(seq 100); do [ -s "$RUN/ready" ] && break; sleep 0.1; done
[ -s "$RUN/ready" ] || { tail -n 20 "$RUN/coordinator.log" >&2; die "the coordinator did not start (log: $RUN/coordinator.log)"; }
http=$(json_field "$RUN/ready" http)
ctl=$(json_field "$RUN/ready" control)
API=http://127.0.0.1:$http
names=()
for i in $(seq "$workers"); do
  names+=("quickstart-w$i")
  setsid nohup "$BUILD/pipewright-worker" --coordinator "127.0.0.1:$ctl" --listen 127.0.0.1:0 \
    --name "quickstart-w$i" --threads "$threads" --state-dir "$RUN/worker$i" \
    >"$RUN/worker$i.log" 2>&1 </dev/null &
  echo "$! worker$i" >>"$PIDS"
done
idle=0
for _ in $(seq 300); do
  idle=$(curl -sf "$API/v1/workers" | grep -o '"state":"idle"' | wc -l || true)
  [ "$idle" -ge "$workers" ] && break
  sleep 0.1
done
[ "$idle" -ge "$workers" ] || die "only $idle of $workers workers registered (logs: $RUN/worker*.log)"
echo "coordinator $API (control 127.0.0.1:$ctl), workers ${names[*]}"

say "submit $JOB"
reply=$(curl -sS -X POST -H 'Content-Type: application/json' --data-binary "@$JOB" "$API/v1/jobs") ||
  die "cannot reach $API"
id=$(printf '%s' "$reply" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("id", ""))' 2>/dev/null || true)
[ -n "$id" ] || die "the coordinator refused the job: $reply"
echo "job $id: $API/v1/jobs/$id"

say "train (job $id)"
# `pipewright watch` draws a progress bar on a terminal, a line per step otherwise.
"$BUILD/pipewright" watch "$id" --coordinator "$API" || true
job=$(curl -sf "$API/v1/jobs/$id") || die "cannot reach $API"
# field KEY[.KEY...]: one value of the job's JSON ("" when absent or null).
field() {
  printf '%s' "$job" | python3 -c '
import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("."):
    v = v.get(k) if isinstance(v, dict) else None
print("" if v is None else v)' "$1"
}
state=$(field state)
if [ "$state" != succeeded ]; then
  echo "job $id ended ${state:-in an unknown state}: $(field error)" >&2
  echo "logs: $RUN/*.log; the daemons are still running (deploy/quickstart.sh --stop)" >&2
  exit 1
fi

say "result"
model=$RUN/model-job$id.safetensors
curl -sf -o "$model" "$API/v1/jobs/$id/checkpoint" || die "cannot download the model"
printf 'final training loss: %.4f after %s steps\n' "$(field loss)" "$(field progress.step)"
"$BUILD/pipewright" eval --job "$JOB" --checkpoint "$model" | sed 's/^/held-out /'
echo "model:       $model (safetensors; PyTorch names as in the README)"
echo
echo "dashboard:   $API/"
echo "the coordinator and the $workers workers are still running (pids $(awk '{printf "%s ", $1}' "$PIDS")) so you can"
echo "open the dashboard and submit more jobs:  $BUILD/pipewright submit --job JOB --coordinator $API"
echo "stop everything:  deploy/quickstart.sh --stop"
