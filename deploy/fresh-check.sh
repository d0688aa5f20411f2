#!/usr/bin/env bash
# fresh-check.sh: prove the README's two commands on a truly fresh Debian 12.
# Builds a minimal Debian 12 root (debootstrap --variant=minbase bookworm)
# and, for each of the README's two commands, a fresh copy of it with this
# working tree in /root/pipewright; runs the command there as root exactly
# as the README writes it:
#   deploy/quickstart.sh        (then deploy/quickstart.sh --stop)
#   deploy/test.sh              (with CI=true: an unexpected skip fails)
# and reports its wall time, the packages it installed, what apt downloaded
# and what /usr grew by. Tests that need what a chroot cannot give are named
# in CHROOT_SKIPS below; any other skip or failure fails the check.
#
#   deploy/fresh-check.sh [--keep] [--only quickstart|test] [ROOT]
# ROOT defaults to /var/tmp/pw-fresh; --keep keeps ROOT.base, the bare root,
# and ROOT.NAME, each command's; --only runs one of the two.
# Needs root, mount and network access to a Debian mirror (PW_MIRROR, default
# http://deb.debian.org/debian). Where the host reaches the network through
# a TLS-intercepting proxy, the host's CA bundle ($NODE_EXTRA_CA_CERTS or
# $SSL_CERT_FILE) is copied in and handed to pip. The summary is
# appended to deploy/fresh-check.log; each command's output is in ROOT.NAME.log.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
KEEP=0
ONLY=""
[ "${1:-}" = --keep ] && { KEEP=1; shift; }
[ "${1:-}" = --only ] && { ONLY=$2; shift 2; }
case "$ONLY" in ""|quickstart|test) ;; *) echo "fresh-check: --only quickstart or --only test" >&2; exit 2 ;; esac
R=${1:-/var/tmp/pw-fresh}
MIRROR=${PW_MIRROR:-http://deb.debian.org/debian}
LOG=$SRC/deploy/fresh-check.log
# A chroot shares the host's kernel and PID 1. Where the host does not let
# it make namespaces or cgroups, test_systemd's start/stop part (a private
# systemd) and test_netns (network namespaces) say so and skip; nothing else
# may skip.
CHROOT_SKIPS="test_systemd test_netns"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { echo "fresh-check: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, mount)"

if ! command -v debootstrap >/dev/null; then
  say "install debootstrap on the host"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
fi

MOUNTS=()
mnt() { mount "$@" && MOUNTS+=("${@: -1}"); }
unmount_all() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTS[$i]}" 2>/dev/null || true; done
  MOUNTS=()
}
ROOTS=()
cleanup() {
  unmount_all
  if [ "$KEEP" = 0 ]; then
    local r
    for r in "${ROOTS[@]}"; do [ ! -d "$r" ] || rm -rf --one-file-system "$r"; done
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the bare root ----------------------------------------------------------------
BASE=$R.base
ROOTS+=("$BASE")
rm -rf --one-file-system "$BASE"
say "debootstrap --variant=minbase bookworm $BASE"
t0=$(date +%s)
debootstrap --variant=minbase bookworm "$BASE" "$MIRROR" >"$R.debootstrap.log" 2>&1 ||
  { tail -n 20 "$R.debootstrap.log" >&2; die "debootstrap failed (log: $R.debootstrap.log)"; }
echo "bare root made in $(($(date +%s) - t0)) s: $(chroot "$BASE" dpkg-query -W | wc -l) packages," \
     "$(du -sm "$BASE" | cut -f1) MiB"
# The sources a Debian 12 install has: the release, its updates, security.
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
  "$MIRROR" "$MIRROR" "${PW_SECURITY_MIRROR:-http://deb.debian.org/debian-security}" \
  >"$BASE/etc/apt/sources.list"
cp /etc/resolv.conf "$BASE/etc/resolv.conf"
CA=""
for f in "${NODE_EXTRA_CA_CERTS:-}" "${SSL_CERT_FILE:-}"; do
  if [ -n "$f" ] && [ -f "$f" ]; then
    mkdir -p "$BASE/usr/local/share/pw-host-ca"
    cp "$f" "$BASE/usr/local/share/pw-host-ca/bundle.crt"
    CA=/usr/local/share/pw-host-ca/bundle.crt
    echo "host CA bundle $f copied in (TLS-intercepting proxy)"
    break
  fi
done

# fresh_root DIR: a copy of the bare root with the working tree in it and
# the file systems a machine has mounted. DIR is a mount point of its own,
# as / is on a machine (ip netns needs `mount --make-rslave /`).
fresh_root() {
  local d=$1
  rm -rf --one-file-system "$d"
  cp -a "$BASE" "$d"
  mkdir -p "$d/root/pipewright"
  git ls-files -z --cached --others --exclude-standard |
    tar -C "$SRC" --null -T - -cf - | tar -C "$d/root/pipewright" -xf -
  mnt --bind "$d" "$d"
  mnt -t proc proc "$d/proc"
  mnt -t sysfs sys "$d/sys"
  mnt --bind /dev "$d/dev"
  mnt -t devpts devpts "$d/dev/pts" -o newinstance,ptmxmode=0666
  mnt -t tmpfs tmpfs "$d/dev/shm"
  mnt -t tmpfs tmpfs "$d/run"
  mnt -t tmpfs tmpfs "$d/tmp"
  mnt -t cgroup2 cgroup2 "$d/sys/fs/cgroup" 2>/dev/null || true
}

# in_root DIR CMD: run in the root with a clean environment, as CI would.
in_root() {
  local d=$1; shift
  local env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
             LANG=C.UTF-8 TERM=dumb CI=true PW_EXPECTED_SKIPS="$CHROOT_SKIPS")
  [ -z "$CA" ] || env+=(PIP_CERT="$CA" SSL_CERT_FILE="$CA")
  chroot "$d" /usr/bin/env -i "${env[@]}" bash -c "cd /root/pipewright && $*"
}
debs() { find "$1/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
npkgs() { chroot "$1" dpkg-query -W -f='${Status}\n' | grep -c 'install ok installed'; }
usr_mb() { du -sm "$1/usr" | cut -f1; }

# step NAME CMD: run one README command in a fresh root; report its time,
# the packages it installed, what apt downloaded and what /usr grew by.
RESULTS=()
step() {
  local name=$1 cmd=$2 d=$R.$1 p0 d0 u0 t0 rc=0
  ROOTS+=("$d")
  say "$name: a fresh root $d"
  fresh_root "$d"
  p0=$(npkgs "$d"); d0=$(debs "$d"); u0=$(usr_mb "$d"); t0=$(date +%s)
  say "$name: $cmd"
  in_root "$d" "$cmd" 2>&1 | tee "$R.$name.log" || rc=$?
  local dt=$(($(date +%s) - t0)) dp=$(($(npkgs "$d") - p0)) dd=$((($(debs "$d") - d0) / 1048576))
  local du=$(($(usr_mb "$d") - u0))
  RESULTS+=("$(printf '%-12s exit %d  %4d s  %4d packages  %5d MiB downloaded  %5d MiB more under /usr' \
    "$name" "$rc" "$dt" "$dp" "$dd" "$du")")
  unmount_all
  return $rc
}

ok=1
[ "$ONLY" = test ] || step quickstart "deploy/quickstart.sh && deploy/quickstart.sh --stop" || ok=0
[ "$ONLY" = quickstart ] || step test "deploy/test.sh" || ok=0

{
  echo "== fresh-check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes'), $(nproc) cores"
  printf '%s\n' "${RESULTS[@]}"
  sed -n 's/^   \(build[^ ]* test_[a-z_0-9]*: .*\)/skipped: \1/p' "$R.test.log" 2>/dev/null || true
  echo "result: $([ $ok = 1 ] && echo PASS || echo FAIL)"
} | tee -a "$LOG"
[ $ok = 1 ] || die "failed (logs: $R.quickstart.log, $R.test.log)"
