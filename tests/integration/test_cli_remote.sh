#!/usr/bin/env bash
# test_cli_remote: `pipewright submit | status | watch | cancel | retry | workers`
# against a real coordinator and two real workers on loopback: a tiny
# 2-stage GPT job submitted and watched to success, its status and the
# worker table, cancelling a finished job, a broken spec; the same over
# https (a TLS terminator with a certificate made here), through forward
# proxies (http_proxy, https_proxy, --proxy; never for loopback unless
# asked), and against a server that answers badly (huge or endless bodies,
# silence, not HTTP); then a token-protected coordinator without workers (a
# job waits there, is cancelled, and watch says so), and that coordinator
# stopped (unreachable). The helper servers are cli_remote_servers.py, all
# on 127.0.0.1. Every process started here is killed on exit.
set -uo pipefail
BUILD=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd)
PW="$BUILD/pipewright"
for b in pipewright pipewright-coordinator pipewright-worker; do
  [ -x "$BUILD/$b" ] || { echo "FAIL: no $BUILD/$b"; echo "0 passed, 1 failed"; exit 1; }
done
T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  wait 2>/dev/null
  [ -n "${PW_KEEP_TMP:-}" ] && echo "kept $T" || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

passed=0; failed=0
ok() { passed=$((passed + 1)); echo "ok: $*"; }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
show() { sed 's/^/    | /' "$@"; }
# Slow under the sanitizers; generous bounds, never timing assertions.
WAIT=${PW_TEST_WAIT:-60}

# start_coordinator DIR [options...]: sets HTTP and CTL to its ports.
start_coordinator() {
  local dir=$1; shift
  mkdir -p "$dir"
  "$BUILD/pipewright-coordinator" --http 127.0.0.1:0 --control 127.0.0.1:0 --state-dir "$dir" \
    --ready-file "$dir/ready.json" "$@" > "$dir/log" 2>&1 &
  PIDS+=($!)
  local pid=$! i
  HTTP=; CTL=
  for i in $(seq $((WAIT * 10))); do
    if [ -s "$dir/ready.json" ]; then
      HTTP=$(sed -n 's/.*"http" *: *\([0-9][0-9]*\).*/\1/p' "$dir/ready.json")
      CTL=$(sed -n 's/.*"control" *: *\([0-9][0-9]*\).*/\1/p' "$dir/ready.json")
      [ -n "$HTTP" ] && [ -n "$CTL" ] && return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "coordinator in $dir did not get ready:"; show "$dir/log"
  return 1
}

