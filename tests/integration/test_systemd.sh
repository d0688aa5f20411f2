#!/usr/bin/env bash
# test_systemd: the install and the systemd units.
#
# Always (no running systemd needed):
#  1. `cmake --install --prefix T/usr` puts the binaries, web/, api/,
#     examples/ and the units where they belong, the units' @...@ paths all
#     filled in for that prefix, the configuration in T/usr/etc/pipewright,
#     and two different 64-hex-digit tokens there, mode 0600; installing
#     again keeps both tokens and an edited config. A DESTDIR install for
#     the /usr/local prefix stages /etc/pipewright too, with units that
#     point at /usr/local/bin and /etc/pipewright.
#  2. `systemd-analyze verify` accepts both units with no output at all
#     (warnings included).
#  3. `systemd-analyze security --offline=yes` rates both units OK or better
#     (the scores are printed).
#  4. `install.sh worker N --cpus LIST` writes the instance's config and
#     its CPUAffinity drop-in.
#  5. The sd_notify protocol with the real daemons (systemd/notify_check.py
#     plays the manager): READY=1 from the main pid once the advertised
#     address accepts connections, a STATUS= saying a worker registered,
#     STOPPING=1 on SIGTERM, exit 0.
# Then for real, under a running systemd:
#  6. where systemd is PID 1, the units renamed pwtest<pid>-* as runtime
#     units on free loopback ports; elsewhere (containers, CI) a private
#     systemd in its own namespaces (systemd/private_systemd.sh) runs the
#     units as installed. `systemctl start` returns only once the API
#     answers (Type=notify); two worker instances register and systemd shows
#     their STATUS=; a third, configured by `install.sh worker 3 --cpus 0`,
#     runs pinned to CPU 0; a 5-step job succeeds and its model downloads
#     (the coordinator reads the workers' checkpoints through the shared
#     state directory); every unit stops with result "success". Where
#     neither is possible this part is skipped, saying why.
set -uo pipefail
BUILD=$1; SRC=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=$([ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)

skip() { echo "SKIP test_systemd: $*"; exit 77; }
fail() { echo "FAIL test_systemd: $*"; exit 1; }
command -v systemd-analyze >/dev/null ||
  skip "systemd-analyze is missing (Debian package 'systemd'): cannot check the units"
for b in pipewright pipewright-worker pipewright-coordinator; do
  [ -x "$BUILD/$b" ] || fail "no $BUILD/$b"
done
T=$(mktemp -d /tmp/pw-systemd.XXXXXX)
CLEAN=()
cleanup() {
  local c
  for c in "${CLEAN[@]}"; do eval "$c"; done
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. install ---------------------------------------------------------------------
P=$T/usr
cmake --install "$BUILD" --prefix "$P" >"$T/install.log" 2>&1 || { cat "$T/install.log"; fail "cmake --install failed"; }
U=$P/lib/systemd/system
C=$P/etc/pipewright
for f in bin/pipewright bin/pipewright-worker bin/pipewright-coordinator; do
  [ -x "$P/$f" ] || fail "not installed: $P/$f"
done
for d in web api examples/jobs examples/data; do
  [ -n "$(ls -A "$P/share/pipewright/$d" 2>/dev/null)" ] || fail "not installed: $P/share/pipewright/$d"
done
[ -f "$P/share/pipewright/api/job.schema.json" ] || fail "api/job.schema.json not installed"
for u in pipewright-coordinator.service pipewright-worker@.service; do
  [ -f "$U/$u" ] || fail "unit not installed: $U/$u"
  ! grep -n '@[A-Z_]*@' "$U/$u" || fail "$u has unsubstituted @VARS@"
done
grep -q "^ExecStart=$P/bin/pipewright-coordinator " "$U/pipewright-coordinator.service" || fail "coordinator ExecStart path"
grep -q "^ExecStart=$P/bin/pipewright-worker " "$U/pipewright-worker@.service" || fail "worker ExecStart path"
grep -q -- "--web $P/share/pipewright/web " "$U/pipewright-coordinator.service" || fail "coordinator --web path"
grep -q "^LoadCredential=cluster.token:$C/cluster.token$" "$U/pipewright-worker@.service" || fail "worker credential path"
grep -q "^EnvironmentFile=-$C/worker-%i.conf$" "$U/pipewright-worker@.service" || fail "per-instance EnvironmentFile"
for f in coordinator.conf worker.conf api.token cluster.token; do
  [ -f "$C/$f" ] || fail "not made: $C/$f"
done
for t in api cluster; do
  grep -qxE '[0-9a-f]{64}' "$C/$t.token" || fail "$t.token is not 64 hex digits"
  mode=$(stat -c %a "$C/$t.token")
  [ "$mode" = 600 ] || [ "$mode" = 640 ] || fail "$t.token has mode $mode"
done
cmp -s "$C/api.token" "$C/cluster.token" && fail "the two tokens are equal"
# The configuration is what the units read: every variable ExecStart uses is set.
for v in $(grep -ho '\${PW_[A-Z_]*}' "$U"/*.service | sort -u | tr -d '${}'); do
  grep -q "^$v=" "$C/coordinator.conf" "$C/worker.conf" || fail "$v is used by a unit but set in no config"
done
# Again: tokens and an edited config survive.
cp "$C/api.token" "$T/api.before"; cp "$C/cluster.token" "$T/cluster.before"
echo "PW_LOG_LEVEL=debug # edited" >>"$C/worker.conf"
cmake --install "$BUILD" --prefix "$P" >"$T/install2.log" 2>&1 || fail "second cmake --install failed"
cmp -s "$C/api.token" "$T/api.before" && cmp -s "$C/cluster.token" "$T/cluster.before" ||
  fail "installing again changed a token"
grep -q "# edited" "$C/worker.conf" || fail "installing again overwrote an edited worker.conf"
# DESTDIR, the packaging way: /etc staged too, the units point at the final paths.
D=$T/dest
DESTDIR=$D cmake --install "$BUILD" --prefix /usr/local >"$T/install3.log" 2>&1 || fail "DESTDIR install failed"
for f in etc/pipewright/coordinator.conf etc/pipewright/worker.conf etc/pipewright/api.token \
         etc/pipewright/cluster.token usr/local/bin/pipewright-worker usr/local/lib/systemd/system/pipewright-worker@.service; do
  [ -e "$D/$f" ] || fail "DESTDIR install: no $D/$f"
done
grep -q "^ExecStart=/usr/local/bin/pipewright-worker " "$D/usr/local/lib/systemd/system/pipewright-worker@.service" &&
  grep -q "^LoadCredential=api.token:/etc/pipewright/api.token$" "$D/usr/local/lib/systemd/system/pipewright-coordinator.service" ||
  fail "DESTDIR install: unit paths are not /usr/local/bin and /etc/pipewright"
! grep -q "made system user" "$T/install3.log" || fail "a DESTDIR install made a system user"
echo "install: ok ($P, and DESTDIR=$D for /usr/local)"

# ---- 2. verify ---------------------------------------------------------------------------
out=$(systemd-analyze verify "$U/pipewright-coordinator.service" "$U/pipewright-worker@.service" 2>&1)
rc=$?
[ $rc -eq 0 ] && [ -z "$out" ] || fail "systemd-analyze verify (rc $rc): $out"
echo "systemd-analyze verify: both units accepted, no warnings"

# ---- 3. security -------------------------------------------------------------------------
for u in pipewright-worker@.service pipewright-coordinator.service; do
  line=$(systemd-analyze security --offline=yes --no-pager "$U/$u" 2>&1 | grep "Overall exposure level")
  score=$(echo "$line" | sed -n 's/.*: \([0-9.]*\) \([A-Z]*\).*/\1 \2/p')
  echo "systemd-analyze security $u: $score"
  case ${score#* } in
    PERFECT|SAFE|OK) ;;
    *) systemd-analyze security --offline=yes --no-pager "$U/$u" | grep -v "✓"; fail "$u is rated '$score', wanted OK or better" ;;
  esac
done

# ---- 4. per-instance configuration ------------------------------------------------------
sh "$P/share/pipewright/deploy/install.sh" worker 3 --cpus 0-1 --listen 10.0.0.5:0 \
  --confdir "$T/conf" --dropin-dir "$T/dropins" >/dev/null || fail "install.sh worker"
grep -qx "PW_THREADS=2" "$T/conf/worker-3.conf" && grep -qx "PW_LISTEN=10.0.0.5:0" "$T/conf/worker-3.conf" ||
  fail "worker-3.conf: $(cat "$T/conf/worker-3.conf")"
grep -qx "CPUAffinity=0-1" "$T/dropins/pipewright-worker@3.service.d/cpus.conf" || fail "CPUAffinity drop-in"
echo "install.sh worker: ok"

# ---- 5. sd_notify with the real daemons -------------------------------------------------
$PY "$HERE/systemd/notify_check.py" -- "$BUILD/pipewright-coordinator" --http 127.0.0.1:0 --control 127.0.0.1:0 \
  --state-dir "$T/c1" || fail "sd_notify: coordinator"
"$BUILD/pipewright-coordinator" --http 127.0.0.1:0 --control 127.0.0.1:0 --state-dir "$T/c2" \
  --ready-file "$T/c2.ready" >"$T/c2.log" 2>&1 &
cpid=$!
CLEAN+=("kill $cpid 2>/dev/null")
for _ in $(seq 100); do [ -s "$T/c2.ready" ] && break; sleep 0.1; done
ctl=$(sed -n 's/.*"control": *\([0-9]*\).*/\1/p' "$T/c2.ready")
[ -n "$ctl" ] || fail "coordinator for the worker check did not start"
$PY "$HERE/systemd/notify_check.py" --expect-status "registered" -- "$BUILD/pipewright-worker" \
  --coordinator "127.0.0.1:$ctl" --listen 127.0.0.1:0 --state-dir "$T/w1" || fail "sd_notify: worker"
kill "$cpid"; wait "$cpid"
echo "sd_notify: READY/STATUS/STOPPING ok for both daemons"

# ---- 6. under a running systemd ------------------------------------------------------------
# shellcheck source=systemd/private_systemd.sh
. "$HERE/systemd/private_systemd.sh"
IN=()                      # runs a command where the units run
if [ -d /run/systemd/system ] && [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; then
  [ "$(id -u)" -eq 0 ] || skip "the start/stop part needs root to start system units (install, verify, security and sd_notify checks passed)"
  MODE="the host's systemd"
  N="pwtest$$"
  R=/run/$N                # not /tmp: the units have PrivateTmp=yes
  CLEAN+=("systemctl stop '$N-worker@1.service' '$N-worker@2.service' '$N-worker@3.service' '$N-coordinator.service' 2>/dev/null"
          "rm -rf /run/systemd/system/$N-coordinator.service '/run/systemd/system/$N-worker@.service' '/run/systemd/system/$N-worker@3.service.d'"
          "systemctl daemon-reload" "rm -rf '$R' /var/lib/$N /var/lib/private/$N")
  cmake --install "$BUILD" --prefix "$R/usr" >"$T/install4.log" 2>&1 || fail "install into $R"
  chmod 755 "$R"
  free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  hp=$(free_port); cp=$(free_port)
  RC=$R/usr/etc/pipewright
  printf 'PW_HTTP=127.0.0.1:%s\nPW_CONTROL=127.0.0.1:%s\n' "$hp" "$cp" >>"$RC/coordinator.conf"
  printf 'PW_COORDINATOR=127.0.0.1:%s\n' "$cp" >>"$RC/worker.conf"
  for u in coordinator.service worker@.service; do
    sed -e "s|StateDirectory=pipewright/|StateDirectory=$N/|; s| pipewright/workers\$| $N/workers|" \
        -e "s|%S/pipewright/|%S/$N/|g; s|pipewright-coordinator.service|$N-coordinator.service|g" \
      "$R/usr/lib/systemd/system/pipewright-$u" >"/run/systemd/system/$N-$u"
  done
  COORD=$N-coordinator.service; W=$N-worker; DROPINS=$T/dropins
else
  why=$(psd_check)
  if [ -n "$why" ]; then
    skip "the start/stop part: systemd is not PID 1 here (PID 1 is '$(cat /proc/1/comm 2>/dev/null)')" \
         "and a private systemd cannot run: $why (install, verify, security and sd_notify checks passed)"
  fi
  MODE="a private systemd in its own namespaces (PID 1 here is '$(cat /proc/1/comm 2>/dev/null)')"
  CLEAN+=("psd_stop")
  # Installed inside, into its private /run; the units keep their names
  # and the default ports (the namespace has its own loopback).
  psd_boot "$T/psd" /run/pw/usr/lib/systemd/system:"$T/dropins-live" \
    sh -c "cmake --install '$BUILD' --prefix /run/pw/usr >/run/pw-install.log 2>&1" || fail "private systemd: see above"
  IN=("${PSD_IN[@]}")
  hp=8080
  RC=/run/pw/usr/etc/pipewright
  COORD=pipewright-coordinator.service; W=pipewright-worker; DROPINS=$T/dropins-live
fi
echo "systemd: running the units under $MODE"
if [ "${PW_SANITIZE:-OFF}" = ON ]; then
  # LeakSanitizer stops the world with ptrace, which the units' system call
  # filter forbids (as it should): sanitizer builds run here without it.
  d=$([ "$W" = pipewright-worker ] && echo "$DROPINS" || echo /run/systemd/system)
  for u in "$COORD" "$W@.service"; do
    mkdir -p "$d/$u.d"
    printf '[Service]\nEnvironment=ASAN_OPTIONS=detect_leaks=0\n' >"$d/$u.d/sanitizer.conf"
  done
  [ "$d" = "$DROPINS" ] || CLEAN+=("rm -rf '$d/$COORD.d' '$d/$W@.service.d'")
  echo "systemd: sanitizer build: LeakSanitizer off inside the units (it needs ptrace)"
fi
sc() { "${IN[@]}" systemctl "$@"; }
journal() { "${IN[@]}" journalctl --no-pager -o cat -n 30 "$@"; }
API=http://127.0.0.1:$hp
tok=$("${IN[@]}" cat "$RC/api.token")
acurl() { "${IN[@]}" curl -sf --max-time 20 -H "Authorization: Bearer $tok" "$@"; }

sc daemon-reload
sc start "$COORD" || { journal -u "$COORD"; fail "systemctl start $COORD"; }
# Type=notify: start has returned, so the API answers now, without waiting.
"${IN[@]}" curl -sf --max-time 5 "$API/healthz" >/dev/null || fail "systemctl start returned but $API/healthz does not answer"
sc start "$W@1.service" "$W@2.service" || { journal -u "$W@1.service"; fail "systemctl start workers"; }
"${IN[@]}" sh "$HERE/../../deploy/install.sh" worker 3 --cpus 0 --confdir "$RC" --dropin-dir "$DROPINS" >/dev/null ||
  fail "install.sh worker 3"
if [ "$W" != pipewright-worker ]; then # the host's systemd: the drop-in goes with the renamed unit
  mv "$DROPINS/pipewright-worker@3.service.d" "/run/systemd/system/$W@3.service.d"
fi
sc daemon-reload
sc start "$W@3.service" || { journal -u "$W@3.service"; fail "systemctl start $W@3"; }
pid3=$(sc show -p MainPID --value "$W@3.service")
aff=$("${IN[@]}" grep Cpus_allowed_list "/proc/$pid3/status" | awk '{print $2}')
[ "$aff" = 0 ] || fail "$W@3 runs on CPUs '$aff', wanted 0 (CPUAffinity drop-in)"
n=0
for _ in $(seq 100); do
  n=$(acurl "$API/v1/workers" | grep -o '"state":"idle"' | wc -l)
  [ "$n" -ge 3 ] && break
  sleep 0.2
done
[ "$n" -ge 3 ] || { journal -u "$W@1.service"; fail "the worker units did not register ($n idle)"; }
for _ in $(seq 30); do
  sc show -p StatusText --value "$W@1.service" | grep -q registered && break
  sleep 0.2
done
sc show -p StatusText --value "$W@1.service" | grep -q registered ||
  fail "systemd does not show the worker's STATUS= ('$(sc show -p StatusText --value "$W@1.service")')"
sc stop "$W@3.service"
job=$($PY -c '
import json, sys
j = json.load(open(sys.argv[1]))
j["train"]["steps"] = 5; j["train"]["checkpoint_every"] = 5
print(json.dumps(j))' "$SRC/examples/jobs/gpt-tiny.json")
# data.path stays relative: the coordinator unit resolves it from its
# WorkingDirectory, the installed share/pipewright.
id=$(acurl -X POST -H 'Content-Type: application/json' --data "$job" "$API/v1/jobs" | sed -n 's/.*"id": *\([0-9]*\).*/\1/p')
[ -n "$id" ] || { journal -u "$COORD"; fail "submit to the coordinator unit"; }
state=""
for _ in $(seq 600); do
  state=$(acurl "$API/v1/jobs/$id" | sed -n 's/^{[^{]*"state":"\([a-z]*\)".*/\1/p')
  case $state in succeeded|failed|cancelled) break ;; esac
  sleep 0.2
done
[ "$state" = succeeded ] || { journal -u "$COORD" -u "$W@1.service" -u "$W@2.service"; fail "job under systemd ended '$state'"; }
acurl -o "$T/model.safetensors" "$API/v1/jobs/$id/checkpoint" ||
  { journal -u "$COORD"; fail "the coordinator unit cannot serve the model (cannot read the worker units' checkpoints?)"; }
[ "$(head -c 8 "$T/model.safetensors" | od -An -tu8 | tr -d ' ')" -gt 0 ] || fail "the model is not a safetensors file"
sc stop "$W@1.service" "$W@2.service" "$COORD"
for u in "$W@1.service" "$W@2.service" "$W@3.service" "$COORD"; do
  r=$(sc show -p Result --value "$u")
  [ "$r" = success ] || { journal -u "$u"; fail "$u stopped with result '$r'"; }
done
echo "systemd: started (ready when the API answered), 3 workers registered (one pinned), trained, served the model, stopped"
echo "PASS test_systemd"
