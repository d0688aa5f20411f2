#!/usr/bin/env bash
# test_custom_schedule: custom schedules end to end (test_custom_schedule.py):
# every built-in exported and run as schedule.custom trains to the same
# bytes; the CSV path; broken lists refused at submit naming what is wrong.
set -euo pipefail
BUILD=$1; SRC=$2
[ -x "$BUILD/pipewright-worker" ] || { echo "SKIP test_custom_schedule: no $BUILD/pipewright-worker"; exit 77; }
exec /usr/bin/python3 "$(dirname "$0")/test_custom_schedule.py" "$BUILD" "$SRC"
