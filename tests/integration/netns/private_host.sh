#!/usr/bin/env bash
# private_host.sh ROOT HOST [--put NAME=FILE]... -- CMD...: run CMD as a
# "host" with a filesystem of its own. Meant to run in a mount namespace of
# its own (netns_host_exec in lib.sh starts it under `unshare --mount
# --propagation private`, so nothing here reaches the caller's view):
#   - every mount that is writable (but /proc, /sys, /dev and below) is
#     remounted read-only: the system and the build dir stay usable, but a
#     host cannot leave a file anywhere another host would see it;
#   - ROOT (the test's temp dir) is covered by an empty tmpfs, so nothing the
#     caller keeps there (the coordinator's state, other hosts, tokens) is
#     visible; ROOT/HOST is made in it, the host's only writable directory
#     (TMPDIR points into it); /dev/shm gets a private tmpfs too;
#   - each --put FILE is read before ROOT is covered and written to
#     ROOT/HOST/NAME (mode 600): how a host gets its token.
# CMD is exec'd, so the caller's $! is CMD itself. Any step that fails ends
# it with status 125 and a message naming the step.
set -uo pipefail
die() { echo "private_host: $*" >&2; exit 125; }
[ $# -ge 3 ] || die "usage: private_host.sh ROOT HOST [--put NAME=FILE]... -- CMD..."
ROOT=$1 HOST=$2
shift 2
names=() fd=3
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  [ "$1" = --put ] && [ $# -ge 2 ] || die "expected --put NAME=FILE or --, got '$1'"
  name=${2%%=*} file=${2#*=}
  [ -n "$name" ] && [ "$name" != "$2" ] || die "--put wants NAME=FILE, got '$2'"
  eval "exec $fd<\"\$file\"" || die "cannot read $file"
  names+=("$name")
  fd=$((fd + 1))
  shift 2
done
[ "${1:-}" = -- ] && [ $# -ge 2 ] || die "no command after --"
shift
[ "$(findmnt -no PROPAGATION / 2>/dev/null)" = private ] ||
  die "/ is not private here: run me in a mount namespace of my own (unshare --mount --propagation private)"

# Read-only everything that is writable now (a snapshot of the table: the
# loop changes it). mountinfo escapes blanks as \040.
mapfile -t mounts </proc/self/mountinfo
for line in "${mounts[@]}"; do
  read -r _ _ _ _ mp opts _ <<<"$line"
  mp=$(printf '%b' "$mp")
  case $mp in /proc | /proc/* | /sys | /sys/* | /dev | /dev/*) continue ;; esac
  case ,$opts, in *,ro,*) continue ;; esac
  mount -o remount,bind,ro "$mp" || die "cannot make $mp read-only"
done

mount -t tmpfs -o mode=755,size=512m "pw-$HOST" "$ROOT" || die "cannot mount a tmpfs on $ROOT"
mount -t tmpfs -o mode=1777,size=64m "pw-$HOST-shm" /dev/shm || die "cannot mount a tmpfs on /dev/shm"
mkdir -p "$ROOT/$HOST/tmp" || die "cannot make $ROOT/$HOST"
fd=3
for name in "${names[@]}"; do
  (umask 077 && cat <&"$fd" >"$ROOT/$HOST/$name") || die "cannot write $ROOT/$HOST/$name"
  eval "exec $fd<&-"
  fd=$((fd + 1))
done
export TMPDIR="$ROOT/$HOST/tmp"
exec "$@"
