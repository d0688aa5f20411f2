#!/usr/bin/env bash
# test_k8s_netns: deploy/k8s's pods run as Kubernetes would run them, each in
# a network namespace with a container's filesystem, user, cgroup, command,
# arguments, environment and probes exactly as the manifests give them, and
# the example Job trains a pp 2 job to success (see test_k8s_netns.py).
# Needs root, network and mount namespaces and overlayfs: otherwise skipped
# (exit 77) saying what failed.
set -uo pipefail
BUILD=$1; SRC=$2
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns/lib.sh
. "$HERE/netns/lib.sh"
skip() { echo "SKIP test_k8s_netns: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "network and mount namespaces need root (running as uid $(id -u))"
why=$(netns_check) || skip "$why"
for c in curl unshare chroot mount; do command -v $c >/dev/null || skip "$c is missing"; done
/usr/bin/python3 -c 'import yaml' 2>/dev/null || skip "/usr/bin/python3 has no yaml module (apt-get install python3-yaml)"
probe=$(mktemp -d /tmp/pw-k8s-probe.XXXXXX)
out=$(unshare --mount --propagation private sh -c "mount -t tmpfs t '$probe' && mkdir '$probe/u' '$probe/w' '$probe/m' &&
      mount -t overlay overlay -o lowerdir=/usr,upperdir='$probe/u',workdir='$probe/w' '$probe/m'" 2>&1)
rc=$?
rmdir "$probe" 2>/dev/null
[ $rc -eq 0 ] || skip "an overlay mount (a container's root filesystem) is refused here: $out"
exec /usr/bin/python3 -u "$HERE/test_k8s_netns.py" "$BUILD" "$SRC"
