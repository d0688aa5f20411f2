#!/usr/bin/env bash
# deb_host.sh HOSTDIR NAME -- CMD...: run CMD on a "host" whose /usr, /etc
# and /var are this machine's, overlaid with writable layers kept in
# HOSTDIR/rw: `dpkg -i` there installs for real (files, dpkg's database,
# conffiles, maintainer scripts), yet nothing reaches this machine's own
# /usr, /etc or /var. Meant to run in mount and UTS namespaces of its own
# (`unshare --mount --uts --propagation private`; test_deb.sh starts it so
# inside a host's network namespace). Also:
#   - /run is an empty tmpfs with /run/systemd/system, so maintainer scripts
#     see a running systemd; HOSTDIR/stub leads PATH, where systemctl and
#     deb-systemd-invoke log their arguments to HOSTDIR/systemctl.log;
#   - the hostname is NAME (a worker unit names its worker %H-%i).
# What one call writes, the next sees. CMD is exec'd (the caller's $! is
# CMD). A step that fails exits 125.
set -uo pipefail
die() { echo "deb_host: $*" >&2; exit 125; }
[ $# -ge 4 ] && [ "$3" = -- ] || die "usage: deb_host.sh HOSTDIR NAME -- CMD..."
H=$1 NAME=$2
shift 3
[ "$(findmnt -no PROPAGATION / 2>/dev/null)" = private ] ||
  die "/ is not private here: run me under unshare --mount --propagation private"
hostname "$NAME" || die "cannot set the hostname (unshare --uts?)"
for d in usr etc var; do
  mkdir -p "$H/rw/$d/upper" "$H/rw/$d/work" || die "cannot make $H/rw/$d"
  mount -t overlay "pw-$NAME-$d" -o "lowerdir=/$d,upperdir=$H/rw/$d/upper,workdir=$H/rw/$d/work" "/$d" ||
    die "cannot overlay /$d"
done
mount -t tmpfs -o mode=755,size=16m "pw-$NAME-run" /run || die "cannot mount a tmpfs on /run"
mkdir -p /run/systemd/system /run/lock || die "cannot make /run/systemd/system"
export PATH="$H/stub:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
exec "$@"
