#!/usr/bin/env bash
# test_cgroup_resources: workers inside a cgroup limited to 1 CPU and 2 GiB
# report 1 core and 2 GiB, and the coordinator plans with them (see
# test_cgroup_resources.py). Needs root and a cgroup it can make: a
# systemd scope where systemd is PID 1, else a cgroup v2 or v1 folder made
# under /sys/fs/cgroup; skipped (exit 77) when neither can be had.
set -uo pipefail
BUILD=$1; SRC=$2
for b in pipewright-worker pipewright-coordinator; do
  [ -x "$BUILD/$b" ] || { echo "FAIL test_cgroup_resources: no $BUILD/$b"; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP test_cgroup_resources: making cgroups needs root (running as uid $(id -u))"; exit 77; }
exec /usr/bin/python3 "$(dirname "$0")/test_cgroup_resources.py" "$BUILD" "$SRC"
