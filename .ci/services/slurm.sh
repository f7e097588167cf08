#!/usr/bin/env bash
# A one-node Slurm cluster on 127.0.0.1 for the Slurm tests (tests/engine/test_slurm.py).
#
# Installs Debian's slurmctld, slurmd, slurm-client and munge when missing (root and apt-get
# needed), then starts munged, slurmctld and slurmd with the config of tests/engine/slurm_cluster.py
# (partition 'debug', node 'localhost') and waits until sinfo shows the node idle.
# Idempotent: a cluster already up is left as it is; with everything installed it takes about a second.
# Stop it with: python -m tests.engine.slurm_cluster down
set -euo pipefail
cd "$(dirname "$0")/../.."

missing=()
for prog in slurmctld slurmd sinfo srun salloc munged; do
  command -v "$prog" >/dev/null 2>&1 || [ -x "/usr/sbin/$prog" ] || missing+=("$prog")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "slurm.sh: ${missing[*]} missing and cannot be installed here (needs root and apt-get)" >&2
    exit 1
  fi
  echo "slurm.sh: installing slurmctld slurmd slurm-client munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
"$PYTHON" -m tests.engine.slurm_cluster up
