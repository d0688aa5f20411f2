#!/usr/bin/env bash
# test_deb: the Debian packages, built from this build dir with cpack and
# installed on three "hosts" (docs/deploy.md's cluster): the coordinator
# host h0 (pipewright-common, -coordinator and the CLI `pipewright`), and
# worker hosts h1..h3 (pipewright-worker and what it Depends on), each a
# network namespace of netns/lib.sh's private network. Installing never
# touches this machine's /usr, /etc or /var: each host runs in mount
# namespaces where those are overlaid with writable layers of its own
# (netns/deb_host.sh), and `dpkg -i` installs there for real: dpkg's
# database, conffiles, maintainer scripts, Depends checked.
#
# Checks:
#  1. four packages, named and versioned from the project; Depends computed
#     (coordinator: libjansson4 libuv1 libmicrohttpd12 libsqlite3-0 and no
#     libopenblas0 or libdnnl2; worker: libopenblas0 libdnnl2 libjansson4 libuv1
#     libcurl4; CLI: libopenblas0 libdnnl2 libcurl4; the daemons = pipewright-common of the same
#     version); the conffiles are the two configs; the units are in
#     /usr/lib/systemd/system pointing at /usr/bin; no token is packaged;
#     every maintainer script passes `sh -n`;
#  2. dpkg -i on each host: the user `pipewright`, on h0 two different tokens
#     (64 hex digits, 0640 root:pipewright); systemd is reloaded and no
#     unit enabled or started;
#  3. the operator's edits: h0's two addresses in coordinator.conf; on each
#     worker host the two lines of worker.conf (PW_COORDINATOR, and
#     PW_LISTEN=0.0.0.0:7100, the same on every host)
#     and h0's cluster.token copied over;
#  4. the daemons run from the installed units as systemd would start them
#     (netns/unit_exec.py: the units' Environment=, EnvironmentFile=,
#     LoadCredential=, ExecStart=): three workers register as h1-1..h3-1
#     with their 10.200.0.x data addresses; `pipewright workers` on h0
#     lists them; `pipewright submit` of the installed examples/jobs/
#     gpt-tiny.json as a pp = 3 job, `pipewright watch` sees it succeed on
#     all three; its model downloads; every daemon exits 0 on SIGTERM;
#  5. reinstalling pipewright-worker keeps an edited worker.conf and
#     restarts running workers; dpkg --purge pipewright-coordinator stops
#     it and deletes its state, coordinator.conf and the API token; purging
#     pipewright-common then /etc/pipewright; this machine's own dpkg
#     database is unchanged.
# Needs root, network and mount namespaces, overlayfs, cpack and dpkg-deb:
# otherwise skipped (77), saying why.
set -uo pipefail
BUILD=$1; SRC=$2
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns/lib.sh
. "$HERE/netns/lib.sh"

skip() { echo "SKIP test_deb: $*"; exit 77; }
fail() { echo "FAIL test_deb: $*"; exit 1; }
[ -f "$BUILD/CPackConfig.cmake" ] || fail "no $BUILD/CPackConfig.cmake"
for c in cpack dpkg-deb dpkg-shlibdeps; do
  command -v $c >/dev/null || skip "$c is missing (Debian packages cmake, dpkg-dev)"
done
[ "$(id -u)" -eq 0 ] || skip "network and mount namespaces need root (running as uid $(id -u))"
why=$(netns_check) || skip "$why"
for c in curl unshare nsenter findmnt adduser; do
  command -v $c >/dev/null || skip "$c is missing"
