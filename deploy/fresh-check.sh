#!/usr/bin/env bash
# fresh-check.sh: prove the README's two commands on a truly fresh Debian 12.
# Builds a minimal Debian 12 root (debootstrap --variant=minbase bookworm),
# copies this working tree in, and runs inside it, as root and exactly as the
# README writes them:
#   deploy/quickstart.sh        (then deploy/quickstart.sh --stop)
#   deploy/test.sh              (with CI=true: an unexpected skip fails)
# and reports each command's wall time, the packages it installed and the
# bytes apt downloaded for it. Tests that need what a chroot cannot give are
# named in CHROOT_SKIPS below; any other skip or failure fails the check.
#
#   deploy/fresh-check.sh [--keep] [ROOT]    ROOT defaults to /var/tmp/pw-fresh
# Needs root, mount and network access to a Debian mirror (PW_MIRROR, default
# http://deb.debian.org/debian). Where the host reaches the network through
# a TLS-intercepting proxy, the host's CA bundle ($NODE_EXTRA_CA_CERTS or
# $SSL_CERT_FILE) is copied in and handed to npm and node. Results are
# appended to deploy/fresh-check.log in the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
KEEP=0
[ "${1:-}" = --keep ] && { KEEP=1; shift; }
R=${1:-/var/tmp/pw-fresh}
MIRROR=${PW_MIRROR:-http://deb.debian.org/debian}
LOG=$SRC/deploy/fresh-check.log
# A chroot shares the host's kernel and PID 1: it cannot run a private
# systemd (test_systemd's start/stop part) or, on some hosts, make network
# namespaces (test_netns). These two may skip; nothing else may.
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
unmount_all() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTS[$i]}" 2>/dev/null || true; done
  MOUNTS=()
}
cleanup() {
  unmount_all
  if [ "$KEEP" = 0 ] && [ -d "$R" ]; then rm -rf --one-file-system "$R"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the root --------------------------------------------------------------------
[ ! -e "$R" ] || { umount -R "$R"/* 2>/dev/null || true; rm -rf --one-file-system "$R"; }
say "debootstrap --variant=minbase bookworm $R"
t0=$(date +%s)
debootstrap --variant=minbase bookworm "$R" "$MIRROR" >"$R.debootstrap.log" 2>&1 ||
  { tail -n 20 "$R.debootstrap.log" >&2; die "debootstrap failed (log: $R.debootstrap.log)"; }
echo "root made in $(($(date +%s) - t0)) s: $(chroot "$R" dpkg-query -W | wc -l) packages"
# The sources a Debian 12 install has: the release, its updates, security.
cat >"$R/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${PW_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main
EOF
cp /etc/resolv.conf "$R/etc/resolv.conf"
CA=""
for f in "${NODE_EXTRA_CA_CERTS:-}" "${SSL_CERT_FILE:-}"; do
  if [ -n "$f" ] && [ -f "$f" ]; then
    mkdir -p "$R/usr/local/share/pw-host-ca"
    cp "$f" "$R/usr/local/share/pw-host-ca/bundle.crt"
    CA=/usr/local/share/pw-host-ca/bundle.crt
    echo "host CA bundle $f copied in (TLS-intercepting proxy)"
    break
  fi
done

# ---- the working tree -------------------------------------------------------------
say "copy the working tree to $R/root/pipewright"
mkdir -p "$R/root/pipewright"
git ls-files -z --cached --others --exclude-standard |
  tar -C "$SRC" --null -T - -cf - | tar -C "$R/root/pipewright" -xf -

mnt() { mount "$@" && MOUNTS+=("${@: -1}"); }
mnt -t proc proc "$R/proc"
mnt -t sysfs sys "$R/sys"
mnt --bind /dev "$R/dev"
mnt -t devpts devpts "$R/dev/pts" -o newinstance,ptmxmode=0666
mnt -t tmpfs tmpfs "$R/dev/shm"
mnt -t tmpfs tmpfs "$R/run"
mnt -t tmpfs tmpfs "$R/tmp"

# in_root CMD...: run in the root with a clean environment, as CI would.
in_root() {
  local env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
             LANG=C.UTF-8 TERM=dumb CI=true PW_EXPECTED_SKIPS="$CHROOT_SKIPS")
  [ -z "$CA" ] || env+=(NODE_EXTRA_CA_CERTS="$CA" npm_config_cafile="$CA")
  chroot "$R" /usr/bin/env -i "${env[@]}" bash -c "cd /root/pipewright && $*"
}
debs() { find "$R/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
npkgs() { chroot "$R" dpkg-query -W -f='${Status}\n' | grep -c 'install ok installed'; }
usr_mb() { du -sm "$R/usr" | cut -f1; }

# step NAME CMD: run one README command, report time, packages and download.
RESULTS=()
step() {
  local name=$1 cmd=$2 p0 d0 u0 t0 rc=0
  p0=$(npkgs); d0=$(debs); u0=$(usr_mb); t0=$(date +%s)
  say "$name: $cmd"
  in_root "$cmd" 2>&1 | tee "$R.$name.log" || rc=$?
  local dt=$(($(date +%s) - t0)) dp=$(($(npkgs) - p0)) dd=$((($(debs) - d0) / 1048576)) du=$(($(usr_mb) - u0))
  RESULTS+=("$(printf '%-12s exit %d  %4d s  %4d packages  %5d MiB downloaded  %5d MiB more under /usr' \
    "$name" "$rc" "$dt" "$dp" "$dd" "$du")")
  return $rc
}

ok=1
step quickstart "deploy/quickstart.sh && deploy/quickstart.sh --stop" || ok=0
step test "deploy/test.sh" || ok=0
unmount_all

{
  echo "== fresh-check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes'), $(nproc) cores"
  printf '%s\n' "${RESULTS[@]}"
  grep -h '^   build' "$R.test.log" 2>/dev/null | sed 's/^ */skipped: /' || true
  echo "result: $([ $ok = 1 ] && echo PASS || echo FAIL)"
} | tee -a "$LOG"
[ $ok = 1 ] || die "failed (logs: $R.quickstart.log, $R.test.log)"