# start_helper NAME MODE [options...]: one of cli_remote_servers.py's
# servers; sets PORT. Its log is $T/NAME.log.
start_helper() {
  local name=$1 i; shift
  python3 "$SRC/tests/integration/cli_remote_servers.py" "$@" --ready "$T/$name.port" --log "$T/$name.log" \
    --lifetime $((WAIT * 20)) > "$T/$name.out" 2>&1 &
  PIDS+=($!)
  local pid=$!
  touch "$T/$name.log"
  PORT=
  for i in $(seq $((WAIT * 10))); do
    [ -s "$T/$name.port" ] && { PORT=$(cat "$T/$name.port"); return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "$name did not start:"; show "$T/$name.out"
  return 1
}

start_worker() { # name control-port
  mkdir -p "$T/$1"
  "$BUILD/pipewright-worker" --coordinator "127.0.0.1:$2" --listen 127.0.0.1:0 --name "$1" \
    --state-dir "$T/$1" > "$T/$1/log" 2>&1 &
  PIDS+=($!)
}

# ---- a coordinator, two workers -----------------------------------------------
if ! start_coordinator "$T/coord"; then
  bad "coordinator start"; echo "$passed passed, $failed failed"; exit 1
fi
URL="http://127.0.0.1:$HTTP"
R=(--coordinator "$URL")
start_worker w1 "$CTL"
start_worker w2 "$CTL"

# both registered (and `workers` shows them: name, address, state)
for _ in $(seq $((WAIT * 5))); do
  "$PW" workers "${R[@]}" > "$T/workers.txt" 2> "$T/workers.err" || true
  grep -q '^w1 ' "$T/workers.txt" && grep -q '^w2 ' "$T/workers.txt" && break
  sleep 0.2
done
if grep -q '^NAME ' "$T/workers.txt" && grep -Eq '^w1 +127\.0\.0\.1:[0-9]+ +[^ ]+ +idle ' "$T/workers.txt" &&
  grep -Eq '^w2 +127\.0\.0\.1:[0-9]+ +[^ ]+ +idle ' "$T/workers.txt"; then
  ok "workers lists w1 and w2, idle, with their addresses"
else
  bad "workers does not list both workers"; show "$T/workers.txt" "$T/workers.err"
fi

# ---- submit and watch a tiny 2-stage GPT ----------------------------------------
cat > "$T/job.json" <<EOF
{"name": "cli-remote",
 "model": {"template": "gpt", "vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layers": 2,
           "n_heads": 4},
 "mesh": {"pp": 2, "dp": 1, "virtual_stages": 1},
 "schedule": {"name": "1f1b", "microbatches": 2},
 "train": {"steps": 10, "batch_size": 4, "seed": 1,
           "optimizer": {"name": "adamw", "lr": 0.003}},
 "data": {"kind": "text", "path": "$SRC/examples/data/corpus.txt", "sampler": "random"}}
EOF
ID=$("$PW" submit --job "$T/job.json" --quiet "${R[@]}" 2> "$T/submit.err")
if [[ "$ID" =~ ^[0-9]+$ ]]; then ok "submit --quiet prints the id ($ID)"; else
  bad "submit --quiet: '$ID'"; show "$T/submit.err"; ID=0; fi

timeout $((WAIT * 3)) "$PW" watch "$ID" --interval 0.2 "${R[@]}" > "$T/watch.txt" 2> "$T/watch.err"
rc=$?
if [ $rc -eq 0 ] && grep -q '^step 1/10 loss [0-9]' "$T/watch.txt" && grep -q '^step 10/10 loss [0-9]' "$T/watch.txt" &&
  grep -q "^job $ID succeeded: 10/10 steps" "$T/watch.txt"; then
  ok "watch follows the job to success (exit 0, a line per step)"
else
  bad "watch exit $rc"; show "$T/watch.txt" "$T/watch.err"
fi
# one line per step, each step once, in order
if [ "$(grep -c '^step ' "$T/watch.txt")" = 10 ] &&
  [ "$(sed -n 's#^step \([0-9]*\)/10 .*#\1#p' "$T/watch.txt" | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 9 10 " ]; then
  ok "watch shows each step exactly once, in order"
else
  bad "watch steps"; show "$T/watch.txt"
fi

"$PW" status "$ID" "${R[@]}" > "$T/status.txt" 2>&1
if grep -q "^job $ID (cli-remote): succeeded" "$T/status.txt" && grep -Eq '^ +progress +10/10 ' "$T/status.txt" &&
  grep -Eq '^ +loss +[0-9]+\.[0-9]{4}$' "$T/status.txt" && grep -Eq '^ +ranks +0 -> w[12] \(pp0 dp0 tp0\), 1 -> w[12] \(pp1 dp0 tp0\)$' "$T/status.txt"; then
  ok "status ID: succeeded, 10/10, loss, ranks -> workers with their mesh coordinates"
else
  bad "status ID"; show "$T/status.txt"
fi

"$PW" status "$ID" --json "${R[@]}" > "$T/status.json" 2>&1
if /usr/bin/python3 - "$T/status.json" "$ID" <<'P'; then ok "status ID --json is the API's job"; else bad "status --json"; show "$T/status.json"; fi
import json, sys
j = json.load(open(sys.argv[1]))
assert j["id"] == int(sys.argv[2]) and j["state"] == "succeeded", j
assert j["progress"] == {"step": 10, "total": 10}, j["progress"]
P

"$PW" status "${R[@]}" > "$T/list.txt" 2>&1
if grep -q '^ID ' "$T/list.txt" && grep -Eq "^$ID +cli-remote +succeeded +10/10 +[0-9.]+ .* 1f1b +pp2 x dp1$" "$T/list.txt"; then
  ok "status lists the job (id, name, state, progress, loss, schedule, mesh)"
else
  bad "status table"; show "$T/list.txt"
fi

# ---- logs: the job's events ------------------------------------------------------------
TS='[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}'
"$PW" logs "$ID" "${R[@]}" > "$T/logs.txt" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -Eq "^$TS  state +.*succeeded" "$T/logs.txt" && ! grep -qv -E "^($TS|-)  " "$T/logs.txt"; then
  ok "logs ID: the events, one line each (time, kind, message)"
else
  bad "logs ID: exit $rc"; show "$T/logs.txt"
fi
timeout "$WAIT" "$PW" logs "$ID" --follow "${R[@]}" > "$T/logs2.txt" 2>&1
rc=$?
if [ $rc -eq 0 ] && cmp -s "$T/logs.txt" "$T/logs2.txt"; then
  ok "logs --follow of a finished job prints the same and exits 0 at once"
else
  bad "logs --follow of a finished job: exit $rc"; show "$T/logs2.txt"
fi
"$PW" logs 999999 "${R[@]}" > "$T/logs3.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^error: .*999999' "$T/logs3.txt"; then ok "logs of an unknown job"; else
  bad "logs 999999: exit $rc"; show "$T/logs3.txt"; fi

# ---- timeline: a sampled step's measured actions ------------------------------------------
"$PW" timeline "$ID" "${R[@]}" > "$T/tl.txt" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -Eq "^job $ID step [0-9]+ \([0-9]+ sampled steps?\)$" "$T/tl.txt" &&
  grep -Eq '^bubble  measured [0-9.]+%, planned [0-9.]+% \(1f1b\)$' "$T/tl.txt" &&
  grep -Eq '^0 +[0-9]+ +[0-9.]+ m?s +[0-9.-]+%$' "$T/tl.txt" && grep -Eq '^1 +[0-9]+ +[0-9.]+ m?s +[0-9.-]+%$' "$T/tl.txt"; then
  ok "timeline ID: the newest sampled step, measured vs planned bubble, each rank's busy time"
else
  bad "timeline ID: exit $rc"; show "$T/tl.txt"
fi
"$PW" timeline "$ID" --json "${R[@]}" > "$T/tl.json" 2>&1
# what the 404 must name: the sampled steps the API lists (10 at most here: all of them)
SAMPLED=$(python3 -c 'import json,sys; print(", ".join(map(str, json.load(open(sys.argv[1]))["steps"])))' "$T/tl.json")
"$PW" timeline "$ID" --step 999 "${R[@]}" > "$T/tl2.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && [ -n "$SAMPLED" ] &&
  grep -qxF "error: step 999 of job $ID was not sampled; sampled steps: $SAMPLED" "$T/tl2.txt"; then
  ok "timeline --step N not sampled: exit 1, the sampled steps named"
else
  bad "timeline --step 999: exit $rc (sampled: $SAMPLED)"; show "$T/tl2.txt"
fi
"$PW" timeline "$ID" --step 999 -o "$T/trace.json" "${R[@]}" > "$T/tl3.txt" 2>&1
rc=$?
echo keep > "$T/old.json"
"$PW" timeline "$ID" --step 999 -o "$T/old.json" "${R[@]}" >> "$T/tl3.txt" 2>&1
rc2=$?
if [ $rc -eq 1 ] && [ $rc2 -eq 1 ] && [ ! -e "$T/trace.json" ] && [ ! -e "$T/trace.json.tmp" ] &&
  [ "$(cat "$T/old.json")" = keep ] && [ ! -e "$T/old.json.tmp" ] && grep -q '^error: step 999 .*sampled steps: ' "$T/tl3.txt"; then
  ok "timeline -o on an error: exit 1, the error on stderr, FILE neither created nor truncated"
else
  bad "timeline -o on an error: exit $rc/$rc2"; show "$T/tl3.txt"; ls -l "$T" | show
fi
"$PW" timeline "$ID" -o "$T/trace.json" "${R[@]}" > "$T/tl4.txt" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -Eqx "wrote $T/trace.json: [0-9]+ trace events" "$T/tl4.txt" && [ ! -e "$T/trace.json.tmp" ] &&
  python3 - "$T/trace.json" <<'P'; then
import json, sys
t = json.load(open(sys.argv[1]))
xs = [e for e in t["traceEvents"] if e["ph"] == "X"]
assert xs and {e["tid"] for e in xs} == {0, 1}, t
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in xs), xs
P
  ok "timeline -o FILE: a Chrome trace (JSON, X events on ranks 0 and 1), nothing left behind"