done
out=$(unshare --mount --propagation private sh -c 'd=$(mktemp -d) && mkdir $d/a $d/b $d/c $d/u $d/w &&
  mount -t overlay x -o lowerdir=$d/a:$d/b,upperdir=$d/u,workdir=$d/w $d/c; r=$?; umount $d/c 2>/dev/null; rm -rf $d; exit $r' 2>&1) ||
  skip "overlay mounts are refused here: $out"

TAG="pwd$$"
netns_scratch "$TAG" deb || fail "cannot make a scratch dir"
export OPENBLAS_NUM_THREADS=1
PY=$NETNS_PY
CADDR=$(netns_addr 0)

# ---- 1. the packages ---------------------------------------------------------
# gzip: xz of a sanitizer build's binaries takes longer than the rest.
(cd "$BUILD" && cpack -G DEB -B "$T/debs" -D CPACK_DEBIAN_COMPRESSION_TYPE=gzip) >"$T/cpack.log" 2>&1 ||
  { tail -20 "$T/cpack.log"; fail "cpack -G DEB failed"; }
V=$(sed -n 's/^project(pipewright VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")-1
[ "$V" != -1 ] || fail "no project version in $SRC/CMakeLists.txt"
deb() { # PACKAGE: its file
  local a
  a=$([ "$1" = pipewright-common ] && echo all || dpkg --print-architecture)
  echo "$T/debs/$1_${V}_$a.deb"
}
mkdir -p "$T/ctrl"
for p in pipewright pipewright-common pipewright-coordinator pipewright-worker; do
  f=$(deb $p)
  [ -f "$f" ] || fail "no $f: cpack made $(ls "$T/debs"/*.deb 2>/dev/null | xargs -n1 basename | tr '\n' ' ')"
  [ "$(dpkg-deb -f "$f" Package)" = $p ] && [ "$(dpkg-deb -f "$f" Version)" = "$V" ] ||
    fail "$f says $(dpkg-deb -f "$f" Package Version | tr '\n' ' ')"
  dpkg-deb -e "$f" "$T/ctrl/$p" || fail "dpkg-deb -e $f"
  for s in preinst postinst prerm postrm; do
    [ ! -e "$T/ctrl/$p/$s" ] || sh -n "$T/ctrl/$p/$s" || fail "$p's $s does not parse"
  done
  ! dpkg-deb -c "$f" | grep -q '\.token$' || fail "$p ships a token"
done
depends_on() { # PACKAGE DEP...: each DEP is in its Depends (by name)
  local d p=$1; shift
  d=$(dpkg-deb -f "$(deb "$p")" Depends)
  for w in "$@"; do
    case "$w" in
      !*) ! printf '%s' "$d" | grep -qE "(^|, )${w#!}( |,|$)" || fail "$p Depends on ${w#!}: $d" ;;
      *) printf '%s' "$d" | grep -qE "(^|, )$w( |,|$)" || fail "$p does not Depend on $w: $d" ;;
    esac
  done
}
depends_on pipewright-coordinator libjansson4 libuv1 libmicrohttpd12 libsqlite3-0 '!libopenblas0' '!libdnnl2' "pipewright-common \\(= $V\\)"
depends_on pipewright-worker libopenblas0 libdnnl2 libjansson4 libuv1 libcurl4 "pipewright-common \\(= $V\\)"
depends_on pipewright libopenblas0 libdnnl2 libcurl4 libjansson4 '!pipewright-common'
depends_on pipewright-common adduser
[ "$(cat "$T/ctrl/pipewright-coordinator/conffiles")" = /etc/pipewright/coordinator.conf ] &&
  [ "$(cat "$T/ctrl/pipewright-worker/conffiles")" = /etc/pipewright/worker.conf ] ||
  fail "conffiles: $(cat "$T"/ctrl/*/conffiles)"
