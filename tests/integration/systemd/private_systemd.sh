# systemd/private_systemd.sh: a real systemd (PID 1 of its own namespaces)
# for tests on machines whose PID 1 is not systemd — containers, CI. Sourced
# by test_systemd.sh.
#
# It runs /lib/systemd/systemd as a container manager would: new PID, mount,
# network (loopback only), UTS, IPC and cgroup namespaces; its own cgroup2
# subtree (PSD_CG, made and removed here); fresh tmpfs on /run, /var/lib,
# /var/log and /etc/systemd/system, so nothing it writes reaches the host;
# and SYSTEMD_UNIT_PATH limited to a directory of stub targets plus the
# units under test, so it starts nothing else (no udev, no gettys). The
# services still get everything the units ask for: dynamic users,
# credentials, state directories, seccomp, namespaces, CPU affinity.
#
#   psd_check                why not, on stdout, when it cannot run here
#   psd_boot DIR UNITDIR PREPARE...
#                            boot; PREPARE (a command) runs inside first,
#                            e.g. an install into /run; UNITDIR is added to
#                            the unit path. Sets PSD_PID (PID 1's host pid)
#                            and PSD_IN (a command prefix that runs inside)
#   psd_stop                 kill it all and remove its cgroup; safe to repeat

PSD_PID=""
PSD_CG=""
PSD_IN=()

# The first child of pid $1 (no procps needed). In /proc/PID/stat the
# fields after comm's last ") " are: state, ppid, ...
psd_child() {
  awk -v want="$1" '{ n = split($0, a, ") "); split(a[n], f, " ")
                      if (f[2] == want) { sub("^/proc/", "", FILENAME); sub("/stat$", "", FILENAME); print FILENAME; exit } }' \
    /proc/[0-9]*/stat 2>/dev/null
}

# A cgroup2 hierarchy: the host's, or, on a cgroup-v1 host (v2 is always
# mountable beside v1, with the controllers v1 does not hold), one mounted
# here at PSD_CG2 and left for later runs to reuse.
PSD_CG2=/run/pw-test-cgroup2
psd_cgroup2() {
  local cg
  cg=$(findmnt -n -t cgroup2 -o TARGET 2>/dev/null | head -n 1)
  if [ -z "$cg" ] && [ "$(id -u)" -eq 0 ]; then
    mkdir -p "$PSD_CG2" && mount -t cgroup2 cgroup2 "$PSD_CG2" 2>/dev/null && cg=$PSD_CG2
  fi
  echo "$cg"
}

psd_check() {
  [ "$(id -u)" -eq 0 ] || { echo "needs root"; return 1; }
  [ -x /lib/systemd/systemd ] || { echo "no /lib/systemd/systemd (package 'systemd')"; return 1; }
  command -v unshare >/dev/null && command -v nsenter >/dev/null && command -v findmnt >/dev/null ||
    { echo "unshare, nsenter or findmnt missing (util-linux)"; return 1; }
  local cg
  cg=$(psd_cgroup2)
  [ -n "$cg" ] || { echo "no cgroup2 hierarchy mounted, and mounting one failed"; return 1; }
  local probe="$cg/pw-probe-$$"
  mkdir "$probe" 2>/dev/null && rmdir "$probe" || { echo "cannot make cgroups under $cg"; return 1; }
  unshare --pid --fork --mount --net --cgroup true 2>/dev/null || { echo "unshare of pid/mount/net/cgroup namespaces is not permitted"; return 1; }
  # The units' sandbox (PrivateUsers=, DynamicUser=) needs user namespaces,
  # which the kernel refuses to a chrooted process.
  unshare --user true 2>/dev/null || { echo "user namespaces are not permitted here (a chroot never gets them), and the units' sandbox needs them"; return 1; }
  return 0
}

psd_boot() {
  local dir=$1 unitdir=$2
  shift 2
  mkdir -p "$dir/units"
  local t
  for t in sysinit basic shutdown multi-user default network network-online network-pre sockets timers paths \
           slices local-fs local-fs-pre remote-fs swap cryptsetup emergency rescue umount final nss-user-lookup; do
    printf '[Unit]\nDescription=stub %s\nDefaultDependencies=no\n' "$t" >"$dir/units/$t.target"
  done
  printf '[Unit]\nDescription=pipewright test system\nWants=systemd-journald.socket systemd-journald.service\n' \
    >"$dir/units/pw-test.target"
  for t in systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket; do
    [ -f "/lib/systemd/system/$t" ] && cp "/lib/systemd/system/$t" "$dir/units/"
  done
  # The inner script: runs as PID 1-to-be inside the new namespaces.
  cat >"$dir/inner.sh" <<'EOF'
#!/bin/bash
set -e
units=$1; shift
mount --make-rprivate /
umount -R -l /sys/fs/cgroup
mount -t cgroup2 cgroup2 /sys/fs/cgroup
for d in /run /var/lib /var/log /etc/systemd/system; do mount -t tmpfs -o mode=0755 tmpfs "$d"; done
mount --make-rshared /
mkdir -p /run/systemd
ip link set lo up
"$@"
export SYSTEMD_UNIT_PATH=$units
export container=pipewright-test
exec /lib/systemd/systemd --system --unit=pw-test.target --log-target=journal --show-status=no
EOF
  chmod +x "$dir/inner.sh"
  PSD_CG="$(psd_cgroup2)/pw-systemd-test-$$"
  mkdir "$PSD_CG" || return 1
  # The launcher moves itself into the subtree, then unshares: the
  # namespace's cgroup root is PSD_CG.
  bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec unshare --pid --fork --mount-proc --mount --uts --ipc --net --cgroup "$@"' \
    _ "$PSD_CG" "$dir/inner.sh" "$dir/units:$unitdir" "$@" >"$dir/boot.log" 2>&1 </dev/null &
  local i pid="" state=""
  for i in $(seq 100); do
    # PID 1 of the new namespace: the launcher's child once it runs systemd.
    pid=$(psd_child "$!")
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = systemd ]; then
      state=$(nsenter -t "$pid" -r -m -p -n -u -i -C systemctl is-system-running 2>/dev/null)
      case $state in running|degraded) break ;; esac
    fi
    sleep 0.2
  done
  case $state in
    running|degraded) ;;
    *) echo "private systemd did not come up (state '$state'): $(cat "$dir/boot.log")"; psd_stop; return 1 ;;
  esac
  PSD_PID=$pid
  # -r: its root, not the mount namespace's (they differ in a chroot, where
  # the tests themselves run in fresh-check.sh)
  PSD_IN=(nsenter -t "$pid" -r -m -p -n -u -i -C)
}

psd_stop() {
  if [ -n "$PSD_PID" ]; then
    kill -9 "$PSD_PID" 2>/dev/null # PID 1 of the namespace: everything in it dies
    PSD_PID=""
  fi
  if [ -n "$PSD_CG" ] && [ -d "$PSD_CG" ]; then
    local i
    for i in $(seq 50); do
      [ -z "$(find "$PSD_CG" -name cgroup.procs -exec cat {} + 2>/dev/null)" ] && break
      sleep 0.1
    done
    find "$PSD_CG" -depth -type d -exec rmdir {} \; 2>/dev/null
    [ -d "$PSD_CG" ] && echo "private_systemd: could not remove $PSD_CG" >&2
  fi
  PSD_CG=""
  PSD_IN=()
}
