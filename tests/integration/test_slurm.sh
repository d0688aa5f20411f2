#!/usr/bin/env bash
# test_slurm: deploy/slurm/pipewright.sbatch under a real slurmctld and two
# slurmd on loopback — a job, then one preempted and requeued (see
# test_slurm.py).
set -euo pipefail
[ -x "$1/pipewright-coordinator" ] || { echo "no $1/pipewright-coordinator"; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/test_slurm.py" "$1" "$2"