for u in coordinator:pipewright-coordinator.service worker:pipewright-worker@.service; do
  dpkg-deb --fsys-tarfile "$(deb pipewright-${u%%:*})" | tar -xO "./usr/lib/systemd/system/${u#*:}" >"$T/${u#*:}" ||
    fail "pipewright-${u%%:*} has no /usr/lib/systemd/system/${u#*:}"
  grep -q "^ExecStart=/usr/bin/pipewright-${u%%:*} " "$T/${u#*:}" || fail "${u#*:}: $(grep ExecStart= "$T/${u#*:}")"
done
echo "packages: $(cd "$T/debs" && ls ./*.deb | xargs -n1 basename | tr '\n' ' ')"

# ---- 2. install: dpkg -i on each host ----------------------------------------------
# The real system's dpkg database must not change: compared at the end.
real_status=$(dpkg-query -W -f='${Package} ${Status}\n' 'pipewright*' 2>/dev/null)
netns_up "$TAG" 4 || fail "could not build the namespaces (see above)"
host() { # HOST_INDEX: the command prefix that runs on that host
  echo ip netns exec "$(netns_name "$TAG" "$1")" unshare --mount --uts --propagation private \
    bash "$HERE/netns/deb_host.sh" "$T/h$1" "h$1" --
}
install_on() { # HOST_INDEX PACKAGE...: dpkg -i them there
  local i=$1 p debs=(); shift
  mkdir -p "$T/h$i/stub"
  for s in systemctl deb-systemd-invoke; do
    printf '#!/bin/sh\necho "%s $*" >>"%s"\n' "$s" "$T/h$i/systemctl.log" >"$T/h$i/stub/$s"
    chmod 755 "$T/h$i/stub/$s"
  done
  for p in "$@"; do debs+=("$(deb "$p")"); done
  $(host "$i") dpkg -i "${debs[@]}" >>"$T/h$i/install.log" 2>&1 ||
    fail "h$i: dpkg -i $*: $(tail -20 "$T/h$i/install.log")"
  for p in "$@"; do
    [ "$($(host "$i") dpkg-query -W -f='${Status}' "$p")" = "install ok installed" ] || fail "h$i: $p is not installed"
  done
}
install_on 0 pipewright-common pipewright-coordinator pipewright
for i in 1 2 3; do install_on "$i" pipewright-common pipewright-worker; done
C0=$T/h0/rw/etc/upper/pipewright   # what h0's install wrote in /etc/pipewright
for t in api cluster; do
  grep -qxE '[0-9a-f]{64}' "$C0/$t.token" || fail "h0's $t.token is not 64 hex digits"
  [ "$($(host 0) stat -c '%a %U:%G' "/etc/pipewright/$t.token")" = "640 root:pipewright" ] ||
    fail "h0's $t.token: $($(host 0) stat -c '%a %U:%G' "/etc/pipewright/$t.token")"
done
! cmp -s "$C0/api.token" "$C0/cluster.token" || fail "the two tokens are equal"
for i in 1 2 3; do
  $(host "$i") getent passwd pipewright >/dev/null || fail "h$i has no user pipewright"
  [ ! -e "$T/h$i/rw/etc/upper/pipewright/cluster.token" ] || fail "the worker package made a cluster token on h$i"
  [ -x "$T/h$i/rw/usr/upper/bin/pipewright-worker" ] && [ ! -e "$T/h$i/rw/usr/upper/bin/pipewright-coordinator" ] ||
    fail "h$i: dpkg did not install pipewright-worker alone in /usr/bin"
done
for i in 0 1 2 3; do
  grep -q "daemon-reload" "$T/h$i/systemctl.log" || fail "h$i: no daemon-reload after install"
  ! grep -qE "enable|start" "$T/h$i/systemctl.log" || fail "h$i: the install started or enabled a unit: $(cat "$T/h$i/systemctl.log")"
done
echo "installed with dpkg -i: h0 coordinator + CLI (tokens made), h1..h3 worker; systemd reloaded, nothing enabled"

# ---- 3. the operator's edits -----------------------------------------------------
$(host 0) sed -i -e "s/^PW_HTTP=.*/PW_HTTP=$CADDR:8080/" -e "s/^PW_CONTROL=.*/PW_CONTROL=$CADDR:7070/" \
  /etc/pipewright/coordinator.conf || fail "edit h0's coordinator.conf"
for i in 1 2 3; do
  $(host "$i") sed -i -e "s/^PW_COORDINATOR=.*/PW_COORDINATOR=$CADDR:7070/" \
    -e "s/^PW_LISTEN=.*/PW_LISTEN=0.0.0.0:7100/" /etc/pipewright/worker.conf || fail "edit h$i's worker.conf"
  # scp coordinator:/etc/pipewright/cluster.token
  $(host "$i") sh -c 'cat >/etc/pipewright/cluster.token && chown root:pipewright /etc/pipewright/cluster.token &&
    chmod 640 /etc/pipewright/cluster.token' <"$C0/cluster.token" || fail "copy the cluster token to h$i"
  [ "$(grep -c '^PW_' "$T/h$i/rw/etc/upper/pipewright/worker.conf")" -ge 2 ] || fail "h$i's worker.conf edit did not stick"
done

# ---- 4. the daemons, as their units start them --------------------------------------
U=/usr/lib/systemd/system
$(host 0) "$PY" "$HERE/netns/unit_exec.py" $U/pipewright-coordinator.service >"$T/coordinator.log" 2>&1 &
CPID=$!
PIDS+=("$CPID")
API="http://$CADDR:8080"
for _ in $(seq 200); do
  [ "$(netns_exec "$TAG" 1 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$API/healthz")" = 200 ] && break
  kill -0 "$CPID" 2>/dev/null || break
  sleep 0.1
done
[ "$(netns_exec "$TAG" 1 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$API/healthz")" = 200 ] ||
  { tail -20 "$T/coordinator.log"; fail "the coordinator (started from its unit) does not answer on $API"; }
WPIDS=()
for i in 1 2 3; do
  $(host "$i") "$PY" "$HERE/netns/unit_exec.py" "$U/pipewright-worker@.service" 1 >"$T/worker$i.log" 2>&1 &
  WPIDS+=($!)
  PIDS+=($!)
done
# On h0, as its operator: the installed CLI with the installed token (--root:
# the coordinator's root, a chroot's when the test runs in one, not the namespace's).
on_h0() { nsenter --target "$CPID" --root --mount --uts --net env PIPEWRIGHT_COORDINATOR="$API" \
            PIPEWRIGHT_TOKEN_FILE=/etc/pipewright/api.token "$@"; }
for _ in $(seq 200); do
  on_h0 /usr/bin/pipewright workers >"$T/workers.txt" 2>&1
  [ "$(grep -c ' idle ' "$T/workers.txt")" -ge 3 ] && break
  sleep 0.1
done
cat "$T/workers.txt"
for i in 1 2 3; do
  grep -qE "^h$i-1 +$(netns_addr "$i"):7100 +[^ ]+ +idle " "$T/workers.txt" ||
    { tail -5 "$T/worker$i.log"; fail "h$i's worker is not listed idle as h$i-1 at $(netns_addr "$i")"; }
done
"$PY" - "$SRC" "$T/job.json" <<'EOF' || fail "the job file"
import json, os, sys
j = json.load(open(os.path.join(sys.argv[1], "examples/jobs/gpt-tiny.json")))
j.update(name="deb-pp3", mesh={"pp": 3, "dp": 1, "virtual_stages": 1})
j["train"].update(steps=6, checkpoint_every=6)
j["train"]["optimizer"]["warmup_steps"] = 2
json.dump(j, open(sys.argv[2], "w"))
EOF
# data.path examples/data/corpus.txt: the installed copy, under the
# coordinator's PW_DATA_ROOT (/usr/share/pipewright).
id=$(on_h0 sh -c "cd /usr/share/pipewright && pipewright submit --job '$T/job.json' --quiet" 2>"$T/submit.err") ||
  fail "pipewright submit on h0: $(cat "$T/submit.err")"
echo "job $id submitted on h0"
on_h0 timeout 170 pipewright watch "$id" --interval 0.2 >"$T/watch.log" 2>&1 ||
  { tail -5 "$T"/*.log; fail "pipewright watch $id: $(tail -3 "$T/watch.log")"; }
tail -1 "$T/watch.log"
job=$(netns_exec "$TAG" 1 curl -sS --max-time 10 -H "Authorization: Bearer $(cat "$C0/api.token")" "$API/v1/jobs/$id")
printf '%s' "$job" | "$PY" -c '
import json, sys
j = json.load(sys.stdin)
ranks = sorted(r["worker"] for r in j["ranks"])
assert j["state"] == "succeeded" and ranks == ["h1-1", "h2-1", "h3-1"], (j["state"], ranks)
print("job %d succeeded on %s" % (j["id"], ", ".join(ranks)))' || fail "job $id: $job"
code=$(netns_exec "$TAG" 1 curl -sS -o "$T/model.safetensors" -w '%{http_code}' --max-time 30 \
       -H "Authorization: Bearer $(cat "$C0/api.token")" "$API/v1/jobs/$id/checkpoint")
[ "$code" = 200 ] && [ -s "$T/model.safetensors" ] || fail "GET /v1/jobs/$id/checkpoint: HTTP $code"
[ -s "$T/h0/rw/var/upper/lib/pipewright/coordinator/pipewright.db" ] ||
  fail "the coordinator's database is not in its StateDirectory on h0 (/var/lib/pipewright/coordinator)"
for p in "${WPIDS[@]}" "$CPID"; do
  kill -TERM "$p"
  wait "$p"
  rc=$?
  [ $rc -eq 0 ] || fail "pid $p exited $rc after SIGTERM (logs in $T, rerun with KEEP=1)"
done
PIDS=()

# ---- 5. reinstall keeps an edited conffile; purge ---------------------------------
: >"$T/h1/systemctl.log"
$(host 1) dpkg -i "$(deb pipewright-worker)" >>"$T/h1/install.log" 2>&1 || fail "h1: dpkg -i again: $(tail -5 "$T/h1/install.log")"
$(host 1) grep -qx "PW_COORDINATOR=$CADDR:7070" /etc/pipewright/worker.conf || fail "reinstalling lost h1's worker.conf edit"
grep -q "try-restart pipewright-worker@\*.service" "$T/h1/systemctl.log" || fail "an upgrade does not restart running workers"
: >"$T/h0/systemctl.log"
$(host 0) dpkg --purge pipewright-coordinator >"$T/purge.log" 2>&1 || fail "dpkg --purge pipewright-coordinator: $(cat "$T/purge.log")"
grep -q "stop pipewright-coordinator.service" "$T/h0/systemctl.log" || fail "removing the coordinator did not stop it"
$(host 0) sh -c '! [ -e /var/lib/pipewright/coordinator ] && ! [ -e /etc/pipewright/api.token ] &&
  ! [ -e /etc/pipewright/coordinator.conf ] && [ -s /etc/pipewright/cluster.token ]' ||
  fail "purging the coordinator: its state, api.token or coordinator.conf remain, or cluster.token went"
$(host 0) dpkg --purge pipewright-common >>"$T/purge.log" 2>&1 || fail "dpkg --purge pipewright-common: $(cat "$T/purge.log")"
$(host 0) sh -c '! [ -e /etc/pipewright ]' || fail "purging pipewright-common left /etc/pipewright: $(ls -A "$C0")"
[ "$(dpkg-query -W -f='${Package} ${Status}\n' 'pipewright*' 2>/dev/null)" = "$real_status" ] ||
  fail "this machine's dpkg database changed"
echo "PASS test_deb: packages $V installed with dpkg on 3 hosts ran a pp = 3 job from their units; reinstall keeps edits; purge cleans up"