else
  bad "timeline -o: exit $rc"; show "$T/tl4.txt"
fi
STEP0=${SAMPLED%%,*}
"$PW" timeline "$ID" --step "$STEP0" --format json -o "$T/tl5.json" "${R[@]}" > "$T/tl5.txt" 2>&1
rc=$?
if [ $rc -eq 0 ] && python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["step"] == int(sys.argv[2]) and j["ranks"], j' \
  "$T/tl5.json" "$STEP0" 2> "$T/tl5.err"; then
  ok "timeline --step N --format json -o FILE: that step's timeline as the API gives it"
else
  bad "timeline --format json -o: exit $rc"; show "$T/tl5.txt" "$T/tl5.err"
fi

# ---- cancel, unknown jobs -----------------------------------------------------------
"$PW" cancel "$ID" "${R[@]}" > "$T/cancel2.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "^error: job $ID is already succeeded" "$T/cancel2.txt"; then
  ok "cancel of a finished job reports the conflict"
else
  bad "cancel of a finished job: exit $rc"; show "$T/cancel2.txt"
fi
"$PW" retry "$ID" "${R[@]}" > "$T/retry1.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "^error: job $ID is succeeded: only a failed or cancelled job can be retried" "$T/retry1.txt"; then
  ok "retry of a succeeded job reports the conflict"
else
  bad "retry of a succeeded job: exit $rc"; show "$T/retry1.txt"
fi
if grep -Eq "^  attempt 1 \(run [0-9]+\) succeeded at [0-9-]+ [0-9:]+ workers w[12],w[12]" "$T/status.txt"; then
  ok "status ID shows the run as attempt 1 with its workers"
else
  bad "status ID: no attempt line"; show "$T/status.txt"
fi
"$PW" status 999999 "${R[@]}" > "$T/nojob.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^error: .*999999' "$T/nojob.txt"; then ok "status of an unknown job"; else
  bad "status 999999: exit $rc"; show "$T/nojob.txt"; fi

# ---- a broken spec: the coordinator's message with the JSON path -------------------
sed 's/"n_heads": 4/"n_heads": 5/' "$T/job.json" > "$T/broken.json"
"$PW" submit --job "$T/broken.json" "${R[@]}" > "$T/broken.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^error: model.n_heads: .*divide' "$T/broken.txt"; then
  ok "a broken spec is refused with its path"
else
  bad "broken spec: exit $rc"; show "$T/broken.txt"
fi
printf '{"name": ' > "$T/trunc.json"
"$PW" submit --job "$T/trunc.json" "${R[@]}" > "$T/trunc.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^error: ' "$T/trunc.txt"; then ok "malformed JSON is refused"; else
  bad "malformed JSON: exit $rc"; show "$T/trunc.txt"; fi

# the default coordinator from the environment
if PIPEWRIGHT_COORDINATOR="$URL" "$PW" workers > "$T/env.txt" 2>&1 && grep -q '^w1 ' "$T/env.txt"; then
  ok "PIPEWRIGHT_COORDINATOR"
else
  bad "PIPEWRIGHT_COORDINATOR"; show "$T/env.txt"
fi

HTTP1=$HTTP
# No proxy from the environment anywhere below unless a test sets one.
unset http_proxy https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY

# ---- coordinator URLs ------------------------------------------------------------------
for bad_url in "ftp://127.0.0.1:$HTTP1|unsupported URL scheme" "http://127.0.0.1:$HTTP1/x?y=1|must not hold a query" \
  "http://127.0.0.1:0|bad port" "http://u:p@127.0.0.1:$HTTP1|credentials"; do
  "$PW" workers --coordinator "${bad_url%%|*}" > "$T/url.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q "^error: bad coordinator URL '${bad_url%%|*}': .*${bad_url#*|}" "$T/url.txt"; then
    ok "URL ${bad_url%%|*} refused: ${bad_url#*|}"
  else
    bad "URL ${bad_url%%|*}: exit $rc"; show "$T/url.txt"
  fi
done
# an empty --coordinator (an unset shell variable) is said, not taken for the default URL
"$PW" workers --coordinator "" > "$T/url.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "^error: --coordinator is empty" "$T/url.txt"; then
  ok "an empty --coordinator is refused"
else
  bad "empty --coordinator: exit $rc"; show "$T/url.txt"
fi
# a bare host:port is http; a path prefix is kept (the coordinator has none: 404 under it)
if "$PW" workers --coordinator "127.0.0.1:$HTTP1" > "$T/url2.txt" 2>&1 && grep -q '^w1 ' "$T/url2.txt"; then
  ok "a bare host:port is taken as http://"
else
  bad "bare host:port"; show "$T/url2.txt"
fi
"$PW" workers --coordinator "http://127.0.0.1:$HTTP1/prefix/" > "$T/url3.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^error: .*/prefix/v1/workers' "$T/url3.txt"; then
  ok "a path prefix is put before the API's paths"
else
  bad "path prefix: exit $rc"; show "$T/url3.txt"
fi

# ---- https: a TLS terminator in front of the coordinator --------------------------------
# A self-signed certificate for 127.0.0.1 and the name the proxy tests use.
if openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -keyout "$T/tls.key" -out "$T/tls.crt" -subj "/CN=pipewright test" \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:pw-coordinator.test" > "$T/openssl.log" 2>&1 &&
  start_helper tls tls --cert "$T/tls.crt" --key "$T/tls.key" --upstream "$HTTP1"; then
  TLS=$PORT
  S=(--coordinator "https://127.0.0.1:$TLS")
  # not trusted: the system's CAs only (CURL_CA_BUNDLE may name them)
  env -u CURL_CA_BUNDLE "$PW" workers "${S[@]}" > "$T/tls1.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q "^error: coordinator at https://127.0.0.1:$TLS: TLS certificate not trusted: " "$T/tls1.txt" &&
    grep -q -- '^hint: .*--cacert FILE or \$CURL_CA_BUNDLE' "$T/tls1.txt" && grep -q '^handshake failed' "$T/tls.log"; then
    ok "https with an unknown CA: TLS is attempted and the certificate refused, with a hint"
  else
    bad "https, unknown CA: exit $rc"; show "$T/tls1.txt" "$T/tls.log"
  fi
  "$PW" workers "${S[@]}" --cacert "$T/tls.crt" > "$T/tls2.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q '^w1 ' "$T/tls2.txt" && grep -q '^w2 ' "$T/tls2.txt" && grep -q '^tls connection' "$T/tls.log"; then
    ok "https with --cacert: workers through TLS"
  else
    bad "https --cacert: exit $rc"; show "$T/tls2.txt" "$T/tls.log"
  fi
  CURL_CA_BUNDLE="$T/tls.crt" "$PW" status "$ID" "${S[@]}" > "$T/tls3.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q "^job $ID (cli-remote): succeeded" "$T/tls3.txt"; then
    ok "https with \$CURL_CA_BUNDLE: status ID"
  else
    bad "https CURL_CA_BUNDLE: exit $rc"; show "$T/tls3.txt"
  fi
  # several requests on one run, on one kept connection (one TLS handshake)
  n0=$(grep -c '^tls connection' "$T/tls.log")
  "$PW" watch "$ID" --interval 0.2 "${S[@]}" --cacert "$T/tls.crt" > "$T/tls4.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && [ "$(grep -c '^step ' "$T/tls4.txt")" = 10 ] && grep -q "^job $ID succeeded: 10/10 steps" "$T/tls4.txt" &&
    [ "$(grep -c '^tls connection' "$T/tls.log")" = $((n0 + 1)) ]; then
    ok "https: watch of the finished job, its requests on one connection"
  else
    bad "https watch: exit $rc"; show "$T/tls4.txt"
  fi
  "$PW" submit --job "$T/broken.json" "${S[@]}" --cacert "$T/tls.crt" > "$T/tls5.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q '^error: model.n_heads: .*divide' "$T/tls5.txt"; then
    ok "https: submit's body goes through, the API error comes back with its path"
  else
    bad "https submit: exit $rc"; show "$T/tls5.txt"
  fi
  # the wrong scheme either way
  "$PW" workers --coordinator "https://127.0.0.1:$HTTP1" > "$T/tls6.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q "^error: coordinator at https://127.0.0.1:$HTTP1: TLS handshake failed" "$T/tls6.txt"; then
    ok "https:// to a plain-HTTP coordinator: the TLS handshake fails, said so"
  else
    bad "https to plain: exit $rc"; show "$T/tls6.txt"
  fi
  "$PW" workers --coordinator "http://127.0.0.1:$TLS" > "$T/tls7.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -Eq "^error: coordinator at http://127.0.0.1:$TLS: (not an HTTP answer|the server closed the connection|recv failure)" "$T/tls7.txt"; then
    ok "http:// to a TLS port: refused (not HTTP, or the TLS server hung up)"
  else
    bad "http to TLS: exit $rc"; show "$T/tls7.txt"
  fi
else
  bad "TLS terminator start"; show "$T/openssl.log"; TLS=
fi

# ---- proxies ---------------------------------------------------------------------------
# The proxy sends the name pw-coordinator.test to 127.0.0.1; nothing else
# resolves it, so an answer under that name came through the proxy.
if start_helper proxy proxy --map pw-coordinator.test; then
  PX=http://127.0.0.1:$PORT
  http_proxy=$PX "$PW" workers --coordinator "http://pw-coordinator.test:$HTTP1" > "$T/px1.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q '^w1 ' "$T/px1.txt" && grep -qx "GET http://pw-coordinator.test:$HTTP1/v1/workers" "$T/proxy.log"; then
    ok "http_proxy carries an http:// request (the proxy saw it)"
  else
    bad "http_proxy: exit $rc"; show "$T/px1.txt" "$T/proxy.log"
  fi
  if [ -n "$TLS" ]; then
    https_proxy=$PX "$PW" status "$ID" --coordinator "https://pw-coordinator.test:$TLS" --cacert "$T/tls.crt" > "$T/px2.txt" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q "^job $ID (cli-remote): succeeded" "$T/px2.txt" &&
      grep -qx "CONNECT pw-coordinator.test:$TLS" "$T/proxy.log"; then
      ok "https_proxy tunnels an https:// request (CONNECT, certificate checked for the name)"
    else
      bad "https_proxy: exit $rc"; show "$T/px2.txt" "$T/proxy.log"
    fi
  fi
  # loopback: never through the environment's proxy...
  n0=$(wc -l < "$T/proxy.log")
  http_proxy=$PX https_proxy=$PX all_proxy=$PX "$PW" workers --coordinator "$URL" > "$T/px3.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q '^w1 ' "$T/px3.txt" && [ "$(wc -l < "$T/proxy.log")" = "$n0" ]; then
    ok "a loopback coordinator bypasses http_proxy/https_proxy/all_proxy"
  else
    bad "loopback bypass: exit $rc"; show "$T/px3.txt" "$T/proxy.log"
  fi
  # ...but through one given with --proxy, and no_proxy still counts
  "$PW" workers --coordinator "$URL" --proxy "$PX" > "$T/px4.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q '^w1 ' "$T/px4.txt" && grep -qx "GET $URL/v1/workers" "$T/proxy.log"; then
    ok "--proxy sends even a loopback coordinator through the proxy"
  else
    bad "--proxy: exit $rc"; show "$T/px4.txt" "$T/proxy.log"
  fi
  n0=$(wc -l < "$T/proxy.log")
  no_proxy=127.0.0.1 "$PW" workers --coordinator "$URL" --proxy "$PX" > "$T/px5.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q '^w1 ' "$T/px5.txt" && [ "$(wc -l < "$T/proxy.log")" = "$n0" ]; then
    ok "no_proxy is honoured"
  else
    bad "no_proxy: exit $rc"; show "$T/px5.txt" "$T/proxy.log"
  fi
  https_proxy=$PX "$PW" workers --coordinator "https://elsewhere.test" > "$T/px6.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -qx "error: cannot reach the coordinator at https://elsewhere.test: the proxy refused the tunnel (HTTP 403)" "$T/px6.txt"; then
    ok "a proxy refusing the tunnel is named"
  else
    bad "proxy 403: exit $rc"; show "$T/px6.txt"
  fi
else
  bad "proxy start"
fi
# a proxy that is not there (port 1 on loopback: nothing listens)
http_proxy=http://127.0.0.1:1 "$PW" workers --coordinator "http://pw-coordinator.test:$HTTP1" > "$T/px7.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -qx "error: cannot reach the coordinator at http://pw-coordinator.test:$HTTP1: connection refused by the proxy at 127.0.0.1:1" "$T/px7.txt"; then
  ok "an unreachable proxy is named as the proxy"
else
  bad "proxy down: exit $rc"; show "$T/px7.txt"
fi

# ---- a server that answers badly ---------------------------------------------------------
if start_helper odd odd; then
  O=(--coordinator "http://127.0.0.1:$PORT")
  OU="http://127.0.0.1:$PORT"
  "$PW" status 1 "${O[@]}" > "$T/odd1.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -qx "error: coordinator at $OU: response body of 107374182400 bytes over the bound of 67108864" "$T/odd1.txt"; then
    ok "a 100 GiB Content-Length is refused at once"
  else
    bad "huge Content-Length: exit $rc"; show "$T/odd1.txt"
  fi
  "$PW" status 2 "${O[@]}" > "$T/odd2.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -qx "error: coordinator at $OU: response body over the bound of 67108864 bytes" "$T/odd2.txt"; then
    ok "an endless chunked body is cut at the bound"
  else
    bad "endless body: exit $rc"; show "$T/odd2.txt"
  fi
  "$PW" status 3 "${O[@]}" --timeout 1 > "$T/odd3.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -qx "error: coordinator at $OU: timed out after 1 s waiting for the response" "$T/odd3.txt"; then
    ok "a silent server: --timeout bounds the wait"
  else
    bad "silent server: exit $rc"; show "$T/odd3.txt"
  fi
  "$PW" status 4 "${O[@]}" > "$T/odd4.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -qx "error: HTTP 502 from $OU: upstream gone" "$T/odd4.txt"; then
    ok "a non-JSON error answer: its status and first line"
  else
    bad "502: exit $rc"; show "$T/odd4.txt"
  fi
  "$PW" submit --job "$T/job.json" "${O[@]}" > "$T/odd5.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -qx "error: model.seq_len: must be at most 4096 (odd server)" "$T/odd5.txt"; then
    ok "an API error body: path and message as sent"
  else
    bad "API error body: exit $rc"; show "$T/odd5.txt"
  fi
  # a job that lost workers: one line per attempt (workers by rank, where it resumed, why it ended)
  "$PW" status 5 "${O[@]}" > "$T/odd7.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -Eqx '  restarts +2 of 2' "$T/odd7.txt" &&
    grep -Eqx "  attempt 1 \(run 3\) interrupted at $TS workers w0,w1,w2,w3, started at step 0: worker w2 \(127\.0\.0\.1:4411, rank 2\) lost at step 13: no heartbeat for 10 s" "$T/odd7.txt" &&
    grep -Eqx "  attempt 2 \(run 5\) interrupted at $TS workers w0,w1,w4,w3, resumed at step 12 from snapshot: worker w4 \(127\.0\.0\.1:4415, rank 2\) lost at step 14: link closed" "$T/odd7.txt" &&
    grep -Eqx "  attempt 3 \(run 6\) failed at $TS workers -: rank 1: out of memory" "$T/odd7.txt" &&
    [ "$(grep -c '^  attempt ' "$T/odd7.txt")" = 3 ]; then
    ok "status ID: a line per attempt, its workers, where it resumed and why it ended"
  else
    bad "status of a job with attempts: exit $rc"; show "$T/odd7.txt"
  fi
  "$PW" retry 5 "${O[@]}" > "$T/odd8.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -qx "job 5 queued" "$T/odd8.txt" && grep -qx "POST /v1/jobs/5/retry" "$T/odd.log"; then
    ok "retry ID posts /v1/jobs/ID/retry and says the job is queued"
  else
    bad "retry 5: exit $rc"; show "$T/odd8.txt" "$T/odd.log"
  fi
  # logs --follow: polls the job and the events after the last one shown, until the job ends
  timeout "$WAIT" "$PW" logs 6 --follow --interval 0.1 "${O[@]}" > "$T/odd9.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && [ "$(wc -l < "$T/odd9.txt")" = 6 ] &&
    [ "$(sed -n 's/.*\(waiting\|planning\|running:\|step 5\|slow\|succeeded\).*/\1/p' "$T/odd9.txt" | tr '\n' ' ')" = "waiting planning running: step 5 slow succeeded " ] &&
    grep -Eqx "$TS  state +queued: waiting for 2 idle workers" "$T/odd9.txt" &&
    grep -qx -- "-  -          checkpoint at step 5" "$T/odd9.txt" &&
    [ "$(sed -n 's#^GET /v1/jobs/6/events?since=##p' "$T/odd.log" | tr '\n' ' ')" = "0 2 4 6 " ]; then
    ok "logs --follow: each event once, in order, asking only for the new ones, until the job ends"
  else
    bad "logs --follow: exit $rc"; show "$T/odd9.txt" "$T/odd.log"
  fi
  "$PW" logs 6 --since 4 --json "${O[@]}" > "$T/odd10.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && [ "$(wc -l < "$T/odd10.txt")" = 2 ] && grep -q '^{"id":5,"time":' "$T/odd10.txt" &&
    grep -q '^{"id":6,"time":' "$T/odd10.txt"; then
    ok "logs --since N --json: the events after N, as the API gives them"
  else
    bad "logs --since --json: exit $rc"; show "$T/odd10.txt"
  fi
  # timeline -o: a 200 cut short, or not JSON, is not saved
  "$PW" timeline 7 -o "$T/odd-trace.json" "${O[@]}" > "$T/odd11.txt" 2>&1
  rc=$?
  "$PW" timeline 8 -o "$T/odd-trace.json" "${O[@]}" >> "$T/odd11.txt" 2>&1
  rc2=$?
  if [ $rc -eq 1 ] && [ $rc2 -eq 1 ] && [ ! -e "$T/odd-trace.json" ] && [ ! -e "$T/odd-trace.json.tmp" ] &&
    [ "$(grep -c '^error: ' "$T/odd11.txt")" = 2 ] && grep -q 'not JSON' "$T/odd11.txt"; then
    ok "timeline -o: a body cut short or not JSON is not saved (exit 1)"
  else
    bad "timeline -o from the odd server: exit $rc/$rc2"; show "$T/odd11.txt"
  fi
  "$PW" workers "${O[@]}" > "$T/odd6.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q "^error: coordinator at $OU: not an HTTP answer" "$T/odd6.txt"; then
    ok "a server that does not speak HTTP"
  else
    bad "not HTTP: exit $rc"; show "$T/odd6.txt"
  fi
  # the OpenBLAS kernel, forced or not, the sgemm rate and the warning under its worker
  "$PW" workers --coordinator "$OU/fleet" > "$T/odd11.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -Eq '^NAME +ADDRESS +HOST +STATE +HEARTBEAT +JOB +THREADS +KERNEL +SGEMM$' "$T/odd11.txt" &&
    grep -Eqx 'w0 +127\.0\.0\.1:4411 +node-a +idle +[0-9.]+s ago +- +1 +Haswell \(forced\) +122 GF/s' "$T/odd11.txt" &&
    grep -Eqx 'w1 +127\.0\.0\.1:4412 +node-a +busy .*3 \(rank 3: pp1 dp0 tp1\) +1 +Cooperlake +215 GF/s' "$T/odd11.txt" &&
    grep -Eqx 'old +127\.0\.0\.1:4413 +- +idle .* +1 +- +-' "$T/odd11.txt" &&
    [ "$(grep -c '^  warning: ' "$T/odd11.txt")" = 1 ] &&
    [ "$(sed -n '/^w0 /{n;p}' "$T/odd11.txt")" = "  warning: OpenBLAS kernel Haswell forced by OPENBLAS_CORETYPE; this CPU supports AVX-512 kernels (about 2x sgemm): unset it" ]; then
    ok "workers: host, job with rank and mesh coordinate, kernel, forced flag, sgemm rate and the warning under its worker"
  else
    bad "workers with kernels: exit $rc"; show "$T/odd11.txt"
  fi
else
  bad "odd server start"
fi

# ---- bad usage: named, exit 2, before anything is sent ----------------------------------
# "ARGS|message" (the command line is split on spaces)
while IFS='|' read -r args want; do
  # shellcheck disable=SC2086
  "$PW" $args --coordinator http://127.0.0.1:1 > "$T/use.txt" 2>&1
  rc=$?
  if [ $rc -eq 2 ] && grep -qxF "$want" "$T/use.txt" && grep -q '^usage: ' "$T/use.txt" && ! grep -q 'cannot reach' "$T/use.txt"; then
    ok "pipewright $args: exit 2, $want"
  else
    bad "pipewright $args: exit $rc, want '$want'"; show "$T/use.txt"
  fi
done <<'EOF'
status abc|pipewright status: job ID: 'abc' is not a whole number
status 0|pipewright status: job ID: '0' is too small (want 1 or more)
status 1 2|pipewright status: unexpected argument '2'
status --limit 10x|pipewright status: --limit: '10x' is not a whole number
status --limit 501|pipewright status: --limit: '501' is too large (want 1 to 500)
status --limit -5|pipewright status: --limit: '-5' is negative (want 1 to 500)
status --state runing|pipewright status: --state: 'runing' is not a job state (queued, planning, dispatching, running, succeeded, failed, cancelled); did you mean running?
status --stat queued|pipewright status: unknown option '--stat'; did you mean --state?
watch|pipewright watch: missing the job ID
watch 1 --interval abc|pipewright watch: --interval: 'abc' is not a number
watch 1 --interval 0|pipewright watch: --interval: '0' is out of range (want more than 0, at most 3600)
watch 1 --interval nan|pipewright watch: --interval: 'nan' is not a number
watch 1 --timeout 0|pipewright watch: --timeout: '0' is out of range (want more than 0, at most 86400)
cancel|pipewright cancel: missing the job ID
retry 1x|pipewright retry: job ID: '1x' is not a whole number
workers --cordinator x|pipewright workers: unknown option '--cordinator'; did you mean --coordinator?
workers --json=1|pipewright workers: --json takes no value
submit|pipewright submit: missing --job FILE
logs|pipewright logs: missing the job ID
logs 1 --since -1|pipewright logs: --since: '-1' is negative (want 0 or more)
logs 1 --folow|pipewright logs: unknown option '--folow'; did you mean --follow?
timeline|pipewright timeline: missing the job ID
timeline 1 --step x|pipewright timeline: --step: 'x' is not a whole number
timeline 1 --step -2|pipewright timeline: --step: '-2' is negative (want 0 or more)
timeline 1 --format svg|pipewright timeline: --format: 'svg' is not chrome or json
timeline 1 --stpe 3|pipewright timeline: unknown option '--stpe'; did you mean --step?
EOF
"$PW" submit --coordinator http://127.0.0.1:1 --job > "$T/use.txt" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -qx "pipewright submit: --job needs a value" "$T/use.txt"; then
  ok "a missing value is named"
else
  bad "submit --job (no value): exit $rc"; show "$T/use.txt"
fi
"$PW" stauts > "$T/use.txt" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -qx "pipewright: unknown command 'stauts'; did you mean status?" "$T/use.txt"; then
  ok "an unknown command: did you mean"
else
  bad "unknown command: exit $rc"; show "$T/use.txt"
fi

# ---- a token-protected coordinator -----------------------------------------------------
printf 's3cret-token-%s\n' "$RANDOM$RANDOM" > "$T/token"
printf 'wrong-token\n' > "$T/wrong"
chmod 600 "$T/token" "$T/wrong"
if start_coordinator "$T/coord2" --token-file "$T/token"; then
  R2=(--coordinator "http://127.0.0.1:$HTTP")
  "$PW" workers "${R2[@]}" > "$T/tok1.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q '^error: ' "$T/tok1.txt" && grep -q -- '--token-file' "$T/tok1.txt"; then
    ok "a token-protected coordinator refuses without --token-file"
  else
    bad "no token: exit $rc"; show "$T/tok1.txt"
  fi
  "$PW" status "${R2[@]}" --token-file "$T/wrong" > "$T/tok2.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q '^error: ' "$T/tok2.txt"; then ok "a wrong token is refused"; else
    bad "wrong token: exit $rc"; show "$T/tok2.txt"; fi
  if "$PW" workers "${R2[@]}" --token-file "$T/token" > "$T/tok3.txt" 2>&1 && grep -q '^NAME ' "$T/tok3.txt" &&
    PIPEWRIGHT_TOKEN_FILE="$T/token" "$PW" status "${R2[@]}" > "$T/tok4.txt" 2>&1 && grep -q '^(no jobs)' "$T/tok4.txt"; then
    ok "the token is accepted (--token-file and PIPEWRIGHT_TOKEN_FILE)"
  else
    bad "with the token"; show "$T/tok3.txt" "$T/tok4.txt"
  fi
  # a job waits here (no workers): submit, its status, cancel, watch
  R2+=(--token-file "$T/token")
  "$PW" submit --job "$T/job.json" "${R2[@]}" > "$T/submit2.txt" 2>&1
  QID=$(sed -n 's/^job \([0-9][0-9]*\) queued$/\1/p' "$T/submit2.txt")
  if [ -n "$QID" ]; then ok "submit prints 'job $QID queued'"; else
    bad "submit output"; show "$T/submit2.txt"; QID=0; fi
  for _ in $(seq $((WAIT * 5))); do # the scheduler writes why it waits
    "$PW" status "$QID" "${R2[@]}" > "$T/queued.txt" 2>&1
    grep -Eq '^ +status +waiting for 2 idle workers' "$T/queued.txt" && break
    sleep 0.2
  done
  if grep -q "^job $QID (cli-remote): queued$" "$T/queued.txt" &&
    grep -Eq '^ +status +waiting for 2 idle workers' "$T/queued.txt" && grep -Eq '^ +progress +0/10 ' "$T/queued.txt"; then
    ok "status ID of a waiting job: queued, and why"
  else
    bad "status of a queued job"; show "$T/queued.txt"
  fi
  # nothing sampled yet (with --token-file, as every remote command)
  "$PW" timeline "$QID" "${R2[@]}" > "$T/tl6.txt" 2>&1
  rc=$?
  "$PW" timeline "$QID" -o "$T/none.json" "${R2[@]}" > "$T/tl7.txt" 2>&1
  rc2=$?
  "$PW" timeline "$QID" --step 5 "${R2[@]}" >> "$T/tl7.txt" 2>&1
  rc3=$?
  if [ $rc -eq 0 ] && grep -qx "job $QID: no step sampled yet" "$T/tl6.txt" && grep -Eqx 'bubble  planned [0-9.]+% \(1f1b\)' "$T/tl6.txt" &&
    [ $rc2 -eq 1 ] && [ ! -e "$T/none.json" ] && grep -qx "error: job $QID has no sampled steps yet" "$T/tl7.txt" &&
    [ $rc3 -eq 1 ] && grep -qx "error: step 5 of job $QID was not sampled; no step has been sampled yet" "$T/tl7.txt"; then
    ok "timeline of a job with no sampled step: the plan's bubble; -o and --step: exit 1, saying so"
  else
    bad "timeline of a queued job: exit $rc/$rc2/$rc3"; show "$T/tl6.txt" "$T/tl7.txt"
  fi
  "$PW" status --state queued "${R2[@]}" > "$T/list2.txt" 2>&1
  if grep -Eq "^$QID +cli-remote +queued +0/10 " "$T/list2.txt"; then ok "status --state queued lists it"; else
    bad "status --state queued"; show "$T/list2.txt"; fi
  if "$PW" cancel "$QID" "${R2[@]}" > "$T/cancel.txt" 2>&1 && grep -q "^job $QID cancelled$" "$T/cancel.txt"; then
    ok "cancel of a queued job"
  else
    bad "cancel $QID"; show "$T/cancel.txt"
  fi
  timeout $((WAIT * 2)) "$PW" watch "$QID" --interval 0.2 "${R2[@]}" > "$T/watch2.txt" 2> "$T/watch2.err"
  rc=$?
  if [ $rc -eq 1 ] && grep -q "^error: job $QID cancelled" "$T/watch2.err"; then
    ok "watch of a cancelled job exits 1 and says so"
  else
    bad "watch of a cancelled job: exit $rc"; show "$T/watch2.txt" "$T/watch2.err"
  fi
  # the cancelled job queued again by retry (--token-file like the rest)
  "$PW" retry "$QID" "${R2[@]}" > "$T/retry2.txt" 2>&1
  rc=$?
  "$PW" status "$QID" "${R2[@]}" > "$T/retried.txt" 2>&1
  if [ $rc -eq 0 ] && grep -qx "job $QID queued" "$T/retry2.txt" && grep -q "^job $QID (cli-remote): queued$" "$T/retried.txt"; then
    ok "retry of a cancelled job queues it again"
  else
    bad "retry $QID: exit $rc"; show "$T/retry2.txt" "$T/retried.txt"
  fi
  # ---- an unreachable coordinator: this one, stopped ----------------------------------
  kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null
  "$PW" status "${R2[@]}" > "$T/down.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -qx "error: cannot reach the coordinator at http://127.0.0.1:$HTTP: connection refused" "$T/down.txt" &&
    grep -qx "hint: is pipewright-coordinator running there?" "$T/down.txt"; then
    ok "an unreachable coordinator is named, with the reason"
  else
    bad "unreachable: exit $rc"; show "$T/down.txt"
  fi
else
  bad "token-protected coordinator start"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
